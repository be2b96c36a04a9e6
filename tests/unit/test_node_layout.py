"""Virtual node blocks and the node segments of the hierarchical all-gather (no MPI)."""

from __future__ import annotations

import pytest

from ipcshare.errors import ConfigError
from ipcshare.patterns import make_pattern
from ipcshare.patterns.allgather_hierarchical import HierarchicalAllGather, node_segments
from ipcshare.topology import virtual_node_blocks


@pytest.mark.parametrize(("size", "nodes", "expected"), [
    (4, 2, [0, 0, 1, 1]), (3, 2, [0, 0, 1]), (3, 3, [0, 1, 2]), (5, 3, [0, 0, 1, 1, 2]),
    (4, 1, [0, 0, 0, 0]),
])
def test_virtual_nodes_are_consecutive_blocks_larger_first(size, nodes, expected):
    assert virtual_node_blocks(size, nodes) == expected


@pytest.mark.parametrize("nodes", [0, 5])
def test_virtual_node_count_outside_one_to_size_is_refused(nodes):
    with pytest.raises(ConfigError, match="IPCSHARE_VIRTUAL_NODES"):
        virtual_node_blocks(4, nodes)


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


def test_pair_paths_name_gpus_without_peer_access():
    from ipcshare.cli.info import pair_paths

    p2p = [{"src": 0, "dst": 1, "access": False}, {"src": 1, "dst": 0, "access": False},
           {"src": 0, "dst": 2, "access": True}, {"src": 2, "dst": 0, "access": True}]
    facts = [{"node": 0, "device": d, "cuda_visible_devices": None, "p2p": p2p}
             for d in (0, 1, 2)] + [{"node": 1}]
    paths = pair_paths(facts)
    assert paths[0] == ["-", "no-p2p", "direct", "mpi"]
    assert paths[2][0] == "direct" and paths[3] == ["mpi", "mpi", "mpi", "-"]
