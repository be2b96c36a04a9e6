// Where the two-shot all-reduces (two_shot.cuh, push.cuh, copy_engine.cuh, the LL two-shot
// of low_latency.cuh) cut their input: chunk p, reduced by rank p, is ceil(count / n)
// elements rounded up to 16 bytes, the last chunks shorter or empty. Whole 16-byte
// granules keep every chunk's start aligned for vector loads and make a chunk whole LL
// lines. Plain C++ that compiles on the host too: tests/unit/test_ll_two_shot.py compiles
// this file and checks the Python side's chunks (gpu_two_shot.py) against it.
#pragma once

#include <ipcshare/host_device.cuh>

namespace ipcshare {
namespace two_shot_chunks {

typedef unsigned long long u64;

// Elements of a full chunk of a `count`-element array of `itemsize`-byte elements (1, 2,
// 4, 8 or 16) over `nranks` ranks.
IPCSHARE_HD u64 chunk_elements(u64 count, u64 nranks, u64 itemsize) {
  const u64 granule = 16 / itemsize;
  return ((count + nranks - 1) / nranks + granule - 1) / granule * granule;
}

// Elements of chunk p, chunks being `chunk` elements (chunk_elements).
IPCSHARE_HD u64 chunk_length(u64 count, u64 chunk, u64 p) {
  const u64 first = p * chunk;
  if (first >= count) return 0;
  return count - first < chunk ? count - first : chunk;
}

}  // namespace two_shot_chunks
}  // namespace ipcshare
