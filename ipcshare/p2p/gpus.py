"""Every visible GPU of one process: its retained primary context, one non-blocking stream,
the ``p2p_direct.cu`` kernels loaded into it, and the device memory allocated through it.

One owner for all of it: ``close()`` frees memory, unloads kernels, destroys streams and
events and releases the contexts, in reverse order, idempotently; a constructor that fails
half-way undoes what it did.
"""

from __future__ import annotations

import contextlib
import ctypes
from typing import Any

import numpy as np

from ..runtime import cuda_driver
from ..runtime.cuda_driver import check, driver
from ..runtime.errors import BackendUnavailable

__all__ = ["GpuSet", "GpuHandles", "PushArgs", "P2P_MAX_TARGETS", "visible_gpus"]

P2P_MAX_TARGETS = 8  # P2P_MAX_TARGETS in kernels/src/p2p_direct.cu
_THREADS = 512
_BYTES_PER_BLOCK = 64 << 10  # below this a block of threads has too little to move


class PushArgs(ctypes.Structure):
    """``PushArgs`` of kernels/src/p2p_direct.cu."""

    _fields_ = [
        ("targets", ctypes.c_void_p * P2P_MAX_TARGETS),
        ("source", ctypes.c_void_p),
        ("bytes", ctypes.c_ulonglong),
    ]


def visible_gpus() -> int:
    """How many GPUs this process sees.

    Raises:
        BackendUnavailable: none (no driver, no cuda-python, no device), with the reason.
    """
    from ..backends import gpu_count

    count, reason = gpu_count()
    if count == 0:
        raise BackendUnavailable(reason)
    return count


