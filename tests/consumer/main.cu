// Consumer of dhisparse::cuda: device code built with what the target brings (C++20, no other nvcc
// flag) and the CUDA architectures the consumer chose, or CMake's default raised by dhisparse.
// It includes the CUDA hierarchy, whose device code needs sm_80 or newer. Runs its kernel only
// where a GPU is present.
#include <dhisparse/cuda/hierarchy.cuh>
#include <dhisparse/version.hpp>

#include <cuda_runtime.h>

#include <concepts>
#include <cstdio>

/// A device function object (no extended lambda: consumers need no --extended-lambda).
struct minor_version {
  __device__ int operator()() const { return dhisparse::version_minor; }
};

template <std::integral T, class F>  // C++20 in device code
__global__ void write_version(T* out, F f) {
  *out = f();
}

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("dhisparse %s (CUDA consumer built; no GPU here, kernel not run)\n",
                dhisparse::version_string);
    return 0;
  }
  int* d = nullptr;
  int h = -1;
  if (cudaMalloc(&d, sizeof(int)) != cudaSuccess) return 1;
  write_version<<<1, 1>>>(d, minor_version{});
  const bool ok = cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess &&
                  h == dhisparse::version_minor;
  cudaFree(d);
  std::printf("dhisparse %s (CUDA consumer, kernel %s)\n", dhisparse::version_string,
              ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}
