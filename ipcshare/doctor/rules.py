"""Root causes: rules that read a node's evidence (environment facts, matrix cells,
bandwidth, limits, leak check) and name the cause and the fix of each failure, in one
line each.

Every rule is a function ``node -> list[Finding]`` over plain data, so the rules are
tested with synthetic evidence (tests/unit/test_doctor_rules.py). ``diagnose`` runs them
all, then adds an "unexplained" finding for any failing required check that no rule
explained, so a failure is never left without a line.

Rules decide on typed facts, never on the wording of a message: the errno and CUDA error
names, the unreachable peer and the malformed setting that a failure records (``errno``,
``cuda_error``, ``peer_unreachable``, ``setting``, as ``runtime.errors.ErrorFacts``
gathers them), ``pidfd_refusal``, and a pair's ``disabled_by_setting``. Messages are
only shown, as evidence.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from ..exchange.node_reach import PID_NAMESPACE_FIX
from ..topology.gpu_sharing import gpu_sharing, shared_gpus_advice
from .plan import APP_WINDOWS, DESCRIPTOR_MARGIN, HOST_STAGED_MAX_GBPS, SMALL_DEV_SHM

__all__ = ["Finding", "RULES", "diagnose", "descriptor_need", "suggested_nofile",
           "SEVERITIES"]

SEVERITIES = ("fail", "warn", "info")
_SOCKET_PATHS = ("posix-fd/socket", "cuda-vmm/socket")


@dataclasses.dataclass(frozen=True)
class Finding:
    """One diagnosed problem: how bad (``fail`` / ``warn`` / ``info``), which check it
    bears on, the cause and the fix (one line each), and the evidence behind them."""

    severity: str
    check: str
    cause: str
    fix: str
    evidence: str = ""

    def to_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)


Node = Mapping[str, Any]


def descriptor_need(open_fds: int | None, local_size: int, windows: int = APP_WINDOWS) -> int:
    """Descriptors a rank needs to hold ``windows`` host windows at once (see plan.py):
    what is open now + (local ranks + 1) per window, one more window being built, and a
    margin."""
    return (open_fds or 0) + (local_size + 1) * (windows + 1) + DESCRIPTOR_MARGIN


def suggested_nofile(need: int) -> int:
    """A round ``ulimit -n`` value that covers ``need``: a power of two, at least 4096."""
    value = 4096
    while value < need:
        value *= 2
    return value


# -- small readers of the evidence ---------------------------------------------------
def _ranks(node: Node) -> dict[int, Mapping[str, Any]]:
    return {facts["rank"]: facts for facts in node.get("ranks", [])}


def _paths(node: Node) -> dict[str, Mapping[str, Any]]:
    return {record["path"]: record for record in node.get("matrix", [])}


def _path_ok(node: Node, name: str) -> bool:
    record = _paths(node).get(name)
    return bool(record) and record.get("status") == "ok"


def _check_failed(node: Node, name: str) -> bool:
    return any(c["name"] == name and not c["ok"] for c in node.get("checks", []))


def _sockets_work(node: Node) -> bool:
    paths = _paths(node)
    host = paths.get("host-shm")
    if host and host.get("status") == "ok" and host.get("exchange_used") == "socket":
        return True
    return any(_path_ok(node, name) for name in _SOCKET_PATHS)


def _pid_namespaces(node: Node) -> dict[str, list[int]]:
    spaces: dict[str, list[int]] = {}
    for rank, facts in sorted(_ranks(node).items()):
        if facts.get("pid_namespace"):
            spaces.setdefault(facts["pid_namespace"], []).append(rank)
    return spaces


def _ranks_text(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


# -- the rules -------------------------------------------------------------------------
def pidfd_refused(node: Node) -> list[Finding]:
    """pidfd_getfd refused (seccomp, yama, missing capability, old kernel): sockets
    carry the descriptors instead, if they work."""
    if len(_pid_namespaces(node)) > 1:
        return []  # the namespace rule explains it better
    evidence: list[tuple[int | None, str | None, str]] = []  # (rank, errno name, text)
    for record in node.get("matrix", []):
        failure = record.get("failure") or {}
        if record.get("exchange") == "pidfd" and failure.get("step", "").startswith(
                "descriptor exchange (pidfd)"):
            # The failing rank's errno as agreement recorded it, not read from the text.
            evidence.append((failure.get("rank"), failure.get("errno"),
                             failure.get("message", "")))
        refusal = record.get("pidfd_refusal")
        if refusal:  # the exchange's typed record of why it left pidfd for sockets
            evidence.append((refusal.get("rank"), refusal.get("errno"),
                             record.get("fallback_reason") or ""))
    findings: dict[tuple[int | None, str], Finding] = {}
    ranks = _ranks(node)
    sockets = _sockets_work(node)
    for rank, errno_name, text in evidence:
        facts = ranks.get(rank, {}) if rank is not None else {}
        code = errno_name or "refused"
        seccomp = (facts.get("seccomp") or {}).get("mode")
        scope = facts.get("ptrace_scope")
        where = f"rank {rank}" if rank is not None else "a rank"
        if seccomp == 2:
            cause = (f"a seccomp filter on {where} refuses pidfd_getfd (syscall 438): {code}")
            fix = ("allow pidfd_getfd in the seccomp profile (Docker's default allows it only "
                   "with --cap-add SYS_PTRACE; or --security-opt seccomp=<profile allowing it>)")
        elif code == "ENOSYS":
            cause = (f"the kernel on {where} ({facts.get('kernel', '?')}) has no pidfd_getfd "
                     "(needs Linux 5.6 or later)")
            fix = "upgrade the kernel to 5.6 or later"
        elif scope == 3:
            cause = f"yama ptrace_scope=3 on {where} forbids reaching another process at all"
            fix = "ptrace_scope 3 holds until reboot: boot with kernel.yama.ptrace_scope=0 or 1"
        elif scope in (1, 2) and not facts.get("cap_sys_ptrace"):
            cause = (f"yama ptrace_scope={scope} on {where} refuses pidfd_getfd to a process "
                     f"without CAP_SYS_PTRACE ({code})")
            fix = ("sysctl -w kernel.yama.ptrace_scope=0, or grant CAP_SYS_PTRACE "
                   "(docker --cap-add SYS_PTRACE)")
        else:
            cause = (f"the kernel's ptrace access check refuses pidfd_getfd on {where} ({code}): "
                     "ranks with different credentials, or a security module (AppArmor, "
                     "SELinux)")
            fix = "run all ranks as one user with the same credentials, or grant CAP_SYS_PTRACE"
        if sockets:
            fix = ("nothing required: descriptors go over unix sockets (SCM_RIGHTS), which "
                   f"work here; to use pidfd_getfd: {fix}")
        findings.setdefault((rank, cause), Finding(
            "warn" if sockets else "fail", "pidfd", cause, fix, evidence=text))
    return list(findings.values())


def pid_namespaces_differ(node: Node) -> list[Finding]:
    """Ranks of one node in different PID namespaces: pidfd_getfd cannot reach the peers,
    so descriptors travel over unix sockets, the peers checked by uid and the job's
    secret instead of their pids (``exchange.node_reach``)."""
    spaces = _pid_namespaces(node)
    if len(spaces) < 2:
        return []
    host_failed = _check_failed(node, "host-shm")
    layout = "; ".join(f"{_ranks_text(ranks)} in {space}" for space, ranks in spaces.items())
    if host_failed:
        return [Finding(
            "fail", "host-shm",
            f"ranks of this node live in different PID namespaces ({layout}) and no "
            "descriptor path joined them: peers' pids mean nothing across them, so "
            "pidfd_getfd cannot work, and the unix sockets failed too (see the evidence)",
            f"{PID_NAMESPACE_FIX[0].upper()}{PID_NAMESPACE_FIX[1:]}; or let the sockets "
            "through: one socket directory mounted in every container (IPCSHARE_SOCKET_DIR) "
            "or one network namespace", evidence=layout)]
    return [Finding(
        "info", "namespaces",
        f"ranks of this node live in different PID namespaces ({layout}): pidfd_getfd "
        "cannot reach peers there, so descriptors travel over unix sockets, peers checked "
        "by uid and the job's secret",
        f"nothing required; {PID_NAMESPACE_FIX}", evidence=layout)]


def ipc_namespaces_differ(node: Node) -> list[Finding]:
    """Different IPC namespaces: legacy CUDA IPC needs a shared one."""
    spaces: dict[str, list[int]] = {}
    for rank, facts in sorted(_ranks(node).items()):
        if facts.get("ipc_namespace"):
            spaces.setdefault(facts["ipc_namespace"], []).append(rank)
    if len(spaces) < 2:
        return []
    layout = "; ".join(f"{_ranks_text(ranks)} in {space}" for space, ranks in spaces.items())
    record = _paths(node).get("cuda-ipc")
    failed = bool(record) and record.get("status") == "failed"
    return [Finding(
        "warn" if failed else "info", "namespaces",
        f"ranks of this node live in different IPC namespaces ({layout})"
        + ("; legacy CUDA IPC (cuda-ipc) failed and needs a shared one" if failed else ""),
        "share the IPC namespace (docker --ipc=host, or ranks in one pod)",
        evidence=layout)]


def gpus_shared(node: Node) -> list[Finding]:
    """Several ranks of the node bound to one GPU: without MPS they take turns on it (a
    warning); under MPS they run side by side (a note)."""
    by_rank = sorted(_ranks(node).items())
    gpus = [facts.get("gpu") or {} for _rank, facts in by_rank]
    shared, time_sliced = gpu_sharing([rank for rank, _facts in by_rank],
                                      [(gpu.get("bound_uuid") or None, bool(gpu.get("mps")))
                                       for gpu in gpus])
    if not shared:
        return []
    advice = shared_gpus_advice(shared, time_sliced)
    evidence = "; ".join(f"{uuid}: ranks {ranks}" + ("" if uuid in time_sliced else " (MPS)")
                         for uuid, ranks in shared.items())
    if not time_sliced:
        return [Finding("info", "gpu-path", advice, "nothing to do", evidence=evidence)]
    cause, _, fix = advice.partition("; give ")
    return [Finding("warn", "gpu-path", cause, "give " + fix, evidence=evidence)]


def gpu_not_visible(node: Node) -> list[Finding]:
    """A GPU path failed between ranks where one cannot see the other's GPU."""
    ranks = _ranks(node)
    found: dict[tuple[int, int], Finding] = {}
    gpu_failed = _check_failed(node, "gpu-path")
    for record in node.get("matrix", []):
        if not record.get("gpu"):
            continue
        for cell in record.get("cells", []):
            if cell.get("result") == "ok":
                continue
            owner, peer = ranks.get(cell["owner"], {}), ranks.get(cell["peer"], {})
            owner_gpu = (owner.get("gpu") or {}).get("bound_uuid")
            visible = {d.get("uuid") for d in (peer.get("gpu") or {}).get("devices", [])}
            if owner_gpu and owner_gpu not in visible and (cell["peer"], cell["owner"]) \
                    not in found:
                found[(cell["peer"], cell["owner"])] = Finding(
                    "fail" if gpu_failed else "warn", "gpu-path",
                    f"rank {cell['peer']} cannot see GPU {owner_gpu} of rank {cell['owner']} "
                    f"(CUDA_VISIBLE_DEVICES={peer.get('cuda_visible_devices')!s} on rank "
                    f"{cell['peer']}), so it cannot map that GPU's memory",
                    "let every rank of a node see all of the node's GPUs (the same "
                    "CUDA_VISIBLE_DEVICES, or none; containers: --gpus all); ipcshare binds "
                    "local rank r to device r % count itself (launch/bind-gpu.sh: set "
                    "IPCSHARE_KEEP_VISIBLE_DEVICES=1)",
                    evidence=f"{record['path']}: {cell.get('message', '')}")
    return list(found.values())


