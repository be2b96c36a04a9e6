"""The device engine: copies, signals and barriers as work on one non-blocking stream.

Everything is stream-ordered: ``copy`` and ``store_signal`` return once enqueued, and
``wait_signal`` makes later work on the stream wait (cuStreamWaitValue64) without
blocking the host. The host blocks only in ``synchronize``, ``download`` and a timer's
``stop``, and there it polls with a deadline, so a peer that never signals turns into a
SignalTimeout naming it, not a hung job.
"""

from __future__ import annotations

import copy
import ctypes
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ..runtime import cuda_driver
from ..runtime.cuda_driver import check, cuda_error, driver
from ..runtime.errors import ConfigError, CudaError, SignalTimeout
from .cuda_graph import CapturedGraph
from .cuda_streams import new_side_lane, stream_device, stream_handle
from .device_buffer import DeviceBuffer

__all__ = ["CudaEngine", "CudaTimer", "DEFAULT_SYNC_TIMEOUT_S"]

# How long synchronize() waits when no signal wait with its own timeout is pending.
DEFAULT_SYNC_TIMEOUT_S = 30.0
# Busy polls of cuStreamQuery before backing off to sleeps: most waits end in microseconds.
_SPIN_POLLS = 200
_MAX_SLEEP_S = 1e-3

_WORD = 8
# How long a host-side look at (or write of) one signal word may take before it is given
# up: it runs only on error paths, where a stuck probe must not turn into a hang.
_PROBE_TIMEOUT_S = 0.5
_WAIT_GEQ = int(driver.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ)
# Default write flags put a memory barrier before the store: data written earlier on
# the stream is visible to whoever sees the new value (release).
_WRITE_RELEASE = int(driver.CUstreamWriteValue_flags.CU_STREAM_WRITE_VALUE_DEFAULT)
# Operations per cuStreamBatchMemOp call (the driver's limit is 256).
_BATCH_OPS = 256
_NOT_SUPPORTED = driver.CUresult.CUDA_ERROR_NOT_SUPPORTED
_Label = str | Callable[[], str]  # a name, or a function making one on a timeout
# Bindings for CUDA 12.0-12.x may know only the _V1 spelling of this attribute.
_WIDE_OPS_ATTRIBUTE = next(
    name for name in ("CAN_USE_64_BIT_STREAM_MEM_OPS", "CAN_USE_64_BIT_STREAM_MEM_OPS_V1")
    if hasattr(driver.CUdevice_attribute, f"CU_DEVICE_ATTRIBUTE_{name}"))


def _word_address(pad: DeviceBuffer, slot: int) -> int:
    if slot < 0 or (slot + 1) * _WORD > pad.nbytes:
        raise ValueError(f"signal slot {slot} lies outside a pad of {pad.nbytes} bytes")
    return pad.ptr + slot * _WORD


# Copies at least this large, to several destinations, run on concurrent side streams.
_CONCURRENT_COPY_BYTES = 1 << 20

