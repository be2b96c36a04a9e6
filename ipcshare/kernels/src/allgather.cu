// All-gather kernels over ipcshare windows: one-shot push, one-shot pull, and a ring
// pipelined with per-chunk flags. Each block owns one slice of the block of bytes every
// rank contributes and synchronises with the same block of its peers only, so a kernel
// needs no grid-wide barrier.
#include <ipcshare/copy.cuh>
#include <ipcshare/signal.cuh>

using ipcshare::u64;
using ipcshare::kMaxRanks;

struct AllGatherArgs {
  char* outputs[kMaxRanks];            // every rank's output (all `nranks` blocks), mapped here
  const char* inputs[kMaxRanks];       // every rank's input block, mapped here
  u64* pads[kMaxRanks];                // every rank's signal pad, mapped here
  unsigned long long block_bytes;      // bytes each rank contributes
  u64 timeout_ns;                      // 0: wait forever
  int rank;
  int nranks;
  int slot_base;                       // first pad word this operation family owns
  int epoch_word;                      // own-pad word counting this family's operations
};

// Runs one operation under the family's device-side epoch (see signal.cuh).
template <void (*Operation)(const AllGatherArgs&, u64)>
__device__ __forceinline__ void with_epoch(const AllGatherArgs& a) {
  u64* own = a.pads[a.rank];
  const u64 epoch = ipcshare::begin_epoch(own, a.epoch_word);
  Operation(a, epoch);
  ipcshare::end_epoch(own, a.epoch_word, epoch);
}

// Words used per block: two barrier phases of kMaxRanks words each.
__device__ __forceinline__ int block_slots(const AllGatherArgs& a, int phase) {
  return a.slot_base + (blockIdx.x * 2 + phase) * kMaxRanks;
}

// Copy this block's share of [0, bytes) from src to dst: 16-byte vectors where both
// pointers allow it, bytes for the rest.
__device__ __forceinline__ void copy_slice(char* dst, const char* src, unsigned long long bytes) {
  const unsigned long long per_block = (bytes + gridDim.x - 1) / gridDim.x;
  unsigned long long begin = per_block * blockIdx.x;
  unsigned long long end = begin + per_block < bytes ? begin + per_block : bytes;
  if (begin >= end) return;
  dst += begin;
  src += begin;
  ipcshare::block_copy(dst, src, end - begin);
}

// Push: write our block into every rank's output (ours included: out of place, or nothing
// when in place), between "outputs free" and "blocks landed" barriers. Fanned out: each
// thread loads a few 16-byte vectors of our block once and stores them into every output,
// so the stores to all peers are in flight together (every NVLink port busy at once) and
// the source is read once, not once per peer. (Peer after peer, one copy_slice each, ran
// 309 against 316 GB/s busbw at 64 MiB on 4 H200s and 261 against 316 on 2.)
__device__ __forceinline__ void fanout_slice(char* const* dsts, int ndst, const char* src,
                                             unsigned long long bytes) {
  // Slices are whole 16-byte vectors, so a slice's start stays as aligned as the block.
  const unsigned long long vectors_total = bytes / 16;
  const unsigned long long per_block = (vectors_total + gridDim.x - 1) / gridDim.x;
  const unsigned long long first = per_block * blockIdx.x;
  const unsigned long long last = first + per_block < vectors_total ? first + per_block
                                                                   : vectors_total;
  bool vector_ok = (((unsigned long long)src) & 15ull) == 0;
  for (int p = 0; p < ndst; ++p) vector_ok &= (((unsigned long long)dsts[p]) & 15ull) == 0;
  if (!vector_ok) {  // unaligned: bytes, block by block
    for (int p = 0; p < ndst; ++p) copy_slice(dsts[p], src, bytes);
    return;
  }
  // This block's whole vectors; the last block also takes the bytes after the last one.
  const unsigned long long begin = (first < vectors_total ? first : vectors_total) * 16;
  const unsigned long long end = blockIdx.x == gridDim.x - 1 ? bytes : last * 16;
  if (begin >= end) return;
  char* mine[ipcshare::kMaxRanks];
  for (int p = 0; p < ndst; ++p) mine[p] = dsts[p] + begin;
  ipcshare::block_fanout(mine, ndst, src + begin, end - begin);
}

__device__ __forceinline__ void push(const AllGatherArgs& a, u64 epoch) {
  if (!ipcshare::block_barrier(a.pads, a.rank, a.nranks, block_slots(a, 0), epoch,
                               a.timeout_ns))
    return;
  const unsigned long long offset = a.block_bytes * a.rank;
  char* dsts[kMaxRanks];
  int ndst = 0;
  for (int step = 1; step <= a.nranks; ++step) {  // peers first, our own slot last
    const int peer = (a.rank + step) % a.nranks;
    char* dst = a.outputs[peer] + offset;
    if (dst != a.inputs[a.rank]) dsts[ndst++] = dst;
  }
  fanout_slice(dsts, ndst, a.inputs[a.rank], a.block_bytes);
  ipcshare::block_barrier(a.pads, a.rank, a.nranks, block_slots(a, 1), epoch, a.timeout_ns);
}

