// The 128-byte-line low-latency collectives (low_latency_128.cuh, all_reduce_ll128.cuh):
// reduce-scatter, all-reduce one-shot and two-shot, all-gather.
#include "collectives/entries.cuh"
#include "collectives/low_latency_128.cuh"
#include "collectives/all_reduce_ll128.cuh"

IPCSHARE_TYPES(reduce_scatter_ll128, IPCSHARE_BOUNDED)
IPCSHARE_TYPES(all_reduce_ll128, IPCSHARE_BOUNDED)
IPCSHARE_TYPES(all_reduce_ll128_two_shot, IPCSHARE_BOUNDED)

extern "C" __global__ void IPCSHARE_BOUNDED all_gather_ll128_bytes(CollectiveArgs a) {
  all_gather_ll128(a);
}
