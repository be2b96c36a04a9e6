"""Root-cause rules of the doctor, fed with synthetic evidence: each failure the issue
names gets its cause and fix, and nothing is left unexplained."""

from __future__ import annotations

import copy

import pytest

from ipcshare.doctor import rules
from ipcshare.doctor.plan import APP_WINDOWS, DESCRIPTOR_MARGIN

NS_A, NS_B = "pid:[4026531836]", "pid:[4026532001]"
# The typed facts a failure carries (runtime.errors.ErrorFacts), copied onto its cells.
FACT_KEYS = ("errno", "cuda_error", "peer_unreachable")
GPU0, GPU1 = "GPU-00000000-0000-0000-0000-000000000000", "GPU-11111111-1111-1111-1111-111111111111"


def rank_facts(rank: int, **overrides) -> dict:
    facts = {
        "rank": rank, "local_rank": rank, "host": "node1", "kernel": "6.8.0",
        "nofile_soft": 20000, "nofile_hard": 20000, "open_fds": 30,
        "dev_shm": {"size": 8 << 30, "free": 8 << 30}, "ptrace_scope": None,
        "seccomp": {"mode": 0, "filters": 0, "no_new_privs": 0}, "cap_sys_ptrace": True,
        "pid_namespace": NS_A, "ipc_namespace": "ipc:[1]", "cuda_visible_devices": None,
        "iommu": {"units": [], "groups": 0, "cmdline": []},
        "gpu": {"count": 0, "device_files": 0, "imex_channels": None, "reason": "no GPU"},
    }
    facts.update(overrides)
    return facts


def path(name: str, *, status: str = "ok", exchange: str = "auto", gpu: bool = False,
         failure: dict | None = None, cells: list | None = None, **extra) -> dict:
    record = {"path": name, "name": name, "backend": "host", "exchange": exchange,
              "handle": "posix-fd", "gpu": gpu, "status": status,
              "cells": cells if cells is not None else
              [{"owner": 0, "peer": 1, "result": "ok"}, {"owner": 1, "peer": 0, "result": "ok"}]}
    if failure:
        record["failure"] = failure
        if cells is None:
            facts = {key: failure[key] for key in FACT_KEYS if key in failure}
            record["cells"] = [dict(c, result="fail", step=failure["step"],
                                    message=failure["message"], **facts)
                               for c in record["cells"]]
    record.update(extra)
    return record


def check(name: str, ok: bool, detail: str = "") -> dict:
    return {"name": name, "required": True, "ok": ok, "detail": detail or name}


def node(**overrides) -> dict:
    base = {
        "ranks": [rank_facts(0), rank_facts(1)],
        "matrix": [path("host-shm", exchange_used="pidfd"),
                   path("posix-fd/pidfd", exchange="pidfd", exchange_used="pidfd"),
                   path("posix-fd/socket", exchange="socket", exchange_used="socket")],
        "bandwidth": {"host": None, "gpu": None},
        "limits": {"windows": [], "per_rank": []},
        "leaks": [{"rank": 0, "leak": False, "leaked": [], "grown": {"fds": 0}},
                  {"rank": 1, "leak": False, "leaked": [], "grown": {"fds": 0}}],
        "checks": [check("host-shm", True), check("descriptors", True), check("leak", True)],
    }
    base.update(overrides)
    return base


EPERM_MESSAGE = ("descriptor exchange (pidfd) failed on rank 1@node1: pidfd_getfd(pid 7, fd 9) "
                 "-> EPERM: Operation not permitted (ptrace policy (yama ptrace_scope) or "
                 "seccomp refuses it)")


def pidfd_refused_node(**rank1) -> dict:
    failure = {"step": "descriptor exchange (pidfd)", "rank": 1, "error": "ExchangeError",
               "message": EPERM_MESSAGE, "errno": "EPERM"}
    return node(ranks=[rank_facts(0), rank_facts(1, **rank1)],
                matrix=[path("host-shm", exchange_used="socket",
                             fallback_reason="pidfd_getfd refused on rank 1@node1: pidfd_getfd("
                                             "pid 7, fd 9) -> EPERM: Operation not permitted",
                             pidfd_refusal={"rank": 1, "errno": "EPERM"}),
                        path("posix-fd/pidfd", status="failed", exchange="pidfd",
                             failure=failure),
                        path("posix-fd/socket", exchange="socket", exchange_used="socket")])


