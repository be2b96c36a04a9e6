// One call of a collective kernel: the block's slice, staging the input, publishing and
// reading the call's headers, and the block barriers (values (epoch << 20) + step) that
// every algorithm of the family meets its peers with.
#pragma once

#include <ipcshare/copy.cuh>
#include <ipcshare/signal.cuh>

#include "collectives/args.cuh"
#include "collectives/split_checks.cuh"
#include "collectives/two_shot_chunks.cuh"

// Elements per 16 bytes: slices start at multiples of it, so vector loads stay aligned.
template <class T>
__device__ __forceinline__ unsigned long long granule() { return 16 / sizeof(typename T::Bits); }

// Block b's slice of [0, n): equal runs of whole granules, the last ones shorter or empty.
struct Slice { unsigned long long begin, end; };
__device__ __forceinline__ Slice block_slice(unsigned long long n, unsigned long long g) {
  const unsigned long long granules = (n + g - 1) / g;
  const unsigned long long per = (granules + gridDim.x - 1) / gridDim.x * g;
  unsigned long long begin = per * blockIdx.x, end = begin + per;
  if (begin > n) begin = n;
  if (end > n) end = n;
  return Slice{begin, end};
}

struct Call {
  const char* sources[kMaxRanks];  // every rank's input, as this block reads it
  bool hold_inputs;                // some rank reads its input in place: end with a barrier
  bool failed;
  u64 epoch;
  int parity;
};

// Header words of calls of `parity` in a pad.
__device__ __forceinline__ u64* header(u64* pad, const CollectiveArgs& a, int parity) {
  return pad + a.header_base + parity * kHeaderWords;
}

// Pad words of this block's barriers: entry (0), middle of two-shot (1), exit (2); the
// push kernels signal their tiles on words 0 and 1.
__device__ __forceinline__ int barrier_slots(const CollectiveArgs& a, int phase) {
  return a.slot_base + (blockIdx.x * 3 + phase) * kMaxRanks;
}

// What a block signals on those words: (epoch << kStepBits) + step. The kernels that meet
// their peers once per call signal step 0; the push kernels signal step t + 1 when tile t
// is done. Every algorithm of the family writes the same words, and these values only
// grow from call to call whichever algorithm made them, so a wait (>=) is never met by a
// signal of an earlier call.
constexpr int kStepBits = 20;
__device__ __forceinline__ u64 barrier_value(u64 epoch, u64 step) {
  return (epoch << kStepBits) + step;
}

// The block barrier of this call on `phase`'s words (a timeout records the call's epoch).
__device__ __forceinline__ bool call_barrier(const CollectiveArgs& a, u64 epoch, int phase) {
  const int slots = barrier_slots(a, phase);
  const u64 value = barrier_value(epoch, 0);
  ipcshare::block_signal(a.pads, a.rank, a.nranks, slots, value);
  return ipcshare::block_wait(a.pads, a.rank, a.nranks, slots, value, a.timeout_ns, epoch);
}

__device__ __forceinline__ void begin_call(const CollectiveArgs& a, Call& call) {
  call.epoch = ipcshare::begin_epoch(a.pads[a.rank], a.epoch_word);
  call.parity = (int)(call.epoch & 1);
  call.failed = false;
  call.hold_inputs = false;
}

// Copy input bytes [first, last) (clipped to `total`) into this call's staging area,
// unless the input is read in place.
__device__ __forceinline__ void stage(const CollectiveArgs& a, const Call& call,
                                      unsigned long long first, unsigned long long last,
                                      unsigned long long total) {
  if (a.zero_copy) return;
  if (last > total) last = total;
  if (first >= last) return;
  char* staging = a.windows[a.rank] + a.staging_offset[call.parity];
  ipcshare::block_copy(staging + first, a.input + first, last - first);
}

// Publish this call's header in our pad: its digest, where our input lies, its flags.
__device__ __forceinline__ void publish_header(const CollectiveArgs& a, int parity) {
  u64* h = header(a.pads[a.rank], a, parity);
  h[kHeaderDigest] = a.digest;
  h[kHeaderInput] = a.zero_copy ? a.input_offset : a.staging_offset[parity];
  h[kHeaderFlags] = a.zero_copy == 2 ? (kFlagZeroCopy | kFlagRegistered)
                    : a.zero_copy   ? kFlagZeroCopy : 0;
  h[kHeaderRegistration] = a.zero_copy == 2 ? a.registration_row : 0;
}

// A call that its rank's own checks refused carries a mark where its digest goes
// (collectives/call_marks.py): kMarkTag in the top 16 bits, the argument's code in bits
// 47..40, the refusing rank in bits 39..32, the collective's code in bits 31..24, bits 23..0
// clear (the error word puts the call's epoch there). A signature's digest has bit 63
// clear, so it is never a mark.
constexpr u64 kMarkTag = 0xFFFDull;
__device__ __forceinline__ bool is_mark(u64 word) { return (word >> 48) == kMarkTag; }
__device__ __forceinline__ u64 mark_rank(u64 mark) { return (mark >> 32) & 0xFF; }

