"""All-to-all-v's splits on the GPU path, without a GPU: how host counts and device arrays
are checked and written into the kernel's arguments, what the kernel's error word says,
and that the splits area holds the kernel's row."""

from __future__ import annotations

import pytest

from ipcshare.collectives.scratch import ScratchLayout
from ipcshare.collectives.split_args import (
    SPLITS_PROBLEM,
    GpuSplits,
    in_device_memory,
    splits_problem,
)
from ipcshare.kernels.launcher import MAX_KERNEL_RANKS, CollectiveArgs
from ipcshare.runtime.errors import CollectiveError


class CudaArray:
    """An array in CUDA memory as the CUDA array interface describes it (never touched)."""

    def __init__(self, shape=(4,), typestr="<i4", ptr=0x7000_0000, readonly=False,
                 strides=None):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr,
                                         "data": (ptr, readonly), "version": 3,
                                         "strides": strides}


def _of(output_splits, input_splits, ranks=4):
    return GpuSplits.of(output_splits, input_splits, ranks=ranks, device=0, input_count=100,
                        output_count=90)


def test_host_counts_go_inline_and_the_receives_are_checked_by_every_rank():
    splits = _of([1, 2, 3, 4], [4, 3, 2, 1])
    assert (splits.sends, splits.receives) == ((4, 3, 2, 1), (1, 2, 3, 4))
    assert splits.host_bytes(2) == {"input_splits": 20, "output_splits": 20}
    args = CollectiveArgs()
    splits.place(args)
    assert not args.send_splits and not args.receive_splits
    assert list(args.splits_inline[0])[:4] == [4, 3, 2, 1]
    assert list(args.splits_inline[1])[:4] == [1, 2, 3, 4]
    assert args.expect_receives == 1


def test_device_arrays_are_read_and_filled_by_the_kernel():
    sends, receives = CudaArray(ptr=0x1000), CudaArray(typestr="<i8", ptr=0x2000)
    assert in_device_memory(sends) and not in_device_memory([1, 2, 3, 4])
    splits = _of(receives, sends)
    assert splits.sends is None and splits.receives is None
    assert splits.host_bytes(4) == {}          # nothing the host can add up
    args = CollectiveArgs()
    splits.place(args)
    assert (args.send_splits, args.send_splits_itemsize) == (0x1000, 4)
    assert (args.receive_splits, args.receive_splits_itemsize) == (0x2000, 8)
    assert args.expect_receives == 0
    # Mixed: device sends, host receives the kernel checks.
    mixed = _of([0, 0, 0, 0], sends)
    args = CollectiveArgs()
    mixed.place(args)
    assert args.send_splits == 0x1000 and args.expect_receives == 1


@pytest.mark.parametrize(("output_splits", "input_splits", "message"), [
    ([1, 1, 1, 1], CudaArray(typestr="<f4"), r"input_splits is a float32 array .* int32 or "
                                            r"int64"),
    ([1, 1, 1, 1], CudaArray(shape=(3,)), r"input_splits is .* expected one count per rank: "
                                          r"shape \(4,\)"),
    ([1, 1, 1, 1], CudaArray(shape=(2, 2)), r"expected one count per rank"),
    ([1, 1, 1, 1], CudaArray(shape=(4,), strides=(8,)), r"not contiguous"),
    (CudaArray(readonly=True), [1, 1, 1, 1], r"output_splits is read-only, but the kernel "
                                             r"writes the counts received there"),
    ([1, 1, 1, -1], [1, 1, 1, 1], r"output_splits\[3\]=-1"),
    ([1, 1, 1, 1], [50, 50, 1, 0], r"input_splits add up to 101 elements, more than "
                                   r"input's 100"),
])
def test_bad_splits_are_named_on_the_calling_rank(output_splits, input_splits, message):
    with pytest.raises(CollectiveError, match=message):
        _of(output_splits, input_splits)


def _word(problem, first, second=0, call=7):
    return (SPLITS_PROBLEM << 48) | (problem << 40) | (first << 32) | (second << 24) | call


@pytest.mark.parametrize(("word", "said"), [
    (_word(1, 2, 3), "rank 2's input_splits[3] is negative"),
    (_word(2, 1), "rank 1's input_splits add up to more elements than its input holds"),
    (_word(3, 0), "rank 0 would receive more elements than its output holds (the ranks' "
                  "input_splits[0] add up past it)"),
    (_word(4, 3, 1), "rank 3's output_splits[1] is not what rank 1 sends it (its "
                     "input_splits[3])"),
    (_word(6, 1), "rank 1 would receive more bytes than algo='push' can land in its window"),
    (_word(7, 2, 0), "rank 2 sends rank 0 more bytes (its input_splits[0]) than algo='eager' "
                     "lands in one slot of a rank's inbox"),
    (_word(8, 0, 1), "rank 0 sends rank 1 more bytes (its input_splits[1]) than algo='ll128' "
                     "carries from one rank to another (its LL128 buffers hold blocks of up "
                     "to the communicator's max_bytes, 8 MiB at most)"),
])
def test_the_kernels_splits_problems_read_as_one_line(word, said):
    message = splits_problem(word)
    assert message.startswith(f"all_to_all_v: {said}")
    assert ("(found on the GPU by every rank at call 7 of this communicator; no element "
            "moved)") in message
    assert "\n" not in message


@pytest.mark.parametrize("problem", [5, 8])
def test_a_block_past_a_low_latency_slot_is_told_what_to_use(problem):
    assert splits_problem(_word(problem, 0, 1)).endswith(
        "use algo='balanced' or 'auto' for blocks this large")


def test_a_push_receiver_past_its_inbox_is_told_how_to_make_room():
    message = splits_problem(_word(6, 2))
    assert message.endswith("register rank 2's output (Communicator.register) or allocate it "
                            "with Communicator.empty(), or use algo='balanced' or 'auto'")


@pytest.mark.parametrize("ranks", range(1, MAX_KERNEL_RANKS + 1))
def test_the_splits_area_holds_the_kernels_row_and_areas_do_not_overlap(ranks):
    layout = ScratchLayout(1 << 20, 1 << 20, ranks, gpu=True)
    assert layout.splits_bytes >= 8 * (2 * ranks + 3)   # split_row_words in all_to_all.cuh
    assert layout.splits_offset(1) >= layout.splits_offset(0) + layout.splits_bytes
    assert layout.splits_offset(0) >= layout.ll_offset(2)
    assert layout.total_bytes >= layout.splits_offset(1) + layout.splits_bytes


def test_arrays_are_told_apart_without_touching_them():
    class TorchLike:
        is_cuda = True

        @property
        def __cuda_array_interface__(self):
            raise TypeError("bfloat16 cannot be spelled")

    class HostTensor:
        is_cuda = False

    class Unspellable:
        @property
        def __cuda_array_interface__(self):
            raise TypeError("bfloat16 cannot be spelled")

    assert in_device_memory(TorchLike()) and in_device_memory(Unspellable())
    assert not in_device_memory(HostTensor()) and not in_device_memory((1, 2))
