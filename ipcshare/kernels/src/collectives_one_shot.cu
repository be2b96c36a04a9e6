// The one-barrier collectives (one_shot.cuh, two_shot.cuh): all-reduce one-shot and
// two-shot, reduce-scatter one-shot, all-gather pull. collectives/entries.cuh says how the
// kernels of a call meet their peers and reduce.
#include "collectives/entries.cuh"
#include "collectives/one_shot.cuh"
#include "collectives/two_shot.cuh"

IPCSHARE_ALL_TYPES(all_reduce_one_shot)
IPCSHARE_ALL_TYPES(all_reduce_two_shot)
IPCSHARE_ALL_TYPES(reduce_scatter_one_shot)

extern "C" __global__ void all_gather_pull_bytes(CollectiveArgs a) { one_kernel<PullAllGather>(a); }