def fabric_without_imex(node: Node) -> list[Finding]:
    """Fabric handles refused: no IMEX channel (only needed across nodes)."""
    record = _paths(node).get("fabric")
    if not record or record.get("status") != "failed":
        return []
    failure = record.get("failure") or {}
    message = failure.get("message", "")
    channels = [(facts.get("gpu") or {}).get("imex_channels") for facts in _ranks(node).values()]
    present = next((c for c in channels if c), None)
    if failure.get("cuda_error") == "CUDA_ERROR_NOT_PERMITTED":
        where = ("/dev/nvidia-caps-imex-channels holds " + ", ".join(present) if present
                 else "no /dev/nvidia-caps-imex-channels")
        return [Finding(
            "info", "fabric",
            f"fabric handles are refused (CUDA_ERROR_NOT_PERMITTED): no usable IMEX channel "
            f"on this node ({where})",
            "needed only across nodes of one NVLink domain; within a node posix-fd works. To "
            "enable: run nvidia-imex on every node of the domain, create "
            "/dev/nvidia-caps-imex-channels/channel0 and pass it into containers",
            evidence=message)]
    return [Finding("info", "fabric", f"fabric handles do not work here: {message}",
                    "use posix-fd handles within a node", evidence=message)]


def fabric_domain_state(node: Node) -> list[Finding]:
    """GPUs of an NVLink domain across hosts that have not joined it, or that this
    process cannot use without an IMEX channel (doctor.fabric)."""
    from .fabric import fabric_domain_findings

    ranks = {rank: {**(facts.get("gpu") or {}), "host": facts.get("host")}
             for rank, facts in _ranks(node).items()}
    return [Finding(severity, "fabric", problem, fix)
            for severity, problem, fix in fabric_domain_findings(ranks)]


