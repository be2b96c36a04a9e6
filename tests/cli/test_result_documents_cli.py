"""Result documents written by the commands themselves (``--result``): each one loads
and validates, holds the figures of the run's ``--json`` document, its commit, machine,
command and exit status, and a launch id shared by its rows."""

from __future__ import annotations

import json

import pytest

from ipcshare.runtime import result_document as rd
from ipcshare.vs_torch.plan import SizePlan
from ipcshare.vs_torch.result_rows import vs_torch_rows
from ipcshare.vs_torch.rows import judge_row, new_row

from .test_cli import needs_mpiexec, run, socket_dir  # noqa: F401


def _json_rows(document: dict) -> dict[tuple[int, str], dict]:
    """The --json document's figures by (size, placement)."""
    found = {}
    for row in document["rows"]:
        found[(row["size"], "out-of-place")] = row
        if row.get("in_place"):
            found[(row["size"], "in-place")] = row["in_place"]
    return found


@needs_mpiexec
@pytest.mark.parametrize("command, flags, status", [
    ("allreduce", ["-d", "float32", "-o", "max", "--algo", "one-shot"], 0),
    ("alltoall", ["--splits", "random"], 0),
    ("ring", ["--min-bw", "1e9"], 4),   # a run that fails: its status is the document's
])
def test_a_pattern_command_writes_a_valid_document(tmp_path, socket_dir, command,  # noqa: F811
                                                    flags, status):
    result, plain = tmp_path / "result.json", tmp_path / "plain.json"
    out = run([command, "--backend", "host", "-b", "1K", "-e", "16K", "-f", "4", "-n", "3",
               "-w", "1", "--baseline", "mpi", "--json", str(plain), "--result", str(result),
               *flags], n=2, timeout=180)
    assert out.returncode == status, out.stderr
    document = rd.load(result)
    plain_doc = json.loads(plain.read_text())
    assert document["tool"] == f"ipcshare {command}" and document["exit_status"] == status
    assert document["command"].startswith(f"mpiexec -n 2 ipcshare {command} --backend host")
    assert document["commit"]["source"] in ("git", "package", "unknown")
    assert document["machine"]["host_cpus"] >= 1
    assert document["world_size"] == 2 and document["wrong_total"] == 0
    assert len({row["launch"] for row in document["rows"]}) == 1
    figures = _json_rows(plain_doc)
    assert len(document["rows"]) == len(figures)
    assert {row["placement"] for row in document["rows"]} == {p for _s, p in figures}
    for row in document["rows"]:
        assert row["op"] == command and row["mode"] == "eager" and row["world_size"] == 2
        assert row["details"]["backend"] == "host"
        theirs = figures[(row["size"], row["placement"])]
        assert row["ours"]["time_us"] == theirs["time_us"]
        assert row["ours"]["busbw"] == theirs["busbw"]
        (baseline,) = row["baselines"]
        assert baseline["name"] == "mpi" and baseline["wrong"] == 0
        assert baseline["time_us"] > 0
    if command == "allreduce":
        assert {row["algorithm"] for row in document["rows"]} == {"one-shot"}
        assert {row["dtype"] for row in document["rows"]} == {"float32"}
    if command == "alltoall":
        assert {row["details"]["splits"] for row in document["rows"]} == {"random"}


@needs_mpiexec
def test_latency_timing_and_unchecked_runs(tmp_path, socket_dir):  # noqa: F811
    result = tmp_path / "result.json"
    out = run(["allreduce", "--backend", "host", "-b", "64", "-e", "256", "-f", "4", "-n",
               "5", "-c", "0", "--timing", "latency", "--result", str(result)], n=2,
              timeout=120)
    assert out.returncode == 0, out.stderr
    document = rd.load(result)
    assert document["wrong_total"] is None
    assert {row["mode"] for row in document["rows"]} == {"latency"}
    assert all(row["wrong"] is None and "p95_us" in row["ours"] for row in document["rows"])


@needs_mpiexec
def test_an_unwritable_result_is_refused_before_the_run(tmp_path, socket_dir):  # noqa: F811
    missing = tmp_path / "no-such-folder" / "result.json"
    out = run(["allgather", "--backend", "host", "-b", "1K", "-e", "1K", "--result",
               str(missing)], n=2, timeout=120)
    assert out.returncode == 1
    assert "no directory" in out.stderr and "#" not in out.stdout


def test_vs_torch_rows_follow_the_judged_rows():
    plans = [SizePlan(op="all_reduce", size=8192, in_count=4096, out_count=4096, block=4096,
                      itemsize=2),
             SizePlan(op="all_gather", size=8192, in_count=2048, out_count=4096, block=2048,
                      itemsize=2)]
    rows = []
    for plan in plans:
        row = new_row(plan)
        row["ours"].update(wrong=0, graph_us=10.0, eager_us=20.0, host_bound_us=5.0)
        row["torch"].update(wrong=0 if plan.op == "all_reduce" else 7, graph_us=30.0,
                            eager_us=40.0, host_us=9.0)
        if plan.op == "all_gather":
            row["torch"]["wrong_by_call"] = {"out-of-place": 7}
        rows.append(judge_row(row, world=2, ceiling=None))
    results = {"facts": {"world_size": 2}, "options": {"dtype": "bfloat16"}, "rows": rows}
    made = vs_torch_rows(results, launch=rd.new_launch_id())
    assert [(r["op"], r["mode"]) for r in made] == [
        ("allreduce", "graph"), ("allreduce", "eager"), ("allgather", "graph"),
        ("allgather", "eager")]
    assert made[0]["ours"]["time_us"] == 10.0 and made[0]["baselines"][0]["time_us"] == 30.0
    assert made[1]["ours"]["host_us"] == 5.0 and made[0]["details"]["ratio"] == 0.3333
    wrong = made[2]["baselines"][0]
    assert wrong["wrong"] == 7 and wrong["time_us"] is None and made[2]["errors"] == []
    document = rd.make_document(tool="ipcshare vs-torch", version="0", commit=rd.unknown_commit(),
                                machine={"hostname": "h", "host_cpus": 1, "gpu_model": None,
                                         "gpu_count": 0, "links": None, "driver": None,
                                         "cuda": None, "nccl": None, "torch": None},
                                command="ipcshare vs-torch", exit_status=3, world_size=2,
                                rows=made)
    assert document["wrong_total"] == 14  # the wrong baseline, in graphs and eager