// Pull: read every rank's block into our output, between "inputs ready" and "inputs read"
// barriers (the mode NCCL prefers on Hopper NVLink for small messages).
__device__ __forceinline__ void pull(const AllGatherArgs& a, u64 epoch) {
  if (!ipcshare::block_barrier(a.pads, a.rank, a.nranks, block_slots(a, 0), epoch,
                               a.timeout_ns))
    return;
  for (int step = 0; step < a.nranks; ++step) {
    const int peer = (a.rank + step) % a.nranks;
    char* dst = a.outputs[a.rank] + a.block_bytes * peer;
    if (dst != a.inputs[peer]) copy_slice(dst, a.inputs[peer], a.block_bytes);
  }
  ipcshare::block_barrier(a.pads, a.rank, a.nranks, block_slots(a, 1), epoch, a.timeout_ns);
}


// Ring, pipelined: the block of bytes is cut into chunks, one per thread block; at step s a
// block forwards chunk c of block (rank - s) to the next rank and flags it; the next rank
// waits for that flag before forwarding the same chunk onward. Flags are per (block, step)
// so chunks of different blocks move independently.
__device__ __forceinline__ void ring(const AllGatherArgs& a, u64 epoch) {
  const int next = (a.rank + 1) % a.nranks;
  const int prev = (a.rank + a.nranks - 1) % a.nranks;
  // Entry: the next rank's output is free (it has entered this operation).
  if (!ipcshare::block_barrier(a.pads, a.rank, a.nranks, block_slots(a, 0), epoch,
                               a.timeout_ns))
    return;
  __shared__ int failed;
  if (threadIdx.x == 0) failed = 0;
  __syncthreads();
  const int flag = block_slots(a, 1);  // word `flag` of the receiver: steps received
  for (int step = 0; step < a.nranks - 1; ++step) {
    const int index = (a.rank - step + a.nranks) % a.nranks;
    const char* src = step == 0 ? a.inputs[a.rank] : a.outputs[a.rank] + a.block_bytes * index;
    copy_slice(a.outputs[next] + a.block_bytes * index, src, a.block_bytes);
    __threadfence_system();
    __syncthreads();
    if (threadIdx.x == 0) {
      const u64 value = (epoch - 1) * (u64)(kMaxRanks) + (u64)step + 1;
      ipcshare::put_signal(a.pads[next] + flag, value);
      if (!ipcshare::wait_signal(a.pads[a.rank] + flag, value, a.timeout_ns)) {
        ipcshare::record_timeout(a.pads[a.rank], prev, epoch);
        failed = 1;
      }
    }
    __syncthreads();
    if (failed) return;
  }
  // Own block, out of place.
  char* own = a.outputs[a.rank] + a.block_bytes * a.rank;
  if (own != a.inputs[a.rank]) copy_slice(own, a.inputs[a.rank], a.block_bytes);
}

// Leader scatter, for ranks that share a GPU: no flags, no waits (the window's barriers,
// met on the host, order it), so it never holds a time-shared GPU while a peer that
// shares it cannot run. Launched by one rank per GPU, it writes the block of every rank in
// `sources` (a bitmask: the ranks on its GPU) into every rank's output.
struct ScatterArgs {
  char* outputs[kMaxRanks];            // every rank's output (all `nranks` blocks), mapped here
  const char* inputs[kMaxRanks];       // every rank's input block, mapped here
  unsigned long long block_bytes;
  int nranks;
  unsigned int sources;                // bit r: copy rank r's block
};

extern "C" __global__ void allgather_scatter(ScatterArgs a) {
  for (int source = 0; source < a.nranks; ++source) {
    if (!(a.sources & (1u << source))) continue;
    char* dsts[kMaxRanks];
    int ndst = 0;
    const unsigned long long offset = a.block_bytes * source;
    for (int step = 1; step <= a.nranks; ++step) {  // others first, the source's own last
      char* dst = a.outputs[(source + step) % a.nranks] + offset;
      if (dst != a.inputs[source]) dsts[ndst++] = dst;
    }
    fanout_slice(dsts, ndst, a.inputs[source], a.block_bytes);
  }
}

extern "C" __global__ void allgather_push(AllGatherArgs a) { with_epoch<push>(a); }
extern "C" __global__ void allgather_pull(AllGatherArgs a) { with_epoch<pull>(a); }
extern "C" __global__ void allgather_ring(AllGatherArgs a) { with_epoch<ring>(a); }
