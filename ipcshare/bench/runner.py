"""Runs a suite in one launch: one Group per backend, every case through the shared
driver with its baselines beside it (p2p cases: P2P direct beside IPC, or skipped with the
reason where they cannot run), the whole suite ``repeat`` times."""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable
from typing import Any

from .. import __version__
from ..baselines import gpu_baseline_class, mpi_baseline, open_gpu_baseline
from ..patterns import make_pattern
from ..patterns.driver import run_pattern
from ..patterns.results import RunResult
from ..patterns.rotation import ROTATION_MAX_BLOCK_BYTES
from ..patterns.timing import GRAPH_LATENCY_LABEL, LATENCY_LABEL
from ..patterns.timing import timing_label as result_timing_label
from ..runtime.config import format_size
from ..runtime.errors import ConfigError
from ..topology.world import World
from ..window import Group
from .p2p_case import group_skip_reason, no_gpu_reason, run_p2p_case, skip_reason
from .progress import ProgressLine
from .stats import aggregate_runs
from .suite import GRAPH_OPS, P2P_OP, BenchCase, Suite

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
    """Every repetition of one case, and the baselines it had to skip; a case that could
    not run at all has ``skip_reason`` and one run without rows. A p2p case keeps what
    its direct half reported beside the rows (``p2p``)."""

    case: BenchCase
    runs: list[RunResult] = dataclasses.field(default_factory=list)
    skipped: list[SkippedBaseline] = dataclasses.field(default_factory=list)
    skip_reason: str | None = None
    p2p: dict[str, Any] | None = None

    @functools.cached_property
    def result(self) -> RunResult:
        """The repetitions folded into one (medians, with min / max ranges)."""
        return aggregate_runs(self.runs)

    def to_dict(self, suite: Suite) -> dict[str, Any]:
        """The ``--json`` document of one run, plus what identifies the case."""
        result = self.result
        document = result.to_dict()
        options = self.case.options
        if self.case.reduction is not None:
            document["reduction"] = self.case.reduction
        document.update(
            case=self.case.label, algorithm=self.case.algorithm, datatype=options.datatype,
            iters=options.iters, warmup=options.warmup, checks=options.checks,
            repeats=0 if self.skip_reason else len(self.runs), skipped=self.skip_reason,
            rotate_buffers=suite.rotate_buffers,
            rotate_max_block_bytes=ROTATION_MAX_BLOCK_BYTES if suite.rotate_buffers > 1 else 0,
            avg_busbw=round(result.avg_busbw, 3),
            baselines=[baseline.to_dict() for baseline in result.baselines],
            skipped_baselines=[skipped.to_dict() for skipped in self.skipped])
        if self.case.p2p_op is not None:
            # The driver's document names the pattern; the suite's op is p2p.
            document.update(op=self.case.op, p2p_op=self.case.p2p_op,
                            p2p_peer_access=self.case.p2p_peer_access, p2p=self.p2p)
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
        """The cases that ran and whose average busbw is under ``min_bw`` GB/s."""
        return [case for case in self.cases
                if case.skip_reason is None and case.result.avg_busbw < min_bw]


class _Baselines:
    """The baselines of one Group: each GPU baseline opened once and handed to every case
    that asks for it; one that cannot run here, or cannot time a case, is skipped with
    the reason, never a crash."""

    def __init__(self, group: Group) -> None:
        self.group = group
        self._opened: dict[tuple[str, Any], Any] = {}
        self._refusals: dict[tuple[str, Any], str] = {}

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
                gpu_baseline_class(name, pattern.name).check_case(pattern)
            except ConfigError as exc:
                skipped.append(SkippedBaseline(name, str(exc)))
                continue
            opened = self._open(name, pattern)
            if opened is None:
                skipped.append(SkippedBaseline(
                    name, self._refusals[(name, gpu_baseline_class(name, pattern.name))]))
            else:
                timed.append(opened.for_pattern(pattern))
        return timed, skipped

    def _open(self, name: str, pattern: Any) -> Any:
        # One opened baseline per class: a name may time some ops with a class of its own
        # (torch-symm's all-to-all), which must not serve the others.
        key = (name, gpu_baseline_class(name, pattern.name))
        if key in self._opened or key in self._refusals:
            return self._opened.get(key)
        if self.group.backend_name == "host":
            self._refusals[key] = ("NCCL runs on GPU memory only; this case runs on the host "
                                   "backend")
            return None
        try:
            # Collective: every rank gets the same ConfigError (no nccl4py or torch, no
            # CUDA, GPUs shared between ranks), so every rank skips it alike.
            self._opened[key] = open_gpu_baseline(name, self.group, pattern)
        except ConfigError as exc:
            self._refusals[key] = str(exc)
        return self._opened.get(key)

    def close(self) -> None:
        opened, self._opened = self._opened, {}
        for baseline in opened.values():
            baseline.close()