def p2p_unreachable(node: Node) -> list[Finding]:
    """The driver says two GPUs have no peer path (or it was disabled on purpose), and
    which fallback path (relay, host-staged) their windows use instead."""
    findings: dict[str, Finding] = {}
    for record in node.get("matrix", []):
        for pair in record.get("pair_paths", []):
            a, b = pair["ranks"]
            key = f"pair {a}-{b}"
            if key in findings:
                continue
            on_purpose = pair.get("disabled_by_setting") is True
            how = (f"relay through rank {pair['relay']}'s GPU" if pair["path"] == "relay"
                   else "host-staged copies through pinned host memory")
            findings[key] = Finding(
                "info" if on_purpose else "warn", "gpu-path",
                f"rank {a} ({pair['devices'][0]}) and rank {b} ({pair['devices'][1]}): "
                f"{pair.get('reason', 'no peer access')}; their windows are not mapped, bytes "
                f"go by {how} (path {pair['path']})",
                "unset IPCSHARE_DISABLE_P2P" if on_purpose else
                "put cooperating ranks on GPUs with a P2P path (nvidia-smi topo -p2p r); in VMs "
                "pass the GPUs through with peer access allowed (ACS / IOMMU settings)",
                evidence=f"{record['path']}: {pair['path']}"
                         + (f" via rank {pair['relay']}" if pair.get("relay") is not None else ""))
        # A window that mapped a peer GPU it may not reach: the typed fact of the error.
        for source in [record.get("failure") or {}, *record.get("cells", [])]:
            unreachable = source.get("peer_unreachable")
            if not unreachable or unreachable["message"] in findings:
                continue
            text = source.get("message", "")
            on_purpose = unreachable.get("disabled_by_setting") is True
            findings[unreachable["message"]] = Finding(
                "info" if on_purpose else "warn", "gpu-path",
                ("peer access between these GPUs was disabled on purpose: " if on_purpose else
                 "the driver reports no peer-to-peer path between these GPUs: ")
                + unreachable["message"],
                "unset IPCSHARE_DISABLE_P2P" if on_purpose else
                "put cooperating ranks on GPUs with a P2P path (nvidia-smi topo -p2p r); in VMs "
                "pass the GPUs through with peer access allowed (ACS / IOMMU settings)",
                evidence=f"{record['path']}: {text}")
    return list(findings.values())