class CudaEngine:
    """Moves bytes and signals on one ``CU_STREAM_NON_BLOCKING`` stream of ``device``.

    The device's context must be current on the calling thread when the engine is
    created and used. ``timeout`` bounds ``synchronize`` when no signal wait with its
    own timeout is pending.

    Raises:
        CudaError: the stream could not be created.
    """

    has_streams = True

    def __init__(self, device: int, *, timeout: float = DEFAULT_SYNC_TIMEOUT_S) -> None:
        self.device = device
        self.timeout = timeout
        # Set by the group: raises PeerDied once a rank of the node has exited.
        self.peer_check: Callable[[str], None] | None = None
        self._stream: Any = None
        # 64-bit stream memory operations are standard on current GPUs; where they are
        # not, signals fall back to the low 32 bits of each word (little-endian).
        self.wide_signals = bool(cuda_driver.device_attribute(device, _WIDE_OPS_ATTRIBUTE))
        if self.wide_signals:
            self._write, self._wait = driver.cuStreamWriteValue64, driver.cuStreamWaitValue64
            self._write_name, self._wait_name = "cuStreamWriteValue64", "cuStreamWaitValue64"
        else:
            self._write, self._wait = driver.cuStreamWriteValue32, driver.cuStreamWaitValue32
            self._write_name, self._wait_name = "cuStreamWriteValue32", "cuStreamWaitValue32"
        self._mask = (1 << 64) - 1 if self.wide_signals else (1 << 32) - 1
        # Waits enqueued since the last synchronize: word address -> (value, timeout, label).
        # Only the latest wait per word matters: values on a word only grow.
        self._pending: dict[int, tuple[int, float, _Label]] = {}
        # Host arrays whose copies may still be in flight (pinned sources copy late).
        self._keep: list[np.ndarray] = []
        self._timers: set[CudaTimer] = set()
        # Side streams (and their completion events) for concurrent large copies.
        self._side: list[tuple[Any, Any]] = []
        # A stream and a pinned word of its own for looking at signal words from the host
        # while our stream is blocked (made on first use; see _probe).
        self._probe_lane: tuple[Any, int] | None = None
        self._probe_stuck = False
        # The last synchronize gave up on a wait (SignalTimeout): a window closing after
        # that meets the unmet waits at once instead of waiting out the timeout again.
        self.timed_out = False
        # The engine this one is a view of (on_stream), or None for the owner of the stream.
        self._parent: CudaEngine | None = None
        self._fork = check("cuEventCreate", driver.cuEventCreate(
            int(driver.CUevent_flags.CU_EVENT_DISABLE_TIMING)))
        # Last: nothing after it can fail and leak the stream.
        try:
            self._stream = check("cuStreamCreate", driver.cuStreamCreate(
                int(driver.CUstream_flags.CU_STREAM_NON_BLOCKING)))
        except BaseException:
            driver.cuEventDestroy(self._fork)
            raise

    def on_stream(self, stream: Any) -> CudaEngine:
        """This engine enqueuing on ``stream`` instead of its own: a cuda.core Stream (or
        anything speaking ``__cuda_stream__``), a torch or cupy stream, a ``CUstream`` or
        a raw handle. The view shares the engine's side streams, timers and pending
        waits; it never destroys ``stream`` (the caller owns it), and closing it only
        forgets it.

        Raises:
            ConfigError: not a stream, or a stream of another device.
            CudaError: the handle is not a live stream.
        """
        handle = stream_handle(stream)
        owner = self._parent or self
        owner._live_stream()
        if handle == int(owner._stream):
            return owner
        device = stream_device(handle)
        if device is not None and device != self.device:
            raise ConfigError(f"the stream given belongs to cuda:{device}, but this window "
                              f"lives on cuda:{self.device}: pass a stream of cuda:{self.device}")
        view = copy.copy(owner)  # shallow: the lists, dicts and events stay shared
        view._stream = driver.CUstream(handle)
        view._parent = owner
        return view

    def capture(self, enqueue: Callable[[], None]) -> CapturedGraph:
        """A CUDA graph of what ``enqueue()`` puts on this engine's stream; launch it
        with ``.launch()`` (on the same stream) and close it when done.

        Only graph-safe work may be captured: kernels and device barriers, whose epochs
        live on the device, and copies. The stream must be idle of waits from the host.

        Raises:
            CudaError: the capture failed (e.g. an operation that cannot be captured).
        """
        return CapturedGraph(self._live_stream(), enqueue)

    # -- bytes ---------------------------------------------------------------------
    def copy(self, dst: DeviceBuffer, src: DeviceBuffer) -> None:
        """Enqueue ``dst <- src`` (same length).

        Raises:
            ValueError: lengths differ.
            CudaError: the copy could not be enqueued.
        """
        if dst.nbytes != src.nbytes:
            raise ValueError(f"copy of {src.nbytes} bytes into a buffer of {dst.nbytes}")
        if dst.nbytes:
            check("cuMemcpyDtoDAsync",
                  driver.cuMemcpyDtoDAsync(dst.ptr, src.ptr, dst.nbytes, self._live_stream()))

    def copier(self, pairs: list[tuple[DeviceBuffer, DeviceBuffer]]) -> Callable[[], None]:
        """A callable enqueueing every ``dst <- src`` of ``pairs`` in order.

        Raises:
            ValueError: a pair's lengths differ (at bind time).
        """
        jobs = []
        for dst, src in pairs:
            if dst.nbytes != src.nbytes:
                raise ValueError(f"copy of {src.nbytes} bytes into a buffer of {dst.nbytes}")
            if dst.nbytes:
                jobs.append((dst.ptr, src.ptr, dst.nbytes))
        memcpy, stream = driver.cuMemcpyDtoDAsync, self._live_stream()
        if len(jobs) > 1 and max(job[2] for job in jobs) >= _CONCURRENT_COPY_BYTES:
            return self._concurrent_copier(jobs)

        def copy_all() -> None:
            for dst_ptr, src_ptr, nbytes in jobs:
                err, = memcpy(dst_ptr, src_ptr, nbytes, stream)
                if err:
                    raise cuda_error("cuMemcpyDtoDAsync", err)
        return copy_all

    def _concurrent_copier(self, jobs: list[tuple[int, int, int]]) -> Callable[[], None]:
        """Large copies to different peers run at once on side streams (each copy engine
        serves one), forked from and joined back into the engine's stream with events."""
        stream = self._live_stream()
        while len(self._side) < len(jobs) - 1:
            self._side.append(new_side_lane())
        fork = self._side_event_fork()
        lanes = self._side[:len(jobs) - 1]
        memcpy, record = driver.cuMemcpyDtoDAsync, driver.cuEventRecord
        wait = driver.cuStreamWaitEvent

        def copy_all() -> None:
            check("cuEventRecord", record(fork, stream))
            for (dst_ptr, src_ptr, nbytes), (side, done) in zip(jobs[1:], lanes, strict=True):
                check("cuStreamWaitEvent", wait(side, fork, 0))
                check("cuMemcpyDtoDAsync", memcpy(dst_ptr, src_ptr, nbytes, side))
                check("cuEventRecord", record(done, side))
            dst_ptr, src_ptr, nbytes = jobs[0]
            check("cuMemcpyDtoDAsync", memcpy(dst_ptr, src_ptr, nbytes, stream))
            for _side, done in lanes:
                check("cuStreamWaitEvent", wait(stream, done, 0))
        return copy_all

    def _side_event_fork(self) -> Any:
        return self._fork

    def upload(self, dst: DeviceBuffer, data: np.ndarray) -> None:
        """Copy host bytes ``data`` (uint8, ``dst.nbytes`` long) into ``dst``, after the
        work already on the stream.

        Raises:
            ValueError: wrong length.
            SignalTimeout: earlier work on the stream never finished (a missing peer).
            CudaError: the copy failed.
        """
        data = np.ascontiguousarray(data, dtype=np.uint8).reshape(-1)
        if data.nbytes != dst.nbytes:
            raise ValueError(f"upload of {data.nbytes} bytes into a buffer of {dst.nbytes}")
        if not data.nbytes:
            return
        # A copy from pageable memory first waits for the stream on the host, with no
        # deadline; drain the stream here, where a missing peer becomes a SignalTimeout.
        self.synchronize()
        check("cuMemcpyHtoDAsync",
              driver.cuMemcpyHtoDAsync(dst.ptr, data.ctypes.data, data.nbytes,
                                       self._live_stream()))
        self._keep.append(data)

    def download(self, src: DeviceBuffer) -> np.ndarray:
        """The bytes of ``src`` as a new host uint8 array, after all work submitted.

        Raises:
            SignalTimeout: the stream never finished (a missing peer).
            CudaError: the copy failed.
        """
        out = np.empty(src.nbytes, dtype=np.uint8)
        self.synchronize()
        if src.nbytes:
            check("cuMemcpyDtoHAsync",
                  driver.cuMemcpyDtoHAsync(out.ctypes.data, src.ptr, src.nbytes,
                                           self._live_stream()))
            self.synchronize()
        return out

    # -- signals -------------------------------------------------------------------
    def store_signal(self, pad: DeviceBuffer, slot: int, value: int) -> None:
        """Enqueue a release store of ``value`` into word ``slot`` of ``pad``.

        Raises:
            ValueError: slot outside the pad.
            CudaError: the write could not be enqueued.
        """
        check(self._write_name, self._write(self._live_stream(), _word_address(pad, slot),
                                            value & self._mask, _WRITE_RELEASE))

    def wait_signal(self, pad: DeviceBuffer, slot: int, value: int, *, timeout: float,
                    what: str) -> None:
        """Make later work on the stream wait until word ``slot`` of ``pad`` >= ``value``.

        Returns at once; ``synchronize`` raises SignalTimeout naming ``what`` if the word
        is still short of ``value`` after ``timeout`` seconds.

        Raises:
            ValueError: slot outside the pad.
            CudaError: the wait could not be enqueued.
        """
        address = _word_address(pad, slot)
        check(self._wait_name,
              self._wait(self._live_stream(), address, value & self._mask, _WAIT_GEQ))
        self._pending[address] = (value & self._mask, timeout, what)

    def signal_poster(self, pad: DeviceBuffer, slot: int) -> Callable[[int], None]:
        """A callable enqueueing a release store of its argument into word ``slot``."""
        address, write, mask = _word_address(pad, slot), self._write, self._mask
        stream, name = self._live_stream(), self._write_name

        def post(value: int) -> None:
            err, = write(stream, address, value & mask, _WRITE_RELEASE)
            if err:
                raise cuda_error(name, err)
        return post

    def signal_waiter(self, pad: DeviceBuffer, slot: int, *, timeout: float,
                      what: str) -> Callable[[int], None]:
        """A callable enqueueing a wait until word ``slot`` reaches its argument."""
        address, wait, mask = _word_address(pad, slot), self._wait, self._mask
        stream, name, pending = self._live_stream(), self._wait_name, self._pending

        def wait_for(value: int) -> None:
            err, = wait(stream, address, value & mask, _WAIT_GEQ)
            if err:
                raise cuda_error(name, err)
            pending[address] = (value & mask, timeout, what)
        return wait_for

    def make_flag_barrier(self, own_pad: DeviceBuffer, peer_pads: list[DeviceBuffer],
                          my_slot: int, peer_slots: list[int], *, timeout: float,
                          what: Callable[[int], str]) -> Callable[[], None]:
        """A stream-ordered barrier made only of fixed values, so a CUDA graph can capture
        it and every replay synchronises afresh: each call stores 1 into word ``my_slot``
        of every peer pad, waits until words ``peer_slots`` of ``own_pad`` are 1, then
        clears them. The host does not block.

        Callers alternate two of these on different words. A peer can set our word for
        its next barrier on the same words only after passing the barrier in between,
        which needs our store there, which our stream makes after clearing: so a clear
        never erases a store of the next round."""
        return self.make_party_flag_barrier([(own_pad, peer_pads, my_slot, peer_slots, what)],
                                            timeout=timeout)

    def make_party_flag_barrier(self, parties: list[tuple], *,
                                timeout: float) -> Callable[[], None]:
        """``make_flag_barrier`` for several parties at once, each ``(own_pad, peer_pads,
        my_slot, peer_slots, what)`` (``what(slot)`` names a wait of that party on a
        timeout): the stores of every party, then every party's waits and clears. One
        stream meets the barrier for several ranks this way (the leader of a time-sliced
        GPU for its guests, collectives/time_sliced.py), where one party's waits would
        otherwise come before the stores of another that it waits for. One stream
        operation (make_signal_batch)."""
        steps: list[tuple] = [("write", pad, my_slot, 1)
                              for _own, peer_pads, my_slot, _slots, _what in parties
                              for pad in peer_pads]
        for own_pad, _pads, _slot, peer_slots, what in parties:
            steps += [("wait", own_pad, slot, 1, lambda s=slot, name=what: name(s))
                      for slot in peer_slots]
        steps += [("write", own_pad, slot, 0) for own_pad, _pads, _slot, peer_slots, _what
                  in parties for slot in peer_slots]
        return self.make_signal_batch(steps, timeout=timeout)

    def make_signal_batch(self, steps: list[tuple], *, timeout: float) -> Callable[[], None]:
        """A callable enqueuing ``steps`` in order as one stream operation
        (``cuStreamBatchMemOp``; each separate operation costs the GPU's front end about
        1.5 µs on an H100, tools/probes/sharing/timeslice_probe.py):
        ``("write", pad, slot, value)`` a
        release store, ``("wait", pad, slot, value, what)`` a wait until the word is >=
        ``value`` (``what``: a name, or a function making one, for ``synchronize``'s
        timeout message). Fixed values only, so a CUDA graph replays it. Where the driver
        refuses batches, the same operations go one by one.

        Raises:
            ValueError: a slot outside its pad.
        """
        kinds = driver.CUstreamBatchMemOpType
        write_kind, wait_kind = ((kinds.CU_STREAM_MEM_OP_WRITE_VALUE_64,
                                  kinds.CU_STREAM_MEM_OP_WAIT_VALUE_64) if self.wide_signals
                                 else (kinds.CU_STREAM_MEM_OP_WRITE_VALUE_32,
                                       kinds.CU_STREAM_MEM_OP_WAIT_VALUE_32))
        ops, waits, singles = [], [], []
        for step in steps:
            address, value = _word_address(step[1], step[2]), step[3] & self._mask
            op = driver.CUstreamBatchMemOpParams()
            part = op.writeValue if step[0] == "write" else op.waitValue
            part.operation = write_kind if step[0] == "write" else wait_kind
            part.address = address
            if self.wide_signals:
                part.value64 = value
            else:
                part.value = value
            part.flags = _WRITE_RELEASE if step[0] == "write" else _WAIT_GEQ
            ops.append(op)
            if step[0] == "wait":
                waits.append((address, (value, timeout, step[4])))
            singles.append((step[0] == "write", address, value))
        batches = [ops[i:i + _BATCH_OPS] for i in range(0, len(ops), _BATCH_OPS)]
        stream, pending, batch = self._live_stream(), self._pending, driver.cuStreamBatchMemOp
        write, wait = self._write, self._wait
        refused = [False]

        def enqueue() -> None:
            if not refused[0]:
                for chunk in batches:
                    err, = batch(stream, len(chunk), chunk, 0)
                    if err == _NOT_SUPPORTED and chunk is batches[0]:
                        refused[0] = True
                        break
                    if err:
                        raise cuda_error("cuStreamBatchMemOp", err)
            if refused[0]:
                for is_write, address, value in singles:
                    err, = (write(stream, address, value, _WRITE_RELEASE) if is_write
                            else wait(stream, address, value, _WAIT_GEQ))
                    if err:
                        raise cuda_error(self._write_name if is_write else self._wait_name,
                                         err)
            pending.update(waits)
        enqueue.keep = batches  # the parameter structs live as long as the callable
        return enqueue

    def make_barrier(self, own_pad: DeviceBuffer, peer_pads: list[DeviceBuffer], my_slot: int,
                     peer_slots: list[int], *, timeout: float, what: Callable[[int], str],
                     epochs: list[int] | None = None) -> Callable[[], None]:
        """A stream-ordered barrier: each call stores the next epoch into word
        ``my_slot`` of every peer pad, then makes the stream wait until words
        ``peer_slots`` of ``own_pad`` reach it. The host does not block.

        ``epochs`` (a one-element list) holds the epoch; barriers on the same words but
        different streams must share it, or their values would collide."""
        outgoing = [_word_address(pad, my_slot) for pad in peer_pads]
        incoming = [(_word_address(own_pad, slot), (lambda s=slot: what(s)))
                    for slot in peer_slots]
        write, wait, stream, mask = self._write, self._wait, self._live_stream(), self._mask
        write_name, wait_name, pending = self._write_name, self._wait_name, self._pending
        counter = [0] if epochs is None else epochs

        def barrier() -> None:
            counter[0] += 1
            value = counter[0] & mask
            for address in outgoing:
                err, = write(stream, address, value, _WRITE_RELEASE)
                if err:
                    raise cuda_error(write_name, err)
            for address, label in incoming:
                err, = wait(stream, address, value, _WAIT_GEQ)
                if err:
                    raise cuda_error(wait_name, err)
                pending[address] = (value, timeout, label)
        return barrier

    # -- completion ----------------------------------------------------------------
    def synchronize(self) -> None:
        """Wait until everything enqueued has finished.

        Raises:
            SignalTimeout: the stream did not finish in time (it is most likely waiting
                for a peer's signal; the message names the waits still unmet).
            CudaError: the stream failed.
        """
        stream = self._stream
        if stream is None:
            return  # closed: nothing can be pending
        try:
            self._poll(lambda: driver.cuStreamQuery(stream), "cuStreamQuery")
        except SignalTimeout:
            self.timed_out = True
            raise
        self.timed_out = False
        self._pending.clear()
        self._keep.clear()

    def _poll(self, query: Callable[[], tuple], call: str) -> None:
        err, = query()
        if err == cuda_driver.SUCCESS:
            return
        if err != cuda_driver.NOT_READY:
            raise cuda_error(call, err)
        # Waits carry their own deadlines (the window's signal timeout); plain work gets
        # the engine's.
        timeout = (max(entry[1] for entry in self._pending.values()) if self._pending
                   else self.timeout)
        deadline = time.monotonic() + timeout
        polls, sleep = 0, 1e-6
        while True:
            err, = query()
            if err == cuda_driver.SUCCESS:
                return
            if err != cuda_driver.NOT_READY:
                raise cuda_error(call, err)
            polls += 1
            if polls > _SPIN_POLLS:
                # Past the first microseconds the peer is slow or gone: stop burning a core
                # that a rank sharing it may need.
                time.sleep(sleep)
                sleep = min(sleep * 2, _MAX_SLEEP_S)
                if self.peer_check is not None:
                    self.peer_check(f"{call} on cuda:{self.device}")
                if time.monotonic() > deadline:
                    raise SignalTimeout(self._timeout_message(timeout))

    def _timeout_message(self, timeout: float) -> str:
        head = (f"the stream of cuda:{self.device} did not finish within {timeout:g} s; "
                "it is most likely waiting for a peer's signal")
        unmet = []
        for address, (value, _timeout, label) in self._pending.items():
            current = self._peek_word(address)
            if current is not None and self._reached(current, value):
                continue
            name = label() if callable(label) else label
            seen = "unreadable" if current is None else str(current)
            unmet.append(f"{name}: signal word at 0x{address:x} is {seen}, waiting for >= {value}")
        if unmet:
            return f"{'; '.join(unmet)} ({head})"
        if self._pending:
            return head
        return (f"the stream of cuda:{self.device} did not finish within {timeout:g} s "
                "(no signal wait is pending: a copy is stuck)")

    def _reached(self, current: int, value: int) -> bool:
        # The driver's GEQ is cyclic: (signed)(current - value) >= 0.
        bits = 64 if self.wide_signals else 32
        diff = (current - value) & ((1 << bits) - 1)
        return diff < (1 << (bits - 1))

    def release_waits(self, pad: DeviceBuffer) -> int:
        """Meet this engine's unmet waits on words of ``pad`` by writing the awaited values
        there, and return how many it wrote. For a window that is closing after a peer
        never signalled: its stream would otherwise stay blocked, and freeing memory under
        a blocked stream (cuMemFree) waits for it forever. The writes go on a probe stream
        of their own, each given at most half a second. Never raises (it runs on an error
        path): a word it cannot write stays."""
        met = 0
        for address, (value, _timeout, _label) in list(self._pending.items()):
            if not pad.ptr <= address < pad.ptr + pad.nbytes:
                continue
            current = self._peek_word(address)
            if current is not None and self._reached(current, value):
                continue
            met += int(self._probe(lambda lane, at=address, word=value & self._mask:
                                   self._write(lane, at, word, _WRITE_RELEASE)) is not None)
        return met

    def _peek_word(self, address: int) -> int | None:
        """The signal word at ``address`` as the host reads it now, or None when it cannot
        be read within the probe's time."""
        size = _WORD if self.wide_signals else 4

        owner = self._parent or self  # the lane is the stream owner's, views share it

        def read(lane: Any) -> tuple:
            return driver.cuMemcpyDtoHAsync(owner._probe_lane[1], address, size, lane)
        if self._probe(read) is None:
            return None
        word = ctypes.c_uint64.from_address(owner._probe_lane[1]).value
        return int(word & self._mask)

    def _probe(self, enqueue: Callable[[Any], tuple]) -> bool | None:
        """Run ``enqueue(stream)`` on the probe stream and wait for it at most
        ``_PROBE_TIMEOUT_S``; True when done, None when it failed or did not finish.

        Why not a synchronous cuMemcpy: with our stream blocked on a peer that never
        signals, synchronous copies were seen to hang on legacy-IPC windows of two ranks
        (H100/H200, driver 580), whereas asynchronous work on another non-blocking stream
        runs. A probe that does not finish in time leaves the lane marked stuck and
        unused, so diagnosis can never block the caller."""
        owner = self._parent or self  # one lane per engine: views (on_stream) share it
        if owner._probe_stuck:
            return None
        try:
            if owner._probe_lane is None:
                stream = check("cuStreamCreate", driver.cuStreamCreate(
                    int(driver.CUstream_flags.CU_STREAM_NON_BLOCKING)))
                try:
                    word = check("cuMemHostAlloc", driver.cuMemHostAlloc(_WORD, 0))
                except BaseException:
                    driver.cuStreamDestroy(stream)
                    raise
                owner._probe_lane = (stream, int(word))
            lane = owner._probe_lane[0]
            err, = enqueue(lane)
            if err:
                return None
            deadline = time.monotonic() + _PROBE_TIMEOUT_S
            while True:
                err, = driver.cuStreamQuery(lane)
                if err == cuda_driver.SUCCESS:
                    return True
                if err != cuda_driver.NOT_READY:
                    return None
                if time.monotonic() > deadline:
                    owner._probe_stuck = True
                    return None
                time.sleep(1e-4)
        except Exception:  # diagnosis only
            return None

    def timer(self) -> CudaTimer:
        """A timer from CUDA events recorded on this stream."""
        return CudaTimer(self)

    def _live_stream(self) -> Any:
        if self._stream is None or (self._parent is not None and self._parent._stream is None):
            raise CudaError("cuStreamQuery -> the engine is closed (its stream was destroyed)")
        return self._stream

    def close(self) -> None:
        """Destroy the stream and any timer's events (idempotent). A view made by
        ``on_stream`` only forgets its stream: the caller owns it.

        Raises:
            CudaError: the driver refused (the engine counts as closed).
        """
        if self._parent is not None:
            self._stream = None
            return
        for timer in list(self._timers):
            timer.close()
        self._timers.clear()
        for side, done in self._side:
            driver.cuEventDestroy(done)
            driver.cuStreamDestroy(side)
        self._side.clear()
        lane, self._probe_lane = self._probe_lane, None
        if lane is not None:
            driver.cuStreamDestroy(lane[0])
            if not self._probe_stuck:  # a copy still in flight would write into freed memory
                driver.cuMemFreeHost(lane[1])
        if self._fork is not None:
            driver.cuEventDestroy(self._fork)
            self._fork = None
        stream, self._stream = self._stream, None
        self._pending.clear()
        self._keep.clear()
        if stream is not None:
            check("cuStreamDestroy", driver.cuStreamDestroy(stream))

    @property
    def closed(self) -> bool:
        return self._stream is None

    @property
    def stream(self) -> Any:
        """The ``CUstream`` (for users who launch their own work after ours)."""
        return self._stream


