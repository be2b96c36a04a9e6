"""The GPU baselines of the all-to-all case without a GPU: which class times it under each
name and what each refuses; the byte counts NCCL's send / recv, torch's split sizes and
symmetric memory's device splits are made of, for every rank, from the case's split
matrix; the buffers and views every mode verifies (the all-to-all emulated on numpy with
those counts, and a corrupted output counted); and when symmetric memory's kernel could
not take a size (its blocks per peer)."""

from __future__ import annotations

import types

import numpy as np
import pytest

from ipcshare.baselines import GPU_BASELINES, gpu_baseline_class, make_baseline, registry
from ipcshare.baselines.gpu import GpuBaseline, all_to_all_splits
from ipcshare.baselines.torch_distributed import torch_split_sizes
from ipcshare.baselines.torch_symm_alltoall import (
    NBLOCKS_SETTING,
    vdev_blocks_per_peer,
    vdev_refusal,
)
from ipcshare.patterns.alltoall import AllToAll
from ipcshare.patterns.seeding import count_wrong
from ipcshare.runtime.config import DATATYPES
from ipcshare.runtime.errors import ConfigError

SPLITS = ("even", "random", "skewed")
LABELS = {"nccl": "NCCL called directly (nccl4py)", "torch": "NCCL through torch.distributed",
          "torch-symm": "PyTorch symmetric memory"}


def _plan(case: AllToAll, size: int, n: int):
    return case.plan(size, n, DATATYPES[case.datatype][1])


@pytest.mark.parametrize("splits", SPLITS)
@pytest.mark.parametrize("name", GPU_BASELINES)
def test_every_gpu_baseline_times_all_to_all_under_its_name_and_label(name, splits):
    cls = gpu_baseline_class(name, "alltoall")
    for datatype in ("float32", "bfloat16", "uint8", "int64"):
        cls.check_case(AllToAll(splits=splits, datatype=datatype))
    assert cls.name == name and cls.label == LABELS[name]
    # The other ops keep their classes.
    assert gpu_baseline_class(name, "allreduce") is gpu_baseline_class(name)


def test_symmetric_memorys_two_classes_refuse_each_others_op():
    from ipcshare.patterns import make_pattern

    with pytest.raises(ConfigError, match=r"^--baseline torch-symm times all-to-all with "
                       r"symmetric memory's all_to_all_vdev on its NVSHMEM backend, .* time it "
                       r"with ipcshare alltoall --baseline torch-symm$"):
        gpu_baseline_class("torch-symm").check_case(AllToAll())
    with pytest.raises(ConfigError, match=r"^--baseline torch-symm's all_to_all_vdev times "
                       r"all-to-all only, not allreduce$"):
        gpu_baseline_class("torch-symm", "alltoall").check_case(
            make_pattern("allreduce", op="sum", datatype="float32"))


@pytest.mark.parametrize("name", GPU_BASELINES)
def test_make_baseline_opens_each_gpu_baseline_for_all_to_all(monkeypatch, name):
    """No refusal left for all-to-all: the class of the name (and of the op) is opened on
    the group's GPU; none and mpi as before."""
    opened = []

    class Recorder:
        def __init__(self, world, pattern, device):
            opened.append((world, pattern, device))

    asked = []

    def stand_in(asked_name, op=None):
        asked.append((asked_name, op))
        return Recorder

    monkeypatch.setattr(registry, "gpu_baseline_class", stand_in)
    world = types.SimpleNamespace(rank=0, size=2)
    group = types.SimpleNamespace(world=world, backend=types.SimpleNamespace(
        device_memory=True, device=3))
    pattern = AllToAll(splits="skewed")
    assert isinstance(make_baseline(name, group, pattern), Recorder)
    assert asked == [(name, "alltoall")] and opened == [(world, pattern, 3)]
    assert make_baseline("none", group, pattern) is None


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("splits", SPLITS)
def test_split_arguments_for_every_rank_come_from_the_split_matrix(splits, n):
    case = AllToAll(splits=splits, datatype="float32")
    for size in (4 * n, 4096 + 12 * n, 1 << 20):
        plan = _plan(case, size, n)
        m = case.split_matrix(plan, n)
        sides = [all_to_all_splits(case, plan, n, rank) for rank in range(n)]
        for rank, side in enumerate(sides):
            assert side.rank == rank and side.even == (splits == "even")
            assert list(side.send) == [int(b) for b in m[rank] * 4]
            assert list(side.receive) == [int(b) for b in m[:, rank] * 4]
            assert sum(side.send) == plan.size
            assert sum(side.receive) == case.received_bytes(plan, rank, n)
            assert side.send_offsets[0] == 0 and side.receive_offsets[0] == 0
            assert all(side.send_offsets[q + 1] == side.send_offsets[q] + side.send[q]
                       for q in range(n - 1))
            # Every pair agrees: what r sends q is what q receives from r (NCCL's send and
            # recv of a pair carry one count).
            assert all(side.send[q] == sides[q].receive[rank] for q in range(n))
            sizes = torch_split_sizes(case, plan, n, rank)
            if splits == "even":
                assert sizes == {}   # torch cuts equal blocks itself
                assert len(set(side.send)) == 1 and side.send == side.receive
            else:
                assert sizes == {"output_split_sizes": list(side.receive),
                                 "input_split_sizes": list(side.send)}


