"""Limits, found by pushing until something gives (always within a bound): how many
windows (and so peer imports) one process holds, how long each takes, the largest
allocation that exports, the GPU's granularity and virtual-address headroom, and
whether closing everything gives every descriptor, mapping and byte back.
"""

from __future__ import annotations

import time
from typing import Any

from ..runtime.errors import IpcShareError
from .environment import mapping_counts, open_fd_count
from .paths import PathSpec, describe_failure, open_group
from .plan import GPU_MEMORY_SLACK, MAPPINGS_SLACK

__all__ = [
    "resource_snapshot",
    "compare_snapshots",
    "probe_window_limit",
    "probe_largest_export",
    "probe_gpu_memory_facts",
    "WINDOW_BYTES",
]

# The smallest useful window: backends round it up to their granularity anyway.
WINDOW_BYTES = 64
_VA_START = 1 << 30


def resource_snapshot(gpu_ordinal: int | None = None) -> dict[str, Any]:
    """Descriptors, mappings (all, and ipcshare's memfd ones) and, with a GPU, its free
    memory as this process sees them now."""
    snapshot: dict[str, Any] = {"fds": open_fd_count(), "mappings": mapping_counts()}
    if gpu_ordinal is not None:
        try:
            from ..runtime import cuda_driver

            with cuda_driver.primary_context(gpu_ordinal):
                snapshot["gpu_free"] = cuda_driver.mem_get_info()[0]
        except Exception as exc:
            snapshot["gpu_error"] = f"{type(exc).__name__}: {exc}"
    return snapshot


