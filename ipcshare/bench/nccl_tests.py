"""nccl-tests output (all_gather_perf, all_reduce_perf, reduce_scatter_perf, ...) read
back into rows, and the runs of one collective as a Markdown table for docs/BENCHMARKS.md.

    python -m ipcshare.bench.nccl_tests out/nccl-tests/*.log > nccl-tests.md

A run's label comes from its header (registration ``-R``, ``graph:`` launches), so the
logs may be named anything.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from collections.abc import Iterable

__all__ = ["NcclTestsRow", "NcclTestsRun", "parse_nccl_tests", "markdown_tables", "main"]

_VERSION = re.compile(r"^# nccl-tests version (\S+)")
_PROGRAM = re.compile(r"^# Collective test starting: (\S+)")
_PARAMS = re.compile(r"^# nThread (\d+) nGpus (\d+) .*? graph: (\d+)")
_RANK = re.compile(r"^#\s+Rank\s+\d+ ")
_REGISTER = re.compile(r"(?:^|\s)-R\s*(\d)")


@dataclasses.dataclass(frozen=True)
class NcclTestsRow:
    """One size: out-of-place and in-place time (µs), algbw and busbw (GB/s), #wrong
    (None where nccl-tests printed N/A)."""

    size: int
    count: int
    dtype: str
    redop: str
    time_us: float
    algbw: float
    busbw: float
    wrong: int | None
    inplace_time_us: float
    inplace_algbw: float
    inplace_busbw: float
    inplace_wrong: int | None


@dataclasses.dataclass
class NcclTestsRun:
    """One nccl-tests invocation."""

    program: str = ""
    version: str = ""
    ranks: int = 0
    graph_launches: int = 0
    register: int | None = None
    rows: list[NcclTestsRow] = dataclasses.field(default_factory=list)

    @property
    def label(self) -> str:
        """``R2 graph`` / ``R0 eager`` (``R?`` when the command line was not logged)."""
        register = "R?" if self.register is None else f"R{self.register}"
        return f"{register} {'graph' if self.graph_launches else 'eager'}"

    @property
    def wrong_total(self) -> int:
        return sum((row.wrong or 0) + (row.inplace_wrong or 0) for row in self.rows)


def _wrong(field: str) -> int | None:
    return None if field == "N/A" else int(float(field))


def _row(fields: list[str]) -> NcclTestsRow | None:
    """A data line: size count type redop root, then time algbw busbw #wrong twice."""
    if len(fields) < 13 or not fields[0].isdigit():
        return None
    try:
        return NcclTestsRow(
            size=int(fields[0]), count=int(fields[1]), dtype=fields[2], redop=fields[3],
            time_us=float(fields[5]), algbw=float(fields[6]), busbw=float(fields[7]),
            wrong=_wrong(fields[8]), inplace_time_us=float(fields[9]),
            inplace_algbw=float(fields[10]), inplace_busbw=float(fields[11]),
            inplace_wrong=_wrong(fields[12]))
    except ValueError:
        return None


def parse_nccl_tests(text: str) -> list[NcclTestsRun]:
    """Every run in ``text`` (one log may hold several, one after another). A line that
    logs the command (``+ ... -R 2 ...``, as tools/gpu_check.py writes) gives the next
    run's registration mode."""
    runs: list[NcclTestsRun] = []
    run: NcclTestsRun | None = None
    register: int | None = None
    for line in text.splitlines():
        if line.startswith("+ ") and "_perf" in line:
            found = _REGISTER.search(line)
            register = int(found.group(1)) if found else 0
            continue
        if match := _VERSION.match(line):
            run = NcclTestsRun(version=match.group(1), register=register)
            runs.append(run)
            continue
        if run is None:
            continue
        if match := _PROGRAM.match(line):
            run.program = match.group(1)
        elif match := _PARAMS.match(line):
            run.graph_launches = int(match.group(3))
        elif _RANK.match(line):
            run.ranks += 1
        elif not line.startswith("#") and (row := _row(line.split())) is not None:
            run.rows.append(row)
    return runs


def markdown_tables(runs: Iterable[NcclTestsRun]) -> str:
    """One table per program and rank count: a row per size, per run its out-of-place
    time and busbw (in-place time in brackets), and #wrong over all runs."""
    groups: dict[tuple[str, int], list[NcclTestsRun]] = {}
    for run in runs:
        groups.setdefault((run.program, run.ranks), []).append(run)
    blocks = []
    for (program, ranks), group in groups.items():
        group.sort(key=lambda r: r.label)
        version = group[0].version
        header = ["size"] + [f"{run.label} µs (in place)" for run in group] + [
            f"{run.label} busbw GB/s" for run in group]
        lines = [f"{program}, {ranks} ranks (nccl-tests {version}; µs out of place, "
                 f"in place in brackets; #wrong {sum(r.wrong_total for r in group)})", "",
                 "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        sizes = sorted({row.size for run in group for row in run.rows})
        by_size = [{row.size: row for row in run.rows} for run in group]
        for size in sizes:
            cells = [_size(size)]
            cells += [f"{rows[size].time_us:.1f} ({rows[size].inplace_time_us:.1f})"
                      if size in rows else "—" for rows in by_size]
            cells += [f"{rows[size].busbw:.1f}" if size in rows else "—" for rows in by_size]
            lines.append("| " + " | ".join(cells) + " |")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def _size(nbytes: int) -> str:
    for shift, unit in ((30, "GiB"), (20, "MiB"), (10, "KiB")):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


def main(argv: list[str] | None = None) -> int:
    """Print the Markdown tables of the nccl-tests logs named in ``argv``; exit status 1
    when a log holds no run or a run reports wrong elements."""
    paths = sys.argv[1:] if argv is None else argv
    runs: list[NcclTestsRun] = []
    for path in paths:
        with open(path) as log:
            found = parse_nccl_tests(log.read())
        if not found:
            print(f"{path}: no nccl-tests run in it", file=sys.stderr)
            return 1
        runs += found
    sys.stdout.write(markdown_tables(runs))
    return 1 if any(run.wrong_total for run in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
