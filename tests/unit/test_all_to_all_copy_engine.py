"""The copy-engine all-to-all without a GPU (collectives/algorithms/
gpu_all_to_all_copy_engine.py): its plan of copies run on a model of every rank's memory
(every byte of every block delivered once, to its place, inside the window's areas, no
batch reading what it writes), the steps every rank enqueues, where the registry lists
it, and what the CLI says where it does not run."""

from __future__ import annotations

import types

import numpy as np
import pytest

from ipcshare.collectives.agreement import Signature
from ipcshare.collectives.algorithms import algorithm, algorithm_names
from ipcshare.collectives.algorithms.gpu_all_to_all_copy_engine import copy_plan
from ipcshare.collectives.algorithms.gpu_copy_engine import GUARD_BLOCKS, merged_copies
from ipcshare.collectives.algorithms.gpu_kernel import GpuCall
from ipcshare.collectives.scratch import ScratchLayout
from ipcshare.runtime.errors import CollectiveError, ConfigError

from .device_memory import DeviceMemory

SIZES = range(1, 9)
ITEMSIZES = (1, 2, 4, 8)
# Elements of a block (the elements a rank sends each rank): none, odd, and long.
BLOCKS = (0, 1, 3, 7, 1001)


def _overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[0] + b[1] and b[0] < a[0] + a[1]


class _Node:
    """Every rank's window (sized for this call: max_bytes its input), input and output
    in one model of memory, each input holding seeded bytes."""

    def __init__(self, size: int, count: int, itemsize: int, in_place: bool) -> None:
        nbytes = count * itemsize
        self.layout = ScratchLayout(max(nbytes, 1), 0, size, gpu=True)
        self.memory = memory = DeviceMemory()
        self.windows = [memory.add(self.layout.total_bytes) for _ in range(size)]
        self.inboxes = [window + self.layout.staging_offset(0) for window in self.windows]
        rng = np.random.default_rng([size, count, itemsize])
        self.data = [rng.integers(0, 256, nbytes, dtype=np.uint8) for _ in range(size)]
        self.inputs, self.outputs = [], []
        for rank in range(size):
            self.inputs.append(memory.add(max(nbytes, 1)))
            memory.at(self.inputs[rank], nbytes)[:] = self.data[rank]
            self.outputs.append(self.inputs[rank] if in_place else memory.add(max(nbytes, 1)))

    def plans(self, count: int, itemsize: int):
        size = len(self.windows)
        return [copy_plan(rank, size, count, itemsize, input=self.inputs[rank],
                          output=self.outputs[rank], inboxes=self.inboxes)
                for rank in range(size)]

    def owner_of_inbox(self, dst: int, nbytes: int) -> int | None:
        """The rank whose inbox (staging area 0) holds ``[dst, dst + nbytes)``, else None."""
        for rank, inbox in enumerate(self.inboxes):
            if inbox <= dst and dst + nbytes <= inbox + self.layout.staging_bytes:
                return rank
        return None


def _deliver(size: int, block_count: int, itemsize: int, in_place: bool) -> None:
    count = size * block_count
    node = _Node(size, count, itemsize, in_place)
    block = block_count * itemsize
    plans = node.plans(count, itemsize)
    # Writes per byte of every inbox and output: each exactly once where a block lands.
    inbox_writes = [np.zeros(node.layout.staging_bytes, np.int64) for _ in range(size)]
    output_writes = [np.zeros(count * itemsize, np.int64) for _ in range(size)]
    for rank, plan in enumerate(plans):
        for dst, src, nbytes in plan.sends:
            assert nbytes == block > 0
            receiver = node.owner_of_inbox(dst, nbytes)
            # Block q of our input into slot `rank` of rank q's inbox, ours too (not in
            # place): every copy into the output reads the inbox, after the guard.
            assert receiver is not None
            assert not (receiver == rank and in_place)
            assert src == node.inputs[rank] + receiver * block
            assert dst == node.inboxes[receiver] + rank * block
            inbox_writes[receiver][rank * block:(rank + 1) * block] += 1
        for dst, src, nbytes in plan.receives:
            # From our inbox into our output at the same place; our own slot not in place.
            start = src - node.inboxes[rank]
            assert node.owner_of_inbox(src, nbytes) == rank
            assert dst == node.outputs[rank] + start
            if in_place:
                assert not _overlap((start, nbytes), (rank * block, block))
            output_writes[rank][start:start + nbytes] += 1
    for rank in range(size):
        slots = np.ones(count * itemsize, np.int64)
        if in_place:
            slots[rank * block:(rank + 1) * block] = 0
        assert np.array_equal(inbox_writes[rank][:count * itemsize], slots)
        assert not inbox_writes[rank][count * itemsize:].any()
        # In place our own block is never written: it is there already.
        assert np.array_equal(output_writes[rank], slots if in_place else slots * 0 + 1)
    # The two batches, each of which may run all at once, on every rank: sends before
    # the barrier, receives after it.
    for stage in ("sends", "receives"):
        jobs = [job for plan in plans for job in getattr(plan, stage)]
        writes = [(dst, nbytes) for dst, _src, nbytes in jobs]
        reads = [(src, nbytes) for _dst, src, nbytes in jobs]
        for i, written in enumerate(writes):
            assert not any(_overlap(written, other) for other in writes[i + 1:]), stage
            assert not any(_overlap(written, read) for read in reads), stage
        node.memory.copy(jobs)
    for rank in range(size):
        got = node.memory.at(node.outputs[rank], count * itemsize)
        want = [node.data[q][rank * block:(rank + 1) * block] for q in range(size)]
        assert np.array_equal(got, np.concatenate(want) if want else got[:0]), rank


