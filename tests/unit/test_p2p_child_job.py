"""A child ``ipcshare`` command whose ``--json`` is read back (the IPC half of ``ipcshare
p2p``, the bench's P2P direct half): its document, its stdout, and one line for each way
it can fail, never an exception."""

from __future__ import annotations

import os
import sys

from ipcshare.p2p.child_job import ipcshare_command, run_child

# A child that writes what it is told to the --json FILE run_child appends (argv[-1]).
WRITER = ("import json, os, sys; import ipcshare; print('table line'); "
          "json.dump({'where': ipcshare.__file__, 'seen': os.environ.get('P2P_TEST')}, "
          "open(sys.argv[-1], 'w'))")


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_the_document_and_stdout_come_back_and_the_child_imports_this_ipcshare():
    import ipcshare

    run = run_child(python(WRITER), timeout_s=60, env={**os.environ, "P2P_TEST": "yes"})
    assert run.error is None and run.stdout == "table line\n"
    assert run.document == {"where": ipcshare.__file__, "seen": "yes"}
    assert run.command[-2] == "--json"


def test_a_failing_child_is_one_line_with_its_status_and_last_words():
    run = run_child(python(WRITER + "; sys.stderr.write('first\\nlast words\\n'); "
                                    "sys.exit(3)"), timeout_s=60)
    # what it wrote still counts: a mismatch exits non-zero with a whole document
    assert run.error == "exit status 3: last words" and run.document["seen"] is None
    silent = run_child(python("pass"), timeout_s=60)
    assert (silent.error, silent.document) == ("exit status 0: no message", None)
    garbled = run_child(python("import sys; open(sys.argv[-1], 'w').write('{not json')"),
                        timeout_s=60)
    assert garbled.document is None and garbled.error.startswith("exit status 0")


def test_a_child_that_cannot_start_or_finish_is_one_line():
    slow = run_child(python("import time; time.sleep(30)"), timeout_s=0.5)
    assert (slow.error, slow.document) == ("no result within 0.5 s", None)
    missing = run_child(["/nonexistent/mpiexec", "-n", "2"], timeout_s=5)
    assert missing.error.startswith("/nonexistent/mpiexec: ") and missing.document is None


def test_ipcshare_command_runs_this_python():
    assert ipcshare_command("p2p", "--no-ipc") == [sys.executable, "-m", "ipcshare", "p2p",
                                                   "--no-ipc"]