def _stand_in(case, rank: int, size: int) -> GpuBaseline:
    """A baseline's layout, without torch or a GPU behind it."""
    baseline = object.__new__(GpuBaseline)
    baseline.world = types.SimpleNamespace(rank=rank, size=size)
    baseline.case, baseline.op = case, case.name
    return baseline


def _address(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]


def _emulated_all_to_all(ranks, views, plan, n):
    """What NCCL's grouped send / recv (or ncclAlltoAll, even) leaves in every output,
    with each rank's counts: in place, the array copied aside first, as the baselines do."""
    sources = []
    for inputs, output in views:
        in_place = _address(inputs) == _address(output)
        sources.append(inputs.copy() if in_place else inputs)
    sides = [all_to_all_splits(b.case, plan, n, b.world.rank) for b in ranks]
    for receiver, (_inputs, output) in enumerate(views):
        mine = sides[receiver]
        for sender, side in enumerate(sides):
            start, nbytes = side.send_offsets[receiver], side.send[receiver]
            at = mine.receive_offsets[sender]
            assert mine.receive[sender] == nbytes
            output[at:at + nbytes] = sources[sender][start:start + nbytes]


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("splits", SPLITS)
@pytest.mark.parametrize("datatype", ["float32", "bfloat16", "uint8", "int64"])
def test_views_counts_and_expected_bytes_agree_in_every_mode(datatype, splits, n):
    """Inputs written where the baseline writes them, the all-to-all run with the counts
    it passes, the output read where it reads it: exactly the case's expected bytes, in
    and out of place; a corrupted element is counted."""
    case = AllToAll(splits=splits, datatype=datatype)
    item = DATATYPES[datatype][1]
    # An odd element count per rank, and one large enough for several splits of each.
    for size in ((7 * n) * item, (4099 * n) * item):
        plan = _plan(case, size, n)
        for mode in case.modes:
            ranks = [_stand_in(case, rank, n) for rank in range(n)]
            views = []
            for baseline in ranks:
                send_bytes, receive_bytes = baseline._buffer_bytes(plan)
                assert send_bytes == plan.size
                assert receive_bytes == case.array_bytes(plan, n)   # alike on every rank
                send = np.full(send_bytes, 0x5A, np.uint8)
                receive = np.full(receive_bytes, 0x5A, np.uint8)
                inputs, output = baseline._views(send, receive, plan, mode)
                assert baseline._typed(inputs) is inputs   # bytes, whatever the datatype
                assert output.nbytes == case.received_bytes(plan, baseline.world.rank, n)
                if mode == "in-place":
                    assert _address(inputs) == _address(output) == _address(receive)
                else:
                    assert not np.shares_memory(inputs, output)
                inputs[:] = baseline._input_bytes(plan, 5)
                views.append((inputs, output))
            _emulated_all_to_all(ranks, views, plan, n)
            for baseline, (_inputs, output) in zip(ranks, views, strict=True):
                expected = baseline._expected_bytes(plan, 5)
                assert np.array_equal(output, expected), (mode, baseline.world.rank)
                if output.nbytes:
                    output[-1] ^= 0xFF
                    assert count_wrong(output, expected, item) == 1


