"""cuMem virtual memory management: cuMemCreate'd memory shared as a POSIX file
descriptor (through the exchange's descriptor path) or a fabric handle (opaque bytes,
where an IMEX channel permits), mapped with cuMemAddressReserve + cuMemMap.

Multi-step setup registers each step's undo as it succeeds and disarms them at the
end, so a failure half-way releases everything. NVLink multicast is never used.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Callable
from typing import Any

from ..runtime import cuda_driver
from ..runtime.cuda_driver import SUCCESS, check, cuda_error, driver, error_name
from ..runtime.errors import BackendError, BackendUnavailable, ConfigError
from ..runtime.gpu_names import format_uuid
from ..runtime.owned_fd import OwnedFd
from ..topology import devices
from .base import Allocation, Exported
from .device_backend import DeviceBackend
from .device_buffer import DeviceAllocation
from .fabric_import import fabric_import_hint
from .vmm_handle import (
    FABRIC_HANDLE_BYTES,
    VMM_HEADER,
    VmmHandleInfo,
    pack_vmm_header,
    parse_vmm_handle,
)
from .vmm_mapping import SharedRange, map_handle, mapping_releaser, open_posix_fd, undo_quietly

__all__ = ["CudaVmmBackend", "VmmAllocation", "VmmHandleInfo", "parse_vmm_handle", "map_handle",
           "open_posix_fd",
           "VMM_HEADER", "FABRIC_REFUSED_MESSAGE"]

FABRIC_REFUSED_MESSAGE = (
    "fabric handles refused: CUDA_ERROR_NOT_PERMITTED \u2014 no IMEX channel on this node "
    "(needs nvidia-imex and /dev/nvidia-caps-imex-channels); use --handle posix-fd")


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


class VmmAllocation(DeviceAllocation):
    """A cuMemCreate allocation mapped here; keeps its handle for export."""

    def __init__(self, ptr: int, nbytes: int, device: int, release: Callable[[], None], *,
                 handle: Any, size: int, number: int) -> None:
        super().__init__(ptr, nbytes, device, release, what="cuda-vmm allocation")
        self.handle = handle
        self.size = size
        self.number = number


class CudaVmmBackend(DeviceBackend):
    """cuMemCreate memory exported as ``posix-fd`` (descriptors) or ``fabric`` (bytes).

    The handle type is checked at construction with a real allocation and export:
    device attributes can claim fabric support that the node then refuses.

    Raises:
        ConfigError: unknown handle type.
        BackendUnavailable: VMM or the handle type does not work here (fabric without
            IMEX says so and suggests ``--handle posix-fd``).
        CudaError: the driver failed.
    """

    name = "cuda-vmm"
    uses_fds = True

    def __init__(self, *, local_rank: int = 0, local_size: int = 1,
                 handle: str = "posix-fd") -> None:
        if handle not in cuda_driver.HANDLE_TYPES:
            raise ConfigError(f"unknown handle type {handle!r}; choose one of: "
                              f"{', '.join(cuda_driver.HANDLE_TYPES)}")
        super().__init__(local_rank=local_rank, local_size=local_size)
        try:
            self.handle = handle
            self.uses_fds = handle == "posix-fd"
            self._handle_type = cuda_driver.handle_type(handle)
            self._prop = cuda_driver.vmm_allocation_prop(self.device, handle)
            self._access = [cuda_driver.vmm_access_desc(self.device)]
            probe = devices.probe_vmm_handle(self.device, handle)
            if not probe.ok:
                # The refused call is the cause: its CUDA error name travels as a field.
                if handle == "fabric" and probe.error == "CUDA_ERROR_NOT_PERMITTED":
                    raise BackendUnavailable(FABRIC_REFUSED_MESSAGE) from probe.as_error()
                raise BackendUnavailable(
                    f"cuMem {handle} handles do not work on cuda:{self.device}: "
                    f"{probe.describe()}{' (' + probe.call + ')' if probe.call else ''}"
                ) from probe.as_error()
            self.granularity = cuda_driver.vmm_granularity(self._prop, recommended=True)
            self._pid = os.getpid()
            self._numbers = itertools.count(1)
        except BaseException:
            self.close()
            raise

    # -- memory --------------------------------------------------------------------
    def _map(self, handle: Any, size: int, undo: contextlib.ExitStack) -> int:
        return map_handle(handle, size, self.granularity, self._access, undo)

    def allocate(self, nbytes: int) -> VmmAllocation:
        """cuMemCreate + reserve + map + set access, all undone on a failure half-way.

        Raises:
            CudaError: the failing step (out of memory, ...).
        """
        size = _round_up(max(nbytes, 1), self.granularity)
        self._context.make_current()
        with contextlib.ExitStack() as undo:
            handle = check("cuMemCreate", driver.cuMemCreate(size, self._prop, 0))
            undo.callback(undo_quietly, driver.cuMemRelease, handle)
            ptr = self._map(handle, size, undo)
            undo.pop_all()
        # The release closure holds plain values, never the backend or the allocation.
        return VmmAllocation(ptr, nbytes, self.device, mapping_releaser(ptr, size, handle),
                             handle=handle, size=size,
                             number=next(self._numbers))

    def export(self, allocation: Allocation) -> Exported:
        """A header naming the allocation, plus its descriptor (posix-fd) or fabric
        handle bytes.

        Raises:
            BackendError: not an open allocation of this backend.
            CudaError: cuMemExportToShareableHandle failed.
        """
        if not isinstance(allocation, VmmAllocation) or allocation.closed:
            raise BackendError("cuda-vmm can only export its own open allocations")
        self._context.make_current()
        header = pack_vmm_header(allocation.nbytes, allocation.size, self.handle, self.uuid,
                                 self._pid, allocation.number)
        shared = check("cuMemExportToShareableHandle",
                       driver.cuMemExportToShareableHandle(allocation.handle, self._handle_type, 0))
        if self.handle == "posix-fd":
            return Exported(payload=header, fd=OwnedFd(int(shared)))
        raw = bytes(shared.data)
        if len(raw) != FABRIC_HANDLE_BYTES:
            raise BackendError(f"cuMemExportToShareableHandle gave a {len(raw)}-byte fabric "
                               f"handle, expected {FABRIC_HANDLE_BYTES}")
        return Exported(payload=header + raw)

    def import_peers(self, peers: list[tuple[bytes, OwnedFd | None]],
                     nbytes: int) -> list[Allocation]:
        """Map every peer of a window into ONE reserved virtual range, with one
        cuMemSetAccess for all of them; each peer's mapping is released on its own and
        the range goes with the last one. Everything is undone on a failure half-way.

        Raises:
            BackendError / CudaError: as ``import_peer``.
        """
        if not peers:
            return []
        infos = [self._validate(payload, fd, nbytes) for payload, fd in peers]
        self._context.make_current()
        for info in infos:
            self._check_peer_reachable(info.device_uuid)
        total = sum(info.size for info in infos)
        with contextlib.ExitStack() as undo:
            base = int(check("cuMemAddressReserve",
                             driver.cuMemAddressReserve(total, self.granularity, 0, 0)))
            undo.callback(undo_quietly, driver.cuMemAddressFree, base, total)
            placed = []
            offset = 0
            for info, (_payload, fd) in zip(infos, peers, strict=True):
                handle = self._import_handle(info, fd)
                undo.callback(undo_quietly, driver.cuMemRelease, handle)
                check("cuMemMap", driver.cuMemMap(base + offset, info.size, 0, handle, 0))
                undo.callback(undo_quietly, driver.cuMemUnmap, base + offset, info.size)
                placed.append((base + offset, info.size, handle))
                offset += info.size
            err, = driver.cuMemSetAccess(base, total, self._access, len(self._access))
            if err:  # a driver that wants one call per mapping: grant them one by one
                for ptr, size, _handle in placed:
                    check("cuMemSetAccess",
                          driver.cuMemSetAccess(ptr, size, self._access, len(self._access)))
            undo.pop_all()
        shared = SharedRange(base, total, len(placed))
        return [DeviceAllocation(ptr, nbytes, self.device, shared.releaser(ptr, size, handle),
                                 what="cuda-vmm peer mapping")
                for ptr, size, handle in placed]

    def _validate(self, payload: bytes, fd: OwnedFd | None, nbytes: int) -> VmmHandleInfo:
        info = parse_vmm_handle(payload)
        if info.nbytes != nbytes:
            raise BackendError(f"peer announced {info.nbytes} bytes, the window has {nbytes}")
        if info.handle != self.handle:
            raise BackendError(
                f"peer exported a {info.handle} handle, this rank uses {self.handle}")
        if info.size % self.granularity:
            raise BackendError(f"peer mapping of {info.size} bytes is not a multiple of this "
                               f"device's granularity {self.granularity}")
        if info.handle == "posix-fd" and fd is None:
            raise BackendError("cuda-vmm posix-fd handle arrived without its descriptor")
        return info

    def _import_handle(self, info: VmmHandleInfo, fd: OwnedFd | None) -> Any:
        if info.handle == "posix-fd":
            assert fd is not None
            # The binding passes an int as (void*)fd, as C does.
            return check("cuMemImportFromShareableHandle",
                         driver.cuMemImportFromShareableHandle(fd.fileno(), self._handle_type))
        fabric = driver.CUmemFabricHandle()
        fabric.data = info.fabric
        # getPtr() is the address of the 64 bytes; ``fabric`` keeps them alive meanwhile.
        err, *handle = driver.cuMemImportFromShareableHandle(fabric.getPtr(), self._handle_type)
        if err != SUCCESS:
            # The driver's words ("invalid resource handle") name neither cause nor fix.
            exporter = f"GPU {format_uuid(info.device_uuid)}"
            raise cuda_error("cuMemImportFromShareableHandle", err,
                             then=": " + fabric_import_hint(error_name(err), exporter=exporter))
        return handle[0]

    def import_peer(self, payload: bytes, fd: OwnedFd | None, nbytes: int) -> DeviceAllocation:
        """Import and map a peer's allocation (once per distinct allocation; later
        imports share the mapping). The caller closes ``fd`` afterwards.

        Raises:
            BackendError: malformed payload, wrong handle type, size mismatch, missing
                descriptor, or GPUs without P2P.
            CudaError: import, reserve, map or set-access failed (all undone).
        """
        info = self._validate(payload, fd, nbytes)
        self._context.make_current()
        self._check_peer_reachable(info.device_uuid)
        return self._imports.acquire(info.key, lambda: self._open_peer(info, fd), nbytes,
                                     self.device, what="cuda-vmm peer mapping")

    def _open_peer(self, info: VmmHandleInfo, fd: OwnedFd | None) -> tuple[int, int, Callable]:
        with contextlib.ExitStack() as undo:
            handle = self._import_handle(info, fd)
            undo.callback(undo_quietly, driver.cuMemRelease, handle)
            ptr = self._map(handle, info.size, undo)
            undo.pop_all()
        return ptr, info.size, mapping_releaser(ptr, info.size, handle)
