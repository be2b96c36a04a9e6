// Phase stamps of the collective kernels, read by tools/kernel_trace.py: where a call's
// microseconds go (the meeting, the first store, a fence, the last wait) on each rank.
// Compiled in only with -DIPCSHARE_KERNEL_TRACE, which IPCSHARE_KERNEL_TRACE=1 asks of the
// backend (a CUBIN of its own in the kernel cache); otherwise every mark is nothing, and
// the kernels are the same machine code as without this header.
//
// A mark stamps, from thread 0 of blocks 0 .. kTraceBlocks - 1 only, two clocks into
// ipcshare_trace[block][mark]: the SM's cycle counter (clock64: exact within the block,
// and what a phase of a few hundred nanoseconds needs) and the GPU's globaltimer (ns,
// comparable across blocks; its resolution depends on the GPU, so the tool converts
// cycles with the ratio the two clocks show over the call). A kernel stamps its marks in
// increasing order; the tool names them per kernel (KERNEL_MARKS in kernel_trace.py) and
// zeroes the buffer before each call, so a mark a call did not reach reads 0.
#pragma once

namespace ipcshare {

constexpr int kTraceBlocks = 4;
constexpr int kTraceMarks = 16;

}  // namespace ipcshare

#ifdef IPCSHARE_KERNEL_TRACE
// [block][mark][0]: clock64, [1]: globaltimer. Defined here, with C linkage so the host
// finds it by name (cuModuleGetGlobal): a kernel module is one translation unit (NVRTC
// compiles a source whole), and only collectives.cu includes this header.
extern "C" {
__device__ unsigned long long ipcshare_trace[ipcshare::kTraceBlocks][ipcshare::kTraceMarks][2];
}

namespace ipcshare {
__device__ __forceinline__ void trace_mark(int mark) {
  if (threadIdx.x != 0 || blockIdx.x >= kTraceBlocks || mark >= kTraceMarks) return;
  unsigned long long ns;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
  ipcshare_trace[blockIdx.x][mark][0] = (unsigned long long)clock64();
  ipcshare_trace[blockIdx.x][mark][1] = ns;
}
}  // namespace ipcshare
#define IPCSHARE_MARK(mark) ipcshare::trace_mark(mark)
#else
#define IPCSHARE_MARK(mark) \
  do {                      \
  } while (0)
#endif
