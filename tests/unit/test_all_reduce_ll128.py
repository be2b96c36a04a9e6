"""The all-reduces by 128-byte lines (algo="ll128" and "ll128-two-shot") without a GPU:
they take every input up to the LL128 buffers' limit and refuse one element more, every
line they write lies inside its slot (the two-shot's two regions of a chunk each, even
for a communicator sized for its one call), and a host replay of the two-shot's plan of
lines (kernels/src/collectives/all_reduce_ll128.cuh) gives every rank the one-shot's sums,
each line written in a call read in it, none written twice."""

from __future__ import annotations

import re
import types
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ipcshare.kernels
from ipcshare.collectives.agreement import Signature
from ipcshare.collectives.algorithms import algorithm, algorithm_names
from ipcshare.collectives.algorithms.gpu_two_shot import chunk_spans
from ipcshare.collectives.scratch import (
    LL128_LINE_BYTES,
    LL128_LINE_PAYLOAD,
    LL128_MAX_BYTES,
    ScratchLayout,
    ll128_lines,
)
from ipcshare.kernels import KERNEL_SOURCES

from ..hypothesis_profiles import examples

_KERNELS = Path(ipcshare.kernels.__file__).parent
_DTYPES = {"float32": 4, "float16": 2, "bfloat16": 2, "int32": 4}
_ALGOS = ("ll128", "ll128-two-shot")


def _call(algo: str, count: int, dtype: str, size: int, layout: ScratchLayout):
    signature = Signature("all_reduce", count, dtype, _DTYPES[dtype], "sum", algo)
    return types.SimpleNamespace(signature=signature, size=size,
                                 ll_max_bytes=layout.ll_max_bytes,
                                 ll128_max_bytes=layout.ll128_max_bytes)


def _lines_written(algo: str, count: int, dtype: str, size: int) -> int:
    """The last line (after the head) a sender writes in a slot: the whole input's
    lines (one-shot), or two regions of a full chunk's lines each (two-shot)."""
    if algo == "ll128":
        return ll128_lines(count * _DTYPES[dtype])
    chunk = max(nbytes for _, nbytes in chunk_spans(count, _DTYPES[dtype], size))
    return 2 * ll128_lines(chunk)


def _fits(algo: str, count: int, dtype: str, size: int, layout: ScratchLayout) -> bool:
    return (1 + _lines_written(algo, count, dtype, size)) * LL128_LINE_BYTES <= \
        layout.ll128_slot_bytes


def test_both_are_registered_for_gpu_all_reduce_and_have_every_kernel_entry():
    assert set(_ALGOS) <= set(algorithm_names("cuda", "all_reduce"))
    assert not set(_ALGOS) & set(algorithm_names("host", "all_reduce"))
    entries = set(KERNEL_SOURCES["collectives_ll128.cu"])
    source = (_KERNELS / "src" / "collectives_ll128.cu").read_text()
    for algo in _ALGOS:
        found = algorithm("cuda", "all_reduce", algo)
        for dtype, itemsize in _DTYPES.items():
            for op in ("sum", "max", "min"):
                assert found.entry(Signature("all_reduce", 7, dtype, itemsize, op, algo)) \
                    in entries
        # Bound to the block: test_kernels checks their registers.
        assert f"IPCSHARE_TYPES({found.kernel}, IPCSHARE_BOUNDED)" in source


def test_the_kernels_regions_are_a_full_chunks_lines():
    # The Python side's region (slot check) is the kernel's: a full chunk's 128-byte lines.
    source = (_KERNELS / "src" / "collectives" / "all_reduce_ll128.cuh").read_text()
    assert re.search(r"region = ipcshare::ll128_lines\(chunk_bytes\);", source)
    assert re.search(r"chunk_bytes = chunk \* size;", source)
    two_shot = algorithm("cuda", "all_reduce", "ll128-two-shot")
    for count, size in ((1, 2), (1000, 3), (2_097_152, 4), (12_345, 8)):
        signature = Signature("all_reduce", count, "float32", 4, "sum", "ll128-two-shot")
        chunk = chunk_spans(count, 4, size)[0][1]
        assert two_shot.region_lines(signature, size) == ll128_lines(chunk)