# How long stop() spins on the end event before it falls back to the engine's sleeping
# poll: a sleep of up to a millisecond would land in the host clock it reads (the
# timer's cross-check), and runs longer than this are long enough not to mind.
_TIMER_SPIN_S = 0.05


class CudaTimer:
    """Elapsed GPU time between ``start()`` and ``stop()``, from two CUDA events on the
    engine's stream; and a second clock beside it: ``wall_seconds``, the host's time
    from ``start()`` to the moment every stream of the context was seen finished
    (cuCtxSynchronize after the end event). Work enqueued between the two on a stream
    the events do not see lengthens the second clock only, which is how a timer
    pointed at the wrong stream is caught (patterns/clock_check.py)."""

    def __init__(self, engine: CudaEngine) -> None:
        self._engine = engine
        self._events: tuple[Any, Any] | None = None
        self._started = 0.0
        self.wall_seconds: float | None = None
        self.wall_parts: tuple[float, float] | None = None

    def start(self) -> None:
        """Record the start event on the engine's stream.

        Raises:
            CudaError: event creation or recording failed.
        """
        self.close()
        flags = int(driver.CUevent_flags.CU_EVENT_DEFAULT)
        begin = check("cuEventCreate", driver.cuEventCreate(flags))
        try:
            end = check("cuEventCreate", driver.cuEventCreate(flags))
        except BaseException:
            driver.cuEventDestroy(begin)
            raise
        self._events = (begin, end)
        self._engine._timers.add(self)  # the engine destroys live events when it closes
        self.wall_seconds = self.wall_parts = None
        check("cuEventRecord", driver.cuEventRecord(begin, self._engine._live_stream()))
        self._started = time.perf_counter()

    def stop(self) -> float:
        """Seconds of GPU time from start() to now, once the work in between is done.

        Raises:
            SignalTimeout: the work never finished (a missing peer).
            CudaError: no start(), or an event call failed.
        """
        if self._events is None:
            raise CudaError("cuEventRecord -> timer stopped before it was started")
        begin, end = self._events
        try:
            enqueued = time.perf_counter() - self._started
            check("cuEventRecord", driver.cuEventRecord(end, self._engine._live_stream()))
            spin_until = time.perf_counter() + _TIMER_SPIN_S
            query, ready = driver.cuEventQuery, cuda_driver.SUCCESS
            while query(end)[0] != ready and time.perf_counter() < spin_until:
                pass
            self._engine._poll(lambda: query(end), "cuEventQuery")
            end_seen = time.perf_counter() - self._started
            # The end event says the timer's stream is done; the context's other streams
            # (a side lane not joined back, a stream the work was wrongly put on) are
            # waited for too, and that wait belongs to the second clock.
            check("cuCtxSynchronize", driver.cuCtxSynchronize())
            self.wall_seconds = time.perf_counter() - self._started
            self.wall_parts = (enqueued, end_seen)
            milliseconds = check("cuEventElapsedTime", driver.cuEventElapsedTime(begin, end))
        finally:
            self.close()
        return float(milliseconds) / 1e3

    def close(self) -> None:
        """Destroy the events (idempotent)."""
        events, self._events = self._events, None
        self._engine._timers.discard(self)
        if events is not None:
            for event in events:
                driver.cuEventDestroy(event)
