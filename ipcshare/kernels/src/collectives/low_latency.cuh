// Low-latency (LL) collectives: in the one-shot ones every rank pushes its input, line by
// line with the call's flag beside the data (ll.cuh), into its own slot of every peer's LL
// buffer, then waits on its own buffer for every peer's lines (the two-shot all-reduce
// makes two such rounds, all_reduce_ll_two_shot), the lines of all peers awaited at once
// (ll_receive_all). One kernel, no barrier, no fence: each line says itself whether it
// has arrived. Line 0 of a slot carries the sender's digest of
// the call, data start at line 1. A rank reads only its own input and its own buffer, so
// an input or output that is the user's memory (or the same array, in place) is safe, and
// nothing waits before returning: the buffer a sender writes next is the other parity's.
#pragma once

#include <ipcshare/ll.cuh>

#include "collectives/call.cuh"
#include "collectives/reduce.cuh"

struct LLCall {
  u64 epoch;
  unsigned flag;
  int parity;
  bool failed;
};

__device__ __forceinline__ char* ll_slot(const CollectiveArgs& a, int owner, int parity,
                                         int source) {
  return a.windows[owner] + a.ll_offset[parity] + (unsigned long long)source * a.ll_slot_bytes;
}

__device__ __forceinline__ LLCall ll_begin(const CollectiveArgs& a) {
  LLCall call;
  call.epoch = ipcshare::begin_epoch(a.pads[a.rank], a.ll_epoch_word);
  call.flag = (unsigned)call.epoch;
  call.parity = (int)(call.epoch & 1);
  call.failed = false;
  // The digest goes out first, with the first thread's data.
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    for (int step = 1; step < a.nranks; ++step) {
      const int peer = (a.rank + step) % a.nranks;
      ipcshare::ll_store(ll_slot(a, peer, call.parity, a.rank), a.digest, call.flag);
    }
  }
  return call;
}

// Push payload line j (0-based, after the digest line) to `peer`.
__device__ __forceinline__ void ll_push_to(const CollectiveArgs& a, const LLCall& call,
                                           int peer, unsigned long long j, u64 data) {
  ipcshare::ll_store(ll_slot(a, peer, call.parity, a.rank) + (j + 1) * ipcshare::kLineBytes,
                     data, call.flag);
}

// The peer a rank reaches at `step` (1 to nranks - 1) of a push to every peer: rank + 1,
// rank + 2, ..., wrapping, so the ranks' first stores land on different GPUs.
__device__ __forceinline__ int ll_peer_at(const CollectiveArgs& a, int step) {
  const int peer = a.rank + step;
  return peer < a.nranks ? peer : peer - a.nranks;
}

// Push line j of block r of `input` (n blocks of `nbytes`) to every peer r, every peer's
// load issued before the first store: ll_store's asm clobbers memory, so a load after it
// is not moved above it, and one peer at a time cost a load's latency per peer (the
// reduce-scatter trailed the all-reduce, which loads one line for all peers). Peers in
// ll_peer_at's order (in the order 0, 1, 2, 3 every rank's first store went to one GPU:
// the 2 MiB reduce-scatter took 18.0 us at 4 ranks against 14.6). Lines are indexed by
// step, not by peer, so they stay in registers.
__device__ __forceinline__ void ll_push_blocks(const CollectiveArgs& a, const LLCall& call,
                                               const char* input, unsigned long long nbytes,
                                               unsigned long long j) {
  u64 line[kMaxRanks];
#pragma unroll
  for (int step = 1; step < kMaxRanks; ++step) {
    if (step >= a.nranks) continue;
    const char* block = input + ll_peer_at(a, step) * nbytes;
    line[step] = ipcshare::load_payload(block, j, nbytes,
                                        ((unsigned long long)block & 7ull) == 0);
  }
#pragma unroll
  for (int step = 1; step < kMaxRanks; ++step)
    if (step < a.nranks) ll_push_to(a, call, ll_peer_at(a, step), j, line[step]);
}

// Push payload line j to every peer.
__device__ __forceinline__ void ll_push(const CollectiveArgs& a, const LLCall& call,
                                        unsigned long long j, u64 data) {
  for (int step = 1; step < a.nranks; ++step)
    ll_push_to(a, call, (a.rank + step) % a.nranks, j, data);
}

