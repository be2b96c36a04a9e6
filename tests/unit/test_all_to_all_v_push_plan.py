"""The push all-to-all-v's plan and protocol (kernels/src/collectives/all_to_all_v_push.cuh,
its plan in all_to_all_v_push_plan.cuh), replayed on numpy without a GPU. The plan header
is compiled here with the host's C++ compiler and called through ctypes, so the replay
runs the kernel's own cutting and landing rules, not a copy of them.

Every rank's blocks run in an order drawn at random, step by step, as the kernel runs
them: meet the same block of every peer; step j: store tile j of the block's part into
each receiver's output (where the receiver's output is within reach) or inbox (poisoned
until written), our own bytes into our output; wait for tile j - 1 of part b of every
sender whose tile holds bytes for us, and copy those bytes out of the inbox where our
output is out of reach; signal tile j. A copy of a byte no signalled tile stored shows as
poison, the scheduler finds any circular wait, and every output is compared with what
its rank must receive, nothing past it written. The eager all-to-all-v
(all_to_all_v_eager.cuh) runs the same plan through slots: each receiver's inbox is one
slot per peer, and every byte goes through its sender's. Mutations (no waits, a wait one
tile short, landing after the wrong ranks, slots in another order) must fail, so the
replay can.

The check every rank makes before any byte moves (first_push_split_problem in
split_checks.cuh: pull's checks, then that a rank out of reach can take what it receives
in its inbox) is compared with a Python model of it on random and edge-case rows."""

from __future__ import annotations

import ctypes
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.block_replay import run_in_random_order
from tests.host_kernels import build_for_host

from ..hypothesis_profiles import examples

POISON = 0xA5
_U64 = ctypes.c_ulonglong
_SHIM = r"""
#include "collectives/all_to_all_v_push_plan.cuh"
#include "collectives/split_checks.cuh"
using namespace ipcshare;
using namespace ipcshare::push_v_plan;
typedef long long Row8[2 * 8 + 3];  // SplitRow of 8 ranks at most
extern "C" {
u64 tiles(const long long* rows, int n, int q, u64 item, u64 parts, u64 part, u64 tile) {
  return tiles_of(rows, n, n, q, item, parts, part, tile);
}
u64 per_tile(u64 len, u64 tile) { return tile_bytes(len, tile); }
int pushes(const long long* rows, int n, int me, u64 item, u64 parts, u64 part, u64 tile,
           u64 t, u64* out) {
  int k = 0;
  plan_push(rows, n, n, me, item, parts, part, tile, t, [&](int r, u64 src, u64 dst, u64 nbytes) {
    out[4 * k] = (u64)r; out[4 * k + 1] = src; out[4 * k + 2] = dst; out[4 * k + 3] = nbytes;
    ++k;
  });
  return k;
}
void receives(const long long* rows, int n, int me, int q, u64 item, u64 parts, u64 part,
              u64 tile, u64 t, u64* out) {
  const Range r = plan_receive(rows, n, n, me, q, item, parts, part, tile, t);
  out[0] = r.begin; out[1] = r.end;
}
u64 push_problem(const long long* flat, int n, u64 item, u64 capacity, unsigned reachable) {
  Row8 rows[8];
  for (int q = 0; q < n; ++q)
    for (int w = 0; w < 2 * n + 3; ++w) rows[q][w] = flat[q * (2 * n + 3) + w];
  return first_push_split_problem(rows, n, item, capacity, reachable);
}
}
"""


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    """The plan's functions, compiled from the kernel headers for this host."""
    lib = build_for_host(tmp_path_factory.mktemp("push_v"), _SHIM, "the push plan")
    for name in ("tiles", "per_tile", "push_problem"):
        getattr(lib, name).restype = _U64
    return lib


def _longs(values) -> ctypes.Array:
    return (ctypes.c_longlong * len(values))(*[int(v) for v in values])


class Plan:
    """The compiled plan for one split matrix (``m[q, r]``: elements q sends r)."""

    def __init__(self, lib, m: np.ndarray, item: int, parts: int, tile: int):
        self.lib, self.n, self.item, self.parts, self.tile = lib, len(m), item, parts, tile
        self.rows = _longs(m.reshape(-1))

    def tiles(self, q: int, part: int) -> int:
        return self.lib.tiles(self.rows, self.n, q, _U64(self.item), _U64(self.parts),
                              _U64(part), _U64(self.tile))

    def pushes(self, me: int, part: int, t: int) -> list[tuple[int, int, int, int]]:
        out = (_U64 * (4 * self.n))()
        k = self.lib.pushes(self.rows, self.n, me, _U64(self.item), _U64(self.parts),
                            _U64(part), _U64(self.tile), _U64(t), out)
        return [tuple(out[4 * i:4 * i + 4]) for i in range(k)]

    def receives(self, me: int, q: int, part: int, t: int) -> tuple[int, int]:
        out = (_U64 * 2)()
        self.lib.receives(self.rows, self.n, me, q, _U64(self.item), _U64(self.parts),
                          _U64(part), _U64(self.tile), _U64(t), out)
        return out[0], out[1]


