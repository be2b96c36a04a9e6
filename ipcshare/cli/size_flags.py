"""The size sweep's flags (``-b``, ``-e``, ``-f``, as nccl-tests spells them) of the
commands that give them defaults of their own (``p2p``, ``vs-torch``)."""

from __future__ import annotations

import argparse

__all__ = ["add_size_flags"]


def add_size_flags(parser: argparse.ArgumentParser, *, smallest: str, largest: str,
                   factor: int, counted: str = "") -> None:
    """``-b/--minbytes``, ``-e/--maxbytes`` and ``-f/--stepfactor`` on ``parser``, with
    these defaults (``counted``: how the command counts a size, said in the help)."""
    add = parser.add_argument
    add("-b", "--minbytes", dest="min_bytes", default=smallest, metavar="SIZE",
        help=f"smallest size{counted}, with K/M/G suffixes (default {smallest})")
    add("-e", "--maxbytes", dest="max_bytes", default=largest, metavar="SIZE",
        help=f"largest size (default {largest})")
    add("-f", "--stepfactor", dest="step_factor", type=int, default=factor, metavar="F",
        help=f"multiply the size by F between rows (default {factor})")
