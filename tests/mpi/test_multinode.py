"""Node-aware groups, hierarchical all-gather and the ring across nodes, on virtual nodes
(``IPCSHARE_VIRTUAL_NODES``): at -n 4 K=2 is 2 nodes x 2 ranks and K=3 is uneven
(2, 1, 1); at -n 3 K=2 is uneven (2, 1) and K=3 is 3 x 1; at -n 2 K=2 is 2 x 1."""

from __future__ import annotations

import numpy as np
import pytest

import ipcshare
import ipcshare.collectives.across_nodes.mpi_path as mpi_path_module
from ipcshare.patterns import make_pattern
from ipcshare.patterns.driver import run_pattern
from ipcshare.runtime.config import merge_options
from ipcshare.runtime.errors import ConfigError, WindowError
from ipcshare.topology.world import VIRTUAL_NODES_ENV, World, virtual_node_blocks

pytestmark = pytest.mark.mpi


@pytest.fixture(params=[2, 3], ids=["K2", "K3"])
def nodes(request, comm, monkeypatch):
    """K virtual nodes over this job's ranks (skips where K exceeds the ranks)."""
    k = request.param
    if k > comm.size:
        pytest.skip(f"{k} virtual nodes need {k} ranks")
    monkeypatch.setenv(VIRTUAL_NODES_ENV, str(k))
    return k


def _run(op, algo="auto", **options):
    opts = merge_options({"backend": "host", "iters": 2, "warmup": 1, "checks": 2, **options})
    with ipcshare.Group(backend="host") as g:
        return run_pattern(g, make_pattern(op, algo), opts, emit=lambda _line: None)


def test_ranks_split_into_blocks_of_consecutive_ranks(comm, nodes):
    world = World.from_comm()
    try:
        expected = virtual_node_blocks(comm.size, nodes)
        assert world.node_of_rank == expected and world.node_count == nodes
        assert world.virtual_nodes == nodes
        assert world.local_ranks == [r for r in range(comm.size) if expected[r] == expected[
            comm.rank]]
        assert world.local_comm.Get_size() == world.local_size == len(world.local_ranks)
        assert world.local_ranks[world.local_rank] == comm.rank
        # One rail per local rank; rail 0 is the leaders' communicator.
        rail = world.rail_comm
        assert rail.allgather(world.local_rank) == [world.local_rank] * rail.Get_size()
        assert rail.allgather(world.node_index) == sorted(rail.allgather(world.node_index))
        assert (world.leader_comm is not None) == world.is_leader == (world.local_rank == 0)
        leaders = comm.allgather(world.rank if world.is_leader else None)
        assert [r for r in leaders if r is not None] == [world.node_ranks(k)[0]
                                                         for k in range(nodes)]
        if world.is_leader:
            assert world.leader_comm.Get_size() == nodes
        assert world.host_size == comm.size  # one machine under the virtual nodes
    finally:
        world.close()


def test_a_group_over_part_of_the_job_keeps_every_rank_on_its_node(comm, nodes):
    job = World.from_comm()
    reversed_comm = comm.Split(0, key=comm.size - comm.rank)  # rank order turned around
    per_node = comm.Split(job.node_index, key=comm.rank)      # what the doctor does
    worlds = [World.from_comm(reversed_comm), World.from_comm(per_node)]
    try:
        job_ranks = reversed_comm.allgather(comm.rank)
        nodes_here = reversed_comm.allgather(job.node_index)
        shared = worlds[0].node_of_rank
        assert all((shared[a] == shared[b]) == (nodes_here[a] == nodes_here[b])
                   for a in range(len(job_ranks)) for b in range(len(job_ranks)))
        assert worlds[1].node_count == 1 and worlds[1].local_size == job.local_size
    finally:
        for world in [*worlds, job]:
            world.close()
        reversed_comm.Free()
        per_node.Free()


def test_peers_of_a_node_write_each_other_and_remote_ranks_are_refused(comm, nodes):
    with ipcshare.Group(backend="host") as g:
        w = g.window(4096)
        world = g.world
        mine = np.asarray(w.local).view(np.int64)
        mine[:] = -1
        w.barrier()
        for peer in world.local_ranks:  # every local peer (self included) gets our mark
            np.asarray(w.peer(peer)).view(np.int64)[g.rank] = 1000 + g.rank
        w.barrier()
        seen = [int(v) for v in mine[:g.size]]
        assert seen == [1000 + r if r in world.local_ranks else -1 for r in range(g.size)]
        for r in range(g.size):
            assert w.is_local(r) == (world.node_of_rank[r] == world.node_index)
            if not w.is_local(r):
                assert w.buffer_ptrs[r] == 0 and w.signal_pad_ptrs[r] == 0
                with pytest.raises(WindowError, match=rf"rank {r} is on virtual node "
                                   rf"{world.node_of_rank[r]} .*reach it through MPI"):
                    w.peer(r)
        with pytest.raises(WindowError, match="not in this group"):
            w.is_local(g.size)
        w.close()


