"""What carries the hierarchical collectives' step between nodes (``--inter``): one
interface, one module per engine (``inter_mpi``: MPI, as before; ``inter_nccl``: NCCL
through nccl4py). Every engine works on this rank's rail: the ranks of the same local
rank on every node (``World.rail_comm``; rail 0 is the node leaders')."""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any

from ..config import INTER_ENGINES
from ..errors import ConfigError
from ..liveness.consensus import collective_step
from ..topology import describe_disagreement

__all__ = ["InterNodeEngine", "INTER_ENGINES", "INTER_LABELS", "nccl4py_missing", "resolve_inter",
           "check_nccl_possible", "open_inter_engine"]

# The engines in words, for tables and reports.
INTER_LABELS = {"nccl": "NCCL through nccl4py on rails of local rank i",
                "mpi": "MPI on rails of local rank i"}


class InterNodeEngine(abc.ABC):
    """Collectives over this rank's rail on window memory (``Buffer`` slices: host or
    device). Each method binds once, for the window engine ``engine`` (whose stream it
    queues on, or whose copies stage device memory), and returns a callable that runs one
    operation.

    ``stream_ordered`` engines queue their work on the window's stream behind what is
    already there (no host wait); the others are host-blocking and read memory as it is,
    so the caller synchronises the stream before calling them.
    """

    name: str = ""
    stream_ordered: bool = False

    @abc.abstractmethod
    def allgatherv_in_place(self, engine: Any, output: Any, counts: list[int],
                            displacements: list[int]) -> Callable[[], None]:
        """Every rail rank's segment of ``output`` (bytes ``counts[i]`` at
        ``displacements[i]`` for rail rank ``i``) to every other rail rank's ``output``."""

    @abc.abstractmethod
    def all_reduce(self, engine: Any, buffer: Any, dtype: str, op: str) -> Callable[[], None]:
        """``buffer`` (``dtype`` elements) reduced with ``op`` over the rail, in place;
        the same bits on every rail rank."""

    @abc.abstractmethod
    def reduce_scatter(self, engine: Any, output: Any, input: Any, dtype: str,
                       op: str) -> Callable[[], None]:
        """Block ``i`` (of ``output.nbytes``) of the rail's reduction of ``input`` into
        rail rank ``i``'s ``output``; ``input.nbytes`` is the rail size times that."""

    def close(self) -> None:  # noqa: B027 - engines that hold nothing have nothing to do
        """Release what the engine holds (idempotent; collective over the rail)."""


def nccl4py_missing() -> str | None:
    """Why nccl4py cannot be imported here, or None when it can (imported now: nothing
    heavy happens at ipcshare's import time)."""
    try:
        import nccl.core  # noqa: F401
    except ImportError as exc:
        return str(exc) or type(exc).__name__
    return None


def check_nccl_possible(backend_name: str, missing: str | None) -> None:
    """Refuse ``--inter nccl`` where it cannot run, naming what is missing.

    Raises:
        ConfigError: the backend holds host memory, or nccl4py is not importable
            (``missing`` says why).
    """
    if backend_name == "host":
        raise ConfigError("--inter nccl moves device memory between nodes through NCCL: it "
                          "needs a GPU backend (cuda-ipc or cuda-vmm), but this run uses the "
                          "host backend (no GPU, or --backend host); use --inter mpi or auto")
    if missing is not None:
        raise ConfigError(f"--inter nccl needs nccl4py (NVIDIA's NCCL binding, module nccl), "
                          f"which is not importable here ({missing}); install nccl4py, or "
                          "use --inter mpi or auto")


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
        raise ConfigError(f"--inter {requested} resolves to different engines: "
                          f"{describe_disagreement(names, verb=('gets', 'get'))} (nccl4py is "
                          "not importable everywhere); install nccl4py on every node, or use "
                          "--inter mpi")
    if name == "nccl":
        from .inter_nccl import NcclInterEngine

        return NcclInterEngine(group)
    from .inter_mpi import MpiInterEngine

    return MpiInterEngine(group)
