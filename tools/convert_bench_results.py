#!/usr/bin/env python3
"""Convert the raw output under docs/bench/ into result documents under docs/results/.

Run once from the repository root (`python3 tools/convert_bench_results.py`); it rewrites
docs/results/ and prints what it left out and why. The raw files carry no commit: a file's
commit comes from its name (`...-<commit>...`) or, for the dated folders of
`tools/gpu-check.sh` runs, from the summary files and the hand-written record of that run
(RAW_COMMITS below); each document says which (`commit_source`). Raw files whose commit
neither says are left out, as are the steps of a run that timed another tree than its
folder's (named in RAW_COMMITS) where that tree's commit is not recorded.

A document holds every launch of one raw file at one commit. Figures are copied as the raw
file printed them (µs, the nccl-tests style `time` column; the baseline's `speedup` as
printed); nothing is recomputed.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_logs import Launch, LogContext, load_json_runs, parse_log, read_text

ROOT = Path(__file__).resolve().parent.parent
RAW = ROOT / "docs" / "bench"
OUT = ROOT / "docs" / "results"
SCHEMA = "ipcshare-result"
SCHEMA_VERSION = 1

# Where a raw file's name carries no commit: (pattern of its path under docs/bench, commit,
# where the commit comes from, step-title prefixes that ran another tree -> its commit or
# None where unrecorded, algorithms of its tables in order where the tables carry no step).
_SUMMARY = "the run's summary file ({}) names the tree; the raw output carries no commit"
_RECORD = "the hand-written record of the run names it; the raw output carries no commit"
RAW_COMMITS = [
    (
        r"gpu-check-h200-x2-2026-11-27/",
        "0243907",
        _SUMMARY.format("1-summary-0243907.txt"),
        {},
        None,
    ),
    (r"gpu-check-h200-x2-2026-11-28/(2|3|4)-", "1ae235d", _RECORD, {"a2a-v-ll:": None}, None),
    (r"gpu-check-h200-x2-2026-11-28/8-alltoall-push", "abfc858", _RECORD, {}, None),
    (r"gpu-check-h200-x2-2026-11-28/(9|10|11)-", "1dd430c", _RECORD, {"ab base:": None}, None),
    (
        r"gpu-check-h200-x2-2026-11-28/12-",
        "7736721",
        _SUMMARY.format("9-12-summaries.txt"),
        {},
        None,
    ),
    (
        r"gpu-check-h200-x2-2026-11-28/13-",
        "07fd5ca",
        _SUMMARY.format("13-16-summaries.txt"),
        {},
        None,
    ),
    (
        r"gpu-check-h200-x2-2026-11-28/1[56]-",
        "1c35a3f",
        _SUMMARY.format("13-16-summaries.txt"),
        {"ab base:": "75b5b00"},
        None,
    ),
    (
        r"gpu-check-h200-x4-2026-11-28/[123]-log",
        "b2fef07",
        _SUMMARY.format("1-summary.txt"),
        {"ll-all-peers": "0f21db3"},
        None,
    ),
    (r"gpu-check-h200-x4-2026-11-28/4-log", "5cdb567", _SUMMARY.format("4-summary.txt"), {}, None),
    (
        r"gpu-check-h200-x4-2026-11-28/[56]-",
        "e8f3647",
        _SUMMARY.format("5-summary.txt"),
        {"main ": "b5c4a32"},
        None,
    ),
    (
        r"gpu-check-h200-x4-2026-11-28/7-log",
        "da250cd",
        _SUMMARY.format("7-summary.txt"),
        {"main ": "b5c4a32"},
        None,
    ),
    (r"gpu-check-h200-x4-2026-11-28/8-moe", "04d8bea", _SUMMARY.format("8-summary.txt"), {}, None),
    (
        r"gpu-check-h200-x4-2026-11-28/[146]-moe",
        "b2fef07",
        _SUMMARY.format("1-summary.txt"),
        {},
        None,
    ),
    (
        r"gpu-check-h200-x4-2026-11-28/9-ll128-n4",
        "b346a7f",
        _SUMMARY.format("9-summary.txt"),
        {},
        ["ll128", "ll", "auto"] * 2,
    ),
    (
        r"gpu-check-h200-x4-2026-11-28/9-ll128-n2",
        "6f1249c",
        _SUMMARY.format("9-summary.txt"),
        {},
        ["ll128", "ll", "auto"] * 2,
    ),
    (
        r"gpu-check-h200-x4-2026-11-28/9-tests-2G",
        "6f1249c",
        _SUMMARY.format("9-summary.txt"),
        {},
        None,
    ),
]
# Files that repeat tables of another file of the same run (left out: one document a launch).
DUPLICATES = {
    "gpu-check-h200-x4-2026-11-28/1-tables.txt": "1-log.txt.gz",
    "gpu-check-h200-x4-2026-11-28/4-tables.txt": "4-log.txt.gz",
    "gpu-check-h200-x4-2026-11-28/9-push-n2.txt": "9-tests-2G.log.gz",
    "gpu-check-h200-x4-2026-11-28/9-push-n4.txt": "9-tests-2G.log.gz",
    "gpu-check-h200-x4-2026-11-28/6-moe-n2-top8.md": "6-log.txt.gz",
    "gpu-check-h200-x4-2026-11-28/1-moe-n4-top1.md": "1-log.txt.gz",
    "gpu-check-h200-x4-2026-11-28/1-moe-n4-top8.md": "1-log.txt.gz",
    "gpu-check-h200-x4-2026-11-28/4-moe-n2-top1.md": "4-log.txt.gz",
}
_COMMIT_IN_NAME = re.compile(r"-([0-9a-f]{7})(?=[-./]|$)")
_MACHINE_IN_NAME = re.compile(r"(h200|h100)(?:-x(\d))?")
_DATE_IN_NAME = re.compile(r"(\d{4}-\d\d-\d\d)")
ALGORITHMS = (
    "ll128-two-shot",
    "ll-two-shot",
    "ll128",
    "ll",
    "push",
    "pull",
    "balanced-pipelined",
    "balanced",
    "copy-engine",
    "auto",
    "ring",
    "ce",
)
_LINKS = {"NV18": "NVLink 4, 18 links between every pair (nvidia-smi topo: NV18)"}


def commit_of(relative: str) -> tuple:
    """(commit, source, step overrides, table algorithms) of a raw file, or None."""
    for pattern, commit, source, overrides, algorithms in RAW_COMMITS:
        if re.match(pattern, relative):
            return commit, source, overrides, algorithms
    name = relative.rsplit("/", 1)[-1]
    m = _COMMIT_IN_NAME.search(name) or _COMMIT_IN_NAME.search(relative)
    if m:
        where = "file name" if _COMMIT_IN_NAME.search(name) else "folder name"
        return m.group(1), f"the {where} names it; the raw output carries no commit", {}, None
    step = re.match(r"(.*/)(\d+)-", relative)
    if step:
        for sibling in sorted((RAW / step.group(1)).glob(step.group(2) + "-*")):
            if m := _COMMIT_IN_NAME.search(sibling.name):
                return (
                    m.group(1),
                    f"the run's other files of step {step.group(2)} "
                    f"({sibling.name}) name it; the raw output carries no commit",
                    {},
                    None,
                )
    return None


def machine_of(relative: str, context: LogContext, devices: list) -> dict:
    """The machine a raw file ran on: from the log's nvidia-smi, else from its name."""
    m = _MACHINE_IN_NAME.search(relative)
    if context.gpus:
        names = {name for _, name in context.gpus}
        gpu, count = " / ".join(sorted(names)), len(context.gpus)
    elif devices:
        gpu = " ".join(devices[0].split()[1:-1])
        count = None
    elif m:
        gpu, count = "NVIDIA " + m.group(1).upper(), int(m.group(2) or 1)
    else:
        return {"gpu": None, "gpu_count": 0, "cpu": "2 cores (AMD EPYC), no GPU"}
    if count is None:
        count = int(m.group(2) or 1) if m else len(devices)
    machine = {"gpu": gpu, "gpu_count": count}
    if count > 1:
        machine["links"] = _LINKS.get(context.link or "NV18", context.link)
    for key in ("driver", "cuda", "nccl", "torch"):
        if getattr(context, key):
            machine[key] = getattr(context, key)
    return machine


