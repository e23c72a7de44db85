#pragma once
/// \file
/// A ring of pinned staging slots for host->device uploads on the eager path. A slot is reused
/// only after the event recorded behind its last copy has completed, so the host never
/// overwrites bytes a queued cudaMemcpyAsync has not read yet.
#include <cuda_runtime.h>

#include <cstddef>
#include <vector>

#include "../buffers.cuh"
#include "../error.cuh"
#include "device_guard.cuh"

namespace dhisparse::cuda::detail {

class staging_ring {
 public:
  staging_ring() = default;
  /// Events are created on the current device (the owning hierarchy's) and destroyed there.
  staging_ring(std::size_t slot_bytes, unsigned depth)
      : buffer_(slot_bytes * depth), slot_bytes_(slot_bytes), events_(depth, nullptr), device_(current_device()) {
    for (auto& e : events_) DHISPARSE_CUDA_TRY(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  staging_ring(const staging_ring&) = delete;
  staging_ring& operator=(const staging_ring&) = delete;
  staging_ring(staging_ring&& o) noexcept { swap(o); }
  staging_ring& operator=(staging_ring&& o) noexcept {
    swap(o);
    return *this;
  }
  ~staging_ring() {
    if (events_.empty()) return;
    const device_guard on(device_, std::nothrow);
    for (auto e : events_)
      if (e != nullptr) cudaEventDestroy(e);
  }

  [[nodiscard]] std::size_t slot_bytes() const { return slot_bytes_; }

  /// Next slot, once its previous upload has been consumed.
  std::byte* acquire(unsigned& slot) {
    slot = next_;
    next_ = (next_ + 1) % static_cast<unsigned>(events_.size());
    DHISPARSE_CUDA_TRY(cudaEventSynchronize(events_[slot]));
    return buffer_.data() + static_cast<std::size_t>(slot) * slot_bytes_;
  }
  /// Marks the slot busy until the work queued so far on `stream` has run.
  void release(unsigned slot, cudaStream_t stream) { DHISPARSE_CUDA_TRY(cudaEventRecord(events_[slot], stream)); }

 private:
  void swap(staging_ring& o) noexcept {
    std::swap(buffer_, o.buffer_);
    std::swap(slot_bytes_, o.slot_bytes_);
    std::swap(events_, o.events_);
    std::swap(next_, o.next_);
    std::swap(device_, o.device_);
  }
  pinned_buffer buffer_;
  std::size_t slot_bytes_ = 0;
  std::vector<cudaEvent_t> events_;
  unsigned next_ = 0;
  int device_ = -1;
};

}  // namespace dhisparse::cuda::detail
