// The stepped collectives (stepped.cuh) of ranks that share a GPU: the first kernel of a
// call (stage_and_publish_<element>) and the second (all-reduce, reduce-scatter,
// all-gather after the stream's barrier); and a guest's copy of its result out.
#include "collectives/entries.cuh"
#include "collectives/stepped.cuh"

IPCSHARE_ALL_TYPES(all_reduce_stepped)
IPCSHARE_ALL_TYPES(reduce_scatter_stepped)

extern "C" __global__ void all_gather_stepped_bytes(CollectiveArgs a) {
  after_meet<PullAllGather>(a);
}

// A guest's copy of its result out of result area 0, where its leader did the call.
extern "C" __global__ void guest_copy_out_bytes(CollectiveArgs a) { guest_copy_out(a); }

// The first kernel of a stepped call, by element size (count is in elements).
struct Bytes { typedef unsigned char Bits; };
extern "C" __global__ void stage_and_publish_bytes(CollectiveArgs a) { stage_and_publish<Bytes>(a); }
extern "C" __global__ void stage_and_publish_float32(CollectiveArgs a) { stage_and_publish<F32>(a); }
extern "C" __global__ void stage_and_publish_float16(CollectiveArgs a) { stage_and_publish<F16>(a); }
extern "C" __global__ void stage_and_publish_bfloat16(CollectiveArgs a) { stage_and_publish<BF16>(a); }
extern "C" __global__ void stage_and_publish_int32(CollectiveArgs a) { stage_and_publish<I32>(a); }
