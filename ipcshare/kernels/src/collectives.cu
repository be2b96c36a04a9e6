// The collectives of ipcshare.collectives on GPU memory: all-gather (pull, ll), all-reduce
// (one-shot, two-shot, push, ll, copy-engine, stepped) and reduce-scatter (one-shot, push,
// ll, stepped) over a communicator's window. The push and ll kernels have sections of
// their own below; what follows describes the others.
//
// One kernel per call, nothing else on the stream: every thread block copies its slice of
// the user's input into this rank's staging area, publishes the call's header in its pad,
// meets the same block of every peer (call_barrier), then reads and reduces its slice
// from every rank. Slices are the same on every rank (the grid and the cut depend on the
// call's signature only), so a block's barrier covers exactly the bytes it then reads and
// no grid-wide barrier is needed. Staging areas and headers alternate with the parity of
// the device-side epoch; a rank can be at most one call ahead of a peer (its next entry
// barrier waits for the peer's next kernel, which starts after the peer's current one has
// finished), so it never overwrites what a peer still reads. Ranks that share a GPU run
// the same collectives as stepped calls instead: two kernels with the stream's own barrier
// between them, so no kernel spins (see "Stepped collectives" below).
//
// Reductions follow ipcshare/collectives/reduction.py bit for bit: float32 additions in
// rank order with IEEE round-to-nearest (inline PTX add.rn.f32: no contraction into FMA
// and no flush of subnormals, whatever the compile options), 16-bit floats converted
// exactly to float32 and rounded once at the end; int32 wraps; max / min are IEEE
// maximum / minimum (-0.0 < +0.0, any NaN gives the canonical quiet NaN).
#include <ipcshare/copy.cuh>
#include <ipcshare/ll.cuh>
#include <ipcshare/signal.cuh>

using ipcshare::u64;
using ipcshare::kMaxRanks;

// Header words of a call, in the caller's own pad (two sets, by parity): the signature's
// digest, where the input lies in the caller's window, flags (window/layout.py).
constexpr int kHeaderDigest = 0;
constexpr int kHeaderInput = 1;
constexpr int kHeaderFlags = 2;
constexpr int kHeaderRegistration = 3;
// Where the output lies, for the push kernels (their peers store results into it): its
// offset, flags (kFlagZeroCopy: our heap; with kFlagRegistered: a registered array; 0: out
// of the peers' reach) and registration row.
constexpr int kHeaderOutput = 4;
constexpr int kHeaderOutputFlags = 5;
constexpr int kHeaderOutputRegistration = 6;
constexpr int kHeaderWords = 7;
constexpr u64 kFlagZeroCopy = 1;
// The input lies in an array the user registered (Communicator.register): kHeaderInput is
// its offset there and kHeaderRegistration the row of the registrations table (the same
// row on every rank: rows are handed out in the collective order of register calls).
constexpr u64 kFlagRegistered = 2;
// A guest's call as its stream describes it (GUEST_* in window/layout.py): the words of
// CollectiveArgs::guest; a place is offset << kGuestOffsetShift | row << kGuestRowShift |
// flags.
constexpr int kGuestDigest = 0;
constexpr int kGuestInput = 1;
constexpr int kGuestOutput = 2;
constexpr int kGuestRowShift = 3;
constexpr int kGuestOffsetShift = 9;
constexpr u64 kGuestRegistered = 1;
constexpr u64 kGuestLeaderStages = 2;
constexpr u64 kGuestImported = 4;
// Error-word code of a call whose ranks disagree (peer field all ones; see gpu_path.py).
constexpr u64 kDisagreement = 0xFFFFull << 48;

struct CollectiveArgs {
  char* windows[kMaxRanks];        // every rank's window, mapped here
  u64* pads[kMaxRanks];            // every rank's signal pad, mapped here
  const char* input;               // this rank's input (the user's array, or in the heap)
  char* output;                    // this rank's output
  unsigned long long count;        // elements of the call's input
  unsigned long long digest;       // of the call's signature
  unsigned long long input_offset; // where the input lies in our window (or registered
                                   // array), if zero_copy
  unsigned long long staging_offset[2];
  unsigned long long result_offset[2];
  u64 timeout_ns;                  // 0: wait forever
  int rank;
  int nranks;
  int zero_copy;                   // peers read the input in place: 1 in our heap,
                                   // 2 in a registered array (row registration_row)
  int slot_base;                   // first pad word of the block barriers
  int header_base;                 // first pad word of the two headers
  int epoch_word;                  // own-pad word counting calls (device-side epoch)
  // Low-latency protocol (ll.cuh): where the buffers of each parity lie in every window
  // (one slot of ll_slot_bytes per source rank), how often the owner re-flags them, the
  // own-pad words counting LL calls (and finished blocks) and recording the call at which
  // each parity was last re-flagged.
  int ll_epoch_word;
  int ll_cleaned_word;
  unsigned long long ll_offset[2];
  unsigned long long ll_slot_bytes;
  unsigned long long ll_clean_every;
  // Registered arrays: row k holds, for every rank r, where rank r's array of the
  // registration in row k is mapped here (kMaxRanks addresses a row).
  const u64* registrations;
  unsigned long long registration_row;
  // Stepped calls on a time-sliced GPU: non-null when the leader of the GPU runs this
  // kernel for `rank`, a guest; the guest's own pad words (kGuest*) say where its input
  // and output lie (resolve_guest).
  const u64* guest;
  // The push kernels' tile (bytes; 0: kPushTileBytes), the same on every rank
  // (gpu_push.py sets it).
  unsigned long long push_tile_bytes;
  // Where the output lies, when peers can reach it (the kHeaderOutput* words): 0 not, 1 in
  // our heap at output_offset, 2 in the registered array of row output_registration_row.
  int output_mapped;
  unsigned long long output_offset;
  unsigned long long output_registration_row;
};

// ---------------------------------------------------------------------------------------
// Element types and reductions.

