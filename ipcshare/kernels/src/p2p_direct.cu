// Kernels of `ipcshare p2p`, where one process owns every GPU and has enabled peer access:
// threads load and store through plain pointers that may point into a peer GPU's memory
// (NVLink / PCIe loads and stores), instead of asking the copy engine.

#define P2P_MAX_TARGETS 8

struct PushArgs {
  char* targets[P2P_MAX_TARGETS];  // where the block goes; any of them may be on a peer GPU
  const char* source;              // the block, on this GPU
  unsigned long long bytes;
};

// Push one block into gridDim.y targets: blockIdx.y picks the target, the blocks along x
// share its bytes (16-byte vectors when both ends allow it, bytes otherwise).
extern "C" __global__ void p2p_push(PushArgs a) {
  char* dst = a.targets[blockIdx.y];
  const char* src = a.source;
  const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  const unsigned long long first = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
  const bool vector_ok = ((((unsigned long long)dst) | ((unsigned long long)src)) & 15ull) == 0;
  unsigned long long done = 0;
  if (vector_ok) {
    const unsigned long long vectors = a.bytes / 16;
    const uint4* s = reinterpret_cast<const uint4*>(src);
    uint4* d = reinterpret_cast<uint4*>(dst);
    for (unsigned long long i = first; i < vectors; i += stride) d[i] = s[i];
    done = vectors * 16;
  }
  for (unsigned long long i = done + first; i < a.bytes; i += stride) dst[i] = src[i];
}

// Keep one thread busy for `nanoseconds`: the long kernel that the host-staged probe queues
// ahead of a peer copy on another stream.
extern "C" __global__ void p2p_spin(unsigned long long nanoseconds) {
  unsigned long long start;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  unsigned long long now = start;
  while (now - start < nanoseconds) {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  }
}
