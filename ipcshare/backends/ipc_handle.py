"""The cuda-ipc handle as it travels: a header (magic, format version, bytes, the
exporter's device UUID) and the 64-byte cuIpcMemHandle; written by ``legacy_ipc_payload``
and read by ``parse_ipc_handle``, for windows (``cuda_ipc``) and for memory the user
already has (``device_existing``)."""

from __future__ import annotations

import dataclasses
import struct

from ..runtime.cuda_driver import check, driver
from ..runtime.errors import BackendError
from .handle_header import check_magic_and_version

__all__ = ["IpcHandleInfo", "parse_ipc_handle", "legacy_ipc_payload", "IPC_HEADER",
           "IPC_PAYLOAD_BYTES"]

# magic, format version, bytes, exporter's device UUID; the 64-byte handle follows.
IPC_HEADER = struct.Struct("!4sHQ16s")
_MAGIC = b"IPCC"
_VERSION = 1
_IPC_HANDLE_BYTES = 64
IPC_PAYLOAD_BYTES = IPC_HEADER.size + _IPC_HANDLE_BYTES



def legacy_ipc_payload(base: int, nbytes: int, device_uuid: bytes) -> bytes:
    """The cuda-ipc payload of the cudaMalloc allocation starting at ``base``: a header
    and its cuIpcMemHandle (the current context must be ``base``'s).

    Raises:
        BackendError: the driver gave a handle of an unexpected size.
        CudaError: cuIpcGetMemHandle failed.
    """
    handle = check("cuIpcGetMemHandle", driver.cuIpcGetMemHandle(base))
    raw = bytes(handle.reserved)
    if len(raw) != _IPC_HANDLE_BYTES:
        raise BackendError(
            f"cuIpcGetMemHandle gave {len(raw)} bytes, expected {_IPC_HANDLE_BYTES}")
    return IPC_HEADER.pack(_MAGIC, _VERSION, nbytes, device_uuid) + raw


@dataclasses.dataclass(frozen=True)
class IpcHandleInfo:
    """A parsed cuda-ipc payload."""

    nbytes: int
    device_uuid: bytes
    handle: bytes


def parse_ipc_handle(payload: bytes) -> IpcHandleInfo:
    """Validate and split a cuda-ipc payload.

    Raises:
        BackendError: wrong length, magic or version.
    """
    payload = bytes(payload)
    if len(payload) != IPC_PAYLOAD_BYTES:
        raise BackendError(
            f"cuda-ipc handle has {len(payload)} bytes, expected {IPC_PAYLOAD_BYTES}")
    magic, version, nbytes, uuid = IPC_HEADER.unpack_from(payload)
    check_magic_and_version("cuda-ipc", magic, version, expected_magic=_MAGIC,
                            expected_version=_VERSION)
    return IpcHandleInfo(nbytes, uuid, payload[IPC_HEADER.size:])
