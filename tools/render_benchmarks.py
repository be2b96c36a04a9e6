#!/usr/bin/env python3
"""Render docs/BENCHMARKS.md and the README's headline table from the result documents.

    python3 tools/render_benchmarks.py          # rewrite both
    python3 tools/render_benchmarks.py --check  # exit 1 where either differs from its render

Every figure printed comes from a document under docs/results/ and is linked to it; the
figures of one line come from one launch. Times are quoted as the document holds them; a
ratio is the run's own printed `speedup` (NCCL / ours) where the run printed one, else the
baseline's time over ours rounded to two decimals. A launch with wrong elements or
measurement errors, ours or the baseline's, is never shown as a comparison.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ipcshare.runtime import result_document as rd  # noqa: E402

RESULTS = ROOT / "docs" / "results"
BENCHMARKS = ROOT / "docs" / "BENCHMARKS.md"
TEMPLATE = ROOT / "tools" / "benchmarks-template.md"
README = ROOT / "README.md"
HEADLINE_BEGIN = "<!-- headline table: rendered by tools/render_benchmarks.py -->"
HEADLINE_END = "<!-- end of headline table -->"
MACHINES = [
    ("2xh200", "2 GPUs: 2 × NVIDIA H200 SXM (700 W), NVLink 4 with 18 links a GPU between them"),
    ("4xh200", "4 GPUs: 4 × NVIDIA H200 SXM (700 W), NVLink 4 with 18 links a GPU, all pairs"),
    ("1xh100", "One GPU shared by ranks under MPS: 1 × NVIDIA H100 80GB HBM3 (checks of the "
               "runner's timing phase, not speed claims: the ranks share one GPU)"),
    ("cpu", "CPU: 2 cores (AMD EPYC), no GPU, host shared memory against MPI"),
]
BASELINE_NAMES = {"nccl": "NCCL", "mpi": "MPICH's `Allgather`", "torch": "torch.distributed"}
EMPTY_MACHINES: dict[str, str] = {}
OPS = {
    "allreduce": "all-reduce",
    "allgather": "all-gather",
    "reducescatter": "reduce-scatter",
    "alltoall": "all-to-all",
    "ring": "ring",
    "moe-step": "MoE step",
}


@dataclass(frozen=True)
class Headline:
    """One README headline row: a size range of one launch of one document."""

    machine: str
    call: str
    document: str
    launch: int
    sizes: tuple | None = None
    baseline: str = "nccl"


HEADLINES = [
    Headline(
        "2 × H200",
        "all-reduce, {sizes}, CUDA graph (`auto`)",
        "2xh200/2026-11-28-1ae235d-4-allreduce-auto-graph.json",
        1,
        (8, 131072),
    ),
    Headline(
        "2 × H200",
        "all-gather, {sizes}, CUDA graph (`auto`)",
        "2xh200/2026-11-28-1ae235d-3-small-messages-and-a2a-v-ll.json",
        1,
        (8, 131072),
    ),
    Headline(
        "2 × H200",
        "all-to-all, even splits, {sizes}, CUDA graph (`ll`)",
        "2xh200/2026-11-28-1ae235d-3-small-messages-and-a2a-v-ll.json",
        8,
        (8, 524288),
    ),
    Headline(
        "2 × H200",
        "all-to-all, even splits, {sizes}, CUDA graph (`ll`)",
        "2xh200/2026-11-28-07fd5ca-13-log.json",
        2,
        (1048576, 1048576),
    ),
    Headline(
        "2 × H200",
        "all-to-all, even splits, {sizes}, CUDA graph (`push`, plain tensors)",
        "2xh200/2026-11-28-abfc858-8-alltoall-push.json",
        1,
        (16777216, 268435456),
    ),
    Headline(
        "2 × H200",
        "all-to-all, even splits, {sizes}, CUDA graph (`push`, registered)",
        "2xh200/2026-11-28-abfc858-8-alltoall-push.json",
        3,
        (16777216, 268435456),
    ),
    Headline(
        "2 × H200",
        "all-to-all-v, random splits, {sizes} a rank, CUDA graph (`push`, registered)",
        "2xh200/2026-11-28-1dd430c-10-tests-ll-registered.json",
        7,
        (33554432, 33554432),
    ),
    Headline(
        "2 × H200",
        "all-to-all-v, random splits, {sizes} a rank, CUDA graph (the `eager` algorithm)",
        "2xh200/2026-11-28-1c35a3f-15-alltoall-v-results.json",
        2,
        (33554432, 33554432),
    ),
    Headline(
        "2 of 4 × H200",
        "MoE step (top-8 of 32 experts, 4,096 x 7,168 bf16), one graph against NCCL with host splits",
        "4xh200/2026-11-28-e8f3647-6-log.json",
        17,
    ),
    Headline(
        "4 × H200",
        "all-reduce, {sizes}, CUDA graph (`ll`)",
        "4xh200/2026-11-28-0f21db3-1-log.json",
        6,
        (8, 2048),
    ),
    Headline(
        "4 × H200",
        "all-reduce, {sizes}, CUDA graph (`ll`)",
        "4xh200/2026-11-28-0f21db3-1-log.json",
        6,
        (2097152, 2097152),
    ),
    Headline(
        "4 × H200",
        "all-reduce, {sizes}, eager from Python (`ll`)",
        "4xh200/2026-11-27-6d3eb65-5-latency.json",
        14,
        (8, 131072),
    ),
    Headline(
        "4 × H200",
        "all-gather, {sizes}, CUDA graph (`ll128`)",
        "4xh200/2026-11-28-b346a7f-9-ll128-n4.json",
        1,
        (2097152, 2097152),
    ),
    Headline(
        "4 × H200",
        "reduce-scatter, {sizes}, CUDA graph (`auto`)",
        "4xh200/2026-11-28-e8f3647-5-log.json",
        8,
        (16, 32768),
    ),
    Headline(
        "4 × H200",
        "all-to-all, even splits, {sizes}, CUDA graph (`ll`)",
        "4xh200/2026-11-28-b2fef07-1-log.json",
        4,
        (16, 524288),
    ),
    Headline(
        "4 × H200",
        "MoE step (top-8 of 32 experts, 4,096 x 7,168 bf16), one graph against NCCL with host splits",
        "4xh200/2026-11-28-04d8bea-8-moe-n4-top8.json",
        1,
    ),
    Headline(
        "2 CPU cores, host memory",
        "all-gather, {sizes}, 2 ranks, eager",
        "cpu/2026-11-22-b319563-host-allgather-n2-run1.json",
        1,
        (8, 8388608),
        "mpi",
    ),
]


def view(document: dict) -> dict:
    """What the pages print of a document: its short commit, its day, and its out-of-place
    rows with ours, each baseline and the run's printed ratio side by side."""
    rows = []
    for row in document["rows"]:
        if row["placement"] != "out-of-place":
            continue
        details = row.get("details", {})
        speedup = details.get("speedup", {})
        rows.append(
            {
                "op": row["op"],
                "size": row["size"],
                "algorithm": row["algorithm"],
                "mode": _mode_label(row["mode"], details.get("timing")),
                "ranks": row["world_size"],
                "launch": row["launch"],
                "ours_us": (row["ours"] or {}).get("time_us"),
                "wrong": row["wrong"],
                "measurement_errors": sum(_error_count(e) for e in row["errors"]),
                "step_exit": details.get("step_exit_status"),
                "splits": _splits_label(details),
                "case": details.get("case"),
                "baselines": [
                    {
                        "name": b["name"],
                        "us": b["time_us"],
                        "wrong": b["wrong"],
                        "error": b["error"],
                        "speedup": speedup.get(b["name"]),
                    }
                    for b in row["baselines"]
                ],
            }
        )
    return {
        "commit": document["commit"]["id"][:7],
        "date": document["date"][:10],
        "subject": document.get("extra", {}).get("commit_subject", ""),
        "rows": rows,
    }


