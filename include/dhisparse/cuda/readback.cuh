#pragma once
/// \file
/// Asynchronous, capturable readbacks of a source's per-step results: `error_record` (what
/// `hierarchy::copy_errors_async` writes and `hierarchy::throw_if_error` turns into a typed error)
/// and the launchers behind `copy_stats_async` / `copy_verify_stats_async` / `copy_errors_async`.
/// Each is one small kernel on the caller's stream: it runs after the launches before it in that
/// stream, reads the source's control block there (so it knows the last launch's entry count
/// without a host round trip) and writes caller memory (device memory, or mapped pinned host
/// memory read once the stream has passed it). No allocation, no synchronization.
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "views.cuh"

namespace dhisparse::cuda {

/// A source's resolver error state, taken on the device by `hierarchy::copy_errors_async`: the
/// first bad entry of the first failing launch since the state was last taken or checked, and a
/// batch count above capacity if one was seen. `hierarchy::throw_if_error` throws it as the typed
/// error `check_errors` would have thrown. Trivially copyable: copy it anywhere.
struct error_record {
  std::uint32_t source = 0;    ///< the source the record was taken from
  std::uint32_t overflow = 0;  ///< a batch count above the batch_view capacity (0: none)
  std::int32_t entry = -1;     ///< batch entry of `error` (-1: no bad entry)
  std::uint32_t reserved = 0;  ///< padding (written 0)
  entry_error error{};         ///< the bad entry's record (code status_ok when entry is -1)

  /// Nothing to report.
  [[nodiscard]] DHISPARSE_HD bool ok() const { return overflow == 0 && entry < 0; }
};
static_assert(sizeof(error_record) == 48);
static_assert(std::is_trivially_copyable_v<error_record>);

namespace detail {

inline constexpr unsigned readback_threads = 256;

/// out[t] = stats[t] for t < min(last_count, n), zero for the rest (so a sum over out is the
/// last launch's total whatever n is).
template <class Stats>
__global__ void __launch_bounds__(readback_threads)
    snapshot_stats_kernel(const control_block* control, const Stats* stats, Stats* out, unsigned n) {
  const unsigned count = control->last_count;
  for (unsigned t = blockIdx.x * blockDim.x + threadIdx.x; t < n; t += gridDim.x * blockDim.x)
    out[t] = t < count ? stats[t] : Stats{};
}

/// Writes the error record of one source and clears its sticky epoch and overflow, so the next
/// failing launch is recorded again (`check_errors` clears them the same way). One CTA.
// A template so that programs of several translation units link (one definition per program).
template <int = 0>
__global__ void __launch_bounds__(readback_threads)
    take_errors_kernel(control_block* control, const entry_error* sticky, unsigned capacity, unsigned source,
                       error_record* out) {
  __shared__ unsigned first;
  const unsigned epoch = control->sticky_epoch;
  if (threadIdx.x == 0) first = capacity;
  __syncthreads();
  if (epoch != 0)
    for (unsigned t = threadIdx.x; t < capacity; t += blockDim.x)
      if (sticky[t].epoch == epoch && sticky[t].code != status_ok) atomicMin(&first, t);
  __syncthreads();
  if (threadIdx.x == 0) {
    error_record r;
    r.source = source;
    r.overflow = control->overflow;
    if (first < capacity) {
      r.entry = static_cast<std::int32_t>(first);
      r.error = sticky[first];
    }
    *out = r;
    control->sticky_epoch = 0;
    control->overflow = 0;
  }
}

/// Launches snapshot_stats_kernel for `n` entries into `out` (device-accessible).
template <class Stats>
cudaError_t launch_snapshot_stats(const control_block* control, const Stats* stats, Stats* out, unsigned n,
                                  cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const unsigned blocks = (n + readback_threads - 1) / readback_threads;
  snapshot_stats_kernel<Stats><<<blocks, readback_threads, 0, stream>>>(control, stats, out, n);
  return cudaGetLastError();
}

/// Launches take_errors_kernel for one source's workspace.
inline cudaError_t launch_take_errors(control_block* control, const entry_error* sticky, unsigned capacity,
                                      unsigned source, error_record* out, cudaStream_t stream) {
  take_errors_kernel<><<<1, readback_threads, 0, stream>>>(control, sticky, capacity, source, out);
  return cudaGetLastError();
}

/// Loads the readback kernels up front: a kernel loaded lazily at its first launch may
/// synchronize the context, which would make the first asynchronous readback wait for every stream.
template <class... Stats>
cudaError_t preload_readback_kernels() {
  cudaFuncAttributes a{};
  cudaError_t e = cudaFuncGetAttributes(&a, take_errors_kernel<>);
  ((e = e == cudaSuccess ? cudaFuncGetAttributes(&a, snapshot_stats_kernel<Stats>) : e), ...);
  return e;
}

}  // namespace detail
}  // namespace dhisparse::cuda
