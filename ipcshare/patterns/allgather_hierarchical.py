"""``--algo hierarchical``: the all-gather pattern bound across nodes (IPC inside each
node, the ``--inter`` engine between them; patterns.allgather_across_nodes)."""

from __future__ import annotations

from collections.abc import Callable

from ..collectives.across_nodes.hierarchy import node_segments
from ..window import Window
from .allgather import AllGather
from .allgather_across_nodes import bind_hierarchical
from .base import SizePlan

__all__ = ["HierarchicalAllGather", "bind_hierarchical", "node_segments"]


class HierarchicalAllGather(AllGather):
    """``--algo hierarchical``: IPC inside nodes, the ``--inter`` engine between them."""

    def bind(self, window: Window, plan: SizePlan, mode: str) -> Callable[[], None]:
        return bind_hierarchical(self, window, plan, mode)
