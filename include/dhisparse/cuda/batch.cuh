#pragma once
/// \file
/// `device_batch`: device buffers for a strided `batch_view` (slots, selections, lengths,
/// locations and the count), carved from one allocation. Use it to capture the resolver in a
/// CUDA graph: capture `hierarchy::resolve(source, batch.view(), stream)` once, then before each
/// replay write new slots/selections/lengths/count (kernels of your own, or `upload`).
#include "detail/minimum_arch.cuh"  // first: stops below sm_80 with a clear message
#include <cuda_runtime.h>

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
#include "views.cuh"

namespace dhisparse::cuda {

/// Owns the device buffers of one strided `batch_view` (one allocation, zeroed at construction); move-only.
/// Bound to the device current at construction (`device()`): its calls work from any thread and
/// take streams of that device (wrong_device otherwise).
class device_batch {
 public:
  /// Buffers for up to `capacity` entries of `stride` selection entries each, on the current device.
  device_batch(std::uint32_t capacity, std::uint32_t stride) : capacity_(capacity), stride_(stride) {
    if (capacity == 0 || stride == 0) throw invalid_configuration("device_batch needs capacity and stride >= 1");
    detail::carver c;
    off_count_ = c.take<std::uint32_t>(1);
    off_slots_ = c.take<std::int32_t>(capacity);
    off_lengths_ = c.take<std::int32_t>(capacity);
    off_sel_ = c.take<row_index>(static_cast<std::size_t>(capacity) * stride);
    off_loc_ = c.take<location>(static_cast<std::size_t>(capacity) * stride);
    bytes_ = device_buffer<std::byte>(c.bytes());
    DHISPARSE_CUDA_TRY(cudaMemset(bytes_.data(), 0, bytes_.bytes()));
    DHISPARSE_CUDA_TRY(cudaDeviceSynchronize());  // done before uploads on any (non-blocking) stream
  }

  /// The device the buffers live on (-1 once moved from).
  [[nodiscard]] int device() const noexcept { return bytes_.device(); }
  /// Batch entries the buffers hold.
  [[nodiscard]] std::uint32_t capacity() const { return capacity_; }
  /// Selection entries per batch entry (the strided layout's stride).
  [[nodiscard]] std::uint32_t stride() const { return stride_; }
  /// Device scalar: entries in the next launch.
  [[nodiscard]] std::uint32_t* count() const { return at<std::uint32_t>(off_count_); }
  /// [capacity] request slot of each entry.
  [[nodiscard]] std::int32_t* slots() const { return at<std::int32_t>(off_slots_); }
  /// [capacity] selection entries each entry reads.
  [[nodiscard]] std::int32_t* lengths() const { return at<std::int32_t>(off_lengths_); }
  /// [capacity * stride] selections, entry e at e * stride, -1 padded.
  [[nodiscard]] row_index* selections() const { return at<row_index>(off_sel_); }
  /// [capacity * stride] locations the resolver writes, entry e at e * stride.
  [[nodiscard]] location* locations() const { return at<location>(off_loc_); }

  /// The strided view over these buffers (stable: capture it once).
  [[nodiscard]] batch_view view() const {
    batch_view v;
    v.slots = slots();
    v.selections = selections();
    v.locations = locations();
    v.lengths = lengths();
    v.count = count();
    v.stride = stride_;
    v.capacity = capacity_;
    return v;
  }

  /// Copies a batch from (pageable or pinned) host memory in stream order: `slots.size()` entries,
  /// `selections` holding entry e at e * stride (may be shorter than capacity * stride), and the
  /// per-entry lengths (empty: every entry uses the full stride). cudaMemcpyAsync stages pageable
  /// memory before returning, so the host vectors may change at once.
  void upload(std::span<const std::int32_t> slots, std::span<const row_index> selections,
              std::span<const std::int32_t> lengths, cudaStream_t stream) {
    const detail::device_guard guard(device(), stream);
    if (slots.size() > capacity_ || selections.size() > static_cast<std::size_t>(capacity_) * stride_ ||
        (!lengths.empty() && lengths.size() != slots.size()))
      throw size_mismatch("device_batch upload of " + std::to_string(slots.size()) + " entries does not fit capacity " +
                          std::to_string(capacity_) + " x stride " + std::to_string(stride_));
    staged_lengths_.assign(lengths.begin(), lengths.end());
    if (lengths.empty()) staged_lengths_.assign(slots.size(), static_cast<std::int32_t>(stride_));
    const auto n = static_cast<std::uint32_t>(slots.size());
    if (n != 0) {
      DHISPARSE_CUDA_TRY(cudaMemcpyAsync(this->slots(), slots.data(), slots.size_bytes(), cudaMemcpyHostToDevice, stream));
      DHISPARSE_CUDA_TRY(cudaMemcpyAsync(this->lengths(), staged_lengths_.data(), n * sizeof(std::int32_t),
                                         cudaMemcpyHostToDevice, stream));
    }
    if (!selections.empty())
      DHISPARSE_CUDA_TRY(
          cudaMemcpyAsync(this->selections(), selections.data(), selections.size_bytes(), cudaMemcpyHostToDevice, stream));
    DHISPARSE_CUDA_TRY(cudaMemcpyAsync(count(), &n, sizeof(n), cudaMemcpyHostToDevice, stream));
  }

  /// Reads `entries * stride` locations back (synchronises `stream`).
  [[nodiscard]] std::vector<location> download_locations(std::uint32_t entries, cudaStream_t stream) const {
    const detail::device_guard guard(device(), stream);
    return detail::download_sync(locations(), static_cast<std::size_t>(entries) * stride_, stream);
  }

 private:
  template <class T>
  T* at(std::size_t off) const {
    return reinterpret_cast<T*>(bytes_.data() + off);
  }
  std::uint32_t capacity_ = 0, stride_ = 0;
  std::size_t off_count_ = 0, off_slots_ = 0, off_lengths_ = 0, off_sel_ = 0, off_loc_ = 0;
  device_buffer<std::byte> bytes_;
  std::vector<std::int32_t> staged_lengths_;
};

}  // namespace dhisparse::cuda
