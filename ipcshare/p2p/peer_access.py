"""Peer access between the GPUs of one process, pair by pair: what the driver says
(``cuDeviceCanAccessPeer``), whether ``cuCtxEnablePeerAccess`` worked, how long it took, and
why not when it did not."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from ..runtime.cuda_driver import SUCCESS, can_access_peer, driver, error_name
from ..runtime.settings import disabled_p2p_pairs
from .gpus import GpuSet

__all__ = ["PeerPair", "enable_peer_access", "disable_peer_access", "describe_pairs"]

_ALREADY_ENABLED = driver.CUresult.CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED


@dataclasses.dataclass
class PeerPair:
    """Whether ``src``'s context may dereference ``dst``'s memory directly."""

    src: int
    dst: int
    enabled: bool
    reason: str = ""
    setup_ms: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def enable_peer_access(gpus: GpuSet, *, enable: bool = True) -> list[PeerPair]:
    """For every ordered pair: ask the driver, then (``enable``) ``cuCtxEnablePeerAccess``
    from ``src``'s context to ``dst``'s. A pair that cannot is recorded with the reason, not
    raised: the caller names it and leaves it out of the direct runs. Pairs named in
    ``IPCSHARE_DISABLE_P2P`` are left disabled on purpose.

    Raises:
        CudaError: a driver query failed.
    """
    disabled = disabled_p2p_pairs()
    pairs = []
    for src in range(gpus.count):
        for dst in range(gpus.count):
            if src == dst:
                continue
            if frozenset((src, dst)) in disabled:
                pairs.append(PeerPair(src, dst, False, "disabled by IPCSHARE_DISABLE_P2P"))
                continue
            if not can_access_peer(src, dst):
                pairs.append(PeerPair(src, dst, False, "cuDeviceCanAccessPeer -> 0: no NVLink "
                                                       "or PCIe P2P path between them"))
                continue
            if not enable:
                pairs.append(PeerPair(src, dst, False, "not enabled (on purpose)"))
                continue
            gpus.activate(src)
            started = time.perf_counter()
            (err,) = driver.cuCtxEnablePeerAccess(gpus.contexts[dst].handle, 0)
            elapsed = (time.perf_counter() - started) * 1e3
            if err in (SUCCESS, _ALREADY_ENABLED):
                pairs.append(PeerPair(src, dst, True, setup_ms=round(elapsed, 3)))
            else:
                pairs.append(PeerPair(src, dst, False,
                                      f"cuCtxEnablePeerAccess -> {error_name(err)}"))
    return pairs


def disable_peer_access(gpus: GpuSet, pairs: list[PeerPair]) -> None:
    """Undo ``enable_peer_access`` for the pairs it enabled (primary contexts outlive this
    process's use of them: torch or cupy in the same process would inherit the mappings).
    Never raises."""
    for pair in pairs:
        if not pair.enabled:
            continue
        try:
            gpus.activate(pair.src)
            # NOT_ENABLED or another error: nothing more to do, the mapping goes with the
            # context when the process ends.
            driver.cuCtxDisablePeerAccess(gpus.contexts[pair.dst].handle)
        except Exception:
            continue


def describe_pairs(pairs: list[PeerPair]) -> list[str]:
    """One line per pair that cannot use peer access: ``'cuda:0 -> cuda:1: reason'``."""
    return [f"cuda:{p.src} -> cuda:{p.dst}: {p.reason}" for p in pairs if not p.enabled]
