"""The doctor's output: the on-screen table of one node's verdict, a progress line, and
the ``--json`` / ``--yaml`` files. Pure functions of the document, so the layout is
tested without MPI."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any, TextIO

from ..runtime.config import format_size, human_bytes
from ..runtime.errors import ConfigError
from .plan import GPU_MEMORY_SLACK, MAPPINGS_SLACK

__all__ = ["render_node", "render_header", "write_outputs", "Progress"]

_MARK = {True: "PASS", False: "FAIL"}
_GRID_LIMIT = 12  # more ranks per node than this: bandwidth as a list, not a grid


def _namespace_id(text: str | None) -> str:
    return text.split("[")[-1].rstrip("]") if text else "?"


def render_header(document: dict[str, Any]) -> list[str]:
    mode = "quick" if document["quick"] else "full"
    lines = [f"ipcshare doctor {document['ipcshare']} ({mode})  {document['mpi']}  world: "
             f"{document['world_size']} rank(s) on {document['node_count']} node(s)  "
             f"{document['elapsed_s']:.1f} s"]
    if document["node_count"] > 1:
        # The matrices below are per node: they are the pairs whose windows are mapped.
        lines.append("paths: pairs within a node as in each node's matrix (direct mapping); "
                     "pairs on different nodes: mpi")
    return lines


def _rank_lines(node: dict[str, Any]) -> list[str]:
    lines = [f"  {'rank':>4} {'pid':>8} {'ulimit -n':>13} {'fds':>5} {'/dev/shm free':>14} "
             f"{'seccomp':>7} {'ptrace':>6} {'pidfd self':>10} {'pid ns':>11} {'ipc ns':>11}  GPU"]
    for facts in node["ranks"]:
        soft, hard = facts.get("nofile_soft"), facts.get("nofile_hard")
        limit = f"{soft if soft is not None else 'inf'}/{hard if hard is not None else 'inf'}"
        shm = facts.get("dev_shm") or {}
        shm_text = f"{human_bytes(shm.get('free'))}/{human_bytes(shm.get('size'))}" if shm else "-"
        seccomp = (facts.get("seccomp") or {}).get("mode")
        scope = facts.get("ptrace_scope")
        gpu = facts.get("gpu") or {}
        if gpu.get("count"):
            bound = gpu.get("bound")
            uuid = (gpu.get("bound_uuid") or "?")[:12]
            gpu_text = (f"cuda:{bound} {uuid} (sees {gpu['count']}; "
                        f"CUDA_VISIBLE_DEVICES={facts.get('cuda_visible_devices')})")
        else:
            gpu_text = "none"
        pidfd = (facts.get("pidfd_getfd_self") or "?").split(":")[0]
        lines.append(
            f"  {facts['rank']:>4} {facts.get('pid', '?'):>8} {limit:>13} "
            f"{facts.get('open_fds', '?')!s:>5} {shm_text:>14} {seccomp!s:>7} "
            f"{('none' if scope is None else scope)!s:>6} {pidfd:>10} "
            f"{_namespace_id(facts.get('pid_namespace')):>11} "
            f"{_namespace_id(facts.get('ipc_namespace')):>11}  {gpu_text}")
    first = node["ranks"][0]
    iommu = first.get("iommu") or {}
    acs = first.get("pci_acs")
    acs_text = ("not probed (--quick)" if acs is None else acs.get("error") or
                f"{acs.get('devices_with_acs', 0)} device(s) with ACS, "
                f"{acs.get('redirecting', 0)} redirecting")
    units = iommu.get("units")
    lines.append(f"  kernel {first.get('kernel')}; IOMMU: "
                 f"{', '.join(units) if units else 'no units visible'}, "
                 f"{iommu.get('groups') if iommu.get('groups') is not None else '?'} groups, "
                 f"cmdline {' '.join(iommu.get('cmdline') or []) or '-'}; PCIe ACS: {acs_text}")
    return lines


def _placement_lines(node: dict[str, Any]) -> list[str]:
    lines = []
    for facts in node["ranks"]:
        placement = facts.get("affinity")
        if not placement:
            continue
        nodes = ",".join(map(str, placement.get("cpu_numa_nodes") or [])) or "?"
        text = (f"  placement: rank {facts['rank']} on CPUs {placement.get('cpus') or '?'} "
                f"(NUMA {nodes} of {placement.get('numa_nodes') or '?'})")
        if placement.get("gpu_pci"):
            gpu_node = placement.get("gpu_numa_node")
            near = placement.get("cpus_near_gpu")
            text += (f"; GPU {placement['gpu_pci']} on NUMA "
                     f"{'?' if gpu_node is None else gpu_node}"
                     + ("" if near is None else
                        f", {near} of {placement['cpu_count']} CPUs local to it"))
        lines.append(text)
    return lines


def _matrix_lines(node: dict[str, Any]) -> list[str]:
    lines = ["  capability matrix: every peer writes into every owner's window, the owner "
             "reads it back",
             f"  {'path':<16} {'pairs ok':>9} {'setup ms':>9}  result"]
    for path in node["matrix"]:
        cells = path["cells"]
        good = sum(cell["result"] == "ok" for cell in cells)
        setup = path.get("setup_ms")
        setup_text = f"{sum(setup.values()):.2f}" if setup else "-"
        if path["status"] == "ok" and not cells:
            result = "ok (no peer on this node: allocate and export only)"
        elif path["status"] == "ok":
            result = "ok" + (f" (descriptors by {path['exchange_used']})"
                             if path.get("exchange_used") not in (None, "mpi") else "")
            if path.get("fallback_reason"):
                result += f"; fell back: {path['fallback_reason']}"
        elif path.get("failure"):
            result = path["failure"]["message"]
        else:
            result = "failed"
        lines.append(f"  {path['path']:<16} {f'{good}/{len(cells)}':>9} {setup_text:>9}  "
                     f"{result}")
        for pair in path.get("pair_paths", []):
            via = f" through rank {pair['relay']}" if pair.get("relay") is not None else ""
            lines.append(f"  {'':<16} ranks {pair['ranks'][0]}<->{pair['ranks'][1]} "
                         f"({'/'.join(pair['devices'])}): {pair['path']}{via} (no peer access)")
        bad = [cell for cell in cells if cell["result"] != "ok"]
        if path.get("pairwise"):
            lines.append(f"  {'':<16} pair by pair: {good} of {len(cells)} ordered pairs work")
        if bad and (path.get("pairwise") or not path.get("failure")):
            for cell in bad[:8]:
                lines.append(f"  {'':<16}   owner {cell['owner']} <- peer {cell['peer']}: "
                             f"{cell.get('step')}: {cell.get('message')}")
            if len(bad) > 8:
                lines.append(f"  {'':<16}   ... and {len(bad) - 8} more")
    return lines


def _grid(rows: list[dict[str, Any]], ranks: list[int], value: Callable[[dict], str]
          ) -> list[str]:
    by_pair = {(row["writer"], row["owner"]): row for row in rows}
    corner = "writer\\owner"
    lines = ["    " + f"{corner:>12}" + "".join(f"{r:>9}" for r in ranks)]
    for writer in ranks:
        cells = []
        for owner in ranks:
            row = by_pair.get((writer, owner))
            cells.append("-" if row is None else value(row))
        lines.append("    " + f"{writer:>12}" + "".join(f"{c:>9}" for c in cells))
    return lines


def _bandwidth_value(row: dict[str, Any]) -> str:
    if "gbps" not in row:
        return "error"
    mark = "!" if row.get("intact") is False else ("*" if row.get("slow") else "")
    # Pairs without peer access are measured on their fallback: r = relay, h = host-staged.
    path = {"relay": "r", "host-staged": "h"}.get(row.get("path", "direct"), "")
    return f"{row['gbps']:.2f}{path}{mark}"


def _bandwidth_lines(node: dict[str, Any]) -> list[str]:
    lines = []
    for side, label in (("host", "host memcpy"), ("gpu", "GPU copy engine")):
        record = (node.get("bandwidth") or {}).get(side)
        if not record:
            continue
        if record.get("status") == "skipped":
            lines.append(f"  bandwidth ({label}): one rank on this node, no pairs")
            continue
        if record.get("failure"):
            lines.append(f"  bandwidth ({label}, {record['path']}): {record['failure']['message']}")
            continue
        rows = record["rows"]
        ranks = node["world_ranks"]
        lines.append(f"  bandwidth GB/s, writer -> owner ({label}, {record['path']}, "
                     f"{format_size(record['bytes'])} per write; * slow for its link, "
                     "! bytes lost, r relay, h host-staged: no peer access)")
        if len(ranks) <= _GRID_LIMIT:
            lines += _grid(rows, ranks, _bandwidth_value)
            lines.append(f"  latency us of {4}-byte writes, writer -> owner")
            lines += _grid(rows, ranks, lambda r: f"{r['latency_us']:.2f}"
                           if "latency_us" in r else "error")
        else:
            for row in rows:
                lines.append(f"    {row['writer']} -> {row['owner']}: "
                             f"{_bandwidth_value(row)} GB/s, {row.get('latency_us')} us")
        errors = [row for row in rows if "error" in row]
        for row in errors[:4]:
            lines.append(f"    {row['writer']} -> {row['owner']}: {row['error']}")
    return lines


def _limit_lines(node: dict[str, Any]) -> list[str]:
    lines = ["  limits"]
    for window in node["limits"]["windows"]:
        size = (f" of {human_bytes(window['window_bytes'])}" if window.get("window_bytes")
                else "")
        text = (f"    {window['path']}: {window['windows']} windows{size} held "
                f"({window['imports']} peer imports per process), stopped by "
                f"{window.get('stopped')}")
        if window.get("ms_per_window_slowest_rank") is not None:
            text += f"; {window['ms_per_window_slowest_rank']:.3f} ms per window (slowest rank)"
        if window.get("us_per_import") is not None:
            text += f", {window['us_per_import']:.0f} us per import"
        lines.append(text)
        if window.get("failure"):
            lines.append(f"      {window['failure']['message']}")
    exports: dict[str, list[str]] = {}
    for entry in node["limits"]["per_rank"]:
        for export in entry.get("exports", []):
            if "error" in export:
                text = f"error: {export['error']}"
            else:
                text = (f"{format_size(export['largest']) if export['largest'] else '0'}"
                        f" ({'cap' if export.get('stopped') == 'cap' else 'next failed'})")
            exports.setdefault(export["path"], []).append(text)
    for path, texts in exports.items():
        same = len(set(texts)) == 1
        lines.append(f"    largest export, {path}: "
                     + (f"{texts[0]} on every rank" if same else ", ".join(texts)))
    for entry in node["limits"]["per_rank"]:
        gpu = entry.get("gpu_memory")
        if not gpu:
            continue
        if gpu.get("error"):
            lines.append(f"    rank {entry['rank']} GPU facts: {gpu['error']}")
            continue
        va = format_size(gpu["va_largest"]) if gpu.get("va_largest") else "0"
        bound = "refused above" if gpu.get("va_refused_at") else "probe cap"
        granule = format_size(gpu["granularity_recommended"])
        lines.append(f"    rank {entry['rank']} GPU: granularity {granule} (min "
                     f"{format_size(gpu['granularity_min'])}), virtual address space: {va} "
                     f"reserved ({bound})")
    grown = [entry for entry in node["leaks"] if entry.get("grown")]
    if grown:
        worst = {key: max(entry["grown"].get(key, 0) for entry in grown)
                 for key in ("fds", "ipcshare_mappings", "mappings", "gpu_bytes")
                 if any(key in entry["grown"] for entry in grown)}
        # Other mappings may grow a little (the libraries' own), up to MAPPINGS_SLACK:
        # say so beside the figure, which would otherwise read as a leak next to PASS.
        allowed = {"mappings": f" (up to +{MAPPINGS_SLACK} allowed: other libraries' own)",
                   "gpu_bytes": f" (up to +{GPU_MEMORY_SLACK} allowed)"}
        lines.append("    leak check after every window closed (largest growth of any rank): "
                     + ", ".join(f"{key} {value:+d}{allowed.get(key, '') if value > 0 else ''}"
                                 for key, value in worst.items()))
    return lines


def _check_lines(node: dict[str, Any]) -> list[str]:
    lines = ["  checks"]
    for check in node["checks"]:
        need = "required" if check["required"] else "optional"
        lines.append(f"    {_MARK[check['ok']]}  {check['name']:<12} ({need}) {check['detail']}")
    if node["findings"]:
        lines.append("  findings")
    for finding in node["findings"]:
        severity = finding["severity"].upper()
        lines.append(f"    {severity:<4}  {finding['check']}: {finding['cause']}")
        lines.append(f"          fix: {finding['fix']}")
    return lines


def render_node(key: str, node: dict[str, Any]) -> list[str]:
    """The table of one node's verdict."""
    gpus = len(node["gpu_uuids"])
    head = (f"node {node['host']}  boot {str(node['boot_id'])[:8]}  driver {node['driver'] or '-'}"
            f"  CUDA {node['cuda'] or '-'}  GPUs: {gpus or 'none'}  ranks "
            f"{','.join(map(str, node['world_ranks']))}  [{_MARK[node['pass']]}]")
    return ([head] + _rank_lines(node) + _placement_lines(node) + [""] + _matrix_lines(node) + [""]
            + _bandwidth_lines(node) + _limit_lines(node) + [""] + _check_lines(node))