@pytest.mark.parametrize(("input_bytes", "n", "setting", "parts"), [
    (8, 2, None, 1), (64 << 10, 2, None, 1), (2 * (64 << 10), 2, None, 1),
    (3 * (64 << 10), 2, None, 2), (1 << 20, 2, None, 8), (1 << 20, 4, None, 4),
    (3 << 20, 3, None, 16), (256 << 20, 2, None, 32), (256 << 20, 4, None, 16),
    (256 << 20, 4, "4", 1), (256 << 20, 4, "16", 4), (1 << 20, 2, "", 8),
    (1 << 20, 2, "0", 8)])
def test_blocks_per_peer_as_torchs_kernel_sizes_them(input_bytes, n, setting, parts):
    assert vdev_blocks_per_peer(input_bytes, n, setting) == parts


def test_a_block_setting_that_is_no_number_is_refused_by_name():
    with pytest.raises(ConfigError, match=rf"^{NBLOCKS_SETTING}='many': torch reads a whole "
                       "number of blocks there$"):
        vdev_blocks_per_peer(1 << 20, 2, "many")


@pytest.mark.parametrize("n", [2, 4])
def test_even_splits_of_the_gpu_check_sweep_all_divide(n):
    """-b 8 -e 256M -f 4, as tools/gpu_check.py alltoall runs torch-symm: no size refused."""
    case = AllToAll(splits="even", datatype="float32")
    size = 8
    while size <= 256 << 20:
        assert vdev_refusal(case, _plan(case, size, n), n, None) is None, size
        size *= 4


def test_uneven_splits_the_kernel_cannot_cut_are_refused_before_it_traps():
    case = AllToAll(splits="random", datatype="float32")
    plan = _plan(case, 8 << 20, 2)   # 128 chunks of 64 KiB: 64 blocks, 32 per peer
    why = vdev_refusal(case, plan, 2, None)
    assert why is not None
    assert why.startswith("--baseline torch-symm: PyTorch's all_to_all_vdev splits each "
                          "peer's bytes over its 32 blocks per peer and traps on a remainder")
    assert "not a multiple of 32" in why and f"{NBLOCKS_SETTING}=2 (one block per peer)" in why
    m = case.split_matrix(plan, 2) * 4
    assert any(int(nbytes) % 32 for nbytes in m.flat)
    # One block per peer takes any split; small inputs get one anyway.
    assert vdev_refusal(case, plan, 2, "2") is None
    assert vdev_refusal(case, _plan(case, 64 << 10, 2), 2, None) is None


class _CountingComm:
    """One rank's communicator: allgather returns what every rank gave (``others``
    beside this rank's value); barriers are counted."""

    def __init__(self, others: list[bool]) -> None:
        self.others, self.barriers = others, 0

    def allgather(self, value: bool) -> list[bool]:
        return [value, *self.others]

    def Barrier(self) -> None:
        self.barriers += 1


def test_nvshmem_is_finalized_only_where_every_rank_loaded_it(monkeypatch):
    import ctypes

    from ipcshare.baselines import torch_symm_alltoall

    finalized = []

    class Library:
        def nvshmemx_hostlib_finalize(self) -> None:
            finalized.append(True)

    def no_library(name, mode=0):
        raise OSError(f"{name}: not loaded")

    # Not loaded in this process (RTLD_NOLOAD never loads it): nothing to finalize.
    monkeypatch.setattr(ctypes, "CDLL", no_library)
    comm = _CountingComm([True])
    assert torch_symm_alltoall.finalize_nvshmem(comm) is False
    assert comm.barriers == 0 and not finalized
    # Loaded here but not on a peer: no rank finalizes alone (its peers would not meet it).
    monkeypatch.setattr(ctypes, "CDLL", lambda name, mode=0: Library())
    comm = _CountingComm([False])
    assert torch_symm_alltoall.finalize_nvshmem(comm) is False
    assert comm.barriers == 0 and not finalized
    # Loaded everywhere: finalized between two barriers.
    comm = _CountingComm([True, True])
    assert torch_symm_alltoall.finalize_nvshmem(comm) is True
    assert comm.barriers == 2 and finalized == [True]
