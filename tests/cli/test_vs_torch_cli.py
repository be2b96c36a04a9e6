"""``ipcshare vs-torch`` on a machine without a GPU, as users run it: one line on every
rank that says what it needs, exit status 1, no traceback, nothing on stdout, no rank
left waiting; with or without mpiexec."""

from __future__ import annotations

import pytest

from ipcshare.cli.exit_codes import EXIT_ERROR

from .test_cli import needs_mpiexec, run, socket_dir, without_gpu  # noqa: F401

_NEEDS = "vs-torch needs torch and a GPU per rank"


@without_gpu
@pytest.mark.parametrize("n", [None, pytest.param(2, marks=needs_mpiexec),
                               pytest.param(3, marks=needs_mpiexec)])
def test_on_host_memory_it_refuses_in_one_line_on_every_rank(n, socket_dir,  # noqa: F811
                                                              tmp_path):
    out = run(["vs-torch", "-b", "8K", "-e", "64K", "--json", str(tmp_path / "t.json")],
              n=n, timeout=90)
    assert out.returncode == EXIT_ERROR, out.stderr
    lines = out.stderr.splitlines()
    assert len(lines) == (n or 1) and len(set(lines)) == 1, out.stderr
    assert lines[0].startswith("ipcshare: error: ") and _NEEDS in lines[0]
    assert "Traceback" not in out.stderr and out.stdout == ""
    assert not (tmp_path / "t.json").exists()


@needs_mpiexec
def test_a_bad_value_is_refused_on_every_rank_before_torch_is_looked_for(socket_dir):  # noqa: F811
    out = run(["vs-torch", "--calls", "0"], n=2, timeout=90)
    assert out.returncode == EXIT_ERROR, out.stderr
    lines = out.stderr.splitlines()
    assert len(lines) == 2 and all("--calls 0: at least 1" in line for line in lines)
