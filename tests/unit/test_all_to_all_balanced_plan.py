"""The balanced all-to-all's plan of work (kernels/src/collectives/all_to_all_plan.cuh) and
its copy arithmetic (kernels/include/ipcshare/wide_copy.cuh), replayed on numpy without a
GPU. The headers are compiled here with the host's C++ compiler and called through ctypes,
so the replay runs the kernel's own cutting rule, not a copy of it.

The replay schedules every rank's blocks in a random order, step by step: a sender block
stages its part (offsets the plan gives) into a poisoned staging area and signals it; a
receiver block waits for part b of every sender (the meeting), then for each piece the
plan gives it waits for the parts the plan names and copies. A piece that reads a byte no
signalled part staged delivers poison, and the output is compared with what every rank
must receive, nothing past it written. In place (all-to-all) the output is the input, and
staging reads what a receiver block may already have overwritten. Mutations (no waits
beyond the meeting, senders cutting otherwise than receivers think) must fail, so the
replay can."""

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
#include <cstring>
#include "collectives/all_to_all_plan.cuh"
using namespace ipcshare;
using namespace ipcshare::all_to_all_plan;
extern "C" {
void cut_of(u64 n, u64 parts, u64 part, u64* out) {
  const Range r = cut(n, parts, part);
  out[0] = r.begin; out[1] = r.end;
}
int stages(const long long* sends, int n, int me, u64 item, u64 parts, u64 part, u64* out) {
  int k = 0;
  plan_stages(sends, n, me, item, parts, part, [&](u64 at, u64 nbytes) {
    out[2 * k] = at; out[2 * k + 1] = nbytes; ++k;
  });
  return k;
}
int reads(const long long* rows, int stride, int n, int me, u64 item, u64 parts, u64 part,
          u64* out) {
  int k = 0;
  plan_reads(rows, stride, n, me, item, parts, part,
             [&](int q, u64 dst, u64 src, u64 nbytes, u64 first, u64 last, u64 own_first,
                 u64 own_last) {
               const u64 v[8] = {(u64)q, dst, src, nbytes, first, last, own_first, own_last};
               for (int i = 0; i < 8; ++i) out[8 * k + i] = v[i];
               ++k;
             });
  return k;
}
void funnel(const unsigned* lo, const unsigned* hi, unsigned shift, unsigned* out) {
  const Words4 r = funnel16(Words4{lo[0], lo[1], lo[2], lo[3]},
                            Words4{hi[0], hi[1], hi[2], hi[3]}, shift);
  out[0] = r.x; out[1] = r.y; out[2] = r.z; out[3] = r.w;
}
// block_copy_wide's arithmetic with the block's threads and a warp's shuffles taken away:
// head and tail bytes, aligned vectors, or vector i = funnel16(a[i], a[i + 1]). `reach`
// gets the lowest and highest source offsets loaded (relative to src).
void copy_bytes(unsigned char* dst, const unsigned char* src, u64 n, long long* reach) {
  reach[0] = 0; reach[1] = 0;
  if (dst == src || n == 0) return;
  const CopyPlan p = copy_plan((u64)dst, (u64)src, n);
  const u64 body = p.head + 16 * p.vectors;
  for (u64 i = 0; i < p.head; ++i) dst[i] = src[i];
  for (u64 i = body; i < n; ++i) dst[i] = src[i];
  reach[1] = (long long)n - 1;
  if (p.vectors == 0) return;
  const unsigned char* a = src + p.head - p.shift;
  reach[0] = (long long)(p.head - p.shift);
  const u64 loaded = p.shift == 0 ? p.vectors : p.vectors + 1;
  if ((long long)(p.head - p.shift + 16 * loaded) - 1 > reach[1])
    reach[1] = (long long)(p.head - p.shift + 16 * loaded) - 1;
  for (u64 i = 0; i < p.vectors; ++i) {
    Words4 lo, hi;
    std::memcpy(&lo, a + 16 * i, 16);
    if (p.shift == 0) { std::memcpy(dst + p.head + 16 * i, &lo, 16); continue; }
    std::memcpy(&hi, a + 16 * (i + 1), 16);
    const Words4 r = funnel16(lo, hi, p.shift);
    std::memcpy(dst + p.head + 16 * i, &r, 16);
  }
}
}
"""


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    """The plan's functions, compiled from the kernel headers for this host."""
    return build_for_host(tmp_path_factory.mktemp("plan"), _SHIM, "the kernel's plan")


