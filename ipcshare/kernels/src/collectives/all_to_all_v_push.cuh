// All-to-all-v, push (collectives/algorithms/gpu_all_to_all_push.py, GpuPushAllToAllV): the
// push all-to-all's stores for any splits. Every byte between GPUs is a store into the
// receiver's output where its header says we can reach it (its heap, a registered array),
// else into its inbox (its staging area of the call's parity, laid out as its output),
// from which the receiver copies it out. Nothing is staged and no peer loads anything but
// the words of the meeting. The pull kernels stage a plain input in a pass of its own
// before any peer may load it, and SM loads cross NVLink about 9 % slower than stores
// (tools/probes/links/link_probe.py on 2 H200s, 2026-11-28: 331 against 362 GB/s a direction).
//
// Meeting. A sender must know where its bytes land in each receiver (after what lower
// ranks send it), which only every rank's split row says, and the counts may be known
// only on the GPU. So every block publishes the header, where its output lies and the
// split row, meets the same block of every peer on its words 1, then loads every peer's
// header and row in one pass (one round trip) and checks them as the pull kernel does
// (first_push_split_problem: pull's checks and that a receiver out of reach can take what
// comes in its inbox). A problem stops every rank alike before any byte moves.
//
// Work (all_to_all_v_push_plan.cuh, replayed on numpy by the unit tests): block b of a
// sender cuts part b of the bytes it sends into tiles (push_tile_bytes). Step j: store
// tile j (its own bytes, if any, copied from input to output directly); wait for tile
// j - 1 of part b of every sender whose tile holds bytes for us (words 0, value j) and
// copy those bytes from the inbox where our output is out of reach; signal tile j to
// every peer (push_signal, after the copies: the fence then finds the stores mostly
// landed). A block waits at step j only for tiles j - 1 of the same block of its peers,
// which those blocks store before their own wait at step j - 1, so no wait is circular;
// by bytes, not by peer, a skewed call keeps every block of the hot sender busy.
//
// Safety between calls is push.cuh's: the meeting tells every block that every peer has
// begun this call, and a rank writes a peer's inbox of parity p in call k, which the peer
// read last in call k - 2; a rank's split row and header of parity p alike. No peer reads
// our input or output, so no exit barrier; every byte that lands in us is waited for by
// the block whose tiles hold it, so none is on its way when the call ends. All-to-all-v in
// place is refused on the host.
#pragma once

#include <ipcshare/trace.cuh>
#include <ipcshare/wide_copy.cuh>

#include "collectives/all_to_all.cuh"
#include "collectives/all_to_all_v_push_plan.cuh"
#include "collectives/push.cuh"

static_assert(ipcshare::push_v_plan::kMostTiles == (1ull << kStepBits) - 2,
              "a tile's step must fit the barrier value's step bits");

// The push all-to-all-v's meeting (this rank's split row is published): publish the header
// and where our output lies, meet the same block of every peer on words 1, load every
// rank's header and split row at once, and check them. `places[r]`: byte 0 of rank r's
// output where we reach it, else of its inbox. Returns, the same on every thread, whether
// the block may move bytes; a peer that never came sets call.failed.
__device__ __forceinline__ bool push_v_meet(const CollectiveArgs& a, Call& call,
                                            SplitRow* rows, char** places) {
  const int n = a.nranks, words = split_row_words(n);
  if (threadIdx.x == 0) {
    publish_header(a, call.parity);
    publish_output(a, call.parity);
  }
  const int entered = barrier_slots(a, 1);
  ipcshare::block_signal(a.pads, a.rank, n, entered, barrier_value(call.epoch, 1));
  const bool met = ipcshare::block_wait(a.pads, a.rank, n, entered,
                                        barrier_value(call.epoch, 1), a.timeout_ns,
                                        call.epoch);
  IPCSHARE_MARK(2);  // met
  __shared__ u64 heads[kMaxRanks][kHeaderWords];
  __shared__ int verdict;
  if (met) load_headers_and_rows<kHeaderWords>(a, call.parity, words, heads, rows);
  __syncthreads();
  if (threadIdx.x == 0) {
    verdict = met ? 0 : 1;
    for (int q = 0; q < n && met; ++q) {
      // Every rank that differs is recorded (a refused call's mark, the lowest kept).
      if (heads[q][kHeaderDigest] != a.digest) {
        record_disagreement(a.pads[a.rank], call.epoch, a.digest, heads[q][kHeaderDigest], q,
                            a.rank);
        verdict = 1;
      }
    }
    if (verdict == 0) {
      unsigned reachable = 0;
      for (int r = 0; r < n; ++r)
        if (heads[r][kHeaderOutputFlags] & kFlagZeroCopy) reachable |= 1u << r;
      const u64 capacity = a.staging_offset[1] - a.staging_offset[0];
      const u64 problem =
          first_push_split_problem(rows, n, (u64)a.itemsize, capacity, reachable);
      if (problem) {
        record_split_problem(a, problem, call.epoch);
        verdict = 2;
      }
    }
  }
  __syncthreads();
  call.failed = verdict == 1;
  if (verdict != 0) return false;
  if (threadIdx.x < n) {
    const int r = threadIdx.x;
    const u64 flags = heads[r][kHeaderOutputFlags];
    char* base = a.windows[r] + a.staging_offset[call.parity];
    if (flags & kFlagZeroCopy) {
      base = (flags & kFlagRegistered)
          ? reinterpret_cast<char*>(
                a.registrations[heads[r][kHeaderOutputRegistration] * kMaxRanks + r])
          : a.windows[r];
      base += heads[r][kHeaderOutput];
    }
    places[r] = base;
  }
  fill_receive_splits(a, rows);
  __syncthreads();
  return true;
}

