"""The one driver every pattern shares: size sweep, checks, warm-up, timing, baseline,
table rows as they are measured, and the result document."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from .. import __version__
from ..config import PatternOptions, format_size
from ..errors import ConfigError
from ..topology import World, mpi
from ..window import Group
from .base import Pattern, SizePlan
from .results import BaselineResult, Measurement, Row, RunResult
from .rotation import (
    ROTATION_MAX_BLOCK_BYTES,
    rotated_window_bytes,
    rotation_count,
    warmup_iterations,
    window_regions,
)
from .table import Table
from .timing import LATENCY_LABEL, TIMING_MODES, slowest_rank_samples, summarize_samples

__all__ = ["run_pattern"]


def run_pattern(group: Group, pattern: Pattern, options: PatternOptions, *,
                emit: Callable[[str], None] = print, baseline=None,
                extra_baselines: Sequence[Any] = (), timing: str = "nccl-tests",
                rotate: int = 1, before_size: Callable[[int], None] | None = None) -> RunResult:
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

    Raises:
        ConfigError: unknown ``timing`` or ``rotate`` < 1 (on every rank).
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
    plans = []
    for size in options.sizes():
        plan = pattern.plan(size, n, options.element_size)
        if not plans or plans[-1].size != plan.size:
            plans.append(plan)
    # The window comes first: its exchange decides which descriptor path the header shows.
    world.comm.Barrier()
    started = time.perf_counter()
    window = group.window(max(rotated_window_bytes(pattern, plan, n, rotate) for plan in plans))
    setup_ms = world.comm.allreduce((time.perf_counter() - started) * 1e3, op=MPI.MAX)
    steps = {step: world.comm.allreduce(ms, op=MPI.MAX) for step, ms in window.setup_ms.items()}
    table = Table(pattern.modes, options.datatype, baseline.name if baseline else None)
    devices = world.comm.gather(group.backend.describe_device(), root=0) or []
    exchange = group.exchange_name
    rank_lines = [f"#  Rank {r:>3} Pid {world.pids[r]:>7} on {world.hostnames[r]:>12} "
                  f"device {dev}" for r, dev in enumerate(devices)]
    title = (f"ipcshare {__version__}  op: {pattern.name}  backend: {group.backend_name}  "
             f"exchange: {exchange}  ranks: {n}  nodes: {world.node_count}  "
             f"iters: {options.iters}  warmup: {options.warmup}  checks: {options.checks}")
    if timing == "latency":
        title += f"  timing: {LATENCY_LABEL}"
    if rotate > 1:
        title += (f"  buffers: {rotate} in rotation up to "
                  f"{format_size(ROTATION_MAX_BLOCK_BYTES)} per rank")
    rank_lines.append(f"#  window setup: {setup_ms:.2f} ms for {window.total_bytes} bytes per rank "
                      "(slowest rank): " + ", ".join(f"{k} {v:.2f}" for k, v in steps.items()))
    for line in table.header(title, rank_lines):
        say(line)

    engine = window.engine
    baselines = ([] if baseline is None else [baseline]) + list(extra_baselines)
    rows: list[Row] = []
    baseline_rows: list[list[Row]] = [[] for _ in baselines]
    try:
        for plan in plans:
            if before_size is not None:
                before_size(plan.size)
            # Operations cycle through disjoint regions (one, the window, above 1 MiB).
            regions = window_regions(window, pattern, plan, rotate)
            modes: dict[str, Measurement] = {}
            for mode in pattern.modes:
                operations = [pattern.bind(region, plan, mode) for region in regions]
                wrong = 0
                for iteration in range(options.checks):
                    region = regions[iteration % len(regions)]
                    pattern.prepare(region, plan, mode, iteration)
                    engine.synchronize()
                    window.barrier()
                    operations[iteration % len(operations)]()
                    engine.synchronize()
                    wrong += pattern.check(region, plan, mode, iteration)
                    window.barrier()  # nobody poisons the next run's output early
                wrong = world.comm.allreduce(wrong, op=MPI.SUM)
                for iteration in range(warmup_iterations(options.warmup, len(operations))):
                    operations[iteration % len(operations)]()
                engine.synchronize()
                if timing == "latency":
                    samples = _latency_samples(world, engine, operations, options.iters)
                    modes[mode] = _latency_measurement(pattern, plan, n, samples, wrong)
                else:
                    seconds = _back_to_back_seconds(world, engine, operations, options.iters)
                    algbw, busbw = pattern.bandwidth(plan, seconds, n)
                    modes[mode] = Measurement(seconds * 1e6, algbw, busbw, wrong)
            row = Row(plan.size, plan.count, modes)
            rows.append(row)
            buffers = rotation_count(plan, rotate)
            for timed, measured in zip(baselines, baseline_rows, strict=True):
                measured.append(_baseline_row(timed, pattern, plan, n, options, timing, buffers))
            say(table.row(row, baseline_rows[0][-1] if baselines else None))
    finally:
        window.close()
    results = [BaselineResult(timed.name, timed.version, measured)
               for timed, measured in zip(baselines, baseline_rows, strict=True)]
    result = RunResult(
        version=__version__, op=pattern.name, backend=group.backend_name, exchange=exchange,
        world_size=n, nodes=world.node_count,
        timing=LATENCY_LABEL if timing == "latency" else "eager", devices=list(devices),
        rows=rows, baseline=results[0] if results else None, extra_baselines=results[1:])
    for line in table.footer(result):
        say(line)
    return result


def _back_to_back_seconds(world: World, engine: Any, operations: list[Callable[[], None]],
                          iters: int) -> float:
    """nccl-tests timing: seconds per operation, averaged over ranks."""
    sequence = [operations[i % len(operations)] for i in range(iters)]
    world.comm.Barrier()
    timer = engine.timer()
    timer.start()
    for operation in sequence:
        operation()
    seconds = timer.stop() / iters
    return world.comm.allreduce(seconds, op=mpi().SUM) / world.size


def _latency_samples(world: World, engine: Any, operations: list[Callable[[], None]],
                     iters: int) -> list[float]:
    """Latency timing: ``iters`` samples of one operation each, started together after a
    barrier, timed by the engine (host clock, or CUDA events on the stream); each sample
    is the slowest rank's."""
    samples = []
    for iteration in range(iters):
        operation = operations[iteration % len(operations)]
        engine.synchronize()
        world.comm.Barrier()
        timer = engine.timer()
        timer.start()
        operation()
        samples.append(timer.stop())
    return slowest_rank_samples(world.comm, samples)


