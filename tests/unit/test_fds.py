"""Owned descriptors and pidfd_getfd between real processes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ipcshare.exchange.pidfd import fetch_fd
from ipcshare.runtime.errors import ExchangeError
from ipcshare.runtime.owned_fd import OwnedFd


def test_owned_fd_closes_once_and_refuses_use_after_close():
    r, w = os.pipe()
    os.close(w)
    fd = OwnedFd(r)
    assert fd.fileno() == r
    fd.close()
    fd.close()
    assert fd.closed
    with pytest.raises(ValueError, match="closed"):
        fd.fileno()
    with pytest.raises(OSError):
        os.fstat(r)


def test_dropped_descriptor_is_closed_with_a_warning():
    r, w = os.pipe()
    os.close(w)
    fd = OwnedFd(r)
    with pytest.warns(ResourceWarning, match="never closed"):
        del fd
        import gc

        gc.collect()
    with pytest.raises(OSError):
        os.fstat(r)


def test_pidfd_getfd_takes_a_descriptor_from_another_process(tmp_path):
    marker = tmp_path / "shared.txt"
    marker.write_text("hello from the child")
    child = subprocess.Popen(
        [sys.executable, "-c",
         "import os,sys; fd=os.open(sys.argv[1], os.O_RDONLY); print(fd, flush=True); "
         "sys.stdin.read()", str(marker)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        target = int(child.stdout.readline())
        try:
            owned = fetch_fd(child.pid, target)
        except ExchangeError as exc:  # a kernel or policy that refuses: say why, and skip
            pytest.skip(f"pidfd_getfd refused here: {exc}")
        with owned:
            assert os.pread(owned.fileno(), 100, 0) == b"hello from the child"
    finally:
        child.stdin.close()
        child.stdout.close()
        child.wait(timeout=10)


def test_pidfd_error_names_the_call():
    with pytest.raises(ExchangeError, match=r"pidfd_(open|getfd)"):
        fetch_fd(os.getpid(), 987654)  # no such descriptor in this process
