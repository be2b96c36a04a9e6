"""What a GPU algorithm is: kernels of kernels/src/collectives_*.cu enqueued on the call's
stream (one per call, or, for the stepped algorithms, two with the stream's own flag
barriers between them), with nothing on the host in between (so a CUDA graph captures
a call whole and replays it with whatever the input holds then). The path fills the
kernels' arguments; an algorithm names the entry points, the grids, the meetings, and
whether its output may be a zero-copy input."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

from ..agreement import Signature
from .base import Algorithm

__all__ = ["GpuCall", "GpuKernelAlgorithm", "MAX_BLOCKS", "THREADS"]

THREADS = 512
# Every block of a kernel must be resident at once (a block waits for the same block of
# its peers, never for a block of its own kernel): at most one per SM of an H100 / H200.
# Where k ranks share a GPU, all their kernels must be resident together: the path gives
# each call MAX_BLOCKS // k (GpuCall.max_blocks).
MAX_BLOCKS = 128


@dataclasses.dataclass(eq=False, slots=True)
class GpuCall:
    """One call as a GPU algorithm sees it: its signature, the world size,
    ``launch(entry, blocks)`` enqueuing a kernel with the call's arguments, the largest
    input the window's low-latency buffers take (``ll128_max_bytes``: the LL128 ones'),
    ``meet(turn)`` enqueuing a barrier
    with every peer made of stream memory operations on flag set ``turn`` (0 or 1; the
    two sets must alternate on the stream, as gpu_stepped.py explains), and
    ``copy([(dst, src, nbytes), ...])`` enqueuing copy-engine copies between device
    addresses, and ``time_sliced`` (see there). ``args`` is the kernels' argument block as
    placed for this call (input, output, every rank's window and the areas' offsets), for
    algorithms that copy; ``max_bytes`` the communicator's."""

    signature: Signature
    size: int
    launch: Callable[[str, int], None]
    ll_max_bytes: int = 0
    meet: Callable[[int], None] | None = None
    copy: Callable[[list[tuple[int, int, int]]], None] | None = None
    args: Any = None
    max_blocks: int = MAX_BLOCKS
    # The communicator's max_bytes (grids that cannot follow the call's own sizes).
    max_bytes: int = 0
    # Stepped calls on a time-sliced GPU (collectives/time_sliced.py): a guest's steps
    # (``guest`` True: ``hand_over()``) or the leader's (``take_guests``, ``launch``,
    # ``meet`` and ``release_guests`` for itself and its guests); None elsewhere.
    time_sliced: Any = None
    ll128_max_bytes: int = 0


class GpuKernelAlgorithm(Algorithm):
    """An algorithm run by one kernel family of the collectives (kernels/src/collectives_*.cu).

    ``kernel`` is the entry point's prefix (``<kernel>_<dtype>_<op>``; all-gather names
    its one entry in full); ``aliasing_safe`` says whether an in-place output may be an
    input that peers read in place (else the path copies such an input in first);
    ``bytes_per_block`` sets the grid from the bytes each block cuts its slice from;
    ``stages_input`` says whether an input outside the heap and the registered arrays is
    copied into the staging area (False where no peer ever reads the input: LL, copy-engine).
    """

    memory = "cuda"
    kernel: ClassVar[str] = ""
    aliasing_safe: ClassVar[bool] = False
    stages_input: ClassVar[bool] = True
    # Whether, on a time-sliced GPU, the leader runs the calls of the other ranks there
    # (only algorithms whose kernels never spin and whose steps run through GpuCall's
    # time_sliced: the stepped ones).
    leader_runs_time_sliced: ClassVar[bool] = False
    bytes_per_block: ClassVar[int] = 16 << 10

    def entry(self, signature: Signature) -> str:
        return f"{self.kernel}_{signature.dtype}_{signature.redop}"

    def sliced_bytes(self, signature: Signature, size: int) -> int:
        """The bytes the blocks cut into slices (the whole input by default)."""
        return signature.nbytes

    def blocks(self, signature: Signature, size: int, max_blocks: int = MAX_BLOCKS) -> int:
        """Thread blocks: one per ``bytes_per_block`` of the sliced range, 1 to
        ``max_blocks``; the same on every rank for the same call."""
        sliced = self.sliced_bytes(signature, size)
        return max(1, min(max_blocks, -(-sliced // self.bytes_per_block)))

    def unsupported(self, call: Any) -> str | None:
        from ...kernels.launcher import MAX_KERNEL_RANKS

        if call.size > MAX_KERNEL_RANKS:
            return (f"the {self.name} kernels span at most {MAX_KERNEL_RANKS} ranks; this "
                    f"group has {call.size}")
        return None

    def run(self, call: GpuCall) -> None:
        call.launch(self.entry(call.signature),
                    self.blocks(call.signature, call.size, call.max_blocks))
