// ipcshare's low-latency protocol: data and its "arrived" flag travel in one store.
//
// A line is 16 bytes, {data.lo, flag, data.hi, flag}: 8 bytes of payload, each 4-byte half
// next to a copy of the flag. The sender writes a line with one 16-byte store; the reader
// polls the line until both flags equal the value it expects, then the payload beside them
// is the payload that was stored with them. That rests on an aligned 16-byte vector store
// reaching memory as one transaction, so that a half never shows a new flag beside old
// data: true of these GPUs over NVLink and in HBM, and what NCCL's LL protocol relies on;
// the PTX memory model itself promises it per 4-byte element only (docs/MEMORY-ORDERING.md
// says what is relied on and how it is tested). No fence, no separate signal: one NVLink
// write carries both, and the reader waits on its own memory.
//
// Flags are the low 32 bits of a call counter that grows by one per call (device-side, so
// CUDA graphs replay correctly). Buffers alternate by the counter's parity: a sender can be
// at most one call ahead of a reader (docs/MEMORY-ORDERING.md, "Low-latency protocol"), so
// a line of parity p holds either this call's flag or one from an earlier call of parity p,
// and the owner re-flags its whole buffer every 2^30 calls so that no earlier flag can be
// 2^32 calls old and match again. Every payload value is legal: arrival is the flag's
// business only, so all-gather stays bit-exact for every byte pattern.
#pragma once

#include <ipcshare/signal.cuh>

namespace ipcshare {

constexpr int kLineBytes = 16;
constexpr int kLinePayload = 8;

// Lines that carry `nbytes` of payload (the last one partly).
__device__ __forceinline__ unsigned long long payload_lines(unsigned long long nbytes) {
  return (nbytes + kLinePayload - 1) / kLinePayload;
}

// Store one line: payload `data`, flag `flag` (volatile: reaches the peer's memory, is not
// kept in a cache of this SM, and is not merged with other stores).
__device__ __forceinline__ void ll_store(char* line, u64 data, unsigned flag) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(line),
               "r"((unsigned)data), "r"(flag), "r"((unsigned)(data >> 32)), "r"(flag)
               : "memory");
}

// A line as loaded: {data.lo, flag, data.hi, flag}.
struct LLLine {
  unsigned lo, flag_lo, hi, flag_hi;
};

// Load `line` as it is now, with one 16-byte volatile load. Nothing waits on the result
// until it is used, so a thread can have the lines of every peer in flight at once.
__device__ __forceinline__ LLLine ll_load(const char* line) {
  LLLine l;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(l.lo), "=r"(l.flag_lo), "=r"(l.hi), "=r"(l.flag_hi)
               : "l"(line)
               : "memory");
  return l;
}

__device__ __forceinline__ bool ll_arrived(const LLLine& l, unsigned flag) {
  return l.flag_lo == flag && l.flag_hi == flag;
}

__device__ __forceinline__ u64 ll_payload(const LLLine& l) {
  return ((u64)l.hi << 32) | l.lo;
}

// Whether `line` holds flag `flag` in both halves; if so its payload is in `data`.
__device__ __forceinline__ bool ll_try_load(const char* line, unsigned flag, u64& data) {
  const LLLine l = ll_load(line);
  data = ll_payload(l);
  return ll_arrived(l, flag);
}

// Wait until `line` holds `flag`, then return its payload in `data`. Gives up after
// timeout_ns (0: never) and returns false, so a late or dead sender is reported, not hung
// on.
__device__ __forceinline__ bool ll_wait(const char* line, unsigned flag, u64& data,
                                        u64 timeout_ns) {
  if (ll_try_load(line, flag, data)) return true;
  const u64 start = now_ns();
  for (unsigned spins = 1;; ++spins) {
    if (ll_try_load(line, flag, data)) return true;
    if ((spins & 255u) == 0 && timeout_ns != 0 && now_ns() - start > timeout_ns) return false;
  }
}

// Load 8 bytes at byte 8*j of `base` (`nbytes` long): one 8-byte load when `aligned`
// (base is 8-byte aligned) and the line is whole, else byte by byte, zero past the end.
__device__ __forceinline__ u64 load_payload(const char* base, unsigned long long j,
                                            unsigned long long nbytes, bool aligned) {
  const unsigned long long first = j * kLinePayload;
  if (aligned && first + kLinePayload <= nbytes)
    return *reinterpret_cast<const u64*>(base + first);
  u64 data = 0;
  for (int k = 0; k < kLinePayload && first + k < nbytes; ++k)
    data |= (u64)(unsigned char)base[first + k] << (8 * k);
  return data;
}

// Store the payload of line j into `base` (`nbytes` long), the counterpart of
// load_payload: bytes past the end are not written.
__device__ __forceinline__ void store_payload(char* base, unsigned long long j,
                                              unsigned long long nbytes, bool aligned,
                                              u64 data) {
  const unsigned long long first = j * kLinePayload;
  if (aligned && first + kLinePayload <= nbytes) {
    *reinterpret_cast<u64*>(base + first) = data;
    return;
  }
  for (int k = 0; k < kLinePayload && first + k < nbytes; ++k)
    base[first + k] = (char)(data >> (8 * k));
}

}  // namespace ipcshare
