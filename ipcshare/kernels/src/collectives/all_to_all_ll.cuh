// All-to-all, low-latency (collectives/algorithms/gpu_all_to_all_ll.py): the LL protocol of
// low_latency.cuh for small all-to-alls. Pull and balanced meet their peers before they
// copy (and again after, where an input is read in place): a round trip over NVLink each.
// Here rank r pushes block p of its input into its own slot of rank p's LL buffer, as
// lines that carry the call's flag (ll.cuh), exactly as reduce_scatter_ll pushes block p
// to rank p; then it waits on its own buffer for block r of every peer. One kernel, no
// barrier: the time is a launch plus one NVLink write.
//
// Lines and threads. count is the input's bytes, n blocks of count / n. Thread i of the
// grid owns lines j = i, i + stride, ... of every block: it pushes line j of each peer's
// block, and after the digests it stores line j of each output block (its own from its
// input, the others from their sources' slots). Line j of block s is bytes
// [s * block + 8j, s * block + 8j + 8) cut at the block's end, in the input and in the
// output alike (load_payload / store_payload).
//
// In place (output is input): our own block is already where it belongs. Output bytes of
// block s (s a peer) are the input bytes that go to rank s, and only the thread owning
// line j reads (pushes) or writes line j of block s; it pushes all its lines before
// ll_check_digests, which comes before its first store. So no byte is overwritten before
// it has left, whatever order threads and blocks run in, and nothing is staged.
//
// Every LL guarantee holds as for the other LL kernels: ll_begin / ll_end keep the epoch
// on the device (graphs replay with no host reset); every rank waits for every peer's
// digest line, empty blocks included, so a sender is never more than one call ahead (the
// parity argument of ll.cuh); the digests are checked before any store, so a call whose
// ranks disagree leaves the output untouched; a rank reads only its own input and its own
// buffer (aliasing_safe: an input that is the user's memory or in the heap is never read
// by a peer).
#pragma once

#include <ipcshare/ll.cuh>

#include "collectives/low_latency.cuh"

__device__ void all_to_all_ll(const CollectiveArgs& a) {
  const int n = a.nranks, me = a.rank;
  const unsigned long long block = a.count / n;  // bytes each rank sends each rank
  const unsigned long long lines = (block + ipcshare::kLinePayload - 1) / ipcshare::kLinePayload;
  const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  const unsigned long long first = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
  LLCall call = ll_begin(a);
  for (unsigned long long j = first; j < lines; j += stride)
    ll_push_blocks(a, call, a.input, block, j);  // every peer's line j, loads first
  ll_check_digests(a, call);
  const bool in_place = a.output == a.input;
  const char* own_in = a.input + me * block;
  char* own_out = a.output + me * block;
  const bool own_in_aligned = ((unsigned long long)own_in & 7ull) == 0;
  const bool own_out_aligned = ((unsigned long long)own_out & 7ull) == 0;
  for (unsigned long long j = first; j < lines && !call.failed; j += stride) {
    // Our own line is loaded first and stored last: its load is in flight while we wait.
    const u64 own = in_place ? 0 : ipcshare::load_payload(own_in, j, block, own_in_aligned);
    for (int step = 1; step < n; ++step) {
      // Rank me - step pushes to us at its step `step`: the earliest first.
      const int source = (me - step + n) % n;
      u64 data;
      if (!ll_receive(a, call, source, j, data)) {
        call.failed = true;
        break;
      }
      char* received = a.output + source * block;
      ipcshare::store_payload(received, j, block, ((unsigned long long)received & 7ull) == 0,
                              data);
    }
    if (!call.failed && !in_place)
      ipcshare::store_payload(own_out, j, block, own_out_aligned, own);
  }
  ll_end(a, call);
}
