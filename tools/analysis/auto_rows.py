"""Propose ``auto``'s rows (ipcshare/collectives/choice.py) from the collective sweeps
that tools/gpu_check.py appended to results.jsonl, and check them against NCCL.

    python tools/analysis/auto_rows.py OUT/results.jsonl [more.jsonl ...] [--target 1.2]
        [--tolerance 0.03] [--out rows.md]

For every (collective, world size, eager or graph, copied or registered arrays) it prints
the time of each algorithm at each size, the fastest, NCCL's best path from the same
launches (nccl4py, plain or symmetric windows, as the sweeps' baselines report it) and
NCCL's time over ours, which at one size is our busbw over NCCL's. Sizes where that
ratio falls short of ``--target`` are flagged, so a table shows at once whether issue
17's bandwidth target (1.2x NCCL's busbw at 1-64 MiB) is met.

The proposed row is the fastest algorithm per size, with a switch only where the new
winner beats the algorithm already chosen by more than ``--tolerance`` (so noise between
near-equal kernels does not make the table flap). ``auto`` itself is shown, not chosen:
its column says what the current table runs. A row is what to paste into
``CUDA_CHOICES`` with the run's machine kind, date and commit in the comment above it.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from pathlib import Path

from ipcshare.patterns.results import read_result_lines

# The CLI names of the collectives and the names their tables use in choice.py.
OPS = {"allreduce": "all_reduce", "reducescatter": "reduce_scatter", "allgather": "all_gather"}
# A limit in choice.py is written in KiB where it is a whole number of them.
_KIB = 1 << 10


@dataclasses.dataclass(frozen=True)
class Key:
    """One table: the collective, the world size, how it was timed, where arrays lay."""

    op: str
    world_size: int
    timing: str
    registered: bool

    def title(self) -> str:
        arrays = "registered arrays (-R 1)" if self.registered else "copied arrays"
        return f"{self.op}, {self.world_size} ranks, {self.timing}, {arrays}"


@dataclasses.dataclass
class Table:
    """Per size: the best time of each algorithm (µs), and NCCL's best with its label and
    its path (``plain`` or ``symmetric`` buffers, where the baseline says)."""

    ours: dict[int, dict[str, float]] = dataclasses.field(default_factory=dict)
    nccl: dict[int, tuple[float, str, str]] = dataclasses.field(default_factory=dict)

    def algorithms(self) -> list[str]:
        names = sorted({algo for times in self.ours.values() for algo in times})
        return [name for name in names if name != "auto"] + (["auto"] if "auto" in names else [])


def case_algorithm(case: str) -> tuple[str, str]:
    """``("allreduce", "one-shot")`` from gpu-check's case tag ``allreduce-one-shot --graph``."""
    head = case.split()[0]
    op, _, algo = head.partition("-")
    if op not in OPS or not algo:
        raise ValueError(f"not a collective sweep's case tag: {case!r}")
    return op, algo


def load(paths: list[Path]) -> dict[Key, Table]:
    """The collective sweeps of ``paths`` (JSON lines), by table; other lines are skipped."""
    tables: dict[Key, Table] = {}
    for path in paths:
        try:
            documents = read_result_lines(path)
        except ValueError as error:
            raise SystemExit(str(error)) from None
        for document in documents:
            case = document.get("collective_case")
            if (case is None or document.get("wrong_total", 0)
                    or document.get("checked") is False):
                continue   # not a collective sweep, or one wrong or unchecked: never chosen
            if document.get("statistic", "mean") != "mean":
                continue   # latency samples (a launch and a sync each): not back-to-back
            op, algo = case_algorithm(case)
            key = Key(op, document["world_size"], document["timing"],
                      bool(document.get("registered", False)))
            table = tables.setdefault(key, Table())
            for row in document["rows"]:
                times = table.ours.setdefault(row["size"], {})
                times[algo] = min(times.get(algo, math.inf), row["time_us"])
            baseline = document.get("baseline")
            if baseline and baseline.get("name") == "nccl":
                label = baseline.get("label") or baseline["name"]
                for row in baseline["rows"]:
                    found = table.nccl.get(row["size"])
                    if found is None or row["time_us"] < found[0]:
                        table.nccl[row["size"]] = (row["time_us"], label, row.get("path", ""))
    return tables


