// All-to-all and all-to-all-v, pull (collectives/algorithms/gpu_all_to_all.py): one
// barrier, then every rank reads from every rank's input the part addressed to it.
//
// Slicing. A block does not cut the input in one run, as the other one-barrier kernels
// do, but each segment (the elements rank q sends rank r) alike: block b stages slice b
// of each of its own segments, meets block b of every peer, and reads slice b of each
// segment addressed to it. Both ends cut a segment from its length alone (block_slice),
// so block b's barrier covers exactly what block b then reads, even where the lengths
// differ from rank to rank and call to call (all-to-all-v).
//
// Splits (all-to-all-v). The counts a rank sends come from a device array (read by the
// kernel at run time: a graph replay takes the array's new values) or from the host
// (splits_inline[0]). Every block writes this rank's split row (its sends, the receives
// it expects where the host gave them, and what its arrays hold) into its window's splits
// area of the call's parity before it signals, so each peer reads a whole row after the
// barrier. Every rank then reads every row, with every header, in one pass
// (read_headers_and_rows: one round trip), and checks all of them in one fixed order
// (first_split_problem, split_checks.cuh): every rank finds the same first problem,
// records it in its error word and moves no byte, so synchronize() raises the same error
// on every rank and no rank reads or writes past an array. Where a device array was
// given for the receives, block 0 fills it with the counts that came (no host copy needed
// to size the next step).
//
// In place (all-to-all): block b writes slice b of output segment q only after it has
// staged slice b of input segment q itself, so a staged input may be the output. An
// input read in place by the peers (the heap, a registered array) must not be: the path
// stages it then (aliasing_safe is false). All-to-all-v in place is refused on the host
// (its segments move, so a block would overwrite what another block has not staged).
#pragma once

#include <ipcshare/trace.cuh>

#include "collectives/call.cuh"
#include "collectives/split_checks.cuh"  // the problem codes, first_split_problem

// Words of a rank's split row in the splits area (ScratchLayout.splits_offset).
__device__ __forceinline__ int split_row_words(int n) { return 2 * n + 3; }

// This rank's input_splits (elements per destination), as the block's threads read them.
__device__ __forceinline__ long long own_send_split(const CollectiveArgs& a, int r) {
  if (a.send_splits == nullptr) return a.splits_inline[0][r];
  if (a.send_splits_itemsize == 4)
    return (long long)reinterpret_cast<const volatile int*>(a.send_splits)[r];
  return reinterpret_cast<const volatile long long*>(a.send_splits)[r];
}

// A rank's split row as every rank reads it after the barrier: sends to each rank, then
// the receives it expects, whether it said them, and what its input and output hold.
typedef long long SplitRow[2 * kMaxRanks + 3];
// Words apart of two ranks' rows in a SplitRow array (the plans' `stride`).
constexpr int kSplitRowStride = 2 * kMaxRanks + 3;

// Word w of this rank's split row: sends, expected receives, flag, what the arrays hold.
__device__ __forceinline__ long long split_row_word(const CollectiveArgs& a,
                                                    const long long* sends, int w) {
  const int n = a.nranks;
  if (w < n) return sends[w];
  if (w < 2 * n) return a.expect_receives ? a.splits_inline[1][w - n] : 0;
  if (w == 2 * n) return a.expect_receives;
  if (w == 2 * n + 1) return (long long)a.count;
  return (long long)a.output_count;
}

// Write this rank's split row where peers read it: sends, expected receives, flags and
// what the arrays hold (elements).
__device__ __forceinline__ void publish_split_row(const CollectiveArgs& a, int parity,
                                                  const long long* sends) {
  long long* row = reinterpret_cast<long long*>(a.windows[a.rank] + a.splits_offset[parity]);
  for (int w = threadIdx.x; w < split_row_words(a.nranks); w += blockDim.x)
    row[w] = split_row_word(a, sends, w);
}

// Record a splits problem of the call of `epoch` in this rank's error word (the first
// error of the call wins).
__device__ __forceinline__ void record_split_problem(const CollectiveArgs& a, u64 problem,
                                                     u64 epoch) {
  atomicCAS(a.pads[a.rank] + ipcshare::kErrorWord, 0ull,
            kSplitsProblem | problem | (epoch & 0xFFFFFFull));
}

