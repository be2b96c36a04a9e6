"""The all-to-all bench on GPUs reports a call the kernel refused as the error it is, on
every rank, never as wrong elements. On 4 x H200 (2026-11-28) the eager
all-to-all-v refused every random-split size at 4 ranks (a segment past its slot of
max_bytes over the ranks but one), moved nothing, and the sweep had called every element
of the untouched outputs wrong."""

from __future__ import annotations

import pytest

import ipcshare
from ipcshare.patterns import make_pattern
from ipcshare.patterns.driver import run_pattern
from ipcshare.runtime.config import merge_options
from ipcshare.runtime.errors import CollectiveError, KernelCompileError

pytestmark = [pytest.mark.gpu, pytest.mark.mpi, pytest.mark.nvrtc]


def test_a_split_the_eager_kernel_refuses_is_an_error_on_every_rank(comm):
    if not 3 <= comm.size <= 8:
        pytest.skip("at 2 ranks an eager slot holds any segment; kernels take 8 ranks")
    # 512 KiB of float32 a rank: the seeded random splits send one peer 1.04x (3 ranks)
    # to 2.37x (8 ranks) a slot.
    options = merge_options({"backend": "cuda-vmm", "iters": 2, "warmup": 1, "checks": 1,
                             "min_bytes": 512 << 10, "max_bytes": 512 << 10,
                             "datatype": "float32", "algo": "eager"})
    with ipcshare.Group(backend="cuda-vmm") as g:
        if g.time_sliced_gpus:   # the same on every rank
            pytest.skip("ranks take turns on a GPU: every all-to-all is refused there")
        pattern = make_pattern("alltoall", "eager", splits="random")
        try:
            run_pattern(g, pattern, options, emit=lambda _line: None)
        except KernelCompileError as exc:   # the same on every rank
            pytest.skip(f"needs NVRTC: {exc}")
        except CollectiveError as exc:
            message = str(exc)
        else:
            message = "no error"
    assert "algo='eager' lands in one slot" in message, message
    assert "no element moved" in message
    assert len(set(comm.allgather(message.split(" sends rank")[0]))) == 1
