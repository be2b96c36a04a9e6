"""GPU all-to-all of even splits by stores (kernels/src/collectives/all_to_all_push.cuh):
rank r stores block q of its input, tile by tile, into rank q's output where q's header
says it can reach it (q's heap, or a registered array), else into slot r of q's inbox,
which q copies into its output as each tile's signal comes. One meeting at the start (the
first store needs the peer's place), no staging of the input and no exit barrier.

Why stores: on 2 H200s (tools/link_probe.py, 2026-11-28, both GPUs moving 128 MiB each
way at once) the SMs' stores crossed NVLink at 362 GB/s a direction where their loads came
back at 331, and the pull kernels first stage a plain input, a whole local pass before any
peer may read. The all-to-all-v keeps pulling: its counts may be known only on the GPU,
so no sender knows where its bytes go in a receiver's inbox before a meeting."""

from __future__ import annotations

from typing import ClassVar

from ..agreement import Signature
from .gpu_push import _Push

__all__ = ["GpuPushAllToAll"]


class GpuPushAllToAll(_Push):
    """Any dtype (bytes move). In place, a rank takes its peers' tiles in its inbox (a
    peer storing into its output could overwrite input it has not sent yet)."""

    name = "push"
    op = "all_to_all"
    kernel = "all_to_all_push_bytes"
    bytes_per_block = 16 << 10
    # Smaller than the reductions' 512 KiB: a call ends with each block copying its last
    # tile out of the inbox, after every store has landed, so a tile is that tail's size.
    # 256 KiB keeps 4 tiles per block at 256 MiB on 2 ranks.
    tile_bytes: ClassVar[int] = 256 << 10

    def entry(self, signature: Signature) -> str:
        return self.kernel

    def sliced_bytes(self, signature: Signature, size: int) -> int:
        return signature.nbytes // max(size, 1)
