"""Two trees of ipcshare side by side from one launch of sweeps (tools/gpu_check.py ab).

A kernel change is judged against the code it replaces on the same machine, in the same
lease and beside NCCL's figures of each launch, since a figure from another day or node
varies by more than most changes gain (docs/BENCHMARKS.md). The ab phase runs each case
once in the base tree (``AB_TREE``) and once in this one, one after the other, and tags
each result document with ``ab_case`` (the case as given) and ``ab_side`` (``base`` or
``this``). This tool reads them and writes, per case, for each size: base's time, NCCL's
in base's launch, this tree's time, NCCL's in this launch, and this over base (below 1:
this tree is faster).

    python tools/analysis/ab_table.py OUT/results.jsonl [--markdown FILE]

A row of either side with wrong elements or a measurement error shows no figure and no
ratio, and counts as a failure; so does a case whose two sides imported the same package
(``ab_package``: ``python -m`` run from the wrong folder measures one tree twice). Exit
status 0 when every row of every case has both figures, 1 otherwise, 2 on unreadable input
or no ab results at all.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ipcshare.patterns.results import read_result_lines

SIDES = ("base", "this")


def _time(row: dict[str, Any]) -> float | None:
    """A row's time in µs, or None where it is not a result (wrong, or a measurement error)."""
    if row.get("wrong") or row.get("errors") or row.get("time_us") is None:
        return None
    return float(row["time_us"])


def _baseline_times(document: dict[str, Any]) -> dict[int, float | None]:
    baseline = document.get("baseline") or {}
    return {row["size"]: _time(row) for row in baseline.get("rows", [])}


def collect(documents: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """``{case: {side: document}}`` in the order the cases first appear; a side that ran
    twice keeps its later document (a retried step)."""
    cases: dict[str, dict[str, dict[str, Any]]] = {}
    for document in documents:
        case, side = document.get("ab_case"), document.get("ab_side")
        if case is None or side not in SIDES:
            continue
        cases.setdefault(case, {})[side] = document
    return cases


def _figure(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def table(case: str, sides: dict[str, dict[str, Any]]) -> tuple[list[str], int]:
    """The Markdown lines of one case and the number of its rows lacking a figure."""
    ours = {side: {row["size"]: _time(row) for row in sides[side].get("rows", [])}
            if side in sides else {} for side in SIDES}
    nccl = {side: _baseline_times(sides[side]) if side in sides else {} for side in SIDES}
    lines = [f"### {case}", ""]
    failures = 0
    missing = [side for side in SIDES if side not in sides]
    if missing:
        failures += 1
        lines += [f"No result from the {' and '.join(missing)} tree: its step failed or did "
                  "not run.", ""]
    packages = {sides[side].get("ab_package") for side in SIDES if side in sides}
    if len(sides) == 2 and len(packages) == 1 and None not in packages:
        failures += 1
        lines += [f"Both sides imported the package at {packages.pop()}: one tree was "
                  "measured twice.", ""]
    name = next((sides[side].get("baseline", {}).get("name") for side in SIDES
                 if side in sides and sides[side].get("baseline")), None) or "baseline"
    label = "NCCL" if name == "nccl" else name
    lines += [f"| size (B) | base | {label} (base launch) | this | {label} (this launch) | "
              "this / base |", "|---|---|---|---|---|---|"]
    for size in sorted(set(ours["base"]) | set(ours["this"])):
        base, this = ours["base"].get(size), ours["this"].get(size)
        if base is None or this is None:
            failures += 1
        ratio = "-" if base is None or this is None or base <= 0 else f"{this / base:.2f}"
        lines.append(f"| {size} | {_figure(base)} | {_figure(nccl['base'].get(size))} | "
                     f"{_figure(this)} | {_figure(nccl['this'].get(size))} | {ratio} |")
    return lines + [""], failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, help="results.jsonl of tools/gpu_check.py")
    parser.add_argument("--markdown", type=Path, help="also write the tables there")
    args = parser.parse_args(argv)
    try:
        cases = collect(read_result_lines(args.results))
    except (OSError, ValueError) as error:
        print(f"ab_table: {error}", file=sys.stderr)
        return 2
    if not cases:
        print(f"ab_table: no ab results in {args.results} (documents tagged ab_case and "
              "ab_side, as tools/gpu_check.py ab writes them)", file=sys.stderr)
        return 2
    lines: list[str] = []
    failures = 0
    for case, sides in cases.items():
        case_lines, case_failures = table(case, sides)
        lines += case_lines
        failures += case_failures
    lines.append(f"# failures (rows without both figures, sides missing or measuring one tree): "
                 f"{failures}")
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.markdown:
        args.markdown.write_text(text)
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
