// Push collectives (collectives/algorithms/gpu_push.py). Every byte between GPUs is a store
// into a peer's window, never a load from one: NVLink carries the SMs' stores faster than
// their remote loads come back. A block cuts its slice into tiles and signals each tile
// on its own (step t + 1 for tile t, barrier_value). It stores tile t + 1 before it waits
// for tile t, and signals only after reducing tile t, so the fence before the signal finds
// the stores mostly landed (push_signal).
//
// All-reduce (two-shot): rank q owns chunk q (two_shot_chunk). Every rank stores tile t
// of chunk q of its input into its slot of rank q's inbox (q's staging area of the call's
// parity) and signals on the block's words 0; rank q reduces tile t of its chunk from its
// own input and the inbox in rank order, into its output and into every peer's result
// area (parity), and signals on words 1; every rank then copies tile t of the other chunks
// from its result area into its output. Reduce-scatter is the first half: rank q's output
// is the reduction of block q.
//
// Safety. No peer reads our input or output, so the call needs no exit barrier, and in
// place is safe (a tile of our input is stored out by the same block before it writes
// that tile of the output). Where our header says a peer can reach our output (our heap,
// or a registered array), peer q stores its reduced chunk q there itself and we copy
// nothing: it stores tile t only after our signal of tile t in this call, so our stream
// has reached this call, and in place we have stored that tile of our input out by then;
// our own reduction reads only our chunk of the input, which no peer writes.
// A rank writes a peer's areas of parity p in call k; the peer read them last in call
// k - 2. Our call k - 1 heard the peer's call k - 1 in every block
// (whatever the algorithm: every one of the family meets or hears every peer before it
// ends), and the peer's call k - 1 began after its call k - 2 had ended on its stream, so
// those areas are free when call k begins. The result area of a peer is written only
// after its signal of this call's tile, so the same holds for areas of any fixed place
// (the copy-engine all-reduce's). Every block signals and waits for tile 0 even where its
// slice is empty: that is where it compares the peers' digests, so ranks making different
// calls all stop there.
#pragma once

#include "collectives/call.cuh"
#include "collectives/reduce.cuh"

// Bytes per tile where the arguments do not say (gpu_push.py has the measured default).
constexpr unsigned long long kPushTileBytes = 512ull << 10;

// The tiles of a block's slice [s.begin, s.end) of elements: at least one (possibly empty),
// each of `per` elements (a multiple of the granule, so vector loads stay aligned), and
// never so many that a step leaves kStepBits.
struct Tiles {
  unsigned long long begin, end, per, count;
  __device__ __forceinline__ Tiles(Slice s, unsigned long long granule,
                                   unsigned long long itemsize, unsigned long long tile_bytes) {
    begin = s.begin;
    end = s.end;
    per = (tile_bytes != 0 ? tile_bytes : kPushTileBytes) / itemsize / granule * granule;
    if (per == 0) per = granule;
    const unsigned long long most = (1ull << kStepBits) - 2;
    const unsigned long long n = end - begin;
    if ((n + per - 1) / per > most) per = ((n + most - 1) / most + granule - 1) / granule * granule;
    count = n == 0 ? 1 : (n + per - 1) / per;
  }
  // Tile t as [first, last) elements, relative to the chunk (or block).
  __device__ __forceinline__ Slice tile(unsigned long long t) const {
    unsigned long long first = begin + t * per, last = first + per;
    if (first > end) first = end;
    if (last > end) last = end;
    return Slice{first, last};
  }
};

// Wait for tile t's signals on `phase`'s words. At tile 0 it also reads the headers (the
// peers published theirs before their first signal) and compares digests, unless the
// block has done so already (`headers_read`: the all-gather's entry meeting).
__device__ __forceinline__ void push_wait(const CollectiveArgs& a, Call& call, int phase,
                                          unsigned long long t, bool headers_read = false) {
  const bool met = ipcshare::block_wait(a.pads, a.rank, a.nranks, barrier_slots(a, phase),
                                        barrier_value(call.epoch, t + 1), a.timeout_ns,
                                        call.epoch);
  if (phase == 0 && t == 0 && !headers_read) read_headers(a, call, met);
  else call.failed = call.failed || !met;
}

