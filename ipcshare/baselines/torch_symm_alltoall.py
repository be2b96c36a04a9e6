"""The torch-symm baseline of the all-to-all case: PyTorch symmetric memory's all-to-all-v
with its splits on the device (``torch.ops.symm_mem.all_to_all_vdev``: the counts each
rank sends are read by the kernel, the counts received written back on the device), on
tensors of symmetric memory's NVSHMEM backend, for even and uneven splits alike. This is
the op mixture-of-experts layers built on symmetric memory call; where this torch lacks
it (or NVSHMEM), the baseline is refused on every rank with the reason."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from ..liveness.consensus import collective_step
from ..patterns.base import SizePlan
from ..runtime.config import format_size
from ..runtime.errors import ConfigError
from ..topology.world import World
from .gpu import ALL_TO_ALL, all_to_all_splits, import_torch_cuda
from .torch_symm import TorchSymmBaseline

__all__ = ["TorchSymmAllToAllBaseline", "all_to_all_vdev_module", "finalize_nvshmem",
           "use_nvshmem", "vdev_blocks_per_peer", "vdev_refusal"]

_FLAG = "--baseline torch-symm"
# The op, and its arguments in the torch releases this baseline knows (earlier ones took
# one (3, n) in_out_splits tensor instead of the last two tensors).
_OP = "all_to_all_vdev"
_ARGUMENTS = ("input", "out", "in_splits", "out_splits_offsets", "group_name")
# Its backend: the op's kernels are NVSHMEM's (nvshmemx_collective_launch, getmem).
_BACKEND = "NVSHMEM"
# The kernel's blocks, as torch sizes them (get_a2a_nblocks beside the op): one per 64 KiB
# of input (16 B per thread, 512 threads, 8 loops), rounded up to a multiple of the world
# size, at most 64 on one node; or what TORCH_SYMMMEM_NBLOCKS says, where it is set.
_CHUNK_BYTES = 16 * 512 * 8
_MAX_BLOCKS = 64
NBLOCKS_SETTING = "TORCH_SYMMMEM_NBLOCKS"


def vdev_blocks_per_peer(input_bytes: int, world_size: int, setting: str | None) -> int:
    """How many blocks ``all_to_all_vdev``'s kernel splits each peer's bytes over, for an
    input tensor of ``input_bytes`` at ``world_size`` ranks on one node (``setting``: the
    value of TORCH_SYMMMEM_NBLOCKS, or None): the kernel's ``blocks_per_peer``,
    ``max(blocks // world_size, 1)``.

    Raises:
        ConfigError: a setting that is not a whole number.
    """
    blocks = 0
    if setting:
        try:
            blocks = int(setting)
        except ValueError:
            raise ConfigError(f"{NBLOCKS_SETTING}={setting!r}: torch reads a whole number of "
                              "blocks there") from None
    if blocks <= 0:
        blocks = -(-input_bytes // _CHUNK_BYTES)
        blocks = min(-(-blocks // world_size) * world_size, _MAX_BLOCKS)
    return max(blocks // world_size, 1)


def vdev_refusal(case: Any, plan: SizePlan, world_size: int, setting: str | None
                 ) -> str | None:
    """Why ``all_to_all_vdev`` cannot move ``case``'s splits at ``plan``, or None. Its
    kernel cuts each peer's bytes into ``blocks_per_peer`` equal parts and traps on a
    remainder (a device-side assert, which ends the process and its CUDA context), so
    every non-empty split must be a multiple of that many bytes; the same answer on every
    rank (it reads the whole split matrix)."""
    parts = vdev_blocks_per_peer(plan.size, world_size, setting)
    if parts == 1:
        return None
    m = case.split_matrix(plan, world_size) * plan.element_size
    for sender in range(world_size):
        for receiver in range(world_size):
            nbytes = int(m[sender, receiver])
            if nbytes % parts:
                return (f"{_FLAG}: PyTorch's {_OP} splits each peer's bytes over its "
                        f"{parts} blocks per peer and traps on a remainder (a device "
                        f"assert that ends the process); at {format_size(plan.size)} "
                        f"rank {sender} sends rank {receiver} {nbytes} bytes, not a multiple "
                        f"of {parts}: use --splits even, sizes whose splits divide, or "
                        f"{NBLOCKS_SETTING}={world_size} (one block per peer)")
    return None


class TorchSymmAllToAllBaseline(TorchSymmBaseline):
    """Times PyTorch symmetric memory's ``all_to_all_vdev`` on the all-to-all case.

    Collective over ``world``, on one node, one GPU per rank: a torch.distributed NCCL
    group (symmetric memory's rendezvous goes through its store), symmetric memory's
    backend set to NVSHMEM before its first tensor. Every tensor the op takes lies in
    symmetric memory, the same sizes in the same order on every rank: the input (in place,
    the array copied aside first: ``_all_to_all_source``), the output, this rank's send
    counts (int64, bytes: the tensors are bytes) and the (2, n) counts-and-offsets the op
    fills.

    Raises:
        ConfigError: torch without symmetric memory, without ``all_to_all_vdev`` of the
            arguments above, without NVSHMEM, a process whose symmetric memory already
            has another backend, ranks on several nodes, or what the torch baseline
            refuses; on every rank.
    """

    name = "torch-symm"
    label = "PyTorch symmetric memory"
    path_column = False

    def __init__(self, world: World, case: Any, device: int | None) -> None:
        # What this torch offers, on every rank alike, before a process group is made.
        with collective_step(world, "torch-symm all-to-all setup"):
            type(self).check_case(case)
            torch = import_torch_cuda(_FLAG)
            symm_mem = all_to_all_vdev_module(torch)
        super().__init__(world, case, device)
        with collective_step(world, "torch-symm NVSHMEM backend"):
            use_nvshmem(symm_mem, self.device)
        self._op = getattr(self._torch.ops.symm_mem, _OP)
        self._setting = os.environ.get(NBLOCKS_SETTING)
        self.version = (f"PyTorch {self._torch.__version__.split('+')[0]} symmetric memory "
                        f"({_BACKEND}), {_OP}")
        if self._setting:
            self.version += f", {NBLOCKS_SETTING}={self._setting}"

    @classmethod
    def check_case(cls, case: Any) -> None:
        if case.name != ALL_TO_ALL:
            raise ConfigError(f"{_FLAG}'s {_OP} times all-to-all only, not {case.name}")

    def _check_plan(self, plan: SizePlan) -> None:
        refusal = vdev_refusal(self.case, plan, self.world.size, self._setting)
        if refusal is not None:
            raise ConfigError(refusal)

    def _paths(self, mode: str) -> tuple[str | None, ...]:
        return (None,)

    def _symmetric(self, *shape: int, dtype: Any) -> Any:
        """A tensor of symmetric memory, mapped by every peer now (collective)."""
        tensor = self._symm_mem.empty(*shape, dtype=dtype, device=self.device)
        self._symm_mem.rendezvous(tensor, self._group_name)
        return tensor

    def _bind(self, path: str | None, inputs: Any, output: Any, plan: SizePlan,
              mode: str) -> Callable[[], None]:
        torch, n = self._torch, self.world.size
        source, copy_aside = self._all_to_all_source(path, inputs, output)
        splits = all_to_all_splits(self.case, plan, n, self.world.rank)
        # Bytes: the input is a byte tensor, so a split counts its rows of one byte.
        in_splits = self._symmetric(n, dtype=torch.int64)
        in_splits.copy_(torch.tensor(splits.send, dtype=torch.int64))
        out_splits_offsets = self._symmetric(2, n, dtype=torch.int64)
        group, op = self._group_name, self._op

        def all_to_all_vdev() -> None:
            if copy_aside is not None:
                copy_aside()
            op(source, output, in_splits, out_splits_offsets, group)
        return all_to_all_vdev


def all_to_all_vdev_module(torch: Any) -> Any:
    """torch's symmetric-memory module, where it has ``all_to_all_vdev`` with the
    arguments this baseline passes and NVSHMEM to run it.

    Raises:
        ConfigError: what is missing, in words.
    """
    try:
        import torch.distributed._symmetric_memory as symm_mem
    except ImportError as exc:
        raise ConfigError(f"{_FLAG} needs PyTorch symmetric memory, which this torch "
                          f"({torch.__version__}) lacks ({exc}); use --baseline nccl or "
                          "torch") from None
    ops = getattr(torch.ops, "symm_mem", None)
    if ops is None or not hasattr(ops, _OP):
        raise ConfigError(f"{_FLAG} times all-to-all with torch.ops.symm_mem.{_OP}, which "
                          f"this torch ({torch.__version__}) does not have; use --baseline "
                          "nccl or torch")
    arguments = tuple(argument.name for argument in getattr(ops, _OP).default._schema.arguments)
    if arguments != _ARGUMENTS:
        raise ConfigError(f"{_FLAG}: this torch's {_OP} takes ({', '.join(arguments)}), not "
                          f"the ({', '.join(_ARGUMENTS)}) this baseline passes; use "
                          "--baseline nccl or torch")
    available = getattr(symm_mem, "is_nvshmem_available", None)
    if available is None or not available():
        raise ConfigError(f"{_FLAG}: {_OP} runs on symmetric memory's NVSHMEM backend, "
                          "and NVSHMEM is not available here (torch finds no "
                          "libnvshmem_host.so.3); use --baseline nccl or torch")
    return symm_mem


def use_nvshmem(symm_mem: Any, device: Any) -> None:
    """Set symmetric memory's backend to NVSHMEM (the op's) before its first tensor.

    Raises:
        ConfigError: this process already holds symmetric memory of another backend
            (torch cannot change it then), or torch refuses the backend.
    """
    current = symm_mem.get_backend(device) if hasattr(symm_mem, "get_backend") else None
    if current == _BACKEND:
        return
    try:
        symm_mem.set_backend(_BACKEND)
    except Exception as exc:  # torch's words, on one line
        reason = " ".join(str(exc).split())
        raise ConfigError(f"{_FLAG}: {_OP} needs symmetric memory's {_BACKEND} backend, "
                          f"and torch refused it ({reason}); symmetric memory of another "
                          f"backend ({current}) may already live in this process: time "
                          "all-to-all in a process of its own") from None


# NVSHMEM's host library as torch loads it (the nvidia-nvshmem wheel's soname).
_NVSHMEM_HOST = "libnvshmem_host.so.3"


def finalize_nvshmem(comm: Any) -> bool:
    """Collective: finalize NVSHMEM where torch started it, once every rank's symmetric
    tensors are gone. torch initializes NVSHMEM for symmetric memory and never finalizes
    it (pytorch/pytorch#195499); its threads then outlive the teardown of the process,
    and a process that exits can fault in ``libnvshmem_host`` (SIGSEGV after the MoE
    step's table on 4 H200s, 2026-11-28). Symmetric memory of the NVSHMEM backend cannot
    be used in this process afterwards. Returns whether it was finalized (False where
    NVSHMEM was never loaded, or its library lacks ``nvshmemx_hostlib_finalize``)."""
    import ctypes

    try:  # RTLD_NOLOAD: only the library torch already loaded, never a new one
        library = ctypes.CDLL(_NVSHMEM_HOST, mode=os.RTLD_NOLOAD | os.RTLD_GLOBAL)
    except OSError:
        loaded = False
    else:
        loaded = hasattr(library, "nvshmemx_hostlib_finalize")
    if not all(comm.allgather(loaded)):  # every rank alike, or none
        return False
    comm.Barrier()
    library.nvshmemx_hostlib_finalize()
    comm.Barrier()
    return True
