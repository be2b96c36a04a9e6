"""The check every handle format makes of its header before reading the rest: the magic
number says it is an ipcshare handle of this kind, the version that this code reads it."""

from __future__ import annotations

from ..runtime.errors import BackendError

__all__ = ["check_magic_and_version"]


def check_magic_and_version(kind: str, magic: bytes, version: int, *, expected_magic: bytes,
                            expected_version: int, same_backend_hint: bool = True) -> None:
    """Raise unless a ``kind`` handle (``host``, ``cuda-ipc``, ``cuda-vmm``) carries the
    expected magic and version.

    Raises:
        BackendError: ``cuda-vmm handle has a bad magic number (...)`` or ``cuda-vmm handle
            format 2 is not supported (expected 1)``.
    """
    if magic != expected_magic:
        hint = ": do all ranks use the same backend?" if same_backend_hint else ""
        raise BackendError(f"{kind} handle has a bad magic number (not an ipcshare {kind} "
                           f"handle{hint})")
    if version != expected_version:
        raise BackendError(
            f"{kind} handle format {version} is not supported (expected {expected_version})")
