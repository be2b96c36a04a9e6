// A stream-ordered device barrier over every rank of a window: one block, thread t
// signals and waits for rank t. Later work on the stream sees every rank's writes from
// before the barrier.
#include <ipcshare/signal.cuh>

using ipcshare::u64;
using ipcshare::kMaxRanks;

struct BarrierArgs {
  u64* pads[kMaxRanks];
  u64 epoch;
  u64 timeout_ns;
  int rank;
  int nranks;
  int slot_base;
};

extern "C" __global__ void device_barrier(BarrierArgs a) {
  ipcshare::block_barrier(a.pads, a.rank, a.nranks, a.slot_base, a.epoch, a.timeout_ns);
}
