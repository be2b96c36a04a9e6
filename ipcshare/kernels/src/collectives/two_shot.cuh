// Two-shot all-reduce by kernel (collectives/algorithms/gpu_two_shot.py).
#pragma once

#include "collectives/call.cuh"
#include "collectives/reduce.cuh"

// Two-shot: chunk r (ceil(count / n) elements, rounded up to a granule; the last chunks
// shorter or empty) is reduced by rank r into its output and its result area; after the
// middle barrier every rank copies every other chunk from its owner's result area. Every
// input is read before the middle barrier, so no exit barrier is needed, and an output
// that is the input itself is safe: chunk r of ours is read by us alone, and chunk q is
// overwritten only after rank q has passed the middle barrier.
template <class T, int OP>
__device__ void all_reduce_two_shot(const CollectiveArgs& a) {
  const unsigned long long g = granule<T>(), size = sizeof(typename T::Bits);
  const unsigned long long chunk = two_shot_chunk<T>(a);
  const Slice s = block_slice(chunk, g);
  Call call;
  begin_call(a, call);
  for (int r = 0; r < a.nranks; ++r)
    stage(a, call, (r * chunk + s.begin) * size, (r * chunk + s.end) * size, a.count * size);
  meet(a, call);
  if (!call.failed) {
    const unsigned long long first = a.rank * chunk + s.begin;
    unsigned long long last = a.rank * chunk + s.end;
    if (last > a.count) last = a.count;
    if (first < last) {
      const char* sources[kMaxRanks];
      for (int r = 0; r < a.nranks; ++r) sources[r] = call.sources[r] + first * size;
      char* result = a.windows[a.rank] + a.result_offset[call.parity] + s.begin * size;
      char* outs[2] = {a.output + first * size, result};
      reduce_range<T, OP>(outs, 2, sources, a.nranks, 0, last - first);
    }
    call.failed = !call_barrier(a, call.epoch, 1);
  }
  if (!call.failed) {
    for (int step = 1; step < a.nranks; ++step) {
      const int owner = (a.rank + step) % a.nranks;
      const unsigned long long first = owner * chunk + s.begin;
      unsigned long long last = owner * chunk + s.end;
      if (last > a.count) last = a.count;
      if (first >= last) continue;
      ipcshare::block_copy(a.output + first * size,
                 a.windows[owner] + a.result_offset[call.parity] + s.begin * size,
                 (last - first) * size);
    }
  }
  call.hold_inputs = false;  // every input was read before the middle barrier
  leave(a, call);
}
