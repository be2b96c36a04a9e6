"""The nccl-tests style table: header, one line per size, and the footer."""

from __future__ import annotations

from .results import Measurement, Row, RunResult

__all__ = ["Table"]

_CELL = "{:>9} {:>7} {:>7} {:>6}"


def _cells(m: Measurement | None, checked: bool) -> str:
    if m is None:
        return _CELL.format("n/a", "", "", "")
    return _CELL.format(_fmt_time(m.time_us), f"{m.algbw:.2f}", f"{m.busbw:.2f}",
                        m.wrong if checked else "N/A")


def _spell_p95(m: Measurement) -> str:
    return "" if m.p95_us is None else _fmt_time(m.p95_us)


def _fmt_time(us: float) -> str:
    return f"{us:.2f}" if us < 1e4 else f"{us:.1f}" if us < 1e6 else f"{us:.0f}"


class Table:
    """Formats rows as they come, so long sweeps show progress line by line."""

    def __init__(self, modes: tuple[str, ...], datatype: str, baseline: str | None, *,
                 path_column: bool = False, host_column: bool = False,
                 p95_column: bool = False, checked: bool = True) -> None:
        """``baseline`` is the baseline's label (None: no baseline columns);
        ``path_column`` adds the path its figure came from; ``host_column`` the host's
        time per call of the first mode (eager timing); ``p95_column`` the 95th
        percentile of the first mode's samples and of the baseline's (latency timing,
        where ``time`` is the median); ``checked`` False (``-c 0``) shows ``N/A`` where
        wrong elements would be counted, as nccl-tests does."""
        self.modes = modes
        self.datatype = datatype
        self.baseline = baseline
        self.path_column = bool(baseline) and path_column
        self.host_column = host_column
        self.p95_column = p95_column
        self.checked = checked

    def header(self, title: str, rank_lines: list[str]) -> list[str]:
        lines = [f"# {title}", "#", *rank_lines, "#"]
        # host and p95 describe the first mode only, so they sit inside its block.
        extras = [name for name, shown in (("host", self.host_column), ("p95", self.p95_column))
                  if shown]
        groups = cols = units = ""
        for index, mode in enumerate(self.modes):
            # each label ends over its block's last column
            width = 32 + (9 * len(extras) if index == 0 else 0)
            groups += f"{mode or 'result':>{width}}  "
            cols += f"{'time':>9} {'algbw':>7} {'busbw':>7} {'#wrong':>6}  "
            units += f"{'(us)':>9} {'(GB/s)':>7} {'(GB/s)':>7} {'':>6}  "
            if index == 0:
                cols += "".join(f"{name:>7}  " for name in extras)
                units += "".join(f"{'(us)':>7}  " for _ in extras)
        extra = f"{self.baseline + ' baseline':>32}" if self.baseline else ""
        lines.append(f"#{'':>39}{groups}{extra}".rstrip())
        bcols = f"{'time':>9} {'busbw':>7} {'#wrong':>6} {'speedup':>7}" if self.baseline else ""
        bunits = f"{'(us)':>9} {'(GB/s)':>7} {'':>6} {'(x)':>7}" if self.baseline else ""
        if self.path_column:
            bcols += f" {'path':>9}"
            bunits += f" {'(fastest)':>9}"
        if self.p95_column and self.baseline:
            bcols += f" {'p95':>7}"
            bunits += f" {'(us)':>7}"
        lines.append(f"#{'size':>14} {'count':>13} {'type':>8}  {cols}{bcols}".rstrip())
        lines.append(f"#{'(B)':>14} {'(elements)':>13} {'':>8}  {units}{bunits}".rstrip())
        return lines

    def row(self, row: Row, baseline_row: Row | None) -> str:
        cells = ""
        for index, mode in enumerate(self.modes):
            cells += _cells(row.modes.get(mode), self.checked) + "  "
            if index == 0 and self.host_column:
                host = row.primary.host_us
                cells += f"{'' if host is None else f'{host:.2f}':>7}  "
            if index == 0 and self.p95_column:
                cells += f"{_spell_p95(row.primary):>7}  "
        text = f" {row.size:>14} {row.count:>13} {self.datatype:>8}  {cells}"
        if self.baseline:
            if baseline_row is None:
                text += f"{'skipped':>9}"
            else:
                b = baseline_row.primary
                speedup = (f"{b.time_us / row.primary.time_us:.2f}"
                           if b.usable and row.primary.usable else "n/a")
                wrong = b.wrong if self.checked else "N/A"
                if b.wrong:  # a wrong result has no time worth showing
                    text += f"{'wrong':>9} {'':>7} {wrong:>6} {speedup:>7}"
                else:
                    text += f"{_fmt_time(b.time_us):>9} {b.busbw:>7.2f} {wrong:>6} {speedup:>7}"
                if self.path_column:
                    text += f" {b.path or '':>9}"
                if self.p95_column:
                    text += f" {_spell_p95(b):>7}"
        return text.rstrip()

    def notes(self, row: Row, baseline_row: Row | None, baseline_name: str = "") -> list[str]:
        """The lines under a row: each measurement error (the figures above are not
        results), and the paths of a baseline whose results were wrong."""
        lines = [f"#  ^ measurement error, {mode}: {error}"
                 for mode, m in row.modes.items() for error in m.errors]
        if baseline_row is not None:
            for mode, m in baseline_row.modes.items():
                lines += [f"#  ^ measurement error, {baseline_name} baseline {mode}: {error}"
                          for error in m.errors]
                if m.wrong_paths:
                    wrong = ", ".join(f"{path} {count}" for path, count in m.wrong_paths.items())
                    lines.append(f"#  ^ {baseline_name} baseline {mode}: wrong elements on its "
                                 f"{wrong} path(s): not timed as its figure")
        return lines

    @staticmethod
    def verdict(wrong: int, checked: bool) -> str:
        """The footer's first line: the wrong elements and OK / FAILED, or N/A."""
        if not checked:
            return "# Out of bounds values : N/A (not checked: -c 0)"
        return f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}"

    @staticmethod
    def footer(result: RunResult) -> list[str]:
        lines = [Table.verdict(result.wrong_total, result.checked),
                 f"# Avg bus bandwidth    : {result.avg_busbw:.3f}"]
        if result.baseline is not None and result.baseline.rows:
            pairs = zip(result.rows, result.baseline.rows, strict=True)
            # Never over a wrong result or a figure that failed its checks.
            ratios = [b.primary.time_us / r.primary.time_us
                      for r, b in pairs if r.primary.usable and b.primary.usable]
            if ratios:
                lines.append(f"# Speedup over {result.baseline.name:<7}: "
                             f"min {min(ratios):.2f}x  max {max(ratios):.2f}x")
        if result.ceiling is not None:
            lines.append(f"# Ceiling              : {result.ceiling.gbps:.2f} GB/s busbw "
                         f"({result.ceiling.source})")
        errors = result.measurement_errors
        lines.append(f"# Measurement errors   : {len(errors)} "
                     f"{'OK' if not errors else 'FAILED (each under its row)'}")
        if result.clock_rechecks:
            lines.append(f"# Clock rechecks       : {result.clock_rechecks} (stretches timed "
                         "again after the clocks disagreed once on some rank)")
        lines.append("#")
        return lines
