#pragma once
/// \file
/// Portability macros shared by host and CUDA code. No CUDA header is included here.
#if defined(__CUDACC__)
#define DHISPARSE_HD __host__ __device__
#else
#define DHISPARSE_HD
#endif
