"""From every rank's results to one verdict per node: merged matrix, bandwidth and
limits, the required checks, the findings of the rules, pass or fail; and the
document that ``--json`` / ``--yaml`` write, keyed by host, boot_id, driver and GPUs.

Required checks (a node fails when any fails): ``host-shm`` works between every pair;
on a GPU node at least one GPU path works between every pair; ``ulimit -n`` covers the
predicted need on every rank; closing every window gives back every descriptor,
mapping and byte (``leak``).
"""

from __future__ import annotations

from typing import Any

from .bandwidth import judge_rows, link_kind
from .consistency import node_differences
from .paths import GPU_PATHS
from .rules import descriptor_need, diagnose

__all__ = ["build_node_verdict", "build_document", "node_key", "REQUIRED_CHECKS",
           "DOCUMENT_FORMAT"]

REQUIRED_CHECKS = ("host-shm", "gpu-path", "descriptors", "leak")
DOCUMENT_FORMAT = 1
_GPU_PATH_NAMES = tuple(spec.name for spec in GPU_PATHS if spec.handle != "fabric")


def _merge_paths(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    merged = []
    for index, first in enumerate(results[0]["matrix"]):
        records = [r["matrix"][index] for r in results if index < len(r["matrix"])]
        path = {key: value for key, value in first.items() if key != "cells"}
        failures = [rec["failure"] for rec in records if rec.get("failure")]
        if failures:
            # The message is the same on every rank; the cause is each failing rank's own.
            path["failure"] = {k: v for k, v in failures[0].items() if k != "local_cause"}
            causes = {str(result["rank"]): rec["failure"]["local_cause"]
                      for result, rec in zip(results, records, strict=False)
                      if (rec.get("failure") or {}).get("local_cause")}
            if causes:
                path["local_causes"] = causes
        path["cells"] = [cell for rec in records for cell in rec.get("cells", [])]
        if any(rec.get("status") == "failed" for rec in records):
            path["status"] = "failed"
        closing = {str(result["rank"]): rec["close_error"]
                   for result, rec in zip(results, records, strict=False)
                   if rec.get("close_error")}
        if closing:
            path["close_errors"] = closing
        merged.append(path)
    return merged


def _merge_bandwidth(results: list[dict[str, Any]], side: str,
                     kinds: dict[tuple[int, int], str] | None) -> dict[str, Any] | None:
    records = [r["bandwidth"].get(side) for r in results if r.get("bandwidth")]
    records = [rec for rec in records if rec]
    if not records:
        return None
    merged = {key: value for key, value in records[0].items()
              if key not in ("rows", "received", "device")}
    failure = next((rec["failure"] for rec in records if rec.get("failure")), None)
    if failure:
        merged.update(status="failed", failure=failure)
    intact = {(got["writer"], got["owner"]): got for rec in records
              for got in rec.get("received", [])}
    rows = []
    for rec in records:
        for row in rec.get("rows", []):
            row = dict(row)
            received = intact.get((row["writer"], row["owner"]))
            if received is not None:
                row["intact"] = received.get("intact")
                if received.get("error"):
                    row["receive_error"] = received["error"]
            rows.append(row)
    rows.sort(key=lambda row: (row["writer"], row["owner"]))
    if kinds is not None:
        judge_rows(rows, kinds)
    merged["rows"] = rows
    merged["devices"] = {str(r["rank"]): r["bandwidth"][side].get("device")
                         for r in results if (r.get("bandwidth") or {}).get(side)}
    return merged


def _link_kinds(ranks: list[dict[str, Any]]) -> dict[tuple[int, int], str]:
    links = next((facts["nvidia_smi"].get("links") for facts in ranks
                  if facts.get("nvidia_smi")), None)
    gpu_of = {facts["rank"]: (facts.get("gpu") or {}).get("bound_uuid") for facts in ranks}
    return {(w, o): link_kind(gpu_of[w], gpu_of[o], links)
            for w in gpu_of for o in gpu_of if w != o}


def _identity(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    first = ranks[0]
    gpus = [(facts.get("gpu") or {}) for facts in ranks]
    uuids = sorted({d["uuid"] for gpu in gpus for d in gpu.get("devices", [])})
    return {"host": first.get("host"), "boot_id": first.get("boot_id"),
            "driver": next((g.get("driver") for g in gpus if g.get("driver")), None),
            "cuda": next((g.get("cuda") for g in gpus if g.get("cuda")), None),
            "gpu_uuids": uuids}


def node_key(identity: dict[str, Any]) -> str:
    """``host|boot_id|driver|uuid,uuid`` ('-' for what is missing): one key per node and
    boot, which changes when the driver or the GPUs change."""
    uuids = ",".join(identity.get("gpu_uuids") or []) or "-"
    return "|".join([identity.get("host") or "-", identity.get("boot_id") or "-",
                     identity.get("driver") or "-", uuids])


def _checks(node: dict[str, Any], gpu_node: bool) -> list[dict[str, Any]]:
    paths = {p["path"]: p for p in node["matrix"]}
    checks = []
    host = paths.get("host-shm")
    if host is None:
        checks.append({"name": "host-shm", "required": True, "ok": False, "detail": "not run"})
    else:
        pairs = len(host["cells"])
        good = sum(cell["result"] == "ok" for cell in host["cells"])
        if host["status"] == "ok":
            detail = (f"{good}/{pairs} pairs ok, descriptors by {host.get('exchange_used')}"
                      if pairs else "ok (no peer on this node: allocate and export only)")
        else:
            detail = (host.get("failure") or {}).get("message") or f"{good}/{pairs} pairs ok"
        checks.append({"name": "host-shm", "required": True, "ok": host["status"] == "ok",
                       "detail": detail})
    if gpu_node:
        working = [name for name in _GPU_PATH_NAMES
                   if paths.get(name, {}).get("status") == "ok"]
        detail = ("working: " + ", ".join(working) if working else
                  "none of " + ", ".join(_GPU_PATH_NAMES) + " works between every pair")
        checks.append({"name": "gpu-path", "required": True, "ok": bool(working),
                       "detail": detail})
    local_size = len(node["ranks"])
    short = []
    for facts in node["ranks"]:
        need = descriptor_need(facts.get("open_fds"), local_size)
        soft = facts.get("nofile_soft")
        if soft is not None and soft < need:
            short.append(f"rank {facts['rank']}: ulimit -n {soft} < {need} needed")
    soft_all = sorted({str(f.get("nofile_soft") or "unlimited") for f in node["ranks"]})
    checks.append({"name": "descriptors", "required": True, "ok": not short,
                   "detail": "; ".join(short) if short else
                   f"ulimit -n {'/'.join(soft_all)} covers the need"})
    leaked = [f"rank {entry['rank']}: {', '.join(entry['leaked'])}"
              for entry in node["leaks"] if entry.get("leak")]
    measured = [entry for entry in node["leaks"] if entry.get("grown")]
    checks.append({"name": "leak", "required": True, "ok": not leaked,
                   "detail": "; ".join(leaked) if leaked else
                   ("nothing kept after closing every window" if measured else
                    "not measured (no /proc)")})
    return checks


def build_node_verdict(results: list[dict[str, Any]], *, quick: bool) -> dict[str, Any]:
    """One node's verdict from its ranks' results (any order)."""
    results = sorted(results, key=lambda r: r["local_rank"])
    ranks = [dict(r["environment"], rank=r["rank"], local_rank=r["local_rank"])
             for r in results]
    gpu_node = any((facts.get("gpu") or {}).get("count") for facts in ranks)
    identity = _identity(ranks)
    node: dict[str, Any] = {**identity, "gpu_node": gpu_node,
                            "world_ranks": [r["rank"] for r in results], "ranks": ranks}
    node["matrix"] = _merge_paths(results)
    node["bandwidth"] = {"host": _merge_bandwidth(results, "host", None),
                         "gpu": _merge_bandwidth(results, "gpu", _link_kinds(ranks))}
    node["limits"] = {
        "windows": [dict(w) for w in results[0].get("limits", {}).get("windows", [])],
        "per_rank": [dict(r.get("limits", {}).get("per_rank", {}), rank=r["rank"])
                     for r in results],
    }
    for window in node["limits"]["windows"]:
        times = [next((w for w in r.get("limits", {}).get("windows", [])
                       if w["path"] == window["path"]), {}).get("ms_per_window")
                 for r in results]
        times = [t for t in times if t is not None]
        if times:
            window["ms_per_window_slowest_rank"] = max(times)
    node["leaks"] = [dict(r.get("leak") or {}, rank=r["rank"]) for r in results]
    node["staging"] = results[0].get("staging")  # local rank 0 probes (full runs)
    node["checks"] = _checks(node, gpu_node)
    node["findings"] = [finding.to_dict() for finding in diagnose(node)]
    node["pass"] = all(check["ok"] for check in node["checks"] if check["required"])
    node["stage_seconds"] = results[0].get("stage_seconds")
    return node


def build_document(results: list[dict[str, Any]], *, version: str, quick: bool,
                   mpi_library: str, elapsed_s: float) -> dict[str, Any]:
    """The whole job's verdict: one entry per node under ``nodes``, keyed by
    ``node_key``, and ``pass`` when every node passes."""
    by_node: dict[int, list[dict[str, Any]]] = {}
    for result in results:
        by_node.setdefault(result["node"], []).append(result)
    nodes: dict[str, Any] = {}
    for index in sorted(by_node):
        verdict = build_node_verdict(by_node[index], quick=quick)
        key = node_key(verdict)
        if key in nodes:  # two nodes that look identical (containers on one host)
            key = f"{key}#{index}"
        nodes[key] = verdict
    return {"ipcshare": version, "doctor_format": DOCUMENT_FORMAT, "quick": quick,
            "mpi": mpi_library, "world_size": len(results), "node_count": len(nodes),
            "elapsed_s": round(elapsed_s, 3),
            "pass": all(node["pass"] for node in nodes.values()),
            "differences": node_differences(nodes), "nodes": nodes}
