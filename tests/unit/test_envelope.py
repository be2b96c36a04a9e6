"""The checked handle envelope: what it accepts, what it refuses, and that no input
makes it do anything but return the payload or raise ExchangeError."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ipcshare.backends.host import HANDLE_FORMAT, parse_host_handle
from ipcshare.exchange.envelope import ENVELOPE, open_sealed, seal
from ipcshare.runtime.errors import BackendError, ExchangeError

from ..hypothesis_profiles import examples

TOKEN = "0123456789abcdef"
OTHER = "fedcba9876543210"
FIELDS = {"kind": "host", "token": TOKEN, "rank": 2, "sequence": 7}
EXPECT = {"kind": "host", "token": TOKEN, "sender": 2, "sequence": 7}


def test_a_sealed_payload_opens_to_itself():
    assert open_sealed(seal(b"payload", **FIELDS), **EXPECT) == b"payload"
    assert open_sealed(seal(b"", **FIELDS), **EXPECT) == b""


@pytest.mark.parametrize("expect,message", [
    ({"token": OTHER}, "belongs to another job"),
    ({"kind": "cuda-ipc"}, "is a host handle; this group uses cuda-ipc"),
    ({"sender": 3}, "claims to come from rank 2"),
    ({"sequence": 8}, "belongs to exchange 7, this is exchange 8"),
])
def test_a_handle_meant_for_someone_else_is_refused(expect, message):
    with pytest.raises(ExchangeError, match=message):
        open_sealed(seal(b"payload", **FIELDS), **{**EXPECT, **expect})


def test_a_newer_format_is_named():
    data = bytearray(seal(b"x", **FIELDS))
    struct.pack_into("!H", data, 4, 9)
    with pytest.raises(ExchangeError, match="format version 9; this ipcshare reads version 1"):
        open_sealed(bytes(data), **EXPECT)


@settings(max_examples=examples(300), deadline=None)
@given(payload=st.binary(max_size=200), position=st.integers(min_value=0),
       flip=st.integers(min_value=1, max_value=255))
def test_any_single_corrupted_byte_is_caught(payload, position, flip):
    data = bytearray(seal(payload, **FIELDS))
    position %= len(data)
    data[position] ^= flip
    with pytest.raises(ExchangeError):
        open_sealed(bytes(data), **EXPECT)


@settings(max_examples=examples(300), deadline=None)
@given(payload=st.binary(max_size=200), cut=st.integers(min_value=1))
def test_any_truncation_is_caught(payload, cut):
    data = seal(payload, **FIELDS)
    with pytest.raises(ExchangeError, match="truncated"):
        open_sealed(data[:-(1 + cut % len(data))], **EXPECT)


@settings(max_examples=examples(500), deadline=None)
@given(data=st.one_of(st.binary(max_size=300),
                      st.binary(max_size=300).map(lambda b: b"IPSE" + b),
                      st.binary(min_size=ENVELOPE.size, max_size=300).map(
                          lambda b: b"IPSE\x00\x01" + b[6:])))
def test_random_bytes_never_open_and_never_crash(data):
    with pytest.raises(ExchangeError):
        open_sealed(data, **EXPECT)


@settings(max_examples=examples(300), deadline=None)
@given(data=st.one_of(st.binary(max_size=64),
                      st.binary(min_size=HANDLE_FORMAT.size - 4,
                                max_size=HANDLE_FORMAT.size - 4).map(lambda b: b"IPCH" + b)))
def test_the_host_handle_parser_raises_only_backend_errors(data):
    try:
        nbytes = parse_host_handle(data)
    except BackendError:
        return
    assert data[:6] == b"IPCH\x00\x01" and nbytes == struct.unpack_from("!Q", data, 6)[0]


def test_non_bytes_are_refused_with_a_clear_error():
    with pytest.raises(ExchangeError, match="is a NoneType, not bytes"):
        open_sealed(None, **EXPECT)  # type: ignore[arg-type]
