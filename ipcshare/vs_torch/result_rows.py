"""The result document's rows (runtime/result_document.py) of an ``ipcshare vs-torch``
run: one per op, size and mode (graph, eager), ours beside NCCL through torch.distributed
timed in the same launch."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..runtime.result_document import baseline_figure, figure, make_row
from .plan import MODES

__all__ = ["vs_torch_rows", "OP_NAMES"]

# The library's names of the ops, as the pattern commands spell them.
OP_NAMES = {"all_reduce": "allreduce", "all_gather": "allgather",
            "reduce_scatter": "reducescatter", "all_to_all": "alltoall"}


def _is_wrong_line(error: str) -> bool:
    """judge_row's line for wrong elements (counted in ``wrong``, not a measurement
    error)."""
    side, _, rest = error.partition(": ")
    return side in ("ours", "torch") and " wrong elements over the ranks" in rest


def vs_torch_rows(results: Mapping[str, Any], *, launch: str) -> list[dict[str, Any]]:
    """Result rows of ``results`` (``TorchComparison.run``'s dict): a row per mode of
    each row with a figure on either side; a side refused or without a figure is
    absent (ours null, or no baseline)."""
    world = results["facts"]["world_size"]
    dtype = results["options"]["dtype"]
    rows = []
    for row in results["rows"]:
        errors = [error for error in row["errors"] if not _is_wrong_line(error)]
        ours_side, torch_side = row["ours"], row["torch"]
        for mode in MODES:
            ours_us, torch_us = ours_side.get(f"{mode}_us"), torch_side.get(f"{mode}_us")
            ours = None
            if ours_us and not ours_side.get("refused"):
                ours = figure(ours_us, None, ours_side.get(f"{mode}_busbw"),
                              wall_us=ours_side.get(f"{mode}_host_clock_us"),
                              host_us=ours_side.get("host_bound_us") if mode == "eager"
                              else None)
            baselines = []
            if torch_us or torch_side.get("wrong"):
                baselines.append(baseline_figure(
                    "torch", torch_us, None, torch_side.get(f"{mode}_busbw"),
                    wrong=torch_side.get("wrong"),
                    wall_us=torch_side.get(f"{mode}_host_clock_us"),
                    host_us=torch_side.get("host_us") if mode == "eager" else None))
            if ours is None and not baselines:
                continue
            details = {"ratio": row["ratios"].get(mode), "in_count": row.get("in_count"),
                       "out_count": row.get("out_count")}
            if ours_side.get("refused"):
                details["refused"] = ours_side["refused"]
            rows.append(make_row(
                op=OP_NAMES.get(row["op"], row["op"]), size=row["size"],
                count=row.get("in_count"), dtype=dtype, algorithm="auto", mode=mode,
                world_size=world, launch=launch, ours=ours, baselines=baselines,
                wrong=ours_side.get("wrong"), errors=errors, details=details))
    return rows
