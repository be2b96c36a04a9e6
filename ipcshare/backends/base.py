"""The contract every memory backend fills in: allocate, export, import, close, and an
engine that moves bytes and raises/waits on signal words in that memory.

Backends know nothing of MPI: the window layer hands them bytes and descriptors that
the exchange layer carried.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from ..runtime.errors import BackendError
from ..runtime.owned_fd import OwnedFd

__all__ = ["Buffer", "Allocation", "Exported", "Backend", "Engine", "Timer"]


class Buffer(abc.ABC):
    """A byte range of some rank's memory, mapped in this process.

    Concrete buffers speak their memory's array protocols (host: ``__array_interface__``
    and ``memoryview()``; device: ``__cuda_array_interface__`` and ``__dlpack__``).
    A buffer is a view: it never owns memory, its allocation does.
    """

    ptr: int
    nbytes: int

    @abc.abstractmethod
    def slice(self, offset: int, nbytes: int) -> Buffer:
        """The sub-range ``[offset, offset + nbytes)`` of this buffer.

        Raises:
            ValueError: the range does not lie inside this buffer.
        """

    def _check_range(self, offset: int, nbytes: int) -> None:
        if offset < 0 or nbytes < 0 or offset + nbytes > self.nbytes:
            raise ValueError(
                f"range [{offset}, {offset + nbytes}) lies outside a buffer of {self.nbytes} bytes")


class Allocation(abc.ABC):
    """Memory owned by this process: a local allocation or the mapping of a peer's.

    ``close()`` is idempotent and releases everything the allocation holds.
    """

    ptr: int
    nbytes: int

    @abc.abstractmethod
    def buffer(self, offset: int = 0, nbytes: int | None = None) -> Buffer:
        """A view of ``[offset, offset + nbytes)`` (default: to the end)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the memory or the mapping (idempotent)."""

    @property
    @abc.abstractmethod
    def closed(self) -> bool:
        """Whether close() has run."""

    def __enter__(self) -> Allocation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclasses.dataclass
class Exported:
    """What one rank sends its peers for one allocation.

    ``payload`` travels by MPI allgather; ``fd``, when the backend exports descriptors,
    travels by the exchange's descriptor path. The exporter keeps ``fd`` open until its
    peers hold their copies, then closes it.
    """

    payload: bytes
    fd: OwnedFd | None = None

    def close(self) -> None:
        if self.fd is not None:
            self.fd.close()


class Timer(Protocol):
    """Elapsed time of work submitted between start() and stop().

    ``wall_seconds`` (set by stop()) is a second clock: the host's seconds from start()
    to the moment all the engine's work, on every stream, was seen finished. The
    harness holds the first against it on every timed row. ``wall_parts`` (set by
    stop(), or None) splits that clock where it can: (seconds until stop() was called,
    that is until the last enqueue returned; seconds until the timer's own end was seen
    finished), the rest being the wait for the engine's other streams. A disagreement
    names them, so that a slow host and work on another stream tell themselves apart."""

    wall_seconds: float | None
    wall_parts: tuple[float, float] | None

    def start(self) -> None: ...

    def stop(self) -> float:
        """Seconds from start() to stop(), waiting for the work in between."""
        ...


class Engine(Protocol):
    """Moves bytes and signals in one backend's memory, in submission order.

    Host engines act at once; device engines enqueue on a stream, and ``synchronize``
    waits for it. ``has_streams``: the engine has ``on_stream(stream)``, the same
    engine on another CUDA stream.
    """

    has_streams: bool

    def copy(self, dst: Buffer, src: Buffer) -> None:
        """Copy ``src`` into ``dst`` (same length)."""
        ...

    def upload(self, dst: Buffer, data: np.ndarray) -> None:
        """Copy host bytes ``data`` (uint8, same length) into ``dst``."""
        ...

    def download(self, src: Buffer) -> np.ndarray:
        """Return the bytes of ``src`` as a new host uint8 array (after pending work)."""
        ...

    def store_signal(self, pad: Buffer, slot: int, value: int) -> None:
        """Write the 64-bit ``value`` into word ``slot`` of ``pad``, ordered after the
        writes submitted before it (release)."""
        ...

    def wait_signal(self, pad: Buffer, slot: int, value: int, *, timeout: float,
                    what: str) -> None:
        """Wait until word ``slot`` of ``pad`` is >= ``value`` (acquire).

        Raises:
            SignalTimeout: not raised within ``timeout`` seconds; ``what`` names the peer.
        """
        ...

    def copier(self, pairs: list[tuple[Buffer, Buffer]]) -> Callable[[], None]:
        """A callable that performs every ``dst <- src`` copy of ``pairs``, in order.

        Patterns bind their copies once per size so the timed loop does no bookkeeping.
        """
        ...

    def signal_poster(self, pad: Buffer, slot: int) -> Callable[[int], None]:
        """A callable storing its argument into word ``slot`` of ``pad`` (release)."""
        ...

    def signal_waiter(self, pad: Buffer, slot: int, *, timeout: float,
                      what: str) -> Callable[[int], None]:
        """A callable waiting until word ``slot`` of ``pad`` reaches its argument."""
        ...

    def make_barrier(self, own_pad: Buffer, peer_pads: list[Buffer], my_slot: int,
                     peer_slots: list[int], *, timeout: float,
                     what: Callable[[int], str]) -> Callable[[], None]:
        """A barrier through signal pads: each call stores the next epoch into word
        ``my_slot`` of every pad in ``peer_pads``, then waits until words ``peer_slots``
        of ``own_pad`` reach it. ``what(slot)`` names the peer on a timeout."""
        ...

    def synchronize(self) -> None:
        """Wait until everything submitted has finished."""
        ...

    def timer(self) -> Timer:
        ...


class Backend(abc.ABC):
    """One kind of shareable memory.

    A backend declares what it can do, and windows, patterns and the CLI choose by these
    declarations, never by its name or by probing for methods:

    - ``uses_fds``: exports carry a descriptor (memfd, cuMem POSIX-FD), not only opaque
      bytes (legacy cudaIpc handles);
    - ``device_memory``: the memory lives on a GPU (device arrays, CUDA streams);
    - ``has_kernels``: ``kernels(source)`` compiles and loads ipcshare's kernels;
    - ``crosses_pid_namespaces``: its handles open in a process of another PID namespace.
    """

    name: str = ""
    uses_fds: bool = False
    device_memory: bool = False
    has_kernels: bool = False
    crosses_pid_namespaces: bool = True
    # Window sizes are rounded up to this many bytes (page size, VMM granularity).
    granularity: int = 4096
    # The raw UUID of the GPU whose memory this backend shares (None on host memory):
    # what names a GPU alike whatever CUDA_VISIBLE_DEVICES each rank was given.
    uuid: bytes | None = None
    # Whether the GPU is served by MPS, so that ranks sharing it run side by side.
    under_mps: bool = False

    @abc.abstractmethod
    def allocate(self, nbytes: int) -> Allocation:
        """Allocate ``nbytes`` of shareable memory (already rounded to granularity)."""

    @abc.abstractmethod
    def export(self, allocation: Allocation) -> Exported:
        """The handle of ``allocation`` for peers."""

    @abc.abstractmethod
    def import_peer(self, payload: bytes, fd: OwnedFd | None, nbytes: int) -> Allocation:
        """Map a peer's exported allocation of ``nbytes`` here.

        The backend takes what it needs from ``fd`` and leaves closing it to the caller.

        Raises:
            BackendError: malformed payload, wrong kind or size of descriptor, map failure.
        """

    def import_peers(self, peers: list[tuple[bytes, OwnedFd | None]],
                     nbytes: int) -> list[Allocation]:
        """Map every peer of a window at once (same order as ``peers``); on a failure
        nothing stays mapped. Backends that can share work between peers override it.

        Raises:
            BackendError: as ``import_peer``.
        """
        mapped: list[Allocation] = []
        try:
            for payload, fd in peers:
                mapped.append(self.import_peer(payload, fd, nbytes))
        except BaseException:
            for allocation in reversed(mapped):
                allocation.close()
            raise
        return mapped

    @abc.abstractmethod
    def engine(self) -> Engine:
        """The engine that moves bytes in this backend's memory."""

    @property
    def capabilities(self) -> frozenset[str]:
        """What this backend declares, by name: ``descriptors``, ``device-memory``,
        ``kernels``, ``streams`` (its engine's)."""
        declared = {"descriptors": self.uses_fds, "device-memory": self.device_memory,
                    "kernels": self.has_kernels, "streams": self.device_memory}
        return frozenset(name for name, present in declared.items() if present)

    def kernels(self, source: str) -> Any:
        """ipcshare's kernels from ``source`` (a file of kernels/src), loaded here.

        Raises:
            BackendError: a backend without kernels (``has_kernels`` is False).
        """
        raise BackendError(f"the {self.name} backend runs no kernels (it needs a GPU backend)")

    def share_existing(self, ptr: int, nbytes: int) -> tuple[Exported, int]:
        """Export memory this process already has (not from ``allocate``), without a
        copy: the handle of what holds ``[ptr, ptr + nbytes)`` for peers, and the offset
        of ``ptr`` in what they map. The same memory exports the same payload bytes
        (they name the allocation, not the array), so importers can share mappings.

        Raises:
            BackendError: this memory cannot be shared, naming why and what to do.
        """
        raise BackendError(f"the {self.name} backend cannot share memory it did not allocate")

    def open_existing(self, payload: bytes, fd: OwnedFd | None) -> Allocation:
        """Map here what a peer exported with ``share_existing`` (the caller closes
        ``fd``).

        Raises:
            BackendError: malformed payload or the mapping failed.
        """
        raise BackendError(f"the {self.name} backend cannot map a peer's registered memory")

    def capacity_bytes(self) -> int | None:
        """Memory this process may still allocate, or None when unknown."""
        return None

    def describe_device(self) -> str:
        """Short label of where this rank's memory lives (for tables and JSON)."""
        return "host"

    def close(self) -> None:  # noqa: B027 - a no-op unless the backend holds state
        """Release backend-wide state (contexts, streams); idempotent."""

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
