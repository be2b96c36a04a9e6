"""What bench writes, from results made by hand: the summary, the Markdown report, the
plot (a real PNG, ceilings chosen by backend), the progress line, and the clear error
when matplotlib is missing."""

from __future__ import annotations

import io
import json
import sys

import pytest

from ipcshare.bench.plot import NVLINK4_GBPS, ceilings, require_matplotlib, write_plot
from ipcshare.bench.progress import ProgressLine
from ipcshare.bench.report import render_markdown, summary_lines, write_markdown
from ipcshare.bench.runner import BenchResult, CaseResult, SkippedBaseline
from ipcshare.bench.suite import parse_suite
from ipcshare.patterns.results import BaselineResult, Measurement, Row, RunResult
from ipcshare.runtime.errors import ConfigError

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SIZES = [1 << 10, 1 << 16, 1 << 20, 1 << 24]
FACTS = {"ipcshare": "0.1.0", "world_size": 2, "nodes": 1, "date": "2026-11-22 10:00 UTC",
         "commit": "abc123", "hosts": {"node1": {"cpus": 2, "usable_cpus": 2, "ranks": 2}},
         "mpi": "MPICH Version: 5.0.2", "python": "3.11", "numpy": "2.4",
         "command": "mpiexec -n 2 ipcshare bench --config s.yaml"}


def _rows(op, times, latency):
    mode = "ring" if op == "ring" else "out-of-place"
    return [Row(size, size // 4, {mode: Measurement(
        t, size / t / 1e3, size / t / 2e3, 0, p5_us=t * 0.9 if latency else None,
        p95_us=t * 1.3 if latency else None)}) for size, t in zip(SIZES, times, strict=True)]


def _result(backend="host", baselines=("mpi",), repeat=1, ops=("allgather", "ring"),
            reductions=("sum",)):
    suite = parse_suite({"ops": list(ops), "backends": [backend], "reductions": list(reductions),
                         "timing": ["nccl-tests", "latency"], "baselines": list(baselines),
                         "min_bytes": "1K", "max_bytes": "16M", "step_factor": 64,
                         "repeat": repeat}, source="suite.yaml", resolve_backend=lambda b: b)
    cases = []
    for index, case in enumerate(suite.cases):
        latency = case.timing == "latency"
        ours = [2.0 + index, 5.0, 40.0, 900.0]
        timed = [BaselineResult(name, f"{name} 1.0",
                                _rows(case.op, [t * (2 + k) for t in ours], latency))
                 for k, name in enumerate(b for b in baselines if b == "mpi" or backend != "host")]
        runs = [RunResult("0.1.0", case.op, backend, "pidfd", 2, 1, "eager",
                          ["host"] * 2 if backend == "host" else ["H200 #0", "H200 #1"],
                          _rows(case.op, [t * (1 + rep / 10) for t in ours], latency),
                          timed[0] if timed else None,
                          extra_baselines=timed[1:],
                          statistic="median" if latency else "mean")
                for rep in range(repeat)]
        skipped = ([SkippedBaseline("nccl", "NCCL runs on GPU memory only")]
                   if backend == "host" and "nccl" in baselines else [])
        cases.append(CaseResult(case, runs, skipped))
    return BenchResult(suite, cases, elapsed_s=1.5)


def test_summary_lines_give_a_ratio_per_band_and_the_notes():
    lines = summary_lines(_result(baselines=("mpi", "nccl")))
    text = "\n".join(lines)
    assert "<= 64K" in text and "> 64K, < 16M" in text and ">= 16M" in text
    allgather = next(line for line in lines if "allgather host single-copy nccl-tests" in line)
    # mpi takes twice our time everywhere: a speedup of 2, read as the table's column is
    assert "mpi" in allgather and "2.00" in allgather and "0.50" not in allgather
    assert "speedup = baseline time / our time" in text and "above 1 = ours is faster" in text
    assert "nccl baseline skipped in 4 case(s): NCCL runs on GPU memory only" in text
    assert lines[-1].endswith("wrong elements: 0 OK; measurement errors: 0 OK")