// This rank's sends into `sends` (elements per destination; all-to-all: count / n bytes
// each) and, where not null, where each segment starts in the input into `send_at`.
// Returns whether they are at least 0 and fit the input: the same on every thread.
template <bool kVariable>
__device__ __forceinline__ bool read_own_sends(const CollectiveArgs& a, long long* sends,
                                               long long* send_at) {
  const int n = a.nranks;
  __shared__ int own_ok;
  if (threadIdx.x < n)
    sends[threadIdx.x] = kVariable ? own_send_split(a, threadIdx.x)
                                   : (long long)(a.count / n);
  __syncthreads();
  if (threadIdx.x == 0) {
    long long at = 0;
    own_ok = 1;
    for (int r = 0; r < n; ++r) {
      if (sends[r] < 0 || (kVariable && (unsigned long long)sends[r] > a.count)) own_ok = 0;
      if (send_at != nullptr) send_at[r] = at;
      at += sends[r] > 0 ? sends[r] : 0;
    }
    if (kVariable && (unsigned long long)at > a.count) own_ok = 0;
  }
  __syncthreads();
  return own_ok != 0;
}

// read_own_sends<true>'s checks and offsets in one warp, with no barrier: called by every
// lane of a warp, lane r < n holding this rank's input_splits[r] in `mine` (own_send_split,
// read by the caller as early as it may). Returns, the same on every lane, whether the
// sends are at least 0 and they and their sum fit the input; `at` gets where lane r's
// block starts in the input (elements). The prefix sum is a shuffle scan over the first
// kMaxRanks lanes, in unsigned arithmetic: the same bits as read_own_sends' serial sum,
// which skips counts below 0 as this does.
__device__ __forceinline__ bool warp_own_sends(const CollectiveArgs& a, long long mine,
                                               unsigned long long& at) {
  const int lane = threadIdx.x & 31;
  const bool here = lane < a.nranks;
  const bool wrong = here && (mine < 0 || (unsigned long long)mine > a.count);
  const unsigned long long own = here && mine > 0 ? (unsigned long long)mine : 0;
  unsigned long long upto = own;  // inclusive
#pragma unroll
  for (int d = 1; d < kMaxRanks; d <<= 1) {
    const unsigned long long below = __shfl_up_sync(0xffffffffu, upto, d);
    if (lane >= d) upto += below;
  }
  at = upto - own;
  // Lanes n..kMaxRanks - 1 add 0: the last of them holds the sum of all n.
  const unsigned long long total = __shfl_sync(0xffffffffu, upto, kMaxRanks - 1);
  return !__any_sync(0xffffffffu, wrong) && total <= a.count;
}

// Block 0 fills the receive_splits device array, where given, with the counts each rank
// sends this one (checked rows).
__device__ __forceinline__ void fill_receive_splits(const CollectiveArgs& a,
                                                    const SplitRow* rows) {
  if (blockIdx.x != 0 || a.receive_splits == nullptr || threadIdx.x >= a.nranks) return;
  const long long got = rows[threadIdx.x][a.rank];
  if (a.receive_splits_itemsize == 4)
    reinterpret_cast<int*>(a.receive_splits)[threadIdx.x] = (int)got;
  else
    reinterpret_cast<long long*>(a.receive_splits)[threadIdx.x] = got;
}

// After the meeting (`met`: false if a peer never came): every rank's header and, for
// all-to-all-v, its split row, loaded in one pass (one round trip; read_headers' acquire
// load and then a pass for the rows took three). The meeting's acquire polls and the block
// barrier after them already order these loads after the peers' stores, so plain volatile
// loads do. Then read_headers' results (where each input lies, whether the ranks agree,
// whether inputs are read in place) and the rows' checks (first_split_problem: the same
// first problem on every rank); all-to-all's rows are every count sends[0]. Block 0 fills
// receive_splits. Returns whether the block may move bytes (the call did not fail and the
// rows pass): the same on every thread of every block.
// Every rank's first kWords header words into heads[q] and the first `words` words of its
// split row into rows[q], in one pass over the block's threads: one round trip. Plain
// volatile loads: call it after a meeting, whose acquire polls and block barrier order
// them after the peers' stores. The caller synchronizes the block before reading them.
template <int kWords>
__device__ __forceinline__ void load_headers_and_rows(const CollectiveArgs& a, int parity,
                                                      int words, u64 (*heads)[kWords],
                                                      SplitRow* rows) {
  const int per = kWords + words;
  for (int i = threadIdx.x; i < a.nranks * per; i += blockDim.x) {
    const int q = i / per, w = i % per;
    if (w < kWords)
      heads[q][w] = reinterpret_cast<const volatile u64*>(header(a.pads[q], a, parity))[w];
    else
      rows[q][w - kWords] = reinterpret_cast<const volatile long long*>(
          a.windows[q] + a.splits_offset[parity])[w - kWords];
  }
}

