"""tools/analysis/alltoall_summary.py: gpu-check's all-to-all sweeps (made-up documents in the
result documents' real shape) on one Markdown page, each baseline beside ours with its
speedup from the same launch, wrong rows shown as such, nccl-tests' table after them."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from ipcshare.patterns.results import BaselineResult, Measurement, Row, RunResult

TOOL = Path(__file__).resolve().parents[2] / "tools" / "analysis" / "alltoall_summary.py"
_spec = importlib.util.spec_from_file_location("alltoall_summary", TOOL)
alltoall_summary = importlib.util.module_from_spec(_spec)
sys.modules["alltoall_summary"] = alltoall_summary   # dataclasses look their module up there
_spec.loader.exec_module(alltoall_summary)

LOG = Path(__file__).parent / "data" / "nccl_tests_two_runs.log"
LABELS = {"nccl": "NCCL called directly (nccl4py)", "torch": "NCCL through torch.distributed",
          "torch-symm": "PyTorch symmetric memory"}


def _document(baseline: str, splits: str, ours: dict[int, float], theirs: dict[int, float],
              *, timing: str = "eager", n: int = 2, wrong_at: int | None = None,
              algo: str = "auto") -> str:
    """One line of results.jsonl as gpu-check's alltoall phase appends it."""
    def row(size, time_us, wrong=0, path=None):
        return Row(size, size // 4, {"out-of-place": Measurement(
            time_us, size / time_us / 1e3, size / time_us / 2e3, wrong, path=path)})
    rows = [row(size, t) for size, t in ours.items()]
    their_rows = [row(size, t, wrong=3 if size == wrong_at else 0,
                      path="plain" if baseline == "nccl" else None)
                  for size, t in theirs.items()]
    result = RunResult(version="0.1.0", op="alltoall", backend="cuda-vmm", exchange="pidfd",
                       world_size=n, nodes=1, timing=timing, devices=[], rows=rows,
                       baseline=BaselineResult(baseline, f"{baseline} 1.0", their_rows,
                                               LABELS[baseline]), splits=splits, algo=algo)
    document = result.to_dict()
    document["alltoall_case"] = f"{splits} {baseline}"
    return json.dumps(document)


@pytest.fixture
def results(tmp_path) -> Path:
    lines = [
        _document("torch", "even", {1024: 10.0, 1 << 20: 20.0}, {1024: 40.0, 1 << 20: 30.0}),
        _document("nccl", "even", {1024: 11.0, 1 << 20: 22.0}, {1024: 22.0, 1 << 20: 44.0}),
        _document("nccl", "random", {1024: 12.0}, {1024: 24.0}, wrong_at=1024),
        _document("nccl", "even", {1024: 5.0}, {1024: 7.5}, timing="graph"),
        _document("nccl", "skewed", {1024: 4.0}, {1024: 8.0}, algo="balanced"),
        json.dumps({"op": "allgather", "collective_case": "allgather-auto"}),
    ]
    path = tmp_path / "results.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_each_table_has_ours_and_every_baseline_with_its_own_launchs_speedup(results):
    tables = alltoall_summary.load([results])
    assert sorted(key.title() for key in tables) == [
        "all-to-all, 2 ranks, even splits, eager", "all-to-all, 2 ranks, even splits, graph",
        "all-to-all, 2 ranks, random splits, eager",
        "all-to-all, 2 ranks, skewed splits, eager, --algo balanced"]
    text = alltoall_summary.page(tables, [])
    even = text.split("### all-to-all, 2 ranks, even splits, eager")[1].split("###")[0]
    # Ours from NCCL's launch; each speedup against ours of its own launch.
    assert "| size | ours µs / busbw GB/s (nccl launch) | nccl µs / busbw | nccl speedup | " \
           "target | torch µs / busbw | torch speedup |" in even
    assert "| 1 KiB | 11.0 / 0.0 | 22.0 / 0.0 plain | 2.00 | — | 40.0 / 0.0 | 4.00 |" in even
    assert "| 1 MiB | 22.0 / 23.8 | 44.0 / 11.9 plain | 2.00 | met | 30.0 / 17.5 | 1.50 |" \
        in even
    assert "- torch: NCCL through torch.distributed, torch 1.0" in even
    random = text.split("### all-to-all, 2 ranks, random splits, eager")[1]
    assert "| 1 KiB | 12.0 / 0.0 | wrong (3) | — | — |" in random
    # Each algorithm of ours its own table (gpu-check's ALLTOALL_ALGOS).
    balanced = text.split("### all-to-all, 2 ranks, skewed splits, eager, --algo balanced")[1]
    assert "| 1 KiB | 4.0 / 0.1 | 8.0 / 0.1 plain | 2.00 | — |" in balanced


