// ipcshare device-side copies shared by its kernels: a thread block copying a run of
// bytes, 16 bytes at a time where both pointers allow it.
#pragma once

namespace ipcshare {

// Copy bytes [0, n) from src to dst with the threads of the calling block.
__device__ __forceinline__ void block_copy(char* dst, const char* src, unsigned long long n) {
  unsigned long long done = 0;
  if (((((unsigned long long)dst) | ((unsigned long long)src)) & 15ull) == 0) {
    const unsigned long long vectors = n / 16;
    const uint4* s = reinterpret_cast<const uint4*>(src);
    uint4* d = reinterpret_cast<uint4*>(dst);
    for (unsigned long long i = threadIdx.x; i < vectors; i += blockDim.x) d[i] = s[i];
    done = vectors * 16;
  }
  for (unsigned long long i = done + threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
}

// Copy bytes [0, n) from src to each of the `ndst` destinations with the threads of the
// calling block, loading each 16-byte vector once and storing it to every destination, so
// the stores to all of them are on the links together. Four loads are in flight per thread
// before their stores: a thread that waited for each load before its store would keep too
// few bytes on a link to a peer.
__device__ __forceinline__ void block_fanout(char* const* dsts, int ndst, const char* src,
                                             unsigned long long n) {
  unsigned long long aligned = (unsigned long long)src;
  for (int d = 0; d < ndst; ++d) aligned |= (unsigned long long)dsts[d];
  if ((aligned & 15ull) != 0) {
    for (int d = 0; d < ndst; ++d) block_copy(dsts[d], src, n);
    return;
  }
  constexpr int kUnroll = 4;
  const unsigned long long vectors = n / 16;
  const unsigned long long stride = (unsigned long long)blockDim.x * kUnroll;
  const uint4* s = reinterpret_cast<const uint4*>(src);
  for (unsigned long long base = threadIdx.x; base < vectors; base += stride) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const unsigned long long i = base + (unsigned long long)u * blockDim.x;
      if (i < vectors) v[u] = s[i];
    }
    for (int d = 0; d < ndst; ++d) {
      uint4* out = reinterpret_cast<uint4*>(dsts[d]);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const unsigned long long i = base + (unsigned long long)u * blockDim.x;
        if (i < vectors) out[i] = v[u];
      }
    }
  }
  for (unsigned long long i = vectors * 16 + threadIdx.x; i < n; i += blockDim.x)
    for (int d = 0; d < ndst; ++d) dsts[d][i] = src[i];
}

}  // namespace ipcshare
