"""The kernels' phase stamps on GPUs (kernels/include/ipcshare/trace.cuh, kernels/trace.py):
a group made with IPCSHARE_KERNEL_TRACE=1 builds the stamped kernels, each traced
all-to-all kernel (pull, balanced, ll, push; even and random splits) still delivers every
byte, and block 0 of every call reaches every mark its kernel names, in order on both
clocks, with the cycle-to-nanosecond ratio of an SM's clock (0.3-2 ns a cycle). Run under
mpiexec with one GPU per rank (or GPUs shared under MPS)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from ipcshare.collectives.algorithms import algorithm
from ipcshare.kernels.trace import KERNEL_MARKS, KernelTrace, ns_per_cycle
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
        stamps = trace.read()
        block0 = stamps[0, :len(names)]
        assert np.all(block0[:, 1] != 0), (kernel, block0[:, 1])     # every mark reached
        assert np.all(np.diff(block0[:, 0].astype(np.int64)) >= 0), kernel   # cycles
        assert np.all(np.diff(block0[:, 1].astype(np.int64)) >= 0), kernel   # globaltimer
        assert np.all(stamps[:, len(names):] == 0)                # no mark past its names
        calls.append(stamps)
    assert 0.3 <= ns_per_cycle(calls) <= 2.0
