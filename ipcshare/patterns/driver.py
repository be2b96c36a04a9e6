"""The one driver every pattern shares: size sweep, checks, warm-up, timing, baseline,
table rows as they are measured, and the result document."""

from __future__ import annotations

import contextlib
import ctypes
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from .. import __version__
from ..backends import Backend
from ..collectives.across_nodes.choice import INTER_LABELS
from ..liveness.consensus import collective_step
from ..runtime.config import PatternOptions, format_size
from ..runtime.errors import ConfigError
from ..topology.gpu_sharing import shared_gpus_advice
from ..topology.world import mpi
from ..window import Group
from .base import Pattern, SizePlan
from .clock_check import (
    agreed_errors,
    agreed_stretch,
    ceiling_error,
    clock_disagreement,
    engine_clock_offset,
    latency_clock_disagreement,
)
from .results import BaselineResult, Measurement, Row, RunResult
from .rotation import (
    ROTATION_MAX_BLOCK_BYTES,
    rotated_window_bytes,
    rotation_count,
    warmup_iterations,
    window_regions,
)
from .table import Table
from .timing import (
    GRAPH_LABEL,
    GRAPH_LATENCY_LABEL,
    LATENCY_LABEL,
    TIMING_MODES,
    mean_over_ranks,
    percentile,
    slowest_rank_samples,
    summarize_samples,
)

__all__ = ["run_pattern", "check_graph_mode", "check_after_kernel"]


# How long the host memory ceiling's measurement may take (two 64 MiB buffers, a few
# copies; 0.1-0.7 s on 2 shared cores), beyond the group's timeout, for the ranks that
# wait for it while every rank runs: a stopped one ends their wait at the group's timeout,
# like any other step's.
HOST_CEILING_MEASURE_S = 10.0
# Eager rounds before a capture, each ended by a barrier: a guest of a time-sliced GPU
# posts its arrays' allocations in the first, its leader maps them in the second, the
# guest's calls name them from the third (collectives/guest_imports.py).
WARM_ROUNDS_BEFORE_CAPTURE = 3
# The commands whose operations replay in CUDA graphs: the communicator's calls (their
# epochs live on the device). The ring's step signals carry values chosen on the host.
GRAPH_OPS = ("allgather", "allreduce", "reducescatter", "alltoall")


def _warm_before_capture(engine: Any, window: Any, operations: list) -> None:
    """Run every operation eagerly a few rounds (their outputs are prepared afresh
    before every check), so what is captured is what later calls do."""
    for _round in range(WARM_ROUNDS_BEFORE_CAPTURE):
        for operation in operations:
            operation()
        engine.synchronize()
        window.barrier()


def check_graph_mode(backend: Backend, op: str, baseline: Any,
                     extra_baselines: Sequence[Any]) -> None:
    """Refuse graph mode where it cannot run.

    Raises:
        ConfigError: a host backend, the ring pattern, or a baseline that cannot capture
            graphs.
    """
    if not backend.device_memory:
        raise ConfigError("--graph captures CUDA graphs: it needs a GPU backend (cuda-ipc or "
                          "cuda-vmm), not host")
    if op not in GRAPH_OPS:
        raise ConfigError(f"--graph times {', '.join(GRAPH_OPS)}; the {op}'s step signals "
                          "carry values chosen on the host, which a replayed graph would "
                          "repeat: run it without --graph")
    for timed in ([baseline] if baseline is not None else []) + list(extra_baselines):
        if not getattr(timed, "captures_graphs", False):
            raise ConfigError(f"--graph: the {timed.name} baseline cannot be captured in a "
                              "CUDA graph; use --baseline nccl, torch or none")