def _iommu_evidence(node: Node) -> str:
    hints = []
    for facts in _ranks(node).values():
        iommu = facts.get("iommu") or {}
        if iommu.get("groups"):
            hints.append(f"{iommu['groups']} IOMMU groups")
        if iommu.get("cmdline"):
            hints.append("kernel cmdline " + " ".join(iommu["cmdline"]))
        acs = facts.get("pci_acs") or {}
        if acs.get("redirecting"):
            hints.append(f"{acs['redirecting']} PCIe device(s) with ACS redirect on "
                         f"(e.g. {', '.join(acs.get('examples', []))})")
        if hints:
            break
    return "; ".join(hints) if hints else "no IOMMU/ACS details readable here"


def data_not_arriving(node: Node) -> list[Finding]:
    """Writes reported success but the owner read different bytes."""
    findings = []
    lost: dict[str, list[str]] = {}
    for record in node.get("matrix", []):
        for cell in record.get("cells", []):
            if cell.get("result") != "ok" and cell.get("step") == "readback":
                lost.setdefault(record["path"], []).append(
                    f"{cell['peer']}->{cell['owner']}: {cell.get('message', '')}")
    for side in ("gpu", "host"):
        record = (node.get("bandwidth") or {}).get(side) or {}
        for row in record.get("rows", []):
            if row.get("intact") is False:
                lost.setdefault(f"{record.get('path')} (bandwidth)", []).append(
                    f"{row['writer']}->{row['owner']}: checksum differs")
    paths = _paths(node)
    for name, cells in lost.items():
        base = name.split(" ")[0]
        gpu = (paths.get(base) or {}).get("gpu", base.startswith("cuda") or base == "fabric")
        sample = "; ".join(cells[:3]) + (f"; and {len(cells) - 3} more" if len(cells) > 3 else "")
        if gpu:
            iommu = _iommu_evidence(node)
            findings.append(Finding(
                "fail", "gpu-path" if base == name else "data",
                f"{name}: peer writes completed without error, yet the owners read different "
                f"bytes: peer-to-peer traffic is redirected or dropped (PCIe ACS redirection or "
                f"an IOMMU translating peer addresses; {iommu})",
                "disable ACS redirection on the PCIe switches between these GPUs (BIOS, or "
                "setpci at boot) or boot with iommu=pt; until then keep these pairs off P2P "
                "(NCCL_P2P_DISABLE=1; ipcshare: use the host path)",
                evidence=sample))
        else:
            findings.append(Finding(
                "fail", "host-shm" if base == "host-shm" else "data",
                f"{name}: shared memory did not carry the bytes between processes",
                "a runtime that does not share memfd mappings between processes (check the "
                "container runtime); report it with the doctor's JSON",
                evidence=sample))
    return findings


