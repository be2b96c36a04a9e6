// All-to-all and all-to-all-v, balanced (collectives/algorithms/gpu_all_to_all_balanced.py):
// the pull kernel's protocol (stage, signal, read from every rank's input what is ours),
// with the work cut by bytes instead of by peer and copies at full width whatever the
// alignment.
//
// Plan of work (all_to_all_plan.cuh, replayed on numpy by the unit tests): block b of a
// sender stages part b of the bytes it sends (its own segment excepted: it never leaves
// the rank) and signals "part b staged" to every rank, itself included; block b of a
// receiver copies part b of the bytes it receives, from the senders' segments that part
// falls in, each after the sender's parts that hold it are signalled. Its own segment it
// copies from its input directly. Parts are equal runs of 16-byte granules of the bytes
// sent / received, so a skewed call keeps every block busy on the hot receiver and a
// zero segment costs nothing.
//
// Signals. Part b's signal is block b's barrier word of phase 0 (the word every algorithm
// of the family meets on), value (epoch << 20) + 0, the value call_barrier sends: it says
// the same thing (this block's staged bytes, the call's header and split row are
// published) and keeps the family's values growing from call to call. Block b first waits
// for part b of every sender, which is the pull kernel's meeting: after it the block reads
// the headers and the split rows; every block of every rank has then heard every peer's
// call, which keeps the staging areas' parity argument of collectives.cu (a rank is at
// most one call ahead of a peer). The other parts it needs it waits for as it gets to
// them; they were signalled by blocks of the same launch that never wait before
// signalling, so no wait depends on a block that waits.
//
// Memory ordering (docs/MEMORY-ORDERING.md): a block's stores (staging, header, split row)
// are ordered before each thread t's __threadfence_system() by the block barrier, and
// thread t then stores the signal into rank t's word with st.release.sys (block_signal's
// pattern, here with the rank itself among the receivers). A waiting thread polls its own
// pad with ld.acquire.sys, then the block synchronizes, so every thread sees the part.
//
// In place (all-to-all only; all-to-all-v in place is refused on the host): output bytes
// [d, e) are input bytes [d, e), which our own blocks stage. A block writes them only
// after our own parts that hold them have signalled (their readers are done with them);
// our own segment lies at the same place in input and output and is not copied. An input
// that peers read in place (heap, registered) is staged first by the path when in place
// (aliasing_safe is false), as for pull.
#pragma once

#include <ipcshare/trace.cuh>
#include <ipcshare/wide_copy.cuh>

#include "collectives/all_to_all.cuh"
#include "collectives/all_to_all_plan.cuh"

// Block `part`'s phase-0 barrier word for sender `q` in a pad: where "part staged" lands.
__device__ __forceinline__ int part_word(const CollectiveArgs& a, unsigned long long part,
                                         int q) {
  return a.slot_base + (int)(part * 3) * kMaxRanks + q;
}

// Signal "this block's part staged" to every rank, this one included (in place, our own
// blocks wait for it). Call it from every thread.
__device__ __forceinline__ void signal_part(const CollectiveArgs& a, u64 value) {
  __syncthreads();
  const int t = threadIdx.x;
  if (t < a.nranks) {
    __threadfence_system();
    ipcshare::put_signal(a.pads[t] + part_word(a, blockIdx.x, a.rank), value);
  }
}

// Wait for parts [first, last) of sender q (threads in parallel). Returns false on every
// thread if one never came (recorded in the error word with the call's epoch).
__device__ __forceinline__ bool wait_parts(const CollectiveArgs& a, const Call& call, int q,
                                           unsigned long long first, unsigned long long last) {
  __shared__ int missing;
  if (threadIdx.x == 0) missing = 0;
  __syncthreads();
  const u64 value = barrier_value(call.epoch, 0);
  u64* own = a.pads[a.rank];
  for (unsigned long long c = first + threadIdx.x; c < last; c += blockDim.x) {
    if (!ipcshare::wait_signal(own + part_word(a, c, q), value, a.timeout_ns)) {
      ipcshare::record_timeout(own, q, call.epoch);
      missing = 1;
    }
  }
  __syncthreads();
  const bool found = missing == 0;
  __syncthreads();  // every thread has read it before a later call resets it
  return found;
}

// kVariable: all-to-all-v (count: the input's elements, itemsize: their size); else
// all-to-all (count: the input's bytes, n equal segments).
template <bool kVariable>
__device__ __forceinline__ void all_to_all_balanced(const CollectiveArgs& a) {
  namespace plan = ipcshare::all_to_all_plan;
  const int n = a.nranks, me = a.rank;
  const unsigned long long itemsize = kVariable ? (unsigned long long)a.itemsize : 1ull;
  const unsigned long long parts = gridDim.x, part = blockIdx.x;
  Call call;
  begin_call(a, call);
  IPCSHARE_MARK(0);  // begun
  __shared__ long long sends[kMaxRanks];
  const bool own_ok = read_own_sends<kVariable>(a, sends, nullptr);
  if (kVariable) publish_split_row(a, call.parity, sends);
  // A bad row stages nothing: the checks after the first wait stop every rank.
  if (own_ok && !a.zero_copy) {
    char* staging = a.windows[me] + a.staging_offset[call.parity];
    plan::plan_stages(sends, n, me, itemsize, parts, part,
                      [&](unsigned long long at, unsigned long long nbytes) {
                        ipcshare::block_copy_wide(staging + at, a.input + at, nbytes);
                      });
  }
  IPCSHARE_MARK(1);  // staged
  if (threadIdx.x == 0) publish_header(a, call.parity);
  const u64 value = barrier_value(call.epoch, 0);
  signal_part(a, value);
  IPCSHARE_MARK(2);  // part signalled
  // Part b of every sender: the meeting after which the headers and rows are read.
  const bool met = ipcshare::block_wait(a.pads, me, n, barrier_slots(a, 0), value,
                                        a.timeout_ns, call.epoch);
  IPCSHARE_MARK(3);  // met
  __shared__ SplitRow rows[kMaxRanks];
  const bool rows_ok = read_headers_and_rows<kVariable>(a, call, met, rows, sends);
  IPCSHARE_MARK(4);  // headers and rows read
  if (rows_ok) {
    const bool in_place = !kVariable && a.output == a.input;
    bool going = true;
    plan::plan_reads(&rows[0][0], kSplitRowStride, n, me, itemsize, parts, part,
                     [&](int q, unsigned long long dst, unsigned long long src,
                         unsigned long long nbytes, unsigned long long first,
                         unsigned long long last, unsigned long long own_first,
                         unsigned long long own_last) {
                       if (!going) return;
                       if (q == me) {  // our own segment, from our input (in place: there)
                         ipcshare::block_copy_wide(a.output + dst, a.input + src, nbytes);
                         return;
                       }
                       going = wait_parts(a, call, q, first, last) &&
                               (!in_place || wait_parts(a, call, me, own_first, own_last));
                       if (going)
                         ipcshare::block_copy_wide(a.output + dst, call.sources[q] + src,
                                                   nbytes);
                     });
    if (!going) call.failed = true;
  }
  IPCSHARE_MARK(5);  // read
  leave(a, call);
  IPCSHARE_MARK(6);  // ended
}
