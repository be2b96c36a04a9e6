"""A refused call asks, where its stream is being captured, whether the capture is still
valid before it binds and before it launches, so a capture invalidated earlier (an
operation not allowed during a capture, such as a CUDA graph destroyed by the garbage
collector) is named as such instead of failing the launch with the driver's error. The
driver's cuStreamIsCapturing is replaced by a stub: no GPU needed."""

from __future__ import annotations

import types

import pytest

cuda_streams = pytest.importorskip("ipcshare.backends.cuda_streams")
from ipcshare.collectives import gpu_path  # noqa: E402
from ipcshare.runtime import cuda_driver  # noqa: E402
from ipcshare.runtime.errors import CollectiveError  # noqa: E402

_STATUS = cuda_driver.driver.CUstreamCaptureStatus


def _driver_reporting(status):
    asked: list[int] = []

    def is_capturing(stream):
        asked.append(int(stream))
        return (cuda_driver.SUCCESS, status)
    fake = types.SimpleNamespace(cuStreamIsCapturing=is_capturing,
                                 CUstream=cuda_driver.driver.CUstream,
                                 CUstreamCaptureStatus=_STATUS)
    return fake, asked


@pytest.mark.parametrize(("status", "invalidated"), [
    (_STATUS.CU_STREAM_CAPTURE_STATUS_NONE, False),
    (_STATUS.CU_STREAM_CAPTURE_STATUS_ACTIVE, False),
    (_STATUS.CU_STREAM_CAPTURE_STATUS_INVALIDATED, True)])
def test_capture_invalidated_reads_the_streams_capture_status(monkeypatch, status,
                                                              invalidated):
    fake, asked = _driver_reporting(status)
    monkeypatch.setattr(cuda_streams, "driver", fake)
    assert cuda_streams.capture_invalidated(0x5EED) is invalidated
    assert cuda_streams.stream_capturing(0x5EED) is (
        status != _STATUS.CU_STREAM_CAPTURE_STATUS_NONE)
    assert asked == [0x5EED, 0x5EED]


def test_a_refused_call_in_an_invalidated_capture_names_the_step(monkeypatch):
    fake, _ = _driver_reporting(_STATUS.CU_STREAM_CAPTURE_STATUS_INVALIDATED)
    monkeypatch.setattr(cuda_streams, "driver", fake)
    with pytest.raises(CollectiveError) as caught:
        gpu_path._check_capture_valid("all_to_all_v", 0x5EED, "before its kernels were "
                                      "launched")
    message = str(caught.value)
    assert message.startswith("all_to_all_v: the CUDA graph capture of this stream was "
                              "invalidated before its kernels were launched")
    assert "\n" not in message


def test_a_refused_call_in_a_valid_capture_goes_on(monkeypatch):
    fake, asked = _driver_reporting(_STATUS.CU_STREAM_CAPTURE_STATUS_ACTIVE)
    monkeypatch.setattr(cuda_streams, "driver", fake)
    gpu_path._check_capture_valid("all_to_all_v", 0x5EED, "before its kernels were launched")
    assert asked == [0x5EED]
