"""The same collectives timed eager, in CUDA graphs and by per-call latency, ours and the
baseline's, side by side, and whether they tell one story (tools/gpu_check.py timer).

Reads the result documents (one JSON per line, as gpu-check's results.jsonl holds them)
whose ``timer_case`` names ``OP-eager``, ``OP-graph`` or ``OP-latency``, and writes a
Markdown table per op: for each size the three figures of ours and of the baseline, and a
verdict. One story means, for each side: eager back-to-back is not faster than the same
calls replayed in a graph (the GPU does the same work, without launch gaps; at least 0.7x
minus 2 us, for noise), and not slower than one call timed alone with its launch (at most
1.5x plus 10 us). Rows with a measurement error or wrong elements are shown as such and
count as failures.

    python tools/analysis/timer_consistency.py OUT/results.jsonl [--markdown FILE]

Exit status 0 when every row tells one story, 1 otherwise, 2 on unreadable input.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

MODES = ("eager", "graph", "latency")


def consistent(eager: float, graph: float, latency: float) -> bool:
    """Whether three timings of one operation (µs) tell one story (module docstring)."""
    return 0.7 * graph - 2 <= eager <= 1.5 * latency + 10


def _figure(row: dict[str, Any]) -> float | None:
    """A row's time, or None where it is not a result (wrong, or a measurement error)."""
    if row.get("wrong") or row.get("errors") or row.get("time_us") is None:
        return None
    return float(row["time_us"])


def collect(documents: list[dict[str, Any]]) -> dict[str, dict[int, dict[str, Any]]]:
    """op -> size -> {("ours"|"baseline", mode): µs or None}."""
    table: dict[str, dict[int, dict[Any, float | None]]] = {}
    for document in documents:
        case = document.get("timer_case")
        if not case or "-" not in case:
            continue
        op, mode = case.rsplit("-", 1)
        if mode not in MODES:
            continue
        sizes = table.setdefault(op, {})
        for row in document.get("rows", []):
            sizes.setdefault(row["size"], {})[("ours", mode)] = _figure(row)
        for row in (document.get("baseline") or {}).get("rows", []):
            sizes.setdefault(row["size"], {})[("baseline", mode)] = _figure(row)
    return table


def render(table: dict[str, dict[int, dict[Any, float | None]]]) -> tuple[list[str], int]:
    """Markdown lines and the number of rows that do not tell one story."""
    lines, failures = [], 0
    for op, sizes in table.items():
        lines += [f"### {op}", "",
                  "| size (B) | ours eager | graph | latency | one story | baseline eager | "
                  "graph | latency | one story |", "|---" * 9 + "|"]
        for size in sorted(sizes):
            cells = [str(size)]
            for side in ("ours", "baseline"):
                values = [sizes[size].get((side, mode)) for mode in MODES]
                cells += ["n/a" if v is None else f"{v:.2f}" for v in values]
                if any(v is None for v in values):
                    verdict = "not measured" if side == "baseline" and all(
                        (side, mode) not in sizes[size] for mode in MODES) else "NO (no result)"
                else:
                    verdict = "yes" if consistent(*values) else "NO"
                failures += verdict.startswith("NO")
                cells.append(verdict)
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return lines, failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", help="result documents, one JSON per line")
    parser.add_argument("--markdown", metavar="FILE", help="also write the tables here")
    args = parser.parse_args(argv)
    try:
        with open(args.results) as source:
            documents = [json.loads(line) for line in source if line.strip()]
    except (OSError, ValueError) as exc:
        print(f"timer_consistency: cannot read {args.results}: {exc}", file=sys.stderr)
        return 2
    lines, failures = render(collect(documents))
    if not lines:
        print("timer_consistency: no timer cases in the results", file=sys.stderr)
        return 2
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as out:
            out.write(text + "\n")
    print(f"# rows that do not tell one story: {failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
