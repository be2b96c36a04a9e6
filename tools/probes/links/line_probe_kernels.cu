// Kernels of tools/probes/links/line_probe.py (not used by the package): does a flagged line written
// over NVLink ever reach its reader torn, a new flag beside older data? The low-latency
// protocol (kernels/include/ipcshare/ll.cuh) puts a flag beside every 4 bytes of payload,
// so it needs no more than 8-byte stores to land whole. Lines with one flag for more
// payload need more: 16 bytes (one thread's vector store: 12 bytes of payload and a flag)
// or 128 bytes (eight threads of a warp storing 16 bytes each, the flag in the last word,
// as NCCL's LL128 lines). This measures whether such a line is ever seen torn.
//
// The writer (on one GPU) stores round r = 1, 2, ..., rounds into every line of the
// reader's buffer (on the peer GPU), over and over; the reader polls its own buffer
// meanwhile and checks every line it sees with a flag. A data word carries its round in
// its high half and its place (line, word) in its low half, so the reader can tell, word
// by word, a round older than the flag beside it (torn: what a one-flag protocol must
// never see), the same round, or a newer one (the next round's data arriving first:
// harmless, since a protocol never rewrites a line its reader has not consumed).
#include <ipcshare/ll.cuh>  // ll_load: one 16-byte volatile load

typedef unsigned long long u64;

struct LineArgs {
  unsigned* lines;   // the buffer: the writer's peer pointer, the reader's own
  u64 nlines;        // lines in it
  unsigned rounds;   // the writer's rounds (1 .. rounds)
  u64* counts;       // reader: [0] lines seen flagged, [1] torn, [2] ahead, [3] misplaced
  u64 budget_ns;     // reader: poll this long (globaltimer)
  int reload;        // reader: once the flag is seen, load the line again before checking
};

__device__ __forceinline__ u64 now_ns() {
  u64 ns;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
  return ns;
}

// Word w of line `line` in round r: the round in the high half, the place in the low.
// (tools/probes/links/line_probe.py computes the same to check the buffer after the last round.)
__device__ __forceinline__ unsigned word32(u64 line, int w, unsigned r) {
  return (r << 16) | (unsigned)((line * 4 + (u64)w) & 0xFFFF);
}
__device__ __forceinline__ u64 word64(u64 line, int w, unsigned r) {
  return ((u64)r << 32) | ((line * 16 + (u64)w) & 0xFFFFFFFFull);
}

// How a data word that should carry (place, round `flag`) compares: 0 same round, 1 older
// (torn), 2 newer (ahead), 3 another place.
__device__ __forceinline__ int judge(unsigned round, unsigned place, unsigned want_place,
                                     unsigned flag) {
  if (place != want_place) return 3;
  return round == flag ? 0 : round < flag ? 1 : 2;
}

// ---- 16-byte lines: {d0, d1, d2, flag}, one thread's v4.u32 store --------------------------

extern "C" __global__ void write16(LineArgs a) {
  const u64 stride = (u64)gridDim.x * blockDim.x;
  for (unsigned r = 1; r <= a.rounds; ++r) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < a.nlines; i += stride) {
      unsigned* line = a.lines + i * 4;
      asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(line),
                   "r"(word32(i, 0, r)), "r"(word32(i, 1, r)), "r"(word32(i, 2, r)), "r"(r)
                   : "memory");
    }
  }
}

// The line's four words as one 16-byte load (ll.cuh's, whose field names are LL's: here
// lo, flag_lo and hi are the three data words and flag_hi the flag).
__device__ __forceinline__ uint4 load16(const unsigned* line) {
  const ipcshare::LLLine l = ipcshare::ll_load(reinterpret_cast<const char*>(line));
  return make_uint4(l.lo, l.flag_lo, l.hi, l.flag_hi);
}

