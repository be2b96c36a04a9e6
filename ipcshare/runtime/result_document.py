"""The result document: one versioned JSON file that says everything a published figure
needs (commit, machine, date, command, exit status, and per row ours and each baseline
timed in the same launch). Pure data: the callers gather the facts and pass them in.

The schema is data too (``DOCUMENT_FIELDS``, ``MACHINE_FIELDS``, ...): ``validate`` walks
it, and docs/CLI.md's field table is checked against it by a test.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import re
import secrets
import shlex
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["SCHEMA", "MODES", "PLACEMENTS", "COMMIT_SOURCES", "Field", "DOCUMENT_FIELDS",
           "COMMIT_FIELDS", "MACHINE_FIELDS", "ROW_FIELDS", "FIGURE_FIELDS",
           "BASELINE_FIELDS", "DocumentError", "unknown_commit", "utc_now", "new_launch_id",
           "figure", "baseline_figure", "make_row", "make_document", "validate", "write",
           "load", "document_exit_status", "command_line"]

SCHEMA = "ipcshare.result/1"
MODES = ("eager", "graph", "latency")
PLACEMENTS = ("out-of-place", "in-place")
COMMIT_SOURCES = ("git", "given", "package", "unknown")
_DATE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")


class DocumentError(ValueError):
    """A result document that does not follow the schema; the message names the field
    (``rows[3].ours.time_us: expected a number or null, got 'fast'``)."""


@dataclass(frozen=True)
class Field:
    """One key of the schema: its JSON types (``"str"``, ``"int"``, ``"number"``,
    ``"bool"``, ``"null"``, ``"list"``, ``"object"``), whether it must be present, and
    what it means (the docs' table)."""

    name: str
    types: tuple[str, ...]
    required: bool
    meaning: str


def _f(name: str, types: str, meaning: str, *, required: bool = True) -> Field:
    return Field(name, tuple(types.split("|")), required, meaning)


DOCUMENT_FIELDS = (
    _f("schema", "str", f'"{SCHEMA}": the schema and its version'),
    _f("tool", "str", "what wrote it: `ipcshare allreduce`, `ipcshare bench`, "
                      "`examples/allreduce_oneshot.py`, a probe's path"),
    _f("ipcshare", "str", "the package version"),
    _f("commit", "object", "the code that ran (below)"),
    _f("machine", "object", "the machine it ran on (below)"),
    _f("date", "str", "when it ended, UTC ISO 8601 (`2026-12-06T06:50:12Z`)"),
    _f("command", "str", "the command line, with `mpiexec -n N` where ranks were launched"),
    _f("exit_status", "int", "the command's exit status (docs/CLI.md, Exit status)"),
    _f("world_size", "int", "ranks of the launch"),
    _f("rows", "list", "the figures (below), in the order they were timed"),
    _f("wrong_total", "int|null", "wrong elements over every row, ours and baselines; "
                                  "null when nothing was verified (`-c 0`)"),
    _f("measurement_errors", "list", "every row's measurement errors (timer cross-check, "
                                     "ceiling), and the run's own"),
    _f("extra", "object", "what the tool says beyond the schema (backend, splits, "
                          "its own JSON ...)", required=False),
)
COMMIT_FIELDS = (
    _f("id", "str", 'the full commit hash, or "unknown"'),
    _f("dirty", "bool|null", "the tree had uncommitted changes; null when unknown"),
    _f("source", "str", "`git` (a checkout), `given` (IPCSHARE_SOURCE_COMMIT, on a copy "
                        "of the tree without its git folder), `package` (the commit "
                        "recorded in the installed package) or `unknown`"),
)
MACHINE_FIELDS = (
    _f("hostname", "str", "the host of rank 0"),
    _f("host_cpus", "int", "CPUs of that host"),
    _f("gpu_model", "str|null", "the GPUs' model (`NVIDIA H200`); null without GPUs"),
    _f("gpu_count", "int", "GPUs visible to the launch"),
    _f("links", "str|null", "how the GPUs connect (`NVLink 4: 18 links per GPU, all pairs`)"),
    _f("driver", "str|null", "the NVIDIA driver version"),
    _f("cuda", "str|null", "the CUDA version the driver supports"),
    _f("nccl", "str|null", "the NCCL wheel's version"),
    _f("torch", "str|null", "torch's version, null where it is not installed"),
)
ROW_FIELDS = (
    _f("op", "str", "`allgather`, `allreduce`, `reducescatter`, `alltoall`, `ring`, or "
                    "what a probe measures"),
    _f("size", "int", "bytes, as nccl-tests counts them for the op"),
    _f("count", "int|null", "elements"),
    _f("dtype", "str|null", "the element type"),
    _f("algorithm", "str", "`--algo` as asked (`auto`, `ll`, ...), or the probe's variant"),
    _f("mode", "str", "`eager`, `graph` (CUDA-graph replays) or `latency` (median of "
                      "single calls)"),
    _f("placement", "str", "`out-of-place` or `in-place`"),
    _f("world_size", "int", "ranks that ran it"),
    _f("launch", "str", "id shared by every figure timed in the same launch: only figures "
                        "of one launch are compared"),
    _f("ours", "object|null", "ipcshare's figure (below); null where a probe times only a "
                              "baseline"),
    _f("baselines", "list", "each baseline timed beside it (below)"),
    _f("wrong", "int|null", "ours' wrong elements; null when not verified"),
    _f("errors", "list", "the row's measurement errors, ours' and the baselines'"),
    _f("details", "object", "the row's other facts (backend, splits, registered, "
                            "ceiling ...)", required=False),
)
FIGURE_FIELDS = (
    _f("time_us", "number|null", "microseconds per operation (the median in latency "
                                 "mode); null where the result was wrong"),
    _f("algbw", "number|null", "GB/s, size / time"),
    _f("busbw", "number|null", "GB/s, nccl-tests' bus bandwidth"),
    _f("p5_us", "number", "latency mode: 5th percentile", required=False),
    _f("p95_us", "number", "latency mode: 95th percentile", required=False),
    _f("wall_us", "number", "the second clock's reading", required=False),
    _f("host_us", "number", "host time per call (eager)", required=False),
)
BASELINE_FIELDS = (
    _f("name", "str", "`nccl`, `torch`, `torch-symm`, `mpi`, ..."),
    *FIGURE_FIELDS,
    _f("wrong", "int|null", "its wrong elements; a wrong baseline carries no time"),
    _f("error", "str|null", "its measurement error, if any"),
    _f("version", "str", "its library's version", required=False),
    _f("path", "str", "which of its paths gave the figure (NCCL `plain` / `symmetric`)",
       required=False),
)

_TYPE_NAMES = {"str": "a string", "int": "an integer", "number": "a number",
               "bool": "true or false", "null": "null", "list": "a list",
               "object": "an object"}


def _has_type(value: Any, kind: str) -> bool:
    if kind == "str":
        return isinstance(value, str)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return (isinstance(value, (int, float)) and not isinstance(value, bool)
                and math.isfinite(value))
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "null":
        return value is None
    if kind == "list":
        return isinstance(value, list)
    return isinstance(value, dict)


def _check_fields(value: Any, fields: Sequence[Field], where: str, *,
                  open_keys: bool = False) -> None:
    if not isinstance(value, dict):
        raise DocumentError(f"{where or 'document'}: expected an object, got "
                            f"{type(value).__name__}")
    prefix = f"{where}." if where else ""
    known = {field.name for field in fields}
    for field in fields:
        if field.name not in value:
            if field.required:
                raise DocumentError(f"{prefix}{field.name}: missing")
            continue
        item = value[field.name]
        if not any(_has_type(item, kind) for kind in field.types):
            wanted = " or ".join(_TYPE_NAMES[kind] for kind in field.types)
            raise DocumentError(f"{prefix}{field.name}: expected {wanted}, got {item!r}")
    unknown = sorted(set(value) - known)
    if unknown and not open_keys:
        raise DocumentError(f"{prefix}{unknown[0]}: not a field of {SCHEMA} (put a tool's "
                            "own facts under extra or details)")


def _check_non_negative(value: Any, where: str) -> None:
    if value is not None and value < 0:
        raise DocumentError(f"{where}: must not be negative, got {value!r}")


def _check_one_of(value: str, choices: Sequence[str], where: str) -> None:
    if value not in choices:
        raise DocumentError(f"{where}: expected one of {', '.join(choices)}, got {value!r}")


def _check_figure(value: Any, fields: Sequence[Field], where: str) -> None:
    _check_fields(value, fields, where)
    for name in ("time_us", "algbw", "busbw", "p5_us", "p95_us", "wall_us", "host_us",
                 "wrong"):
        if name in value:
            _check_non_negative(value[name], f"{where}.{name}")
    if value.get("time_us") == 0:
        raise DocumentError(f"{where}.time_us: must be positive (null when not timed)")


def _check_row(row: Any, where: str) -> None:
    _check_fields(row, ROW_FIELDS, where)
    for name in ("op", "algorithm", "launch"):
        if not row[name]:
            raise DocumentError(f"{where}.{name}: must not be empty")
    _check_one_of(row["mode"], MODES, f"{where}.mode")
    _check_one_of(row["placement"], PLACEMENTS, f"{where}.placement")
    for name in ("size", "count", "wrong"):
        _check_non_negative(row[name], f"{where}.{name}")
    if row["world_size"] < 1:
        raise DocumentError(f"{where}.world_size: must be at least 1, got {row['world_size']}")
    if row["ours"] is None and not row["baselines"]:
        raise DocumentError(f"{where}: no figure (ours is null and baselines is empty)")
    if row["ours"] is not None:
        _check_figure(row["ours"], FIGURE_FIELDS, f"{where}.ours")
    for j, baseline in enumerate(row["baselines"]):
        here = f"{where}.baselines[{j}]"
        _check_figure(baseline, BASELINE_FIELDS, here)
        if not baseline["name"]:
            raise DocumentError(f"{here}.name: must not be empty")
        if baseline["wrong"] and baseline["time_us"] is not None:
            raise DocumentError(f"{here}.time_us: a baseline with {baseline['wrong']} wrong "
                                "elements carries no time (null)")
    for j, error in enumerate(row["errors"]):
        if not isinstance(error, str) or not error:
            raise DocumentError(f"{where}.errors[{j}]: expected a non-empty string, "
                                f"got {error!r}")
    if "details" in row and not isinstance(row["details"], dict):
        raise DocumentError(f"{where}.details: expected an object")


def _counted_wrong(rows: Sequence[Mapping[str, Any]]) -> int | None:
    counts = [row["wrong"] for row in rows]
    counts += [b["wrong"] for row in rows for b in row["baselines"]]
    known = [count for count in counts if count is not None]
    return sum(known) if known else (None if counts else 0)


def validate(document: Any) -> dict[str, Any]:
    """Check ``document`` against the schema and return it.

    Beyond each field's type: the schema's name and version, the date's form, every
    row's mode and placement, non-negative sizes and figures, a wrong baseline without a
    time, ``wrong_total`` equal to the rows' wrong elements, and an exit status of 0 only
    where nothing was wrong and nothing mismeasured.

    Raises:
        DocumentError: the first field that breaks the schema, named by its path.
    """
    _check_fields(document, DOCUMENT_FIELDS, "")
    if document["schema"] != SCHEMA:
        raise DocumentError(f"schema: expected {SCHEMA!r}, got {document['schema']!r}")
    _check_fields(document["commit"], COMMIT_FIELDS, "commit")
    _check_one_of(document["commit"]["source"], COMMIT_SOURCES, "commit.source")
    if not document["commit"]["id"]:
        raise DocumentError('commit.id: must not be empty (say "unknown")')
    _check_fields(document["machine"], MACHINE_FIELDS, "machine")
    for name in ("gpu_count", "host_cpus"):
        _check_non_negative(document["machine"][name], f"machine.{name}")
    if not _DATE.match(document["date"]):
        raise DocumentError(f"date: expected UTC ISO 8601 such as 2026-12-06T06:50:12Z, "
                            f"got {document['date']!r}")
    if not document["command"]:
        raise DocumentError("command: must not be empty")
    if document["world_size"] < 1:
        raise DocumentError(f"world_size: must be at least 1, got {document['world_size']}")
    for i, row in enumerate(document["rows"]):
        _check_row(row, f"rows[{i}]")
    for j, error in enumerate(document["measurement_errors"]):
        if not isinstance(error, str) or not error:
            raise DocumentError(f"measurement_errors[{j}]: expected a non-empty string, "
                                f"got {error!r}")
    counted = _counted_wrong(document["rows"])
    if document["wrong_total"] != counted:
        raise DocumentError(f"wrong_total: {document['wrong_total']!r}, but the rows count "
                            f"{counted!r}")
    if document["exit_status"] == 0 and document["wrong_total"]:
        raise DocumentError(f"exit_status: 0, but wrong_total is {document['wrong_total']}")
    for i, row in enumerate(document["rows"]):
        for error in row["errors"]:
            if error not in document["measurement_errors"]:
                raise DocumentError(f"measurement_errors: lacks rows[{i}]'s {error!r}")
    if document["exit_status"] == 0 and document["measurement_errors"]:
        raise DocumentError("exit_status: 0, but the document lists measurement errors")
    return document


def document_exit_status(document: Mapping[str, Any]) -> int:
    """The exit status a document stands for: its own, or 3 (wrong data) / 5 (a
    measurement error) when it holds either under a status of 0 (a document written by
    hand or by a tool that missed them; ``validate`` refuses those, a reader of many
    documents may still meet one)."""
    status = int(document.get("exit_status", 1))
    if status == 0 and document.get("wrong_total"):
        return 3
    if status == 0 and document.get("measurement_errors"):
        return 5
    return status


def unknown_commit() -> dict[str, Any]:
    """The commit of code whose origin cannot be told."""
    return {"id": "unknown", "dirty": None, "source": "unknown"}


def utc_now() -> str:
    """Now, as the document's ``date`` spells it."""
    now = datetime.datetime.now(datetime.timezone.utc)
    return now.strftime("%Y-%m-%dT%H:%M:%SZ")


def new_launch_id() -> str:
    """A fresh launch id: the UTC time and 8 random hex digits (``20261206T065012-3fa9c1d2``),
    unique across machines without coordination."""
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S")
    return f"{now}-{secrets.token_hex(4)}"


def command_line(argv: Sequence[str], world_size: int = 1) -> str:
    """The command as a reader would type it again: ``argv`` quoted for a shell, behind
    ``mpiexec -n N`` where more than one rank ran."""
    text = " ".join(shlex.quote(str(arg)) for arg in argv)
    return f"mpiexec -n {world_size} {text}" if world_size > 1 else text


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(float(value), 3)


def figure(time_us: float | None, algbw: float | None = None, busbw: float | None = None,
           **optional: float | None) -> dict[str, Any]:
    """Ours: ``{"time_us", "algbw", "busbw"}`` rounded to 3 decimals, with the optional
    ``p5_us``, ``p95_us``, ``wall_us``, ``host_us`` where given (not None)."""
    data = {"time_us": _rounded(time_us), "algbw": _rounded(algbw), "busbw": _rounded(busbw)}
    data.update({k: _rounded(v) for k, v in optional.items() if v is not None})
    return data


def baseline_figure(name: str, time_us: float | None, algbw: float | None = None,
                    busbw: float | None = None, *, wrong: int | None = 0,
                    error: str | None = None, version: str | None = None,
                    path: str | None = None, **optional: float | None) -> dict[str, Any]:
    """One baseline's figure; a wrong one carries no time or bandwidth."""
    data: dict[str, Any] = {"name": name}
    data.update(figure(None, None, None) if wrong else figure(time_us, algbw, busbw,
                                                              **optional))
    data.update(wrong=wrong, error=error)
    if version is not None:
        data["version"] = version
    if path is not None:
        data["path"] = path
    return data


def make_row(*, op: str, size: int, algorithm: str, mode: str, world_size: int, launch: str,
             ours: Mapping[str, Any] | None, baselines: Iterable[Mapping[str, Any]] = (),
             wrong: int | None = 0, count: int | None = None, dtype: str | None = None,
             placement: str = "out-of-place", errors: Iterable[str] = (),
             details: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """One row of the document (not validated here: ``make_document`` does)."""
    row: dict[str, Any] = {
        "op": op, "size": int(size), "count": None if count is None else int(count),
        "dtype": dtype, "algorithm": algorithm, "mode": mode, "placement": placement,
        "world_size": int(world_size), "launch": launch,
        "ours": None if ours is None else dict(ours),
        "baselines": [dict(b) for b in baselines], "wrong": wrong, "errors": list(errors)}
    if details:
        row["details"] = dict(details)
    return row


def make_document(*, tool: str, version: str, commit: Mapping[str, Any],
                  machine: Mapping[str, Any], command: str, exit_status: int, world_size: int,
                  rows: Iterable[Mapping[str, Any]], measurement_errors: Iterable[str] = (),
                  date: str | None = None, extra: Mapping[str, Any] | None = None
                  ) -> dict[str, Any]:
    """A whole document, validated: ``wrong_total`` is counted from the rows and
    ``measurement_errors`` holds the rows' errors followed by the run's own (those
    ``measurement_errors`` names that no row holds).

    Raises:
        DocumentError: a field breaks the schema.
    """
    rows = [dict(row) for row in rows]
    errors = list(dict.fromkeys([*(error for row in rows for error in row.get("errors", ())),
                                 *measurement_errors]))
    document: dict[str, Any] = {
        "schema": SCHEMA, "tool": tool, "ipcshare": version, "commit": dict(commit),
        "machine": dict(machine), "date": date or utc_now(), "command": command,
        "exit_status": int(exit_status), "world_size": int(world_size), "rows": rows,
        "wrong_total": _counted_wrong(rows),
        "measurement_errors": errors}
    if extra:
        document["extra"] = dict(extra)
    return validate(document)


def write(path: str | os.PathLike[str], document: Mapping[str, Any]) -> None:
    """Validate ``document`` and write it to ``path`` atomically (a temporary file in the
    same folder, renamed over it): a reader sees the old file or the whole new one.

    Raises:
        DocumentError: the document breaks the schema (nothing is written).
        OSError: the folder cannot be written.
    """
    validate(document)
    target = Path(path)
    handle, temporary = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent or ".")
    try:
        os.fchmod(handle, 0o644)   # a published file, not mkstemp's private 0600
        with os.fdopen(handle, "w") as out:
            json.dump(document, out, indent=1)
            out.write("\n")
        os.replace(temporary, target)
    except BaseException:
        try:
            os.unlink(temporary)
        except FileNotFoundError:
            pass
        raise


def load(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The validated document at ``path``.

    Raises:
        DocumentError: not JSON, or not a document of this schema (the message starts
            with the path).
        OSError: the file cannot be read.
    """
    text = Path(path).read_text()
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise DocumentError(f"{path}: not JSON ({error.msg}, line {error.lineno})") from None
    try:
        return validate(document)
    except DocumentError as error:
        raise DocumentError(f"{path}: {error}") from None
