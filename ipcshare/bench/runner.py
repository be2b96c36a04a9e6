"""Runs a suite in one launch: one Group per backend, every case through the shared
driver with its baselines beside it, the whole suite ``repeat`` times."""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable
from typing import Any

from ..patterns import make_pattern
from ..patterns.baselines import gpu_baseline_class, mpi_baseline, open_gpu_baseline
from ..patterns.driver import run_pattern
from ..patterns.results import RunResult
from ..patterns.rotation import ROTATION_MAX_BLOCK_BYTES
from ..patterns.timing import GRAPH_LATENCY_LABEL, LATENCY_LABEL
from ..patterns.timing import timing_label as result_timing_label
from ..runtime.config import format_size
from ..runtime.errors import ConfigError
from ..topology.world import World
from ..window import Group
from .progress import ProgressLine
from .stats import aggregate_runs
from .suite import GRAPH_OPS, BenchCase, Suite

__all__ = ["SkippedBaseline", "CaseResult", "BenchResult", "run_suite", "timing_label"]


def timing_label(mode: str, case: BenchCase | None = None) -> str:
    """How a case's timing mode is named in outputs."""
    if case is not None:
        timing, graphed = driver_timing(case)
        if timing == "latency":
            return result_timing_label(timing, graphed)
        if case.timing == "after-kernel":
            return "after-kernel"
        return "graph" if graphed else timing
    return LATENCY_LABEL if mode == "latency" else mode


def driver_timing(case: BenchCase) -> tuple[str, bool]:
    """(the driver's timing mode, whether operations run as CUDA graphs) for ``case``.

    Latency samples of GPU all-gathers, all-reduces and reduce-scatters are graph
    replays, for us and NCCL alike: a sample then measures the operation, not Python
    launching it. The ring's signals carry host-chosen values, so its samples stay
    eager."""
    if case.timing == "graph":
        return "nccl-tests", True
    if case.timing == "after-kernel":
        return "nccl-tests", False
    graphed = case.timing == "latency" and case.backend != "host" and case.op in GRAPH_OPS
    return case.timing, graphed


# The driver's algorithm names for the suite's.
_DRIVER_ALGO = {"single-copy": "copy-engine"}


@dataclasses.dataclass(frozen=True)
class SkippedBaseline:
    """A baseline the suite asked for that could not run, and why."""

    name: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "reason": self.reason}


@dataclasses.dataclass
class CaseResult:
    """Every repetition of one case, and the baselines it had to skip."""

    case: BenchCase
    runs: list[RunResult] = dataclasses.field(default_factory=list)
    skipped: list[SkippedBaseline] = dataclasses.field(default_factory=list)

    @functools.cached_property
    def result(self) -> RunResult:
        """The repetitions folded into one (medians, with min / max ranges)."""
        return aggregate_runs(self.runs)

    def to_dict(self, suite: Suite) -> dict[str, Any]:
        """DESIGN.md's document of one run, plus what identifies the case."""
        result = self.result
        document = result.to_dict()
        document["timing"] = timing_label(self.case.timing, self.case)
        options = self.case.options
        if self.case.reduction is not None:
            document["reduction"] = self.case.reduction
        document.update(
            case=self.case.label, algorithm=self.case.algorithm, datatype=options.datatype,
            iters=options.iters, warmup=options.warmup, checks=options.checks,
            repeats=len(self.runs),
            rotate_buffers=suite.rotate_buffers,
            rotate_max_block_bytes=ROTATION_MAX_BLOCK_BYTES if suite.rotate_buffers > 1 else 0,
            avg_busbw=round(result.avg_busbw, 3),
            baselines=[baseline.to_dict() for baseline in result.baselines],
            skipped_baselines=[skipped.to_dict() for skipped in self.skipped])
        return document


@dataclasses.dataclass
class BenchResult:
    """A whole suite's results, in the suite's case order."""

    suite: Suite
    cases: list[CaseResult]
    elapsed_s: float = 0.0

    @property
    def wrong_total(self) -> int:
        return sum(case.result.wrong_total for case in self.cases)

    def documents(self) -> list[dict[str, Any]]:
        """The JSON list: one document per case."""
        return [case.to_dict(self.suite) for case in self.cases]

    def below(self, min_bw: float) -> list[CaseResult]:
        """The cases whose average busbw is under ``min_bw`` GB/s."""
        return [case for case in self.cases if case.result.avg_busbw < min_bw]


