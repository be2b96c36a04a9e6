#!/usr/bin/env python3
"""The GPU checks of a node, in one run: phases of steps (tools/gpu_check_phases.py holds
them as data, of the kinds tools/gpu_check_steps.py defines), each step under a time
limit, its outcome taken from its exit status and from the result documents it wrote, and
a summary made from those outcomes alone.

    python3 tools/gpu_check.py [PHASE ...] [--out DIR] [--list]     (default: tests bench)
    make gpu-check PHASES="tests allreduce-quick"

Run from the checkout with the node's own python3 (the package need not be installed:
the checkout goes first on PYTHONPATH). Writes under --out (default $OUT, else out/), at
most a few files and two folders deep, as a GPU node hands them back:

    gpu-check.log              every line every step printed, with a header per step
    summary.txt                one line per step: name, verdict, seconds (made from the
                               same outcomes as the log's step footers)
    results.jsonl              the steps' --json documents, one a line, tagged by case
                               (the summary tools' input: tools/auto_rows.py ...)
    result-documents.jsonl     the steps' result documents (docs/CLI.md), one a line
    info.json, *.md            `ipcshare info`, and the tables some phases make

A step fails when its command exits non-zero, runs past its limit (its process group is
sent SIGTERM, then SIGKILL 15 s later), or a result document it was to write is missing,
invalid, or says wrong elements, measurement errors or a non-zero exit status. The run
exits 1 when any step failed, 2 on a bad command line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # the package from this checkout, installed or not
    sys.path.insert(0, str(REPO))
if str(REPO / "tools") not in sys.path:
    sys.path.insert(0, str(REPO / "tools"))

from gpu_check_steps import Context, Note, Outcome, Phase, Step  # noqa: E402

from ipcshare.runtime.result_document import (  # noqa: E402
    DocumentError,
    document_exit_status,
    load,
)

__all__ = ["Runner", "MpsDaemon", "run", "main", "step_verdict", "summary_lines", "outcome_line",
           "count_gpus"]

KILL_GRACE_S = 15
MPS_PIPE = "/tmp/ipcshare-mps-pipe"
MPS_LOG = "/tmp/ipcshare-mps-log"


def step_verdict(rc: int | None, timed_out: bool, limit_s: int,
                 documents: Sequence[tuple[str, dict[str, Any] | None, str | None]]
                 ) -> tuple[str, bool]:
    """The verdict of a step from its exit status (``rc``), whether it ran past
    ``limit_s``, and the result documents it was to write: ``(path, document or None,
    why it could not be read)``. Returns ``(verdict, failed)``."""
    if timed_out:
        return f"TIMEOUT after {limit_s}s", True
    problems = []
    for path, document, error in documents:
        name = os.path.basename(path)
        if document is None:
            problems.append(f"{name}: {error}")
            continue
        status = document_exit_status(document)
        if status:
            said = []
            if document.get("wrong_total"):
                said.append(f"{document['wrong_total']} wrong")
            if document.get("measurement_errors"):
                said.append(f"{len(document['measurement_errors'])} measurement errors")
            problems.append(f"document exit {status}" + (f" ({', '.join(said)})" if said
                                                         else ""))
    if rc:
        return " ".join([f"FAILED rc={rc}", *problems]), True
    if problems:
        return "FAILED " + "; ".join(problems), True
    return "ok", False


def summary_lines(outcomes: Sequence[Outcome], phases: Sequence[str],
                  elapsed_s: float) -> list[str]:
    """The summary: a head line, then one line per step, from ``outcomes`` alone."""
    failed = sum(outcome.failed for outcome in outcomes)
    lines = [f"===== summary ({' '.join(phases)}, {elapsed_s:.0f}s, {len(outcomes)} steps, "
             f"{failed} failed)"]
    lines += [outcome_line(outcome) for outcome in outcomes]
    return lines


def outcome_line(outcome: Outcome) -> str:
    """One step's line, the same in the log's step footer and in the summary."""
    name = f"{outcome.phase}: {outcome.name}"
    return f"{name:<64} {outcome.verdict:<24} {outcome.seconds:5.0f}s"


class MpsDaemon:
    """An MPS daemon of this run's own (pipe and log folders under /tmp): started on the
    first step that asks for it, stopped by this run only if this run started it. Where
    it cannot start, it says why once and ``start`` answers False from then on."""

    def __init__(self, control: str, env: dict[str, str], log: Callable[[str], None]) -> None:
        self.control = control
        self.env = {**env, **self.variables()}
        self.log = log
        self.started = False   # by this run: only then does this run stop it
        self.failed = False

    @staticmethod
    def variables() -> dict[str, str]:
        """What a client of this daemon runs with."""
        return {"CUDA_MPS_PIPE_DIRECTORY": MPS_PIPE, "CUDA_MPS_LOG_DIRECTORY": MPS_LOG}

    def start(self) -> bool:
        """Whether the daemon runs (started now, or earlier by this run)."""
        if self.started:
            return True
        if self.failed:
            return False
        if shutil.which(self.control) is None:
            self.log(f"MPS: {self.control} not found; steps under MPS are skipped")
            self.failed = True
            return False
        for folder in (MPS_PIPE, MPS_LOG):
            os.makedirs(folder, exist_ok=True)
        started = subprocess.run([self.control, "-d"], env=self.env, capture_output=True,
                                 text=True, timeout=60)
        if started.returncode != 0:
            self.log(f"MPS: the daemon did not start (exit {started.returncode}: "
                     f"{(started.stderr or started.stdout).strip()}); steps under MPS are "
                     "skipped")
            self.failed = True
            return False
        self.started = True
        self.log("MPS daemon started")
        return True

    def stop(self) -> None:
        """Stop the daemon, only if this run started it."""
        if not self.started:
            return
        try:
            subprocess.run([self.control], input="quit\n", env=self.env, text=True,
                           capture_output=True, timeout=60)
        except subprocess.TimeoutExpired:
            self.log("MPS: quit was not answered in 60 s")
        time.sleep(2)  # the daemon lets its clients go before it exits
        self.started = False
        self.log("MPS daemon stopped")


class Runner:
    """Runs phases of steps, logging to ``out``/gpu-check.log and to stdout, and keeps
    the outcomes the summary is made of."""

    def __init__(self, context: Context, *, stream: TextIO | None = None,
                 env: dict[str, str] | None = None, mps_control: str = "nvidia-cuda-mps-control",
                 kill_grace_s: float = KILL_GRACE_S) -> None:
        self.context = context
        self.stream = stream if stream is not None else sys.stdout
        self.env = dict(os.environ if env is None else env)
        self.kill_grace_s = kill_grace_s
        self.outcomes: list[Outcome] = []
        context.out.mkdir(parents=True, exist_ok=True)
        self._log = open(context.out / "gpu-check.log", "a", buffering=1)
        self.mps = MpsDaemon(mps_control, self.env, self.log)

    def close(self) -> None:
        """Stop the MPS daemon if this run started it; close the log."""
        self.mps.stop()
        self._log.close()

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # -- output -----------------------------------------------------------------
    def log(self, line: str = "") -> None:
        """A line to stdout and to the log."""
        self.stream.write(line + "\n")
        self.stream.flush()
        self._log.write(line + "\n")

    # -- steps -------------------------------------------------------------------
    def run_phase(self, phase: Phase) -> None:
        """Every step of ``phase`` for this machine, or a note that it is skipped."""
        gpus = self.context.gpus
        if gpus < phase.min_gpus:
            self.log(f"{phase.name}: needs {phase.min_gpus} GPU"
                     f"{'s' if phase.min_gpus > 1 else ''}, {gpus} visible; skipped")
            return
        for item in phase.steps(self.context):
            if isinstance(item, Note):
                self.log(f"{phase.name}: {item.text}")
            else:
                self.run_step(phase.name, item)
        self.mps.stop()  # a phase's daemon does not outlive it

    def run_step(self, phase: str, step: Step) -> Outcome:
        """Run ``step``, log its output and its outcome, and record the outcome."""
        self.log()
        self.log(f"===== {phase}: {step.name} ({time.strftime('%H:%M:%S', time.gmtime())} "
                 f"UTC, limit {step.limit_s}s{', under MPS' if step.mps else ''})")
        if step.mps and not self.mps.start():
            return self.record(Outcome(phase, step.name, "skipped (no MPS)", 0.0, False))
        if not step.mps:
            self.mps.stop()
        if step.needs and not os.path.exists(step.needs):
            return self.record(Outcome(phase, step.name, f"skipped (no {step.needs})", 0.0,
                                        False))
        for path in step.results:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)   # a document from before must not stand for this run
        env = {**self.env, **dict(step.env)}
        if step.mps:
            env.update(MpsDaemon.variables())
        started = time.monotonic()
        deadline = started + step.limit_s
        rc: int | None = 0
        timed_out = False
        tee = open(self.context.out / step.tee, "a") if step.tee else None
        try:
            for command in step.commands:
                self.log("+ " + " ".join(_quoted(command)))
                rc, timed_out = self._run_command(command, env, deadline, step, tee)
                if rc or timed_out:
                    break
        finally:
            if tee is not None:
                tee.close()
        seconds = time.monotonic() - started
        documents = [] if timed_out else [self._read_document(path) for path in step.results]
        verdict, failed = step_verdict(rc, timed_out, step.limit_s, documents)
        self._gather(step, phase, documents)
        return self.record(Outcome(phase, step.name, verdict, seconds, failed, rc,
                                    sum(doc is not None for _p, doc, _e in documents)))

    def record(self, outcome: Outcome) -> Outcome:
        """Keep ``outcome`` for the summary and log its line."""
        self.outcomes.append(outcome)
        self.log(outcome_line(outcome))
        return outcome

    def _run_command(self, command: Sequence[str], env: dict[str, str], deadline: float,
                     step: Step, tee: TextIO | None) -> tuple[int | None, bool]:
        drop = re.compile(step.drop) if step.drop else None
        try:
            process = subprocess.Popen(list(command), stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       env=env, cwd=step.cwd or str(self.context.repo),
                                       start_new_session=True, text=True, errors="replace",
                                       bufsize=1)
        except OSError as exc:
            self.log(f"cannot start {command[0]}: {exc.strerror}")
            return 127, False

        def pump() -> None:
            assert process.stdout is not None
            for line in process.stdout:
                line = line.rstrip("\n")
                if tee is not None:
                    tee.write(line + "\n")
                if drop is None or not drop.search(line):
                    self.log(line)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        timed_out = False
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
            self._kill_group(process)
        reader.join(timeout=30)
        if process.stdout is not None:
            process.stdout.close()
        return process.returncode, timed_out

    def _kill_group(self, process: subprocess.Popen) -> None:
        """SIGTERM to the step's process group (mpiexec and its ranks), SIGKILL after the
        grace, as ``timeout -k`` does."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=self.kill_grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()

    @staticmethod
    def _read_document(path: str) -> tuple[str, dict[str, Any] | None, str | None]:
        if not os.path.exists(path):
            return path, None, "no result document written"
        try:
            return path, load(path), None
        except (DocumentError, OSError) as exc:
            return path, None, f"invalid result document: {exc}"

    def _gather(self, step: Step, phase: str,
                documents: Sequence[tuple[str, dict[str, Any] | None, str | None]]) -> None:
        """The step's documents into the output's two JSON-lines files: results.jsonl
        (its --json documents, tagged) and result-documents.jsonl (its result documents,
        their phase and step under extra)."""
        out = self.context.out
        with open(out / "result-documents.jsonl", "a") as lines:
            for _path, document, _error in documents:
                if document is None:
                    continue
                document.setdefault("extra", {})["gpu_check"] = {"phase": phase,
                                                                 "step": step.name}
                lines.write(json.dumps(document) + "\n")
        with open(out / "results.jsonl", "a") as lines:
            for path, tags in step.json_tags:
                try:
                    document = json.loads(Path(path).read_text())
                except (OSError, json.JSONDecodeError):
                    continue  # the step's verdict already says what it failed to write
                document.update(dict(tags))
                lines.write(json.dumps(document) + "\n")


