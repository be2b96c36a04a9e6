// ipcshare device-side copies at full width whatever the alignment: a thread block copying
// a run of bytes with 16-byte stores, however its source and destination are aligned.
//
// block_copy (copy.cuh) moves 16-byte vectors only when source and destination are both
// 16-byte aligned, and one byte per thread per step otherwise, which uneven all-to-all-v
// splits and 3 ranks hit almost always. Here the destination is aligned by copying a head
// of fewer than 16 bytes, then every 16-byte store of the body is fed by aligned 16-byte
// loads: where the source's offset from a 16-byte boundary differs from the destination's
// (`shift`), each stored vector is bytes [shift, shift + 16) of two neighbouring aligned
// source vectors (funnel16), the second of which a warp takes from the next lane by a
// shuffle, so every source byte crosses the link once. Several independent loads are in
// flight per thread (kAlignedUnroll, kShiftedUnroll): one load at a time keeps too few
// bytes on an NVLink to cover its latency.
//
// The plan (copy_plan) and the byte arithmetic (funnel16) compile on the host too, where
// tests/unit/test_all_to_all_slicing.py runs them against numpy for every alignment.
// Source loads that complete a vector may read up to 15 bytes before or after the run
// (never across a 16-byte boundary, so never outside a mapped page); those bytes are
// discarded.
#pragma once

#include <ipcshare/host_device.cuh>

