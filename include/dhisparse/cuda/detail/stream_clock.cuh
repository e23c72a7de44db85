#pragma once
/// \file
/// `stream_clock`: tickets for points in one stream's work, completed in order and polled with
/// cudaEventQuery, so the host learns what the device has finished without ever waiting for it.
/// `record()` marks "everything enqueued on the stream so far" with a ticket; `poll()` advances
/// `completed()` over the tickets whose events have fired; `event(t)` lets another stream wait for
/// a ticket on the device (cudaStreamWaitEvent). Events are reused once fired.
#include <cuda_runtime.h>

#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

#include "../error.cuh"

namespace dhisparse::cuda::detail {

class stream_clock {
 public:
  stream_clock() = default;
  explicit stream_clock(cudaStream_t stream) : stream_(stream) {}
  stream_clock(const stream_clock&) = delete;
  stream_clock& operator=(const stream_clock&) = delete;
  stream_clock(stream_clock&& o) noexcept { *this = std::move(o); }
  stream_clock& operator=(stream_clock&& o) noexcept {
    if (this != &o) {
      destroy();
      stream_ = o.stream_;
      next_ = o.next_;
      completed_ = o.completed_;
      in_flight_ = std::move(o.in_flight_);
      spare_ = std::move(o.spare_);
      o.in_flight_.clear();
      o.spare_.clear();
    }
    return *this;
  }
  ~stream_clock() { destroy(); }

  [[nodiscard]] cudaStream_t stream() const { return stream_; }
  /// Ticket of the last `record()` (0 before any).
  [[nodiscard]] std::uint64_t last() const { return next_ - 1; }
  /// Every ticket up to this one has completed on the device (as of the last `poll()`).
  [[nodiscard]] std::uint64_t completed() const { return completed_; }
  [[nodiscard]] bool done(std::uint64_t ticket) const { return ticket <= completed_; }
  [[nodiscard]] bool idle() const { return in_flight_.empty(); }

  /// Records an event behind everything enqueued on the stream so far; returns its ticket.
  std::uint64_t record() {
    cudaEvent_t e = nullptr;
    if (spare_.empty()) {
      DHISPARSE_CUDA_TRY(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    } else {
      e = spare_.back();
      spare_.pop_back();
    }
    const cudaError_t r = cudaEventRecord(e, stream_);
    if (r != cudaSuccess) {
      spare_.push_back(e);
      DHISPARSE_CUDA_TRY(r);
    }
    in_flight_.emplace_back(next_, e);
    return next_++;
  }

  /// Advances `completed()` without blocking; returns it. Throws device_error on a CUDA error.
  std::uint64_t poll() {
    while (!in_flight_.empty()) {
      const cudaError_t r = cudaEventQuery(in_flight_.front().second);
      if (r == cudaErrorNotReady) break;
      DHISPARSE_CUDA_TRY(r);
      completed_ = in_flight_.front().first;
      spare_.push_back(in_flight_.front().second);
      in_flight_.pop_front();
    }
    return completed_;
  }

  /// Makes `waiter` wait on the device for everything enqueued on this clock's stream so far
  /// (records a ticket); returns the ticket. No host wait.
  std::uint64_t order_before(cudaStream_t waiter) {
    const std::uint64_t t = record();
    DHISPARSE_CUDA_TRY(cudaStreamWaitEvent(waiter, in_flight_.back().second, 0));
    return t;
  }

 private:
  void destroy() noexcept {
    for (auto& [t, e] : in_flight_) cudaEventDestroy(e);  // destroying a pending event is allowed
    for (auto e : spare_) cudaEventDestroy(e);
    in_flight_.clear();
    spare_.clear();
  }

  cudaStream_t stream_ = nullptr;
  std::uint64_t next_ = 1;
  std::uint64_t completed_ = 0;
  std::deque<std::pair<std::uint64_t, cudaEvent_t>> in_flight_;
  std::vector<cudaEvent_t> spare_;
};

}  // namespace dhisparse::cuda::detail
