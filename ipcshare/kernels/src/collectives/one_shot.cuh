// One-shot all-reduce and reduce-scatter, and the pull all-gather
// (collectives/algorithms/gpu_one_shot.py, gpu_pull_all_gather.py): one barrier, then
// every rank reads what it needs from every peer.
#pragma once

#include "collectives/call.cuh"
#include "collectives/reduce.cuh"

// The one-barrier collectives in three parts: the block's slice, what the block stages of
// the input, and the block's work once every rank's input is visible. one_kernel runs
// them as one kernel that meets the peers by spinning on flags; the stepped kernels
// (stepped.cuh) run them on either side of a barrier made by the stream.

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
