"""The low-latency all-to-all's host half without a GPU (algorithms/gpu_all_to_all_ll.py):
which calls its LL slots take at every world size and window, the grid it cuts, and where
it is registered. The line sizes are read from kernels/include/ipcshare/ll.cuh, so the
arithmetic cannot drift from the kernel's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import ipcshare.kernels
from ipcshare.collectives.agreement import Signature
from ipcshare.collectives.algorithms import algorithm, algorithm_names
from ipcshare.collectives.algorithms.gpu_kernel import MAX_BLOCKS, THREADS, GpuCall
from ipcshare.collectives.scratch import (
    LL_LINE_BYTES,
    LL_LINE_PAYLOAD,
    LL_MAX_BYTES,
    ScratchLayout,
)
from ipcshare.runtime.errors import CollectiveError

_LL_HEADER = Path(ipcshare.kernels.__file__).parent / "include" / "ipcshare" / "ll.cuh"


def _constant(name: str) -> int:
    found = re.search(rf"constexpr int {name} = (\d+);", _LL_HEADER.read_text())
    assert found, f"{name} is not in {_LL_HEADER.name}"
    return int(found.group(1))


def _call(nbytes: int, size: int, layout: ScratchLayout) -> GpuCall:
    signature = Signature("all_to_all", nbytes, "uint8", 1, None, "ll")
    return GpuCall(signature, size, lambda *_: None, layout.ll_max_bytes)


def test_the_line_sizes_are_the_kernel_s():
    assert (_constant("kLineBytes"), _constant("kLinePayload")) == (LL_LINE_BYTES,
                                                                     LL_LINE_PAYLOAD)


@pytest.mark.parametrize("size", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("max_bytes", [4096, 1 << 20, LL_MAX_BYTES, 9 * LL_MAX_BYTES])
def test_calls_run_exactly_while_a_block_and_its_digest_line_fit_a_slot(size, max_bytes):
    """A block (input / size bytes) goes to one slot: the digest line, then a line per 8
    bytes. Every call the algorithm takes fits; the first block past ll_max_bytes is
    refused, naming its numbers; the window's max_bytes bounds nothing else."""
    ll = algorithm("cuda", "all_to_all", "ll")
    layout = ScratchLayout(max_bytes, 0, size, gpu=True)
    line_bytes, payload = _constant("kLineBytes"), _constant("kLinePayload")
    limit = layout.ll_max_bytes
    for block in (0, 1, 7, 8, 9, limit - 1, limit, limit + 1, limit + payload, 2 * limit):
        why = ll.unsupported(_call(size * block, size, layout))
        if block <= limit:
            assert why is None, (block, why)
            lines = 1 + -(-block // payload)
            assert lines * line_bytes <= layout.ll_slot_bytes, block
        else:
            assert why == (
                f"its buffers take blocks (the bytes a rank sends each rank) of up to {limit} "
                f"bytes and this call's are {block} ({size * block} bytes over {size} ranks); "
                "use algo='auto', or another algorithm for calls this large"), block


def test_too_many_ranks_are_refused_as_for_every_kernel():
    ll = algorithm("cuda", "all_to_all", "ll")
    layout = ScratchLayout(1 << 20, 0, 9, gpu=True)
    why = ll.unsupported(_call(9 * 64, 9, layout))
    assert why == "the ll kernels span at most 8 ranks; this group has 9"


@pytest.mark.parametrize("size", [1, 2, 4, 8])
def test_the_grid_gives_each_thread_a_line_of_every_block_up_to_the_block_cap(size):
    """One block of threads per THREADS lines of a block (each thread pushes and receives
    one line per peer), at most MAX_BLOCKS: the largest call gives a thread
    LL_MAX_BYTES / (MAX_BLOCKS * THREADS * 8) lines a peer. The same on every rank."""
    ll = algorithm("cuda", "all_to_all", "ll")
    payload = _constant("kLinePayload")
    for block in (0, 1, 8, THREADS * payload, THREADS * payload + 1, 64 << 10, LL_MAX_BYTES):
        signature = Signature("all_to_all", size * block, "uint8", 1, None, "ll")
        blocks = ll.blocks(signature, size)
        lines = -(-block // payload)
        assert blocks == max(1, min(MAX_BLOCKS, -(-lines // THREADS))), block
        assert -(-lines // (blocks * THREADS)) <= max(1, -(-LL_MAX_BYTES // (
            MAX_BLOCKS * THREADS * payload))), block
    assert ll.entry(Signature("all_to_all", 8, "bfloat16", 2, None, "ll")) == (
        "all_to_all_ll_bytes")   # bytes move, whatever the dtype


def test_ll_runs_all_to_all_and_all_to_all_v_on_gpus_and_reads_no_peer_s_input():
    ll = algorithm("cuda", "all_to_all", "ll")
    assert (ll.name, ll.op, ll.memory) == ("ll", "all_to_all", "cuda")
    # Nothing staged, and in place with any input: a rank reads only its own input and
    # its own LL buffer.
    assert ll.aliasing_safe and not ll.stages_input
    v = algorithm("cuda", "all_to_all_v", "ll")
    assert (v.name, v.op, v.memory, v.kernel) == ("ll", "all_to_all_v", "cuda",
                                                  "all_to_all_v_ll_bytes")
    assert v.aliasing_safe and not v.stages_input
    assert "ll" in algorithm_names("cuda", "all_to_all")
    assert algorithm_names("cuda", "all_to_all_v") == ("pull", "balanced", "ll", "push", "eager",
                                                       "ll128")
    assert "ll" not in algorithm_names("host", "all_to_all")
    with pytest.raises(CollectiveError, match="algo='ll' is not an algorithm of all_to_all_v "
                                              "on host memory; choose one of: auto, pull$"):
        algorithm("host", "all_to_all_v", "ll")


def test_every_call_auto_gives_ll_fits_the_slots():
    """auto runs ll for even splits up to 1 MiB at 2 ranks (test_collectives_parts.py):
    such a call fits the LL slots of every communicator that takes it (max_bytes at least
    the call)."""
    from ipcshare.collectives.choice import choose

    ll = algorithm("cuda", "all_to_all", "ll")
    for size, nbytes in ((2, 1 << 20), (3, (512 << 10) // 3 * 3), (4, 512 << 10)):
        assert choose("cuda", "all_to_all", nbytes, size) == "ll"
        for max_bytes in (nbytes, 4 << 20, 64 << 20):
            layout = ScratchLayout(max_bytes, 0, size, gpu=True)
            assert ll.unsupported(_call(nbytes, size, layout)) is None, (size, max_bytes)
