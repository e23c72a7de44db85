#pragma once
/// \file
/// The CUDA backend's simple kernels: follower-layer replay of the last resolve's copy plan,
/// append (rows into the mapped host store and the tail), optional-page population, slot reset
/// and scalar stores. Flat grids; each launcher takes the stream last and returns cudaError_t.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "../views.cuh"
#include "last_at_or_below.cuh"
#include "programmatic_launch.cuh"
#include "resolve_kernel.cuh"
#include "rows_copied_scan.cuh"

namespace dhisparse::cuda::detail {

inline constexpr int simple_block_threads = 256;

// --------------------------------------------------------------------------------------------
// follower copy: layer-wise prefetch replays the producer's plan with the follower's own bytes

template <class OrderIndex, unsigned R>
__global__ void __launch_bounds__(512)
    follower_copy_kernel(source_view<OrderIndex> src, workspace_view ws, unsigned layer, unsigned top_k) {
  programmatic_launch_prologue();  // the resolve's plan may still be in flight
  extern __shared__ unsigned dhisparse_follower_prefix[];  // [capacity + 1]
  unsigned* prefix = dhisparse_follower_prefix;
  const unsigned C = ws.control->last_count < ws.capacity ? ws.control->last_count : ws.capacity;
  const unsigned lane = threadIdx.x & 31u;
  scan_rows_copied(ws.stats, C, prefix);
  __syncthreads();
  const unsigned total = prefix[C];
  const unsigned vecs = src.row_bytes / 16u;
  const std::uint64_t layer_offset = static_cast<std::uint64_t>(layer) * src.page_rows * src.row_bytes;
  std::byte* const pool = src.layer_pool[layer];
  const unsigned warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const unsigned warps = (gridDim.x * blockDim.x) >> 5;
  // Neighbouring warps take neighbouring plan units (ascending rows of an entry): each SM reads
  // neighbouring host rows.
  for (unsigned u0 = R * warp; u0 < total; u0 += R * warps) {
    const int4* s[R];
    int4* d[R];
    unsigned cnt = 0;
#pragma unroll
    for (unsigned k = 0; k < R; ++k) {
      s[k] = nullptr;
      d[k] = nullptr;
      const unsigned u = u0 + k;
      if (u < total) {
        const unsigned lo = last_at_or_below(prefix, C, u);  // the entry holding unit u
        const plan_entry pe = load_plan(ws.plan + static_cast<std::size_t>(lo) * top_k + (u - prefix[lo]));
        s[k] = reinterpret_cast<const int4*>(src.host_store + pe.host_offset + layer_offset);
        d[k] = reinterpret_cast<int4*>(pool + static_cast<std::size_t>(pe.dst) * src.row_bytes);
        ++cnt;
      }
    }
    warp_copy_rows<R>(s, d, cnt, vecs, lane);
  }
}

/// Launch shape of a follower copy: copying warps per SM and rows each warp keeps in flight.
/// Fewer rows in flight touch fewer host pages at once.
struct follower_copy_shape {
  unsigned warps_per_sm = 32;
  unsigned rows_per_warp = 2;
  /// The shapes a launch gives exactly, all warps resident at once: 1-16 warps per SM (one CTA)
  /// or 32 (two CTAs of 16; the kernel's registers allow no more), 1 or 2 rows each.
  static constexpr bool valid(unsigned warps, unsigned rows) {
    return ((warps >= 1 && warps <= 16) || warps == 32) && (rows == 1 || rows == 2);
  }
};

template <class OrderIndex>
cudaError_t launch_follower_copy(const source_view<OrderIndex>& src, const workspace_view& ws, unsigned layer,
                                 unsigned top_k, int sm_count, follower_copy_shape shape, cudaStream_t stream,
                                 bool programmatic = false) {
  const std::size_t smem = (static_cast<std::size_t>(ws.capacity) + 1) * sizeof(unsigned);
  // CTAs of at most 16 warps, as many per SM as the warps per SM need.
  const unsigned block_warps = shape.warps_per_sm < 16u ? shape.warps_per_sm : 16u;
  const unsigned ctas_per_sm = (shape.warps_per_sm + block_warps - 1) / block_warps;
  const dim3 grid(static_cast<unsigned>(sm_count) * ctas_per_sm), block(32u * block_warps);
  return shape.rows_per_warp == 1
             ? launch_kernel(follower_copy_kernel<OrderIndex, 1>, grid, block, smem, stream, programmatic, src, ws,
                             layer, top_k)
             : launch_kernel(follower_copy_kernel<OrderIndex, 2>, grid, block, smem, stream, programmatic, src, ws,
                             layer, top_k);
}

// --------------------------------------------------------------------------------------------
// append: rows [layer][count][row_bytes] -> host store (mapped) and, for the newest T, the tail

template <class OrderIndex>
__global__ void __launch_bounds__(simple_block_threads)
    append_kernel(source_view<OrderIndex> src, unsigned slot, const std::byte* rows, std::int64_t first,
                  unsigned count, std::int64_t last) {
  const unsigned lane = threadIdx.x & 31u;
  const unsigned warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const unsigned warps = (gridDim.x * blockDim.x) >> 5;
  const unsigned vecs = src.row_bytes / 16u;
  const std::uint64_t units = static_cast<std::uint64_t>(count) * src.layers;  // no 32-bit wrap
  const std::int64_t tail_begin = last - static_cast<std::int64_t>(src.tail_rows);
  for (std::uint64_t u = warp; u < units; u += warps) {
    const auto l = static_cast<unsigned>(u / count), i = static_cast<unsigned>(u - static_cast<std::uint64_t>(l) * count);
    const std::int64_t r = first + i;
    const auto* in = reinterpret_cast<const int4*>(rows + (static_cast<std::size_t>(l) * count + i) * src.row_bytes);
    const std::int32_t hp =
        src.host_page[static_cast<std::size_t>(slot) * src.pages_per_request + static_cast<std::size_t>(r) / src.page_rows];
    auto* host = reinterpret_cast<int4*>(src.host_store + static_cast<std::uint64_t>(hp) * src.page_bytes +
                                         (static_cast<std::uint64_t>(l) * src.page_rows +
                                          static_cast<std::uint64_t>(r) % src.page_rows) *
                                             src.row_bytes);
    int4* tail = nullptr;
    if (r >= tail_begin)
      tail = reinterpret_cast<int4*>(src.layer_pool[l] +
                                     static_cast<std::size_t>(src.space.tail(slot, r)) * src.row_bytes);
    if (!src.writes_host_copy(r)) host = nullptr;  // shared host store: another rank owns the row's page
    for (unsigned v = lane; v < vecs; v += 32) {
      const int4 x = in[v];
      if (host != nullptr) host[v] = x;
      if (tail != nullptr) tail[v] = x;
    }
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) src.frontier[slot] = last;
}

template <class OrderIndex>
cudaError_t launch_append(const source_view<OrderIndex>& src, unsigned slot, const std::byte* rows, std::int64_t first,
                          unsigned count, std::int64_t last, int max_grid, cudaStream_t stream) {
  const std::uint64_t units = static_cast<std::uint64_t>(count) * src.layers;
  const unsigned warps_per_block = simple_block_threads / 32;
  std::uint64_t blocks = (units + warps_per_block - 1) / warps_per_block;
  if (blocks == 0) blocks = 1;
  if (blocks > static_cast<std::uint64_t>(max_grid)) blocks = static_cast<std::uint64_t>(max_grid);
  const auto grid = static_cast<unsigned>(blocks);
  append_kernel<OrderIndex><<<grid, simple_block_threads, 0, stream>>>(src, slot, rows, first, count, last);
  return cudaGetLastError();
}

// --------------------------------------------------------------------------------------------
// optional page: copy one complete history page (every layer) from the host store to a pool page

template <class OrderIndex>
__global__ void __launch_bounds__(simple_block_threads)
    optional_page_kernel(source_view<OrderIndex> src, std::int32_t host_page, unsigned page, std::int32_t pool_page) {
  const unsigned lane = threadIdx.x & 31u;
  const unsigned warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const unsigned warps = (gridDim.x * blockDim.x) >> 5;
  const unsigned vecs = src.row_bytes / 16u;
  const unsigned units = src.page_rows * src.layers;
  for (unsigned u = warp; u < units; u += warps) {
    const unsigned l = u / src.page_rows, i = u - l * src.page_rows;
    const std::int64_t r = static_cast<std::int64_t>(page) * src.page_rows + i;
    const auto* in = reinterpret_cast<const int4*>(src.host_store + static_cast<std::uint64_t>(host_page) * src.page_bytes +
                                                   (static_cast<std::uint64_t>(l) * src.page_rows + i) * src.row_bytes);
    auto* out = reinterpret_cast<int4*>(src.layer_pool[l] +
                                        static_cast<std::size_t>(src.space.optional(static_cast<std::size_t>(pool_page), r)) *
                                            src.row_bytes);
    for (unsigned v = lane; v < vecs; v += 32) out[v] = __ldg(in + v);
  }
}

template <class OrderIndex>
cudaError_t launch_optional_page(const source_view<OrderIndex>& src, std::int32_t host_page, unsigned page,
                                 std::int32_t pool_page, cudaStream_t stream) {
  const unsigned units = src.page_rows * src.layers;
  const unsigned warps_per_block = simple_block_threads / 32;
  const unsigned grid = (units + warps_per_block - 1) / warps_per_block;
  optional_page_kernel<OrderIndex><<<grid, simple_block_threads, 0, stream>>>(src, host_page, page, pool_page);
  return cudaGetLastError();
}

// --------------------------------------------------------------------------------------------
// slot reset (admission state): empty hot cache (and reverse map), identity LRU order, no pages, frontier 0

template <class OrderIndex>
__global__ void __launch_bounds__(simple_block_threads) reset_slots_kernel(source_view<OrderIndex> src, unsigned first_slot) {
  const unsigned slot = first_slot + blockIdx.y;
  const std::size_t B = src.space.hot_rows;
  const std::size_t P = src.pages_per_request;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t j = blockIdx.x * blockDim.x + threadIdx.x; j < B; j += stride) {
    const row_index old = src.hot_row[slot * B + j];  // the reverse map holds exactly the cached rows
    if (old >= 0) src.way_of_row[slot * static_cast<std::size_t>(src.max_rows) + static_cast<std::size_t>(old)] = no_way<OrderIndex>;
    src.hot_row[slot * B + j] = no_row;
    src.order[slot * B + j] = static_cast<OrderIndex>(j);
  }
  for (std::size_t j = blockIdx.x * blockDim.x + threadIdx.x; j < P; j += stride) {
    src.optional_page[slot * P + j] = -1;
    src.host_page[slot * P + j] = -1;
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) src.frontier[slot] = 0;
}

