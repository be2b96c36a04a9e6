// Element types and reductions: what every reducing kernel computes per element, in rank
// order, bit for bit as ipcshare/collectives/reduction.py (collectives.cu says how).
#pragma once

#include "collectives/args.cuh"

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
