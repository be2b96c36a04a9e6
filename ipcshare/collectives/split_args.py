"""An all-to-all-v call's splits as a GPU call takes them: each side given as host
counts or as a device array of int32 / int64 (read or filled by the kernel at run time,
so CUDA graphs replay with new splits), and how they go into the kernel's arguments
(kernels/src/collectives/all_to_all.cuh)."""

from __future__ import annotations

import dataclasses
from typing import Any

from ..runtime.errors import CollectiveError
from .algorithms.host_all_to_all import check_splits
from .arrays import ArrayRef, describe_array, in_device_memory
from .call_marks import blame
from .scratch import LL128_MAX_BYTES, LL_MAX_BYTES

__all__ = ["GpuSplits", "in_device_memory", "device_splits", "SPLITS_PROBLEM",
           "SPLIT_TOO_LARGE_FOR_LL", "SPLIT_TOO_LARGE_FOR_INBOX", "SPLIT_TOO_LARGE_FOR_SLOT",
           "SPLIT_TOO_LARGE_FOR_LL128", "splits_problem"]

_SPLIT_DTYPES = {"int32": 4, "int64": 8}
# The error word's top 16 bits when the kernel found the splits wrong (kSplitsProblem in
# split_checks.cuh); then the problem (8 bits), two ranks (8 bits each), the call (24 bits).
SPLITS_PROBLEM = 0xFFFE
# The problem algo='ll' adds to pull's four (kSplitTooLargeForLL): a block past an LL slot.
SPLIT_TOO_LARGE_FOR_LL = 5
# algo='push''s (kSplitTooLargeForInbox): a rank whose output the peers cannot reach would
# receive more than its inbox (its staging area, the communicator's max_bytes) holds.
SPLIT_TOO_LARGE_FOR_INBOX = 6
# algo='eager''s (kSplitTooLargeForSlot): a block past the sender's slot of the receiver's
# inbox (the staging area cut into one slot per peer).
SPLIT_TOO_LARGE_FOR_SLOT = 7
# algo='ll128''s (kSplitTooLargeForLL128): a block past an LL128 slot.
SPLIT_TOO_LARGE_FOR_LL128 = 8


def splits_problem(word: int) -> str:
    """The one-line error of a splits problem the kernel recorded in ``word`` (every
    rank records the same one: each checks every rank's splits in one order)."""
    problem, first, second = (word >> 40) & 0xFF, (word >> 32) & 0xFF, (word >> 24) & 0xFF
    what = {
        1: f"rank {first}'s input_splits[{second}] is negative",
        2: f"rank {first}'s input_splits add up to more elements than its input holds",
        3: f"rank {first} would receive more elements than its output holds (the ranks' "
           f"input_splits[{first}] add up past it)",
        4: f"rank {first}'s output_splits[{second}] is not what rank {second} sends it "
           f"(its input_splits[{first}])",
        5: f"rank {first} sends rank {second} more bytes (its input_splits[{second}]) than "
           "algo='ll' carries from one rank to another (its LL buffers hold blocks of up to "
           f"the communicator's max_bytes, {LL_MAX_BYTES >> 20} MiB at most)",
        6: f"rank {first} would receive more bytes than algo='push' can land in its window "
           "(its output is out of the peers' reach, so they store into its inbox, which "
           "holds the communicator's max_bytes)",
        7: f"rank {first} sends rank {second} more bytes (its input_splits[{second}]) than "
           "algo='eager' lands in one slot of a rank's inbox (the communicator's max_bytes "
           "over the ranks but one)",
        8: f"rank {first} sends rank {second} more bytes (its input_splits[{second}]) than "
           "algo='ll128' carries from one rank to another (its LL128 buffers hold blocks of "
           f"up to the communicator's max_bytes, {LL128_MAX_BYTES >> 20} MiB at most)",
    }.get(problem, f"problem {problem} between ranks {first} and {second}")
    if problem in (SPLIT_TOO_LARGE_FOR_LL, SPLIT_TOO_LARGE_FOR_LL128):
        advice = "use algo='balanced' or 'auto' for blocks this large"
    elif problem == SPLIT_TOO_LARGE_FOR_SLOT:
        advice = "use algo='push', 'balanced' or 'auto' for blocks this large"
    elif problem == SPLIT_TOO_LARGE_FOR_INBOX:
        advice = (f"register rank {first}'s output (Communicator.register) or allocate it "
                  "with Communicator.empty(), or use algo='balanced' or 'auto'")
    else:
        advice = "every rank must pass splits that match"
    return (f"all_to_all_v: {what} (found on the GPU by every rank at call "
            f"{word & 0xFFFFFF} of this communicator; no element moved): {advice}")