def unreachable(*, disabled_by_setting: bool) -> dict:
    """A PeerUnreachable error's facts, as ``failure["peer_unreachable"]`` holds them."""
    reason = ("disabled by IPCSHARE_DISABLE_P2P" if disabled_by_setting else
              "cuDeviceCanAccessPeer -> 0: no NVLink or PCIe P2P path between them")
    return {"device": "cuda:0", "peer": "cuda:1", "reason": reason,
            "disabled_by_setting": disabled_by_setting,
            "message": f"cuda:0 cannot reach the memory of cuda:1 ({GPU1}) peer-to-peer: {reason}"}


def only(findings, check_name):
    chosen = [f for f in findings if f.check == check_name]
    assert len(chosen) == 1, findings
    return chosen[0]


def test_a_healthy_node_has_no_findings():
    assert rules.diagnose(node()) == []


def test_a_malformed_setting_is_named_with_its_value_and_the_fix():
    # Every path's group setup refuses it; the rule reads the typed fact, not the text.
    setting = {"name": "IPCSHARE_P2P_CHUNK", "value": "lots"}
    failure = {"step": "group setup", "rank": 0, "error": "SettingError",
               "message": "group setup failed on rank 0@node1: (wording of any release)",
               "errno": None, "cuda_error": None, "peer_unreachable": None,
               "setting": setting}
    evidence = node(matrix=[path("host-shm", status="failed", failure=failure),
                            path("posix-fd/socket", exchange="socket", status="failed",
                                 failure=failure)],
                    checks=[check("host-shm", False, "host-shm failed"),
                            check("descriptors", True), check("leak", True)])
    findings = rules.diagnose(evidence)
    finding = only(findings, "host-shm")
    assert finding.severity == "fail"
    assert finding.cause.startswith("IPCSHARE_P2P_CHUNK='lots' is a value ipcshare cannot take")
    assert "(host-shm, posix-fd/socket)" in finding.cause
    assert finding.fix.startswith("correct or unset IPCSHARE_P2P_CHUNK")
    assert not any("no rule recognises" in f.fix for f in findings)
    # no required check failed by it: one line for the node, still naming the variable
    optional = node(matrix=[path("posix-fd/socket", exchange="socket", status="failed",
                                 failure=failure)])
    assert [(f.check, f.severity) for f in rules.malformed_setting(optional)] == [
        ("environment", "fail")]


def test_seccomp_refusing_pidfd_getfd_is_named_and_the_socket_fallback_noted():
    finding = only(rules.diagnose(pidfd_refused_node(seccomp={"mode": 2, "filters": 1})),
                   "pidfd")
    assert finding.severity == "warn"
    assert "seccomp filter on rank 1" in finding.cause and "438" in finding.cause
    assert "EPERM" in finding.cause
    assert finding.fix.startswith("nothing required") and "SCM_RIGHTS" in finding.fix
    assert "SYS_PTRACE" in finding.fix


def test_yama_without_the_capability_is_named_with_the_sysctl_fix():
    finding = only(rules.diagnose(pidfd_refused_node(ptrace_scope=1, cap_sys_ptrace=False)),
                   "pidfd")
    assert "ptrace_scope=1" in finding.cause and "CAP_SYS_PTRACE" in finding.cause
    assert "kernel.yama.ptrace_scope=0" in finding.fix and "--cap-add SYS_PTRACE" in finding.fix


def test_enosys_means_an_old_kernel():
    evidence = pidfd_refused_node(kernel="5.4.0")
    for record in evidence["matrix"]:
        for key in ("failure", "fallback_reason"):
            if isinstance(record.get(key), dict):
                record[key]["message"] = record[key]["message"].replace("EPERM", "ENOSYS")
                record[key]["errno"] = "ENOSYS"
            elif record.get(key):
                record[key] = record[key].replace("EPERM", "ENOSYS")
        if record.get("pidfd_refusal"):
            record["pidfd_refusal"]["errno"] = "ENOSYS"
    finding = only(rules.diagnose(evidence), "pidfd")
    assert "5.4.0" in finding.cause and "5.6" in finding.cause


