"""A guest's allocations handed to the leader of its time-sliced GPU
(collectives/guest_imports.py): what is posted and when, what the leader maps and
unmaps, and which address a call then names; over an in-memory channel with stand-in
allocations (tests/mpi/test_guest_imports_mpi.py runs the same over MPI)."""

from __future__ import annotations

import collections

import pytest

from ipcshare.collectives.guest_imports import GuestImports, LeaderImports
from ipcshare.collectives.time_sliced import place_guest_call
from ipcshare.runtime.errors import BackendError
from ipcshare.window import layout

LEADER, GUEST = 0, 1
LEADER_BASE = 0x7F00_0000_0000  # where the stand-in leader maps everything


class PostOffice:
    """Messages between ranks in order, as MPI delivers them per sender."""

    def __init__(self) -> None:
        self.boxes: dict[int, collections.deque] = collections.defaultdict(collections.deque)

    def channel(self, rank: int) -> Channel:
        return Channel(self, rank)


class Channel:
    def __init__(self, office: PostOffice, rank: int) -> None:
        self.office, self.rank = office, rank
        self.posted: list[tuple] = []

    def post(self, rank: int, message: tuple) -> None:
        self.posted.append(message)
        self.office.boxes[rank].append((self.rank, message))

    def pending(self) -> bool:
        return bool(self.office.boxes[self.rank])

    def receive(self) -> list:
        box = self.office.boxes[self.rank]
        received = list(box)
        box.clear()
        return received


class Memory:
    """The guest's allocations: base -> (size, buffer id); ids never repeat."""

    def __init__(self) -> None:
        self.allocations: dict[int, tuple[int, int]] = {}
        self.next_id = 100
        self.refuse: set[int] = set()
        self.with_fd: set[int] = set()
        self.fds: list[FakeFd] = []

    def allocate(self, base: int, size: int) -> int:
        self.next_id += 1
        self.allocations[base] = (size, self.next_id)
        return self.next_id

    def free(self, base: int) -> None:
        del self.allocations[base]

    def _find(self, ptr: int):
        for base, (size, identity) in self.allocations.items():
            if base <= ptr < base + size:
                return base, size, identity
        return None

    def buffer_id(self, ptr: int) -> int | None:
        found = self._find(ptr)
        return None if found is None else found[2]

    def address_range(self, ptr: int) -> tuple[int, int]:
        base, size, _ = self._find(ptr)
        return base, size

    def export(self, base: int, size: int):
        if base in self.refuse:
            raise BackendError(f"the array at 0x{base:x} is managed (unified) memory")
        fd = None
        if base in self.with_fd:
            fd = FakeFd(40 + len(self.fds))
            self.fds.append(fd)
        return f"handle:{base:x}:{self.buffer_id(base)}".encode(), fd


class FakeFd:
    def __init__(self, number: int) -> None:
        self.number, self.closed = number, False

    def fileno(self) -> int:
        return self.number

    def close(self) -> None:
        self.closed = True


class Mapped:
    def __init__(self, ptr: int, payload: bytes) -> None:
        self.ptr, self.payload, self.closed = ptr, payload, False

    def close(self) -> None:
        self.closed = True


class Leader:
    """The stand-in leader's mappings: each export at a new address of its own."""

    def __init__(self) -> None:
        self.mapped: list[Mapped] = []
        self.fetched: list[tuple[int, int]] = []
        self.failing = False

    def open_allocation(self, payload: bytes, fd) -> Mapped:
        if self.failing:
            raise BackendError("cuda:0 cannot reach the memory of cuda:1 peer-to-peer")
        mapping = Mapped(LEADER_BASE + len(self.mapped) * (1 << 30), payload)
        self.mapped.append(mapping)
        return mapping

    def fetch_fd(self, guest: int, number: int) -> FakeFd:
        self.fetched.append((guest, number))
        return FakeFd(90 + number)


def _pair(capacity: int = 64):
    office, memory, leader = PostOffice(), Memory(), Leader()
    guest_side = GuestImports(office.channel(GUEST), LEADER, buffer_id=memory.buffer_id,
                              address_range=memory.address_range, export=memory.export,
                              capacity=capacity)
    leader_side = LeaderImports(office.channel(LEADER), open_allocation=leader.open_allocation,
                                fetch_fd=leader.fetch_fd)
    return guest_side, leader_side, memory, leader


def _always() -> bool:
    return True


def _never() -> bool:
    return False


