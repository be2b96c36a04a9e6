"""The pieces of a fast, complete exit after a peer stopped: what /proc says of a peer, a
leaving rank that waits only until every rank has spoken, a step that does not wait a
second timeout for a stopped peer, and a wait that gives a busy rank more time only while
nobody is stopped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from ipcshare.liveness import consensus, deadline_waits, exit_policy
from ipcshare.runtime.errors import ExchangeTimeout, SignalTimeout
from ipcshare.topology import job_ranks
from ipcshare.topology.process_state import (
    LEAVING_NAME,
    peer_state,
    process_start_time,
)


@pytest.fixture(autouse=True)
def _this_process_stays(monkeypatch):
    """What a wait that gives up does to its process (leave without MPI_Finalize at exit,
    hold the request given up on) must not happen to this test process: the CLI's
    main() called in it later would leave at once, ending the worker."""
    monkeypatch.setattr(deadline_waits, "leave_without_finalize_at_exit",
                        lambda reason, stopped_pids=(): None)
    monkeypatch.setattr(deadline_waits, "keep", lambda *requests, buffers=(): None)


def _wait_for_state(pid: int, letters: str) -> None:
    """Until ``/proc/PID/stat`` shows one of ``letters`` (a stop takes effect
    asynchronously)."""
    for _ in range(500):
        with open(f"/proc/{pid}/stat") as stat:
            if stat.read().rsplit(")", 1)[1].split()[0] in letters:
                return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} never reached state {letters}")


@pytest.fixture
def sleeper():
    child = subprocess.Popen(["sleep", "600"])
    try:
        yield child
    finally:
        child.kill()
        child.wait()


def test_a_peer_is_running_stopped_or_gone_as_proc_says(sleeper):
    started = process_start_time(sleeper.pid)
    assert peer_state(sleeper.pid, started) == "running"
    # Another start time: the pid names another process by now.
    assert peer_state(sleeper.pid, started + 1) == "gone"
    os.kill(sleeper.pid, signal.SIGSTOP)
    _wait_for_state(sleeper.pid, "T")
    assert peer_state(sleeper.pid, started) == "stopped"
    sleeper.kill()
    _wait_for_state(sleeper.pid, "Z")
    assert peer_state(sleeper.pid, started) == "gone"  # a zombie has left
    sleeper.wait()
    assert peer_state(sleeper.pid, started) == "gone"


def test_a_process_that_marked_itself_leaving_is_seen_leaving():
    child = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\n"
        "from ipcshare.topology.process_state import mark_leaving\n"
        "assert mark_leaving()\n"
        "print('marked', flush=True)\n"
        "time.sleep(600)\n")], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "marked\n"
        assert peer_state(child.pid, process_start_time(child.pid)) == "leaving"
        with open(f"/proc/{child.pid}/comm") as comm:
            assert comm.read().strip() == LEAVING_NAME
    finally:
        child.kill()
        child.communicate()


def _note(pid: int, job_rank: int, started: int | None, *, job_size: int) -> None:
    """What a world made here would note of a rank on this host."""
    job_ranks.note_ranks([0, job_rank], ["here", "here"], [os.getpid(), pid],
                         [process_start_time(), started], own_job_rank=0, job_size=job_size,
                         host="here")


@pytest.fixture
def nothing_seen(monkeypatch):
    monkeypatch.setattr(job_ranks, "_seen", {})
    monkeypatch.setattr(job_ranks, "_job_size", 0)


def test_only_ranks_proven_to_be_the_same_process_are_seen(nothing_seen, sleeper):
    started = process_start_time(sleeper.pid)
    _note(sleeper.pid, 1, started + 1, job_size=3)   # its pid is another process here
    job_ranks.note_ranks([2], ["elsewhere"], [sleeper.pid], [started], own_job_rank=0,
                         job_size=3, host="here")     # another host's pid means nothing
    assert job_ranks.seen_ranks() == {}
    _note(sleeper.pid, 1, started, job_size=3)
    assert list(job_ranks.seen_ranks()) == [1] and not job_ranks.every_rank_seen()
    assert job_ranks.stopped_ranks([1, 2]) == []
    os.kill(sleeper.pid, signal.SIGSTOP)
    _wait_for_state(sleeper.pid, "T")
    assert job_ranks.stopped_ranks([1, 2]) == [1]
    assert job_ranks.describe_stopped([1]) == (
        f"rank 1@here (pid {sleeper.pid}) stopped responding (its process is stopped: "
        "SIGSTOP, or a debugger)")


def test_every_rank_must_be_seen_to_have_spoken(nothing_seen, sleeper):
    assert not exit_policy.peers_have_spoken()   # nothing known: wait the whole linger
    _note(sleeper.pid, 1, process_start_time(sleeper.pid), job_size=3)
    os.kill(sleeper.pid, signal.SIGSTOP)
    _wait_for_state(sleeper.pid, "T")
    # The third rank is out of sight (another node): it may still have to speak.
    assert not exit_policy.peers_have_spoken()
    gone = subprocess.Popen(["true"])
    gone_started = process_start_time(gone.pid) or 0
    _note(gone.pid, 2, gone_started, job_size=3)
    gone.wait()
    assert exit_policy.peers_have_spoken()   # one stopped, one gone
    os.kill(sleeper.pid, signal.SIGCONT)
    _wait_for_state(sleeper.pid, "SR")
    assert not exit_policy.peers_have_spoken()   # running again: it may speak yet


_LEAVER = """
import os, sys
from ipcshare.liveness import exit_policy
from ipcshare.topology import job_ranks
from ipcshare.topology.process_state import process_start_time
peer = int(sys.argv[1])
job_ranks.note_ranks([0, 1], ["h", "h"], [os.getpid(), peer],
                     [process_start_time(), process_start_time(peer)], own_job_rank=0,
                     job_size=2, host="h")