def test_markdown_report_has_machine_tables_summary_and_plot_link(tmp_path):
    result = _result(repeat=3)
    path = tmp_path / "report" / "bench.md"
    path.parent.mkdir()
    write_markdown(result, FACTS, path, plot_path=tmp_path / "bench.png")
    text = path.read_text()
    assert "](../bench.png)" in text
    for needle in ("# ipcshare bench: suite", "## Machine", "`node1`", "MPICH Version: 5.0.2",
                   "commit `abc123`", "## Summary", "## Cases", "### ring host single-copy latency",
                   "p5-p95", "min-max", "latency (eager samples)", "CUDA graph of one",
                   "speedup vs mpi", "ran 3 times"):
        assert needle in text, needle
    without_plot = render_markdown(result, FACTS)
    assert "## Plot" not in without_plot
    # a PDF figure is linked, not shown inline (no Markdown viewer draws one)
    pdf = render_markdown(result, FACTS, plot_link="bench.pdf")
    assert "\n[busbw and time per operation against size](bench.pdf)" in pdf


def test_json_documents_have_the_design_shape():
    docs = _result(repeat=2).documents()
    assert len(docs) == 4
    for doc in docs:
        assert {"ipcshare", "op", "backend", "exchange", "world_size", "nodes", "timing",
                "devices", "rows", "baseline", "wrong_total", "case", "algorithm", "repeats",
                "baselines", "skipped_baselines"} <= set(doc)
        assert doc["timing"] == "eager"     # how operations ran; host cases never graph
        latency = doc["case"].endswith(" latency")
        assert doc.get("statistic") == ("median" if latency else None)
        row = doc["rows"][0]
        assert ("p5_us" in row) == latency
        assert row["time_us_min"] <= row["time_us"] <= row["time_us_max"]
    json.dumps(docs)


def _png_size(path):
    """(width, height) from a PNG's IHDR chunk."""
    header = path.read_bytes()[16:24]
    return int.from_bytes(header[:4], "big"), int.from_bytes(header[4:], "big")


def test_reductions_get_their_own_sections_formulas_and_plot_rows(tmp_path):
    result = _result(backend="cuda-vmm", baselines=("nccl", "torch-symm"),
                     ops=("allreduce", "reducescatter", "allgather"), reductions=("sum", "max"))
    assert len(result.cases) == 10  # 2 reductions x 2 timings x 2 ops + 2 all-gathers
    text = render_markdown(result, FACTS, plot_link="bench.png")
    sections = [line for line in text.splitlines() if line.startswith("## Cases")]
    assert sections == ["## Cases: all-reduce", "## Cases: reduce-scatter",
                        "## Cases: all-gather"]
    reduce_scatter = text.split("## Cases: reduce-scatter")[1].split("## Cases: all-gather")[0]
    assert "### reducescatter max float32 cuda-vmm auto latency" in reduce_scatter
    assert "### allreduce" not in reduce_scatter and "size = bytes of each rank's input" in (
        reduce_scatter)
    assert "reduction max, float32" in reduce_scatter
    for needle in ("all-reduce size = each rank's array, busbw = algbw x 2(n-1)/n",
                   "reduce-scatter size = each rank's input, busbw = algbw x (n-1)/n",
                   "bound call (`comm.bind`)", "| allreduce sum float32 cuda-vmm auto nccl-tests |",
                   "torch-symm time (µs)", "speedup vs torch-symm"):
        assert needle in text, needle
    assert "ring follows sendrecv" not in text
    docs = result.documents()
    assert [doc.get("reduction") for doc in docs] == (
        ["sum", "sum", "max", "max"] * 2 + [None, None])
    assert all(doc["datatype"] == "float32" for doc in docs)
    summary = "\n".join(summary_lines(result))
    assert "allreduce max float32 cuda-vmm auto latency" in summary and "torch-symm" in summary
    pytest.importorskip("matplotlib")
    one_op, three_ops = tmp_path / "one.png", tmp_path / "three.png"
    write_plot(_result(backend="cuda-vmm", baselines=("nccl",), ops=("allreduce",)), FACTS,
               one_op)
    write_plot(result, FACTS, three_ops)
    # A row of panels per op: the figure grows with the ops it shows.
    assert _png_size(three_ops)[0] == _png_size(one_op)[0]
    assert _png_size(three_ops)[1] > 2 * _png_size(one_op)[1]


