"""A rank SIGKILLed at the worst moments: the others name it, exit, and leave nothing.

Each case starts a real job. ``mpiexec.gforker`` with SIGINT ignored by the ranks is a
launcher that keeps the job running after a death (MPICH 5's hydra ends ipcshare's
survivors even with -disable-auto-cleanup, see docs/RELIABILITY.md), so every survivor
must find out by itself; hydra's default, which kills the whole job, is tested too.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from ipcshare.liveness.mpi_segments import remove_stale_mpi_segments

from ..launchers import mpich_launcher
from ..resources import idle_shm_entries

HYDRA = mpich_launcher("mpiexec")
GFORKER = mpich_launcher("mpiexec.gforker")
JOB = Path(__file__).with_name("dead_peer_job.py")
# What the issue asks for by default; detection through pidfds takes milliseconds.
DETECTION_BOUND_S = 30.0
RANKS = 3
VICTIM = 1
# Survivors have about 1 s to report before gforker ends the job: with a test of another
# pytest-xdist worker beside them on a 2-core machine they missed it.
pytestmark = pytest.mark.serial


def _leftover_processes(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                    if marker.encode() in cmdline.read():
                        found.append(int(entry))
            except OSError:
                pass
    return found


def _sweep_mpich_segments() -> None:
    """Remove MPICH segments that no process uses any more (what the next ipcshare job
    would do once they are a minute old): one created by the dead rank and never
    attached by a survivor stays (MPICH unlinks it only in MPI_Finalize, which the dead
    rank never reaches). Swept here so that CI machines do not collect 3 MiB per run;
    ipcshare's own memory never lives in /dev/shm."""
    remove_stale_mpi_segments(min_age=0)


def _run_job(launcher: list[str], mode: str, tmp_path: Path, extra_env: dict[str, str],
             sockets: Path):
    marker = f"ipcshare-fault-{uuid.uuid4().hex}"
    # gforker SIGQUITs the job about 1 s after a death: every report must come before.
    env = dict(os.environ, IPCSHARE_SOCKET_DIR=str(sockets), GRACE="0.3", **extra_env)
    shm = idle_shm_entries()
    started = time.monotonic()
    out = subprocess.run([*launcher, "-n", str(RANKS), sys.executable, str(JOB), mode,
                          str(VICTIM), str(tmp_path / "death"), marker],
                         capture_output=True, text=True, timeout=120, env=env)
    elapsed = time.monotonic() - started
    time.sleep(0.2)  # let the kernel finish reaping
    assert _leftover_processes(marker) == [], "processes left behind"
    # Survivors leave without MPI_Finalize: they unlink MPICH's segment themselves.
    # (Only new entries count: other jobs on the machine may remove theirs meanwhile.)
    assert idle_shm_entries() - shm == set(), "something left in /dev/shm"
    _sweep_mpich_segments()
    return out, elapsed, sockets


needs_gforker = pytest.mark.skipif(GFORKER is None, reason="needs mpiexec.gforker (mpich)")


@needs_gforker
@pytest.mark.parametrize("mode", ["handle-exchange", "descriptor-exchange", "pattern",
                                  "signal"])
def test_every_survivor_names_the_dead_rank(mode, tmp_path, socket_base):
    # In the descriptor exchange the last survivor comes 0.5 s late, after the first
    # removed the socket directory: it said "the socket ... is gone" instead of naming
    # the death (a loaded CI machine, 1 run in 5), and its guard ended it.
    slow = "0.5" if mode == "descriptor-exchange" else "0"
    out, elapsed, sockets = _run_job([GFORKER], mode, tmp_path,
                                     {"IGNORE_SIGINT": "1", "SLOW_SURVIVOR_S": slow},
                                     socket_base)
    lines = re.findall(r"SURVIVOR rank (\d+) detected after ([\d.]+) s: (.*)", out.stdout)
    assert sorted(int(rank) for rank, _s, _m in lines) == [0, 2], out.stdout + out.stderr
    for _rank, seconds, message in lines:
        assert re.match(rf"rank {VICTIM}@\S+ \(pid \d+\) died while rank \d@", message)
        assert float(seconds) < DETECTION_BOUND_S
    assert "Traceback" not in out.stderr
    assert list(sockets.iterdir()) == [], "socket directory left behind"
    assert elapsed < 60


