"""What a reader gets after a bench: the closing summary on screen, and the Markdown
report (machine, method, ratio summary, plot, one table per case)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..patterns.results import Measurement, RunResult
from ..patterns.rotation import ROTATION_MAX_BLOCK_BYTES
from ..patterns.timing import LATENCY_LABEL
from ..runtime.config import format_size
from ..runtime.errors import ConfigError
from .bands import SIZE_BANDS, BandRatio, band_ratios
from .plot import ceilings
from .runner import BenchResult, CaseResult, timing_label
from .suite import OP_SIZES, OP_TITLES, REDUCTION_OPS

__all__ = ["summary_lines", "render_markdown", "write_markdown"]


def _ratio_cell(ratio: BandRatio | None) -> str:
    if ratio is None:
        return "-"
    if ratio.sizes == 1:
        return f"{ratio.ratio:.2f}"
    return f"{ratio.ratio:.2f} [{ratio.low:.2f}-{ratio.high:.2f}]"


def _ratio_table(result: BenchResult) -> list[tuple[CaseResult, str, dict[str, BandRatio]]]:
    """(case, baseline name, ratio per band) for every case and baseline."""
    table = []
    for record in result.cases:
        by_baseline: dict[str, dict[str, BandRatio]] = {}
        for ratio in band_ratios(record.result):
            by_baseline.setdefault(ratio.baseline, {})[ratio.band] = ratio
        for name, bands in by_baseline.items():
            table.append((record, name, bands))
    return table


def _skipped_notes(result: BenchResult) -> list[str]:
    """The cases that could not run, each with its reason; then the baselines skipped,
    counted by reason."""
    notes: dict[tuple[str, str], int] = {}
    for record in result.cases:
        for entry in record.skipped:
            notes[(entry.name, entry.reason)] = notes.get((entry.name, entry.reason), 0) + 1
    return ([f"case {record.case.label} skipped: {record.skip_reason}"
             for record in result.cases if record.skip_reason is not None]
            + [f"{name} baseline skipped in {count} case(s): {reason}"
               for (name, reason), count in notes.items()])


# Said wherever ratios are shown and a p2p case is among them.
_P2P_RATIOS = ("p2p cases: ours is IPC, the baselines are P2P direct (p2p-kernel, p2p-copy), "
               "so a speedup below 1 is what IPC costs against P2P direct")


def _has_p2p(result: BenchResult) -> bool:
    return any(record.case.p2p_op and record.skip_reason is None for record in result.cases)


def summary_lines(result: BenchResult) -> list[str]:
    """The closing summary: per case and baseline, the baseline's time over ours (the
    speedup) in each size band; average busbw; skipped baselines; totals."""
    lines = ["#", "# Summary: speedup = baseline time / our time per size band (geometric mean "
             "over the band's sizes, [min-max]); above 1 = ours is faster"]
    width = max((len(record.case.label) for record in result.cases), default=4)
    header = (f"#  {'case':<{width}}  {'avg busbw':>9}  {'baseline':<8}"
              + "".join(f"  {band:>19}" for band in SIZE_BANDS))
    lines.append(header)
    ratios = {(id(record), name): bands for record, name, bands in _ratio_table(result)}
    for record in result.cases:
        names = [b.name for b in record.result.baselines] or [
            "skipped" if record.skip_reason else "-"]
        for index, name in enumerate(names):
            bands = ratios.get((id(record), name), {})
            label = record.case.label if index == 0 else ""
            busbw = (f"{record.result.avg_busbw:>9.2f}" if record.skip_reason is None
                     else f"{'-':>9}") if index == 0 else " " * 9
            lines.append(f"#  {label:<{width}}  {busbw}  {name:<8}"
                         + "".join(f"  {_ratio_cell(bands.get(band)):>19}"
                                   for band in SIZE_BANDS))
    if _has_p2p(result):
        lines.append(f"# {_P2P_RATIOS}")
    for note in _skipped_notes(result):
        lines.append(f"# {note}")
    status = "OK" if result.wrong_total == 0 else "FAILED"
    errors = sum(len(record.result.measurement_errors) for record in result.cases
                 if record.skip_reason is None)
    lines.append(f"# {len(result.cases)} cases x {result.suite.repeat} repetition(s) in "
                 f"{result.elapsed_s:.1f} s; wrong elements: {result.wrong_total} {status}; "
                 f"measurement errors: {errors} {'OK' if errors == 0 else 'FAILED'}")
    return lines


def render_markdown(result: BenchResult, facts: dict[str, Any], *,
                    plot_link: str | None = None) -> str:
    """The report as Markdown text; ``plot_link`` is the figure's path relative to the
    report (no figure section without it)."""
    suite = result.suite
    out = [f"# ipcshare bench: {suite.name}", ""]
    out.append(f"{facts.get('date', '?')}, ipcshare {facts.get('ipcshare', '?')}, commit "
               f"`{facts.get('commit') or 'unknown (not a git checkout)'}`, "
               f"suite `{suite.source}`, ran in {result.elapsed_s:.0f} s.")
    if facts.get("command"):
        out += ["", f"```\n{facts['command']}\n```"]
    out += ["", "## Machine", "", "| | |", "|---|---|"]
    for hostname, host in (facts.get("hosts") or {}).items():
        cpus = f"{host.get('cpus')} CPUs ({host.get('usable_cpus')} usable by this job)"
        out.append(f"| host `{hostname}` | {cpus}, {host.get('ranks')} rank(s) |")
    out.append(f"| ranks | {facts.get('world_size')} on {facts.get('nodes')} node(s) |")
    out.append(f"| GPUs | {_devices(result)} |")
    out.append(f"| MPI library | {facts.get('mpi', '?')} |")
    out.append(f"| software | Python {facts.get('python', '?')}, numpy {facts.get('numpy', '?')},"
               f" {facts.get('machine', '?')}, Linux {facts.get('kernel', '?')} |")
    versions = {b.name: (b.label, b.version) for c in result.cases for b in c.result.baselines}
    for name, (label, version) in versions.items():
        out.append(f"| {name} baseline | {label or name}: {version} |")
    out += ["", "## Method", ""]
    out += _method(result)
    out += ["", "## Summary", "",
            "Speedup: the baseline's time over ours, per size band: geometric mean over the "
            "band's sizes with [min-max]; above 1 means ipcshare is faster (as in the tables' "
            "speedup column). Primary variant only "
            "(all-gather, all-reduce, reduce-scatter: out-of-place)."
            + (f" For {_P2P_RATIOS}." if _has_p2p(result) else ""), ""]
    out.append("| case | avg busbw (GB/s) | baseline | " + " | ".join(SIZE_BANDS) + " |")
    out.append("|---|---|---|" + "---|" * len(SIZE_BANDS))
    ratios = _ratio_table(result)
    for record, name, bands in ratios:
        out.append(f"| {record.case.label} | {record.result.avg_busbw:.2f} | {name} | "
                   + " | ".join(_ratio_cell(bands.get(band)) for band in SIZE_BANDS) + " |")
    if not ratios:
        out.append("| (no baseline was timed) | | | " + " | " * (len(SIZE_BANDS) - 1) + " |")
    notes = _skipped_notes(result)
    if notes:
        out.append("")
        out += [f"- {note}" for note in notes]
    bounds = ceilings(result)
    if bounds:
        out += ["", "Ceilings drawn on the busbw panel: "
                + "; ".join(bound.label for bound in bounds) + "."]
    if plot_link:
        # A PDF is no image a Markdown viewer shows inline: link to it instead.
        shown = "" if plot_link.lower().endswith(".pdf") else "!"
        out += ["", "## Plot", "",
                f"{shown}[busbw and time per operation against size]({plot_link})"]
    for op in _ops(result):
        out += ["", f"## Cases: {OP_TITLES[op]}", "", f"size = {OP_SIZES[op]}."]
        for record in result.cases:
            if record.case.pattern_op == op:
                out += ["", *_case_section(record)]
    status = "OK" if result.wrong_total == 0 else "FAILED"
    out += ["", f"Wrong elements over all cases and baselines: **{result.wrong_total}** "
            f"({status}).", ""]
    return "\n".join(out)


def _ops(result: BenchResult) -> list[str]:
    """The ops whose tables the result's cases fill (a p2p case's pattern), in order of
    first appearance."""
    return list(dict.fromkeys(record.case.pattern_op for record in result.cases))


def _devices(result: BenchResult) -> str:
    devices = sorted({d for c in result.cases for d in c.result.devices if d != "host"})
    return ", ".join(devices) if devices else "none used (host memory)"


def _method(result: BenchResult) -> list[str]:
    suite = result.suite
    modes = {c.case.timing for c in result.cases}
    lines = []
    if "nccl-tests" in modes:
        lines.append("- **nccl-tests** timing: barrier, `iters` back-to-back operations, one "
                     "host timer (GPU: synchronised), averaged over ranks.")
    if "latency" in modes:
        lines.append(f"- **{LATENCY_LABEL}**: `iters` samples of one operation each, started "
                     "together after a barrier and timed alone (host clock; CUDA events on "
                     "GPUs); each sample is the slowest rank's; the table gives the median "
                     "with p5 and p95. GPU all-gather, all-reduce and reduce-scatter samples "
                     "replay a CUDA graph of one operation (ours and NCCL's), so they measure "
                     "the operation, not the "
                     "Python launching it; ring samples are eager launches.")
    if "graph" in modes:
        lines.append("- **graph** timing: nccl-tests timing of `iters` operations captured in "
                     "one CUDA graph (ours and NCCL's), launched once to warm it, then once "
                     "timed.")
    if "after-kernel" in modes:
        lines.append("- **after-kernel** timing: nccl-tests timing with an empty kernel on the "
                     "stream before every operation (ours; NCCL's gets a one-element add), as "
                     "when a collective follows the compute that produced its input.")
    if suite.rotate_buffers > 1:
        lines.append(f"- Buffers rotate at sizes up to {format_size(ROTATION_MAX_BLOCK_BYTES)} "
                     f"per rank: {suite.rotate_buffers} disjoint buffer sets used in turn, for "
                     "ipcshare and the baselines alike, so no cache holds the last operation's "
                     "data.")
    if suite.repeat > 1:
        lines.append(f"- The suite ran {suite.repeat} times; figures are medians, "
                     "[min-max] the spread over repetitions.")
    if _has_p2p(result):
        lines.append("- **p2p** cases set P2P direct against IPC on the same sizes: rank 0 "
                     "runs `ipcshare p2p --no-ipc` over the ranks' GPUs in one process "
                     "(`p2p-kernel`: a kernel storing through peer pointers; `p2p-copy`: "
                     "`cuMemcpyPeerAsync`; host clock from idle GPUs to idle GPUs, so the "
                     "host's enqueueing counts) while the other ranks wait; then every rank "
                     "runs the pattern through IPC windows (the columns without a baseline's "
                     "name), nccl-tests timing, one buffer set for both (docs/P2P.md).")
    ops = _ops(result)
    if any(op in REDUCTION_OPS for op in ops):
        lines.append("- all-reduce and reduce-scatter run the library's `Communicator` through a "
                     "bound call (`comm.bind`), as a user's loop would; inputs are seeded small "
                     "integers whose reductions are exact in every datatype, so every algorithm "
                     "and summation order must give the same bits; outputs are poisoned before "
                     "each checked run. MPI reduces float32 and int32 only: 16-bit cases skip "
                     "it, saying so.")
    if "alltoall" in ops:
        lines.append("- all-to-all runs the library's `Communicator.all_to_all` (`even` splits) "
                     "or `all_to_all_v` (`random`, `skewed`: seeded split tables, zero-size "
                     "splits among them) through a bound call; every rank's received bytes "
                     "are checked against the seeded inputs of every sender.")
    formulas = {
        "allgather": "all-gather size = total gathered bytes, busbw = algbw x (n-1)/n",
        "allreduce": "all-reduce size = each rank's array, busbw = algbw x 2(n-1)/n",
        "reducescatter": "reduce-scatter size = each rank's input, busbw = algbw x (n-1)/n",
        "alltoall": "all-to-all size = each rank's input (all of it sent; `random` and "
                    "`skewed` splits are seeded, alike on every rank), busbw = algbw x "
                    "(n-1)/n",
        "ring": "ring follows sendrecv (size = bytes per rank and step, busbw = algbw)"}
    lines.append("- nccl-tests formulas: algbw = size / time; "
                 + "; ".join(formulas[op] for op in ops)
                 + ". GB = 1e9 bytes. Every size is verified bit-exact (`checks` runs) for "
                 "ipcshare and the baselines.")
    return lines


def _case_section(record: CaseResult) -> list[str]:
    case, run = record.case, record.result
    options = case.options
    if record.skip_reason is not None:
        return [f"### {case.label}", "", f"Skipped: {record.skip_reason}."]
    lines = [f"### {case.label}", "",
             f"backend `{run.backend}`, exchange `{run.exchange}`, {run.world_size} ranks, "
             f"algorithm {case.algorithm}, timing {timing_label(case.timing, case)}, "
             + (f"reduction {case.reduction}, " if case.reduction else "")
             + f"{options.datatype}, "
             f"iters {options.iters}, warmup {options.warmup}, checks {options.checks}, "
             f"avg busbw {run.avg_busbw:.2f} GB/s.", ""]
    if record.p2p is not None:
        lines += [_p2p_facts(record.p2p), ""]
    modes = list(run.rows[0].modes) if run.rows else []
    spread = _has(run, "p5_us")
    ranged = _has(run, "time_us_range")
    head = ["size (B)"]
    for mode in modes:
        name = "" if mode in ("", case.pattern_op) else f" {mode}"
        if case.p2p_op:
            name = f" ipc{name}"
        head += [f"time{name} (µs)", f"busbw{name} (GB/s)"]
        if spread:
            head.append(f"p5-p95{name} (µs)")
        if ranged:
            head.append(f"time{name} min-max (µs)")
    for baseline in run.baselines:
        head += [f"{baseline.name} time (µs)", f"{baseline.name} busbw (GB/s)",
                 f"speedup vs {baseline.name}"]
    head.append("#wrong")
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "---|" * len(head))
    for index, row in enumerate(run.rows):
        cells = [format_size(row.size)]
        for mode in modes:
            m = row.modes[mode]
            cells += [_us(m.time_us), f"{m.busbw:.2f}"]
            if spread:
                cells.append(f"{_us(m.p5_us)}-{_us(m.p95_us)}" if m.p5_us is not None else "")
            if ranged:
                cells.append(_range(m))
        wrong = row.wrong
        for baseline in run.baselines:
            theirs = baseline.rows[index]
            other = theirs.primary
            speedup = (f"{other.time_us / row.primary.time_us:.2f}"
                       if other.usable and row.primary.usable else "n/a")
            if other.wrong:  # a wrong result shows no time and is nobody's denominator
                cells += ["wrong", "", speedup]
            else:
                cells += [_us(other.time_us), f"{other.busbw:.2f}", speedup]
            wrong += theirs.wrong
        cells.append(str(wrong))
        lines.append("| " + " | ".join(cells) + " |")
    for entry in record.skipped:
        lines += ["", f"{entry.name} baseline skipped: {entry.reason}"]
    return lines


def _p2p_facts(p2p: dict[str, Any]) -> str:
    """What the direct half of a p2p case reported beside its rows, in one sentence."""
    pairs = p2p["peer_access"]
    enabled = [pair for pair in pairs if pair["enabled"]]
    setup = p2p.get("ipc_window_setup_ms")
    return (f"P2P direct: one process over {p2p['gpus']} GPUs (`{p2p['command']}`), peer "
            f"access enabled for {len(enabled)} of {len(pairs)} ordered pairs in "
            f"{sum(pair['setup_ms'] for pair in enabled):.2f} ms, buffers allocated in "
            f"{p2p['allocate_ms']:.2f} ms; IPC: window setup "
            + (f"{setup:.2f} ms (slowest rank)." if setup is not None else "not reported."))


def _has(run: RunResult, field: str) -> bool:
    return any(getattr(m, field) is not None for row in run.rows for m in row.modes.values())


def _us(value: float | None) -> str:
    if value is None:
        return ""
    return f"{value:.2f}" if value < 1e4 else f"{value:.0f}"


def _range(m: Measurement) -> str:
    if m.time_us_range is None:
        return ""
    return f"{_us(m.time_us_range[0])}-{_us(m.time_us_range[1])}"


def write_markdown(result: BenchResult, facts: dict[str, Any], path: str | Path, *,
                   plot_path: str | Path | None = None) -> None:
    """Write the report to ``path``, linking the figure at ``plot_path`` relatively.

    Raises:
        ConfigError: ``path`` cannot be written.
    """
    link = None
    if plot_path is not None:
        link = os.path.relpath(Path(plot_path).resolve(), Path(path).resolve().parent)
    try:
        Path(path).write_text(render_markdown(result, facts, plot_link=link))
    except OSError as exc:
        raise ConfigError(f"cannot write {str(path)!r}: {exc.strerror or exc}") from None
