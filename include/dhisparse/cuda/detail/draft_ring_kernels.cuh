#pragma once
/// \file
/// Kernels of the draft ring's step path (draft_ring_step.cuh): the batched write and commit over
/// device descriptors, which check each entry against the DEVICE books and record bad entries in
/// the error books of the hierarchy's batched launches (write_control / entry_error, first bad
/// entry of the first failing launch), plus the two small kernels the host path needs: setting one
/// slot's book in stream order, and copying all books out. One CTA per entry; an entry touches
/// only its own slot (a slot named twice is a bad entry), so CTAs never race on books.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "../../errors.hpp"
#include "../draft_ring_step.cuh"
#include "write_kernel.cuh"

namespace dhisparse::cuda::detail {

inline constexpr unsigned draft_write_threads = 256;
inline constexpr unsigned draft_commit_threads = 64;

/// Status of entry e naming `slot` (>= 0) of a store of `slots` slots: invalid_slot, then
/// duplicate_in_batch against entries before e. Every thread of the CTA calls it.
__device__ inline status_code draft_entry_slot(std::size_t slots, const std::int32_t* batch_slots, unsigned e,
                                               std::int32_t slot) {
  return batch_entry_slot_status(static_cast<std::size_t>(slot) >= slots, errc::invalid_slot, batch_slots, e, slot);
}

/// One CTA per entry of a `draft_write_view`: checks the entry against the slot's device book, copies
/// its rows into the ring (16-byte vectors when every address allows), then sets written.
template <DraftRingPolicy Ring>
__global__ void __launch_bounds__(draft_write_threads)
    draft_write_step_kernel(draft_ring_ref<Ring> ring, draft_slot_state* books, draft_write_view v,
                            write_workspace_view ws) {
  __shared__ status_code code;
  __shared__ draft_slot_state st;
  __shared__ std::int32_t count, offset;
  __shared__ std::int64_t first_row;
  __shared__ bool vec16;
  const unsigned e = blockIdx.x;
  const std::uint32_t epoch = write_epoch(ws);
  const std::int32_t slot = v.slots[e];
  if (slot >= 0) {
    const status_code slot_code = draft_entry_slot(ring.slots, v.slots, e, slot);
    if (threadIdx.x == 0) {
      entry_error r = slot_entry_record(slot_code, slot, epoch);
      if (r.code == status_ok) {
        st = books[slot];
        r.frontier = static_cast<std::int64_t>(st.committed);
        count = v.counts[e];
        offset = v.offsets != nullptr ? v.offsets[e] : 0;
        first_row = v.first != nullptr ? v.first[e] : static_cast<std::int64_t>(e) * v.max_count;
        const std::uint64_t block = st.written - st.committed;  // written part of the block
        if (count < 1 || static_cast<std::uint32_t>(count) > v.max_count || first_row < 0) {
          r.code = to_status(errc::size_mismatch);
          r.value = first_row < 0 ? first_row : count;
          r.index = static_cast<std::int32_t>(v.max_count);
        } else if (offset < 0 || static_cast<std::uint64_t>(offset) > block) {
          r.code = to_status(errc::draft_write_out_of_order);
          r.value = offset;
          r.index = static_cast<std::int32_t>(block);
        } else if (static_cast<std::uint64_t>(offset) + static_cast<std::uint64_t>(count) > Ring::max_block) {
          r.code = to_status(errc::block_too_wide);
          r.value = static_cast<std::int64_t>(offset) + count;
          r.index = static_cast<std::int32_t>(Ring::max_block);
        }
      }
      code = r.code;
      if (r.code != status_ok) record_entry_error(ws, epoch, e, r);
      bool aligned = ring.row_bytes % 16 == 0 && v.row_stride % 16 == 0 &&
                     reinterpret_cast<std::uintptr_t>(ring.base) % 16 == 0;
      if (v.layer_rows != nullptr)
        for (std::size_t l = 0; l < ring.layers && aligned; ++l)
          aligned = reinterpret_cast<std::uintptr_t>(v.layer_rows[l]) % 16 == 0;
      vec16 = aligned;
    }
    __syncthreads();
    if (code == status_ok) {
      const std::uint64_t pos0 = st.committed + static_cast<std::uint64_t>(offset);
      if (v.layer_rows != nullptr) {
        const std::size_t unit = vec16 ? 16 : 1;
        const std::size_t units = ring.row_bytes / unit;
        const std::size_t total = ring.layers * static_cast<std::size_t>(count) * units;
        for (std::size_t i = threadIdx.x; i < total; i += blockDim.x) {
          const std::size_t u = i % units, j = (i / units) % static_cast<std::size_t>(count),
                            l = i / (units * static_cast<std::size_t>(count));
          const std::byte* src = v.layer_rows[l] + (static_cast<std::uint64_t>(first_row) + j) * v.row_stride + u * unit;
          std::byte* dst = ring.row(slot, pos0 + j, l) + u * unit;
          if (vec16)
            *reinterpret_cast<int4*>(dst) = *reinterpret_cast<const int4*>(src);
          else
            *dst = *src;
        }
      }
      __syncthreads();  // rows before the book that publishes them (same kernel: ordering for later launches)
      if (threadIdx.x == 0) books[slot].written = pos0 + static_cast<std::uint64_t>(count);
    }
  }
  finish_write_cta(ws);
}

/// One CTA per entry of a commit view: committed += accepted + 1, written = committed, when the
/// anchor and the accepted proposals are written.
template <int = 0>
__global__ void __launch_bounds__(draft_commit_threads)
    draft_commit_step_kernel(std::size_t slots, draft_slot_state* books, draft_commit_view v, write_workspace_view ws) {
  const unsigned e = blockIdx.x;
  const std::uint32_t epoch = write_epoch(ws);
  const std::int32_t slot = v.slots[e];
  if (slot >= 0) {
    const status_code slot_code = draft_entry_slot(slots, v.slots, e, slot);
    if (threadIdx.x == 0) {
      entry_error r = slot_entry_record(slot_code, slot, epoch);
      if (r.code == status_ok) {
        const draft_slot_state st = books[slot];
        const std::int32_t a = v.accepted[e];
        const std::uint64_t block = st.written - st.committed;
        r.frontier = static_cast<std::int64_t>(st.committed);
        if (a < 0 || static_cast<std::uint64_t>(a) >= block) {
          r.code = to_status(errc::acceptance_beyond_block);
          r.value = a;
          r.index = static_cast<std::int32_t>(block);
        } else {
          const std::uint64_t n = st.committed + static_cast<std::uint64_t>(a) + 1;
          books[slot] = {n, n};
        }
      }
      if (r.code != status_ok) record_entry_error(ws, epoch, e, r);
    }
  }
  finish_write_cta(ws);
}

/// Sets one slot's book (the host path, in stream order: values by value, no host memory to outlive).
template <int = 0>
__global__ void set_draft_books_kernel(draft_slot_state* books, std::size_t slot, draft_slot_state s) {
  books[slot] = s;
}

/// out[i] = books[i] for i < n (out: device memory or mapped pinned host memory).
template <int = 0>
__global__ void copy_draft_books_kernel(const draft_slot_state* books, draft_slot_state* out, std::size_t n) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) out[i] = books[i];
}

