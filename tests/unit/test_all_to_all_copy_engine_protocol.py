"""The copy-engine all-to-all's ordering, run on a model of a node (no GPU): every rank's
stream is what the real code enqueues for its calls (the algorithm's run, GpuPath's flag
barriers, the stepped all-gather's run), with the kernels and copies as steps that move
bytes in a model of device memory and the pads' words, executed with the streams advancing
in random orders. Calls of other algorithms come before and after it: a stepped all-gather
(two flag barriers), and a one-kernel all-gather that stages its input in its staging
area of the call's parity, meets its peers with the kernel's block barrier, reads every
peer's staging area and ends with no barrier, so a slow peer may still read a staging area
0 when a fast one has begun its next call. The checks: no stream waits for ever, every
call of every rank gets its bytes (a copy that overwrote an inbox or a staging area still
being read shows as a wrong byte), and ranks making the same calls never find a
disagreement, while ranks that do not all find it and leave every output as it was.
Without ``publish_call``'s wait for the peers' previous call, some order gives a wrong
byte."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import numpy as np
import pytest

from ipcshare.collectives.agreement import Signature
from ipcshare.collectives.algorithms import algorithm
from ipcshare.collectives.algorithms.gpu_kernel import GpuCall
from ipcshare.collectives.gpu_path import GpuPath
from ipcshare.collectives.scratch import ScratchLayout
from ipcshare.window.layout import KERNEL_SLOT_BASE, ONE_SHOT_EPOCH_SLOT

from .device_memory import DeviceMemory
from .stream_model import Pad, StreamRecorder, run_streams

# Bytes of a block of the all-to-alls, and of an all-gather's input.
BLOCK, GATHER = 24, 40
# Every kind after every other one, the all-to-all in place and not.
CALLS = ("one-kernel", "a2a", "a2a", "one-kernel", "a2a-in-place", "stepped", "a2a",
         "stepped", "one-kernel", "a2a-in-place", "a2a", "one-kernel", "stepped", "stepped",
         "a2a")


class _Node:
    """Every rank's window, pads and streams for ``calls`` (the kinds above, the same on
    every rank), with the data each call's output must end up holding."""

    def __init__(self, size: int, calls: tuple[str, ...], *, publish_waits: bool = True,
                 odd_rank_count: int | None = None) -> None:
        self.size = size
        self.memory = DeviceMemory()
        self.layout = ScratchLayout(2 * size * BLOCK, 0, size, gpu=True)
        self.windows = [self.memory.add(self.layout.total_bytes) for _ in range(size)]
        self.headers: dict[tuple[int, int], int] = {}   # (rank, parity) -> digest
        self.disagreements: set[tuple[int, int]] = set()  # (rank, call) that found one
        self.checks: list[tuple[int, int, np.ndarray]] = []  # (output, call, bytes)
        # (rank, call) -> (output, bytes, what it held before) of every all-to-all
        self.untouched: dict[tuple[int, int], tuple[int, int, np.ndarray]] = {}
        self.publish_waits = publish_waits
        pads = {rank: Pad(rank) for rank in range(size)}
        self.streams = {}
        for me in range(size):
            engine = StreamRecorder()
            path = SimpleNamespace(_meetings={}, rank=me, size=size,
                                   group=SimpleNamespace(signal_timeout=1.0),
                                   window=SimpleNamespace(signal_pad=lambda r: pads[r]))
            meetings = GpuPath._meetings_on(path, engine)
            for number, kind in enumerate(calls):
                blocks = 2 * BLOCK if (me, number) == (0, odd_rank_count) else BLOCK
                self._call(engine, meetings, me, number, kind, blocks)
            self.streams[me] = engine.items

    # -- what the kernels do, as steps of a stream ---------------------------------------
    def _staging(self, rank: int, parity: int) -> int:
        return self.windows[rank] + self.layout.staging_offset(parity)

    def _publish(self, me: int, parity: int, digest: int) -> tuple:
        return ("op", lambda: self.headers.__setitem__((me, parity), digest))

    def _compare(self, me: int, number: int, parity: int, digest: int) -> tuple:
        def compare() -> None:
            if any(self.headers.get((r, parity)) != digest for r in range(self.size)):
                self.disagreements.add((me, number))
        return ("op", compare)

    def _keep_output(self, me: int, number: int, output: int, nbytes: int) -> tuple:
        """The guard's copy, where this call found a disagreement: the output into the
        inbox, which the copies after it then write back."""
        def keep() -> None:
            if (me, number) in self.disagreements:
                self.memory.copy([(self._staging(me, 0), output, nbytes)])
        return ("op", keep)

    def _end(self, me: int, epoch: int) -> tuple:
        return ("batch", [("write", me, ONE_SHOT_EPOCH_SLOT, epoch)])

    def _data(self, number: int, rank: int, nbytes: int) -> np.ndarray:
        return np.random.default_rng([number, rank]).integers(0, 256, nbytes, dtype=np.uint8)

    def _gather_all(self, me: int, output: int, parity: int) -> tuple:
        def gather() -> None:
            for rank in range(self.size):
                self.memory.at(output + rank * GATHER, GATHER)[:] = \
                    self.memory.at(self._staging(rank, parity), GATHER)
        return ("op", gather)

    def _call(self, engine: StreamRecorder, meetings: tuple, me: int, number: int,
              kind: str, block: int) -> None:
        n, items, memory = self.size, engine.items, self.memory
        epoch = number + 1
        parity = epoch & 1
        others = [r for r in range(n) if r != me]
        if kind.startswith("a2a"):
            source = memory.add(n * block)
            memory.at(source, n * block)[:] = self._data(number, me, n * block)
            output = source if kind == "a2a-in-place" else memory.add(n * block)
            self.checks.append((output, n * block, np.concatenate(
                [self._data(number, q, n * block)[me * block:(me + 1) * block]
                 for q in range(n)])))
            signature = Signature("all_to_all", n * block, "uint8", 1, None, "copy-engine")

            self.untouched[(me, number)] = (output, n * block,
                                            memory.at(output, n * block).copy())

            def launch(entry: str, blocks: int) -> None:
                if entry == "publish_call":
                    assert blocks == 1
                    items.append(self._publish(me, parity, signature.digest))
                    if self.publish_waits and others:
                        items.append(("batch", [("wait", r, ONE_SHOT_EPOCH_SLOT, epoch - 1)
                                                for r in others]))
                elif entry == "guard_all_to_all_output":
                    items.append(self._compare(me, number, parity, signature.digest))
                    items.append(self._keep_output(me, number, output, n * block))
                else:
                    assert (entry, blocks) == ("finish_call", 1)
                    items.append(self._end(me, epoch))
            args = SimpleNamespace(rank=me, input=source, output=output, windows=self.windows,
                                   staging_offset=[self.layout.staging_offset(p)
                                                   for p in (0, 1)])
            algorithm("cuda", "all_to_all", "copy-engine").run(GpuCall(
                signature, n, launch, meet=lambda turn: meetings[turn](),
                copy=lambda jobs: items.append(("op", lambda j=list(jobs): memory.copy(j))),
                args=args))
            return
        # An all-gather of GATHER bytes a rank: staged, met, read from every staging area.
        source = memory.add(GATHER)
        memory.at(source, GATHER)[:] = self._data(number, me, GATHER)
        output = memory.add(n * GATHER)
        self.checks.append((output, n * GATHER, np.concatenate(
            [self._data(number, q, GATHER) for q in range(n)])))
        signature = Signature("all_gather", GATHER, "uint8", 1, None, kind)

        def stage() -> None:
            memory.copy([(self._staging(me, parity), source, GATHER)])
        if kind == "one-kernel":
            barrier = ([("write", r, KERNEL_SLOT_BASE + me, epoch) for r in others]
                       + [("wait", me, KERNEL_SLOT_BASE + r, epoch) for r in others])
            items += [("op", stage), self._publish(me, parity, signature.digest),
                      *([("batch", barrier)] if barrier else []),
                      self._compare(me, number, parity, signature.digest),
                      self._gather_all(me, output, parity), self._end(me, epoch)]
            return

        def launch_stepped(entry: str, blocks: int) -> None:
            if entry.startswith("stage_and_publish"):
                items.extend([("op", stage), self._publish(me, parity, signature.digest)])
                return
            items.extend([self._compare(me, number, parity, signature.digest),
                          self._gather_all(me, output, parity), self._end(me, epoch)])
        algorithm("cuda", "all_gather", "stepped").run(GpuCall(
            signature, n, launch_stepped, meet=lambda turn: meetings[turn]()))

    def run(self, seed: int) -> None:
        run_streams(self.streams, seed, lambda _rank, item: item[1]())

    def wrong_outputs(self) -> list[int]:
        return [place for place, (output, nbytes, want) in enumerate(self.checks)
                if not np.array_equal(self.memory.at(output, nbytes), want)]