def test_an_allocation_is_named_by_the_leaders_address_once_it_replied():
    guest, lead, memory, leader = _pair()
    memory.allocate(0x1000_0000, 1 << 20)
    ptr = 0x1000_0000 + 4096
    assert guest.address(ptr, 256, may_post=_always) is None  # posted, copies for now
    assert guest.address(ptr, 256, may_post=_always) is None  # posted once, still waiting
    assert len(guest._channel.posted) == 1
    lead.serve(_always)
    assert [m.payload for m in leader.mapped] == [f"handle:{0x1000_0000:x}:101".encode()]
    assert guest.address(ptr, 256, may_post=_always) == LEADER_BASE + 4096
    assert guest.mapped == 1 and lead.mapped == 1
    # Another array of the same allocation needs nothing new.
    assert guest.address(0x1000_0000, 1 << 20, may_post=_always) == LEADER_BASE
    # An array running past its allocation is not the allocation's.
    assert guest.address(0x1000_0000 + 8, 1 << 20, may_post=_always) is None
    assert len(guest._channel.posted) == 1


def test_nothing_is_posted_or_mapped_during_a_capture():
    guest, lead, memory, leader = _pair()
    memory.allocate(0x2000_0000, 4096)
    assert guest.address(0x2000_0000, 64, may_post=_never) is None
    assert guest._channel.posted == []
    guest.address(0x2000_0000, 64, may_post=_always)
    lead.serve(_never)  # the leader's call is being captured: it waits
    assert leader.mapped == [] and lead._channel.posted == []
    lead.serve(_always)
    assert guest.address(0x2000_0000, 64, may_post=_never) == LEADER_BASE


def test_memory_freed_and_allocated_again_at_the_same_address_is_not_the_old_one():
    guest, lead, memory, leader = _pair()
    base = 0x3000_0000
    memory.allocate(base, 1 << 20)
    guest.address(base, 64, may_post=_always)
    lead.serve(_always)
    assert guest.address(base, 64, may_post=_always) == LEADER_BASE
    memory.free(base)
    memory.allocate(base, 2 << 20)  # a new buffer id at the same base
    assert guest.address(base, 64, may_post=_always) is None
    assert [m[0] for m in guest._channel.posted] == ["open", "close", "open"]
    lead.serve(_always)
    assert leader.mapped[0].closed and not leader.mapped[1].closed
    assert guest.address(base, 64, may_post=_always) == LEADER_BASE + (1 << 30)
    assert lead.mapped == 1


def test_memory_that_cannot_be_shared_is_copied_without_asking_again():
    guest, lead, memory, leader = _pair()
    memory.allocate(0x4000_0000, 4096)
    memory.refuse.add(0x4000_0000)
    for _ in range(3):
        assert guest.address(0x4000_0000, 64, may_post=_always) is None
    assert guest._channel.posted == []
    # Host memory (no buffer id) is never asked about either.
    assert guest.address(0x10, 8, may_post=_always) is None
    assert guest._channel.posted == []


def test_a_leader_that_cannot_map_it_replies_why_and_the_guest_stops_asking():
    guest, lead, memory, leader = _pair()
    memory.allocate(0x5000_0000, 4096)
    leader.failing = True
    guest.address(0x5000_0000, 64, may_post=_always)
    lead.serve(_always)
    kind, _token, why = lead._channel.posted[0]
    assert kind == "refused" and "peer-to-peer" in why
    for _ in range(3):
        assert guest.address(0x5000_0000, 64, may_post=_always) is None
    assert len(guest._channel.posted) == 1 and lead.mapped == 0


def test_a_cumem_descriptor_is_held_until_the_leader_took_it():
    guest, lead, memory, leader = _pair()
    memory.allocate(0x6000_0000, 4096)
    memory.with_fd.add(0x6000_0000)
    guest.address(0x6000_0000, 64, may_post=_always)
    fd = memory.fds[0]
    assert guest._channel.posted[0][3] == fd.number and not fd.closed
    lead.serve(_always)
    assert leader.fetched == [(GUEST, fd.number)]
    assert guest.address(0x6000_0000, 64, may_post=_always) == LEADER_BASE
    assert fd.closed


def test_past_capacity_gone_allocations_make_room_and_live_ones_are_kept():
    guest, lead, memory, leader = _pair(capacity=2)
    for base in (0x1_0000_0000, 0x2_0000_0000):
        memory.allocate(base, 4096)
        guest.address(base, 64, may_post=_always)
    lead.serve(_always)
    memory.allocate(0x3_0000_0000, 4096)
    assert guest.address(0x3_0000_0000, 64, may_post=_always) is None
    assert len(guest._channel.posted) == 2  # full: the third copies, nothing unmapped
    memory.free(0x1_0000_0000)  # gone (never to be named again)
    guest.address(0x3_0000_0000, 64, may_post=_always)
    assert [m[0] for m in guest._channel.posted[2:]] == ["close", "open"]
    lead.serve(_always)
    assert leader.mapped[0].closed and lead.mapped == 2
    assert guest.address(0x2_0000_0000, 64, may_post=_always) == LEADER_BASE + (1 << 30)
    assert guest.address(0x3_0000_0000, 64, may_post=_always) == LEADER_BASE + (2 << 30)


