"""NVLink domains across hosts (GB200 NVL72-class systems, where cuMem fabric handles map
memory between hosts through nvidia-imex): each GPU's fabric registration from NVML
(state, cluster UUID, clique id), and which ranks share one domain. Ranks whose GPUs sit
in one completed clique of one cluster, with an IMEX channel, can share memory by fabric
handles whatever their host (PyTorch symmetric memory makes the same check); elsewhere
the host is the limit.

NVML is read through nvidia-ml-py (``pynvml``) where it is installed; its answers are
parsed by :func:`parse_fabric_info`, which the tests feed from fixtures.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

__all__ = ["FABRIC_STATES", "parse_fabric_info", "read_fabric_facts", "fabric_domains",
           "describe_fabric_domains", "fabric_domain_findings"]

# nvmlGpuFabricState_t
FABRIC_STATES = {0: "not-supported", 1: "not-started", 2: "in-progress", 3: "completed"}
_NVML_SUCCESS = 0


def parse_fabric_info(info: Mapping[str, Any]) -> dict[str, Any]:
    """The facts of one GPU's ``nvmlGpuFabricInfo(V)_t`` (fields ``state``, ``status``,
    ``clusterUuid``, ``cliqueId``, as pynvml names them): ``state`` in words, ``status``
    (NVML's return code of the registration, 0 = success), ``cluster_uuid`` (None when
    all zero), ``clique`` and ``in_domain``: registered in an NVLink domain."""
    state_code = int(info.get("state", 0))
    state = FABRIC_STATES.get(state_code, f"unknown ({state_code})")
    status = int(info.get("status", _NVML_SUCCESS))
    raw = bytes(info.get("clusterUuid") or b"")[:16]
    cluster = str(uuid.UUID(bytes=raw)) if len(raw) == 16 and any(raw) else None
    clique = int(info.get("cliqueId", 0))
    return {"state": state, "status": status, "cluster_uuid": cluster, "clique": clique,
            "in_domain": state == "completed" and status == _NVML_SUCCESS
            and cluster is not None}


def read_fabric_facts(pci_bus_id: str) -> dict[str, Any] | None:
    """NVML's fabric facts of the GPU at ``pci_bus_id`` (:func:`parse_fabric_info`), or
    None without nvidia-ml-py; ``{"error": ...}`` when NVML cannot say."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # no driver: report, never raise from a fact
        return {"error": f"nvmlInit: {exc}"}
    try:
        handle = pynvml.nvmlDeviceGetHandleByPciBusId(pci_bus_id.encode())
        info = pynvml.nvmlDeviceGetGpuFabricInfo(handle)
        return parse_fabric_info({name: getattr(info, name, 0) for name in
                                  ("state", "status", "clusterUuid", "cliqueId")})
    except Exception as exc:  # older drivers and GPUs without fabric: NOT_SUPPORTED
        return {"error": str(exc) or type(exc).__name__}
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def fabric_domains(ranks: Mapping[int, Mapping[str, Any]]) -> dict[str, list[int]]:
    """Ranks grouped by NVLink domain (``"<cluster uuid>/<clique>"``), from each rank's
    facts: ``fabric`` (its GPU's :func:`parse_fabric_info`) and ``imex_channels``. Ranks
    whose GPU is in no completed domain, or that see no IMEX channel, stand alone under
    ``"host:<name>"``: fabric handles cannot reach them from another host."""
    groups: dict[str, list[int]] = {}
    for rank in sorted(ranks):
        facts = ranks[rank]
        fabric = facts.get("fabric") or {}
        if fabric.get("in_domain") and facts.get("imex_channels"):
            key = f"{fabric['cluster_uuid']}/{fabric['clique']}"
        else:
            key = f"host:{facts.get('host', '?')}"
        groups.setdefault(key, []).append(rank)
    return groups


def describe_fabric_domains(ranks: Mapping[int, Mapping[str, Any]]) -> str:
    """One line: how many NVLink domains span how many hosts, e.g. ``ranks 0-7 on 2 hosts
    share NVLink domain <uuid>/3: fabric handles can map memory between these hosts``."""
    from ..topology.world import format_ranks

    parts = []
    for key, members in fabric_domains(ranks).items():
        hosts = {ranks[r].get("host") for r in members}
        if key.startswith("host:"):
            parts.append(f"{format_ranks(members)} on {key[5:]}: no NVLink domain across hosts")
        else:
            parts.append(f"{format_ranks(members)} on {len(hosts)} host(s) share NVLink "
                         f"domain {key}")
    return "; ".join(parts)


def fabric_domain_findings(ranks: Mapping[int, Mapping[str, Any]]) -> list[tuple[str, str, str]]:
    """``(severity, problem, fix)`` for GPUs whose fabric registration is under way or
    failed (a domain member that cannot take part yet), and for domain members without
    an IMEX channel. Nothing for GPUs without fabric support (most systems)."""
    found = []
    for rank in sorted(ranks):
        facts = ranks[rank]
        fabric = facts.get("fabric") or {}
        state = fabric.get("state")
        if state in ("not-started", "in-progress") or (
                state == "completed" and fabric.get("status", _NVML_SUCCESS) != _NVML_SUCCESS):
            found.append(("warn", f"rank {rank}'s GPU has not joined its NVLink domain "
                          f"(fabric state {state}, NVML status {fabric.get('status')})",
                          "start nvidia-fabricmanager (and nvidia-imex) on this host and "
                          "wait for the registration to complete before the job"))
        elif fabric.get("in_domain") and not facts.get("imex_channels"):
            found.append(("warn", f"rank {rank}'s GPU is in NVLink domain "
                          f"{fabric['cluster_uuid']}/{fabric['clique']} but this process "
                          "sees no IMEX channel: fabric handles will be refused "
                          "(CUDA_ERROR_NOT_PERMITTED)",
                          "create /dev/nvidia-caps-imex-channels/channel0 and pass it into "
                          "the container"))
    return found
