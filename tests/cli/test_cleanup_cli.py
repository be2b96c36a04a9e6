"""Runs that set up descriptor sockets leave the user's files alone (issue: a run once
removed every old ``ipcshare-*`` directory of the user under the socket base)."""

from __future__ import annotations

import os
import time

from .test_cli import needs_mpiexec, run, socket_dir  # noqa: F401


@needs_mpiexec
def test_the_issues_reproduction_keeps_the_users_directory(socket_dir):  # noqa: F811
    results = socket_dir / "ipcshare-my-results"
    results.mkdir()
    (results / "x").write_text("data\n")
    venv = socket_dir / "ipcshare-venv"  # a virtual environment named like ours
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("#!/bin/sh\n")
    then = time.time() - 2 * 86400
    for path in (results, venv, venv / "bin"):
        os.utime(path, (then, then))

    out = run(["ring", "--exchange", "socket", "-b", "1K", "-e", "4K"], n=2)

    assert out.returncode == 0, out.stderr
    assert (results / "x").read_text() == "data\n"
    assert (venv / "bin" / "python").read_text() == "#!/bin/sh\n"
    # ... and the run's own socket directory is gone.
    assert sorted(path.name for path in socket_dir.iterdir()) == ["ipcshare-my-results",
                                                                  "ipcshare-venv"]
