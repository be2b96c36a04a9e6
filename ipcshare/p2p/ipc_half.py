"""The IPC half of ``ipcshare p2p``: the same op and sizes through IPC windows, run as what
IPC is, one process per GPU: ``mpiexec -n <GPUs> python -m ipcshare <op> --backend cuda-vmm``
as a child process, whose ``--json`` rows and window setup time are read back.

A child job, not an in-process import of our own exports: an IPC handle opened by the
process that made it measures neither the exchange nor the second process's mapping, so
it would flatter IPC.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import sys
from pathlib import Path

from ..patterns.results import Measurement, Row
from ..runtime.config import PatternOptions
from .child_job import ipcshare_command, run_child

__all__ = ["IpcRun", "default_mpiexec", "run_ipc_half", "parse_window_setup_ms", "merge_rows"]

_SETUP = re.compile(r"window setup: ([0-9.]+) ms")


@dataclasses.dataclass
class IpcRun:
    """Rows by size (``None`` values when the child failed), the window setup time, the
    command, and the error line when it failed."""

    command: list[str]
    rows: dict[int, Measurement]
    setup_ms: float | None = None
    error: str | None = None


def default_mpiexec() -> str | None:
    """The mpiexec next to this Python (a virtual environment's MPI), else on PATH."""
    return shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or \
        shutil.which("mpiexec")


def parse_window_setup_ms(stdout: str) -> float | None:
    """The ``# window setup: X ms`` of an ``ipcshare ring|allgather`` table."""
    match = _SETUP.search(stdout)
    return float(match.group(1)) if match else None


def run_ipc_half(op: str, ranks: int, *, mpiexec: list[str], sweep: PatternOptions,
                 timeout_s: float) -> IpcRun:
    """Run ``op`` through IPC windows on ``ranks`` processes; never raises for the child's
    failure (it becomes ``error``: its last stderr line)."""
    run = run_child([*mpiexec, "-n", str(ranks), *ipcshare_command(
        op, "--backend", "cuda-vmm", "-b", str(sweep.min_bytes), "-e", str(sweep.max_bytes),
        "-f", str(sweep.step_factor), "-n", str(sweep.iters), "-w", str(sweep.warmup),
        "-c", str(sweep.checks))], timeout_s=timeout_s)
    if run.error is not None:
        return IpcRun(run.command, {}, error=run.error)
    rows = {row["size"]: Measurement.from_dict(row) for row in run.document["rows"]}
    return IpcRun(run.command, rows, setup_ms=parse_window_setup_ms(run.stdout))


def merge_rows(direct: list[Row], ipc: IpcRun) -> list[Row]:
    """``direct`` rows with the IPC measurement of the same size added as mode ``ipc``."""
    return [Row(row.size, row.count, {**row.modes, "ipc": ipc.rows[row.size]})
            if row.size in ipc.rows else row for row in direct]
