// All-to-all, low-latency (collectives/algorithms/gpu_all_to_all_ll.py): the LL protocol of
// low_latency.cuh for small all-to-alls. Pull and balanced meet their peers before they
// copy (and again after, where an input is read in place): a round trip over NVLink each.
// Here rank r pushes block p of its input into its own slot of rank p's LL buffer, as
// lines that carry the call's flag (ll.cuh), exactly as reduce_scatter_ll pushes block p
// to rank p; then it waits on its own buffer for block r of every peer. One kernel, no
// barrier: the time is a launch plus one NVLink write.
//
// Lines and threads. count is the input's bytes, n blocks of count / n. Thread i of the
// grid owns lines j = i, i + stride, ... of every block: it pushes line j of each peer's
// block, and after the digests it waits for line j of every peer at once and stores line
// j of each output block (its own from its input, the others from their sources' slots).
// Line j of block s is bytes [s * block + 8j, s * block + 8j + 8) cut at the block's end,
// in the input and in the output alike (load_payload / store_payload).
//
// In place (output is input): our own block is already where it belongs. Output bytes of
// block s (s a peer) are the input bytes that go to rank s, and only the thread owning
// line j reads (pushes) or writes line j of block s; it pushes all its lines before
// ll_check_digests, which comes before its first store. So no byte is overwritten before
// it has left, whatever order threads and blocks run in, and nothing is staged.
//
// Every LL guarantee holds as for the other LL kernels: ll_begin / ll_end keep the epoch
// on the device (graphs replay with no host reset); every rank waits for every peer's
// digest line, empty blocks included, so a sender is never more than one call ahead (the
// parity argument of ll.cuh); the digests are checked before any store, so a call whose
// ranks disagree leaves the output untouched; a rank reads only its own input and its own
// buffer (aliasing_safe: an input that is the user's memory or in the heap is never read
// by a peer).
#pragma once

#include <ipcshare/ll.cuh>
#include <ipcshare/trace.cuh>

#include "collectives/all_to_all.cuh"
#include "collectives/low_latency.cuh"

__device__ void all_to_all_ll(const CollectiveArgs& a) {
  const int n = a.nranks, me = a.rank;
  const unsigned long long block = a.count / n;  // bytes each rank sends each rank
  const unsigned long long lines = (block + ipcshare::kLinePayload - 1) / ipcshare::kLinePayload;
  const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  const unsigned long long first = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
  LLCall call = ll_begin(a);
  IPCSHARE_MARK(0);  // begun
  for (unsigned long long j = first; j < lines; j += stride)
    ll_push_blocks(a, call, a.input, block, j);  // every peer's line j, loads first
  IPCSHARE_MARK(1);  // pushed
  ll_check_digests(a, call);
  IPCSHARE_MARK(2);  // digests checked
  const bool in_place = a.output == a.input;
  const char* own_in = a.input + me * block;
  char* own_out = a.output + me * block;
  const bool own_in_aligned = ((unsigned long long)own_in & 7ull) == 0;
  const bool own_out_aligned = ((unsigned long long)own_out & 7ull) == 0;
  // Line j of every peer awaited at once (ll_receive_all), as the all-gather does: waiting
  // for one source after another cost a load's latency per source at 3 ranks and more.
  const unsigned peers = ll_peers(a);
  for (unsigned long long j = first; j < lines && !call.failed; j += stride) {
    // Our own line is loaded first and stored last: its load is in flight while we wait.
    const u64 own = in_place ? 0 : ipcshare::load_payload(own_in, j, block, own_in_aligned);
    u64 got[kMaxRanks];
    if (!ll_receive_all(a, call, j, peers, got)) {
      call.failed = true;
      break;
    }
    ll_store_blocks(a.output, block, j, peers, got);
    if (!in_place) ipcshare::store_payload(own_out, j, block, own_out_aligned, own);
  }
  IPCSHARE_MARK(3);  // received
  ll_end(a, call);
  IPCSHARE_MARK(4);  // ended
}