template <DraftRingPolicy Ring>
cudaError_t launch_draft_write_step(const draft_ring_ref<Ring>& ring, draft_slot_state* books,
                                    const draft_write_view& v, const write_workspace_view& ws, cudaStream_t stream) {
  if (v.capacity == 0) return cudaSuccess;
  draft_write_step_kernel<Ring><<<v.capacity, draft_write_threads, 0, stream>>>(ring, books, v, ws);
  return cudaGetLastError();
}

inline cudaError_t launch_draft_commit_step(std::size_t slots, draft_slot_state* books, const draft_commit_view& v,
                                            const write_workspace_view& ws, cudaStream_t stream) {
  if (v.capacity == 0) return cudaSuccess;
  draft_commit_step_kernel<><<<v.capacity, draft_commit_threads, 0, stream>>>(slots, books, v, ws);
  return cudaGetLastError();
}

inline cudaError_t launch_set_draft_books(draft_slot_state* books, std::size_t slot, draft_slot_state s,
                                          cudaStream_t stream) {
  set_draft_books_kernel<><<<1, 1, 0, stream>>>(books, slot, s);
  return cudaGetLastError();
}

inline cudaError_t launch_copy_draft_books(const draft_slot_state* books, draft_slot_state* out, std::size_t n,
                                           cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const unsigned blocks = static_cast<unsigned>((n + 255) / 256);
  copy_draft_books_kernel<><<<blocks, 256, 0, stream>>>(books, out, n);
  return cudaGetLastError();
}

/// Loads the kernels up front (a kernel loaded lazily at its first launch may synchronise the
/// context, and a first launch inside a stream capture should not be the one that loads it).
template <DraftRingPolicy Ring>
cudaError_t preload_draft_ring_kernels() {
  cudaFuncAttributes a{};
  cudaError_t e = cudaFuncGetAttributes(&a, draft_write_step_kernel<Ring>);
  if (e == cudaSuccess) e = cudaFuncGetAttributes(&a, draft_commit_step_kernel<>);
  if (e == cudaSuccess) e = cudaFuncGetAttributes(&a, set_draft_books_kernel<>);
  if (e == cudaSuccess) e = cudaFuncGetAttributes(&a, copy_draft_books_kernel<>);
  return e;
}

}  // namespace dhisparse::cuda::detail
