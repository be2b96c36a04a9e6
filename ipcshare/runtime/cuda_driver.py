"""The one module that talks to the CUDA driver: checked calls, device facts, contexts.

Every other module reaches ``cuda.bindings.driver`` through this one, so there is one
checked-call helper, one place that turns ``CUresult`` codes into ``CudaError`` and one
place to look when a binding changes. Importing it loads the bindings (an ImportError
here means cuda-python is missing) but does not touch the driver: ``cuInit`` runs on
the first call that needs it.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator
from typing import Any

from cuda.bindings import driver  # ImportError -> gpu_count() says cuda-python is missing

from .errors import CudaError
from .finalizers import finalize_unclosed, release_now

__all__ = [
    "driver",
    "check",
    "describe_error",
    "cuda_error",
    "error_name",
    "init",
    "device_count",
    "get_device",
    "device_attribute",
    "device_name",
    "device_uuid",
    "pci_bus_id",
    "total_memory",
    "mem_get_info",
    "can_access_peer",
    "p2p_attribute",
    "handle_type",
    "vmm_allocation_prop",
    "vmm_access_desc",
    "vmm_granularity",
    "PrimaryContext",
    "primary_context",
    "SUCCESS",
    "NOT_READY",
    "NOT_PERMITTED",
    "HANDLE_TYPES",
]

SUCCESS = driver.CUresult.CUDA_SUCCESS
NOT_READY = driver.CUresult.CUDA_ERROR_NOT_READY
NOT_PERMITTED = driver.CUresult.CUDA_ERROR_NOT_PERMITTED

# ipcshare's names for the cuMem shareable handle types it knows.
HANDLE_TYPES = {
    "posix-fd": driver.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
    "fabric": driver.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_FABRIC,
}

_init_lock = threading.Lock()
_initialised = False


def error_name(err: Any) -> str:
    """``CUDA_ERROR_...`` name of a ``CUresult`` (never raises)."""
    try:
        code, name = driver.cuGetErrorName(err)
        if code == SUCCESS and name:
            return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:  # naming an error must not raise another one
        pass
    try:
        return driver.CUresult(int(err)).name
    except Exception:
        return f"CUresult {int(err)}"


def describe_error(call: str, err: Any) -> str:
    """``'<call> -> CUDA_ERROR_X: description'`` (the text of every CudaError)."""
    description = ""
    try:
        code, text = driver.cuGetErrorString(err)
        if code == SUCCESS and text:
            description = text.decode() if isinstance(text, bytes) else str(text)
    except Exception:  # best effort
        pass
    name = error_name(err)
    return f"{call} -> {name}: {description}" if description else f"{call} -> {name}"


def cuda_error(call: str, err: Any, *, then: str = "") -> CudaError:
    """The CudaError for ``call`` failing with ``err``: the message of
    :func:`describe_error` (followed by ``then``), the call and the error name as fields,
    so that readers never parse the name out of the message."""
    return CudaError(describe_error(call, err) + then, call=call, error_name=error_name(err))


def check(call: str, result: tuple) -> Any:
    """Unpack what a ``cuda.bindings.driver`` call returned: ``(err, *values)``.

    Returns None, the single value, or a tuple of the values.

    Raises:
        CudaError: ``err`` is not CUDA_SUCCESS; the message starts with ``call`` and
            the error name.
    """
    err = result[0]
    if err != SUCCESS:
        raise cuda_error(call, err)
    if len(result) == 1:
        return None
    if len(result) == 2:
        return result[1]
    return result[1:]


def init() -> None:
    """``cuInit(0)`` once per process.

    Raises:
        CudaError: the driver library is missing or refuses to start (no device...).
    """
    global _initialised
    if _initialised:
        return
    with _init_lock:
        if _initialised:
            return
        try:
            result = driver.cuInit(0)
        except RuntimeError as exc:  # the bindings could not dlopen libcuda.so.1
            raise CudaError(
                f"cuInit -> the NVIDIA driver library could not be loaded ({exc}): "
                "no NVIDIA driver on this machine") from None
        check("cuInit", result)
        _initialised = True


def device_count() -> int:
    """Number of CUDA devices visible to this process (after CUDA_VISIBLE_DEVICES).

    Raises:
        CudaError: no driver, or the driver failed to start.
    """
    init()
    return int(check("cuDeviceGetCount", driver.cuDeviceGetCount()))


def get_device(ordinal: int) -> Any:
    """The ``CUdevice`` of ``ordinal``.

    Raises:
        CudaError: no such device.
    """
    init()
    return check("cuDeviceGet", driver.cuDeviceGet(ordinal))


def device_attribute(ordinal: int, name: str) -> int:
    """``cuDeviceGetAttribute`` by short name, e.g. ``'VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED'``.

    Raises:
        CudaError: the query failed.
        AttributeError: these bindings do not know the attribute.
    """
    attribute = getattr(driver.CUdevice_attribute, f"CU_DEVICE_ATTRIBUTE_{name}")
    return int(check(f"cuDeviceGetAttribute({name})",
                     driver.cuDeviceGetAttribute(attribute, get_device(ordinal))))


def _c_string(raw: Any) -> str:
    if isinstance(raw, bytes):
        raw = raw.split(b"\0", 1)[0].decode(errors="replace")
    return str(raw).strip()


def device_name(ordinal: int) -> str:
    """Marketing name, e.g. ``'NVIDIA H200'``.

    Raises:
        CudaError: the query failed.
    """
    return _c_string(check("cuDeviceGetName", driver.cuDeviceGetName(256, get_device(ordinal))))


def device_uuid(ordinal: int) -> bytes:
    """The 16 raw bytes of the device UUID (MIG instance UUID in MIG mode).

    Raises:
        CudaError: the query failed.
    """
    uuid = check("cuDeviceGetUuid", driver.cuDeviceGetUuid(get_device(ordinal)))
    raw = bytes(uuid.bytes)
    return raw[:16].ljust(16, b"\0")


def mps_client(ordinal: int) -> bool:
    """Whether contexts on this device are MPS clients (an MPS daemon serves it, so the
    contexts of several processes run side by side instead of taking turns). False where
    the driver cannot say (the attribute is newer than CUDA 12.3)."""
    attribute = getattr(driver.CUdevice_attribute, "CU_DEVICE_ATTRIBUTE_MPS_ENABLED", None)
    if attribute is None:
        return False
    err, value = driver.cuDeviceGetAttribute(attribute, get_device(ordinal))
    return int(err) == 0 and bool(value)


def pci_bus_id(ordinal: int) -> str:
    """PCI address, e.g. ``'0000:1B:00.0'``.

    Raises:
        CudaError: the query failed.
    """
    return _c_string(check("cuDeviceGetPCIBusId",
                           driver.cuDeviceGetPCIBusId(32, get_device(ordinal))))


def total_memory(ordinal: int) -> int:
    """Bytes of memory on the device.

    Raises:
        CudaError: the query failed.
    """
    return int(check("cuDeviceTotalMem", driver.cuDeviceTotalMem(get_device(ordinal))))


def mem_get_info() -> tuple[int, int]:
    """(free, total) bytes of the current context's device.

    Raises:
        CudaError: no current context, or the query failed.
    """
    free, total = check("cuMemGetInfo", driver.cuMemGetInfo())
    return int(free), int(total)


def can_access_peer(ordinal: int, peer: int) -> bool:
    """Whether contexts on ``ordinal`` can map memory of ``peer`` directly.

    Raises:
        CudaError: the query failed.
    """
    return bool(check("cuDeviceCanAccessPeer",
                      driver.cuDeviceCanAccessPeer(get_device(ordinal), get_device(peer))))


def p2p_attribute(name: str, src: int, dst: int) -> int:
    """``cuDeviceGetP2PAttribute`` by short name (``ACCESS_SUPPORTED``,
    ``NATIVE_ATOMIC_SUPPORTED``, ``PERFORMANCE_RANK``) for the link src -> dst.

    Raises:
        CudaError: the query failed.
    """
    attribute = getattr(driver.CUdevice_P2PAttribute, f"CU_DEVICE_P2P_ATTRIBUTE_{name}")
    return int(check(f"cuDeviceGetP2PAttribute({name})",
                     driver.cuDeviceGetP2PAttribute(attribute, get_device(src), get_device(dst))))


def handle_type(name: str) -> Any:
    """The ``CUmemAllocationHandleType`` called ``name`` (``posix-fd`` or ``fabric``).

    Raises:
        KeyError: unknown name (callers validate names first).
    """
    return HANDLE_TYPES[name]


def vmm_allocation_prop(ordinal: int, handle: str) -> Any:
    """``CUmemAllocationProp`` for pinned memory on ``ordinal`` exportable as ``handle``."""
    prop = driver.CUmemAllocationProp()
    prop.type = driver.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = driver.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = ordinal
    prop.requestedHandleTypes = handle_type(handle)
    return prop


def vmm_access_desc(ordinal: int) -> Any:
    """``CUmemAccessDesc`` granting read/write to device ``ordinal``."""
    desc = driver.CUmemAccessDesc()
    desc.location.type = driver.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    desc.location.id = ordinal
    desc.flags = driver.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    return desc


def vmm_granularity(prop: Any, *, recommended: bool = True) -> int:
    """Allocation granularity for ``prop`` (recommended or minimum).

    Raises:
        CudaError: the query failed.
    """
    flags = driver.CUmemAllocationGranularity_flags
    option = (flags.CU_MEM_ALLOC_GRANULARITY_RECOMMENDED if recommended
              else flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM)
    return int(check("cuMemGetAllocationGranularity",
                     driver.cuMemGetAllocationGranularity(prop, option)))


def _release_primary(ordinal: int) -> None:
    driver.cuDevicePrimaryCtxRelease(driver.cuDeviceGet(ordinal)[1])


class PrimaryContext:
    """A retained reference to a device's primary context (the one the CUDA runtime,
    torch and cupy use too), made current on the creating thread.

    ``close()`` releases the reference (idempotent); the context itself lives on while
    anyone else holds it.
    """

    def __init__(self, ordinal: int) -> None:
        device = get_device(ordinal)
        self.ordinal = ordinal
        self.handle = check("cuDevicePrimaryCtxRetain", driver.cuDevicePrimaryCtxRetain(device))
        self._finalizer = finalize_unclosed(
            self, functools.partial(_release_primary, ordinal),
            f"ipcshare: primary context of cuda:{ordinal} was never released; released it now")
        try:
            self.make_current()
        except BaseException:
            self.close()
            raise

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def make_current(self) -> None:
        """Bind the context to the calling thread (cheap; call before driver work
        on a thread that may have switched devices).

        Raises:
            CudaError: the context is gone or the call failed.
        """
        check("cuCtxSetCurrent", driver.cuCtxSetCurrent(self.handle))

    def close(self) -> None:
        """Release the retained reference (idempotent).

        Raises:
            CudaError: the driver refused the release (the reference is dropped anyway).
        """
        def release() -> None:
            check("cuDevicePrimaryCtxRelease",
                  driver.cuDevicePrimaryCtxRelease(get_device(self.ordinal)))

        release_now(self._finalizer, release)

    def __enter__(self) -> PrimaryContext:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def primary_context(ordinal: int) -> Iterator[PrimaryContext]:
    """Retain and bind ``ordinal``'s primary context for a block, then restore the
    thread's previous current context and release.

    Raises:
        CudaError: retain or bind failed.
    """
    init()
    previous = check("cuCtxGetCurrent", driver.cuCtxGetCurrent())
    context = PrimaryContext(ordinal)
    try:
        yield context
    finally:
        try:
            # Put back whatever the thread had (possibly no context at all), so a probe
            # never leaves another device's context current behind its caller's back.
            driver.cuCtxSetCurrent(previous)
        finally:
            context.close()