def run_suite(suite: Suite, world: World, *, emit: Callable[[str], None] = print,
              progress: ProgressLine | None = None) -> BenchResult:
    """Collective: run every case of ``suite``, ``suite.repeat`` times over.

    Cases of one backend share one Group (and so one exchange setup) and one instance of
    each baseline. ``emit`` gets the tables and notes on rank 0; ``progress`` (rank 0)
    shows the case, size and elapsed time. A p2p case that cannot run here is skipped
    with its reason (no GPU, one rank, several nodes...), never an error.

    Raises:
        IpcShareError: a backend, window or pattern failure (on every rank).
    """
    started = time.perf_counter()
    run = _SuiteRun(suite, world, emit, progress)
    for backend in suite.backends:
        run.backend(backend)
    if progress is not None:
        progress.clear()
    return BenchResult(suite, [run.records[case] for case in suite.cases],
                       time.perf_counter() - started)


class _SuiteRun:
    """One run of a suite: each case's record, the position in the run, and the p2p
    cases that cannot run in this job, decided up front (alike on every rank)."""

    def __init__(self, suite: Suite, world: World, emit: Callable[[str], None],
                 progress: ProgressLine | None) -> None:
        self.suite, self.world, self.emit, self.progress = suite, world, emit, progress
        self.say = emit if world.rank == 0 else (lambda _line: None)
        self.records = {case: CaseResult(case) for case in suite.cases}
        self.total = len(suite.cases) * suite.repeat
        self.position = 0
        p2p = [case for case in suite.cases if case.op == P2P_OP]
        # Only suites with p2p cases ask whether any rank sees a GPU (a collective).
        no_gpu = no_gpu_reason(world) if p2p else None
        self.skips = {case: reason for case in p2p
                      if (reason := skip_reason(case, world, no_gpu)) is not None}

    def backend(self, backend: str) -> None:
        """Collective: every repetition of the cases on ``backend``."""
        suite = self.suite
        cases = [case for case in suite.cases if case.backend == backend]
        if all(case in self.skips for case in cases):
            # Nothing runs on it: no Group, which a GPU backend cannot open without a GPU.
            for repetition in range(suite.repeat):
                for case in cases:
                    self._begin(case, repetition)
                    self._skip(case, self.skips[case])
            return
        with Group(backend, suite.exchange, handle=suite.handle) as group:
            baselines = _Baselines(group)
            shared = group_skip_reason(group) if any(c.op == P2P_OP for c in cases) else None
            try:
                for repetition in range(suite.repeat):
                    for case in cases:
                        self._begin(case, repetition)
                        reason = self.skips.get(case) or (shared if case.op == P2P_OP
                                                          else None)
                        if reason is not None:
                            self._skip(case, reason)
                        else:
                            self._run(group, baselines, case, repetition)
            finally:
                baselines.close()

    def _begin(self, case: BenchCase, repetition: int) -> None:
        self.position += 1
        heading = f"# [case {self.position}/{self.total}] {case.label}"
        if self.suite.repeat > 1:
            heading += f"  (repetition {repetition + 1}/{self.suite.repeat})"
        self.say(heading)

    def _skip(self, case: BenchCase, reason: str) -> None:
        record = self.records[case]
        if record.skip_reason is None:
            record.skip_reason = reason
            timing, graphed = driver_timing(case)
            record.runs.append(RunResult(__version__, case.op, case.backend,
                                         self.suite.exchange, self.world.size,
                                         self.world.node_count, "graph" if graphed else "eager",
                                         [], [], None, after_kernel=case.timing == "after-kernel",
                                         statistic="median" if timing == "latency" else "mean"))
        self.say(f"# skipped: {reason}")
        self.say("#")

    def _run(self, group: Group, baselines: _Baselines, case: BenchCase,
             repetition: int) -> None:
        record = self.records[case]
        hook = _progress_hook(self.progress, self.position, self.total, case)
        pattern = make_pattern(case.pattern_op, _DRIVER_ALGO.get(case.algorithm, case.algorithm),
                               op=case.options.op, datatype=case.options.datatype,
                               register=case.options.register, splits=case.options.splits)
        try:
            if case.op == P2P_OP:
                if self.progress is not None:
                    self.progress.show(f"ipcshare bench: case {self.position}/{self.total} "
                                       f"{case.label}, P2P direct half on rank 0")
                p2p = run_p2p_case(group, case, pattern, emit=self.emit, before_size=hook)
                result = p2p.result
                skipped = [SkippedBaseline(name, why) for name, why in p2p.missing.items()]
                record.p2p = record.p2p or p2p.details
            else:
                timed, skipped = baselines.for_case(case, pattern)
                result = _run_case(group, case, pattern, self.suite, timed, self.emit, hook)
        finally:
            pattern.close()  # across nodes: its node group and rails
        record.runs.append(result)
        if repetition == 0:
            record.skipped = skipped
        for line in _case_notes(result, case, skipped):
            self.say(line)


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
    # The driver's table shows the first baseline; a p2p case's were timed apart from it.
    for baseline in result.baselines if case.op == P2P_OP else result.extra_baselines:
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