extern "C" __global__ void read16(LineArgs a) {
  const u64 stride = (u64)gridDim.x * blockDim.x;
  u64 seen = 0, verdicts[4] = {0, 0, 0, 0};
  const u64 start = now_ns();
  while (now_ns() - start < a.budget_ns) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < a.nlines; i += stride) {
      const unsigned* line = a.lines + i * 4;
      uint4 v = load16(line);
      const unsigned flag = v.w;
      if (flag == 0) continue;
      if (a.reload) v = load16(line);
      ++seen;
      const unsigned data[3] = {v.x, v.y, v.z};
      for (int w = 0; w < 3; ++w)
        ++verdicts[judge(data[w] >> 16, data[w] & 0xFFFF, word32(i, w, 0), flag)];
    }
  }
  atomicAdd(a.counts + 0, seen);
  for (int k = 1; k < 4; ++k) atomicAdd(a.counts + k, verdicts[k]);
}

// ---- 128-byte lines: 16 words, 8 lanes of a warp store 16 bytes each, the flag last -------
// Lanes 8g .. 8g + 7 of a warp hold line (warp's first line + g): lane k of the eight
// stores words 2k and 2k + 1, lane 7's second word being the flag. One st.v2.u64 per lane
// puts four whole lines on the wire per warp instruction.

extern "C" __global__ void write128(LineArgs a) {
  const int lane = threadIdx.x & 31, k = lane & 7;
  const u64 warps = (u64)gridDim.x * (blockDim.x / 32);
  const u64 warp = (u64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  u64* lines = reinterpret_cast<u64*>(a.lines);
  for (unsigned r = 1; r <= a.rounds; ++r) {
    for (u64 first = warp * 4; first < a.nlines; first += warps * 4) {
      const u64 i = first + (lane >> 3);
      if (i >= a.nlines) continue;
      const u64 lo = word64(i, 2 * k, r);
      const u64 hi = k == 7 ? (u64)r : word64(i, 2 * k + 1, r);
      asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(lines + i * 16 + 2 * k),
                   "l"(lo), "l"(hi)
                   : "memory");
    }
  }
}

__device__ __forceinline__ void load128(const u64* at, u64& lo, u64& hi) {
  asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];"
               : "=l"(lo), "=l"(hi)
               : "l"(at)
               : "memory");
}

extern "C" __global__ void read128(LineArgs a) {
  const int lane = threadIdx.x & 31, k = lane & 7;
  const u64 warps = (u64)gridDim.x * (blockDim.x / 32);
  const u64 warp = (u64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const u64* lines = reinterpret_cast<const u64*>(a.lines);
  u64 seen = 0, verdicts[4] = {0, 0, 0, 0};
  const u64 start = now_ns();
  // Every lane of the warp runs every pass (the shuffles need the whole warp).
  while (true) {
    const bool more = now_ns() - start < a.budget_ns;
    if (!__any_sync(0xFFFFFFFFu, more)) break;
    for (u64 first = warp * 4; first < a.nlines; first += warps * 4) {
      const u64 i = first + (lane >> 3);
      const bool here = i < a.nlines;
      u64 lo = 0, hi = 0;
      if (here) load128(lines + i * 16 + 2 * k, lo, hi);
      // The flag: lane 7 of this lane's eight.
      const unsigned flag = (unsigned)__shfl_sync(0xFFFFFFFFu, hi, (lane & ~7) | 7);
      if (a.reload) {
        __syncwarp();
        if (here && flag != 0) load128(lines + i * 16 + 2 * k, lo, hi);
      }
      if (!here || flag == 0) continue;
      if (k == 0) ++seen;
      const u64 data[2] = {lo, hi};
      for (int h = 0; h < (k == 7 ? 1 : 2); ++h) {
        const u64 d = data[h];
        ++verdicts[judge((unsigned)(d >> 32), (unsigned)(d & 0xFFFFFFFFull),
                         (unsigned)(word64(i, 2 * k + h, 0) & 0xFFFFFFFFull), flag)];
      }
    }
  }
  atomicAdd(a.counts + 0, seen);
  for (int v = 1; v < 4; ++v) atomicAdd(a.counts + v, verdicts[v]);
}