namespace ipcshare {

struct Words4 { unsigned x, y, z, w; };

// How a run of n bytes from src to dst is cut: `head` bytes one by one until dst is
// 16-byte aligned, `vectors` aligned 16-byte stores, then n - head - 16 * vectors tail
// bytes one by one; the body's source starts `shift` bytes past a 16-byte boundary.
struct CopyPlan {
  unsigned long long head, vectors;
  unsigned shift;
};

IPCSHARE_HD CopyPlan copy_plan(unsigned long long dst, unsigned long long src,
                               unsigned long long n) {
  unsigned long long head = (16ull - (dst & 15ull)) & 15ull;
  if (head > n) head = n;
  CopyPlan p;
  p.head = head;
  p.vectors = (n - head) / 16ull;
  p.shift = (unsigned)((src + head) & 15ull);
  return p;
}

// Bits [8 * bytes, 8 * bytes + 32) of the 64-bit lo | hi << 32 (bytes 0 to 3).
IPCSHARE_HD unsigned funnel_bytes(unsigned lo, unsigned hi, unsigned bytes) {
#if defined(__CUDA_ARCH__)
  return __funnelshift_r(lo, hi, 8u * bytes);
#else
  return bytes == 0 ? lo : (lo >> (8u * bytes)) | (hi << (32u - 8u * bytes));
#endif
}

// Bytes [shift, shift + 16) of the 32 bytes lo | hi (shift 0 to 15). The word offset is
// resolved by a switch on a value that is uniform across the block, so no word array is
// indexed at run time (which would live in local memory).
IPCSHARE_HD Words4 funnel16(Words4 lo, Words4 hi, unsigned shift) {
  const unsigned b = shift & 3u;
  Words4 r;
  switch (shift >> 2) {
    case 0:
      r.x = funnel_bytes(lo.x, lo.y, b); r.y = funnel_bytes(lo.y, lo.z, b);
      r.z = funnel_bytes(lo.z, lo.w, b); r.w = funnel_bytes(lo.w, hi.x, b);
      break;
    case 1:
      r.x = funnel_bytes(lo.y, lo.z, b); r.y = funnel_bytes(lo.z, lo.w, b);
      r.z = funnel_bytes(lo.w, hi.x, b); r.w = funnel_bytes(hi.x, hi.y, b);
      break;
    case 2:
      r.x = funnel_bytes(lo.z, lo.w, b); r.y = funnel_bytes(lo.w, hi.x, b);
      r.z = funnel_bytes(hi.x, hi.y, b); r.w = funnel_bytes(hi.y, hi.z, b);
      break;
    default:
      r.x = funnel_bytes(lo.w, hi.x, b); r.y = funnel_bytes(hi.x, hi.y, b);
      r.z = funnel_bytes(hi.y, hi.z, b); r.w = funnel_bytes(hi.z, hi.w, b);
      break;
  }
  return r;
}

#if defined(__CUDACC__)

// Independent 16-byte loads in flight per thread: aligned runs, shifted runs (each of
// those also shuffles, and lane 31 loads one vector more per round).
constexpr int kAlignedUnroll = 8;
constexpr int kShiftedUnroll = 4;

__device__ __forceinline__ Words4 load_words4(const uint4* p) {
  // .cg: cached in L2 only. Sources are peers' windows read once per call after an
  // acquire; nothing is gained from keeping them in this SM's L1.
  const uint4 v = __ldcg(p);
  return Words4{v.x, v.y, v.z, v.w};
}

__device__ __forceinline__ Words4 shuffle_words4(Words4 v, int lane_or_delta, bool down) {
  Words4 r;
  if (down) {
    r.x = __shfl_down_sync(0xffffffffu, v.x, lane_or_delta);
    r.y = __shfl_down_sync(0xffffffffu, v.y, lane_or_delta);
    r.z = __shfl_down_sync(0xffffffffu, v.z, lane_or_delta);
    r.w = __shfl_down_sync(0xffffffffu, v.w, lane_or_delta);
  } else {
    r.x = __shfl_sync(0xffffffffu, v.x, lane_or_delta);
    r.y = __shfl_sync(0xffffffffu, v.y, lane_or_delta);
    r.z = __shfl_sync(0xffffffffu, v.z, lane_or_delta);
    r.w = __shfl_sync(0xffffffffu, v.w, lane_or_delta);
  }
  return r;
}

// Copy bytes [0, n) from src to dst with the threads of the calling block (blockDim.x a
// multiple of 32; every thread must call it: the shifted body shuffles within warps).
// The ranges must not overlap unless dst == src (then nothing is done).
__device__ __forceinline__ void block_copy_wide(char* dst, const char* src,
                                                unsigned long long n) {
  if (dst == src || n == 0) return;
  const CopyPlan p = copy_plan((unsigned long long)dst, (unsigned long long)src, n);
  const unsigned t = threadIdx.x, threads = blockDim.x;
  const unsigned long long body = p.head + 16ull * p.vectors;
  for (unsigned long long i = t; i < p.head; i += threads) dst[i] = src[i];
  for (unsigned long long i = body + t; i < n; i += threads) dst[i] = src[i];
  const unsigned long long vectors = p.vectors;
  if (vectors == 0) return;
  uint4* d = reinterpret_cast<uint4*>(dst + p.head);
  if (p.shift == 0) {
    const uint4* s = reinterpret_cast<const uint4*>(src + p.head);
    const unsigned long long stride = (unsigned long long)threads * kAlignedUnroll;
    for (unsigned long long base = t; base < vectors; base += stride) {
      uint4 v[kAlignedUnroll];
#pragma unroll
      for (int u = 0; u < kAlignedUnroll; ++u) {
        const unsigned long long i = base + (unsigned long long)u * threads;
        if (i < vectors) v[u] = __ldcg(s + i);
      }
#pragma unroll
      for (int u = 0; u < kAlignedUnroll; ++u) {
        const unsigned long long i = base + (unsigned long long)u * threads;
        if (i < vectors) d[i] = v[u];
      }
    }
    return;
  }
  // Shifted: stored vector i is funnel16(a[i], a[i + 1]) of the aligned source vectors
  // a[0 .. vectors] (a[vectors] holds the body's last bytes, since shift > 0). A warp
  // takes 32 consecutive vectors per unrolled step: lane l loads a[i] and takes a[i + 1]
  // from lane l + 1 (lane 31 from lane 0 of the next step, or one load of its own).
  const uint4* a = reinterpret_cast<const uint4*>(src + p.head - p.shift);
  const unsigned lane = t & 31u, warp = t >> 5, warps = threads >> 5;
  const unsigned long long round = 32ull * kShiftedUnroll;
  const Words4 zero = {0u, 0u, 0u, 0u};
  for (unsigned long long base = (unsigned long long)warp * round; base < vectors;
       base += (unsigned long long)warps * round) {
    Words4 lo[kShiftedUnroll];
#pragma unroll
    for (int u = 0; u < kShiftedUnroll; ++u) {
      const unsigned long long i = base + 32ull * u + lane;
      lo[u] = i <= vectors ? load_words4(a + i) : zero;
    }
    const unsigned long long after = base + round;
    const Words4 extra = (lane == 31u && after <= vectors) ? load_words4(a + after) : zero;
#pragma unroll
    for (int u = 0; u < kShiftedUnroll; ++u) {
      const Words4 next = shuffle_words4(lo[u], 1, true);
      const Words4 wrap = u + 1 < kShiftedUnroll
          ? shuffle_words4(lo[(u + 1) % kShiftedUnroll], 0, false) : extra;
      const unsigned long long i = base + 32ull * u + lane;
      if (i < vectors) {
        const Words4 r = funnel16(lo[u], lane == 31u ? wrap : next, p.shift);
        d[i] = make_uint4(r.x, r.y, r.z, r.w);
      }
    }
  }
}

#endif  // __CUDACC__

}  // namespace ipcshare
