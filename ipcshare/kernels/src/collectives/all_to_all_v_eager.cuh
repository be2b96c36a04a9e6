// All-to-all-v, eager (collectives/algorithms/gpu_all_to_all_eager.py): the push
// all-to-all-v's stores without its meeting. A sender cannot know where its bytes land in
// a receiver's output before it has every rank's split row, which costs push a meeting and
// a round trip before the first store. Here each receiver's inbox (its staging area of the
// call's parity) is cut into n - 1 slots, one per peer in a fixed order, so a sender knows
// where its bytes go from its own counts alone: the bytes it sends rank r land in its slot
// of r's inbox at their offset in its segment, and r copies them into its output where
// the rows (which it has by then) put them.
//
// Rows. The split rows travel as the LL all-to-all-v's do (all_to_all_ll.cuh): block 0's
// warp 0 pushes this rank's row as LL lines after the digest line of its LL slot at every
// peer; every block waits for the digests (ll_check_digests: a rank making another call is
// found before any byte moves), then warp 0 waits for every row and checks them all with
// the LL all-to-all-v's checks, a segment past a slot taking the place of one past an LL
// slot (kSplitTooLargeForSlot): every rank finds the same first problem, and nobody
// stores a data byte. One one-way trip over NVLink, where push's meeting is a round trip
// and then a load.
//
// Work. As push's (all_to_all_v_push_plan.cuh): block b of a sender stores part b of the
// bytes it sends, tile by tile, and signals each tile on its words 0; block b of a
// receiver waits, at step j, for tile j - 1 of part b of every sender whose tile holds
// bytes for it, and copies them from the sender's slot into its output. Its own bytes go
// from input to output directly.
//
// Safety between calls. The digest lines make each rank hear every peer's call before it
// stores anything, as push's meeting does: a rank writes a peer's inbox of parity p in call
// k (the Call epoch, which counts the calls of the staging areas' users), which the peer
// read last in call k - 2, and our call k - 1 heard its call k - 1. The LL lines follow
// ll.cuh's parity argument (every rank waits for every peer's digest and row). No peer
// reads our input or output, so no exit barrier; every byte that lands in us is waited
// for. In place is refused on the host.
#pragma once

#include <ipcshare/trace.cuh>
#include <ipcshare/wide_copy.cuh>

#include "collectives/all_to_all.cuh"
#include "collectives/all_to_all_ll.cuh"
#include "collectives/all_to_all_v_push.cuh"

// Bytes of one sender's slot in a receiver's inbox: the staging area cut into n - 1 runs
// of whole 16-byte granules (at 2 ranks the whole area, which holds any segment).
__device__ __forceinline__ unsigned long long eager_slot_bytes(const CollectiveArgs& a) {
  const unsigned long long staging = a.staging_offset[1] - a.staging_offset[0];
  return a.nranks > 1 ? staging / (unsigned long long)(a.nranks - 1) / 16 * 16 : staging;
}

// Where sender q's slot starts in receiver r's inbox (q != r): slots in the order r + 1,
// r + 2, ... wrapping.
__device__ __forceinline__ unsigned long long eager_slot_at(const CollectiveArgs& a, int q,
                                                            int r) {
  const int index = (q - r - 1 + a.nranks) % a.nranks;
  return (unsigned long long)index * eager_slot_bytes(a);
}

__device__ void all_to_all_v_eager(const CollectiveArgs& a) {
  static_assert(2 * kMaxRanks + 3 <= 32, "a split row's words are lanes of warp 0");
  namespace plan = ipcshare::push_v_plan;
  const int n = a.nranks, me = a.rank, words = split_row_words(n);
  const u64 itemsize = (u64)a.itemsize;
  const u64 tile = a.push_tile_bytes != 0 ? a.push_tile_bytes : kPushTileBytes;
  const u64 capacity = eager_slot_bytes(a);
  const unsigned peers = ll_peers(a);
  const bool warp0 = threadIdx.x < 32;
  const int lane = threadIdx.x;  // in warp 0
  __shared__ long long sends[kMaxRanks];
  __shared__ SplitRow rows[kMaxRanks];
  __shared__ int sound;  // every row came and the rows pass the checks
  // Our sends, loaded before the calls begin (as the LL all-to-all-v's).
  const long long mine = threadIdx.x < n ? own_send_split(a, threadIdx.x) : 0;
  Call call;
  begin_call(a, call);
  LLCall ll = ll_begin(a);
  IPCSHARE_MARK(0);  // begun
  if (warp0) {
    unsigned long long at;
    warp_own_sends(a, mine, at);  // a wrong row is found by every rank in the checks
    if (lane < n) sends[lane] = mine;
    if (lane == 0) sound = 1;
    if (blockIdx.x == 0 && lane < words) {
      const u64 word = (u64)(lane < n ? mine : split_row_word(a, sends, lane));
      for (int step = 1; step < n; ++step) ll_push_to(a, ll, ll_peer_at(a, step), lane, word);
    }
  }
  IPCSHARE_MARK(1);  // row pushed
  ll_check_digests(a, ll);
  IPCSHARE_MARK(2);  // digests checked
  if (!ll.failed && warp0) {
    const bool came = ll_gather_rows(a, ll, sends, peers, rows);
    const bool bad = split_lane_finds_problem(rows, n, itemsize, capacity, lane, 32);
    if (!__all_sync(0xffffffffu, came)) {
      if (lane == 0) sound = 0;
    } else if (__any_sync(0xffffffffu, bad)) {
      if (lane == 0) {
        const u64 problem =
            first_ll_split_problem(rows, n, itemsize, capacity, kSplitTooLargeForSlot);
        if (problem) record_split_problem(a, problem, call.epoch);
        sound = 0;
      }
    }
  }
  __syncthreads();
  IPCSHARE_MARK(3);  // rows read and checked
  if (ll.failed || !sound) call.failed = true;
  if (!call.failed) {
    fill_receive_splits(a, rows);
    const long long* flat = &rows[0][0];
    const char* inbox = a.windows[me] + a.staging_offset[call.parity];
    push_v_steps(a, call, rows, tile, /*copy_out=*/true,
                 [&](int r, u64 src, u64 dst, u64 nbytes) {
                   if (r == me) {
                     ipcshare::block_copy_wide(a.output + dst, a.input + src, nbytes);
                     return;
                   }
                   // Our slot of r's inbox, at the bytes' offset in our segment.
                   const u64 offset = dst - plan::landing(flat, kSplitRowStride, me, r,
                                                          itemsize);
                   char* slot = a.windows[r] + a.staging_offset[call.parity] +
                                eager_slot_at(a, me, r);
                   ipcshare::block_copy_wide(slot + offset, a.input + src, nbytes);
                 },
                 [&](int q, u64 at) {
                   return inbox + eager_slot_at(a, q, me) +
                          (at - plan::landing(flat, kSplitRowStride, q, me, itemsize));
                 });
    IPCSHARE_MARK(7);  // every step done
  }
  ll_end(a, ll);
  ipcshare::end_epoch(a.pads[a.rank], a.epoch_word, call.epoch);
  IPCSHARE_MARK(8);  // ended
}
