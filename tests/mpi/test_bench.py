"""bench under mpiexec: a tiny suite on host memory in both timing modes, buffer rotation
verified byte for byte, baselines timed per sample; every rank agrees on every figure."""

from __future__ import annotations

import json

import pytest

import ipcshare
from ipcshare.backends import gpu_count
from ipcshare.baselines.mpi import MpiBaseline
from ipcshare.bench.runner import run_suite
from ipcshare.bench.suite import parse_suite
from ipcshare.patterns import make_pattern
from ipcshare.patterns.driver import run_pattern
from ipcshare.patterns.rotation import WindowRegion, rotation_count, window_regions
from ipcshare.runtime.config import merge_options
from ipcshare.runtime.errors import ConfigError
from ipcshare.topology.world import World

pytestmark = pytest.mark.mpi

TINY = {"ops": ["allgather", "ring"], "backends": ["host"],
        "timing": ["nccl-tests", "latency"], "baselines": ["mpi"], "min_bytes": 64,
        "max_bytes": "2M", "step_factor": 32, "iters": 5, "warmup": 1, "checks": 4,
        "datatype": "uint8"}


def _suite(**changes):
    return parse_suite({**TINY, **changes}, source="tiny.yaml", resolve_backend=lambda b: b)


@pytest.fixture
def world():
    world = World.from_comm()
    yield world
    world.close()


def test_a_tiny_suite_runs_both_timing_modes_and_verifies(comm, world):
    lines: list[str] = []
    result = run_suite(_suite(), world, emit=lines.append)
    assert result.wrong_total == 0
    docs = result.documents()
    assert [doc["case"] for doc in docs] == [
        "allgather host single-copy nccl-tests", "allgather host single-copy latency",
        "ring host single-copy nccl-tests", "ring host single-copy latency"]
    for doc in docs:
        assert {"op", "world_size", "rows", "baseline", "timing", "wrong_total"} <= set(doc)
        assert doc["world_size"] == comm.size and doc["wrong_total"] == 0
        assert [row["size"] for row in doc["baseline"]["rows"]] == [
            row["size"] for row in doc["rows"]]
        latency = doc["case"].endswith(" latency")
        assert doc["timing"] == "eager" and doc.get("statistic") == ("median" if latency
                                                                      else None)
        for row in doc["rows"] + doc["baseline"]["rows"]:
            assert row["wrong"] == 0 and row["time_us"] > 0
            if latency:
                assert row["p5_us"] <= row["p50_us"] <= row["p95_us"]
                assert row["p50_us"] == row["time_us"]
            else:
                assert "p5_us" not in row
    # Times are reduced over ranks: every rank holds the same figures (devices are
    # gathered on rank 0 only).
    text = json.dumps([{k: v for k, v in doc.items() if k != "devices"} for doc in docs],
                      sort_keys=True)
    assert comm.allgather(text) == [text] * comm.size
    if comm.rank == 0:
        assert sum(line.startswith("# [case ") for line in lines) == 4
        assert any("timing: latency (eager samples)" in line for line in lines)
        assert any("buffers: 4 in rotation" in line for line in lines)
    else:
        assert lines == []


def test_repetitions_report_medians_and_ranges(comm, world):
    result = run_suite(_suite(ops=["ring"], timing=["latency"], max_bytes=64, repeat=3), world,
                       emit=lambda _line: None)
    (record,) = result.cases
    assert len(record.runs) == 3
    row = result.documents()[0]["rows"][0]
    assert row["time_us_min"] <= row["time_us"] <= row["time_us_max"]
    assert row["busbw_min"] <= row["busbw"] <= row["busbw_max"]


def test_nccl_asked_for_on_host_memory_is_skipped_with_a_note(comm, world):
    lines: list[str] = []
    result = run_suite(_suite(ops=["allgather"], timing=["nccl-tests"], max_bytes=64,
                              baselines=["nccl", "mpi"]), world, emit=lines.append)
    (doc,) = result.documents()
    assert doc["baseline"]["name"] == "mpi" and doc["wrong_total"] == 0
    assert doc["skipped_baselines"][0]["name"] == "nccl"
    assert "GPU memory" in doc["skipped_baselines"][0]["reason"]
    if comm.rank == 0:
        assert any(line.startswith("# nccl baseline skipped:") for line in lines)


