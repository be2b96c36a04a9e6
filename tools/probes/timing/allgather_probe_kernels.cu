// Experimental all-gather kernels for tools/probes/timing/allgather_probe.py (not used by the package).
// Same arguments, barriers and epochs as the push kernel of ipcshare/kernels/src/allgather.cu;
// what differs is how the bytes move:
//   probe_push<U>  push with the number of destinations known at compile time and U
//                  16-byte vectors per thread in flight
//   probe_scatter  no barriers: one source into up to 8 destinations (the SM share of a
//                  split where the copy engine moves the rest)
//   probe_pull<U>  fanned-in pull: each thread loads U vectors from every source rank at
//                  once (N*U remote loads in flight), then stores them into its own output
#include <ipcshare/signal.cuh>

using ipcshare::u64;
using ipcshare::kMaxRanks;

struct AllGatherArgs {
  char* outputs[kMaxRanks];
  const char* inputs[kMaxRanks];
  u64* pads[kMaxRanks];
  unsigned long long block_bytes;
  u64 timeout_ns;
  int rank;
  int nranks;
  int slot_base;
  int epoch_word;
};

__device__ __forceinline__ int slots(const AllGatherArgs& a, int phase) {
  return a.slot_base + (blockIdx.x * 2 + phase) * kMaxRanks;
}

// This block's share of a buffer's 16-byte vectors: [first, last).
__device__ __forceinline__ void block_share(unsigned long long bytes, unsigned long long& first,
                                            unsigned long long& last) {
  const unsigned long long vectors = bytes / 16;
  const unsigned long long per_block = (vectors + gridDim.x - 1) / gridDim.x;
  first = per_block * blockIdx.x;
  last = first + per_block < vectors ? first + per_block : vectors;
}

// Store v[0..U) at vectors base, base + blockDim.x, ... of d (those below last).
template <int U>
__device__ __forceinline__ void store_run(uint4* d, const uint4* v, unsigned long long base,
                                          unsigned long long last) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const unsigned long long i = base + (unsigned long long)u * blockDim.x;
    if (i < last) d[i] = v[u];
  }
}

// dsts[k] <- srcs[k] for k < N, this block's share, U vectors of each pair per thread in
// flight: every load is issued before any store. Sizes here are multiples of 16 bytes and
// buffers 16-byte aligned (the probe's sizes); the caller checks.
template <int N, int U>
__device__ __forceinline__ void move(char* const* dsts, const char* const* srcs,
                                     unsigned long long bytes) {
  unsigned long long first, last;
  block_share(bytes, first, last);
  const unsigned long long stride = (unsigned long long)blockDim.x * U;
  for (unsigned long long base = first + threadIdx.x; base < last; base += stride) {
    uint4 v[N][U];
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const uint4* s = reinterpret_cast<const uint4*>(srcs[k]);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const unsigned long long i = base + (unsigned long long)u * blockDim.x;
        if (i < last) v[k][u] = s[i];
      }
    }
#pragma unroll
    for (int k = 0; k < N; ++k) store_run<U>(reinterpret_cast<uint4*>(dsts[k]), v[k], base, last);
  }
}

// Push with one source: load U vectors once, store them into all N destinations.
template <int N, int U>
__device__ __forceinline__ void fan_out(char* const* dsts, const char* src,
                                        unsigned long long bytes) {
  unsigned long long first, last;
  block_share(bytes, first, last);
  const unsigned long long stride = (unsigned long long)blockDim.x * U;
  const uint4* s = reinterpret_cast<const uint4*>(src);
  for (unsigned long long base = first + threadIdx.x; base < last; base += stride) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const unsigned long long i = base + (unsigned long long)u * blockDim.x;
      if (i < last) v[u] = s[i];
    }
#pragma unroll
    for (int k = 0; k < N; ++k) store_run<U>(reinterpret_cast<uint4*>(dsts[k]), v, base, last);
  }
}

template <int U>
__device__ __forceinline__ void push_body(const AllGatherArgs& a) {
  char* dsts[kMaxRanks];
  int n = 0;
  const unsigned long long offset = a.block_bytes * a.rank;
  for (int step = 1; step <= a.nranks; ++step) {
    char* dst = a.outputs[(a.rank + step) % a.nranks] + offset;
    if (dst != a.inputs[a.rank]) dsts[n++] = dst;
  }
  const char* src = a.inputs[a.rank];
  switch (n) {
    case 1: fan_out<1, U>(dsts, src, a.block_bytes); break;
    case 2: fan_out<2, U>(dsts, src, a.block_bytes); break;
    case 3: fan_out<3, U>(dsts, src, a.block_bytes); break;
    case 4: fan_out<4, U>(dsts, src, a.block_bytes); break;
    default: fan_out<8, U>(dsts, src, a.block_bytes); break;  // not timed by the probe
  }
}

template <int U>
__device__ __forceinline__ void pull_body(const AllGatherArgs& a) {
  char* dsts[kMaxRanks];
  const char* srcs[kMaxRanks];
  int n = 0;
  for (int step = 1; step <= a.nranks; ++step) {  // peers first, our own block last
    const int peer = (a.rank + step) % a.nranks;
    char* dst = a.outputs[a.rank] + a.block_bytes * peer;
    if (dst != a.inputs[peer]) {
      dsts[n] = dst;
      srcs[n++] = a.inputs[peer];
    }
  }
  switch (n) {
    case 1: move<1, U>(dsts, srcs, a.block_bytes); break;
    case 2: move<2, U>(dsts, srcs, a.block_bytes); break;
    case 3: move<3, U>(dsts, srcs, a.block_bytes); break;
    case 4: move<4, U>(dsts, srcs, a.block_bytes); break;
    default: break;  // more ranks: not timed by the probe
  }
}

template <void (*Body)(const AllGatherArgs&)>
__device__ __forceinline__ void between_barriers(const AllGatherArgs& a) {
  u64* own = a.pads[a.rank];
  const u64 epoch = ipcshare::begin_epoch(own, a.epoch_word);
  if (ipcshare::block_barrier(a.pads, a.rank, a.nranks, slots(a, 0), epoch, a.timeout_ns)) {
    Body(a);
    ipcshare::block_barrier(a.pads, a.rank, a.nranks, slots(a, 1), epoch, a.timeout_ns);
  }
  ipcshare::end_epoch(own, a.epoch_word, epoch);
}

extern "C" __global__ void probe_push4(AllGatherArgs a) { between_barriers<push_body<4>>(a); }
extern "C" __global__ void probe_push8(AllGatherArgs a) { between_barriers<push_body<8>>(a); }
extern "C" __global__ void probe_pull2(AllGatherArgs a) { between_barriers<pull_body<2>>(a); }
extern "C" __global__ void probe_pull4(AllGatherArgs a) { between_barriers<pull_body<4>>(a); }

struct ScatterArgs {
  char* dsts[kMaxRanks];
  const char* src;
  unsigned long long bytes;
  int ndst;
};

extern "C" __global__ void probe_scatter(ScatterArgs a) {
  switch (a.ndst) {
    case 1: fan_out<1, 4>(a.dsts, a.src, a.bytes); break;
    case 2: fan_out<2, 4>(a.dsts, a.src, a.bytes); break;
    case 3: fan_out<3, 4>(a.dsts, a.src, a.bytes); break;
    case 4: fan_out<4, 4>(a.dsts, a.src, a.bytes); break;
    default: break;
  }
}
