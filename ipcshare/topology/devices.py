"""GPU binding and facts: which device a rank uses, what each device is, how devices
reach each other, and which shareable handle types really work (probed, not assumed)."""

from __future__ import annotations

import dataclasses
import os
from typing import Any, NamedTuple

from ..runtime import cuda_driver
from ..runtime.errors import BackendUnavailable, ConfigError, CudaError
from ..runtime.gpu_names import format_uuid
from ..runtime.settings import disabled_p2p_pairs, max_ranks_per_gpu

__all__ = [
    "bind_device",
    "ranks_sharing",
    "max_ranks_per_gpu",
    "describe_devices",
    "p2p_matrix",
    "peer_access",
    "peer_reach",
    "PeerAccess",
    "handle_support",
    "probe_vmm_handle",
    "HandleProbe",
    "FABRIC_REFUSED_REASON",
]

# Why a fabric allocation is refused on a node without IMEX: the one spelling of it.
FABRIC_REFUSED_REASON = "no IMEX channel"


def ranks_sharing(ordinal: int, local_size: int, count: int) -> int:
    """How many of the node's ``local_size`` ranks bind to ``ordinal`` when ranks are
    dealt round-robin over ``count`` devices (at least 1)."""
    return max(1, len(range(ordinal, local_size, count)))


def bind_device(local_rank: int, local_size: int) -> int:
    """The device ordinal of this rank: ``local_rank % device_count``.

    CUDA_VISIBLE_DEVICES is applied by the driver, so ordinals are the visible ones.
    All ranks of a node are assumed to see the same devices.

    Raises:
        BackendUnavailable: no device is visible.
        ConfigError: more ranks would share one GPU than IPCSHARE_MAX_RANKS_PER_GPU allows.
        CudaError: the driver failed.
    """
    count = cuda_driver.device_count()
    if count == 0:
        raise BackendUnavailable("no CUDA device is visible to this process")
    ordinal = local_rank % count
    limit = max_ranks_per_gpu()
    sharing = ranks_sharing(ordinal, local_size, count)
    if limit is not None and sharing > limit:
        raise ConfigError(
            f"{sharing} ranks would share GPU {ordinal}; at most {limit} allowed "
            f"(IPCSHARE_MAX_RANKS_PER_GPU; {local_size} ranks on this node, {count} GPUs visible)")
    return ordinal


def describe_devices() -> list[dict[str, Any]]:
    """One dict per visible device: index, name, uuid, pci_bus_id, memory (bytes).

    Raises:
        CudaError: the driver failed.
    """
    return [
        {"index": ordinal, "name": cuda_driver.device_name(ordinal),
         "uuid": format_uuid(cuda_driver.device_uuid(ordinal)),
         "pci_bus_id": cuda_driver.pci_bus_id(ordinal),
         "memory": cuda_driver.total_memory(ordinal)}
        for ordinal in range(cuda_driver.device_count())
    ]


class PeerAccess(NamedTuple):
    """Whether one GPU may map another's memory (``ok``), why not (``why``), and whether
    the user's IPCSHARE_DISABLE_P2P is the reason (``disabled_by_setting``: a fact for
    readers such as the doctor, not a phrase to look for in ``why``)."""

    ok: bool
    why: str = ""
    disabled_by_setting: bool = False


def peer_access(src: int, dst: int) -> PeerAccess:
    """Whether ``src`` may map ``dst``'s memory, and why not when it may not."""
    if frozenset((src, dst)) in disabled_p2p_pairs():
        return PeerAccess(False, "disabled by IPCSHARE_DISABLE_P2P", disabled_by_setting=True)
    if not cuda_driver.can_access_peer(src, dst):
        return PeerAccess(False,
                          "cuDeviceCanAccessPeer -> 0: no NVLink or PCIe P2P path between them")
    return PeerAccess(True)


def peer_reach(ordinal: int, uuids: list[bytes | None]) -> list[PeerAccess]:
    """For each device UUID in ``uuids`` (one per rank of the node): whether ``ordinal``
    may map memory on it, and why not. The same device always may; a device this process
    cannot see (another CUDA_VISIBLE_DEVICES) counts as reachable, for the driver to judge
    when the window maps it.

    Raises:
        CudaError: the driver failed.
    """
    own = cuda_driver.device_uuid(ordinal)
    visible = {cuda_driver.device_uuid(o): o for o in range(cuda_driver.device_count())}
    facts = []
    for uuid in uuids:
        peer = visible.get(uuid) if uuid is not None else None
        if uuid == own or peer is None:
            facts.append(PeerAccess(True))
        else:
            facts.append(peer_access(ordinal, peer))
    return facts


def p2p_matrix() -> list[dict[str, Any]]:
    """For every ordered pair of distinct devices: whether src can access dst's memory,
    whether native atomics work over the link, and the link's performance rank.

    Raises:
        CudaError: the driver failed.
    """
    count = cuda_driver.device_count()
    pairs = []
    for src in range(count):
        for dst in range(count):
            if src == dst:
                continue
            access = peer_access(src, dst)
            pairs.append({
                "src": src, "dst": dst,
                "access": bool(cuda_driver.p2p_attribute("ACCESS_SUPPORTED", src, dst))
                          and access.ok,
                "why": access.why,
                "native_atomics": bool(
                    cuda_driver.p2p_attribute("NATIVE_ATOMIC_SUPPORTED", src, dst)),
                "perf_rank": cuda_driver.p2p_attribute("PERFORMANCE_RANK", src, dst),
            })
    return pairs


