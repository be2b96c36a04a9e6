"""GPU all-to-all of even splits by stores (kernels/src/collectives/all_to_all_push.cuh):
rank r stores block q of its input, tile by tile, into rank q's output where q's header
says it can reach it (q's heap, or a registered array), else into slot r of q's inbox,
which q copies into its output as each tile's signal comes. One meeting at the start (the
first store needs the peer's place), no staging of the input and no exit barrier.

Why stores: on 2 H200s (tools/probes/links/link_probe.py, 2026-11-28, both GPUs moving 128 MiB each
way at once) the SMs' stores crossed NVLink at 362 GB/s a direction where their loads came
back at 331, and the pull kernels first stage a plain input, a whole local pass before any
peer may read.

All-to-all-v (``GpuPushAllToAllV``, kernels/src/collectives/all_to_all_v_push.cuh): the
counts may be known only on the GPU, so no sender knows where its bytes land in a
receiver before it has read every rank's split row. Each block meets its peers once,
loads every header and row in one pass and checks them as pull does; then each sender's
block b stores part b of the bytes it sends (cut by bytes, as balanced cuts them) tile by
tile, and each receiver's block b waits for and copies out the tiles of part b of every
sender. A receiver whose output is out of reach takes its bytes in its inbox, which holds
the communicator's ``max_bytes``: a call that brings such a rank more is found by every
rank before any byte moves (kSplitTooLargeForInbox)."""

from __future__ import annotations

from typing import Any, ClassVar

from ..agreement import Signature
from .gpu_all_to_all import max_bytes_grid
from .gpu_kernel import GpuCall, GpuKernelAlgorithm
from .gpu_push import _Push

__all__ = ["GpuPushAllToAll", "GpuPushAllToAllV"]


class GpuPushAllToAll(_Push):
    """Any dtype (bytes move). In place, a rank takes its peers' tiles in its inbox (a
    peer storing into its output could overwrite input it has not sent yet)."""

    name = "push"
    op = "all_to_all"
    kernel = "all_to_all_push_bytes"
    bytes_per_block = 16 << 10
    # Smaller than the reductions' 512 KiB: a call ends with each block copying its last
    # tile out of the inbox after every store has landed, and a block's local copies stall
    # its stores less in short runs. 2 ranks, plain arrays, in graphs (2 x H200,
    # 2026-11-28), us at 16 / 64 / 256 MiB with tiles of 16 KiB: 49.5 / 167 / 639 (a fence
    # per tile); 64 KiB: 40.9 / 114 / 394; 128 KiB: 40.5 / 120 / 395; 256 KiB: 43.5 / 126 /
    # 406; 512 KiB: 40.9 / 126 / 442; 1 MiB: 40.2 / 126 / 474 (NCCL 49-51 / 132-134 / 435-439).
    tile_bytes: ClassVar[int] = 64 << 10

    def entry(self, signature: Signature) -> str:
        return self.kernel

    def sliced_bytes(self, signature: Signature, size: int) -> int:
        return signature.nbytes // max(size, 1)


class GpuPushAllToAllV(GpuPushAllToAll):
    """The counts of each call may only be known on the GPU, and every rank must cut the
    same parts of every sender: the grid follows the communicator's ``max_bytes``, as
    pull's and balanced's. Nothing on the host knows the counts, so nothing is refused
    here for them; in place is refused before any algorithm is asked (blocks move)."""

    op = "all_to_all_v"
    kernel = "all_to_all_v_push_bytes"

    def unsupported(self, call: Any) -> str | None:
        # The world size only: the signature of an all-to-all-v has no count.
        return GpuKernelAlgorithm.unsupported(self, call)

    def run(self, call: GpuCall) -> None:
        call.args.push_tile_bytes = self.tile_bytes
        call.launch(self.entry(call.signature), max_bytes_grid(call, self.bytes_per_block))
