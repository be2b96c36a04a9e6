"""``--algo auto`` all-gather: each size runs the algorithm the measured table picks for it
(patterns.choice). Every all-gather shares one window layout, one data seeding and one
check, so the choice changes only how the bytes move."""

from __future__ import annotations

from collections.abc import Callable

from ..window import Window
from .allgather import AllGather
from .base import SizePlan
from .choice import choose_allgather

__all__ = ["AutoAllGather"]


class AutoAllGather(AllGather):
    """All-gather by the copy engine or a kernel, chosen per size; engine copies on host
    windows, across nodes (kernels reach only one node's peers) and where a pair of GPUs
    has no peer access."""

    def __init__(self) -> None:
        super().__init__("auto")
        self._algorithms: dict[str, AllGather] = {}
        self.last_choice = "copy-engine"

    def choose(self, window: Window, plan: SizePlan, mode: str = "out-of-place") -> str:
        """The algorithm ``plan`` runs on ``window`` in ``mode``."""
        # Kernels need every peer mapped: pairs without peer access keep to the copy
        # engine, whose staged copies reach them.
        if (not window.backend.has_kernels or window.world.node_count > 1
                or window.paths.has_fallbacks or not _nvrtc_present()):
            return "copy-engine"
        # Ranks sharing a GPU take turns on it in time slices (without MPS): a kernel that
        # spins on a peer's flag holds the GPU while that peer cannot run, and copies
        # issued by both contexts at once keep preempting each other. One rank per GPU
        # moves the bytes, between barriers met on the host (docs/GPU.md). Under MPS the
        # ranks of a GPU run side by side, and the usual kernels are faster.
        if window.time_sliced_gpus:
            return "leader"
        # A graph-safe view (Window.on_stream(..., graph_safe=True)) is what gets captured.
        return choose_allgather(plan.size, window.world_size,
                                graph=getattr(window, "graph_safe", False),
                                in_place=mode == "in-place")

    def _algorithm(self, name: str) -> AllGather:
        if name not in self._algorithms:
            if name == "copy-engine":
                # AllGather's own auto: single copy on one node, hierarchical across nodes.
                self._algorithms[name] = AllGather("auto")
            elif name == "leader":
                from .allgather_leader import LeaderAllGather

                self._algorithms[name] = LeaderAllGather()
            elif name == "ll":
                from .allgather_library import LibraryAllGather

                self._algorithms[name] = LibraryAllGather("ll")
            else:
                from .allgather_kernels import KernelAllGather

                self._algorithms[name] = KernelAllGather(name)
            # One engine between nodes for this pattern and every algorithm it picks:
            # opened once, named in the results, closed with this pattern.
            self._algorithms[name].inter_engine = self.inter_engine  # type: ignore[method-assign]
        return self._algorithms[name]

    def bind(self, window: Window, plan: SizePlan, mode: str) -> Callable[[], None]:
        self.last_choice = self.choose(window, plan, mode)
        return self._algorithm(self.last_choice).bind(window, plan, mode)

    def check(self, window: Window, plan: SizePlan, mode: str, iteration: int) -> int:
        return self._algorithm(self.choose(window, plan, mode)).check(
            window, plan, mode, iteration)


def _nvrtc_present() -> bool:
    """Whether kernels can be compiled here (else auto keeps to the copy engine)."""
    from ..kernels.compiler import nvrtc_version
    from ..runtime.errors import KernelCompileError

    try:
        nvrtc_version()
    except KernelCompileError:
        return False
    return True