def test_pidfd_refused_without_a_working_socket_path_is_a_failure():
    evidence = pidfd_refused_node(seccomp={"mode": 2})
    socket_failure = {"step": "descriptor exchange (socket)", "rank": 0, "error": "ExchangeTimeout",
                      "message": "descriptor exchange (socket) failed on rank 0@node1: timeout"}
    evidence["matrix"][0] = path("host-shm", status="failed", failure=socket_failure)
    evidence["matrix"][2] = path("posix-fd/socket", status="failed", exchange="socket",
                                 failure=socket_failure)
    evidence["checks"][0] = check("host-shm", False, socket_failure["message"])
    findings = rules.diagnose(evidence)
    assert only(findings, "pidfd").severity == "fail"
    # host-shm failed for a reason no rule knows: it still gets a line of its own
    unexplained = only(findings, "host-shm")
    assert unexplained.severity == "fail" and "timeout" in unexplained.cause
    assert "IPCSHARE_LOG=INFO" in unexplained.fix


def test_ranks_in_different_pid_namespaces():
    failure = {"step": "descriptor exchange (socket)", "rank": 1, "error": "ExchangeTimeout",
               "message": "descriptor exchange (socket) failed on rank 1@node1: no descriptor"}
    evidence = node(ranks=[rank_facts(0), rank_facts(1, pid_namespace=NS_B)],
                    matrix=[path("host-shm", status="failed", failure=failure)],
                    checks=[check("host-shm", False, failure["message"]),
                            check("descriptors", True), check("leak", True)])
    findings = rules.diagnose(evidence)
    finding = only(findings, "host-shm")
    assert finding.severity == "fail"
    assert "different PID namespaces" in finding.cause and NS_B in finding.cause
    assert "--pid=host" in finding.fix and "shareProcessNamespace" in finding.fix
    assert "IPCSHARE_SOCKET_DIR" in finding.fix
    assert not [f for f in findings if f.check == "pidfd"]  # one cause, said once


def test_ranks_in_different_pid_namespaces_with_working_sockets_need_nothing():
    evidence = node(ranks=[rank_facts(0), rank_facts(1, pid_namespace=NS_B)],
                    matrix=[path("host-shm", exchange_used="socket")],
                    checks=[check("host-shm", True), check("descriptors", True),
                            check("leak", True)])
    finding = only(rules.diagnose(evidence), "namespaces")
    assert finding.severity == "info" and NS_B in finding.cause
    assert finding.fix.startswith("nothing required") and "shareProcessNamespace" in finding.fix


def test_peer_gpu_not_visible():
    def gpu_facts(uuid, visible):
        return {"count": 1, "device_files": 1, "imex_channels": None, "bound": 0,
                "bound_uuid": uuid, "devices": [{"index": 0, "uuid": visible}]}

    failure = {"step": "import", "rank": 1, "error": "CudaError",
               "message": "import failed on rank 1@node1: cuIpcOpenMemHandle -> "
                          "CUDA_ERROR_INVALID_DEVICE"}
    evidence = node(
        ranks=[rank_facts(0, gpu=gpu_facts(GPU0, GPU0), cuda_visible_devices="0"),
               rank_facts(1, gpu=gpu_facts(GPU1, GPU1), cuda_visible_devices="1")],
        matrix=[path("host-shm", exchange_used="pidfd"),
                path("cuda-ipc", status="failed", gpu=True, failure=failure)],
        checks=[check("host-shm", True), check("gpu-path", False, "none works"),
                check("descriptors", True), check("leak", True)])
    findings = [f for f in rules.diagnose(evidence) if f.check == "gpu-path"]
    assert {f.severity for f in findings} == {"fail"}
    causes = " | ".join(f.cause for f in findings)
    assert f"rank 1 cannot see GPU {GPU0} of rank 0" in causes
    assert "CUDA_VISIBLE_DEVICES=1" in causes
    assert all("CUDA_VISIBLE_DEVICES" in f.fix for f in findings)


def _two_ranks_on_one_gpu(mps0, mps1):
    def gpu_facts(mps):
        return {"count": 1, "device_files": 1, "imex_channels": None, "bound": 0,
                "bound_uuid": GPU0, "devices": [{"index": 0, "uuid": GPU0}], "mps": mps}

    return node(ranks=[rank_facts(0, gpu=gpu_facts(mps0)), rank_facts(1, gpu=gpu_facts(mps1))])