def run_pattern(group: Group, pattern: Pattern, options: PatternOptions, *,
                emit: Callable[[str], None] = print, baseline=None,
                extra_baselines: Sequence[Any] = (), timing: str = "nccl-tests",
                rotate: int = 1, before_size: Callable[[int], None] | None = None,
                graph: bool = False, after_kernel: bool = False) -> RunResult:
    """Collective: sweep ``options``' sizes with ``pattern`` over ``group``.

    ``emit`` receives the table lines (rank 0 only); ``baseline`` (an object with
    ``name``, ``version``, ``measure`` and ``measure_latency``) is timed on the same sizes
    in the same run, and so is each of ``extra_baselines`` (not shown in the table).

    ``timing`` is ``nccl-tests`` (barrier, ``iters`` back-to-back operations, one timer,
    averaged over ranks) or ``latency`` (``iters`` samples of one operation each, the
    slowest rank per sample; the row's time is the median, with p5 and p95).
    ``rotate`` > 1 cycles the operations over that many disjoint buffer sets at sizes up
    to 1 MiB per rank, for us and the baselines. ``before_size`` is called with each size
    before it is measured (every rank).

    ``graph`` (GPU backends) binds graph-safe operations and captures them in CUDA
    graphs: checks replay a graph of one operation; nccl-tests timing captures ``iters``
    operations in one graph and times one launch of it; latency timing times one launch
    of a one-operation graph per sample. Baselines are captured the same way.

    ``after_kernel`` (GPU backends) launches an empty kernel on the stream before every
    operation, ours and the baselines' alike (checks, warm-up and timing), so a collective
    is timed as it runs after the compute that produced its input.

    Raises:
        ConfigError: unknown ``timing``, ``rotate`` < 1, ``graph`` on a host window or
            with the ring, or ``after_kernel`` on a host window or with a baseline that
            runs no kernels (on every rank).
    """
    if timing not in TIMING_MODES:
        raise ConfigError(f"unknown timing mode {timing!r}; choose one of: "
                          f"{', '.join(TIMING_MODES)}")
    if isinstance(rotate, bool) or not isinstance(rotate, int) or rotate < 1:
        raise ConfigError(f"rotate must be an integer >= 1, got {rotate!r}")
    world = group.world
    MPI = mpi()
    n = world.size
    say = emit if world.rank == 0 else (lambda _line: None)
    pattern.fit_memory(group.backend.device_memory)
    plans = []
    for size in options.sizes():
        plan = pattern.plan(size, n, options.element_size)
        if not plans or plans[-1].size != plan.size:
            plans.append(plan)
    # Every collective of the run's own bookkeeping waits at most the group's timeout and
    # gives up on a dead or stopped peer, like the group's calls: none waits for ever.
    comm = group.deadline_comm(f"{pattern.name}: window setup")
    # The window comes first: its exchange decides which descriptor path the header shows.
    comm.Barrier()
    started = time.perf_counter()
    if graph:
        with group.step("graph mode"):
            check_graph_mode(group.backend, pattern.name, baseline, extra_baselines)
    baselines = ([] if baseline is None else [baseline]) + list(extra_baselines)
    if after_kernel:
        with group.step("--after-kernel"):
            check_after_kernel(group.backend, baselines)
    window = group.window(max(rotated_window_bytes(pattern, plan, n, rotate) for plan in plans))
    setup_ms = comm.allreduce((time.perf_counter() - started) * 1e3, op=MPI.MAX)
    # A world of one moves nothing between ranks (nccl-tests' bus factor of 1 there is a
    # convention): no link bounds it.
    ceiling = run_ceiling(group) if world.size > 1 else None
    steps = {step: comm.allreduce(ms, op=MPI.MAX) for step, ms in window.setup_ms.items()}
    # Eager nccl-tests timing also shows the host's time per call (what Python spends
    # issuing it), next to the wall time per call.
    table = Table(pattern.modes, options.datatype, baseline.label if baseline else None,
                  path_column=baseline.path_column if baseline else False,
                  host_column=timing == "nccl-tests" and not graph,
                  p95_column=timing == "latency", checked=options.checks > 0)
    devices = comm.gather(group.backend.describe_device(), root=0) or []
    exchange = group.exchange_name
    rank_lines = [f"#  Rank {r:>3} Pid {world.pids[r]:>7} on {world.hostnames[r]:>12} "
                  f"device {dev}" for r, dev in enumerate(devices)]
    shown = exchange
    if options.exchange == "mpi" and group.backend.uses_fds:
        # The backend's handles are descriptors, which MPI cannot carry.
        shown = f"{exchange} (asked: mpi; descriptors travel by {exchange})"
    elif options.exchange not in ("auto", exchange) and not group.backend.uses_fds:
        # Handles that are bytes travel by MPI whatever carries descriptors.
        shown = f"{exchange} (asked: {options.exchange}; this backend's handles are bytes)"
    title = (f"ipcshare {__version__}  op: {pattern.name}  backend: {group.backend_name}  "
             f"exchange: {shown}  ranks: {n}  nodes: {world.node_count}  "
             f"iters: {options.iters}  warmup: {options.warmup}  checks: {options.checks}")
    if timing == "latency":
        title += f"  timing: {GRAPH_LATENCY_LABEL if graph else LATENCY_LABEL}"
    elif graph:
        title += f"  timing: {GRAPH_LABEL} ({options.iters} operations per graph)"
    if after_kernel:
        title += "  before each: an empty kernel"
    if getattr(pattern, "register", False):
        title += "  arrays: registered with the communicator (-R 1)"
    splits = getattr(pattern, "splits", None)
    if splits is not None:
        title += f"  splits: {splits}"
    if rotate > 1:
        title += (f"  buffers: {rotate} in rotation up to "
                  f"{format_size(ROTATION_MAX_BLOCK_BYTES)} per rank")
    rank_lines.append(f"#  window setup: {setup_ms:.2f} ms for {window.total_bytes} bytes per rank "
                      "(slowest rank): " + ", ".join(f"{k} {v:.2f}" for k, v in steps.items()))
    rank_lines.append(
        (f"#  ceiling: {ceiling.gbps:.2f} GB/s busbw per rank ({ceiling.source}); "
         if ceiling is not None else "#  ceiling: none (a world of one moves nothing); ")
        + "every timer is checked against the host clock to a full synchronize")
    if group.shared_gpus:
        rank_lines.append(f"#  {shared_gpus_advice(group.shared_gpus, group.time_sliced_gpus)}")
    for line in table.header(title, rank_lines):
        say(line)

    engine = window.engine
    # What the second clock reads with nothing to time, taken off before the comparison.
    # Where ranks take turns on a GPU it is unbounded: the host clock also runs while
    # another rank's context holds the GPU, up to a time slice before our first event (4
    # ranks on 2 H200s, 2026-11-27: ms-long false alarms at 1 KB). There only the upper
    # bound is checked (the timer may not pass the host clock).
    offset = math.inf if group.time_sliced_gpus else engine_clock_offset(engine)
    # Graph mode binds through a view whose barrier is the device barrier kernel: its
    # epoch lives on the device, so a replayed graph synchronises like a fresh launch.
    bound = window.on_stream(engine.stream, graph_safe=True) if graph else window
    rows: list[Row] = []
    baseline_rows: list[list[Row]] = [[] for _ in baselines]
    graphs: list[Any] = []
    try:
        if after_kernel:
            with group.step("compiling the empty kernel"):
                before_each = group.backend.kernels("empty.cu").launcher(
                    "empty_kernel", ctypes.c_int(0), grid=1, block=1, stream=engine.stream)
            for timed in baselines:
                timed.after_kernel = True
        for plan in plans:
            if before_size is not None:
                before_size(plan.size)
            # Operations cycle through disjoint regions (one, the window, above 1 MiB).
            regions = window_regions(bound, pattern, plan, rotate)
            modes: dict[str, Measurement] = {}
            for mode in pattern.modes:
                # A wait on a peer may time out on one rank while the others go on to
                # the next MPI collective, where they would wait for it for ever: each
                # stretch of operations ends in an agreement (group.step), where every
                # rank learns the first rank's error and raises it, within the timeout.
                step = _stretches(group, f"{format_size(plan.size)} {mode}")
                comm.label = f"{pattern.name} at {format_size(plan.size)} {mode}"
                wrong = 0
                with step("checks"):
                    operations = [pattern.bind(region, plan, mode) for region in regions]
                    if after_kernel:
                        operations = [_after(before_each, operation)
                                      for operation in operations]
                    if graph:
                        bound_operations = operations
                        if pattern.warm_before_capture:
                            _warm_before_capture(engine, window, bound_operations)
                        operations = []
                        for operation in bound_operations:
                            graphs.append(engine.capture(operation))
                            operations.append(graphs[-1].launch)
                    for iteration in range(options.checks):
                        region = regions[iteration % len(regions)]
                        pattern.prepare(region, plan, mode, iteration)
                        engine.synchronize()
                        window.barrier()
                        operations[iteration % len(operations)]()
                        engine.synchronize()
                        wrong += pattern.check(region, plan, mode, iteration)
                        if graph:
                            window.raise_kernel_error("the device barrier")
                        window.barrier()  # nobody poisons the next run's output early
                wrong = comm.allreduce(wrong, op=MPI.SUM)
                with step("warm-up"):
                    for iteration in range(warmup_iterations(options.warmup,
                                                             len(operations))):
                        operations[iteration % len(operations)]()
                    engine.synchronize()
                host = None
                if timing == "latency":
                    samples, wall, errors, again = _latency_samples(
                        comm, engine, operations, options.iters, offset, step)
                    measured = _latency_measurement(pattern, plan, n, samples, wrong)
                else:
                    if graph:
                        seconds, wall, errors, again = _graph_seconds(
                            comm, engine, bound_operations, options.iters, offset, step)
                    else:
                        seconds, host, wall, errors, again = _back_to_back_seconds(
                            comm, engine, operations, options.iters, offset, step)
                    algbw, busbw = pattern.bandwidth(plan, seconds, n)
                    measured = Measurement(seconds * 1e6, algbw, busbw, wrong)
                measured.clock_rechecks = again
                measured.host_us = None if host is None else host * 1e6
                measured.wall_us = wall * 1e6
                over = _over_ceiling(pattern, plan, n, measured, ceiling,
                                     f"{format_size(plan.size)} {mode}")
                measured.errors = agreed_errors(comm, errors + ([over] if over else []))
                modes[mode] = measured
                for captured in graphs:
                    captured.close()
                graphs.clear()
            row = Row(plan.size, plan.count, modes)
            row.facts = pattern.row_facts(plan, n, row)
            rows.append(row)
            buffers = rotation_count(plan, rotate)
            for timed, measured in zip(baselines, baseline_rows, strict=True):
                measured.append(_baseline_row(timed, pattern, plan, n, options, timing, buffers,
                                              graph, ceiling, comm))
            first = baseline_rows[0][-1] if baselines else None
            say(table.row(row, first))
            for line in table.notes(row, first, baselines[0].name if baselines else ""):
                say(line)
            for line in pattern.fact_lines(row.facts):
                say(line)
    finally:
        try:
            engine.synchronize()
        finally:
            for captured in graphs:
                captured.close()
            window.close()
            if after_kernel:   # a baseline may serve later runs (bench): leave it as found
                for timed in baselines:
                    timed.after_kernel = False
    results = [BaselineResult(timed.name, timed.version, measured, timed.label)
               for timed, measured in zip(baselines, baseline_rows, strict=True)]
    result = RunResult(
        version=__version__, op=pattern.name, backend=group.backend_name, exchange=exchange,
        world_size=n, nodes=world.node_count,
        timing=GRAPH_LABEL if graph else "eager", devices=list(devices),
        rows=rows, baseline=results[0] if results else None, extra_baselines=results[1:],
        after_kernel=after_kernel, inter=pattern.inter_engine_name,
        registered=bool(getattr(pattern, "register", False)), splits=splits,
        algo=getattr(pattern, "algo", None) if splits is not None else None,
        checked=options.checks > 0,
        statistic="median" if timing == "latency" else "mean", ceiling=ceiling)
    if result.inter is not None:
        say(f"# between nodes: {result.inter} ({INTER_LABELS[result.inter]})")
    for line in table.footer(result):
        say(line)
    return result


