"""``ipcshare doctor``: validate memory sharing on every node of a job by doing it, and
name the root cause and the fix of every failure.

Modules, one idea each: ``plan`` (sizes, bounds, thresholds), ``environment`` (what each
rank's process sees), ``paths`` (the ways memory is shared), ``matrix`` (the capability
matrix), ``bandwidth`` (per-pair bandwidth and latency), ``limits`` (limits and the leak
check), ``rules`` (root causes), ``verdict`` (checks and the document), ``report``
(table, files, progress), ``cluster`` (the summary), ``liveness`` (deadlines between
ranks) and ``runner`` (the stages). Importing this package loads none of them: MPI and
CUDA start only when a run does.
"""

from __future__ import annotations

__all__ = ["run_doctor", "DoctorPlan", "DoctorOutcome"]


def __getattr__(name: str):
    if name in ("run_doctor", "DoctorOutcome"):
        from . import runner

        return getattr(runner, name)
    if name == "DoctorPlan":
        from .plan import DoctorPlan

        return DoctorPlan
    raise AttributeError(f"module 'ipcshare.doctor' has no attribute {name!r}")
