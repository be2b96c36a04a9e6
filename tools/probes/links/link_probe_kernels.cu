// SM-driven copies for tools/probes/links/link_probe.py (not used by the package): what one GPU's
// thread blocks reach over NVLink when they load from a peer (pull) or store into one
// (push), by grid and by loads in flight, with the other GPU doing the same at the same
// time, as in a 2-rank all-to-all.
//
// A launch copies up to two pairs (dst, src): blocks [0, split) share pair 0's vectors in
// equal contiguous runs, blocks [split, gridDim.x) pair 1's. Pair 1 is how the probe puts
// a local copy (an all-to-all's own segment) beside the remote one, on other SMs.
// Each thread issues U independent 16-byte loads before its U stores, as the package's
// block_copy_wide does (kernels/include/ipcshare/wide_copy.cuh, aligned path).
typedef unsigned long long u64;

struct ProbeArgs {
  uint4* dst[2];
  const uint4* src[2];
  u64 vectors[2];
  int split;
};

template <int U>
__device__ __forceinline__ void copy_share(uint4* d, const uint4* s, u64 vectors, u64 block,
                                           u64 blocks) {
  const u64 per = (vectors + blocks - 1) / blocks;
  const u64 first = per * block;
  const u64 last = first + per < vectors ? first + per : vectors;
  const u64 stride = (u64)blockDim.x * U;
  for (u64 base = first + threadIdx.x; base < last; base += stride) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const u64 i = base + (u64)u * blockDim.x;
      if (i < last) v[u] = __ldcg(s + i);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const u64 i = base + (u64)u * blockDim.x;
      if (i < last) d[i] = v[u];
    }
  }
}

template <int U>
__device__ __forceinline__ void probe(const ProbeArgs& a) {
  if ((int)blockIdx.x < a.split)
    copy_share<U>(a.dst[0], a.src[0], a.vectors[0], blockIdx.x, (u64)a.split);
  else
    copy_share<U>(a.dst[1], a.src[1], a.vectors[1], blockIdx.x - a.split,
                  (u64)(gridDim.x - a.split));
}

extern "C" __global__ void probe_u2(ProbeArgs a) { probe<2>(a); }
extern "C" __global__ void probe_u4(ProbeArgs a) { probe<4>(a); }
extern "C" __global__ void probe_u8(ProbeArgs a) { probe<8>(a); }
extern "C" __global__ void probe_u16(ProbeArgs a) { probe<16>(a); }
