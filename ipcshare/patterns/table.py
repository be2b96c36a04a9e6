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
        groups = "".join(f"{mode or 'result':>34} " for mode in self.modes)
        if self.host_column:
            groups += " " * 9
        if self.p95_column:
            groups += " " * 9
        extra = f"{self.baseline + ' baseline':>33}" if self.baseline else ""
        lines.append(f"#{'':>38}{groups}{extra}".rstrip())
        cols = "".join(f"{'time':>9} {'algbw':>7} {'busbw':>7} {'#wrong':>6}  " for _ in self.modes)
        units = "".join(f"{'(us)':>9} {'(GB/s)':>7} {'(GB/s)':>7} {'':>6}  " for _ in self.modes)
        bcols = f"{'time':>9} {'busbw':>7} {'#wrong':>6} {'speedup':>7}" if self.baseline else ""
        bunits = f"{'(us)':>9} {'(GB/s)':>7} {'':>6} {'(x)':>7}" if self.baseline else ""
        if self.path_column:
            bcols += f" {'path':>9}"
            bunits += f" {'(fastest)':>9}"
        if self.host_column:
            cols += f"{'host':>7}  "
            units += f"{'(us)':>7}  "
        if self.p95_column:
            cols += f"{'p95':>7}  "
            units += f"{'(us)':>7}  "
            bcols += f" {'p95':>7}" if self.baseline else ""
            bunits += f" {'(us)':>7}" if self.baseline else ""
        lines.append(f"#{'size':>14} {'count':>13} {'type':>8}  {cols}{bcols}".rstrip())
        lines.append(f"#{'(B)':>14} {'(elements)':>13} {'':>8}  {units}{bunits}".rstrip())
        return lines

    def row(self, row: Row, baseline_row: Row | None) -> str:
        cells = "".join(_cells(row.modes.get(mode), self.checked) + "  " for mode in self.modes)
        if self.host_column:
            host = row.primary.host_us
            cells += f"{'' if host is None else f'{host:.2f}':>7}  "
        if self.p95_column:
            cells += f"{_spell_p95(row.primary):>7}  "
        text = f" {row.size:>14} {row.count:>13} {self.datatype:>8}  {cells}"
        if self.baseline:
            if baseline_row is None:
                text += f"{'skipped':>9}"
            else:
                b = baseline_row.primary
                speedup = b.time_us / row.primary.time_us if row.primary.time_us > 0 else 0.0
                wrong = b.wrong if self.checked else "N/A"
                text += f"{_fmt_time(b.time_us):>9} {b.busbw:>7.2f} {wrong:>6} {speedup:>7.2f}"
                if self.path_column:
                    text += f" {b.path or '':>9}"
                if self.p95_column:
                    text += f" {_spell_p95(b):>7}"
        return text.rstrip()

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
            ratios = [b.primary.time_us / r.primary.time_us
                      for r, b in pairs if r.primary.time_us > 0]
            if ratios:
                lines.append(f"# Speedup over {result.baseline.name:<7}: "
                             f"min {min(ratios):.2f}x  max {max(ratios):.2f}x")
        lines.append("#")
        return lines
