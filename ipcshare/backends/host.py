"""Host shared memory: each rank's buffer is a memfd, shared as a descriptor and mmapped.

This backend is what runs on a machine without a GPU, so demos, tests and CI exercise
the same window and pattern code that the GPU backends use.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import platform
import stat
import struct
import time
from collections.abc import Callable

import numpy as np

from ..runtime.errors import BackendError, BackendUnavailable, SignalTimeout
from ..runtime.owned_fd import OwnedFd
from .base import Allocation, Backend, Buffer, Exported
from .handle_header import check_magic_and_version

__all__ = ["HostBackend", "HostBuffer", "HostAllocation", "HostEngine", "HANDLE_FORMAT",
           "check_peer_memfd", "parse_host_handle", "create_sealed_memfd", "map_peer_memfd"]

# magic, format version, bytes, exporter pid
HANDLE_FORMAT = struct.Struct("!4sHQI")
_MAGIC = b"IPCH"
_VERSION = 1
# An exported memfd can neither shrink (a peer's mapping would SIGBUS) nor grow; an
# importer insists on both seals, which only a memfd can carry.
_REQUIRED_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW


class HostBuffer(Buffer):
    """A range of a host mapping; ``numpy.asarray(buf)`` is a zero-copy uint8 view."""

    __slots__ = ("_view", "ptr", "nbytes")

    def __init__(self, view: memoryview, ptr: int) -> None:
        self._view = view
        self.ptr = ptr
        self.nbytes = len(view)

    @property
    def __array_interface__(self) -> dict:
        # Handing numpy the memoryview (not the raw pointer) makes every array keep the
        # mapping alive, so a view can never outlive the memory it points to.
        return {"shape": (self.nbytes,), "typestr": "|u1", "data": self._view, "version": 3}

    def memoryview(self) -> memoryview:
        """A writable memoryview of the bytes (buffer protocol)."""
        return self._view

    def __buffer__(self, flags: int) -> memoryview:
        # The buffer protocol for Python classes (PEP 688, Python 3.12+): memoryview(buf),
        # bytes(buf), file.write(buf). Python 3.11 ignores it; use buf.memoryview() there.
        return self._view

    def numpy(self, dtype: str | np.dtype = "u1") -> np.ndarray:
        """A zero-copy numpy view with ``dtype`` elements."""
        return np.asarray(self).view(dtype)

    def slice(self, offset: int, nbytes: int) -> HostBuffer:
        self._check_range(offset, nbytes)
        return HostBuffer(self._view[offset:offset + nbytes], self.ptr + offset)

    def words(self) -> memoryview:
        """The buffer as native 64-bit unsigned words (signal pads)."""
        return self._view.cast("Q")

    def __repr__(self) -> str:
        return f"HostBuffer(ptr=0x{self.ptr:x}, nbytes={self.nbytes})"


class HostAllocation(Allocation):
    """A memfd and its mapping; owns both."""

    def __init__(self, fd: OwnedFd | None, mapping: mmap.mmap, nbytes: int, *,
                 on_close: Callable[[], None] | None = None) -> None:
        self._fd = fd
        self._on_close = on_close
        self._mmap: mmap.mmap | None = mapping
        self._view: memoryview | None = memoryview(mapping)
        self.nbytes = nbytes
        self.ptr = _address_of(self._view)

    @property
    def fd(self) -> OwnedFd:
        if self._fd is None or self._fd.closed:
            raise BackendError("allocation has no open descriptor")
        return self._fd

    @property
    def closed(self) -> bool:
        return self._mmap is None

    def buffer(self, offset: int = 0, nbytes: int | None = None) -> HostBuffer:
        if self._view is None:
            raise BackendError("allocation is closed")
        nbytes = self.nbytes - offset if nbytes is None else nbytes
        return HostBuffer(self._view, self.ptr).slice(offset, nbytes)

    def close(self) -> None:
        if self._mmap is None:
            return
        mapping, self._mmap = self._mmap, None
        if self._view is not None:
            self._view.release()
            self._view = None
        try:
            mapping.close()
        except BufferError:
            # A user still holds a view (numpy array, memoryview): the mapping goes away
            # with the last of them instead of leaving them pointing at nothing.
            pass
        if self._fd is not None:
            self._fd.close()
        if self._on_close is not None:
            self._on_close()
            self._on_close = None


def _address_of(view: memoryview) -> int:
    import ctypes

    return ctypes.addressof(ctypes.c_char.from_buffer(view))


def _mem_available() -> int | None:
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


# Sources at least this large, copied to several destinations, are copied in chunks that
# stay in a core's L2 between destinations.
_BLOCKED_COPY_BYTES = 1 << 20
_COPY_CHUNK_BYTES = 256 << 10


class HostEngine:
    """Copies with memcpy (memoryview assignment) and signals with 64-bit stores.

    Signal ordering relies on the host's memory model: on x86-64 (TSO) stores become
    visible in program order, so data copied before a signal store is visible to a peer
    that has seen the signal. See docs/MEMORY-ORDERING.md.
    """

    # Host memory has no streams: work happens at once, in program order.
    has_streams = False

    def __init__(self, *, spin_before_yield: int = 2000) -> None:
        # Spin this many polls before yielding the core; 0 when ranks outnumber cores,
        # where spinning only delays the peer we wait for.
        self._spin = spin_before_yield
        # Set by the group: raises PeerDied once a rank of the node has exited.
        self.peer_check: Callable[[str | Callable[[], str]], None] | None = None

    def copy(self, dst: HostBuffer, src: HostBuffer) -> None:
        dst._view[:] = src._view

    def upload(self, dst: HostBuffer, data: np.ndarray) -> None:
        np.copyto(np.asarray(dst), data, casting="no")

    def download(self, src: HostBuffer) -> np.ndarray:
        return np.array(src, copy=True)

    def store_signal(self, pad: HostBuffer, slot: int, value: int) -> None:
        pad.words()[slot] = value

    def wait_signal(self, pad: HostBuffer, slot: int, value: int, *, timeout: float,
                    what: str) -> None:
        words = pad.words()
        if words[slot] < value:
            self._wait_words(words, slot, value, timeout, what)

    def _wait_words(self, words: memoryview, slot: int, value: int, timeout: float,
                    what: str | Callable[[], str]) -> None:
        # Spin first: a peer on another core usually arrives within a microsecond or two.
        for _ in range(self._spin):
            if words[slot] >= value:
                return
        spins = 0
        deadline = time.monotonic() + timeout
        while words[slot] < value:
            spins += 1
            os.sched_yield()  # ranks may outnumber cores: let the peer run
            if spins % 256 == 0:
                if self.peer_check is not None:
                    self.peer_check(what)
                if time.monotonic() > deadline:
                    label = what() if callable(what) else what
                    raise SignalTimeout(
                        f"{label}: signal word {slot} still {words[slot]} < {value} "
                        f"after {timeout:g} s")
                if spins > 50_000:
                    time.sleep(50e-6)  # a long wait: stop burning a shared core

    def copier(self, pairs: list[tuple[HostBuffer, HostBuffer]]) -> Callable[[], None]:
        # Group destinations by source: a large source copied to several places goes
        # chunk by chunk, so each chunk comes from memory once and from cache after that
        # (one read of the source instead of one per destination, on a memory-bound path).
        by_source: dict[tuple[int, int], tuple[memoryview, list[memoryview]]] = {}
        for dst, src in pairs:
            by_source.setdefault((src.ptr, src.nbytes), (src._view, []))[1].append(dst._view)
        steps: list[tuple[memoryview, memoryview]] = []
        for src, dsts in by_source.values():
            if len(dsts) == 1 or len(src) < _BLOCKED_COPY_BYTES:
                steps.extend((dst, src) for dst in dsts)
                continue
            for start in range(0, len(src), _COPY_CHUNK_BYTES):
                chunk = src[start:start + _COPY_CHUNK_BYTES]
                steps.extend((dst[start:start + len(chunk)], chunk) for dst in dsts)

        def copy_all() -> None:
            for dst, src in steps:
                dst[:] = src
        return copy_all

    def signal_poster(self, pad: HostBuffer, slot: int) -> Callable[[int], None]:
        words = pad.words()

        def post(value: int) -> None:
            words[slot] = value
        return post

    def signal_waiter(self, pad: HostBuffer, slot: int, *, timeout: float,
                      what: str) -> Callable[[int], None]:
        words, slow = pad.words(), self._wait_words

        def wait(value: int) -> None:
            if words[slot] < value:
                slow(words, slot, value, timeout, what)
        return wait

    def make_barrier(self, own_pad: HostBuffer, peer_pads: list[HostBuffer], my_slot: int,
                     peer_slots: list[int], *, timeout: float,
                     what: Callable[[int], str]) -> Callable[[], None]:
        mine = own_pad.words()
        theirs = [pad.words() for pad in peer_pads]
        epoch = 0
        wait = self._wait_words
        # A peer on another core usually arrives within a few polls: poll inline first,
        # and only then pay for the general wait (yielding, timeout, error text).
        quick_polls = range(self._spin // 8)

        def barrier() -> None:
            nonlocal epoch
            epoch += 1
            for words in theirs:
                words[my_slot] = epoch
            for slot in peer_slots:
                if mine[slot] < epoch:
                    for _ in quick_polls:
                        if mine[slot] >= epoch:
                            break
                    else:
                        wait(mine, slot, epoch, timeout, lambda slot=slot: what(slot))
        return barrier

    def synchronize(self) -> None:
        pass

    def timer(self) -> HostTimer:
        return HostTimer()


class HostTimer:
    """Wall-clock timer: host work is done when the call returns, so its second clock
    (``wall_seconds``, as CudaTimer's) is the same reading."""

    def __init__(self) -> None:
        self._start = 0.0
        self.wall_seconds: float | None = None
        # Host work is done when it returns: nothing to split.
        self.wall_parts: tuple[float, float] | None = None

    def start(self) -> None:
        self.wall_seconds = None
        self._start = time.perf_counter()

    def stop(self) -> float:
        self.wall_seconds = time.perf_counter() - self._start
        return self.wall_seconds


class HostBackend(Backend):
    """memfd-backed host shared memory."""

    name = "host"
    uses_fds = True
    granularity = mmap.PAGESIZE

    def __init__(self, *, local_size: int = 1) -> None:
        if not hasattr(os, "memfd_create"):
            raise BackendUnavailable(
                f"the host backend needs memfd_create (Linux >= 3.17); this is {platform.system()}")
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        self._engine = HostEngine(spin_before_yield=0 if local_size > (cores or 1) else 2000)
        # (device, inode) of every memfd mapped here, own and peers': a handle imported
        # twice, or our own memory sent back to us, is refused.
        self._mapped: set[tuple[int, int]] = set()

    def _track(self, fd: int) -> Callable[[], None]:
        info = os.fstat(fd)
        key = (info.st_dev, info.st_ino)
        self._mapped.add(key)
        return lambda: self._mapped.discard(key)

    def allocate(self, nbytes: int) -> HostAllocation:
        fd, mapping = create_sealed_memfd(nbytes)
        return HostAllocation(fd, mapping, nbytes, on_close=self._track(fd.fileno()))

    def export(self, allocation: Allocation) -> Exported:
        assert isinstance(allocation, HostAllocation)
        payload = HANDLE_FORMAT.pack(_MAGIC, _VERSION, allocation.nbytes, os.getpid())
        return Exported(payload=payload, fd=OwnedFd(os.dup(allocation.fd.fileno())))

    def import_peer(self, payload: bytes, fd: OwnedFd | None, nbytes: int) -> HostAllocation:
        announced = parse_host_handle(payload)
        if announced != nbytes:
            raise BackendError(f"peer announced {announced} bytes, the window has {nbytes}")
        if fd is None:
            raise BackendError("host handle arrived without its descriptor")
        check_peer_memfd(fd.fileno(), nbytes)
        info = os.fstat(fd.fileno())
        if (info.st_dev, info.st_ino) in self._mapped:
            raise BackendError("peer descriptor is memory already mapped here (the same "
                               "handle imported twice, or our own memory sent back)")
        mapping = map_peer_memfd(fd, nbytes)
        # mmap keeps its own duplicate of the descriptor; the caller closes ``fd``.
        return HostAllocation(None, mapping, nbytes, on_close=self._track(fd.fileno()))

    def share_existing(self, ptr: int, nbytes: int) -> tuple[Exported, int]:
        """The shared file mapping holding the range (host_existing says which memory
        qualifies).

        Raises:
            BackendError: private memory, several mappings, or no way to reopen the file.
        """
        from .host_existing import export_host_range

        return export_host_range(ptr, nbytes)

    def open_existing(self, payload: bytes, fd: OwnedFd | None) -> HostAllocation:
        """Map a peer's registered span, shared.

        Raises:
            BackendError: as ``host_existing.map_host_range``.
        """
        from .host_existing import map_host_range

        mapping = map_host_range(payload, fd)
        return HostAllocation(None, mapping, len(mapping))

    def engine(self) -> HostEngine:
        return self._engine

    def capacity_bytes(self) -> int | None:
        return _mem_available()


def create_sealed_memfd(nbytes: int, name: str = "ipcshare") -> tuple[OwnedFd, mmap.mmap]:
    """A memfd of ``nbytes`` (pages reserved, sealed against shrinking and growing) and
    its shared mapping here; on a failure nothing stays open.

    Raises:
        BackendError: the pages cannot be reserved.
        OSError: memfd_create, ftruncate or mmap failed.
    """
    fd = OwnedFd(os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING))
    try:
        os.ftruncate(fd.fileno(), nbytes)
        try:
            # Reserve the pages now: running out later would be a SIGBUS, not an error.
            os.posix_fallocate(fd.fileno(), 0, nbytes)
        except OSError as exc:
            raise BackendError(
                f"cannot reserve {nbytes} bytes of shared memory: {exc.strerror}") from exc
        fcntl.fcntl(fd.fileno(), fcntl.F_ADD_SEALS, _REQUIRED_SEALS)
        mapping = mmap.mmap(fd.fileno(), nbytes, mmap.MAP_SHARED,
                            mmap.PROT_READ | mmap.PROT_WRITE)
    except BaseException:
        fd.close()
        raise
    return fd, mapping