def replay(lib, m: np.ndarray, item: int, parts: int, tile: int, rng: random.Random, *,
           reachable: list[bool], wait_shift: int = 0, waits: bool = True,
           landing_after_own: bool = False, slots: bool = False,
           slot_order: int = -1) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Every rank's blocks on numpy in an order drawn from ``rng``; returns (what each
    rank's output holds, the inputs). ``reachable[r]``: peers store into r's output
    itself. ``slots``: the eager all-to-all-v (all_to_all_v_eager.cuh): every receiver's
    inbox is n - 1 slots of the largest segment, sender q's at index (q - r - 1) mod n,
    and its bytes land there at their offset in its segment. Mutations: ``waits`` False
    (no waits for tiles), ``wait_shift`` 1 (wait for one tile fewer than the bytes copied
    need), ``landing_after_own`` (a sender lands its bytes after what it sends the
    receiver itself too), ``slot_order`` 0 (slots at index (q - r) mod n)."""
    n = len(m)
    p = Plan(lib, m, item, parts, tile)
    sent = m.sum(axis=1) * item
    received = m.sum(axis=0) * item
    inputs = [np.frombuffer(np.random.default_rng([q, 5]).bytes(int(sent[q])), np.uint8)
              .copy() for q in range(n)]
    outputs = [np.full(int(received.max()) + 3, POISON, np.uint8) for _ in range(n)]
    inboxes = [np.full(int(received.max()) + 3, POISON, np.uint8) for _ in range(n)]
    slot = -(-max(int(m.max()) * item, 1) // 16) * 16
    if slots:
        inboxes = [np.full((n - 1) * slot, POISON, np.uint8) for _ in range(n)]

    def landing(q: int, r: int) -> int:
        return int(m[:q, r].sum()) * item

    def slot_at(q: int, r: int) -> int:
        return ((q - r + slot_order) % n) * slot
    met: set[tuple[int, int]] = set()                 # (rank, block) has entered
    signalled: dict[tuple[int, int], int] = {}        # (sender, block) -> tiles signalled

    def block(me: int, b: int):
        met.add((me, b))
        for q in range(n):
            yield ("met", q, b)
        steps = max(p.tiles(q, b) for q in range(n))
        own = p.tiles(me, b)
        for step in range(steps + 1):
            if step < own:
                for r, src, dst, nbytes in p.pushes(me, b, step):
                    if landing_after_own and r != me:
                        dst += int(m[me, r]) * item
                    if slots and r != me:
                        dst = slot_at(me, r) + dst - landing(me, r)
                        assert dst + nbytes <= inboxes[r].size, "a store past the inbox"
                        inboxes[r][dst:dst + nbytes] = inputs[me][src:src + nbytes]
                        yield None
                        continue
                    place = outputs[r] if r == me or reachable[r] else inboxes[r]
                    place[dst:dst + nbytes] = inputs[me][src:src + nbytes]
                    yield None
            if step >= 1:
                t = step - 1
                pieces = []
                for q in range(n):
                    if q == me:
                        continue
                    lo, hi = p.receives(me, q, b, t)
                    if lo < hi:
                        if waits and t - wait_shift >= 0:
                            yield ("tile", q, b, t - wait_shift + 1)
                        at = slot_at(q, me) + lo - landing(q, me) if slots else lo
                        pieces.append((lo, hi, at))
                if slots or not reachable[me]:
                    for lo, hi, at in pieces:
                        assert at + hi - lo <= inboxes[me].size, "a copy past the inbox"
                        outputs[me][lo:hi] = inboxes[me][at:at + hi - lo]
                        yield None
            if step < own:
                signalled[(me, b)] = step + 1

    def ready(need) -> bool:
        if need[0] == "met":
            return (need[1], need[2]) in met
        return signalled.get((need[1], need[2]), 0) >= need[3]

    run_in_random_order([block(r, b) for r in range(n) for b in range(parts)], ready, rng)
    return outputs, inputs


def expected(m: np.ndarray, inputs: list[np.ndarray], me: int, item: int) -> np.ndarray:
    return np.concatenate([data[int(m[q, :me].sum()) * item:int(m[q, :me + 1].sum()) * item]
                           for q, data in enumerate(inputs)])


def _delivered(m, outputs, inputs, item) -> bool:
    for me, out in enumerate(outputs):
        want = expected(m, inputs, me, item)
        if not np.array_equal(out[:want.nbytes], want) or np.any(out[want.nbytes:] != POISON):
            return False
    return True


def _matrices(n: int):
    """Random counts (zeros among them), all to one rank, all-but-one zero, one rank
    sending everything to itself."""
    counts = st.integers(0, 60)
    random_m = st.lists(counts, min_size=n * n, max_size=n * n).map(
        lambda flat: np.array(flat, np.int64).reshape(n, n))

    def to_one(c: int) -> np.ndarray:
        m = np.zeros((n, n), np.int64)
        m[:, n - 1] = c
        return m

    def next_rank(c: int) -> np.ndarray:
        m = np.zeros((n, n), np.int64)
        for r in range(n):
            m[r, (r + 1) % n] = c
        return m

    def own_only(c: int) -> np.ndarray:
        return np.diag(np.full(n, c, np.int64))

    return st.one_of(random_m, counts.map(to_one), counts.map(next_rank), counts.map(own_only))


_CASES = st.integers(1, 6).flatmap(lambda n: st.tuples(
    st.just(n), _matrices(n), st.sampled_from([1, 2, 4, 8]), st.integers(1, 5),
    st.sampled_from([16, 32, 48, 128]), st.lists(st.booleans(), min_size=n, max_size=n),
    st.randoms(use_true_random=False)))


@settings(max_examples=examples(250), deadline=None)
@given(_CASES)
def test_every_byte_lands_where_its_receiver_expects_it_in_any_order(plan, case):
    n, m, item, parts, tile, reachable, rng = case
    outputs, inputs = replay(plan, m, item, parts, tile, rng, reachable=reachable)
    for me, out in enumerate(outputs):
        want = expected(m, inputs, me, item)
        assert np.array_equal(out[:want.nbytes], want), me
        assert np.all(out[want.nbytes:] == POISON), me   # nothing past the received


@settings(max_examples=examples(200), deadline=None)
@given(_CASES)
def test_eager_lands_every_byte_in_its_senders_slot_and_delivers_it_in_any_order(plan, case):
    """The eager all-to-all-v: the same plan, every byte through the sender's slot of the
    receiver's inbox (outputs in reach or not, it makes no difference there)."""
    n, m, item, parts, tile, reachable, rng = case
    outputs, inputs = replay(plan, m, item, parts, tile, rng, reachable=reachable, slots=True)
    for me, out in enumerate(outputs):
        want = expected(m, inputs, me, item)
        assert np.array_equal(out[:want.nbytes], want), me
        assert np.all(out[want.nbytes:] == POISON), me


