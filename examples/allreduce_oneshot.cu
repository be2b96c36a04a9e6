// A user's own one-shot all-reduce (float32, sum) over an ipcshare window, for
// examples/allreduce_oneshot.py. Built from the public blocks of <ipcshare/signal.cuh>:
// block_barrier (release/acquire at system scope, a timeout that reports instead of
// hanging) and begin_epoch / end_epoch (a call counter kept on the device, so a CUDA
// graph that captured a launch replays correctly).
//
// Each rank's window holds two staging areas, used by the parity of the call counter.
// Thread block b of every rank: copies slice b of its input into its staging area, meets
// block b of every peer, then sums slice b of every rank's staging area in rank order
// into its output. Slices depend on the count and the grid only, the same on every rank,
// so a block's barrier covers exactly the bytes it reads: no grid-wide barrier. One
// barrier per call is enough: a rank writes a staging area of parity p again two calls
// later, after a barrier that each peer entered only once its previous kernel, the last
// one reading that area, had finished (one stream per rank orders them).
#include <ipcshare/signal.cuh>

using ipcshare::u64;

// Pad words of this kernel, in the window's user range [256, 511): the call counter and
// its count of finished blocks, then one barrier word per block and source rank.
constexpr int kEpochWord = ipcshare::kHostBarrierWords;
constexpr int kSlotBase = kEpochWord + 2;

struct OneShotArgs {
  char* buffers[ipcshare::kMaxRanks];  // every rank's window (Window.buffer_ptrs)
  u64* pads[ipcshare::kMaxRanks];      // every rank's signal pad (Window.signal_pad_ptrs)
  const float* input;                  // this rank's input, 16-byte aligned
  float* output;                       // this rank's output, 16-byte aligned
  unsigned long long count;            // floats per rank
  unsigned long long parity_bytes;     // where the staging area of odd calls starts
  u64 timeout_ns;                      // give up on a silent peer after this long
  int rank;
  int nranks;
};

// IEEE round-to-nearest addition that the compiler may neither fuse nor flush.
__device__ __forceinline__ float add_rn(float a, float b) {
  float r;
  asm("add.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

extern "C" __global__ void __launch_bounds__(512) one_shot_all_reduce_f32(OneShotArgs a) {
  u64* own = a.pads[a.rank];
  const u64 epoch = ipcshare::begin_epoch(own, kEpochWord);
  const unsigned long long parity_offset = (epoch & 1) ? a.parity_bytes : 0;

  // Slice b of the granules (4 floats: one 16-byte vector each).
  const unsigned long long granules = (a.count + 3) / 4;
  const unsigned long long per = (granules + gridDim.x - 1) / gridDim.x;
  unsigned long long first = per * blockIdx.x, last = first + per;
  if (first > granules) first = granules;
  if (last > granules) last = granules;
  const unsigned long long whole = a.count / 4;  // granules holding 4 floats

  float* staging = reinterpret_cast<float*>(a.buffers[a.rank] + parity_offset);
  for (unsigned long long g = first + threadIdx.x; g < last; g += blockDim.x) {
    if (g < whole) {
      reinterpret_cast<float4*>(staging)[g] = reinterpret_cast<const float4*>(a.input)[g];
    } else {
      for (unsigned long long i = 4 * g; i < a.count; ++i) staging[i] = a.input[i];
    }
  }

  // block_barrier fences this block's staged floats system-wide before it signals.
  if (ipcshare::block_barrier(a.pads, a.rank, a.nranks, kSlotBase + blockIdx.x * a.nranks,
                              epoch, a.timeout_ns)) {
    for (unsigned long long g = first + threadIdx.x; g < last; g += blockDim.x) {
      if (g < whole) {
        // Every rank's vector in flight at once. Loops over kMaxRanks, unrolled, with the
        // rank count as a guard: constant indices keep `in` in registers.
        float4 in[ipcshare::kMaxRanks];
#pragma unroll
        for (int r = 0; r < ipcshare::kMaxRanks; ++r)
          if (r < a.nranks)
            in[r] = reinterpret_cast<const float4*>(a.buffers[r] + parity_offset)[g];
        float4 sum = in[0];
#pragma unroll
        for (int r = 1; r < ipcshare::kMaxRanks; ++r) {
          if (r < a.nranks) {
            sum.x = add_rn(sum.x, in[r].x);
            sum.y = add_rn(sum.y, in[r].y);
            sum.z = add_rn(sum.z, in[r].z);
            sum.w = add_rn(sum.w, in[r].w);
          }
        }
        reinterpret_cast<float4*>(a.output)[g] = sum;
      } else {
        for (unsigned long long i = 4 * g; i < a.count; ++i) {
          float sum = reinterpret_cast<const float*>(a.buffers[0] + parity_offset)[i];
          for (int r = 1; r < a.nranks; ++r)
            sum = add_rn(sum, reinterpret_cast<const float*>(a.buffers[r] + parity_offset)[i]);
          a.output[i] = sum;
        }
      }
    }
  }
  ipcshare::end_epoch(own, kEpochWord, epoch);
}
