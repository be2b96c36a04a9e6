"""A suite's p2p case without GPUs: when it is skipped and why, the direct half's document
turned into baselines, and what JSON, summary, Markdown and plot show of a p2p case that
ran (results made by hand) and of one that was skipped."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from ipcshare.bench import p2p_case
from ipcshare.bench.plot import ceilings, write_plot
from ipcshare.bench.report import render_markdown, summary_lines
from ipcshare.bench.runner import BenchResult, CaseResult, SkippedBaseline
from ipcshare.bench.suite import parse_suite
from ipcshare.patterns.results import Measurement, Row, RunResult
from ipcshare.runtime.errors import BackendError

FACTS = {"ipcshare": "0.1.0", "world_size": 2, "nodes": 1, "date": "2026-11-24 10:00 UTC",
         "hosts": {"node1": {"cpus": 32, "usable_cpus": 32, "ranks": 2}}}
SIZES = [4096, 1 << 20]
NO_PEER_ACCESS = "cuDeviceCanAccessPeer -> 0: no NVLink or PCIe P2P path"


def _suite(**changes):
    return parse_suite({"ops": ["p2p"], "backends": ["cuda-vmm"], "min_bytes": "4K",
                        "max_bytes": "1M", "step_factor": 256, **changes},
                       source="p2p.yaml", resolve_backend=lambda b: b)


def _world(size=2, nodes=1):
    return SimpleNamespace(size=size, node_count=nodes)


def test_a_p2p_case_is_skipped_where_it_cannot_run_and_says_why():
    case = _suite().cases[0]
    skip = p2p_case.skip_reason
    assert skip(case, _world(), "no CUDA device is visible") == (
        "no rank sees a GPU, and P2P direct against IPC needs 2 or more, one rank each "
        "(no CUDA device is visible)")
    host = parse_suite({"ops": ["p2p"], "backends": ["auto"]},
                       resolve_backend=lambda _name: "host").cases[0]
    assert skip(host, _world(), None) == (
        "its backend is host: P2P direct against IPC needs GPU memory")
    assert skip(case, _world(size=1), None) == (
        "one rank: P2P direct against IPC needs 2 or more GPUs, one rank each")
    assert skip(case, _world(size=4, nodes=2), None) == (
        "the job spans 2 nodes: P2P direct is one process over one node's GPUs; run it in a "
        "job of one node")
    pytest.importorskip("cuda.bindings")  # the kernels' limit is the GPU code's constant
    assert skip(case, _world(size=9), None) == (
        "9 ranks: P2P direct's kernel pushes to at most 8 GPUs")
    assert skip(case, _world(size=8), None) is None


def _document(*, kernel=True, sizes=SIZES):
    def measured(size, speed):
        return {"time_us": size / speed, "algbw": speed / 1e3, "busbw": speed / 1e3,
                "wrong": 0}
    rows = [{"size": size, "count": size // 4, "p2p_copy": measured(size, 300e3),
             **({"p2p_kernel": measured(size, 350e3)} if kernel else {})} for size in sizes]
    pairs = [{"src": 0, "dst": 1, "enabled": kernel, "reason": "" if kernel else NO_PEER_ACCESS,
              "setup_ms": 0.25},
             {"src": 1, "dst": 0, "enabled": kernel, "reason": "" if kernel else NO_PEER_ACCESS,
              "setup_ms": 0.25}]
    return {"ipcshare": "0.1.0", "op": "p2p", "gpus": 2, "devices": ["H200", "H200"],
            "peer_access_enabled": True, "peer_access": pairs,
            "setup_ms": {"contexts_streams_kernels": 80.0, "peer_access": 0.5},
            "ops": {"ring": {"rows": rows, "allocate_ms": 1.5, "latency_us": {},
                             "ipc": None, "wrong_total": 0}},
            "wrong_total": 0}


def _ipc_rows(mode="ring"):
    return [Row(size, size // 4, {mode: Measurement(size / 200e3, 0.2, 0.2, 0)})
            for size in SIZES]


def test_the_direct_modes_become_baselines_row_for_row():
    baselines, missing = p2p_case._direct_baselines(_document(), "ring", _ipc_rows())
    assert missing == {}
    assert [b.name for b in baselines] == ["p2p-kernel", "p2p-copy"]
    kernel = baselines[0]
    assert "peer pointers" in kernel.label and kernel.version.endswith("over 2 GPUs")
    assert [row.size for row in kernel.rows] == SIZES
    # named as our primary mode, so every table and ratio lines them up
    assert list(kernel.rows[0].modes) == ["ring"]
    assert kernel.rows[1].primary.time_us == pytest.approx((1 << 20) / 350e3)


def test_without_peer_access_the_kernel_mode_is_missing_with_the_pairs_named():
    pytest.importorskip("cuda.bindings")  # peer_access names pairs as the driver reports them
    baselines, missing = p2p_case._direct_baselines(_document(kernel=False), "ring",
                                                    _ipc_rows())
    assert [b.name for b in baselines] == ["p2p-copy"]
    assert missing == {"p2p-kernel": (
        f"no peer access (cuda:0 -> cuda:1: {NO_PEER_ACCESS}; cuda:1 -> cuda:0: "
        f"{NO_PEER_ACCESS}): a kernel can only dereference peers it has access to")}


def test_halves_of_other_sizes_are_an_error():
    with pytest.raises(BackendError, match=r"the P2P direct half measured sizes \[4096\], the "
                                           r"IPC half \[4096, 1048576\]"):
        p2p_case._direct_baselines(_document(sizes=[4096]), "ring", _ipc_rows())


def _result(skipped=False):
    suite = _suite(p2p_ops=["ring"])
    (case,) = suite.cases
    if skipped:
        record = CaseResult(case, [RunResult("0.1.0", "p2p", "cuda-vmm", "auto", 2, 1,
                                             "nccl-tests", [], [], None)],
                            skip_reason="no rank sees a GPU, and P2P direct against IPC "
                                        "needs 2 or more, one rank each (no driver)")
        return BenchResult(suite, [record], elapsed_s=0.1)
    baselines, _missing = p2p_case._direct_baselines(_document(), "ring", _ipc_rows())
    run = RunResult("0.1.0", "ring", "cuda-vmm", "pidfd", 2, 1, "eager", ["H200 #0", "H200 #1"],
                    _ipc_rows(), baselines[0], extra_baselines=baselines[1:])
    details = {"command": "python -m ipcshare p2p --no-ipc --op ring", "gpus": 2,
               "devices": ["H200", "H200"], "peer_access": _document()["peer_access"],
               "setup_ms": {"contexts_streams_kernels": 80.0, "peer_access": 0.5},
               "allocate_ms": 1.5, "ipc_window_setup_ms": 41.25}
    record = CaseResult(case, [run], [SkippedBaseline("p2p-kernel", "not this time")],
                        p2p=details)
    return BenchResult(suite, [record], elapsed_s=2.0)


def test_a_p2p_case_that_ran_shows_ipc_against_p2p_direct_everywhere(tmp_path):
    result = _result()
    (doc,) = result.documents()
    assert (doc["op"], doc["p2p_op"], doc["case"], doc["skipped"]) == (
        "p2p", "ring", "p2p ring cuda-vmm auto nccl-tests", None)
    assert [b["name"] for b in doc["baselines"]] == ["p2p-kernel", "p2p-copy"]
    assert doc["p2p"]["ipc_window_setup_ms"] == 41.25 and doc["repeats"] == 1
    json.dumps(doc)
    summary = "\n".join(summary_lines(result))
    assert "p2p ring cuda-vmm auto nccl-tests" in summary and "p2p-copy" in summary
    assert "what IPC costs against P2P direct" in summary
    text = render_markdown(result, FACTS)
    for needle in ("## Cases: ring", "### p2p ring cuda-vmm auto nccl-tests",
                   "P2P direct: one process over 2 GPUs (`python -m ipcshare p2p --no-ipc "
                   "--op ring`), peer access enabled for 2 of 2 ordered pairs in 0.50 ms, "
                   "buffers allocated in 1.50 ms; IPC: window setup 41.25 ms (slowest rank).",
                   "time ipc (µs)", "speedup vs p2p-kernel", "speedup vs p2p-copy",
                   "**p2p** cases set P2P direct against IPC", "| p2p-kernel baseline |",
                   "ring follows sendrecv"):
        assert needle in text, needle
    # the IPC ring is no copy-engine ceiling of its own: only the line rate is drawn
    assert [c.gbps for c in ceilings(result)] == [450.0]
    pytest.importorskip("matplotlib")
    write_plot(result, FACTS, tmp_path / "p2p.png")
    assert (tmp_path / "p2p.png").read_bytes()[:4] == b"\x89PNG"


def test_a_skipped_p2p_case_says_why_in_every_output(tmp_path):
    result = _result(skipped=True)
    reason = result.cases[0].skip_reason
    (doc,) = result.documents()
    assert doc["skipped"] == reason and doc["rows"] == [] and doc["repeats"] == 0
    assert doc["wrong_total"] == 0 and result.wrong_total == 0
    # a case that did not run is under no bandwidth floor
    assert result.below(1e9) == []
    summary = summary_lines(result)
    assert any("skipped" in line and "p2p ring cuda-vmm auto nccl-tests" in line
               for line in summary)
    assert f"# case p2p ring cuda-vmm auto nccl-tests skipped: {reason}" in summary
    text = render_markdown(result, FACTS)
    assert f"Skipped: {reason}." in text
    assert f"- case p2p ring cuda-vmm auto nccl-tests skipped: {reason}" in text
    assert "**p2p** cases set" not in text and ceilings(result) == []
    pytest.importorskip("matplotlib")
    write_plot(result, FACTS, tmp_path / "skipped.png")
    assert (tmp_path / "skipped.png").read_bytes()[:4] == b"\x89PNG"