/// Resets `slots` consecutive request slots starting at `first_slot`.
template <class OrderIndex>
cudaError_t launch_reset_slots(const source_view<OrderIndex>& src, unsigned first_slot, unsigned slots,
                               cudaStream_t stream) {
  const std::size_t work = src.space.hot_rows > src.pages_per_request ? src.space.hot_rows : src.pages_per_request;
  unsigned gx = static_cast<unsigned>((work + simple_block_threads - 1) / simple_block_threads);
  if (gx == 0) gx = 1;
  if (gx > 64) gx = 64;
  if (slots == 0) return cudaSuccess;
  reset_slots_kernel<OrderIndex><<<dim3(gx, slots), simple_block_threads, 0, stream>>>(src, first_slot);
  return cudaGetLastError();
}

// --------------------------------------------------------------------------------------------
// forget a completed slot's planned copies (its host pages are gone): follower copies skip them

// A template so that programs of several translation units link (one definition per program).
template <int = 0>
__global__ void forget_slot_plan_kernel(workspace_view ws, int slot) {
  const unsigned C = ws.control->last_count < ws.capacity ? ws.control->last_count : ws.capacity;
  for (unsigned t = blockIdx.x * blockDim.x + threadIdx.x; t < C; t += gridDim.x * blockDim.x)
    if (ws.errors[t].slot == slot) ws.stats[t].rows_copied = 0;
}

