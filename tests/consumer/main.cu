// Consumer of dhisparse::cuda: device code built with the flags the target brings (C++20,
// extended lambdas). Runs its kernel only where a GPU is present.
#include <dhisparse/version.hpp>

#include <cuda_runtime.h>

#include <concepts>
#include <cstdio>

template <std::integral T>  // C++20 in device code
__global__ void write_version(T* out) {
  auto minor = [] __device__() { return dhisparse::version_minor; };  // --extended-lambda
  *out = minor();
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
  write_version<<<1, 1>>>(d);
  const bool ok = cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess &&
                  h == dhisparse::version_minor;
  cudaFree(d);
  std::printf("dhisparse %s (CUDA consumer, kernel %s)\n", dhisparse::version_string,
              ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}
