// Probe: what executing cold code costs a short kernel on this machine, measured the way
// bench_cuda_resolver measures a step (CUDA events around one launch, L2 flushed by a 256 MiB
// memset before each launch, median of 200). A CTA (128 or 1024 threads; 128 keeps the compute
// small beside the fetch) runs P phases separated by block barriers, each phase 4 KiB of straight-line integer code (256 instructions: 8 independent
// xor-shift chains, so the SM issues about one instruction per cycle). Two kernels with the same
// dynamic instruction stream:
//   straight  the P phases are distinct code (P x 4 KiB of SASS)
//   looped    one 4 KiB phase run P times (4 KiB of SASS)
// and three states before each launch:
//   warm      a kernel that spins 50 us on one SM (code in the SMs' instruction caches and in L2)
//   flushed   the 256 MiB memset (code evicted from L2; the SMs' caches keep what they held)
//   evicted   another kernel of 256 KiB of straight-line code on every SM, then the memset
// straight - looped is what fetching the extra code costs; flushed - warm and evicted - warm say
// where it comes from. The resolver's fused kernel is about 84 KiB of SASS, of which one entry's
// path executes a part. Measured on the H200 (2026-11-30, µs, warm / flushed / evicted):
//   1024 threads, 16 phases  straight 16.64 / 16.67 / 16.64   looped 19.71 / 19.71 / 19.71
//   128 threads, 16 phases   straight  7.23 /  7.23 /  7.26   looped  5.18 /  5.18 /  5.38
//   128 threads, 32 phases   straight 11.68 / 11.52 / 26.21   looped  7.58 /  7.58 /  7.78
// With one warp per scheduler new code costs about 0.05 µs per KiB, cold or not; at 1024 threads
// it costs nothing measurable; only ~100 KiB of code evicted from the SMs costs more. The memset
// that flushes L2 leaves the SMs' instruction caches alone.
// Built with the CUDA benchmarks as probe_cold_code (CI compiles it); by hand:
//   nvcc -O3 -arch=sm_90 -std=c++17 -o cold_code benchmarks/probes/cold_code.cu
#include <cuda_runtime.h>

#include <algorithm>
#include <utility>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "probe_timing.cuh"


constexpr int kBlock = 1024;

// 256 SASS instructions (two per step: shift and xor, eight chains); Salt makes every phase's
// code distinct so the compiler cannot share it.
template <unsigned Salt>
__device__ __forceinline__ void phase(unsigned (&x)[8]) {
#pragma unroll
  for (int i = 0; i < 16; ++i) {
#pragma unroll
    for (int c = 0; c < 8; ++c) x[c] ^= x[c] << ((Salt + i + c) % 31 + 1);
  }
}

template <unsigned... Salts>
__device__ __forceinline__ void phases(unsigned (&x)[8], std::integer_sequence<unsigned, Salts...>) {
  ((phase<Salts>(x), __syncthreads()), ...);
}

template <int P>
__global__ void __launch_bounds__(kBlock) straight(unsigned seed, unsigned* out) {
  unsigned x[8];
  for (int c = 0; c < 8; ++c) x[c] = seed + threadIdx.x * 8 + c;
  phases(x, std::make_integer_sequence<unsigned, P>{});
  unsigned r = 0;
  for (int c = 0; c < 8; ++c) r ^= x[c];
  if (r == 0x12345678u) out[0] = r;  // keeps the chains live
}

template <int P>
__global__ void __launch_bounds__(kBlock) looped(unsigned seed, unsigned* out) {
  unsigned x[8];
  for (int c = 0; c < 8; ++c) x[c] = seed + threadIdx.x * 8 + c;
#pragma unroll 1
  for (int p = 0; p < P; ++p) {
    phase<0>(x);
    __syncthreads();
  }
  unsigned r = 0;
  for (int c = 0; c < 8; ++c) r ^= x[c];
  if (r == 0x12345678u) out[0] = r;
}

// Keeps the GPU busy while the host enqueues the timed launch, as the memset does in the other
// states (otherwise the host's launch latency lands between the events).
__global__ void spin(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

enum class state { warm, flushed, evicted };

template <class Launch>
float median_us(Launch launch, state s, void* flush, size_t flush_bytes, unsigned* out, int sms, cudaStream_t st) {
  return probes::median_launch_us(
      st,
      [&](cudaStream_t q, int i) {
        if (s == state::evicted) straight<64><<<sms, kBlock, 0, q>>>(i, out);
        if (s == state::warm) spin<<<1, 32, 0, q>>>(100'000);  // about 50 us at 2 GHz
        else DHB_CHECK(cudaMemsetAsync(flush, i & 0xFF, flush_bytes, q));
      },
      launch);
}

template <int P>
void row(void* flush, size_t flush_bytes, unsigned* out, int sms, cudaStream_t st) {
  const int shapes[3][2] = {{1, 128}, {1, kBlock}, {sms, 128}};
  for (const auto& shape : shapes) {
    const int grid = shape[0], block = shape[1];
    float v[2][3];
    for (int s = 0; s < 3; ++s) {
      v[0][s] = median_us([&](cudaStream_t q) { straight<P><<<grid, block, 0, q>>>(1, out); }, state(s), flush,
                          flush_bytes, out, sms, st);
      v[1][s] = median_us([&](cudaStream_t q) { looped<P><<<grid, block, 0, q>>>(1, out); }, state(s), flush,
                          flush_bytes, out, sms, st);
    }
    std::printf("%3d phases %3d x %4d | %8.2f %8.2f %8.2f | %8.2f %8.2f %8.2f\n", P, grid, block, v[0][0], v[0][1], v[0][2],
                v[1][0], v[1][1], v[1][2]);
  }
}

int main() {
  int sms = 0;
  DHB_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const size_t flush_bytes = 256u << 20;
  void* flush = nullptr;
  DHB_CHECK(cudaMalloc(&flush, flush_bytes));
  unsigned* out = nullptr;
  DHB_CHECK(cudaMalloc(&out, sizeof(unsigned)));
  cudaStream_t st;
  DHB_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  std::printf("cold code, events, median of 200 (us); straight code is about 3.2-4 KiB of SASS per phase\n");
  std::printf("phases  CTAs x threads | straight: warm  flushed  evicted | looped: warm  flushed  evicted\n");
  row<1>(flush, flush_bytes, out, sms, st);
  row<4>(flush, flush_bytes, out, sms, st);
  row<8>(flush, flush_bytes, out, sms, st);
  row<16>(flush, flush_bytes, out, sms, st);
  row<32>(flush, flush_bytes, out, sms, st);
  return 0;
}
