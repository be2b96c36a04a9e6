"""The one driver every pattern shares: size sweep, checks, warm-up, timing, baseline,
table rows as they are measured, and the result document."""

from __future__ import annotations

import time
from collections.abc import Callable

from .. import __version__
from ..config import PatternOptions
from ..topology import mpi
from ..window import Group
from .base import Pattern
from .results import BaselineResult, Measurement, Row, RunResult
from .table import Table

__all__ = ["run_pattern"]


def run_pattern(group: Group, pattern: Pattern, options: PatternOptions, *,
                emit: Callable[[str], None] = print, baseline=None) -> RunResult:
    """Collective: sweep ``options``' sizes with ``pattern`` over ``group``.

    ``emit`` receives the table lines (rank 0 only); ``baseline`` (an object with
    ``name``, ``version`` and ``measure``) is timed on the same sizes in the same run.
    """
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
    window = group.window(max(pattern.window_bytes(plan, n) for plan in plans))
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
    rank_lines.append(f"#  window setup: {setup_ms:.2f} ms for {window.total_bytes} bytes per rank "
                      "(slowest rank): " + ", ".join(f"{k} {v:.2f}" for k, v in steps.items()))
    for line in table.header(title, rank_lines):
        say(line)

    engine = window.engine
    rows: list[Row] = []
    baseline_rows: list[Row] = []
    try:
        for plan in plans:
            modes: dict[str, Measurement] = {}
            for mode in pattern.modes:
                operation = pattern.bind(window, plan, mode)
                wrong = 0
                for iteration in range(options.checks):
                    pattern.prepare(window, plan, mode, iteration)
                    engine.synchronize()
                    window.barrier()
                    operation()
                    engine.synchronize()
                    wrong += pattern.check(window, plan, mode, iteration)
                    window.barrier()  # nobody poisons the next run's output early
                wrong = world.comm.allreduce(wrong, op=MPI.SUM)
                for _ in range(options.warmup):
                    operation()
                engine.synchronize()
                world.comm.Barrier()
                timer = engine.timer()
                timer.start()
                for _ in range(options.iters):
                    operation()
                seconds = timer.stop() / options.iters
                seconds = world.comm.allreduce(seconds, op=MPI.SUM) / n
                algbw, busbw = pattern.bandwidth(plan, seconds, n)
                modes[mode] = Measurement(seconds * 1e6, algbw, busbw, wrong)
            row = Row(plan.size, plan.count, modes)
            rows.append(row)
            brow = None
            if baseline is not None:
                bmodes = {}
                for mode in pattern.modes:
                    seconds, bwrong = baseline.measure(plan, mode, iters=options.iters,
                                                       warmup=options.warmup, checks=options.checks)
                    algbw, busbw = pattern.bandwidth(plan, seconds, n)
                    bmodes[mode] = Measurement(seconds * 1e6, algbw, busbw, bwrong)
                brow = Row(plan.size, plan.count, bmodes)
                baseline_rows.append(brow)
            say(table.row(row, brow))
    finally:
        window.close()
    result = RunResult(
        version=__version__, op=pattern.name, backend=group.backend_name, exchange=exchange,
        world_size=n, nodes=world.node_count, timing="eager", devices=list(devices),
        rows=rows,
        baseline=None if baseline is None else BaselineResult(baseline.name, baseline.version,
                                                              baseline_rows))
    for line in table.footer(result):
        say(line)
    return result
