"""Communication patterns over windows and the driver that sweeps, checks and times them."""

from __future__ import annotations

__all__ = ["make_pattern", "PATTERNS"]

PATTERNS = ("ring", "allgather")


def make_pattern(name: str, algo: str = "auto"):
    """A fresh pattern object for ``name`` (``ring`` or ``allgather``) and ``algo``:
    ``copy-engine`` (engine copies: memcpy on host, the copy engine on GPUs),
    ``hierarchical`` (all-gather: IPC inside nodes, MPI between nodes), one of the
    all-gather kernels ``push``, ``pull``, ``ring`` (GPU backends, one node), or
    ``auto``: for all-gather on one node's GPUs the measured choice by size and world
    size (patterns.choice), hierarchical across nodes, engine copies otherwise."""
    from ..config import ALGOS
    from ..errors import ConfigError

    if algo not in ALGOS:
        raise ConfigError(f"unknown algorithm {algo!r}; choose one of: {', '.join(ALGOS)}")
    if name == "ring":
        if algo not in ("auto", "copy-engine"):
            raise ConfigError(f"the ring op has no {algo!r} algorithm; use --algo auto")
        from .ring import Ring

        return Ring()
    if name == "allgather":
        if algo in ("push", "pull", "ring"):
            from .allgather_kernels import KernelAllGather

            return KernelAllGather(algo)
        if algo == "auto":
            from .allgather_auto import AutoAllGather

            return AutoAllGather()
        if algo == "hierarchical":
            from .allgather_hierarchical import HierarchicalAllGather

            return HierarchicalAllGather(algo)
        from .allgather import AllGather

        return AllGather(algo)
    raise ConfigError(f"unknown op {name!r}; choose one of: {', '.join(PATTERNS)}")
