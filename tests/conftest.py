"""Shared fixtures. MPI is imported only by the tests that run under mpiexec."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

try:
    from hypothesis import settings
except ImportError:  # GPU nodes' images may lack it: only unit tests use it
    pass
else:
    from .hypothesis_profiles import QUICK

    # The quick profile unless pytest is given another (--hypothesis-profile thorough),
    # which Hypothesis's own plugin loads after this.
    settings.load_profile(QUICK)


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (`make test` runs the unit tests on 2 workers), every test that
    compiles kernels goes to one worker: what it compiles once per run is then compiled
    once, not once per worker."""
    for item in items:
        if item.get_closest_marker("nvrtc") is not None:
            item.add_marker(pytest.mark.xdist_group("nvrtc"))


def pytest_runtest_setup(item):
    """``@pytest.mark.world_sizes(2, 3)``: the MPI test runs at those world sizes and skips
    at the others (`make test` runs every size from 1 to 4; a slow test runs where it
    means most). Every rank skips alike: they share the world's size."""
    marker = item.get_closest_marker("world_sizes")
    if marker is None:
        return
    from mpi4py import MPI

    size = MPI.COMM_WORLD.size
    if size not in marker.args:
        sizes = ", ".join(str(n) for n in marker.args)
        pytest.skip(f"runs at world sizes {sizes}, not {size}")


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
