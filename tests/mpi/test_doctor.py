"""The doctor between real ranks, at any world size: the capability matrix on host
memory, a refused pidfd_getfd found pair by pair, meeting points that name a missing
rank, bandwidth, limits, the leak check, and a whole run in-process."""

from __future__ import annotations

import dataclasses

import pytest

import ipcshare.exchange as exchange_module
from ipcshare.doctor import bandwidth, limits, matrix
from ipcshare.doctor.liveness import Checkpoints, PeerLost
from ipcshare.doctor.paths import HOST_PATHS, PATHS_BY_NAME
from ipcshare.doctor.plan import DoctorPlan
from ipcshare.runtime.errors import ExchangeError
from ipcshare.topology.world import World

pytestmark = pytest.mark.mpi

TIMEOUT = 20.0


@pytest.fixture
def world(comm):
    world = World.from_comm(comm)
    yield world
    world.close()


def run_host_matrix(world, specs, *, pairwise=False):
    return matrix.run_matrix(list(enumerate(specs)), world.local_comm, world.local_ranks,
                             slot_bytes=4096, timeout=TIMEOUT, world_rank=world.rank,
                             pairwise=pairwise, before_path=lambda spec: None)


def test_every_host_path_works_between_every_ordered_pair(world, comm):
    records = run_host_matrix(world, HOST_PATHS)
    assert [r["path"] for r in records] == [spec.name for spec in HOST_PATHS]
    assert {r["status"] for r in records} == {"ok"}
    for record in records:
        assert {(c["owner"], c["result"]) for c in record["cells"]} <= {(world.rank, "ok")}
    cells = [(c["owner"], c["peer"]) for r in comm.allgather(records[0]) for c in r["cells"]]
    local = world.local_ranks
    assert sorted(cells) == sorted((o, p) for o in local for p in local if o != p)
    if world.local_size > 1:
        assert records[1]["exchange_used"] == "pidfd" and records[2]["exchange_used"] == "socket"


def test_a_refused_pidfd_getfd_is_recorded_and_pinned_to_its_pairs(world, comm, monkeypatch):
    if world.local_size < 2:
        pytest.skip("needs peers on the node")
    refused = world.local_ranks[-1]
    if world.rank == refused:
        def refuse(pid, fd):
            raise ExchangeError(f"pidfd_getfd(pid {pid}, fd {fd}) -> EPERM: Operation not "
                                "permitted (ptrace policy (yama ptrace_scope) or seccomp "
                                "refuses it)")
        monkeypatch.setattr(exchange_module, "fetch_fd", refuse)
    auto, forced = run_host_matrix(world, [PATHS_BY_NAME["host-shm"],
                                           PATHS_BY_NAME["posix-fd/pidfd"]], pairwise=True)
    # host-shm: pidfd refused, sockets carry the descriptors, every pair works
    assert auto["status"] == "ok" and auto["exchange_used"] == "socket"
    assert f"rank {refused}@" in auto["fallback_reason"] and "EPERM" in auto["fallback_reason"]
    # forced pidfd: fails everywhere, naming the refused rank (a world rank, translated)
    assert forced["status"] == "failed"
    assert forced["failure"]["step"] == "descriptor exchange (pidfd)"
    assert forced["failure"]["rank"] == refused
    assert ("local_cause" in forced["failure"]) == (world.rank == refused)
    for cell in forced["cells"]:
        involved = refused in (cell["owner"], cell["peer"])
        # more than two ranks: retried pair by pair, so only the refused rank's pairs fail
        expected_ok = world.local_size > 2 and not involved
        assert (cell["result"] == "ok") == expected_ok, cell
    assert forced.get("pairwise", False) == (world.local_size > 2)