def descriptor_limit(node: Node) -> list[Finding]:
    """``ulimit -n`` below what the node's ranks need, or the window probe ran out."""
    findings = []
    local_size = len(node.get("ranks", [])) or 1
    emfile = []
    for limit in (node.get("limits") or {}).get("windows", []):
        failure = limit.get("failure") or {}
        if failure.get("errno") == "EMFILE":
            emfile.append(f"{limit['path']}: held {limit['windows']} windows, then "
                          f"{failure.get('message', '')}")
    short: dict[tuple[int, int | None], list[tuple[int, int]]] = {}
    for rank, facts in sorted(_ranks(node).items()):
        soft, hard = facts.get("nofile_soft"), facts.get("nofile_hard")
        need = descriptor_need(facts.get("open_fds"), local_size)
        if soft is not None and soft < need:
            short.setdefault((soft, hard), []).append((rank, need))
    for (soft, hard), ranks in short.items():
        need = max(n for _rank, n in ranks)
        value = suggested_nofile(need)
        fix = f"ulimit -n {value}"
        if hard is not None and hard < value:
            fix += (f" (the hard limit is {hard}: raise it first, e.g. 'nofile' in "
                    f"/etc/security/limits.conf, systemd LimitNOFILE={value}, or docker "
                    f"--ulimit nofile={value}:{value})")
        findings.append(Finding(
            "fail", "descriptors",
            f"ulimit -n is {soft} on {_ranks_text([r for r, _n in ranks])}; "
            f"{local_size} rank(s) per node holding {APP_WINDOWS} windows need about {need} "
            "descriptors each", fix, evidence="; ".join(emfile)))
        emfile = []  # said once
    if emfile:
        findings.append(Finding(
            "warn", "limits",
            "the window probe ran out of descriptors (EMFILE) before its bound: each host "
            "window keeps (local ranks + 1) descriptors per rank",
            "raise ulimit -n for applications that hold this many windows",
            evidence="; ".join(emfile)))
    return findings


def leaks(node: Node) -> list[Finding]:
    """Closing every window did not give everything back."""
    findings = []
    for entry in node.get("leaks", []):
        if entry.get("leak"):
            findings.append(Finding(
                "fail", "leak",
                f"rank {entry['rank']} kept {', '.join(entry['leaked'])} after closing every "
                "window",
                "an ipcshare or driver bug: report it with this JSON (IPCSHARE_LOG=INFO shows "
                "each step)", evidence=str(entry.get("grown"))))
    return findings


