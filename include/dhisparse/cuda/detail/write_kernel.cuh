#pragma once
/// \file
/// Batched step writes and speculative commits over device descriptors (kv_write.cuh): one CTA
/// per descriptor entry, each validating its own entry on the device (so nothing is read on the
/// host and the launch shape is fixed), then writing the new rows into the tail ring and through
/// to the mapped host store, and publishing the frontier to the device books and to a pinned
/// mirror the host absorbs later (`hierarchy::sync_books`). Bad entries are left untouched and
/// recorded; the first one of the first failing launch is kept for `check_errors`.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "../../errors.hpp"
#include "../kv_write.cuh"
#include "../verify_views.cuh"
#include "../views.cuh"

namespace dhisparse::cuda::detail {

inline constexpr int write_block_threads = 256;

/// Launch counters and the first error of one kind of batched launch on one source.
struct write_control {
  std::uint32_t done = 0;       ///< CTAs of the running launch that finished
  std::uint32_t epoch = 0;      ///< launches completed
  /// (epoch << 32 | entry) of the first bad entry since errors were last checked; all ones if none.
  unsigned long long first_error = ~0ull;
};

/// Error books of one kind of batched launch (writes or commits) on one source.
struct write_workspace_view {
  write_control* control = nullptr;
  entry_error* sticky = nullptr;  ///< [capacity] record of each entry that set first_error
  std::uint32_t capacity = 0;
};

/// Where the kernels publish what the host books absorb: mapped pinned host memory, per slot.
struct books_mirror_view {
  std::int64_t* frontier = nullptr;  ///< [slots] rows stored
  std::int32_t* partial = nullptr;   ///< [slots] committed positions of the boundary row
};

/// Slot check shared by both kernels: status of entry `e` naming `slot` (0 when good). Every
/// thread of the CTA calls it (the duplicate scan is spread over the CTA).
template <class OrderIndex>
__device__ status_code check_entry_slot(const source_view<OrderIndex>& src, const std::int32_t* slots, unsigned e,
                                        std::int32_t slot) {
  const bool bad_slot = static_cast<std::size_t>(slot) >= src.space.slots || src.live[slot] == 0u;
  bool dup = false;
  if (!bad_slot)
    for (unsigned j = threadIdx.x; j < e; j += blockDim.x) dup |= slots[j] == slot;
  dup = __syncthreads_or(dup) != 0;
  if (bad_slot) return to_status(errc::unknown_request);
  return dup ? to_status(errc::duplicate_in_batch) : status_ok;
}

/// Records entry e's error if it is the first since the last check (smallest epoch, then entry).
__device__ inline void record_entry_error(const write_workspace_view& ws, std::uint32_t epoch, unsigned e,
                                          const entry_error& r) {
  const unsigned long long key = (static_cast<unsigned long long>(epoch) << 32) | e;
  if (key < atomicMin(&ws.control->first_error, key)) ws.sticky[e] = r;
}

/// Ends one CTA of a launch; the last one advances the epoch (launches never overlap: stream order).
__device__ inline void finish_write_cta(const write_workspace_view& ws) {
  if (threadIdx.x != 0) return;
  __threadfence();
  const unsigned ctas = gridDim.x * gridDim.y;
  if (atomicAdd(&ws.control->done, 1u) == ctas - 1) {
    ws.control->done = 0;
    atomicAdd(&ws.control->epoch, 1u);
  }
}

/// Copies `rows` x layers rows: unit (l, i) reads `in(l, i)` and writes the host copy of row
/// first + i and, for the newest `tail_rows` of the slot after the write, its tail ring row.
template <class OrderIndex, class Input>
__device__ void write_rows(const source_view<OrderIndex>& src, unsigned slot, std::int64_t first, unsigned rows,
                           std::int64_t last, Input in) {
  const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const unsigned vecs = src.row_bytes / 16u;
  const std::int64_t tail_begin = last - static_cast<std::int64_t>(src.tail_rows);
  const unsigned units = rows * src.layers;
  for (unsigned u = warp; u < units; u += warps) {
    const unsigned l = u / rows, i = u - l * rows;
    const std::int64_t r = first + i;
    const int4* from = in(l, i, r);
    const std::int32_t hp =
        src.host_page[static_cast<std::size_t>(slot) * src.pages_per_request + static_cast<std::size_t>(r) / src.page_rows];
    auto* host = reinterpret_cast<int4*>(src.host_store + static_cast<std::uint64_t>(hp) * src.page_bytes +
                                         (static_cast<std::uint64_t>(l) * src.page_rows +
                                          static_cast<std::uint64_t>(r) % src.page_rows) *
                                             src.row_bytes);
    int4* tail = nullptr;
    const auto* tail_src = reinterpret_cast<const int4*>(
        src.layer_pool[l] + static_cast<std::size_t>(src.space.tail(slot, r)) * src.row_bytes);
    if (r >= tail_begin && from != tail_src) tail = const_cast<int4*>(tail_src);
    for (unsigned v = lane; v < vecs; v += 32) {
      const int4 x = from[v];
      host[v] = x;
      if (tail != nullptr) tail[v] = x;
    }
  }
}

/// Rows [f, last) are reserved when `last` is within max_rows and its last page has a host page.
template <class OrderIndex>
__device__ bool rows_reserved(const source_view<OrderIndex>& src, unsigned slot, std::int64_t last) {
  if (last > src.max_rows) return false;
  if (last <= 0) return true;
  return src.host_page[static_cast<std::size_t>(slot) * src.pages_per_request +
                       static_cast<std::size_t>(last - 1) / src.page_rows] >= 0;
}

// --------------------------------------------------------------------------------------------
// batched append: entry e's new rows into the tail ring and the host store, then its frontier

template <class OrderIndex>
__global__ void __launch_bounds__(write_block_threads)
    batched_write_kernel(source_view<OrderIndex> src, write_workspace_view ws, kv_write_view w,
                         verify_workspace_view vws, books_mirror_view mirror) {
  const unsigned e = blockIdx.y;
  const std::uint32_t epoch = *static_cast<volatile std::uint32_t*>(&ws.control->epoch);
  const std::int32_t slot = w.slots[e];
  if (slot >= 0) {
    entry_error r;
    r.slot = slot;
    r.epoch = epoch;
    r.code = check_entry_slot(src, w.slots, e, slot);
    r.value = slot;
    const std::int32_t rows = w.rows[e];
    std::int64_t f = 0;
    if (r.code == status_ok) {
      f = src.frontier[slot];
      r.frontier = f;
      if (rows < 0 || static_cast<std::uint32_t>(rows) > w.max_rows) {
        r.code = to_status(errc::size_mismatch);
        r.value = rows;
      } else if (!rows_reserved(src, static_cast<unsigned>(slot), f + rows)) {
        r.code = to_status(errc::capacity_exceeded);
        r.value = f + rows;
      }
    }
    if (r.code != status_ok) {
      if (threadIdx.x == 0) record_entry_error(ws, epoch, e, r);
    } else if (rows > 0) {
      const std::int64_t last = f + rows;
      const std::size_t base = w.first != nullptr ? static_cast<std::size_t>(w.first[e])
                                                  : static_cast<std::size_t>(e) * w.max_rows;
      const std::uint64_t stride = w.row_stride != 0 ? w.row_stride : src.row_bytes;
      write_rows(src, static_cast<unsigned>(slot), f, static_cast<unsigned>(rows), last,
                 [&](unsigned l, unsigned i, std::int64_t) {
                   return reinterpret_cast<const int4*>(w.layer_rows[l] + (base + i) * stride);
                 });
      __syncthreads();
      if (threadIdx.x == 0) {
        src.frontier[slot] = last;  // read by later launches only
        mirror.frontier[slot] = last;
        if (vws.staged != nullptr) {  // complete rows: a staged block is superseded, no partial row
          vws.staged[slot] = 0;
          vws.verified[slot] = 0;
          vws.partial[slot] = 0;
          mirror.partial[slot] = 0;
        }
      }
    }
  }
  finish_write_cta(ws);
}

// --------------------------------------------------------------------------------------------
// batched commit: the accepted prefix of each entry's verified block joins the history

template <class OrderIndex>
__global__ void __launch_bounds__(write_block_threads)
    batched_commit_kernel(source_view<OrderIndex> src, write_workspace_view ws, commit_view c,
                          verify_workspace_view vws, books_mirror_view mirror) {
  const unsigned e = blockIdx.y;
  const std::uint32_t epoch = *static_cast<volatile std::uint32_t*>(&ws.control->epoch);
  const std::int32_t slot = c.slots[e];
  if (slot >= 0) {
    entry_error r;
    r.slot = slot;
    r.epoch = epoch;
    r.code = check_entry_slot(src, c.slots, e, slot);
    r.value = slot;
    std::int64_t f = 0, n_next = 0;
    const auto m = static_cast<std::int64_t>(vws.positions_per_row);
    if (r.code == status_ok) {
      f = src.frontier[slot];
      r.frontier = f;
      const std::int32_t accepted = c.accepted[e];
      const std::int32_t verified = vws.verified[slot];
      n_next = f * m + vws.partial[slot] + accepted + 1;
      if (vws.staged[slot] == 0 || verified == 0) {
        r.code = to_status(errc::commit_without_verify);
      } else if (accepted < 0 || accepted >= verified) {
        r.code = to_status(errc::acceptance_beyond_block);
        r.value = accepted;
        r.index = verified;
      } else if (!rows_reserved(src, static_cast<unsigned>(slot), n_next / m)) {
        r.code = to_status(errc::capacity_exceeded);
        r.value = n_next / m;
      }
    }
    if (r.code != status_ok) {
      if (threadIdx.x == 0) record_entry_error(ws, epoch, e, r);
    } else {
      const std::int64_t last = n_next / m;
      if (last > f)  // completed rows: ring -> host store (the ring keeps them while in the window)
        write_rows(src, static_cast<unsigned>(slot), f, static_cast<unsigned>(last - f), last,
                   [&](unsigned l, unsigned, std::int64_t row) {
                     return reinterpret_cast<const int4*>(
                         src.layer_pool[l] + static_cast<std::size_t>(src.space.tail(static_cast<unsigned>(slot), row)) *
                                                 src.row_bytes);
                   });
      __syncthreads();
      if (threadIdx.x == 0) {
        src.frontier[slot] = last;
        vws.partial[slot] = static_cast<std::int32_t>(n_next % m);
        vws.staged[slot] = 0;  // the round is closed: the rest of the block is discarded
        vws.verified[slot] = 0;
        mirror.frontier[slot] = last;
        mirror.partial[slot] = static_cast<std::int32_t>(n_next % m);
      }
    }
  }
  finish_write_cta(ws);
}

// --------------------------------------------------------------------------------------------
// page-table upload of a reservation: scattered (entry, host page) pairs

/// One page-table entry to set: `table[index] = value`.
struct page_table_update {
  std::int32_t* table = nullptr;
  std::uint64_t index = 0;
  std::int32_t value = -1;
};

// A template so that programs of several translation units link (one definition per program).
template <int = 0>
__global__ void __launch_bounds__(write_block_threads)
    page_table_update_kernel(const page_table_update* updates, std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    updates[i].table[updates[i].index] = updates[i].value;
}

// --------------------------------------------------------------------------------------------
// launchers (stream last, cudaError_t; no allocation, no host synchronisation: capturable)

/// One CTA per entry of `w` (capacity CTAs, so the shape is fixed for a graph).
template <class OrderIndex>
cudaError_t launch_batched_write(const source_view<OrderIndex>& src, const write_workspace_view& ws,
                                 const kv_write_view& w, const verify_workspace_view& vws,
                                 const books_mirror_view& mirror, cudaStream_t stream) {
  if (w.capacity == 0) return cudaSuccess;
  batched_write_kernel<OrderIndex><<<dim3(1, w.capacity), write_block_threads, 0, stream>>>(src, ws, w, vws, mirror);
  return cudaGetLastError();
}

/// One CTA per entry of `c`.
template <class OrderIndex>
cudaError_t launch_batched_commit(const source_view<OrderIndex>& src, const write_workspace_view& ws,
                                  const commit_view& c, const verify_workspace_view& vws,
                                  const books_mirror_view& mirror, cudaStream_t stream) {
  if (c.capacity == 0) return cudaSuccess;
  batched_commit_kernel<OrderIndex><<<dim3(1, c.capacity), write_block_threads, 0, stream>>>(src, ws, c, vws, mirror);
  return cudaGetLastError();
}

inline cudaError_t launch_page_table_update(const page_table_update* updates, std::size_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const auto grid = static_cast<unsigned>(n / write_block_threads + 1 < 1024 ? n / write_block_threads + 1 : 1024);
  page_table_update_kernel<><<<grid, write_block_threads, 0, stream>>>(updates, n);
  return cudaGetLastError();
}

/// Loads the batched kernels up front (see preload_hierarchy_kernels: no lazy load in a step).
template <class OrderIndex>
cudaError_t preload_write_kernels() {
  cudaFuncAttributes a{};
  cudaError_t err = cudaFuncGetAttributes(&a, batched_write_kernel<OrderIndex>);
  if (err == cudaSuccess) err = cudaFuncGetAttributes(&a, batched_commit_kernel<OrderIndex>);
  if (err == cudaSuccess) err = cudaFuncGetAttributes(&a, page_table_update_kernel<>);
  return err;
}

}  // namespace dhisparse::cuda::detail