def test_meeting_points_gather_and_name_a_rank_that_does_not_come(world, comm):
    points = Checkpoints(comm, timeout=TIMEOUT, name_rank=world.where)
    assert points.meet("first", comm.rank * 10) == [r * 10 for r in range(comm.size)]
    values = points.gather("second", comm.rank)
    assert (values == list(range(comm.size))) if comm.rank == 0 else values is None
    assert points.release("second", "go" if comm.rank == 0 else None) == "go"
    if comm.size > 1:
        absent = comm.size - 1
        if comm.rank != absent:
            with pytest.raises(PeerLost, match=rf"rank {absent}@\S+ did not answer within "
                                               r"0.5 s at stage 'third'"):
                points.meet("third", None, timeout=0.5)
        comm.Barrier()
    points.close()


def test_bandwidth_of_every_ordered_pair_arrives_intact(world, comm):
    record = bandwidth.measure_pairs(HOST_PATHS[0], world.local_comm, world.local_ranks,
                                     nbytes=64 << 10, repeats=1, latency_writes=5,
                                     timeout=TIMEOUT, world_rank=world.rank)
    if world.local_size == 1:
        assert record["status"] == "skipped"
        return
    assert record["status"] == "ok"
    assert sorted(row["owner"] for row in record["rows"]) == \
        [r for r in world.local_ranks if r != world.rank]
    assert all(row["gbps"] > 0 and row["latency_us"] > 0 for row in record["rows"])
    assert len(record["received"]) == world.local_size - 1
    assert all(got["intact"] for got in record["received"])


def test_window_limit_bound_budget_and_no_leak(world):
    spec = HOST_PATHS[0]
    before = limits.resource_snapshot()
    held = limits.probe_window_limit(spec, world.local_comm, world.local_ranks, bound=6,
                                     budget_s=60, timeout=TIMEOUT, world_rank=world.rank)
    assert held["stopped"] == "bound" and held["windows"] == 6
    assert held["imports"] == 6 * (world.local_size - 1) and held["ms_per_window"] > 0
    none = limits.probe_window_limit(spec, world.local_comm, world.local_ranks, bound=6,
                                     budget_s=0, timeout=TIMEOUT, world_rank=world.rank)
    assert none["stopped"] == "time budget" and none["windows"] == 0
    leak = limits.compare_snapshots(before, limits.resource_snapshot())
    assert leak["leak"] is False, leak
    assert leak["grown"]["fds"] == 0 and leak["grown"]["ipcshare_mappings"] == 0


def test_largest_export_stops_at_the_cap(world):
    result = limits.probe_largest_export(HOST_PATHS[0], local_rank=world.local_rank,
                                         local_size=world.local_size, cap=1 << 20,
                                         bisect_steps=2)
    assert result["largest"] == 1 << 20 and result["stopped"] == "cap"


def test_a_whole_quick_doctor_in_process(comm, tmp_path):
    from ipcshare.doctor.runner import run_doctor

    plan = dataclasses.replace(DoctorPlan.make(quick=True, timeout_s=TIMEOUT), window_bound=4,
                               host_bandwidth_bytes=64 << 10, host_export_cap=256 << 10)
    lines: list[str] = []
    out = tmp_path / "doctor.json"
    outcome = run_doctor(plan, json_path=str(out), emit=lines.append)
    assert comm.allgather(outcome.passed) == [True] * comm.size
    if comm.rank == 0:
        document = outcome.document
        assert document["world_size"] == comm.size and document["pass"] is True
        (node,) = document["nodes"].values()
        # A node with GPUs adds the required GPU-path check (as on the GPU nodes).
        gpu_node = node["gpu_node"]
        assert [c["name"] for c in node["checks"]] == (
            ["host-shm", "gpu-path", "descriptors", "leak"] if gpu_node
            else ["host-shm", "descriptors", "leak"])
        assert len(node["matrix"][0]["cells"]) == comm.size * (comm.size - 1) \
            or document["node_count"] > 1
        assert out.exists() and any(line.startswith("cluster summary") for line in lines)
    else:
        assert outcome.document is None and lines == []
