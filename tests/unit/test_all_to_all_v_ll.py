"""The LL all-to-all-v without a GPU: a numpy model of what all_to_all_v_ll
(kernels/src/collectives/all_to_all_ll.cuh) pushes into each slot, which first problem
every rank finds in the split rows, and where the received blocks land, run on random
split matrices and windows; the kernel's own split checks (split_checks.cuh, compiled for
the host): its serial checks find the model's first problem, and its parallel verdict (a
warp's lanes' shares) is true exactly where they find one; and the host half
(algorithms/gpu_all_to_all_ll.py): the grid, the registry, the error it spells. Line
sizes, row words and problem codes are read from the kernel's headers, so the model cannot
drift from them unnoticed."""

from __future__ import annotations

import ctypes
import random
import re
import types
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ipcshare.kernels
from ipcshare.collectives.agreement import Signature
from ipcshare.collectives.algorithms import algorithm
from ipcshare.collectives.algorithms.gpu_all_to_all_ll import all_to_all_v_block_capacity
from ipcshare.collectives.algorithms.gpu_kernel import MAX_BLOCKS, THREADS, GpuCall
from ipcshare.collectives.scratch import LL_MAX_BYTES, ScratchLayout, split_row_words
from ipcshare.collectives.split_args import (
    SPLIT_TOO_LARGE_FOR_LL,
    SPLIT_TOO_LARGE_FOR_SLOT,
    SPLITS_PROBLEM,
    splits_problem,
)
from tests.host_kernels import build_for_host

from ..hypothesis_profiles import examples

_SOURCES = Path(ipcshare.kernels.__file__).parent
_LL = (_SOURCES / "include" / "ipcshare" / "ll.cuh").read_text()
_A2A = (_SOURCES / "src" / "collectives" / "all_to_all.cuh").read_text()
_A2A_LL = (_SOURCES / "src" / "collectives" / "all_to_all_ll.cuh").read_text()
_CHECKS = (_SOURCES / "src" / "collectives" / "split_checks.cuh").read_text()


def _constant(text: str, kind: str, name: str) -> int:
    found = re.search(rf"constexpr {kind} {name} = (\d+);", text)
    assert found, name
    return int(found.group(1))


LINE_BYTES = _constant(_LL, "int", "kLineBytes")
PAYLOAD = _constant(_LL, "int", "kLinePayload")
NEGATIVE, SENDS, RECEIVES, MISMATCH, TOO_LARGE = (
    _constant(_CHECKS, "u64", name) for name in ("kSplitNegative", "kSplitSendsTooMany",
                                              "kSplitReceivesTooMany", "kSplitMismatch",
                                              "kSplitTooLargeForLL"))


def test_the_model_s_constants_are_the_kernel_s():
    assert re.search(r"int split_row_words\(int n\) \{ return 2 \* n \+ 3; \}", _A2A)
    assert [split_row_words(n) for n in (1, 2, 8)] == [5, 7, 19]
    assert TOO_LARGE == SPLIT_TOO_LARGE_FOR_LL
    # The kernel makes read_headers_and_rows' checks (first_split_problem), then its own: its
    # warp's verdict, and the serial checks where the verdict finds a problem (both
    # compiled for the host below).
    # (ll_plan_receives, shared with the LL128 kernel, which passes its own problem code).
    plan = _A2A_LL[_A2A_LL.index("void ll_plan_receives("):]
    plan = plan[:plan.index("\n}\n")]
    assert "split_lane_finds_problem(plan.rows, n, itemsize, capacity, lane, 32)" in plan
    assert "first_ll_split_problem(plan.rows, n, itemsize, capacity, too_large)" in plan
    body = _A2A_LL[_A2A_LL.index("__device__ void all_to_all_v_ll("):]
    assert re.search(r"ll_plan_after_push<ipcshare::kLinePayload>\(a, call, peers, capacity, "
                     r"kSplitTooLargeForLL,", body)
    serial = _CHECKS[_CHECKS.index("u64 first_ll_split_problem("):]
    serial = serial[:serial.index("\n}\n")]
    assert "u64 too_large = kSplitTooLargeForLL" in serial   # LL's problem by default
    assert serial.index("first_split_problem(rows, n)") < serial.index("(too_large << 40)")
    read = _A2A[_A2A.index("bool read_headers_and_rows("):]
    assert "first_split_problem(rows, n)" in read[:read.index("\n}\n")]


