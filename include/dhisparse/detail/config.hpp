#pragma once
/// \file
/// Portability macros shared by host and CUDA code. No CUDA header is included here.
#if defined(__CUDACC__)
#define DHISPARSE_HD __host__ __device__
#else
#define DHISPARSE_HD
#endif

/// Oldest CUDA architecture the CUDA backend compiles for, as in CMAKE_CUDA_ARCHITECTURES:
/// compute capability 8.0 (sm_80), for the warp reductions (__reduce_add_sync) and cp.async.
/// Device code for an older architecture stops at cuda/detail/minimum_arch.cuh; dhisparse's CMake
/// reads this line.
#define DHISPARSE_CUDA_MINIMUM_ARCH 80
