"""Node-shared pinned host memory: a sealed memfd that one rank creates and other ranks of
the node map, each process registering its own mapping with the driver
(``cuMemHostRegister`` with DEVICEMAP and PORTABLE), so that copies and stream memory
operations (``cuStreamWriteValue64`` / ``cuStreamWaitValue64``) reach it through the
device pointer ``cuMemHostGetDevicePointer`` gives.

This is where GPU pairs without peer access meet: their barrier words, their staged
copies' flags and, for host-staged pairs, the staged bytes themselves.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

from ..runtime.cuda_driver import check, driver
from ..runtime.errors import CudaError
from ..runtime.finalizers import finalize_unclosed, release_now
from ..runtime.owned_fd import OwnedFd
from .device_buffer import DeviceBuffer
from .host import HostAllocation, check_peer_memfd, create_sealed_memfd, map_peer_memfd

__all__ = ["PinnedHostMemory", "create_pinned", "open_peer_pinned"]

# Page-locked, mapped into the device's address space, and pinned for every context of
# the process (the primary context of the window's device is not the only one there).
_REGISTER_FLAGS = driver.CU_MEMHOSTREGISTER_DEVICEMAP | driver.CU_MEMHOSTREGISTER_PORTABLE


def _release(host_ptr: int, allocation: HostAllocation) -> None:
    # Unregister before unmapping (the driver must let go of the pages first); the
    # mapping goes even if the driver refused, and the first failure is reported.
    try:
        check("cuMemHostUnregister", driver.cuMemHostUnregister(host_ptr))
    finally:
        allocation.close()


class PinnedHostMemory:
    """One memfd mapping of this process, registered with the driver: ``device_ptr`` is
    where this process's GPU work reaches its bytes. Owns the mapping and the
    registration; ``close()`` undoes both (idempotent), a finalizer warns if it never ran.

    The device's context must be current when it is created and closed.

    Raises:
        CudaError: cuMemHostRegister or cuMemHostGetDevicePointer failed (the mapping is
            closed again).
    """

    def __init__(self, allocation: HostAllocation, device: int, *, what: str) -> None:
        self.nbytes = allocation.nbytes
        self.device = device
        self.host_ptr = allocation.ptr
        self.what = what
        try:
            check("cuMemHostRegister",
                  driver.cuMemHostRegister(self.host_ptr, self.nbytes, _REGISTER_FLAGS))
        except BaseException:
            allocation.close()
            raise
        try:
            self.device_ptr = int(check("cuMemHostGetDevicePointer",
                                        driver.cuMemHostGetDevicePointer(self.host_ptr, 0)))
        except BaseException:
            with contextlib.suppress(Exception):
                driver.cuMemHostUnregister(self.host_ptr)
            allocation.close()
            raise
        # The finalizer holds plain values and the allocation, never this object.
        self._finalizer = finalize_unclosed(
            self, functools.partial(_release, self.host_ptr, allocation),
            f"ipcshare: {what} of {self.nbytes} bytes was never closed; released it now")
        self._allocation = allocation

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def device_buffer(self, offset: int = 0, nbytes: int | None = None) -> DeviceBuffer:
        """``[offset, offset + nbytes)`` as device memory of this process's GPU (what
        copies and stream memory operations take)."""
        if self.closed:
            raise CudaError(f"cuMemHostGetDevicePointer -> {self.what} is closed")
        nbytes = self.nbytes - offset if nbytes is None else nbytes
        return DeviceBuffer(self.device_ptr, self.nbytes, self.device, self).slice(offset, nbytes)

    def words(self) -> Any:
        """The bytes as native 64-bit words, read from the host (tests, diagnosis)."""
        return self._allocation.buffer().words()

    def close(self) -> None:
        """Unregister and unmap (idempotent).

        Raises:
            CudaError: cuMemHostUnregister failed (the mapping is gone anyway).
        """
        release_now(self._finalizer, functools.partial(_release, self.host_ptr, self._allocation))


def create_pinned(nbytes: int, device: int, *, what: str) -> tuple[PinnedHostMemory, OwnedFd]:
    """A new zeroed memfd of ``nbytes`` (a multiple of the page size), mapped and
    registered here, and its descriptor for the node's other ranks (the caller closes it).

    Raises:
        BackendError / OSError: the memfd could not be made.
        CudaError: the registration failed (nothing stays open).
    """
    fd, mapping = create_sealed_memfd(nbytes, name="ipcshare-pinned")
    try:
        memory = PinnedHostMemory(HostAllocation(None, mapping, nbytes), device, what=what)
    except BaseException:
        fd.close()
        raise
    return memory, fd


def open_peer_pinned(fd: OwnedFd, nbytes: int, device: int, *, what: str) -> PinnedHostMemory:
    """Map and register ``nbytes`` of a peer's pinned memfd (checked first: sealed, large
    enough). The caller still closes ``fd``.

    Raises:
        BackendError: not a sealed memfd of at least ``nbytes``, or mmap failed.
        CudaError: the registration failed (the mapping is closed again).
    """
    check_peer_memfd(fd.fileno(), nbytes)
    mapping = map_peer_memfd(fd, nbytes)
    return PinnedHostMemory(HostAllocation(None, mapping, nbytes), device, what=what)
