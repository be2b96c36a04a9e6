"""What carries the hierarchical collectives' step between nodes (``--inter``): one
interface, one module per engine (``inter_mpi``: MPI, as before; ``inter_nccl``: NCCL
through nccl4py). Every engine works on this rank's rail: the ranks of the same local
rank on every node (``World.rail_comm``; rail 0 is the node leaders')."""

from __future__ import annotations

import socket
from typing import Any

from ...liveness.consensus import collective_step
from ...runtime.config import INTER_ENGINES
from ...runtime.errors import ConfigError
from ...topology.world import describe_disagreement
from .engine import InterNodeEngine, check_nccl_possible, nccl4py_missing

__all__ = ["InterNodeEngine", "INTER_ENGINES", "INTER_LABELS", "nccl4py_missing", "resolve_inter",
           "check_nccl_possible", "open_inter_engine", "rail_gpu_clash"]

# The engines in words, for tables and reports.
INTER_LABELS = {"nccl": "NCCL through nccl4py on rails of local rank i",
                "mpi": "MPI on rails of local rank i"}


def resolve_inter(requested: str, backend_name: str) -> str:
    """The engine ``requested`` (one of ``INTER_ENGINES``) runs as: ``auto`` is ``nccl``
    where nccl4py imports and the backend holds device memory, ``mpi`` otherwise.

    Raises:
        ConfigError: an unknown name, or ``nccl`` where it cannot run.
    """
    if requested not in INTER_ENGINES:
        raise ConfigError(f"unknown inter-node engine {requested!r}; choose one of: "
                          f"{', '.join(INTER_ENGINES)}")
    if requested == "mpi":
        return "mpi"
    missing = nccl4py_missing() if backend_name != "host" else "host backend"
    if requested == "auto":
        return "mpi" if missing is not None else "nccl"
    check_nccl_possible(backend_name, missing)
    return "nccl"


def rail_gpu_clash(places: list[tuple[int, str, Any]]) -> str | None:
    """Where two ranks of one rail use the same GPU, in words, or None. ``places[r]`` is
    world rank r's (local rank, physical host, GPU UUID or None). NCCL refuses a
    communicator two of whose ranks share a GPU (ncclInvalidUsage), which is what rails
    of virtual nodes on one machine with fewer GPUs than ranks would ask of it."""
    first: dict[tuple[int, str, Any], int] = {}
    for rank, (rail, host, uuid) in enumerate(places):
        if uuid is None:
            continue
        other = first.setdefault((rail, host, uuid), rank)
        if other != rank:
            text = uuid.hex() if isinstance(uuid, bytes) else str(uuid)
            return (f"ranks {other} and {rank} of rail {rail} both use GPU "
                    f"{text.removeprefix('GPU-')[:8]} on {host}")
    return None


def open_inter_engine(requested: str, group: Any) -> InterNodeEngine:
    """Collective over ``group`` (a job spanning nodes): the engine ``requested`` names,
    on this rank's rail.

    Raises:
        ConfigError: it cannot run here (on every rank, naming the first rank that
            found out and why).
        IpcShareError: creating its communicators failed on some rank (on every rank).
    """
    world = group.world
    with collective_step(world, "choosing the engine between nodes", watch=group.watch):
        name = resolve_inter(requested, group.backend_name)
    # Ranks of one job resolve alike unless nccl4py is importable on some only: then
    # auto would mix engines and the rails would never meet.
    names = group.collective("engine between nodes", name)
    if len(set(names)) > 1:  # every rank sees the same names and raises alike
        raise ConfigError(f"inter={requested!r} resolves to different engines: "
                          f"{describe_disagreement(names, verb=('gets', 'get'))} (nccl4py is "
                          "not importable everywhere); install nccl4py on every node, or use "
                          "inter='mpi'")
    if name == "nccl":
        # Every rank gathers the same places, so every rank decides (and raises) alike.
        clash = rail_gpu_clash(group.collective("GPUs of the rails", (
            world.local_rank, socket.gethostname(), group.backend.uuid)))
        if clash is not None and requested == "nccl":
            raise ConfigError(f"inter='nccl' cannot run here: {clash}, and NCCL needs one "
                              "GPU per rank of a communicator; use inter='mpi' or "
                              "inter='auto', or give each rank its own GPU")
        if clash is not None:
            name = "mpi"
    if name == "nccl":
        from .nccl_engine import NcclInterEngine

        return NcclInterEngine(group)
    from .mpi_engine import MpiInterEngine

    return MpiInterEngine(group)
