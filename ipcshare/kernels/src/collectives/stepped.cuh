// Stepped collectives, for ranks that share a GPU (collectives/algorithms/gpu_stepped.py).
// Without MPS the contexts on one GPU take turns in time slices, so a kernel spinning on a
// peer's flag holds the GPU that the peer needs to raise it: milliseconds per call. A
// stepped call never spins. Its first kernel stages the input and publishes the header;
// the stream then meets the peers with the flag barrier's stream memory operations (the
// GPU's front end waits, and another context may run meanwhile); the second kernel reads
// the headers and does the work; a second flag barrier, on the other set of words, ends
// the call, so no rank returns while a peer may still read its input. Both kernels of a
// call read the same device-side epoch (so the same parity); the second publishes it.
#pragma once

#include "collectives/call.cuh"
#include "collectives/one_shot.cuh"

// The row of the registrations table in a guest's place word.
__device__ __forceinline__ u64 guest_row(u64 place) {
  return (place >> kGuestRowShift) & ((1ull << (kGuestOffsetShift - kGuestRowShift)) - 1);
}

// The guest's memory at `place`, as mapped here: an allocation of its own that we imported
// (the word holds our address of it), a registered array's row, or its window.
__device__ __forceinline__ char* guest_place(const CollectiveArgs& a, u64 place) {
  if (place & kGuestImported) return reinterpret_cast<char*>(place >> kGuestOffsetShift);
  char* base = (place & kGuestRegistered)
      ? reinterpret_cast<char*>(a.registrations[guest_row(place) * kMaxRanks + a.rank])
      : a.windows[a.rank];
  return base + (place >> kGuestOffsetShift);
}

// A stepped kernel run by the leader of a time-sliced GPU for a guest rank
// (collectives/time_sliced.py): take the call's digest, input and output from the words
// the guest's stream wrote before it handed the call over, translated into the leader's
// mappings (the guest's window, or a registered array's row). A guest whose call differs
// keeps its own digest and nothing is staged or written: every rank finds the
// disagreement in the headers, as for calls made by the ranks themselves.
__device__ __forceinline__ void resolve_guest(CollectiveArgs& a) {
  if (a.guest == nullptr) return;
  const volatile u64* d = a.guest;
  const u64 digest = d[kGuestDigest], input = d[kGuestInput], output = d[kGuestOutput];
  if (digest != a.digest) {
    a.digest = digest;
    a.zero_copy = 1;
    a.input_offset = 0;
    return;
  }
  a.input = guest_place(a, input);
  if (input & kGuestLeaderStages) {
    a.zero_copy = 0;
  } else {
    a.zero_copy = (input & kGuestRegistered) ? 2 : 1;
    a.input_offset = input >> kGuestOffsetShift;
    a.registration_row = guest_row(input);
  }
  a.output = guest_place(a, output);
}

// The leader of a time-sliced GPU launches each stepped kernel once for itself and its
// guests: row 0 of blocks (blockIdx.y) works for the leader, row j for the j-th guest in
// guest_mask, with the arguments a guest's call had before it was placed (nothing of the
// leader's own arrays), then resolve_guest reads the guest's words. One launch instead of
// one per party (each costs the host a cuLaunchKernel and the stream a kernel boundary).
__device__ __forceinline__ void as_party(CollectiveArgs& a) {
  if (blockIdx.y == 0) return;
  u64 mask = a.guest_mask;
  for (unsigned j = 1; j < blockIdx.y; ++j) mask &= mask - 1;  // drop the guests before
  const int rank = __ffsll(static_cast<long long>(mask)) - 1;
  a.rank = rank;
  a.guest = a.pads[rank] + kGuestCallSlot;
  a.input = nullptr;
  a.output = nullptr;
  a.zero_copy = 0;
  a.input_offset = 0;
  a.registration_row = 0;
  a.output_mapped = 0;
  a.output_offset = 0;
  a.output_registration_row = 0;
  a.guest_mask = 0;
}

template <class T>
__device__ void stage_and_publish(CollectiveArgs a) {
  as_party(a);
  resolve_guest(a);
  const unsigned long long nbytes = a.count * sizeof(typename T::Bits);
  const Slice s = block_slice(nbytes, 16);
  Call call;
  begin_call(a, call);
  stage(a, call, s.begin, s.end, nbytes);
  if (blockIdx.x == 0 && threadIdx.x == 0) publish_header(a, call.parity);
}

template <class C>
__device__ __forceinline__ void after_meet(CollectiveArgs a) {
  as_party(a);
  resolve_guest(a);
  const Slice s = C::slice(a);
  Call call;
  begin_call(a, call);
  read_headers(a, call, true);
  if (!call.failed) C::work(a, call, s);
  // A guest's call done: its result may leave result area 0 (guest_copy_out). The guest
  // reads the word only after its DONE, which follows this whole kernel on our stream.
  if (a.guest != nullptr && !call.failed && blockIdx.x == 0 && threadIdx.x == 0)
    *reinterpret_cast<volatile u64*>(a.pads[a.rank] + kGuestResultSlot) = 1;
  ipcshare::end_epoch(a.pads[a.rank], a.epoch_word, call.epoch);
}

// A guest's result, copied out of its result area 0 into its output (which its leader could
// not reach, collectives/time_sliced.py) on the guest's own stream after DONE: `output`,
// `count` bytes, from windows[rank] + result_offset[0]. Only where the leader's work kernel
// did the call (kGuestResultSlot is 1): a call that failed (a rank refused it, or the ranks
// disagree) leaves the output as it was, as on every other rank. A copy-engine copy is fixed
// when it is enqueued, so only a kernel can decide this on the GPU.
__device__ __forceinline__ void guest_copy_out(const CollectiveArgs& a) {
  const volatile u64* own = a.pads[a.rank];
  if (own[kGuestResultSlot] != 1) return;
  const Slice s = block_slice(a.count, 16);
  if (s.begin < s.end)
    ipcshare::block_copy(a.output + s.begin, a.windows[a.rank] + a.result_offset[0] + s.begin,
                         s.end - s.begin);
}

template <class T, int OP>
__device__ void all_reduce_stepped(const CollectiveArgs& a) {
  after_meet<OneShotAllReduce<T, OP> >(a);
}

template <class T, int OP>
__device__ void reduce_scatter_stepped(const CollectiveArgs& a) {
  after_meet<OneShotReduceScatter<T, OP> >(a);
}
