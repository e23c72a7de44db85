#pragma once
/// \file
/// CUDA draft ring store: the drafter's KV of `slots` request slots in device memory, laid out by a
/// DraftRing policy (R_d rows per slot and drafter layer, position t of slot i at phi(i, t)), with
/// the same book-keeping and typed errors as the host store (detail/draft_ring_books.hpp).
///
///   using ring = dhisparse::draft_ring<2048, 8, 64>;
///   dhisparse::draft_ring_config cfg{.slots = 35, .row_bytes = 2048, .layers = 6};
///   auto need = dhisparse::cuda::draft_ring_store<ring>::requirements(cfg);  // need.bytes of device memory
///   dhisparse::cuda::draft_ring_store<ring> ring_kv(cfg, stream);
///   ring_kv.prefill(slot, prompt_len, last_kv, std::min(prompt_len, W), stream);  // a new request
///   ring_kv.write(slot, n, block_kv, K, stream);   // device or host source, stream-ordered
///   my_draft_attention<<<...>>>(ring_kv.ref(), ...);  // ref.row(slot, t, layer) inside kernels
///   ring_kv.commit(slot, accepted);                 // host books only: no device work, no sync
///
/// Book-keeping errors throw before any device work, with the store unchanged. Copies return the
/// CUDA status; the books stay unchanged when nothing was enqueued (when the second piece of a
/// wrapping block fails, positions from the write's first one on are dropped). Writes and commits
/// do not synchronise; a kernel reading rows must be ordered after the write on the same stream (or an
/// event), and a rewrite of a row must be ordered after the kernels still reading it.
#include "detail/minimum_arch.cuh"  // first: stops below sm_80 with a clear message
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "../detail/draft_ring_store_base.hpp"
#include "buffers.cuh"
#include "error.cuh"

namespace dhisparse::cuda {

/// Device ref of a draft ring: pass by value to kernels; `location(slot, t)` and `row(slot, t, layer)`.
template <DraftRingPolicy Ring>
using draft_ring_ref = ::dhisparse::draft_ring_ref<Ring>;

/// CUDA draft ring store: the draft KV of N request slots in device memory, laid out by `Ring`,
/// with host-side books of committed, written and live positions (see the file comment).
template <DraftRingPolicy Ring>
class draft_ring_store : public ::dhisparse::detail::draft_ring_store_base<Ring> {
  using base = ::dhisparse::detail::draft_ring_store_base<Ring>;
  using base::books_;
  using base::cfg_;
  using base::req_;

 public:
  /// Trivially copyable device view of the ring's rows (`draft_ring_ref<Ring>`).
  using typename base::ref_type;
  /// R_d: ring rows per request slot (`Ring::rows_per_slot`).
  using base::rows_per_slot;

  /// Allocates the ring and zeroes it on `stream` (synchronises `stream` before returning, like
  /// every constructor of the CUDA backend; the step path never does).
  explicit draft_ring_store(const draft_ring_config& cfg, cudaStream_t stream = nullptr)
      : base(cfg), bytes_(req_.bytes) {
    DHISPARSE_CUDA_TRY(cudaMemsetAsync(bytes_.data(), 0, bytes_.bytes(), stream));
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
  }

  /// Device bytes actually allocated (equals requirements(cfg).bytes).
  [[nodiscard]] std::size_t allocated_bytes() const { return bytes_.bytes(); }
  /// Trivially copyable device view of all rows.
  [[nodiscard]] ref_type ref() const { return {bytes_.data(), cfg_.slots, cfg_.row_bytes, cfg_.layers}; }

  /// Writes positions [first, first + count) of `slot` from `rows` (device, pinned or pageable host
  /// memory; laid out layer-major: layer l of position first + j at rows + (l * count + j) *
  /// row_bytes), stream-ordered. Same rules as the host store: first in [committed, written],
  /// first + count <= committed + K_max; later written positions are dropped. At most two 2-D
  /// copies (the block may wrap the ring), each covering every layer.
  cudaError_t write(std::size_t slot, std::uint64_t first, const std::byte* rows, std::size_t count,
                    cudaStream_t stream) {
    books_.check_write(slot, first, count);
    if (rows == nullptr) throw size_mismatch("draft ring write from a null source");
    std::size_t done = 0;
    if (const cudaError_t e = enqueue_rows(slot, first, rows, count, stream, done); e != cudaSuccess) {
      // A first piece already enqueued replaces block rows from `first` on, so the books drop
      // those positions rather than claim rows they no longer describe (committed rows untouched).
      if (done > 0) books_.note_write(slot, first, 0);
      return e;
    }
    books_.note_write(slot, first, count);
    return cudaSuccess;
  }

  /// A new request's prompt: positions [0, positions) become committed at once, given by the
  /// rows of the last `count` = min(positions, W) of them (what the window shows), laid out as for
  /// write, stream-ordered. The slot must be empty (new, or reset); on a CUDA error nothing is
  /// committed. The next write starts at position `positions`.
  cudaError_t prefill(std::size_t slot, std::uint64_t positions, const std::byte* rows, std::size_t count,
                      cudaStream_t stream) {
    books_.check_prefill(slot, positions, count);
    if (rows == nullptr && count > 0) throw size_mismatch("draft ring prefill from a null source");
    std::size_t done = 0;
    if (const cudaError_t e = enqueue_rows(slot, positions - count, rows, count, stream, done); e != cudaSuccess)
      return e;
    books_.note_prefill(slot, positions);
    return cudaSuccess;
  }
  /// Device address of a live position's row in one drafter layer.
  [[nodiscard]] const std::byte* row(std::size_t slot, std::uint64_t position, std::size_t layer = 0) const {
    this->check_row(slot, position, layer);
    return ref().row(slot, position, layer);
  }

 private:
  /// Enqueues the copy of positions [first, first + count) from layer-major `rows`: at most two
  /// 2-D copies (the positions may wrap the ring), each covering every layer. `done` counts the
  /// positions already enqueued when a copy fails.
  cudaError_t enqueue_rows(std::size_t slot, std::uint64_t first, const std::byte* rows, std::size_t count,
                           cudaStream_t stream, std::size_t& done) const {
    const ref_type r = ref();
    const std::size_t rb = cfg_.row_bytes;
    done = 0;
    while (done < count) {
      // Positions first + done .. up to the ring's end are contiguous rows of the slot.
      const std::size_t at = static_cast<std::size_t>((first + done) % rows_per_slot);
      const std::size_t run = std::min(count - done, rows_per_slot - at);
      const cudaError_t e = cudaMemcpy2DAsync(r.row(slot, first + done), r.layer_stride(), rows + done * rb, count * rb,
                                              run * rb, cfg_.layers, cudaMemcpyDefault, stream);
      if (e != cudaSuccess) return e;
      done += run;
    }
    return cudaSuccess;
  }
  device_buffer<std::byte> bytes_;
};

}  // namespace dhisparse::cuda