@pytest.mark.parametrize("algo", ["auto", "hierarchical"])
def test_hierarchical_allgather_is_bit_exact_in_both_modes(comm, nodes, algo):
    result = _run("allgather", algo, min_bytes=1, max_bytes=1 << 20, step_factor=64,
                  datatype="uint8")
    assert result.nodes == nodes
    assert [set(row.modes) for row in result.rows] == [{"out-of-place", "in-place"}] * 4
    assert [row.wrong for row in result.rows] == [0] * len(result.rows)
    assert comm.allgather(result.wrong_total) == [0] * comm.size


def test_hierarchical_allgather_through_host_staging(comm, nodes, monkeypatch):
    # The path GPU memory takes without a CUDA-aware MPI, run here on host memory.
    monkeypatch.setattr(mpi_path_module, "mpi_path_mode", lambda _backend: "host-staged")
    result = _run("allgather", "hierarchical", min_bytes=4096, max_bytes=64 << 10,
                  step_factor=16)
    assert comm.allgather(result.wrong_total) == [0] * comm.size


def test_ring_crosses_nodes_through_mpi(comm, nodes, monkeypatch):
    result = _run("ring", min_bytes=8, max_bytes=256 << 10, step_factor=32, datatype="float64")
    assert result.nodes == nodes and result.wrong_total == 0
    monkeypatch.setattr(mpi_path_module, "mpi_path_mode", lambda _backend: "host-staged")
    staged = _run("ring", min_bytes=4096, max_bytes=4096)
    assert comm.allgather(staged.wrong_total) == [0] * comm.size


def test_a_corrupted_remote_block_is_caught_on_the_ranks_that_got_it(comm, nodes):
    pattern = make_pattern("allgather", "hierarchical")
    with ipcshare.Group(backend="host") as g:
        plan = pattern.plan(4096 * g.size, g.size, 4)
        w = g.window(pattern.window_bytes(plan, g.size))
        pattern.prepare(w, plan, "out-of-place", 0)
        w.barrier()
        pattern.bind(w, plan, "out-of-place")()
        w.barrier()
        # Rank 0's leader corrupts one element of the last node's segment after the run.
        last = g.world.node_ranks(nodes - 1)[0]
        if g.world.is_leader and g.world.node_index == 0:
            out = np.asarray(w.local)[4096 + last * plan.block_bytes:].view(np.uint32)
            out[0] ^= 1
        w.barrier()
        wrong = pattern.check(w, plan, "out-of-place", 0)
        expected = 1 if g.world.is_leader and g.world.node_index == 0 else 0
        assert wrong == expected
        w.close()


def test_the_single_copy_algorithm_is_refused_across_nodes(comm, nodes):
    with pytest.raises(ConfigError, match=rf"copy-engine .* spans {nodes} nodes: use --algo "
                       "hierarchical"):
        _run("allgather", "copy-engine", min_bytes=1024, max_bytes=1024)


def test_bad_virtual_node_counts_fail_on_every_rank(comm, monkeypatch):
    monkeypatch.setenv(VIRTUAL_NODES_ENV, str(comm.size + 1))
    with pytest.raises(ConfigError, match=rf"{VIRTUAL_NODES_ENV}={comm.size + 1} asks for "
                       rf"more virtual nodes than the {comm.size} rank"):
        World.from_comm()
    monkeypatch.setenv(VIRTUAL_NODES_ENV, "two")
    with pytest.raises(ConfigError, match="is not a number of nodes"):
        ipcshare.Group(backend="host")
    if comm.size > 1:
        if comm.rank == 0:
            monkeypatch.delenv(VIRTUAL_NODES_ENV)
        else:
            monkeypatch.setenv(VIRTUAL_NODES_ENV, "1")
        with pytest.raises(ConfigError, match="differs between ranks"):
            World.from_comm()
    monkeypatch.delenv(VIRTUAL_NODES_ENV, raising=False)
    world = World.from_comm()  # nothing was left half set up
    assert world.node_count == 1 and world.virtual_nodes is None and world.leader_comm is None
    world.close()
