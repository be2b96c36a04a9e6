"""Measured rows and the JSON document of ``--json`` (its keys are a contract:
docs/CLI.md)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["Measurement", "Row", "BaselineResult", "RunResult", "read_result_lines"]


def read_result_lines(path: Path) -> list[dict[str, Any]]:
    """The documents of a JSON-lines file of results (``--json`` documents one a line, as
    tools/gpu_check.py gathers them in results.jsonl), empty lines left out.

    Raises:
        ValueError: a line that is not JSON, named by file and line.
    """
    documents = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            documents.append(json.loads(line))
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}:{number}: not JSON ({error.msg})") from None
    return documents


@dataclasses.dataclass
class Measurement:
    """One timed variant of one size.

    In latency timing ``time_us`` is the median of the samples and ``p5_us`` / ``p95_us``
    their 5th and 95th percentiles; over repetitions (``bench --repeat``) the fields are
    medians and the ranges hold the smallest and largest value seen.
    """

    time_us: float
    algbw: float
    busbw: float
    wrong: int
    p5_us: float | None = None
    p95_us: float | None = None
    time_us_range: tuple[float, float] | None = None
    busbw_range: tuple[float, float] | None = None
    # Which of a baseline's paths gave this figure (its fastest: NCCL's "plain" or
    # "symmetric", symmetric memory's "one-shot" or "two-shot"); None where it has one.
    path: str | None = None
    # Eager nccl-tests timing: the host's microseconds per call spent issuing the calls
    # (for GPU operations, what Python and the launch cost; time_us is the wall time).
    host_us: float | None = None
    # The second clock per operation (host clock from the first enqueue to a full
    # synchronize, averaged over ranks as time_us is; the median sample in latency
    # timing), and the row's measurement errors (clock_check.py): a figure with errors
    # is not a result.
    wall_us: float | None = None
    errors: list[str] = dataclasses.field(default_factory=list)
    # How many times the row's stretch was timed again, on every rank, because the two
    # clocks disagreed on some rank and a host hiccup may have been the cause
    # (clock_check.agreed_stretch); errors hold what still disagreed after that.
    clock_rechecks: int = 0
    # A baseline's paths whose results were wrong, with their wrong elements: never its
    # figure (the fastest right path is), but said.
    wrong_paths: dict[str, int] = dataclasses.field(default_factory=dict)

    @property
    def usable(self) -> bool:
        """Whether the figure may be compared: verified right and measured right."""
        return self.wrong == 0 and not self.errors and self.time_us > 0

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"time_us": round(self.time_us, 3), "algbw": round(self.algbw, 3),
                                "busbw": round(self.busbw, 3), "wrong": self.wrong}
        if self.p5_us is not None and self.p95_us is not None:
            data.update(p5_us=round(self.p5_us, 3), p50_us=round(self.time_us, 3),
                        p95_us=round(self.p95_us, 3))
        if self.time_us_range is not None:
            data.update(time_us_min=round(self.time_us_range[0], 3),
                        time_us_max=round(self.time_us_range[1], 3))
        if self.busbw_range is not None:
            data.update(busbw_min=round(self.busbw_range[0], 3),
                        busbw_max=round(self.busbw_range[1], 3))
        if self.path is not None:
            data["path"] = self.path
        if self.host_us is not None:
            data["host_us"] = round(self.host_us, 3)
        if self.wall_us is not None:
            data["wall_us"] = round(self.wall_us, 3)
        if self.errors:
            data["errors"] = list(self.errors)
        if self.clock_rechecks:
            data["clock_rechecks"] = self.clock_rechecks
        if self.wrong_paths:
            data["wrong_paths"] = dict(self.wrong_paths)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Measurement:
        """The measurement that ``to_dict`` wrote (as another process reports it in its
        ``--json``).

        Raises:
            KeyError: ``data`` lacks time_us, algbw, busbw or wrong.
        """
        def bounds(name: str) -> tuple[float, float] | None:
            low, high = data.get(f"{name}_min"), data.get(f"{name}_max")
            return None if low is None or high is None else (low, high)

        # An unchecked run (-c 0) reports "wrong": null: none were counted.
        wrong = data["wrong"]
        return cls(time_us=data["time_us"], algbw=data["algbw"], busbw=data["busbw"],
                   wrong=0 if wrong is None else wrong, p5_us=data.get("p5_us"),
                   p95_us=data.get("p95_us"),
                   time_us_range=bounds("time_us"), busbw_range=bounds("busbw"),
                   path=data.get("path"), host_us=data.get("host_us"),
                   wall_us=data.get("wall_us"), errors=list(data.get("errors", ())),
                   wrong_paths=dict(data.get("wrong_paths", {})),
                   clock_rechecks=int(data.get("clock_rechecks", 0)))


@dataclasses.dataclass
class Row:
    """All variants of one size: ``modes`` maps a mode name to its measurement."""

    size: int
    count: int
    modes: dict[str, Measurement]
    # What the pattern says of the row beyond its figures (Pattern.row_facts), as JSON
    # keys of the row.
    facts: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def primary(self) -> Measurement:
        return next(iter(self.modes.values()))

    @property
    def wrong(self) -> int:
        return sum(m.wrong for m in self.modes.values())

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"size": self.size, "count": self.count, **self.primary.to_dict(),
                                **self.facts}
        if "in-place" in self.modes:
            data["in_place"] = self.modes["in-place"].to_dict()
        return data


@dataclasses.dataclass
class BaselineResult:
    """A baseline's rows, measured on the same sizes as ours; ``label`` says what it
    is in words (``NCCL through torch.distributed``)."""

    name: str
    version: str
    rows: list[Row]
    label: str = ""

    def to_dict(self) -> dict[str, Any]:
        rows = []
        for row in self.rows:
            data = {k: v for k, v in row.to_dict().items() if k != "count"}
            for measured in (data, data.get("in_place") or {}):
                if measured.get("wrong"):
                    # A wrong result has no time worth reading and is nobody's
                    # denominator: the document says so instead of giving figures.
                    measured.update(time_us=None, algbw=None, busbw=None)
            rows.append(data)
        return {"name": self.name, "label": self.label or self.name, "version": self.version,
                "rows": rows}


@dataclasses.dataclass
class RunResult:
    """Everything one ``ipcshare ring|allgather`` run measured."""

    version: str
    op: str
    backend: str
    exchange: str
    world_size: int
    nodes: int
    # How operations were launched: "eager" or "graph" (CUDA-graph replays).
    timing: str
    devices: list[str]
    rows: list[Row]
    baseline: BaselineResult | None
    # Every operation (ours and the baselines') followed an empty kernel on its stream.
    after_kernel: bool = False
    # What crossed nodes in a job spanning nodes (``nccl`` or ``mpi``); None on one node.
    inter: str | None = None
    # The reduction's arrays were registered with its communicator (-R 1).
    registered: bool = False
    # How the all-to-all split each rank's input (even, random, skewed); None for others.
    splits: str | None = None
    # The all-to-all's algorithm as asked for (``--algo``: auto, pull, balanced, ll,
    # copy-engine, push); None for the other ops.
    algo: str | None = None
    # Results were verified (-c > 0); otherwise the document says "wrong": null.
    checked: bool = True
    # What time_us is over the timed operations: "mean" (nccl-tests: back-to-back
    # operations, one timer) or "median" (--timing latency: one sample per operation,
    # with p5_us / p95_us beside it).
    statistic: str = "mean"
    # Further baselines timed in the same run (``bench`` with several); not in to_dict.
    extra_baselines: list[BaselineResult] = dataclasses.field(default_factory=list)
    # What no row's busbw may pass on this run's path (topology/link_speed.py).
    ceiling: Any = None

    @property
    def measurement_errors(self) -> list[str]:
        """Every row's measurement errors, ours and the baselines' (clock_check.py)."""
        found = [error for row in self.rows for m in row.modes.values() for error in m.errors]
        for baseline in self.baselines:
            found += [f"{baseline.name} baseline: {error}" for row in baseline.rows
                      for m in row.modes.values() for error in m.errors]
        return found

    @property
    def clock_rechecks(self) -> int:
        """Stretches timed again over the run, ours and the baselines', because the two
        clocks disagreed once on some rank (clock_check.agreed_stretch)."""
        return sum(m.clock_rechecks for rows in [self.rows] + [b.rows for b in self.baselines]
                   for row in rows for m in row.modes.values())

    @property
    def baselines(self) -> list[BaselineResult]:
        """Every baseline of the run, the table's first."""
        return ([] if self.baseline is None else [self.baseline]) + list(self.extra_baselines)

    @property
    def wrong_total(self) -> int:
        total = sum(row.wrong for row in self.rows)
        for baseline in self.baselines:
            total += sum(row.wrong for row in baseline.rows)
        return total

    @property
    def avg_busbw(self) -> float:
        values = [row.primary.busbw for row in self.rows]
        return sum(values) / len(values) if values else 0.0

    def to_dict(self) -> dict[str, Any]:
        document = {
            "ipcshare": self.version, "op": self.op, "backend": self.backend,
            "exchange": self.exchange, "world_size": self.world_size, "nodes": self.nodes,
            "timing": self.timing, "devices": self.devices,
            "rows": [row.to_dict() for row in self.rows],
            "baseline": None if self.baseline is None else self.baseline.to_dict(),
            "wrong_total": self.wrong_total,
        }
        if self.algo is not None:
            document["algo"] = self.algo
        if self.ceiling is not None:
            # Every row carries the ceiling it was held against, with its source.
            document["ceiling"] = self.ceiling.to_dict()
            for row in (*document["rows"], *(document["baseline"] or {}).get("rows", ())):
                row["ceiling"] = dict(document["ceiling"])
            # The checks ran (the ceiling is theirs): what they found, [] when nothing.
            document["measurement_errors"] = self.measurement_errors
            if self.clock_rechecks:   # only then: the design's document keeps its keys
                document["clock_rechecks"] = self.clock_rechecks
        if self.after_kernel:   # only then: the design's document keeps its exact keys
            document["after_kernel"] = True
        if self.statistic != "mean":
            document["statistic"] = self.statistic
        if self.inter is not None:  # jobs spanning nodes: the engine between them
            document["inter"] = self.inter
        if self.registered:
            document["registered"] = True
        if self.splits is not None:
            document["splits"] = self.splits
        if not self.checked:  # nothing verified: no count of wrong elements to report
            document["checked"] = False
            document["wrong_total"] = None
            for row in (*document["rows"], *(document["baseline"] or {}).get("rows", ())):
                for measured in (row, row.get("in_place") or {}):
                    if "wrong" in measured:
                        measured["wrong"] = None
        return document