// Threads t < nranks of every block wait for rank t's digest line and compare it with
// ours: a rank that makes another call is found here, before anyone waits for lines it
// may never send. Every thread of the block gets the verdict.
__device__ __forceinline__ void ll_check_digests(const CollectiveArgs& a, LLCall& call) {
  __shared__ int failed;
  if (threadIdx.x == 0) failed = 0;
  __syncthreads();
  const int t = threadIdx.x;
  if (t < a.nranks && t != a.rank) {
    u64 digest;
    if (!ipcshare::ll_wait(ll_slot(a, a.rank, call.parity, t), call.flag, digest,
                           a.timeout_ns)) {
      ipcshare::record_timeout(a.pads[a.rank], t, call.epoch);
      atomicOr(&failed, 1);
    } else if (digest != a.digest) {
      record_disagreement(a.pads[a.rank], call.epoch, a.digest, digest, t, a.rank);
      atomicOr(&failed, 1);
    }
  }
  __syncthreads();
  call.failed = failed != 0;
}

// Whether a wait that has polled `round + 1` rounds and still misses `pending` (a bit per
// rank) gives up: every 256 rounds it reads the clock (the first reading starts it, in
// `start`), and past timeout_ns (0: never) it records the lowest missing rank late.
__device__ __forceinline__ bool ll_gave_up(const CollectiveArgs& a, const LLCall& call,
                                           unsigned round, unsigned pending, u64& start) {
  if ((round & 255u) != 255u || a.timeout_ns == 0) return false;
  const u64 now = ipcshare::now_ns();
  if (start == 0) {
    start = now;
    return false;
  }
  if (now - start <= a.timeout_ns) return false;
  ipcshare::record_timeout(a.pads[a.rank], __ffs(pending) - 1, call.epoch);
  return true;
}

// Wait for payload line j from every rank of `sources` (a bit per rank) in our own
// buffer, at once: each round loads the line of every source still missing, so the lines
// of all peers cost one arrival and one load's latency together, where waiting for them
// one source after another cost a load's latency per source. data[r] gets rank r's
// payload. After timeout_ns (0: never) the lowest source still missing is recorded late.
// Called after ll_check_digests: every source makes this call, so its lines will come.
__device__ __forceinline__ bool ll_receive_all(const CollectiveArgs& a, const LLCall& call,
                                               unsigned long long j, unsigned sources,
                                               u64 (&data)[kMaxRanks]) {
  const unsigned long long line = (j + 1) * ipcshare::kLineBytes;
  unsigned pending = sources;
  u64 start = 0;
  for (unsigned round = 0;; ++round) {
    ipcshare::LLLine got[kMaxRanks];
#pragma unroll
    for (int r = 0; r < kMaxRanks; ++r)
      if ((pending >> r) & 1u) got[r] = ipcshare::ll_load(ll_slot(a, a.rank, call.parity, r) + line);
#pragma unroll
    for (int r = 0; r < kMaxRanks; ++r)
      if (((pending >> r) & 1u) && ipcshare::ll_arrived(got[r], call.flag)) {
        data[r] = ipcshare::ll_payload(got[r]);
        pending &= ~(1u << r);
      }
    if (pending == 0) return true;
    if (ll_gave_up(a, call, round, pending, start)) return false;
  }
}

// Every rank but ourselves, a bit each.
__device__ __forceinline__ unsigned ll_peers(const CollectiveArgs& a) {
  return ((1u << a.nranks) - 1u) & ~(1u << a.rank);
}

// Line j of every peer of `sources` (a bit per rank, data[r] from ll_receive_all) into
// block r of `out`, n blocks of `nbytes` (all-gather, all-to-all).
__device__ __forceinline__ void ll_store_blocks(char* out, unsigned long long nbytes,
                                                unsigned long long j, unsigned sources,
                                                const u64 (&data)[kMaxRanks]) {
#pragma unroll
  for (int r = 0; r < kMaxRanks; ++r) {
    if (!((sources >> r) & 1u)) continue;
    char* block = out + r * nbytes;
    ipcshare::store_payload(block, j, nbytes, ((unsigned long long)block & 7ull) == 0, data[r]);
  }
}