def _latency_measurement(pattern: Pattern, plan: SizePlan, world_size: int,
                         samples: list[float], wrong: int) -> Measurement:
    """The median sample with its bandwidth, and the p5 / p95 spread."""
    summary = summarize_samples(samples)
    algbw, busbw = pattern.bandwidth(plan, summary.p50, world_size)
    return Measurement(summary.p50 * 1e6, algbw, busbw, wrong, p5_us=summary.p5 * 1e6,
                       p95_us=summary.p95 * 1e6)


def _baseline_row(baseline: Any, pattern: Pattern, plan: SizePlan, world_size: int,
                  options: PatternOptions, timing: str, buffers: int) -> Row:
    """One size of a baseline, every mode, timed like ours."""
    modes = {}
    for mode in pattern.modes:
        if timing == "latency":
            samples, wrong = baseline.measure_latency(
                plan, mode, iters=options.iters, warmup=options.warmup, checks=options.checks,
                buffers=buffers)
            modes[mode] = _latency_measurement(pattern, plan, world_size, samples, wrong)
        else:
            seconds, wrong = baseline.measure(plan, mode, iters=options.iters,
                                              warmup=options.warmup, checks=options.checks,
                                              buffers=buffers)
            algbw, busbw = pattern.bandwidth(plan, seconds, world_size)
            modes[mode] = Measurement(seconds * 1e6, algbw, busbw, wrong)
    return Row(plan.size, plan.count, modes)