// All-to-all-v, low-latency (GpuLowLatencyAllToAllV): the even kernel above with the
// splits on the device and no barrier. The counts are read at run time (own_send_split:
// a device array or the host's), so a graph replays with new splits; count is the
// input's elements, output_count the output's, itemsize their size.
//
// A slot of this call holds, after the digest line, the sender's whole split row
// (split_row_words(n) payload lines, a word each: the row pull publishes in its splits
// area) and then the lines of the block the sender sends the slot's owner (payload lines
// R, R + 1, ...). ScratchLayout reserves the row's lines, so a block of up to
// ll_max_bytes fits; all_to_all_v_ll_capacity is what fits exactly, from ll_slot_bytes,
// which every rank has alike (a block past it is pushed nowhere, and every rank finds it
// in the rows: kSplitTooLargeForLL).
//
// Warp 0 of every block does the per-call bookkeeping (a row is 19 words at most, a lane
// a word), and the block meets at two barriers of its own besides ll_check_digests' and
// ll_end's: a thread-0 pass over the rows with a barrier on each side cost ~2.5 us a call
// at 4 ranks, and read_own_sends' loads after ll_begin's stores, two barriers and a
// thread-0 prefix loop ~0.7 us (estimates from the 4-H200 timings of 2026-11-28: the
// kernel took 11.9-13 us up to 128 KiB a rank against 5.1-5.6 for the even one).
//
// 0. Warp 0 loads our sends (lane r: input_splits[r]) before ll_begin, so the loads are
//    in flight while the call begins (ll_begin's digest stores are asm that clobbers
//    memory: a load after them is issued after them); checks and sums them with a shuffle
//    scan (warp_own_sends, read_own_sends' checks); and writes, for each peer, where its
//    block starts and the bytes pushed to it (none where it is past a slot, or where our
//    sends are not sound: a row that is not stops every rank in 3 before anyone waits for
//    data). Block 0's warp 0 pushes our row to every peer (R lines, lane w word w) from
//    its registers: pushed by every block the rows would cost 128 times the NVLink stores
//    for nothing. One barrier.
// 1. Every thread pushes its lines j of each peer's block, every peer's line j loaded
//    before the first is stored, as ll_push_blocks does (ll_store's asm clobbers memory,
//    so a load after a store is issued after it: one peer at a time cost a load's latency
//    per peer, ~1.2 us at 4 ranks by the same estimate), peers in the order rank + 1,
//    rank + 2, ... (ll_peer_at), lines indexed by step so they stay in registers. A peer
//    whose block has no line j gets none.
// 2. ll_check_digests, as in every LL kernel: a disagreeing call stops before any row is
//    read or any byte stored.
// 3. Warp 0 waits for every peer's row lines in our own buffer (all peers at once, lane
//    w for word w) and builds our own row as we pushed it; its lanes share the checks
//    (split_lane_finds_problem) and __any_sync gives the verdict, true exactly where the
//    serial checks find a problem (split_checks.cuh; tests/unit/test_all_to_all_v_ll.py
//    compares the two on the host). Only on a call that has one does lane 0 run the
//    serial checks (first_ll_split_problem: read_headers_and_rows' checks in their
//    order, then one more: no block between two ranks is larger than a slot) and record
//    the first problem: every rank checks the same rows, so every rank finds the same
//    first problem, records it and moves no byte. The same warp computes the receive
//    offsets (used only where the rows pass): the blocks land packed in source order,
//    lane s sums what ranks below s send us, and a shuffle gives the most lines of any
//    block.
//    The rows are written and read by warp 0 alone (__syncwarp); one barrier hands the
//    verdict and the offsets to the block.
// 4. Thread i waits for lines R + i, R + i + stride, ... of every source whose block has
//    that line, at once, and stores each at its place; our own block goes from input to
//    output directly. Block 0 fills output_splits where it is a device array.
//
// Every line a sender writes us in a call we wait for in that call, except the data of a
// call that a problem stopped (they carry that call's flag; ll_end's re-flagging writes
// the same flag, so a late one changes nothing, and the next call of the parity waits for
// another flag), so the parity argument of ll.cuh holds as for the even kernel. In place
// is refused on the host: blocks move, and a thread would overwrite input that another
// has not pushed yet.
__device__ __forceinline__ unsigned long long all_to_all_v_ll_capacity(const CollectiveArgs& a) {
  const unsigned long long lines = a.ll_slot_bytes / ipcshare::kLineBytes;
  const unsigned long long taken = 1 + split_row_words(a.nranks);
  return lines > taken ? (lines - taken) * ipcshare::kLinePayload : 0;
}

