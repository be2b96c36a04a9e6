"""The interface every inter-node engine fills in (``InterNodeEngine``), and whether NCCL
can be one here (``nccl4py_missing``, ``check_nccl_possible``)."""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any

from ...runtime.errors import ConfigError

__all__ = ["InterNodeEngine", "nccl4py_missing", "check_nccl_possible"]


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

    @abc.abstractmethod
    def all_to_all(self, engine: Any, output: Any, input: Any) -> Callable[[], None]:
        """Block ``i`` of ``input`` (``input.nbytes`` is the rail size times a block) to
        rail rank ``i``; block ``i`` of ``output`` (as long) from rail rank ``i``. Bytes."""

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
        raise ConfigError("inter='nccl' moves device memory between nodes through NCCL: it "
                          "needs a GPU backend (cuda-ipc or cuda-vmm), but this run uses the "
                          "host backend (no GPU, or backend='host'); use inter='mpi' or "
                          "inter='auto'")
    if missing is not None:
        raise ConfigError(f"inter='nccl' needs nccl4py (NVIDIA's NCCL binding, module nccl), "
                          f"which is not importable here ({missing}); install nccl4py, or "
                          "use inter='mpi' or inter='auto'")