def device_splits(splits: Any, name: str, *, ranks: int, device: int,
                  writable: bool, call: str = "all_to_all_v") -> ArrayRef:
    """``splits`` described as a device array of ``ranks`` int32 or int64 counts on
    ``device``, contiguous (and writable where the kernel fills it).

    Raises:
        CollectiveError: naming ``name`` and what is wrong with it.
    """
    ref = describe_array(splits, name)
    if ref.device != "cuda":
        raise CollectiveError(f"{call}: {name} is {ref.spell()}: pass host counts or a CUDA "
                              "array")
    if ref.dtype not in _SPLIT_DTYPES:
        raise CollectiveError(f"{call}: {name} is {ref.spell()}: device splits are int32 or "
                              "int64 element counts")
    if ref.count != ranks or len(ref.shape) != 1:
        raise CollectiveError(f"{call}: {name} is {ref.spell()}, expected one count per rank: "
                              f"shape ({ranks},)")
    if not ref.contiguous:
        raise CollectiveError(f"{call}: {name} is {ref.spell()} that is not contiguous")
    if ref.device_id is not None and ref.device_id != device:
        raise CollectiveError(f"{call}: {name} is {ref.spell()} on cuda:{ref.device_id}, but "
                              f"this rank's communicator lives on cuda:{device}")
    if writable and ref.readonly:
        raise CollectiveError(f"{call}: {name} is read-only, but the kernel writes the counts "
                              "received there")
    return ref


@dataclasses.dataclass(frozen=True, eq=False)
class GpuSplits:
    """This rank's ``input_splits`` as host counts (``sends``) or a device array the
    kernel reads (``send_array``), and its ``output_splits`` as host counts every rank
    checks on the GPU (``receives``) or a device array the kernel fills with the counts
    received (``receive_array``). Exactly one of each pair is set."""

    sends: tuple[int, ...] | None
    send_array: ArrayRef | None
    receives: tuple[int, ...] | None
    receive_array: ArrayRef | None

    @classmethod
    def of(cls, output_splits: Any, input_splits: Any, *, ranks: int, device: int,
           input_count: int, output_count: int) -> GpuSplits:
        """Checked on this rank: host counts as ``check_splits`` checks them; device
        arrays for their type, length and device (their values are the kernel's to check).

        Raises:
            ArgumentProblem: naming the argument and what is wrong with it.
        """
        sides = []
        for splits, name, count, array, writable in (
                (input_splits, "input_splits", input_count, "input", False),
                (output_splits, "output_splits", output_count, "output", True)):
            with blame(name):   # a refused call names the side (call_marks.py)
                if in_device_memory(splits):
                    sides += [None, device_splits(splits, name, ranks=ranks, device=device,
                                                  writable=writable)]
                else:
                    sides += [check_splits(splits, name, ranks=ranks, count=count,
                                           array=array), None]
        return cls(*sides)

    def host_bytes(self, itemsize: int) -> dict[str, int]:
        """The bytes each host-given side adds up to (device sides are unknown here)."""
        return {name: sum(counts) * itemsize for name, counts in
                (("input_splits", self.sends), ("output_splits", self.receives))
                if counts is not None}

    def place(self, args: Any) -> None:
        """Write the splits into a kernel argument block (CollectiveArgs)."""
        if self.send_array is not None:
            args.send_splits = self.send_array.ptr
            args.send_splits_itemsize = self.send_array.itemsize
        else:
            args.send_splits = None
            args.send_splits_itemsize = 8
            for rank, count in enumerate(self.sends):
                args.splits_inline[0][rank] = count
        if self.receive_array is not None:
            args.receive_splits = self.receive_array.ptr
            args.receive_splits_itemsize = self.receive_array.itemsize
            args.expect_receives = 0
        else:
            args.receive_splits = None
            args.receive_splits_itemsize = 8
            args.expect_receives = 1
            for rank, count in enumerate(self.receives):
                args.splits_inline[1][rank] = count
