"""The all-to-all sweeps of tools/gpu_check.py (phase alltoall) on one Markdown page: per
world size, splits and timing, each size's time and busbw of ours beside every baseline's
(NCCL through nccl4py with its path, NCCL through torch.distributed, PyTorch symmetric
memory), each with its speedup against ours from the same launch; then nccl-tests'
alltoall_perf, where its log is given.

    python tools/analysis/alltoall_summary.py OUT/results.jsonl [more.jsonl ...]
        [--nccl-tests OUT/nccl-tests/alltoall_perf.log] [--out alltoall.md]

Speedup is the baseline's time over ours at one size (above 1: ours faster), as the
console table and the bench summary give it. Out-of-place rows (the in-place rows of even
splits are in the JSON). A row with wrong elements shows ``wrong`` and no time; one with
measurement errors carries a ``!``. Beside NCCL's speedup, each row says whether it meets
the target for its size and splits (a dash where none is set). Exits 1 when
no all-to-all sweep is found.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from ipcshare.patterns.results import read_result_lines

# gpu-check's tag on the result documents of this phase.
TAG = "alltoall_case"
# The baselines' columns in this order; others after them, by name.
ORDER = ("nccl", "torch", "torch-symm")
_KiB, _MiB = 1 << 10, 1 << 20


@dataclasses.dataclass(frozen=True)
class Key:
    """One table: the world size, the splits, how it was timed, our algorithm."""

    world_size: int
    splits: str
    timing: str
    algo: str = "auto"
    registered: bool = False

    def title(self) -> str:
        algo = "" if self.algo == "auto" else f", --algo {self.algo}"
        registered = ", registered arrays (-R 1)" if self.registered else ""
        return (f"all-to-all, {self.world_size} ranks, {self.splits} splits, "
                f"{self.timing}{algo}{registered}")


@dataclasses.dataclass
class Launch:
    """One sweep: our rows and one baseline's, by size."""

    baseline: str
    label: str
    version: str
    ours: dict[int, dict]
    theirs: dict[int, dict]


def load(paths: list[Path]) -> dict[Key, list[Launch]]:
    """The all-to-all sweeps of ``paths`` (JSON lines), by table; other lines, and files
    that do not exist, skipped.

    Raises:
        SystemExit: a line that is not JSON, named by file and line.
    """
    tables: dict[Key, list[Launch]] = {}
    for path in paths:
        if not path.exists():   # no sweep wrote it (each failed before its document)
            continue
        try:
            documents = read_result_lines(path)
        except ValueError as error:
            raise SystemExit(str(error)) from None
        for document in documents:
            if TAG not in document or document.get("op") != "alltoall":
                continue
            key = Key(document["world_size"], document.get("splits", "even"),
                      document["timing"], document.get("algo", "auto"),
                      bool(document.get("registered", False)))
            baseline = document.get("baseline") or {}
            tables.setdefault(key, []).append(Launch(
                baseline=baseline.get("name", "none"),
                label=baseline.get("label", ""), version=baseline.get("version", ""),
                ours={row["size"]: row for row in document["rows"]},
                theirs={row["size"]: row for row in baseline.get("rows", ())}))
    return tables


def _rank(name: str) -> tuple[int, str]:
    return (ORDER.index(name) if name in ORDER else len(ORDER), name)


def _size(nbytes: int) -> str:
    for shift, unit in ((30, "GiB"), (20, "MiB"), (10, "KiB")):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


def _figure(row: dict | None) -> tuple[str, float | None]:
    """(the cell for a row: µs and busbw, ``wrong``, or a dash; its time when usable)."""
    if row is None:
        return "—", None
    if row.get("wrong"):
        return f"wrong ({row['wrong']})", None
    mark = " !" if row.get("errors") else ""
    path = f" {row['path']}" if row.get("path") else ""
    return f"{row['time_us']:.1f} / {row['busbw']:.1f}{path}{mark}", row["time_us"]