def _splits_label(details: dict) -> str | None:
    """The splits of an all-to-all, and `registered` where the arrays were (`-R 1`)."""
    parts = [
        details.get("splits"),
        "registered" if details.get("arrays", "").startswith("registered") else None,
    ]
    return ", ".join(p for p in parts if p) or None


def _mode_label(mode: str, timing: str | None) -> str:
    """The mode, with the kind of samples of a latency (`latency (graph replay samples)`)."""
    if mode == "latency" and timing and timing.startswith("latency ("):
        return timing
    return mode


def _error_count(error: str) -> int:
    """How many measurement errors an entry stands for (a table's trailer counts them)."""
    m = re.search(r"(\d+) measurement errors", error)
    return int(m.group(1)) if m else 1


def load(relative: str) -> dict:
    """The view of the document at docs/results/<relative>, validated against its schema."""
    return view(rd.load(RESULTS / relative))


def documents() -> list:
    """Every result document's view, sorted by date and file name (the render's order)."""
    found = [
        (path.relative_to(RESULTS).as_posix(), view(rd.load(path)))
        for path in sorted(RESULTS.rglob("*.json"))
    ]
    return sorted(found, key=lambda item: (item[1]["date"], item[0]))


def launch_number(launch_id: str) -> int:
    """The number of a launch in its raw file: `<raw file>#<n> (<step>)`."""
    return int(re.search(r"#(\d+)", launch_id).group(1))