def test_nccl_tests_tables_follow_and_the_command_writes_the_page(results, tmp_path, capsys):
    out = tmp_path / "alltoall.md"
    assert alltoall_summary.main([str(results), "--nccl-tests", str(LOG),
                                  str(tmp_path / "absent.log"), "--out", str(out)]) == 0
    text = out.read_text()
    assert text == capsys.readouterr().out
    assert "## nccl-tests alltoall_perf" in text and "| 1 MiB | 14.2 (14.0) |" in text


def test_no_sweep_is_an_error_and_a_bad_line_is_named(tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text(json.dumps({"op": "allgather"}) + "\n")
    assert alltoall_summary.main([str(empty), str(tmp_path / "absent.jsonl")]) == 1
    assert "no all-to-all sweeps (alltoall_case)" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    with pytest.raises(SystemExit, match=r"bad.jsonl:1: not JSON"):
        alltoall_summary.main([str(bad)])


@pytest.mark.parametrize(("splits", "timing", "registered", "size", "ours", "theirs", "bound",
                          "verdict"), [
    # Uneven splits from 1 MiB: 1.2x NCCL's speed and 1.25 x bound + 10 µs.
    ("random", "graph", False, 32 << 20, 100.0, 130.0, 80.0, "met"),
    ("random", "graph", False, 32 << 20, 133.6, 263.6, 90.69,
     "missed: 133.6 > 123.4 µs"),
    ("skewed", "eager", False, 2 << 20, 18.3, 15.2, 5.67,
     "missed: 0.83x < 1.20x, 18.3 > 17.1 µs"),
    ("random", "graph", False, 512 << 10, 9.0, 5.0, 1.0, "—"),          # below 1 MiB: none
    # Even splits: graphs up to 8 KiB at most 7 µs (eager: none).
    ("even", "graph", False, 8 << 10, 4.5, 7.4, None, "met"),
    ("even", "graph", False, 8, 7.4, 6.9, None, "missed: 7.4 > 7 µs"),
    ("even", "eager", False, 8, 13.6, 27.9, None, "—"),
    # 1-16 MiB: at most 0.9x NCCL's time.
    ("even", "graph", False, 4 << 20, 20.5, 20.5, None, "missed: 1.00x NCCL's time > 0.90x"),
    ("even", "graph", False, 16 << 20, 40.9, 49.3, None, "met"),
    ("even", "graph", False, 32 << 20, 73.0, 79.8, None, "—"),           # between: none
    # From 64 MiB: 1.05x NCCL's busbw with plain arrays, 1.15x registered.
    ("even", "graph", False, 256 << 20, 395.6, 437.8, None, "met"),
    ("even", "graph", True, 256 << 20, 387.7, 435.9, None, "missed: 1.12x < 1.15x"),
    ("even", "graph", True, 64 << 20, 108.2, 134.1, None, "met"),
])
def test_each_row_says_whether_it_meets_issue_42s_target(splits, timing, registered, size,
                                                         ours, theirs, bound, verdict):
    key = alltoall_summary.Key(2, splits, timing, "auto", registered)
    our_row = {"time_us": ours, "busbw": 1.0, "wrong": 0}
    if bound is not None:
        our_row["bound_us"] = bound
    their_row = {"time_us": theirs, "busbw": 1.0, "wrong": 0}
    assert alltoall_summary.target(key, size, our_row, their_row) == verdict
    # A side with no usable time has no verdict.
    assert alltoall_summary.target(key, size, our_row, None) == "—"
    assert alltoall_summary.target(key, size, our_row, {**their_row, "wrong": 2}) == "—"


def test_registered_sweeps_are_tables_of_their_own(tmp_path):
    plain = json.loads(_document("nccl", "even", {1 << 20: 20.0}, {1 << 20: 21.0}))
    registered = dict(plain, registered=True)
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps(plain) + "\n" + json.dumps(registered) + "\n")
    titles = sorted(key.title() for key in alltoall_summary.load([path]))
    assert titles == ["all-to-all, 2 ranks, even splits, eager",
                      "all-to-all, 2 ranks, even splits, eager, registered arrays (-R 1)"]
