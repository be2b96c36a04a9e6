// The plan of work of the balanced all-to-all (all_to_all_balanced.cuh): which bytes each
// thread block stages, and which bytes it reads from whom after waiting for which parts.
// Plain C++ that compiles on the host too: tests/unit/test_all_to_all_slicing.py compiles
// this very file and replays the plan on numpy (blocks in any order, unstaged bytes
// poisoned), so the test cannot drift from the kernel.
//
// Cutting. Both sides cut by bytes, not by peer:
// - A sender cuts the bytes it sends (its input up to the sum of its input_splits) into
//   `parts` equal runs of whole 16-byte granules (cut); part b is staged by its block b,
//   less its own segment, which never leaves the rank. Its block b then signals "part b
//   staged" to every rank.
// - A receiver cuts the bytes it receives (its output up to what comes) alike; its block b
//   copies output bytes cut(received, parts, b), from whichever senders' segments they
//   fall in, after waiting for the sender's parts that hold them (parts_holding). A
//   segment of zero bytes costs nothing, and a skewed call keeps every block busy on the
//   hot receiver: each copies 1 / parts of what it receives.
// The receiver knows every sender's cut because every rank's split row is published
// before its first signal; block b waits for part b of every sender first (which is also
// where it learns the rows), then for the other parts it needs.
#pragma once

#include <ipcshare/wide_copy.cuh>

namespace ipcshare {
namespace all_to_all_plan {

typedef unsigned long long u64;

constexpr u64 kCutGranule = 16;

struct Range { u64 begin, end; };

// Bytes per part when n bytes are cut into `parts` (a multiple of kCutGranule).
IPCSHARE_HD u64 cut_per(u64 n, u64 parts) {
  const u64 granules = (n + kCutGranule - 1) / kCutGranule;
  return (granules + parts - 1) / parts * kCutGranule;
}

// Part `part` of [0, n): equal runs of whole granules, the last ones shorter or empty.
IPCSHARE_HD Range cut(u64 n, u64 parts, u64 part) {
  const u64 per = cut_per(n, parts);
  u64 begin = per * part, end = begin + per;
  if (begin > n) begin = n;
  if (end > n) end = n;
  return Range{begin, end};
}

// The parts [first, last) of a cut of n bytes that hold bytes [at, at + nbytes) (empty
// where nbytes is 0 or the bytes lie past n).
IPCSHARE_HD Range parts_holding(u64 n, u64 parts, u64 at, u64 nbytes) {
  if (nbytes == 0 || at >= n) return Range{0, 0};
  u64 last = at + nbytes;
  if (last > n) last = n;
  const u64 per = cut_per(n, parts);
  return Range{at / per, (last - 1) / per + 1};
}

// A sender's staging: what block `part` copies into its staging area (offsets in the
// input, which the staging area mirrors): its part of the bytes sent, less the rank's own
// segment. visit(at, nbytes) is called at most twice. sends[r]: elements to rank r.
template <class Visit>
IPCSHARE_HD void plan_stages(const long long* sends, int n, int me, u64 itemsize, u64 parts,
                             u64 part, Visit&& visit) {
  u64 total = 0, own_at = 0;
  for (int r = 0; r < n; ++r) {
    if (r == me) own_at = total;
    total += (u64)sends[r] * itemsize;
  }
  const u64 own_end = own_at + (u64)sends[me] * itemsize;
  const Range mine = cut(total, parts, part);
  if (mine.begin < own_at) visit(mine.begin, (mine.end < own_at ? mine.end : own_at) - mine.begin);
  if (mine.end > own_end) {
    const u64 from = mine.begin > own_end ? mine.begin : own_end;
    visit(from, mine.end - from);
  }
}

// A receiver's reads: what block `part` of rank `me` copies into its output. rows[q *
// stride + r] holds the elements rank q sends rank r (every rank's row, checked). For each
// sender q whose segment for `me` meets this block's part of the output, in rank order:
// visit(q, dst, src, nbytes, first, last, own_first, own_last): bytes [dst, dst + nbytes)
// of the output come from bytes [src, ...) of q's input (q == me: our own input, read
// directly), which q's parts [first, last) stage; [own_first, own_last) are our own parts
// that stage bytes [dst, dst + nbytes) of our input (what an in-place all-to-all must wait
// for before it overwrites them).
template <class Visit>
IPCSHARE_HD void plan_reads(const long long* rows, int stride, int n, int me, u64 itemsize,
                            u64 parts, u64 part, Visit&& visit) {
  u64 received = 0, own_total = 0;
  for (int q = 0; q < n; ++q) received += (u64)rows[q * stride + me] * itemsize;
  for (int r = 0; r < n; ++r) own_total += (u64)rows[me * stride + r] * itemsize;
  const Range mine = cut(received, parts, part);
  u64 place = 0;
  for (int q = 0; q < n && place < mine.end; ++q) {
    const u64 nbytes = (u64)rows[q * stride + me] * itemsize;
    const u64 lo = mine.begin > place ? mine.begin : place;
    const u64 hi = mine.end < place + nbytes ? mine.end : place + nbytes;
    if (lo < hi) {
      u64 from = 0, total = 0;
      for (int r = 0; r < n; ++r) {
        if (r < me) from += (u64)rows[q * stride + r] * itemsize;
        total += (u64)rows[q * stride + r] * itemsize;
      }
      const u64 src = from + (lo - place);
      const Range theirs = parts_holding(total, parts, src, hi - lo);
      const Range ours = parts_holding(own_total, parts, lo, hi - lo);
      visit(q, lo, src, hi - lo, theirs.begin, theirs.end, ours.begin, ours.end);
    }
    place += nbytes;
  }
}

}  // namespace all_to_all_plan
}  // namespace ipcshare