def launch_rows(document: dict, launch: int) -> list:
    """The rows of launch number `launch` of the document's raw file."""
    rows = [row for row in document["rows"] if launch_number(row["launch"]) == launch]
    if not rows:
        raise ValueError(f"the document holds no launch #{launch}")
    return rows


def number(value) -> str:
    """A figure as the document holds it (Python's shortest form of the JSON number)."""
    return repr(value) if isinstance(value, float) else str(value)


def span(values: list) -> str:
    low, high = min(values), max(values)
    return number(low) if low == high else f"{number(low)}–{number(high)}"


def ratio(row: dict, baseline: dict):
    """NCCL / ours: the run's printed speedup, else the two times' ratio to 2 decimals."""
    if baseline.get("speedup") is not None:
        return baseline["speedup"]
    return round(baseline["us"] / row["ours_us"], 2)


def clean(rows: list) -> bool:
    """0 wrong and 0 measurement errors, ours and every baseline's, and a step that exited 0
    where its exit status is known."""
    return all(
        row["wrong"] == 0
        and not row.get("measurement_errors")
        and row.get("step_exit") in (None, 0)
        and all(b.get("wrong") == 0 and not b.get("error") for b in row["baselines"])
        for row in rows
    )


def headline_cells(headline: Headline, results: str = "docs/results/") -> list:
    """The five cells of a headline row; raises ValueError where its launch is not clean."""
    document = load(headline.document)
    launch = launch_rows(document, headline.launch)
    rows = launch
    if headline.sizes:
        rows = [r for r in rows if headline.sizes[0] <= r["size"] <= headline.sizes[1]]
    # A measurement error names no row and a failed step none either: the whole launch goes.
    whole = all(not r["measurement_errors"] and r.get("step_exit") in (None, 0) for r in launch)
    if not rows or not clean(rows) or not whole:
        raise ValueError(f"{headline.document} launch {headline.launch}: no clean rows")
    nccl = [next(b for b in r["baselines"] if b["name"] == headline.baseline) for r in rows]
    named = "" if headline.baseline == "nccl" else f"{BASELINE_NAMES[headline.baseline]}: "
    link = results + headline.document
    return [
        f"{headline.machine} ({document['date']}, [`{document['commit']}`]({link}))",
        headline.call.format(sizes=_size_span([r["size"] for r in rows])),
        span([r["ours_us"] for r in rows]) + " µs",
        named + span([b["us"] for b in nccl]) + " µs",
        span([ratio(r, b) for r, b in zip(rows, nccl)]),
    ]


def render_headline(results: str = "docs/results/") -> str:
    """The headline table, its links relative to the page it goes in (`results`)."""
    lines = [
        HEADLINE_BEGIN,
        "| machine (date, commit: its result document) | call, sizes, timing | ipcshare | NCCL (or another baseline), same launch | baseline / ours |",
        "|---|---|---|---|---|",
    ]
    lines += ["| " + " | ".join(headline_cells(h, results)) + " |" for h in HEADLINES]
    lines.append(HEADLINE_END)
    return "\n".join(lines)