def _longs(values) -> ctypes.Array:
    return (ctypes.c_longlong * len(values))(*[int(v) for v in values])


def _stages(plan, sends, me, item, parts, part):
    out = (_U64 * 4)()
    k = plan.stages(_longs(sends), len(sends), me, _U64(item), _U64(parts), _U64(part), out)
    return [(out[2 * i], out[2 * i + 1]) for i in range(k)]


def _reads(plan, m, me, item, parts, part):
    n = len(m)
    out = (_U64 * (8 * n))()
    k = plan.reads(_longs(m.reshape(-1)), n, n, me, _U64(item), _U64(parts), _U64(part), out)
    return [tuple(out[8 * i:8 * i + 8]) for i in range(k)]


def replay(plan, m: np.ndarray, item: int, parts: int, rng: random.Random, *,
           in_place: bool = False, zero_copy: bool = False, waits: bool = True,
           sender_parts: int | None = None) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Run every rank's blocks on numpy in an order drawn from ``rng``; return (what each
    rank's output holds, the inputs). ``m[q, r]``: elements rank q sends rank r.
    ``waits`` False: receivers wait only for the meeting (a mutation);
    ``sender_parts``: senders cut into that many parts (a mutation)."""
    n = len(m)
    sent = m.sum(axis=1) * item
    received = m.sum(axis=0) * item
    inputs = [np.frombuffer(np.random.default_rng([q, 11]).bytes(int(sent[q])), np.uint8)
              .copy() for q in range(n)]
    if in_place:   # all-to-all: one array, input and output
        outputs = [data.copy() for data in inputs]
        sources = outputs
    else:
        outputs = [np.full(int(received.max()) + 3, POISON, np.uint8) for _ in range(n)]
        sources = [data.copy() for data in inputs]
    staging = [np.full(int(sent[q]), POISON, np.uint8) for q in range(n)]
    signalled: set[tuple[int, int, int]] = set()    # (receiver, sender, part)

    def sender(q: int, b: int):
        for at, nbytes in _stages(plan, m[q], q, item, sender_parts or parts, b):
            assert at + nbytes <= sent[q]
            if not zero_copy:
                staging[q][at:at + nbytes] = sources[q][at:at + nbytes]
            yield None
        for r in range(n):
            signalled.add((r, q, b))

    def receiver(r: int, b: int):
        for q in range(n):
            if q != r:
                yield (r, q, b)
        for q, dst, src, nbytes, first, last, own_first, own_last in _reads(plan, m, r, item,
                                                                              parts, b):
            if q == r:
                outputs[r][dst:dst + nbytes] = sources[r][src:src + nbytes]
                continue
            if waits:
                for c in range(first, last):
                    yield (r, q, c)
                if in_place:
                    for c in range(own_first, own_last):
                        yield (r, r, c)
            held = sources[q] if zero_copy else staging[q]
            outputs[r][dst:dst + nbytes] = held[src:src + nbytes]
            yield None

    tasks = [sender(q, b) for q in range(n) for b in range(parts)]
    tasks += [receiver(r, b) for r in range(n) for b in range(parts)]
    run_in_random_order(tasks, lambda need: need in signalled, rng)
    return outputs, inputs


def expected(m: np.ndarray, inputs: list[np.ndarray], me: int, item: int) -> np.ndarray:
    parts = [data[int(m[q, :me].sum()) * item:int(m[q, :me + 1].sum()) * item]
             for q, data in enumerate(inputs)]
    return np.concatenate(parts)


def _check(m, outputs, inputs, item):
    for me, out in enumerate(outputs):
        want = expected(m, inputs, me, item)
        assert np.array_equal(out[:want.nbytes], want), me
        assert np.all(out[want.nbytes:] == POISON), me    # nothing past the received


def _matrices(n: int):
    """Split matrices of the shapes the kernel must take alike: random counts (zeros
    among them), all to one rank, one segment holding everything, all-but-one zero."""
    counts = st.integers(0, 40)
    random_m = st.lists(counts, min_size=n * n, max_size=n * n).map(
        lambda flat: np.array(flat, np.int64).reshape(n, n))

    def all_to(k, c):
        m = np.zeros((n, n), np.int64)
        m[:, k % n] = c
        return m

    def one_segment(q, r, c):
        m = np.zeros((n, n), np.int64)
        m[q % n, r % n] = c
        return m

    def next_rank(c):
        m = np.zeros((n, n), np.int64)
        for q in range(n):
            m[q, (q + 1) % n] = c
        return m
    return st.one_of(random_m, st.builds(all_to, st.integers(0, 7), st.integers(1, 300)),
                     st.builds(one_segment, st.integers(0, 7), st.integers(0, 7),
                               st.integers(1, 300)),
                     st.builds(next_rank, st.integers(0, 200)))


@settings(max_examples=examples(300), deadline=None)
@given(st.integers(1, 8).flatmap(lambda n: st.tuples(
    _matrices(n), st.sampled_from([1, 2, 4, 8]), st.integers(1, 9), st.randoms(),
    st.booleans())))
def test_every_byte_arrives_from_a_part_the_reader_waited_for(plan, drawn):
    m, item, parts, rng, zero_copy = drawn
    outputs, inputs = replay(plan, m, item, parts, rng, zero_copy=zero_copy)
    _check(m, outputs, inputs, item)


@settings(max_examples=examples(100), deadline=None)
@given(st.integers(1, 8), st.integers(0, 60), st.sampled_from([1, 2, 4, 8]),
       st.integers(1, 9), st.randoms())
def test_in_place_all_to_all_overwrites_input_only_once_it_is_staged(plan, n, block, item,
                                                                      parts, rng):
    m = np.full((n, n), block, np.int64)
    outputs, inputs = replay(plan, m, item, parts, rng, in_place=True)
    for me, out in enumerate(outputs):
        assert np.array_equal(out, expected(m, inputs, me, item)), me


def test_every_part_is_cut_alike_and_covers_the_bytes(plan):
    """Parts are runs of whole 16-byte granules that tile [0, n), the last ones shorter or
    empty (the rule both ends apply)."""
    for nbytes in (0, 1, 15, 16, 17, 1000, 4099, 1 << 20):
        for parts in (1, 2, 3, 7, 128):
            out = (_U64 * 2)()
            at = 0
            for part in range(parts):
                plan.cut_of(_U64(nbytes), _U64(parts), _U64(part), out)
                begin, end = out[0], out[1]
                assert begin == at and begin <= end <= nbytes
                assert begin % 16 == 0 or begin == nbytes
                at = end
            assert at == nbytes


def test_a_skewed_call_keeps_every_block_busy_on_the_hot_receiver(plan):
    """Bytes, not peers: with one receiver taking nearly everything, each of its blocks
    copies about 1 / parts of it, and a zero segment gives no piece."""
    parts = 16
    m = np.array([[1, 5000, 0, 3], [7, 4000, 2, 0], [0, 6000, 1, 1], [2, 3000, 0, 9]], np.int64)
    loads = [sum(piece[3] for piece in _reads(plan, m, 1, 4, parts, b)) for b in range(parts)]
    assert sum(loads) == int(m[:, 1].sum()) * 4
    # Equal runs of whole granules: only the last parts are shorter, by what rounding
    # each part up to a granule leaves them.
    assert max(loads) - min(loads) <= 16 * parts
    for b in range(parts):
        assert all(piece[3] > 0 for piece in _reads(plan, m, 1, 4, parts, b))


def test_a_reader_that_waits_only_for_its_meeting_delivers_unstaged_bytes(plan):
    """The waits beyond the meeting matter (and the replay can fail): a receiver whose
    part of one big segment lies in a sender's other parts reads them before they are
    staged when it runs first."""
    m = np.array([[0, 4000], [0, 0]], np.int64)
    seen = []
    for seed in range(20):
        outputs, inputs = replay(plan, m, 1, 4, random.Random(seed), waits=False)
        seen.append(any(np.any(out[:int(m[:, r].sum())] == POISON)
                        for r, out in enumerate(outputs)))
    assert any(seen)
    outputs, inputs = replay(plan, m, 1, 4, random.Random(0))
    _check(m, outputs, inputs, 1)


def test_senders_cutting_otherwise_than_receivers_think_deliver_unstaged_bytes(plan):
    m = np.array([[10, 3000], [2500, 7]], np.int64)
    bad = 0
    for seed in range(20):
        outputs, inputs = replay(plan, m, 2, 4, random.Random(seed), sender_parts=5)
        bad += any(np.any(out[:int(m[:, r].sum()) * 2] == POISON)
                   for r, out in enumerate(outputs))
    assert bad


def test_in_place_without_waiting_for_our_own_parts_loses_input(plan):
    """In place, a block overwrites input bytes that another of our blocks may not have
    staged yet unless it waits for that block's part."""
    n, block, parts = 2, 900, 4
    m = np.full((n, n), block, np.int64)
    wrong = 0
    for seed in range(20):
        outputs, inputs = replay(plan, m, 1, parts, random.Random(seed), in_place=True,
                                 waits=False)
        wrong += any(not np.array_equal(out, expected(m, inputs, me, 1))
                     for me, out in enumerate(outputs))
    assert wrong


