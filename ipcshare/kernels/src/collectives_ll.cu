// The low-latency collectives (low_latency.cuh): all-reduce one-shot and two-shot,
// reduce-scatter and all-gather over flagged 8-byte lines.
#include "collectives/entries.cuh"
#include "collectives/low_latency.cuh"

IPCSHARE_ALL_TYPES(all_reduce_ll)
IPCSHARE_TYPES(all_reduce_ll_two_shot, IPCSHARE_BOUNDED)
IPCSHARE_ALL_TYPES(reduce_scatter_ll)

extern "C" __global__ void all_gather_ll_bytes(CollectiveArgs a) { all_gather_ll(a); }