@dataclasses.dataclass(frozen=True)
class HandleProbe:
    """Outcome of a real allocate-and-export of one handle type.

    ``ok`` when both worked; otherwise ``call`` failed with ``error`` (a CUDA error
    name, or a sentence when a device attribute already says no and ``call`` is None).
    """

    handle: str
    ok: bool
    call: str | None = None
    error: str | None = None

    def describe(self) -> str:
        """``'ok'``, ``'unsupported: ...'`` or ``'refused: CUDA_ERROR_X (why)'``."""
        if self.ok:
            return "ok"
        if self.call is None:
            return f"unsupported: {self.error}"
        why = ""
        if self.handle == "fabric" and self.error == "CUDA_ERROR_NOT_PERMITTED":
            why = f" ({FABRIC_REFUSED_REASON})"
        return f"refused: {self.error}{why}"

    def as_error(self) -> CudaError | None:
        """The refusal as the CudaError of its call (None when no call failed): the cause
        that errors about this handle type cite, the CUDA error name as a field."""
        if self.ok or self.call is None:
            return None
        return CudaError(f"{self.call} -> {self.error}", call=self.call, error_name=self.error)


_SUPPORT_ATTRIBUTE = {
    "posix-fd": "HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED",
    "fabric": "HANDLE_TYPE_FABRIC_SUPPORTED",
}


def probe_vmm_handle(ordinal: int, handle: str) -> HandleProbe:
    """Allocate one granule with cuMemCreate for ``handle`` and export it, then free
    it. Needs ``ordinal``'s context current. Attributes can claim support that the node
    then refuses (fabric without IMEX), hence the real allocation.

    Raises:
        ConfigError: unknown handle name.
        CudaError: a driver failure other than the allocation or export being refused.
    """
    if handle not in cuda_driver.HANDLE_TYPES:
        raise ConfigError(f"unknown handle type {handle!r}; choose one of: "
                          f"{', '.join(cuda_driver.HANDLE_TYPES)}")
    driver = cuda_driver.driver
    if not cuda_driver.device_attribute(ordinal, "VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED"):
        return HandleProbe(handle, False, None,
                           "the device does not support virtual memory management")
    if not cuda_driver.device_attribute(ordinal, _SUPPORT_ATTRIBUTE[handle]):
        return HandleProbe(handle, False, None,
                           f"device attribute {_SUPPORT_ATTRIBUTE[handle]} is 0")
    prop = cuda_driver.vmm_allocation_prop(ordinal, handle)
    size = cuda_driver.vmm_granularity(prop, recommended=False)
    err, allocation = driver.cuMemCreate(size, prop, 0)
    if err != cuda_driver.SUCCESS:
        return HandleProbe(handle, False, "cuMemCreate", cuda_driver.error_name(err))
    try:
        exported = driver.cuMemExportToShareableHandle(
            allocation, cuda_driver.handle_type(handle), 0)
        if exported[0] != cuda_driver.SUCCESS:
            return HandleProbe(handle, False, "cuMemExportToShareableHandle",
                               cuda_driver.error_name(exported[0]))
        if handle == "posix-fd":
            os.close(int(exported[1]))
        return HandleProbe(handle, True)
    finally:
        cuda_driver.check("cuMemRelease", driver.cuMemRelease(allocation))


def _probe_legacy_ipc() -> HandleProbe:
    driver = cuda_driver.driver
    err, pointer = driver.cuMemAlloc(2 << 20)
    if err != cuda_driver.SUCCESS:
        return HandleProbe("cuda-ipc", False, "cuMemAlloc", cuda_driver.error_name(err))
    try:
        err, _handle = driver.cuIpcGetMemHandle(pointer)
        if err != cuda_driver.SUCCESS:
            return HandleProbe("cuda-ipc", False, "cuIpcGetMemHandle", cuda_driver.error_name(err))
        return HandleProbe("cuda-ipc", True)
    finally:
        cuda_driver.check("cuMemFree", driver.cuMemFree(pointer))


def handle_support(ordinal: int) -> dict[str, str]:
    """Which ways of sharing ``ordinal``'s memory work, each probed with a real small
    allocation: ``{'cuda-ipc': 'ok', 'posix-fd': 'ok',
    'fabric': 'refused: CUDA_ERROR_NOT_PERMITTED (no IMEX channel)'}``.

    Raises:
        CudaError: the driver failed outside the probes themselves (no context...).
    """
    results: dict[str, str] = {}
    with cuda_driver.primary_context(ordinal):
        for name, probe in (("cuda-ipc", _probe_legacy_ipc),
                            ("posix-fd", lambda: probe_vmm_handle(ordinal, "posix-fd")),
                            ("fabric", lambda: probe_vmm_handle(ordinal, "fabric"))):
            try:
                results[name] = probe().describe()
            except CudaError as exc:
                results[name] = f"error: {exc}"
    return results