def slow_pairs(node: Node) -> list[Finding]:
    """Correct but slow: a GPU pair far below what its link should give."""
    rows = [row for row in ((node.get("bandwidth") or {}).get("gpu") or {}).get("rows", [])
            if row.get("slow")]
    if not rows:
        return []
    sample = "; ".join(f"{r['writer']}->{r['owner']} {r['gbps']:g} GB/s over {r['link']} "
                       f"(expected >= {r['expected_min_gbps']:g})" for r in rows[:4])
    return [Finding(
        "warn", "bandwidth",
        f"{len(rows)} GPU pair(s) are correct but slow for their link: {sample}",
        "check nvidia-smi topo -m and nvidia-smi nvlink --status (degraded links), other "
        "jobs on these GPUs, and ACS/IOMMU settings that route P2P through the CPU",
        evidence=sample)]


def small_dev_shm(node: Node) -> list[Finding]:
    """A tiny /dev/shm (Docker's default 64 MiB) starves MPI and NCCL."""
    for facts in _ranks(node).values():
        shm = facts.get("dev_shm")
        if shm and shm.get("size", SMALL_DEV_SHM) < SMALL_DEV_SHM:
            size = shm["size"] >> 20
            return [Finding(
                "warn", "environment",
                f"/dev/shm holds only {size} MiB: MPI's shared-memory transport and NCCL use "
                "it (ipcshare's host windows use memfd and do not)",
                "give the container a larger /dev/shm (docker run --shm-size=8g, or "
                "--ipc=host)", evidence=f"/dev/shm {shm}")]
    return []


def gpu_unusable(node: Node) -> list[Finding]:
    """NVIDIA device files exist but CUDA does not start, or GPU facts failed."""
    findings = []
    for rank, facts in sorted(_ranks(node).items()):
        gpu = facts.get("gpu") or {}
        if gpu.get("count") == 0 and gpu.get("device_files"):
            findings.append(Finding(
                "warn", "environment",
                f"rank {rank} has NVIDIA device files but CUDA does not start: "
                f"{gpu.get('reason')}",
                "check the driver with nvidia-smi; install cuda-python (pip install "
                "'ipcshare[gpu]'); in containers use the NVIDIA runtime (--gpus all)",
                evidence=str(gpu.get("reason"))))
            break
        if gpu.get("error"):
            findings.append(Finding("warn", "environment",
                                    f"rank {rank} could not read its GPU facts: {gpu['error']}",
                                    "see the message; IPCSHARE_MAX_RANKS_PER_GPU may be too low",
                                    evidence=gpu["error"]))
    return findings


def window_limit_short(node: Node) -> list[Finding]:
    """The window probe failed before its bound for a reason other than descriptors."""
    findings = []
    for limit in (node.get("limits") or {}).get("windows", []):
        failure = limit.get("failure")
        if limit.get("stopped") != "failure" or not failure:
            continue
        message = failure.get("message", "")
        if failure.get("errno") == "EMFILE":
            continue  # the descriptor rule says it
        if failure.get("errno") == "ENOMEM":
            fix = ("mappings may be capped by vm.max_map_count: sysctl -w "
                   "vm.max_map_count=262144; or memory is short")
        else:
            fix = "applications should hold fewer windows than this; see the message"
        findings.append(Finding(
            "warn", "limits",
            f"{limit['path']}: one process held {limit['windows']} windows "
            f"({limit['imports']} peer imports) before {failure.get('step')} failed",
            fix, evidence=message))
    return findings


_BIND_FIX = ("bind each rank to its GPU's NUMA node: launch/bind-gpu.sh does it (numactl "
             "--cpunodebind=N --membind=N, else taskset -c <the GPU's local CPUs>), or mpirun "
             "--bind-to numa / srun --cpu-bind=ldoms; nvidia-smi topo -m shows each GPU's CPU "
             "and NUMA affinity")


