"""Streams from other libraries, as the raw ``CUstream`` the engine enqueues on.

Users hand ipcshare the stream their own work runs on: a cuda.core ``Stream`` (or anything
with the ``__cuda_stream__`` protocol), a ``torch.cuda.Stream``, a cupy stream, a
``cuda.bindings`` ``CUstream`` or a raw handle as an int. The stream must belong to the
window's device: work on another device's stream could not touch this device's memory
in order, so that is refused up front, not discovered as a hang.
"""

from __future__ import annotations

from typing import Any

from ..runtime.cuda_driver import check, driver
from ..runtime.errors import ConfigError

__all__ = ["stream_handle", "stream_device", "new_side_lane", "stream_capturing",
           "capture_invalidated"]

# The legacy and per-thread default streams: handles 0, 1 (CU_STREAM_LEGACY) and 2
# (CU_STREAM_PER_THREAD) mean "the current context's", so they have no device of their own.
_DEFAULT_STREAM_HANDLES = (0, 1, 2)


def stream_handle(stream: Any) -> int:
    """The ``CUstream`` address of ``stream`` as an int.

    Raises:
        ConfigError: ``stream`` is none of the kinds above.
    """
    if isinstance(stream, bool):
        raise ConfigError(f"not a CUDA stream: {stream!r}")
    if isinstance(stream, int):
        if stream < 0:
            raise ConfigError(f"not a CUDA stream handle: {stream}")
        return stream
    if isinstance(stream, driver.CUstream):
        return int(stream)
    protocol = getattr(stream, "__cuda_stream__", None)
    if protocol is not None:
        described = protocol() if callable(protocol) else protocol
        try:
            version, handle = described
        except (TypeError, ValueError):
            raise ConfigError(f"{type(stream).__name__}.__cuda_stream__ gave {described!r}, "
                              "not (version, handle)") from None
        if version != 0:
            raise ConfigError(f"{type(stream).__name__}.__cuda_stream__ speaks version "
                              f"{version}; ipcshare knows version 0")
        return int(handle)
    for attribute in ("cuda_stream", "ptr"):  # torch.cuda.Stream, cupy.cuda.Stream
        handle = getattr(stream, attribute, None)
        if isinstance(handle, int) and not isinstance(handle, bool):
            return handle
    raise ConfigError(
        f"not a CUDA stream: {type(stream).__name__} (pass a cuda.core Stream, a "
        "torch.cuda.Stream, a cupy stream, a CUstream or a raw handle)")


def stream_device(handle: int) -> int | None:
    """CUDA ordinal of the device ``handle`` belongs to (None for the default streams,
    which follow the current context, and for a stream being captured).

    Raises:
        CudaError: the handle is not a live stream.
    """
    if handle in _DEFAULT_STREAM_HANDLES:
        return None
    if stream_capturing(handle):
        # Asking a capturing stream for its device is refused, and the refusal would
        # invalidate the user's capture: the device is not checked then.
        return None
    stream = driver.CUstream(handle)
    if hasattr(driver, "cuStreamGetDevice"):  # CUDA 12.8 and later
        return int(check("cuStreamGetDevice", driver.cuStreamGetDevice(stream)))
    context = check("cuStreamGetCtx", driver.cuStreamGetCtx(stream))
    check("cuCtxPushCurrent", driver.cuCtxPushCurrent(context))
    try:
        return int(check("cuCtxGetDevice", driver.cuCtxGetDevice()))
    finally:
        driver.cuCtxPopCurrent()


def stream_capturing(handle: int) -> bool:
    """Whether work enqueued on the stream ``handle`` is being captured into a CUDA graph
    now (cuStreamIsCapturing): host waits are then not allowed on it.

    Raises:
        CudaError: the handle is not a live stream.
    """
    status = check("cuStreamIsCapturing", driver.cuStreamIsCapturing(driver.CUstream(handle)))
    return status != driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE


def capture_invalidated(handle: int) -> bool:
    """Whether the capture of the stream ``handle`` into a CUDA graph has been
    invalidated (cuStreamIsCapturing): an operation not allowed during a capture ran since
    it began (on this stream, or, in the global capture mode, on any thread of the
    process), so every further launch into it fails and ending it raises.

    Raises:
        CudaError: the handle is not a live stream.
    """
    status = check("cuStreamIsCapturing", driver.cuStreamIsCapturing(driver.CUstream(handle)))
    return status == driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_INVALIDATED


def new_side_lane() -> tuple[Any, Any]:
    """A new non-blocking stream of the current context and an event (no timing) that marks
    where its work ends: the pair that side work forks onto and joins back from. The
    caller owns both and destroys them.

    Raises:
        CudaError: either could not be created (nothing is left behind).
    """
    stream = check("cuStreamCreate", driver.cuStreamCreate(
        int(driver.CUstream_flags.CU_STREAM_NON_BLOCKING)))
    try:
        done = check("cuEventCreate", driver.cuEventCreate(
            int(driver.CUevent_flags.CU_EVENT_DISABLE_TIMING)))
    except BaseException:
        driver.cuStreamDestroy(stream)
        raise
    return stream, done
