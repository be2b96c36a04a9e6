// All-to-all (even splits), push (collectives/algorithms/gpu_all_to_all_push.py): every
// byte between GPUs is a store into a peer's window or output, never a load from a peer.
// tools/probes/links/link_probe.py on 2 H200s (2026-11-28), both GPUs copying 128 MiB each way at once:
// stores 362 GB/s a direction, loads 331 (and the pull kernels stage a plain input first,
// a whole pass before any peer may read).
//
// Rank r's input is n blocks of `block` bytes (count / n); block q goes to block r of rank
// q's output. Each thread block takes the same slice of every block (block_slice of
// `block`) and cuts it into tiles (push.cuh's Tiles, of the size gpu_all_to_all_push.py
// sets). The blocks first meet once on their words 1, as the push all-gather does
// (push_meet): each publishes its header and where its output lies, then learns the
// peers'. Step j: store tile j of block q into rank q's output where rank q's header says
// we can reach it (its heap, or a registered array), else into slot r of its inbox (its
// staging area of the call's parity, slots laid out as the output's blocks); copy tile j
// of our own block from input to output (none in place); wait for the peers' tile j - 1
// (words 0) and copy it from our inbox where they could not reach our output; signal
// tile j (push_signal, after that copy: the fence then finds the stores mostly landed).
// Copies are block_copy_wide's: a block's byte offset need not be a multiple of 16.
//
// In place the output is the input: a peer storing tile t into our block q could overwrite
// bytes of our block q before we have stored them to rank q. So a rank in place says its
// output is out of reach (push_meet's output flags 0) and copies from its inbox: it
// copies tile t of block q only after storing tile t of block q itself (step t < t + 1),
// and no peer writes its input.
//
// Safety between calls is push.cuh's: the meeting tells every block that every peer has
// begun this call, and a rank writes a peer's inbox of parity p in call k, which the peer
// read last in call k - 2. No peer reads our input or output, so no exit barrier; every
// block waits for every peer's every tile, so no store into our output is still on its
// way when the call ends.
#pragma once

#include <ipcshare/trace.cuh>
#include <ipcshare/wide_copy.cuh>

#include "collectives/push.cuh"

__device__ void all_to_all_push(const CollectiveArgs& a) {
  const int n = a.nranks, me = a.rank;
  const unsigned long long block = a.count / n;
  const bool in_place = a.output == a.input;
  const Tiles tiles(block_slice(block, 16), 16, 1, a.push_tile_bytes);
  Call call;
  begin_call(a, call);
  IPCSHARE_MARK(0);  // begun
  __shared__ char* places[kMaxRanks];
  push_meet(a, call, !in_place, places);
  IPCSHARE_MARK(1);  // met, headers read
  const bool from_inbox = a.output_mapped == 0 || in_place;
  const char* inbox = a.windows[me] + a.staging_offset[call.parity];
  for (unsigned long long step = 0; step < tiles.count + 1 && !call.failed; ++step) {
    unsigned long long pushed = 0;
    if (step < tiles.count) {
      const Slice tile = tiles.tile(step);
      const unsigned long long nbytes = tile.end - tile.begin;
      for (int i = 1; i < n; ++i) {  // the next rank first: no rank is everyone's first
        const int q = (me + i) % n;
        ipcshare::block_copy_wide(places[q] + me * block + tile.begin,
                                  a.input + q * block + tile.begin, nbytes);
      }
      if (!in_place)
        ipcshare::block_copy_wide(a.output + me * block + tile.begin,
                                  a.input + me * block + tile.begin, nbytes);
      pushed = step + 1;
      if (step == 0) IPCSHARE_MARK(2);  // tile 0 stored
    }
    if (step >= 1) {
      const unsigned long long t = step - 1;
      push_wait(a, call, 0, t, /*headers_read=*/true);
      if (call.failed) break;
      if (t == 0) IPCSHARE_MARK(4);  // the peers' tile 0 came
      if (from_inbox) {
        const Slice tile = tiles.tile(t);
        for (int i = 1; i < n; ++i) {
          const int q = (me + i) % n;
          ipcshare::block_copy_wide(a.output + q * block + tile.begin,
                                    inbox + q * block + tile.begin, tile.end - tile.begin);
        }
      }
    }
    if (pushed != 0) push_signal(a, call, pushed, 0);
    if (step == 0) IPCSHARE_MARK(3);  // tile 0 signalled
  }
  IPCSHARE_MARK(5);  // every step done
  ipcshare::end_epoch(a.pads[a.rank], a.epoch_word, call.epoch);
  IPCSHARE_MARK(6);  // ended
}