def test_ranks_sharing_a_gpu_without_mps_get_a_warning_with_the_mps_fix():
    for mps0, mps1 in ((False, False), (True, False)):  # one rank outside MPS is enough
        finding = only(rules.diagnose(_two_ranks_on_one_gpu(mps0, mps1)), "gpu-path")
        assert finding.severity == "warn"
        assert "ranks 0-1" in finding.cause and "take turns in time slices" in finding.cause
        assert "nvidia-cuda-mps-control -d" in finding.fix
        assert "(MPS)" not in finding.evidence


def test_ranks_sharing_a_gpu_under_mps_are_only_noted():
    finding = only(rules.diagnose(_two_ranks_on_one_gpu(True, True)), "gpu-path")
    assert finding.severity == "info"
    assert "side by side under MPS" in finding.cause and "ranks 0-1" in finding.cause
    assert finding.evidence.endswith("(MPS)")


def test_fabric_without_imex_is_information_not_failure():
    failure = {"step": "backend setup", "rank": 0, "error": "BackendUnavailable",
               "message": "backend setup failed on rank 0@node1: fabric handles refused: "
                          "CUDA_ERROR_NOT_PERMITTED \u2014 no IMEX channel on this node",
               "cuda_error": "CUDA_ERROR_NOT_PERMITTED"}
    evidence = node(matrix=node()["matrix"] + [path("fabric", status="failed", gpu=True,
                                                      failure=failure)])
    finding = only(rules.diagnose(evidence), "fabric")
    assert finding.severity == "info"
    assert "IMEX" in finding.cause and "nvidia-imex" in finding.fix
    assert "posix-fd" in finding.fix


def test_writes_that_do_not_arrive_point_at_acs_and_the_iommu():
    lost = [{"owner": 0, "peer": 1, "result": "fail", "step": "readback", "wrong_bytes": 4096,
             "message": "4096 of 65536 bytes differ (first at byte 0); rank 1's write reported "
                        "success"},
            {"owner": 1, "peer": 0, "result": "ok"}]
    evidence = node(
        ranks=[rank_facts(0, iommu={"units": ["dmar0"], "groups": 87,
                                    "cmdline": ["intel_iommu=on"]},
                          pci_acs={"devices_with_acs": 12, "redirecting": 4,
                                   "examples": ["0000:17:00.0"]}),
               rank_facts(1)],
        matrix=[path("host-shm", exchange_used="pidfd"),
                path("cuda-vmm/pidfd", status="failed", exchange="pidfd", gpu=True, cells=lost)],
        checks=[check("host-shm", True), check("gpu-path", False), check("descriptors", True),
                check("leak", True)])
    finding = only(rules.diagnose(evidence), "gpu-path")
    assert finding.severity == "fail"
    assert "ACS" in finding.cause and "IOMMU" in finding.cause
    assert "87 IOMMU groups" in finding.cause and "intel_iommu=on" in finding.cause
    assert "4 PCIe device(s) with ACS redirect" in finding.cause
    assert "iommu=pt" in finding.fix and "ACS" in finding.fix
    assert "1->0" in finding.evidence


def test_a_descriptor_limit_too_low_gets_the_ulimit_fix():
    evidence = node(ranks=[rank_facts(0, nofile_soft=64, nofile_hard=64),
                           rank_facts(1, nofile_soft=64, nofile_hard=64)],
                    limits={"windows": [{"path": "host-shm", "windows": 10, "imports": 10,
                                         "stopped": "failure",
                                         "failure": {"step": "allocate", "message":
                                                     "allocate failed: [Errno 24] Too many "
                                                     "open files", "errno": "EMFILE"}}],
                            "per_rank": []},
                    checks=[check("host-shm", True), check("descriptors", False),
                            check("leak", True)])
    findings = rules.diagnose(evidence)
    finding = only(findings, "descriptors")
    need = 30 + 3 * (APP_WINDOWS + 1) + DESCRIPTOR_MARGIN
    assert finding.severity == "fail"
    assert "ulimit -n is 64 on ranks 0, 1" in finding.cause and str(need) in finding.cause
    assert finding.fix.startswith("ulimit -n 4096")
    assert "hard limit is 64" in finding.fix and "nofile=4096:4096" in finding.fix
    assert "Too many open files" in finding.evidence
    assert not [f for f in findings if f.check == "limits"]  # the EMFILE is said once


