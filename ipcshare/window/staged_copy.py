"""Stream-ordered copies between two ranks of a node whose GPUs have no peer access: the
bytes go in chunks through a staging area both ends can reach, double-buffered, with
flags in pinned host memory, and both ends take part (the sender enqueues its pushes, the
receiver its pulls).

- ``relay``: the staging slots lie in a third rank's window (whose GPU reaches both
  ends); the sender's copy engine writes a chunk there, the receiver's reads it out. The
  relay rank's process does nothing.
- ``host-staged``: the slots lie in the receiver's pinned host inbox (a node-shared
  memfd every end registers with the driver): the sender copies device to host, the
  receiver host to device.

Protocol per directed pair (sender s, receiver r), ``STAGING_SLOTS`` slots, chunks numbered
1, 2, ... over the life of the window (both ends count the same chunks, since both bind
the same transfers in the same order): chunk c goes to slot (c - 1) % STAGING_SLOTS. The sender
waits until FREE[s<-r] >= c - STAGING_SLOTS (the slot's previous chunk was taken), copies the
chunk in, and stores READY = c into the receiver's inbox; the receiver waits until
READY >= c, copies the chunk out, and stores FREE = c into the sender's inbox. The
stores are ``cuStreamWriteValue64`` with the default flags (a system-wide fence before
the store: the chunk is visible before its flag), the waits ``cuStreamWaitValue64`` on
the waiter's own inbox, so every flag is written remotely and polled locally.

Each (direction, peer) runs on a lane of its own (a stream forked from the caller's
stream by an event and joined back by another), so a rank that both sends to and
receives from a peer never waits on itself, and the caller's stream stays asynchronous:
the host never blocks per chunk.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

from ..backends.cuda_streams import new_side_lane
from ..backends.device_buffer import DeviceBuffer
from ..backends.pinned_host import PinnedHostMemory, create_pinned, open_peer_pinned
from ..exchange import Exchange
from ..liveness.consensus import Rendezvous
from ..runtime.cuda_driver import NOT_READY, SUCCESS, check, cuda_error, driver
from ..runtime.errors import WindowError
from ..topology.peer_paths import PathPlan
from ..topology.world import World
from .layout import (
    INBOX_FREE_WORD_BASE,
    INBOX_HEADER_BYTES,
    INBOX_READY_WORD_BASE,
    STAGING_SLOTS,
    inbox_bytes,
    slot_stride,
)

__all__ = ["StagedCopy", "open_staged_copy"]


class _Lane:
    """A stream of its own for one (direction, peer), the event marking its end, and the
    engine enqueuing signals on it."""

    def __init__(self, engine: Any) -> None:
        self.stream, self.done = new_side_lane()
        try:
            self.engine = engine.on_stream(int(self.stream))
        except BaseException:
            self.close()
            raise

    def idle(self) -> bool:
        err, = driver.cuStreamQuery(self.stream)
        return err != NOT_READY

    def close(self) -> None:
        # A stream destroyed while busy is released once its work is done.
        try:
            check("cuEventDestroy", driver.cuEventDestroy(self.done))
        finally:
            check("cuStreamDestroy", driver.cuStreamDestroy(self.stream))


class StagedCopy:
    """The fallback copies of one window: owns this rank's pinned inbox, its mappings of
    the inboxes of the peers it cannot map, and the lanes; reads the relays' staging
    areas through the window's mappings.

    ``bind`` is the building block: both ends of every pair bind matching transfers
    (the sender the source, the receiver the destination, equal lengths, same order) and
    call them within the same collective operation.

    Raises:
        WindowError: (``bind``) a peer whose pair is direct, or a closed channel.
    """

    def __init__(self, *, engine: Any, world: Any, plan: PathPlan, inbox: PinnedHostMemory,
                 peer_inboxes: dict[int, PinnedHostMemory], relay_areas: dict[int, DeviceBuffer],
                 slot_bytes: int, timeout: float) -> None:
        self._engine = engine
        self._world = world
        self.plan = plan
        self.rank = world.rank
        self.slot_bytes = slot_bytes
        self._stride = slot_stride(slot_bytes)
        self._inbox = inbox
        self._peer_inboxes = dict(peer_inboxes)
        self._relay_areas = dict(relay_areas)
        self._timeout = timeout
        self._lanes: dict[tuple[str, int], _Lane] = {}
        self._fork: Any = None
        # Chunks posted to / taken from each peer so far: both ends count alike.
        self._sent: dict[int, int] = {}
        self._taken: dict[int, int] = {}
        self._closed = False

    # -- words shared with the window's barrier ------------------------------------
    @property
    def own_words(self) -> DeviceBuffer:
        """This rank's inbox header (barrier, READY and FREE words) as device memory."""
        return self._inbox.device_buffer(0, INBOX_HEADER_BYTES)

    def words_of(self, rank: int) -> DeviceBuffer:
        """The inbox header of ``rank`` (a peer this rank cannot map) as mapped here."""
        if rank == self.rank:
            return self.own_words
        return self._peer_inboxes[rank].device_buffer(0, INBOX_HEADER_BYTES)

    @property
    def peers(self) -> list[int]:
        """The ranks this rank reaches through relays or host memory."""
        return list(self._peer_inboxes)

    # -- copies --------------------------------------------------------------------
    def bind(self, engine: Any, *, sends: list[tuple[int, DeviceBuffer]] = (),
             receives: list[tuple[int, DeviceBuffer]] = ()) -> Callable[[], None]:
        """A callable enqueuing, on ``engine``'s stream, every ``(peer, source)`` of
        ``sends`` (this rank's bytes to ``peer``) and every ``(peer, destination)`` of
        ``receives`` (``peer``'s bytes into this rank's memory). Returns at once; the
        caller's stream continues once every send has left and every receive landed.

        Raises:
            WindowError: a peer this rank maps directly (or itself), or a closed channel.
            CudaError: a lane could not be created.
        """
        self._check_open()
        grouped: dict[tuple[str, int], list[DeviceBuffer]] = {}
        for direction, transfers in (("send", sends), ("receive", receives)):
            for peer, buffer in transfers:
                if peer not in self._peer_inboxes:
                    raise WindowError(
                        f"{self._world.where()}: a staged copy to or from "
                        f"{self._world.where(peer)}, whose path is "
                        f"{self.plan.kind(self.rank, peer)}: copy directly instead")
                grouped.setdefault((direction, peer), []).append(buffer)
        if self._fork is None:
            self._fork = check("cuEventCreate", driver.cuEventCreate(
                int(driver.CUevent_flags.CU_EVENT_DISABLE_TIMING)))
        prepared = []
        for (direction, peer), buffers in grouped.items():
            lane = self._lane(direction, peer)
            make = self._sender if direction == "send" else self._receiver
            prepared.append((lane.stream, lane.done, make(lane, peer, buffers)))
        caller, fork = engine.stream, self._fork
        record, wait_event = driver.cuEventRecord, driver.cuStreamWaitEvent

        def staged() -> None:
            if not prepared:
                return
            check("cuEventRecord", record(fork, caller))
            for stream, done, enqueue in prepared:
                check("cuStreamWaitEvent", wait_event(stream, fork, 0))
                enqueue()
                check("cuEventRecord", record(done, stream))
            for _stream, done, _enqueue in prepared:
                check("cuStreamWaitEvent", wait_event(caller, done, 0))
        return staged

    def _lane(self, direction: str, peer: int) -> _Lane:
        key = (direction, peer)
        if key not in self._lanes:
            self._lanes[key] = _Lane(self._engine)
        return self._lanes[key]

    def _index(self, rank: int) -> int:
        return self.plan.ranks.index(rank)

    def _slots(self, sender: int, receiver: int) -> int:
        """Address, in this process, of the first staging slot of sender -> receiver."""
        path = self.plan.path(sender, receiver)
        if path.kind == "relay":
            assert path.relay is not None
            index = self.plan.relayed_by(path.relay).index((sender, receiver))
            return self._relay_areas[path.relay].ptr + index * STAGING_SLOTS * self._stride
        inbox = self._inbox if receiver == self.rank else self._peer_inboxes[receiver]
        index = self.plan.host_staged_peers(receiver).index(sender)
        return inbox.device_ptr + INBOX_HEADER_BYTES + index * STAGING_SLOTS * self._stride

    def _chunks(self, buffers: list[DeviceBuffer]) -> list[tuple[int, int]]:
        step = self.slot_bytes
        return [(buffer.ptr + offset, min(step, buffer.nbytes - offset))
                for buffer in buffers for offset in range(0, buffer.nbytes, step)]

    def _label(self, verb: str, peer: int) -> str:
        return (f"{self._world.where()} {verb} {self._world.where(peer)} "
                f"({self.plan.describe(self.rank, peer)})")

    def _sender(self, lane: _Lane, peer: int, sources: list[DeviceBuffer]) -> Callable[[], None]:
        wait_free = lane.engine.signal_waiter(
            self.own_words, INBOX_FREE_WORD_BASE + self._index(peer), timeout=self._timeout,
            what=self._label("waiting for a free staging slot of", peer))
        post_ready = lane.engine.signal_poster(self.words_of(peer),
                                               INBOX_READY_WORD_BASE + self._index(self.rank))
        base, stride, stream = self._slots(self.rank, peer), self._stride, lane.stream
        chunks, counters, memcpy = self._chunks(sources), self._sent, driver.cuMemcpyAsync

        def enqueue() -> None:
            count = counters.get(peer, 0)
            for source, length in chunks:
                count += 1
                if count > STAGING_SLOTS:
                    wait_free(count - STAGING_SLOTS)
                err, = memcpy(base + ((count - 1) % STAGING_SLOTS) * stride, source, length, stream)
                if err != SUCCESS:
                    raise cuda_error("cuMemcpyAsync", err)
                post_ready(count)
            counters[peer] = count
        return enqueue

    def _receiver(self, lane: _Lane, peer: int,
                  targets: list[DeviceBuffer]) -> Callable[[], None]:
        wait_ready = lane.engine.signal_waiter(
            self.own_words, INBOX_READY_WORD_BASE + self._index(peer), timeout=self._timeout,
            what=self._label("waiting for a staged chunk from", peer))
        post_free = lane.engine.signal_poster(self.words_of(peer),
                                              INBOX_FREE_WORD_BASE + self._index(self.rank))
        base, stride, stream = self._slots(peer, self.rank), self._stride, lane.stream
        chunks, counters, memcpy = self._chunks(targets), self._taken, driver.cuMemcpyAsync

        def enqueue() -> None:
            count = counters.get(peer, 0)
            for target, length in chunks:
                count += 1
                wait_ready(count)
                err, = memcpy(target, base + ((count - 1) % STAGING_SLOTS) * stride, length, stream)
                if err != SUCCESS:
                    raise cuda_error("cuMemcpyAsync", err)
                post_free(count)
            counters[peer] = count
        return enqueue

    # -- lifetime ------------------------------------------------------------------
    def drain(self, timeout: float) -> None:
        """Wait (at most ``timeout`` seconds in all) for the lanes to go idle, so no
        staged copy still touches an inbox or a relay's window when they close."""
        deadline = time.monotonic() + timeout
        for lane in self._lanes.values():
            while not lane.idle() and time.monotonic() < deadline:
                time.sleep(1e-4)

    def _check_open(self) -> None:
        if self._closed:
            raise WindowError("the window's staged copies are closed")

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Destroy the lanes, unmap the peers' inboxes, then this rank's (idempotent).

        Raises:
            CudaError: a release failed (every one is attempted; the first is raised).
        """
        if self._closed:
            return
        self._closed = True
        first: BaseException | None = None
        releases: list[Callable[[], None]] = [lane.close for lane in self._lanes.values()]
        if self._fork is not None:
            fork = self._fork
            releases.append(lambda: check("cuEventDestroy", driver.cuEventDestroy(fork)))
        releases += [inbox.close for inbox in self._peer_inboxes.values()]
        releases.append(self._inbox.close)
        for release in releases:
            try:
                release()
            except Exception as exc:  # release the rest, then report
                first = first or exc
        self._lanes.clear()
        self._fork = None
        self._relay_areas.clear()
        if first is not None:
            raise first


def open_staged_copy(undo: contextlib.ExitStack, *, rendezvous: Rendezvous, exchange: Exchange,
                     world: World, plan: PathPlan, engine: Any, device: int,
                     relay_areas: Callable[[set[int]], dict[int, DeviceBuffer]],
                     slot_bytes: int, timeout: float) -> StagedCopy | None:
    """Collective over the job: every rank makes a pinned inbox and passes it to its
    node's peers; each rank maps the inboxes of the peers it cannot map and keeps them
    in a StagedCopy (None where this rank has no such peer). Each step's undo goes on
    ``undo``, the window's setup transaction; ``relay_areas(relays)`` gives the staging
    area of each relay rank's window, as mapped here."""
    size = inbox_bytes(plan, slot_bytes)
    peers = plan.indirect_peers(world.rank)
    with rendezvous.step("pinned inbox"):
        inbox, inbox_fd = create_pinned(size, device, what=f"pinned inbox of {world.where()}")
        undo.callback(inbox.close)
        undo.callback(inbox_fd.close)
    fds = exchange.share_fds(inbox_fd)  # collective over the node, agrees job-wide
    inbox_fd.close()
    for owned in fds.values():
        undo.callback(owned.close)
    with rendezvous.step("pinned inbox import"):
        peer_inboxes = {}
        for rank in peers:
            peer_inboxes[rank] = open_peer_pinned(
                fds[rank], size, device, what=f"pinned inbox of {world.where(rank)}")
            undo.callback(peer_inboxes[rank].close)
        for owned in fds.values():
            owned.close()
        if not peers:
            inbox.close()  # nobody writes into it: no peer of ours goes through staging
            return None
        relays = {plan.path(world.rank, r).relay for r in peers} - {None}
        staged = StagedCopy(engine=engine, world=world, plan=plan, inbox=inbox,
                            peer_inboxes=peer_inboxes, relay_areas=relay_areas(relays),
                            slot_bytes=slot_bytes, timeout=timeout)
        undo.callback(staged.close)
    return staged