__device__ __forceinline__ float add_rn(float a, float b) {
  float r;
  asm("add.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

__device__ __forceinline__ float half_to_float(unsigned short h) {
  float f;
  asm("{ .reg .b16 t; mov.b16 t, %1; cvt.f32.f16 %0, t; }" : "=f"(f) : "h"(h));
  return f;
}

__device__ __forceinline__ unsigned short float_to_half(float f) {
  unsigned short h;
  asm("{ .reg .b16 t; cvt.rn.f16.f32 t, %1; mov.b16 %0, t; }" : "=h"(h) : "f"(f));
  return h;
}

__device__ __forceinline__ float bfloat_to_float(unsigned short b) {
  return __uint_as_float(((unsigned int)b) << 16);
}

__device__ __forceinline__ unsigned short float_to_bfloat(float f) {
  // Round to nearest even, overflowing to infinity; a NaN keeps its sign and becomes the
  // quiet NaN 0x7FC0 (as the host reference does).
  const unsigned int bits = __float_as_uint(f);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return (unsigned short)(((bits >> 16) & 0x8000u) | 0x7FC0u);
  return (unsigned short)((bits + ((bits >> 16) & 1u) + 0x7FFFu) >> 16);
}

// Sum: the accumulator is float32 (int for int32); load converts, store rounds once.
struct F32 {
  typedef unsigned int Bits;
  typedef float Acc;
  static __device__ __forceinline__ Acc load(Bits b) { return __uint_as_float(b); }
  static __device__ __forceinline__ Bits store(Acc a) { return __float_as_uint(a); }
  static __device__ __forceinline__ Acc add(Acc a, Acc b) { return add_rn(a, b); }
  static constexpr int kWidth = 32;
  static constexpr unsigned int kMagnitude = 0x7FFFFFFFu, kInfinity = 0x7F800000u;
  static constexpr unsigned int kCanonicalNan = 0x7FC00000u;
  static constexpr bool kFloat = true;
};
struct F16 {
  typedef unsigned short Bits;
  typedef float Acc;
  static __device__ __forceinline__ Acc load(Bits b) { return half_to_float(b); }
  static __device__ __forceinline__ Bits store(Acc a) { return float_to_half(a); }
  static __device__ __forceinline__ Acc add(Acc a, Acc b) { return add_rn(a, b); }
  static constexpr int kWidth = 16;
  static constexpr unsigned int kMagnitude = 0x7FFFu, kInfinity = 0x7C00u;
  static constexpr unsigned int kCanonicalNan = 0x7E00u;
  static constexpr bool kFloat = true;
};
struct BF16 {
  typedef unsigned short Bits;
  typedef float Acc;
  static __device__ __forceinline__ Acc load(Bits b) { return bfloat_to_float(b); }
  static __device__ __forceinline__ Bits store(Acc a) { return float_to_bfloat(a); }
  static __device__ __forceinline__ Acc add(Acc a, Acc b) { return add_rn(a, b); }
  static constexpr int kWidth = 16;
  static constexpr unsigned int kMagnitude = 0x7FFFu, kInfinity = 0x7F80u;
  static constexpr unsigned int kCanonicalNan = 0x7FC0u;
  static constexpr bool kFloat = true;
};
struct I32 {
  typedef unsigned int Bits;
  typedef unsigned int Acc;  // unsigned: wraps modulo 2**32 without undefined behaviour
  static __device__ __forceinline__ Acc load(Bits b) { return b; }
  static __device__ __forceinline__ Bits store(Acc a) { return a; }
  static __device__ __forceinline__ Acc add(Acc a, Acc b) { return a + b; }
  static constexpr int kWidth = 32;
  static constexpr unsigned int kMagnitude = 0, kInfinity = 0, kCanonicalNan = 0;
  static constexpr bool kFloat = false;
};

// An integer that orders like the value (IEEE totalOrder for floats: -0.0 < +0.0): the
// magnitude bits of negative floats flipped, sign-extended from the type's width. Its
// own inverse on the low kWidth bits.
template <class T>
__device__ __forceinline__ int order_key(typename T::Bits bits) {
  if (T::kWidth == 32) {
    const int s = (int)bits;
    return T::kFloat ? (s ^ ((s >> 31) & (int)T::kMagnitude)) : s;
  }
  const int s = (int)(short)bits;
  return s ^ ((s >> 15) & (int)T::kMagnitude);
}

template <class T>
__device__ __forceinline__ bool is_nan(typename T::Bits bits) {
  return T::kFloat && (bits & T::kMagnitude) > T::kInfinity;
}

enum Op { kSum = 0, kMax = 1, kMin = 2 };

// Reduce one element over the ranks, in rank order: load(r) gives rank r's bits.
template <class T, int OP, class Load>
__device__ __forceinline__ typename T::Bits reduce_ranks(Load load, int nranks) {
  typedef typename T::Bits Bits;
  if (OP == kSum) {
    typename T::Acc acc = T::load(load(0));
    for (int r = 1; r < nranks; ++r) acc = T::add(acc, T::load(load(r)));
    return T::store(acc);
  }
  const Bits first = load(0);
  int best = order_key<T>(first);
  bool nan = is_nan<T>(first);
  for (int r = 1; r < nranks; ++r) {
    const Bits bits = load(r);
    const int key = order_key<T>(bits);
    nan |= is_nan<T>(bits);
    best = OP == kMax ? (key > best ? key : best) : (key < best ? key : best);
  }
  if (nan) return (Bits)T::kCanonicalNan;
  return (Bits)order_key<T>((Bits)best);
}

// ---------------------------------------------------------------------------------------
// Slices, copies, headers.

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
      atomicCAS(own + ipcshare::kErrorWord, 0ull,
                kDisagreement | (call.epoch & 0xFFFFFFFFFFFFull));
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

// ---------------------------------------------------------------------------------------
// The collectives.

// Reduce elements [begin, end) of every source into each of the `nouts` outputs (a peer's
// memory too), at [begin, end). Each element is read from every source before it is
// written, so an output may be one of them. 16-byte vectors where every pointer allows it
// (begin is a multiple of a granule): one vector from every rank in flight at once per
// thread.
template <class T, int OP>
__device__ __forceinline__ void reduce_range(char* const* outs, int nouts,
                                             const char* const* sources, int nranks,
                                             unsigned long long begin, unsigned long long end) {
  typedef typename T::Bits Bits;
  constexpr int kLanes = 16 / sizeof(Bits);
  union Vector { uint4 v; Bits lane[kLanes]; };
  unsigned long long aligned = 0;
  for (int o = 0; o < nouts; ++o) aligned |= (unsigned long long)outs[o];
  for (int r = 0; r < nranks; ++r) aligned |= (unsigned long long)sources[r];
  if ((aligned & 15ull) == 0 && begin % kLanes == 0) {
    const unsigned long long vectors = (end - begin) / kLanes, first = begin / kLanes;
    for (unsigned long long v = first + threadIdx.x; v < first + vectors; v += blockDim.x) {
      Vector in[kMaxRanks];
      for (int r = 0; r < nranks; ++r) in[r].v = reinterpret_cast<const uint4*>(sources[r])[v];
      Vector out;
#pragma unroll
      for (int j = 0; j < kLanes; ++j)
        out.lane[j] = reduce_ranks<T, OP>([&](int r) { return in[r].lane[j]; }, nranks);
      for (int o = 0; o < nouts; ++o) reinterpret_cast<uint4*>(outs[o])[v] = out.v;
    }
    begin += vectors * kLanes;
  }
  for (unsigned long long i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const Bits value = reduce_ranks<T, OP>(
        [&](int r) { return reinterpret_cast<const Bits*>(sources[r])[i]; }, nranks);
    for (int o = 0; o < nouts; ++o) reinterpret_cast<Bits*>(outs[o])[i] = value;
  }
}

// The one-barrier collectives in three parts: the block's slice, what the block stages of
// the input, and the block's work once every rank's input is visible. one_kernel runs
// them as one kernel that meets the peers by spinning on flags; the stepped kernels below
// run them on either side of a barrier made by the stream.

// All-reduce, one-shot: every rank reduces every element from every input in rank order.
template <class T, int OP>
struct OneShotAllReduce {
  static constexpr unsigned long long kSize = sizeof(typename T::Bits);
  static __device__ __forceinline__ Slice slice(const CollectiveArgs& a) {
    return block_slice(a.count, granule<T>());
  }
  static __device__ __forceinline__ void stage_slice(const CollectiveArgs& a, const Call& call,
                                                     Slice s) {
    stage(a, call, s.begin * kSize, s.end * kSize, a.count * kSize);
  }
  static __device__ __forceinline__ void work(const CollectiveArgs& a, const Call& call,
                                              Slice s) {
    char* outs[1] = {a.output};
    reduce_range<T, OP>(outs, 1, call.sources, a.nranks, s.begin, s.end);
  }
};

// Reduce-scatter, one-shot: count is the input's elements; rank r's output is block r of
// the reduction, count / nranks elements. Block b handles slice b of every rank's block.
template <class T, int OP>
struct OneShotReduceScatter {
  static constexpr unsigned long long kSize = sizeof(typename T::Bits);
  static __device__ __forceinline__ Slice slice(const CollectiveArgs& a) {
    return block_slice(a.count / a.nranks, granule<T>());
  }
  static __device__ __forceinline__ void stage_slice(const CollectiveArgs& a, const Call& call,
                                                     Slice s) {
    const unsigned long long block = a.count / a.nranks;
    for (int r = 0; r < a.nranks; ++r)
      stage(a, call, (r * block + s.begin) * kSize, (r * block + s.end) * kSize,
            a.count * kSize);
  }
  static __device__ __forceinline__ void work(const CollectiveArgs& a, const Call& call,
                                              Slice s) {
    const unsigned long long offset = a.rank * (a.count / a.nranks) * kSize;
    const char* mine[kMaxRanks];
    for (int r = 0; r < a.nranks; ++r) mine[r] = call.sources[r] + offset;
    char* outs[1] = {a.output};
    reduce_range<T, OP>(outs, 1, mine, a.nranks, s.begin, s.end);
  }
};

// All-gather, pull: rank r's input goes to block r of every output (any dtype: bytes).
// count is the input's bytes.
struct PullAllGather {
  static __device__ __forceinline__ Slice slice(const CollectiveArgs& a) {
    return block_slice(a.count, 16);
  }
  static __device__ __forceinline__ void stage_slice(const CollectiveArgs& a, const Call& call,
                                                     Slice s) {
    stage(a, call, s.begin, s.end, a.count);
  }
  static __device__ __forceinline__ void work(const CollectiveArgs& a, const Call& call,
                                              Slice s) {
    for (int step = 0; step < a.nranks; ++step) {
      const int owner = (a.rank + step) % a.nranks;
      char* dst = a.output + owner * a.count + s.begin;
      if (owner == a.rank && dst == a.input + s.begin) continue;  // in place
      ipcshare::block_copy(dst, call.sources[owner] + s.begin, s.end - s.begin);
    }
  }
};

template <class C>
__device__ __forceinline__ void one_kernel(const CollectiveArgs& a) {
  const Slice s = C::slice(a);
  Call call;
  begin_call(a, call);
  C::stage_slice(a, call, s);
  meet(a, call);
  if (!call.failed) C::work(a, call, s);
  leave(a, call);
}

template <class T, int OP>
__device__ void all_reduce_one_shot(const CollectiveArgs& a) {
  one_kernel<OneShotAllReduce<T, OP> >(a);
}

template <class T, int OP>
__device__ void reduce_scatter_one_shot(const CollectiveArgs& a) {
  one_kernel<OneShotReduceScatter<T, OP> >(a);
}

// Chunk r of two-shot all-reduces: ceil(count / n) elements rounded up to a granule (the
// last chunks shorter or empty); gpu_copy_engine.py cuts the copies alike.
template <class T>
__device__ __forceinline__ unsigned long long two_shot_chunk(const CollectiveArgs& a) {
  const unsigned long long g = granule<T>();
  return ((a.count + a.nranks - 1) / a.nranks + g - 1) / g * g;
}

// Two-shot: chunk r (ceil(count / n) elements, rounded up to a granule; the last chunks
// shorter or empty) is reduced by rank r into its output and its result area; after the
// middle barrier every rank copies every other chunk from its owner's result area. Every
// input is read before the middle barrier, so no exit barrier is needed, and an output
// that is the input itself is safe: chunk r of ours is read by us alone, and chunk q is
// overwritten only after rank q has passed the middle barrier.
template <class T, int OP>
__device__ void all_reduce_two_shot(const CollectiveArgs& a) {
  const unsigned long long g = granule<T>(), size = sizeof(typename T::Bits);
  const unsigned long long chunk = two_shot_chunk<T>(a);
  const Slice s = block_slice(chunk, g);
  Call call;
  begin_call(a, call);
  for (int r = 0; r < a.nranks; ++r)
    stage(a, call, (r * chunk + s.begin) * size, (r * chunk + s.end) * size, a.count * size);
  meet(a, call);
  if (!call.failed) {
    const unsigned long long first = a.rank * chunk + s.begin;
    unsigned long long last = a.rank * chunk + s.end;
    if (last > a.count) last = a.count;
    if (first < last) {
      const char* sources[kMaxRanks];
      for (int r = 0; r < a.nranks; ++r) sources[r] = call.sources[r] + first * size;
      char* result = a.windows[a.rank] + a.result_offset[call.parity] + s.begin * size;
      char* outs[2] = {a.output + first * size, result};
      reduce_range<T, OP>(outs, 2, sources, a.nranks, 0, last - first);
    }
    call.failed = !call_barrier(a, call.epoch, 1);
  }
  if (!call.failed) {
    for (int step = 1; step < a.nranks; ++step) {
      const int owner = (a.rank + step) % a.nranks;
      const unsigned long long first = owner * chunk + s.begin;
      unsigned long long last = owner * chunk + s.end;
      if (last > a.count) last = a.count;
      if (first >= last) continue;
      ipcshare::block_copy(a.output + first * size,
                 a.windows[owner] + a.result_offset[call.parity] + s.begin * size,
                 (last - first) * size);
    }
  }
  call.hold_inputs = false;  // every input was read before the middle barrier
  leave(a, call);
}

// ---------------------------------------------------------------------------------------
// Stepped collectives, for ranks that share a GPU (collectives/algorithms/gpu_stepped.py).
// Without MPS the contexts on one GPU take turns in time slices, so a kernel spinning on a
// peer's flag holds the GPU that the peer needs to raise it: milliseconds per call. A
// stepped call never spins. Its first kernel stages the input and publishes the header;
// the stream then meets the peers with the flag barrier's stream memory operations (the
// GPU's front end waits, and another context may run meanwhile); the second kernel reads
// the headers and does the work; a second flag barrier, on the other set of words, ends
// the call, so no rank returns while a peer may still read its input. Both kernels of a
// call read the same device-side epoch (so the same parity); the second publishes it.

// The row of the registrations table in a guest's place word.
__device__ __forceinline__ u64 guest_row(u64 place) {
  return (place >> kGuestRowShift) & ((1ull << (kGuestOffsetShift - kGuestRowShift)) - 1);
}

// The guest's memory at `place`, as mapped here: an allocation of its own that we imported
// (the word holds our address of it), a registered array's row, or its window.
__device__ __forceinline__ char* guest_place(const CollectiveArgs& a, u64 place) {
  if (place & kGuestImported) return reinterpret_cast<char*>(place >> kGuestOffsetShift);
  char* base = (place & kGuestRegistered)
      ? reinterpret_cast<char*>(a.registrations[guest_row(place) * kMaxRanks + a.rank])
      : a.windows[a.rank];
  return base + (place >> kGuestOffsetShift);
}

// A stepped kernel run by the leader of a time-sliced GPU for a guest rank
// (collectives/time_sliced.py): take the call's digest, input and output from the words
// the guest's stream wrote before it handed the call over, translated into the leader's
// mappings (the guest's window, or a registered array's row). A guest whose call differs
// keeps its own digest and nothing is staged or written: every rank finds the
// disagreement in the headers, as for calls made by the ranks themselves.
__device__ __forceinline__ void resolve_guest(CollectiveArgs& a) {
  if (a.guest == nullptr) return;
  const volatile u64* d = a.guest;
  const u64 digest = d[kGuestDigest], input = d[kGuestInput], output = d[kGuestOutput];
  if (digest != a.digest) {
    a.digest = digest;
    a.zero_copy = 1;
    a.input_offset = 0;
    return;
  }
  a.input = guest_place(a, input);
  if (input & kGuestLeaderStages) {
    a.zero_copy = 0;
  } else {
    a.zero_copy = (input & kGuestRegistered) ? 2 : 1;
    a.input_offset = input >> kGuestOffsetShift;
    a.registration_row = guest_row(input);
  }
  a.output = guest_place(a, output);
}

template <class T>
__device__ void stage_and_publish(CollectiveArgs a) {
  resolve_guest(a);
  const unsigned long long nbytes = a.count * sizeof(typename T::Bits);
  const Slice s = block_slice(nbytes, 16);
  Call call;
  begin_call(a, call);
  stage(a, call, s.begin, s.end, nbytes);
  if (blockIdx.x == 0 && threadIdx.x == 0) publish_header(a, call.parity);
}

template <class C>
__device__ __forceinline__ void after_meet(CollectiveArgs a) {
  resolve_guest(a);
  const Slice s = C::slice(a);
  Call call;
  begin_call(a, call);
  read_headers(a, call, true);
  if (!call.failed) C::work(a, call, s);
  ipcshare::end_epoch(a.pads[a.rank], a.epoch_word, call.epoch);
}

template <class T, int OP>
__device__ void all_reduce_stepped(const CollectiveArgs& a) {
  after_meet<OneShotAllReduce<T, OP> >(a);
}

template <class T, int OP>
__device__ void reduce_scatter_stepped(const CollectiveArgs& a) {
  after_meet<OneShotReduceScatter<T, OP> >(a);
}

// ---------------------------------------------------------------------------------------
// Copy-engine two-shot all-reduce (collectives/algorithms/gpu_copy_engine.py): the bytes
// between GPUs move by copy engine, the reduction is local. The stream runs: publish_call;
// copies of every peer's chunk of our input into slot `rank` of that peer's inbox (its
// staging area of parity 0); a flag barrier; the kernel below, which reduces our chunk
// from our input and the inbox into our output; copies of that chunk into every peer's
// result area (parity 0, at the chunk's place); a flag barrier; local copies of the other
// chunks from our result area into our output. The copies' addresses are fixed when they
// are enqueued, so one set of buffers serves every call (a graph replays the same
// addresses): the second barrier keeps the next call's copies out until every rank has
// read both areas. The first copies have no barrier before them, and the areas they
// write are staging area 0, which a peer's previous call may still read if it was
// another algorithm's call of parity 0 (a one-shot's staged input, a push call's inbox):
// publish_call therefore waits until every peer has finished its previous call.

// Publish the call's header (its digest, for the kernel after the barrier to compare),
// once every peer's epoch word (the calls it has finished, which end_epoch publishes)
// has reached our previous call.
extern "C" __global__ void publish_call(CollectiveArgs a) {
  Call call;
  begin_call(a, call);
  if (blockIdx.x != 0) return;
  if (threadIdx.x == 0) publish_header(a, call.parity);
  const int t = threadIdx.x;
  if (t < a.nranks && t != a.rank &&
      !ipcshare::wait_signal(a.pads[t] + a.epoch_word, call.epoch - 1, a.timeout_ns))
    ipcshare::record_timeout(a.pads[a.rank], t, call.epoch);
}

template <class T, int OP>
__device__ void all_reduce_copy_engine(const CollectiveArgs& a) {
  const unsigned long long size = sizeof(typename T::Bits), chunk = two_shot_chunk<T>(a);
  const Slice s = block_slice(chunk, granule<T>());
  Call call;
  begin_call(a, call);
  read_headers(a, call, true);
  const unsigned long long first = a.rank * chunk + s.begin;
  unsigned long long last = a.rank * chunk + s.end;
  if (last > a.count) last = a.count;
  if (!call.failed && first < last) {
    const char* inbox = a.windows[a.rank] + a.staging_offset[0];
    const char* sources[kMaxRanks];
    for (int r = 0; r < a.nranks; ++r)
      sources[r] = r == a.rank ? a.input + first * size : inbox + (r * chunk + s.begin) * size;
    char* outs[1] = {a.output + first * size};
    reduce_range<T, OP>(outs, 1, sources, a.nranks, 0, last - first);
  }
  ipcshare::end_epoch(a.pads[a.rank], a.epoch_word, call.epoch);
}

// ---------------------------------------------------------------------------------------
// Push collectives (collectives/algorithms/gpu_push.py). Every byte between GPUs is a store
// into a peer's window, never a load from one: NVLink carries the SMs' stores faster than
// their remote loads come back. A block cuts its slice into tiles and signals each tile
// on its own (step t + 1 for tile t, barrier_value). It stores tile t + 1 before it waits
// for tile t, and signals only after reducing tile t, so the fence before the signal finds
// the stores mostly landed (push_signal).
//
// All-reduce (two-shot): rank q owns chunk q (two_shot_chunk). Every rank stores tile t
// of chunk q of its input into its slot of rank q's inbox (q's staging area of the call's
// parity) and signals on the block's words 0; rank q reduces tile t of its chunk from its
// own input and the inbox in rank order, into its output and into every peer's result
// area (parity), and signals on words 1; every rank then copies tile t of the other chunks
// from its result area into its output. Reduce-scatter is the first half: rank q's output
// is the reduction of block q.
//
// Safety. No peer reads our input or output, so the call needs no exit barrier, and in
// place is safe (a tile of our input is stored out by the same block before it writes
// that tile of the output). Where our header says a peer can reach our output (our heap,
// or a registered array), peer q stores its reduced chunk q there itself and we copy
// nothing: it stores tile t only after our signal of tile t in this call, so our stream
// has reached this call, and in place we have stored that tile of our input out by then;
// our own reduction reads only our chunk of the input, which no peer writes.
// A rank writes a peer's areas of parity p in call k; the peer read them last in call
// k - 2. Our call k - 1 heard the peer's call k - 1 in every block
// (whatever the algorithm: every one of the family meets or hears every peer before it
// ends), and the peer's call k - 1 began after its call k - 2 had ended on its stream, so
// those areas are free when call k begins. The result area of a peer is written only
// after its signal of this call's tile, so the same holds for areas of any fixed place
// (the copy-engine all-reduce's). Every block signals and waits for tile 0 even where its
// slice is empty: that is where it compares the peers' digests, so ranks making different
// calls all stop there.

// Bytes per tile where the arguments do not say (gpu_push.py has the measured default).
constexpr unsigned long long kPushTileBytes = 512ull << 10;

// The tiles of a block's slice [s.begin, s.end) of elements: at least one (possibly empty),
// each of `per` elements (a multiple of the granule, so vector loads stay aligned), and
// never so many that a step leaves kStepBits.
struct Tiles {
  unsigned long long begin, end, per, count;
  __device__ __forceinline__ Tiles(Slice s, unsigned long long granule,
                                   unsigned long long itemsize, unsigned long long tile_bytes) {
    begin = s.begin;
    end = s.end;
    per = (tile_bytes != 0 ? tile_bytes : kPushTileBytes) / itemsize / granule * granule;
    if (per == 0) per = granule;
    const unsigned long long most = (1ull << kStepBits) - 2;
    const unsigned long long n = end - begin;
    if ((n + per - 1) / per > most) per = ((n + most - 1) / most + granule - 1) / granule * granule;
    count = n == 0 ? 1 : (n + per - 1) / per;
  }
  // Tile t as [first, last) elements, relative to the chunk (or block).
  __device__ __forceinline__ Slice tile(unsigned long long t) const {
    unsigned long long first = begin + t * per, last = first + per;
    if (first > end) first = end;
    if (last > end) last = end;
    return Slice{first, last};
  }
};

// Wait for tile t's signals on `phase`'s words. At tile 0 it also reads the headers (the
// peers published theirs before their first signal) and compares digests, unless the
// block has done so already (`headers_read`: the all-gather's entry meeting).
__device__ __forceinline__ void push_wait(const CollectiveArgs& a, Call& call, int phase,
                                          unsigned long long t, bool headers_read = false) {
  const bool met = ipcshare::block_wait(a.pads, a.rank, a.nranks, barrier_slots(a, phase),
                                        barrier_value(call.epoch, t + 1), a.timeout_ns,
                                        call.epoch);
  if (phase == 0 && t == 0 && !headers_read) read_headers(a, call, met);
  else call.failed = call.failed || !met;
}

// Tell every peer how many tiles this block has stored into it (`pushed`, on words 0) and
// reduced for it (`reduced`, on words 1); 0 leaves a word as it is. One fence covers both,
// and it comes after the block's reduction work, so the stores it waits for have had that
// long to land (a fence right after the stores waited for every one of them: tiles of
// 8 KiB took 2.5 times as long as tiles of 32 KiB on one H100).
__device__ __forceinline__ void push_signal(const CollectiveArgs& a, const Call& call,
                                            unsigned long long pushed,
                                            unsigned long long reduced) {
  __syncthreads();
  const int t = threadIdx.x;
  if (t >= a.nranks || t == a.rank) return;
  __threadfence_system();
  if (pushed != 0)
    ipcshare::put_signal(a.pads[t] + barrier_slots(a, 0) + a.rank,
                         barrier_value(call.epoch, pushed));
  if (reduced != 0)
    ipcshare::put_signal(a.pads[t] + barrier_slots(a, 1) + a.rank,
                         barrier_value(call.epoch, reduced));
}

// Store tile `tile` of run q of our input (runs of `run` elements, the last ones clipped
// to `count`) into our slot of rank q's inbox, whose slots are `slot_stride` elements apart.
template <class T>
__device__ __forceinline__ void push_to_inbox(const CollectiveArgs& a, const Call& call, int q,
                                              unsigned long long run,
                                              unsigned long long slot_stride, Slice tile,
                                              unsigned long long count) {
  const unsigned long long size = sizeof(typename T::Bits);
  const unsigned long long first = q * run + tile.begin;
  unsigned long long last = q * run + tile.end;
  if (last > count) last = count;
  if (first >= last) return;
  char* inbox = a.windows[q] + a.staging_offset[call.parity];
  char* slot = inbox + (a.rank * slot_stride + tile.begin) * size;
  ipcshare::block_fanout(&slot, 1, a.input + first * size, (last - first) * size);
}

// Publish where our output lies (the kHeaderOutput* words of this call's header).
__device__ __forceinline__ void publish_output(const CollectiveArgs& a, int parity) {
  u64* h = header(a.pads[a.rank], a, parity);
  h[kHeaderOutput] = a.output_offset;
  h[kHeaderOutputFlags] = a.output_mapped == 2 ? (kFlagZeroCopy | kFlagRegistered)
                          : a.output_mapped   ? kFlagZeroCopy : 0;
  h[kHeaderOutputRegistration] = a.output_registration_row;
}

// After the first wait (the peers' headers are published): where to store into each
// peer, as a pointer to byte 0 of its output when the peer's output is within our reach
// (its heap or a registered array), else to byte 0 of its area at `fallback_offset` of its
// window (the all-reduce's result area, the all-gather's inbox). Every thread of the
// block gets the same places.
__device__ __forceinline__ void result_places(const CollectiveArgs& a, const Call& call,
                                              unsigned long long fallback_offset,
                                              char** places) {
  if (threadIdx.x < a.nranks) {
    const int r = threadIdx.x;
    const u64* h = header(a.pads[r], a, call.parity);
    const u64 flags = h[kHeaderOutputFlags];
    char* base = a.windows[r] + fallback_offset;
    if (flags & kFlagZeroCopy) {
      base = (flags & kFlagRegistered)
          ? reinterpret_cast<char*>(a.registrations[h[kHeaderOutputRegistration] * kMaxRanks + r])
          : a.windows[r];
      base += h[kHeaderOutput];
    }
    places[r] = base;
  }
  __syncthreads();
}

template <class T, int OP>
__device__ void all_reduce_push(const CollectiveArgs& a) {
  const unsigned long long size = sizeof(typename T::Bits), g = granule<T>();
  const unsigned long long chunk = two_shot_chunk<T>(a);
  const Tiles tiles(block_slice(chunk, g), g, size, a.push_tile_bytes);
  Call call;
  begin_call(a, call);
  if (threadIdx.x == 0) {
    publish_header(a, call.parity);
    publish_output(a, call.parity);
  }
  const char* inbox = a.windows[a.rank] + a.staging_offset[call.parity];
  const char* results = a.windows[a.rank] + a.result_offset[call.parity];
  __shared__ char* places[kMaxRanks];
  // Step j: store tile j; wait for the peers' tile j - 1, reduce it and store the result;
  // signal both; wait for the peers' results of tile j - 2 and copy them (unless they
  // stored them into our output itself). Each wait is for a signal a peer sends at the end
  // of its step j - 1.
  for (unsigned long long step = 0; step < tiles.count + 2 && !call.failed; ++step) {
    unsigned long long pushed = 0, reduced = 0;
    if (step < tiles.count) {
      const Slice tile = tiles.tile(step);
      for (int i = 1; i < a.nranks; ++i)
        push_to_inbox<T>(a, call, (a.rank + i) % a.nranks, chunk, chunk, tile, a.count);
      pushed = step + 1;
    }
    if (step >= 1 && step <= tiles.count) {
      const unsigned long long t = step - 1;
      push_wait(a, call, 0, t);
      if (call.failed) break;
      if (t == 0) result_places(a, call, a.result_offset[call.parity], places);
      const Slice tile = tiles.tile(t);
      const unsigned long long first = a.rank * chunk + tile.begin;
      unsigned long long last = a.rank * chunk + tile.end;
      if (last > a.count) last = a.count;
      if (first < last) {
        const char* sources[kMaxRanks];
        char* outs[kMaxRanks];
        int nouts = 0;
        outs[nouts++] = a.output + first * size;
        for (int r = 0; r < a.nranks; ++r) {
          sources[r] = r == a.rank ? a.input + first * size
                                   : inbox + (r * chunk + tile.begin) * size;
          if (r != a.rank) outs[nouts++] = places[r] + first * size;
        }
        reduce_range<T, OP>(outs, nouts, sources, a.nranks, 0, last - first);
      }
      reduced = t + 1;
    }
    if (pushed != 0 || reduced != 0) push_signal(a, call, pushed, reduced);
    if (step >= 2) {
      const unsigned long long t = step - 2;
      push_wait(a, call, 1, t);
      if (call.failed) break;
      if (a.output_mapped != 0) continue;  // the peers stored their chunks in place
      const Slice tile = tiles.tile(t);
      for (int i = 1; i < a.nranks; ++i) {
        const int owner = (a.rank + i) % a.nranks;
        const unsigned long long first = owner * chunk + tile.begin;
        unsigned long long last = owner * chunk + tile.end;
        if (last > a.count) last = a.count;
        if (first < last)
          ipcshare::block_copy(a.output + first * size, results + first * size,
                               (last - first) * size);
      }
    }
  }
  ipcshare::end_epoch(a.pads[a.rank], a.epoch_word, call.epoch);
}

// Reduce-scatter: count is the input's elements; rank q's output is the reduction of
// block q (count / n elements). Inbox slots are a block rounded up to a granule apart, so
// every slot starts 16-byte aligned.
template <class T, int OP>
__device__ void reduce_scatter_push(const CollectiveArgs& a) {
  const unsigned long long size = sizeof(typename T::Bits), g = granule<T>();
  const unsigned long long block = a.count / a.nranks;
  const unsigned long long stride = (block + g - 1) / g * g;
  const Tiles tiles(block_slice(block, g), g, size, a.push_tile_bytes);
  Call call;
  begin_call(a, call);
  if (threadIdx.x == 0) publish_header(a, call.parity);
  const char* inbox = a.windows[a.rank] + a.staging_offset[call.parity];
  // Step j: store tile j of every peer's block; wait for the peers' tile j - 1 and reduce
  // it; signal tile j.
  for (unsigned long long step = 0; step < tiles.count + 1 && !call.failed; ++step) {
    unsigned long long pushed = 0;
    if (step < tiles.count) {
      const Slice tile = tiles.tile(step);
      for (int i = 1; i < a.nranks; ++i)
        push_to_inbox<T>(a, call, (a.rank + i) % a.nranks, block, stride, tile,
                         block * a.nranks);
      pushed = step + 1;
    }
    if (step >= 1) {
      const unsigned long long t = step - 1;
      push_wait(a, call, 0, t);
      if (call.failed) break;
      const Slice tile = tiles.tile(t);
      if (tile.begin < tile.end) {
        const char* sources[kMaxRanks];
        for (int r = 0; r < a.nranks; ++r)
          sources[r] = r == a.rank ? a.input + (a.rank * block + tile.begin) * size
                                   : inbox + (r * stride + tile.begin) * size;
        char* outs[1] = {a.output + tile.begin * size};
        reduce_range<T, OP>(outs, 1, sources, a.nranks, 0, tile.end - tile.begin);
      }
    }
    if (pushed != 0) push_signal(a, call, pushed, 0);
  }
  ipcshare::end_epoch(a.pads[a.rank], a.epoch_word, call.epoch);
}

// All-gather (bytes; count is the input's): rank r's input goes to block r of every
// output. A peer's output place is needed before the first store, so the blocks first
// meet once on their words 1 (each publishes its header, then learns the peers'); then
// tile j of the input goes, loaded once, to every peer's output where reachable, else to
// slot r of its inbox (staging area of the parity, slots `count` bytes apart), and to our
// own block unless in place; a rank whose output is out of reach copies each peer's tile
// from its inbox once that peer has signalled it.
__device__ void all_gather_push(const CollectiveArgs& a) {
  const unsigned long long nbytes = a.count;
  const Tiles tiles(block_slice(nbytes, 16), 16, 1, a.push_tile_bytes);
  Call call;
  begin_call(a, call);
  if (threadIdx.x == 0) {
    publish_header(a, call.parity);
    publish_output(a, call.parity);
  }
  const int entered = barrier_slots(a, 1);
  ipcshare::block_signal(a.pads, a.rank, a.nranks, entered, barrier_value(call.epoch, 1));
  read_headers(a, call, ipcshare::block_wait(a.pads, a.rank, a.nranks, entered,
                                             barrier_value(call.epoch, 1), a.timeout_ns,
                                             call.epoch));
  __shared__ char* places[kMaxRanks];
  if (!call.failed) result_places(a, call, a.staging_offset[call.parity], places);
  char* own_block = a.output + a.rank * nbytes;
  const char* inbox = a.windows[a.rank] + a.staging_offset[call.parity];
  // Step j: store tile j everywhere; wait for the peers' tile j - 1 and copy it from the
  // inbox if they could not reach our output; signal tile j.
  for (unsigned long long step = 0; step < tiles.count + 1 && !call.failed; ++step) {
    unsigned long long pushed = 0;
    if (step < tiles.count) {
      const Slice tile = tiles.tile(step);
      char* dsts[kMaxRanks];
      int ndst = 0;
      for (int i = 1; i < a.nranks; ++i)
        dsts[ndst++] = places[(a.rank + i) % a.nranks] + a.rank * nbytes + tile.begin;
      if (own_block != a.input) dsts[ndst++] = own_block + tile.begin;
      ipcshare::block_fanout(dsts, ndst, a.input + tile.begin, tile.end - tile.begin);
      pushed = step + 1;
    }
    if (step >= 1) {
      const unsigned long long t = step - 1;
      push_wait(a, call, 0, t, /*headers_read=*/true);
      if (call.failed) break;
      if (a.output_mapped == 0) {
        const Slice tile = tiles.tile(t);
        for (int i = 1; i < a.nranks; ++i) {
          const int source = (a.rank + i) % a.nranks;
          ipcshare::block_copy(a.output + source * nbytes + tile.begin,
                               inbox + source * nbytes + tile.begin, tile.end - tile.begin);
        }
      }
    }
    if (pushed != 0) push_signal(a, call, pushed, 0);
  }
  ipcshare::end_epoch(a.pads[a.rank], a.epoch_word, call.epoch);
}

// ---------------------------------------------------------------------------------------
// Low-latency (LL) one-shot collectives: every rank pushes its input, line by line with the
// call's flag beside the data (ll.cuh), into its own slot of every peer's LL buffer, then
// waits on its own buffer for every peer's lines. One kernel, no barrier, no fence: each
// line says itself whether it has arrived. Line 0 of a slot carries the sender's digest of
// the call, data start at line 1. A rank reads only its own input and its own buffer, so
// an input or output that is the user's memory (or the same array, in place) is safe, and
// nothing waits before returning: the buffer a sender writes next is the other parity's.

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
      atomicCAS(a.pads[a.rank] + ipcshare::kErrorWord, 0ull,
                kDisagreement | (call.epoch & 0xFFFFFFFFFFFFull));
      atomicOr(&failed, 1);
    }
  }
  __syncthreads();
  call.failed = failed != 0;
}