def check_after_kernel(backend: Backend, baselines: Sequence[Any]) -> None:
    """Refuse ``--after-kernel`` where it cannot run.

    Raises:
        ConfigError: a host backend, or a baseline that runs no kernels on a stream.
    """
    if not backend.has_kernels:
        raise ConfigError("--after-kernel launches an empty kernel before every operation: it "
                          "needs a GPU backend (cuda-ipc or cuda-vmm), not host")
    for timed in baselines:
        if not hasattr(timed, "after_kernel"):
            raise ConfigError(f"--after-kernel: the {timed.name} baseline runs no kernels on a "
                              "stream; use --baseline nccl, torch or none")


def _stretches(group: Group, where: str) -> Callable[[str], Any]:
    """``step(name)``: a context that runs a stretch of operations at ``where`` (a size
    and mode) and then agrees on it over the group (``Group.step``): a rank whose
    operation failed (a SignalTimeout) hands its error to the others there, instead of
    leaving them in the next blocking collective; a rank that never comes is given up
    on at the group's timeout."""
    def step(name: str) -> Any:
        return group.step(f"{name} at {where}")
    return step


def _no_agreement(_name: str) -> Any:
    """A stretch without agreement, for callers of the timing helpers that have none."""
    return contextlib.nullcontext()


def _after(first: Callable[[], None], operation: Callable[[], None]) -> Callable[[], None]:
    def run() -> None:
        first()
        operation()
    return run


