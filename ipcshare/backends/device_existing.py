"""Device memory the user already has, shared without a copy: a cudaMalloc block (torch's
caching allocator) by the legacy IPC handle of its allocation's base, a cuMem allocation
(torch's expandable segments, cuda.core, ipcshare's own windows) by a POSIX file
descriptor of its physical handle. Anything else is refused with the reason."""

from __future__ import annotations

import ctypes
import functools
import os
import struct
from typing import Any

from ..runtime.cuda_driver import check, driver, error_name, handle_type
from ..runtime.errors import BackendError
from ..runtime.owned_fd import OwnedFd
from .base import Exported
from .device_buffer import DeviceAllocation

__all__ = ["allocation_buffer_id", "allocation_range", "export_device_range",
           "open_device_range", "VMM_RANGE_HEADER"]

# The payload's first byte says how the allocation travels.
_LEGACY = b"L"
_VMM = b"V"
# magic, format version, mapped bytes, exporter's device UUID, exporter pid, the
# allocation's base address in the exporter (its identity for the import cache).
VMM_RANGE_HEADER = struct.Struct("!4sHQ16sIQ")
_MAGIC = b"IPCX"
_VERSION = 1
_ATTR = driver.CUpointer_attribute
_BUFFER_ID = ctypes.c_int(int(_ATTR.CU_POINTER_ATTRIBUTE_BUFFER_ID))


def _attribute(name: str, ptr: int) -> tuple[Any, Any]:
    err, value = driver.cuPointerGetAttribute(getattr(_ATTR, name), ptr)
    return err, value


@functools.cache
def _libcuda() -> ctypes.CDLL:
    return ctypes.CDLL("libcuda.so.1")


def _device_ordinal(ptr: int) -> int | None:
    """The ordinal of the GPU ``ptr`` was allocated on, or None where the driver cannot
    say. Asked of libcuda directly: cuda-bindings 13.x returns 0 for this attribute
    whatever the device (it writes a signed field and reads an unsigned one;
    NVIDIA/cuda-python#2928), which would refuse every array of any GPU but the first."""
    ordinal = ctypes.c_int(-1)
    attribute = int(_ATTR.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL)
    status = _libcuda().cuPointerGetAttribute(ctypes.byref(ordinal), ctypes.c_int(attribute),
                                              ctypes.c_uint64(ptr))
    return ordinal.value if status == 0 and ordinal.value >= 0 else None


def _check_device_memory(backend: Any, ptr: int) -> None:
    """Raise, naming why, unless ``ptr`` is device memory of ``backend``'s GPU."""
    err, kind = _attribute("CU_POINTER_ATTRIBUTE_MEMORY_TYPE", ptr)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise BackendError(f"the array at 0x{ptr:x} is not CUDA memory ({error_name(err)}): it "
                           "is host memory; pass an array on this rank's GPU")
    if int(kind) == int(driver.CUmemorytype.CU_MEMORYTYPE_HOST):
        raise BackendError(f"the array at 0x{ptr:x} is pinned host memory, not device memory: "
                           "pass an array on this rank's GPU")
    err, managed = _attribute("CU_POINTER_ATTRIBUTE_IS_MANAGED", ptr)
    if err == driver.CUresult.CUDA_SUCCESS and managed:
        raise BackendError(f"the array at 0x{ptr:x} is managed (unified) memory, which CUDA "
                           "IPC cannot share: allocate it with cudaMalloc or cuMemCreate")
    ordinal = _device_ordinal(ptr)
    if ordinal is not None and ordinal != backend.device:
        raise BackendError(f"the array at 0x{ptr:x} lives on cuda:{ordinal}, but this "
                           f"rank's group uses cuda:{backend.device}: pass an array of "
                           f"cuda:{backend.device}")


def allocation_buffer_id(ptr: int) -> int | None:
    """The driver's id of the allocation holding ``ptr`` (unique for the process's life,
    so memory freed and allocated again at the same address has another), or None where
    ``ptr`` is no CUDA memory. Asked of libcuda directly: bound calls of a time-sliced
    GPU's guests ask it every call, and this costs a fraction of the binding's call."""
    value = ctypes.c_uint64(0)
    status = _libcuda().cuPointerGetAttribute(ctypes.byref(value), _BUFFER_ID,
                                              ctypes.c_uint64(ptr))
    return int(value.value) if status == 0 else None


def allocation_range(ptr: int) -> tuple[int, int]:
    """(base, bytes) of the allocation holding ``ptr``.

    Raises:
        CudaError: ``ptr`` is no CUDA memory.
    """
    base, size = check("cuMemGetAddressRange", driver.cuMemGetAddressRange(ptr))
    return int(base), int(size)