// Tell every peer how many tiles this block has stored into it (`pushed`, on words 0) and
// reduced for it (`reduced`, on words 1); 0 leaves a word as it is. One fence covers both,
// and it comes after the block's reduction work, so the stores it waits for have had that
// long to land (a fence right after the stores waited for every one of them: tiles of
// 8 KiB took 2.5 times as long as tiles of 32 KiB on one H100).
__device__ __forceinline__ void push_signal(const CollectiveArgs& a, const Call& call,
                                            unsigned long long pushed,
                                            unsigned long long reduced) {
  __syncthreads();
  const int t = threadIdx.x;
  if (t >= a.nranks || t == a.rank) return;
  __threadfence_system();
  if (pushed != 0)
    ipcshare::put_signal(a.pads[t] + barrier_slots(a, 0) + a.rank,
                         barrier_value(call.epoch, pushed));
  if (reduced != 0)
    ipcshare::put_signal(a.pads[t] + barrier_slots(a, 1) + a.rank,
                         barrier_value(call.epoch, reduced));
}

// Store tile `tile` of run q of our input (runs of `run` elements, the last ones clipped
// to `count`) into our slot of rank q's inbox, whose slots are `slot_stride` elements apart.
template <class T>
__device__ __forceinline__ void push_to_inbox(const CollectiveArgs& a, const Call& call, int q,
                                              unsigned long long run,
                                              unsigned long long slot_stride, Slice tile,
                                              unsigned long long count) {
  const unsigned long long size = sizeof(typename T::Bits);
  const unsigned long long first = q * run + tile.begin;
  unsigned long long last = q * run + tile.end;
  if (last > count) last = count;
  if (first >= last) return;
  char* inbox = a.windows[q] + a.staging_offset[call.parity];
  char* slot = inbox + (a.rank * slot_stride + tile.begin) * size;
  ipcshare::block_fanout(&slot, 1, a.input + first * size, (last - first) * size);
}

// Publish where our output lies (the kHeaderOutput* words of this call's header).
__device__ __forceinline__ void publish_output(const CollectiveArgs& a, int parity) {
  u64* h = header(a.pads[a.rank], a, parity);
  h[kHeaderOutput] = a.output_offset;
  h[kHeaderOutputFlags] = a.output_mapped == 2 ? (kFlagZeroCopy | kFlagRegistered)
                          : a.output_mapped   ? kFlagZeroCopy : 0;
  h[kHeaderOutputRegistration] = a.output_registration_row;
}

// After the first wait (the peers' headers are published): where to store into each
// peer, as a pointer to byte 0 of its output when the peer's output is within our reach
// (its heap or a registered array), else to byte 0 of its area at `fallback_offset` of its
// window (the all-reduce's result area, the all-gather's inbox). Every thread of the
// block gets the same places.
__device__ __forceinline__ void result_places(const CollectiveArgs& a, const Call& call,
                                              unsigned long long fallback_offset,
                                              char** places) {
  if (threadIdx.x < a.nranks) {
    const int r = threadIdx.x;
    const u64* h = header(a.pads[r], a, call.parity);
    const u64 flags = h[kHeaderOutputFlags];
    char* base = a.windows[r] + fallback_offset;
    if (flags & kFlagZeroCopy) {
      base = (flags & kFlagRegistered)
          ? reinterpret_cast<char*>(a.registrations[h[kHeaderOutputRegistration] * kMaxRanks + r])
          : a.windows[r];
      base += h[kHeaderOutput];
    }
    places[r] = base;
  }
  __syncthreads();
}

// The meeting of the push kernels that store into peers' outputs before any signal (the
// all-gather, the all-to-all): publish the header and where our output lies (out of reach
// unless `output_reachable`: then peers store into our inbox), meet the same block of
// every peer on words 1, read the peers' headers, and learn where to store into each
// (result_places, with each peer's inbox, its staging area of the call's parity, where its
// output is out of reach). `places` is the caller's __shared__ array.
__device__ __forceinline__ void push_meet(const CollectiveArgs& a, Call& call,
                                          bool output_reachable, char** places) {
  if (threadIdx.x == 0) {
    publish_header(a, call.parity);
    publish_output(a, call.parity);
    if (!output_reachable) header(a.pads[a.rank], a, call.parity)[kHeaderOutputFlags] = 0;
  }
  const int entered = barrier_slots(a, 1);
  ipcshare::block_signal(a.pads, a.rank, a.nranks, entered, barrier_value(call.epoch, 1));
  read_headers(a, call, ipcshare::block_wait(a.pads, a.rank, a.nranks, entered,
                                             barrier_value(call.epoch, 1), a.timeout_ns,
                                             call.epoch));
  if (!call.failed) result_places(a, call, a.staging_offset[call.parity], places);
}