def cpus_far_from_gpu(node: Node) -> list[Finding]:
    """A rank whose CPUs are all on another NUMA node than its GPU (warn), or that may
    wander over several nodes (info): its launches, pinned staging buffers and host-staged
    copies cross the CPU interconnect."""
    far, unbound = [], []
    for rank, facts in sorted(_ranks(node).items()):
        placement = facts.get("affinity") or {}
        near, count = placement.get("cpus_near_gpu"), placement.get("cpu_count")
        if near is None or not count or placement.get("gpu_numa_node") is None:
            continue
        bound = (facts.get("gpu") or {}).get("bound")
        text = (f"rank {rank} on CPUs {placement['cpus']} (NUMA node(s) "
                f"{','.join(map(str, placement.get('cpu_numa_nodes') or [])) or '?'}), its "
                f"GPU cuda:{bound} ({placement.get('gpu_pci')}) on NUMA node "
                f"{placement['gpu_numa_node']} (local CPUs {placement.get('gpu_local_cpus')})")
        if near == 0:
            far.append(text)
        elif near < count and placement.get("numa_nodes", 0) > 1:
            unbound.append(f"{text}: {near} of its {count} CPUs are local")
    findings = [Finding(
        "warn", "affinity",
        f"{text}: none of the rank's CPUs is local to its GPU, so kernel launches, pinned "
        "host buffers and host-staged peer copies cross the CPU interconnect",
        _BIND_FIX, evidence=text) for text in far]
    if unbound:
        findings.append(Finding(
            "info", "affinity",
            f"{len(unbound)} rank(s) may run on CPUs of other NUMA nodes than their GPU's "
            "(not bound): the scheduler can move them away from their GPU",
            _BIND_FIX, evidence="; ".join(unbound)))
    return findings


def _driver_reports_p2p(node: Node, writer: int, owner: int) -> bool:
    ranks = _ranks(node)
    gpu_of = {rank: (facts.get("gpu") or {}).get("bound_uuid") for rank, facts in ranks.items()}
    pairs = (ranks.get(writer, {}).get("gpu") or {}).get("p2p", [])
    return any(pair.get("access") and pair.get("src_uuid") == gpu_of.get(writer)
               and pair.get("dst_uuid") == gpu_of.get(owner) for pair in pairs)


def host_staged_speed(node: Node) -> list[Finding]:
    """NVLink pairs the driver calls P2P-capable whose direct copies ran no faster than
    copies staged through host memory: peer traffic is not going peer to peer."""
    rows = [row for row in ((node.get("bandwidth") or {}).get("gpu") or {}).get("rows", [])
            if row.get("path", "direct") == "direct" and row.get("link") == "nvlink"
            and "gbps" in row and row["gbps"] <= HOST_STAGED_MAX_GBPS
            and _driver_reports_p2p(node, row["writer"], row["owner"])]
    if not rows:
        return []
    sample = "; ".join(f"{r['writer']}->{r['owner']} {r['gbps']:g} GB/s" for r in rows[:4])
    return [Finding(
        "warn", "bandwidth",
        f"{len(rows)} GPU pair(s) over NVLink copy at host-staged speed (<= "
        f"{HOST_STAGED_MAX_GBPS:g} GB/s) although the driver reports P2P: {sample}; the copies "
        "go through host memory (peer access not enabled for them, or an IOMMU / PCIe ACS "
        "sending peer traffic through the CPU)",
        "enable peer access before peer copies (cudaDeviceEnablePeerAccess / "
        "cuCtxEnablePeerAccess; IPC mappings need cuMemSetAccess for the peer device); boot "
        "with iommu=pt or disable ACS redirection; compare with ipcshare p2p --peer-access "
        "on / off (docs/P2P.md)", evidence=_iommu_evidence(node))]


_PEER_ACCESS_FIX = ("enable peer access before peer copies (cudaDeviceEnablePeerAccess / "
                    "cuCtxEnablePeerAccess; IPC mappings need cuMemSetAccess for the peer "
                    "device); compare with ipcshare p2p --peer-access on / off (docs/P2P.md)")