def test_descriptor_need_and_suggestion():
    assert rules.descriptor_need(30, 4) == 30 + 5 * (APP_WINDOWS + 1) + DESCRIPTOR_MARGIN
    assert rules.descriptor_need(None, 1) == 2 * (APP_WINDOWS + 1) + DESCRIPTOR_MARGIN
    assert rules.suggested_nofile(100) == 4096
    assert rules.suggested_nofile(5000) == 8192


def test_a_leak_fails_with_what_was_kept():
    evidence = node(leaks=[{"rank": 0, "leak": True, "leaked": ["3 descriptor(s)"],
                            "grown": {"fds": 3}}],
                    checks=[check("host-shm", True), check("descriptors", True),
                            check("leak", False)])
    finding = only(rules.diagnose(evidence), "leak")
    assert finding.severity == "fail" and "rank 0 kept 3 descriptor(s)" in finding.cause


def test_correct_but_slow_pairs_are_a_warning():
    rows = [{"writer": 0, "owner": 1, "gbps": 31.0, "link": "nvlink", "expected_min_gbps": 200.0,
             "slow": True, "intact": True},
            {"writer": 1, "owner": 0, "gbps": 380.0, "link": "nvlink", "expected_min_gbps": 200.0,
             "slow": False, "intact": True}]
    finding = only(rules.diagnose(node(bandwidth={"host": None, "gpu": {"path": "cuda-vmm/pidfd",
                                                                       "rows": rows}})),
                   "bandwidth")
    assert finding.severity == "warn" and "0->1 31 GB/s over nvlink" in finding.cause
    assert "nvlink --status" in finding.fix


def test_small_dev_shm_and_unusable_gpu_are_environment_warnings():
    evidence = node(ranks=[rank_facts(0, dev_shm={"size": 64 << 20, "free": 60 << 20},
                                      gpu={"count": 0, "device_files": 4,
                                           "reason": "cuda-python is not installed"}),
                           rank_facts(1)])
    findings = {f.cause.split(" ")[0]: f for f in rules.diagnose(evidence)
                if f.check == "environment"}
    assert set(findings) == {"/dev/shm", "rank"}
    assert "holds only 64 MiB" in findings["/dev/shm"].cause
    assert "--shm-size" in findings["/dev/shm"].fix
    assert "NVIDIA device files but CUDA does not start" in findings["rank"].cause
    assert "cuda-python is not installed" in findings["rank"].cause


def test_window_limit_failure_other_than_descriptors():
    evidence = node(limits={"windows": [{"path": "host-shm", "windows": 500, "imports": 1500,
                                         "stopped": "failure",
                                         "failure": {"step": "import", "message":
                                                     "mmap of peer memory failed: Cannot "
                                                     "allocate memory", "errno": "ENOMEM"}}],
                            "per_rank": []})
    finding = only(rules.diagnose(evidence), "limits")
    assert "held 500 windows (1500 peer imports)" in finding.cause
    assert "vm.max_map_count" in finding.fix


def test_p2p_disabled_on_purpose_is_not_a_mystery():
    failure = {"step": "import", "rank": 0, "error": "PeerUnreachable",
               "message": "import failed on rank 0@node1: cuda:0 cannot reach the memory of "
                          f"cuda:1 ({GPU1}) peer-to-peer: disabled by IPCSHARE_DISABLE_P2P",
               "peer_unreachable": unreachable(disabled_by_setting=True)}
    evidence = node(matrix=node()["matrix"] + [path("cuda-ipc", status="failed", gpu=True,
                                                      failure=failure)])
    finding = only(rules.diagnose(evidence), "gpu-path")
    assert finding.severity == "info" and "on purpose" in finding.cause
    assert "IPCSHARE_DISABLE_P2P" in finding.fix


