// All-gather and reduce-scatter by 128-byte lines (algo="ll128",
// collectives/algorithms/gpu_ll128.py): the LL kernels (low_latency.cuh) with lines that
// carry 120 bytes where LL's carry 8 in 16, so the wire carries 1.07 times the input where
// LL carries twice it. A call is an LL call: ll_begin counts it and sends the digest line
// in the LL slot, ll_check_digests finds a rank making another call before anyone waits
// for data, ll_end ends it. The data travel in the LL128 buffers
// (ScratchLayout.ll128_offset; ll128.cuh says why not in the LL ones): in rank r's buffer
// of the call's parity, source s's slot holds a 128-byte head (unused) and then line j of
// what s sends r at (j + 1) * 128.
//
// A group of eight lanes moves one line: lane k loads its words of line j (ll128_words)
// and stores them, the flag in lane 7's second word, into the peer's slot (peers in
// ll_peer_at's order); after the digests every group waits for its line of every peer at
// once (ll128_receive_all) and stores each into the output (all-gather) or reduces them
// with its own in rank order (reduce-scatter). The parity argument is ll.cuh's: a sender
// writes a buffer of parity p in call e + 2 only after its call e + 1, which waited for
// our digest and lines of e + 1, which we send only after our call e is over; every line
// a sender writes us in a call we wait for in that call. In place only this rank reads
// its input, and a group stores the words it loaded and pushed.
#pragma once

#include <ipcshare/ll128.cuh>

#include "collectives/low_latency.cuh"
#include "collectives/reduce.cuh"

__device__ __forceinline__ char* ll128_line(const CollectiveArgs& a, int owner, int parity,
                                            int source, unsigned long long j) {
  return a.windows[owner] + a.ll128_offset[parity] +
         (unsigned long long)source * a.ll128_slot_bytes +
         (j + 1) * (unsigned long long)ipcshare::kLL128LineBytes;
}

// This thread's place among the groups of eight that move a line each: its lane k in the
// group, the payload words it carries, the first line of its group and the stride over
// the grid's groups, and the group's lanes as a warp mask.
struct LL128Group {
  int k;
  int words;
  unsigned long long first;
  unsigned long long stride;
  unsigned mask;
};

__device__ __forceinline__ LL128Group ll128_group() {
  LL128Group g;
  g.k = (int)(threadIdx.x & 7u);
  g.words = ipcshare::ll128_words(g.k);
  g.first = ((unsigned long long)blockIdx.x * blockDim.x + threadIdx.x) / ipcshare::kLL128Lanes;
  g.stride = (unsigned long long)gridDim.x * blockDim.x / ipcshare::kLL128Lanes;
  g.mask = 0xFFu << (threadIdx.x & 24u);
  return g;
}

// Line j from every rank of `sources` (a bit per rank) in our own buffer, all awaited at
// once: each round loads the line of every source still missing (a warp instruction per
// source: the eight lanes of a line load it together), and lane 7's second word says
// whether the line is this call's. Every lane of the group calls it together; lo[r] and
// hi[r] get lane k's words of source r's line. After timeout_ns (0: never) the lowest
// source still missing is recorded late. Called after ll_check_digests.
__device__ __forceinline__ bool ll128_receive_all(const CollectiveArgs& a, const LLCall& call,
                                                  unsigned long long j, unsigned sources,
                                                  u64 (&lo)[kMaxRanks], u64 (&hi)[kMaxRanks]) {
  const unsigned lane = threadIdx.x & 31u;
  const unsigned group_mask = 0xFFu << (lane & ~7u);
  const int k = (int)(lane & 7u);
  unsigned pending = sources;
  u64 start = 0;
  for (unsigned round = 0;; ++round) {
    u64 l[kMaxRanks], h[kMaxRanks];
    // The eight lanes load each line in one instruction: they are converged here.
    __syncwarp(group_mask);
#pragma unroll
    for (int r = 0; r < kMaxRanks; ++r)
      if ((pending >> r) & 1u)
        ipcshare::ll128_load(ll128_line(a, a.rank, call.parity, r, j), k, l[r], h[r]);
#pragma unroll
    for (int r = 0; r < kMaxRanks; ++r) {
      if (!((pending >> r) & 1u)) continue;
      // The flag: lane 7 of this group (width 8: lanes are counted within the group).
      if (__shfl_sync(group_mask, h[r], ipcshare::kLL128Lanes - 1, ipcshare::kLL128Lanes) ==
          call.epoch) {
        lo[r] = l[r];
        hi[r] = h[r];
        pending &= ~(1u << r);
      }
    }
    if (pending == 0) return true;
    if (ll_gave_up(a, call, round, pending, start)) return false;
  }
}

