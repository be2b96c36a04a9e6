"""A closing window meets its own unmet signal waits from the host (CudaEngine.release_waits),
so a stream stuck on a peer that never signalled drains before its memory is freed; and the
host's look at a signal word (for the timeout's message) is bounded, so diagnosis can never
hang. The driver is replaced by a dictionary of words and a probe stream that finishes or
not on demand: no GPU needed."""

from __future__ import annotations

import ctypes
import time
import types

import pytest

cuda_engine = pytest.importorskip("ipcshare.backends.cuda_engine")
from ipcshare.runtime import cuda_driver  # noqa: E402


class _Words:
    """The driver calls of the engine's probe lane over a dict of 64-bit words."""

    CUstream_flags = cuda_driver.driver.CUstream_flags

    def __init__(self, *, finishes: bool = True) -> None:
        self.words: dict[int, int] = {}
        self.writes: list[int] = []
        self.finishes = finishes
        self.pinned: list[ctypes.c_uint64] = []
        self.freed: list[int] = []
        self.streams_destroyed = 0

    def cuStreamCreate(self, _flags: int):
        return (cuda_driver.SUCCESS, 0x5EED)

    def cuStreamDestroy(self, _stream):
        self.streams_destroyed += 1
        return (cuda_driver.SUCCESS,)

    def cuMemHostAlloc(self, _size: int, _flags: int):
        self.pinned.append(ctypes.c_uint64(0))
        return (cuda_driver.SUCCESS, ctypes.addressof(self.pinned[-1]))

    def cuMemFreeHost(self, address: int):
        self.freed.append(address)
        return (cuda_driver.SUCCESS,)

    def cuMemcpyDtoHAsync(self, dst: int, src: int, size: int, _stream):
        if self.finishes:
            ctypes.c_uint64.from_address(dst).value = (self.words.get(src, 0)
                                                       & ((1 << 8 * size) - 1))
        return (cuda_driver.SUCCESS,)

    def write(self, _stream, dst: int, value: int, _flags: int):
        if self.finishes:
            self.words[dst] = value
            self.writes.append(dst)
        return (cuda_driver.SUCCESS,)

    def cuStreamQuery(self, _stream):
        return (cuda_driver.SUCCESS if self.finishes else cuda_driver.NOT_READY,)


def _engine(monkeypatch, words: _Words, wide: bool):
    monkeypatch.setattr(cuda_engine, "driver", words)
    engine = cuda_engine.CudaEngine.__new__(cuda_engine.CudaEngine)
    engine.wide_signals = wide
    engine._mask = (1 << 64) - 1 if wide else (1 << 32) - 1
    engine._write = words.write
    engine._probe_lane, engine._probe_stuck = None, False
    engine._parent, engine._timers, engine._side, engine._fork = None, set(), [], None
    engine._stream, engine._keep, engine.device = None, [], 0
    return engine


@pytest.mark.parametrize("wide", [True, False])
def test_only_unmet_waits_on_the_given_pad_are_met(monkeypatch, wide):
    words = _Words()
    engine = _engine(monkeypatch, words, wide)
    pad = types.SimpleNamespace(ptr=0x10000, nbytes=65536)
    unmet, met, elsewhere = pad.ptr + 8 * 261, pad.ptr + 8 * 262, 0x90000
    words.words[met] = 5
    engine._pending = {unmet: (7, 0.5, "waiting for rank 1"), met: (5, 0.5, "done"),
                       elsewhere: (1, 0.5, "another window")}
    assert engine.release_waits(pad) == 1
    assert words.writes == [unmet] and words.words[unmet] == 7
    assert elsewhere not in words.words
    assert engine.release_waits(pad) == 0  # met now: nothing more to write
    engine.close()
    assert words.streams_destroyed == 1 and words.freed == [ctypes.addressof(words.pinned[0])]


def test_a_probe_that_never_finishes_gives_up_in_bounded_time_and_is_not_retried(monkeypatch):
    words = _Words(finishes=False)
    engine = _engine(monkeypatch, words, True)
    pad = types.SimpleNamespace(ptr=0x10000, nbytes=65536)
    engine._pending = {pad.ptr + 8 * 261: (7, 0.5, "waiting for rank 1")}
    started = time.monotonic()
    assert engine._peek_word(pad.ptr + 8 * 261) is None
    assert time.monotonic() - started < 2 * cuda_engine._PROBE_TIMEOUT_S + 0.5
    started = time.monotonic()
    assert engine.release_waits(pad) == 0  # the lane is stuck: not tried again
    assert "is unreadable" in engine._timeout_message(0.5)
    assert time.monotonic() - started < 0.1
    engine.close()
    # A copy may still land in the pinned word: it is not freed under it.
    assert words.streams_destroyed == 1 and words.freed == []


def test_a_view_on_another_stream_probes_through_its_owners_lane(monkeypatch):
    import copy

    words = _Words()
    owner = _engine(monkeypatch, words, True)
    owner._pending = {}
    view = copy.copy(owner)
    view._parent = owner
    words.words[0x10008] = 3
    assert view._peek_word(0x10008) == 3
    assert owner._probe_lane is not None      # made once, owned by the stream's owner
    view.close()                              # a view only forgets its stream
    assert words.streams_destroyed == 0
    owner.close()                             # the owner frees the lane it holds
    assert words.streams_destroyed == 1 and len(words.freed) == 1
