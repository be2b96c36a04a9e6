"""tools/gpu_check.py without a GPU: steps of trivial commands, a failing step, a step
past its limit, steps whose result documents say wrong elements or measurement errors,
MPS started and stopped only by the run, the summary made from the outcomes alone, and
the phase table for machines of 1, 2 and 4 GPUs."""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import shutil
import sys
import time
from pathlib import Path

import pytest

from ipcshare.runtime import result_document as rd

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import gpu_check  # noqa: E402
import gpu_check_phases  # noqa: E402
from gpu_check import Runner  # noqa: E402
from gpu_check_steps import Context, Note, Phase, Step  # noqa: E402

PY = sys.executable
MPIEXEC = shutil.which("mpiexec", path=os.path.dirname(PY)) or shutil.which("mpiexec")
# The commands that time: each step running one writes its result document.
TIMED = {"ring", "allgather", "allreduce", "reducescatter", "alltoall", "bench", "vs-torch"}


def _context(tmp_path: Path, gpus: int = 1, **knobs: str) -> Context:
    scratch = tmp_path / "scratch"
    scratch.mkdir(exist_ok=True)
    return Context(gpus=gpus, out=tmp_path / "out", scratch=scratch, python=PY,
                   mpiexec=MPIEXEC or "mpiexec", knobs=dict(knobs))


def _document_writer(path: Path, *, exit_status: int, wrong: int = 0,
                     errors: tuple[str, ...] = ()) -> list[str]:
    """A command that writes a result document as a timed step would."""
    code = f"""
from ipcshare.runtime import result_document as rd
row = rd.make_row(op="allreduce", size=8, algorithm="auto", mode="graph", world_size=2,
                  launch=rd.new_launch_id(), ours=rd.figure(5.0, 1.0, 1.0), wrong={wrong},
                  errors={list(errors)!r})
rd.write({str(path)!r}, rd.make_document(
    tool="ipcshare allreduce", version="0", commit=rd.unknown_commit(),
    machine={{"hostname": "h", "host_cpus": 1, "gpu_model": None, "gpu_count": 0,
             "links": None, "driver": None, "cuda": None, "nccl": None, "torch": None}},
    command="ipcshare allreduce", exit_status={exit_status}, world_size=2, rows=[row]))
"""
    return [PY, "-c", code]


def _run(tmp_path: Path, steps: list[Step | Note], **runner_args):
    context = _context(tmp_path)
    stream = io.StringIO()
    phase = Phase("trial", "trivial steps", 0, lambda _ctx: steps)
    with Runner(context, stream=stream, env={**os.environ, "PYTHONPATH": str(ROOT)},
                **runner_args) as runner:
        runner.run_phase(phase)
    return runner.outcomes, stream.getvalue(), context


def test_verdicts_come_from_exit_statuses_and_limits(tmp_path):
    started = time.monotonic()
    outcomes, log, _ctx = _run(tmp_path, [
        Step.of("passes", ["true"], limit_s=30),
        Step.of("fails", ["sh", "-c", "echo half-way; exit 3"], limit_s=30),
        Step.of("stops at the first failing command", ["false"], ["sh", "-c", "echo never"],
                limit_s=30),
        Step.of("runs past its limit", ["sh", "-c", "echo started; sleep 60"], limit_s=1),
        Step.of("cannot start", ["/no/such/program"], limit_s=5),
        Note("a line between steps"),
    ], kill_grace_s=2)
    assert time.monotonic() - started < 30  # the sleeper's group was killed
    assert [(o.name, o.verdict, o.failed) for o in outcomes] == [
        ("passes", "ok", False),
        ("fails", "FAILED rc=3", True),
        ("stops at the first failing command", "FAILED rc=1", True),
        ("runs past its limit", "TIMEOUT after 1s", True),
        ("cannot start", "FAILED rc=127", True)]
    assert "half-way" in log and "started" in log and "never" not in log
    assert "trial: a line between steps" in log