// Wait for tile t of this block's part of every sender whose tile holds bytes for us
// (threads in parallel, a sender each). Returns false on every thread if one never came.
__device__ __forceinline__ bool push_v_wait(const CollectiveArgs& a, const Call& call,
                                            const SplitRow* rows, unsigned long long tile,
                                            unsigned long long t) {
  namespace plan = ipcshare::push_v_plan;
  const int q = threadIdx.x;
  bool came = true;
  if (q < a.nranks && q != a.rank) {
    const plan::Range got = plan::plan_receive(&rows[0][0], kSplitRowStride, a.nranks, a.rank,
                                               q, (u64)a.itemsize, gridDim.x, blockIdx.x,
                                               tile, t);
    u64* own = a.pads[a.rank];
    if (got.begin < got.end &&
        !ipcshare::wait_signal(own + barrier_slots(a, 0) + q, barrier_value(call.epoch, t + 1),
                               a.timeout_ns)) {
      ipcshare::record_timeout(own, q, call.epoch);
      came = false;
    }
  }
  return __syncthreads_and(came) != 0;
}

// The steps after the rows are known (this file's and all_to_all_v_eager.cuh's): step j
// stores tile j of this block's part, store(r, src, dst, nbytes) for each run (bytes
// [src, src + nbytes) of our input to bytes [dst, ...) of rank r's output, r == me our own);
// waits for tile j - 1 of part b of every sender with bytes for us and, where `copy_out`,
// copies them into our output from source(q, at), where sender q's bytes for output byte
// `at` lie; signals tile j.
template <class Store, class Source>
__device__ __forceinline__ void push_v_steps(const CollectiveArgs& a, Call& call,
                                             const SplitRow* rows, u64 tile, bool copy_out,
                                             Store&& store, Source&& source) {
  namespace plan = ipcshare::push_v_plan;
  const int n = a.nranks, me = a.rank;
  const u64 itemsize = (u64)a.itemsize, parts = gridDim.x, part = blockIdx.x;
  const long long* flat = &rows[0][0];
  // Steps: our own tiles, and one past the last tile of any sender's part (its wait).
  u64 own_tiles = 0, steps = 0;
  for (int q = 0; q < n; ++q) {
    const u64 tiles = plan::tiles_of(flat, kSplitRowStride, n, q, itemsize, parts, part, tile);
    if (q == me) own_tiles = tiles;
    if (tiles > steps) steps = tiles;
  }
  for (u64 step = 0; step <= steps && !call.failed; ++step) {
    u64 pushed = 0;
    if (step < own_tiles) {
      plan::plan_push(flat, kSplitRowStride, n, me, itemsize, parts, part, tile, step, store);
      pushed = step + 1;
      if (step == 0) IPCSHARE_MARK(4);  // tile 0 stored
    }
    if (step >= 1) {
      const u64 t = step - 1;
      if (!push_v_wait(a, call, rows, tile, t)) {
        call.failed = true;
        break;
      }
      if (t == 0) IPCSHARE_MARK(6);  // the peers' tile 0 came
      if (copy_out) {
        for (int i = 1; i < n; ++i) {
          const int q = (me + i) % n;
          const plan::Range got = plan::plan_receive(flat, kSplitRowStride, n, me, q,
                                                     itemsize, parts, part, tile, t);
          if (got.begin < got.end)
            ipcshare::block_copy_wide(a.output + got.begin, source(q, got.begin),
                                      got.end - got.begin);
        }
      }
    }
    if (pushed != 0) push_signal(a, call, pushed, 0);
    if (step == 0) IPCSHARE_MARK(5);  // tile 0 signalled
  }
}

// count: the input's elements, itemsize their size (all-to-all-v's arguments).
__device__ void all_to_all_v_push(const CollectiveArgs& a) {
  const int me = a.rank;
  const u64 tile = a.push_tile_bytes != 0 ? a.push_tile_bytes : kPushTileBytes;
  Call call;
  begin_call(a, call);
  IPCSHARE_MARK(0);  // begun
  __shared__ long long sends[kMaxRanks];
  // A bad row is found by every rank in the meeting's checks, which stop all before any
  // byte moves; the counts need no check of their own here.
  read_own_sends<true>(a, sends, nullptr);
  publish_split_row(a, call.parity, sends);
  IPCSHARE_MARK(1);  // row published
  __shared__ SplitRow rows[kMaxRanks];
  __shared__ char* places[kMaxRanks];
  if (push_v_meet(a, call, rows, places)) {
    IPCSHARE_MARK(3);  // rows read and checked
    const char* inbox = a.windows[me] + a.staging_offset[call.parity];
    push_v_steps(a, call, rows, tile, /*copy_out=*/a.output_mapped == 0,
                 [&](int r, u64 src, u64 dst, u64 nbytes) {
                   char* base = r == me ? a.output : places[r];
                   ipcshare::block_copy_wide(base + dst, a.input + src, nbytes);
                 },
                 [&](int, u64 at) { return inbox + at; });
    IPCSHARE_MARK(7);  // every step done
  }
  ipcshare::end_epoch(a.pads[a.rank], a.epoch_word, call.epoch);
  IPCSHARE_MARK(8);  // ended
}