template <class T, int OP>
__device__ void all_reduce_push(const CollectiveArgs& a) {
  const unsigned long long size = sizeof(typename T::Bits), g = granule<T>();
  const unsigned long long chunk = two_shot_chunk<T>(a);
  const Tiles tiles(block_slice(chunk, g), g, size, a.push_tile_bytes);
  Call call;
  begin_call(a, call);
  if (threadIdx.x == 0) {
    publish_header(a, call.parity);
    publish_output(a, call.parity);
  }
  const char* inbox = a.windows[a.rank] + a.staging_offset[call.parity];
  const char* results = a.windows[a.rank] + a.result_offset[call.parity];
  __shared__ char* places[kMaxRanks];
  // Step j: store tile j; wait for the peers' tile j - 1, reduce it and store the result;
  // signal both; wait for the peers' results of tile j - 2 and copy them (unless they
  // stored them into our output itself). Each wait is for a signal a peer sends at the end
  // of its step j - 1.
  for (unsigned long long step = 0; step < tiles.count + 2 && !call.failed; ++step) {
    unsigned long long pushed = 0, reduced = 0;
    if (step < tiles.count) {
      const Slice tile = tiles.tile(step);
      for (int i = 1; i < a.nranks; ++i)
        push_to_inbox<T>(a, call, (a.rank + i) % a.nranks, chunk, chunk, tile, a.count);
      pushed = step + 1;
    }
    if (step >= 1 && step <= tiles.count) {
      const unsigned long long t = step - 1;
      push_wait(a, call, 0, t);
      if (call.failed) break;
      if (t == 0) result_places(a, call, a.result_offset[call.parity], places);
      const Slice tile = tiles.tile(t);
      const unsigned long long first = a.rank * chunk + tile.begin;
      unsigned long long last = a.rank * chunk + tile.end;
      if (last > a.count) last = a.count;
      if (first < last) {
        const char* sources[kMaxRanks];
        char* outs[kMaxRanks];
        int nouts = 0;
        outs[nouts++] = a.output + first * size;
        for (int r = 0; r < a.nranks; ++r) {
          sources[r] = r == a.rank ? a.input + first * size
                                   : inbox + (r * chunk + tile.begin) * size;
          if (r != a.rank) outs[nouts++] = places[r] + first * size;
        }
        reduce_range<T, OP>(outs, nouts, sources, a.nranks, 0, last - first);
      }
      reduced = t + 1;
    }
    if (pushed != 0 || reduced != 0) push_signal(a, call, pushed, reduced);
    if (step >= 2) {
      const unsigned long long t = step - 2;
      push_wait(a, call, 1, t);
      if (call.failed) break;
      if (a.output_mapped != 0) continue;  // the peers stored their chunks in place
      const Slice tile = tiles.tile(t);
      for (int i = 1; i < a.nranks; ++i) {
        const int owner = (a.rank + i) % a.nranks;
        const unsigned long long first = owner * chunk + tile.begin;
        unsigned long long last = owner * chunk + tile.end;
        if (last > a.count) last = a.count;
        if (first < last)
          ipcshare::block_copy(a.output + first * size, results + first * size,
                               (last - first) * size);
      }
    }
  }
  ipcshare::end_epoch(a.pads[a.rank], a.epoch_word, call.epoch);
}

