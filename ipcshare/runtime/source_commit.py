"""Which commit of ipcshare is running, and whether its tree was dirty: from git where
the package runs from a checkout, else as IPCSHARE_SOURCE_COMMIT gives it (a copy of the
tree without its git folder, as on a GPU node), else from what the installer recorded (a
VCS install's ``direct_url.json``), else said to be unknown."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

__all__ = ["source_commit", "git_describe"]

_CHECKOUT = Path(__file__).resolve().parents[2]


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(_CHECKOUT), *args], capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _from_package() -> str | None:
    """The commit pip recorded for a VCS install (PEP 610), if it was one."""
    from importlib import metadata

    try:
        text = metadata.distribution("ipcshare").read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        return None
    try:
        commit = json.loads(text or "{}").get("vcs_info", {}).get("commit_id")
    except (json.JSONDecodeError, AttributeError):
        return None
    return commit or None


def source_commit() -> dict[str, Any]:
    """``{"id", "dirty", "source"}`` as the result document holds it: the commit
    IPCSHARE_SOURCE_COMMIT gives (``"given"``: said on purpose, so it comes first: a copy
    of the tree may carry a git folder of another commit, as a GPU node's copy did), the
    checkout's HEAD and whether tracked files differ from it (``"git"``), the installed
    package's recorded commit (``"package"``, dirtiness unknown), or ``"unknown"``.

    Raises:
        SettingError: IPCSHARE_SOURCE_COMMIT is malformed.
    """
    from .settings import given_source_commit

    given = given_source_commit()
    if given is not None:
        return {"id": given[0], "dirty": given[1], "source": "given"}
    if (_CHECKOUT / ".git").exists():
        head = _git("rev-parse", "HEAD")
        if head:
            status = _git("status", "--porcelain", "--untracked-files=no")
            return {"id": head, "dirty": None if status is None else bool(status),
                    "source": "git"}
    recorded = _from_package()
    if recorded:
        return {"id": recorded, "dirty": None, "source": "package"}
    return {"id": "unknown", "dirty": None, "source": "unknown"}


def git_describe() -> str | None:
    """``git describe --always --dirty`` of the checkout ipcshare runs from (a short
    name for reports), or None outside a checkout or without git."""
    if not (_CHECKOUT / ".git").exists():
        return None
    return _git("describe", "--always", "--dirty", "--abbrev=10") or None