// Whether error word `value` (a mark) replaces `seen`, recorded earlier: a disagreement or a
// splits problem of the same call (a refused call's digest fails every comparison first),
// or the mark of a higher rank, so every rank ends with the lowest refusing rank's mark.
__device__ __forceinline__ bool mark_outranks(u64 value, u64 seen) {
  const bool same_call = (seen & 0xFFFFFFull) == (value & 0xFFFFFFull);
  const u64 code = seen >> 48;
  if (code == (kDisagreement >> 48) || code == (kSplitsProblem >> 48)) return same_call;
  return is_mark(seen) && same_call && mark_rank(value) < mark_rank(seen);
}

// Record in our error word (in `own_pad`) that the ranks' calls of `epoch` differ: ours (rank
// `own_rank`) has digest `own`, rank `peer_rank`'s `peer`. A refused call's mark (ours or the
// peer's) is recorded with the call's epoch in its low 24 bits (mark_outranks says what it
// replaces); otherwise the first error of the call wins, and the call that holds the word
// leaves both digests at kDisagreementDigests (the same values from every block and
// thread of that call, so stores in any order agree).
__device__ __forceinline__ void record_disagreement(u64* own_pad, u64 epoch, u64 own,
                                                    u64 peer, int peer_rank, int own_rank) {
  u64* word = own_pad + ipcshare::kErrorWord;
  if (!is_mark(peer) && !is_mark(own)) {
    const u64 value = kDisagreement | (epoch & 0xFFFFFFFFFFFFull);
    const u64 seen = atomicCAS(word, 0ull, value);
    if (seen == 0 || seen == value) {
      volatile u64* digests = own_pad + kDisagreementDigests;
      digests[peer_rank] = peer;
      digests[own_rank] = own;
    }
    return;
  }
  const u64 mark =
      is_mark(peer) && (!is_mark(own) || mark_rank(peer) < mark_rank(own)) ? peer : own;
  const u64 value = (mark & ~0xFFFFFFull) | (epoch & 0xFFFFFFull);
  u64 seen = atomicCAS(word, 0ull, value);
  while (seen != 0 && seen != value && mark_outranks(value, seen)) {
    const u64 prior = atomicCAS(word, seen, value);
    if (prior == seen) break;
    seen = prior;
  }
}

// After the peers have published (`met`: false if a peer never came): read every rank's
// header, learn where its input lies and whether the ranks agree. Every thread of the
// block gets the same Call.
__device__ __forceinline__ void read_headers(const CollectiveArgs& a, Call& call, bool met) {
  u64* own = a.pads[a.rank];
  __shared__ int failed, hold;
  __shared__ const char* bases[kMaxRanks];
  __shared__ unsigned long long offsets[kMaxRanks];
  if (threadIdx.x == 0) {
    failed = met ? 0 : 1;
    hold = 0;
  }
  __syncthreads();
  if (met && threadIdx.x < a.nranks) {
    const u64* h = header(a.pads[threadIdx.x], a, call.parity);
    const u64 digest = ipcshare::load_acquire(h + kHeaderDigest);
    const u64 flags = h[kHeaderFlags];
    offsets[threadIdx.x] = h[kHeaderInput];
    bases[threadIdx.x] = (flags & kFlagRegistered)
        ? reinterpret_cast<const char*>(
              a.registrations[h[kHeaderRegistration] * kMaxRanks + threadIdx.x])
        : a.windows[threadIdx.x];
    if (flags & kFlagZeroCopy) atomicOr(&hold, 1);
    if (digest != a.digest) {
      record_disagreement(own, call.epoch, a.digest, digest, threadIdx.x, a.rank);
      atomicOr(&failed, 1);
    }
  }
  __syncthreads();
  call.failed = failed != 0;
  call.hold_inputs = hold != 0;
  for (int r = 0; r < a.nranks; ++r) call.sources[r] = bases[r] + offsets[r];
}

// Publish the header, meet the same block of every peer, and read every peer's header.
__device__ __forceinline__ void meet(const CollectiveArgs& a, Call& call) {
  if (threadIdx.x == 0) publish_header(a, call.parity);
  // block_signal fences and syncs the block before any signal leaves: the staged bytes
  // and the header are visible to a peer that has seen our signal.
  const bool met = call_barrier(a, call.epoch, 0);
  read_headers(a, call, met);
}

// Leave: when some input is its owner's own memory, wait until every peer's block has
// read what it needs from ours (the user may overwrite it once the call is done).
__device__ __forceinline__ void leave(const CollectiveArgs& a, const Call& call) {
  if (!call.failed && call.hold_inputs) call_barrier(a, call.epoch, 2);
  ipcshare::end_epoch(a.pads[a.rank], a.epoch_word, call.epoch);
}

// Elements of chunk r of two-shot all-reduces (two_shot_chunks.cuh; the last chunks
// shorter or empty); gpu_copy_engine.py cuts the copies alike.
template <class T>
__device__ __forceinline__ unsigned long long two_shot_chunk(const CollectiveArgs& a) {
  return ipcshare::two_shot_chunks::chunk_elements(a.count, a.nranks,
                                                   sizeof(typename T::Bits));
}
