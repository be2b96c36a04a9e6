"""Views of a window: ``StreamWindow`` (the window with its GPU work on another stream)
and typed arrays over a rank's window (``Window.get_buffer``)."""

from __future__ import annotations

import math
from typing import Any

from ..backends import Buffer
from ..runtime.errors import WindowError

__all__ = ["StreamWindow", "typed_view", "dtype_name", "DEVICE_DTYPES"]

# The element types a device array can have (DeviceArray speaks them through DLPack), by
# name, with their sizes in bytes.
DEVICE_DTYPES = {
    "uint8": 1, "int8": 1, "int16": 2, "uint16": 2, "int32": 4, "uint32": 4,
    "int64": 8, "uint64": 8, "float16": 2, "float32": 4, "float64": 8, "bfloat16": 2,
}


def _dims(shape: Any) -> tuple[int, ...]:
    dims = (shape,) if isinstance(shape, int) and not isinstance(shape, bool) else shape
    if (not isinstance(dims, tuple)
            or any(isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in dims)):
        raise WindowError(f"shape={shape!r}: expected an int or a tuple of ints >= 0")
    return dims


def dtype_name(dtype: Any) -> str | None:
    """The name in DEVICE_DTYPES of ``dtype`` (``float32`` for ``"float32"``,
    ``numpy.float32``, ``numpy.dtype("float32")`` or ``torch.float32``), or None when it
    is none of them."""
    import numpy as np

    name = str(dtype).removeprefix("torch.")
    if name in DEVICE_DTYPES:
        return name
    try:
        name = np.dtype(dtype).name
    except TypeError:
        return None
    return name if name in DEVICE_DTYPES else None


def _host_dtype(name: str) -> Any:
    import numpy as np

    if name != "bfloat16":
        return np.dtype(name)
    try:
        import ml_dtypes
    except ImportError:
        raise WindowError("dtype='bfloat16' on host memory needs numpy's bfloat16 from the "
                          "ml_dtypes package: pip install ml_dtypes") from None
    return np.dtype(ml_dtypes.bfloat16)


def typed_view(buffer: Buffer, shape: Any, dtype: Any, offset: int = 0, *,
               device_memory: bool) -> Any:
    """The bytes of ``buffer`` from ``offset`` as a C-contiguous array of ``shape`` and
    ``dtype``, without a copy: a numpy array over host memory, a ``DeviceArray`` over
    device memory (``device_memory``: the backend's declaration), which
    ``torch.from_dlpack`` / ``cupy.from_dlpack`` view. The view keeps the mapping alive.

    Raises:
        WindowError: a bad shape, dtype or offset, or a view that does not fit.
    """
    dims = _dims(shape)
    name = dtype_name(dtype)
    if name is None:
        raise WindowError(f"dtype={dtype!r}: a window view's dtype is one of "
                          f"{', '.join(DEVICE_DTYPES)}")
    itemsize = DEVICE_DTYPES[name]
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise WindowError(f"offset={offset!r}: expected an int >= 0")
    if offset % itemsize:
        raise WindowError(f"offset={offset} is not a multiple of {itemsize}, the size of "
                          f"a {name}")
    nbytes = math.prod(dims) * itemsize
    if offset + nbytes > buffer.nbytes:
        raise WindowError(f"shape={dims} of {name} at offset={offset} needs bytes "
                          f"[{offset}, {offset + nbytes}), but the window holds "
                          f"{buffer.nbytes}")
    view: Any = buffer.slice(offset, nbytes)
    if not device_memory:
        import numpy as np

        return np.asarray(view).view(_host_dtype(name)).reshape(dims)
    from ..backends.device_buffer import DeviceArray

    return DeviceArray(view.ptr, view.nbytes, view.device, view, shape=dims, dtype=name)


class StreamWindow:
    """A window whose GPU work goes to another stream (``Window.on_stream``): ``engine``
    enqueues there and ``barrier`` runs there; buffers, pads and ranks are the window's.
    Compares and hashes equal to its window, so per-window state is shared."""

    def __init__(self, window: Any, engine: Any, barrier: Any, *,
                 graph_safe: bool = False) -> None:
        self.window = window
        self.engine = engine
        self.barrier = barrier
        # Work bound to this view is meant for a CUDA graph (patterns may choose by it).
        self.graph_safe = graph_safe

    @property
    def stream(self) -> Any:
        """The ``CUstream`` this view enqueues on."""
        return self.engine.stream

    def __getattr__(self, name: str) -> Any:
        if name == "window":  # not set yet (a copy in the making): no recursion
            raise AttributeError(name)
        return getattr(self.window, name)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, StreamWindow):
            other = other.window
        return other is self.window

    def __hash__(self) -> int:
        return hash(self.window)

    def __repr__(self) -> str:
        return f"StreamWindow({self.window!r}, stream={self.stream!r})"