inline cudaError_t launch_forget_slot_plan(const workspace_view& ws, int slot, cudaStream_t stream) {
  forget_slot_plan_kernel<><<<1, simple_block_threads, 0, stream>>>(ws, slot);
  return cudaGetLastError();
}

// --------------------------------------------------------------------------------------------

template <class T>
__global__ void store_value_kernel(T* where, T value) {
  *where = value;
}

/// Writes one value in stream order (the value travels as a kernel argument, so the host may
/// change its own copy at once).
template <class T>
cudaError_t launch_store_value(T* where, T value, cudaStream_t stream) {
  store_value_kernel<T><<<1, 1, 0, stream>>>(where, value);
  return cudaGetLastError();
}

/// Loads the hierarchy's step-path kernels up front (cudaFuncGetAttributes loads a kernel that is
/// not loaded yet). Under lazy module loading, the CUDA default since 12.2, a kernel is otherwise
/// loaded at its first launch, and loading may synchronise the context: an engine's first append,
/// admission or follower copy would wait on the host for unrelated streams. Called at construction.
template <class OrderIndex>
cudaError_t preload_hierarchy_kernels() {
  cudaFuncAttributes a{};
  cudaError_t e = cudaFuncGetAttributes(&a, follower_copy_kernel<OrderIndex, 1>);
  if (e == cudaSuccess) e = cudaFuncGetAttributes(&a, follower_copy_kernel<OrderIndex, 2>);
  if (e == cudaSuccess) e = cudaFuncGetAttributes(&a, append_kernel<OrderIndex>);
  if (e == cudaSuccess) e = cudaFuncGetAttributes(&a, optional_page_kernel<OrderIndex>);
  if (e == cudaSuccess) e = cudaFuncGetAttributes(&a, reset_slots_kernel<OrderIndex>);
  if (e == cudaSuccess) e = cudaFuncGetAttributes(&a, forget_slot_plan_kernel<>);
  if (e == cudaSuccess) e = cudaFuncGetAttributes(&a, store_value_kernel<std::uint32_t>);
  if (e == cudaSuccess) e = cudaFuncGetAttributes(&a, store_value_kernel<std::int32_t>);
  return e;
}

}  // namespace dhisparse::cuda::detail
