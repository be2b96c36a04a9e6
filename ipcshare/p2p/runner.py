"""``ipcshare p2p`` from start to end: take every visible GPU, enable peer access pair by
pair, sweep the sizes of each op in each direct mode, run the IPC half, print the
nccl-tests-style tables and build the ``--json`` document."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from .. import __version__
from ..patterns.clock_check import ceiling_error
from ..patterns.results import Row
from ..patterns.table import Table
from ..runtime.config import PatternOptions, format_size
from ..runtime.errors import BackendUnavailable
from ..topology.link_speed import gpu_ceiling
from .direct import MODES, OPS, DirectBuffers, events_needed, measure_direct, pattern_of
from .gpus import P2P_MAX_TARGETS, GpuSet, visible_gpus
from .ipc_half import IpcRun, merge_rows, run_ipc_half
from .peer_access import describe_pairs, disable_peer_access, enable_peer_access

__all__ = ["P2pOptions", "run_p2p", "TABLE_MODES"]

# Column groups of the table, in order: the direct modes, then IPC.
TABLE_MODES = tuple(f"p2p-{mode}" for mode in MODES) + ("ipc",)


@dataclasses.dataclass(frozen=True)
class P2pOptions:
    """What one ``ipcshare p2p`` run does. ``peer_access=False`` leaves peer access off:
    copies then go host-staged and the kernel mode cannot run."""

    sweep: PatternOptions = PatternOptions()  # sizes, iterations, warm-up, checks
    ops: tuple[str, ...] = OPS
    modes: tuple[str, ...] = MODES
    peer_access: bool = True
    mpiexec: tuple[str, ...] | None = None  # None: no IPC half
    ipc_timeout_s: float = 600.0


def _gpu_count() -> int:
    count = visible_gpus()
    if count < 2:
        raise BackendUnavailable(f"only {count} GPU is visible to this process")
    return min(count, P2P_MAX_TARGETS)


def run_p2p(options: P2pOptions, *, emit: Callable[[str], None] = print) -> dict[str, Any]:
    """Run every op of ``options`` and return the ``--json`` document (``wrong_total`` is
    the mismatch count over every direct and IPC row).

    Raises:
        BackendUnavailable: fewer than 2 GPUs visible (the message says why).
        CudaError, KernelCompileError: the direct half failed.
    """
    count = _gpu_count()
    from ..topology import devices

    names = [d["name"] for d in devices.describe_devices()[:count]]
    document: dict[str, Any] = {"ipcshare": __version__, "op": "p2p", "gpus": count,
                                "devices": names, "peer_access_enabled": options.peer_access,
                                "ops": {}}
    started = time.perf_counter()
    with GpuSet(count, events_per_gpu=events_needed(count)) as gpus:
        context_ms = (time.perf_counter() - started) * 1e3
        pairs = enable_peer_access(gpus, enable=options.peer_access)
        try:
            document["peer_access"] = [pair.to_dict() for pair in pairs]
            document["setup_ms"] = {"contexts_streams_kernels": round(context_ms, 3),
                                    "peer_access": round(sum(p.setup_ms for p in pairs), 3)}
            every_pair = all(pair.enabled for pair in pairs)
            modes = [m for m in options.modes if m == "copy" or every_pair]
            for op in options.ops:
                document["ops"][op] = _run_op(gpus, op, modes, options, pairs, emit)
        finally:
            disable_peer_access(gpus, pairs)
    document["wrong_total"] = sum(entry["wrong_total"] for entry in document["ops"].values())
    document["measurement_errors"] = [error for entry in document["ops"].values()
                                      for error in entry["measurement_errors"]]
    return document


def _run_op(gpus: GpuSet, op: str, modes: list[str], options: P2pOptions, pairs: list,
            emit: Callable[[str], None]) -> dict[str, Any]:
    pattern, sweep = pattern_of(op), options.sweep
    plans = []
    for size in sweep.sizes():
        plan = pattern.plan(size, gpus.count, 4)
        if not plans or plans[-1].size != plan.size:
            plans.append(plan)
    started = time.perf_counter()
    buffers = DirectBuffers(gpus, max(plan.block_bytes for plan in plans))
    allocate_ms = (time.perf_counter() - started) * 1e3
    # The direct half's figures are held against GPU 0's links (all alike on the nodes
    # it runs on); the IPC half's rows come checked by the driver of its own job.
    ceiling = gpu_ceiling(0, shares_gpu=False) if gpus.count > 1 else None
    rows = []
    for plan in plans:
        measured = {f"p2p-{mode}": measure_direct(gpus, buffers, op, mode, plan,
                                                  iters=sweep.iters, warmup=sweep.warmup,
                                                  checks=sweep.checks)
                    for mode in modes}
        for name, m in measured.items():
            over = ceiling_error(m.busbw, ceiling, f"{format_size(plan.size)} {name}")
            m.errors = [over] if over else []
        rows.append(Row(plan.size, plan.count, measured))
    ipc = None
    if options.mpiexec is not None:
        ipc = run_ipc_half(op, gpus.count, mpiexec=list(options.mpiexec),
                           sweep=sweep, timeout_s=options.ipc_timeout_s)
        rows = merge_rows(rows, ipc)
    _print_table(op, gpus.count, rows, options, pairs, modes, allocate_ms, ipc, emit)
    return _op_document(rows, allocate_ms, ipc)


def _print_table(op: str, count: int, rows: list[Row], options: P2pOptions, pairs: list,
                 modes: list[str], allocate_ms: float, ipc: IpcRun | None,
                 emit: Callable[[str], None]) -> None:
    enabled = [p for p in pairs if p.enabled]
    lines = [f"#  one process, {count} GPUs; peer access "
             + (f"enabled for {len(enabled)} of {len(pairs)} ordered pairs in "
                f"{sum(p.setup_ms for p in enabled):.2f} ms (cuCtxEnablePeerAccess)"
                if options.peer_access else "left off on purpose: peer copies are host-staged")]
    lines += [f"#  no peer access: {line}" for line in describe_pairs(pairs)
              if options.peer_access]
    if "kernel" in options.modes and "kernel" not in modes:
        lines.append("#  p2p-kernel skipped: a kernel can only dereference peers it has "
                     "access to")
    lines.append(f"#  p2p buffers: {allocate_ms:.2f} ms to allocate (cuMemAlloc on every GPU); "
                 "p2p-kernel: p2p_push stores through peer pointers; p2p-copy: "
                 "cuMemcpyPeerAsync")
    if ipc is None:
        lines.append("#  ipc: not run (--no-ipc)")
    elif ipc.error:
        lines.append(f"#  ipc: failed: {ipc.error}")
    else:
        lines.append(f"#  ipc: one process per GPU ({' '.join(ipc.command[:3])} ... "
                     f"--backend cuda-vmm); window setup {ipc.setup_ms} ms (slowest rank)")
    sweep = options.sweep
    table = Table(TABLE_MODES, "float", None, checked=sweep.checks > 0)
    title = (f"ipcshare {__version__}  op: p2p {op}  GPUs: {count}  iters: {sweep.iters}  "
             f"warmup: {sweep.warmup}  checks: {sweep.checks}  timing: host wall clock, "
             "back-to-back")
    for line in table.header(title, lines):
        emit(line)
    for row in rows:
        emit(table.row(row, None))
        for line in table.notes(row, None):
            emit(line)
    emit(Table.verdict(sum(row.wrong for row in rows), sweep.checks > 0))
    for mode in TABLE_MODES:
        values = [row.modes[mode].busbw for row in rows if mode in row.modes]
        if values:
            emit(f"# Avg bus bandwidth {mode:<11}: {sum(values) / len(values):.3f}")
    emit("#")


def _op_document(rows: list[Row], allocate_ms: float, ipc: IpcRun | None) -> dict[str, Any]:
    first = rows[0] if rows else None
    return {
        "rows": [{"size": row.size, "count": row.count,
                  **{mode.replace("-", "_"): m.to_dict() for mode, m in row.modes.items()}}
                 for row in rows],
        "allocate_ms": round(allocate_ms, 3),
        "latency_us": ({mode.replace("-", "_"): round(m.time_us, 3)
                        for mode, m in first.modes.items()} if first else {}),
        "ipc": None if ipc is None else {"command": ipc.command, "setup_ms": ipc.setup_ms,
                                         "error": ipc.error},
        "wrong_total": sum(row.wrong for row in rows),
        "measurement_errors": [error for row in rows for m in row.modes.values()
                               for error in m.errors],
    }
