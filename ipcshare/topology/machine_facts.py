"""The machine a figure was measured on, as the result document's ``machine`` holds it:
GPU model and count, how they link, driver, CUDA, NCCL and torch versions, host CPUs.
Read from NVML (nvidia-ml-py) or, without it, ``nvidia-smi``; packages by their installed
metadata, so nothing heavy is imported and no CUDA context is made."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Sequence
from importlib import metadata
from typing import Any

from .link_speed import NVLINK_NAMES
from .nvml_session import nvml_session

__all__ = ["machine_facts_here", "describe_links", "links_from_topology",
           "visible_gpu_indices"]

_MAX_NVLINKS = 18
_NCCL_WHEELS = ("nvidia-nccl-cu13", "nvidia-nccl-cu12")


def describe_links(nvlinks: Sequence[tuple[int, int]], nvlink_pairs: int, pairs: int,
                   pcie: tuple[int, int] | None = None) -> str | None:
    """One line on how ``len(nvlinks)`` GPUs connect: ``nvlinks`` holds each GPU's
    (links up, NVML NVLink version), ``nvlink_pairs`` of the ``pairs`` GPU pairs talk over
    NVLink, ``pcie`` is the first GPU's (generation, width).

    >>> describe_links([(18, 6)] * 4, 6, 6)
    'NVLink 4: 18 links per GPU, all 6 pairs'
    """
    if not nvlinks:
        return None
    ups = sorted({up for up, _version in nvlinks})
    versions = sorted({NVLINK_NAMES.get(v, str(v)) for up, v in nvlinks if up})
    pcie_text = f"PCIe gen {pcie[0]} x{pcie[1]}" if pcie else "PCIe"
    if not versions:
        return f"{pcie_text}, no NVLink" + ("" if len(nvlinks) > 1 else " (one GPU)")
    links = "-".join(str(up) for up in (ups[0], ups[-1]) if up) if len(ups) > 1 else str(ups[0])
    text = f"NVLink {'/'.join(versions)}: {links} links per GPU"
    if len(nvlinks) == 1:
        return text + " (one GPU)"
    if nvlink_pairs == pairs:
        return f"{text}, all {pairs} pairs"
    return f"{text}, {nvlink_pairs} of {pairs} pairs ({pcie_text} for the others)"


def links_from_topology(text: str, chosen: Sequence[int]) -> str | None:
    """One line on how the GPUs ``chosen`` connect, from ``nvidia-smi topo -m``'s matrix
    (``NV18``: 18 NVLinks between the pair; ``PIX``, ``PXB``, ``PHB``, ``NODE``, ``SYS``:
    PCIe paths); None where the matrix is not there. On 4 H200s: ``NVLink: 18 links a
    pair, all 6 pairs (nvidia-smi topo)``.
    """
    matrix: dict[int, list[str]] = {}
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.split("\t")]
        if cells and cells[0].startswith("GPU") and cells[0][3:].isdigit():
            matrix[int(cells[0][3:])] = cells[1:]
    pairs = [(a, b) for i, a in enumerate(chosen) for b in chosen[i + 1:]]
    if not pairs:
        return None
    try:
        kinds = [matrix[a][b] for a, b in pairs]
    except (KeyError, IndexError):
        return None
    nvlinks = sorted({int(kind[2:]) for kind in kinds if kind.startswith("NV")
                      and kind[2:].isdigit()})
    if not nvlinks:
        return f"PCIe ({', '.join(sorted(set(kinds)))}), no NVLink (nvidia-smi topo)"
    links = str(nvlinks[0]) if len(nvlinks) == 1 else f"{nvlinks[0]}-{nvlinks[-1]}"
    over = sum(kind.startswith("NV") for kind in kinds)
    reach = f"all {len(pairs)} pairs" if over == len(pairs) else f"{over} of {len(pairs)} pairs"
    return f"NVLink: {links} links a pair, {reach} (nvidia-smi topo)"


def visible_gpu_indices(count: int, uuids: Sequence[str] = (),
                        visible: str | None = None) -> list[int]:
    """The NVML indices of the GPUs CUDA_VISIBLE_DEVICES (``visible``) leaves this
    process, of ``count``; every one when unset. Entries are indices or UUIDs
    (``GPU-...``, matched against ``uuids`` by prefix); an entry that matches none ends
    the list, as CUDA does."""
    if visible is None:
        return list(range(count))
    chosen: list[int] = []
    for entry in (part.strip() for part in visible.split(",")):
        if entry.isdigit() and int(entry) < count:
            chosen.append(int(entry))
            continue
        match = [i for i, uuid in enumerate(uuids) if entry and uuid.startswith(entry)]
        if len(match) != 1:
            break
        chosen.append(match[0])
    return chosen


def _package_version(*names: str) -> str | None:
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _from_nvml(pynvml: Any) -> dict[str, Any]:
    count = int(pynvml.nvmlDeviceGetCount())
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    uuids = [_text(pynvml.nvmlDeviceGetUUID(h)) for h in handles]
    chosen = [handles[i] for i in visible_gpu_indices(count, uuids,
                                                      os.environ.get("CUDA_VISIBLE_DEVICES"))]
    facts: dict[str, Any] = {
        "gpu_model": _text(pynvml.nvmlDeviceGetName(chosen[0])) if chosen else None,
        "gpu_count": len(chosen),
        "driver": _text(pynvml.nvmlSystemGetDriverVersion()), "cuda": None, "links": None}
    try:
        cuda = int(pynvml.nvmlSystemGetCudaDriverVersion_v2())
        facts["cuda"] = f"{cuda // 1000}.{cuda % 1000 // 10}"
    except Exception:  # an older NVML: the version stays unknown
        pass
    nvlinks = []
    for handle in chosen:
        up, version = 0, 0
        for link in range(_MAX_NVLINKS):
            try:
                if pynvml.nvmlDeviceGetNvLinkState(handle, link):
                    up += 1
                    version = version or int(pynvml.nvmlDeviceGetNvLinkVersion(handle, link))
            except pynvml.NVMLError:
                break  # past the GPU's last link, or no NVLink at all
        nvlinks.append((up, version))
    pairs = [(a, b) for i, a in enumerate(chosen) for b in chosen[i + 1:]]
    nvlink_pairs = 0
    for a, b in pairs:
        try:
            status = pynvml.nvmlDeviceGetP2PStatus(a, b, pynvml.NVML_P2P_CAPS_INDEX_NVLINK)
            nvlink_pairs += status == pynvml.NVML_P2P_STATUS_OK
        except Exception:  # NVML cannot say for this pair: not counted as NVLink
            pass
    pcie = None
    if chosen:
        try:
            pcie = (int(pynvml.nvmlDeviceGetMaxPcieLinkGeneration(chosen[0])),
                    int(pynvml.nvmlDeviceGetMaxPcieLinkWidth(chosen[0])))
        except Exception:  # no PCIe facts: the line says "PCIe" alone
            pass
    facts["links"] = describe_links(nvlinks, nvlink_pairs, len(pairs), pcie)
    return facts


def _from_nvidia_smi() -> dict[str, Any]:
    facts: dict[str, Any] = {"gpu_model": None, "gpu_count": 0, "driver": None, "cuda": None,
                             "links": None}
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,uuid",
                              "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=30)
    except (OSError, subprocess.SubprocessError):
        return facts
    if out.returncode != 0:
        return facts
    gpus = [[part.strip() for part in line.split(",")] for line in out.stdout.splitlines()
            if line.strip()]
    chosen = visible_gpu_indices(len(gpus), [g[-1] for g in gpus],
                                 os.environ.get("CUDA_VISIBLE_DEVICES"))
    if chosen:
        facts.update(gpu_model=gpus[chosen[0]][0], gpu_count=len(chosen),
                     driver=gpus[chosen[0]][1])
    if len(chosen) > 1:
        try:
            topology = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True,
                                      text=True, timeout=30)
            facts["links"] = links_from_topology(topology.stdout, chosen)
        except (OSError, subprocess.SubprocessError):
            pass  # the links stay unknown
    elif chosen:
        facts["links"] = "one GPU"
    return facts


def machine_facts_here() -> dict[str, Any]:
    """This host's facts for the result document's ``machine`` (every key of
    ``result_document.MACHINE_FIELDS``); what cannot be read is None, and a machine
    without GPUs has ``gpu_count`` 0."""
    with nvml_session() as pynvml:
        gpus = None
        if pynvml is not None:
            try:
                gpus = _from_nvml(pynvml)
            except Exception:  # NVML failed half-way: ask nvidia-smi instead
                gpus = None
    if gpus is None:
        gpus = _from_nvidia_smi()
    return {"hostname": socket.gethostname(), "host_cpus": os.cpu_count() or 0, **gpus,
            "nccl": _package_version(*_NCCL_WHEELS), "torch": _package_version("torch")}
