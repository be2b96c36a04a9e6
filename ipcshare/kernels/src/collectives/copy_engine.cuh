// Copy-engine two-shot all-reduce (collectives/algorithms/gpu_copy_engine.py): the bytes
// between GPUs move by copy engine, the reduction is local. The stream runs: publish_call;
// copies of every peer's chunk of our input into slot `rank` of that peer's inbox (its
// staging area of parity 0); a flag barrier; the kernel below, which reduces our chunk
// from our input and the inbox into our output; copies of that chunk into every peer's
// result area (parity 0, at the chunk's place); a flag barrier; guard_all_reduce_output;
// local copies of the other chunks from our result area into our output. The copies'
// addresses are fixed when they are enqueued, so one set of buffers serves every call (a
// graph replays the same addresses): the second barrier keeps the next call's copies out
// until every rank has read both areas. The first copies have no barrier before them,
// and the areas they write are staging area 0, which a peer's previous call may still
// read if it was another algorithm's call of parity 0 (a one-shot's staged input, a push
// call's inbox): publish_call therefore waits until every peer has finished its previous
// call.
//
// The copy-engine all-to-all (collectives/algorithms/gpu_all_to_all_copy_engine.py) moves
// every byte by copy engine and has no work for a kernel: publish_call opens its calls,
// guard_all_to_all_output compares the digests before the copies into the output, and
// finish_call, below, closes them.
//
// A call whose ranks differ (a rank's refused call carries a mark where its digest goes,
// collectives/call_marks.py) must leave every output as it was, but a copy cannot be
// called off from the GPU once enqueued. So the last copies of both (from an area of our
// window into our output) are preceded by a guard: where the digests differ, or our error
// word holds an error, it first fills that area from the output, and the copies then write
// the output's own bytes back.
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

// Where a copy-engine call of `epoch` failed (the ranks' digests differ, recorded in our
// error word as any kernel records them, or the word holds another error of this call: a
// peer that never came), make the `nbytes` at `area` of our window equal to our output,
// which the call's last copies then copy back onto itself. An error of an earlier call
// that synchronize() has not raised yet leaves this one alone (every error word names its
// call in its low 24 bits at least). Every block compares (a few loads); the blocks share
// the copy.
__device__ __forceinline__ void keep_output_if_failed(const CollectiveArgs& a, u64 epoch,
                                                      unsigned long long area,
                                                      unsigned long long nbytes) {
  Call call;
  call.epoch = epoch;
  call.parity = (int)(epoch & 1);
  read_headers(a, call, true);
  const u64 word =
      *reinterpret_cast<const volatile u64*>(a.pads[a.rank] + ipcshare::kErrorWord);
  const bool error = word != 0 && ((word ^ epoch) & 0xFFFFFFull) == 0;
  if (!call.failed && !error) return;
  const Slice s = block_slice(nbytes, 16);
  if (s.begin < s.end)
    ipcshare::block_copy(a.windows[a.rank] + area + s.begin, a.output + s.begin,
                         s.end - s.begin);
}

// The all-to-all's guard, after the first flag barrier (every peer's block is in our inbox,
// every header published) and before the copies from the inbox into our output (count
// bytes, as our blocks lie in the output). The call is still open: its epoch is one past
// the epoch word.
extern "C" __global__ void guard_all_to_all_output(CollectiveArgs a) {
  keep_output_if_failed(a, ipcshare::begin_epoch(a.pads[a.rank], a.epoch_word),
                        a.staging_offset[0], a.count);
}

// The all-reduce's guard, after the second flag barrier (every peer's reduced chunk is in
// our result area) and before the copies from it into our output. The reducing kernel has
// ended the call: its epoch is the epoch word.
extern "C" __global__ void guard_all_reduce_output(CollectiveArgs a) {
  keep_output_if_failed(a, ipcshare::begin_epoch(a.pads[a.rank], a.epoch_word) - 1,
                        a.result_offset[0], a.count * (unsigned long long)a.itemsize);
}

// The last kernel of a copy-engine call that has no kernel of its own (the all-to-all),
// launched after its last reads of the inbox: end the call, publishing its epoch, which
// the next call's publish_call waits for before its copies write into our inbox.
extern "C" __global__ void finish_call(CollectiveArgs a) {
  Call call;
  begin_call(a, call);
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
