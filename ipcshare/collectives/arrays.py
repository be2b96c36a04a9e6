"""A user's array as a small descriptor (address, bytes, dtype, elements, device,
contiguity), read from numpy, ``__cuda_array_interface__`` or ``__dlpack__``."""

from __future__ import annotations

import ctypes
import dataclasses
import math
import sys
from typing import Any

import numpy as np

from ..runtime.errors import CollectiveError, Unsupported
from ..window.views import DEVICE_DTYPES, dtype_name

__all__ = ["ArrayRef", "describe_array", "parse_dlpack_capsule", "check_array", "c_contiguous",
           "to_numpy_dtype", "in_device_memory"]

# DLPack device types (dlpack.h): memory the host can read as numpy, and CUDA memory.
_DL_CPU = 1
_DL_CUDA = 2
_DL_CUDA_HOST = 3
_DL_CUDA_MANAGED = 13
_DL_DEVICES = {_DL_CPU: "cpu", _DL_CUDA: "cuda", _DL_CUDA_HOST: "cpu",
               _DL_CUDA_MANAGED: "cuda"}
# DLPack type codes (kDLInt, kDLUInt, kDLFloat, kDLBfloat, kDLComplex, kDLBool).
_DL_TYPE_NAMES = {0: "int", 1: "uint", 2: "float", 4: "bfloat", 5: "complex", 6: "bool"}


@dataclasses.dataclass(frozen=True, eq=False)
class ArrayRef:
    """Where an array's bytes are and what they hold.

    ``dtype`` is a name (``float32``, ``bfloat16``, ``int32``; a byte-swapped numpy type
    keeps its typestring, e.g. ``>f4``); ``device`` is ``cpu`` (memory this process reads
    directly) or ``cuda``; ``host`` is the numpy array for cpu memory (None on a GPU);
    ``source`` is the object described, held so its memory outlives the descriptor.
    """

    ptr: int
    nbytes: int
    count: int
    dtype: str
    itemsize: int
    shape: tuple[int, ...]
    contiguous: bool
    readonly: bool
    device: str
    device_id: int | None
    host: np.ndarray | None
    source: Any

    def bytes(self) -> np.ndarray:
        """The array's bytes as a flat uint8 numpy view (cpu memory, contiguous)."""
        assert self.host is not None and self.contiguous
        return self.host.reshape(-1).view(np.uint8)

    def overlaps(self, other: ArrayRef) -> bool:
        """Whether the two byte ranges share a byte (empty arrays share none)."""
        return (self.nbytes > 0 and other.nbytes > 0 and self.ptr < other.ptr + other.nbytes
                and other.ptr < self.ptr + self.nbytes)

    def spell(self) -> str:
        """``a float32 array of shape (2, 3) in cuda memory`` (for messages)."""
        where = "" if self.device == "cpu" else f" in {self.device} memory"
        article = "an" if self.dtype.startswith("int") else "a"  # an int32, a uint8
        return f"{article} {self.dtype} array of shape {self.shape}{where}"


def c_contiguous(shape: tuple[int, ...], strides: tuple[int, ...] | None, itemsize: int) -> bool:
    """Whether ``strides`` (bytes; None means C order) lay ``shape`` out densely in C
    order. Dimensions of length 1 may have any stride, and an empty array is dense."""
    if strides is None or 0 in shape:
        return True
    expected = itemsize
    for length, stride in zip(reversed(shape), reversed(strides), strict=True):
        if length != 1 and stride != expected:
            return False
        expected *= length
    return True


def in_device_memory(obj: Any) -> bool:
    """Whether ``obj`` is an array in CUDA memory (a torch tensor on a GPU, the CUDA array
    interface, DLPack on a CUDA device), asked without ever raising."""
    is_cuda = getattr(obj, "is_cuda", None)   # a torch tensor says so directly
    if isinstance(is_cuda, bool):
        return is_cuda
    try:
        if getattr(obj, "__cuda_array_interface__", None) is not None:
            return True
    except (TypeError, ValueError, RuntimeError):
        return True   # a CUDA array whose type the interface cannot spell (bfloat16)
    device = getattr(obj, "__dlpack_device__", None)
    if callable(device):
        try:
            return int(device()[0]) in (_DL_CUDA, _DL_CUDA_MANAGED)
        except (TypeError, ValueError, IndexError):
            return False
    return False


