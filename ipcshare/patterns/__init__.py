"""Communication patterns over windows and the driver that sweeps, checks and times them."""

from __future__ import annotations

__all__ = ["make_pattern", "PATTERNS"]

PATTERNS = ("ring", "allgather")


def make_pattern(name: str):
    """A fresh pattern object for ``name`` (``ring`` or ``allgather``)."""
    if name == "ring":
        from .ring import Ring

        return Ring()
    if name == "allgather":
        from .allgather import AllGather

        return AllGather()
    from ..errors import ConfigError

    raise ConfigError(f"unknown op {name!r}; choose one of: {', '.join(PATTERNS)}")
