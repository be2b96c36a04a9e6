"""The Markdown of ``ipcshare vs-torch``: per op and size both sides' graph and eager
times with their ratios and busbw, the errors and refusals under each op's table, then
the host time per call."""

from __future__ import annotations

from typing import Any

from ..runtime.config import format_size
from .plan import CALLS, OPS

__all__ = ["render_markdown", "row_line", "BOUND_TARGET_US"]

BOUND_TARGET_US = 2.0


def _number(value: float | None, digits: int = 2) -> str:
    if value is None:
        return "n/a"
    return f"{value:,.1f}" if value >= 100 else f"{value:.{digits}f}"


def _cell(figures: dict[str, Any], key: str) -> str:
    if figures.get("refused"):
        return "refused"
    if figures.get("wrong"):
        return "wrong"
    return _number(figures.get(key))


def _ratio(row: dict[str, Any], mode: str) -> str:
    value = row["ratios"][mode]
    if value is not None:
        return f"{value:.2f}x"
    return "failed" if not row["ok"] else "—"


def render_markdown(results: dict[str, Any]) -> str:
    """The Markdown tables of a run's ``results`` (rows judged by ``judge_row``): per op
    and size the graph and eager times of both sides with their ratios and busbw, the
    errors and refusals under each op's table, then the host time per call."""
    facts = results.get("facts", {})
    options = results.get("options", {})
    calls, replays = options.get("calls", "?"), options.get("replays", "?")
    lines = ["## What a PyTorch user sees: ipcshare against NCCL through torch.distributed",
             "",
             f"{facts.get('world_size', '?')} ranks, {facts.get('gpu_count', '?')} x "
             f"{facts.get('gpu_name', '?')}, NCCL {facts.get('nccl', '?')} through torch "
             f"{facts.get('torch', '?')}, ipcshare {facts.get('commit') or '?'}, "
             f"{facts.get('date', '?')}; {options.get('dtype', '?')} tensors, sizes as "
             "nccl-tests counts them.",
             f"Graph: one torch CUDA graph of {calls} calls replayed {replays} times; eager: "
             f"{calls} back-to-back calls; µs per call, the slowest rank's; ratio = ours / "
             "torch (below 1: ours faster); busbw of the graph figures, GB/s.", ""]
    rows = results["rows"]
    for op in [op for op in OPS if any(row["op"] == op for row in rows)]:
        ours_call, torch_call = CALLS[op]
        lines += [f"### {op}: `{ours_call}` vs `{torch_call}`", "",
                  "| size | ours graph | torch graph | ratio | ours eager | torch eager | ratio "
                  "| ours busbw | torch busbw | checks |", "|---" * 10 + "|"]
        notes = []
        for row in [row for row in rows if row["op"] == op]:
            ours, theirs = row["ours"], row["torch"]
            verdict = "ok" if row["ok"] else "FAILED"
            lines.append("| " + " | ".join([
                format_size(row["size"]), _cell(ours, "graph_us"), _cell(theirs, "graph_us"),
                _ratio(row, "graph"), _cell(ours, "eager_us"), _cell(theirs, "eager_us"),
                _ratio(row, "eager"), _cell(ours, "graph_busbw"), _cell(theirs, "graph_busbw"),
                verdict]) + " |")
            size = format_size(row["size"])
            if ours.get("refused"):
                notes.append(f"- {size}: ours refused: {ours['refused']}")
            notes += [f"- {size}: {error}" for error in row["errors"]]
        lines += [""] + notes + ([""] if notes else [])
    lines += [f"### Host time per call (µs, Python, the slowest rank's; "
              f"{options.get('host_calls', '?')} calls enqueued without waiting)", "",
              "| op | size | ours bound | ours plain | torch |", "|---" * 5 + "|"]
    bound = []
    for row in rows:
        ours = row["ours"]
        lines.append(f"| {row['op']} | {format_size(row['size'])} | "
                     f"{_cell(ours, 'host_bound_us')} | {_cell(ours, 'host_plain_us')} | "
                     f"{_cell(row['torch'], 'host_us')} |")
        if not ours.get("refused") and ours.get("host_bound_us") is not None:
            bound.append(ours["host_bound_us"])
    lines.append("")
    if bound:
        met = sum(value <= BOUND_TARGET_US for value in bound)
        lines.append(f"Bound call at most {BOUND_TARGET_US:g} µs of host time: {met} of "
                     f"{len(bound)} rows (largest {max(bound):.2f} µs).")
    failed = sum(not row["ok"] for row in rows)
    lines.append(f"Rows failing a check: {failed} of {len(rows)}"
                 + (" (FAILED: their figures are not results)" if failed else "") + ".")
    return "\n".join(lines) + "\n"


def row_line(row: dict[str, Any]) -> str:
    """One judged row in a line, as the progress shows it: both sides' graph and eager
    times, and FAILED with the count of its errors."""
    ours, theirs = row["ours"], row["torch"]
    return (f"{row['op']} {format_size(row['size'])}: graph "
            f"{_cell(ours, 'graph_us')} vs {_cell(theirs, 'graph_us')} us, eager "
            f"{_cell(ours, 'eager_us')} vs {_cell(theirs, 'eager_us')} us"
            + ("" if row["ok"] else f", FAILED ({len(row['errors'])} errors)"))