@settings(max_examples=examples(120), deadline=None)
@given(_CASES)
def test_every_sent_byte_is_stored_once_and_every_tile_is_a_run_of_its_part(plan, case):
    """The pushes of every tile of every part cover each sender's bytes exactly once,
    each run inside one segment; a tile's runs are what its receivers expect of it."""
    n, m, item, parts, tile, _, _ = case
    p = Plan(plan, m, item, parts, tile)
    for q in range(n):
        covered = np.zeros(int(m[q].sum()) * item, np.int64)
        for b in range(parts):
            count = p.tiles(q, b)
            for t in range(count + 2):      # past the last tile: nothing
                runs = p.pushes(q, b, t)
                if t >= count:
                    assert runs == []
                for r, src, dst, nbytes in runs:
                    assert nbytes > 0
                    covered[src:src + nbytes] += 1
                    start = int(m[q, :r].sum()) * item
                    assert start <= src and src + nbytes <= start + int(m[q, r]) * item
                    assert dst == int(m[:q, r].sum()) * item + (src - start)
                    if r != q:
                        assert p.receives(r, q, b, t) == (dst, dst + nbytes)
                for r in range(n):
                    if r != q and all(run[0] != r for run in runs):
                        lo, hi = p.receives(r, q, b, t)
                        assert lo == hi == 0
        assert np.all(covered == 1), q