print("leaving", flush=True)
exit_policy.leave_after_peer_death(3, linger=float(sys.argv[2]))
"""


def _leave(peer: int, linger: float) -> tuple[subprocess.Popen, float]:
    leaver = subprocess.Popen([sys.executable, "-c", _LEAVER, str(peer), str(linger)],
                              stdout=subprocess.PIPE, text=True)
    assert leaver.stdout.readline() == "leaving\n"
    return leaver, time.monotonic()


def test_a_leaving_rank_waits_for_a_running_peer_and_not_for_a_stopped_one(sleeper):
    leaver, started = _leave(sleeper.pid, 1.5)
    time.sleep(0.5)
    # Still there, and its peers can see that it has spoken.
    assert leaver.poll() is None
    assert peer_state(leaver.pid, process_start_time(leaver.pid)) == "leaving"
    leaver.communicate(timeout=30)
    assert leaver.returncode == 3
    assert time.monotonic() - started >= 1.4   # the peer ran on: the whole linger

    os.kill(sleeper.pid, signal.SIGSTOP)
    _wait_for_state(sleeper.pid, "T")
    leaver, started = _leave(sleeper.pid, 20)
    leaver.communicate(timeout=30)
    assert leaver.returncode == 3
    assert time.monotonic() - started < 5   # a stopped peer says nothing more


class _StoppedPeerWatch:
    """The little of a PeerWatch that a step reads, with rank 1 stopped."""

    class world:
        pids = [100, 101, 102]

    dead_ranks: list[int] = []

    def __init__(self) -> None:
        self.failed = None

    def stopped_ranks(self):
        return [1]

    def describe_stopped(self, stopped):
        return "rank 1@h (pid 101) stopped responding (its process is stopped)"

    def fail(self, reason):
        self.failed = self.failed or reason


def test_a_step_whose_wait_timed_out_on_a_stopped_peer_does_not_wait_again(monkeypatch):
    leaving = []   # the autouse fixture's stand-in, recording this time
    monkeypatch.setattr(deadline_waits, "leave_without_finalize_at_exit",
                        lambda reason, stopped_pids=(): leaving.append(list(stopped_pids)))

    watch = _StoppedPeerWatch()  # and no world: no agreement is tried
    started = time.monotonic()
    with pytest.raises(ExchangeTimeout, match=r"^checks at 1K ring: rank 1@h \(pid 101\) "
                                              r"stopped responding .*; rank 0@h in ring "
                                              r"waiting for rank 2@h: signal word"):
        with consensus.collective_step(None, "checks at 1K ring", watch=watch, timeout=30):
            raise SignalTimeout("rank 0@h in ring waiting for rank 2@h: signal word 3 still "
                                "2 < 3 after 3 s")
    assert time.monotonic() - started < 1
    assert watch.failed and leaving == [[101]]   # no MPI_Finalize: rank 1 cannot answer
    # The descriptor exchange agrees by itself after a socket wait timed out: alike.
    with pytest.raises(ExchangeTimeout, match=r"^descriptor exchange \(socket\): rank 1@h "
                                              r"\(pid 101\) stopped responding .*; no "
                                              r"descriptor from local rank\(s\) \[1\]"):
        consensus.agree(None, "descriptor exchange (socket)", ExchangeTimeout(
            "no descriptor from local rank(s) [1] within 3 s"), watch=watch, timeout=30)


class _NeverDone:
    def Test(self) -> bool:  # the MPI spelling
        return False


@pytest.mark.parametrize("stopped,within", [(False, (0.55, 3)), (True, (0.1, 0.45))])
def test_a_busy_rank_gets_more_time_only_while_nobody_is_stopped(monkeypatch, stopped,
                                                                 within):
    watch = _StoppedPeerWatch()
    if not stopped:
        watch.stopped_ranks = lambda: []
    watch.check = lambda doing="": None
    started = time.monotonic()
    with pytest.raises(ExchangeTimeout, match="stopped responding" if stopped
                       else "not every rank arrived within 0.6 s"):
        deadline_waits.wait_request(_NeverDone(), watch=watch, timeout=0.1,
                                    what="reading the links' ceiling", extra_while_running=0.5)
    took = time.monotonic() - started
    assert within[0] <= took < within[1], took