template <bool kVariable>
__device__ __forceinline__ bool read_headers_and_rows(const CollectiveArgs& a, Call& call,
                                                      bool met, SplitRow* rows,
                                                      const long long* sends) {
  static_assert(kHeaderDigest < 4 && kHeaderInput < 4 && kHeaderFlags < 4 &&
                    kHeaderRegistration < 4,
                "the header words read here are its first four");
  constexpr int kRead = 4;
  const int n = a.nranks;
  __shared__ u64 heads[kMaxRanks][kRead];
  __shared__ int failed, hold, rows_ok;
  if (met)
    load_headers_and_rows<kRead>(a, call.parity, kVariable ? split_row_words(n) : 0, heads,
                                 rows);
  if (!kVariable)
    for (int i = threadIdx.x; i < n * n; i += blockDim.x) rows[i / n][i % n] = sends[0];
  __syncthreads();
  if (threadIdx.x == 0) {
    failed = met ? 0 : 1;
    hold = 0;
    rows_ok = 1;
    for (int q = 0; q < n && met; ++q) {
      if (heads[q][kHeaderFlags] & kFlagZeroCopy) hold = 1;
      // Every rank that differs is recorded: a refused call's mark must reach the
      // error word from every rank that refused (the lowest one's is kept).
      if (heads[q][kHeaderDigest] != a.digest) {
        record_disagreement(a.pads[a.rank], call.epoch, a.digest, heads[q][kHeaderDigest], q,
                            a.rank);
        failed = 1;
      }
    }
    if (kVariable && met) {
      const u64 problem = first_split_problem(rows, n);
      if (problem && !failed) record_split_problem(a, problem, call.epoch);
      rows_ok = problem ? 0 : 1;
    }
  }
  __syncthreads();
  call.failed = failed != 0;
  call.hold_inputs = hold != 0;
  if (met) {
    for (int r = 0; r < n; ++r) {
      const u64 flags = heads[r][kHeaderFlags];
      const char* base = (flags & kFlagRegistered)
          ? reinterpret_cast<const char*>(
                a.registrations[heads[r][kHeaderRegistration] * kMaxRanks + r])
          : a.windows[r];
      call.sources[r] = base + heads[r][kHeaderInput];
    }
  }
  if (call.failed || !rows_ok) return false;
  if (kVariable) fill_receive_splits(a, rows);
  return true;
}

// kVariable: all-to-all-v (count: the input's elements, itemsize: their size); else
// all-to-all (count: the input's bytes, n equal segments).
template <bool kVariable>
__device__ __forceinline__ void all_to_all_pull(const CollectiveArgs& a) {
  const int n = a.nranks;
  const unsigned long long itemsize = kVariable ? (unsigned long long)a.itemsize : 1ull;
  Call call;
  begin_call(a, call);
  IPCSHARE_MARK(0);  // begun
  // This rank's sends, and where each segment starts in its input (elements).
  __shared__ long long sends[kMaxRanks], send_at[kMaxRanks];
  const bool own_ok = read_own_sends<kVariable>(a, sends, send_at);
  const unsigned long long input_bytes = a.count * itemsize;
  if (kVariable) publish_split_row(a, call.parity, sends);
  if (own_ok) {  // a bad row stages nothing: the checks after the barrier stop every rank
    for (int r = 0; r < n; ++r) {
      const unsigned long long first = (unsigned long long)send_at[r] * itemsize;
      const Slice s = block_slice((unsigned long long)sends[r] * itemsize, 16);
      stage(a, call, first + s.begin, first + s.end, input_bytes);
    }
  }
  IPCSHARE_MARK(1);  // staged
  if (threadIdx.x == 0) publish_header(a, call.parity);
  // call_barrier fences and syncs the block before any signal leaves: the staged bytes,
  // the header and the split row are visible to a peer that has seen our signal.
  const bool met = call_barrier(a, call.epoch, 0);
  IPCSHARE_MARK(2);  // met
  // rows[q][r]: the elements rank q sends rank r.
  __shared__ SplitRow rows[kMaxRanks];
  const bool rows_ok = read_headers_and_rows<kVariable>(a, call, met, rows, sends);
  IPCSHARE_MARK(3);  // headers and rows read
  if (rows_ok) {
    // Segments land packed in rank order; rank q's for us starts after what rank q
    // sends lower ranks.
    for (int step = 0; step < n; ++step) {
      const int q = (a.rank + step) % n;  // ranks spread their reads over the peers
      unsigned long long from = 0, place = 0;
      for (int r = 0; r < a.rank; ++r) from += (unsigned long long)rows[q][r];
      for (int p = 0; p < q; ++p) place += (unsigned long long)rows[p][a.rank];
      const unsigned long long nbytes = (unsigned long long)rows[q][a.rank] * itemsize;
      const Slice s = block_slice(nbytes, 16);
      char* dst = a.output + place * itemsize + s.begin;
      const char* src = call.sources[q] + from * itemsize + s.begin;
      if (dst == src) continue;  // our own segment, in place and read in place
      ipcshare::block_copy(dst, src, s.end - s.begin);
    }
  }
  IPCSHARE_MARK(4);  // read
  leave(a, call);
  IPCSHARE_MARK(5);  // ended
}