def machine_dir(machine: dict) -> str:
    if not machine.get("gpu"):
        return "cpu"
    model = machine["gpu"].replace("NVIDIA ", "").split()[0].lower()
    return f"{machine['gpu_count']}x{model}"


def _number(text):
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return int(value) if re.fullmatch(r"-?\d+", str(text)) else value


def _algorithm(step: str, command: str, table_algorithm: str | None) -> str | None:
    if table_algorithm:
        return table_algorithm
    m = re.search(r"--algo[ =](\S+)|ALGO=(\S+)", command) or re.search(r"--algo (\S+)", step)
    if m:
        return m.group(1) or m.group(2)
    for word in re.split(r"[\s:]+", step):
        if word in ALGORITHMS:
            return word
    return None


def _mode(timing: str | None) -> str:
    if not timing:
        return "eager"
    word = timing.split()[0]
    return {"nccl-tests": "eager"}.get(word, word)


def rows_of_table(launch: Launch, launch_id: str, algorithm: str | None) -> list:
    """A table's rows as result-document rows (ours out of place; in place beside it)."""
    rows = []
    op = "ring" if launch.header.get("op") == "ring" else launch.header.get("op")
    for printed in launch.rows:
        ours = printed.get("out-of-place") or printed.get("ring") or {}
        in_place = printed.get("in-place") or {}
        baselines = []
        for group, cells in printed.items():
            if group.startswith("baseline:"):
                label = group.split(":", 1)[1]
                baseline = {
                    "name": _baseline_name(label),
                    "label": label,
                    "us": _number(cells.get("time")),
                    "wrong": _number(cells.get("#wrong")),
                }
                if "speedup" in cells:
                    baseline["speedup"] = _number(cells["speedup"])
                if "path" in cells:
                    baseline["path"] = cells["path"]
                baselines.append(baseline)
        row = {
            "op": op,
            "size": _number(printed.get("size")),
            "dtype": printed.get("type"),
            "algorithm": algorithm,
            "mode": _mode(launch.header.get("timing")),
            "ranks": _number(launch.header.get("ranks")),
            "ours_us": _number(ours.get("time")),
            "wrong": _number(ours.get("#wrong")),
            "baselines": baselines,
            "launch": launch_id,
            "measurement_errors": launch.measurement_errors,
        }
        if in_place:
            row["ours_in_place_us"] = _number(in_place.get("time"))
            row["wrong"] = (row["wrong"] or 0) + (_number(in_place.get("#wrong")) or 0)
        if launch.header.get("splits"):
            row["splits"] = launch.header["splits"]
        rows.append(row)
    return rows


