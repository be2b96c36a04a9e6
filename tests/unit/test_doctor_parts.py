"""The doctor's pieces that need no MPI: schedules, parsers, message translation, the
verdict built from synthetic rank results, the table, the summary, the watchdog."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import yaml

from ipcshare.doctor import bandwidth, cluster, environment, matrix, paths, plan, report, verdict
from ipcshare.runtime.errors import (
    BackendError,
    BackendUnavailable,
    CollectiveFailure,
    ConfigError,
    CudaError,
    ErrorFacts,
    ExchangeError,
    IpcShareError,
    PeerUnreachable,
    error_facts,
)

GPU0, GPU1 = "GPU-aaaaaaaa-0000-0000-0000-000000000000", "GPU-bbbbbbbb-0000-0000-0000-000000000000"


@pytest.mark.parametrize("count", range(1, 10))
def test_pair_rounds_cover_every_pair_once_with_disjoint_rounds(count):
    rounds = matrix.pair_rounds(count)
    pairs = [pair for round_ in rounds for pair in round_]
    assert sorted(pairs) == list(itertools.combinations(range(count), 2))
    for round_ in rounds:
        ranks = [r for pair in round_ for r in pair]
        assert len(ranks) == len(set(ranks))
    assert len(rounds) <= count


def test_cell_seeds_differ_by_path_owner_and_peer():
    seeds = {bytes(matrix.cell_seed(p, o, r, 64)) for p in range(2) for o in range(3)
             for r in range(3)}
    assert len(seeds) == 18


TOPOLOGY = textwrap.dedent("""\
    \tGPU0\tGPU1\tGPU2\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID
    GPU0\t X \tNV18\tSYS\tSYS\t0-47\t0\t\tN/A
    GPU1\tNV18\t X \tPHB\tSYS\t0-47\t0\t\tN/A
    GPU2\tSYS\tPHB\t X \tSYS\t48-95\t1\t\tN/A
    NIC0\tSYS\tSYS\tSYS\t X

    Legend:

      X    = Self
      SYS  = Connection traversing PCIe as well as the SMP interconnect
      NV#  = Connection traversing a bonded set of # NVLinks
    """)


def test_nvidia_topology_is_read_into_links_keyed_by_uuid():
    links = environment.parse_nvidia_topology(TOPOLOGY, {0: GPU0, 1: GPU1, 2: "GPU-c"})
    assert links[f"{GPU0}|{GPU1}"] == {"kind": "nvlink", "label": "NV18"}
    assert links[f"{GPU1}|{GPU0}"]["kind"] == "nvlink"
    assert links[f"{GPU1}|GPU-c"] == {"kind": "pcie", "label": "PHB"}
    assert f"{GPU0}|{GPU0}" not in links and len(links) == 6


def test_link_kinds_and_the_slow_flag():
    links = {f"{GPU0}|{GPU1}": {"kind": "nvlink", "label": "NV18"}}
    assert bandwidth.link_kind(GPU0, GPU1, links) == "nvlink"
    assert bandwidth.link_kind(GPU0, GPU0, links) == "same-gpu"
    assert bandwidth.link_kind(GPU1, GPU0, links) == "unknown"
    assert bandwidth.link_kind(None, GPU0, links) == "unknown"
    rows = [{"writer": 0, "owner": 1, "gbps": 150.0}, {"writer": 1, "owner": 0, "gbps": 15.0},
            {"writer": 0, "owner": 2, "error": "CudaError: x"}]
    bandwidth.judge_rows(rows, {(0, 1): "nvlink", (1, 0): "pcie", (0, 2): "nvlink"})
    assert rows[0]["slow"] and rows[0]["expected_min_gbps"] == plan.EXPECTED_MIN_GBPS["nvlink"]
    assert not rows[1]["slow"] and not rows[2]["slow"]


def test_checksum_sees_a_moved_word():
    data = np.arange(1 << 12, dtype=np.uint8)
    moved = data.copy()
    moved[:8], moved[8:16] = data[8:16], data[:8]
    assert bandwidth.checksum(data) == bandwidth.checksum(data.copy())
    assert bandwidth.checksum(data[:13]) != bandwidth.checksum(data[:12])
    assert bandwidth.checksum(moved)[0] == bandwidth.checksum(data)[0]  # the sum alone misses it
    assert bandwidth.checksum(moved) != bandwidth.checksum(data)


LSPCI = textwrap.dedent("""\
    00:01.0 PCI bridge: Intel Corporation Device 09ab
    \tCapabilities: [220 v1] Access Control Services
    \t\tACSCap:\tSrcValid+ TransBlk+ ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-
    \t\tACSCtl:\tSrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-
    17:00.0 PCI bridge: PLX Technology Device 8796
    \t\tACSCtl:\tSrcValid- TransBlk- ReqRedir- CmpltRedir- UpstreamFwd- EgressCtrl- DirectTrans-
    """)


def test_acs_redirection_is_counted():
    assert environment.parse_acs(LSPCI) == {"devices_with_acs": 2, "redirecting": 1,
                                            "examples": ["00:01.0"]}


def _agreed(error, step: str, rank: int, facts: ErrorFacts | None = None):
    """``error`` as fail-together agreement raises it: with its typed facts."""
    error.failure = CollectiveFailure(step=step, rank=rank, host="n3", ranks=(rank,),
                                      facts=facts or ErrorFacts())
    return error


def test_collective_failures_name_the_step_and_the_world_rank_from_typed_facts():
    text = "import failed on rank 1@n3: cuMemMap -> CUDA_ERROR_X (and on rank 0@n3 too)"
    translated = paths.translate_ranks(text, [4, 6])
    assert translated == ("import failed on rank 6@n3: cuMemMap -> CUDA_ERROR_X "
                          "(and on rank 4@n3 too)")
    failure = paths.describe_failure(
        _agreed(CudaError(text), "import", 1, ErrorFacts(cuda_error="CUDA_ERROR_X")), [4, 6])
    assert (failure["step"], failure["rank"], failure["message"]) == ("import", 6, translated)
    assert failure["cuda_error"] == "CUDA_ERROR_X" and failure["errno"] is None
    unagreed = paths.describe_failure(IpcShareError("something else"), [4, 6])
    assert (unagreed["step"], unagreed["rank"]) == ("setup", None)


def test_the_step_and_rank_come_from_the_facts_not_the_wording():
    exc = _agreed(BackendError("worded in another release"), "export", 0)
    failure = paths.describe_failure(exc, [5, 7])
    assert (failure["step"], failure["rank"]) == ("export", 5)
    # a message shaped like agreement's, without its facts, names no step and no rank
    shaped = paths.describe_failure(BackendError("export failed on rank 1@n3: x"), [5, 7])
    assert (shaped["step"], shaped["rank"]) == ("setup", None)


def test_describe_failure_keeps_the_local_cause():
    try:
        try:
            raise OSError(1, "Operation not permitted")
        except OSError as cause:
            raise _agreed(ExchangeError("descriptor exchange (pidfd) failed on rank 0@h: EPERM"),
                          "descriptor exchange (pidfd)", 0, ErrorFacts(errno="EPERM")) from cause
    except ExchangeError as exc:
        failure = paths.describe_failure(exc, [5, 7])
    assert failure["step"] == "descriptor exchange (pidfd)" and failure["rank"] == 5
    assert failure["error"] == "ExchangeError" and "rank 5@h" in failure["message"]
    assert failure["local_cause"] == "PermissionError: [Errno 1] Operation not permitted"
    assert failure["errno"] == "EPERM"


def test_a_malformed_setting_is_a_typed_fact_along_the_causes():
    # (through agreement on every rank: tests/mpi/test_window.py)
    from ipcshare.runtime import settings
    from ipcshare.runtime.errors import ConfigError, SettingError

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(settings.MPI_CUDA_AWARE, "yes")
        with pytest.raises(SettingError) as raised:
            settings.mpi_cuda_aware()
    assert isinstance(raised.value, ConfigError)
    outer = BackendError("group setup failed")
    outer.__cause__ = raised.value
    assert error_facts(outer).setting == {"name": "IPCSHARE_MPI_CUDA_AWARE", "value": "yes"}


def test_error_facts_follow_the_causes():
    try:
        try:
            raise OSError(24, "Too many open files")
        except OSError:
            raise BackendError("memfd_create failed")  # noqa: B904 (the context is the cause)
    except BackendError as exc:
        assert error_facts(exc) == ErrorFacts(errno="EMFILE")
    hidden = BackendError("no cause")
    hidden.__context__, hidden.__suppress_context__ = OSError(24, "x"), True
    assert error_facts(hidden) == ErrorFacts()
    cuda = BackendUnavailable("fabric refused")
    cuda.__cause__ = CudaError("cuMemCreate -> CUDA_ERROR_NOT_PERMITTED", call="cuMemCreate",
                               error_name="CUDA_ERROR_NOT_PERMITTED")
    assert error_facts(cuda).cuda_error == "CUDA_ERROR_NOT_PERMITTED"
    peer = PeerUnreachable("cuda:0 cannot reach ...", device="cuda:0", peer="cuda:1",
                           reason="disabled by IPCSHARE_DISABLE_P2P", disabled_by_setting=True)
    assert error_facts(peer).peer_unreachable == {
        "device": "cuda:0", "peer": "cuda:1", "reason": "disabled by IPCSHARE_DISABLE_P2P",
        "disabled_by_setting": True, "message": "cuda:0 cannot reach ..."}


def test_plan_timeout_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("IPCSHARE_DOCTOR_TIMEOUT", "7.5")
    quick = plan.DoctorPlan.make(quick=True)
    full = plan.DoctorPlan.make(quick=False)
    assert quick.timeout_s == full.timeout_s == 7.5 and quick.group_timeout_s == 7.5
    assert quick.window_bound < full.window_bound == 1000
    for bad in ("soon", "0", "-1"):
        monkeypatch.setenv("IPCSHARE_DOCTOR_TIMEOUT", bad)
        with pytest.raises(ConfigError, match="IPCSHARE_DOCTOR_TIMEOUT"):
            plan.DoctorPlan.make(quick=True)


def test_environment_facts_of_this_process():
    facts = environment.collect_rank_facts(local_rank=0, local_size=1, node_facts=True,
                                           probe_acs=False)
    assert facts["pid"] > 0 and facts["nofile_soft"] is None or facts["nofile_soft"] > 0
    assert facts["seccomp"]["mode"] in (0, 1, 2, None)
    assert facts["pid_namespace"] is None or facts["pid_namespace"].startswith("pid:")
    assert facts["open_fds"] is None or facts["open_fds"] > 2
    assert facts["pci_acs"] is None  # not probed
    assert "count" in facts["gpu"]
    json.dumps(facts)  # travels by MPI and into the JSON document


def rank_result(rank: int, *, cells_ok: bool = True, nofile: int = 20000, node: int = 0,
                host: str = "n1") -> dict:
    peer = 1 - rank
    cell = {"owner": rank, "peer": peer, "result": "ok" if cells_ok else "fail"}
    if not cells_ok:
        cell.update(step="readback", message="4 of 64 bytes differ")
    env = {"host": host, "boot_id": f"boot-{host}", "kernel": "6.8", "pid": 100 + rank,
           "nofile_soft": nofile, "nofile_hard": nofile, "open_fds": 30,
           "dev_shm": {"size": 1 << 33, "free": 1 << 33}, "ptrace_scope": None,
           "seccomp": {"mode": 0}, "cap_sys_ptrace": True, "pid_namespace": "pid:[1]",
           "ipc_namespace": "ipc:[1]", "pidfd_getfd_self": "ok",
           "iommu": {"units": [], "groups": 0, "cmdline": []},
           "gpu": {"count": 0, "device_files": 0, "reason": "no GPU"}}
    host_path = {"path": "host-shm", "name": "host-shm", "backend": "host", "exchange": "auto",
                 "handle": "posix-fd", "gpu": False, "status": "ok" if cells_ok else "failed",
                 "exchange_used": "pidfd", "fallback_reason": None, "cells": [cell],
                 "setup_ms": {"allocate": 0.1}}
    return {"rank": rank + 2 * node, "local_rank": rank, "node": node, "environment": env,
            "matrix": [host_path],
            "bandwidth": {"host": {"path": "host-shm", "bytes": 1 << 20, "status": "ok",
                                   "rows": [{"writer": rank, "owner": peer, "gbps": 9.5,
                                             "latency_us": 0.3}],
                                   "received": [{"writer": peer, "owner": rank,
                                                 "intact": True}]}},
            "limits": {"windows": [{"path": "host-shm", "bound": 32, "windows": 32,
                                    "imports": 32, "stopped": "bound", "ms_per_window": 0.4}],
                       "per_rank": {"exports": [{"path": "host-shm", "largest": 16 << 20,
                                                 "stopped": "cap", "granularity": 4096}]}},
            "leak": {"grown": {"fds": 0, "ipcshare_mappings": 0, "mappings": 0}, "leak": False,
                     "leaked": []},
            "stage_seconds": {"matrix host-shm": 0.01}}


def test_a_document_from_two_nodes_one_failing():
    results = [rank_result(0), rank_result(1),
               rank_result(0, node=1, host="n2", cells_ok=False, nofile=64),
               rank_result(1, node=1, host="n2", nofile=64)]
    document = verdict.build_document(results, version="9.9", quick=True, mpi_library="MPI x",
                                      elapsed_s=1.25)
    assert document["world_size"] == 4 and document["node_count"] == 2
    assert document["pass"] is False
    good, bad = document["nodes"].values()
    assert list(document["nodes"])[0] == "n1|boot-n1|-|-"
    assert good["pass"] and good["world_ranks"] == [0, 1]
    assert [c["name"] for c in good["checks"]] == ["host-shm", "descriptors", "leak"]
    assert bad["pass"] is False
    failed = {c["name"] for c in bad["checks"] if not c["ok"]}
    assert failed == {"host-shm", "descriptors"}
    assert {f["check"] for f in bad["findings"] if f["severity"] == "fail"} >= failed
    assert good["bandwidth"]["host"]["rows"][0]["intact"] is True
    # the table and the summary render, and the files round-trip
    lines = report.render_header(document)
    for key, node in document["nodes"].items():
        lines += report.render_node(key, node)
    text = "\n".join(lines)
    assert "[PASS]" in text and "[FAIL]" in text and "host-shm" in text
    assert "ulimit -n" in text and "9.50" in text
    assert "pairs on different nodes: mpi" in text  # two nodes: say how they meet
    summary = "\n".join(cluster.render_summary(document))
    assert summary.startswith("cluster summary: 1 of 2 node(s) pass")
    assert "FAIL  n2" in summary and "fix: ulimit -n 4096" in summary
    assert cluster.summarize_cluster(document)["passed"] == ["n1|boot-n1|-|-"]


def test_growth_within_the_allowance_says_so_beside_the_figure():
    # "mappings +9" beside PASS read as a leak: the line now names the allowance.
    results = [rank_result(0), rank_result(1)]
    results[1]["leak"]["grown"]["mappings"] = 9
    document = verdict.build_document(results, version="9.9", quick=True, mpi_library="MPI x",
                                      elapsed_s=1.0)
    (key, node), = document["nodes"].items()
    assert node["pass"]
    text = "\n".join(report.render_node(key, node))
    assert ("fds +0, ipcshare_mappings +0, mappings +9 (up to +64 allowed: other "
            "libraries' own)") in text, text


def test_outputs_are_written_as_json_and_yaml(tmp_path):
    document = verdict.build_document([rank_result(0), rank_result(1)], version="9.9",
                                      quick=False, mpi_library="MPI x", elapsed_s=2.0)
    out_json, out_yaml = tmp_path / "d.json", tmp_path / "d.yaml"
    report.write_outputs(document, json_path=str(out_json), yaml_path=str(out_yaml))
    assert json.loads(out_json.read_text())["pass"] is True
    assert yaml.safe_load(out_yaml.read_text()) == json.loads(out_json.read_text())


def test_the_watchdog_ends_a_stuck_process_with_one_line():
    script = ("import time\n"
              "from ipcshare.doctor.liveness import Watchdog\n"
              "w = Watchdog(budget_s=0.3, who='rank 3@h', status=5)\n"
              "w.arm('matrix cuda-ipc')\n"
              "time.sleep(30)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 5
    assert out.stderr.strip() == (
        "ipcshare: error: doctor: rank 3@h spent more than 0.3 s in stage 'matrix cuda-ipc' "
        "(a peer died or hangs inside a collective); giving up")


def test_a_stopped_watchdog_stays_quiet():
    from ipcshare.doctor.liveness import Watchdog

    watchdog = Watchdog(budget_s=0.05, who="me", status=5)
    watchdog.stop()
    import time

    time.sleep(0.2)  # still alive: the watchdog did not fire
