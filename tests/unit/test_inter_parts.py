"""The parts of the engines between nodes that need no MPI: the option, the choice and its
refusals, the rail-major block order, the result document's field."""

from __future__ import annotations

import numpy as np
import pytest

from ipcshare.cli.main import build_parser
from ipcshare.collectives.across_nodes.choice import nccl4py_missing, resolve_inter
from ipcshare.collectives.across_nodes.hierarchy import rail_major_moves, rank_order_moves
from ipcshare.patterns import make_pattern
from ipcshare.patterns.results import RunResult
from ipcshare.runtime.config import merge_options
from ipcshare.runtime.errors import ConfigError


def test_inter_option_from_yaml_and_flags():
    assert merge_options({}).inter == "auto"
    assert merge_options({"inter": "mpi"}, {"inter": "nccl"}).inter == "nccl"
    with pytest.raises(ConfigError,
                       match="inter ib: unknown inter; choose one of: auto, nccl, mpi"):
        merge_options({"inter": "ib"})
    args = build_parser().parse_args(["allreduce", "--inter", "nccl"])
    assert args.inter == "nccl"


def test_make_pattern_carries_the_engine_and_refuses_unknown_ones():
    assert make_pattern("allgather", inter="mpi").inter == "mpi"
    assert make_pattern("allreduce", "hierarchical").library_algo == "auto"
    with pytest.raises(ConfigError, match="unknown inter-node engine 'tcp'"):
        make_pattern("allreduce", inter="tcp")


def test_auto_takes_nccl_only_with_a_gpu_backend_and_nccl4py():
    assert resolve_inter("mpi", "cuda-vmm") == "mpi"
    assert resolve_inter("auto", "host") == "mpi"
    assert resolve_inter("auto", "cuda-vmm") == ("mpi" if nccl4py_missing() else "nccl")


def test_nccl_names_what_is_missing():
    with pytest.raises(ConfigError, match=r"needs a GPU backend \(cuda-ipc or cuda-vmm\)"):
        resolve_inter("nccl", "host")
    missing = nccl4py_missing()
    if missing is None:
        assert resolve_inter("nccl", "cuda-ipc") == "nccl"
    else:
        with pytest.raises(ConfigError, match=r"needs nccl4py .*not importable here \("):
            resolve_inter("nccl", "cuda-ipc")


def test_rail_major_order_puts_each_rails_blocks_together():
    # 2 nodes x 3 ranks: chunk j holds the blocks of ranks j and 3 + j.
    moves = rail_major_moves(2, 3, 10)
    assert moves == [(0, 0), (10, 30), (20, 10), (30, 40), (40, 20), (50, 50)]
    assert sorted(t for t, _ in moves) == sorted(s for _, s in moves)  # a permutation


def test_result_document_names_the_engine_only_across_nodes():
    def result(inter):
        return RunResult(version="0", op="allreduce", backend="host", exchange="socket",
                         world_size=4, nodes=2 if inter else 1, timing="eager", devices=[],
                         rows=[], baseline=None, inter=inter)
    assert result("nccl").to_dict()["inter"] == "nccl"
    assert "inter" not in result(None).to_dict()


@pytest.mark.parametrize("nodes,per_node", [(3, 2), (2, 3), (4, 1), (1, 4), (2, 2)])
def test_rank_order_moves_undo_the_local_rank_major_gather(nodes, per_node):
    # What the hierarchical all-gather holds after its node step: local rank j's rail
    # blocks, node by node: the block of rank (node, j) at position j * nodes + node.
    block = 3
    rank = np.arange(nodes * per_node)
    gathered = np.concatenate([np.full(block, node * per_node + j, np.uint8)
                               for j in range(per_node) for node in range(nodes)])
    output = np.zeros_like(gathered)
    for target, source in rank_order_moves(nodes, per_node, block):
        output[target:target + block] = gathered[source:source + block]
    assert np.array_equal(output, np.repeat(rank.astype(np.uint8), block))