// Lane k's two words of line j of the `nbytes` run at `block`, lane 7's second the flag.
__device__ __forceinline__ void ll128_load_line(const char* block, unsigned long long j,
                                                unsigned long long nbytes, const LL128Group& g,
                                                u64 epoch, u64& lo, u64& hi) {
  const bool aligned = ((unsigned long long)block & 7ull) == 0;
  lo = ipcshare::ll128_load_word(block, j, 2 * g.k, nbytes, aligned);
  const u64 next = ipcshare::ll128_load_word(block, j, 2 * g.k + 1, nbytes, aligned);
  hi = g.words == 2 ? next : epoch;
}

// Lane k's words of line j into the `nbytes` run at `block` (bytes past it not written).
__device__ __forceinline__ void ll128_store_line(char* block, unsigned long long j,
                                                 unsigned long long nbytes, const LL128Group& g,
                                                 u64 lo, u64 hi) {
  const bool aligned = ((unsigned long long)block & 7ull) == 0;
  ipcshare::ll128_store_word(block, j, 2 * g.k, nbytes, aligned, lo);
  if (g.words == 2) ipcshare::ll128_store_word(block, j, 2 * g.k + 1, nbytes, aligned, hi);
}

// Lane k's words of line j to every peer, line `at + j` of our slot there (peers in
// ll_peer_at's order); `hi` is the flag in lane 7. Every lane of the group calls it
// together, so that the line goes out as one store instruction of the eight.
__device__ __forceinline__ void ll128_push_all(const CollectiveArgs& a, const LLCall& call,
                                               const LL128Group& g, unsigned long long line,
                                               u64 lo, u64 hi) {
  __syncwarp(g.mask);
  for (int step = 1; step < a.nranks; ++step)
    ipcshare::ll128_store(ll128_line(a, ll_peer_at(a, step), call.parity, a.rank, line), g.k,
                          lo, hi);
}

// For ll128_reduce_lines' callers that only store.
struct LL128StoreOnly {
  __device__ __forceinline__ void operator()(unsigned long long, u64, u64) const {}
};

// Reduce the group's lines (g.first, g.first + g.stride, ...) of an `nbytes` run, word by
// word in rank order: its own words from `own` (loaded before the wait, so the load is in
// flight while the peers' lines arrive), every peer's from line `at + j` of its slot in our
// buffer, into `out`. 120 and 8 are multiples of every element size, so a word holds whole
// elements and the same ones on every rank: ll and ll128 give the same bits.
// `reduced(j, lo, hi)` gets lane k's reduced words of line j (hi: the flag in lane 7)
// before they are stored, every lane of the group together (the two-shot sends them on).
template <class T, int OP, class Reduced>
__device__ __forceinline__ void ll128_reduce_lines(const CollectiveArgs& a, LLCall& call,
                                                   const LL128Group& g, const char* own,
                                                   char* out, unsigned long long nbytes,
                                                   unsigned long long at, Reduced reduced) {
  typedef typename T::Bits Bits;
  constexpr int kElements = 8 / sizeof(Bits);
  union Word { u64 v; Bits element[kElements]; };
  const unsigned long long lines = ipcshare::ll128_lines(nbytes);
  const bool own_aligned = ((unsigned long long)own & 7ull) == 0;
  const unsigned peers = ll_peers(a);
  const int k = g.k, words = g.words;
  for (unsigned long long j = g.first; j < lines && !call.failed; j += g.stride) {
    u64 mine[2] = {0, 0};
    for (int w = 0; w < words; ++w)
      mine[w] = ipcshare::ll128_load_word(own, j, 2 * k + w, nbytes, own_aligned);
    u64 lo[kMaxRanks], hi[kMaxRanks];
    if (peers != 0 && !ll128_receive_all(a, call, at + j, peers, lo, hi)) {
      call.failed = true;
      break;
    }
    // Lane 7's second word is the flag, never reduced.
    u64 sum_words[2] = {0, call.epoch};
    for (int w = 0; w < words; ++w) {
      Word in[kMaxRanks];
#pragma unroll
      for (int r = 0; r < kMaxRanks; ++r) in[r].v = r == a.rank ? mine[w] : w == 0 ? lo[r] : hi[r];
      Word sum;
#pragma unroll
      for (int e = 0; e < kElements; ++e)
        sum.element[e] = reduce_ranks<T, OP>([&](int r) { return in[r].element[e]; }, a.nranks);
      sum_words[w] = sum.v;
    }
    reduced(j, sum_words[0], sum_words[1]);
    ll128_store_line(out, j, nbytes, g, sum_words[0], sum_words[1]);
  }
}