@pytest.mark.parametrize("op", ["ring", "allgather"])
def test_rotated_regions_are_disjoint_and_each_one_verified(comm, op):
    options = merge_options({"backend": "host", "min_bytes": 3, "max_bytes": 3 << 20,
                             "step_factor": 16, "iters": 6, "warmup": 0, "checks": 8,
                             "datatype": "uint8"})
    with ipcshare.Group(backend="host") as g:
        pattern = make_pattern(op)
        result = run_pattern(g, pattern, options, emit=lambda _line: None, rotate=4,
                             baseline=MpiBaseline(g.world, op), timing="latency")
        assert result.wrong_total == 0 and len(result.rows) == 6
        plan = pattern.plan(4096, g.size, 1)
        window = g.window(1 << 20)
        regions = window_regions(window, pattern, plan, 4)
        assert regions[0] is window and all(isinstance(r, WindowRegion) for r in regions[1:])
        starts = [region.local.ptr for region in regions]
        stride = starts[1] - starts[0]
        assert stride >= pattern.window_bytes(plan, g.size) and stride % 4096 == 0
        assert starts == [starts[0] + k * stride for k in range(4)]
        assert all(region == window and hash(region) == hash(window) for region in regions)
        assert len(window_regions(window, pattern, plan, 1)) == 1
        # Rotation stops above 1 MiB per rank.
        edge = pattern.plan((1 << 20) * (g.size if op == "allgather" else 1), g.size, 1)
        past = pattern.plan(((1 << 20) + 1) * (g.size if op == "allgather" else 1), g.size, 1)
        assert (rotation_count(edge, 4), rotation_count(past, 4)) == (4, 1)


def test_mpi_baseline_samples_are_the_slowest_rank_s(comm):
    from ipcshare.patterns.base import SizePlan

    with ipcshare.Group(backend="host") as g:
        baseline = MpiBaseline(g.world, "allgather")
        plan = SizePlan(size=256 * g.size, count=256 * g.size, block_bytes=256, element_size=1)
        samples, wrong = baseline.measure_latency(plan, "out-of-place", iters=7, warmup=1,
                                                  checks=3, buffers=3)
        seconds, wrong_again = baseline.measure(plan, "in-place", iters=7, warmup=0, checks=3,
                                                buffers=3)
    assert len(samples) == 7 and all(s > 0 for s in samples) and seconds > 0
    assert wrong == 0 and wrong_again == 0
    assert comm.allgather(samples) == [samples] * comm.size


def test_an_unknown_timing_mode_is_refused(comm):
    options = merge_options({"backend": "host", "min_bytes": 64, "max_bytes": 64})
    with ipcshare.Group(backend="host") as g:
        with pytest.raises(ConfigError, match="unknown timing mode 'graph'"):
            run_pattern(g, make_pattern("ring"), options, timing="graph")
        with pytest.raises(ConfigError, match="rotate must be an integer >= 1"):
            run_pattern(g, make_pattern("ring"), options, rotate=0)


