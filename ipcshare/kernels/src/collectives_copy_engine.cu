// The copy-engine collectives (copy_engine.cuh): the all-reduce's reducing kernel, and
// publish_call, guard_all_to_all_output, guard_all_reduce_output and finish_call, which
// frame the copy-engine all-reduce's and all-to-all's copies (defined in copy_engine.cuh
// itself).
#include "collectives/entries.cuh"
#include "collectives/copy_engine.cuh"

IPCSHARE_ALL_TYPES(all_reduce_copy_engine)