def _baseline_name(label: str) -> str:
    lower = label.lower()
    for name in ("nccl", "mpi", "torch"):
        if name in lower:
            return name
    return lower


def rows_of_moe(launch: Launch, launch_id: str) -> list:
    """A MoE step's versions: ours and each baseline timed in the one launch."""
    h = launch.header
    versions = {row["version"]: row for row in launch.rows}
    ours = next((r for v, r in versions.items() if v.startswith("ipcshare")), None)
    if ours is None:
        return []
    baselines = []
    for version, row in versions.items():
        if version.startswith("ipcshare"):
            continue
        baselines.append(
            {
                "name": "nccl" if version.startswith("NCCL") else "torch-symmetric-memory",
                "label": version,
                "us": _number(row["µs per step"]),
                "wrong": 0 if "bit for bit" in row["checked"] else None,
                "timing": row["timing"],
                "ours_over": _number(row["÷ ipcshare"]),
            }
        )
    return [
        {
            "op": "moe-step",
            "case": f"top-{h['top']} of {h['experts']} experts, {h['tokens']} x {h['hidden']} {h['dtype']}",
            "size": None,
            "dtype": h["dtype"],
            "algorithm": "auto",
            "mode": "graph",
            "ranks": _number(h["ranks"]),
            "ours_us": _number(ours["µs per step"]),
            "wrong": 0 if "bit for bit" in ours["checked"] else None,
            "baselines": baselines,
            "launch": launch_id,
            "measurement_errors": None,
        }
    ]


