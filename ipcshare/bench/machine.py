"""Facts about the machine a bench ran on, for the report: hosts, CPUs, MPI, software
versions, date and the git commit of the code that ran."""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from .. import __version__
from ..topology.world import World, mpi_library_version

__all__ = ["machine_facts", "git_commit"]


def git_commit() -> str | None:
    """``git describe --always --dirty`` of the checkout ipcshare runs from, or None when
    it is not a git checkout (an installed wheel) or git is missing."""
    checkout = Path(__file__).resolve().parents[2]
    if not (checkout / ".git").exists():
        return None
    try:
        out = subprocess.run(["git", "-C", str(checkout), "describe", "--always", "--dirty",
                              "--abbrev=10"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0 or not out.stdout.strip():
        return None
    return out.stdout.strip()


def machine_facts(world: World) -> dict[str, Any]:
    """Collective: facts for the report, complete on rank 0 (other ranks get theirs)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    per_rank = world.comm.gather((world.hostname, os.cpu_count(), cores), root=0)
    facts: dict[str, Any] = {"ipcshare": __version__, "world_size": world.size,
                             "nodes": world.node_count}
    if world.rank != 0:
        return facts
    hosts: dict[str, dict[str, Any]] = {}
    for hostname, cpus, usable in per_rank:
        entry = hosts.setdefault(hostname, {"cpus": cpus, "usable_cpus": usable, "ranks": 0})
        entry["ranks"] += 1
    import numpy

    library = mpi_library_version()
    command = " ".join(shlex.quote(arg) for arg in ["ipcshare", *sys.argv[1:]])
    if world.size > 1:
        command = f"mpiexec -n {world.size} {command}"
    facts.update(
        hosts=hosts, mpi=library, python=platform.python_version(), numpy=numpy.__version__,
        machine=platform.machine(), kernel=platform.release(),
        date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        commit=git_commit(), command=command)
    return facts
