// A kernel that does nothing. `--after-kernel` launches it on the stream before every timed
// operation, so a collective is timed the way it runs in an application: right after the
// kernel that produced its input (some copy-engine paths are slower then; docs/BENCHMARKS.md,
// "After a kernel").
extern "C" __global__ void empty_kernel() {}
