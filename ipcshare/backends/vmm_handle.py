"""The cuda-vmm handle as it travels: a header (magic, format version, bytes announced and
mapped, handle type, the exporter's device UUID, pid and allocation number), followed for
fabric handles by the 64-byte CUmemFabricHandle (a POSIX-FD handle's descriptor travels
beside it)."""

from __future__ import annotations

import dataclasses
import struct

from ..runtime.errors import BackendError
from .handle_header import check_magic_and_version

__all__ = ["VmmHandleInfo", "parse_vmm_handle", "pack_vmm_header", "VMM_HEADER",
           "FABRIC_HANDLE_BYTES"]

# magic, format version, bytes announced, bytes mapped (granularity-rounded), handle
# type code, exporter's device UUID, exporter pid, exporter's allocation number.
# A fabric payload carries the 64-byte CUmemFabricHandle after it.
VMM_HEADER = struct.Struct("!4sHQQB16sIQ")
_MAGIC = b"IPCV"
_VERSION = 1
_HANDLE_CODES = {"posix-fd": 1, "fabric": 2}
_HANDLE_NAMES = {code: name for name, code in _HANDLE_CODES.items()}
FABRIC_HANDLE_BYTES = 64


def pack_vmm_header(nbytes: int, size: int, handle: str, device_uuid: bytes, pid: int,
                    number: int) -> bytes:
    """The header of a cuda-vmm payload (``handle``: posix-fd or fabric)."""
    return VMM_HEADER.pack(_MAGIC, _VERSION, nbytes, size, _HANDLE_CODES[handle], device_uuid,
                           pid, number)


@dataclasses.dataclass(frozen=True)
class VmmHandleInfo:
    """A parsed cuda-vmm payload."""

    nbytes: int
    size: int
    handle: str
    device_uuid: bytes
    pid: int
    number: int
    fabric: bytes | None

    @property
    def key(self) -> tuple[bytes, int, int]:
        """Identity of the exporter's allocation (for the import cache)."""
        return (self.device_uuid, self.pid, self.number)


def parse_vmm_handle(payload: bytes) -> VmmHandleInfo:
    """Validate and split a cuda-vmm payload.

    Raises:
        BackendError: wrong length, magic, version, handle type or sizes.
    """
    payload = bytes(payload)
    if len(payload) < VMM_HEADER.size:
        raise BackendError(
            f"cuda-vmm handle has {len(payload)} bytes, fewer than its "
            f"{VMM_HEADER.size}-byte header")
    magic, version, nbytes, size, code, uuid, pid, number = VMM_HEADER.unpack_from(payload)
    check_magic_and_version("cuda-vmm", magic, version, expected_magic=_MAGIC,
                            expected_version=_VERSION)
    handle = _HANDLE_NAMES.get(code)
    if handle is None:
        raise BackendError(f"cuda-vmm handle names unknown handle type {code}")
    expected = VMM_HEADER.size + (FABRIC_HANDLE_BYTES if handle == "fabric" else 0)
    if len(payload) != expected:
        raise BackendError(
            f"cuda-vmm {handle} handle has {len(payload)} bytes, expected {expected}")
    if size < nbytes or size == 0:
        raise BackendError(f"cuda-vmm handle maps {size} bytes, fewer than the {nbytes} announced")
    fabric = payload[VMM_HEADER.size:] if handle == "fabric" else None
    return VmmHandleInfo(nbytes, size, handle, uuid, pid, number, fabric)