// The largest `v` of a warp's lanes 0 .. kMaxRanks - 1, in each of them (lanes past them
// take no part).
__device__ __forceinline__ unsigned long long rank_lanes_max(unsigned long long v) {
#pragma unroll
  for (int d = kMaxRanks / 2; d > 0; d >>= 1) {
    const unsigned long long other = __shfl_xor_sync(0xffffffffu, v, d);
    if (other > v) v = other;
  }
  return v;
}

// Warp 0, every lane: lane w < the row's words puts word w of our row (from `sends`) into
// rows[rank] and word w of every peer's row (its LL lines after the digest, `peers` a bit
// each) into rows[peer]; then the warp synchronizes, so every lane sees every row.
// Returns whether this lane's words came from every peer (a peer that never came is
// recorded as late by ll_receive_all). The eager all-to-all-v gathers its rows so too.
__device__ __forceinline__ bool ll_gather_rows(const CollectiveArgs& a, const LLCall& call,
                                               const long long* sends, unsigned peers,
                                               SplitRow* rows) {
  const int lane = threadIdx.x;
  bool came = true;
  if (lane < split_row_words(a.nranks)) {
    rows[a.rank][lane] = split_row_word(a, sends, lane);
    u64 got[kMaxRanks];
    if (peers != 0 && !ll_receive_all(a, call, lane, peers, got)) {
      came = false;
    } else {
#pragma unroll
      for (int r = 0; r < kMaxRanks; ++r)
        if ((peers >> r) & 1u) rows[r][lane] = (long long)got[r];
    }
  }
  __syncwarp();  // the rows, to every lane
  return came;
}

// What warp 0 works out of the split rows for the other threads of its block (shared
// memory): our sends, where each block starts in our input (bytes) and the bytes pushed to
// each peer (0: none), the most lines of any block pushed; every rank's row; where each
// source's block lands in our output, its bytes and the most lines of any; and whether
// every row came and the rows pass the checks. kPayload is the payload bytes of a line:
// 8 for LL lines, 120 for LL128 ones (all_to_all_ll128.cuh), which share this bookkeeping.
struct LLSplitPlan {
  long long sends[kMaxRanks];
  unsigned long long send_from[kMaxRanks], push_bytes[kMaxRanks], push_lines;
  SplitRow rows[kMaxRanks];
  unsigned long long recv_at[kMaxRanks], recv_bytes[kMaxRanks], recv_lines;
  int sound;
};

template <int kPayload>
__device__ __forceinline__ unsigned long long lines_of(unsigned long long nbytes) {
  return (nbytes + kPayload - 1) / kPayload;
}