class GpuSet:
    """Contexts, streams, events and kernels of GPUs ``0 .. count-1``.

    ``events`` is per GPU a list of ``events_per_gpu`` events (no timing) for ordering
    work between GPUs with ``cuStreamWaitEvent``.

    Raises:
        CudaError: a driver call failed (everything made so far is released).
        KernelCompileError: the kernels do not compile for a device.
    """

    def __init__(self, count: int, *, events_per_gpu: int = 1) -> None:
        from ..kernels.compiler import compile_kernel_source, device_arch
        from ..kernels.launcher import LoadedKernels

        self.count = count
        self.contexts: list[cuda_driver.PrimaryContext] = []
        self.streams: list[Any] = []
        self.events: list[list[Any]] = []
        self.kernels: list[LoadedKernels] = []
        self.sm_counts: list[int] = []
        self._memory: list[tuple[int, int]] = []  # (gpu, pointer)
        self._undo = contextlib.ExitStack()
        try:
            for gpu in range(count):
                context = cuda_driver.PrimaryContext(gpu)  # current from here on
                self._undo.callback(context.close)
                self.contexts.append(context)
                stream = check("cuStreamCreate", driver.cuStreamCreate(
                    int(driver.CUstream_flags.CU_STREAM_NON_BLOCKING)))
                self._undo.callback(self._in_context, gpu, driver.cuStreamDestroy, stream)
                self.streams.append(stream)
                events = []
                for _ in range(events_per_gpu):
                    event = check("cuEventCreate", driver.cuEventCreate(
                        int(driver.CUevent_flags.CU_EVENT_DISABLE_TIMING)))
                    self._undo.callback(self._in_context, gpu, driver.cuEventDestroy, event)
                    events.append(event)
                self.events.append(events)
                cubin = compile_kernel_source("p2p_direct.cu", arch=device_arch(gpu))
                kernels = LoadedKernels(cubin)
                self._undo.callback(self._in_context, gpu, lambda k=kernels: k.close())
                self.kernels.append(kernels)
                self.sm_counts.append(cuda_driver.device_attribute(gpu, "MULTIPROCESSOR_COUNT"))
        except BaseException:
            self._undo.close()
            raise

    def _in_context(self, gpu: int, release: Any, *handle: Any) -> None:
        # Releases run with their own GPU's context current (streams, events, modules and
        # memory belong to it), and never raise: the next release must still run.
        with contextlib.suppress(Exception):
            self.contexts[gpu].make_current()
            release(*handle)

    @property
    def closed(self) -> bool:
        return not self.contexts

    def activate(self, gpu: int) -> None:
        """Make ``gpu``'s context current on this thread.

        Raises:
            CudaError: the context is gone.
        """
        self.contexts[gpu].make_current()

    def allocate(self, gpu: int, nbytes: int) -> int:
        """``nbytes`` of device memory on ``gpu`` (freed by ``close``).

        Raises:
            CudaError: out of memory or another driver failure.
        """
        self.activate(gpu)
        pointer = int(check("cuMemAlloc", driver.cuMemAlloc(nbytes)))
        self._undo.callback(self._in_context, gpu, driver.cuMemFree, pointer)
        return pointer

    def upload(self, gpu: int, pointer: int, data: np.ndarray) -> None:
        """Copy host ``data`` to ``pointer`` on ``gpu`` (host-blocking)."""
        self.activate(gpu)
        data = np.ascontiguousarray(data)
        check("cuMemcpyHtoD", driver.cuMemcpyHtoD(pointer, data.ctypes.data, data.nbytes))
        self._settle()

    def _settle(self) -> None:
        # Synchronous copies and memsets from pageable memory may return before the device
        # has them, on the legacy stream, which our non-blocking streams do not wait for.
        check("cuCtxSynchronize", driver.cuCtxSynchronize())

    def download(self, gpu: int, pointer: int, nbytes: int) -> np.ndarray:
        """``nbytes`` from ``pointer`` on ``gpu`` as a new host array (host-blocking)."""
        self.activate(gpu)
        out = np.empty(nbytes, np.uint8)
        check("cuMemcpyDtoH", driver.cuMemcpyDtoH(out.ctypes.data, pointer, nbytes))
        return out

    def fill(self, gpu: int, pointer: int, value: int, nbytes: int) -> None:
        """Set ``nbytes`` at ``pointer`` on ``gpu`` to the byte ``value`` (host-blocking)."""
        self.activate(gpu)
        check("cuMemsetD8", driver.cuMemsetD8(pointer, value, nbytes))
        self._settle()

    def push(self, gpu: int, args: PushArgs, targets: int, stream: Any = None) -> None:
        """Launch ``p2p_push`` on ``gpu`` (its stream unless ``stream``): ``args.source``
        into the first ``targets`` of ``args.targets``. The driver copies ``args`` at
        launch, so the caller may reuse it at once. ``gpu``'s context must be current."""
        blocks = max(1, min(self.sm_counts[gpu], -(-int(args.bytes) // _BYTES_PER_BLOCK)))
        params = (ctypes.c_void_p * 1)(ctypes.addressof(args))
        check("cuLaunchKernel", driver.cuLaunchKernel(
            self.kernels[gpu].function("p2p_push"), blocks, targets, 1, _THREADS, 1, 1, 0,
            self.streams[gpu] if stream is None else stream, ctypes.addressof(params), 0))

    def spin(self, gpu: int, nanoseconds: int, stream: Any) -> None:
        """Launch ``p2p_spin`` (one thread busy for ``nanoseconds``) on ``stream`` of
        ``gpu``, whose context must be current."""
        value = ctypes.c_ulonglong(nanoseconds)
        params = (ctypes.c_void_p * 1)(ctypes.addressof(value))
        check("cuLaunchKernel", driver.cuLaunchKernel(
            self.kernels[gpu].function("p2p_spin"), 1, 1, 1, 1, 1, 1, 0, stream,
            ctypes.addressof(params), 0))

    def synchronize(self) -> None:
        """Wait until every GPU's stream is idle (host-blocking).

        Raises:
            CudaError: a kernel or copy failed (e.g. an illegal peer address).
        """
        for gpu in range(self.count):
            self.activate(gpu)
            check("cuStreamSynchronize", driver.cuStreamSynchronize(self.streams[gpu]))

    def close(self) -> None:
        """Free and release everything (idempotent)."""
        self._undo.close()
        self.contexts, self.streams, self.events, self.kernels = [], [], [], []

    def __enter__(self) -> GpuSet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class GpuHandles:
    """Handles a tool makes on a GpuSet's GPUs (modules, streams, events), each released
    with its own GPU's context current, in the reverse order of their making, once:
    ``close`` is idempotent, and a release that fails does not stop the others. A
    constructor that fails half-way calls ``close`` and so undoes itself."""

    def __init__(self, gpus: GpuSet) -> None:
        self.gpus = gpus
        self._undo = contextlib.ExitStack()

    def own(self, gpu: int, release: Any, *handle: Any) -> None:
        """Release ``handle`` with ``release(*handle)`` on ``gpu`` at ``close``."""
        self._undo.callback(self._release, gpu, release, *handle)

    def load_kernels(self, gpu: int, source: Any) -> Any:
        """``source`` (a kernels file) compiled for ``gpu`` and loaded there, owned."""
        from ..kernels.compiler import compile_kernel_source, device_arch
        from ..kernels.launcher import LoadedKernels

        self.gpus.activate(gpu)
        kernels = LoadedKernels(compile_kernel_source(source, arch=device_arch(gpu)))
        self.own(gpu, kernels.close)
        return kernels

    def new_stream(self, gpu: int) -> Any:
        """A non-blocking stream on ``gpu``, owned."""
        self.gpus.activate(gpu)
        stream = check("cuStreamCreate", driver.cuStreamCreate(
            int(driver.CUstream_flags.CU_STREAM_NON_BLOCKING)))
        self.own(gpu, driver.cuStreamDestroy, stream)
        return stream

    def _release(self, gpu: int, release: Any, *handle: Any) -> None:
        with contextlib.suppress(Exception):
            self.gpus.activate(gpu)
            release(*handle)

    def close(self) -> None:
        self._undo.close()
