"""The LL128 all-to-all and all-to-all-v's host half without a GPU
(algorithms/gpu_ll128.py, kernels/src/collectives/all_to_all_ll128.cuh): the LL128 buffers'
size in every window, which calls the even kernel takes, the all-to-all-v's slot
capacity (the kernel's formula, read from its source), the grids, the registry, and the
all-gather and reduce-scatter by 128-byte lines taking what the larger buffers hold. Line
sizes are read from the kernel's headers, so the arithmetic cannot drift from them."""

from __future__ import annotations

import re
import types
from pathlib import Path

import pytest

import ipcshare.kernels
from ipcshare.collectives.agreement import Signature
from ipcshare.collectives.algorithms import algorithm, algorithm_names
from ipcshare.collectives.algorithms.gpu_kernel import MAX_BLOCKS, GpuCall
from ipcshare.collectives.algorithms.gpu_ll128 import all_to_all_v_ll128_capacity
from ipcshare.collectives.scratch import (
    LL128_LINE_BYTES,
    LL128_LINE_PAYLOAD,
    LL128_MAX_BYTES,
    LL_MAX_BYTES,
    ScratchLayout,
)

_SOURCES = Path(ipcshare.kernels.__file__).parent
_WORDS = (_SOURCES / "include" / "ipcshare" / "ll128_words.cuh").read_text()
_KERNEL = (_SOURCES / "src" / "collectives" / "all_to_all_ll128.cuh").read_text()
_CHECKS = (_SOURCES / "src" / "collectives" / "split_checks.cuh").read_text()
# Groups of eight threads in a block of 512, a line each.
_BYTES_PER_BLOCK = 512 // 8 * LL128_LINE_PAYLOAD


def _constant(text: str, kind: str, name: str) -> int:
    found = re.search(rf"constexpr {kind} {name} = (\d+);", text)
    assert found, name
    return int(found.group(1))


def _call(op: str, nbytes: int, size: int, layout: ScratchLayout, **extra) -> GpuCall:
    signature = Signature(op, nbytes, "uint8", 1, None, "ll128")
    return GpuCall(signature, size, lambda *_: None, layout.ll_max_bytes,
                   ll128_max_bytes=layout.ll128_max_bytes, **extra)


def test_the_line_sizes_and_the_problem_code_are_the_kernel_s():
    assert (_constant(_WORDS, "int", "kLL128LineBytes"),
            _constant(_WORDS, "int", "kLL128Payload")) == (LL128_LINE_BYTES,
                                                           LL128_LINE_PAYLOAD)
    from ipcshare.collectives.split_args import SPLIT_TOO_LARGE_FOR_LL128
    assert _constant(_CHECKS, "u64", "kSplitTooLargeForLL128") == SPLIT_TOO_LARGE_FOR_LL128


def test_the_capacity_is_the_kernel_s_formula():
    # all_to_all_v_ll128_capacity in the kernel: (slot lines - the head) * payload.
    assert re.search(r"a\.ll128_slot_bytes / ipcshare::kLL128LineBytes;\s+return lines > 1 \? "
                     r"\(lines - 1\) \* ipcshare::kLL128Payload : 0;", _KERNEL)
    assert all_to_all_v_ll128_capacity(0) == 0
    assert all_to_all_v_ll128_capacity(LL128_LINE_BYTES) == 0
    assert all_to_all_v_ll128_capacity(3 * LL128_LINE_BYTES + 5) == 2 * LL128_LINE_PAYLOAD


