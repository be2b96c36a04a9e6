"""Parse the raw output committed under docs/bench/ into launches and rows.

The raw output is what `ipcshare` commands, `ipcshare bench --json`, `tools/gpu-check.sh`
(the shell script before tools/gpu_check.py) and `examples/moe_step_bench.py` printed: nccl-tests style tables headed `# ipcshare ... op: ...`,
JSON documents and JSON lines, Markdown tables of the MoE step. Each table is one launch: its
figures (ours and the baseline beside it) were timed by one `mpiexec`, and only figures of one
launch are compared with each other.

Numbers are kept as the text printed them (strings such as "395.55"), so that what a document
holds is exactly what the run printed; `float()` of them is for sorting and comparing only.
"""

from __future__ import annotations

import gzip
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

_STEP = re.compile(r"^===== (?P<title>.*?)(?: \((?P<time>\d\d:\d\d:\d\d)(?:, limit \d+s?)?\))?\s*$")
_RUN_HEADER = re.compile(r"^===== gpu-check .* at (?P<date>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)")
_TABLE_HEADER = re.compile(r"^# ipcshare \S+\s+(?P<fields>.*)$")
_HEADER_FIELD = re.compile(r"^(\w[\w-]*): (.+)$")
_DRIVER = re.compile(r"Driver Version: (?P<driver>\S+)\s+CUDA Version: (?P<cuda>\S+)")
_SMI_GPU = re.compile(r"^\|\s+(?P<index>\d+)\s+(?P<name>NVIDIA [^|]*?)\s{2,}(?:On|Off)\s+\|")
_TORCH = re.compile(r"^torch\s+(?P<version>\d+\.\d+\.\d+\S*)\s*$")
_TORCH_NCCL = re.compile(r"^torch cuda \S+ nccl \((?P<nccl>\d+), (?P<minor>\d+), (?P<patch>\d+)\)")
_TOPOLOGY_ROW = re.compile(r"^GPU0\s+X\s+(?P<link>NV\d+|SYS|NODE|PHB|PXB|PIX)")
_MEASUREMENT_ERRORS = re.compile(r"^# Measurement errors\s*:\s*(?P<count>\d+)")
_MOE_TITLE = re.compile(
    r"### MoE step: (?P<tokens>\d+) tokens x (?P<hidden>\d+) (?P<dtype>\w+) per rank, "
    r"(?P<experts>\d+) experts(?: \(top-(?P<top>\d+)\))? on (?P<ranks>\d+) rank"
)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass
class Launch:
    """One table: figures timed together by one launch."""

    step: str
    command: str
    header: dict
    columns: list
    groups: list
    rows: list = field(default_factory=list)
    measurement_errors: int | None = None
    kind: str = "table"


@dataclass
class LogContext:
    """What a log says about its machine and date, outside its tables."""

    date_time: str | None = None
    gpus: list = field(default_factory=list)
    driver: str | None = None
    cuda: str | None = None
    torch: str | None = None
    nccl: str | None = None
    link: str | None = None


def read_text(path: Path) -> str:
    """The text of a raw file, gunzipped where it ends in .gz, ANSI colours removed."""
    data = gzip.open(path, "rb").read() if path.suffix == ".gz" else path.read_bytes()
    return _ANSI.sub("", data.decode("utf-8", errors="replace"))


def _groups(group_line: str, columns: list) -> list:
    """Name each column of a table by the group its header line puts above it.

    A table's columns are `size count type` then one group per timing: `out-of-place`,
    `in-place`, `ring` (ours) and `<label> baseline`; each group starts at a `time` column.
    Columns after the last group's `#wrong` (speedup, path, p95) belong to the baseline.
    """
    text = group_line.lstrip("#").strip()
    names = []
    for ours in ("out-of-place", "in-place", "ring"):
        if re.search(rf"(^|\s){ours}(\s|$)", text):
            names.append((text.index(ours), ours))
    baseline = re.search(r"(\S.*?)\s+baseline\s*$", text)
    if baseline:
        label = baseline.group(1)
        for ours in ("out-of-place", "in-place", "ring"):
            label = label.replace(ours, "").strip()
        names.append((text.index(label) if label in text else len(text), "baseline:" + label))
    names = [name for _, name in sorted(names)]
    groups, index = [], -1
    for column in columns:
        if column == "time":
            index += 1
        groups.append(names[index] if 0 <= index < len(names) else "common")
    return groups


