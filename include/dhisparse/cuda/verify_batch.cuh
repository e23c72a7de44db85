#pragma once
/// \file
/// `device_verify_batch`: device buffers for a `verify_batch_view` (count, slots, K_r per entry,
/// per-query lengths, selections, locations and the pointer arrays into them), carved from one
/// allocation. Query j of entry e reads its selection at `selections() + (e * max_block + j) *
/// stride` and writes its locations at the same offset of `locations()`. Capture
/// `hierarchy::verify(source, batch.view(), stream)` once, then before each replay write new
/// contents (kernels of your own, or `upload`).
#include "detail/minimum_arch.cuh"  // first: stops below sm_80 with a clear message
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "../errors.hpp"
#include "../types.hpp"
#include "buffers.cuh"
#include "detail/device_guard.cuh"
#include "error.cuh"
#include "verify_views.cuh"

namespace dhisparse::cuda {

/// Owns the device buffers of one `verify_batch_view` (one allocation, zeroed at construction, pointer arrays
/// filled in); move-only. Bound to the device current at construction (`device()`): its calls
/// work from any thread and take streams of that device (wrong_device otherwise).
class device_verify_batch {
 public:
  /// Buffers for up to `capacity` entries of up to `max_block` queries (the hierarchy's K_max) of
  /// up to `stride` selection entries each (top_k), on the current device. Synchronises the device once.
  device_verify_batch(std::uint32_t capacity, std::uint32_t max_block, std::uint32_t stride)
      : capacity_(capacity), max_block_(max_block), stride_(stride) {
    if (capacity == 0 || max_block == 0 || stride == 0)
      throw invalid_configuration("device_verify_batch needs capacity, max_block and stride >= 1");
    const std::size_t queries = static_cast<std::size_t>(capacity) * max_block;
    detail::carver c;
    off_count_ = c.take<std::uint32_t>(1);
    off_slots_ = c.take<std::int32_t>(capacity);
    off_queries_ = c.take<std::int32_t>(capacity);
    off_lengths_ = c.take<std::int32_t>(queries);
    off_sel_ptrs_ = c.take<const row_index*>(queries);
    off_loc_ptrs_ = c.take<location*>(queries);
    off_sel_ = c.take<row_index>(queries * stride);
    off_loc_ = c.take<location>(queries * stride);
    bytes_ = device_buffer<std::byte>(c.bytes());
    DHISPARSE_CUDA_TRY(cudaMemset(bytes_.data(), 0, bytes_.bytes()));
    std::vector<const row_index*> sel_ptrs(queries);
    std::vector<location*> loc_ptrs(queries);
    for (std::size_t q = 0; q < queries; ++q) {
      sel_ptrs[q] = selections() + q * stride;
      loc_ptrs[q] = locations() + q * stride;
    }
    DHISPARSE_CUDA_TRY(cudaMemcpy(at<const row_index*>(off_sel_ptrs_), sel_ptrs.data(), queries * sizeof(void*),
                                  cudaMemcpyHostToDevice));
    DHISPARSE_CUDA_TRY(cudaMemcpy(at<location*>(off_loc_ptrs_), loc_ptrs.data(), queries * sizeof(void*),
                                  cudaMemcpyHostToDevice));
    DHISPARSE_CUDA_TRY(cudaDeviceSynchronize());  // done before uploads on any (non-blocking) stream
  }

  /// The device the buffers live on (-1 once moved from).
  [[nodiscard]] int device() const noexcept { return bytes_.device(); }
  /// Batch entries (rounds) the buffers hold.
  [[nodiscard]] std::uint32_t capacity() const { return capacity_; }
  /// Queries per entry the buffers hold (K_max).
  [[nodiscard]] std::uint32_t max_block() const { return max_block_; }
  /// Selection entries per query (top_k).
  [[nodiscard]] std::uint32_t stride() const { return stride_; }
  /// Device scalar: entries in the next launch.
  [[nodiscard]] std::uint32_t* count() const { return at<std::uint32_t>(off_count_); }
  /// [capacity] request slot of each entry.
  [[nodiscard]] std::int32_t* slots() const { return at<std::int32_t>(off_slots_); }
  /// [capacity] K_r (queries) of each entry.
  [[nodiscard]] std::int32_t* queries() const { return at<std::int32_t>(off_queries_); }
  /// [capacity * max_block] entries of each query, at e * max_block + j.
  [[nodiscard]] std::int32_t* lengths() const { return at<std::int32_t>(off_lengths_); }
  /// [capacity * max_block * stride] selections, query j of entry e at (e * max_block + j) * stride, -1 padded.
  [[nodiscard]] row_index* selections() const { return at<row_index>(off_sel_); }
  /// [capacity * max_block * stride] locations the verify writes, at the same offsets as `selections()`.
  [[nodiscard]] location* locations() const { return at<location>(off_loc_); }
  /// First location of query j of entry e.
  [[nodiscard]] location* locations(std::uint32_t e, std::uint32_t j) const {
    return locations() + (static_cast<std::size_t>(e) * max_block_ + j) * stride_;
  }