def write_outputs(document: dict[str, Any], *, json_path: str | None,
                  yaml_path: str | None) -> None:
    """Write the verdict document as JSON and/or YAML.

    Raises:
        ConfigError: a file could not be written.
    """
    for path, dump in ((json_path, _dump_json), (yaml_path, _dump_yaml)):
        if not path:
            continue
        try:
            with open(path, "w") as out:
                dump(document, out)
        except OSError as exc:
            raise ConfigError(f"cannot write {path!r}: {exc.strerror or exc}") from None


def _dump_json(document: dict[str, Any], out: TextIO) -> None:
    json.dump(document, out, indent=1, default=str)
    out.write("\n")


def _dump_yaml(document: dict[str, Any], out: TextIO) -> None:
    import yaml

    # Through JSON first: tuples and other non-YAML types become plain lists and strings.
    yaml.safe_dump(json.loads(json.dumps(document, default=str)), out, sort_keys=False,
                   width=100)


class Progress:
    """One progress line on stderr (rank 0 only): rewritten in place on a terminal,
    one line per step otherwise (logs, CI)."""

    def __init__(self, *, enabled: bool, stream: TextIO | None = None) -> None:
        self.enabled = enabled
        self._stream = stream or sys.stderr
        self._tty = enabled and self._stream.isatty()
        self._width = 0

    def step(self, text: str) -> None:
        if not self.enabled:
            return
        line = f"doctor: {text}"
        if self._tty:
            self._stream.write("\r" + line.ljust(self._width))
            self._width = len(line)
        else:
            self._stream.write(line + "\n")
        self._stream.flush()

    def done(self) -> None:
        if self.enabled and self._tty and self._width:
            self._stream.write("\r" + " " * self._width + "\r")
            self._stream.flush()
