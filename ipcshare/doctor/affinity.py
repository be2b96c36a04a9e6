"""Where a rank runs against where its GPU sits: the rank's CPU affinity and memory nodes,
the NUMA node and local CPUs of its GPU's PCI device, and how many of the rank's CPUs are
local to the GPU.

The readers take a ``root`` (``/`` on a real machine), so tests feed them fake sysfs trees.
sysfs is the source; NVML (the ``nvidia-ml-py`` binding, optional) fills what sysfs does not
say, e.g. in containers that hide ``/sys/bus/pci``. Nothing here raises for a missing file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..topology.nvml_session import handle_by_cuda_bus_id, nvml_session

__all__ = [
    "parse_cpulist",
    "format_cpulist",
    "normalize_bus_id",
    "read_numa_cpus",
    "read_pci_locality",
    "read_mems_allowed",
    "collect_affinity",
]


def parse_cpulist(text: str) -> list[int]:
    """CPUs of a kernel cpulist (``'0-3,8,10-11'``), sorted.

    Raises:
        ValueError: not a cpulist.
    """
    cpus: set[int] = set()
    for part in filter(None, (item.strip() for item in text.strip().split(","))):
        first, _, last = part.partition("-")
        if last:
            cpus.update(range(int(first), int(last) + 1))
        else:
            cpus.add(int(first))
    return sorted(cpus)


def format_cpulist(cpus: list[int] | set[int]) -> str:
    """The kernel's spelling of a CPU set: ``[0, 1, 2, 3, 8]`` -> ``'0-3,8'``."""
    ordered = sorted(cpus)
    ranges: list[str] = []
    start = previous = None
    for cpu in ordered + [None]:
        if start is not None and (cpu is None or cpu != previous + 1):
            ranges.append(str(start) if start == previous else f"{start}-{previous}")
            start = None
        if cpu is not None and start is None:
            start = cpu
        previous = cpu
    return ",".join(ranges)


def normalize_bus_id(bus_id: str) -> str:
    """sysfs spelling of a PCI address: CUDA's ``0000:1B:00.0`` and NVML's
    ``00000000:1B:00.0`` both become ``0000:1b:00.0``.

    Raises:
        ValueError: not a ``domain:bus:device.function`` address.
    """
    domain, bus, rest = bus_id.strip().split(":")
    device, function = rest.split(".")
    return f"{int(domain, 16):04x}:{int(bus, 16):02x}:{int(device, 16):02x}.{int(function, 16)}"


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def read_numa_cpus(root: str | os.PathLike = "/") -> dict[int, list[int]]:
    """``{numa node: its CPUs}`` from ``sys/devices/system/node/node*/cpulist``; empty when
    the kernel shows no NUMA nodes."""
    nodes: dict[int, list[int]] = {}
    base = Path(root, "sys/devices/system/node")
    try:
        entries = sorted(base.iterdir())
    except OSError:
        return nodes
    for entry in entries:
        suffix = entry.name[4:]
        if not entry.name.startswith("node") or not suffix.isdigit():
            continue
        text = _read(entry / "cpulist")
        try:
            nodes[int(suffix)] = parse_cpulist(text) if text else []
        except ValueError:
            continue
    return nodes


def read_pci_locality(bus_id: str, root: str | os.PathLike = "/") -> dict[str, Any]:
    """``{'numa_node': int | None, 'local_cpus': [cpus] | None}`` of a PCI device from
    ``sys/bus/pci/devices/<address>/numa_node`` and ``local_cpulist``. The kernel writes
    ``-1`` when the platform does not say (one-socket machines, many VMs): None."""
    device = Path(root, "sys/bus/pci/devices", normalize_bus_id(bus_id))
    numa_text = _read(device / "numa_node")
    cpus_text = _read(device / "local_cpulist")
    numa_node = None
    if numa_text is not None and numa_text.lstrip("-").isdigit() and int(numa_text) >= 0:
        numa_node = int(numa_text)
    try:
        local_cpus = parse_cpulist(cpus_text) if cpus_text else None
    except ValueError:
        local_cpus = None
    return {"numa_node": numa_node, "local_cpus": local_cpus}


def read_mems_allowed(root: str | os.PathLike = "/") -> list[int] | None:
    """NUMA nodes this process may allocate memory on (its cpuset's ``Mems_allowed_list``
    in ``proc/self/status``), or None where unreadable."""
    text = _read(Path(root, "proc/self/status")) or ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "Mems_allowed_list":
            try:
                return parse_cpulist(value)
            except ValueError:
                return None
    return None


def _nvml_locality(bus_id: str) -> dict[str, Any] | None:
    """The same facts from NVML, or None when nvidia-ml-py is absent or NVML fails."""
    with nvml_session() as pynvml:
        if pynvml is None:
            return None
        try:
            handle = handle_by_cuda_bus_id(pynvml, normalize_bus_id(bus_id))
            words = pynvml.nvmlDeviceGetCpuAffinity(handle, (os.cpu_count() or 64) // 64 + 1)
            cpus = [64 * index + bit for index, word in enumerate(words) for bit in range(64)
                    if int(word) >> bit & 1]
            numa_node = None
            if hasattr(pynvml, "nvmlDeviceGetNumaNodeId"):
                value = int(pynvml.nvmlDeviceGetNumaNodeId(handle))
                numa_node = value if value >= 0 else None
            return {"numa_node": numa_node, "local_cpus": cpus or None}
        except Exception:  # NVML errors are facts we could not read, nothing more
            return None


def collect_affinity(gpu_bus_id: str | None, *, root: str | os.PathLike = "/",
                     cpus: set[int] | None = None, use_nvml: bool = True) -> dict[str, Any]:
    """This rank's placement: its CPUs (``os.sched_getaffinity`` unless ``cpus`` is
    given), their NUMA nodes, its memory nodes, and with ``gpu_bus_id`` the GPU's NUMA
    node, local CPUs and how many of the rank's CPUs are among them. Never raises."""
    if cpus is None:
        try:
            cpus = set(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cpus = set()
    numa = read_numa_cpus(root)
    node_of = {cpu: node for node, members in numa.items() for cpu in members}
    facts: dict[str, Any] = {
        "cpus": format_cpulist(cpus), "cpu_count": len(cpus), "numa_nodes": len(numa),
        "cpu_numa_nodes": sorted({node_of[cpu] for cpu in cpus if cpu in node_of}),
        "mems_allowed": read_mems_allowed(root),
    }
    if not gpu_bus_id:
        return facts
    try:
        locality = read_pci_locality(gpu_bus_id, root)
    except ValueError:
        facts["error"] = f"GPU PCI address {gpu_bus_id!r} is not domain:bus:device.function"
        return facts
    source = "sysfs" if locality["numa_node"] is not None or locality["local_cpus"] else None
    if use_nvml and (locality["numa_node"] is None or not locality["local_cpus"]):
        nvml = _nvml_locality(gpu_bus_id)
        if nvml and (nvml["numa_node"] is not None or nvml["local_cpus"]):
            locality = {key: locality[key] if locality[key] is not None else nvml[key]
                        for key in locality}
            source = "sysfs+nvml" if source else "nvml"
    local = locality["local_cpus"]
    if not local and locality["numa_node"] is not None:
        local = numa.get(locality["numa_node"])  # the node's CPUs stand in for the device's
    facts.update(gpu_pci=normalize_bus_id(gpu_bus_id), gpu_numa_node=locality["numa_node"],
                 gpu_local_cpus=format_cpulist(local) if local else None,
                 cpus_near_gpu=len(cpus & set(local)) if local else None, source=source)
    return facts
