"""One rank's timeout never hangs the job or corrupts its memory.

A wait that times out on one rank used to leave the others in the driver's next blocking
collective for ever (the SignalTimeout that started it never printed), and an exchange
timeout left an MPI request that MPI_Finalize completed into freed memory (``malloc():
unsorted double linked list corrupted``). Each case runs real jobs under ``timeout``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ..launchers import mpich_launcher

HYDRA = mpich_launcher("mpiexec")
LATE_JOB = Path(__file__).with_name("late_rank_job.py")
# Runs of each tiny-timeout case: a few in `make test`; the soak's 20 (`make test-slow`, about
# 3 minutes on 2 cores for all eight cases) are what docs/RELIABILITY.md reports.
QUICK_RUNS, SOAK_RUNS = 2, 20
# Signals of a process that died on its own (SIGABRT from malloc's checks, SIGSEGV),
# as the launcher or subprocess report them.
_CRASHES = {134, 139, -6, -11}

needs_hydra = pytest.mark.skipif(HYDRA is None, reason="needs mpiexec (pip install mpich)")


@needs_hydra
@pytest.mark.parametrize("ranks", [2, 3])
def test_a_rank_that_times_out_alone_is_named_by_every_rank(socket_base, ranks):
    env = dict(os.environ, IPCSHARE_SOCKET_DIR=str(socket_base), IPCSHARE_SIGNAL_TIMEOUT="0.05",
               LATE_S="0.5")
    started = time.monotonic()
    out = subprocess.run([HYDRA, "-n", str(ranks), sys.executable, str(LATE_JOB)],
                         capture_output=True, text=True, timeout=60, env=env)
    elapsed = time.monotonic() - started
    # Every rank raises the same agreed error, in the words of the first rank that timed
    # out (rank 1, unless the machine's load made another time out first), naming it.
    # Ranks' lines may interleave on the launcher's stdout.
    said = dict(re.findall(r"RANK (\d+): (SignalTimeout: checks at 1K ring failed on "
                           r"rank \d@\S+: rank \d@\S+ in \w+ waiting for rank \d@\S+: "
                           r"signal word \d+ still \d+ < \d+ after 0\.05 s"
                           r"(?: \(reported by [^)]*\))?)", out.stdout))
    assert sorted(said) == [str(rank) for rank in range(ranks)], out.stdout + out.stderr
    assert len(set(said.values())) == 1, said
    assert out.returncode == 3, out.stderr
    assert elapsed < 20, f"took {elapsed:.1f} s"
    assert list(socket_base.iterdir()) == []


@needs_hydra
@pytest.mark.parametrize("runs", [QUICK_RUNS, pytest.param(SOAK_RUNS, marks=pytest.mark.slow)])
@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.parametrize("value", ["1e-9", "0.001"])
@pytest.mark.parametrize("name", ["IPCSHARE_SIGNAL_TIMEOUT", "IPCSHARE_EXCHANGE_TIMEOUT"])
def test_tiny_timeouts_never_hang_or_abort(socket_base, name, value, ranks, runs):
    # 1 ns is refused at start on every rank; 1 ms, the smallest accepted, makes waits time
    # out at any step on any rank. Either way: every run ends within the bound, with no
    # abort and no traceback, and every rank of a failed run says why in one line.
    env = dict(os.environ, IPCSHARE_SOCKET_DIR=str(socket_base), **{name: value})
    cmd = [HYDRA, "-n", str(ranks), sys.executable, "-m", "ipcshare", "ring", "-b", "1K",
           "-e", "4K", "--backend", "host", "--exchange", "socket"]
    outcomes, partial = [], 0
    for run in range(runs):
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
        except subprocess.TimeoutExpired:
            pytest.fail(f"run {run} hung: {name}={value}, {ranks} ranks")
        errors = [line for line in out.stderr.splitlines()
                  if line.startswith("ipcshare: error:")]
        context = f"run {run}, rc {out.returncode}:\n{out.stderr}"
        assert out.returncode not in _CRASHES, context
        assert "malloc" not in out.stderr and "corrupt" not in out.stderr, context
        assert "Traceback" not in out.stderr and "internal error" not in out.stderr, context
        if out.returncode == 0:
            assert errors == [], context
        else:
            assert 1 <= len(errors) <= ranks, context
            # A rank that times out in the job's last meeting, which its peers passed (a
            # timeout shorter than the ranks' skew), fails alone: they had finished. Rare
            # (about 1 run in 150 here); a rank's line cut off by the launcher, as when
            # ranks left without MPI_Finalize at once, showed in 1 run in 4.
            partial += len(errors) < ranks
        if value == "1e-9":
            assert out.returncode == 1, context
            assert all(f"{name}='1e-9' is out of range" in line for line in errors), context
        outcomes.append(out.returncode)
    assert len(outcomes) == runs
    # 2 in 20 at most: rare, as said above (and at most one in a short run's few)
    assert partial <= max(1, runs // 10), f"{partial} of {runs} failed runs without every " \
                                          "rank's line"
