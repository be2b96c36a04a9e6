"""The fixed interface every pattern fills in (sizes, data, run, expected, bandwidth);
the driver owns the sweep, warm-up, timing, checks and the table."""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable
from typing import Any

from ..window import Window
from ..window.layout import PAD_ALIGN, round_up

__all__ = ["SizePlan", "Pattern", "align"]


def align(value: int, multiple: int = PAD_ALIGN) -> int:
    """Round ``value`` up to a multiple of ``multiple`` (region starts in windows)."""
    return round_up(value, multiple)


@dataclasses.dataclass(frozen=True)
class SizePlan:
    """One row of the sweep: what the table calls size and count, and the per-rank block."""

    size: int          # the table's size column, in bytes
    count: int         # the table's count column, in elements
    block_bytes: int   # bytes each rank contributes
    element_size: int


class Pattern(abc.ABC):
    """A communication pattern over a window, run by the shared driver."""

    name: str = ""
    # Variants timed in separate table columns, e.g. ("out-of-place", "in-place").
    modes: tuple[str, ...] = ("",)
    # What the hierarchical algorithms cross nodes with (config.INTER_ENGINES); the
    # engine opens at the first bind that crosses nodes and serves every later one.
    inter: str = "auto"
    _inter_engine: Any = None
    # Whether graph mode runs the bound operations eagerly before capturing them: a
    # library call's first calls on a time-sliced GPU differ from its later ones (a guest
    # copies its arrays until its leader has mapped them, collectives/guest_imports.py),
    # and a capture keeps what it sees.
    warm_before_capture: bool = False

    @property
    def inter_engine_name(self) -> str | None:
        """The engine that crossed nodes (``nccl`` or ``mpi``); None before any did."""
        return None if self._inter_engine is None else self._inter_engine.name

    def inter_engine(self, group: Any) -> Any:
        """Collective the first time: this pattern's engine between nodes on ``group``
        (collectives.across_nodes.choice).

        Raises:
            ConfigError / IpcShareError: as ``open_inter_engine`` (on every rank).
        """
        if self._inter_engine is None:
            from ..collectives.across_nodes.choice import open_inter_engine

            self._inter_engine = open_inter_engine(self.inter, group)
        return self._inter_engine

    def fit_memory(self, device_memory: bool) -> None:
        """Drop the modes this case cannot run on the group's memory (``device_memory``:
        GPU memory); run_pattern calls it before its first size. Keeps every mode by
        default."""
        return None

    def close(self) -> None:
        """Collective: release what binding opened beyond the window (the engine
        between nodes). Idempotent."""
        opened, self._inter_engine = self._inter_engine, None
        if opened is not None:
            opened.close()

    @abc.abstractmethod
    def plan(self, size: int, world_size: int, element_size: int) -> SizePlan:
        """Turn a requested size into the exact sizes this pattern will move."""

    @abc.abstractmethod
    def window_bytes(self, plan: SizePlan, world_size: int) -> int:
        """Window bytes per rank that every mode of ``plan`` needs."""

    @abc.abstractmethod
    def prepare(self, window: Window, plan: SizePlan, mode: str, iteration: int) -> None:
        """Write this rank's seeded input and poison its output (local memory only)."""

    @abc.abstractmethod
    def bind(self, window: Window, plan: SizePlan, mode: str) -> Callable[[], None]:
        """A callable running one operation; on return this rank's output is complete
        once the engine synchronises. Binding resolves buffers once, outside timing."""

    @abc.abstractmethod
    def check(self, window: Window, plan: SizePlan, mode: str, iteration: int) -> int:
        """Mismatched elements in this rank's output after a checked run."""

    @abc.abstractmethod
    def bandwidth(self, plan: SizePlan, seconds: float, world_size: int) -> tuple[float, float]:
        """(algbw, busbw) in GB/s (1e9 bytes) for one operation of ``seconds``."""

    def link_gbps(self, plan: SizePlan, seconds: float, world_size: int) -> tuple[float, str]:
        """(GB/s, what it is) that one operation of ``seconds`` asks of the busiest rank's
        link, which the ceiling check holds against what the path carries: busbw by
        default (nccl-tests' accounting, what one rank's links carry per direction)."""
        return self.bandwidth(plan, seconds, world_size)[1], "busbw"

    def row_facts(self, plan: SizePlan, world_size: int, row: Any) -> dict[str, Any]:
        """What this pattern adds to a measured row (``Row``) of ``plan``: JSON keys of the
        row and the note under it (``fact_lines``). None by default."""
        return {}

    def fact_lines(self, facts: dict[str, Any]) -> list[str]:
        """The table's lines under a row for its ``row_facts``."""
        return []