def test_pairs_without_peer_access_are_named_with_their_fallback_path():
    pairs = [{"ranks": [0, 2], "path": "relay", "relay": 1, "devices": ["cuda:0", "cuda:2"],
              "reason": "cuda:0 and cuda:2 have no peer access: disabled by "
                        "IPCSHARE_DISABLE_P2P", "disabled_by_setting": True},
             {"ranks": [1, 3], "path": "host-staged", "relay": None,
              "devices": ["cuda:1", "cuda:3"],
              "reason": "cuda:1 and cuda:3 have no peer access: cuDeviceCanAccessPeer -> 0",
              "disabled_by_setting": False}]
    evidence = node(matrix=node()["matrix"] + [path("cuda-vmm/pidfd", gpu=True,
                                                      pair_paths=pairs)])
    found = [f for f in rules.diagnose(evidence) if f.check == "gpu-path"]
    assert len(found) == 2
    relay, staged = sorted(found, key=lambda f: f.cause)
    assert relay.severity == "info" and "relay through rank 1's GPU (path relay)" in relay.cause
    assert "rank 0 (cuda:0) and rank 2 (cuda:2)" in relay.cause
    assert staged.severity == "warn" and "host-staged copies through pinned host memory" \
        in staged.cause and "cuDeviceCanAccessPeer" in staged.cause


def test_findings_come_failures_first_and_rules_never_mutate_the_evidence():
    evidence = pidfd_refused_node(seccomp={"mode": 2})
    evidence["leaks"][0] = {"rank": 0, "leak": True, "leaked": ["1 descriptor(s)"],
                            "grown": {"fds": 1}}
    evidence["checks"][2] = check("leak", False)
    frozen = copy.deepcopy(evidence)
    findings = rules.diagnose(evidence)
    assert [f.severity for f in findings] == sorted(
        (f.severity for f in findings), key=rules.SEVERITIES.index)
    assert findings[0].severity == "fail"
    assert evidence == frozen


@pytest.mark.parametrize("rule", rules.RULES)
def test_every_rule_accepts_a_minimal_node(rule):
    assert rule({"ranks": [], "matrix": [], "checks": []}) == []


def test_pidfd_refusal_is_read_from_the_typed_fact_not_the_message():
    evidence = pidfd_refused_node(seccomp={"mode": 2, "filters": 1})
    evidence["matrix"] = [record for record in evidence["matrix"]
                          if record.get("pidfd_refusal")]
    evidence["matrix"][0]["fallback_reason"] = "refused (wording of another release)"
    finding = only(rules.diagnose(evidence), "pidfd")
    assert "seccomp filter on rank 1" in finding.cause and "EPERM" in finding.cause


def test_errno_name_of_follows_the_cause():
    from ipcshare.runtime.errors import ExchangeError, errno_name_of

    try:
        try:
            raise PermissionError(1, "Operation not permitted")
        except OSError as exc:
            raise ExchangeError("pidfd_getfd(pid 7, fd 9) -> EPERM") from exc
    except ExchangeError as error:
        assert errno_name_of(error) == "EPERM"
    assert errno_name_of(ExchangeError("no system call")) is None


# -- each rule that reads a typed fact fires from the fact, whatever the wording, and
# -- never from the wording alone ------------------------------------------------------
NEUTRAL = "step failed on rank 1@node1: worded in a way no rule knows"


def forced_pidfd_node(failure: dict) -> dict:
    """A node whose forced-pidfd path failed as ``failure`` says (no pidfd_refusal)."""
    return node(ranks=[rank_facts(0), rank_facts(1, kernel="5.4.0")],
                matrix=[path("host-shm", exchange_used="socket"),
                        path("posix-fd/pidfd", status="failed", exchange="pidfd",
                             failure=failure),
                        path("posix-fd/socket", exchange="socket", exchange_used="socket")])


def test_pidfd_rule_reads_the_failure_s_errno_not_its_message():
    failure = {"step": "descriptor exchange (pidfd)", "rank": 1, "error": "ExchangeError"}
    typed = only(rules.diagnose(forced_pidfd_node(dict(failure, message=NEUTRAL,
                                                       errno="ENOSYS"))), "pidfd")
    assert "5.4.0" in typed.cause and "5.6" in typed.cause
    worded = only(rules.diagnose(forced_pidfd_node(dict(
        failure, message="descriptor exchange (pidfd) failed on rank 1@node1: pidfd_getfd "
                         "-> ENOSYS: Function not implemented"))), "pidfd")
    assert "5.6" not in worded.cause and "(refused)" in worded.cause


def fabric_node(failure: dict) -> dict:
    return node(matrix=node()["matrix"] + [path("fabric", status="failed", gpu=True,
                                                 failure=failure)])


