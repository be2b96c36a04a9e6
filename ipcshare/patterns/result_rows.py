"""The result document's rows (runtime/result_document.py) made from a pattern run's
``--json`` document: one row per size and placement (out of place, and in place where it
was timed), ours beside each baseline of the same launch. Reads the ``--json`` contract
(docs/CLI.md), so documents written before the result document existed convert alike."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..runtime.result_document import baseline_figure, figure, make_row

__all__ = ["rows_from_run_json", "mode_of_run_json"]

_OPTIONAL_TIMES = ("p5_us", "p95_us", "wall_us", "host_us")
# Keys of a --json row that the result row holds in its own fields.
_FIGURE_KEYS = {"size", "count", "time_us", "algbw", "busbw", "wrong", "in_place", "errors",
                "p50_us", "clock_rechecks", "wrong_paths", "path", *_OPTIONAL_TIMES,
                "time_us_min", "time_us_max", "busbw_min", "busbw_max"}
# Facts of the whole run that every row repeats under details.
_RUN_DETAILS = ("backend", "exchange", "nodes", "splits", "registered", "inter",
                "after_kernel", "statistic", "checked")


def mode_of_run_json(document: Mapping[str, Any]) -> str:
    """``latency`` for a run timed by single-call samples (``statistic`` median), else
    its ``timing``: ``eager`` or ``graph``."""
    if document.get("statistic") == "median":
        return "latency"
    return "graph" if document.get("timing") == "graph" else "eager"


def _ours(measured: Mapping[str, Any]) -> dict[str, Any]:
    return figure(measured.get("time_us"), measured.get("algbw"), measured.get("busbw"),
                  **{key: measured.get(key) for key in _OPTIONAL_TIMES})


def _baseline(baseline: Mapping[str, Any], measured: Mapping[str, Any]) -> dict[str, Any]:
    errors = measured.get("errors") or []
    return baseline_figure(
        baseline["name"], measured.get("time_us"), measured.get("algbw"),
        measured.get("busbw"), wrong=measured.get("wrong"),
        error="; ".join(errors) if errors else None, version=baseline.get("version"),
        path=measured.get("path"), **{key: measured.get(key) for key in _OPTIONAL_TIMES})


def rows_from_run_json(document: Mapping[str, Any], *, launch: str,
                       dtype: str | None = None, algorithm: str | None = None,
                       extra_baselines: Iterable[Mapping[str, Any]] = ()
                       ) -> list[dict[str, Any]]:
    """Result rows of one run's ``--json`` ``document``, all of launch ``launch``.

    ``dtype`` and ``algorithm`` name what the ``--json`` document may not (it holds
    ``algo`` for all-to-all only); ``extra_baselines`` are further baselines timed in
    the same run (``bench`` with several), as ``BaselineResult.to_dict`` writes them.

    Raises:
        KeyError: ``document`` lacks a key of the ``--json`` contract.
    """
    baselines = ([document["baseline"]] if document.get("baseline") else [])
    baselines += list(extra_baselines)
    by_size = [{row["size"]: row for row in baseline["rows"]} for baseline in baselines]
    run_details = {key: document[key] for key in _RUN_DETAILS if key in document}
    mode = mode_of_run_json(document)
    if mode == "latency" and document.get("timing") == "graph":
        run_details["graph"] = True
    rows = []
    for row in document["rows"]:
        facts = {key: value for key, value in row.items() if key not in _FIGURE_KEYS}
        placements = [("out-of-place", row, [b.get(row["size"], {}) for b in by_size])]
        if row.get("in_place"):
            placements.append(("in-place", row["in_place"],
                               [(b.get(row["size"]) or {}).get("in_place") or {}
                                for b in by_size]))
        for placement, measured, theirs in placements:
            timed = [(baseline, their) for baseline, their in zip(baselines, theirs,
                                                                   strict=True) if their]
            errors = list(measured.get("errors") or [])
            errors += [f"{baseline['name']} baseline: {error}" for baseline, their in timed
                       for error in their.get("errors") or []]
            rows.append(make_row(
                op=document["op"], size=row["size"], count=row.get("count"), dtype=dtype,
                algorithm=algorithm or document.get("algo") or "auto", mode=mode,
                placement=placement, world_size=document["world_size"], launch=launch,
                ours=_ours(measured),
                baselines=[_baseline(baseline, their) for baseline, their in timed],
                wrong=measured.get("wrong"), errors=errors,
                details={**run_details, **facts}))
    return rows