def test_a_document_that_says_wrong_or_mismeasured_fails_the_step(tmp_path):
    scratch = tmp_path / "docs"
    scratch.mkdir()
    wrong, mismeasured, right = scratch / "wrong.json", scratch / "timer.json", scratch / "ok.json"
    missing, broken = scratch / "missing.json", scratch / "broken.json"
    outcomes, _log, context = _run(tmp_path, [
        # The command exits 0, as a wrapper that loses the status would: the document
        # still says what happened.
        Step.of("wrong elements", [*_document_writer(wrong, exit_status=3, wrong=5)],
                limit_s=60, results=[str(wrong)]),
        Step.of("a measurement error", [*_document_writer(
            mismeasured, exit_status=5, errors=("timer disagrees with the host clock",))],
            limit_s=60, results=[str(mismeasured)]),
        Step.of("right", [*_document_writer(right, exit_status=0)], limit_s=60,
                results=[str(right)]),
        Step.of("no document", ["true"], limit_s=10, results=[str(missing)]),
        Step.of("a broken document", ["sh", "-c", f"echo '{{}}' > {shlex.quote(str(broken))}"],
                limit_s=10, results=[str(broken)]),
    ])
    verdicts = {o.name: o.verdict for o in outcomes}
    assert verdicts["wrong elements"] == "FAILED document exit 3 (5 wrong)"
    assert verdicts["a measurement error"] == "FAILED document exit 5 (1 measurement errors)"
    assert verdicts["right"] == "ok"
    assert verdicts["no document"] == "FAILED missing.json: no result document written"
    assert verdicts["a broken document"].startswith(
        "FAILED broken.json: invalid result document:")
    assert [o.failed for o in outcomes] == [True, True, False, True, True]
    lines = (context.out / "result-documents.jsonl").read_text().splitlines()
    gathered = [json.loads(line) for line in lines]
    assert [d["exit_status"] for d in gathered] == [3, 5, 0]
    assert gathered[2]["extra"]["gpu_check"] == {"phase": "trial", "step": "right"}
    for document in gathered:
        rd.validate(document)


def test_a_document_from_an_earlier_run_does_not_stand_for_this_one(tmp_path):
    stale = tmp_path / "stale.json"
    _run(tmp_path, [Step.of("writes", [*_document_writer(stale, exit_status=0)], limit_s=60)])
    assert stale.exists()
    outcomes, _log, _ctx = _run(tmp_path, [Step.of("writes nothing", ["true"], limit_s=10,
                                                   results=[str(stale)])])
    assert outcomes[0].failed and "no result document written" in outcomes[0].verdict