def _capacity(layout: ScratchLayout, n: int) -> int:
    """all_to_all_v_ll_capacity: payload bytes after the digest line and the row."""
    return max(0, layout.ll_slot_bytes // LINE_BYTES - 1 - split_row_words(n)) * PAYLOAD


def _row(sends, expects, count, output_count) -> list[int]:
    """split_row_word for every w: sends, expected receives (0 where none), the flag,
    the input's and the output's elements."""
    n = len(sends)
    return [*sends, *(expects if expects is not None else [0] * n),
            int(expects is not None), count, output_count]


def _first_problem(rows: list[list[int]], itemsize: int, capacity: int) -> tuple:
    """first_split_problem, then the LL check: (code, a, b) or None."""
    n = len(rows)
    for q in range(n):   # 1. counts at least 0 and within the sender's input
        total = 0
        for r in range(n):
            if rows[q][r] < 0:
                return NEGATIVE, q, r
            if rows[q][r] > rows[q][2 * n + 1]:
                return SENDS, q, 0
            total += rows[q][r]
        if total > rows[q][2 * n + 1]:
            return SENDS, q, 0
    for r in range(n):   # 2. receives within the output
        if sum(rows[q][r] for q in range(n)) > rows[r][2 * n + 2]:
            return RECEIVES, r, 0
    for r in range(n):   # 3. expected receives are what is sent
        if rows[r][2 * n]:
            for q in range(n):
                if rows[r][n + q] != rows[q][r]:
                    return MISMATCH, r, q
    for q in range(n):   # 4. every block that travels fits a slot
        for r in range(n):
            if q != r and rows[q][r] * itemsize > capacity:
                return TOO_LARGE, q, r
    return None


def _own_ok(sends: list[int], count: int) -> bool:
    """read_own_sends<true>: at least 0 each, each and their sum within the input."""
    return all(0 <= s <= count for s in sends) and sum(max(s, 0) for s in sends) <= count


def _run(m, counts, out_counts, expects, itemsize, layout):
    """Every rank's kernel, modelled: returns (problems, outputs, slots) where
    problems[r] is what rank r records, outputs[r] its output bytes (None where it moved
    nothing) and slots[(q, r)] the payload lines q pushed into its slot of rank r."""
    n = len(m)
    R = split_row_words(n)
    capacity = _capacity(layout, n)
    slot_lines = layout.ll_slot_bytes // LINE_BYTES - 1   # after the digest line
    rng = np.random.default_rng(n)
    inputs = [rng.integers(0, 256, counts[q] * itemsize, dtype=np.uint8) for q in range(n)]
    rows = [_row(list(m[q]), expects[q], counts[q], out_counts[q]) for q in range(n)]
    slots: dict[tuple[int, int], dict[int, int]] = {}
    # 1. Push: block 0 the row, every thread the lines of each block that fits.
    for q in range(n):
        sends = list(m[q])
        at = np.concatenate([[0], np.cumsum(np.maximum(sends, 0))])
        for r in range(n):
            if r == q:
                continue
            lines = slots.setdefault((q, r), {})
            for w in range(R):
                lines[w] = rows[q][w]
            nbytes = sends[r] * itemsize
            if not _own_ok(sends, counts[q]) or nbytes > capacity:
                continue
            block = inputs[q][at[r] * itemsize:at[r] * itemsize + nbytes]
            for j in range(-(-nbytes // PAYLOAD)):
                piece = block[j * PAYLOAD:(j + 1) * PAYLOAD]
                lines[R + j] = int.from_bytes(piece.tobytes(), "little")
            assert max(lines) < slot_lines   # never past the slot
    problems, outputs = [], []
    for me in range(n):
        # 3. Every peer's row from our slots, our own as we built it.
        got = [rows[me] if q == me else [slots[(q, me)][w] for w in range(R)]
               for q in range(n)]
        problem = _first_problem(got, itemsize, capacity)
        problems.append(problem)
        if problem is not None:
            outputs.append(None)
            continue
        # 4. Offsets, packed in source order; every line waited for was pushed.
        out = np.full(out_counts[me] * itemsize, 0xA5, np.uint8)
        place = 0
        for s in range(n):
            nbytes = got[s][me] * itemsize
            if s == me:
                start = sum(got[me][:me]) * itemsize
                out[place:place + nbytes] = inputs[me][start:start + nbytes]
            else:
                for j in range(-(-nbytes // PAYLOAD)):
                    assert R + j in slots[(s, me)], (s, me, j)   # it came
                    data = slots[(s, me)][R + j].to_bytes(PAYLOAD, "little")
                    take = min(PAYLOAD, nbytes - j * PAYLOAD)
                    out[place + j * PAYLOAD:place + j * PAYLOAD + take] = np.frombuffer(
                        data[:take], np.uint8)
            place += nbytes
        outputs.append(out)
    return problems, outputs, inputs


def _expected(m, inputs, me, itemsize, out_count):
    out = np.full(out_count * itemsize, 0xA5, np.uint8)
    at = 0
    for q, data in enumerate(inputs):
        start = int(sum(m[q][:me])) * itemsize
        nbytes = int(m[q][me]) * itemsize
        out[at:at + nbytes] = data[start:start + nbytes]
        at += nbytes
    return out


@st.composite
def _calls(draw):
    n = draw(st.integers(1, 8))
    itemsize = draw(st.sampled_from([1, 2, 4, 8]))
    m = [[draw(st.integers(0, 40)) for _ in range(n)] for _ in range(n)]
    counts = [sum(row) + draw(st.integers(0, 3)) for row in m]
    out_counts = [sum(m[q][r] for q in range(n)) + draw(st.integers(0, 3)) for r in range(n)]
    expects = [None if draw(st.booleans()) else [m[q][r] for q in range(n)]
               for r in range(n)]
    # Sometimes something wrong: a negative count, a row past its input, an output too
    # short, an expectation that differs (on one rank, as a user's mistake would be).
    fault = draw(st.sampled_from(["none", "none", "negative", "sends", "receives",
                                  "mismatch"]))
    a, b = draw(st.integers(0, n - 1)), draw(st.integers(0, n - 1))
    if fault == "negative":
        m[a][b] = -draw(st.integers(1, 5))
    elif fault == "sends":
        counts[a] = max(0, sum(m[a]) - draw(st.integers(1, 5)))
    elif fault == "receives":
        out_counts[a] = max(0, sum(m[q][a] for q in range(n)) - draw(st.integers(1, 5)))
    elif fault == "mismatch" and expects[a] is not None:
        expects[a][b] += 1
    # Small windows, so that blocks past a slot come up too.
    max_bytes = draw(st.sampled_from([1, 8, 64, 100, 256, 4096]))
    return m, counts, out_counts, expects, itemsize, ScratchLayout(max_bytes, 0, n, gpu=True)


@settings(max_examples=examples(300), deadline=None)
@given(_calls())
def test_every_rank_finds_the_same_first_problem_or_receives_every_byte(call):
    m, counts, out_counts, expects, itemsize, layout = call
    n = len(m)
    problems, outputs, inputs = _run(m, counts, out_counts, expects, itemsize, layout)
    assert all(problem == problems[0] for problem in problems)
    if problems[0] is not None:
        assert all(out is None for out in outputs)   # no byte moved anywhere
        return
    for me in range(n):
        assert np.array_equal(outputs[me], _expected(m, inputs, me, itemsize, out_counts[me]))


def test_a_block_one_byte_past_the_slot_is_the_problem_every_rank_finds():
    for n in (2, 3, 8):
        layout = ScratchLayout(4 * LL_MAX_BYTES, 0, n, gpu=True)
        capacity = all_to_all_v_block_capacity(layout.ll_slot_bytes, n)
        assert capacity == _capacity(layout, n)
        # Every block up to ll_max_bytes fits; the alignment of the slot adds under 256 B.
        assert layout.ll_max_bytes <= capacity < layout.ll_max_bytes + 256
        for block, problem in ((capacity, None), (capacity + 1, (TOO_LARGE, 0, n - 1))):
            m = [[0] * n for _ in range(n)]
            m[0][n - 1] = block
            rows = [_row(m[q], None, block, block) for q in range(n)]
            assert _first_problem(rows, 1, capacity) == problem
        # A rank's block to itself never enters a slot: any size is taken.
        rows = [_row([capacity + 1 if r == q else 0 for r in range(n)], None, capacity + 1,
                     capacity + 1) for q in range(n)]
        assert _first_problem(rows, 1, capacity) is None
        # Earlier problems come first: a mismatch on the same call is what is found.
        m = [[0] * n for _ in range(n)]
        m[0][n - 1] = capacity + 1
        rows = [_row(m[q], [m[p][q] + (q == 1) for p in range(n)], capacity + 1,
                     capacity + 2) for q in range(n)]
        assert _first_problem(rows, 1, capacity)[0] == MISMATCH


# -- the kernel's split checks, compiled for the host ------------------------------------

_CHECKS_SHIM = r"""
#include "collectives/split_checks.cuh"
typedef long long Row[2 * 8 + 3];
extern "C" {
// rows: n rows of 2n + 3 words each, packed. serial: first_ll_split_problem's word;
// returns whether some lane of `lanes` finds a problem (the kernel's warp: 32).
int verdicts(const long long* packed, int n, u64 itemsize, u64 capacity, int lanes,
             u64* serial) {
  Row rows[8];
  for (int q = 0; q < n; ++q)
    for (int w = 0; w < 2 * n + 3; ++w) rows[q][w] = packed[q * (2 * n + 3) + w];
  *serial = first_ll_split_problem(rows, n, itemsize, capacity);
  bool any = false;
  for (int lane = 0; lane < lanes; ++lane)
    any |= split_lane_finds_problem(rows, n, itemsize, capacity, lane, lanes);
  return any;
}
// The eager all-to-all-v's word for the same rows: a block past a slot is its problem.
u64 eager_problem(const long long* packed, int n, u64 itemsize, u64 capacity) {
  Row rows[8];
  for (int q = 0; q < n; ++q)
    for (int w = 0; w < 2 * n + 3; ++w) rows[q][w] = packed[q * (2 * n + 3) + w];
  return first_ll_split_problem(rows, n, itemsize, capacity, kSplitTooLargeForSlot);
}
}
"""


@pytest.fixture(scope="module")
def checks(tmp_path_factory):
    """split_checks.cuh's functions, compiled for this host."""
    return build_for_host(tmp_path_factory.mktemp("checks"), _CHECKS_SHIM,
                          "the kernel's split checks")


def _kernel_checks(checks, rows, itemsize, capacity, lanes=32):
    """(first_ll_split_problem as the model spells it, the lanes' verdict)."""
    packed = [word for row in rows for word in row]
    serial = ctypes.c_ulonglong()
    found = checks.verdicts((ctypes.c_longlong * len(packed))(*packed), len(rows),
                            ctypes.c_ulonglong(itemsize), ctypes.c_ulonglong(capacity),
                            lanes, ctypes.byref(serial))
    word = serial.value
    problem = None if word == 0 else ((word >> 40) & 0xFF, (word >> 32) & 0xFF,
                                      (word >> 24) & 0xFF)
    return problem, bool(found)


def _random_rows(rng: random.Random) -> tuple[list[list[int]], int, int]:
    """Split rows of 1 to 8 ranks, right or wrong in one or more of the checks' ways
    (counts below 0 or past the input, sums past the input or the output, expectations
    that differ, blocks past or exactly at the slot, a rank's own block past it), with
    an itemsize and a slot capacity."""
    n = rng.randint(1, 8)
    itemsize = rng.choice([1, 2, 4, 8])
    m = [[rng.choice([0, 0, 1, 7, rng.randint(0, 40)]) for _ in range(n)] for _ in range(n)]
    capacity = itemsize * rng.choice([0, 8, 39, 40, rng.randint(0, 40), 1 << 20])
    counts = [sum(row) + rng.choice([0, 0, 1, 5]) for row in m]
    outs = [sum(m[q][r] for q in range(n)) + rng.choice([0, 0, 2]) for r in range(n)]
    expects = [[m[q][r] for q in range(n)] if rng.random() < 0.5 else None for r in range(n)]
    for _ in range(rng.choice([0, 0, 1, 1, 2, 3])):
        a, b = rng.randrange(n), rng.randrange(n)
        fault = rng.choice(["negative", "past", "sends", "receives", "mismatch", "slot",
                            "own", "edge"])
        if fault == "negative":
            m[a][b] = -rng.randint(1, 3)
        elif fault == "past":
            m[a][b] = counts[a] + rng.randint(1, 3)
        elif fault == "sends":
            counts[a] = max(0, sum(m[a]) - rng.randint(1, 3))
        elif fault == "receives":
            outs[a] = max(0, sum(m[q][a] for q in range(n)) - rng.randint(1, 3))
        elif fault == "mismatch":
            expects[a] = [m[q][a] for q in range(n)]
            expects[a][b] += rng.choice([-1, 1])
        elif fault == "slot" and a != b:
            m[a][b] = capacity // itemsize + 1
            counts[a] = max(counts[a], sum(m[a]))
        elif fault == "own":
            m[a][a] = capacity // itemsize + rng.randint(1, 3)
            counts[a] = max(counts[a], sum(max(c, 0) for c in m[a]))
            outs[a] = max(outs[a], sum(m[q][a] for q in range(n)))
        else:   # right to the last element: sums equal to what the arrays hold
            counts[a] = sum(m[a])
            outs[b] = sum(m[q][b] for q in range(n))
    rows = [_row(m[q], expects[q], counts[q], outs[q]) for q in range(n)]
    return rows, itemsize, capacity


def test_the_warp_s_verdict_is_the_serial_checks_and_they_find_the_model_s_problem(checks):
    """all_to_all_v_ll tells whether a call's rows hold a problem by a warp's vote, each
    lane making a share of the checks, and runs the serial checks (which name the first
    problem, the one every rank records) only where the vote says so: the vote must be
    true exactly where the serial checks find a problem, and they the model's first
    problem, on every kind of row and 1 to 8 ranks (n x n up to 64 pairs: two a lane)."""
    rng = random.Random(2026_11_29)
    found = {}
    for case in range(4000):
        rows, itemsize, capacity = _random_rows(rng)
        problem, vote = _kernel_checks(checks, rows, itemsize, capacity)
        assert problem == _first_problem(rows, itemsize, capacity), (case, rows)
        assert vote == (problem is not None), (case, rows, itemsize, capacity, problem)
        if case % 10 == 0:   # other lane counts cut the pairs otherwise
            for lanes in (1, 3, 64):
                assert _kernel_checks(checks, rows, itemsize, capacity, lanes)[1] == vote
        found[None if problem is None else problem[0]] = found.get(
            None if problem is None else problem[0], 0) + 1
    # Every problem came up often, and so did rows without one.
    assert set(found) == {None, NEGATIVE, SENDS, RECEIVES, MISMATCH, TOO_LARGE}, found
    assert min(found.values()) >= 100, found


def test_eager_names_the_same_first_problem_with_a_slot_for_the_ll_slot(checks):
    """The eager all-to-all-v checks its rows as the LL all-to-all-v does, a segment past
    its inbox slot being problem 7 (kSplitTooLargeForSlot) where LL's is problem 5: the
    same word otherwise, bit for bit."""
    rng = random.Random(2026_11_28)
    slot = 0
    for case in range(2000):
        rows, itemsize, capacity = _random_rows(rng)
        packed = [word for row in rows for word in row]
        ll_word = ctypes.c_ulonglong()
        checks.verdicts((ctypes.c_longlong * len(packed))(*packed), len(rows),
                        ctypes.c_ulonglong(itemsize), ctypes.c_ulonglong(capacity), 32,
                        ctypes.byref(ll_word))
        checks.eager_problem.restype = ctypes.c_ulonglong
        eager = checks.eager_problem((ctypes.c_longlong * len(packed))(*packed), len(rows),
                                     ctypes.c_ulonglong(itemsize),
                                     ctypes.c_ulonglong(capacity))
        ll = ll_word.value
        if (ll >> 40) & 0xFF == TOO_LARGE:
            slot += 1
            assert eager == (ll & ~(0xFF << 40)) | (SPLIT_TOO_LARGE_FOR_SLOT << 40), case
        else:
            assert eager == ll, case
    assert slot >= 50


def test_the_warp_s_verdict_on_edge_rows(checks):
    """One rank; every count 0; blocks exactly at a slot and one element past it; a
    rank's own block past it; an empty slot; sums exactly what the arrays hold and one
    element past; an expectation off by one in the last pair of 8 ranks."""
    def verdict(m, itemsize=1, capacity=64, counts=None, outs=None, expects=None):
        n = len(m)
        counts = counts or [sum(row) for row in m]
        outs = outs or [sum(m[q][r] for q in range(n)) for r in range(n)]
        expects = expects or [None] * n
        rows = [_row(m[q], expects[q], counts[q], outs[q]) for q in range(n)]
        problem, vote = _kernel_checks(checks, rows, itemsize, capacity)
        assert problem == _first_problem(rows, itemsize, capacity)
        assert vote == (problem is not None)
        return problem

    assert verdict([[0]]) is None
    assert verdict([[1 << 30]], capacity=0) is None          # to itself: never a slot
    assert verdict([[-1]]) == (NEGATIVE, 0, 0)
    for n in range(1, 9):
        assert verdict([[0] * n for _ in range(n)], capacity=0) is None
    assert verdict([[0, 8], [8, 0]], itemsize=8, capacity=64) is None
    assert verdict([[0, 9], [8, 0]], itemsize=8, capacity=64) == (TOO_LARGE, 0, 1)
    assert verdict([[0, 8], [9, 0]], itemsize=8, capacity=64) == (TOO_LARGE, 1, 0)
    assert verdict([[0, 1], [0, 0]], capacity=0) == (TOO_LARGE, 0, 1)
    assert verdict([[5, 3], [2, 4]], counts=[8, 5]) == (SENDS, 1, 0)
    assert verdict([[5, 3], [2, 4]], counts=[8, 6], outs=[7, 7]) is None
    assert verdict([[5, 3], [2, 4]], counts=[8, 6], outs=[7, 6]) == (RECEIVES, 1, 0)
    m = [[r + q for r in range(8)] for q in range(8)]
    expects = [[m[q][r] for q in range(8)] for r in range(8)]
    assert verdict(m, capacity=1 << 10, expects=expects) is None
    expects[7][7] += 1
    assert verdict(m, capacity=1 << 10, expects=expects) == (MISMATCH, 7, 7)
    expects[7][7] -= 1
    m[7][6] = -1   # a negative count's sums are off too: the count is what is named
    assert verdict(m, capacity=1 << 10, counts=[100] * 8, outs=[100] * 8) == (NEGATIVE, 7, 6)


def test_the_new_problem_is_spelled_with_what_to_do():
    word = (SPLITS_PROBLEM << 48) | (TOO_LARGE << 40) | (1 << 32) | (3 << 24) | 12
    assert splits_problem(word) == (
        "all_to_all_v: rank 1 sends rank 3 more bytes (its input_splits[3]) than algo='ll' "
        "carries from one rank to another (its LL buffers hold blocks of up to the "
        f"communicator's max_bytes, {LL_MAX_BYTES >> 20} MiB at most) (found on the GPU by "
        "every rank at call 12 of this communicator; no element moved): use "
        "algo='balanced' or 'auto' for blocks this large")
    mismatch = (SPLITS_PROBLEM << 48) | (MISMATCH << 40) | (1 << 32) | (3 << 24) | 12
    assert splits_problem(mismatch).endswith("every rank must pass splits that match")


def _launches(count: int, output_count: int, itemsize: int, layout: ScratchLayout,
              size: int, max_blocks: int = MAX_BLOCKS, with_args: bool = True):
    launched = []
    args = types.SimpleNamespace(count=count, output_count=output_count, itemsize=itemsize)
    signature = Signature("all_to_all_v", 0, "uint8", itemsize, None, "ll")
    algorithm("cuda", "all_to_all_v", "ll").run(GpuCall(
        signature, size, lambda entry, blocks: launched.append((entry, blocks)),
        layout.ll_max_bytes, args=args if with_args else None, max_blocks=max_blocks))
    return launched


@pytest.mark.parametrize("size", [1, 2, 4, 8])
def test_the_grid_gives_a_thread_a_line_of_the_largest_block_this_rank_may_move(size):
    """This rank's input or output, whichever is longer, cut to the LL buffers: a line a
    thread, at most MAX_BLOCKS blocks (ranks may launch different grids: no block waits
    for a peer's block)."""
    layout = ScratchLayout(4 * LL_MAX_BYTES, 0, size, gpu=True)
    for count, output_count, itemsize in ((0, 0, 4), (1, 0, 1), (0, 3, 8), (512, 10, 8),
                                          (513, 0, 8), (100_000, 4, 4), (1 << 30, 0, 1)):
        largest = min(max(count, output_count) * itemsize, layout.ll_max_bytes)
        lines = -(-largest // PAYLOAD)
        want = max(1, min(MAX_BLOCKS, -(-lines // THREADS)))
        assert _launches(count, output_count, itemsize, layout, size) == [
            ("all_to_all_v_ll_bytes", want)], (count, output_count, itemsize)
    assert _launches(1 << 30, 0, 1, layout, size, max_blocks=32) == [
        ("all_to_all_v_ll_bytes", 32)]
    # No arrays known: the LL buffers' size.
    assert _launches(0, 0, 1, layout, size, with_args=False) == [
        ("all_to_all_v_ll_bytes", MAX_BLOCKS)]


def test_nothing_is_refused_on_the_host_for_its_size_but_too_many_ranks_are():
    ll = algorithm("cuda", "all_to_all_v", "ll")
    for size in (1, 2, 8):
        layout = ScratchLayout(4096, 0, size, gpu=True)
        signature = Signature("all_to_all_v", 0, "float32", 4, None, "ll")
        assert ll.unsupported(GpuCall(signature, size, lambda *_: None,
                                      layout.ll_max_bytes)) is None
    signature = Signature("all_to_all_v", 0, "float32", 4, None, "ll")
    assert ll.unsupported(GpuCall(signature, 9, lambda *_: None, 4096)) == (
        "the ll kernels span at most 8 ranks; this group has 9")
