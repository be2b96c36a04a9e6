// ipcshare device-side signals: include this from kernels that synchronise through the
// signal pads of an ipcshare window (w.signal_pad_ptrs), e.g. with NVRTC
//   --include-path=<ipcshare>/kernels/include   and   #include <ipcshare/signal.cuh>
//
// Memory-ordering contract (docs/MEMORY-ORDERING.md): put_signal is a release at system
// scope, wait_signal an acquire at system scope, so data written before a signal is
// visible to whoever has seen the signal. Signal words are 64-bit counters with a single
// writer each: always signal a larger value, always wait with >=.
#pragma once

namespace ipcshare {

typedef unsigned long long u64;

// Pad layout, in 64-bit words: ipcshare/window/layout.py owns it (tests/unit/test_layout.py
// checks these against it).
constexpr int kPadWords = 8192;          // SIGNAL_PAD_BYTES / 8
constexpr int kHostBarrierWords = 256;   // [0, 256): Window.barrier(), one word per local rank
constexpr int kUserWords = 256;          // [256, 512): free for users
constexpr int kErrorWord = 511;          // a kernel that gave up writes why here
constexpr int kKernelWordBase = 512;     // [512, 8192): ipcshare's own kernels
constexpr int kMaxRanks = 8;             // ranks a kernel argument block can name
// [8064, 8192): device-side epochs, two words per operation family (epoch, blocks done).
constexpr int kEpochWordBase = 8064;

__device__ __forceinline__ void put_signal(u64* word, u64 value) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(word), "l"(value) : "memory");
}

__device__ __forceinline__ u64 load_acquire(const u64* word) {
  u64 value;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(value) : "l"(word) : "memory");
  return value;
}

__device__ __forceinline__ u64 now_ns() {
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Wait until *word >= value. Returns false after timeout_ns (0 = wait forever) instead of
// hanging the GPU: the caller records the failure and returns.
__device__ __forceinline__ bool wait_signal(const u64* word, u64 value, u64 timeout_ns) {
  if (load_acquire(word) >= value) return true;
  const u64 start = now_ns();
  while (load_acquire(word) < value) {
    if (timeout_ns != 0 && now_ns() - start > timeout_ns) return false;
    __nanosleep(100);
  }
  return true;
}

// Record a failure for the host: the error word holds (1 + the rank waited for) and the
// epoch, so the host can raise an error that names the peer. First writer wins.
__device__ __forceinline__ void record_timeout(u64* own_pad, int peer, u64 epoch) {
  atomicCAS(own_pad + kErrorWord, 0ull, ((u64)(peer + 1) << 48) | (epoch & 0xFFFFFFFFFFFFull));
}

// One thread block signalling the same block of every peer: after the block's barrier,
// thread t < nranks fences at system scope and stores `value` into word `slot_base + rank`
// of peer t's pad. The barrier orders every thread's earlier writes (into the peers' memory
// too) before that thread's fence, and a fence is cumulative, so a peer that sees the value
// sees them all. One fence per peer instead of one per thread: the same ordering, about 8%
// less time per large push call on one H100. Call it from every thread.
__device__ __forceinline__ void block_signal(u64* const* pads, int rank, int nranks,
                                             int slot_base, u64 value) {
  __syncthreads();
  const int t = threadIdx.x;
  if (t < nranks && t != rank) {
    __threadfence_system();
    put_signal(pads[t] + slot_base + rank, value);
  }
}

// One thread block waiting until every peer's word `slot_base + peer` of our pad has
// reached `value` (thread t waits for peer t), recording the first peer that never came
// with `epoch` (the operation the host names in its error). Call it from every thread; all
// of them return the same verdict, and after it they may read whatever the peers wrote
// before signalling.
__device__ __forceinline__ bool block_wait(u64* const* pads, int rank, int nranks,
                                           int slot_base, u64 value, u64 timeout_ns,
                                           u64 epoch) {
  __shared__ int failed;
  if (threadIdx.x == 0) failed = 0;
  __syncthreads();
  const int t = threadIdx.x;
  if (t < nranks && t != rank && !wait_signal(pads[rank] + slot_base + t, value, timeout_ns)) {
    record_timeout(pads[rank], t, epoch);
    failed = 1;
  }
  __syncthreads();
  return failed == 0;
}

// A barrier of one thread block with the same block of every peer: signal every peer,
// then wait for every peer. `slot_base` selects the words this barrier owns (one word per
// source rank); `epoch` must grow by one per use. All threads return the same verdict.
__device__ __forceinline__ bool block_barrier(u64* const* pads, int rank, int nranks,
                                              int slot_base, u64 epoch, u64 timeout_ns) {
  block_signal(pads, rank, nranks, slot_base, epoch);
  return block_wait(pads, rank, nranks, slot_base, epoch, timeout_ns, epoch);
}

// Device-side epochs. An operation family keeps the number of operations it has completed
// in word `epoch_word` of the rank's own pad (and a count of finished blocks in the word
// after it), so launches carry no host-side counter and a CUDA graph that captured them
// replays correctly. Every block calls begin_epoch first and end_epoch last; the last
// block to finish publishes the epoch. The next launch on the stream starts after that,
// and every block of one launch reads the same value, since the update happens only once
// all of them are past their read.
__device__ __forceinline__ u64 begin_epoch(const u64* own_pad, int epoch_word) {
  return *reinterpret_cast<const volatile u64*>(own_pad + epoch_word) + 1;
}

__device__ __forceinline__ void end_epoch(u64* own_pad, int epoch_word, u64 epoch) {
  __syncthreads();
  if (threadIdx.x != 0) return;
  u64* done = own_pad + epoch_word + 1;
  if (gridDim.x == 1 || atomicAdd(done, 1ull) == gridDim.x - 1) {
    *reinterpret_cast<volatile u64*>(done) = 0;
    *reinterpret_cast<volatile u64*>(own_pad + epoch_word) = epoch;
    __threadfence();
  }
}

}  // namespace ipcshare
