"""tools/analysis/timer_consistency.py: the rule that eager, graph and latency timings of one
operation tell one story, and its reading of result documents."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

_PATH = Path(__file__).resolve().parents[2] / "tools" / "analysis" / "timer_consistency.py"
_spec = importlib.util.spec_from_file_location("timer_consistency", _PATH)
tool = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tool)


def test_the_broken_timer_of_2026_11_26_does_not_tell_one_story():
    assert not tool.consistent(eager=2.64, graph=8.91, latency=21.0)
    assert tool.consistent(eager=10.87, graph=8.71, latency=20.16)
    assert not tool.consistent(eager=80.0, graph=8.7, latency=20.0)   # slower than alone


def _doc(op, mode, ours, theirs, **extra):
    return {"timer_case": f"{op}-{mode}",
            "rows": [{"size": 8, "time_us": ours, "wrong": 0, **extra}],
            "baseline": {"rows": [{"size": 8, "time_us": theirs, "wrong": 0}]}}


def test_rows_are_judged_per_side_and_errors_fail(tmp_path):
    good = [_doc("allreduce", "eager", 10.9, 22.1), _doc("allreduce", "graph", 8.7, 4.2),
            _doc("allreduce", "latency", 20.2, 31.7)]
    results = tmp_path / "results.jsonl"
    results.write_text("\n".join(json.dumps(d) for d in good) + "\n")
    assert tool.main([str(results), "--markdown", str(tmp_path / "t.md")]) == 0
    assert "| 8 | 10.87 |" not in (tmp_path / "t.md").read_text()
    assert "| 8 | 10.90 | 8.70 | 20.20 | yes | 22.10 | 4.20 | 31.70 | yes |" in (
        tmp_path / "t.md").read_text()
    bad = good[:2] + [_doc("allreduce", "latency", 20.2, 31.7, errors=["rank 0: ..."])]
    results.write_text("\n".join(json.dumps(d) for d in bad) + "\n")
    assert tool.main([str(results)]) == 1
    results.write_text("")
    assert tool.main([str(results)]) == 2
