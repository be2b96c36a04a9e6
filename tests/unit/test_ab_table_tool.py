"""tools/analysis/ab_table.py: two trees' sweeps of one launch side by side, with NCCL's figure of
each side's own launch, and rows that are not results counted as failures."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

_PATH = Path(__file__).resolve().parents[2] / "tools" / "analysis" / "ab_table.py"
_spec = importlib.util.spec_from_file_location("ab_table", _PATH)
tool = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tool)


def _doc(case, side, ours, nccl, **row_extra):
    return {"ab_case": case, "ab_side": side,
            "rows": [{"size": size, "time_us": t, "wrong": 0, **row_extra}
                     for size, t in ours.items()],
            "baseline": {"name": "nccl",
                         "rows": [{"size": size, "time_us": t, "wrong": 0}
                                  for size, t in nccl.items()]}}


def _write(tmp_path, documents):
    path = tmp_path / "results.jsonl"
    # Documents of other phases share the file: they are left out.
    lines = [json.dumps({"timer_case": "allreduce-graph", "rows": []})]
    lines += [json.dumps(d) for d in documents]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_each_size_shows_both_trees_and_each_launchs_nccl(tmp_path, capsys):
    case = "4 reducescatter ll 2M --graph"
    path = _write(tmp_path, [
        _doc(case, "base", {16: 4.57, 2097152: 15.16}, {16: 4.17, 2097152: 12.49}),
        _doc(case, "this", {16: 4.42, 2097152: 14.80}, {16: 4.83, 2097152: 12.43})])
    out = tmp_path / "ab.md"
    assert tool.main([str(path), "--markdown", str(out)]) == 0
    text = out.read_text()
    assert text == capsys.readouterr().out
    assert f"### {case}" in text
    assert "| 16 | 4.57 | 4.17 | 4.42 | 4.83 | 0.97 |" in text
    assert "| 2097152 | 15.16 | 12.49 | 14.80 | 12.43 | 0.98 |" in text
    assert text.rstrip().endswith("measuring one tree): 0")


def test_a_retried_side_keeps_its_later_document(tmp_path):
    case = "2 allgather ll 2M --graph"
    path = _write(tmp_path, [_doc(case, "base", {8: 9.0}, {8: 4.0}),
                             _doc(case, "base", {8: 4.4}, {8: 3.9}),
                             _doc(case, "this", {8: 4.2}, {8: 3.9})])
    out = tmp_path / "ab.md"
    assert tool.main([str(path), "--markdown", str(out)]) == 0
    assert "| 8 | 4.40 | 3.90 | 4.20 | 3.90 | 0.95 |" in out.read_text()


def test_wrong_rows_measurement_errors_and_missing_sides_fail(tmp_path):
    case = "4 allreduce ll 2M --graph"
    wrong = _doc(case, "this", {8: 4.0}, {8: 3.9})
    wrong["rows"][0]["wrong"] = 3
    path = _write(tmp_path, [_doc(case, "base", {8: 4.1}, {8: 3.9}), wrong])
    out = tmp_path / "ab.md"
    assert tool.main([str(path), "--markdown", str(out)]) == 1
    assert "| 8 | 4.10 | 3.90 | - | 3.90 | - |" in out.read_text()
    erred = _doc(case, "this", {8: 4.0}, {8: 3.9}, errors=["rank 1: the host clock ..."])
    path = _write(tmp_path, [_doc(case, "base", {8: 4.1}, {8: 3.9}), erred])
    assert tool.main([str(path)]) == 1
    path = _write(tmp_path, [_doc(case, "this", {8: 4.0}, {8: 3.9})])
    assert tool.main([str(path), "--markdown", str(out)]) == 1
    assert "No result from the base tree" in out.read_text()


def test_no_ab_results_or_unreadable_input_exit_2(tmp_path, capsys):
    path = _write(tmp_path, [])
    assert tool.main([str(path)]) == 2
    assert "no ab results" in capsys.readouterr().err
    path.write_text("not json\n")
    assert tool.main([str(path)]) == 2
    assert tool.main([str(tmp_path / "absent.jsonl")]) == 2


def test_two_sides_that_imported_one_package_fail(tmp_path):
    case = "4 allgather ll 2M --graph"
    base = _doc(case, "base", {8: 4.4}, {8: 3.9})
    this = _doc(case, "this", {8: 4.2}, {8: 3.9})
    base["ab_package"] = this["ab_package"] = "/node/tree/ipcshare"
    path = _write(tmp_path, [base, this])
    out = tmp_path / "ab.md"
    assert tool.main([str(path), "--markdown", str(out)]) == 1
    assert "one tree was measured twice" in out.read_text()
    base["ab_package"] = "/node/tree/ab-base/ipcshare"
    path = _write(tmp_path, [base, this])
    assert tool.main([str(path)]) == 0


def test_another_baseline_names_its_columns(tmp_path):
    case = "2 allgather auto 1K"
    base, this = _doc(case, "base", {8: 1.2}, {8: 2.3}), _doc(case, "this", {8: 1.0}, {8: 2.3})
    base["baseline"]["name"] = this["baseline"]["name"] = "mpi"
    out = tmp_path / "ab.md"
    assert tool.main([str(_write(tmp_path, [base, this])), "--markdown", str(out)]) == 0
    assert "| size (B) | base | mpi (base launch) | this | mpi (this launch) |" in out.read_text()