def host_staging_probe(node: Node) -> list[Finding]:
    """The host-staging probe's verdict (full runs, 2+ GPUs): what copies staged through
    host memory cost on this node, and a warning when copies stay at host-staged speed
    with peer access enabled."""
    probe = node.get("staging")
    if not probe:
        return []
    if "error" in probe:
        return [Finding("info", "bandwidth", f"the host-staging probe did not run: "
                        f"{probe['error']}", "run ipcshare p2p --peer-access off on the node "
                        "to see the same figures (docs/P2P.md)")]
    staged, direct = probe["without_peer_access"], probe["with_peer_access"]
    src, dst = probe["pair"]
    pair = f"cuda:{src} -> cuda:{dst}"
    findings = []
    if "error" in direct:
        findings.append(Finding("warn", "bandwidth", f"peer access could not be enabled for "
                                f"{pair}: {direct['error']}; its peer copies are staged through "
                                "host memory", _PEER_ACCESS_FIX))
    elif direct["gbps"] <= HOST_STAGED_MAX_GBPS:
        findings.append(Finding(
            "warn", "bandwidth",
            f"{pair} copies at {direct['gbps']:g} GB/s with peer access enabled, host-staged "
            f"speed (<= {HOST_STAGED_MAX_GBPS:g} GB/s; {staged['gbps']:g} without it): peer "
            "traffic goes through host memory (an IOMMU or PCIe ACS redirecting it)",
            "boot with iommu=pt or disable ACS redirection for the GPUs' switches; "
            "nvidia-smi topo -p2p r should show OK", evidence=_iommu_evidence(node)))
    waited = (f"; a copy on a second stream waited {staged['second_copy_ms']:g} ms behind a "
              f"{staged['spin_ms']:g} ms kernel on the first (alone: "
              f"{staged['copy_alone_ms']:g} ms)" if staged.get("waited_behind_kernel") else "")
    with_access = (f" against {direct['gbps']:g} GB/s with it" if "gbps" in direct else "")
    findings.append(Finding(
        "info", "bandwidth",
        f"without peer access {pair} copies are staged through host memory: "
        f"{staged['gbps']:g} GB/s{with_access}{waited}", _PEER_ACCESS_FIX,
        evidence=f"{staged['bytes']} bytes per copy"))
    return findings


def malformed_setting(node: Node) -> list[Finding]:
    """An IPCSHARE_* variable holds a value it cannot take: every group setup refuses it,
    so each path of the matrix fails at once for the same reason."""
    failing = {check["name"] for check in node.get("checks", [])
               if check.get("required") and not check.get("ok")}
    # (name, value) -> [(path, message)]
    stopped: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for record in node.get("matrix", []):
        setting = (record.get("failure") or {}).get("setting")
        if setting:
            stopped.setdefault((setting.get("name", "?"), setting.get("value", "?")), []).append(
                (record.get("name", "?"), record["failure"].get("message", "")))
    findings = []
    for (setting, value), paths in stopped.items():
        names = ", ".join(name for name, _message in paths)
        cause = (f"{setting}={value!r} is a value ipcshare cannot take, so no group could be "
                 f"set up ({names})")
        fix = f"correct or unset {setting} (docs/SETTINGS.md lists the values it takes)"
        # One line per failing required check it explains, or one for the node.
        checks = [name for name, _message in paths if name in failing] or ["environment"]
        findings += [Finding("fail", check, cause, fix, evidence=paths[0][1])
                     for check in checks]
    return findings


RULES: tuple[Callable[[Node], list[Finding]], ...] = (
    malformed_setting, pid_namespaces_differ, pidfd_refused, ipc_namespaces_differ, gpu_not_visible,
    p2p_unreachable, data_not_arriving, fabric_without_imex, fabric_domain_state,
    descriptor_limit, leaks, slow_pairs, window_limit_short, small_dev_shm, gpu_unusable,
    gpus_shared, cpus_far_from_gpu, host_staged_speed, host_staging_probe,
)


def _unexplained(node: Node, findings: list[Finding]) -> list[Finding]:
    explained = {f.check for f in findings if f.severity == "fail"}
    extra = []
    for check in node.get("checks", []):
        if check["required"] and not check["ok"] and check["name"] not in explained:
            extra.append(Finding(
                "fail", check["name"], f"{check['name']} failed: {check['detail']}",
                "no rule recognises this failure: rerun with IPCSHARE_LOG=INFO and see "
                "docs/DOCTOR.md", evidence=check["detail"]))
    return extra


def diagnose(node: Node) -> list[Finding]:
    """Every rule's findings for one node, failures first, then any failing required
    check that no rule explained."""
    findings: list[Finding] = []
    for rule in RULES:
        findings.extend(rule(node))
    findings.extend(_unexplained(node, findings))
    order = {severity: i for i, severity in enumerate(SEVERITIES)}
    return sorted(findings, key=lambda f: order[f.severity])
