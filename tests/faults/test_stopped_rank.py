"""A rank stopped (SIGSTOP) in the middle of a job: every other rank ends with one line
naming it, within the timeouts, without a traceback and without MPI_Finalize (which
would wait for the stopped rank for ever); the stopped rank is ended too, so that the
launcher returns. Before: 2 of 13 CLI runs hung with no line (the others sat in the
driver's blocking all-gathers), the runs that ended printed KeyboardInterrupt tracebacks
and called the ranks that left on a timeout "died", and from Python the survivors sat in
MPI_Finalize until killed.

One short run of each here; ``tools/checks/socket_attacks.py stop`` repeats them (50 runs).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ..launchers import mpich_launcher

GFORKER = mpich_launcher("mpiexec.gforker")
JOB = Path(__file__).with_name("stopped_rank_job.py")
RANKS = 3
VICTIM = 1
TIMEOUT_S = 1.0  # signal and exchange timeouts alike

needs_gforker = pytest.mark.skipif(GFORKER is None, reason="needs mpiexec.gforker "
                                   "(pip install mpich)")


def run_and_stop(command: list[str], pid_line: str, env: dict[str, str], *,
                 stop_after: float, bound: float) -> tuple[subprocess.CompletedProcess, float]:
    """Start ``command``, read each rank's pid from its ``pid_line`` (a regex: rank, pid),
    SIGSTOP rank ``VICTIM`` ``stop_after`` seconds after the last one appeared, and wait
    at most ``bound`` seconds; returns what it printed and the seconds from the stop to
    its end (every process it left is killed, and the test fails, after ``bound``)."""
    job = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=env)
    pids: dict[int, int] = {}
    seen = []
    while len(pids) < RANKS:
        line = job.stdout.readline()
        if not line:
            break
        seen.append(line)
        for rank, pid in re.findall(pid_line, line):  # the launcher may join lines
            pids[int(rank)] = int(pid)
    assert len(pids) == RANKS, "".join(seen) + job.stderr.read()
    time.sleep(stop_after)
    os.kill(pids[VICTIM], signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        out, err = job.communicate(timeout=bound)
    except subprocess.TimeoutExpired:
        for pid in pids.values():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        job.kill()
        out, err = job.communicate()
        pytest.fail(f"the job hung after rank {VICTIM} was stopped:\n{out}\n{err}")
    return (subprocess.CompletedProcess(command, job.returncode, "".join(seen) + out, err),
            time.monotonic() - stopped)


def _env(socket_base: Path) -> dict[str, str]:
    return dict(os.environ, IPCSHARE_SOCKET_DIR=str(socket_base),
                IPCSHARE_SIGNAL_TIMEOUT=str(TIMEOUT_S), IPCSHARE_EXCHANGE_TIMEOUT=str(TIMEOUT_S),
                IPCSHARE_PEER_EXIT_GRACE="0.5")


@needs_gforker
def test_a_stopped_rank_ends_the_cli_job_with_one_line_per_rank(socket_base):
    out, took = run_and_stop(
        [GFORKER, "-n", str(RANKS), sys.executable, "-m", "ipcshare", "ring", "-b", "1K",
         "-e", "32M", "-n", "100", "--backend", "host", "--exchange", "socket"],
        r"#\s+Rank\s+(\d+) Pid\s+(\d+)", _env(socket_base), stop_after=0.5, bound=60)
    assert out.returncode != 0
    assert "Traceback" not in out.stderr, out.stderr
    lines = [line for line in out.stderr.splitlines() if line.startswith("ipcshare: error:")]
    assert len(lines) == RANKS, out.stderr
    for line in lines:
        assert re.search(rf"rank {VICTIM}@\S+ (\(pid \d+\) )?stopped responding", line), line
        assert " died" not in line, line
    # Within twice the timeouts, and the guard's short grace, after the stop.
    assert took < 2 * (2 * TIMEOUT_S) + 4, took


def test_a_stopped_rank_ends_a_python_job(socket_base):
    launcher = GFORKER or mpich_launcher("mpiexec")
    if launcher is None:
        pytest.skip("needs an MPICH launcher (pip install mpich)")
    out, took = run_and_stop([launcher, "-n", str(RANKS), sys.executable, str(JOB), "60"],
                             r"RANK (\d+) pid (\d+)", _env(socket_base), stop_after=0.5,
                             bound=60)
    assert out.returncode != 0
    assert "Traceback" not in out.stderr, out.stderr
    failed = [line for line in out.stdout.splitlines() if " failed: " in line]
    survivors = [line for line in failed if not line.startswith(f"RANK {VICTIM} ")]
    assert len(survivors) == RANKS - 1, out.stdout + out.stderr
    for line in survivors:  # a collective's wait says it stopped; a signal's, whom it awaits
        assert re.search(rf"rank {VICTIM}@\S+ \(pid \d+\) stopped responding|waiting for "
                         rf"rank {VICTIM}@\S+: signal word", line), line
    # The stopped rank was continued as they left (gforker) and said it was stopped, or
    # its launcher ended it (hydra).
    for line in failed:
        if line.startswith(f"RANK {VICTIM} "):
            assert "was stopped (SIGSTOP, or a debugger) and continued" in line, line
    assert took < 2 * (2 * TIMEOUT_S) + 4, took
    assert list(socket_base.iterdir()) == []


def test_a_rank_stopped_before_the_group_is_given_up_on_after_the_timeout(socket_base):
    """Ranks that met once know each other's pids: one that is stopped when the others
    make a group is not waited for as a late starter (IPCSHARE_ARRIVAL_TIMEOUT), but
    named after the timeout, and the others leave without MPI_Finalize. Under hydra,
    which ends the job as the first survivor leaves (once both have spoken): gforker
    would add a second for each rank that leaves without MPI_Finalize."""
    launcher = mpich_launcher("mpiexec") or GFORKER
    if launcher is None:
        pytest.skip("needs an MPICH launcher (pip install mpich)")
    out, took = run_and_stop([launcher, "-n", str(RANKS), sys.executable, str(JOB), "60",
                              "before-group"], r"RANK (\d+) pid (\d+)", _env(socket_base),
                             stop_after=0, bound=60)
    survivors = [line for line in out.stdout.splitlines()
                 if " failed: " in line and not line.startswith(f"RANK {VICTIM} ")]
    assert len(survivors) == RANKS - 1, out.stdout + out.stderr
    for line in survivors:
        assert re.search(rf"making a group over {RANKS} ranks: rank {VICTIM}@\S+ \(pid \d+\) "
                         rf"stopped responding .*within {TIMEOUT_S:g} s", line), line
    assert took < 2 * TIMEOUT_S + 6, took
