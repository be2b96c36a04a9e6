"""Device memory as buffers (with the CUDA array interface and DLPack), as allocations
(one owner, idempotent close, a finalizer that warns), and the reference-counted cache
of peer mappings.

DLPack is implemented with ctypes: a ``DLManagedTensor`` (or the versioned
``DLManagedTensorVersioned``) in a ``dltensor`` capsule. The Python objects that must
outlive the consumer's tensor (the struct itself, its shape array, the buffer and so
the allocation object) are kept in a module registry keyed by the struct's address;
the consumer's call of the struct's ``deleter`` drops them. An unconsumed capsule drops
them from its destructor.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

from ..runtime.errors import BackendError
from ..runtime.finalizers import finalize_unclosed, release_now
from .base import Allocation, Buffer

__all__ = ["DeviceBuffer", "DeviceArray", "DeviceAllocation", "ImportCache", "KDLCUDA",
           "live_dlpack_exports"]

KDLCUDA = 2              # DLDeviceType kDLCUDA
_KDL_INT, _KDL_UINT, _KDL_FLOAT, _KDL_BFLOAT = 0, 1, 2, 4  # DLDataTypeCode
# dtype name -> (DLPack code, bits, CUDA array interface typestr; None: it has none)
_TYPED = {
    "uint8": (_KDL_UINT, 8, "|u1"), "int8": (_KDL_INT, 8, "|i1"),
    "int16": (_KDL_INT, 16, "<i2"), "uint16": (_KDL_UINT, 16, "<u2"),
    "int32": (_KDL_INT, 32, "<i4"), "uint32": (_KDL_UINT, 32, "<u4"),
    "int64": (_KDL_INT, 64, "<i8"), "uint64": (_KDL_UINT, 64, "<u8"),
    "float16": (_KDL_FLOAT, 16, "<f2"), "float32": (_KDL_FLOAT, 32, "<f4"),
    "float64": (_KDL_FLOAT, 64, "<f8"), "bfloat16": (_KDL_BFLOAT, 16, None),
}
_DLPACK_VERSION = (1, 0)


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


# void (*deleter)(DLManagedTensor*): called by the consumer, maybe from another thread;
# ctypes takes the GIL for the callback.
_Deleter = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", _Deleter)]


class _DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("version", _DLPackVersion), ("manager_ctx", ctypes.c_void_p),
                ("deleter", _Deleter), ("flags", ctypes.c_uint64), ("dl_tensor", _DLTensor)]


# Capsule names; module constants, so the char* handed to PyCapsule_New stays valid.
_CAPSULE_NAME = b"dltensor"
_CAPSULE_NAME_VERSIONED = b"dltensor_versioned"

# PyCapsule_New runs with the GIL held and reports errors (PYFUNCTYPE). The destructor
# helpers only read the capsule, so plain CFUNCTYPE prototypes do: they never look at
# the thread's error state, which may hold an exception while a capsule dies.
_capsule_new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p,
                                 ctypes.c_void_p)(("PyCapsule_New", ctypes.pythonapi))
_capsule_is_valid = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_IsValid", ctypes.pythonapi))
_capsule_get_pointer = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi))

# struct address -> what must stay alive until the consumer lets go of the tensor.
_LIVE: dict[int, tuple[Any, ...]] = {}


def live_dlpack_exports() -> int:
    """DLPack tensors handed out and not yet released by their consumers (for tests)."""
    return len(_LIVE)


@_Deleter
def _release_export(address: int) -> None:
    _LIVE.pop(address, None)


_CapsuleDestructor = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


@_CapsuleDestructor
def _destroy_capsule(capsule: int) -> None:
    # A consumer renames the capsule to used_dltensor*; only a never-consumed capsule
    # still owns its tensor here.
    for name in (_CAPSULE_NAME, _CAPSULE_NAME_VERSIONED):
        if _capsule_is_valid(capsule, name):
            address = _capsule_get_pointer(capsule, name)
            if address:
                _LIVE.pop(address, None)
            return


def _dlpack_capsule(buffer: DeviceBuffer, versioned: bool, dims: tuple[int, ...] | None = None,
                    dtype: str = "uint8") -> Any:
    dims = (buffer.nbytes,) if dims is None else dims
    shape = (ctypes.c_int64 * max(len(dims), 1))(*dims)
    managed = _DLManagedTensorVersioned() if versioned else _DLManagedTensor()
    tensor = managed.dl_tensor
    tensor.data = buffer.ptr
    tensor.device = _DLDevice(KDLCUDA, buffer.device)
    tensor.ndim = len(dims)
    code, bits, _ = _TYPED[dtype]
    tensor.dtype = _DLDataType(code, bits, 1)
    tensor.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
    tensor.strides = None  # compact row-major
    tensor.byte_offset = 0
    managed.deleter = _release_export
    address = ctypes.addressof(managed)
    managed.manager_ctx = address
    if versioned:
        managed.version = _DLPackVersion(*_DLPACK_VERSION)
        managed.flags = 0  # writable, not a copy
    _LIVE[address] = (managed, shape, buffer)
    try:
        return _capsule_new(address, _CAPSULE_NAME_VERSIONED if versioned else _CAPSULE_NAME,
                            ctypes.cast(_destroy_capsule, ctypes.c_void_p))
    except BaseException:
        _LIVE.pop(address, None)
        raise


class DeviceBuffer(Buffer):
    """A range of device memory mapped in this process, usable from ``device``.

    Views, not copies: ``torch.from_dlpack(buf)`` and ``cupy.from_dlpack(buf)`` give
    uint8 tensors over the same bytes; ``cupy.asarray(buf)`` and
    ``torch.as_tensor(buf, device="cuda")`` read ``__cuda_array_interface__`` (they take
    the device from the pointer itself, so prefer DLPack for peer memory).

    No stream ordering is carried: call the engine's ``synchronize()`` (or end with a
    barrier and synchronize) before another library's stream touches the bytes.
    """

    __slots__ = ("ptr", "nbytes", "device", "_owner")

    def __init__(self, ptr: int, nbytes: int, device: int, owner: Any = None) -> None:
        self.ptr = int(ptr)
        self.nbytes = int(nbytes)
        self.device = int(device)
        # The allocation, kept alive as long as any view of it (tensors included).
        self._owner = owner

    def slice(self, offset: int, nbytes: int) -> DeviceBuffer:
        self._check_range(offset, nbytes)
        return DeviceBuffer(self.ptr + offset, nbytes, self.device, self._owner)

    @property
    def __cuda_array_interface__(self) -> dict:
        return {"shape": (self.nbytes,), "typestr": "|u1", "data": (self.ptr, False),
                "version": 3, "strides": None, "stream": None}

    def __dlpack_device__(self) -> tuple[int, int]:
        return (KDLCUDA, self.device)

    def __dlpack__(self, stream: int | None = None, *,
                   max_version: tuple[int, int] | None = None,
                   dl_device: tuple[int, int] | None = None, copy: bool | None = None) -> Any:
        """A DLPack capsule viewing these bytes as a 1-D uint8 tensor.

        ``stream`` is accepted and not waited on: the buffer carries no stream of its
        own (see the class docstring).

        Raises:
            BufferError: a copy or another device was requested.
        """
        if copy:
            raise BufferError("a DeviceBuffer is shared memory: DLPack export never copies")
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            raise BufferError(f"the buffer lives on {self.__dlpack_device__()}, not {dl_device}")
        versioned = max_version is not None and int(max_version[0]) >= _DLPACK_VERSION[0]
        return self._capsule(versioned)

    def _capsule(self, versioned: bool) -> Any:
        return _dlpack_capsule(self, versioned)

    def __repr__(self) -> str:
        return f"DeviceBuffer(ptr=0x{self.ptr:x}, nbytes={self.nbytes}, device=cuda:{self.device})"


class DeviceArray(DeviceBuffer):
    """A typed, C-contiguous array over device memory (``shape``, ``dtype`` a name such as
    ``float32`` or ``bfloat16``): what ``Communicator.empty`` returns on GPUs.
    ``torch.from_dlpack(a)`` and ``cupy.from_dlpack(a)`` view it with its shape and dtype
    (bfloat16 included); ``__cuda_array_interface__`` exists for the types it can spell
    (not bfloat16). The memory stays mapped as long as the array or any such view lives.
    """

    __slots__ = ("shape", "dtype")

    def __init__(self, ptr: int, nbytes: int, device: int, owner: Any, shape: tuple[int, ...],
                 dtype: str) -> None:
        if dtype not in _TYPED:
            raise BackendError(f"a device array of {dtype}: the types are {', '.join(_TYPED)}")
        super().__init__(ptr, nbytes, device, owner)
        self.shape = tuple(int(d) for d in shape)
        self.dtype = dtype

    @classmethod
    def viewing(cls, buffer: DeviceBuffer, dtype: str, *,
                device: int | None = None) -> DeviceArray:
        """A 1-D array of ``dtype`` over all of ``buffer``'s bytes, keeping ``buffer``
        alive; on ``device`` (default: the buffer's).

        Raises:
            BackendError: a dtype a device array cannot have.
        """
        if dtype not in _TYPED:
            raise BackendError(f"a device array of {dtype}: the types are {', '.join(_TYPED)}")
        itemsize = _TYPED[dtype][1] // 8
        return cls(buffer.ptr, buffer.nbytes, buffer.device if device is None else device,
                   buffer, (buffer.nbytes // itemsize,), dtype)

    @property
    def __cuda_array_interface__(self) -> dict:
        typestr = _TYPED[self.dtype][2]
        if typestr is None:  # AttributeError: consumers then fall back on DLPack
            raise AttributeError(f"{self.dtype} has no CUDA array interface typestr; use DLPack")
        return {"shape": self.shape, "typestr": typestr, "data": (self.ptr, False),
                "version": 3, "strides": None, "stream": None}

    def _capsule(self, versioned: bool) -> Any:
        return _dlpack_capsule(self, versioned, self.shape, self.dtype)

    def __repr__(self) -> str:
        return (f"DeviceArray(shape={self.shape}, dtype={self.dtype}, ptr=0x{self.ptr:x}, "
                f"device=cuda:{self.device})")


class DeviceAllocation(Allocation):
    """Device memory this process owns or has mapped: ``release`` runs exactly once,
    on ``close()`` or, with a warning, when the object is collected unclosed."""

    def __init__(self, ptr: int, nbytes: int, device: int, release: Callable[[], None], *,
                 what: str = "device allocation") -> None:
        self.ptr = int(ptr)
        self.nbytes = int(nbytes)
        self.device = int(device)
        self._release = release
        self._finalizer = finalize_unclosed(
            self, release, f"ipcshare: {what} of {nbytes} bytes at 0x{self.ptr:x} was never "
            "closed; released it now")

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def buffer(self, offset: int = 0, nbytes: int | None = None) -> DeviceBuffer:
        if self.closed:
            raise BackendError("allocation is closed")
        nbytes = self.nbytes - offset if nbytes is None else nbytes
        return DeviceBuffer(self.ptr, self.nbytes, self.device, self).slice(offset, nbytes)

    def close(self) -> None:
        """Release the memory or mapping (idempotent).

        Raises:
            CudaError: the driver refused to release (the allocation counts as closed).
        """
        release_now(self._finalizer, self._release)

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"ptr=0x{self.ptr:x}"
        return f"{type(self).__name__}({state}, nbytes={self.nbytes}, device=cuda:{self.device})"


class ImportCache:
    """Peer mappings by identity, reference-counted: importing the same peer
    allocation twice maps it once, and the mapping goes when the last import closes.

    ``acquire`` returns a new DeviceAllocation per import; closing it drops one
    reference. ``close()`` unmaps everything still mapped (backend shutdown).
    """

    def __init__(self) -> None:
        # key -> [pointer, mapped bytes, release, references]
        self._entries: dict[Any, list] = {}

    def __len__(self) -> int:
        """Distinct peer allocations mapped right now."""
        return len(self._entries)

    def acquire(self, key: Any, open_mapping: Callable[[], tuple[int, int, Callable[[], None]]],
                nbytes: int, device: int, *, what: str) -> DeviceAllocation:
        """An allocation viewing the mapping of ``key``; ``open_mapping()`` ->
        (pointer, mapped bytes, release) runs only when ``key`` is not mapped yet.

        Raises:
            BackendError: a cached mapping is smaller than ``nbytes``.
            CudaError / BackendError: whatever ``open_mapping`` raises.
        """
        entry = self._entries.get(key)
        if entry is None:
            ptr, size, release = open_mapping()
            entry = self._entries[key] = [int(ptr), int(size), release, 0]
        elif nbytes > entry[1]:
            raise BackendError(
                f"peer allocation already mapped with {entry[1]} bytes; {nbytes} requested")
        entry[3] += 1
        return DeviceAllocation(entry[0], nbytes, device,
                                lambda: self._drop(key, entry), what=what)

    def _drop(self, key: Any, entry: list) -> None:
        if self._entries.get(key) is not entry:
            return  # already released by close()
        entry[3] -= 1
        if entry[3] == 0:
            del self._entries[key]
            entry[2]()

    def close(self) -> None:
        """Release every mapping regardless of references (idempotent).

        Raises:
            CudaError: a release failed (all are attempted; the first error is raised).
        """
        entries, self._entries = list(self._entries.values()), {}
        first: BaseException | None = None
        for entry in entries:
            try:
                entry[2]()
            except Exception as exc:  # release the rest, then report
                first = first or exc
        if first is not None:
            raise first
