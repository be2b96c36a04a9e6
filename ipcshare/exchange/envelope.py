"""The checked wrapper every handle travels in: magic, version, job token, backend kind,
sender rank, exchange sequence, payload length and a CRC-32, verified before a backend
sees a byte of the payload.

A backend's own format says what a handle means; the envelope says whether it is meant
for us: from this job (not a previous one on the same node), from the rank that sent
it, for this exchange (not a replay of an earlier window's), of the backend we run, and
intact.
"""

from __future__ import annotations

import struct
import zlib

from ..runtime.errors import ExchangeError

__all__ = ["seal", "open_sealed", "ENVELOPE", "ENVELOPE_VERSION", "KIND_CODES"]

# magic, version, kind, job token (8 bytes), sender rank, sequence, payload bytes, crc32
ENVELOPE = struct.Struct("!4sHB8sIQII")
ENVELOPE_VERSION = 1
_MAGIC = b"IPSE"
_CRC_OFFSET = ENVELOPE.size - 4
# Handles above this size are not ours: the largest real one (a fabric handle) is ~150 B.
MAX_PAYLOAD_BYTES = 4096
KIND_CODES = {"opaque": 0, "host": 1, "cuda-ipc": 2, "cuda-vmm": 3}
_KIND_NAMES = {code: name for name, code in KIND_CODES.items()}


def _token_bytes(token: str) -> bytes:
    raw = bytes.fromhex(token)
    if len(raw) != 8:
        raise ValueError(f"job token must be 16 hex digits, got {token!r}")
    return raw


def seal(payload: bytes, *, kind: str, token: str, rank: int, sequence: int) -> bytes:
    """Wrap ``payload`` for the exchange number ``sequence`` of the job ``token``."""
    payload = bytes(payload)
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise ExchangeError(f"a handle of {len(payload)} bytes is larger than the "
                            f"{MAX_PAYLOAD_BYTES} an envelope carries")
    header = ENVELOPE.pack(_MAGIC, ENVELOPE_VERSION, KIND_CODES[kind], _token_bytes(token),
                           rank, sequence, len(payload), 0)
    crc = zlib.crc32(payload, zlib.crc32(header[:_CRC_OFFSET]))
    return header[:_CRC_OFFSET] + struct.pack("!I", crc) + payload


def open_sealed(data: bytes, *, kind: str, token: str, sender: int, sequence: int,
                sender_name: str | None = None) -> bytes:
    """The payload inside ``data``, after checking every field of the envelope.

    ``sender_name`` spells the sending rank in messages (default ``rank N``).

    Raises:
        ExchangeError: truncated, corrupted, foreign (another job, another kind of
            backend), misaddressed or stale (an earlier exchange's) handle.
    """
    who = sender_name or f"rank {sender}"
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ExchangeError(f"handle from {who} is a {type(data).__name__}, not bytes")
    data = bytes(data)
    if len(data) < ENVELOPE.size:
        raise ExchangeError(f"handle from {who} is truncated: {len(data)} bytes, fewer than "
                            f"its {ENVELOPE.size}-byte header")
    magic, version, code, job, rank, seq, length, crc = ENVELOPE.unpack_from(data)
    if magic != _MAGIC:
        raise ExchangeError(f"handle from {who} has a bad magic number (not an ipcshare "
                            "handle, or corrupted)")
    if version != ENVELOPE_VERSION:
        raise ExchangeError(f"handle from {who} has format version {version}; this ipcshare "
                            f"reads version {ENVELOPE_VERSION} (mixed installations?)")
    if len(data) != ENVELOPE.size + length:
        raise ExchangeError(f"handle from {who} is truncated or padded: {len(data)} bytes, "
                            f"its header announces {ENVELOPE.size + length}")
    payload = data[ENVELOPE.size:]
    if zlib.crc32(payload, zlib.crc32(data[:_CRC_OFFSET])) != crc:
        raise ExchangeError(f"handle from {who} fails its checksum (corrupted in transit)")
    if job != _token_bytes(token):
        raise ExchangeError(f"handle from {who} belongs to another job (token {job.hex()}, "
                            f"ours {token})")
    if code != KIND_CODES[kind]:
        theirs = _KIND_NAMES.get(code, f"unknown kind {code}")
        raise ExchangeError(f"handle from {who} is a {theirs} handle; this group uses {kind}")
    if rank != sender:
        raise ExchangeError(f"handle from {who} claims to come from rank {rank}")
    if seq != sequence:
        raise ExchangeError(f"handle from {who} belongs to exchange {seq}, this is exchange "
                            f"{sequence} (a stale or replayed handle)")
    return payload
