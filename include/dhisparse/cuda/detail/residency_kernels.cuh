#pragma once
/// \file
/// Kernels of load-adaptive residency on the CUDA backend (cuda/residency_manager.cuh): import of
/// a prefilled history (device-only pages into the optional pool, the rest into the host store,
/// the newest T rows into the tail), batched page fills from the host store, batched backups of
/// device-only pages to the host store, and batched optional-map stores (publish / unmap).
/// Page batches travel as kernel arguments, so the host may reuse its copy at once and nothing is
/// staged. Each launcher takes the stream last and returns cudaError_t. `preload_residency_kernels`
/// loads them all ahead of their first launch.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "../views.cuh"
#include "copy_kernel.cuh"

namespace dhisparse::cuda::detail {

/// One page of one request slot: history page `page` of `slot`, its optional pool page and its
/// host-store page.
struct page_task {
  std::int32_t slot = 0;
  std::int32_t page = 0;
  std::int32_t pool = -1;
  std::int32_t host = -1;
};

/// Up to `page_batch::capacity` page tasks, passed by value (1 KiB of kernel arguments).
struct page_batch {
  static constexpr unsigned capacity = 64;
  page_task task[capacity];
  unsigned count = 0;
  [[nodiscard]] bool full() const { return count == capacity; }
  void push(const page_task& t) { task[count++] = t; }
};

// --------------------------------------------------------------------------------------------
// fill (host store -> pool page) and backup (pool page -> host store), one grid row per task

template <bool ToHost, class OrderIndex>
__global__ void __launch_bounds__(simple_block_threads) page_copy_kernel(source_view<OrderIndex> src, page_batch b) {
  const page_task t = b.task[blockIdx.y];
  const unsigned lane = threadIdx.x & 31u;
  const unsigned warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const unsigned warps = (gridDim.x * blockDim.x) >> 5;
  const unsigned vecs = src.row_bytes / 16u;
  const unsigned units = src.page_rows * src.layers;
  for (unsigned u = warp; u < units; u += warps) {
    const unsigned l = u / src.page_rows, i = u - l * src.page_rows;
    const std::int64_t r = static_cast<std::int64_t>(t.page) * src.page_rows + i;
    auto* host = reinterpret_cast<int4*>(src.host_store + static_cast<std::uint64_t>(t.host) * src.page_bytes +
                                         (static_cast<std::uint64_t>(l) * src.page_rows + i) * src.row_bytes);
    auto* pool = reinterpret_cast<int4*>(src.layer_pool[l] +
                                         static_cast<std::size_t>(src.space.optional(static_cast<std::size_t>(t.pool), r)) *
                                             src.row_bytes);
    if constexpr (ToHost) {
      for (unsigned v = lane; v < vecs; v += 32) host[v] = pool[v];
    } else {
      for (unsigned v = lane; v < vecs; v += 32) pool[v] = __ldg(host + v);
    }
  }
}

template <bool ToHost, class OrderIndex>
cudaError_t launch_page_copy(const source_view<OrderIndex>& src, const page_batch& b, cudaStream_t stream) {
  if (b.count == 0) return cudaSuccess;
  const unsigned units = src.page_rows * src.layers;
  const unsigned warps_per_block = simple_block_threads / 32;
  unsigned gx = (units + warps_per_block - 1) / warps_per_block;
  if (gx > 32) gx = 32;
  page_copy_kernel<ToHost, OrderIndex><<<dim3(gx, b.count), simple_block_threads, 0, stream>>>(src, b);
  return cudaGetLastError();
}

/// Copies complete history pages from the host store into their optional pool pages.
template <class OrderIndex>
cudaError_t launch_fill_pages(const source_view<OrderIndex>& src, const page_batch& b, cudaStream_t stream) {
  return launch_page_copy<false>(src, b, stream);
}
/// Copies device-only optional pool pages into their host-store pages (the deferred backup).
template <class OrderIndex>
cudaError_t launch_backup_pages(const source_view<OrderIndex>& src, const page_batch& b, cudaStream_t stream) {
  return launch_page_copy<true>(src, b, stream);
}

// --------------------------------------------------------------------------------------------
// optional-map stores: publish (value = pool page) or unmap (value = -1), behind earlier work

template <class OrderIndex>
__global__ void store_map_kernel(source_view<OrderIndex> src, page_batch b, bool unmap) {
  for (unsigned i = threadIdx.x; i < b.count; i += blockDim.x) {
    const page_task t = b.task[i];
    src.optional_page[static_cast<std::size_t>(t.slot) * src.pages_per_request + static_cast<std::size_t>(t.page)] =
        unmap ? -1 : t.pool;
  }
}

/// Writes the optional-map entries of a batch: the pool page (publish) or -1 (unmap). Stream
/// ordered: a reader ordered after it sees the new entry, one ordered before it the old one.
template <class OrderIndex>
cudaError_t launch_store_map(const source_view<OrderIndex>& src, const page_batch& b, bool unmap, cudaStream_t stream) {
  if (b.count == 0) return cudaSuccess;
  store_map_kernel<OrderIndex><<<1, 64, 0, stream>>>(src, b, unmap);
  return cudaGetLastError();
}

// --------------------------------------------------------------------------------------------
// import: rows [layer][count][row_bytes] of a new request; rows of a page with a pool page in
// `pool_of_page` go to that pool page only (device-only: their host copy is deferred), the
// others to the host store; the newest T rows also to the tail. Publishes the frontier.

template <class OrderIndex>
__global__ void __launch_bounds__(simple_block_threads)
    import_kernel(source_view<OrderIndex> src, unsigned slot, const std::byte* rows, std::int64_t first, unsigned count,
                  std::int64_t last, const std::int32_t* pool_of_page) {
  const unsigned lane = threadIdx.x & 31u;
  const unsigned warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const unsigned warps = (gridDim.x * blockDim.x) >> 5;
  const unsigned vecs = src.row_bytes / 16u;
  const std::uint64_t units = static_cast<std::uint64_t>(count) * src.layers;
  const std::int64_t tail_begin = last - static_cast<std::int64_t>(src.tail_rows);
  for (std::uint64_t u = warp; u < units; u += warps) {
    const auto l = static_cast<unsigned>(u / count), i = static_cast<unsigned>(u - static_cast<std::uint64_t>(l) * count);
    const std::int64_t r = first + i;
    const std::size_t page = static_cast<std::size_t>(r) / src.page_rows;
    const auto* in = reinterpret_cast<const int4*>(rows + (static_cast<std::size_t>(l) * count + i) * src.row_bytes);
    const std::int32_t g = pool_of_page[page];
    int4* out;
    if (g >= 0) {
      out = reinterpret_cast<int4*>(src.layer_pool[l] +
                                    static_cast<std::size_t>(src.space.optional(static_cast<std::size_t>(g), r)) *
                                        src.row_bytes);
    } else {
      const std::int32_t hp = src.host_page[static_cast<std::size_t>(slot) * src.pages_per_request + page];
      out = reinterpret_cast<int4*>(src.host_store + static_cast<std::uint64_t>(hp) * src.page_bytes +
                                    (static_cast<std::uint64_t>(l) * src.page_rows +
                                     static_cast<std::uint64_t>(r) % src.page_rows) *
                                        src.row_bytes);
    }
    int4* tail = nullptr;
    if (r >= tail_begin)
      tail = reinterpret_cast<int4*>(src.layer_pool[l] + static_cast<std::size_t>(src.space.tail(slot, r)) * src.row_bytes);
    for (unsigned v = lane; v < vecs; v += 32) {
      const int4 x = in[v];
      out[v] = x;
      if (tail != nullptr) tail[v] = x;
    }
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) src.frontier[slot] = last;
}

template <class OrderIndex>
cudaError_t launch_import(const source_view<OrderIndex>& src, unsigned slot, const std::byte* rows, std::int64_t first,
                          unsigned count, std::int64_t last, const std::int32_t* pool_of_page, int max_grid,
                          cudaStream_t stream) {
  const std::uint64_t units = static_cast<std::uint64_t>(count) * src.layers;
  const unsigned warps_per_block = simple_block_threads / 32;
  std::uint64_t blocks = (units + warps_per_block - 1) / warps_per_block;
  if (blocks == 0) blocks = 1;
  if (blocks > static_cast<std::uint64_t>(max_grid)) blocks = static_cast<std::uint64_t>(max_grid);
  import_kernel<OrderIndex><<<static_cast<unsigned>(blocks), simple_block_threads, 0, stream>>>(src, slot, rows, first, count,
                                                                                              last, pool_of_page);
  return cudaGetLastError();
}

// --------------------------------------------------------------------------------------------
// loading ahead of use

/// Loads every kernel above for views of `OrderIndex` (cudaFuncGetAttributes loads a kernel that
/// is not loaded yet). With lazy module loading, the default since CUDA 12.2, a kernel is
/// otherwise loaded at its first launch, and loading may synchronise the context: the first fill
/// or backup of a residency manager would then wait on the host for every stream's work, and make
/// later step-stream work wait behind copy-stream work it does not depend on. Called once, when the
/// manager is built.
template <class OrderIndex>
cudaError_t preload_residency_kernels(const source_view<OrderIndex>&) {
  cudaFuncAttributes a{};
  cudaError_t e = cudaFuncGetAttributes(&a, page_copy_kernel<false, OrderIndex>);
  if (e == cudaSuccess) e = cudaFuncGetAttributes(&a, page_copy_kernel<true, OrderIndex>);
  if (e == cudaSuccess) e = cudaFuncGetAttributes(&a, store_map_kernel<OrderIndex>);
  if (e == cudaSuccess) e = cudaFuncGetAttributes(&a, import_kernel<OrderIndex>);
  return e;
}

}  // namespace dhisparse::cuda::detail
