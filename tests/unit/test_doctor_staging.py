"""The doctor's host-staging probe: its verdicts from recorded results (no GPU needed), and
the probe process refusing clearly where there are not two GPUs."""

from __future__ import annotations

from ipcshare.doctor import rules
from ipcshare.doctor.plan import DoctorPlan
from ipcshare.doctor.staging import run_staging_probe


def _probe(staged_gbps: float, direct: dict) -> dict:
    return {"pair": [0, 1],
            "without_peer_access": {"src": 0, "dst": 1, "bytes": 64 << 20, "gbps": staged_gbps,
                                    "copy_alone_ms": 1.9, "spin_ms": 50.0,
                                    "second_copy_ms": 53.8, "waited_behind_kernel": True},
            "with_peer_access": direct}


def _direct(gbps: float) -> dict:
    return {"src": 0, "dst": 1, "bytes": 64 << 20, "gbps": gbps, "copy_alone_ms": 0.2,
            "spin_ms": 50.0, "second_copy_ms": 0.24, "waited_behind_kernel": False}


def test_the_cost_of_host_staging_is_shown_when_peer_access_works():
    (finding,) = rules.host_staging_probe({"staging": _probe(37.3, _direct(382.9))})
    assert finding.severity == "info"
    assert finding.cause == (
        "without peer access cuda:0 -> cuda:1 copies are staged through host memory: "
        "37.3 GB/s against 382.9 GB/s with it; a copy on a second stream waited 53.8 ms "
        "behind a 50 ms kernel on the first (alone: 1.9 ms)")
    assert "cuCtxEnablePeerAccess" in finding.fix


def test_copies_still_staged_with_peer_access_are_flagged_with_the_iommu_fix():
    warn, info = rules.host_staging_probe({"staging": _probe(37.3, _direct(36.8))})
    assert warn.severity == "warn" and "36.8 GB/s with peer access enabled" in warn.cause
    assert "iommu=pt" in warn.fix and info.severity == "info"


def test_peer_access_that_cannot_be_enabled_is_named():
    warn, _info = rules.host_staging_probe(
        {"staging": _probe(20.0, {"error": "cuCtxEnablePeerAccess -> CUDA_ERROR_TOO_MANY_PEERS"})})
    assert warn.severity == "warn" and "CUDA_ERROR_TOO_MANY_PEERS" in warn.cause


def test_a_probe_that_could_not_run_says_why_and_no_probe_says_nothing():
    (finding,) = rules.host_staging_probe({"staging": {"error": "ValueError: 1 visible"}})
    assert finding.severity == "info" and "did not run: ValueError: 1 visible" in finding.cause
    assert rules.host_staging_probe({"staging": None}) == []
    assert rules.host_staging_probe({}) == []


def test_the_probe_process_refuses_without_two_gpus():
    # This machine has no GPU: the probe's own process fails and says why, in one line.
    result = run_staging_probe(nbytes=1 << 20, timeout_s=120)
    assert set(result) == {"error"} and result["error"]
    assert "\n" not in result["error"]


def test_only_full_runs_probe():
    assert DoctorPlan.make(quick=True).staging_probe_bytes == 0
    assert DoctorPlan.make(quick=False).staging_probe_bytes == 64 << 20