def run_ceiling(group: Group) -> Any:
    """Collective: the ceiling no row of this run may pass (topology/link_speed.py),
    the highest of the ranks' (each rank's own links or memory), alike on every rank."""
    from ..topology import link_speed

    world = group.world
    backend = group.backend
    # The others wait while rank 0 measures: the group's timeout, plus the measurement's
    # as long as no rank is stopped.
    with collective_step(world, "reading the links' ceiling", watch=group.watch,
                         timeout=group.rendezvous.timeout,
                         extra_while_running=HOST_CEILING_MEASURE_S):
        mine = None
        if backend.device_memory:
            # Where some ranks share a GPU the group's figures mix both paths: the looser
            # bound (that GPU's memory) holds for every row.
            mine = link_speed.gpu_ceiling(backend.device, shares_gpu=bool(group.shared_gpus))
        elif world.rank == 0:
            # Measured by one rank while the others wait: ranks copying at once on
            # shared cores would measure each other.
            mine = link_speed.host_memory_ceiling()
    found = [ceiling for ceiling in group.collective("reading the links' ceiling", mine)
             if ceiling is not None]
    return max(found, key=lambda ceiling: ceiling.gbps)


def _back_to_back_seconds(comm: Any, engine: Any, operations: list[Callable[[], None]],
                          iters: int, offset: float = 0.0,
                          step: Callable[[str], Any] = _no_agreement
                          ) -> tuple[float, float, float, list[str], int]:
    """nccl-tests timing: seconds per operation by the engine's timer, the host's seconds
    per operation spent issuing them (until the last returned), and the second clock's
    seconds per operation, each averaged over ranks; this rank's clock disagreement, if
    any; and how many times the stretch was timed again (clock_check.agreed_stretch).
    Each timed stretch ends in an agreement (``step``, see ``_stretches``)."""
    sequence = [operations[i % len(operations)] for i in range(iters)]
    what = f"{iters} back-to-back operations"

    def stretch() -> tuple[float, float, float, tuple[float, float] | None]:
        comm.Barrier()
        with step("timing"):
            timer = engine.timer()
            timer.start()
            started = time.perf_counter()
            for operation in sequence:
                operation()
            host = time.perf_counter() - started
            elapsed = timer.stop()
        return (elapsed, host, timer.wall_seconds if timer.wall_seconds is not None else elapsed,
                timer.wall_parts)

    (elapsed, host, wall, _parts), error, again = agreed_stretch(
        comm, stretch, lambda reading: clock_disagreement(
            reading[0], reading[2], what, offset, parts=reading[3]))
    seconds, host, wall = mean_over_ranks(comm, [elapsed / iters, host / iters,
                                                       wall / iters])
    return seconds, host, wall, [error] if error else [], again