def readme_with_headline(text: str) -> str:
    begin, end = text.index(HEADLINE_BEGIN), text.index(HEADLINE_END) + len(HEADLINE_END)
    return text[:begin] + render_headline() + text[end:]


def _launches(document: dict) -> list:
    ids = list(dict.fromkeys(row["launch"] for row in document["rows"]))
    return [[r for r in document["rows"] if r["launch"] == i] for i in ids]


def _size(size) -> str:
    if size is None:
        return "—"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"


def _size_span(sizes: list) -> str:
    low, high = min(sizes), max(sizes)
    return _size(low) if low == high else f"{_size(low)}–{_size(high)}"


def _key(rows: list) -> tuple:
    r = rows[0]
    return (
        r["op"],
        r["mode"],
        r.get("algorithm") or "—",
        r["ranks"],
        r.get("splits") or "",
        r.get("case") or "",
    )


def _launch_line(path: str, document: dict, rows: list) -> str:
    """One launch as one table line: its sizes and each side's range, linked to its document."""
    r0 = rows[0]
    sizes = [r["size"] for r in rows if r["size"] is not None]
    cells = [
        r0.get("algorithm") or "—",
        str(r0["ranks"]),
        r0.get("splits") or r0.get("case") or "—",
        (
            "—"
            if not sizes
            else _size(min(sizes))
            if min(sizes) == max(sizes)
            else f"{_size(min(sizes))}–{_size(max(sizes))}"
        ),
        span([r["ours_us"] for r in rows]),
    ]
    nccl = [next((b for b in r["baselines"] if b["name"] == "nccl"), None) for r in rows]
    other = [next((b for b in r["baselines"]), None) for r in rows]
    baselines = nccl if all(nccl) else other
    if all(baselines):
        cells.append(f"{baselines[0]['name']} {span([b['us'] for b in baselines])}")
        cells.append(span([ratio(r, b) for r, b in zip(rows, baselines)]) if clean(rows) else "—")
    else:
        cells += ["—", "—"]
    wrong = sum(r["wrong"] or 0 for r in rows) + sum((b or {}).get("wrong") or 0 for b in baselines)
    errors = sum(r["measurement_errors"] for r in rows)
    exits = sorted({r["step_exit"] for r in rows if r.get("step_exit")})
    cells.append(f"{wrong} / {errors}" + "".join(f", exit {code}" for code in exits))
    cells.append(f"{document['date']}, [`{document['commit']}`](results/{path})")
    return "| " + " | ".join(cells) + " |"


def _size_table(chosen: list, ranks: int) -> list:
    """The launches at one rank a GPU side by side, a line per size: ours / baseline (ratio),
    each column headed by its algorithm and linked to its document."""
    head, sizes = ["size"], set()
    for path, document, rows in chosen:
        r0 = rows[0]
        label = f"`{r0['algorithm']}`" + (f", {r0['splits']}" if r0.get("splits") else "")
        head.append(f"{label}: [`{document['commit']}`](results/{path}) {document['date']}")
        sizes |= {r["size"] for r in rows}
    base = next((b["name"] for _, _, rows in chosen for b in rows[0]["baselines"]), None)
    out = [
        f"{ranks} ranks, µs: ours"
        + (f" / {base} (ratio)" if base else "")
        + ", one launch a column:",
        "",
        "| " + " | ".join(head) + " |",
        "|---:" + "|---" * len(chosen) + "|",
    ]
    for size in sorted(sizes):
        cells = [_size(size)]
        for _path, _document, rows in chosen:
            row = next((r for r in rows if r["size"] == size), None)
            if row is None:
                cells.append("")
                continue
            cell = number(row["ours_us"])
            b = next(iter(row["baselines"]), None)
            if b is not None:
                shown = clean([row]) and not any(r["measurement_errors"] for r in rows)
                cell += f" / {number(b['us'])}" + (
                    f" ({number(ratio(row, b))})" if shown else " (—)"
                )
            if row["wrong"]:
                cell += f", {row['wrong']} wrong"
            cells.append(cell)
        out.append("| " + " | ".join(cells) + " |")
    return out


