// A stream-ordered device barrier over every rank of a window: one block, thread t
// signals and waits for rank t. Later work on the stream sees every rank's writes from
// before the barrier. The epoch lives on the device (word `epoch_word` of the own pad),
// so the barrier may be captured in a CUDA graph and replayed.
#include <ipcshare/signal.cuh>

using ipcshare::u64;
using ipcshare::kMaxRanks;

struct BarrierArgs {
  u64* pads[kMaxRanks];
  u64 timeout_ns;
  int rank;
  int nranks;
  int slot_base;
  int epoch_word;
};

extern "C" __global__ void device_barrier(BarrierArgs a) {
  u64* own = a.pads[a.rank];
  const u64 epoch = ipcshare::begin_epoch(own, a.epoch_word);
  ipcshare::block_barrier(a.pads, a.rank, a.nranks, a.slot_base, epoch, a.timeout_ns);
  ipcshare::end_epoch(own, a.epoch_word, epoch);
}