def _graph_seconds(comm: Any, engine: Any, operations: list[Callable[[], None]],
                   iters: int, offset: float = 0.0, step: Callable[[str], Any] = _no_agreement
                   ) -> tuple[float, float, list[str], int]:
    """nccl-tests timing of ``iters`` operations captured in one CUDA graph: one launch
    to warm it (its first launch uploads it), then one timed launch (again where the
    clocks disagreed); seconds per operation by the timer and by the second clock,
    averaged over ranks, this rank's clock disagreement, if any, and how many times the
    launch was timed again. Capture, warm launch and each timed launch end in an
    agreement (``step``)."""
    sequence = [operations[i % len(operations)] for i in range(iters)]
    what = f"one graph of {iters} operations"

    def enqueue_all() -> None:
        for operation in sequence:
            operation()
    with step("capture"):
        captured = engine.capture(enqueue_all)

    def stretch() -> tuple[float, float, tuple[float, float] | None]:
        comm.Barrier()
        with step("timing"):
            timer = engine.timer()
            timer.start()
            captured.launch()
            elapsed = timer.stop()
        return (elapsed, timer.wall_seconds if timer.wall_seconds is not None else elapsed,
                timer.wall_parts)

    try:
        with step("warm launch"):
            captured.launch()
            engine.synchronize()
        (elapsed, wall, _parts), error, again = agreed_stretch(
            comm, stretch, lambda reading: clock_disagreement(
                reading[0], reading[1], what, offset, parts=reading[2]))
    finally:
        engine.synchronize()
        captured.close()
    seconds, wall = mean_over_ranks(comm, [elapsed / iters, wall / iters])
    return seconds, wall, [error] if error else [], again