def test_a_release_before_the_reply_unmaps_it_and_the_late_reply_is_ignored():
    guest, lead, memory, leader = _pair()
    memory.allocate(0x7000_0000, 4096)
    guest.address(0x7000_0000, 64, may_post=_always)
    memory.free(0x7000_0000)
    memory.allocate(0x7000_0000, 4096)
    guest.address(0x7000_0000, 64, may_post=_always)  # close the first, open the second
    lead.serve(_always)
    assert [m.closed for m in leader.mapped] == [True, False]
    assert guest.address(0x7000_0000, 64, may_post=_always) == LEADER_BASE + (1 << 30)
    assert guest._waiting == 0


def test_close_unmaps_everything_once():
    guest, lead, memory, leader = _pair()
    for base in (0x1_0000_0000, 0x2_0000_0000):
        memory.allocate(base, 4096)
        guest.address(base, 64, may_post=_always)
    lead.serve(_always)
    lead.close()
    lead.close()
    guest.close()
    guest.close()
    assert all(m.closed for m in leader.mapped) and lead.mapped == 0


def test_an_imported_input_is_staged_by_the_leader_and_nothing_is_copied_by_the_guest():
    imported_in = (layout.GUEST_IMPORTED, LEADER_BASE + 64, 0)
    imported_out = (layout.GUEST_IMPORTED, LEADER_BASE + 8192, 0)
    placement = place_guest_call(imported_in, imported_out, may_alias=True,
                                 staging_offset=4096, result_offset=8192)
    assert placement.input_flags == layout.GUEST_IMPORTED | layout.GUEST_LEADER_STAGES
    assert placement.output_flags == layout.GUEST_IMPORTED
    assert not placement.copy_in and not placement.copy_out
    assert placement.copies_input  # by the leader's staging kernel, on the GPU it runs
    words = placement.words(7)
    assert words[layout.GUEST_OUTPUT] >> layout.GUEST_OFFSET_SHIFT == LEADER_BASE + 8192


@pytest.mark.parametrize("capacity", [1, 3])
def test_many_arrays_of_few_allocations_post_each_allocation_once(capacity):
    guest, lead, memory, leader = _pair(capacity=capacity)
    bases = [0x1_0000_0000 * (i + 1) for i in range(capacity)]
    for base in bases:
        memory.allocate(base, 1 << 20)
    for _round in range(3):
        for base in bases:
            for offset in (0, 4096, 65536):
                guest.address(base + offset, 1024, may_post=_always)
        lead.serve(_always)
    assert len(guest._channel.posted) == capacity and lead.mapped == capacity


class _FakeMpi:
    ANY_SOURCE = -1
    finalized = False

    class Status:
        def Get_source(self) -> int:
            return 1

    @classmethod
    def Is_finalized(cls) -> bool:
        return cls.finalized


class _DeadPeerComm:
    """A duplicate communicator whose probe fails as MPI does once a peer died."""

    def __init__(self) -> None:
        self.freed = 0

    def Dup(self) -> _DeadPeerComm:
        return self

    def Iprobe(self, **_kwargs) -> bool:
        raise RuntimeError("MPI_ERR_PROC_FAILED: process failure")

    def Free(self) -> None:
        self.freed += 1


def test_closing_the_channel_survives_a_dead_peer_and_frees_once(monkeypatch):
    from ipcshare.collectives import guest_imports
    from ipcshare.topology import world

    monkeypatch.setattr(world, "mpi", lambda: _FakeMpi)
    comm = _DeadPeerComm()
    channel = guest_imports.ImportChannel(comm)
    channel.close()  # the failing probe is logged, not raised
    channel.close()
    assert comm.freed == 0  # the probe failed before Free; the second close does nothing
    comm = _DeadPeerComm()
    comm.Iprobe = lambda **_kwargs: False
    channel = guest_imports.ImportChannel(comm)
    channel.close()
    channel.close()
    assert comm.freed == 1
    _FakeMpi.finalized = True
    try:
        comm = _DeadPeerComm()
        channel = guest_imports.ImportChannel(comm)
        channel.close()  # after MPI_Finalize nothing may be called
        assert comm.freed == 0
    finally:
        _FakeMpi.finalized = False
