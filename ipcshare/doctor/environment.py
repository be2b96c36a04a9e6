"""What each rank's process sees: limits, policies, namespaces, IOMMU hints, GPUs.

Every reader returns None (or an ``error`` entry) when its source is missing or
unreadable: a container hides half of /proc and /sys, and the doctor must still run.
Nothing here shares memory; the capability matrix does the real work.
"""

from __future__ import annotations

import glob
import os
import re
import resource
import shutil
import socket
import subprocess
from typing import Any

from .affinity import collect_affinity

__all__ = [
    "collect_rank_facts",
    "open_fd_count",
    "mapping_counts",
    "read_seccomp",
    "read_ptrace_scope",
    "parse_nvidia_topology",
    "parse_acs",
    "CAP_SYS_PTRACE",
]

CAP_SYS_PTRACE = 19  # bit in /proc/self/status CapEff
_COMMAND_TIMEOUT_S = 10.0


def _read_text(path: str) -> str | None:
    try:
        with open(path) as source:
            return source.read()
    except OSError:
        return None


def _status_fields() -> dict[str, str]:
    text = _read_text("/proc/self/status") or ""
    fields = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    return fields


def open_fd_count() -> int | None:
    """Descriptors open in this process now (None where /proc is hidden)."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return None


def mapping_counts() -> dict[str, int] | None:
    """``{'total': mappings of this process, 'ipcshare': memfd windows among them}``."""
    text = _read_text("/proc/self/maps")
    if text is None:
        return None
    lines = text.splitlines()
    return {"total": len(lines), "ipcshare": sum("memfd:ipcshare" in line for line in lines)}


def read_seccomp(status: dict[str, str] | None = None) -> dict[str, Any]:
    """Seccomp mode (0 off, 1 strict, 2 filter), filter count and no_new_privs."""
    status = _status_fields() if status is None else status

    def number(key: str) -> int | None:
        try:
            return int(status[key])
        except (KeyError, ValueError):
            return None

    return {"mode": number("Seccomp"), "filters": number("Seccomp_filters"),
            "no_new_privs": number("NoNewPrivs")}


def read_ptrace_scope() -> int | None:
    """yama ``ptrace_scope`` (0 classic, 1 restricted, 2 admin only, 3 none); None when
    the kernel has no yama."""
    text = _read_text("/proc/sys/kernel/yama/ptrace_scope")
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _has_capability(status: dict[str, str], bit: int) -> bool | None:
    try:
        return bool(int(status["CapEff"], 16) >> bit & 1)
    except (KeyError, ValueError):
        return None


def _namespace(kind: str) -> str | None:
    try:
        return os.readlink(f"/proc/self/ns/{kind}")
    except OSError:
        return None


def _filesystem(path: str) -> dict[str, int] | None:
    try:
        stats = os.statvfs(path)
    except OSError:
        return None
    return {"size": stats.f_blocks * stats.f_frsize, "free": stats.f_bavail * stats.f_frsize}


def _pidfd_self_probe() -> str:
    """``'ok'`` when this process may pidfd_getfd from itself, else the errno and why."""
    from ..exchange.pidfd import probe_self

    refused = probe_self()
    return "ok" if refused is None else refused


def _iommu_hints() -> dict[str, Any]:
    try:
        units = sorted(os.listdir("/sys/class/iommu"))
    except OSError:
        units = None
    try:
        groups: int | None = len(os.listdir("/sys/kernel/iommu_groups"))
    except OSError:
        groups = None
    cmdline = (_read_text("/proc/cmdline") or "").split()
    return {"units": units, "groups": groups,
            "cmdline": [token for token in cmdline if "iommu" in token.lower()]}


def parse_acs(lspci_text: str) -> dict[str, Any]:
    """PCIe ACS control from ``lspci -vvv``: devices that redirect peer-to-peer requests
    upstream (``ReqRedir+`` / ``CmpltRedir+``), which can route GPU P2P through the CPU
    or, with a misconfigured IOMMU, drop it."""
    device = None
    redirecting: list[str] = []
    with_acs = 0
    for line in lspci_text.splitlines():
        if line and not line[0].isspace():
            device = line.split()[0]
        elif "ACSCtl:" in line:
            with_acs += 1
            if "ReqRedir+" in line or "CmpltRedir+" in line:
                redirecting.append(device or "?")
    return {"devices_with_acs": with_acs, "redirecting": len(redirecting),
            "examples": redirecting[:5]}


def _pci_acs() -> dict[str, Any] | None:
    lspci = shutil.which("lspci")
    if lspci is None:
        return {"error": "lspci is not installed"}
    try:
        out = subprocess.run([lspci, "-vvv"], capture_output=True, text=True,
                             timeout=_COMMAND_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as exc:
        return {"error": str(exc)}
    if out.returncode != 0:
        return {"error": (out.stderr.strip().splitlines() or ["lspci failed"])[-1]}
    facts = parse_acs(out.stdout)
    if facts["devices_with_acs"] == 0 and "Capabilities: <access denied>" in out.stdout:
        facts["note"] = "lspci could not read capabilities (needs root)"
    return facts


def _boot_id() -> str | None:
    text = _read_text("/proc/sys/kernel/random/boot_id")
    return text.strip() if text else None


def _max_map_count() -> int | None:
    text = _read_text("/proc/sys/vm/max_map_count")
    try:
        return int(text) if text else None
    except ValueError:
        return None


_TOPOLOGY_CELL = re.compile(r"^(X|NV\d+|PIX|PXB|PHB|NODE|SYS|SOC)$")


def parse_nvidia_topology(topo_text: str, uuids_by_index: dict[int, str]) -> dict[str, dict]:
    """Links between GPUs from ``nvidia-smi topo -m``, keyed ``'<uuid>|<uuid>'``:
    ``{'kind': 'nvlink' | 'pcie', 'label': 'NV18'}``. nvidia-smi numbers GPUs its own
    way (all of them, whatever CUDA_VISIBLE_DEVICES says), hence the UUIDs."""
    links: dict[str, dict] = {}
    for line in topo_text.splitlines():
        cells = line.split()
        if not cells or not re.fullmatch(r"GPU\d+", cells[0]):
            continue
        src = int(cells[0][3:])
        gpu_cells = [c for c in cells[1:] if _TOPOLOGY_CELL.match(c)]
        for dst, label in enumerate(gpu_cells):
            if dst == src or label == "X" or src not in uuids_by_index \
                    or dst not in uuids_by_index:
                continue
            kind = "nvlink" if label.startswith("NV") else "pcie"
            links[f"{uuids_by_index[src]}|{uuids_by_index[dst]}"] = {"kind": kind, "label": label}
    return links


def _nvidia_smi_facts() -> dict[str, Any] | None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    facts: dict[str, Any] = {}
    try:
        query = subprocess.run(
            [smi, "--query-gpu=index,uuid,pci.bus_id,driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=_COMMAND_TIMEOUT_S)
        uuids = {}
        for line in query.stdout.splitlines():
            parts = [part.strip() for part in line.split(",")]
            if len(parts) == 4 and parts[0].isdigit():
                uuids[int(parts[0])] = parts[1]
                facts["driver"] = parts[3]
        topo = subprocess.run([smi, "topo", "-m"], capture_output=True, text=True,
                              timeout=_COMMAND_TIMEOUT_S)
        facts["links"] = parse_nvidia_topology(topo.stdout, uuids)
    except (OSError, subprocess.SubprocessError) as exc:
        facts["error"] = str(exc)
    return facts


def _driver_version() -> str | None:
    text = _read_text("/proc/driver/nvidia/version") or ""
    match = re.search(r"Kernel Module.*?\s(\d{3,}\.\d+(?:\.\d+)?)\s", text)
    return match.group(1) if match else None


def _gpu_facts(local_rank: int, local_size: int) -> dict[str, Any]:
    from ..backends import gpu_count

    count, reason = gpu_count()
    device_files = sorted(glob.glob("/dev/nvidia[0-9]*"))
    facts: dict[str, Any] = {"count": count, "device_files": len(device_files)}
    try:
        facts["imex_channels"] = sorted(os.listdir("/dev/nvidia-caps-imex-channels"))
    except OSError:
        facts["imex_channels"] = None
    if count == 0:
        facts["reason"] = reason
        return facts
    try:
        from ..runtime import cuda_driver
        from ..topology import devices
        from .fabric import read_fabric_facts

        version = int(cuda_driver.check("cuDriverGetVersion",
                                        cuda_driver.driver.cuDriverGetVersion()))
        facts["cuda"] = f"{version // 1000}.{version % 1000 // 10}"
        facts["driver"] = _driver_version()
        facts["devices"] = devices.describe_devices()
        uuid_of = {d["index"]: d["uuid"] for d in facts["devices"]}
        facts["p2p"] = [dict(pair, src_uuid=uuid_of[pair["src"]], dst_uuid=uuid_of[pair["dst"]])
                        for pair in devices.p2p_matrix()]
        facts["bound"] = devices.bind_device(local_rank, local_size)
        facts["bound_uuid"] = uuid_of[facts["bound"]]
        # Served by MPS: ranks sharing the GPU run side by side instead of taking turns.
        facts["mps"] = cuda_driver.mps_client(facts["bound"])
        # NVLink domain across hosts (NVL72-class): the bound GPU's fabric registration.
        bus_id = _bound_bus_id(facts)
        facts["fabric"] = read_fabric_facts(bus_id) if bus_id else None
    except Exception as exc:  # a fact that cannot be read is reported, not fatal
        facts["error"] = f"{type(exc).__name__}: {exc}"
    return facts


def _bound_bus_id(gpu: dict[str, Any]) -> str | None:
    bound = gpu.get("bound")
    return next((d.get("pci_bus_id") for d in gpu.get("devices", []) if d["index"] == bound),
                None)


def collect_rank_facts(*, local_rank: int, local_size: int, node_facts: bool,
                       probe_acs: bool) -> dict[str, Any]:
    """Facts of this rank's process (with its CPU / NUMA placement against its GPU's,
    ``affinity``). ``node_facts`` adds what one rank per node reads
    for all (nvidia-smi topology; with ``probe_acs`` also ``lspci -vvv``). Never raises
    for a missing source."""
    status = _status_fields()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    facts: dict[str, Any] = {
        "host": socket.gethostname(),
        "boot_id": _boot_id(),
        "kernel": os.uname().release,
        "pid": os.getpid(),
        "uid": os.getuid(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "nofile_soft": None if soft == resource.RLIM_INFINITY else soft,
        "nofile_hard": None if hard == resource.RLIM_INFINITY else hard,
        "open_fds": open_fd_count(),
        "mappings": mapping_counts(),
        "max_map_count": _max_map_count(),
        "dev_shm": _filesystem("/dev/shm"),
        "ptrace_scope": read_ptrace_scope(),
        "seccomp": read_seccomp(status),
        "cap_sys_ptrace": _has_capability(status, CAP_SYS_PTRACE),
        "pid_namespace": _namespace("pid"),
        "ipc_namespace": _namespace("ipc"),
        "pidfd_getfd_self": _pidfd_self_probe(),
        "memfd": hasattr(os, "memfd_create"),
        "iommu": _iommu_hints(),
        "gpu": _gpu_facts(local_rank, local_size),
    }
    facts["affinity"] = collect_affinity(_bound_bus_id(facts["gpu"]))
    if node_facts:
        facts["pci_acs"] = _pci_acs() if probe_acs else None
        facts["nvidia_smi"] = _nvidia_smi_facts() if facts["gpu"]["count"] else None
        if facts["nvidia_smi"] and not facts["gpu"].get("driver"):
            facts["gpu"]["driver"] = facts["nvidia_smi"].get("driver")
    return facts
