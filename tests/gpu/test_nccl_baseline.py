"""The NCCL baseline: timed and verified in the same run as ours (needs torch with NCCL
and one GPU per rank)."""

from __future__ import annotations

import pytest

import ipcshare
from ipcshare.config import merge_options
from ipcshare.errors import ConfigError
from ipcshare.patterns import make_pattern
from ipcshare.patterns.driver import run_pattern

pytestmark = [pytest.mark.gpu, pytest.mark.mpi]


def _torch_with_nccl():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_nccl_available():
        pytest.skip("torch has no NCCL")
    return torch


@pytest.mark.parametrize("op", ["allgather", "ring"])
def test_nccl_baseline_is_timed_and_verified_beside_ours(comm, op):
    _torch_with_nccl()
    from ipcshare.patterns.baseline_nccl import NcclBaseline

    options = merge_options({"backend": "cuda-vmm", "iters": 3, "warmup": 1, "checks": 1,
                             "min_bytes": 1000, "max_bytes": 1 << 20, "step_factor": 32,
                             "datatype": "uint8"})
    with ipcshare.Group(backend="cuda-vmm") as g:
        places = comm.allgather((g.world.hostname, g.backend.uuid))
        if len(set(places)) < len(places):
            with pytest.raises(ConfigError, match="NCCL needs one GPU per rank"):
                NcclBaseline(g.world, op, g.backend.device)
            return
        baseline = NcclBaseline(g.world, op, g.backend.device)
        try:
            result = run_pattern(g, make_pattern(op), options, baseline=baseline,
                                 emit=lambda _line: None)
        finally:
            baseline.close()
    assert result.wrong_total == 0
    assert result.baseline is not None and result.baseline.name == "nccl"
    assert result.baseline.version.startswith("NCCL ") and "torch" in result.baseline.version
    assert len(result.baseline.rows) == len(result.rows)
    assert all(row.wrong == 0 and row.primary.time_us > 0 for row in result.baseline.rows)


def test_nccl_baseline_needs_a_gpu_backend(comm):
    from ipcshare.patterns.baseline_nccl import NcclBaseline

    with ipcshare.Group(backend="host") as g:
        with pytest.raises(ConfigError, match="needs a GPU backend"):
            NcclBaseline(g.world, "allgather", None)