def _quoted(command: Sequence[str]) -> Iterator[str]:
    import shlex

    return (shlex.quote(part) for part in command)


def count_gpus(env: dict[str, str]) -> int:
    """GPUs this run may use: CUDA_VISIBLE_DEVICES's entries where set, else the lines
    of ``nvidia-smi -L``; 0 without nvidia-smi."""
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([part for part in visible.split(",") if part.strip()])
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(line.startswith("GPU") for line in out.stdout.splitlines())


def install_wheels(runner: Runner, context: Context) -> None:
    """The wheels brought in .whl/ (none on the nodes' image): pytest-mpi, nccl4py,
    ml_dtypes under /tmp/site on PYTHONPATH; MPICH and an mpi4py bound to it under their
    own prefix (only the dead-peer tests use them: Open MPI's launcher kills the whole job
    when a rank dies)."""
    wheels = context.repo / ".whl"
    extra = [str(p) for pattern in ("pytest_mpi-*.whl", "nccl4py-*.whl", "ml_dtypes-*.whl")
             for p in sorted(wheels.glob(pattern))]
    env = runner.env
    if extra:
        runner.run_step("setup", Step.of(
            "install pytest-mpi, nccl4py, ml_dtypes from .whl/",
            [context.python, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
             "--target", "/tmp/site", *extra], limit_s=300))
        # After the checkout, which goes first (run): the package is this tree's.
        parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        at = 1 if parts and parts[0] == str(context.repo) else 0
        env["PYTHONPATH"] = os.pathsep.join(parts[:at] + ["/tmp/site"] + parts[at:])
    mpich = sorted(wheels.glob("mpich-*.whl")) + sorted(wheels.glob("mpi4py-*.whl"))
    if any(p.name.startswith("mpich-") for p in mpich) and \
            any(p.name.startswith("mpi4py-") for p in mpich):
        runner.run_step("setup", Step.of(
            f"install MPICH and mpi4py under {context.mpich_prefix}",
            [context.python, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
             "--prefix", context.mpich_prefix, *map(str, mpich)], limit_s=300))