def winners(table: Table, tolerance: float) -> dict[int, str]:
    """The algorithm chosen at each size: the fastest, except that the one chosen at the
    size below stays while it is within ``tolerance`` of the fastest."""
    chosen: dict[int, str] = {}
    previous = None
    for size in sorted(table.ours):
        times = {algo: t for algo, t in table.ours[size].items() if algo != "auto"}
        if not times:
            continue
        fastest = min(times, key=times.__getitem__)
        if previous in times and times[previous] <= times[fastest] * (1 + tolerance):
            fastest = previous
        chosen[size] = previous = fastest
    return chosen


def choice_literal(chosen: dict[int, str]) -> str:
    """``Choice((512 * _KiB,), ("ll", "one-shot"))``: each algorithm up to the largest
    measured size it won, the last one for everything larger."""
    limits: list[int] = []
    algos: list[str] = []
    for size, algo in sorted(chosen.items()):
        if algos and algos[-1] == algo:
            limits[-1] = size
        else:
            algos.append(algo)
            limits.append(size)
    limits = limits[:-1]

    def written(limit: int) -> str:
        return f"{limit // _KIB} * _KiB" if limit % _KIB == 0 else str(limit)
    inner = ", ".join(written(limit) for limit in limits)
    return (f"Choice(({inner}{',' if len(limits) == 1 else ''}), "
            f"({', '.join(repr(a) for a in algos)}{',' if len(algos) == 1 else ''}))")


def size_text(size: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift and size % (1 << shift) == 0:
            return f"{size >> shift} {unit}"
    return f"{size} B"


def report(tables: dict[Key, Table], target: float, tolerance: float) -> list[str]:
    """Markdown: a table per key, its proposed row and the sizes short of ``target``."""
    lines: list[str] = []
    for key in sorted(tables, key=lambda k: (k.op, k.world_size, k.timing, k.registered)):
        table = tables[key]
        algos = table.algorithms()
        chosen = winners(table, tolerance)
        lines += [f"### {key.title()}", ""]
        header = ["size", *(f"{a} µs" for a in algos), "chosen", "NCCL µs", "NCCL / ours"]
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        short = []
        for size in sorted(table.ours):
            times = table.ours[size]
            cells = [size_text(size)]
            cells += [f"{times[a]:.1f}" if a in times else "" for a in algos]
            pick = chosen.get(size, "")
            cells.append(pick)
            nccl = table.nccl.get(size)
            if nccl is not None and pick:
                ratio = nccl[0] / times[pick]
                path = f" ({nccl[2]})" if nccl[2] else ""
                cells += [f"{nccl[0]:.1f}{path}", f"{ratio:.2f}" + (" *" if ratio < target else "")]
                if ratio < target:
                    short.append(size_text(size))
            else:
                cells += ["", ""]
            lines.append("| " + " | ".join(cells) + " |")
        labels = sorted({label for _, label, _ in table.nccl.values()})
        lines.append("")
        if labels:
            lines.append(f"NCCL: {'; '.join(labels)}.")
        lines.append(f"Proposed row ({OPS[key.op]}, {key.world_size} ranks): "
                     f"`{choice_literal(chosen)}`")
        if short:
            lines.append(f"Short of {target:g}x NCCL (marked *): {', '.join(short)}.")
        lines.append("")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", type=Path, help="results.jsonl files")
    parser.add_argument("--target", type=float, default=1.2,
                        help="NCCL's time over ours to reach (default 1.2)")
    parser.add_argument("--tolerance", type=float, default=0.03,
                        help="how much faster a new winner must be to switch (default 0.03)")
    parser.add_argument("--out", type=Path, help="also write the Markdown here")
    args = parser.parse_args(argv)
    missing = [str(p) for p in args.results if not p.is_file()]
    if missing:
        print(f"auto_rows: no such file: {', '.join(missing)}", file=sys.stderr)
        return 2
    tables = load(args.results)
    if not tables:
        print("auto_rows: no collective sweeps (lines with collective_case) in the input",
              file=sys.stderr)
        return 1
    text = "\n".join(report(tables, args.target, args.tolerance))
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