def test_ceilings_follow_the_backend():
    host = ceilings(_result())
    assert len(host) == 1 and "single-copy" in host[0].label
    best_ring = max(r.primary.busbw for c in _result().cases if c.case.op == "ring"
                    for r in c.result.rows)
    assert host[0].gbps == pytest.approx(best_ring)
    gpu = ceilings(_result(backend="cuda-vmm", baselines=("nccl", "mpi")))
    assert [c.gbps for c in gpu][-1] == NVLINK4_GBPS
    assert "copy-engine peer copy" in gpu[0].label and "NVLink 4" in gpu[1].label


@pytest.mark.parametrize("backend,baselines", [("host", ("mpi",)),
                                               ("cuda-ipc", ("nccl", "mpi"))])
def test_plot_is_a_png(tmp_path, backend, baselines):
    pytest.importorskip("matplotlib")
    path = tmp_path / "bench.png"
    write_plot(_result(backend=backend, baselines=baselines, repeat=2), FACTS, path)
    assert path.read_bytes()[:8] == PNG_SIGNATURE and path.stat().st_size > 20_000


def test_plot_into_a_missing_folder_is_a_config_error(tmp_path):
    pytest.importorskip("matplotlib")
    with pytest.raises(ConfigError, match="cannot write"):
        write_plot(_result(), FACTS, tmp_path / "missing" / "bench.png")


def test_missing_matplotlib_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import now fails
    with pytest.raises(ConfigError, match=r"pip install 'ipcshare\[plot\]'"):
        require_matplotlib()
    with pytest.raises(ConfigError, match="needs matplotlib"):
        write_plot(_result(), FACTS, "unused.png")


def test_progress_line_waits_for_a_long_run_and_rewrites_itself():
    now = [0.0]
    stream = io.StringIO()
    progress = ProgressLine(stream, delay_s=2.0, interval_s=0.5, clock=lambda: now[0])
    progress.show("case 1/2")
    assert stream.getvalue() == ""          # short runs stay quiet
    now[0] = 3.0
    progress.show("case 1/2, size 1M")
    now[0] = 3.1
    progress.show("too soon")               # at most one update per interval
    now[0] = 3.6
    progress.show("case 2/2")
    assert stream.getvalue() == "\rcase 1/2, size 1M\rcase 2/2         "
    progress.clear()
    assert stream.getvalue().endswith("\r" + " " * 8 + "\r")
    progress.clear()                         # nothing shown: nothing to blank
    assert stream.getvalue().endswith("\r" + " " * 8 + "\r")
    quiet = io.StringIO()
    ProgressLine(quiet, enabled=False, delay_s=0).show("x")
    assert quiet.getvalue() == ""


def test_the_plot_is_written_in_the_format_its_name_asks_for(tmp_path):
    pytest.importorskip("matplotlib")
    from ipcshare.bench.plot import write_plot

    write_plot(_result(), FACTS, tmp_path / "bench.svg")
    write_plot(_result(), FACTS, tmp_path / "bench.PDF")
    assert (tmp_path / "bench.svg").read_text().lstrip().startswith("<?xml")
    assert "<svg" in (tmp_path / "bench.svg").read_text()
    assert (tmp_path / "bench.PDF").read_bytes()[:5] == b"%PDF-"
    from ipcshare.bench.plot import plot_format

    assert plot_format(".png") == "png" and plot_format("out/x.Svg") == "svg"
