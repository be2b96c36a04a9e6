"""Waiting on a request: a dead peer or the deadline ends the wait, with a clear error."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from ipcshare.liveness.deadline_waits import wait_request
from ipcshare.liveness.pidfd_watch import process_start_time
from ipcshare.runtime.errors import ExchangeTimeout, PeerDied


@pytest.fixture(autouse=True)
def _no_exit_without_finalize(monkeypatch):
    """A wait that gives up on a dead or stopped peer has its process leave without
    MPI_Finalize (exit_policy): not this test process, which goes on to other tests
    (the CLI's main() called in it later would leave at once, ending the worker)."""
    from ipcshare.liveness import deadline_waits

    monkeypatch.setattr(deadline_waits, "leave_without_finalize_at_exit",
                        lambda reason, stopped_pids=(): None)
    # Nor does a fake request given up on stay held (runtime/abandoned_requests.py):
    # the CLI's main() would then leave without MPI_Finalize too.
    monkeypatch.setattr(deadline_waits, "keep", lambda *requests, buffers=(): None)


class NeverDone:
    def Test(self) -> bool:  # the MPI spelling
        return False


class FakeWatch:
    def __init__(self, dead: bool) -> None:
        self.dead = dead
        self.failed = None

    @property
    def dead_ranks(self):
        return [1] if self.dead else []

    def stopped_ranks(self):
        return []

    def check(self, doing=""):
        if self.dead:
            raise PeerDied(f"rank 1@host (pid 42) died while rank 0@host was in {doing}")

    def describe(self, doing=""):
        return f"rank 1@host (pid 42) died while rank 0@host was in {doing}"

    def fail(self, reason):
        self.failed = self.failed or reason


def test_a_request_that_never_completes_times_out_and_marks_the_group_failed():
    watch = FakeWatch(dead=False)
    started = time.monotonic()
    with pytest.raises(ExchangeTimeout, match="window rendezvous: not every rank arrived "
                                              "within 0.2 s"):
        wait_request(NeverDone(), watch=watch, timeout=0.2, what="window rendezvous")
    assert 0.2 <= time.monotonic() - started < 2
    assert watch.failed


def test_a_dead_peer_ends_the_wait_at_once_naming_it():
    watch = FakeWatch(dead=True)
    started = time.monotonic()
    with pytest.raises(PeerDied, match=r"rank 1@host \(pid 42\) died while rank 0@host was "
                                       "in handle exchange"):
        wait_request(NeverDone(), watch=watch, timeout=30, what="handle exchange")
    assert time.monotonic() - started < 1
    assert watch.failed


def test_start_times_tell_processes_apart():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert process_start_time() == process_start_time(os.getpid()) is not None
        assert process_start_time(child.pid) is not None
        assert process_start_time(child.pid) >= process_start_time()
    finally:
        child.kill()
        child.wait()
    assert process_start_time(child.pid) is None  # reaped: gone


class TwoHosts:
    """The little of a World that describe() reads."""

    rank = 0
    hostnames = ["h0", "h1", "h2"]
    pids = [100, 101, 102]

    def where(self, rank=None):
        rank = self.rank if rank is None else rank
        return f"rank {rank}@{self.hostnames[rank]}"


@pytest.mark.parametrize("doing,said", [
    # a wait's own description names this rank already: once in the message
    ("rank 0@h0 in ring waiting for rank 2@h2",
     "rank 1@h1 (pid 101) died while rank 0@h0 was in ring waiting for rank 2@h2"),
    ("rank 0@h0 in a graph barrier for rank 2 waiting for rank 1@h1",
     "rank 1@h1 (pid 101) died while rank 0@h0 was in a graph barrier for rank 2 waiting "
     "for rank 1@h1"),
    ("the handle exchange", "rank 1@h1 (pid 101) died while rank 0@h0 was in the handle "
                            "exchange"),
    ("", "rank 1@h1 (pid 101) died"),
])
def test_the_death_message_names_each_rank_once(doing, said):
    from ipcshare.liveness.pidfd_watch import PeerWatch

    watch = PeerWatch(TwoHosts(), {})
    try:
        watch._dead = [1]
        assert watch.describe(doing) == said
    finally:
        watch.close()


def test_a_rank_arriving_at_a_step_after_a_death_is_told_of_the_death():
    """On a loaded machine a rank may reach the next step only after the watch saw a
    peer die: it must get the same PeerDied as the ranks already inside, not a bare
    'can no longer meet' that callers catching PeerDied would miss (CI, 2026-11-26)."""
    from ipcshare.liveness.consensus import Rendezvous
    from ipcshare.runtime.errors import WindowError

    dead = FakeWatch(dead=True)
    dead.fail("rank 1@host died")
    with pytest.raises(PeerDied, match="died while rank 0@host was in handle exchange"):
        Rendezvous(world=None, watch=dead, timeout=1).check_usable("handle exchange")

    abandoned = FakeWatch(dead=False)  # a timed-out collective, nobody dead
    abandoned.fail("window rendezvous: not every rank arrived within 0.2 s")
    with pytest.raises(WindowError, match="can no longer meet: window rendezvous"):
        Rendezvous(world=None, watch=abandoned, timeout=1).check_usable("barrier")


def test_an_interrupt_right_after_a_peers_death_is_the_launchers_notice():
    # mpiexec.gforker sends SIGINT to every survivor when a rank dies: that used to end
    # them by KeyboardInterrupt before they could say who died. After a death
    # the interrupt is let pass (the rank's wait names the dead peer); without one it is
    # Ctrl-C as ever; the handler goes with the watch.
    import signal

    from ipcshare.liveness.pidfd_watch import PeerWatch

    # Python's own handler first, whatever an earlier test left: the watch replaces only
    # that one. The peer is a process that cannot exit by itself before it is killed.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    peer = subprocess.Popen(["sleep", "600"])
    watch = PeerWatch(_OneHost(peer.pid), {os.pidfd_open(peer.pid): 1})
    try:
        installed = signal.getsignal(signal.SIGINT)
        assert installed is not signal.default_int_handler
        assert getattr(installed, "__name__", "") == "interrupted"
        assert peer.poll() is None
        with pytest.raises(KeyboardInterrupt):  # no death: Ctrl-C
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
        peer.kill()
        peer.wait(timeout=30)
        os.kill(os.getpid(), signal.SIGINT)   # the launcher's notice, even before the
        time.sleep(0.2)                       # watch thread has looked
        with pytest.raises(PeerDied, match=rf"rank 1@host \(pid {peer.pid}\) died"):
            for _ in range(100):
                watch.check("a test")
                time.sleep(0.05)
    finally:
        watch.close()
        peer.kill()
        peer.wait()
        restored = signal.getsignal(signal.SIGINT)
        signal.signal(signal.SIGINT, previous)
    assert restored is signal.default_int_handler


class _OneHost:
    """What PeerWatch reads of a world: ranks 0 (this process) and 1 on host ``host``."""

    def __init__(self, peer_pid: int) -> None:
        self.rank = 0
        self.pids = [os.getpid(), peer_pid]

    def where(self, rank=None) -> str:
        return f"rank {self.rank if rank is None else rank}@host"


def test_a_stopped_peer_is_named_as_stopped_and_the_others_as_having_left():
    """A rank that left after timing out on a stopped one did not die (before: the guard
    and the watches said "died" of every rank that left)."""
    import signal

    from ipcshare.liveness.guard import _what_happened
    from ipcshare.liveness.pidfd_watch import PeerWatch

    stopped = subprocess.Popen(["sleep", "600"])
    gone = subprocess.Popen(["true"])
    gone.wait(timeout=30)
    try:
        os.kill(stopped.pid, signal.SIGSTOP)
        for _ in range(100):  # the stop takes effect asynchronously
            with open(f"/proc/{stopped.pid}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] == "T":
                    break
            time.sleep(0.01)
        world = _OneHost(stopped.pid)
        watch = PeerWatch(world, {os.pidfd_open(stopped.pid): 1})
        try:
            assert watch.stopped_ranks() == [1]
            said = watch.describe("a barrier")
            assert said == (f"rank 1@host (pid {stopped.pid}) stopped responding (its process "
                            "is stopped: SIGSTOP, or a debugger) while rank 0@host was in "
                            "a barrier")
        finally:
            watch.close()
        # The guard of a survivor stuck in an MPI call, and the guard of the stopped rank.
        spec = {"me": "rank 2@host", "pid": os.getpid(),
                "peers": {"5": f"rank 1@host (pid {stopped.pid})", "6": "rank 0@host (pid 9)"},
                "peer_pids": {"5": stopped.pid, "6": gone.pid}}
        assert _what_happened(spec, ["rank 0@host (pid 9)"], 0.5) == (
            "rank 1@host (pid " + str(stopped.pid) + ") stopped responding (its process is "
            "stopped: SIGSTOP, or a debugger); rank 0@host (pid 9) left the job; rank 2@host "
            "was stuck for 0.5 s in a call that cannot notice it (an MPI collective) and is "
            "ended")
        mine = dict(spec, me="rank 1@host", pid=stopped.pid)
        assert _what_happened(mine, ["rank 0@host (pid 9)"], 0.5).startswith(
            "rank 1@host stopped responding (its process is stopped")
    finally:
        stopped.kill()
        stopped.wait()
