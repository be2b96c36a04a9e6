"""The push all-to-all's and all-to-all-v's host half (collectives/algorithms/
gpu_all_to_all_push.py): where the registry lists them, what one call launches (the
kernel, its grid from a block's bytes or, for all-to-all-v, from the communicator's
max_bytes, the tile size in the arguments), and that ``auto`` picks them only where a run
on GPUs put them ahead. Their bytes are checked on GPUs (tests/gpu/test_gpu_all_to_all.py);
the all-to-all-v's protocol is replayed on numpy (test_all_to_all_v_push_plan.py)."""

from __future__ import annotations

import types

import pytest

from ipcshare.collectives.agreement import Signature
from ipcshare.collectives.algorithms import algorithm, algorithm_names
from ipcshare.collectives.algorithms.gpu_kernel import MAX_BLOCKS, GpuCall
from ipcshare.runtime.errors import CollectiveError


def _launches(nbytes: int, size: int, max_blocks: int = MAX_BLOCKS):
    launched = []
    args = types.SimpleNamespace(push_tile_bytes=0)
    call = GpuCall(Signature("all_to_all", nbytes, "uint8", 1, None, "push"), size,
                   launch=lambda entry, blocks: launched.append((entry, blocks)), args=args,
                   max_blocks=max_blocks)
    algorithm("cuda", "all_to_all", "push").run(call)
    return launched, args.push_tile_bytes


def test_the_registry_lists_them_for_gpu_all_to_all_and_all_to_all_v_only():
    for op in ("all_to_all", "all_to_all_v"):
        found = algorithm("cuda", op, "push")
        assert (found.name, found.op, found.memory) == ("push", op, "cuda")
        # No peer reads our input or output: nothing staged, any output may be the input.
        assert found.aliasing_safe and not found.stages_input
        assert "push" in algorithm_names("cuda", op)
    for op in ("all_to_all", "all_to_all_v"):
        assert "push" not in algorithm_names("host", op)
        with pytest.raises(CollectiveError, match=r"^algo='push' is not an algorithm of "):
            algorithm("host", op, "push")


@pytest.mark.parametrize(("nbytes", "size", "blocks"), [
    (0, 2, 1),                      # an empty call still meets: one block
    (2 * 100, 2, 1),                # 100 bytes a block
    (4 * (16 << 10), 4, 1),         # one block's 16 KiB
    (4 * ((16 << 10) + 1), 4, 2),
    (2 * (64 << 20), 2, MAX_BLOCKS),
])
def test_one_kernel_a_call_its_grid_from_the_bytes_of_a_block(nbytes, size, blocks):
    launched, tile = _launches(nbytes, size)
    assert launched == [("all_to_all_push_bytes", blocks)]
    assert tile == 64 << 10


def test_ranks_sharing_a_gpu_get_their_share_of_the_grid():
    launched, _ = _launches(2 * (64 << 20), 2, max_blocks=MAX_BLOCKS // 2)
    assert launched == [("all_to_all_push_bytes", MAX_BLOCKS // 2)]


@pytest.mark.parametrize(("max_bytes", "size", "max_blocks", "blocks"), [
    (0, 2, MAX_BLOCKS, 1),
    (16 << 10, 4, MAX_BLOCKS, 1),
    ((16 << 10) + 1, 4, MAX_BLOCKS, 2),
    (1 << 30, 2, MAX_BLOCKS, MAX_BLOCKS),
    (1 << 30, 4, MAX_BLOCKS // 2, MAX_BLOCKS // 2),   # ranks sharing a GPU
])
def test_all_to_all_v_cuts_every_call_by_the_communicators_max_bytes(max_bytes, size,
                                                                     max_blocks, blocks):
    """Every rank must cut the same parts whatever its own counts (they may be known only
    on the GPU), so the grid follows max_bytes, not the call."""
    launched = []
    args = types.SimpleNamespace(push_tile_bytes=0)
    call = GpuCall(Signature("all_to_all_v", 0, "float32", 4, None, "push"), size,
                   launch=lambda entry, blocks: launched.append((entry, blocks)), args=args,
                   max_blocks=max_blocks, max_bytes=max_bytes)
    found = algorithm("cuda", "all_to_all_v", "push")
    assert found.unsupported(call) is None
    found.run(call)
    assert launched == [("all_to_all_v_push_bytes", blocks)]
    assert args.push_tile_bytes == 64 << 10


def test_auto_picks_it_only_where_it_was_measured_ahead():
    from ipcshare.collectives.choice import choose

    assert choose("cuda", "all_to_all", 64 << 20, 2) == "push"      # 2 ranks, > 32 MiB
    for nbytes in (0, 1 << 10, 1 << 20, 32 << 20):
        assert choose("cuda", "all_to_all", nbytes, 2) != "push"
    for size in (3, 4, 8):                                           # not run there yet
        for nbytes in (0, 1 << 20, 64 << 20, 1 << 30):
            assert choose("cuda", "all_to_all", nbytes, size) != "push"
    for size in (2, 3, 4, 8):                                        # not measured yet
        for nbytes in (0, 1 << 20, 64 << 20, 1 << 30):
            assert choose("cuda", "all_to_all_v", nbytes, size) != "push"
