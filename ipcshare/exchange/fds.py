"""The old home of ``OwnedFd``, kept because tests name it: see ``ipcshare.runtime.owned_fd``."""

from ..runtime.owned_fd import OwnedFd

__all__ = ["OwnedFd"]