def compare_snapshots(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """What grew between two snapshots, and whether that is a leak: any descriptor,
    any ipcshare mapping, more than MAPPINGS_SLACK other mappings, or more than
    GPU_MEMORY_SLACK of device memory."""
    grown: dict[str, int] = {}
    if before.get("fds") is not None and after.get("fds") is not None:
        grown["fds"] = after["fds"] - before["fds"]
    if before.get("mappings") and after.get("mappings"):
        grown["mappings"] = after["mappings"]["total"] - before["mappings"]["total"]
        grown["ipcshare_mappings"] = (after["mappings"]["ipcshare"]
                                      - before["mappings"]["ipcshare"])
    if "gpu_free" in before and "gpu_free" in after:
        grown["gpu_bytes"] = before["gpu_free"] - after["gpu_free"]
    leaks = []
    if grown.get("fds", 0) > 0:
        leaks.append(f"{grown['fds']} descriptor(s)")
    if grown.get("ipcshare_mappings", 0) > 0:
        leaks.append(f"{grown['ipcshare_mappings']} shared-memory mapping(s)")
    if grown.get("mappings", 0) > MAPPINGS_SLACK:
        leaks.append(f"{grown['mappings']} mapping(s)")
    if grown.get("gpu_bytes", 0) > GPU_MEMORY_SLACK:
        leaks.append(f"{grown['gpu_bytes']} bytes of GPU memory")
    return {"before": before, "after": after, "grown": grown, "leak": bool(leaks),
            "leaked": leaks}


def probe_window_limit(spec: PathSpec, comm: Any, members: list[int], *, bound: int,
                       budget_s: float, timeout: float, world_rank: int) -> dict[str, Any]:
    """Collective over the node's ``comm``: open small windows on ``spec`` and hold them
    until one fails, ``bound`` are held or ``budget_s`` has passed (rank 0 of ``comm``
    keeps the clock, so all ranks stop together), then close them all.

    Returns windows held, peer imports held per process, time per window and per
    import, and why it stopped (``bound``, ``time budget`` or ``failure`` with the
    failing step and message).
    """
    me, count = comm.Get_rank(), comm.Get_size()
    result: dict[str, Any] = {"path": spec.name, "bound": bound, "windows": 0, "imports": 0}
    try:
        group = open_group(spec, comm, timeout=timeout, world_rank=world_rank)
    except IpcShareError as exc:
        result.update(stopped="failure", failure=describe_failure(exc, members))
        return result
    windows = []
    try:
        started = time.perf_counter()
        opening = 0.0
        stopped = "bound"
        while len(windows) < bound:
            in_budget = time.perf_counter() - started < budget_s if me == 0 else None
            if not comm.bcast(in_budget, root=0):
                stopped = "time budget"
                break
            tick = time.perf_counter()
            try:
                windows.append(group.window(WINDOW_BYTES))
            except IpcShareError as exc:
                stopped = "failure"
                result["failure"] = describe_failure(exc, members)
                break
            opening += time.perf_counter() - tick
        held = len(windows)
        # Memory behind each window on every rank: data, signal pad, granularity rounding.
        window_bytes = windows[0].total_bytes if windows else None
        tick = time.perf_counter()
        while windows:
            windows.pop().close()
        closing = time.perf_counter() - tick
        result.update(stopped=stopped, windows=held, imports=held * (count - 1),
                      window_bytes=window_bytes)
        if held:
            result["ms_per_window"] = round(opening / held * 1e3, 3)
            result["ms_per_close"] = round(closing / held * 1e3, 3)
            if count > 1:
                result["us_per_import"] = round(opening / (held * (count - 1)) * 1e6, 1)
    finally:
        try:
            while windows:
                windows.pop().close()
        finally:
            group.close()
    return result


def _try_export(backend: Any, nbytes: int) -> str | None:
    """Allocate and export ``nbytes``, then free both; the error text when it fails."""
    try:
        allocation = backend.allocate(nbytes)
    except Exception as exc:
        return f"allocate: {type(exc).__name__}: {exc}"
    try:
        backend.export(allocation).close()
    except Exception as exc:
        return f"export: {type(exc).__name__}: {exc}"
    finally:
        allocation.close()
    return None


def probe_largest_export(spec: PathSpec, *, local_rank: int, local_size: int, cap: int,
                         bisect_steps: int) -> dict[str, Any]:
    """This rank alone: the largest allocation of ``spec``'s backend that allocates and
    exports, doubling from one granule up to ``cap`` (at most half of this rank's share
    of free memory), then bisecting ``bisect_steps`` times below the first failure."""
    from ..backends import open_backend

    try:
        backend = open_backend(spec.backend, local_rank=local_rank, local_size=local_size,
                               handle=spec.handle)
    except Exception as exc:
        return {"path": spec.name, "error": f"{type(exc).__name__}: {exc}"}
    try:
        granule = backend.granularity
        capacity = backend.capacity_bytes()
        if capacity is not None:
            cap = min(cap, max(granule, capacity // max(local_size, 1) // 2))
        best, failed_at, error = 0, None, None
        size = granule
        while size <= cap:
            error = _try_export(backend, size)
            if error:
                failed_at = size
                break
            best, size = size, size * 2
        for _ in range(bisect_steps if failed_at else 0):
            middle = (best + failed_at) // 2 // granule * granule
            if middle <= best:
                break
            attempt = _try_export(backend, middle)
            if attempt:
                failed_at, error = middle, attempt
            else:
                best = middle
        result: dict[str, Any] = {"path": spec.name, "largest": best, "cap": cap,
                                  "granularity": granule}
        if failed_at:
            result.update(stopped="failure", failed_at=failed_at, error=error)
        else:
            result["stopped"] = "cap"
        return result
    finally:
        backend.close()


def probe_gpu_memory_facts(ordinal: int, *, va_cap: int) -> dict[str, Any]:
    """Granularity of cuMem allocations (minimum and recommended) and the largest
    virtual range cuMemAddressReserve grants, doubling from 1 GiB up to ``va_cap``."""
    from ..runtime import cuda_driver

    driver = cuda_driver.driver
    facts: dict[str, Any] = {}
    try:
        with cuda_driver.primary_context(ordinal):
            prop = cuda_driver.vmm_allocation_prop(ordinal, "posix-fd")
            facts["granularity_min"] = cuda_driver.vmm_granularity(prop, recommended=False)
            facts["granularity_recommended"] = cuda_driver.vmm_granularity(prop)
            best, size = 0, _VA_START
            while size <= va_cap:
                err, pointer = driver.cuMemAddressReserve(size, 0, 0, 0)
                if err != cuda_driver.SUCCESS:
                    facts.update(va_refused_at=size, va_error=cuda_driver.error_name(err))
                    break
                cuda_driver.check("cuMemAddressFree", driver.cuMemAddressFree(pointer, size))
                best, size = size, size * 2
            facts["va_largest"] = best
            facts["va_cap"] = va_cap
    except Exception as exc:
        facts["error"] = f"{type(exc).__name__}: {exc}"
    return facts
