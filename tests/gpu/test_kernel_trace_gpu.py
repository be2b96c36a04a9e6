"""The kernels' phase stamps on GPUs (kernels/include/ipcshare/trace.cuh, kernels/trace.py):
a group made with IPCSHARE_KERNEL_TRACE=1 builds the stamped kernels, each traced
all-to-all kernel (pull, balanced, ll, push; even and random splits) still delivers every
byte, and block 0 of every call reaches every mark its kernel names, in order on both
clocks, with the cycle-to-nanosecond ratio of an SM's clock (0.3-2 ns a cycle); every
block's span is stamped; a CUDA graph of several calls leaves each call in a slot of its
own, each call's blocks starting after the one before ended (one stream). Run under
mpiexec with one GPU per rank (or GPUs shared under MPS)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from ipcshare.collectives.algorithms import algorithm
from ipcshare.kernels.trace import KERNEL_MARKS, KernelTrace, call_spans, ns_per_cycle
from ipcshare.patterns.alltoall import split_matrix
from ipcshare.runtime import settings

from .torch_communicator import torch_communicator

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu, pytest.mark.mpi]


@pytest.fixture(scope="module")
def traced():
    before = os.environ.get(settings.KERNEL_TRACE)
    os.environ[settings.KERNEL_TRACE] = "1"
    try:
        with torch_communicator("cuda-vmm", 4 << 20) as (group, comm, stream):
            if group.time_sliced_gpus:
                pytest.skip("ranks here take turns on a GPU (no MPS): all-to-all is refused")
            yield group, comm, stream, KernelTrace(group.backend.kernels("collectives.cu"))
    finally:
        if before is None:
            os.environ.pop(settings.KERNEL_TRACE, None)
        else:
            os.environ[settings.KERNEL_TRACE] = before


@pytest.mark.parametrize("splits", ["even", "random"])
@pytest.mark.parametrize("algo", ["pull", "balanced", "ll", "push", "eager"])
def test_every_traced_kernel_reaches_its_marks_in_order_and_moves_every_byte(traced, algo,
                                                                           splits):
    group, comm, stream, trace = traced
    n, me, device = comm.size, comm.rank, group.backend.device
    # eager runs all_to_all_v only: even splits as counts.
    op = "all_to_all" if splits == "even" and algo != "eager" else "all_to_all_v"
    kernel = algorithm("cuda", op, algo).kernel
    names = KERNEL_MARKS[kernel]
    count = 40_000 // n * n
    m = split_matrix(splits, count, n)
    inputs = [np.random.default_rng([q, 3]).integers(0, 256, count * 4, dtype=np.uint8)
              for q in range(n)]
    want = np.concatenate([inputs[q][int(m[q, :me].sum()) * 4:int(m[q, :me + 1].sum()) * 4]
                           for q in range(n)])
    source = torch.from_numpy(inputs[me].copy()).to(f"cuda:{device}").view(torch.float32)
    out = torch.zeros(max(count, int(m.sum(axis=0).max())), dtype=torch.float32,
                      device=f"cuda:{device}")
    calls = []
    for _ in range(3):
        trace.reset(stream.cuda_stream)
        if op == "all_to_all":
            comm.all_to_all(out[:count], source, algo=algo, stream=stream)
        else:
            comm.all_to_all_v(out, source, m[:, me].tolist(), m[me].tolist(), algo=algo,
                              stream=stream)
        comm.synchronize(stream)
        assert np.array_equal(out.view(torch.uint8).cpu().numpy()[:want.nbytes], want)
        read = trace.read()
        stamps = read.stamps[0]
        assert not read.stamps[1:].any() and not read.spans[1:].any()   # one call: slot 0
        first, last, blocks = call_spans(read.spans)[0]
        assert blocks >= 1 and first <= last
        block0 = stamps[0, :len(names)]
        assert np.all(block0[:, 1] != 0), (kernel, block0[:, 1])     # every mark reached
        assert np.all(np.diff(block0[:, 0].astype(np.int64)) >= 0), kernel   # cycles
        assert np.all(np.diff(block0[:, 1].astype(np.int64)) >= 0), kernel   # globaltimer
        assert np.all(stamps[:, len(names):] == 0)                # no mark past its names
        calls.append(stamps)
    assert 0.3 <= ns_per_cycle(calls) <= 2.0


@pytest.mark.parametrize("algo", ["balanced", "eager"])
def test_a_graph_of_calls_leaves_each_call_in_its_own_slot_one_after_another(traced, algo):
    group, comm, stream, trace = traced
    n, me, device = comm.size, comm.rank, group.backend.device
    names = KERNEL_MARKS[algorithm("cuda", "all_to_all_v", algo).kernel]
    count = 40_000 // n * n
    m = split_matrix("random", count, n)
    source = torch.arange(count, dtype=torch.float32, device=f"cuda:{device}") + 1e6 * me
    out = torch.zeros(int(m.sum(axis=0).max()), dtype=torch.float32, device=f"cuda:{device}")

    def call():
        comm.all_to_all_v(out, source, m[:, me].tolist(), m[me].tolist(), algo=algo,
                          stream=stream)

    call()   # bound before the capture
    comm.synchronize(stream)
    graph, calls = torch.cuda.CUDAGraph(), 5
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(calls):
            call()
    with torch.cuda.stream(stream):
        for _ in range(2):
            trace.reset(stream.cuda_stream)
            graph.replay()
            comm.synchronize(stream)
            read = trace.read()
            spans = call_spans(read.spans)
            assert all(edges is not None for edges in spans[:calls]), spans
            assert all(edges is None for edges in spans[calls:]), spans
            for slot in range(calls):
                block0 = read.stamps[slot, 0, :len(names)]
                assert np.all(block0[:, 1] != 0), (slot, block0[:, 1])
                # The slots all saw the same grid.
                assert spans[slot][2] == spans[0][2]
            for before, after in zip(spans[:calls - 1], spans[1:calls], strict=True):
                # One stream: the next kernel's first block starts after the last mark of
                # this one (a globaltimer tick of slack).
                assert after[0] + 1_000 >= before[1], (before, after)
    expected_from = [torch.arange(count, dtype=torch.float32) + 1e6 * q for q in range(n)]
    want = torch.cat([expected_from[q][int(m[q, :me].sum()):int(m[q, :me + 1].sum())]
                      for q in range(n)])
    assert torch.equal(out[:want.numel()].cpu(), want)
