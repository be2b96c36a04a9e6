// All-to-all and all-to-all-v by 128-byte lines (algo="ll128",
// collectives/algorithms/gpu_ll128.py): the LL all-to-alls of all_to_all_ll.cuh with their
// data in LL128 lines (ll128.cuh, low_latency_128.cuh), which carry 120 bytes in 128 where
// LL lines carry 8 in 16. The wire carries 1.07 times the bytes, so one kernel with no
// barrier stays ahead of the copy kernels to larger calls (LL's doubled bytes lost to them
// above 1-2 MiB a rank).
//
// A call is an LL call: ll_begin counts it and sends the digest line in the LL slot,
// ll_check_digests finds a rank making another call before anyone waits for data, ll_end
// ends it. In rank r's LL128 buffer of the call's parity, source s's slot holds a 128-byte
// head (unused) and then line j of the block s sends r at (j + 1) * 128. A group of eight
// lanes (LL128Group) moves a line: it loads line j of every peer's block (lane k words 2k
// and 2k + 1, lane 7's second replaced by the flag), then stores each to its peer with one
// warp instruction of the eight; after the digests it waits for line j of every source at
// once (ll128_receive_all) and stores each where that source's block lands, our own block
// straight from input to output.
//
// All-to-all-v: the split rows are LL lines, as in all_to_all_v_ll (LL slot, lines
// 0 .. R - 1 after the digest), and the plan of the call is that kernel's (LLSplitPlan,
// ll_plan_sends, ll_plan_receives) with lines of 120 bytes and a slot of
// all_to_all_v_ll128_capacity: a block past it is pushed nowhere and every rank finds it
// in the rows (kSplitTooLargeForLL128). Every line a sender writes us in a call we wait
// for in that call, except the data of a call that a problem stopped, which carry that
// call's flag: 64-bit flags never come round again, so a late one is never taken for a
// later call's (ll128.cuh). The parity argument is ll.cuh's.
//
// In place (the even kernel only; the host refuses it for all-to-all-v): a group stores
// output line j of block s only after it has pushed input line j of block s, and it stores
// the words it loaded; lane 7's second load (the next line's first word) may race with the
// group that owns that line, but its value is replaced by the flag and never stored.
#pragma once

#include <ipcshare/ll128.cuh>
#include <ipcshare/trace.cuh>

#include "collectives/all_to_all_ll.cuh"
#include "collectives/low_latency_128.cuh"

// The most bytes one rank sends another in an LL128 all-to-all-v: a slot's lines after
// its head. gpu_ll128.py's all_to_all_v_ll128_capacity computes the same on the host.
__device__ __forceinline__ unsigned long long all_to_all_v_ll128_capacity(
    const CollectiveArgs& a) {
  const unsigned long long lines = a.ll128_slot_bytes / ipcshare::kLL128LineBytes;
  return lines > 1 ? (lines - 1) * ipcshare::kLL128Payload : 0;
}

// Even all-to-all (bytes): count is the input's bytes, n blocks of count / n.
__device__ void all_to_all_ll128(const CollectiveArgs& a) {
  const int n = a.nranks, me = a.rank;
  const unsigned long long block = a.count / n;
  const unsigned long long lines = ipcshare::ll128_lines(block);
  const LL128Group g = ll128_group();
  LLCall call = ll_begin(a);
  IPCSHARE_MARK(0);  // begun
  for (unsigned long long j = g.first; j < lines; j += g.stride) {
    u64 lo[kMaxRanks], hi[kMaxRanks];
#pragma unroll
    for (int step = 1; step < kMaxRanks; ++step)
      if (step < n)
        ll128_load_line(a.input + ll_peer_at(a, step) * block, j, block, g, call.epoch,
                        lo[step], hi[step]);
    __syncwarp(g.mask);  // one store instruction of the eight lanes a line
#pragma unroll
    for (int step = 1; step < kMaxRanks; ++step)
      if (step < n)
        ipcshare::ll128_store(ll128_line(a, ll_peer_at(a, step), call.parity, me, j), g.k,
                              lo[step], hi[step]);
  }
  IPCSHARE_MARK(1);  // pushed
  ll_check_digests(a, call);
  IPCSHARE_MARK(2);  // digests checked
  const bool in_place = a.output == a.input;
  const char* own_in = a.input + me * block;
  char* own_out = a.output + me * block;
  const unsigned peers = ll_peers(a);
  for (unsigned long long j = g.first; j < lines && !call.failed; j += g.stride) {
    // Our own words are loaded first: their loads are in flight while we wait.
    u64 own_lo = 0, own_hi = 0;
    if (!in_place) ll128_load_line(own_in, j, block, g, 0, own_lo, own_hi);
    u64 lo[kMaxRanks], hi[kMaxRanks];
    if (peers != 0 && !ll128_receive_all(a, call, j, peers, lo, hi)) {
      call.failed = true;
      break;
    }
#pragma unroll
    for (int r = 0; r < kMaxRanks; ++r)
      if ((peers >> r) & 1u) ll128_store_line(a.output + r * block, j, block, g, lo[r], hi[r]);
    if (!in_place) ll128_store_line(own_out, j, block, g, own_lo, own_hi);
  }
  IPCSHARE_MARK(3);  // received
  ll_end(a, call);
  IPCSHARE_MARK(4);  // ended
}

