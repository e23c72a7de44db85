#pragma once
/// \file
/// Admission on a retained prefix (docs/prefixes.md), device part: copies the prefix's rows of its
/// partially filled last page into the new request's own host page (mapped pinned memory), fills
/// the request's tail ring with the prefix's newest rows from the host store, and publishes the
/// frontier. The shared page-table entries are uploaded before it in stream order. One warp per
/// (row, layer) unit, 16-byte vectors; the launcher takes the stream last and returns cudaError_t.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "../views.cuh"

namespace dhisparse::cuda::detail {

inline constexpr int prefix_block_threads = 256;

/// `boundary_from`/`boundary_to`: the prefix's partial last page and the request's copy of it
/// (-1/-1 for a page-aligned prefix); `rows`: the prefix's rows on this source.
template <class OrderIndex>
__global__ void __launch_bounds__(prefix_block_threads)
    prefix_admit_kernel(source_view<OrderIndex> src, unsigned slot, std::int32_t boundary_from, std::int32_t boundary_to,
                        std::int64_t rows) {
  const unsigned lane = threadIdx.x & 31u;
  const unsigned warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const unsigned warps = (gridDim.x * blockDim.x) >> 5;
  const unsigned vecs = src.row_bytes / 16u;
  const std::int64_t p = src.page_rows;
  const std::int64_t boundary_first = boundary_to >= 0 ? rows / p * p : rows;
  const std::int64_t tail_first = rows > static_cast<std::int64_t>(src.tail_rows) ? rows - src.tail_rows : 0;
  const auto n_boundary = static_cast<std::uint64_t>(rows - boundary_first);
  const auto n_tail = static_cast<std::uint64_t>(rows - tail_first);
  const std::uint64_t units = (n_boundary + n_tail) * src.layers;
  auto host_row = [&](std::int32_t g, unsigned l, std::int64_t r) {
    return src.host_store + static_cast<std::uint64_t>(g) * src.page_bytes +
           (static_cast<std::uint64_t>(l) * src.page_rows + static_cast<std::uint64_t>(r % p)) * src.row_bytes;
  };
  for (std::uint64_t u = warp; u < units; u += warps) {
    const auto l = static_cast<unsigned>(u % src.layers);
    const std::uint64_t k = u / src.layers;
    const int4* in;
    int4* out;
    if (k < n_boundary) {  // the boundary copy: the prefix's page to the request's own
      const std::int64_t r = boundary_first + static_cast<std::int64_t>(k);
      in = reinterpret_cast<const int4*>(host_row(boundary_from, l, r));
      out = reinterpret_cast<int4*>(host_row(boundary_to, l, r));
    } else {  // the tail: read the prefix's pages (the partial one before its copy exists)
      const std::int64_t r = tail_first + static_cast<std::int64_t>(k - n_boundary);
      const std::int64_t page = r / p;
      const std::int32_t g = boundary_to >= 0 && r >= boundary_first
                                 ? boundary_from
                                 : src.host_page[static_cast<std::size_t>(slot) * src.pages_per_request + page];
      in = reinterpret_cast<const int4*>(host_row(g, l, r));
      out = reinterpret_cast<int4*>(src.layer_pool[l] + static_cast<std::size_t>(src.space.tail(slot, r)) * src.row_bytes);
    }
    for (unsigned v = lane; v < vecs; v += 32) out[v] = in[v];
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) src.frontier[slot] = rows;
}

template <class OrderIndex>
cudaError_t launch_prefix_admit(const source_view<OrderIndex>& src, unsigned slot, std::int32_t boundary_from,
                                std::int32_t boundary_to, std::int64_t rows, int max_grid, cudaStream_t stream) {
  const std::int64_t p = src.page_rows;
  const std::int64_t boundary = boundary_to >= 0 ? rows - rows / p * p : 0;
  const std::int64_t tail = rows < static_cast<std::int64_t>(src.tail_rows) ? rows : src.tail_rows;
  const std::uint64_t units = static_cast<std::uint64_t>(boundary + tail) * src.layers;
  const unsigned warps_per_block = prefix_block_threads / 32;
  std::uint64_t blocks = (units + warps_per_block - 1) / warps_per_block;
  if (blocks == 0) blocks = 1;
  if (blocks > static_cast<std::uint64_t>(max_grid)) blocks = static_cast<std::uint64_t>(max_grid);
  prefix_admit_kernel<OrderIndex><<<static_cast<unsigned>(blocks), prefix_block_threads, 0, stream>>>(
      src, slot, boundary_from, boundary_to, rows);
  return cudaGetLastError();
}

}  // namespace dhisparse::cuda::detail