// Wait for payload line j from `source` in our own buffer.
__device__ __forceinline__ bool ll_receive(const CollectiveArgs& a, const LLCall& call,
                                           int source, unsigned long long j, u64& data) {
  const char* line = ll_slot(a, a.rank, call.parity, source) + (j + 1) * ipcshare::kLineBytes;
  if (ipcshare::ll_wait(line, call.flag, data, a.timeout_ns)) return true;
  ipcshare::record_timeout(a.pads[a.rank], source, call.epoch);
  return false;
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

// Reduce this thread's lines (first, first + stride, ...) of an `nbytes` run: its own from
// `own` (its input), every peer's from its slot in our buffer, in rank order, into the
// output.
template <class T, int OP>
__device__ __forceinline__ void ll_reduce_lines(const CollectiveArgs& a, LLCall& call,
                                                const char* own, unsigned long long nbytes,
                                                unsigned long long first,
                                                unsigned long long stride) {
  typedef typename T::Bits Bits;
  constexpr int kLanes = ipcshare::kLinePayload / sizeof(Bits);
  union Line { u64 v; Bits lane[kLanes]; };
  const unsigned long long lines = (nbytes + ipcshare::kLinePayload - 1) / ipcshare::kLinePayload;
  const bool own_aligned = ((unsigned long long)own & 7ull) == 0;
  const bool out_aligned = ((unsigned long long)a.output & 7ull) == 0;
  for (unsigned long long j = first; j < lines && !call.failed; j += stride) {
    Line in[kMaxRanks];
    for (int r = 0; r < a.nranks; ++r) {
      if (r == a.rank) {
        in[r].v = ipcshare::load_payload(own, j, nbytes, own_aligned);
      } else if (!ll_receive(a, call, r, j, in[r].v)) {
        call.failed = true;
        break;
      }
    }
    if (call.failed) break;
    Line out;
#pragma unroll
    for (int k = 0; k < kLanes; ++k)
      out.lane[k] = reduce_ranks<T, OP>([&](int r) { return in[r].lane[k]; }, a.nranks);
    ipcshare::store_payload(a.output, j, nbytes, out_aligned, out.v);
  }
}

// One-shot all-reduce: every rank reduces every rank's lines in rank order (its own from
// its input), so every rank computes the same bits.
template <class T, int OP>
__device__ void all_reduce_ll(const CollectiveArgs& a) {
  const unsigned long long nbytes = a.count * sizeof(typename T::Bits);
  const unsigned long long lines = (nbytes + ipcshare::kLinePayload - 1) / ipcshare::kLinePayload;
  const bool in_aligned = ((unsigned long long)a.input & 7ull) == 0;
  const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  const unsigned long long first = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
  LLCall call = ll_begin(a);
  for (unsigned long long j = first; j < lines; j += stride)
    ll_push(a, call, j, ipcshare::load_payload(a.input, j, nbytes, in_aligned));
  ll_check_digests(a, call);
  ll_reduce_lines<T, OP>(a, call, a.input, nbytes, first, stride);
  ll_end(a, call);
}

// Reduce-scatter: count is the input's elements; rank p gets block p of the reduction.
// Each rank pushes block p of its input to rank p only, and reduces its own block from
// every rank's lines in rank order (its own from its input).
template <class T, int OP>
__device__ void reduce_scatter_ll(const CollectiveArgs& a) {
  const unsigned long long nbytes = a.count / a.nranks * sizeof(typename T::Bits);  // a block
  const unsigned long long lines = (nbytes + ipcshare::kLinePayload - 1) / ipcshare::kLinePayload;
  const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  const unsigned long long first = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
  const char* own_block = a.input + a.rank * nbytes;
  LLCall call = ll_begin(a);
  for (int step = 1; step < a.nranks; ++step) {
    const int peer = (a.rank + step) % a.nranks;
    const char* block = a.input + peer * nbytes;
    const bool aligned = ((unsigned long long)block & 7ull) == 0;
    for (unsigned long long j = first; j < lines; j += stride)
      ll_push_to(a, call, peer, j, ipcshare::load_payload(block, j, nbytes, aligned));
  }
  ll_check_digests(a, call);
  ll_reduce_lines<T, OP>(a, call, own_block, nbytes, first, stride);
  ll_end(a, call);
}

// All-gather (bytes): rank r's input goes to block r of every output.
__device__ void all_gather_ll(const CollectiveArgs& a) {
  const unsigned long long nbytes = a.count;
  const unsigned long long lines = (nbytes + ipcshare::kLinePayload - 1) / ipcshare::kLinePayload;
  const bool in_aligned = ((unsigned long long)a.input & 7ull) == 0;
  const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  const unsigned long long first = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
  char* own_block = a.output + a.rank * nbytes;
  const bool in_place = own_block == a.input;
  const bool own_aligned = ((unsigned long long)own_block & 7ull) == 0;
  LLCall call = ll_begin(a);
  for (unsigned long long j = first; j < lines; j += stride) {
    const u64 data = ipcshare::load_payload(a.input, j, nbytes, in_aligned);
    ll_push(a, call, j, data);
    if (!in_place) ipcshare::store_payload(own_block, j, nbytes, own_aligned, data);
  }
  ll_check_digests(a, call);
  for (int step = 1; step < a.nranks && !call.failed; ++step) {
    const int source = (a.rank + step) % a.nranks;
    char* block = a.output + source * nbytes;
    const bool aligned = ((unsigned long long)block & 7ull) == 0;
    for (unsigned long long j = first; j < lines; j += stride) {
      u64 data;
      if (!ll_receive(a, call, source, j, data)) {
        call.failed = true;
        break;
      }
      ipcshare::store_payload(block, j, nbytes, aligned, data);
    }
  }
  ll_end(a, call);
}

// ---------------------------------------------------------------------------------------
// Entry points: <collective>_<dtype>_<op>, e.g. all_reduce_one_shot_bfloat16_sum.

#define IPCSHARE_REDUCTIONS(NAME, TYPE, TYPENAME)                                           \
  extern "C" __global__ void NAME##_##TYPENAME##_sum(CollectiveArgs a) {                   \
    NAME<TYPE, kSum>(a);                                                                   \
  }                                                                                        \
  extern "C" __global__ void NAME##_##TYPENAME##_max(CollectiveArgs a) {                   \
    NAME<TYPE, kMax>(a);                                                                   \
  }                                                                                        \
  extern "C" __global__ void NAME##_##TYPENAME##_min(CollectiveArgs a) {                   \
    NAME<TYPE, kMin>(a);                                                                   \
  }

