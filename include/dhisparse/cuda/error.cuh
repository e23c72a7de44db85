#pragma once
/// \file
/// CUDA runtime errors as dhisparse errors: every failing runtime call made by the CUDA backend
/// throws `dhisparse::device_error` naming the call, the source line and the CUDA error.
#include "detail/minimum_arch.cuh"  // first: stops below sm_80 with a clear message
#include <cuda_runtime.h>

#include <string>

#include "../errors.hpp"

namespace dhisparse::cuda {

/// Throws `device_error` when `status` is not `cudaSuccess`.
inline void check_cuda(cudaError_t status, const char* expression, const char* file, int line) {
  if (status == cudaSuccess) return;
  throw device_error(std::string(expression) + " failed at " + file + ":" + std::to_string(line) + ": " +
                     cudaGetErrorName(status) + " (" + cudaGetErrorString(status) + ")");
}

}  // namespace dhisparse::cuda

/// Evaluates a CUDA runtime call and throws `dhisparse::device_error` if it fails.
#define DHISPARSE_CUDA_TRY(expression) ::dhisparse::cuda::check_cuda((expression), #expression, __FILE__, __LINE__)