def rows_of_json(run: dict, launch_id: str) -> list:
    """A `--json` document's rows (one launch)."""
    baseline = run.get("baseline") or None
    by_size = {r["size"]: r for r in (baseline or {}).get("rows", [])}
    rows = []
    for r in run.get("rows", []):
        b = by_size.get(r["size"])
        baselines = []
        if b is not None:
            entry = {
                "name": baseline.get("name"),
                "label": baseline.get("label") or baseline.get("version"),
                "us": b.get("time_us"),
                "wrong": b.get("wrong"),
            }
            if b.get("path"):
                entry["path"] = b["path"]
            baselines.append(entry)
        row = {
            "op": run.get("op"),
            "size": r["size"],
            "dtype": run.get("dtype", "float32"),
            "algorithm": run.get("algo"),
            "mode": _mode(run.get("timing")),
            "ranks": run.get("world_size"),
            "ours_us": r.get("time_us"),
            "wrong": r.get("wrong", 0) + (r.get("in_place") or {}).get("wrong", 0),
            "baselines": baselines,
            "launch": launch_id,
            "measurement_errors": len(run["measurement_errors"])
            if "measurement_errors" in run
            else None,
        }
        if r.get("in_place"):
            row["ours_in_place_us"] = r["in_place"].get("time_us")
        if run.get("splits"):
            row["splits"] = run["splits"]
        rows.append(row)
    return rows


def _what(relative: str) -> str:
    name = relative.rsplit("/", 1)[-1]
    name = re.sub(r"\.(log|txt|json|jsonl|md)(\.gz)?$", "", name)
    name = _COMMIT_IN_NAME.sub("", name)
    name = re.sub(r"^gpu-check-", "check-", name)
    name = re.sub(r"(gpu-)?(h200|h100)(-x\d)?-?", "", name)
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "run"