def log_facts(runner: Runner, context: Context) -> None:
    """The node's facts at the head of the log: nvidia-smi, its topology, the machine's
    facts as the result documents hold them, package versions, the MPI launcher."""
    from ipcshare.topology.machine_facts import machine_facts_here

    runner.log(f"PYTHONPATH={runner.env.get('PYTHONPATH', '')}")
    for command in (["nvidia-smi"], ["nvidia-smi", "topo", "-m"], [context.mpiexec, "--version"]):
        try:
            out = subprocess.run(command, capture_output=True, text=True, timeout=60)
            text = (out.stdout + out.stderr).rstrip()
        except (OSError, subprocess.SubprocessError) as exc:
            text = f"{command[0]}: {exc}"
        for line in text.splitlines()[:60]:
            runner.log(line)
    runner.log("machine: " + json.dumps(machine_facts_here()))
    commit = subprocess.run(
        [context.python, "-c", "import json; from ipcshare.runtime.source_commit import "
         "source_commit; print(json.dumps(source_commit()))"], capture_output=True, text=True,
        env=runner.env, cwd=str(context.repo), timeout=60)
    runner.log("commit: " + (commit.stdout.strip() or commit.stderr.strip()))
    if '"unknown"' in commit.stdout:
        runner.log("commit: unknown here (no git folder): pass --commit HASH[+dirty] so "
                   "that the result documents name it")
    probe = ("import importlib, platform\nprint('python', platform.python_version())\n"
             "for name in ('numpy', 'mpi4py', 'torch', 'cupy', 'cuda.bindings', 'pytest', "
             "'pytest_mpi', 'nccl4py'):\n"
             "    try:\n        m = importlib.import_module(name)\n"
             "        print(f'{name:14s}', getattr(m, '__version__', '?'))\n"
             "    except Exception as exc:\n        print(f'{name:14s} not importable: {exc}')\n")
    out = subprocess.run([context.python, "-c", probe], capture_output=True, text=True,
                         env=runner.env, timeout=120)
    for line in (out.stdout + out.stderr).splitlines():
        runner.log(line)
    runner.log(f"GPUs visible: {context.gpus}")


