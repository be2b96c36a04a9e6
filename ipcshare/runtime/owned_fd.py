"""Owned file descriptors: one owner, idempotent close, use after close raises."""

from __future__ import annotations

import functools
import os

from .finalizers import finalize_unclosed

__all__ = ["OwnedFd"]


def _close_quietly(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


class OwnedFd:
    """A file descriptor with exactly one owner.

    ``close()`` is idempotent; ``fileno()`` after close raises ``ValueError``; a
    descriptor dropped without ``close()`` is closed by a finalizer that warns.
    """

    __slots__ = ("_fd", "_finalizer", "__weakref__")

    def __init__(self, fd: int) -> None:
        if fd < 0:
            raise ValueError(f"not a file descriptor: {fd}")
        self._fd = fd
        self._finalizer = finalize_unclosed(
            self, functools.partial(_close_quietly, fd),
            f"ipcshare: descriptor {fd} was never closed; closing it now")

    def fileno(self) -> int:
        """The raw descriptor number.

        Raises:
            ValueError: the descriptor was closed or detached.
        """
        if self._fd < 0:
            raise ValueError("descriptor is closed")
        return self._fd

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def detach(self) -> int:
        """Give up ownership: return the number, which the caller must close."""
        fd = self.fileno()
        self._finalizer.detach()
        self._fd = -1
        return fd

    def close(self) -> None:
        """Close the descriptor (idempotent)."""
        if self._fd >= 0:
            self._finalizer.detach()
            _close_quietly(self._fd)
            self._fd = -1

    def __enter__(self) -> OwnedFd:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"OwnedFd({self._fd})" if self._fd >= 0 else "OwnedFd(closed)"

