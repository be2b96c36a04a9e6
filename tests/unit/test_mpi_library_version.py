"""The MPI library's version as reports show it: one line, no NUL (Open MPI ends its
string with one, which reached the bench report's Markdown table)."""

from __future__ import annotations

import pytest

from ipcshare.topology import world as topology


class _FakeMPI:
    def __init__(self, text: str) -> None:
        self.text = text

    def Get_library_version(self) -> str:   # mpi4py's name
        return self.text


@pytest.mark.parametrize("text,expected", [
    ("Open MPI v4.1.6, package: Debian OpenMPI, ident: 4.1.6, repo rev: v4.1.6, "
     "Sep 30, 2023\x00",
     "Open MPI v4.1.6, package: Debian OpenMPI, ident: 4.1.6, repo rev: v4.1.6, Sep 30, 2023"),
    ("MPICH Version:      5.0.2\nMPICH Release date: ...\n", "MPICH Version: 5.0.2"),
    ("", ""),
])
def test_first_line_without_nul(monkeypatch, text, expected):
    monkeypatch.setattr(topology, "mpi", lambda: _FakeMPI(text))
    assert topology.mpi_library_version() == expected


def test_the_real_library_gives_one_clean_line():
    version = topology.mpi_library_version()
    assert version and "\x00" not in version and "\n" not in version