def parse_log(text: str) -> tuple[LogContext, list]:
    """The machine context and every launch (table, MoE step) of one log's text."""
    context = LogContext()
    launches: list[Launch] = []
    step, command = "", ""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if (m := _RUN_HEADER.match(line)) and context.date_time is None:
            context.date_time = m.group("date")
        if (m := _DRIVER.search(line)) and context.driver is None:
            context.driver, context.cuda = m.group("driver"), m.group("cuda")
        if (m := _SMI_GPU.match(line)) and not any(g[0] == m.group("index") for g in context.gpus):
            context.gpus.append((m.group("index"), m.group("name").strip()))
        if (m := _TORCH.match(line)) and context.torch is None:
            context.torch = m.group("version")
        if (m := _TORCH_NCCL.match(line)) and context.nccl is None:
            context.nccl = ".".join(m.group("nccl", "minor", "patch"))
        if (m := _TOPOLOGY_ROW.match(line.strip())) and context.link is None:
            context.link = m.group("link")
        if (m := _STEP.match(line)) and not line.startswith("===== gpu-check "):
            if "MPI Information" not in line and not set(m.group("title")) <= set("= "):
                step, command = m.group("title").strip(), ""
        elif line.startswith("+ "):
            command = line[2:].strip()
        if m := _MOE_TITLE.search(line):
            launch, i = _parse_moe(lines, i, m, step, command)
            if launch:
                launches.append(launch)
            continue
        if m := _TABLE_HEADER.match(line):
            launch, i = _parse_table(lines, i, m, step, command)
            if launch:
                launches.append(launch)
            continue
        i += 1
    return context, launches


def _parse_table(lines: list, i: int, header_match, step: str, command: str):
    # Fields are `key: value`, two spaces apart; a value may hold single spaces.
    fields = re.split(r"\s{2,}", header_match.group("fields").strip())
    header = dict(m.groups() for f in fields if (m := _HEADER_FIELD.match(f)))
    j = i + 1
    while j < len(lines) and lines[j].startswith("#") and not re.match(r"#\s+size\s", lines[j]):
        if lines[j].startswith("# ipcshare "):
            return None, j
        j += 1
    if j >= len(lines) or not lines[j].startswith("#"):
        return None, j
    columns = lines[j].lstrip("#").split()
    groups = _groups(lines[j - 1], columns)
    launch = Launch(step=step, command=command, header=header, columns=columns, groups=groups)
    j += 2  # the units line
    closing = False  # past the table's trailer (`# Out of bounds`, `# Avg bus bandwidth`)
    while j < len(lines):
        line = lines[j]
        if m := _MEASUREMENT_ERRORS.match(line):
            launch.measurement_errors = int(m.group("count"))
            j += 1
            break
        if line.startswith("# ipcshare ") or line.startswith("====="):
            break
        stripped = line.strip()
        if stripped.startswith(("# Out of bounds", "# Avg bus bandwidth")):
            closing = True
        elif closing and not stripped.startswith("# "):
            break
        cells = line.split()
        if (
            not closing
            and cells
            and cells[0].isdigit()
            and len(columns) - 1 <= len(cells) <= len(columns)
        ):
            launch.rows.append(_row(cells, columns, groups))
        j += 1
    return (launch if launch.rows else None), j


def _row(cells: list, columns: list, groups: list) -> dict:
    row: dict = {}
    for cell, column, group in zip(cells, columns, groups):
        if group == "common":
            row[column] = cell
        else:
            row.setdefault(group, {})[column] = cell
    return row


def _parse_moe(lines: list, i: int, match, step: str, command: str):
    """A MoE step's Markdown table: one row per version, all timed in one launch."""
    header = {
        "op": "moe-step",
        "ranks": match.group("ranks"),
        "experts": match.group("experts"),
        "top": match.group("top") or "1",
        "tokens": match.group("tokens"),
        "hidden": match.group("hidden"),
        "dtype": match.group("dtype"),
    }
    j = i + 1
    while j < len(lines) and not lines[j].startswith("| version"):
        if j - i > 6:
            return None, i + 1
        j += 1
    columns = [c.strip() for c in lines[j].strip().strip("|").split("|")]
    launch = Launch(
        step=step, command=command, header=header, columns=columns, groups=[], kind="moe-step"
    )
    j += 2
    while j < len(lines) and lines[j].startswith("| "):
        cells = [c.strip() for c in lines[j].strip().strip("|").split("|")]
        launch.rows.append(dict(zip(columns, cells)))
        j += 1
    return (launch if launch.rows else None), j


def load_json_runs(path: Path) -> list:
    """The `--json` documents of a .json or .jsonl file (a list, one per launch)."""
    text = read_text(path)
    if path.name.endswith(".jsonl"):
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    data = json.loads(text)
    return data if isinstance(data, list) else [data]