@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_every_call_gets_its_bytes_in_any_order_of_the_streams(size):
    for seed in range(120):
        node = _Node(size, CALLS)
        node.run(seed)
        assert node.wrong_outputs() == [], seed
        assert not node.disagreements, seed


def test_without_waiting_for_the_peers_previous_call_some_order_overwrites_a_staging_area():
    """The model is not blind to the hazard publish_call guards: a rank that starts its
    copies as soon as its own previous call is done overwrites a peer's staging area 0
    while a slower peer still reads it there (a one-kernel call of parity 0 just before)."""
    wrong = 0
    for seed in range(200):
        node = _Node(3, ("a2a", "one-kernel", "a2a"), publish_waits=False)
        node.run(seed)
        wrong += bool(node.wrong_outputs())
    assert wrong


def test_ranks_that_make_different_calls_all_find_it_and_none_waits_for_ever():
    calls = ("a2a", "stepped", "a2a", "one-kernel", "a2a")
    for size, seed in itertools.product((2, 3, 4), range(40)):
        node = _Node(size, calls, odd_rank_count=2)   # rank 0's third call is larger
        node.run(seed)
        assert node.disagreements == {(rank, 2) for rank in range(size)}, (size, seed)
        # Every other call is right, before and after it; that one moved no element.
        wrong = node.wrong_outputs()
        assert all(place % len(calls) == 2 for place in wrong), (size, seed, wrong)
        for rank in range(size):
            output, nbytes, before = node.untouched[(rank, 2)]
            assert np.array_equal(node.memory.at(output, nbytes), before), (size, seed)
