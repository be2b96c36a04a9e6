"""Descriptor exchange between real ranks: fallback from pidfd, strangers at the socket."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

import ipcshare
import ipcshare.exchange as exchange_module
from ipcshare.runtime.errors import ExchangeError

pytestmark = pytest.mark.mpi


def test_auto_falls_back_to_sockets_when_one_rank_is_refused(comm, monkeypatch):
    if comm.size == 1:
        pytest.skip("needs peers to exchange descriptors with")
    refused_rank = comm.size - 1
    if comm.rank == refused_rank:
        def refuse(pid, fd):
            raise ExchangeError(f"pidfd_getfd(pid {pid}, fd {fd}) -> EPERM: Operation not "
                                "permitted (ptrace policy or seccomp refuses it)")
        monkeypatch.setattr(exchange_module, "fetch_fd", refuse)
    with ipcshare.Group(backend="host", exchange="auto") as g:
        w = g.window(4096)
        assert g.exchange_name == "socket"
        assert f"rank {refused_rank}@" in g.exchange.fallback_reason
        assert "EPERM" in g.exchange.fallback_reason
        np.asarray(w.peer((g.rank + 1) % g.size))[0] = g.rank + 1
        w.barrier()
        assert np.asarray(w.local)[0] == (g.rank - 1) % g.size + 1
        w.close()


def test_forced_pidfd_that_is_refused_fails_on_every_rank(comm, monkeypatch):
    if comm.size == 1:
        pytest.skip("needs peers to exchange descriptors with")
    if comm.rank == 0:
        monkeypatch.setattr(exchange_module, "fetch_fd",
                            lambda pid, fd: (_ for _ in ()).throw(ExchangeError("EPERM here")))
    # The group's warm-up passes the first descriptors: the refusal surfaces there.
    with pytest.raises(ExchangeError, match=r"descriptor exchange \(pidfd\) failed on rank 0@"):
        ipcshare.Group(backend="host", exchange="pidfd")


STRANGER = textwrap.dedent("""
    import os, socket, sys
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(sys.argv[1])
    fd = os.memfd_create("bait")
    socket.send_fds(s, [b"IPCS" + b"0" * 28], [fd])
    s.close()
""")


def test_a_process_outside_the_job_is_refused_at_the_socket(comm):
    if comm.size == 1:
        pytest.skip("needs a peer whose socket a stranger can knock on")
    with ipcshare.Group(backend="host", exchange="socket") as g:
        g.window(4096).close()  # sets up every rank's socket
        endpoint = g.exchange._endpoint
        if endpoint.namespace == "abstract":  # the same on every rank of the node
            pytest.skip("no short socket directory here: sockets are abstract")
        if g.rank == 0:  # a stranger knocks on rank 1's socket before the next exchange
            address = endpoint.address_of(g.world.local_index(1))
            subprocess.run([sys.executable, "-c", STRANGER, address], check=True, timeout=30)
        comm.Barrier()
        w = g.window(4096)  # the exchange must still succeed, and only with job peers
        np.asarray(w.peer((g.rank + 1) % g.size))[0] = 9
        w.barrier()
        assert np.asarray(w.local)[0] == 9
        refused = g.exchange.refused_connections
        assert (len(refused) == 1) == (g.rank == 1)
        w.close()
