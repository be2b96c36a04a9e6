"""The one-shot all-reduce example's kernel: it compiles with NVRTC (no GPU needed), its
argument block and pad words match the example's Python side, and its inputs sum exactly
in float32 in any order (what lets the example compare results bit for bit)."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from ipcshare.kernels import compile_kernel_source, nvrtc_version
from ipcshare.runtime.errors import KernelCompileError
from ipcshare.window import ERROR_SLOT, USER_SLOT_BASE

from ..example_runs import load_example

example = load_example("allreduce_oneshot")


@pytest.mark.nvrtc
def test_the_kernel_compiles_and_its_argument_block_matches_the_ctypes_mirror(
        tmp_path, monkeypatch):
    try:
        nvrtc_version()
    except KernelCompileError as exc:
        pytest.skip(f"needs NVRTC: {exc}")
    monkeypatch.setenv("IPCSHARE_KERNEL_CACHE", str(tmp_path))
    args = example.OneShotArgs
    checks = [f'static_assert(sizeof(OneShotArgs) == {ctypes.sizeof(args)}, "size");',
              f'static_assert(kEpochWord == {USER_SLOT_BASE}, "epoch word");',
              f'static_assert(kSlotBase == {example._SLOT_BASE}, "barrier words");',
              f'static_assert(ipcshare::kMaxRanks == {example.MAX_RANKS}, "ranks");']
    for field, *_ in args._fields_:
        checks.append(f"static_assert(__builtin_offsetof(OneShotArgs, {field}) == "
                      f'{getattr(args, field).offset}, "{field}");')
    code = example.KERNEL_SOURCE.read_text() + "\n" + "\n".join(checks) + "\n"
    cubin = compile_kernel_source("allreduce_oneshot_layout.cu", code=code, arch="sm_90",
                                  use_cache=False)
    assert cubin[:4] == b"\x7fELF"
    # The checks bite: a narrower field moves the ones after it.
    with pytest.raises(KernelCompileError, match='"rank"'):
        compile_kernel_source("broken.cu", code=code.replace(
            "u64 timeout_ns;", "unsigned timeout_ns;"), use_cache=False)


def test_the_barrier_words_of_the_largest_grid_stay_below_the_error_word():
    for ranks in range(1, example.MAX_RANKS + 1):
        blocks = (ERROR_SLOT - example._SLOT_BASE) // ranks
        assert example._SLOT_BASE + blocks * ranks <= ERROR_SLOT and blocks >= 31


@pytest.mark.parametrize("ranks", [1, 2, 3, 8])
def test_example_inputs_sum_exactly_in_any_order(ranks):
    count = 4099
    values = [example.example_values(count, rank, step=5) for rank in range(ranks)]
    exact = np.sum([v.astype(np.float64) for v in values], axis=0)
    forward = np.zeros(count, np.float32)
    for v in values:
        forward += v
    backward = np.zeros(count, np.float32)
    for v in reversed(values):
        backward += v
    assert np.array_equal(forward, exact) and np.array_equal(backward, exact)
    assert np.array_equal(example.expected_sum(count, ranks, 5), exact)
    assert len(np.unique(values[-1])) > 16   # not a trivial pattern
    assert example.window_bytes(count) == 2 * 16400 and example.staging_bytes(4) == 16
