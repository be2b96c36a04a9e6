"""One short name for the MPI library wherever a line names it (info, doctor, the mpi
baseline), from the first line of each library's own version string."""

from __future__ import annotations

import pytest

from ipcshare.topology.world import short_library_name


@pytest.mark.parametrize("line,name", [
    ("MPICH Version:      5.0.2", "MPICH 5.0.2"),
    ("Open MPI v4.1.6, package: Debian OpenMPI, ident: 4.1.6, repo rev: v4.1.6, Sep 30, 2023",
     "Open MPI 4.1.6"),
    ("MVAPICH2 Version      :\t2.3.7", "MVAPICH2 2.3.7"),
    ("MPI VERSION    : CRAY MPICH version 8.1.25.17 (ANL base 3.4a2)",
     "MPI CRAY MPICH 8.1.25.17"),
    ("Intel(R) MPI Library 2021.10 for Linux* OS", "Intel(R) MPI Library 2021.10"),
    ("", "MPI"),
])
def test_the_name_stops_at_the_version_without_the_word_version(line, name):
    assert short_library_name(line) == name