// Finish: the last block out publishes the LL call count and, every ll_clean_every calls
// of a parity, first re-flags that parity's whole buffer with this call's flag (every
// block has read what it needed from it, and no sender writes it before our next call
// has begun), so no line ever keeps a flag old enough to come round again.
__device__ __forceinline__ void ll_end(const CollectiveArgs& a, const LLCall& call) {
  u64* own = a.pads[a.rank];
  __shared__ bool last;
  __syncthreads();
  if (threadIdx.x == 0) {
    u64* done = own + a.ll_epoch_word + 1;
    last = gridDim.x == 1 || atomicAdd(done, 1ull) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last) return;
  volatile u64* cleaned = own + a.ll_cleaned_word + call.parity;
  if (a.ll_clean_every != 0 && call.epoch - *cleaned >= a.ll_clean_every) {
    __threadfence();  // the other blocks' reads are over (they counted themselves done)
    const unsigned long long lines = a.nranks * a.ll_slot_bytes / ipcshare::kLineBytes;
    char* buffer = ll_slot(a, a.rank, call.parity, 0);
    for (unsigned long long i = threadIdx.x; i < lines; i += blockDim.x)
      ipcshare::ll_store(buffer + i * ipcshare::kLineBytes, 0, call.flag);
    __syncthreads();
    if (threadIdx.x == 0) *cleaned = call.epoch;
  }
  if (threadIdx.x == 0) {
    *reinterpret_cast<volatile u64*>(own + a.ll_epoch_word + 1) = 0;
    *reinterpret_cast<volatile u64*>(own + a.ll_epoch_word) = call.epoch;
    __threadfence();
  }
}

// For ll_reduce_lines' callers that only store.
struct LLStoreOnly {
  __device__ __forceinline__ void operator()(unsigned long long, u64) const {}
};

// Reduce this thread's lines (first, first + stride, ...) of an `nbytes` run: its own from
// `own` (its input), every peer's from its slot in our buffer, in rank order, into `out`.
// `reduced(j, data)` sees each reduced line before it is stored (the LL two-shot sends it
// on).
template <class T, int OP, class Reduced>
__device__ __forceinline__ void ll_reduce_lines(const CollectiveArgs& a, LLCall& call,
                                                const char* own, char* out,
                                                unsigned long long nbytes,
                                                unsigned long long first,
                                                unsigned long long stride, Reduced reduced) {
  typedef typename T::Bits Bits;
  constexpr int kLanes = ipcshare::kLinePayload / sizeof(Bits);
  union Line { u64 v; Bits lane[kLanes]; };
  const unsigned long long lines = ipcshare::payload_lines(nbytes);
  const bool own_aligned = ((unsigned long long)own & 7ull) == 0;
  const bool out_aligned = ((unsigned long long)out & 7ull) == 0;
  const unsigned peers = ll_peers(a);
  for (unsigned long long j = first; j < lines && !call.failed; j += stride) {
    u64 got[kMaxRanks];
    const u64 mine = ipcshare::load_payload(own, j, nbytes, own_aligned);
    if (!ll_receive_all(a, call, j, peers, got)) {
      call.failed = true;
      break;
    }
    Line in[kMaxRanks];
#pragma unroll
    for (int r = 0; r < kMaxRanks; ++r) in[r].v = r == a.rank ? mine : got[r];
    Line sum;
#pragma unroll
    for (int k = 0; k < kLanes; ++k)
      sum.lane[k] = reduce_ranks<T, OP>([&](int r) { return in[r].lane[k]; }, a.nranks);
    reduced(j, sum.v);
    ipcshare::store_payload(out, j, nbytes, out_aligned, sum.v);
  }
}