def describe_array(obj: Any, name: str) -> ArrayRef:
    """The descriptor of ``obj``: a numpy array (or anything numpy views without a copy:
    ``__array_interface__``, the buffer protocol), an object with
    ``__cuda_array_interface__``, or one with ``__dlpack__``.

    ``name`` is the argument's name for messages.

    Raises:
        CollectiveError: ``obj`` is none of these (naming ``name`` and its type).
    """
    if isinstance(obj, np.ndarray):
        return _from_numpy(obj, obj, name)
    if isinstance(obj, np.generic):
        # numpy would view it through a temporary copy: a result written there is lost.
        raise CollectiveError(
            f"{name} is a numpy scalar ({type(obj).__name__}), not an array: a result "
            f"cannot be written into it; pass an array, e.g. numpy.array([value], "
            f"dtype=numpy.{type(obj).__name__})")
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor) and obj.is_cuda:
        return _from_torch(obj)
    try:
        interface = getattr(obj, "__cuda_array_interface__", None)
    except (TypeError, ValueError, RuntimeError):
        interface = None  # e.g. a type the interface cannot spell (bfloat16): DLPack below
    if interface is not None:
        return _from_cuda_interface(obj, interface, name)
    if callable(getattr(obj, "__dlpack__", None)) and callable(
            getattr(obj, "__dlpack_device__", None)):
        device_type, _device_id = obj.__dlpack_device__()
        if _DL_DEVICES.get(int(device_type)) == "cpu":
            return _from_numpy(np.from_dlpack(obj), obj, name)
        # A CUDA consumer that does not synchronise: stream -1 (array API standard).
        return parse_dlpack_capsule(obj.__dlpack__(stream=-1), obj, name)
    if getattr(obj, "__array_interface__", None) is not None:
        return _from_numpy(np.asarray(obj), obj, name)
    try:
        view = memoryview(obj)
    except TypeError:
        raise CollectiveError(
            f"{name} is a {type(obj).__name__}, not an array: pass a numpy array (host "
            "backend) or an array with __cuda_array_interface__ or __dlpack__") from None
    return _from_numpy(np.asarray(view), obj, name)


# numpy computes a dtype's name in Python (microseconds): once per dtype is enough.
_DTYPE_NAMES: dict[np.dtype, str] = {}


def _dtype_name(dtype: np.dtype) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        # A byte-swapped float32 is not float32 to a reduction: keep its typestring.
        name = _DTYPE_NAMES[dtype] = dtype.name if dtype.isnative else dtype.str
    return name


def _from_numpy(array: np.ndarray, source: Any, name: str) -> ArrayRef:
    if array.dtype.hasobject:
        # Its elements are pointers into this process: no other rank can read them.
        raise CollectiveError(f"{name} has dtype {array.dtype}: it holds Python objects, "
                              "whose bytes mean nothing in another process; pass numbers "
                              "(e.g. float32, int32)")
    flags = array.flags
    return ArrayRef(
        ptr=array.__array_interface__["data"][0], nbytes=array.nbytes, count=array.size,
        dtype=_dtype_name(array.dtype), itemsize=array.itemsize, shape=array.shape,
        contiguous=flags.c_contiguous, readonly=not flags.writeable, device="cpu",
        device_id=None, host=array, source=source)


# torch dtype -> (name, itemsize); filled on first use.
_TORCH_DTYPES: dict[Any, tuple[str, int]] = {}


def _from_torch(tensor: Any) -> ArrayRef:
    """A CUDA torch tensor, read from its own attributes: its ``__cuda_array_interface__``
    is built in Python per access (several microseconds) and cannot spell bfloat16."""
    dtype = tensor.dtype
    known = _TORCH_DTYPES.get(dtype)
    if known is None:
        known = _TORCH_DTYPES[dtype] = (str(dtype).removeprefix("torch."), tensor.element_size())
    count = tensor.numel()
    return ArrayRef(
        ptr=tensor.data_ptr(), nbytes=count * known[1], count=count, dtype=known[0],
        itemsize=known[1], shape=tuple(tensor.shape), contiguous=tensor.is_contiguous(),
        readonly=False, device="cuda", device_id=tensor.device.index, host=None, source=tensor)


def _from_cuda_interface(obj: Any, interface: dict, name: str) -> ArrayRef:
    try:
        shape = tuple(int(d) for d in interface["shape"])
        dtype = np.dtype(interface["typestr"])
        ptr, readonly = interface["data"]
        strides = interface.get("strides")
    except (KeyError, TypeError, ValueError) as exc:
        raise CollectiveError(f"{name} has a malformed __cuda_array_interface__ "
                              f"({type(exc).__name__}: {exc})") from None
    strides = None if strides is None else tuple(int(s) for s in strides)
    count = math.prod(shape)
    return ArrayRef(
        ptr=int(ptr or 0), nbytes=count * dtype.itemsize, count=count, dtype=_dtype_name(dtype),
        itemsize=dtype.itemsize, shape=shape,
        contiguous=c_contiguous(shape, strides, dtype.itemsize), readonly=bool(readonly),
        device="cuda", device_id=None, host=None, source=obj)


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    # The head of DLManagedTensor (dlpack.h, unversioned "dltensor" capsules).
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_valid = ctypes.pythonapi.PyCapsule_IsValid
_capsule_valid.restype = ctypes.c_int
_capsule_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _dlpack_dtype(code: int, bits: int, lanes: int) -> str:
    base = _DL_TYPE_NAMES.get(code, f"dlpack-type-{code}")
    name = "bool" if base == "bool" else f"{base}{bits}"
    return name if lanes == 1 else f"{name}x{lanes}"