@pytest.mark.parametrize("size", [2, 3, 4, 5, 8])
@pytest.mark.parametrize("dtype", sorted(_DTYPES))
def test_every_input_up_to_the_ll128_buffers_is_taken_and_one_element_more_refused(size, dtype):
    # A communicator for larger calls: the LL128 buffers hold LL128_MAX_BYTES a rank.
    layout = ScratchLayout(2 * LL128_MAX_BYTES, 0, size, gpu=True)
    assert layout.ll128_max_bytes == LL128_MAX_BYTES
    largest = LL128_MAX_BYTES // _DTYPES[dtype]
    for algo in _ALGOS:
        found = algorithm("cuda", "all_reduce", algo)
        for count in (*range(1, 80), largest // 3, largest // 2 + 1, largest - 1, largest):
            assert found.unsupported(_call(algo, count, dtype, size, layout)) is None, count
            assert _fits(algo, count, dtype, size, layout), (algo, count)
        why = found.unsupported(_call(algo, largest + 1, dtype, size, layout))
        assert why == (f"its buffers take inputs of up to {LL128_MAX_BYTES} bytes and this "
                       f"input has {(largest + 1) * _DTYPES[dtype]}; use algo='auto', or "
                       "another algorithm for calls this large")


@settings(max_examples=examples(300), deadline=None)
@given(st.integers(1, 3 * LL128_MAX_BYTES), st.integers(2, 8), st.sampled_from(sorted(_DTYPES)),
       st.floats(0, 1), st.sampled_from(_ALGOS))
def test_a_communicator_of_any_size_takes_what_its_buffers_hold(max_bytes, size, dtype,
                                                               fraction, algo):
    # The command line sizes a communicator for each row: 2 float32 at 4 ranks are one
    # line whole but two regions of one line each in chunks, which the slot must hold.
    layout = ScratchLayout(max_bytes, 0, size, gpu=True)
    largest = layout.ll128_max_bytes // _DTYPES[dtype]
    found = algorithm("cuda", "all_reduce", algo)
    for count in {1, max(largest, 1), max(largest - 1, 1), max(int(fraction * largest), 1)}:
        if count > largest:
            continue
        assert found.unsupported(_call(algo, count, dtype, size, layout)) is None, (
            count, max_bytes)
        assert _fits(algo, count, dtype, size, layout), (count, max_bytes)


def test_the_slots_grow_only_where_two_regions_outgrow_the_whole_input():
    # 1000 bytes at 3 ranks: 9 lines whole, two chunks of 352 bytes take 2 x 3.
    assert ScratchLayout(1000, 0, 3, gpu=True).ll128_slot_bytes == 256 * 5
    # 8 bytes at 4 ranks: 1 line whole, two chunks of 16 bytes take 2 lines.
    small = ScratchLayout(8, 0, 4, gpu=True)
    assert small.ll128_slot_bytes >= LL128_LINE_BYTES * 3
    assert ScratchLayout(8, 0, 1, gpu=True).ll128_slot_bytes == 256


def _replay_two_shot(inputs: list[np.ndarray], epoch: int, buffers: list[dict]) -> tuple:
    """The two-shot's lines on the host, as all_reduce_ll128.cuh writes and reads them:
    buffers[o][(source, line)] = (flag, 120 payload bytes). Returns every rank's output
    and the lines written and read in this call, per (owner, source, line)."""
    size = len(inputs)
    itemsize = inputs[0].itemsize
    count = inputs[0].size
    spans = chunk_spans(count, itemsize, size)
    region = ll128_lines(spans[0][1])  # a full chunk's lines: chunk 0 is never shorter
    raw = [x.view(np.uint8) for x in inputs]
    written: list[tuple[int, int, int]] = []
    read: list[tuple[int, int, int]] = []

    def line_of(data: np.ndarray, j: int) -> np.ndarray:
        payload = np.zeros(LL128_LINE_PAYLOAD, np.uint8)
        part = data[j * LL128_LINE_PAYLOAD:(j + 1) * LL128_LINE_PAYLOAD]
        payload[:part.size] = part
        return payload

    def push(owner: int, source: int, line: int, payload: np.ndarray) -> None:
        written.append((owner, source, line))
        buffers[owner][(source, line)] = (epoch, payload.copy())

    def receive(owner: int, source: int, line: int) -> np.ndarray:
        flag, payload = buffers[owner][(source, line)]
        assert flag == epoch, (owner, source, line, flag)  # the kernel would wait here
        read.append((owner, source, line))
        return payload

    # Phase 1: chunk p of every rank's input to rank p, region 0.
    for rank in range(size):
        for step in range(1, size):
            peer = (rank + step) % size
            offset, nbytes = spans[peer]
            for j in range(ll128_lines(nbytes)):
                push(peer, rank, j, line_of(raw[rank][offset:offset + nbytes], j))
    # Each rank reduces its chunk in rank order and sends it on, region 1.
    outputs = [np.zeros(count * itemsize, np.uint8) for _ in range(size)]
    for rank in range(size):
        offset, nbytes = spans[rank]
        for j in range(ll128_lines(nbytes)):
            lines = [line_of(raw[rank][offset:offset + nbytes], j) if r == rank
                     else receive(rank, r, j) for r in range(size)]
            words = [line.view(inputs[0].dtype) for line in lines]
            total = words[0].copy()
            for r in range(1, size):
                total = (total + words[r]).astype(inputs[0].dtype)
            reduced = total.view(np.uint8)
            for step in range(1, size):
                push((rank + step) % size, rank, region + j, reduced)
            end = min(nbytes, (j + 1) * LL128_LINE_PAYLOAD) - j * LL128_LINE_PAYLOAD
            start = offset + j * LL128_LINE_PAYLOAD
            outputs[rank][start:start + end] = reduced[:end]
    # Phase 2: every peer's reduced chunk from region 1.
    for rank in range(size):
        for j in range(region):
            for r in range(size):
                offset, nbytes = spans[r]
                if r == rank or j >= ll128_lines(nbytes):
                    continue
                payload = receive(rank, r, region + j)
                end = min(nbytes, (j + 1) * LL128_LINE_PAYLOAD) - j * LL128_LINE_PAYLOAD
                start = offset + j * LL128_LINE_PAYLOAD
                outputs[rank][start:start + end] = payload[:end]
    return outputs, written, read, region


@pytest.mark.parametrize("size", [2, 3, 4, 8])
@pytest.mark.parametrize("count", [1, 2, 5, 29, 30, 31, 240, 1001, 4099])
def test_the_two_shots_plan_of_lines_gives_the_one_shots_sums(size, count):
    rng = np.random.default_rng([size, count])
    buffers: list[dict] = [{} for _ in range(size)]
    for epoch in (1, 3, 5):  # one parity's calls: each must read only its own lines
        inputs = [rng.integers(-1000, 1000, count).astype(np.int32) for _ in range(size)]
        outputs, written, read, region = _replay_two_shot(inputs, epoch, buffers)
        want = np.sum(np.stack(inputs).astype(np.int64), axis=0).astype(np.int32)
        for output in outputs:
            assert np.array_equal(output.view(np.int32), want)
        # No line written twice, every line written read in the same call, and every
        # line inside the slot's two regions.
        assert len(set(written)) == len(written)
        assert sorted(written) == sorted(read)
        assert all(0 <= line < 2 * region for _, _, line in written)
        layout = ScratchLayout(count * 4, 0, size, gpu=True)
        assert (1 + 2 * region) * LL128_LINE_BYTES <= layout.ll128_slot_bytes
