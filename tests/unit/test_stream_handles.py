"""Streams from other libraries become raw CUstream handles; anything else is refused."""

import pytest

pytest.importorskip("cuda.bindings.driver")

from ipcshare.backends.cuda_streams import stream_handle
from ipcshare.runtime.errors import ConfigError


class CoreLikeStream:  # cuda.core's protocol
    def __cuda_stream__(self):
        return (0, 0xBEEF)


class TorchLikeStream:
    cuda_stream = 0xCAFE


class CupyLikeStream:
    ptr = 0xF00D


def test_each_kind_of_stream_gives_its_handle():
    from cuda.bindings import driver

    assert stream_handle(CoreLikeStream()) == 0xBEEF
    assert stream_handle(TorchLikeStream()) == 0xCAFE
    assert stream_handle(CupyLikeStream()) == 0xF00D
    assert stream_handle(driver.CUstream(0x1234)) == 0x1234
    assert stream_handle(7) == 7


class FutureProtocol:
    def __cuda_stream__(self):
        return (3, 1)


class BrokenProtocol:
    def __cuda_stream__(self):
        return "stream"


@pytest.mark.parametrize("value,message", [
    ("stream", "not a CUDA stream: str"),
    (True, "not a CUDA stream: True"),
    (-1, "not a CUDA stream handle: -1"),
    (object(), "not a CUDA stream: object"),
    (FutureProtocol(), "speaks version 3"),
    (BrokenProtocol(), "not \\(version, handle\\)"),
])
def test_what_is_not_a_stream_is_a_clear_error(value, message):
    with pytest.raises(ConfigError, match=message):
        stream_handle(value)