// Step 0 of the LL all-to-all-vs, by warp 0 (lane r < n holds our input_splits[r] in
// `mine`): check and sum our sends (warp_own_sends), fill the plan's send side (a block
// past `capacity`, or any block where our sends are not sound, is pushed nowhere: the rows
// stop every rank in step 3 before anyone waits for data), and, in block 0, push our row
// to every peer as LL lines 0 .. R - 1 of our LL slot, from registers.
template <int kPayload>
__device__ __forceinline__ void ll_plan_sends(const CollectiveArgs& a, const LLCall& call,
                                              long long mine, unsigned long long capacity,
                                              LLSplitPlan& plan) {
  const int n = a.nranks, me = a.rank, lane = threadIdx.x;
  const unsigned long long itemsize = (unsigned long long)a.itemsize;
  unsigned long long at;
  const bool own_ok = warp_own_sends(a, mine, at);
  unsigned long long lines = 0;
  if (lane < n) {
    const unsigned long long nbytes = (unsigned long long)mine * itemsize;
    // Never past a slot: the rows stop every rank. (Sound sends fit the input, so the
    // product does not overflow.)
    const bool pushed = own_ok && lane != me && nbytes <= capacity;
    plan.sends[lane] = mine;
    plan.send_from[lane] = at * itemsize;
    plan.push_bytes[lane] = pushed ? nbytes : 0;
    lines = pushed ? lines_of<kPayload>(nbytes) : 0;
  }
  lines = rank_lanes_max(lines);
  if (lane == 0) {
    plan.push_lines = lines;
    plan.sound = 1;
  }
  // Our row to every peer (block 0); words past the sends do not read `sends`.
  if (blockIdx.x == 0 && lane < split_row_words(n)) {
    const u64 word = (u64)(lane < n ? mine : split_row_word(a, plan.sends, lane));
    for (int step = 1; step < n; ++step) ll_push_to(a, call, ll_peer_at(a, step), lane, word);
  }
}

// Step 3, by warp 0 after ll_check_digests: every rank's row, the verdict and the receive
// offsets (the blocks land packed in source order). Only on a call that has a problem
// does lane 0 run the serial checks and record the first, `too_large` for a block past
// `capacity`: every rank checks the same rows, so every rank records the same problem.
template <int kPayload>
__device__ __forceinline__ void ll_plan_receives(const CollectiveArgs& a, const LLCall& call,
                                                 unsigned peers, unsigned long long capacity,
                                                 u64 too_large, LLSplitPlan& plan) {
  const int n = a.nranks, me = a.rank, lane = threadIdx.x;
  const unsigned long long itemsize = (unsigned long long)a.itemsize;
  const bool came = ll_gather_rows(a, call, plan.sends, peers, plan.rows);
  unsigned long long lines = 0;
  if (lane < n) {  // where source `lane`'s block lands
    unsigned long long at = 0;
    for (int q = 0; q < lane; ++q) at += (unsigned long long)plan.rows[q][me] * itemsize;
    const unsigned long long nbytes = (unsigned long long)plan.rows[lane][me] * itemsize;
    plan.recv_at[lane] = at;
    plan.recv_bytes[lane] = nbytes;
    lines = lines_of<kPayload>(nbytes);
  }
  lines = rank_lanes_max(lines);
  if (lane == 0) plan.recv_lines = lines;
  const bool bad = split_lane_finds_problem(plan.rows, n, itemsize, capacity, lane, 32);
  if (!__all_sync(0xffffffffu, came)) {
    if (lane == 0) plan.sound = 0;
  } else if (__any_sync(0xffffffffu, bad)) {
    if (lane == 0) {
      const u64 problem = first_ll_split_problem(plan.rows, n, itemsize, capacity, too_large);
      // The verdict is the serial checks': there is a problem to record.
      if (problem) record_split_problem(a, problem, call.epoch);
      plan.sound = 0;
    }
  }
}

// Steps 2 and 3 of the LL all-to-all-vs, after every thread pushed its lines: the digests
// (a disagreeing call stops before any row is read or any byte stored), the plan's
// receive side in warp 0, one barrier, and the verdict in `call`; block 0 fills
// output_splits where the rows pass.
template <int kPayload>
__device__ __forceinline__ void ll_plan_after_push(const CollectiveArgs& a, LLCall& call,
                                                   unsigned peers, unsigned long long capacity,
                                                   u64 too_large, LLSplitPlan& plan) {
  ll_check_digests(a, call);
  IPCSHARE_MARK(2);  // digests checked
  if (!call.failed && threadIdx.x < 32)
    ll_plan_receives<kPayload>(a, call, peers, capacity, too_large, plan);
  __syncthreads();
  IPCSHARE_MARK(3);  // rows read and checked
  if (!plan.sound) call.failed = true;
  if (!call.failed) fill_receive_splits(a, plan.rows);
}

