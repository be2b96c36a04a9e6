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

import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_logs import Launch, LogContext, load_json_runs, parse_log, read_text  # noqa: E402

from ipcshare.runtime import result_document as rd  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RAW = ROOT / "docs" / "bench"
OUT = ROOT / "docs" / "results"

# Where a raw file's name carries no commit: (pattern of its path under docs/bench, commit,
# where the commit comes from, step-title prefixes that ran another tree -> its commit or
# None where unrecorded, algorithms of its tables in order where the tables carry no step).
_SUMMARY = "the run's summary file ({}) names the tree; the raw output carries no commit"
_RECORD = (
    "the hand-written record of the run ({}, at 3be84d4) names it; the raw output carries no commit"
)
RAW_COMMITS = [
    (
        r"gpu-check-h200-x2-2026-11-27/",
        "0243907",
        _SUMMARY.format("1-summary-0243907.txt"),
        {},
        None,
    ),
    (
        r"gpu-check-h200-x2-2026-11-28/(2|3|4)-",
        "1ae235d",
        _RECORD.format("docs/BENCHMARKS.md"),
        {"a2a-v-ll:": None},
        None,
    ),
    (
        r"gpu-check-h200-x2-2026-11-28/8-",
        "abfc858",
        _RECORD.format("docs/GPU.md, README.md"),
        {},
        None,
    ),
    (r"host-ring-n2\.", "c58ad90", _RECORD.format("docs/BENCHMARKS.md"), {}, None),
    (
        r"gpu-check-h200-x2-2026-11-28/(9|10|11)-",
        "1dd430c",
        _RECORD.format("docs/BENCHMARKS.md"),
        {"ab base:": None},
        None,
    ),
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
    "gpu-check-h200-x4-2026-11-28/6-shared-5-on-4.log.gz": "6-log.txt.gz",
    "gpu-check-h200-x4-2026-11-28/6-shared-mps-gpus01.log.gz": "6-log.txt.gz",
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
_LINKS = {"NV18": "NVLink 4: 18 links per GPU, all pairs (nvidia-smi topo: NV18)"}


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


_HOSTNAME = re.compile(r"^===== gpu-check .* on (?P<host>\S+) at ")
_CPU_AFFINITY = re.compile(r"^GPU0\s.*?\s(?P<first>\d+)-(?P<last>\d+)\s+\d+\s+\S+\s*$")
_STEP_STATUS = re.compile(
    r"^(?P<title>\S.*?)\s{2,}(?:ok|FAILED rc=(?P<failed>\d+)|rc=(?P<rc>\d+))\s+\d+s\b"
)


def _host_facts(text: str) -> dict:
    """The hostname and CPU count a log printed (gpu-check's header, nvidia-smi topo)."""
    facts = {}
    for line in text.splitlines():
        if "hostname" not in facts and (m := _HOSTNAME.match(line)):
            facts["hostname"] = m.group("host")
        if "host_cpus" not in facts and (m := _CPU_AFFINITY.match(line.strip())):
            facts["host_cpus"] = int(m.group("last")) - int(m.group("first")) + 1
    return facts


def _step_statuses(texts: list) -> dict:
    """Each step's exit status, from the step lines of logs and summaries (ok is 0)."""
    statuses = {}
    for text in texts:
        for line in text.splitlines():
            if m := _STEP_STATUS.match(line):
                # The log's own line first: a summary written beside it has misreported one.
                statuses.setdefault(
                    m.group("title").strip(), int(m.group("failed") or m.group("rc") or 0)
                )
    return statuses


def _context_files(path: Path, commit: str) -> list:
    """Logs and summaries that describe the same run: the file itself, its folder's files of
    the same numbered call, and the logs named with the same commit."""
    relative = path.relative_to(RAW).as_posix()
    found = [path]
    step = re.match(r"(.*/)(\d+)-", relative)
    if step:
        found += sorted((RAW / step.group(1)).glob(step.group(2) + "-*"))
        found += sorted((RAW / step.group(1)).glob("*summar*"))
    found += sorted(p for p in RAW.rglob(f"*{commit}*") if p.suffix in (".log", ".txt", ".gz"))
    if path.parent != RAW:
        found += sorted(path.parent.glob("*log*"))
    return list(dict.fromkeys(p for p in found if p.is_file()))


def machine_of(path: Path, commit: str, context: LogContext, devices: list) -> tuple:
    """The machine a raw file ran on, and where each fact came from.

    The log's own nvidia-smi, topology and header first; then the logs of the same run
    (same call of a dated folder, or the same commit); then the file's name (`h200-x4`).
    """
    relative = path.relative_to(RAW).as_posix()
    name = _MACHINE_IN_NAME.search(relative)
    notes = []
    contexts = [(path, context)]
    facts: dict = {}
    for other in _context_files(path, commit):
        if other.suffix not in (".log", ".txt", ".gz"):
            continue
        text = read_text(other)
        if other != path:
            contexts.append((other, parse_log(text)[0]))
        for key, value in _host_facts(text).items():
            if key not in facts:
                facts[key] = value
                if other != path:
                    notes.append(f"{key} from {other.relative_to(RAW).as_posix()}")
    machine = {
        "hostname": facts.get("hostname", "unknown"),
        "host_cpus": facts.get("host_cpus", 0),
        "gpu_model": None,
        "gpu_count": 0,
        "links": None,
        "driver": None,
        "cuda": None,
        "nccl": None,
        "torch": None,
    }
    if name is None and not devices and not any(c.gpus for _, c in contexts):
        machine["host_cpus"] = facts.get("host_cpus", 2)
        notes.append("the CPU machine of these runs: 2 cores (AMD EPYC), as the run's record says")
        return machine, notes
    for other, each in contexts:
        if each.gpus and machine["gpu_model"] is None:
            machine["gpu_model"] = " / ".join(sorted({n for _, n in each.gpus}))
            machine["gpu_count"] = len(each.gpus)
            if other != path:
                notes.append(f"GPUs from {other.relative_to(RAW).as_posix()}")
        for key in ("driver", "cuda", "nccl", "torch"):
            if machine[key] is None and getattr(each, key):
                machine[key] = getattr(each, key)
                if other != path:
                    notes.append(f"{key} from {other.relative_to(RAW).as_posix()}")
        if machine["links"] is None and each.link:
            machine["links"] = _LINKS.get(each.link, each.link)
    if machine["gpu_model"] is None:
        if devices:
            machine["gpu_model"] = " ".join(devices[0].split()[1:-1])
        elif name:
            machine["gpu_model"] = "NVIDIA " + name.group(1).upper()
        machine["gpu_count"] = int(name.group(2) or 1) if name else len(devices)
        notes.append("GPU model and count from the file name")
    if machine["gpu_count"] > 1 and machine["links"] is None:
        machine["links"] = _LINKS["NV18"]
        notes.append("links as every log of this machine shows them (nvidia-smi topo: NV18)")
    if machine["host_cpus"] == 0:
        notes.append("host_cpus: not recorded (0)")
    return machine, notes


def machine_dir(machine: dict) -> str:
    if not machine.get("gpu_model"):
        return "cpu"
    model = machine["gpu_model"].replace("NVIDIA ", "").split()[0].lower()
    return f"{machine['gpu_count']}x{model}"


def _number(text):
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return int(value) if re.fullmatch(r"-?\d+", str(text)) else value


def _algorithm(step: str, command: str, table_algorithm: str | None, name: str) -> str:
    if table_algorithm:
        return table_algorithm
    m = re.search(r"--algo[ =](\S+)|ALGO=(\S+)", command) or re.search(r"--algo (\S+)", step)
    if m:
        return m.group(1) or m.group(2)
    for word in re.split(r"[\s:]+", step):
        if word in ALGORITHMS:
            return word
    for word in re.split(r"[\s:-]+", step) + re.split(r"[-.]", name):
        if word in ALGORITHMS:
            return word
    return "default"


def _mode(timing: str | None) -> str:
    if not timing:
        return "eager"
    word = timing.split()[0]
    if word in rd.MODES:
        return word
    # nccl-tests, after-kernel: eager calls (the timing's own name stays in details)
    return "graph" if "graph" in timing else "eager"


def _figure(cells: dict) -> dict:
    extra = {
        k: _number(cells[c])
        for k, c in (("host_us", "host"), ("p95_us", "p95"))
        if cells.get(c) not in (None, "-")
    }
    return rd.figure(
        _number(cells.get("time")),
        _number(cells.get("algbw")),
        _number(cells.get("busbw")),
        **extra,
    )


def rows_of_table(launch: Launch, launch_id: str, algorithm: str) -> list:
    """A table's rows as result-document rows: out of place, then in place where timed."""
    rows = []
    op = launch.header.get("op")
    ranks = _number(launch.header.get("ranks"))
    # The table's trailer counts the launch's measurement errors without naming their rows:
    # the first row carries the count, and a reader takes the launch as one.
    errors = (
        [f"{launch_id}: {launch.measurement_errors} measurement errors (rows not named)"]
        if launch.measurement_errors
        else []
    )
    for index, printed in enumerate(launch.rows):
        row_errors = errors if index == 0 else []
        baselines, speedups = [], {}
        for group, cells in printed.items():
            if not group.startswith("baseline:"):
                continue
            label = group.split(":", 1)[1]
            name = _baseline_name(label)
            wrong = _number(cells.get("#wrong"))
            baselines.append(
                rd.baseline_figure(
                    name,
                    _number(cells.get("time")),
                    None,
                    _number(cells.get("busbw")),
                    wrong=wrong,
                    path=cells.get("path"),
                    version=label,
                )
            )
            if cells.get("speedup") not in (None, "-") and not wrong:
                speedups[name] = _number(cells["speedup"])
        details = {}
        timing = launch.header.get("timing") or ""
        if timing and (timing.split()[0] not in rd.MODES or timing.startswith("latency")):
            details["timing"] = timing  # after-kernel; latency of eager or graph samples
        if launch.header.get("splits"):
            details["splits"] = launch.header["splits"]
        if launch.header.get("arrays"):
            details["arrays"] = launch.header["arrays"]
        if speedups:
            details["speedup"] = speedups
        for placement in ("out-of-place", "in-place", "ring"):
            cells = printed.get(placement)
            if not cells:
                continue
            rows.append(
                rd.make_row(
                    op=op,
                    size=_number(printed["size"]),
                    count=_number(printed.get("count")),
                    dtype=printed.get("type"),
                    algorithm=algorithm,
                    mode=_mode(launch.header.get("timing")),
                    placement="in-place" if placement == "in-place" else "out-of-place",
                    world_size=ranks,
                    launch=launch_id,
                    ours=_figure(cells),
                    baselines=baselines if placement != "in-place" else [],
                    wrong=_number(cells.get("#wrong")),
                    errors=row_errors if placement != "in-place" else [],
                    details=details,
                )
            )
    return rows


def _baseline_name(label: str) -> str:
    lower = label.lower()
    if "symmetric memory" in lower:
        return "torch-symm"
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
    baselines, ratios = [], {}
    for version, row in versions.items():
        if version.startswith("ipcshare"):
            continue
        name = _baseline_name(version)
        wrong = 0 if "bit for bit" in row["checked"] else None
        baselines.append(
            rd.baseline_figure(
                name,
                _number(row["µs per step"]),
                wrong=wrong,
                version=f"{version} ({row['timing']})",
            )
        )
        ratios[name] = _number(row["÷ ipcshare"])
    tokens, hidden = int(h["tokens"]), int(h["hidden"])
    return [
        rd.make_row(
            op="moe-step",
            size=tokens * hidden * 2,
            count=tokens * hidden,
            dtype=h["dtype"],
            algorithm="auto",
            mode="graph",
            world_size=int(h["ranks"]),
            launch=launch_id,
            ours=rd.figure(_number(ours["µs per step"])),
            baselines=baselines,
            wrong=0 if "bit for bit" in ours["checked"] else None,
            details={
                "case": f"top-{h['top']} of {h['experts']} experts, {tokens} x {hidden} "
                f"{h['dtype']} a rank",
                "speedup": ratios,
                "ours_timing": ours["timing"],
            },
        )
    ]


def rows_of_json(run: dict, launch_id: str) -> list:
    """A `--json` document's rows (one launch)."""
    baseline = run.get("baseline") or None
    by_size = {r["size"]: r for r in (baseline or {}).get("rows", [])}
    errors = [str(e) for e in run.get("measurement_errors") or []]
    rows = []
    for r in run.get("rows", []):
        b = by_size.get(r["size"])
        baselines = []
        if b is not None:
            baselines.append(
                rd.baseline_figure(
                    baseline.get("name"),
                    b.get("time_us"),
                    b.get("algbw"),
                    b.get("busbw"),
                    wrong=b.get("wrong"),
                    path=b.get("path"),
                    version=baseline.get("version") or baseline.get("label"),
                )
            )
        details = {"splits": run["splits"]} if run.get("splits") else {}
        if run.get("timing") and run["timing"] not in rd.MODES:
            details["timing"] = run["timing"]
        for placement, figure in (("out-of-place", r), ("in-place", r.get("in_place"))):
            if not figure:
                continue
            # The run's measurement errors name no row: the first row carries them.
            row_errors = errors if placement == "out-of-place" and not rows else []
            rows.append(
                rd.make_row(
                    op=run.get("op"),
                    size=r["size"],
                    count=r.get("count"),
                    dtype=run.get("dtype", "float32"),
                    algorithm=run.get("algo") or "default",
                    mode=_mode(run.get("timing")),
                    placement=placement,
                    world_size=run.get("world_size"),
                    launch=launch_id,
                    ours=rd.figure(
                        figure.get("time_us"),
                        figure.get("algbw"),
                        figure.get("busbw"),
                        **{k: figure[k] for k in ("wall_us", "host_us") if k in figure},
                    ),
                    baselines=baselines if placement == "out-of-place" else [],
                    wrong=figure.get("wrong"),
                    errors=row_errors,
                    details=details,
                )
            )
    return rows


def _what(relative: str) -> str:
    name = relative.rsplit("/", 1)[-1]
    name = re.sub(r"\.(log|txt|json|jsonl|md)(\.gz)?$", "", name)
    name = _COMMIT_IN_NAME.sub("", name)
    name = re.sub(r"^gpu-check-", "check-", name)
    name = re.sub(r"(gpu-)?(h200|h100)(-x\d)?-?", "", name)
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "run"


# Asides of old commit subjects about how a run was organised, not about the code.
_WORKPLACE_ASIDE = re.compile(r"\s*\((?:[^()]*\b(?:session|lent|issue \d+)\b[^()]*)\)", re.I)
_MACHINE_KIND = re.compile(
    r"\bnvidia-h[12]00-x([1248])\b|(?<![-\w/.])x([1248])(?![-\w/.])|\bnvidia-h[12]00()\b"
)
_WORKPLACE_WORDS = re.compile(r"\b(?:\w+ session|session|lent|lending|issue \d+)\b", re.I)


def _subject(commit: str) -> str:
    """The subject of the commit, without asides on how its run was organised."""
    text = subprocess.run(
        ["git", "log", "-1", "--format=%s", commit],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    text = re.sub(r"\s+", " ", text)
    text = _WORKPLACE_ASIDE.sub("", text)
    text = _MACHINE_KIND.sub(lambda m: f"{m.group(1) or m.group(2) or '1'}-GPU", text)
    text = _WORKPLACE_WORDS.split(text)[0].rstrip(" ,;:(")
    return (text[:110] + "…") if len(text) > 111 else (text or "(commit not in this history)")


def _full_commit(commit: str) -> str:
    out = subprocess.run(
        ["git", "rev-parse", "--verify", "--quiet", commit + "^{commit}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return out or commit


def convert_file(path: Path) -> tuple[list, str | None]:
    """The documents of one raw file, or ([], why it is left out)."""
    relative = path.relative_to(RAW).as_posix()
    if relative in DUPLICATES:
        return [], f"repeats the tables of {DUPLICATES[relative]}"
    context, launches, devices, json_runs = LogContext(), [], [], []
    if path.name.endswith((".json", ".jsonl")):
        try:
            json_runs = load_json_runs(path)
        except (ValueError, KeyError) as exc:
            return [], f"not a --json document ({exc})"
        json_runs = [r for r in json_runs if isinstance(r, dict) and "rows" in r and "op" in r]
        if not json_runs:
            return [], "holds no timed rows of an ipcshare command"
        devices = [d for d in json_runs[0].get("devices") or [] if d.startswith("cuda")]
    else:
        context, launches = parse_log(read_text(path))
        if not launches:
            return [], "holds no timed table"
    found = commit_of(relative)
    if found is None:
        return [], "timed, but no commit in its name, its folder or the run's summary"
    commit, source, overrides, table_algorithms = found
    if json_runs:
        twin = _log_of_the_same_launches(path, commit, json_runs)
        if twin:
            return [], f"the same {len(json_runs)} launches as {twin}, which is converted"
    m = _DATE_IN_NAME.search(relative)
    if context.date_time:
        date, date_note = context.date_time, None
    else:
        day = m.group(1) if m else _date_committed(path)
        if day is None:
            return [], "timed, but no date in the output, its name or the history of the file"
        date = f"{day}T00:00:00Z"
        date_note = (
            "the day from the folder name; the raw output carries no time"
            if m
            else "the day the raw file was committed; the raw output carries no date"
        )
    machine, machine_notes = machine_of(path, commit, context, devices)
    statuses = _step_statuses(
        [read_text(p) for p in _context_files(path, commit) if p.suffix in (".log", ".txt", ".gz")]
    )
    by_commit: dict = {}
    skipped = []
    for index, launch in enumerate(launches):
        launch_commit = commit
        for prefix, other in overrides.items():
            if launch.step.startswith(prefix):
                launch_commit = other
        if launch_commit is None:
            skipped.append(launch.step)
            continue
        launch_id = f"{relative}#{index + 1}" + (f" ({launch.step})" if launch.step else "")
        algorithm = (
            table_algorithms[index] if table_algorithms and index < len(table_algorithms) else None
        )
        if launch.kind == "moe-step":
            rows = rows_of_moe(launch, launch_id)
        else:
            rows = rows_of_table(
                launch, launch_id, _algorithm(launch.step, launch.command, algorithm, path.name)
            )
        if launch.step in statuses:
            for row in rows:
                row.setdefault("details", {})["step_exit_status"] = statuses[launch.step]
        entry = by_commit.setdefault(launch_commit, {"rows": [], "steps": []})
        entry["rows"].extend(rows)
        entry["steps"].append(launch.step)
    for index, run in enumerate(json_runs):
        entry = by_commit.setdefault(commit, {"rows": [], "steps": []})
        entry["rows"].extend(rows_of_json(run, f"{relative}#{index + 1}"))
    documents = []
    for each_commit, entry in by_commit.items():
        rows = entry["rows"]
        if not rows:
            continue
        note = (
            source
            if each_commit == commit
            else (
                f"steps of this file that ran another tree ({each_commit}), as the run's summary "
                "names it; the raw output carries no commit"
            )
        )
        step_codes = [statuses[s] for s in entry["steps"] if s in statuses]
        from_rows = (
            3 if any(r["wrong"] for r in rows) else (5 if any(r["errors"] for r in rows) else 0)
        )
        exit_status = max(step_codes + [from_rows])
        extra = {
            "raw": [f"docs/bench/{relative}"],
            "converted_by": "tools/convert_bench_results.py",
            "commit_from": note,
            "commit_subject": _subject(each_commit),
            "exit_status_from": (
                "the run's step lines"
                if len(step_codes) == len(entry["steps"]) and step_codes
                else "the rows (wrong elements: 3, measurement errors: 5); "
                "the raw output does not record it for every step"
            ),
        }
        if date_note:
            extra["date_from"] = date_note
        if machine_notes:
            extra["machine_from"] = machine_notes
        documents.append(
            rd.make_document(
                tool=_tool(relative, json_runs),
                version="0.1.0",
                commit={"id": _full_commit(each_commit), "dirty": None, "source": "unknown"},
                machine=machine,
                command=_command(launches, json_runs, entry["steps"]),
                exit_status=exit_status,
                world_size=max(r["world_size"] for r in rows),
                rows=rows,
                date=date,
                extra=extra,
            )
        )
    why = f"steps of an unrecorded tree left out: {', '.join(skipped)}" if skipped else None
    return documents, why


def _same_figures(run: dict, table: Launch) -> bool:
    """A `--json` launch and a printed table hold the same figures (the table prints two
    decimals of the JSON's three)."""
    if len(run.get("rows", [])) != len(table.rows):
        return False
    for row, printed in zip(run["rows"], table.rows, strict=True):
        ours = printed.get("out-of-place") or printed.get("ring") or {}
        if str(row["size"]) != printed.get("size") or _number(ours.get("time")) is None:
            return False
        if abs(row["time_us"] - _number(ours["time"])) > 0.0051:
            return False
    return True


def _log_of_the_same_launches(path: Path, commit: str, runs: list) -> str | None:
    """The log that printed the launches a `--json` lines file holds, where there is one:
    the same call of a dated folder, or the gpu-check log of the same commit, with as many
    tables. The log is converted instead: it names each step and its exit status."""
    relative = path.relative_to(RAW).as_posix()
    step = re.match(r"(.*/)(\d+)-", relative)
    if step:
        candidates = sorted((RAW / step.group(1)).glob(step.group(2) + "-*"))
    else:
        candidates = sorted(RAW.glob(f"gpu-check-*{commit}*.log"))
    for candidate in candidates:
        if candidate == path or not re.search(r"\.(log|txt)(\.gz)?$", candidate.name):
            continue
        tables = [t for t in parse_log(read_text(candidate))[1] if t.kind == "table"]
        if len(tables) == len(runs) and all(map(_same_figures, runs, tables)):
            return candidate.relative_to(RAW).as_posix()
    return None


def _tool(relative: str, json_runs: list) -> str:
    if json_runs:
        return "ipcshare " + ("bench" if "bench" in relative else json_runs[0].get("op", ""))
    return "tools/gpu-check.sh" if "gpu-check" in relative else "ipcshare"


def _command(launches: list, json_runs: list, steps: list) -> str:
    if json_runs:
        return (
            "ipcshare "
            + (json_runs[0].get("op") or "bench")
            + " --json (the command line is not recorded)"
        )
    steps = [s for s in dict.fromkeys(steps) if s]
    if steps:
        return "tools/gpu-check.sh steps: " + "; ".join(steps)
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
    """docs/results/<machine>/<date>-<commit>-<what>.json"""
    raw = document["extra"]["raw"][0].removeprefix("docs/bench/")
    what = _what(raw)
    folder = raw.split("/")[0]
    if "/" in raw and not re.search(r"\d{4}-\d\d-\d\d", folder):
        what = f"{_what(folder)}-{what}"
    name = f"{document['date'][:10]}-{document['commit']['id'][:7]}-{what}.json"
    return OUT / machine_dir(document["machine"]) / name


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
            rd.write(target, document)
            written += 1
    print(f"{written} documents written under {OUT.relative_to(ROOT)}")
    for path, why in left_out:
        print(f"left out {path.relative_to(ROOT)}: {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