def target(key: Key, size: int, ours: dict | None, theirs: dict | None) -> str:
    """The target for this row against NCCL in the same launch, and whether the row
    meets it: uneven splits from 1 MiB, at least 1.2x NCCL's speed and at most 1.25 times
    the busiest link's bound (``bound_us``) + 10 µs; even splits in graphs up to 8 KiB at
    most 7 µs; even splits at 1-16 MiB at most 0.9x NCCL's time; from 64 MiB at least
    1.05x NCCL's busbw with plain arrays, 1.15x registered. A dash where it sets none, or
    where a side has no usable time."""
    _, our_time = _figure(ours)
    _, their_time = _figure(theirs)
    if our_time is None or their_time is None:
        return "—"
    speedup = their_time / our_time
    missed = []
    if key.splits != "even":
        if size < _MiB:
            return "—"
        if speedup < 1.2:
            missed.append(f"{speedup:.2f}x < 1.20x")
        bound = ours.get("bound_us")
        if bound is not None and our_time > 1.25 * bound + 10:
            missed.append(f"{our_time:.1f} > {1.25 * bound + 10:.1f} µs")
    elif size <= 8 * _KiB and key.timing == "graph":
        if our_time > 7:
            missed.append(f"{our_time:.1f} > 7 µs")
    elif _MiB <= size <= 16 * _MiB:
        if our_time > 0.9 * their_time:
            missed.append(f"{our_time / their_time:.2f}x NCCL's time > 0.90x")
    elif size >= 64 * _MiB:
        need = 1.15 if key.registered else 1.05
        if speedup < need:
            missed.append(f"{speedup:.2f}x < {need:.2f}x")
    else:
        return "—"
    return "missed: " + ", ".join(missed) if missed else "met"


def table(key: Key, launches: list[Launch]) -> str:
    """One Markdown table: per size, ours (from the first launch: NCCL's where there is
    one) and each baseline with its speedup against ours of its own launch."""
    launches = sorted(launches, key=lambda launch: _rank(launch.baseline))
    first = launches[0]
    timed = [launch for launch in launches if launch.baseline != "none"]
    header = ["size", f"ours µs / busbw GB/s ({first.baseline} launch)"]
    for launch in timed:
        header += [f"{launch.baseline} µs / busbw", f"{launch.baseline} speedup"]
        if launch.baseline == "nccl":
            header.append("target")
    lines = [f"### {key.title()}", ""]
    lines += [f"- {launch.baseline}: {launch.label}, {launch.version}" for launch in timed]
    lines += ["", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    sizes = sorted({size for launch in launches for size in launch.ours})
    for size in sizes:
        cells = [_size(size), _figure(first.ours.get(size))[0]]
        for launch in timed:
            theirs, their_time = _figure(launch.theirs.get(size))
            _ours, our_time = _figure(launch.ours.get(size))
            speedup = (f"{their_time / our_time:.2f}" if their_time and our_time else "—")
            cells += [theirs, speedup]
            if launch.baseline == "nccl":
                cells.append(target(key, size, launch.ours.get(size), launch.theirs.get(size)))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def page(tables: dict[Key, list[Launch]], nccl_tests: list[Path]) -> str:
    """The whole page: every table, then nccl-tests' alltoall_perf tables."""
    blocks = ["## ipcshare alltoall against its baselines",
              "µs / busbw GB/s out of place; speedup = baseline time / ours in the same launch "
              "(above 1: ours faster); `!` = a measurement error under the row in the log."]
    order = sorted(tables, key=lambda k: (k.world_size, ("even", "random", "skewed").index(
        k.splits) if k.splits in ("even", "random", "skewed") else 3, k.timing, k.algo))
    blocks += [table(key, tables[key]) for key in order]
    if nccl_tests:
        from ipcshare.bench.nccl_tests import markdown_tables, parse_nccl_tests

        runs = [run for path in nccl_tests for run in parse_nccl_tests(path.read_text())]
        if runs:
            blocks += ["## nccl-tests alltoall_perf (R2 runs with -x 2: symmetric windows on "
                       "a zero-CTA communicator, NCCL's copy-engine all-to-all)",
                       markdown_tables(runs).rstrip()]
    return "\n\n".join(blocks) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", type=Path, help="results.jsonl files")
    parser.add_argument("--nccl-tests", nargs="*", type=Path, default=[],
                        help="nccl-tests alltoall_perf logs")
    parser.add_argument("--out", type=Path, help="write the page here (and print it)")
    args = parser.parse_args(argv)
    tables = load(args.results)
    if not tables:
        print(f"no all-to-all sweeps ({TAG}) in {', '.join(map(str, args.results))}",
              file=sys.stderr)
        return 1
    text = page(tables, [path for path in args.nccl_tests if path.exists()])
    if args.out:
        args.out.write_text(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
