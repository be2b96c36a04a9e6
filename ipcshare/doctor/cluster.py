"""The cluster summary rank 0 prints last: which nodes pass, which fail, and why (the
failing required checks with the cause and fix the rules found for each)."""

from __future__ import annotations

from typing import Any

from .consistency import node_differences
from .fabric import describe_fabric_domains

__all__ = ["summarize_cluster", "render_summary"]


def summarize_cluster(document: dict[str, Any]) -> dict[str, Any]:
    """``{'passed': [keys], 'failed': {key: [reasons]}, 'warnings': {key: count},
    'differences': [lines]}`` (driver, CUDA or GPU model differing between nodes).

    A reason is ``'<check>: <cause> (fix: <fix>)'`` for every failing finding of the
    node (the rules always leave at least one for each failing required check).
    """
    passed, failed, warnings = [], {}, {}
    for key, node in document["nodes"].items():
        fails = [f for f in node["findings"] if f["severity"] == "fail"]
        warns = [f for f in node["findings"] if f["severity"] == "warn"]
        if warns:
            warnings[key] = len(warns)
        if node["pass"]:
            passed.append(key)
        else:
            failed[key] = [f"{f['check']}: {f['cause']} (fix: {f['fix']})" for f in fails] or [
                f"{c['name']}: {c['detail']}" for c in node["checks"]
                if c["required"] and not c["ok"]]
    return {"passed": passed, "failed": failed, "warnings": warnings,
            "differences": node_differences(document["nodes"])}


def _label(node: dict[str, Any]) -> str:
    gpus = len(node["gpu_uuids"])
    driver = f"driver {node['driver']}" if node.get("driver") else "no driver"
    return (f"{node['host']} (boot {str(node['boot_id'])[:8]}, {driver}, "
            f"{gpus or 'no'} GPU{'s' if gpus != 1 else ''}, ranks "
            f"{','.join(map(str, node['world_ranks']))})")


def render_summary(document: dict[str, Any]) -> list[str]:
    """Lines of the cluster summary."""
    summary = summarize_cluster(document)
    nodes = document["nodes"]
    lines = [f"cluster summary: {len(summary['passed'])} of {len(nodes)} node(s) pass"]
    for key, node in nodes.items():
        if key in summary["passed"]:
            warns = summary["warnings"].get(key)
            lines.append(f"  PASS  {_label(node)}"
                         + (f"  ({warns} warning{'s' if warns != 1 else ''})" if warns else ""))
        else:
            lines.append(f"  FAIL  {_label(node)}")
            for reason in summary["failed"][key]:
                lines.append(f"        {reason}")
    ranks = {facts["rank"]: {**(facts.get("gpu") or {}), "host": facts.get("host")}
             for node in nodes.values() for facts in node.get("ranks", [])}
    if any((facts.get("fabric") or {}).get("in_domain") for facts in ranks.values()):
        # NVL72-class systems: fabric handles reach every rank of a domain, any host.
        lines.append(f"  NVLink domains: {describe_fabric_domains(ranks)}")
    if summary["differences"]:
        lines.append("  nodes differ (mixed drivers break P2P / IPC on some nodes only; "
                      "mixed GPUs make bandwidths incomparable):")
        lines += [f"    {line}" for line in summary["differences"]]
    return lines