// One-shot all-reduce: every rank reduces every rank's lines in rank order (its own from
// its input), so every rank computes the same bits.
template <class T, int OP>
__device__ void all_reduce_ll(const CollectiveArgs& a) {
  const unsigned long long nbytes = a.count * sizeof(typename T::Bits);
  const unsigned long long lines = ipcshare::payload_lines(nbytes);
  const bool in_aligned = ((unsigned long long)a.input & 7ull) == 0;
  const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  const unsigned long long first = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
  LLCall call = ll_begin(a);
  for (unsigned long long j = first; j < lines; j += stride)
    ll_push(a, call, j, ipcshare::load_payload(a.input, j, nbytes, in_aligned));
  ll_check_digests(a, call);
  ll_reduce_lines<T, OP>(a, call, a.input, a.output, nbytes, first, stride, LLStoreOnly());
  ll_end(a, call);
}

// Two-shot all-reduce in one kernel, two LL round trips and no barrier (ll-two-shot).
// The input is cut in the two-shot's chunks (two_shot_chunk: whole 16-byte granules, so a
// chunk is whole lines, and line j of chunk p covers the same bytes of input and output).
// After the digest line, a slot of rank o's buffer holds two regions of `region` lines
// each (a full chunk's, whatever the chunk's own length; gpu_low_latency.py refuses
// inputs whose two regions the slot cannot hold):
//   region 0, phase 1: the sender's input chunk o, which rank o reduces in rank order
//     (its own chunk from its input), pushes on and stores;
//   region 1, phase 2: the sender's reduced chunk, which rank o stores.
// The reduced chunk is computed by its owner alone, so every rank gets the same bits.
//
// Both phases carry the call's flag: their lines differ, so a line of this call's flag
// is the line meant for it. The protocol's argument holds line for line
// (docs/MEMORY-ORDERING.md, "Low-latency protocol"): a sender writes our buffer of parity
// p for call e+2 only after finishing call e+1, whose digest check waited for our digest
// line of e+1, which we write only after our call e is over, both phases included; and
// every line a sender writes us in a call (digest, region 0 lines of our chunk, region 1
// lines of its chunk) is one we wait for in that call, so once our blocks are done no
// store of the call can land after ll_end's re-flagging (after a failed call one may,
// carrying the very flag the re-flagging writes).
//
// In place (output == input): only this rank reads its input. Rank me never pushes its
// own chunk in phase 1; it loads line j of it and stores the reduced line j, the same
// bytes, in that order, in one thread. A line j of chunk p != me is pushed in phase 1 and
// overwritten in phase 2 by the same thread (both loops hand line j to thread j mod
// stride), in program order, the push's load first.
template <class T, int OP>
__device__ void all_reduce_ll_two_shot(const CollectiveArgs& a) {
  using ipcshare::two_shot_chunks::chunk_length;
  const unsigned long long size = sizeof(typename T::Bits);
  const unsigned long long chunk = two_shot_chunk<T>(a);
  const unsigned long long chunk_bytes = chunk * size;
  const unsigned long long region = chunk_bytes / ipcshare::kLinePayload;
  const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  const unsigned long long first = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
  const bool in_aligned = ((unsigned long long)a.input & 7ull) == 0;
  const bool out_aligned = ((unsigned long long)a.output & 7ull) == 0;
  LLCall call = ll_begin(a);
  // Phase 1: chunk p of our input to rank p, into region 0 of our slot there, one peer at
  // a time. Loading every peer's line j before the first push (as ll_push_blocks) won
  // 0.1-0.7 us up to 2 KiB on 4 H200s but lost 0.6-1.0 us from 32 KiB to 2 MiB, and this
  // kernel runs only 128-512 KiB calls at 4 ranks (2026-11-28, docs/BENCHMARKS.md).
  for (int step = 1; step < a.nranks; ++step) {
    const int peer = (a.rank + step) % a.nranks;
    const unsigned long long nbytes = chunk_length(a.count, chunk, peer) * size;
    const unsigned long long lines = ipcshare::payload_lines(nbytes);
    const char* block = a.input + peer * chunk_bytes;
    for (unsigned long long j = first; j < lines; j += stride)
      ll_push_to(a, call, peer, j, ipcshare::load_payload(block, j, nbytes, in_aligned));
  }
  ll_check_digests(a, call);
  // Our chunk, reduced from every rank's lines; each reduced line goes to region 1 of our
  // slot in every peer's buffer before we store it.
  const unsigned long long own_offset = a.rank * chunk_bytes;
  const auto send_on = [&](unsigned long long j, u64 data) { ll_push(a, call, region + j, data); };
  ll_reduce_lines<T, OP>(a, call, a.input + own_offset, a.output + own_offset,
                         chunk_length(a.count, chunk, a.rank) * size, first, stride, send_on);
  // Phase 2: every peer's reduced chunk, from region 1 of its slot in our buffer, line j
  // of every peer at once (a peer whose chunk is shorter sends no line j).
  for (unsigned long long j = first; j < region && !call.failed; j += stride) {
    unsigned sources = 0;
#pragma unroll
    for (int r = 0; r < kMaxRanks; ++r)
      if (r < a.nranks && r != a.rank &&
          j < ipcshare::payload_lines(chunk_length(a.count, chunk, r) * size))
        sources |= 1u << r;
    if (sources == 0) break;  // chunks only shorten with the rank: none has line j
    u64 got[kMaxRanks];
    if (!ll_receive_all(a, call, region + j, sources, got)) {
      call.failed = true;
      break;
    }
#pragma unroll
    for (int r = 0; r < kMaxRanks; ++r)
      if ((sources >> r) & 1u)
        ipcshare::store_payload(a.output + r * chunk_bytes, j,
                                chunk_length(a.count, chunk, r) * size, out_aligned, got[r]);
  }
  ll_end(a, call);
}

