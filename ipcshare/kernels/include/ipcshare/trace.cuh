// Phase stamps of the collective kernels, read by tools/probes/timing/kernel_trace.py: where a call's
// microseconds go (the meeting, the first store, a fence, the last wait) on each rank.
// Compiled in only with -DIPCSHARE_KERNEL_TRACE, which IPCSHARE_KERNEL_TRACE=1 asks of the
// backend (a CUBIN of its own in the kernel cache); otherwise every mark is nothing, and
// the kernels are the same machine code as without this header.
//
// A mark stamps, from thread 0 of blocks 0 .. kTraceBlocks - 1 only, two clocks into
// ipcshare_trace[call][block][mark]: the SM's cycle counter (clock64: exact within the
// block, and what a phase of a few hundred nanoseconds needs) and the GPU's globaltimer
// (ns, comparable across blocks; its resolution depends on the GPU, so the tool converts
// cycles with the ratio the two clocks show over the call). Every block up to
// kTraceSpanBlocks also keeps its first and its latest mark's globaltimer in
// ipcshare_trace_span[call][block]: the whole kernel's span, and the gap between calls.
// `call` is the block's count of calls (ipcshare_trace_calls[block], taken at mark 0)
// modulo kTraceCalls, so a CUDA graph of up to kTraceCalls calls leaves each call in a
// slot of its own. A kernel stamps its marks in increasing order, mark 0 first; the tool
// names them per kernel (KERNEL_MARKS in kernel_trace.py) and zeroes the buffers before
// each call or graph replay, so a mark a call did not reach reads 0.
#pragma once

namespace ipcshare {

constexpr int kTraceBlocks = 4;
constexpr int kTraceMarks = 16;
constexpr int kTraceCalls = 8;
constexpr int kTraceSpanBlocks = 1024;

}  // namespace ipcshare

#ifdef IPCSHARE_KERNEL_TRACE
// [call][block][mark][0]: clock64, [1]: globaltimer; spans [call][block][0]: the block's
// mark 0, [1]: its latest mark (globaltimer ns); calls [block]: the calls it began. Defined
// here, with C linkage so the host finds them by name (cuModuleGetGlobal): a kernel module
// is one translation unit (NVRTC compiles a source whole), and only collectives.cu
// includes this header.
extern "C" {
__device__ unsigned long long
    ipcshare_trace[ipcshare::kTraceCalls][ipcshare::kTraceBlocks][ipcshare::kTraceMarks][2];
__device__ unsigned long long ipcshare_trace_span[ipcshare::kTraceCalls]
                                                 [ipcshare::kTraceSpanBlocks][2];
__device__ unsigned long long ipcshare_trace_calls[ipcshare::kTraceSpanBlocks];
}

namespace ipcshare {
// Only thread 0 of a block marks, so the block's slot needs no synchronization.
__shared__ unsigned trace_slot;

__device__ __forceinline__ void trace_mark(int mark) {
  if (threadIdx.x != 0 || blockIdx.x >= kTraceSpanBlocks || mark >= kTraceMarks) return;
  unsigned long long ns;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
  const unsigned long long cycles = (unsigned long long)clock64();
  const unsigned block = blockIdx.x;
  if (mark == 0) {
    trace_slot = (unsigned)(ipcshare_trace_calls[block]++ % kTraceCalls);
    ipcshare_trace_span[trace_slot][block][0] = ns;
  }
  const unsigned slot = trace_slot;
  ipcshare_trace_span[slot][block][1] = ns;
  if (block < kTraceBlocks) {
    ipcshare_trace[slot][block][mark][0] = cycles;
    ipcshare_trace[slot][block][mark][1] = ns;
  }
}
}  // namespace ipcshare
#define IPCSHARE_MARK(mark) ipcshare::trace_mark(mark)
#else
#define IPCSHARE_MARK(mark) \
  do {                      \
  } while (0)
#endif