def parse_dlpack_capsule(capsule: Any, source: Any, name: str) -> ArrayRef:
    """The descriptor of the tensor in an unconsumed ``dltensor`` capsule (which keeps
    its producer's reference until the capsule goes: only ``source`` keeps the memory).

    Raises:
        CollectiveError: not a ``dltensor`` capsule.
    """
    if not _capsule_valid(capsule, b"dltensor"):
        raise CollectiveError(f"{name}.__dlpack__() did not return a 'dltensor' capsule")
    tensor = ctypes.cast(_capsule_pointer(capsule, b"dltensor"),
                         ctypes.POINTER(_DLTensor)).contents
    ndim = int(tensor.ndim)
    shape = tuple(int(tensor.shape[i]) for i in range(ndim))
    dtype = tensor.dtype
    itemsize = max(1, int(dtype.bits) * int(dtype.lanes) // 8)
    strides = (None if not tensor.strides else
               tuple(int(tensor.strides[i]) * itemsize for i in range(ndim)))
    count = math.prod(shape)
    device_type = int(tensor.device.device_type)
    return ArrayRef(
        ptr=int(tensor.data or 0) + int(tensor.byte_offset), nbytes=count * itemsize,
        count=count, dtype=_dlpack_dtype(int(dtype.code), int(dtype.bits), int(dtype.lanes)),
        itemsize=itemsize, shape=shape, contiguous=c_contiguous(shape, strides, itemsize),
        readonly=False, device=_DL_DEVICES.get(device_type, f"dlpack-device-{device_type}"),
        device_id=int(tensor.device.device_id), host=None, source=source)


def check_array(ref: ArrayRef, name: str, *, device: str, writable: bool = False) -> None:
    """Raise unless ``ref`` is contiguous, in ``device`` memory and, when ``writable``,
    writable.

    Raises:
        CollectiveError: naming ``name``, what it is and what is allowed.
    """
    if ref.device != device:
        allowed = ("a numpy array in host memory" if device == "cpu" else
                   "an array on this rank's GPU")
        raise CollectiveError(f"{name} is {ref.spell()}, but this communicator takes "
                              f"{allowed}")
    if not ref.contiguous:
        raise CollectiveError(f"{name} is {ref.spell()} that is not contiguous: pass a "
                              "C-contiguous array (e.g. numpy.ascontiguousarray)")
    if writable and ref.readonly:
        raise CollectiveError(f"{name} is {ref.spell()} that is read-only: the result is "
                              "written into it")


@dataclasses.dataclass(frozen=True)
class DeviceDtype:
    """A dtype of GPU arrays by name and size (bfloat16 needs no ml_dtypes here)."""

    name: str
    itemsize: int


def device_dtype(dtype: Any) -> DeviceDtype:
    """The dtype of a GPU array from a name (``bfloat16``), a numpy dtype or a torch dtype.

    Raises:
        CollectiveError: none of the types a GPU array can have.
    """
    name = dtype_name(dtype)
    if name is None:
        raise CollectiveError(f"dtype={dtype!r}: a GPU array's dtype is one of "
                              f"{', '.join(DEVICE_DTYPES)}")
    return DeviceDtype(name, DEVICE_DTYPES[name])


def to_numpy_dtype(dtype: Any) -> np.dtype:
    """numpy's dtype for ``dtype`` (a name or a numpy dtype); ``bfloat16`` is ml_dtypes'.

    Raises:
        CollectiveError: not a dtype.
        Unsupported: bfloat16 without the ml_dtypes package.
    """
    if dtype is None:  # numpy would read it as float64
        raise CollectiveError("dtype=None: name the element type (e.g. 'float32', "
                              "'bfloat16', numpy.int32)")
    if isinstance(dtype, str) and dtype == "bfloat16":
        try:
            import ml_dtypes
        except ImportError:
            raise Unsupported("dtype='bfloat16' on the host backend needs numpy's bfloat16 "
                              "from the ml_dtypes package: pip install ml_dtypes") from None
        return np.dtype(ml_dtypes.bfloat16)
    try:
        numpy_dtype = np.dtype(dtype)
    except TypeError:
        raise CollectiveError(f"dtype={dtype!r} is not a dtype (e.g. 'float32', "
                              "'bfloat16', numpy.int32)") from None
    if numpy_dtype.hasobject:
        raise CollectiveError(f"dtype={dtype!r} holds Python objects, whose bytes are "
                              "pointers into this process: choose a numeric dtype "
                              "(e.g. 'float32')")
    return numpy_dtype
