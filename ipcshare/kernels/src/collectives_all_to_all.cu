// The all-to-all and all-to-all-v kernels (all_to_all*.cuh): pull, balanced, ll, ll128,
// push, and the -v's eager. They are the kernels with phase stamps (trace.cuh), so they
// stay one module: one stamps buffer orders every traced call (kernels/trace.py).
#include "collectives/entries.cuh"
#include "collectives/all_to_all.cuh"
#include "collectives/all_to_all_balanced.cuh"
#include "collectives/all_to_all_ll.cuh"
#include "collectives/all_to_all_ll128.cuh"
#include "collectives/all_to_all_push.cuh"
#include "collectives/all_to_all_v_push.cuh"
#include "collectives/all_to_all_v_eager.cuh"

extern "C" __global__ void all_to_all_pull_bytes(CollectiveArgs a) { all_to_all_pull<false>(a); }
extern "C" __global__ void all_to_all_v_pull_bytes(CollectiveArgs a) { all_to_all_pull<true>(a); }
extern "C" __global__ void all_to_all_ll_bytes(CollectiveArgs a) { all_to_all_ll(a); }
extern "C" __global__ void IPCSHARE_BOUNDED all_to_all_v_ll_bytes(CollectiveArgs a) {
  all_to_all_v_ll(a);
}
extern "C" __global__ void IPCSHARE_BOUNDED all_to_all_ll128_bytes(CollectiveArgs a) {
  all_to_all_ll128(a);
}
extern "C" __global__ void IPCSHARE_BOUNDED all_to_all_v_ll128_bytes(CollectiveArgs a) {
  all_to_all_v_ll128(a);
}
// The balanced copies' unrolled loads are bound to the block too.
extern "C" __global__ void IPCSHARE_BOUNDED all_to_all_balanced_bytes(CollectiveArgs a) {
  all_to_all_balanced<false>(a);
}
extern "C" __global__ void IPCSHARE_BOUNDED all_to_all_v_balanced_bytes(CollectiveArgs a) {
  all_to_all_balanced<true>(a);
}
extern "C" __global__ void IPCSHARE_BOUNDED all_to_all_push_bytes(CollectiveArgs a) {
  all_to_all_push(a);
}
extern "C" __global__ void IPCSHARE_BOUNDED all_to_all_v_push_bytes(CollectiveArgs a) {
  all_to_all_v_push(a);
}
extern "C" __global__ void IPCSHARE_BOUNDED all_to_all_v_eager_bytes(CollectiveArgs a) {
  all_to_all_v_eager(a);
}