// Reduce-scatter: count is the input's elements; rank q's output is the reduction of
// block q (count / n elements). Inbox slots are a block rounded up to a granule apart, so
// every slot starts 16-byte aligned.
template <class T, int OP>
__device__ void reduce_scatter_push(const CollectiveArgs& a) {
  const unsigned long long size = sizeof(typename T::Bits), g = granule<T>();
  const unsigned long long block = a.count / a.nranks;
  const unsigned long long stride = (block + g - 1) / g * g;
  const Tiles tiles(block_slice(block, g), g, size, a.push_tile_bytes);
  Call call;
  begin_call(a, call);
  if (threadIdx.x == 0) publish_header(a, call.parity);
  const char* inbox = a.windows[a.rank] + a.staging_offset[call.parity];
  // Step j: store tile j of every peer's block; wait for the peers' tile j - 1 and reduce
  // it; signal tile j.
  for (unsigned long long step = 0; step < tiles.count + 1 && !call.failed; ++step) {
    unsigned long long pushed = 0;
    if (step < tiles.count) {
      const Slice tile = tiles.tile(step);
      for (int i = 1; i < a.nranks; ++i)
        push_to_inbox<T>(a, call, (a.rank + i) % a.nranks, block, stride, tile,
                         block * a.nranks);
      pushed = step + 1;
    }
    if (step >= 1) {
      const unsigned long long t = step - 1;
      push_wait(a, call, 0, t);
      if (call.failed) break;
      const Slice tile = tiles.tile(t);
      if (tile.begin < tile.end) {
        const char* sources[kMaxRanks];
        for (int r = 0; r < a.nranks; ++r)
          sources[r] = r == a.rank ? a.input + (a.rank * block + tile.begin) * size
                                   : inbox + (r * stride + tile.begin) * size;
        char* outs[1] = {a.output + tile.begin * size};
        reduce_range<T, OP>(outs, 1, sources, a.nranks, 0, tile.end - tile.begin);
      }
    }
    if (pushed != 0) push_signal(a, call, pushed, 0);
  }
  ipcshare::end_epoch(a.pads[a.rank], a.epoch_word, call.epoch);
}

// All-gather (bytes; count is the input's): rank r's input goes to block r of every
// output. A peer's output place is needed before the first store, so the blocks first
// meet once on their words 1 (each publishes its header, then learns the peers'); then
// tile j of the input goes, loaded once, to every peer's output where reachable, else to
// slot r of its inbox (staging area of the parity, slots `count` bytes apart), and to our
// own block unless in place; a rank whose output is out of reach copies each peer's tile
// from its inbox once that peer has signalled it.
__device__ void all_gather_push(const CollectiveArgs& a) {
  const unsigned long long nbytes = a.count;
  const Tiles tiles(block_slice(nbytes, 16), 16, 1, a.push_tile_bytes);
  Call call;
  begin_call(a, call);
  __shared__ char* places[kMaxRanks];
  push_meet(a, call, true, places);
  char* own_block = a.output + a.rank * nbytes;
  const char* inbox = a.windows[a.rank] + a.staging_offset[call.parity];
  // Step j: store tile j everywhere; wait for the peers' tile j - 1 and copy it from the
  // inbox if they could not reach our output; signal tile j.
  for (unsigned long long step = 0; step < tiles.count + 1 && !call.failed; ++step) {
    unsigned long long pushed = 0;
    if (step < tiles.count) {
      const Slice tile = tiles.tile(step);
      char* dsts[kMaxRanks];
      int ndst = 0;
      for (int i = 1; i < a.nranks; ++i)
        dsts[ndst++] = places[(a.rank + i) % a.nranks] + a.rank * nbytes + tile.begin;
      if (own_block != a.input) dsts[ndst++] = own_block + tile.begin;
      ipcshare::block_fanout(dsts, ndst, a.input + tile.begin, tile.end - tile.begin);
      pushed = step + 1;
    }
    if (step >= 1) {
      const unsigned long long t = step - 1;
      push_wait(a, call, 0, t, /*headers_read=*/true);
      if (call.failed) break;
      if (a.output_mapped == 0) {
        const Slice tile = tiles.tile(t);
        for (int i = 1; i < a.nranks; ++i) {
          const int source = (a.rank + i) % a.nranks;
          ipcshare::block_copy(a.output + source * nbytes + tile.begin,
                               inbox + source * nbytes + tile.begin, tile.end - tile.begin);
        }
      }
    }
    if (pushed != 0) push_signal(a, call, pushed, 0);
  }
  ipcshare::end_epoch(a.pads[a.rank], a.epoch_word, call.epoch);
}
