// The push collectives (push.cuh): all-reduce, reduce-scatter and all-gather by tiles
// stored into the peers' windows.
#include "collectives/entries.cuh"
#include "collectives/push.cuh"

IPCSHARE_ALL_TYPES(all_reduce_push)
IPCSHARE_ALL_TYPES(reduce_scatter_push)

extern "C" __global__ void all_gather_push_bytes(CollectiveArgs a) { all_gather_push(a); }