  /// The view over these buffers (stable: capture it once).
  [[nodiscard]] verify_batch_view view() const {
    verify_batch_view v;
    v.count = count();
    v.slots = slots();
    v.queries = queries();
    v.lengths = lengths();
    v.selection_ptrs = at<const row_index* const>(off_sel_ptrs_);
    v.location_ptrs = at<location* const>(off_loc_ptrs_);
    v.max_block = max_block_;
    v.capacity = capacity_;
    return v;
  }

  /// One request's round for `upload`: its request slot and K_r selections (each at most `stride`).
  struct round {
    /// Request slot of the round (`hierarchy::slot_of`).
    std::int32_t slot = 0;
    /// K_r host selections, anchor first, each of at most `stride` entries.
    std::span<const std::span<const row_index>> queries;
  };

  /// Copies a batch of rounds from host memory in stream order (slots, K_r, lengths and
  /// selections, then the count) and fills the rounds' location lists with -1. The copies are
  /// staged in this object's host buffers, so `rounds` may change at once; the next upload on
  /// another stream must be ordered after this one by the caller.
  void upload(std::span<const round> rounds, cudaStream_t stream) {
    const detail::device_guard guard(device(), stream);
    if (rounds.size() > capacity_)
      throw size_mismatch("device_verify_batch upload of " + std::to_string(rounds.size()) +
                          " rounds exceeds capacity " + std::to_string(capacity_));
    for (const auto& r : rounds) {
      if (r.queries.size() > max_block_)
        throw size_mismatch("device_verify_batch round with " + std::to_string(r.queries.size()) +
                            " queries exceeds max_block " + std::to_string(max_block_));
      for (const auto& q : r.queries)
        if (q.size() > stride_)
          throw size_mismatch("device_verify_batch query of " + std::to_string(q.size()) +
                              " entries exceeds stride " + std::to_string(stride_));
    }
    const auto n = static_cast<std::uint32_t>(rounds.size());
    const std::size_t queries = static_cast<std::size_t>(n) * max_block_;
    h_slots_.assign(n, 0);
    h_queries_.assign(n, 0);
    h_lengths_.assign(queries, 0);
    h_sel_.assign(queries * stride_, no_row);
    for (std::uint32_t e = 0; e < n; ++e) {
      h_slots_[e] = rounds[e].slot;
      h_queries_[e] = static_cast<std::int32_t>(rounds[e].queries.size());
      for (std::size_t j = 0; j < rounds[e].queries.size(); ++j) {
        const auto q = rounds[e].queries[j];
        h_lengths_[e * max_block_ + j] = static_cast<std::int32_t>(q.size());
        std::copy(q.begin(), q.end(), h_sel_.begin() + static_cast<std::ptrdiff_t>((e * max_block_ + j) * stride_));
      }
    }
    h_count_ = n;
    if (n != 0) {
      DHISPARSE_CUDA_TRY(cudaMemcpyAsync(slots(), h_slots_.data(), n * sizeof(std::int32_t), cudaMemcpyHostToDevice, stream));
      DHISPARSE_CUDA_TRY(
          cudaMemcpyAsync(this->queries(), h_queries_.data(), n * sizeof(std::int32_t), cudaMemcpyHostToDevice, stream));
      DHISPARSE_CUDA_TRY(cudaMemcpyAsync(lengths(), h_lengths_.data(), queries * sizeof(std::int32_t),
                                         cudaMemcpyHostToDevice, stream));
      DHISPARSE_CUDA_TRY(cudaMemcpyAsync(selections(), h_sel_.data(), h_sel_.size() * sizeof(row_index),
                                         cudaMemcpyHostToDevice, stream));
      DHISPARSE_CUDA_TRY(cudaMemsetAsync(locations(), 0xFF, queries * stride_ * sizeof(location), stream));  // -1
    }
    DHISPARSE_CUDA_TRY(cudaMemcpyAsync(count(), &h_count_, sizeof(h_count_), cudaMemcpyHostToDevice, stream));
  }

  /// Reads the locations of query j of entry e back (`length` entries; synchronises `stream`).
  [[nodiscard]] std::vector<location> download_locations(std::uint32_t e, std::uint32_t j, std::size_t length,
                                                         cudaStream_t stream) const {
    const detail::device_guard guard(device(), stream);
    if (e >= capacity_ || j >= max_block_ || length > stride_)
      throw size_mismatch("device_verify_batch download outside the buffers");
    return detail::download_sync(locations(e, j), length, stream);
  }

 private:
  template <class T>
  T* at(std::size_t off) const {
    return reinterpret_cast<T*>(bytes_.data() + off);
  }
  std::uint32_t capacity_ = 0, max_block_ = 0, stride_ = 0;
  std::size_t off_count_ = 0, off_slots_ = 0, off_queries_ = 0, off_lengths_ = 0, off_sel_ptrs_ = 0, off_loc_ptrs_ = 0,
              off_sel_ = 0, off_loc_ = 0;
  device_buffer<std::byte> bytes_;
  // Host staging of the last upload (pageable: cudaMemcpyAsync copies it before returning).
  std::vector<std::int32_t> h_slots_, h_queries_, h_lengths_;
  std::vector<row_index> h_sel_;
  std::uint32_t h_count_ = 0;
};

}  // namespace dhisparse::cuda
