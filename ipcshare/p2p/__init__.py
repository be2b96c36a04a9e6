"""P2P direct: one process owns every visible GPU, enables peer access pair by pair and moves
bytes through peer pointers (kernels) or ``cuMemcpyPeerAsync``; ``ipcshare p2p`` sets it
against IPC windows (one process per GPU) on the same sizes.

Modules, one idea each: ``gpus`` (contexts, streams, kernels and memory of every GPU),
``peer_access`` (enable / disable, pair by pair, with reasons), ``direct`` (ring and
all-gather, verified and timed), ``ipc_half`` (the IPC run as a child job), ``runner`` (the
whole command). Importing this package loads none of them.
"""

from __future__ import annotations

__all__: list[str] = []
