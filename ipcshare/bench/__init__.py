"""``ipcshare bench``: a suite of cases (ops x backends x algorithms x timing modes x
sizes) run in one launch against MPI and NCCL, with JSON, plot and Markdown outputs."""

from __future__ import annotations

__all__: list[str] = []
