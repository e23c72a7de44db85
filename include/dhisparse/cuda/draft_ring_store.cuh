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
///   ring_kv.write(slot, n, block_kv, K, stream);   // device or host source, stream-ordered
///   my_draft_attention<<<...>>>(ring_kv.ref(), ...);  // ref.row(slot, t, layer) inside kernels
///   ring_kv.commit(slot, accepted);                 // host books only: no device work, no sync
///
/// Book-keeping errors throw before any device work, with the store unchanged. Copies return the
/// CUDA status; the books stay unchanged when nothing was enqueued (when the second piece of a
/// wrapping block fails, positions from the write's first one on are dropped). Writes and commits
/// do not synchronise; a kernel reading rows must be ordered after the write on the same stream (or an
/// event), and a rewrite of a row must be ordered after the kernels still reading it.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "../detail/draft_ring_books.hpp"
#include "buffers.cuh"
#include "error.cuh"

namespace dhisparse::cuda {

/// Device ref of a draft ring: pass by value to kernels; `location(slot, t)` and `row(slot, t, layer)`.
template <DraftRingPolicy Ring>
using draft_ring_ref = ::dhisparse::draft_ring_ref<Ring>;

template <DraftRingPolicy Ring>
class draft_ring_store {
 public:
  using policy = Ring;
  using ref_type = draft_ring_ref<Ring>;
  static constexpr std::size_t rows_per_slot = Ring::rows_per_slot;

  /// Device bytes a store of `cfg` allocates (`bytes`; nothing pinned, no metadata on the device).
  /// Throws invalid_configuration on zero sizes or overflow.
  [[nodiscard]] static draft_ring_requirements requirements(const draft_ring_config& cfg) {
    return ::dhisparse::detail::draft_ring_sizing<Ring>(cfg);
  }

  /// Allocates the ring and zeroes it on `stream` (synchronises `stream` before returning, like
  /// every constructor of the CUDA backend; the step path never does).
  explicit draft_ring_store(const draft_ring_config& cfg, cudaStream_t stream = nullptr)
      : cfg_(cfg), req_(requirements(cfg)), bytes_(req_.bytes), books_(cfg.slots) {
    DHISPARSE_CUDA_TRY(cudaMemsetAsync(bytes_.data(), 0, bytes_.bytes(), stream));
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
  }

  [[nodiscard]] const draft_ring_config& config() const { return cfg_; }
  [[nodiscard]] const draft_ring_requirements& memory() const { return req_; }
  /// Device bytes actually allocated (equals requirements(cfg).bytes).
  [[nodiscard]] std::size_t allocated_bytes() const { return bytes_.bytes(); }
  [[nodiscard]] std::size_t position_bytes() const { return cfg_.layers * cfg_.row_bytes; }
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
    const ref_type r = ref();
    const std::size_t rb = cfg_.row_bytes;
    std::size_t done = 0;
    while (done < count) {
      // Positions first + done .. up to the ring's end are contiguous rows of the slot.
      const std::size_t at = static_cast<std::size_t>((first + done) % rows_per_slot);
      const std::size_t run = std::min(count - done, rows_per_slot - at);
      const cudaError_t e = cudaMemcpy2DAsync(r.row(slot, first + done), r.layer_stride(), rows + done * rb, count * rb,
                                              run * rb, cfg_.layers, cudaMemcpyDefault, stream);
      if (e != cudaSuccess) {
        // A first piece already enqueued replaces block rows from `first` on, so the books drop
        // those positions rather than claim rows they no longer describe (committed rows untouched).
        if (done > 0) books_.note_write(slot, first, 0);
        return e;
      }
      done += run;
    }
    books_.note_write(slot, first, count);
    return cudaSuccess;
  }
  /// Records positions [first, first + count) as written in place by the caller's kernels through
  /// ref() (same rules as write).
  void claim(std::size_t slot, std::uint64_t first, std::size_t count = 1) {
    books_.check_write(slot, first, count);
    books_.note_write(slot, first, count);
  }

  /// After verification: n' = n + accepted + 1, the rest of the block dropped (host books only).
  void commit(std::size_t slot, std::size_t accepted) {
    books_.check_commit(slot, accepted);
    books_.note_commit(slot, accepted);
  }
  /// Drops the current block without committing anything.
  void rollback(std::size_t slot) { books_.rollback(slot); }
  /// Frees the slot for a new request (positions restart at 0; the bytes are left as they are).
  void reset(std::size_t slot) { books_.reset(slot); }

  [[nodiscard]] std::uint64_t committed(std::size_t slot) const { return books_.state(slot).committed; }
  [[nodiscard]] std::uint64_t written(std::size_t slot) const { return books_.state(slot).written; }
  /// Ring location of a live position; draft_position_not_live otherwise.
  [[nodiscard]] std::size_t location(std::size_t slot, std::uint64_t position) const {
    books_.check_live(slot, position);
    return Ring::address(slot, position);
  }
  /// Device address of a live position's row in one drafter layer.
  [[nodiscard]] const std::byte* row(std::size_t slot, std::uint64_t position, std::size_t layer = 0) const {
    books_.check_live(slot, position);
    if (layer >= cfg_.layers)
      throw invalid_source("draft ring layer " + std::to_string(layer) + " out of range (" +
                           std::to_string(cfg_.layers) + " layers)");
    return ref().row(slot, position, layer);
  }
  /// Live positions of a slot and their ring locations in position order (host side; the drafter
  /// uploads them or recomputes phi from the window in its kernel).
  [[nodiscard]] draft_window window(std::size_t slot) const { return books_.window(slot); }
  draft_window window_into(std::size_t slot, std::span<std::size_t> out) const { return books_.window_into(slot, out); }
  [[nodiscard]] std::vector<std::size_t> window_locations(std::size_t slot) const {
    std::vector<std::size_t> out(Ring::window + Ring::max_block);
    out.resize(books_.window_into(slot, out).count);
    return out;
  }

 private:
  draft_ring_config cfg_;
  draft_ring_requirements req_;
  device_buffer<std::byte> bytes_;
  ::dhisparse::detail::draft_ring_books<Ring> books_;
};

}  // namespace dhisparse::cuda
