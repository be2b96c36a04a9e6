"""Legacy CUDA IPC: cuMemAlloc'd buffers shared as 64-byte cuIpcMemHandles (opaque bytes
that travel by MPI), opened with cuIpcOpenMemHandle."""

from __future__ import annotations

from ..runtime.errors import BackendError
from ..runtime.owned_fd import OwnedFd
from .base import Allocation, Exported
from .device_backend import DeviceBackend
from .device_buffer import DeviceAllocation
from .ipc_handle import (
    IPC_HEADER,
    IPC_PAYLOAD_BYTES,
    IpcHandleInfo,
    legacy_ipc_payload,
    parse_ipc_handle,
)

__all__ = ["CudaIpcBackend", "IpcHandleInfo", "parse_ipc_handle",
           "legacy_ipc_payload",
           "IPC_HEADER", "IPC_PAYLOAD_BYTES"]

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
        return self.allocate_private(nbytes, what="cuda-ipc allocation")

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
