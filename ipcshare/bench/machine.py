"""Facts about the machine a bench ran on, for the report: hosts, CPUs, MPI, software
versions, date and the git commit of the code that ran."""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import sys
from typing import Any

from .. import __version__
from ..runtime.source_commit import git_describe
from ..topology.world import World, mpi_library_version

__all__ = ["machine_facts"]


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
        commit=git_describe(), command=command)
    return facts
