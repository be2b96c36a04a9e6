// IPCSHARE_HD marks arithmetic that the kernels run and that tests compile for the host
// (plain inline C++ there) and run against the Python side, so neither can drift.
#pragma once

#if defined(__CUDACC__)
#define IPCSHARE_HD __host__ __device__ __forceinline__
#else
#define IPCSHARE_HD inline
#endif