@pytest.mark.parametrize("shift", range(16))
def test_funnel16_takes_sixteen_bytes_at_any_offset(plan, shift):
    data = np.arange(32, dtype=np.uint8) * 7 + 3
    words = data.view("<u4")
    lo = (ctypes.c_uint * 4)(*words[:4].tolist())
    hi = (ctypes.c_uint * 4)(*words[4:].tolist())
    out = (ctypes.c_uint * 4)()
    plan.funnel(lo, hi, shift, out)
    got = np.array(list(out), "<u4").view(np.uint8)
    assert np.array_equal(got, data[shift:shift + 16])


@pytest.mark.parametrize("dst_offset", range(16))
def test_wide_copy_is_exact_at_every_alignment_and_reads_only_whole_vectors(plan, dst_offset):
    """Every destination and source alignment, lengths around the vector sizes: the bytes
    arrive, nothing outside [dst, dst + n) is written, and the loads stay within the
    16-byte vectors that hold the source's bytes (so no page can be crossed)."""
    pool = np.random.default_rng(dst_offset).integers(0, 256, 8192, dtype=np.uint8)
    reach = (ctypes.c_longlong * 2)()
    for src_offset in range(16):
        src = 16 + (src_offset - pool.ctypes.data) % 16    # pool[src] is src_offset mod 16
        for n in (*range(0, 70), 255, 256, 257, 1000, 4099):
            out = np.full(n + 64, POISON, np.uint8)
            dst = 16 + (dst_offset - out.ctypes.data) % 16
            plan.copy_bytes(ctypes.c_void_p(out.ctypes.data + dst),
                            ctypes.c_void_p(pool.ctypes.data + src), _U64(n), reach)
            assert np.array_equal(out[dst:dst + n], pool[src:src + n]), (src_offset, n)
            assert np.all(out[:dst] == POISON) and np.all(out[dst + n:] == POISON)
            if n:
                first = pool.ctypes.data + src
                low, high = first + reach[0], first + reach[1]
                assert low // 16 >= first // 16 and high // 16 <= (first + n - 1) // 16