def map_peer_memfd(fd: OwnedFd, nbytes: int) -> mmap.mmap:
    """Map ``nbytes`` of a peer's memfd here, shared (the caller checked it first with
    ``check_peer_memfd``; mmap keeps its own duplicate of the descriptor).

    Raises:
        BackendError: mmap failed.
    """
    try:
        return mmap.mmap(fd.fileno(), nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    except OSError as exc:
        raise BackendError(f"mmap of peer memory failed: {exc.strerror}") from exc


def check_peer_memfd(fd: int, nbytes: int) -> None:
    """Refuse a descriptor that is not a sealed memfd of at least ``nbytes`` bytes.

    Checked before mapping: a pipe or socket cannot be mapped, a regular file would
    share a file on disk, and a memfd that is shorter, or could still shrink, would
    kill this process with SIGBUS when touched past its end.

    Raises:
        BackendError: naming what the descriptor is instead.
    """
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        kind = ("a pipe" if stat.S_ISFIFO(info.st_mode) else
                "a socket" if stat.S_ISSOCK(info.st_mode) else
                "a directory" if stat.S_ISDIR(info.st_mode) else
                "a device" if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode) else
                "not a regular file")
        raise BackendError(f"peer descriptor is {kind}, not shared memory")
    try:
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    except OSError:
        raise BackendError("peer descriptor is a file, not a memfd (it cannot be sealed)") \
            from None
    if seals & _REQUIRED_SEALS != _REQUIRED_SEALS:
        raise BackendError("peer memfd is not sealed against shrinking and growing: its "
                           "owner could truncate it under our mapping")
    if info.st_size < nbytes:
        raise BackendError(
            f"peer memfd holds {info.st_size} bytes, fewer than the {nbytes} announced")


def parse_host_handle(payload: bytes) -> int:
    """Bytes announced by a host handle.

    Raises:
        BackendError: wrong length, magic or version.
    """
    if not isinstance(payload, (bytes, bytearray)) or len(payload) != HANDLE_FORMAT.size:
        raise BackendError(
            f"host handle has {len(payload) if isinstance(payload, (bytes, bytearray)) else '?'}"
            f" bytes, expected {HANDLE_FORMAT.size}")
    magic, version, nbytes, _pid = HANDLE_FORMAT.unpack(payload)
    check_magic_and_version("host", magic, version, expected_magic=_MAGIC,
                            expected_version=_VERSION, same_backend_hint=False)
    return nbytes
