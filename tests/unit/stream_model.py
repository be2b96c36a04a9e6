"""A model of a node's streams for protocol tests without a GPU: each rank's stream is the
list of what its code enqueued (batches of stream memory operations, and whatever markers
or kernels a test records), executed against one memory of signal-pad words, the streams
advancing in a random order among those that can."""

from __future__ import annotations

import random
from collections.abc import Callable

from ipcshare.backends.cuda_engine import CudaEngine


class Pad:
    """A rank's signal pad, known by its owner (``ptr`` for code that takes addresses)."""

    def __init__(self, owner: int) -> None:
        self.owner = owner
        self.ptr = 0x1000 * (owner + 1)


class StreamRecorder:
    """One rank's stream: ``items`` holds ("batch", [(kind, pad owner, slot, value)])
    for each batch of stream operations, and what the test appends itself."""

    def __init__(self) -> None:
        self.items: list[tuple] = []
        self.stream = 0

    def make_signal_batch(self, steps: list[tuple], *, timeout: float) -> Callable[[], None]:
        for step in steps:
            assert step[0] in ("write", "wait") and isinstance(step[1], Pad)
        frozen = [(kind, pad.owner, slot, value) for kind, pad, slot, value, *_ in steps]

        def enqueue() -> None:
            if frozen:  # as CudaEngine's: no steps, no stream operation (a rank alone)
                self.items.append(("batch", frozen))
        return enqueue

    # The real composition of the flag barriers' steps, on this recorder.
    make_party_flag_barrier = CudaEngine.make_party_flag_barrier
    make_flag_barrier = CudaEngine.make_flag_barrier


def run_streams(streams: dict[int, list[tuple]], seed: int,
                on_item: Callable[[int, tuple], None],
                memory: dict[tuple[int, int], int] | None = None) -> None:
    """Execute every stream to its end, one step at a time, in an order drawn with
    ``seed``: a batch's writes set words, its waits hold the stream until the word is
    at least the value, and every other item goes to ``on_item(rank, item)`` (which
    asserts what the test promises, and may read and write the words of ``memory``,
    {(pad owner, slot): value}, which the batches use). Fails when every unfinished
    stream waits."""
    rng = random.Random(seed)
    memory = {} if memory is None else memory
    position = {rank: 0 for rank in streams}
    step_in_batch = {rank: 0 for rank in streams}

    def can_advance(rank: int) -> bool:
        items = streams[rank]
        if position[rank] == len(items):
            return False
        item = items[position[rank]]
        if item[0] != "batch":
            return True
        kind, owner, slot, value = item[1][step_in_batch[rank]]
        return kind == "write" or memory.get((owner, slot), 0) >= value

    def advance(rank: int) -> None:
        item = streams[rank][position[rank]]
        if item[0] == "batch":
            kind, owner, slot, value = item[1][step_in_batch[rank]]
            if kind == "write":
                memory[(owner, slot)] = value
            step_in_batch[rank] += 1
            if step_in_batch[rank] < len(item[1]):
                return
            step_in_batch[rank] = 0
        else:
            on_item(rank, item)
        position[rank] += 1

    while any(position[rank] < len(streams[rank]) for rank in streams):
        ready = [rank for rank in streams if can_advance(rank)]
        assert ready, f"every stream waits: {position}"
        advance(rng.choice(ready))