// Reduce-scatter: count is the input's elements; rank p gets block p of the reduction.
// Each rank pushes block p of its input to rank p only, and reduces its own block from
// every rank's lines in rank order (its own from its input).
template <class T, int OP>
__device__ void reduce_scatter_ll(const CollectiveArgs& a) {
  const unsigned long long nbytes = a.count / a.nranks * sizeof(typename T::Bits);  // a block
  const unsigned long long lines = ipcshare::payload_lines(nbytes);
  const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  const unsigned long long first = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
  const char* own_block = a.input + a.rank * nbytes;
  LLCall call = ll_begin(a);
  for (unsigned long long j = first; j < lines; j += stride)
    ll_push_blocks(a, call, a.input, nbytes, j);
  ll_check_digests(a, call);
  ll_reduce_lines<T, OP>(a, call, own_block, a.output, nbytes, first, stride, LLStoreOnly());
  ll_end(a, call);
}

// All-gather (bytes): rank r's input goes to block r of every output.
__device__ void all_gather_ll(const CollectiveArgs& a) {
  const unsigned long long nbytes = a.count;
  const unsigned long long lines = ipcshare::payload_lines(nbytes);
  const bool in_aligned = ((unsigned long long)a.input & 7ull) == 0;
  const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  const unsigned long long first = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
  char* own_block = a.output + a.rank * nbytes;
  const bool in_place = own_block == a.input;
  const bool own_aligned = ((unsigned long long)own_block & 7ull) == 0;
  LLCall call = ll_begin(a);
  for (unsigned long long j = first; j < lines; j += stride)
    ll_push(a, call, j, ipcshare::load_payload(a.input, j, nbytes, in_aligned));
  ll_check_digests(a, call);
  // Only a call every rank agreed on gets here with call.failed clear (the digests were
  // checked above), so our own block is stored beside the peers' lines: a call whose
  // ranks disagree writes no output. Its line is loaded before the wait, so the load is
  // in flight while the peers' lines arrive (stored after the loop, it was a load and a
  // store after the last arrival: the all-gather trailed the all-reduce by 0.5-0.9 us at
  // 4 ranks in graphs on 4 H200s, 2026-11-28).
  const unsigned peers = ll_peers(a);
  for (unsigned long long j = first; j < lines && !call.failed; j += stride) {
    const u64 mine = in_place ? 0 : ipcshare::load_payload(a.input, j, nbytes, in_aligned);
    u64 got[kMaxRanks];
    if (!ll_receive_all(a, call, j, peers, got)) {
      call.failed = true;
      break;
    }
    ll_store_blocks(a.output, nbytes, j, peers, got);
    if (!in_place) ipcshare::store_payload(own_block, j, nbytes, own_aligned, mine);
  }
  ll_end(a, call);
}