def test_fabric_rule_reads_the_cuda_error_name_not_the_message():
    failure = {"step": "backend setup", "rank": 0, "error": "BackendUnavailable"}
    typed = only(rules.diagnose(fabric_node(dict(failure, message=NEUTRAL,
                                                 cuda_error="CUDA_ERROR_NOT_PERMITTED"))),
                 "fabric")
    assert "no usable IMEX channel" in typed.cause and "nvidia-imex" in typed.fix
    worded = only(rules.diagnose(fabric_node(dict(
        failure, message="fabric handles refused: CUDA_ERROR_NOT_PERMITTED \u2014 no IMEX "
                         "channel on this node"))), "fabric")
    assert "no usable IMEX channel" not in worded.cause
    assert worded.cause.startswith("fabric handles do not work here")


def unreachable_node(failure: dict) -> dict:
    return node(matrix=node()["matrix"] + [path("cuda-ipc", status="failed", gpu=True,
                                                 failure=failure)])


def test_p2p_rule_reads_the_unreachable_peer_not_the_message():
    failure = {"step": "import", "rank": 0, "error": "PeerUnreachable", "message": NEUTRAL}
    for on_purpose in (True, False):
        facts = unreachable(disabled_by_setting=on_purpose)
        finding = only(rules.diagnose(unreachable_node(dict(failure,
                                                            peer_unreachable=facts))),
                       "gpu-path")
        assert finding.severity == ("info" if on_purpose else "warn")
        assert facts["message"] in finding.cause
        assert ("unset IPCSHARE_DISABLE_P2P" == finding.fix) == on_purpose
    worded = dict(failure, message="import failed on rank 0@node1: cuda:0 cannot reach the "
                  f"memory of cuda:1 ({GPU1}) peer-to-peer: disabled by IPCSHARE_DISABLE_P2P")
    assert [f for f in rules.diagnose(unreachable_node(worded)) if f.check == "gpu-path"] == []


def test_pairs_disabled_on_purpose_are_read_from_the_flag_not_the_reason():
    pair = {"ranks": [0, 1], "path": "host-staged", "relay": None,
            "devices": ["cuda:0", "cuda:1"], "reason": "cuda:0 and cuda:1 have no peer access"}

    def finding(**fields):
        evidence = node(matrix=node()["matrix"] + [path("cuda-vmm/pidfd", gpu=True,
                                                          pair_paths=[dict(pair, **fields)])])
        return only(rules.diagnose(evidence), "gpu-path")

    typed = finding(disabled_by_setting=True)
    assert typed.severity == "info" and typed.fix == "unset IPCSHARE_DISABLE_P2P"
    worded = finding(reason="cuda:0 and cuda:1 have no peer access: disabled by "
                            "IPCSHARE_DISABLE_P2P")
    assert worded.severity == "warn" and "IPCSHARE_DISABLE_P2P" not in worded.fix


def window_limit_node(failure: dict) -> dict:
    return node(limits={"windows": [{"path": "host-shm", "windows": 500, "imports": 1500,
                                     "stopped": "failure", "failure": failure}],
                        "per_rank": []})


def test_descriptor_rules_read_emfile_from_the_errno_not_the_message():
    typed = rules.diagnose(window_limit_node({"step": "allocate", "message": NEUTRAL,
                                              "errno": "EMFILE"}))
    finding = only(typed, "limits")
    assert "ran out of descriptors (EMFILE)" in finding.cause and NEUTRAL in finding.evidence
    worded = rules.diagnose(window_limit_node({"step": "allocate", "message":
                                               "allocate failed: [Errno 24] Too many open "
                                               "files (EMFILE)"}))
    finding = only(worded, "limits")  # the window rule's line, not the descriptor rule's
    assert "ran out of descriptors" not in finding.cause and "held 500 windows" in finding.cause


def test_window_rule_reads_enomem_from_the_errno_not_the_message():
    typed = only(rules.diagnose(window_limit_node({"step": "import", "message": NEUTRAL,
                                                   "errno": "ENOMEM"})), "limits")
    assert "vm.max_map_count" in typed.fix
    worded = only(rules.diagnose(window_limit_node({"step": "import", "message":
                                                    "mmap failed: ENOMEM, Cannot allocate "
                                                    "memory"})), "limits")
    assert "vm.max_map_count" not in worded.fix