@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("itemsize", ITEMSIZES)
@pytest.mark.parametrize("size", SIZES)
def test_every_byte_of_every_block_arrives_once_at_its_place(size, itemsize, in_place):
    for block_count in BLOCKS:
        _deliver(size, block_count, itemsize, in_place)


def test_an_input_as_large_as_max_bytes_fits_the_inboxes_whole():
    """The communicator refuses inputs over max_bytes before any algorithm runs, and
    _Node sizes every window for exactly its call, so the test above already lands every
    block of the largest input inside the inboxes; here, the same for large calls."""
    for size in (2, 3, 8):
        _deliver(size, 12_345, 8, in_place=False)
        layout = ScratchLayout(1 << 30, 0, size, gpu=True)
        assert layout.staging_bytes >= layout.max_bytes


@pytest.mark.parametrize("size", SIZES)
def test_the_receives_are_merged_into_the_runs_before_and_after_our_block(size):
    block_count, itemsize = 5, 4
    node = _Node(size, size * block_count, itemsize, in_place=False)
    for rank, plan in enumerate(node.plans(size * block_count, itemsize)):
        # One copy of the whole inbox (our own block's slot included).
        assert len(plan.receives) == 1
        assert len(plan.sends) == size  # one per peer, and our own block
        # Rotated: the next rank first, so no rank is every sender's first target.
        if size > 1:
            first = node.owner_of_inbox(plan.sends[0][0], plan.sends[0][2])
            assert first == (rank + 1) % size
    in_place = _Node(size, size * block_count, itemsize, in_place=True)
    for rank, plan in enumerate(in_place.plans(size * block_count, itemsize)):
        assert len(plan.sends) == size - 1   # our own block is already where it goes
        # One copy per side of our own block that has any block.
        assert len(plan.receives) == (rank > 0) + (rank < size - 1)


def test_merged_copies_join_runs_adjacent_on_both_sides_only():
    assert merged_copies([]) == []
    assert merged_copies([(100, 500, 10), (110, 510, 6), (116, 516, 4)]) == [(100, 500, 20)]
    # Adjacent at the destination but not at the source, and the other way round.
    assert merged_copies([(100, 500, 10), (110, 600, 10)]) == [(100, 500, 10), (110, 600, 10)]
    assert merged_copies([(100, 500, 10), (200, 510, 10)]) == [(100, 500, 10), (200, 510, 10)]
    assert merged_copies([(0, 0, 4), (8, 8, 4), (12, 12, 4)]) == [(0, 0, 4), (8, 8, 8)]


def _steps(size: int, count: int, itemsize: int = 4) -> list[list[tuple]]:
    """What each rank's call enqueues: kernels, meetings, and the copies' batch sizes."""
    node = _Node(size, count, itemsize, in_place=False)
    signature = Signature("all_to_all", count, "float32", itemsize, None, "copy-engine")
    steps: list[list[tuple]] = [[] for _ in range(size)]
    for rank in range(size):
        args = types.SimpleNamespace(
            rank=rank, input=node.inputs[rank], output=node.outputs[rank],
            windows=node.windows,
            staging_offset=[node.layout.staging_offset(p) for p in (0, 1)])
        call = GpuCall(signature, size,
                       launch=lambda entry, blocks, r=rank: steps[r].append(("kernel", entry,
                                                                             blocks)),
                       meet=lambda turn, r=rank: steps[r].append(("meet", turn)),
                       copy=lambda jobs, r=rank: steps[r].append(("copy", len(jobs))),
                       args=args)
        algorithm("cuda", "all_to_all", "copy-engine").run(call)
    return steps


@pytest.mark.parametrize("size", SIZES)
def test_every_rank_publishes_copies_meets_copies_finishes_and_meets_again(size):
    steps = _steps(size, size * 3)
    frame = [("kernel", "publish_call", 1), ("meet", 0),
             ("kernel", "guard_all_to_all_output", GUARD_BLOCKS),
             ("kernel", "finish_call", 1), ("meet", 1)]
    for rank, mine in enumerate(steps):
        # Kernels and meetings alike on every rank, both flag sets in every call (they
        # alternate whatever call follows: docs/MEMORY-ORDERING.md); the guard before the
        # only copy into the output.
        assert [step for step in mine if step[0] != "copy"] == frame
        want = [frame[0], ("copy", size), frame[1], frame[2], ("copy", 1)]
        assert mine == [*want, *frame[3:]], rank


