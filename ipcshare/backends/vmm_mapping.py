"""cuMem mappings: reserve, map and grant access with an undo for each step, and the
release that unmaps, frees the addresses and drops the handle; used by the cuda-vmm
backend and by memory the user already has (``device_existing``)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from ..runtime import cuda_driver
from ..runtime.cuda_driver import check, driver
from ..runtime.errors import CudaError
from ..runtime.owned_fd import OwnedFd

__all__ = ["map_handle", "open_posix_fd", "mapping_releaser", "undo_quietly", "SharedRange"]


def _release_mapping(ptr: int, size: int, handle: Any) -> None:
    # Unmap, free the address range, release the handle: each step runs even if an
    # earlier one failed, and the first failure is reported.
    first: CudaError | None = None
    for call, result in (("cuMemUnmap", lambda: driver.cuMemUnmap(ptr, size)),
                         ("cuMemAddressFree", lambda: driver.cuMemAddressFree(ptr, size)),
                         ("cuMemRelease", lambda: driver.cuMemRelease(handle))):
        try:
            check(call, result())
        except CudaError as exc:
            first = first or exc
    if first is not None:
        raise first


def mapping_releaser(ptr: int, size: int, handle: Any) -> Callable[[], None]:
    """The release of one whole mapping: unmap, free the addresses, release the handle
    (each step runs; the first failure is raised as CudaError)."""
    return lambda: _release_mapping(ptr, size, handle)


def undo_quietly(call: Callable[..., Any], *args: Any) -> None:
    """One rollback step after a failure: ``call(*args)``, its own errors swallowed,
    because the original error is the one worth reporting."""
    with contextlib.suppress(Exception):
        call(*args)


def map_handle(handle: Any, size: int, alignment: int, access: list, undo: contextlib.ExitStack
               ) -> int:
    """Reserve ``size`` bytes of addresses, map ``handle`` there and grant ``access``;
    each step's undo goes on ``undo``. Returns the address.

    Raises:
        CudaError: the failing step.
    """
    ptr = int(check("cuMemAddressReserve", driver.cuMemAddressReserve(size, alignment, 0, 0)))
    undo.callback(undo_quietly, driver.cuMemAddressFree, ptr, size)
    check("cuMemMap", driver.cuMemMap(ptr, size, 0, handle, 0))
    undo.callback(undo_quietly, driver.cuMemUnmap, ptr, size)
    # Each process grants access to its own device only; importers do the same.
    check("cuMemSetAccess", driver.cuMemSetAccess(ptr, size, access, len(access)))
    return ptr


def open_posix_fd(fd: OwnedFd, size: int, alignment: int, access: list
                  ) -> tuple[int, int, Callable[[], None]]:
    """Import a cuMem POSIX-FD handle and map its ``size`` bytes here: (address, bytes,
    release), everything undone on a failure half-way. The caller closes ``fd``.

    Raises:
        CudaError: import, reserve, map or set-access failed.
    """
    posix = cuda_driver.handle_type("posix-fd")
    with contextlib.ExitStack() as undo:
        # The binding passes an int as (void*)fd, as C does.
        handle = check("cuMemImportFromShareableHandle",
                       driver.cuMemImportFromShareableHandle(fd.fileno(), posix))
        undo.callback(undo_quietly, driver.cuMemRelease, handle)
        ptr = map_handle(handle, size, alignment, access, undo)
        undo.pop_all()
    return ptr, size, mapping_releaser(ptr, size, handle)


class SharedRange:
    """One reserved virtual range holding several peers' mappings: each peer unmaps and
    releases its own part; the range is freed with the last part."""

    def __init__(self, base: int, size: int, parts: int) -> None:
        self._base, self._size, self._parts = base, size, parts

    def releaser(self, ptr: int, size: int, handle: Any) -> Callable[[], None]:
        def release() -> None:
            first: CudaError | None = None
            for call, result in (("cuMemUnmap", lambda: driver.cuMemUnmap(ptr, size)),
                                 ("cuMemRelease", lambda: driver.cuMemRelease(handle))):
                try:
                    check(call, result())
                except CudaError as exc:
                    first = first or exc
            self._parts -= 1
            if self._parts == 0:
                try:
                    check("cuMemAddressFree", driver.cuMemAddressFree(self._base, self._size))
                except CudaError as exc:
                    first = first or exc
            if first is not None:
                raise first
        return release