def export_device_range(backend: Any, ptr: int, nbytes: int) -> tuple[Exported, int]:
    """Export the allocation holding ``[ptr, ptr + nbytes)`` (``backend``'s context is
    current): its payload (and descriptor for a cuMem allocation), and the array's
    offset in the allocation.

    Raises:
        BackendError: host, pinned, managed memory, another GPU's, an array spanning
            allocations, or an allocation neither legacy-IPC capable nor a cuMem one
            exportable as a POSIX descriptor (each named).
        CudaError: the export failed.
    """
    _check_device_memory(backend, ptr)
    base, size = (int(v) for v in check("cuMemGetAddressRange", driver.cuMemGetAddressRange(ptr)))
    if ptr + nbytes > base + size:
        raise BackendError(
            f"the array [0x{ptr:x}, +{nbytes}) is not contiguous in one allocation: its "
            f"allocation [0x{base:x}, +{size}) ends {ptr + nbytes - base - size} bytes before "
            "the array does (e.g. a tensor across two of torch's expandable segments); "
            "allocate it in one piece")
    err, legacy = _attribute("CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE", ptr)
    if err == driver.CUresult.CUDA_SUCCESS and legacy:
        from .ipc_handle import legacy_ipc_payload

        return Exported(payload=_LEGACY + legacy_ipc_payload(base, size, backend.uuid)), ptr - base
    err, handle = driver.cuMemRetainAllocationHandle(ptr)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise BackendError(
            f"the array at 0x{ptr:x} cannot be shared: its allocation is not legacy-IPC "
            f"capable (CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE is 0, e.g. memory of "
            f"cudaMallocAsync or a memory pool) and not a cuMem allocation "
            f"(cuMemRetainAllocationHandle -> {error_name(err)}): allocate it with cudaMalloc "
            "(torch's default allocator), cuMemCreate, or comm.empty()")
    try:
        posix = handle_type("posix-fd")
        err, allowed = _attribute("CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES", ptr)
        if err == driver.CUresult.CUDA_SUCCESS and not int(allowed) & int(posix):
            raise BackendError(
                f"the array at 0x{ptr:x} lies in a cuMem allocation created without "
                "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR in requestedHandleTypes (allowed: "
                f"0x{int(allowed):x}), so no process can import it: create it with that "
                "handle type")
        fd = OwnedFd(int(check("cuMemExportToShareableHandle",
                               driver.cuMemExportToShareableHandle(handle, posix, 0))))
    finally:
        # The exporter's mapping keeps the allocation; the retained reference is not needed.
        check("cuMemRelease", driver.cuMemRelease(handle))
    header = VMM_RANGE_HEADER.pack(_MAGIC, _VERSION, size, backend.uuid, os.getpid(), base)
    return Exported(payload=_VMM + header, fd=fd), ptr - base


def open_device_range(backend: Any, payload: bytes, fd: OwnedFd | None) -> DeviceAllocation:
    """Map a peer's exported allocation here (``backend``'s context is current), shared
    with earlier imports of the same allocation.

    Raises:
        BackendError: malformed payload, GPUs without P2P, a missing descriptor.
        CudaError: the import or map failed (undone).
    """
    payload = bytes(payload)
    kind, rest = payload[:1], payload[1:]
    if kind == _LEGACY:
        from .ipc_handle import parse_ipc_handle

        info = parse_ipc_handle(rest)
        return backend.open_legacy_ipc(info, info.nbytes, what="registered peer memory")
    if kind != _VMM or len(rest) != VMM_RANGE_HEADER.size:
        raise BackendError("not a registered device memory handle of this ipcshare version")
    magic, version, size, uuid, pid, base = VMM_RANGE_HEADER.unpack(rest)
    if magic != _MAGIC or version != _VERSION:
        raise BackendError("not a registered device memory handle of this ipcshare version")
    if fd is None:
        raise BackendError("registered cuMem memory arrived without its descriptor")
    backend._check_peer_reachable(uuid)
    from ..runtime import cuda_driver
    from .vmm_mapping import open_posix_fd

    alignment = cuda_driver.vmm_granularity(
        cuda_driver.vmm_allocation_prop(backend.device, "posix-fd"), recommended=False)
    access = [cuda_driver.vmm_access_desc(backend.device)]
    return backend._imports.acquire(("registered", uuid, pid, base),
                                    lambda: open_posix_fd(fd, size, alignment, access), size,
                                    backend.device, what="registered peer memory")