def test_an_empty_call_still_publishes_finishes_and_meets_but_copies_nothing():
    for size in (1, 2, 5):
        for mine in _steps(size, 0):
            assert mine == [("kernel", "publish_call", 1), ("meet", 0),
                            ("kernel", "guard_all_to_all_output", GUARD_BLOCKS),
                            ("kernel", "finish_call", 1), ("meet", 1)]


def test_the_registry_lists_it_for_gpu_all_to_all_only():
    found = algorithm("cuda", "all_to_all", "copy-engine")
    assert (found.name, found.op, found.memory) == ("copy-engine", "all_to_all", "cuda")
    # Nothing staged, in place with any input: no peer reads our input or output.
    assert found.aliasing_safe and not found.stages_input
    assert not found.leader_runs_time_sliced
    assert "copy-engine" in algorithm_names("cuda", "all_to_all")
    assert "copy-engine" not in algorithm_names("cuda", "all_to_all_v")
    assert "copy-engine" not in algorithm_names("host", "all_to_all")
    assert "copy-engine" not in algorithm_names("host", "all_to_all_v")
    with pytest.raises(CollectiveError, match=r"^algo='copy-engine' is not an algorithm of "
                                              r"all_to_all_v on cuda memory; choose one of: "
                                              r"auto, pull, balanced, ll, push, eager, ll128$"):
        algorithm("cuda", "all_to_all_v", "copy-engine")
    with pytest.raises(CollectiveError, match=r"^algo='copy-engine' is not an algorithm of "
                                              r"all_to_all on host memory; choose one of: "
                                              r"auto, pull$"):
        algorithm("host", "all_to_all", "copy-engine")


def test_more_ranks_than_the_kernels_name_are_refused():
    from ipcshare.kernels.launcher import MAX_KERNEL_RANKS

    found = algorithm("cuda", "all_to_all", "copy-engine")
    ranks = MAX_KERNEL_RANKS + 1
    call = GpuCall(Signature("all_to_all", ranks, "uint8", 1, None, "copy-engine"), ranks,
                   launch=lambda *_: None)
    assert found.unsupported(call) == (f"the copy-engine kernels span at most "
                                       f"{MAX_KERNEL_RANKS} ranks; this group has {ranks}")
    assert found.unsupported(GpuCall(call.signature, MAX_KERNEL_RANKS,
                                     launch=lambda *_: None)) is None


def test_auto_never_picks_it_before_it_is_measured():
    from ipcshare.collectives.choice import choose

    for size in SIZES:
        for nbytes in (0, 1 << 10, 1 << 20, 64 << 20, 1 << 30, 16 << 30):
            assert choose("cuda", "all_to_all", nbytes, size) != "copy-engine"


def _gpu_group(device_memory: bool = True):
    return types.SimpleNamespace(backend=types.SimpleNamespace(device_memory=device_memory),
                                 backend_name="cuda-vmm" if device_memory else "host",
                                 time_sliced_gpus={},
                                 world=types.SimpleNamespace(node_count=1))


def test_the_cli_takes_it_for_even_splits_on_gpus_and_says_what_it_runs_elsewhere():
    from ipcshare.cli.run_pattern import _check_all_to_all_memory
    from ipcshare.patterns import make_pattern

    even = make_pattern("alltoall", "copy-engine", splits="even")
    assert even.collective == "all_to_all"
    _check_all_to_all_memory(_gpu_group(), even)
    # The case takes the name for any splits; the run refuses it before the table,
    # naming the splits it takes and what runs these, in one line.
    for splits in ("random", "skewed"):
        pattern = make_pattern("alltoall", "copy-engine", splits=splits)
        with pytest.raises(ConfigError) as refused:
            _check_all_to_all_memory(_gpu_group(), pattern)
        assert str(refused.value) == (
            f"--algo copy-engine runs alltoall with --splits even only (all_to_all); "
            f"--splits {splits} calls all_to_all_v, which it does not run on GPU memory; "
            "choose one of: auto, pull, balanced, ll, push, eager, ll128")
    with pytest.raises(ConfigError) as refused:
        _check_all_to_all_memory(_gpu_group(device_memory=False), even)
    assert str(refused.value) == ("--algo copy-engine does not run alltoall on host memory "
                                  "(backend host); choose one of: auto, pull")
    with pytest.raises(ConfigError) as refused:
        make_pattern("alltoall", "two-shot", splits="random")
    assert str(refused.value) == ("the alltoall op has no 'two-shot' algorithm; choose one "
                                  "of: auto, pull, balanced, ll, copy-engine, push, ll128, eager")
