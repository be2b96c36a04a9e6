"""The bench figure: busbw against size and time against size, a row of the two panels per
op (sizes mean different things per op), one line per case and per baseline, with the
ceilings that bound them. matplotlib is imported only to draw."""

from __future__ import annotations

import dataclasses
import math
import textwrap
from pathlib import Path
from typing import Any

from ..runtime.config import format_size
from ..runtime.errors import ConfigError
from .runner import BenchResult
from .suite import OP_SIZES, OP_TITLES

__all__ = ["Ceiling", "ceilings", "PLOT_FORMATS", "plot_format", "require_matplotlib", "write_plot",
           "NVLINK4_GBPS"]

# NVLink 4 (H100 / H200, 18 links): line rate per direction, GB/s.
NVLINK4_GBPS = 450.0
_GPU_BACKENDS = ("cuda-ipc", "cuda-vmm")
# A legend line is half the figure wide: the whole reason is in the report and the JSON.
_SKIP_REASON_CHARS = 60
# Line styles say who moved the bytes; colours say which case.
_STYLES = {"ours": "-", "mpi": "--", "nccl": ":", "torch": (0, (1, 3)),
           "torch-symm": (0, (5, 1)), "p2p-kernel": (0, (3, 1, 1, 1)),
           "p2p-copy": (0, (8, 2))}
_SOURCE_NAMES = {"ours": "ipcshare", "mpi": "MPI baseline", "nccl": "NCCL (nccl4py) baseline",
                 "torch": "NCCL through torch.distributed",
                 "torch-symm": "PyTorch symmetric memory",
                 "p2p-kernel": "P2P direct in one process, kernel through peer pointers",
                 "p2p-copy": "P2P direct in one process, cuMemcpyPeerAsync"}


@dataclasses.dataclass(frozen=True)
class Ceiling:
    """A horizontal line on the busbw panel."""

    label: str
    gbps: float


def ceilings(result: BenchResult) -> list[Ceiling]:
    """The bounds worth drawing: on GPUs the measured copy-engine peer copy (best busbw
    of a ring case) and NVLink 4's line rate; on host memory the best single-copy
    bandwidth measured (ring cases: one copy per step, nothing else); and the ceilings
    the runs were checked against, read off the machine."""
    lines = []
    ran = [c for c in result.cases if c.skip_reason is None]
    gpu = [c for c in ran if c.case.backend in _GPU_BACKENDS]
    host = [c for c in ran if c.case.backend == "host"]
    if gpu:
        best = _best_busbw([c for c in gpu if c.case.op == "ring"])
        if best:
            lines.append(Ceiling(f"copy-engine peer copy, measured (best ring busbw): "
                                 f"{best:.0f} GB/s", best))
        # The ceiling each run was checked against (read off the machine), once each.
        read = {c.result.ceiling for c in gpu if c.result.ceiling is not None}
        for bound in sorted(read, key=lambda bound: bound.gbps):
            lines.append(Ceiling(f"ceiling: {bound.gbps:.0f} GB/s ({bound.source})", bound.gbps))
        if not read:
            lines.append(Ceiling(f"NVLink 4 line rate: {NVLINK4_GBPS:.0f} GB/s per direction",
                                 NVLINK4_GBPS))
    if host:
        # Only the ring is one copy per step and nothing else: another case's best is no
        # bound (a run of one all-to-all would draw its own figure as its ceiling).
        best = _best_busbw([c for c in host if c.case.op == "ring"])
        if best:
            lines.append(Ceiling(f"single-copy on host memory, measured best: {best:.1f} GB/s",
                                 best))
        read = {c.result.ceiling for c in host if c.result.ceiling is not None}
        for bound in sorted(read, key=lambda bound: bound.gbps):
            lines.append(Ceiling(f"ceiling: {bound.gbps:.1f} GB/s ({bound.source})", bound.gbps))
    return lines


def _best_busbw(cases: list[Any]) -> float:
    return max((row.primary.busbw for c in cases for row in c.result.rows), default=0.0)


# The figure formats --plot writes, by the file name's ending: an image a Markdown
# report can show (png, svg) or a page to print (pdf).
PLOT_FORMATS = ("png", "svg", "pdf")


