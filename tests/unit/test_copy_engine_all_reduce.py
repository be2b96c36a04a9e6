"""The copy-engine all-reduce's plan of copies, run on a model of every rank's memory (no
GPU): the copies each rank enqueues land where the reduction kernel reads (the inbox slot
of every source rank, ``all_reduce_copy_engine`` in kernels/src/collectives/
copy_engine.cuh), stay inside the window's areas, and leave every rank's output equal to
the reference sum."""

from __future__ import annotations

import types

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ipcshare.collectives.agreement import Signature
from ipcshare.collectives.algorithms import algorithm
from ipcshare.collectives.algorithms.gpu_kernel import GpuCall
from ipcshare.collectives.algorithms.gpu_two_shot import chunk_elements, chunk_spans
from ipcshare.collectives.scratch import ScratchLayout

from ..hypothesis_profiles import examples
from .device_memory import DeviceMemory

_DTYPES = {"float32": np.float32, "int32": np.int32, "float16": np.float16}


def _run(count: int, size: int, dtype: str, in_place: bool) -> None:
    itemsize = np.dtype(_DTYPES[dtype]).itemsize
    nbytes = count * itemsize
    layout = ScratchLayout(max(nbytes, 1), 0, size, gpu=True)
    memory = DeviceMemory()
    windows = [memory.add(layout.total_bytes) for _ in range(size)]
    rng = np.random.default_rng([count, size])
    inputs = [rng.integers(-50, 50, count).astype(_DTYPES[dtype]) for _ in range(size)]
    want = np.sum(np.stack(inputs).astype(np.int64), axis=0).astype(_DTYPES[dtype])
    ins, outs = [], []
    for rank in range(size):
        ins.append(memory.add(max(nbytes, 1)))
        memory.at(ins[rank], nbytes)[:] = inputs[rank].view(np.uint8)
        outs.append(ins[rank] if in_place else memory.add(max(nbytes, 1)))
    signature = Signature("all_reduce", count, dtype, itemsize, "sum", "copy-engine")
    steps: list[list] = [[] for _ in range(size)]
    for rank in range(size):
        args = types.SimpleNamespace(
            rank=rank, input=ins[rank], output=outs[rank], windows=windows,
            staging_offset=[layout.staging_offset(p) for p in (0, 1)],
            result_offset=[layout.result_offset(p) for p in (0, 1)])
        call = GpuCall(signature, size,
                       launch=lambda entry, blocks, r=rank: steps[r].append(("kernel", entry)),
                       meet=lambda turn, r=rank: steps[r].append(("meet", turn)),
                       copy=lambda jobs, r=rank: steps[r].append(("copy", list(jobs))),
                       args=args)
        algorithm("cuda", "all_reduce", "copy-engine").run(call)
    # Every rank launches the same kernels and meets the same barriers (copies are its own).
    shared = [[step for step in rank_steps if step[0] != "copy"] for rank_steps in steps]
    assert all(s == shared[0] for s in shared)
    chunk = chunk_elements(count, itemsize, size) * itemsize
    spans = chunk_spans(count, itemsize, size)

    def check_area(jobs, offset, area_bytes):
        """Every copy of ``jobs`` lands in a peer's area at ``offset``, inside it."""
        for dst, _src, length in jobs:
            owner = next(r for r in range(size)
                         if windows[r] <= dst < windows[r] + layout.total_bytes)
            assert owner != rank
            start = windows[owner] + offset
            assert start <= dst and dst + length <= start + area_bytes

    # Run phase by phase: every rank's steps up to its next meeting, then the next.
    position = [0] * size
    while position[0] < len(steps[0]):
        for rank in range(size):
            while position[rank] < len(steps[rank]):
                kind, what = steps[rank][position[rank]]
                position[rank] += 1
                if kind == "meet":
                    break
                if kind == "copy":
                    memory.copy(what)
                elif what.startswith("all_reduce_copy_engine"):
                    # What the kernel reads: our input's chunk, and slot r of our inbox.
                    offset, length = spans[rank]
                    inbox = windows[rank] + layout.staging_offset(0)
                    parts = [memory.at(ins[rank] + offset, length) if r == rank
                             else memory.at(inbox + r * chunk, length) for r in range(size)]
                    total = np.sum(np.stack([p.view(_DTYPES[dtype]).astype(np.int64)
                                             for p in parts]), axis=0) if length else []
                    memory.at(outs[rank] + offset, length)[:] = \
                        np.asarray(total).astype(_DTYPES[dtype]).view(np.uint8)
    for rank in range(size):
        copy_steps = [jobs for kind, jobs in steps[rank] if kind == "copy"]
        check_area(copy_steps[0], layout.staging_offset(0), layout.staging_bytes)  # inboxes
        if spans[rank][1]:
            check_area(copy_steps[1], layout.result_offset(0), layout.result_bytes)
        got = memory.at(outs[rank], nbytes).view(_DTYPES[dtype])
        assert np.array_equal(got, want), (rank, count, size)


@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "float16", "int32"])
@pytest.mark.parametrize("size", [1, 2, 3, 4, 8])
def test_every_rank_gets_the_sum(size, dtype, in_place):
    for count in (0, 1, 5, 7, 64, 1000, 4099):
        _run(count, size, dtype, in_place)


@settings(max_examples=examples(60), deadline=None)
@given(st.integers(0, 5000), st.integers(1, 8))
def test_chunks_cover_the_input_once_in_16_byte_multiples(count, size):
    for itemsize in (2, 4):
        spans = chunk_spans(count, itemsize, size)
        assert sum(n for _o, n in spans) == count * itemsize
        assert all(a[0] + a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))
        assert chunk_elements(count, itemsize, size) * itemsize % 16 == 0