def test_the_summary_is_made_of_the_outcomes_and_agrees_with_the_log(tmp_path):
    phases = {"trial": Phase("trial", "trivial", 0, lambda _ctx: [
        Step.of("passes", ["true"], limit_s=10), Step.of("fails", ["false"], limit_s=10)]),
        "big": Phase("big", "needs GPUs", 4, lambda _ctx: [Step.of("x", ["true"], limit_s=1)])}
    stream = io.StringIO()
    status, outcomes = gpu_check.run(["trial", "big"], tmp_path / "out", phases=phases,
                                     gpus=2, setup=False, stream=stream,
                                     env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert status == 1
    summary = (tmp_path / "out" / "summary.txt").read_text().splitlines()
    assert re.fullmatch(r"===== summary \(trial big, \d+s, 2 steps, 1 failed\)", summary[0])
    assert summary[1:] == [gpu_check.outcome_line(o) for o in outcomes]
    log = (tmp_path / "out" / "gpu-check.log").read_text()
    for line in summary[1:]:
        assert log.count(line) == 2   # under its step, and in the summary at the end
    assert "big: needs 4 GPUs, 2 visible; skipped" in log
    assert gpu_check.run(["trial"], tmp_path / "again", phases={"trial": Phase(
        "trial", "", 0, lambda _ctx: [Step.of("passes", ["true"], limit_s=10)])}, gpus=0,
        setup=False, stream=io.StringIO())[0] == 0


def _fake_mps(tmp_path: Path) -> tuple[str, Path]:
    calls = tmp_path / "mps-calls"
    script = tmp_path / "fake-mps-control"
    script.write_text(f"#!/bin/sh\necho \"$@ $(cat 2>/dev/null)\" >> {shlex.quote(str(calls))}\n")
    script.chmod(0o755)
    return str(script), calls


def test_mps_is_started_once_for_its_steps_and_stopped_only_by_the_run(tmp_path,
                                                                    monkeypatch):
    monkeypatch.setattr(gpu_check.time, "sleep", lambda _s: None)
    control, calls = _fake_mps(tmp_path)
    outcomes, log, _ctx = _run(tmp_path, [
        Step.of("under MPS 1", ["sh", "-c", 'test -n "$CUDA_MPS_PIPE_DIRECTORY"'],
                limit_s=10, mps=True),
        Step.of("under MPS 2", ["true"], limit_s=10, mps=True),
        Step.of("without", ["sh", "-c", 'test -z "$CUDA_MPS_PIPE_DIRECTORY"'], limit_s=10),
    ], mps_control=control)
    assert [o.verdict for o in outcomes] == ["ok", "ok", "ok"]
    assert calls.read_text().split("\n")[:2] == ["-d ", " quit"]
    assert log.count("MPS daemon started") == 1 and log.count("MPS daemon stopped") == 1


def test_without_mps_its_steps_are_skipped_not_failed(tmp_path):
    outcomes, log, _ctx = _run(tmp_path, [Step.of("under MPS", ["true"], limit_s=10,
                                                  mps=True)],
                               mps_control="no-such-mps-control")
    assert outcomes[0].verdict == "skipped (no MPS)" and not outcomes[0].failed
    assert "MPS daemon stopped" not in log


@pytest.mark.skipif(MPIEXEC is None, reason="needs mpiexec")
def test_a_timed_step_writes_both_documents_into_the_output(tmp_path):
    context = _context(tmp_path)
    step = gpu_check_phases.timed_step(context, "allreduce host", 2, "allreduce", [
        "--backend", "host", "-b", "1K", "-e", "4K", "-f", "4", "-n", "2", "-w", "1",
        "--baseline", "mpi"], tags={"quick_case": "allreduce-host"}, limit_s=120)
    # Hydra takes --bind-to as Open MPI does; the step's command is the node's.
    with Runner(context, stream=io.StringIO(),
                env={**os.environ, "PYTHONPATH": str(ROOT)}) as runner:
        outcome = runner.run_step("quick", step)
    assert outcome.verdict == "ok" and outcome.documents == 1
    (document,) = [json.loads(line) for line in
                   (context.out / "result-documents.jsonl").read_text().splitlines()]
    rd.validate(document)
    assert document["tool"] == "ipcshare allreduce" and document["world_size"] == 2
    assert {row["baselines"][0]["name"] for row in document["rows"]} == {"mpi"}
    (plain,) = [json.loads(line) for line in
                (context.out / "results.jsonl").read_text().splitlines()]
    assert plain["quick_case"] == "allreduce-host" and plain["op"] == "allreduce"
    log = (context.out / "gpu-check.log").read_text()
    assert "#  Rank" not in log and "Avg bus bandwidth" in log


# -- the phase table ----------------------------------------------------------------------
@pytest.mark.parametrize("gpus", [1, 2, 4])
def test_every_phase_lists_its_steps_for_each_machine_size(tmp_path, gpus):
    context = _context(tmp_path, gpus, AB_TREE=str(ROOT))
    for phase in gpu_check_phases.PHASES.values():
        if gpus < phase.min_gpus:
            continue
        items = phase.steps(context)
        steps = [item for item in items if isinstance(item, Step)]
        assert items, phase.name
        names = [step.name for step in steps]
        assert len(names) == len(set(names)), f"{phase.name}: two steps of one name"
        for step in steps:
            assert step.limit_s > 0 and step.commands
            timed = any(cmd[i:i + 2] == ("-m", "ipcshare") and cmd[i + 2] in TIMED
                        for cmd in step.commands for i in range(len(cmd) - 2))
            mpiexec_ranks = [int(cmd[cmd.index("-n") + 1]) for cmd in step.commands
                             if cmd[0] == context.mpiexec]
            if step.mps:
                assert all("CUDA_MPS_PIPE_DIRECTORY" in cmd for cmd in step.commands
                           if cmd[0] == context.mpiexec), step.name
            if timed:
                assert step.results, f"{step.name}: a timed step writes a result document"
            assert all(n >= 1 for n in mpiexec_ranks)


def test_one_gpu_runs_tests_and_a_timing_phase_under_mps(tmp_path):
    context = _context(tmp_path, 1, TESTS_PARTS="2")
    (tests,) = gpu_check_phases.tests_steps(context)
    assert tests.mps and "-n" in tests.commands[0] and "2" in tests.commands[0]
    quick = gpu_check_phases.quick_steps(_context(tmp_path, 1))
    steps = [s for s in quick if isinstance(s, Step)]
    assert isinstance(quick[0], Note) and len(steps) == 3
    for step in steps:
        assert step.mps and step.results and "--graph" in step.commands[0] or \
            "allreduce" in step.commands[0]
        assert step.commands[0][step.commands[0].index("--baseline") + 1] == "none"
    on_two = [s for s in gpu_check_phases.quick_steps(_context(tmp_path, 2))
              if isinstance(s, Step)]
    assert not any(step.mps for step in on_two)
    assert {s.commands[0][s.commands[0].index("--baseline") + 1] for s in on_two} == {"nccl"}
    assert gpu_check_phases.PHASES["bench"].min_gpus == 2
    assert gpu_check_phases.PHASES["tests"].min_gpus == 1


def test_the_halves_cover_every_gpu_test_file_once():
    halves = [gpu_check_phases.test_files_half(n, ["tests/gpu"], ROOT) for n in (1, 2)]
    every = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests/gpu").rglob("test_*.py"))
    assert sorted(halves[0] + halves[1]) == every
    assert not set(halves[0]) & set(halves[1])
    assert abs(len(halves[0]) - len(halves[1])) <= 1
    named = ["tests/gpu/test_examples.py", "tests/gpu/test_shared_gpu.py",
             "tests/gpu/test_line_probe_gpu.py"]
    assert gpu_check_phases.test_files_half(1, named, ROOT) == [named[0], named[2]]
    assert gpu_check_phases.test_files_half(2, named, ROOT) == [named[1]]


def test_every_tool_is_run_by_a_phase_and_listed_in_the_readme():
    phases = (ROOT / "tools" / "gpu_check_phases.py").read_text()
    readme = (ROOT / "tools" / "README.md").read_text()
    gpu_tests = "".join(p.read_text() for p in (ROOT / "tests" / "gpu").glob("test_*.py"))
    for path in sorted((ROOT / "tools").rglob("*.py")):
        relative = str(path.relative_to(ROOT / "tools"))
        assert f"| `{relative}` |" in readme, f"{relative} has no line in tools/README.md"
        if path.parent == ROOT / "tools":
            continue  # the runner and its table
        used = f"tools/{relative}" in phases or path.stem in gpu_tests
        assert used, f"tools/{relative}: no phase runs it (remove it, or give it a phase)"


def test_the_command_line_lists_and_refuses(capsys):
    assert gpu_check.main(["--list"]) == 0
    listed = capsys.readouterr().out
    assert "allreduce-quick" in listed and "tests" in listed
    with pytest.raises(SystemExit) as stopped:
        gpu_check.main(["no-such-phase"])
    assert stopped.value.code == 2
    assert "unknown phase 'no-such-phase'" in capsys.readouterr().err


def test_a_malformed_commit_is_refused_before_anything_runs(capsys, monkeypatch):
    monkeypatch.setenv("IPCSHARE_SOURCE_COMMIT", "")   # restored after: main sets it
    with pytest.raises(SystemExit) as stopped:
        gpu_check.main(["tests", "--commit", "HEAD~1"])
    assert stopped.value.code == 2
    assert "--commit: IPCSHARE_SOURCE_COMMIT='HEAD~1'" in capsys.readouterr().err
