// Copy-engine two-shot all-reduce (collectives/algorithms/gpu_copy_engine.py): the bytes
// between GPUs move by copy engine, the reduction is local. The stream runs: publish_call;
// copies of every peer's chunk of our input into slot `rank` of that peer's inbox (its
// staging area of parity 0); a flag barrier; the kernel below, which reduces our chunk
// from our input and the inbox into our output; copies of that chunk into every peer's
// result area (parity 0, at the chunk's place); a flag barrier; local copies of the other
// chunks from our result area into our output. The copies' addresses are fixed when they
// are enqueued, so one set of buffers serves every call (a graph replays the same
// addresses): the second barrier keeps the next call's copies out until every rank has
// read both areas. The first copies have no barrier before them, and the areas they
// write are staging area 0, which a peer's previous call may still read if it was
// another algorithm's call of parity 0 (a one-shot's staged input, a push call's inbox):
// publish_call therefore waits until every peer has finished its previous call.
//
// The copy-engine all-to-all (collectives/algorithms/gpu_all_to_all_copy_engine.py) moves
// every byte by copy engine and has no work for a kernel: publish_call opens its calls and
// finish_call, below, closes them.
#pragma once

#include "collectives/call.cuh"
#include "collectives/reduce.cuh"

// Publish the call's header (its digest, for the kernel after the barrier to compare),
// once every peer's epoch word (the calls it has finished, which end_epoch publishes)
// has reached our previous call.
extern "C" __global__ void publish_call(CollectiveArgs a) {
  Call call;
  begin_call(a, call);
  if (blockIdx.x != 0) return;
  if (threadIdx.x == 0) publish_header(a, call.parity);
  const int t = threadIdx.x;
  if (t < a.nranks && t != a.rank &&
      !ipcshare::wait_signal(a.pads[t] + a.epoch_word, call.epoch - 1, a.timeout_ns))
    ipcshare::record_timeout(a.pads[a.rank], t, call.epoch);
}

// The last kernel of a copy-engine call that has no kernel of its own (the all-to-all,
// collectives/algorithms/gpu_all_to_all_copy_engine.py), launched after its last reads of
// the inbox: compare every rank's digest of this call (a disagreement goes into our error
// word, which synchronize() raises; every rank compares every header, so every rank
// raises), then end the call: publish its epoch, which the next call's publish_call
// waits for before its copies write into our inbox. The headers were published before the
// peers' first flag barrier, which our stream has passed.
extern "C" __global__ void finish_call(CollectiveArgs a) {
  Call call;
  begin_call(a, call);
  read_headers(a, call, true);
  ipcshare::end_epoch(a.pads[a.rank], a.epoch_word, call.epoch);
}

template <class T, int OP>
__device__ void all_reduce_copy_engine(const CollectiveArgs& a) {
  const unsigned long long size = sizeof(typename T::Bits), chunk = two_shot_chunk<T>(a);
  const Slice s = block_slice(chunk, granule<T>());
  Call call;
  begin_call(a, call);
  read_headers(a, call, true);
  const unsigned long long first = a.rank * chunk + s.begin;
  unsigned long long last = a.rank * chunk + s.end;
  if (last > a.count) last = a.count;
  if (!call.failed && first < last) {
    const char* inbox = a.windows[a.rank] + a.staging_offset[0];
    const char* sources[kMaxRanks];
    for (int r = 0; r < a.nranks; ++r)
      sources[r] = r == a.rank ? a.input + first * size : inbox + (r * chunk + s.begin) * size;
    char* outs[1] = {a.output + first * size};
    reduce_range<T, OP>(outs, 1, sources, a.nranks, 0, last - first);
  }
  ipcshare::end_epoch(a.pads[a.rank], a.epoch_word, call.epoch);
}
