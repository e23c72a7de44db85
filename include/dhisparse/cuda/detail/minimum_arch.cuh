#pragma once
/// \file
/// Stops device compilation for an architecture older than the CUDA backend needs
/// (DHISPARSE_CUDA_MINIMUM_ARCH), with a message that says what to set, instead of the
/// "identifier __reduce_add_sync is undefined" errors that would follow. Every public CUDA header
/// includes it first.
#include "../../detail/config.hpp"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < DHISPARSE_CUDA_MINIMUM_ARCH * 10
#error "dhisparse's CUDA backend needs compute capability 8.0 (sm_80) or newer, but this device pass compiles for an older architecture. Set CMAKE_CUDA_ARCHITECTURES to 80 or newer (e.g. 90 for H100/H200; no entry below 80), or pass nvcc -arch=sm_80 or newer."
#endif
