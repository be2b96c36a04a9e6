"""A program that makes its group on some ranks only (the mistake ``if rank == 0:
Group()``) ends: the ranks that made it raise within IPCSHARE_ARRIVAL_TIMEOUT, naming the
cause, and the job exits non-zero instead of waiting for ever in MPI's split."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from ..launchers import mpich_launcher

HYDRA = mpich_launcher("mpiexec")

_PROGRAM = """
import sys, time
from mpi4py import MPI
import ipcshare
if MPI.COMM_WORLD.rank == 0:
    ipcshare.Group(backend="host")
    print("MADE", flush=True)
else:
    time.sleep(float(sys.argv[1]))
print("DONE", MPI.COMM_WORLD.rank, flush=True)
"""


@pytest.mark.skipif(HYDRA is None, reason="MPICH's mpiexec (hydra) is not installed")
@pytest.mark.parametrize("others_stay_s", [0.0, 4.0], ids=["others-leave", "others-stay"])
def test_a_group_made_on_rank_0_alone_ends_the_job_naming_the_cause(tmp_path, others_stay_s):
    program = tmp_path / "some_ranks.py"
    program.write_text(_PROGRAM)
    env = dict(os.environ, IPCSHARE_ARRIVAL_TIMEOUT="1.5")
    start = time.monotonic()
    job = subprocess.run([HYDRA, "-n", "3", sys.executable, str(program), str(others_stay_s)],
                         capture_output=True, text=True, env=env, timeout=120)
    took = time.monotonic() - start
    assert job.returncode != 0, job.stdout
    assert "MADE" not in job.stdout
    assert ("ExchangeTimeout: making a group over 3 ranks: not every rank arrived within "
            "1.5 s") in job.stderr, job.stderr
    assert "IPCSHARE_ARRIVAL_TIMEOUT" in job.stderr
    # Before, rank 0 sat in MPI's split until the test's own timeout.
    assert took < others_stay_s + 30, took