def convert_file(path: Path) -> tuple[list, str | None]:
    """The documents of one raw file, or ([], why it is left out)."""
    relative = path.relative_to(RAW).as_posix()
    if relative in DUPLICATES:
        return [], f"repeats the tables of {DUPLICATES[relative]}"
    found = commit_of(relative)
    if found is None:
        return [], "no commit in its name, folder or the run's summary"
    commit, source, overrides, table_algorithms = found
    context, launches, devices, json_runs = LogContext(), [], [], []
    if path.name.endswith((".json", ".jsonl")):
        try:
            json_runs = load_json_runs(path)
        except (ValueError, KeyError) as exc:
            return [], f"not a --json document ({exc})"
        json_runs = [r for r in json_runs if isinstance(r, dict) and "rows" in r and "op" in r]
        if not json_runs:
            return [], "holds no timed rows of an ipcshare command"
        devices = json_runs[0].get("devices") or []
    else:
        context, launches = parse_log(read_text(path))
        if not launches:
            return [], "holds no timed table"
    m = _DATE_IN_NAME.search(relative)
    date = context.date or (m.group(1) if m else None)
    date_source = "the log" if context.date else ("the folder name" if m else None)
    if date is None:
        date = _date_committed(path)
        date_source = "the day the raw file was committed; the raw output carries no date"
    machine = machine_of(relative, context, devices)
    by_commit: dict = {}
    stem = relative
    skipped = []
    for index, launch in enumerate(launches):
        launch_commit = commit
        for prefix, other in overrides.items():
            if launch.step.startswith(prefix):
                launch_commit = other
        if launch_commit is None:
            skipped.append(launch.step)
            continue
        launch_id = f"{stem}#{index + 1}" + (f" ({launch.step})" if launch.step else "")
        algorithm = (
            table_algorithms[index] if table_algorithms and index < len(table_algorithms) else None
        )
        if launch.kind == "moe-step":
            rows = rows_of_moe(launch, launch_id)
        else:
            rows = rows_of_table(
                launch, launch_id, _algorithm(launch.step, launch.command, algorithm)
            )
        by_commit.setdefault(launch_commit, []).extend(rows)
    for index, run in enumerate(json_runs):
        by_commit.setdefault(commit, []).extend(rows_of_json(run, f"{stem}#{index + 1}"))
    documents = []
    for each_commit, rows in by_commit.items():
        if not rows:
            continue
        note = (
            source
            if each_commit == commit
            else (
                f"steps of this file that ran another tree ({each_commit}), as the run's summary names it"
            )
        )
        documents.append(
            {
                "schema": SCHEMA,
                "version": SCHEMA_VERSION,
                "commit": each_commit,
                "dirty": None,
                "commit_source": note,
                "machine": machine,
                "date": date,
                "date_source": date_source,
                "command": _command(launches, json_runs),
                "exit_status": None,
                "raw": [f"docs/bench/{relative}"],
                "converted_by": "tools/convert_bench_results.py",
                "rows": rows,
            }
        )
    why = f"steps of an unrecorded tree left out: {', '.join(skipped)}" if skipped else None
    return documents, why


def _command(launches: list, json_runs: list) -> str:
    if json_runs:
        return (
            "ipcshare "
            + (json_runs[0].get("op") or "bench")
            + " --json (the command line is not recorded)"
        )
    steps = [launch.step for launch in launches if launch.step]
    if steps:
        return "tools/gpu-check.sh steps: " + "; ".join(dict.fromkeys(steps))
    return (
        "ipcshare " + (launches[0].header.get("op") or "") + " (the command line is not recorded)"
    )


def _date_committed(path: Path) -> str | None:
    out = subprocess.run(
        ["git", "log", "--diff-filter=A", "--format=%as", "--", str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
    return out[-1] if out else None


def document_path(document: dict) -> Path:
    what = _what(document["raw"][0].removeprefix("docs/bench/"))
    folder = document["raw"][0].removeprefix("docs/bench/").split("/")[0]
    if "/" in document["raw"][0].removeprefix("docs/bench/"):
        m = re.search(r"(\d{4}-\d\d-\d\d)", folder)
        what = f"{what}" if m else f"{_what(folder)}-{what}"
    date = document["date"] or "undated"
    return OUT / machine_dir(document["machine"]) / f"{date}-{document['commit']}-{what}.json"


def main() -> int:
    if OUT.exists():
        for old in OUT.rglob("*.json"):
            old.unlink()
    written, left_out = 0, []
    for path in sorted(RAW.rglob("*")):
        if not path.is_file() or not re.search(r"\.(log|txt|json|jsonl|md)(\.gz)?$", path.name):
            continue
        if path.suffix == ".txt" and path.with_suffix(".json").exists():
            left_out.append((path, f"the table of {path.with_suffix('.json').name}"))
            continue
        if path.suffix == ".md" and "moe" not in path.name:
            left_out.append((path, "a summary written from other output, not raw output"))
            continue
        documents, why = convert_file(path)
        if why:
            left_out.append((path, why))
        for document in documents:
            target = document_path(document)
            if target.exists():
                raise SystemExit(f"two documents would be written to {target}")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(json.dumps(document, indent=1, ensure_ascii=False) + "\n")
            written += 1
    print(f"{written} documents written under {OUT.relative_to(ROOT)}")
    for path, why in left_out:
        print(f"left out {path.relative_to(ROOT)}: {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
