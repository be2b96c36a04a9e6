// The plan of work of the push all-to-all-v (all_to_all_v_push.cuh): which bytes each
// thread block stores where, tile by tile, and which of the bytes that land in a rank it
// waits for at which step. Plain C++ that compiles on the host too:
// tests/unit/test_all_to_all_v_push_plan.py compiles this very file and replays the
// protocol on numpy (blocks of every rank in random order, inboxes poisoned).
//
// A sender cuts the bytes it sends (its input up to the sum of its input_splits) into
// `parts` equal runs of 16-byte granules (all_to_all_plan.cuh's cut), one per thread
// block, and block b cuts its part into tiles. Tile t of a part may hold bytes for several
// receivers (a segment ends inside it) or for one; each run lands in the receiver's output
// (or its inbox, laid out as the output) where the receiver's bytes from that sender
// start: after what lower ranks send the receiver. Every rank knows every rank's row after
// the meeting, so a receiver's block b computes the same tiles of every sender's part b
// and knows which of them hold bytes for it, and where they land.
#pragma once

#include "collectives/all_to_all_plan.cuh"

namespace ipcshare {
namespace push_v_plan {

typedef unsigned long long u64;
using all_to_all_plan::Range;
using all_to_all_plan::cut;

// A tile's signal is its step, which must stay below 2^kStepBits - 1 (call.cuh); a part
// with more tiles than this gets larger ones (only past 64 GiB a block at 64 KiB tiles).
constexpr u64 kMostTiles = (1ull << 20) - 2;

// Bytes per tile of a part of `len` bytes, for tiles of `tile` bytes asked: a multiple of
// 16 (a tile's start keeps a part's alignment), larger only past kMostTiles tiles.
IPCSHARE_HD u64 tile_bytes(u64 len, u64 tile) {
  u64 per = tile / 16 * 16;
  if (per == 0) per = 16;
  if ((len + per - 1) / per > kMostTiles) per = ((len + kMostTiles - 1) / kMostTiles + 15) / 16 * 16;
  return per;
}

// Bytes rank q sends in all (rows[q * stride + r]: elements q sends r).
IPCSHARE_HD u64 sent_bytes(const long long* rows, int stride, int n, int q, u64 itemsize) {
  u64 total = 0;
  for (int r = 0; r < n; ++r) total += (u64)rows[q * stride + r] * itemsize;
  return total;
}

// Tiles of sender q's part `part` (0 where the part is empty).
IPCSHARE_HD u64 tiles_of(const long long* rows, int stride, int n, int q, u64 itemsize,
                         u64 parts, u64 part, u64 tile) {
  const Range p = cut(sent_bytes(rows, stride, n, q, itemsize), parts, part);
  const u64 len = p.end - p.begin;
  const u64 per = tile_bytes(len, tile);
  return (len + per - 1) / per;
}

// Tile t of sender q's part `part`: bytes [begin, end) of what q sends (empty past the
// part's last tile).
IPCSHARE_HD Range tile_of(const long long* rows, int stride, int n, int q, u64 itemsize,
                          u64 parts, u64 part, u64 tile, u64 t) {
  const Range p = cut(sent_bytes(rows, stride, n, q, itemsize), parts, part);
  const u64 per = tile_bytes(p.end - p.begin, tile);
  u64 begin = p.begin + t * per, end = begin + per;
  if (begin > p.end) begin = p.end;
  if (end > p.end) end = p.end;
  return Range{begin, end};
}

// Where rank r's bytes from rank q start in r's output: after what lower ranks send r.
IPCSHARE_HD u64 landing(const long long* rows, int stride, int q, int r, u64 itemsize) {
  u64 at = 0;
  for (int p = 0; p < q; ++p) at += (u64)rows[p * stride + r] * itemsize;
  return at;
}

// The stores of tile t of rank me's part `part`: visit(r, src, dst, nbytes) for each
// receiver r the tile holds bytes for, in rank order: bytes [src, src + nbytes) of me's
// input go to bytes [dst, dst + nbytes) of r's output (or inbox). r == me: our own bytes,
// a copy within the rank.
template <class Visit>
IPCSHARE_HD void plan_push(const long long* rows, int stride, int n, int me, u64 itemsize,
                           u64 parts, u64 part, u64 tile, u64 t, Visit&& visit) {
  const Range span = tile_of(rows, stride, n, me, itemsize, parts, part, tile, t);
  u64 at = 0;
  for (int r = 0; r < n && at < span.end; ++r) {
    const u64 len = (u64)rows[me * stride + r] * itemsize;
    const u64 lo = span.begin > at ? span.begin : at;
    const u64 hi = span.end < at + len ? span.end : at + len;
    if (lo < hi) visit(r, lo, landing(rows, stride, me, r, itemsize) + (lo - at), hi - lo);
    at += len;
  }
}

// What of sender q's tile t of part `part` lands in rank me: bytes [begin, end) of me's
// output (or inbox), empty where the tile holds nothing for me. A segment is one run of
// the sender's bytes, so a tile holds at most one run for a receiver.
IPCSHARE_HD Range plan_receive(const long long* rows, int stride, int n, int me, int q,
                               u64 itemsize, u64 parts, u64 part, u64 tile, u64 t) {
  const Range span = tile_of(rows, stride, n, q, itemsize, parts, part, tile, t);
  u64 at = 0;
  for (int r = 0; r < me; ++r) at += (u64)rows[q * stride + r] * itemsize;
  const u64 len = (u64)rows[q * stride + me] * itemsize;
  const u64 lo = span.begin > at ? span.begin : at;
  const u64 hi = span.end < at + len ? span.end : at + len;
  if (lo >= hi) return Range{0, 0};
  const u64 base = landing(rows, stride, q, me, itemsize);
  return Range{base + (lo - at), base + (hi - at)};
}

}  // namespace push_v_plan
}  // namespace ipcshare