// All-to-all-v (bytes; count and output_count are elements of itemsize): all_to_all_v_ll's
// four steps, the blocks in LL128 lines.
__device__ void all_to_all_v_ll128(const CollectiveArgs& a) {
  static_assert(2 * kMaxRanks + 3 <= 32, "a split row's words are lanes of warp 0");
  const int n = a.nranks, me = a.rank;
  const unsigned long long capacity = all_to_all_v_ll128_capacity(a);
  const LL128Group g = ll128_group();
  const unsigned peers = ll_peers(a);
  const bool warp0 = threadIdx.x < 32;
  __shared__ LLSplitPlan plan;
  // 0. Our sends, loaded before the call begins, then checked and summed; our row out.
  const long long mine = threadIdx.x < n ? own_send_split(a, threadIdx.x) : 0;
  LLCall call = ll_begin(a);
  IPCSHARE_MARK(0);  // begun
  if (warp0) ll_plan_sends<ipcshare::kLL128Payload>(a, call, mine, capacity, plan);
  __syncthreads();
  // 1. Line j of every peer's block that has one, loaded, then pushed. `has` is the same
  // on the group's eight lanes (it depends on j and the plan), so they store together.
  for (unsigned long long j = g.first; j < plan.push_lines; j += g.stride) {
    u64 lo[kMaxRanks], hi[kMaxRanks];
    unsigned has = 0;  // a bit per step
#pragma unroll
    for (int step = 1; step < kMaxRanks; ++step) {
      if (step >= n) continue;
      const int peer = ll_peer_at(a, step);
      const unsigned long long nbytes = plan.push_bytes[peer];
      if (j >= ipcshare::ll128_lines(nbytes)) continue;  // its block has no line j
      ll128_load_line(a.input + plan.send_from[peer], j, nbytes, g, call.epoch, lo[step],
                      hi[step]);
      has |= 1u << step;
    }
    __syncwarp(g.mask);
#pragma unroll
    for (int step = 1; step < kMaxRanks; ++step)
      if ((has >> step) & 1u)
        ipcshare::ll128_store(ll128_line(a, ll_peer_at(a, step), call.parity, me, j), g.k,
                              lo[step], hi[step]);
  }
  IPCSHARE_MARK(1);  // pushed
  // 2, 3. The digests; every rank's row, the verdict and the receive offsets.
  ll_plan_after_push<ipcshare::kLL128Payload>(a, call, peers, capacity, kSplitTooLargeForLL128,
                                              plan);
  // 4. The blocks: line j of every source at once, then our own.
  const char* own_in = a.input + plan.send_from[me];
  const unsigned long long own_bytes = plan.recv_bytes[me];
  for (unsigned long long j = g.first; !call.failed && j < plan.recv_lines; j += g.stride) {
    unsigned sources = 0;
#pragma unroll
    for (int r = 0; r < kMaxRanks; ++r)
      if (((peers >> r) & 1u) && j < ipcshare::ll128_lines(plan.recv_bytes[r]))
        sources |= 1u << r;
    const bool own_line = j < ipcshare::ll128_lines(own_bytes);
    u64 own_lo = 0, own_hi = 0;
    if (own_line) ll128_load_line(own_in, j, own_bytes, g, 0, own_lo, own_hi);
    u64 lo[kMaxRanks], hi[kMaxRanks];
    if (sources != 0 && !ll128_receive_all(a, call, j, sources, lo, hi)) {
      call.failed = true;
      break;
    }
#pragma unroll
    for (int r = 0; r < kMaxRanks; ++r)
      if ((sources >> r) & 1u)
        ll128_store_line(a.output + plan.recv_at[r], j, plan.recv_bytes[r], g, lo[r], hi[r]);
    if (own_line) ll128_store_line(a.output + plan.recv_at[me], j, own_bytes, g, own_lo, own_hi);
  }
  IPCSHARE_MARK(4);  // received
  ll_end(a, call);
  IPCSHARE_MARK(5);  // ended
}
