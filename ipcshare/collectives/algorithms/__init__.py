"""The algorithms of each collective on each kind of memory, by the name ``algo=``
takes. Modules are imported when first asked for, so a GPU algorithm's CUDA imports
never run on a host-only machine."""

from __future__ import annotations

import importlib

from ...runtime.errors import CollectiveError
from .base import Algorithm, HostCall

__all__ = ["Algorithm", "HostCall", "algorithm", "algorithm_names", "OPS"]

# The collectives that every kind of memory runs with every placement of ranks (all-to-all
# and all-to-all-v have no stepped kernels: ranks taking turns on a GPU cannot run them).
OPS = ("all_gather", "all_reduce", "reduce_scatter")

# (memory, op) -> algorithm name -> "module:Class" under this package.
_REGISTRY: dict[tuple[str, str], dict[str, str]] = {
    ("host", "all_gather"): {"copy-engine": "host_all_gather:HostCopyAllGather"},
    ("host", "all_reduce"): {"one-shot": "host_one_shot:HostOneShotAllReduce",
                             "two-shot": "host_two_shot:HostTwoShotAllReduce"},
    ("host", "reduce_scatter"): {"one-shot": "host_one_shot:HostOneShotReduceScatter"},
    ("host", "all_to_all"): {"pull": "host_all_to_all:HostAllToAll"},
    ("host", "all_to_all_v"): {"pull": "host_all_to_all:HostAllToAllV"},
    ("cuda", "all_gather"): {"pull": "gpu_pull_all_gather:GpuPullAllGather",
                             "push": "gpu_push:GpuPushAllGather",
                             "ll": "gpu_low_latency:GpuLowLatencyAllGather",
                             "ll128": "gpu_ll128:GpuLL128AllGather",
                             "stepped": "gpu_stepped:GpuSteppedAllGather"},
    ("cuda", "all_reduce"): {"one-shot": "gpu_one_shot:GpuOneShotAllReduce",
                             "two-shot": "gpu_two_shot:GpuTwoShotAllReduce",
                             "ll": "gpu_low_latency:GpuLowLatencyAllReduce",
                             "ll-two-shot": "gpu_low_latency:GpuLowLatencyTwoShotAllReduce",
                             "ll128": "gpu_ll128:GpuLL128AllReduce",
                             "ll128-two-shot": "gpu_ll128:GpuLL128TwoShotAllReduce",
                             "stepped": "gpu_stepped:GpuSteppedAllReduce",
                             "copy-engine": "gpu_copy_engine:GpuCopyEngineAllReduce",
                             "push": "gpu_push:GpuPushAllReduce"},
    ("cuda", "reduce_scatter"): {"one-shot": "gpu_one_shot:GpuOneShotReduceScatter",
                                 "ll": "gpu_low_latency:GpuLowLatencyReduceScatter",
                                 "ll128": "gpu_ll128:GpuLL128ReduceScatter",
                                 "stepped": "gpu_stepped:GpuSteppedReduceScatter",
                                 "push": "gpu_push:GpuPushReduceScatter"},
    ("cuda", "all_to_all"): {"pull": "gpu_all_to_all:GpuPullAllToAll",
                             "balanced": "gpu_all_to_all_balanced:GpuBalancedAllToAll",
                             "ll": "gpu_all_to_all_ll:GpuLowLatencyAllToAll",
                             "copy-engine": "gpu_all_to_all_copy_engine:GpuCopyEngineAllToAll",
                             "push": "gpu_all_to_all_push:GpuPushAllToAll",
                             "ll128": "gpu_ll128:GpuLL128AllToAll"},
    ("cuda", "all_to_all_v"): {"pull": "gpu_all_to_all:GpuPullAllToAllV",
                               "balanced": "gpu_all_to_all_balanced:GpuBalancedAllToAllV",
                               "ll": "gpu_all_to_all_ll:GpuLowLatencyAllToAllV",
                               "push": "gpu_all_to_all_push:GpuPushAllToAllV",
                               "eager": "gpu_all_to_all_eager:GpuEagerAllToAllV",
                               "ll128": "gpu_ll128:GpuLL128AllToAllV"},
}
_INSTANCES: dict[tuple[str, str, str], Algorithm] = {}


def algorithm_names(memory: str, op: str) -> tuple[str, ...]:
    """The names ``algo=`` accepts for ``op`` on ``memory``, besides ``auto``."""
    return tuple(_REGISTRY.get((memory, op), {}))


def algorithm(memory: str, op: str, name: str) -> Algorithm:
    """The algorithm called ``name`` for ``op`` on ``memory``.

    Raises:
        CollectiveError: no such algorithm (listing the names there are).
    """
    key = (memory, op, name)
    found = _INSTANCES.get(key)
    if found is not None:
        return found
    where = _REGISTRY.get((memory, op), {})
    if not isinstance(name, str) or name not in where:
        names = ", ".join(("auto", *where))
        raise CollectiveError(f"algo={name!r} is not an algorithm of {op} on {memory} "
                              f"memory; choose one of: {names}")
    module_name, class_name = where[name].split(":")
    module = importlib.import_module(f"{__name__}.{module_name}")
    found = _INSTANCES[key] = getattr(module, class_name)()
    return found