def plot_format(path: str | Path) -> str:
    """The format ``path`` asks for by its ending.

    Raises:
        ConfigError: the name ends in no format of :data:`PLOT_FORMATS` (a PNG written
            under another name would be a file nothing opens for what it claims).
    """
    name = Path(path).name
    suffix = name.rpartition(".")[2].lower() if "." in name else ""   # ".png" too
    if suffix not in PLOT_FORMATS:
        endings = ", ".join(f".{name}" for name in PLOT_FORMATS)
        raise ConfigError(f"--plot {str(path)!r}: name the figure with an ending that says "
                          f"its format: {endings} (e.g. --plot bench.png)")
    return suffix


def require_matplotlib() -> None:
    """Raises ConfigError, with the install hint, when matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ConfigError("--plot needs matplotlib, which is not installed: "
                          "pip install 'ipcshare[plot]'") from None


def write_plot(result: BenchResult, facts: dict[str, Any], path: str | Path) -> None:
    """Draw the two panels into ``path`` with matplotlib's Agg canvas, in the format its
    ending names (:func:`plot_format`).

    Raises:
        ConfigError: matplotlib is missing, the ending names no format, or ``path``
            cannot be written.
    """
    file_format = plot_format(path)
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    # A row of panels per op with a case that ran; skipped cases have a legend entry only.
    ops = list(dict.fromkeys(record.case.pattern_op for record in result.cases
                             if record.skip_reason is None)) or ["allgather"]
    figure = Figure(figsize=(14, 2.4 + 4.8 * len(ops)), dpi=110, layout="constrained")
    FigureCanvasAgg(figure)
    panels = dict(zip(ops, figure.subplots(len(ops), 2, squeeze=False), strict=True))
    colours = _colours(len(result.cases))
    handles: list[Any] = []
    for colour, record in zip(colours, result.cases, strict=True):
        run = record.result
        if record.skip_reason is not None:
            reason = textwrap.shorten(record.skip_reason, _SKIP_REASON_CHARS, placeholder=" ...")
            handles.append(Line2D([], [], color=colour, linestyle="none", marker="x",
                                  label=f"{_case_label(record.case, run)}: skipped ({reason})"))
            continue
        bandwidth, latency = panels[record.case.pattern_op]
        sources = [("ours", run.rows)] + [(b.name, b.rows) for b in run.baselines]
        for source, rows in sources:
            x = [row.size for row in rows]
            style = dict(color=colour, linestyle=_STYLES.get(source, "-."), linewidth=1.6,
                         marker="o" if source == "ours" else None, markersize=3.5)
            # A wrong result or a failed measurement is a gap in its line, not a point.
            shown = [row.primary.usable for row in rows]
            bandwidth.plot(x, [row.primary.busbw if ok else math.nan
                               for row, ok in zip(rows, shown, strict=True)], **style)
            latency.plot(x, [row.primary.time_us if ok else math.nan
                             for row, ok in zip(rows, shown, strict=True)], **style)
            if source == "ours":
                _shade_spread(bandwidth, latency, rows, colour)
        handles.append(Line2D([], [], color=colour, marker="o", markersize=4,
                              label=_case_label(record.case, run)))
    for index, ceiling in enumerate(ceilings(result)):
        colour = ("0.25", "0.55", "0.4")[index % 3]
        for bandwidth, _latency in panels.values():
            bandwidth.axhline(ceiling.gbps, color=colour, linestyle=(0, (6, 2, 1, 2)),
                              linewidth=1.2)
            bandwidth.annotate(ceiling.label, xy=(0.01, ceiling.gbps),
                               xycoords=("axes fraction", "data"), xytext=(0, 2),
                               textcoords="offset points", va="bottom", fontsize=8,
                               color=colour)
        handles.append(Line2D([], [], color=colour, linestyle=(0, (6, 2, 1, 2)),
                              label=ceiling.label))
    used = {"ours"} | {b.name for c in result.cases for b in c.result.baselines}
    for source in _STYLES:
        if source in used:
            handles.append(Line2D([], [], color="black", linestyle=_STYLES[source],
                                  label=f"line style: {_SOURCE_NAMES[source]}"))

    repeated = result.suite.repeat > 1
    sampled = any(c.case.timing == "latency" for c in result.cases)
    shading = [text for text, shown in (("p5-p95 of latency samples", sampled),
                                        ("min-max over repetitions", repeated)) if shown]
    for op, (bandwidth, latency) in panels.items():
        sizes = sorted({row.size for record in result.cases if record.case.pattern_op == op
                        for row in record.result.rows})
        ticks = _size_ticks(sizes)
        for axes in (bandwidth, latency):
            axes.set_xscale("log", base=2)
            axes.xaxis.set_major_locator(FixedLocator(ticks))
            axes.xaxis.set_minor_locator(NullLocator())
            axes.xaxis.set_major_formatter(FuncFormatter(lambda value, _pos: _size_text(value)))
            axes.set_xlabel(f"size (bytes: {OP_SIZES[op]})")
            axes.grid(True, which="major", alpha=0.3)
        bandwidth.set_ylabel("busbw (GB/s)")
        bandwidth.set_title(f"{OP_TITLES[op]}: bus bandwidth (higher is better)"
                            + ("\nshaded: min-max over repetitions" if repeated else ""))
        bandwidth.set_ylim(bottom=0)
        latency.set_yscale("log")
        latency.set_ylabel("time per operation (µs)")
        latency.set_title(f"{OP_TITLES[op]}: time per operation (lower is better)"
                          + (f"\nshaded: {', or '.join(shading)}" if shading else ""))
        latency.grid(True, which="minor", axis="y", alpha=0.12)
    figure.suptitle(_title(result, facts), fontsize=12)
    figure.legend(handles=handles, loc="outside lower center", ncols=2, fontsize=8.5,
                  frameon=False)
    try:
        figure.savefig(path, format=file_format)
    except OSError as exc:
        raise ConfigError(f"cannot write {str(path)!r}: {exc.strerror or exc}") from None


def _shade_spread(bandwidth: Any, latency: Any, rows: list[Any], colour: Any) -> None:
    """p5-p95 of latency samples and min-max over repetitions, lightly shaded."""
    x = [row.size for row in rows]
    primary = [row.primary for row in rows]
    if all(m.p5_us is not None and m.p95_us is not None for m in primary):
        latency.fill_between(x, [m.p5_us for m in primary], [m.p95_us for m in primary],
                             color=colour, alpha=0.15, linewidth=0)
    elif all(m.time_us_range is not None for m in primary):
        latency.fill_between(x, [m.time_us_range[0] for m in primary],
                             [m.time_us_range[1] for m in primary], color=colour, alpha=0.15,
                             linewidth=0)
    if all(m.busbw_range is not None for m in primary):
        bandwidth.fill_between(x, [m.busbw_range[0] for m in primary],
                               [m.busbw_range[1] for m in primary], color=colour, alpha=0.15,
                               linewidth=0)


def _case_label(case: Any, run: Any) -> str:
    mode = next(iter(run.rows[0].modes)) if run.rows else ""
    variant = f" {mode}" if mode and mode != case.pattern_op else ""
    names = ", ".join(b.name for b in run.baselines)
    against = f" (vs {names})" if names else ""
    return (f"{case.what}{variant} · {case.backend} {case.algorithm} · "
            f"{case.timing}{against}")


def _colours(count: int) -> list[Any]:
    from matplotlib import colormaps

    palette = colormaps["tab10" if count <= 10 else "tab20"]
    return [palette(index % palette.N) for index in range(count)]


def _size_ticks(sizes: list[int]) -> list[float]:
    """Powers of two spanning ``sizes``, thinned to at most 12 labels."""
    if not sizes:
        return [1.0]
    low = math.floor(math.log2(sizes[0]))
    high = math.ceil(math.log2(sizes[-1]))
    step = max(1, math.ceil((high - low + 1) / 12))
    return [float(2 ** exponent) for exponent in range(low, high + 1, step)]


def _size_text(value: float) -> str:
    nbytes = int(round(value))
    return format_size(nbytes) if nbytes >= 1 else f"{value:g}"


def _title(result: BenchResult, facts: dict[str, Any]) -> str:
    hosts = facts.get("hosts") or {}
    where = ", ".join(hosts) if hosts else "?"
    world = result.cases[0].result.world_size if result.cases else facts.get("world_size", "?")
    # A command's run (cli/pattern_plot.py) is named by the command itself.
    name = result.suite.name
    title = name if name.startswith("ipcshare ") else f"ipcshare bench: {name}"
    parts = [title, f"{world} ranks on {where}"]
    if facts.get("date"):
        parts.append(str(facts["date"]))
    if facts.get("commit"):
        parts.append(f"commit {facts['commit']}")
    return "  ·  ".join(parts)