def test_a_host_suite_of_both_reductions_writes_json_report_and_plot(comm, world, tmp_path):
    from ipcshare.bench.machine import machine_facts
    from ipcshare.bench.report import write_markdown

    suite = parse_suite({
        "backends": ["host"], "baselines": ["mpi"], "min_bytes": 64, "max_bytes": "64K",
        "step_factor": 32, "iters": 3, "warmup": 1, "checks": 2,
        "cases": [
            {"ops": ["allreduce", "reducescatter"], "reductions": ["sum", "max"],
             "algorithms": ["one-shot", "two-shot"], "datatype": "int32"},
            # MPI reduces no 16-bit floats: this case runs without it, saying why.
            {"ops": ["allreduce"], "reductions": ["min"], "datatype": "bfloat16",
             "timing": ["latency"]}]},
        source="reductions.yaml", resolve_backend=lambda b: b)
    lines: list[str] = []
    result = run_suite(suite, world, emit=lines.append)
    assert result.wrong_total == 0
    docs = result.documents()
    assert [(doc["op"], doc["reduction"], doc["algorithm"]) for doc in docs] == [
        ("allreduce", "sum", "one-shot"), ("allreduce", "sum", "two-shot"),
        ("allreduce", "max", "one-shot"), ("allreduce", "max", "two-shot"),
        ("reducescatter", "sum", "one-shot"), ("reducescatter", "max", "one-shot"),
        ("allreduce", "min", "auto")]
    for doc in docs[:-1]:
        assert doc["datatype"] == "int32" and doc["baseline"]["name"] == "mpi"
        assert [row["wrong"] for row in doc["rows"] + doc["baseline"]["rows"]] == [0] * 6
        # Sizes as nccl-tests: all-reduce keeps the array; reduce-scatter's input is a
        # whole number of blocks, one per rank.
        sizes = [row["size"] for row in doc["rows"]]
        if doc["op"] == "allreduce":
            assert sizes == [64, 2048, 65536]
        else:
            assert all(size % (4 * comm.size) == 0 for size in sizes)
    last = docs[-1]
    assert last["baseline"] is None and last["datatype"] == "bfloat16"
    assert "no 16-bit float types" in last["skipped_baselines"][0]["reason"]
    assert last["rows"][0]["p5_us"] <= last["rows"][0]["p95_us"]
    text = json.dumps([{k: v for k, v in doc.items() if k != "devices"} for doc in docs],
                      sort_keys=True)
    assert comm.allgather(text) == [text] * comm.size
    facts = machine_facts(world)
    report = tmp_path / "bench.md"
    if comm.rank == 0:
        assert any(line.startswith("# mpi baseline skipped: --baseline mpi reduces")
                   for line in lines)
        (tmp_path / "bench.json").write_text(json.dumps(docs))
        assert len(json.loads((tmp_path / "bench.json").read_text())) == 7
        write_markdown(result, facts, report)
        markdown = report.read_text()
        assert "## Cases: all-reduce" in markdown and "## Cases: reduce-scatter" in markdown
        assert "### reducescatter max int32 host one-shot nccl-tests" in markdown
        assert "**0** (OK)" in markdown
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        pytest.skip("matplotlib is not installed: the plot is not drawn (pip install "
                    "'ipcshare[plot]')")
    if comm.rank == 0:
        from ipcshare.bench.plot import write_plot

        write_plot(result, facts, tmp_path / "bench.png")
        assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_registered_arrays_are_a_case_of_their_own(comm, world, tmp_path):
    from ipcshare.bench.machine import machine_facts
    from ipcshare.bench.report import write_markdown

    suite = parse_suite({
        "ops": ["allreduce"], "backends": ["host"], "baselines": ["none"],
        "arrays": ["copied", "registered"], "min_bytes": "1K", "max_bytes": "16K",
        "step_factor": 4, "iters": 2, "warmup": 1, "checks": 2},
        source="registered.yaml", resolve_backend=lambda b: b)
    result = run_suite(suite, world, emit=lambda _line: None)
    assert result.wrong_total == 0
    docs = result.documents()
    assert [doc.get("registered", False) for doc in docs] == [False, True]
    facts = machine_facts(world)  # collective
    if comm.rank == 0:
        write_markdown(result, facts, tmp_path / "bench.md")
        assert ("### allreduce sum float32 registered host"
                in (tmp_path / "bench.md").read_text())


@pytest.mark.skipif(gpu_count()[0] > 0, reason="a GPU is visible: tests/gpu/test_gpu_bench.py "
                                                "runs the p2p case there")