@pytest.mark.parametrize("size", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("max_bytes", [4096, 1 << 20, LL_MAX_BYTES, LL128_MAX_BYTES,
                                       3 * LL128_MAX_BYTES])
def test_the_ll128_buffers_hold_a_head_and_every_line_of_their_largest_input(size, max_bytes):
    layout = ScratchLayout(max_bytes, 0, size, gpu=True)
    assert layout.ll128_max_bytes == min(max_bytes, LL128_MAX_BYTES)
    assert layout.ll128_max_bytes >= layout.ll_max_bytes
    capacity = all_to_all_v_ll128_capacity(layout.ll128_slot_bytes)
    assert layout.ll128_max_bytes <= capacity < layout.ll128_max_bytes + 256 + LL128_LINE_PAYLOAD
    assert layout.ll128_slot_bytes % LL128_LINE_BYTES == 0
    # Two parities of a slot per rank, the last area of the window.
    assert layout.total_bytes == layout.ll128_offset(0) + 2 * size * layout.ll128_slot_bytes
    host = ScratchLayout(max_bytes, 0, size)
    assert (host.ll128_max_bytes, host.ll128_slot_bytes) == (0, 0)


@pytest.mark.parametrize("size", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("max_bytes", [4096, LL_MAX_BYTES, 2 * LL128_MAX_BYTES])
def test_the_even_all_to_all_takes_blocks_up_to_its_buffers_and_names_the_numbers(size,
                                                                                 max_bytes):
    ll128 = algorithm("cuda", "all_to_all", "ll128")
    layout = ScratchLayout(max_bytes, 0, size, gpu=True)
    limit = layout.ll128_max_bytes
    for block in (0, 1, 119, 120, 121, limit - 1, limit, limit + 1, 2 * limit):
        why = ll128.unsupported(_call("all_to_all", size * block, size, layout))
        if block <= limit:
            assert why is None, (block, why)
            want = max(1, min(MAX_BLOCKS, -(-block // _BYTES_PER_BLOCK)))
            assert ll128.blocks(_call("all_to_all", size * block, size, layout).signature,
                                size) == want
        else:
            assert why == (f"its buffers take blocks (the bytes a rank sends each rank) of up "
                           f"to {limit} bytes and this call's are {block} ({size * block} "
                           f"bytes over {size} ranks); use algo='auto', or another algorithm "
                           "for calls this large"), block


def test_all_gather_and_reduce_scatter_take_what_the_ll128_buffers_hold():
    """The LL128 buffers hold more than the LL ones: ll128 takes an all-gather input (a
    reduce-scatter block) up to ll128_max_bytes where ll stops at ll_max_bytes."""
    layout = ScratchLayout(4 * LL128_MAX_BYTES, 0, 2, gpu=True)
    gather = algorithm("cuda", "all_gather", "ll128")
    scatter = algorithm("cuda", "reduce_scatter", "ll128")
    ll_gather = algorithm("cuda", "all_gather", "ll")
    assert gather.unsupported(_call("all_gather", LL128_MAX_BYTES, 2, layout)) is None
    assert ll_gather.unsupported(_call("all_gather", LL128_MAX_BYTES, 2, layout)) is not None
    assert gather.unsupported(_call("all_gather", LL128_MAX_BYTES + 1, 2, layout)) == (
        f"its buffers take inputs of up to {LL128_MAX_BYTES} bytes and this input has "
        f"{LL128_MAX_BYTES + 1}; use algo='auto', or another algorithm for calls this large")
    # Two blocks of float32 (count is in elements): each as large as a slot, then one
    # element more.
    signature = Signature("reduce_scatter", 2 * LL128_MAX_BYTES // 4, "float32", 4, "sum",
                          "ll128")
    call = GpuCall(signature, 2, lambda *_: None, layout.ll_max_bytes,
                   ll128_max_bytes=layout.ll128_max_bytes)
    assert scatter.unsupported(call) is None
    signature = Signature("reduce_scatter", 2 * LL128_MAX_BYTES // 4 + 2, "float32", 4, "sum",
                          "ll128")
    assert scatter.unsupported(GpuCall(signature, 2, lambda *_: None, layout.ll_max_bytes,
                                       ll128_max_bytes=layout.ll128_max_bytes)) is not None


def _v_launches(count, output_count, itemsize, layout, size, max_blocks=MAX_BLOCKS,
                with_args=True):
    launched = []
    args = types.SimpleNamespace(count=count, output_count=output_count, itemsize=itemsize)
    signature = Signature("all_to_all_v", 0, "uint8", itemsize, None, "ll128")
    algorithm("cuda", "all_to_all_v", "ll128").run(GpuCall(
        signature, size, lambda entry, blocks: launched.append((entry, blocks)),
        layout.ll_max_bytes, args=args if with_args else None, max_blocks=max_blocks,
        ll128_max_bytes=layout.ll128_max_bytes))
    return launched


@pytest.mark.parametrize("size", [1, 2, 4, 8])
def test_the_v_grid_gives_a_group_a_line_of_the_largest_block_this_rank_may_move(size):
    layout = ScratchLayout(4 * LL128_MAX_BYTES, 0, size, gpu=True)
    for count, output_count, itemsize in ((0, 0, 4), (1, 0, 1), (0, 3, 8), (960, 10, 8),
                                          (961, 0, 8), (100_000, 4, 4), (1 << 30, 0, 1)):
        largest = min(max(count, output_count) * itemsize, layout.ll128_max_bytes)
        want = max(1, min(MAX_BLOCKS, -(-largest // _BYTES_PER_BLOCK)))
        assert _v_launches(count, output_count, itemsize, layout, size) == [
            ("all_to_all_v_ll128_bytes", want)], (count, output_count, itemsize)
    assert _v_launches(1 << 30, 0, 1, layout, size, max_blocks=32) == [
        ("all_to_all_v_ll128_bytes", 32)]
    assert _v_launches(0, 0, 1, layout, size, with_args=False) == [
        ("all_to_all_v_ll128_bytes", MAX_BLOCKS)]


def test_the_v_kernel_refuses_nothing_on_the_host_for_its_size_but_too_many_ranks():
    ll128 = algorithm("cuda", "all_to_all_v", "ll128")
    signature = Signature("all_to_all_v", 0, "float32", 4, None, "ll128")
    for size in (1, 2, 8):
        layout = ScratchLayout(4096, 0, size, gpu=True)
        assert ll128.unsupported(_call("all_to_all_v", 0, size, layout)) is None
    assert ll128.unsupported(GpuCall(signature, 9, lambda *_: None, 4096)) == (
        "the ll128 kernels span at most 8 ranks; this group has 9")


def test_both_all_to_alls_are_registered_with_their_entry_points():
    assert "ll128" in algorithm_names("cuda", "all_to_all")
    assert "ll128" in algorithm_names("cuda", "all_to_all_v")
    from ipcshare.kernels.compiler import KERNEL_SOURCES
    for entry in ("all_to_all_ll128_bytes", "all_to_all_v_ll128_bytes"):
        assert entry in KERNEL_SOURCES["collectives_all_to_all.cu"]
        assert f"void IPCSHARE_BOUNDED {entry}(CollectiveArgs a)" in (
            _SOURCES / "src" / "collectives_all_to_all.cu").read_text()
