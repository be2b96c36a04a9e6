"""An ``ipcshare`` command run as a child process whose ``--json`` document is read back:
the IPC half of ``ipcshare p2p`` (``mpiexec -n <GPUs> python -m ipcshare <op>``) and the
bench's P2P direct half (``python -m ipcshare p2p --no-ipc`` over the ranks' GPUs)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["ChildRun", "ipcshare_command", "run_child"]


@dataclasses.dataclass
class ChildRun:
    """What a child left: its command, its stdout, the ``--json`` document it wrote (None
    when it wrote none) and, when it failed or wrote nothing, why, in one line."""

    command: list[str]
    stdout: str
    document: Any | None
    error: str | None = None


def ipcshare_command(*args: str) -> list[str]:
    """``python -m ipcshare ARGS``, with the Python running this one."""
    return [sys.executable, "-m", "ipcshare", *args]


def _package_root() -> str:
    return str(Path(__file__).resolve().parents[2])


def run_child(command: list[str], *, timeout_s: float,
              env: Mapping[str, str] | None = None) -> ChildRun:
    """Run ``command --json FILE`` (environment ``env``, default this one's) and read FILE
    back; never raises for the child's failure (it becomes ``error``: the failure to
    start, the timeout, or the exit status with the last line of stderr)."""
    with tempfile.TemporaryDirectory(prefix="ipcshare-child-") as folder:
        out = os.path.join(folder, "child.json")
        command = [*command, "--json", out]
        # The child imports this very ipcshare, wherever it was imported from.
        environment = dict(os.environ if env is None else env)
        environment["PYTHONPATH"] = os.pathsep.join(
            filter(None, [_package_root(), environment.get("PYTHONPATH")]))
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s,
                                  env=environment, check=False)
        except subprocess.TimeoutExpired:
            return ChildRun(command, "", None, f"no result within {timeout_s:g} s")
        except (OSError, subprocess.SubprocessError) as exc:
            return ChildRun(command, "", None, f"{command[0]}: {exc}")
        document = None
        if os.path.exists(out):
            with open(out) as source, contextlib.suppress(ValueError):
                document = json.load(source)  # unreadable: as if none was written
    error = None
    if done.returncode != 0 or document is None:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        error = f"exit status {done.returncode}: {lines[-1] if lines else 'no message'}"
    return ChildRun(command, done.stdout, document, error)