def _latency_samples(comm: Any, engine: Any, operations: list[Callable[[], None]],
                     iters: int, offset: float, step: Callable[[str], Any]
                     ) -> tuple[list[float], float, list[str], int]:
    """Latency timing: ``iters`` samples of one operation each, started together after a
    barrier, timed by the engine (host clock, or CUDA events on the stream); each sample
    is the slowest rank's. Also the second clock's median sample (averaged over ranks),
    this rank's clock disagreement, if any, and how many times the samples were taken
    again.

    Each sample ends in an agreement (``step``, see ``_stretches``), which is also the
    barrier that starts the next sample together."""
    what = f"{iters} samples of one operation"

    def stretch() -> tuple[list[float], list[float]]:
        samples, walls = [], []
        engine.synchronize()
        comm.Barrier()
        for iteration in range(iters):
            operation = operations[iteration % len(operations)]
            with step("latency sample"):
                timer = engine.timer()
                timer.start()
                operation()
                samples.append(timer.stop())
                walls.append(timer.wall_seconds if timer.wall_seconds is not None
                             else samples[-1])
                engine.synchronize()
        return samples, walls

    (samples, walls), error, again = agreed_stretch(
        comm, stretch,
        lambda reading: latency_clock_disagreement(*reading, what, offset))
    wall, = mean_over_ranks(comm, [percentile(walls, 50)])
    return slowest_rank_samples(comm, samples), wall, [error] if error else [], again


def _latency_measurement(pattern: Pattern, plan: SizePlan, world_size: int,
                         samples: list[float], wrong: int) -> Measurement:
    """The median sample with its bandwidth, and the p5 / p95 spread."""
    summary = summarize_samples(samples)
    algbw, busbw = pattern.bandwidth(plan, summary.p50, world_size)
    return Measurement(summary.p50 * 1e6, algbw, busbw, wrong, p5_us=summary.p5 * 1e6,
                       p95_us=summary.p95 * 1e6)


def _over_ceiling(pattern: Pattern, plan: SizePlan, world_size: int, measured: Measurement,
                  ceiling: Any, what: str) -> str | None:
    """The ceiling check of a timed row: what its time asks of the busiest link
    (``Pattern.link_gbps``) against what the path carries."""
    if not measured.time_us or measured.time_us <= 0:
        return None
    gbps, quantity = pattern.link_gbps(plan, measured.time_us / 1e6, world_size)
    return ceiling_error(gbps, ceiling, what, quantity)


def _baseline_row(baseline: Any, pattern: Pattern, plan: SizePlan, world_size: int,
                  options: PatternOptions, timing: str, buffers: int, graph: bool,
                  ceiling: Any, comm: Any) -> Row:
    """One size of a baseline, every mode, timed like ours and held to the same checks
    (its timer against the host clock where it has two clocks, its busbw against the
    ceiling)."""
    modes = {}
    # Only baselines that can capture graphs are asked to (check_graph_mode saw to it).
    captured = {"graph": True} if graph else {}
    for mode in pattern.modes:
        # GPU baselines time several paths and add the fastest's name (baselines/gpu.py).
        if timing == "latency":
            samples, wrong, *path = baseline.measure_latency(
                plan, mode, iters=options.iters, warmup=options.warmup, checks=options.checks,
                buffers=buffers, **captured)
            measurement = _latency_measurement(pattern, plan, world_size, samples, wrong)
        else:
            seconds, wrong, *path = baseline.measure(plan, mode, iters=options.iters,
                                                     warmup=options.warmup,
                                                     checks=options.checks, buffers=buffers,
                                                     **captured)
            algbw, busbw = pattern.bandwidth(plan, seconds, world_size)
            measurement = Measurement(seconds * 1e6, algbw, busbw, wrong)
        measurement.path = path[0] if path else None
        measurement.wrong_paths = dict(baseline.wrong_paths)
        # (this rank's clock disagreement, the second clock's seconds per operation
        # averaged over ranks), or None for a baseline with one clock
        clock = baseline.clock
        mine = [clock[0]] if clock is not None and clock[0] else []
        if clock is not None and clock[1] is not None:
            measurement.wall_us = clock[1] * 1e6
        measurement.clock_rechecks = baseline.clock_rechecks
        over = (None if measurement.wrong else
                _over_ceiling(pattern, plan, world_size, measurement, ceiling,
                              f"{format_size(plan.size)} {mode}"))
        measurement.errors = agreed_errors(comm, mine + ([over] if over else []))
        modes[mode] = measurement
    return Row(plan.size, plan.count, modes)
