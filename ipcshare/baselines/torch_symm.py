"""The torch-symm baseline: PyTorch symmetric memory's all-reduce kernels
(``torch.ops.symm_mem.one_shot_all_reduce_out``, ``two_shot_all_reduce_out`` and the
in-place ``two_shot_all_reduce_``) on tensors from ``symm_mem.empty``, multicast off; the
faster of one-shot and two-shot per size. These are the kernels vLLM-style custom
all-reduces are measured against."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..patterns.base import SizePlan
from ..runtime.errors import ConfigError
from ..topology.world import World
from .torch_distributed import TorchBaseline

__all__ = ["TorchSymmBaseline"]

# What the kernels reduce (torch dispatches them on float and bfloat16, sum only).
_DTYPES = ("float32", "bfloat16")
_FLAG = "--baseline torch-symm"


class TorchSymmBaseline(TorchBaseline):
    """Times PyTorch symmetric memory's one-shot and two-shot all-reduce.

    Collective over ``world``, on one node, one GPU per rank: a torch.distributed NCCL
    group (symmetric memory's rendezvous goes through its store). Out of place, one-shot
    reads every peer's input into the output, two-shot reduces a slice and gathers it
    (and leaves partial sums in its input); in place, two-shot only (one-shot would
    overwrite an input that peers still read).

    Raises:
        ConfigError: an op other than all-reduce with sum on float32 or bfloat16, ranks
            on several nodes, or what the torch baseline refuses; on every rank.
    """

    name = "torch-symm"
    label = "PyTorch symmetric memory"
    path_column = True

    def __init__(self, world: World, case: Any, device: int | None) -> None:
        super().__init__(world, case, device)
        import torch.distributed._symmetric_memory as symm_mem

        self._symm_mem = symm_mem
        self._group_name = self._dist.group.WORLD.group_name
        self._kernels = self._torch.ops.symm_mem
        self.version = (f"PyTorch {self._torch.__version__.split('+')[0]} symmetric memory, "
                        "multicast off")

    @classmethod
    def check_case(cls, case: Any) -> None:
        if case.name == "alltoall":
            raise ConfigError(f"{_FLAG} times all-to-all with symmetric memory's "
                              "all_to_all_vdev on its NVSHMEM backend, which a process "
                              "cannot hold beside these all-reduce kernels' CUDA backend: "
                              "time it with ipcshare alltoall --baseline torch-symm")
        if case.name != "allreduce":
            raise ConfigError(f"{_FLAG} times all-reduce only (PyTorch symmetric memory's "
                              f"one_shot / two_shot_all_reduce), not {case.name}; use "
                              "--baseline nccl or torch")
        if case.op != "sum" or case.datatype not in _DTYPES:
            raise ConfigError(f"{_FLAG} reduces with -o sum on -d {' or '.join(_DTYPES)} "
                              f"(what its kernels support), not -o {case.op} -d "
                              f"{case.datatype}; use --baseline nccl or torch")

    def _check_world(self, world: World) -> None:
        if world.node_count > 1:
            raise ConfigError(f"{_FLAG} maps peers' memory by CUDA IPC: it needs every rank "
                              f"on one node, not {world.node_count}; use --baseline nccl")

    def _check_plan(self, plan: SizePlan) -> None:
        if plan.size % 4:
            raise ConfigError(f"{_FLAG} needs arrays of a multiple of 4 bytes (its kernels' "
                              f"narrowest vector), not {plan.size}; choose -b and -e so")

    def _paths(self, mode: str) -> tuple[str | None, ...]:
        return ("two-shot",) if mode == "in-place" else ("one-shot", "two-shot")

    def _allocate(self, path: str | None, nbytes: int) -> Any:
        tensor = self._symm_mem.empty(nbytes, dtype=self._torch.uint8, device=self.device)
        # Collective: maps every peer's tensor now, so no call (or capture) does it later.
        self._symm_mem.rendezvous(tensor, self._group_name)
        return tensor

    def _bind(self, path: str | None, inputs: Any, output: Any, plan: SizePlan,
              mode: str) -> Callable[[], None]:
        kernels, group = self._kernels, self._group_name
        if inputs.data_ptr() == output.data_ptr():
            return lambda: kernels.two_shot_all_reduce_(output, "sum", group)
        if path == "one-shot":
            return lambda: kernels.one_shot_all_reduce_out(inputs, "sum", group, output)
        return lambda: kernels.two_shot_all_reduce_out(inputs, "sum", group, output)
