"""bench on GPUs: a tiny suite of the three collectives, every algorithm of the
reductions and ll, eager and in CUDA graphs, verified, beside NCCL and PyTorch symmetric
memory where they run (skipped with their reason where they do not)."""

from __future__ import annotations

import pytest

from ipcshare.bench.runner import run_suite
from ipcshare.bench.suite import parse_suite
from ipcshare.topology.world import World

pytestmark = [pytest.mark.gpu, pytest.mark.mpi]


def test_a_gpu_suite_of_reductions_and_ll_verifies_every_case(comm, gpus):
    if comm.size > gpus:
        pytest.skip(f"a bench wants one GPU per rank: {comm.size} ranks, {gpus} GPU(s)")
    suite = parse_suite({
        "backends": ["cuda-vmm"], "baselines": ["nccl", "torch-symm"], "min_bytes": "1K",
        "max_bytes": "1M", "step_factor": 32, "iters": 3, "warmup": 1, "checks": 2,
        "datatype": "bfloat16",
        "cases": [{"ops": ["allreduce", "reducescatter"], "reductions": ["sum", "max"],
                   "algorithms": ["auto", "one-shot", "two-shot", "ll"],
                   "timing": ["nccl-tests", "graph"]},
                  {"ops": ["allgather"], "algorithms": ["ll"], "timing": ["graph"]}]},
        source="gpu-reductions.yaml", resolve_backend=lambda b: b)
    world = World.from_comm()
    try:
        result = run_suite(suite, world, emit=lambda _line: None)
    finally:
        world.close()
    assert result.wrong_total == 0
    docs = result.documents()
    labels = [doc["case"] for doc in docs]
    assert "allreduce max bfloat16 cuda-vmm ll graph" in labels
    assert "reducescatter sum bfloat16 cuda-vmm one-shot nccl-tests" in labels
    assert labels[-1] == "allgather cuda-vmm ll graph" and len(labels) == 2 * 2 * 7 + 1
    for doc in docs:
        assert all(row["wrong"] == 0 and row["time_us"] > 0 for row in doc["rows"])
        names = {b["name"] for b in doc["baselines"]} | {
            s["name"] for s in doc["skipped_baselines"]}
        assert names == {"nccl", "torch-symm"}, doc["case"]
        if doc["op"] != "allreduce":
            assert any(s["name"] == "torch-symm" and "all-reduce only" in s["reason"]
                       for s in doc["skipped_baselines"])
    if comm.rank == 0:
        print({doc["case"]: [row["time_us"] for row in doc["rows"]] for doc in docs})


def _needs_a_gpu_per_rank(comm, gpus: int) -> None:
    """Skip, saying why, unless 2 or more ranks run with one GPU each (a p2p case's need)."""
    if gpus < 2:
        pytest.skip(f"needs 2 GPUs, {gpus} visible")
    if comm.size < 2 or comm.size > gpus:
        pytest.skip(f"the p2p case wants 2 or more ranks, one GPU each: {comm.size} ranks, "
                    f"{gpus} GPU(s)")


def test_a_p2p_case_sets_p2p_direct_against_ipc_and_every_row_verifies(comm, gpus):
    _needs_a_gpu_per_rank(comm, gpus)
    suite = parse_suite({
        "ops": ["p2p"], "backends": ["cuda-vmm"], "min_bytes": "4K", "max_bytes": "4M",
        "step_factor": 32, "iters": 3, "warmup": 1, "checks": 2},
        source="gpu-p2p.yaml", resolve_backend=lambda b: b)
    world = World.from_comm()
    try:
        if world.node_count > 1:
            pytest.skip("P2P direct is one node's GPUs: run this on one node")
        lines: list[str] = []
        result = run_suite(suite, world, emit=lines.append)
    finally:
        world.close()
    docs = result.documents()
    assert [doc["case"] for doc in docs] == ["p2p ring cuda-vmm auto nccl-tests",
                                             "p2p allgather cuda-vmm auto nccl-tests"]
    assert result.wrong_total == 0
    for doc in docs:
        assert doc["skipped"] is None and doc["wrong_total"] == 0, doc["skipped"]
        assert doc["p2p"]["gpus"] == comm.size
        # the reference nodes have NVLink between every pair: both direct modes run
        assert doc["skipped_baselines"] == [], doc["skipped_baselines"]
        assert [b["name"] for b in doc["baselines"]] == ["p2p-kernel", "p2p-copy"]
        sizes = [row["size"] for row in doc["rows"]]
        assert len(sizes) == 3
        for rows in [doc["rows"]] + [b["rows"] for b in doc["baselines"]]:
            assert [row["size"] for row in rows] == sizes
            assert all(row["wrong"] == 0 and row["busbw"] > 0 for row in rows), rows
    if comm.rank == 0:
        assert any(line.startswith("# P2P direct half: python -m ipcshare p2p --no-ipc")
                   for line in lines)
        assert any("op: p2p ring" in line for line in lines)
        print({doc["case"]: {b["name"]: [row["busbw"] for row in b["rows"]]
                             for b in [{"name": "ipc", "rows": doc["rows"]}, *doc["baselines"]]}
               for doc in docs})


def test_a_host_staged_p2p_case_runs_copies_without_peer_access(comm, gpus):
    _needs_a_gpu_per_rank(comm, gpus)
    suite = parse_suite({
        "ops": ["p2p"], "p2p_ops": ["ring"], "p2p_peer_access": ["disabled"],
        "backends": ["cuda-vmm"], "min_bytes": "64K", "max_bytes": "4M", "step_factor": 64,
        "iters": 3, "warmup": 1, "checks": 2},
        source="gpu-p2p-staged.yaml", resolve_backend=lambda b: b)
    world = World.from_comm()
    try:
        if world.node_count > 1:
            pytest.skip("P2P direct is one node's GPUs: run this on one node")
        result = run_suite(suite, world, emit=lambda _line: None)
    finally:
        world.close()
    (doc,) = result.documents()
    assert doc["case"] == "p2p ring host-staged cuda-vmm auto nccl-tests"
    assert doc["p2p_peer_access"] is False and doc["wrong_total"] == 0
    # Copies ran (staged through host memory); the kernel mode cannot without access.
    assert [b["name"] for b in doc["baselines"]] == ["p2p-copy"]
    assert [s["name"] for s in doc["skipped_baselines"]] == ["p2p-kernel"]
    assert "no peer access" in doc["skipped_baselines"][0]["reason"]
    assert all(row["wrong"] == 0 for row in doc["baselines"][0]["rows"])
