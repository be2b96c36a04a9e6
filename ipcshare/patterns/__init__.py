"""Communication patterns over windows and the driver that sweeps, checks and times them."""

from __future__ import annotations

__all__ = ["make_pattern", "PATTERNS"]

PATTERNS = ("ring", "allgather", "allreduce", "reducescatter", "alltoall")


def make_pattern(name: str, algo: str = "auto", *, op: str = "sum",
                 datatype: str = "float32", inter: str = "auto", register: int = 0,
                 splits: str = "even"):
    """A fresh pattern object for ``name`` (``ring`` or ``allgather``) and ``algo``:
    ``copy-engine`` (engine copies: memcpy on host, the copy engine on GPUs),
    ``hierarchical`` (all-gather: IPC inside nodes, MPI between nodes), one of the
    all-gather kernels ``push``, ``pull``, ``ring`` (GPU backends, one node), ``ll``
    (the collectives layer's low-latency all-gather and all-reduce, GPU backends),
    ``leader`` (one kernel per GPU, for ranks that share GPUs), or
    ``auto``: for all-gather on one node's GPUs the measured choice by size and world
    size (patterns.choice), hierarchical across nodes, engine copies otherwise.
    ``inter`` names what crosses nodes (config.INTER_ENGINES: auto, nccl, mpi).
    ``register`` (allreduce, reducescatter, alltoall): 1 registers the case's arrays with
    its communicator, so calls read them in place (and the push all-to-all stores into
    the peers' outputs). ``splits`` (alltoall): ``even`` runs
    all_to_all, ``random`` and ``skewed`` all_to_all_v on seeded splits."""
    from ..runtime.config import INTER_ENGINES
    from ..runtime.errors import ConfigError

    if inter not in INTER_ENGINES:
        raise ConfigError(f"unknown inter-node engine {inter!r}; choose one of: "
                          f"{', '.join(INTER_ENGINES)}")
    if splits != "even" and name != "alltoall":
        raise ConfigError(f"splits apply to the alltoall op (how each rank's input is "
                          f"split between the ranks), not to {name}")
    if name == "alltoall":
        pattern = _all_to_all_case(algo, splits, datatype)
    else:
        pattern = _make(name, algo, op, datatype)
    pattern.inter = inter
    if register:
        if name not in ("allreduce", "reducescatter", "alltoall"):
            raise ConfigError(f"register applies to the allreduce, reducescatter and alltoall "
                              f"ops (their communicator's arrays), not to {name}")
        pattern.register = True
    return pattern


def _make(name: str, algo: str, op: str, datatype: str):
    from ..runtime.config import ALGOS
    from ..runtime.errors import ConfigError

    if algo not in ALGOS:
        raise ConfigError(f"unknown algorithm {algo!r}; choose one of: {', '.join(ALGOS)}")
    if name in ("allreduce", "reducescatter"):
        return _reduction_case(name, algo, op, datatype)
    if algo in ("one-shot", "two-shot"):
        raise ConfigError(f"--algo {algo} runs all-reduce or reduce-scatter, not the {name} "
                          "op")
    if name == "ring":
        if algo not in ("auto", "copy-engine"):
            raise ConfigError(f"the ring op has no {algo!r} algorithm; use --algo auto")
        from .ring import Ring

        return Ring()
    if name == "allgather":
        if algo in ("push", "pull", "ring"):
            from .allgather_kernels import KernelAllGather

            return KernelAllGather(algo)
        if algo in ("ll", "ll128", "stepped"):
            from .allgather_library import LibraryAllGather

            return LibraryAllGather(algo)
        if algo == "leader":
            from .allgather_leader import LeaderAllGather

            return LeaderAllGather()
        if algo == "auto":
            from .allgather_auto import AutoAllGather

            return AutoAllGather()
        if algo == "hierarchical":
            from .allgather_hierarchical import HierarchicalAllGather

            return HierarchicalAllGather(algo)
        from .allgather import AllGather

        return AllGather(algo)
    raise ConfigError(f"unknown op {name!r}; choose one of: {', '.join(PATTERNS)}")


def _reduction_case(name: str, algo: str, op: str, datatype: str):
    """The all-reduce or reduce-scatter case: it calls the collectives layer, whose
    algorithm names ``algo`` must be (or ``auto``)."""
    from ..collectives.algorithms import algorithm_names
    from ..runtime.errors import ConfigError

    if name == "allreduce":
        from .allreduce import AllReduce as case
    else:
        from .reducescatter import ReduceScatter as case
    # hierarchical: the node's collective by the library, the rails' by --inter (across
    # nodes; on one node it is the library's auto).
    allowed = ("auto", "hierarchical", *dict.fromkeys((
        *algorithm_names("host", case.collective), *algorithm_names("cuda", case.collective))))
    if algo not in allowed:
        raise ConfigError(f"the {name} op has no {algo!r} algorithm; choose one of: "
                          f"{', '.join(allowed)}")
    return case(algo, op=op, datatype=datatype)


def _all_to_all_case(algo: str, splits: str, datatype: str):
    """The all-to-all case: it calls the collectives layer (all_to_all, or all_to_all_v
    for uneven splits), whose algorithm names ``algo`` must be (or ``auto``)."""
    from ..collectives.algorithms import algorithm_names
    from ..runtime.errors import ConfigError
    from .alltoall import AllToAll

    case = AllToAll(algo, splits=splits, datatype=datatype)
    # Every name of either collective on either memory: the run refuses one that the
    # group's memory or these splits lack before the table starts, saying which splits it
    # takes (cli/run_pattern.py); `--algo ll --splits random` used to stop here with "no
    # 'll' algorithm", though ll runs even splits.
    allowed = ("auto", *dict.fromkeys(
        name for collective in ("all_to_all", "all_to_all_v") for memory in ("host", "cuda")
        for name in algorithm_names(memory, collective)))
    if algo not in allowed:
        raise ConfigError(f"the alltoall op has no {algo!r} algorithm; choose one of: "
                          f"{', '.join(allowed)}")
    return case