// All-gather (bytes): rank r's input goes to block r of every output.
__device__ void all_gather_ll128(const CollectiveArgs& a) {
  const unsigned long long nbytes = a.count;
  const unsigned long long lines = ipcshare::ll128_lines(nbytes);
  const LL128Group g = ll128_group();
  char* own_block = a.output + a.rank * nbytes;
  const bool in_place = own_block == a.input;
  const bool in_aligned = ((unsigned long long)a.input & 7ull) == 0;
  LLCall call = ll_begin(a);
  for (unsigned long long j = g.first; j < lines; j += g.stride) {
    // Every lane loads two words (lane 7's second is past the line's payload: zero or
    // the next line's bytes, never past the input) and lane 7 swaps its second for the
    // flag without a branch; then the eight lanes converge, so that each line goes out
    // as one store instruction of the eight, the flag with its data.
    u64 lo, hi;
    ll128_load_line(a.input, j, nbytes, g, call.epoch, lo, hi);
    ll128_push_all(a, call, g, j, lo, hi);
  }
  ll_check_digests(a, call);
  // Only a call every rank agreed on gets here with call.failed clear, so a call whose
  // ranks disagree writes no output. Our own words are loaded before the wait.
  const unsigned peers = ll_peers(a);
  for (unsigned long long j = g.first; j < lines && !call.failed; j += g.stride) {
    // Only the lane's payload words: lane 7's second would hold a register over the wait.
    u64 own[2] = {0, 0};
    if (!in_place)
      for (int w = 0; w < g.words; ++w)
        own[w] = ipcshare::ll128_load_word(a.input, j, 2 * g.k + w, nbytes, in_aligned);
    u64 lo[kMaxRanks], hi[kMaxRanks];
    if (peers != 0 && !ll128_receive_all(a, call, j, peers, lo, hi)) {
      call.failed = true;
      break;
    }
#pragma unroll
    for (int r = 0; r < kMaxRanks; ++r)
      if ((peers >> r) & 1u) ll128_store_line(a.output + r * nbytes, j, nbytes, g, lo[r], hi[r]);
    if (!in_place) ll128_store_line(own_block, j, nbytes, g, own[0], own[1]);
  }
  ll_end(a, call);
}

// Reduce-scatter (reduce_scatter_ll128): count is the input's elements; rank p gets block
// p of the reduction. Each rank pushes block p of its input to rank p alone, as 128-byte
// lines (every peer's line j loaded before the first is stored, as ll_push_blocks does),
// and reduces its own block from every rank's lines in rank order (its own from its
// input, ll128_reduce_lines).
template <class T, int OP>
__device__ void reduce_scatter_ll128(const CollectiveArgs& a) {
  const unsigned long long nbytes = a.count / a.nranks * sizeof(typename T::Bits);  // a block
  const unsigned long long lines = ipcshare::ll128_lines(nbytes);
  const LL128Group g = ll128_group();
  LLCall call = ll_begin(a);
  for (unsigned long long j = g.first; j < lines; j += g.stride) {
    u64 lo[kMaxRanks], hi[kMaxRanks];
#pragma unroll
    for (int step = 1; step < kMaxRanks; ++step)
      if (step < a.nranks)
        ll128_load_line(a.input + ll_peer_at(a, step) * nbytes, j, nbytes, g, call.epoch,
                        lo[step], hi[step]);
    __syncwarp(g.mask);
#pragma unroll
    for (int step = 1; step < kMaxRanks; ++step)
      if (step < a.nranks)
        ipcshare::ll128_store(ll128_line(a, ll_peer_at(a, step), call.parity, a.rank, j), g.k,
                              lo[step], hi[step]);
  }
  ll_check_digests(a, call);
  ll128_reduce_lines<T, OP>(a, call, g, a.input + a.rank * nbytes, a.output, nbytes, 0,
                            LL128StoreOnly());
  ll_end(a, call);
}
