"""Virtual node blocks and the node segments of the hierarchical all-gather (no MPI)."""

from __future__ import annotations

import pytest

from ipcshare.collectives.across_nodes.hierarchy import node_segments
from ipcshare.patterns import make_pattern
from ipcshare.patterns.allgather_hierarchical import HierarchicalAllGather
from ipcshare.runtime.errors import ConfigError
from ipcshare.topology.world import virtual_node_blocks


@pytest.mark.parametrize(("size", "nodes", "expected"), [
    (4, 2, [0, 0, 1, 1]), (3, 2, [0, 0, 1]), (3, 3, [0, 1, 2]), (5, 3, [0, 0, 1, 1, 2]),
    (4, 1, [0, 0, 0, 0]),
])
def test_virtual_nodes_are_consecutive_blocks_larger_first(size, nodes, expected):
    assert virtual_node_blocks(size, nodes) == expected


@pytest.mark.parametrize(("nodes", "says"), [
    (0, "IPCSHARE_VIRTUAL_NODES=0: the job needs at least 1 virtual node"),
    (-1, "IPCSHARE_VIRTUAL_NODES=-1: the job needs at least 1 virtual node"),
    (5, "IPCSHARE_VIRTUAL_NODES=5 asks for more virtual nodes than the 4 rank(s)"),
])
def test_virtual_node_count_outside_one_to_size_is_refused(nodes, says):
    with pytest.raises(ConfigError) as refused:
        virtual_node_blocks(4, nodes)
    assert str(refused.value).startswith(says), refused.value


def test_node_segments_follow_the_rank_order():
    assert node_segments([0, 0, 1]) == [(0, 2), (2, 1)]
    assert node_segments([0, 1, 1, 1, 2]) == [(0, 1), (1, 3), (4, 1)]


def test_interleaved_nodes_are_refused_with_the_placement_fix():
    with pytest.raises(ConfigError, match=r"node 0 holds ranks \[0, 2\].*--distribution=block"):
        node_segments([0, 1, 0, 1])


def test_hierarchical_is_an_allgather_algorithm_but_not_a_ring_one():
    assert isinstance(make_pattern("allgather", "hierarchical"), HierarchicalAllGather)
    with pytest.raises(ConfigError, match="ring op has no 'hierarchical' algorithm"):
        make_pattern("ring", "hierarchical")


def _p2p(count: int, without: set[frozenset[int]]) -> list[dict]:
    return [{"src": s, "dst": d, "access": frozenset((s, d)) not in without,
             "why": "disabled by IPCSHARE_DISABLE_P2P" if frozenset((s, d)) in without else ""}
            for s in range(count) for d in range(count) if s != d]


def test_pair_paths_stage_gpus_without_peer_access_through_host_memory():
    from ipcshare.cli.info import PAIR_PATHS, pair_paths

    p2p = [{"src": 0, "dst": 1, "access": False}, {"src": 1, "dst": 0, "access": False},
           {"src": 0, "dst": 2, "access": True}, {"src": 2, "dst": 0, "access": True}]
    facts = [{"node": 0, "device": d, "cuda_visible_devices": None, "p2p": p2p}
             for d in (0, 1, 2)] + [{"node": 1}]
    paths = pair_paths(facts)
    # 0-1 has no relay: GPU 2 reaches GPU 0 but not GPU 1 (no 1-2 row says it may).
    assert paths[0] == ["-", "host-staged", "direct", "mpi"]
    assert paths[2][0] == "direct" and paths[3] == ["mpi", "mpi", "mpi", "-"]
    assert {cell for row in paths for cell in row} - {"-"} <= set(PAIR_PATHS)


def test_pair_paths_relay_through_a_third_gpu_and_follow_the_forced_fallback():
    from ipcshare.cli.info import node_path_plans, pair_paths

    p2p = _p2p(4, {frozenset((0, 2)), frozenset((1, 3))})
    facts = [{"rank": d, "node": 0, "device": d, "cuda_visible_devices": None, "p2p": p2p,
              "p2p_fallback": ""} for d in range(4)]
    paths = pair_paths(facts)
    assert paths[0] == ["-", "direct", "relay", "direct"]
    assert paths[1][3] == paths[3][1] == "relay"
    plan = node_path_plans(facts)[0]
    assert plan.path(0, 2).relay == 1 and plan.path(1, 3).relay == 0
    assert "disabled by IPCSHARE_DISABLE_P2P" in plan.path(0, 2).reason
    for fact in facts:
        fact["p2p_fallback"] = "host"
    assert pair_paths(facts)[0] == ["-", "direct", "host-staged", "direct"]
    for fact in facts:
        fact["p2p_fallback"] = "sideways"
    with pytest.raises(ConfigError, match="IPCSHARE_P2P_FALLBACK='sideways'"):
        pair_paths(facts)


def test_a_group_over_something_that_is_no_communicator_is_refused_by_name():
    # It used to fail with AttributeError: 'int' object has no attribute 'Get_rank'.
    from ipcshare.topology.world import World

    with pytest.raises(ConfigError, match=r"^comm=42 \(int\) is not an MPI communicator: pass"):
        World.from_comm(42)
