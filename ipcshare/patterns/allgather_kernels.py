"""All-gather by kernels that read or write peer memory directly and synchronise through
flags in the peers' signal pads: one-shot push, one-shot pull, and a pipelined ring.

Same window layout, data, checks and bandwidth formula as the copy-engine all-gather, so
the driver's table compares them directly; only ``bind`` differs.
"""

from __future__ import annotations

from collections.abc import Callable

from ..runtime.errors import ConfigError
from ..window import Window
from ..window.layout import (
    KERNEL_SLOT_BASE,
    ONE_SHOT_EPOCH_SLOT,
    RING_KERNEL_EPOCH_SLOT,
    RING_KERNEL_SLOT_BASE,
)
from .allgather import AllGather
from .base import SizePlan

__all__ = ["KernelAllGather", "KERNEL_ALGOS", "refuse_indirect_pairs"]

KERNEL_ALGOS = {"push": "allgather_push", "pull": "allgather_pull", "ring": "allgather_ring"}
_THREADS = 512
# Up to one block per SM of an H100/H200 (132): all resident at once, so blocks waiting
# on their peers' blocks never wait for a block that cannot be scheduled.
_MAX_BLOCKS = 128
# Below this per block, fewer blocks: flags cost more than bytes. (At 256 KiB, measured
# on 4 H200s, 1-4 MiB all-gathers ran on 1-4 blocks and lost to NCCL.)
_BYTES_PER_BLOCK = 32 << 10
# Pad words (window.layout): push and pull share the one-shot kernels' region and epoch,
# the ring has its own.
_SLOT_BASE = {"push": KERNEL_SLOT_BASE, "pull": KERNEL_SLOT_BASE, "ring": RING_KERNEL_SLOT_BASE}
_EPOCH_WORD = {"push": ONE_SHOT_EPOCH_SLOT, "pull": ONE_SHOT_EPOCH_SLOT,
               "ring": RING_KERNEL_EPOCH_SLOT}


def refuse_indirect_pairs(window: Window, what: str) -> None:
    """Raise ConfigError naming the first pair of the node without peer access: kernels
    load and store into every peer's window, which such a pair cannot map. The plan is
    the node's, so every rank refuses alike."""
    plan = window.paths
    if not plan.has_fallbacks:
        return
    a, b = min(tuple(sorted(pair)) for pair in plan.indirect)
    raise ConfigError(
        f"{what} reads and writes every peer's window directly, but rank {a} "
        f"({plan.label(a)}) and rank {b} ({plan.label(b)}) have no peer access "
        f"({plan.path(a, b).reason}; their path is {plan.kind(a, b)}): use --algo "
        "copy-engine (or auto), which stages such pairs")


def kernel_blocks(block_bytes: int) -> int:
    """Thread blocks for a per-rank block of ``block_bytes``."""
    return max(1, min(_MAX_BLOCKS, -(-block_bytes // _BYTES_PER_BLOCK)))


class KernelAllGather(AllGather):
    """All-gather through one of ipcshare's kernels (``algo``: push, pull or ring)."""

    def __init__(self, algo: str) -> None:
        if algo not in KERNEL_ALGOS:
            raise ConfigError(f"unknown kernel algorithm {algo!r}; choose one of: "
                              f"{', '.join(KERNEL_ALGOS)}")
        self.algo = algo

    def bind(self, window: Window, plan: SizePlan, mode: str) -> Callable[[], None]:
        from ..kernels.launcher import MAX_KERNEL_RANKS, AllGatherArgs

        backend, n, me = window.backend, window.world_size, window.rank
        if not backend.has_kernels:
            raise ConfigError(f"--algo {self.algo} runs kernels: it needs a GPU backend "
                              "(cuda-ipc or cuda-vmm), not host")
        if n > MAX_KERNEL_RANKS or window.world.node_count > 1:
            raise ConfigError(f"--algo {self.algo} works within one node of at most "
                              f"{MAX_KERNEL_RANKS} ranks; this job has {n} on "
                              f"{window.world.node_count} node(s)")
        refuse_indirect_pairs(window, f"--algo {self.algo}")
        args = AllGatherArgs()
        for rank in range(n):
            args.outputs[rank] = window.peer(rank).ptr + self._recv_offset(plan)
            args.inputs[rank] = self._send_of(window, rank, plan, mode).ptr
            args.pads[rank] = window.signal_pad(rank).ptr
        args.block_bytes = plan.block_bytes
        # Device waits give up at half the host's patience, so a kernel reports the silent
        # peer (in the pad's error word) before the host gives up on the stream.
        args.timeout_ns = int(window.signal_timeout * 0.5e9)
        args.rank, args.nranks, args.slot_base = me, n, _SLOT_BASE[self.algo]
        args.epoch_word = _EPOCH_WORD[self.algo]
        return backend.kernels("allgather.cu").launcher(
            KERNEL_ALGOS[self.algo], args, grid=kernel_blocks(plan.block_bytes),
            block=_THREADS, stream=window.engine.stream)

    def check(self, window: Window, plan: SizePlan, mode: str, iteration: int) -> int:
        wrong = super().check(window, plan, mode, iteration)
        window.raise_kernel_error(f"a {self.algo} all-gather kernel")
        return wrong