__device__ void all_to_all_v_ll(const CollectiveArgs& a) {
  static_assert(2 * kMaxRanks + 3 <= 32, "a split row's words are lanes of warp 0");
  const int n = a.nranks, me = a.rank, words = split_row_words(n);
  const unsigned long long capacity = all_to_all_v_ll_capacity(a);
  const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  const unsigned long long first = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
  const unsigned peers = ll_peers(a);
  const bool warp0 = threadIdx.x < 32;
  __shared__ LLSplitPlan plan;
  // 0. Our sends, loaded before the call begins, then checked and summed.
  const long long mine = threadIdx.x < n ? own_send_split(a, threadIdx.x) : 0;
  LLCall call = ll_begin(a);
  IPCSHARE_MARK(0);  // begun
  if (warp0) ll_plan_sends<ipcshare::kLinePayload>(a, call, mine, capacity, plan);
  __syncthreads();
  // 1. Our blocks' lines: line j of every peer's block loaded, then pushed.
  for (unsigned long long j = first; j < plan.push_lines; j += stride) {
    u64 line[kMaxRanks];
    unsigned has = 0;  // a bit per step
#pragma unroll
    for (int step = 1; step < kMaxRanks; ++step) {
      if (step >= n) continue;
      const int peer = ll_peer_at(a, step);
      const unsigned long long nbytes = plan.push_bytes[peer];
      if (j >= ipcshare::payload_lines(nbytes)) continue;  // its block has no line j
      const char* block = a.input + plan.send_from[peer];
      line[step] = ipcshare::load_payload(block, j, nbytes,
                                          ((unsigned long long)block & 7ull) == 0);
      has |= 1u << step;
    }
#pragma unroll
    for (int step = 1; step < kMaxRanks; ++step)
      if ((has >> step) & 1u) ll_push_to(a, call, ll_peer_at(a, step), words + j, line[step]);
  }
  IPCSHARE_MARK(1);  // pushed
  // 2, 3. The digests; every rank's row, the verdict and the receive offsets.
  ll_plan_after_push<ipcshare::kLinePayload>(a, call, peers, capacity, kSplitTooLargeForLL,
                                             plan);
  // 4. The blocks: every source's line j at once, then our own.
  const char* own_in = a.input + plan.send_from[me];
  const bool own_in_aligned = ((unsigned long long)own_in & 7ull) == 0;
  for (unsigned long long j = first; !call.failed && j < plan.recv_lines; j += stride) {
    unsigned sources = 0;
#pragma unroll
    for (int r = 0; r < kMaxRanks; ++r)
      if (((peers >> r) & 1u) && j < ipcshare::payload_lines(plan.recv_bytes[r]))
        sources |= 1u << r;
    const unsigned long long own_bytes = plan.recv_bytes[me];
    const bool own_line = j < ipcshare::payload_lines(own_bytes);
    // Our own line is loaded first: its load is in flight while we wait.
    const u64 own = own_line ? ipcshare::load_payload(own_in, j, own_bytes, own_in_aligned) : 0;
    u64 got[kMaxRanks];
    if (sources != 0 && !ll_receive_all(a, call, words + j, sources, got)) {
      call.failed = true;
      break;
    }
#pragma unroll
    for (int r = 0; r < kMaxRanks; ++r) {
      if (!((sources >> r) & 1u)) continue;
      char* block = a.output + plan.recv_at[r];
      ipcshare::store_payload(block, j, plan.recv_bytes[r],
                              ((unsigned long long)block & 7ull) == 0, got[r]);
    }
    if (own_line) {
      char* block = a.output + plan.recv_at[me];
      ipcshare::store_payload(block, j, own_bytes, ((unsigned long long)block & 7ull) == 0, own);
    }
  }
  IPCSHARE_MARK(4);  // received
  ll_end(a, call);
  IPCSHARE_MARK(5);  // ended
}