def run(phase_names: Sequence[str], out: Path, *, env: dict[str, str] | None = None,
        phases: dict[str, Phase] | None = None, gpus: int | None = None,
        setup: bool = True, stream: TextIO | None = None) -> tuple[int, list[Outcome]]:
    """Run ``phase_names`` (in the order given) writing under ``out``; returns the exit
    status (0 when no step failed) and the outcomes."""
    from gpu_check_phases import PHASES, base_environment

    table = PHASES if phases is None else phases
    env = dict(os.environ if env is None else env)
    env.update(base_environment())
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.txt").write_text("")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ipcshare-gpu-check.") as scratch:
        context = Context(gpus=count_gpus(env) if gpus is None else gpus, out=out,
                          scratch=Path(scratch), python=env.get("PYTHON", "python3"),
                          mpiexec=env.get("MPIEXEC", "mpiexec"), knobs=env)
        with Runner(context, stream=stream, env=env) as runner:
            runner.log(f"===== gpu-check {' '.join(phase_names)} on {os.uname().nodename} at "
                       f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}")
            if setup:
                install_wheels(runner, context)
                log_facts(runner, context)
                runner.run_step("setup", Step.of(
                    "ipcshare info", [context.python, "-m", "ipcshare", "info", "--json",
                                      str(out / "info.json")], limit_s=120))
            if context.gpus < 1 and setup:
                runner.record(Outcome("setup", "a GPU visible", "FAILED (none)", 0.0, True))
            for name in phase_names:
                runner.run_phase(table[name])
            lines = summary_lines(runner.outcomes, phase_names, time.monotonic() - started)
            runner.log()
            for line in lines:
                runner.log(line)
            (out / "summary.txt").write_text("\n".join(lines) + "\n")
            failed = any(outcome.failed for outcome in runner.outcomes)
            return (1 if failed else 0), list(runner.outcomes)


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: phases, --out, --list."""
    from gpu_check_phases import DEFAULT_PHASES, PHASES

    parser = argparse.ArgumentParser(
        prog="tools/gpu_check.py", description="The GPU checks of a node, phase by phase.",
        epilog="phases: " + "; ".join(f"{p.name} ({p.about})" for p in PHASES.values()))
    parser.add_argument("phases", nargs="*", metavar="PHASE",
                        help="phases to run, in order (default, or all: "
                             f"{' '.join(DEFAULT_PHASES)})")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "out"),
                        help="output folder (default $OUT, else out/)")
    parser.add_argument("--list", action="store_true",
                        help="list the phases and the GPUs each needs, then exit")
    parser.add_argument("--commit", metavar="HASH[+dirty]",
                        help="the commit of this tree where it has no git folder (a copy "
                             "on a GPU node): what every result document names")
    args = parser.parse_args(argv)
    if args.list:
        for phase in PHASES.values():
            print(f"{phase.name:<16} {phase.min_gpus}+ GPUs  {phase.about}")
        return 0
    # "all" is the old script's name for the default phases.
    names = [name for asked in args.phases or ["all"]
             for name in (DEFAULT_PHASES if asked == "all" else [asked])]
    unknown = [name for name in names if name not in PHASES]
    if unknown:
        parser.error(f"unknown phase {unknown[0]!r}; phases: {', '.join(PHASES)}")
    env = dict(os.environ)
    if args.commit:
        from ipcshare.runtime import settings
        from ipcshare.runtime.errors import SettingError

        env[settings.SOURCE_COMMIT] = args.commit
        try:
            os.environ[settings.SOURCE_COMMIT] = args.commit   # read by the check below
            settings.given_source_commit()
        except SettingError as exc:
            parser.error(f"--commit: {exc}")
    status, _outcomes = run(names, args.out, env=env)
    return status


if __name__ == "__main__":
    sys.exit(main())
