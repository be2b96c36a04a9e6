"""A row of ``ipcshare vs-torch``: its figures reduced over the ranks, then judged: wrong
elements, each busbw against the links' ceiling, and ratios only where every check
passed and both sides have a right figure."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..patterns.clock_check import ceiling_error
from ..runtime.config import format_size
from ..topology.link_speed import Ceiling
from .plan import MODES, SIDES, SizePlan, busbw

__all__ = ["max_over_ranks", "new_row", "judge_row", "failure_kind"]


def max_over_ranks(comm: Any, values: Sequence[float], max_op: Any) -> np.ndarray:
    """Collective: each of ``values`` as the largest any rank of ``comm`` gave, reduced
    as one float64 buffer (``max_op``: ``MPI.MAX``). Never a pickled tuple: mpi4py
    "sums" those by concatenating them."""
    mine = np.ascontiguousarray(values, dtype=np.float64)
    largest = np.empty_like(mine)
    comm.Allreduce(mine, largest, op=max_op)
    return largest



def new_row(plan: SizePlan) -> dict[str, Any]:
    """A row before it is measured: no figure, no error (``step_failed``: a step of it
    raised on some rank, rather than a check finding a figure wrong)."""
    return {"op": plan.op, "size": plan.size, "in_count": plan.in_count,
            "out_count": plan.out_count,
            "ours": {"refused": None, "wrong": None, "wrong_by_call": {}},
            "torch": {"wrong": None, "wrong_by_call": {}},
            "errors": [], "step_failed": False, "ok": None,
            "ratios": {mode: None for mode in MODES}}


def _usable(figures: dict[str, Any]) -> bool:
    return not figures.get("refused") and not figures.get("wrong")


def judge_row(row: dict[str, Any], *, world: int, ceiling: Ceiling | None) -> dict[str, Any]:
    """Finish ``row`` (in place, and returned): busbw of each figure held against
    ``ceiling``, wrong elements as errors, ``ok``, and ratios ours / torch only where
    the row passed every check and both sides have a right figure."""
    errors = list(row["errors"])
    for side in SIDES:
        figures = row[side]
        if figures.get("refused"):
            continue
        if figures.get("wrong"):
            detail = ", ".join(f"{call} {n}" for call, n in figures["wrong_by_call"].items())
            errors.append(f"{side}: {figures['wrong']} wrong elements over the ranks "
                          f"({detail})")
            continue
        for mode in MODES:
            us = figures.get(f"{mode}_us")
            if us is None or us <= 0:
                continue
            bandwidth = busbw(row["op"], row["size"], us * 1e-6, world)
            figures[f"{mode}_busbw"] = round(bandwidth, 3)
            problem = ceiling_error(bandwidth, ceiling,
                                    f"{side} {mode} {row['op']} {format_size(row['size'])}")
            if problem:
                errors.append(problem)
    row["errors"] = errors
    row["ok"] = not errors
    for mode in MODES:
        ours, theirs = row["ours"].get(f"{mode}_us"), row["torch"].get(f"{mode}_us")
        usable = row["ok"] and _usable(row["ours"]) and _usable(row["torch"])
        row["ratios"][mode] = (round(ours / theirs, 4) if usable and ours is not None
                               and theirs else None)
    return row


def failure_kind(rows: Sequence[dict[str, Any]]) -> str | None:
    """What went worst over judged ``rows``: ``"step"`` (a step raised on some rank),
    ``"wrong"`` (wrong elements on either side), ``"check"`` (a figure that failed the
    second clock or the ceiling), or None when every row passed."""
    if any(row["step_failed"] for row in rows):
        return "step"
    if any(row[side].get("wrong") for row in rows for side in SIDES):
        return "wrong"
    return None if all(row["ok"] for row in rows) else "check"
