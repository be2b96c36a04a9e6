"""Shared fixtures. MPI is imported only by the tests that run under mpiexec."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest


@pytest.fixture
def comm():
    """MPI.COMM_WORLD (the test runs under mpiexec -n 1, 2, 3 or 4)."""
    from mpi4py import MPI

    return MPI.COMM_WORLD


@pytest.fixture
def socket_base():
    """An empty directory whose path is short enough for unix sockets inside it.

    pytest's ``tmp_path`` is too long: ``make_socket_dir`` would move on to /tmp, where
    the test could neither see nor check what a job left.
    """
    base = tempfile.mkdtemp(prefix="ipt-", dir="/tmp")
    yield Path(base)
    shutil.rmtree(base)  # made above by this fixture