#define IPCSHARE_ALL_TYPES(NAME)              \
  IPCSHARE_REDUCTIONS(NAME, F32, float32)     \
  IPCSHARE_REDUCTIONS(NAME, F16, float16)     \
  IPCSHARE_REDUCTIONS(NAME, BF16, bfloat16)   \
  IPCSHARE_REDUCTIONS(NAME, I32, int32)

IPCSHARE_ALL_TYPES(all_reduce_one_shot)
IPCSHARE_ALL_TYPES(all_reduce_two_shot)
IPCSHARE_ALL_TYPES(reduce_scatter_one_shot)
IPCSHARE_ALL_TYPES(all_reduce_ll)
IPCSHARE_ALL_TYPES(reduce_scatter_ll)
IPCSHARE_ALL_TYPES(all_reduce_stepped)
IPCSHARE_ALL_TYPES(reduce_scatter_stepped)
IPCSHARE_ALL_TYPES(all_reduce_copy_engine)
IPCSHARE_ALL_TYPES(all_reduce_push)
IPCSHARE_ALL_TYPES(reduce_scatter_push)

extern "C" __global__ void all_gather_pull_bytes(CollectiveArgs a) { one_kernel<PullAllGather>(a); }
extern "C" __global__ void all_gather_push_bytes(CollectiveArgs a) { all_gather_push(a); }
extern "C" __global__ void all_gather_stepped_bytes(CollectiveArgs a) {
  after_meet<PullAllGather>(a);
}

// The first kernel of a stepped call, by element size (count is in elements).
struct Bytes { typedef unsigned char Bits; };
extern "C" __global__ void stage_and_publish_bytes(CollectiveArgs a) { stage_and_publish<Bytes>(a); }
extern "C" __global__ void stage_and_publish_float32(CollectiveArgs a) { stage_and_publish<F32>(a); }
extern "C" __global__ void stage_and_publish_float16(CollectiveArgs a) { stage_and_publish<F16>(a); }
extern "C" __global__ void stage_and_publish_bfloat16(CollectiveArgs a) { stage_and_publish<BF16>(a); }
extern "C" __global__ void stage_and_publish_int32(CollectiveArgs a) { stage_and_publish<I32>(a); }
extern "C" __global__ void all_gather_ll_bytes(CollectiveArgs a) { all_gather_ll(a); }
