"""Whether peer copies between two GPUs of this process go direct or through host memory,
measured: the bandwidth of ``cuMemcpyPeerAsync`` src -> dst, and how long a copy on a second
stream takes when a copy queued behind a long kernel on the first stream is pending.

Without peer access the driver stages peer copies through pinned host memory: a fraction of
NVLink's bandwidth, and serialised, so the second stream's copy waits for the kernel too.
"""

from __future__ import annotations

import time
from typing import Any

from ..runtime.cuda_driver import NOT_READY, check, driver
from .gpus import GpuSet

__all__ = ["probe_staging"]

_COPIES = 5


def _poll_done(event: Any, deadline_s: float) -> float:
    """Host-poll ``event`` until complete; returns the perf_counter when it was seen done."""
    limit = time.perf_counter() + deadline_s
    while True:
        err = driver.cuEventQuery(event)[0]
        now = time.perf_counter()
        if err != NOT_READY:
            check("cuEventQuery", (err,))
            return now
        if now > limit:
            raise TimeoutError(f"a probe copy did not finish within {deadline_s:.0f} s")


def probe_staging(gpus: GpuSet, src: int, dst: int, *, nbytes: int = 64 << 20,
                  spin_ms: float = 50.0) -> dict[str, Any]:
    """Measure on whatever peer access ``gpus`` has between ``src`` and ``dst``:
    ``gbps`` of ``cuMemcpyPeerAsync``; ``copy_alone_ms`` of one copy on an idle second
    stream; ``second_copy_ms``, the same copy enqueued right after a ``spin_ms`` kernel and
    a copy behind it on the first stream (from the kernel's launch to the second copy's
    end); ``waited_behind_kernel`` when that took at least 80 % of the kernel's time.

    Raises:
        CudaError: a driver call failed.
        TimeoutError: a copy never finished.
    """
    source, target = gpus.allocate(src, nbytes), gpus.allocate(dst, nbytes)
    src_ctx, dst_ctx = gpus.contexts[src].handle, gpus.contexts[dst].handle
    gpus.activate(src)
    first = gpus.streams[src]
    second = check("cuStreamCreate", driver.cuStreamCreate(
        int(driver.CUstream_flags.CU_STREAM_NON_BLOCKING)))
    done = check("cuEventCreate", driver.cuEventCreate(
        int(driver.CUevent_flags.CU_EVENT_DISABLE_TIMING)))

    def copy(stream: Any) -> None:
        check("cuMemcpyPeerAsync", driver.cuMemcpyPeerAsync(target, dst_ctx, source, src_ctx,
                                                            nbytes, stream))
    try:
        copy(first)
        check("cuStreamSynchronize", driver.cuStreamSynchronize(first))
        started = time.perf_counter()
        for _ in range(_COPIES):
            copy(first)
        check("cuStreamSynchronize", driver.cuStreamSynchronize(first))
        gbps = nbytes * _COPIES / (time.perf_counter() - started) / 1e9

        started = time.perf_counter()
        copy(second)
        check("cuEventRecord", driver.cuEventRecord(done, second))
        alone_ms = (_poll_done(done, 60.0) - started) * 1e3

        started = time.perf_counter()
        gpus.spin(src, int(spin_ms * 1e6), first)
        copy(first)                      # queued behind the kernel
        copy(second)                     # independent of both, on another stream
        check("cuEventRecord", driver.cuEventRecord(done, second))
        second_ms = (_poll_done(done, 60.0 + spin_ms / 1e3) - started) * 1e3
        check("cuStreamSynchronize", driver.cuStreamSynchronize(first))
    finally:
        gpus.activate(src)
        driver.cuEventDestroy(done)
        driver.cuStreamDestroy(second)
    return {"src": src, "dst": dst, "bytes": nbytes, "gbps": round(gbps, 2),
            "copy_alone_ms": round(alone_ms, 3), "spin_ms": spin_ms,
            "second_copy_ms": round(second_ms, 3),
            "waited_behind_kernel": second_ms >= 0.8 * spin_ms}


def probe_pair(nbytes: int = 64 << 20, spin_ms: float = 50.0) -> dict[str, Any]:
    """GPUs 0 and 1 of this process: ``probe_staging`` 0 -> 1 with peer access never
    enabled, then with it enabled (and disabled again after): what host staging costs on
    this node, and whether enabling peer access really makes copies go peer to peer.

    Raises:
        ValueError: fewer than 2 GPUs are visible.
        CudaError / TimeoutError: as ``probe_staging``.
    """
    from .gpus import visible_gpus
    from .peer_access import disable_peer_access, enable_peer_access

    count = visible_gpus()
    if count < 2:
        raise ValueError(f"the staging probe needs 2 GPUs in one process; {count} visible")
    with GpuSet(2) as gpus:
        staged = probe_staging(gpus, 0, 1, nbytes=nbytes, spin_ms=spin_ms)
        pairs = enable_peer_access(gpus)
        try:
            enabled = all(pair.enabled for pair in pairs)
            direct = probe_staging(gpus, 0, 1, nbytes=nbytes, spin_ms=spin_ms) if enabled \
                else {"error": "; ".join(p.reason for p in pairs if not p.enabled)}
        finally:
            disable_peer_access(gpus, pairs)
    return {"pair": [0, 1], "without_peer_access": staged, "with_peer_access": direct}


def main(argv: list[str] | None = None) -> int:
    """``python -m ipcshare.p2p.staging_probe [--bytes N]``: ``probe_pair`` as one JSON
    line on stdout (doctor runs it in a process of its own, so the probe's contexts and
    peer mappings never touch the doctor's); exit status 2 with the reason on stderr."""
    import argparse
    import json
    import sys

    parser = argparse.ArgumentParser(description=probe_pair.__doc__.splitlines()[0])
    parser.add_argument("--bytes", type=int, default=64 << 20)
    parser.add_argument("--spin-ms", type=float, default=50.0)
    args = parser.parse_args(argv)
    try:
        print(json.dumps(probe_pair(args.bytes, args.spin_ms)))
    except Exception as exc:  # reported to the caller, who records it as the probe's result
        sys.stderr.write(f"{type(exc).__name__}: {exc}\n")
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