def render_today(all_documents: list) -> list:
    """Per machine, op and timing mode: the latest launch of each algorithm, rank count and
    split kind, one line each."""
    out = []
    for machine, heading in MACHINES:
        latest: dict = {}
        for path, document in all_documents:
            if not path.startswith(machine + "/"):
                continue
            for rows in _launches(document):
                # The newest day's launch; on one day a clean launch before one that is not.
                held = latest.get(_key(rows))
                if (
                    held
                    and held[1]["date"] == document["date"]
                    and clean(held[2])
                    and not clean(rows)
                ):
                    continue
                latest[_key(rows)] = (path, document, rows)
        out += [f"### {heading}", ""]
        if not latest:
            out += [EMPTY_MACHINES.get(machine, "No result document yet."), ""]
            continue
        full = int(machine.split("x")[0]) if machine[0].isdigit() else 2
        for op in OPS:
            modes = sorted(
                {k[1] for k in latest if k[0] == op},
                key=lambda m: (("graph", "eager").index(m) if m in ("graph", "eager") else 2, m),
            )
            for mode in modes:
                chosen = [v for k, v in latest.items() if k[0] == op and k[1] == mode]
                if not chosen:
                    continue
                chosen.sort(
                    key=lambda v: (
                        v[2][0]["ranks"],
                        str(v[2][0].get("algorithm")),
                        str(v[2][0].get("splits") or v[2][0].get("case")),
                    )
                )
                per_size = [
                    v for v in chosen if v[2][0]["ranks"] == full and op not in ("moe-step",)
                ]
                if per_size:
                    table = _size_table(per_size, full)
                    out += [f"**{OPS[op]}, {mode}.** {table[0]}"] + table[1:] + [""]
                else:
                    out += [f"**{OPS[op]}, {mode}.**", ""]
                others = [v for v in chosen if v not in per_size]
                if others:
                    out += [
                        "| algorithm | ranks | splits / case | sizes | ours | baseline, same launch | baseline / ours | #wrong / measurement errors | date, commit: document |",
                        "|---|---:|---|---|---|---|---|---|---|",
                    ]
                    out += [_launch_line(path, document, rows) for path, document, rows in others]
                    out.append("")
    return out


def render_history(all_documents: list) -> list:
    """A line per run (date and commit), newest first: what the commit changed, and its
    documents by machine."""
    runs: dict = {}
    for path, document in all_documents:
        runs.setdefault((document["date"], document["commit"]), []).append((path, document))
    out = ["| date | commit | what the commit changed | documents |", "|---|---|---|---|"]
    for (date, commit), held in sorted(runs.items(), reverse=True):
        links = ", ".join(f"[{_document_label(path)}](results/{path})" for path, _ in sorted(held))
        subject = held[0][1]["subject"].replace("|", "/")
        out.append(f"| {date} | `{commit}` | {subject} | {links} |")
    return out


def _document_label(path: str) -> str:
    """A document's machine and what it holds, from its file name."""
    machine, name = path.split("/", 1)
    what = re.sub(r"^\d{4}-\d\d-\d\d-[0-9a-f]{7}-", "", Path(name).stem)
    return f"{machine} {what}"


def render_benchmarks() -> str:
    all_documents = documents()
    template = TEMPLATE.read_text()
    text = template.replace("{{today}}", "\n".join(render_today(all_documents)).rstrip())
    text = text.replace("{{history}}", "\n".join(render_history(all_documents)))
    text = text.replace("{{headline}}", render_headline("results/"))
    return text.rstrip() + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="exit 1 where a file differs from its render"
    )
    args = parser.parse_args(argv)
    benchmarks = render_benchmarks()
    readme = readme_with_headline(README.read_text())
    if args.check:
        stale = [p for p, t in ((BENCHMARKS, benchmarks), (README, readme)) if p.read_text() != t]
        for path in stale:
            print(
                f"{path.relative_to(ROOT)} differs from its render: run tools/render_benchmarks.py"
            )
        return 1 if stale else 0
    BENCHMARKS.write_text(benchmarks)
    README.write_text(readme)
    return 0


if __name__ == "__main__":
    sys.exit(main())
