"""Legacy CUDA IPC: cuMemAlloc'd buffers shared as 64-byte cuIpcMemHandles (opaque bytes
that travel by MPI), opened with cuIpcOpenMemHandle."""

from __future__ import annotations

import dataclasses
import functools
import struct

from ..errors import BackendError
from ..runtime.cuda_driver import check, driver
from ..runtime.owned_fd import OwnedFd
from .base import Allocation, Exported
from .device_backend import DeviceBackend
from .device_buffer import DeviceAllocation

__all__ = ["CudaIpcBackend", "IpcHandleInfo", "parse_ipc_handle",
           "legacy_ipc_payload",
           "IPC_HEADER", "IPC_PAYLOAD_BYTES"]

# magic, format version, bytes, exporter's device UUID; the 64-byte handle follows.
IPC_HEADER = struct.Struct("!4sHQ16s")
_MAGIC = b"IPCC"
_VERSION = 1
_IPC_HANDLE_BYTES = 64
IPC_PAYLOAD_BYTES = IPC_HEADER.size + _IPC_HANDLE_BYTES


def _free(ptr: int) -> None:
    check("cuMemFree", driver.cuMemFree(ptr))


def legacy_ipc_payload(base: int, nbytes: int, device_uuid: bytes) -> bytes:
    """The cuda-ipc payload of the cudaMalloc allocation starting at ``base``: a header
    and its cuIpcMemHandle (the current context must be ``base``'s).

    Raises:
        BackendError: the driver gave a handle of an unexpected size.
        CudaError: cuIpcGetMemHandle failed.
    """
    handle = check("cuIpcGetMemHandle", driver.cuIpcGetMemHandle(base))
    raw = bytes(handle.reserved)
    if len(raw) != _IPC_HANDLE_BYTES:
        raise BackendError(
            f"cuIpcGetMemHandle gave {len(raw)} bytes, expected {_IPC_HANDLE_BYTES}")
    return IPC_HEADER.pack(_MAGIC, _VERSION, nbytes, device_uuid) + raw


@dataclasses.dataclass(frozen=True)
class IpcHandleInfo:
    """A parsed cuda-ipc payload."""

    nbytes: int
    device_uuid: bytes
    handle: bytes


def parse_ipc_handle(payload: bytes) -> IpcHandleInfo:
    """Validate and split a cuda-ipc payload.

    Raises:
        BackendError: wrong length, magic or version.
    """
    payload = bytes(payload)
    if len(payload) != IPC_PAYLOAD_BYTES:
        raise BackendError(
            f"cuda-ipc handle has {len(payload)} bytes, expected {IPC_PAYLOAD_BYTES}")
    magic, version, nbytes, uuid = IPC_HEADER.unpack_from(payload)
    if magic != _MAGIC:
        raise BackendError("cuda-ipc handle has a bad magic number (not an ipcshare cuda-ipc "
                           "handle: do all ranks use the same backend?)")
    if version != _VERSION:
        raise BackendError(
            f"cuda-ipc handle format {version} is not supported (expected {_VERSION})")
    return IpcHandleInfo(nbytes, uuid, payload[IPC_HEADER.size:])


class CudaIpcBackend(DeviceBackend):
    """cuMemAlloc memory shared with legacy cudaIpc handles (bytes only, no descriptor).

    Works between processes on the same GPU and between P2P-capable GPUs.
    """

    name = "cuda-ipc"
    uses_fds = False
    # Measured on H200s (driver 580): cuIpcOpenMemHandle returns
    # CUDA_ERROR_INVALID_CONTEXT in another PID namespace.
    crosses_pid_namespaces = False
    # cuMemAlloc needs no rounding, but window regions then start on the large-page
    # boundary the driver uses for big allocations anyway.
    granularity = 2 << 20

    def allocate(self, nbytes: int) -> DeviceAllocation:
        """cuMemAlloc ``nbytes`` (256-byte aligned or better).

        Raises:
            CudaError: out of memory, or another driver failure.
        """
        self._context.make_current()
        ptr = int(check("cuMemAlloc", driver.cuMemAlloc(nbytes)))
        return DeviceAllocation(ptr, nbytes, self.device, functools.partial(_free, ptr),
                                what="cuda-ipc allocation")

    def export(self, allocation: Allocation) -> Exported:
        """The allocation's cuIpcMemHandle behind a small header.

        Raises:
            BackendError: not an allocation of this backend, or a closed one.
            CudaError: cuIpcGetMemHandle failed.
        """
        if not isinstance(allocation, DeviceAllocation) or allocation.closed:
            raise BackendError("cuda-ipc can only export its own open allocations")
        self._context.make_current()
        return Exported(payload=legacy_ipc_payload(allocation.ptr, allocation.nbytes, self.uuid))

    def import_peer(self, payload: bytes, fd: OwnedFd | None, nbytes: int) -> DeviceAllocation:
        """Open a peer's cuIpcMemHandle (once per distinct handle; later imports share it).

        Raises:
            BackendError: malformed payload, size mismatch, or GPUs without P2P.
            CudaError: cuIpcOpenMemHandle failed.
        """
        info = parse_ipc_handle(payload)
        if info.nbytes != nbytes:
            raise BackendError(f"peer announced {info.nbytes} bytes, the window has {nbytes}")
        return self.open_legacy_ipc(info, nbytes, what="cuda-ipc peer mapping")
