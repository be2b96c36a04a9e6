"""The hand-over of guests' allocations (collectives/guest_imports.py) over real MPI
messages: every other rank is a guest of rank 0, with stand-in allocations; rank 0 maps
each once and every guest learns its address, while ranks go on without waiting for each
other's hosts (any world size; one rank has no guests and nothing to do)."""

from __future__ import annotations

import time

import pytest

from ipcshare.collectives.guest_imports import GuestImports, ImportChannel, LeaderImports

pytestmark = pytest.mark.mpi

LEADER_BASE = 0x7F00_0000_0000


class _Mapped:
    def __init__(self, ptr: int) -> None:
        self.ptr, self.closed = ptr, False

    def close(self) -> None:
        self.closed = True


def test_every_guest_learns_where_its_leader_mapped_its_allocations(comm):
    channel = ImportChannel(comm)
    try:
        rank, size = comm.rank, comm.size
        # Guest g's allocations lie at g << 32 (two of them, 1 MiB each).
        bases = [(rank << 32) + (i << 24) for i in range(2)]
        ids = {base: rank * 10 + i for i, base in enumerate(bases)}

        def buffer_id(ptr: int) -> int | None:
            return next((ids[b] for b in bases if b <= ptr < b + (1 << 20)), None)

        def address_range(ptr: int) -> tuple[int, int]:
            return next((b, 1 << 20) for b in bases if b <= ptr < b + (1 << 20))

        def export(base: int, nbytes: int):
            return base.to_bytes(8, "little") + nbytes.to_bytes(8, "little"), None

        opened: list[tuple[int, int]] = []

        def open_allocation(payload: bytes, fd) -> _Mapped:
            base = int.from_bytes(payload[:8], "little")
            opened.append((base >> 32, base))
            return _Mapped(LEADER_BASE + base)  # an address of the leader's own per guest

        if rank == 0:
            leader = LeaderImports(channel, open_allocation=open_allocation,
                                   fetch_fd=lambda *_: pytest.fail("no descriptor was sent"))
            deadline = time.monotonic() + 20
            while len(opened) < 2 * (size - 1) and time.monotonic() < deadline:
                leader.serve(lambda: True)
            assert sorted(opened) == sorted((g, (g << 32) + (i << 24))
                                            for g in range(1, size) for i in range(2))
            comm.barrier()  # every guest has its replies
            leader.close()
        else:
            guest = GuestImports(channel, 0, buffer_id=buffer_id, address_range=address_range,
                                 export=export)
            for base in bases:
                assert guest.address(base + 64, 128, may_post=lambda: True) is None
            deadline = time.monotonic() + 20
            found: list[int | None] = [None, None]
            while None in found and time.monotonic() < deadline:
                found = [guest.address(base + 64, 128, may_post=lambda: True)
                         for base in bases]
            assert found == [LEADER_BASE + base + 64 for base in bases]
            comm.barrier()
            guest.close()
        comm.barrier()
    finally:
        channel.close()
        channel.close()
