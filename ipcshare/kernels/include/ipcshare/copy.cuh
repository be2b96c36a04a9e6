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

}  // namespace ipcshare
