"""Collectives on the user's own arrays: ``Communicator`` (all-gather, all-reduce,
reduce-scatter), the algorithms behind it and the measured ``auto`` choice.

Created by ``Group.communicator(max_bytes=...)``; see docs/COLLECTIVES.md. Nothing is
imported from here until a communicator is made.
"""

from __future__ import annotations

from .communicator import Communicator

__all__ = ["Communicator"]