@needs_gforker
def test_a_rank_stuck_in_a_blocking_mpi_call_is_ended_by_its_guard(tmp_path, socket_base):
    out, _elapsed, sockets = _run_job([GFORKER], "mpi-collective", tmp_path,
                                      {"IGNORE_SIGINT": "1"}, socket_base)
    ended = re.findall(r"ipcshare: error: rank 1@\S+ \(pid \d+\) died; rank (\d)@\S+ was "
                       r"stuck for 0.3 s", out.stderr)
    assert sorted(ended) == ["0", "2"], out.stderr
    assert list(sockets.iterdir()) == [], "socket directory left behind"


@pytest.mark.skipif(HYDRA is None, reason="needs mpiexec (mpich)")
def test_hydra_default_kills_the_job_and_nothing_stays(tmp_path, socket_base):
    from ipcshare.exchange.socket_dir import remove_stale_socket_dirs

    out, elapsed, sockets = _run_job([HYDRA], "pattern", tmp_path, {}, socket_base)
    assert out.returncode != 0 and elapsed < 60
    # Survivors are SIGKILLed by the launcher: their socket directory stays until a
    # later job sweeps it, which it does once the directory is stale and its creator
    # provably gone (tests/unit/test_socket_dir.py has the decoys it must not touch).
    leftovers = sorted(str(path) for path in sockets.iterdir())
    then = time.time() - 3600
    for leftover in leftovers:
        os.utime(leftover, (then, then))
    assert remove_stale_socket_dirs(str(sockets)) == leftovers
    assert list(sockets.iterdir()) == []


CLI_IGNORING_SIGINT = ("import signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
                       "from ipcshare.cli.main import main; sys.exit(main(sys.argv[1:]))")


def _pid_of_rank(marker: str, rank: int) -> int | None:
    for pid in _leftover_processes(marker):
        try:
            with open(f"/proc/{pid}/environ", "rb") as environ:
                if f"PMI_RANK={rank}".encode() in environ.read().split(b"\0"):
                    with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                        if b"ring" in cmdline.read().split(b"\0"):
                            return pid
        except OSError:
            pass
    return None


@needs_gforker
@pytest.mark.parametrize("ignoring_sigint", [True, False])
def test_the_cli_prints_one_line_per_survivor_when_a_rank_is_killed(tmp_path, socket_base,
                                                                    ignoring_sigint):
    import signal

    sockets = socket_base
    marker = f"ipcshare-fault-{uuid.uuid4().hex}"
    env = dict(os.environ, IPCSHARE_SOCKET_DIR=str(sockets), IPCSHARE_PEER_EXIT_GRACE="0.5")
    shm = idle_shm_entries()
    # Ignoring SIGINT, the ranks are not ended by gforker's interrupt, so it is a launcher
    # that keeps the job running (until its SIGQUIT a second later) and the ranks must
    # notice by themselves. Plain, they get that interrupt right after the death: it
    # used to end them silently in 4 of 6 trials.
    command = ["-c", CLI_IGNORING_SIGINT] if ignoring_sigint else ["-m", "ipcshare"]
    job = subprocess.Popen(
        [GFORKER, "-n", str(RANKS), sys.executable, *command, "ring",
         "--backend",
         "host", "-b", "4K", "-e", "4K", "-n", "3000000", "-w", "0", "-c", "0",
         "--json", str(tmp_path / f"{marker}.json")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert job.stdout.readline().startswith("#")  # rank 0 prints the header: running
        time.sleep(1.0)
        victim = _pid_of_rank(marker, VICTIM)
        assert victim is not None
        os.kill(victim, signal.SIGKILL)
        started = time.monotonic()
        _out, err = job.communicate(timeout=60)
        elapsed = time.monotonic() - started
    finally:
        job.kill()
        job.wait()
    errors = [line for line in err.splitlines() if line.startswith("ipcshare: error:")]
    assert len(errors) == RANKS - 1, err
    for line in errors:
        assert re.search(rf"rank {VICTIM}@\S+ \(pid {victim}\) died", line), line
    assert {re.search(r"rank (\d)@\S+ (?:was|\(pid)", line.split("died")[1]).group(1)
            for line in errors} == {"0", "2"}
    assert "Traceback" not in err
    assert elapsed < DETECTION_BOUND_S
    time.sleep(0.2)
    assert _leftover_processes(marker) == []
    assert list(sockets.iterdir()) == []
    assert idle_shm_entries() - shm == set()
    _sweep_mpich_segments()
