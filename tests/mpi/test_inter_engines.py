"""The hierarchical all-reduce and reduce-scatter across virtual nodes with ``--inter mpi``
on the host backend (at -n 4 K=2 is 2 nodes x 2 ranks, at -n 2 it is 2 x 1; -n 3 makes
uneven nodes, which these collectives refuse), and how the engine between nodes is chosen
and refused on every rank."""

from __future__ import annotations

import numpy as np
import pytest

import ipcshare
import ipcshare.collectives.across_nodes.choice as inter_engine_module
import ipcshare.collectives.across_nodes.mpi_path as mpi_path_module
from ipcshare.collectives.across_nodes.choice import open_inter_engine
from ipcshare.runtime.errors import ConfigError
from ipcshare.topology.world import VIRTUAL_NODES_ENV

from ..node_runs import run_across_nodes

pytestmark = pytest.mark.mpi


@pytest.fixture
def even_nodes(comm, monkeypatch):
    """Two virtual nodes of as many ranks each (2 x 1 at -n 2, 2 x 2 at -n 4)."""
    if comm.size % 2 or comm.size < 2:
        pytest.skip(f"two nodes of equal size need an even number of ranks, not {comm.size}")
    monkeypatch.setenv(VIRTUAL_NODES_ENV, "2")


def _run(name, *, inter="mpi", algo="auto", **options):
    return run_across_nodes(name, "host", inter, algo=algo, **options)


# Sizes from one element (fewer than the ranks of a node: the all-reduce's tail path) up
# to 256 KiB, and a count no node size divides (5 elements at 20 bytes of float32).
@pytest.mark.parametrize("op", ["allreduce", "reducescatter"])
@pytest.mark.parametrize("reduction,datatype", [("sum", "float32"), ("max", "bfloat16"),
                                                ("min", "int32"), ("sum", "float16")])
def test_hierarchical_reductions_are_bit_exact(comm, even_nodes, op, reduction, datatype):
    result = _run(op, min_bytes=4, max_bytes=256 << 10, step_factor=16, op=reduction,
                  datatype=datatype)
    assert result.nodes == 2 and result.inter == "mpi"
    assert result.to_dict()["inter"] == "mpi"
    assert all(set(row.modes) == {"out-of-place", "in-place"} for row in result.rows)
    assert comm.allgather(result.wrong_total) == [0] * comm.size
    odd = _run(op, min_bytes=20 * comm.size, max_bytes=20 * comm.size, op=reduction,
               datatype=datatype)
    assert comm.allgather(odd.wrong_total) == [0] * comm.size


@pytest.mark.parametrize("op", ["allreduce", "reducescatter"])
def test_hierarchical_reductions_through_host_staging(comm, even_nodes, op, monkeypatch):
    # The path device memory takes with an MPI that is not CUDA-aware, run on host memory.
    monkeypatch.setattr(mpi_path_module, "mpi_path_mode", lambda _backend: "host-staged")
    result = _run(op, min_bytes=4096, max_bytes=64 << 10, step_factor=16)
    assert comm.allgather(result.wrong_total) == [0] * comm.size


def test_hierarchical_allgather_names_its_engine(comm, even_nodes):
    result = _run("allgather", min_bytes=1, max_bytes=64 << 10, step_factor=256,
                  datatype="uint8")
    assert result.inter == "mpi" and comm.allgather(result.wrong_total) == [0] * comm.size


def test_a_wrong_rail_sum_is_caught(comm, even_nodes, monkeypatch):
    # A rail all-reduce that adds one to the result on rank 0's rail only: the ranks of
    # that rail (and their node's all-gather) must see wrong elements, not the others.
    from ipcshare.collectives.across_nodes import mpi_engine as inter_mpi

    original = inter_mpi.MpiInterEngine.all_reduce

    def off_by_one(self, engine, buffer, dtype, op):
        run = original(self, engine, buffer, dtype, op)
        if comm.rank != 0:
            return run

        def corrupted():
            run()
            np.asarray(buffer).view(np.int32)[0] += 1
        return corrupted
    monkeypatch.setattr(inter_mpi.MpiInterEngine, "all_reduce", off_by_one)
    result = _run("allreduce", min_bytes=64 * comm.size, max_bytes=64 * comm.size,
                  datatype="int32")
    wrong = comm.allgather(result.wrong_total)
    assert wrong[0] > 0 and len(set(wrong)) == 1  # wrong_total is summed over ranks


def test_uneven_nodes_are_refused_on_every_rank(comm, monkeypatch):
    if comm.size != 3:
        pytest.skip("uneven virtual nodes: 3 ranks as 2 + 1")
    monkeypatch.setenv(VIRTUAL_NODES_ENV, "2")
    with pytest.raises(ConfigError, match=r"needs as many ranks on every node.* 1, 2 ranks"):
        _run("allreduce")


def test_inter_nccl_on_host_memory_is_refused_on_every_rank(comm, even_nodes):
    with pytest.raises(ConfigError, match=r"inter='nccl' .* needs a GPU backend"):
        _run("allreduce", inter="nccl")


def test_an_engine_that_fails_on_one_rank_fails_on_every_rank(comm, even_nodes, monkeypatch):
    if comm.rank == comm.size - 1:
        def missing(requested, backend_name):
            raise ConfigError("--inter nccl needs nccl4py, which is not importable here")
        monkeypatch.setattr(inter_engine_module, "resolve_inter", missing)
    with ipcshare.Group(backend="host") as g:
        with pytest.raises(ConfigError, match=rf"failed on rank {comm.size - 1}@.*nccl4py"):
            open_inter_engine("mpi", g)  # fine everywhere else
        g.barrier()  # nobody was left behind in a collective


def test_ranks_that_would_mix_engines_are_refused(comm, even_nodes, monkeypatch):
    chosen = "nccl" if comm.rank == 0 else "mpi"
    monkeypatch.setattr(inter_engine_module, "resolve_inter", lambda _r, _b: chosen)
    with ipcshare.Group(backend="host") as g:
        with pytest.raises(ConfigError, match=r"resolves to different engines: rank 0 gets "
                                              r"'?nccl"):
            open_inter_engine("auto", g)
