// The collectives of ipcshare.collectives on GPU memory: all-gather (pull, ll, ll128),
// all-reduce (one-shot, two-shot, push, ll, ll-two-shot, ll128, ll128-two-shot,
// copy-engine, stepped),
// reduce-scatter (one-shot, push, ll, ll128, stepped), all-to-all (pull, balanced, ll,
// ll128, copy-engine, push) and all-to-all-v (pull, balanced, ll, ll128, push, eager) over
// a communicator's window, in one translation unit a kernel family
// (collectives_<family>.cu, which defines its entry points with this file's macros;
// kernels/compiler.py's COLLECTIVE_UNITS maps each entry to its unit). Each algorithm's
// kernels are one file of kernels/src/collectives/ (the copy-engine all-to-all has no kernel of its own:
// copy_engine.cuh's publish_call and finish_call frame its copies), beside its Python half
// in collectives/algorithms/: args.cuh (the arguments and pad words), reduce.cuh (element
// types, reductions), call.cuh (the call protocol every algorithm shares),
// two_shot_chunks.cuh (the two-shots' chunks), then one_shot, two_shot, stepped,
// copy_engine, push, low_latency, low_latency_128, all_reduce_ll128, all_to_all,
// all_to_all_balanced, all_to_all_ll, all_to_all_ll128, all_to_all_push, all_to_all_v_push
// and all_to_all_v_eager. What follows describes the one-barrier kernels; push.cuh, low_latency.cuh and the all-to-all
// files describe their own.
//
// One kernel per call, nothing else on the stream: every thread block copies its slice of
// the user's input into this rank's staging area, publishes the call's header in its pad,
// meets the same block of every peer (call_barrier), then reads and reduces its slice
// from every rank. Slices are the same on every rank (the grid and the cut depend on the
// call's signature only), so a block's barrier covers exactly the bytes it then reads and
// no grid-wide barrier is needed. Staging areas and headers alternate with the parity of
// the device-side epoch; a rank can be at most one call ahead of a peer (its next entry
// barrier waits for the peer's next kernel, which starts after the peer's current one has
// finished), so it never overwrites what a peer still reads. Ranks that share a GPU run
// the same collectives as stepped calls instead: two kernels with the stream's own barrier
// between them, so no kernel spins (stepped.cuh).
//
// Reductions follow ipcshare/collectives/reduction.py bit for bit: float32 additions in
// rank order with IEEE round-to-nearest (inline PTX add.rn.f32: no contraction into FMA
// and no flush of subnormals, whatever the compile options), 16-bit floats converted
// exactly to float32 and rounded once at the end; int32 wraps; max / min are IEEE
// maximum / minimum (-0.0 < +0.0, any NaN gives the canonical quiet NaN).
//
// Entry points: <collective>_<dtype>_<op>, e.g. all_reduce_one_shot_bfloat16_sum.
//
// Every entry is launched with 512 threads a block (gpu_kernel.py's THREADS), where a
// thread may have 128 registers. A kernel the compiler gives more fails every launch
// (CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES): the LL two-shot, waiting on every peer's line at
// once in both its rounds, took 146. Bound to the block (IPCSHARE_BOUNDED), it spills a
// little instead; the others are left as the compiler makes them (a bound lets it spend
// registers it did not need before, and their timings were measured that way).
// tests/unit/test_kernels.py checks every entry's registers against the block.
#pragma once

#include "collectives/args.cuh"
#include "collectives/reduce.cuh"

#define IPCSHARE_UNBOUNDED
#define IPCSHARE_BOUNDED __launch_bounds__(512, 1)

#define IPCSHARE_REDUCTIONS(NAME, TYPE, TYPENAME, BOUND)                                    \
  extern "C" __global__ void BOUND NAME##_##TYPENAME##_sum(CollectiveArgs a) {             \
    NAME<TYPE, kSum>(a);                                                                   \
  }                                                                                        \
  extern "C" __global__ void BOUND NAME##_##TYPENAME##_max(CollectiveArgs a) {             \
    NAME<TYPE, kMax>(a);                                                                   \
  }                                                                                        \
  extern "C" __global__ void BOUND NAME##_##TYPENAME##_min(CollectiveArgs a) {             \
    NAME<TYPE, kMin>(a);                                                                   \
  }

#define IPCSHARE_TYPES(NAME, BOUND)                   \
  IPCSHARE_REDUCTIONS(NAME, F32, float32, BOUND)      \
  IPCSHARE_REDUCTIONS(NAME, F16, float16, BOUND)      \
  IPCSHARE_REDUCTIONS(NAME, BF16, bfloat16, BOUND)    \
  IPCSHARE_REDUCTIONS(NAME, I32, int32, BOUND)
#define IPCSHARE_ALL_TYPES(NAME) IPCSHARE_TYPES(NAME, IPCSHARE_UNBOUNDED)