class _Baselines:
    """The baselines of one Group: each GPU baseline opened once and handed to every case
    that asks for it; one that cannot run here, or cannot time a case, is skipped with
    the reason, never a crash."""

    def __init__(self, group: Group) -> None:
        self.group = group
        self._opened: dict[str, Any] = {}
        self._refusals: dict[str, str] = {}

    def for_case(self, case: BenchCase, pattern: Any) -> tuple[list[Any], list[SkippedBaseline]]:
        """Collective: (baselines to time ``pattern`` of ``case``, in the suite's order;
        those skipped)."""
        timed: list[Any] = []
        skipped: list[SkippedBaseline] = []
        graphed = driver_timing(case)[1]
        for name in case.baselines:
            if name == "mpi":
                if graphed:
                    skipped.append(SkippedBaseline(
                        name, "MPI calls cannot be captured in a CUDA graph; this case "
                              "replays graphs"))
                    continue
                if case.timing == "after-kernel":
                    skipped.append(SkippedBaseline(
                        name, "MPI runs no kernels on a stream; this case launches one "
                              "before each operation"))
                    continue
                try:
                    # Every rank alike: MPI reduces no 16-bit floats, whatever the rank.
                    timed.append(mpi_baseline(self.group.world, pattern))
                except ConfigError as exc:
                    skipped.append(SkippedBaseline(name, str(exc)))
                continue
            try:
                # Every rank alike: the case and the library decide, not the rank.
                gpu_baseline_class(name).check_case(pattern)
            except ConfigError as exc:
                skipped.append(SkippedBaseline(name, str(exc)))
                continue
            opened = self._open(name, pattern)
            if opened is None:
                skipped.append(SkippedBaseline(name, self._refusals[name]))
            else:
                timed.append(opened.for_pattern(pattern))
        return timed, skipped

    def _open(self, name: str, pattern: Any) -> Any:
        if name in self._opened or name in self._refusals:
            return self._opened.get(name)
        if self.group.backend_name == "host":
            self._refusals[name] = ("NCCL runs on GPU memory only; this case runs on the host "
                                    "backend")
            return None
        try:
            # Collective: every rank gets the same ConfigError (no nccl4py or torch, no
            # CUDA, GPUs shared between ranks), so every rank skips it alike.
            self._opened[name] = open_gpu_baseline(name, self.group, pattern)
        except ConfigError as exc:
            self._refusals[name] = str(exc)
        return self._opened.get(name)

    def close(self) -> None:
        opened, self._opened = self._opened, {}
        for baseline in opened.values():
            baseline.close()


def run_suite(suite: Suite, world: World, *, emit: Callable[[str], None] = print,
              progress: ProgressLine | None = None) -> BenchResult:
    """Collective: run every case of ``suite``, ``suite.repeat`` times over.

    Cases of one backend share one Group (and so one exchange setup) and one instance of
    each baseline. ``emit`` gets the tables and notes on rank 0; ``progress`` (rank 0)
    shows the case, size and elapsed time.

    Raises:
        IpcShareError: a backend, window or pattern failure (on every rank).
    """
    say = emit if world.rank == 0 else (lambda _line: None)
    records = {case: CaseResult(case) for case in suite.cases}
    total = len(suite.cases) * suite.repeat
    started = time.perf_counter()
    position = 0
    for backend in suite.backends:
        cases = [case for case in suite.cases if case.backend == backend]
        with Group(backend, suite.exchange, handle=suite.handle) as group:
            baselines = _Baselines(group)
            try:
                for repetition in range(suite.repeat):
                    for case in cases:
                        position += 1
                        heading = f"# [case {position}/{total}] {case.label}"
                        if suite.repeat > 1:
                            heading += f"  (repetition {repetition + 1}/{suite.repeat})"
                        say(heading)
                        pattern = make_pattern(case.op,
                                               _DRIVER_ALGO.get(case.algorithm, case.algorithm),
                                               op=case.options.op,
                                               datatype=case.options.datatype)
                        timed, skipped = baselines.for_case(case, pattern)
                        record = records[case]
                        try:
                            record.runs.append(_run_case(
                                group, case, pattern, suite, timed, emit,
                                _progress_hook(progress, position, total, case)))
                        finally:
                            pattern.close()  # across nodes: its node group and rails
                        if repetition == 0:
                            record.skipped = skipped
                        for line in _case_notes(record.runs[-1], case, skipped):
                            say(line)
            finally:
                baselines.close()
    if progress is not None:
        progress.clear()
    return BenchResult(suite, [records[case] for case in suite.cases],
                       time.perf_counter() - started)


def _run_case(group: Group, case: BenchCase, pattern: Any, suite: Suite, timed: list[Any],
              emit: Callable[[str], None],
              before_size: Callable[[int], None] | None) -> RunResult:
    timing, graphed = driver_timing(case)
    return run_pattern(group, pattern, case.options, emit=emit,
                       baseline=timed[0] if timed else None, extra_baselines=timed[1:],
                       timing=timing, rotate=suite.rotate_buffers,
                       before_size=before_size, graph=graphed,
                       after_kernel=case.timing == "after-kernel")


def _progress_hook(progress: ProgressLine | None, position: int, total: int,
                   case: BenchCase) -> Callable[[int], None] | None:
    if progress is None:
        return None

    def show(size: int) -> None:
        progress.show(f"ipcshare bench: case {position}/{total} {case.label}, "
                      f"size {format_size(size)}, {progress.elapsed_s:.0f} s elapsed")
    return show


def _case_notes(result: RunResult, case: BenchCase, skipped: list[SkippedBaseline]) -> list[str]:
    """Lines after a case's table: the baselines the table has no room for, what the
    latency time column means, and the baselines skipped."""
    lines = []
    for baseline in result.extra_baselines:
        lines.append(f"# also timed: {baseline.name} baseline, {baseline.label} "
                     f"({baseline.version})")
        lines.append(f"#{'size':>14} {'time':>9} {'busbw':>7} {'#wrong':>6} {'speedup':>7}")
        for ours, theirs in zip(result.rows, baseline.rows, strict=True):
            mine, other = ours.primary, theirs.primary
            speedup = other.time_us / mine.time_us if mine.time_us > 0 else 0.0
            lines.append(f" {ours.size:>14} {other.time_us:>9.2f} {other.busbw:>7.2f} "
                         f"{other.wrong:>6} {speedup:>7.2f}")
    if case.timing == "latency":
        label = GRAPH_LATENCY_LABEL if driver_timing(case)[1] else LATENCY_LABEL
        lines.append(f"# {label}: time = median of {case.options.iters} samples, each "
                     "the slowest rank's; p5 / p95 are in --json and --markdown")
    for entry in skipped:
        lines.append(f"# {entry.name} baseline skipped: {entry.reason}")
    if lines:
        lines.append("#")
    return lines
