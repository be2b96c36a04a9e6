"""Device memory across virtual nodes: the hierarchical all-gather (both shapes) and the
ring's MPI hops, with device pointers handed to a CUDA-aware MPI and staged through the
host. Run on a GPU node, e.g. ``mpiexec -n 4 python -m pytest --with-mpi tests/gpu``."""

from __future__ import annotations

import pytest

import ipcshare
from ipcshare.collectives.across_nodes.mpi_path import MPI_CUDA_AWARE_ENV, mpi_cuda_aware
from ipcshare.patterns import make_pattern
from ipcshare.patterns.driver import run_pattern
from ipcshare.runtime.config import merge_options
from ipcshare.topology.world import VIRTUAL_NODES_ENV

pytestmark = [pytest.mark.gpu, pytest.mark.mpi]


def _staging_modes() -> list[str]:
    """Host staging always; device pointers only where the MPI says it takes them."""
    try:
        return ["0", "1"] if mpi_cuda_aware() else ["0"]
    except Exception:
        return ["0"]


@pytest.mark.parametrize("staged", _staging_modes(), ids=lambda v: f"cuda-aware={v}")
@pytest.mark.parametrize("op", ["allgather", "ring"])
@pytest.mark.parametrize("nodes", [2, 3])
def test_device_memory_crosses_virtual_nodes_bit_exact(comm, monkeypatch, nodes, op, staged):
    if nodes > comm.size:
        pytest.skip(f"{nodes} virtual nodes need {nodes} ranks")
    monkeypatch.setenv(VIRTUAL_NODES_ENV, str(nodes))
    monkeypatch.setenv(MPI_CUDA_AWARE_ENV, staged)
    opts = merge_options({"backend": "cuda-vmm", "iters": 3, "warmup": 1, "checks": 2,
                          "min_bytes": 1, "max_bytes": 9 << 20, "step_factor": 13,
                          "datatype": "uint8"})
    with ipcshare.Group(backend="cuda-vmm") as g:
        result = run_pattern(g, make_pattern(op), opts, emit=lambda _line: None)
    assert result.nodes == nodes
    assert comm.allgather(result.wrong_total) == [0] * comm.size
