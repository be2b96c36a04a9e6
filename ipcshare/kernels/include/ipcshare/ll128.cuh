// 128-byte lines: the low-latency protocol with 120 payload bytes a line (ll.cuh carries 8
// in 16), as NCCL's LL128. Eight threads of a warp (a "group": lanes 8g .. 8g + 7) write a
// line together, lane k storing bytes 16k .. 16k + 15 with one st.volatile.global.v2.u64;
// lane 7's second word is the flag, the call's 64-bit epoch. The reader loads the line
// the same way, in one warp instruction, takes the flag from lane 7 and uses the data of
// that same load once the flag is this call's.
//
// What it rests on: the eight 16-byte stores of one warp instruction to one 128-byte
// aligned line reach the reader's memory as one write, and a warp's 128-byte load sees
// all of it or none of it. NCCL's LL128 relies on the same over NVLink; the PTX memory
// model does not promise it, so tools/probes/links/line_probe.py looks for torn lines on every node
// kind before these kernels are trusted there (docs/MEMORY-ORDERING.md, "128-byte lines").
//
// Flags never come round again (64 bits), so no re-flagging: a line of a parity holds this
// call's epoch or an older one of the parity, or the zero the buffers start with. The
// buffers are the LL128 ones (ScratchLayout.ll128_offset): an LL line never lands there,
// and no LL128 payload where an LL reader could take it for a flag.
#pragma once

#include <ipcshare/ll128_words.cuh>
#include <ipcshare/signal.cuh>

namespace ipcshare {

// Lane k's 16 bytes of `line`: words `lo` and `hi` (lane 7: payload word 14 and the flag).
__device__ __forceinline__ void ll128_store(char* line, int k, u64 lo, u64 hi) {
  asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(line + 16 * k), "l"(lo),
               "l"(hi)
               : "memory");
}

__device__ __forceinline__ void ll128_load(const char* line, int k, u64& lo, u64& hi) {
  asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];"
               : "=l"(lo), "=l"(hi)
               : "l"(line + 16 * k)
               : "memory");
}

}  // namespace ipcshare