def test_tiles_past_the_step_bits_grow_instead(plan):
    """A part of more tiles than a signal's step holds gets larger tiles (multiples of 16)."""
    lib = plan
    most = (1 << 20) - 2
    assert lib.per_tile(_U64(64 << 10), _U64(64 << 10)) == 64 << 10
    assert lib.per_tile(_U64(100), _U64(8)) == 16          # never below a granule
    big = most * 64 + 1
    per = lib.per_tile(_U64(big), _U64(64))
    assert per % 16 == 0 and -(-big // per) <= most and per > 64


def _mutation_fails(plan, **mutation) -> None:
    rng = random.Random(3)
    found = False
    for trial in range(200):
        n = rng.randint(2, 4)
        m = np.array([[rng.randint(1, 80) for _ in range(n)] for _ in range(n)], np.int64)
        reachable = [rng.random() < 0.5 for _ in range(n)]
        try:
            outputs, inputs = replay(plan, m, 4, rng.randint(1, 3), 32, random.Random(trial),
                                     reachable=reachable, **mutation)
        except (AssertionError, ValueError, IndexError):
            found = True
            break
        if not _delivered(m, outputs, inputs, 4):
            found = True
            break
    assert found, f"the replay cannot tell {mutation} from the kernel's protocol"


def test_receivers_that_do_not_wait_for_tiles_copy_poison(plan):
    _mutation_fails(plan, waits=False)


def test_receivers_that_wait_for_one_tile_fewer_copy_poison(plan):
    _mutation_fails(plan, wait_shift=1)


def test_senders_landing_after_the_wrong_ranks_are_found(plan):
    _mutation_fails(plan, landing_after_own=True)


def test_eager_slots_in_another_order_are_found(plan):
    _mutation_fails(plan, slots=True, slot_order=0)


def _model_problem(m: np.ndarray, inputs: list[int], outputs: list[int], expect, item: int,
                   capacity: int, reachable: int) -> int:
    """split_checks.cuh's order in Python: pull's checks 1-3, then the inbox's."""
    n = len(m)
    for q in range(n):
        for r in range(n):
            if m[q, r] < 0:
                return (1 << 40) | (q << 32) | (r << 24)
            if m[q, r] > inputs[q]:
                return (2 << 40) | (q << 32)
        if m[q].sum() > inputs[q]:
            return (2 << 40) | (q << 32)
    for r in range(n):
        if m[:, r].sum() > outputs[r]:
            return (3 << 40) | (r << 32)
    for r in range(n):
        if expect[r] is None:
            continue
        for q in range(n):
            if expect[r][q] != m[q, r]:
                return (4 << 40) | (r << 32) | (q << 24)
    for r in range(n):
        if not (reachable >> r) & 1 and int(m[:, r].sum()) * item > capacity:
            return (6 << 40) | (r << 32)
    return 0


@settings(max_examples=examples(400), deadline=None)
@given(st.integers(1, 8).flatmap(lambda n: st.tuples(
    st.just(n), st.lists(st.integers(-1, 30), min_size=n * n, max_size=n * n),
    st.lists(st.integers(0, 120), min_size=n, max_size=n),
    st.lists(st.integers(0, 120), min_size=n, max_size=n),
    st.lists(st.booleans(), min_size=n, max_size=n), st.sampled_from([1, 2, 8]),
    st.integers(0, 400), st.integers(0, (1 << n) - 1))))
def test_the_inbox_check_comes_after_pulls_and_names_the_receiver(plan, drawn):
    n, flat, inputs, outputs, said, item, capacity, reachable = drawn
    m = np.array(flat, np.int64).reshape(n, n)
    expect = [list(m[:, r]) if said[r] else None for r in range(n)]
    words = 2 * n + 3
    rows = np.zeros((n, words), np.int64)
    for q in range(n):
        rows[q, :n] = m[q]
        rows[q, n:2 * n] = m[:, q] if said[q] else 0
        rows[q, 2 * n] = int(said[q])
        rows[q, 2 * n + 1] = inputs[q]
        rows[q, 2 * n + 2] = outputs[q]
    got = plan.push_problem(_longs(rows.reshape(-1)), n, _U64(item), _U64(capacity),
                            ctypes.c_uint(reachable))
    assert got == _model_problem(m, inputs, outputs, expect, item, capacity, reachable)


def test_a_receiver_out_of_reach_past_its_inbox_is_found_and_one_in_reach_is_not(plan):
    n, words = 2, 7
    m = np.array([[0, 50], [0, 50]], np.int64)       # rank 1 receives 100 elements
    rows = np.zeros((n, words), np.int64)
    for q in range(n):
        rows[q, :n] = m[q]
        rows[q, 2 * n + 1] = rows[q, 2 * n + 2] = 1000
    flat = _longs(rows.reshape(-1))
    assert plan.push_problem(flat, n, _U64(4), _U64(399), ctypes.c_uint(0)) == (6 << 40) | (1 << 32)
    assert plan.push_problem(flat, n, _U64(4), _U64(400), ctypes.c_uint(0)) == 0
    assert plan.push_problem(flat, n, _U64(4), _U64(399), ctypes.c_uint(0b10)) == 0
