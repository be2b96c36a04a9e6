"""Shared fixtures. MPI is imported only by the tests that run under mpiexec."""

from __future__ import annotations

import pytest


@pytest.fixture
def comm():
    """MPI.COMM_WORLD (the test runs under mpiexec -n 1, 2, 3 or 4)."""
    from mpi4py import MPI

    return MPI.COMM_WORLD