def test_without_a_gpu_p2p_cases_are_skipped_with_the_reason_in_json_and_markdown(
        comm, world, tmp_path):
    from ipcshare.bench.machine import machine_facts
    from ipcshare.bench.report import render_markdown, summary_lines

    suite = parse_suite({
        "baselines": ["mpi"], "min_bytes": 64, "max_bytes": "4K", "step_factor": 64,
        "iters": 3, "warmup": 1,
        "cases": [{"ops": ["allgather"], "backends": ["host"]},
                  # named GPU backend: skipped without opening its Group, which needs a GPU
                  {"ops": ["p2p"], "backends": ["cuda-vmm"]},
                  # auto: host here, so skipped inside the host backend's Group
                  {"ops": ["p2p"], "p2p_ops": ["ring"], "backends": ["auto"]}]},
        source="p2p.yaml", resolve_backend=lambda b: "host" if b == "auto" else b)
    lines: list[str] = []
    result = run_suite(suite, world, emit=lines.append)
    docs = result.documents()
    assert [(doc["case"], doc["skipped"] is None) for doc in docs] == [
        ("allgather host single-copy nccl-tests", True),
        ("p2p ring cuda-vmm auto nccl-tests", False),
        ("p2p allgather cuda-vmm auto nccl-tests", False),
        ("p2p ring host single-copy nccl-tests", False)]
    assert result.wrong_total == 0 and docs[0]["rows"] and docs[0]["wrong_total"] == 0
    for doc in docs[1:]:
        assert doc["skipped"].startswith("no rank sees a GPU, and P2P direct against IPC "
                                         "needs 2 or more, one rank each (")
        assert (doc["op"], doc["rows"], doc["repeats"], doc["wrong_total"]) == ("p2p", [], 0, 0)
        assert doc["world_size"] == comm.size and doc["baseline"] is None
    assert [doc["p2p_op"] for doc in docs[1:]] == ["ring", "allgather", "ring"]
    assert [record.case for record in result.below(1e12)] == [suite.cases[0]]
    text = json.dumps([{k: v for k, v in doc.items() if k != "devices"} for doc in docs],
                      sort_keys=True)
    assert comm.allgather(text) == [text] * comm.size
    facts = machine_facts(world)
    if comm.rank == 0:
        reason = docs[1]["skipped"]
        assert sum(line.startswith("# skipped: no rank sees a GPU") for line in lines) == 3
        assert (f"# case p2p allgather cuda-vmm auto nccl-tests skipped: {reason}"
                in summary_lines(result))
        markdown = render_markdown(result, facts)
        assert "### p2p ring host single-copy nccl-tests" in markdown
        assert markdown.count(f"Skipped: {reason}.") == 3
        assert "**0** (OK)" in markdown
    else:
        assert lines == []


def test_all_to_all_cases_run_per_splits_beside_mpi_and_say_their_splits(comm, world,
                                                                          tmp_path):
    from ipcshare.bench.machine import machine_facts
    from ipcshare.bench.report import write_markdown

    suite = parse_suite({
        "ops": ["alltoall"], "splits": ["even", "random", "skewed"], "backends": ["host"],
        "baselines": ["mpi"], "timing": ["nccl-tests", "latency"], "min_bytes": 64,
        "max_bytes": "64K", "step_factor": 32, "iters": 3, "warmup": 1, "checks": 2,
        "datatype": "int32"}, source="alltoall.yaml", resolve_backend=lambda b: b)
    result = run_suite(suite, world, emit=lambda _line: None)
    assert result.wrong_total == 0
    docs = result.documents()
    assert [doc["case"] for doc in docs] == [
        f"alltoall {splits} int32 host auto {timing}"
        for splits in ("even", "random", "skewed") for timing in ("nccl-tests", "latency")]
    for doc in docs:
        assert doc["splits"] in ("even", "random", "skewed") and doc["case"].split()[1] == \
            doc["splits"]
        assert doc["baseline"]["name"] == "mpi"
        assert [row["wrong"] for row in doc["rows"] + doc["baseline"]["rows"]] == [0] * 6
        # Size is each rank's input: whole elements, one block per rank with even splits.
        assert all(row["size"] % (4 * comm.size) == 0 for row in doc["rows"])
    facts = machine_facts(world)  # collective
    if comm.rank == 0:
        write_markdown(result, facts, tmp_path / "bench.md")
        markdown = (tmp_path / "bench.md").read_text()
        assert "## Cases: all-to-all" in markdown
        assert "### alltoall skewed int32 host auto latency" in markdown
