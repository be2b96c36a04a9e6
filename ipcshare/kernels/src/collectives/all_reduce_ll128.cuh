// All-reduce by 128-byte lines (collectives/algorithms/gpu_ll128.py): the LL all-reduces
// of low_latency.cuh with low_latency_128.cuh's lines, which carry 120 payload bytes in
// 128 where LL's carry 8 in 16. The call is an LL call (ll_begin, ll_check_digests,
// ll_end) whose data travel in the LL128 buffers; low_latency_128.cuh has the protocol's
// argument, which holds line for line here.
//
// one-shot (algo="ll128"): every rank pushes its whole input to every peer and reduces
// every rank's lines in rank order, its own from its input: the same bits on every rank,
// and ll's. Each rank sends (n - 1) x 1.07 x its input, where ll sends (n - 1) x 2.
//
// two-shot (algo="ll128-two-shot"): the LL two-shot (all_reduce_ll_two_shot) by 128-byte
// lines. The input is cut in the two-shot's chunks (two_shot_chunk: whole 16-byte
// granules); line j of chunk p covers the same bytes of input and output. After the head,
// a slot of rank o's LL128 buffer holds two regions of `region` lines each (a full
// chunk's, whatever the chunk's own length; gpu_ll128.py refuses inputs whose regions the
// slot cannot hold):
//   region 0: the sender's input chunk o, which rank o reduces in rank order (its own
//     chunk from its input), pushes on to every peer and stores;
//   region 1: the sender's reduced chunk, which rank o stores.
// Each rank sends 2 (n - 1) / n x 1.07 x its input, two NVLink trips in one kernel and no
// barrier; the chunk's owner alone reduces it, so every rank gets the one-shot's bits.
// Both regions carry the call's 64-bit count as flag: a line of this call's flag is the
// line meant for it, and every line a sender writes us in a call (region 0 lines of our
// chunk, region 1 lines of its chunk) is one we wait for in that call.
//
// In place (output == input): only this rank reads its input. A group loads and stores the
// words of its own lines alone (both phases hand line j of a chunk to group j mod the
// groups, and lane k to words 2k and 2k + 1): rank me never pushes its own chunk in phase
// 1, and loads line j of it before storing the reduced line j; a line of chunk p != me is
// pushed in phase 1 before the same lanes store its reduced words in phase 2. Lane 7's
// second load of a line (word 15: the next line's first bytes, or zero past the chunk) is
// never used, so another group storing that line meanwhile changes nothing.
#pragma once

#include "collectives/low_latency_128.cuh"

// One-shot all-reduce (algo="ll128").
template <class T, int OP>
__device__ void all_reduce_ll128(const CollectiveArgs& a) {
  const unsigned long long nbytes = a.count * sizeof(typename T::Bits);
  const unsigned long long lines = ipcshare::ll128_lines(nbytes);
  const LL128Group g = ll128_group();
  LLCall call = ll_begin(a);
  for (unsigned long long j = g.first; j < lines; j += g.stride) {
    u64 lo, hi;
    ll128_load_line(a.input, j, nbytes, g, call.epoch, lo, hi);
    ll128_push_all(a, call, g, j, lo, hi);
  }
  ll_check_digests(a, call);
  ll128_reduce_lines<T, OP>(a, call, g, a.input, a.output, nbytes, 0, LL128StoreOnly());
  ll_end(a, call);
}

// Two-shot all-reduce (algo="ll128-two-shot").
template <class T, int OP>
__device__ void all_reduce_ll128_two_shot(const CollectiveArgs& a) {
  using ipcshare::two_shot_chunks::chunk_length;
  const unsigned long long size = sizeof(typename T::Bits);
  const unsigned long long chunk = two_shot_chunk<T>(a);
  const unsigned long long chunk_bytes = chunk * size;
  const unsigned long long region = ipcshare::ll128_lines(chunk_bytes);
  const LL128Group g = ll128_group();
  const bool out_aligned = ((unsigned long long)a.output & 7ull) == 0;
  LLCall call = ll_begin(a);
  // Phase 1: chunk p of our input to rank p, into region 0 of our slot there, one peer at
  // a time (as the LL two-shot, whose phase 1 lost 0.6-1.0 us from 32 KiB to 2 MiB on
  // 4 H200s with every peer's line loaded first).
  for (int step = 1; step < a.nranks; ++step) {
    const int peer = ll_peer_at(a, step);
    const unsigned long long nbytes = chunk_length(a.count, chunk, peer) * size;
    const unsigned long long lines = ipcshare::ll128_lines(nbytes);
    const char* block = a.input + peer * chunk_bytes;
    for (unsigned long long j = g.first; j < lines; j += g.stride) {
      u64 lo, hi;
      ll128_load_line(block, j, nbytes, g, call.epoch, lo, hi);
      __syncwarp(g.mask);  // one store instruction of the eight lanes a line
      ipcshare::ll128_store(ll128_line(a, peer, call.parity, a.rank, j), g.k, lo, hi);
    }
  }
  ll_check_digests(a, call);
  // Our chunk, reduced from every rank's region 0 lines; each reduced line goes to region 1
  // of our slot in every peer's buffer before we store it.
  const unsigned long long own_offset = a.rank * chunk_bytes;
  const auto send_on = [&](unsigned long long j, u64 lo, u64 hi) {
    ll128_push_all(a, call, g, region + j, lo, hi);
  };
  ll128_reduce_lines<T, OP>(a, call, g, a.input + own_offset, a.output + own_offset,
                            chunk_length(a.count, chunk, a.rank) * size, 0, send_on);
  // Phase 2: every peer's reduced chunk from region 1 of its slot in our buffer, line j of
  // every peer at once (a peer whose chunk is shorter sends no line j).
  for (unsigned long long j = g.first; j < region && !call.failed; j += g.stride) {
    unsigned sources = 0;
#pragma unroll
    for (int r = 0; r < kMaxRanks; ++r)
      if (r < a.nranks && r != a.rank &&
          j < ipcshare::ll128_lines(chunk_length(a.count, chunk, r) * size))
        sources |= 1u << r;
    if (sources == 0) break;  // chunks only shorten with the rank: none has line j
    u64 lo[kMaxRanks], hi[kMaxRanks];
    if (!ll128_receive_all(a, call, region + j, sources, lo, hi)) {
      call.failed = true;
      break;
    }
    // The output's alignment once for every chunk (chunks start at multiples of 16
    // bytes), not per block as ll128_store_line finds it: that spilled 76 bytes here.
#pragma unroll
    for (int r = 0; r < kMaxRanks; ++r) {
      if (!((sources >> r) & 1u)) continue;
      char* block = a.output + r * chunk_bytes;
      const unsigned long long nbytes = chunk_length(a.count, chunk, r) * size;
      ipcshare::ll128_store_word(block, j, 2 * g.k, nbytes, out_aligned, lo[r]);
      if (g.words == 2)
        ipcshare::ll128_store_word(block, j, 2 * g.k + 1, nbytes, out_aligned, hi[r]);
    }
  }
  ll_end(a, call);
}
