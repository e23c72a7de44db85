#pragma once
/// \file
/// Simple baselines of the CUDA resolver benchmark (the one-CTA-per-request peer design lives in
/// one_cta_per_request.cuh):
///  * pinned_memcpy: one large cudaMemcpyAsync host->device from pinned memory (the PCIe ceiling);
///  * naive_gather:  a flat warp-per-row zero-copy gather of exactly a step's missing rows, in the
///                   order the selections emit them, from the pinned history into a device buffer
///                   (copy only: no lookup, no cache state, no locations);
///  * claimed_gather: the same copy, each warp claiming the next group of missing rows from a
///                   device counter (one row in flight per warp), at a chosen number of warps per
///                   SM: the copy-only times dhisparse is held against are the best of these and
///                   naive_gather's;
///  * resident:      the whole history in HBM; resolving is `location = request base + row`;
///  * indexer:       a stand-in for the kernel that writes a step's selections before the resolve
///                   (the engine's top-k indexer): copies them into the batch buffer.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "common.cuh"

namespace dhisparse_bench {

/// 16-byte vectors a lane moves for a row of RowBytes (RowBytes % 16 == 0, at most 64 vectors).
template <int RowBytes>
struct row_shape {
  static_assert(RowBytes % 16 == 0 && RowBytes > 0 && RowBytes <= 1024, "rows of 16..1024 bytes, 16-byte multiples");
  static constexpr int vectors = RowBytes / 16;
  static constexpr int per_lane = (vectors + 31) / 32;
};

/// Copies one row with one warp: every lane loads its vectors first, then stores them (loads of
/// the whole row in flight before any store; the pattern of the probes in docs/h200-limits.md).
template <int RowBytes>
__device__ __forceinline__ void warp_copy_row(const int4* __restrict__ src, int4* __restrict__ dst, int lane) {
  using shape = row_shape<RowBytes>;
  int4 v[shape::per_lane];
#pragma unroll
  for (int i = 0; i < shape::per_lane; ++i) {
    const int x = lane + 32 * i;
    if (x < shape::vectors) v[i] = src[x];
  }
#pragma unroll
  for (int i = 0; i < shape::per_lane; ++i) {
    const int x = lane + 32 * i;
    if (x < shape::vectors) dst[x] = v[i];
  }
}

/// naive_gather: row i of the output is history row gidx[i] (global index q*hist + row).
template <int RowBytes>
__global__ void __launch_bounds__(512) naive_gather_kernel(const std::byte* __restrict__ history,
                                                           std::byte* __restrict__ out,
                                                           const std::int32_t* __restrict__ gidx, int n) {
  const int lane = threadIdx.x & 31;
  const int warp = static_cast<int>((blockIdx.x * blockDim.x + threadIdx.x) >> 5);
  const int warps = static_cast<int>((gridDim.x * blockDim.x) >> 5);
  for (int i = warp; i < n; i += warps) {
    const auto* src = reinterpret_cast<const int4*>(history + static_cast<std::size_t>(gidx[i]) * RowBytes);
    auto* dst = reinterpret_cast<int4*>(out + static_cast<std::size_t>(i) * RowBytes);
    warp_copy_row<RowBytes>(src, dst, lane);
  }
}

template <int RowBytes>
void launch_naive_gather(const std::byte* history, std::byte* out, const std::int32_t* gidx, int n, int sms,
                         cudaStream_t s) {
  naive_gather_kernel<RowBytes><<<sms * 4, 512, 0, s>>>(history, out, gidx, n);
}

/// Warps per CTA of claimed_gather (grid = SMs x warps per SM / this).
constexpr int claimed_warps_per_cta = 4;

/// claimed_gather: row i of the output is history row gidx[i]. Each warp claims `group` rows at a
/// time from *next (zeroed before the launch) and copies them one after the other.
template <int RowBytes>
__global__ void __launch_bounds__(32 * claimed_warps_per_cta) claimed_gather_kernel(
    const std::byte* __restrict__ history, std::byte* __restrict__ out, const std::int32_t* __restrict__ gidx, int n,
    int group, unsigned int* __restrict__ next) {
  const int lane = threadIdx.x & 31;
  while (true) {
    unsigned first = 0;
    if (lane == 0) first = atomicAdd(next, static_cast<unsigned>(group));
    first = __shfl_sync(0xffffffffu, first, 0);
    if (first >= static_cast<unsigned>(n)) return;
    const int end = min(n, static_cast<int>(first) + group);
    for (int i = static_cast<int>(first); i < end; ++i) {
      const auto* src = reinterpret_cast<const int4*>(history + static_cast<std::size_t>(gidx[i]) * RowBytes);
      auto* dst = reinterpret_cast<int4*>(out + static_cast<std::size_t>(i) * RowBytes);
      warp_copy_row<RowBytes>(src, dst, lane);
    }
  }
}

/// `next` must hold 0 (the caller zeroes it outside its timing).
template <int RowBytes>
void launch_claimed_gather(const std::byte* history, std::byte* out, const std::int32_t* gidx, int n, int group,
                           unsigned int* next, int sms, int warps_per_sm, cudaStream_t s) {
  const int grid = std::max(1, sms * warps_per_sm / claimed_warps_per_cta);
  claimed_gather_kernel<RowBytes><<<grid, 32 * claimed_warps_per_cta, 0, s>>>(history, out, gidx, n, group, next);
}

/// Translation scrub: one 16-byte store every `stride` bytes of a buffer of `bytes`, so that the
/// GPU's address translation caches hold the buffer's pages and none of the rows' or the
/// resolver state's (a store per 4 KiB touches every page whatever page size backs it).
__global__ void __launch_bounds__(256) translation_scrub_kernel(std::byte* __restrict__ p, std::size_t bytes,
                                                                std::size_t stride, int tag) {
  const std::size_t touches = bytes / stride;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < touches;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    *reinterpret_cast<int4*>(p + i * stride) = make_int4(tag, tag, tag, tag);
}

inline void launch_translation_scrub(std::byte* p, std::size_t bytes, std::size_t stride, int tag, int sms,
                                     cudaStream_t s) {
  if (bytes >= stride) translation_scrub_kernel<<<sms * 8, 256, 0, s>>>(p, bytes, stride, tag);
}

/// resident: loc[b*k + j] = req[b]*hist + sel[b*k + j] (-1 passes). Four entries per thread.
__global__ void __launch_bounds__(256) resident_locations_kernel(const int4* __restrict__ sel, int4* __restrict__ loc,
                                                                 const std::int32_t* __restrict__ req, int vec_per_item,
                                                                 int vectors, int hist) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= vectors) return;
  const int base = req[i / vec_per_item] * hist;
  int4 s = sel[i];
  s.x = s.x < 0 ? -1 : base + s.x;
  s.y = s.y < 0 ? -1 : base + s.y;
  s.z = s.z < 0 ? -1 : base + s.z;
  s.w = s.w < 0 ? -1 : base + s.w;
  loc[i] = s;
}

/// Requires k % 4 == 0 and 16-byte aligned selection/location arrays.
inline void launch_resident(const std::int32_t* sel, std::int32_t* loc, const std::int32_t* req, int C, int k, int hist,
                            cudaStream_t s) {
  const int vectors = C * k / 4;
  resident_locations_kernel<<<(vectors + 255) / 256, 256, 0, s>>>(reinterpret_cast<const int4*>(sel),
                                                                   reinterpret_cast<int4*>(loc), req, k / 4, vectors,
                                                                   hist);
}

/// indexer: dst[i] = src[i] for C * k selection entries, in 16-byte vectors (k % 4 == 0).
__global__ void __launch_bounds__(256) indexer_standin_kernel(const int4* __restrict__ src, int4* __restrict__ dst,
                                                              int vectors) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < vectors) dst[i] = src[i];
}

inline void launch_indexer_standin(const std::int32_t* sel, std::int32_t* batch_sel, int C, int k, cudaStream_t s) {
  const int vectors = C * k / 4;
  indexer_standin_kernel<<<(vectors + 255) / 256, 256, 0, s>>>(reinterpret_cast<const int4*>(sel),
                                                               reinterpret_cast<int4*>(batch_sel), vectors);
}

}  // namespace dhisparse_bench
