#pragma once
/// \file
/// What the host and CUDA draft ring stores share: configuration, sizing and every call that only
/// touches the books (claims, commits, rollbacks, resets, liveness and windows). A backend adds its
/// storage, its ref and its write. The CUDA store keeps its true books on the device and these
/// host books as a cache: a slot whose cache is stale (`stale_`) refuses every host-book call with
/// invalid_configuration until the store reads its books back (the host store never goes stale).
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "draft_ring_books.hpp"

namespace dhisparse::detail {

template <DraftRingPolicy Ring>
class draft_ring_store_base {
 public:
  using policy = Ring;
  using ref_type = draft_ring_ref<Ring>;
  static constexpr std::size_t rows_per_slot = Ring::rows_per_slot;

  /// Bytes a store of `cfg` allocates; throws invalid_configuration on zero sizes or overflow.
  [[nodiscard]] static draft_ring_requirements requirements(const draft_ring_config& cfg) {
    return draft_ring_sizing<Ring>(cfg);
  }

  [[nodiscard]] const draft_ring_config& config() const { return cfg_; }
  [[nodiscard]] const draft_ring_requirements& memory() const { return req_; }
  /// Bytes one position occupies over all drafter layers (a write's source size per position).
  [[nodiscard]] std::size_t position_bytes() const { return cfg_.layers * cfg_.row_bytes; }

  /// Records positions [first, first + count) as written in place by the caller through ref()
  /// (same rules as write), for drafters that store their KV themselves.
  void claim(std::size_t slot, std::uint64_t first, std::size_t count = 1) {
    check_known(slot);
    books_.check_write(slot, first, count);
    books_.note_write(slot, first, count);
  }
  /// After verification with `accepted` proposals accepted (anchor not counted): positions
  /// n .. n + accepted join the committed window, n' = n + accepted + 1, the rest of the block is
  /// dropped (books only: no device work). acceptance_beyond_block unless all of them are written.
  void commit(std::size_t slot, std::size_t accepted) {
    check_known(slot);
    books_.check_commit(slot, accepted);
    books_.note_commit(slot, accepted);
  }
  /// Drops the current block without committing anything.
  void rollback(std::size_t slot) {
    check_known(slot);
    books_.rollback(slot);
  }
  /// Frees the slot for a new request (positions restart at 0; the bytes are left as they are).
  void reset(std::size_t slot) { books_.reset(slot); }

  /// Next position to commit (n) and one past the last written position of a slot.
  [[nodiscard]] std::uint64_t committed(std::size_t slot) const {
    check_known(slot);
    return books_.state(slot).committed;
  }
  [[nodiscard]] std::uint64_t written(std::size_t slot) const {
    check_known(slot);
    return books_.state(slot).written;
  }

  /// Ring location (row index in [0, slots * R_d)) of a live position; draft_position_not_live otherwise.
  [[nodiscard]] std::size_t location(std::size_t slot, std::uint64_t position) const {
    check_known(slot);
    books_.check_live(slot, position);
    return Ring::address(slot, position);
  }
  /// Live positions of a slot: the last W committed, then the written part of the block.
  [[nodiscard]] draft_window window(std::size_t slot) const {
    check_known(slot);
    return books_.window(slot);
  }
  /// Ring locations of the live positions in position order into `out` (size >= W + K_max suffices).
  draft_window window_into(std::size_t slot, std::span<std::size_t> out) const {
    check_known(slot);
    return books_.window_into(slot, out);
  }
  /// The same, as a new vector.
  [[nodiscard]] std::vector<std::size_t> window_locations(std::size_t slot) const {
    check_known(slot);
    std::vector<std::size_t> out(Ring::window + Ring::max_block);
    out.resize(books_.window_into(slot, out).count);
    return out;
  }

 protected:
  explicit draft_ring_store_base(const draft_ring_config& cfg)
      : cfg_(cfg), req_(requirements(cfg)), books_(cfg.slots) {}

  /// A live position and a layer in range, or the typed error.
  void check_row(std::size_t slot, std::uint64_t position, std::size_t layer) const {
    check_known(slot);
    books_.check_live(slot, position);
    if (layer >= cfg_.layers)
      throw invalid_source("draft ring layer " + std::to_string(layer) + " out of range (" +
                           std::to_string(cfg_.layers) + " layers)");
  }

  /// invalid_configuration while the host books of `slot` are a stale cache of device books that
  /// batched device calls changed (CUDA store; see its `sync_books`). Out-of-range slots pass, for
  /// the books to report invalid_slot.
  void check_known(std::size_t slot) const {
    if (slot < stale_.size() && stale_[slot] != 0)
      throw invalid_configuration("draft ring slot " + std::to_string(slot) +
                                  ": its books were changed on the device by write_step/commit_step since the host "
                                  "last read them; call sync_books(stream) (or reset the slot) first");
  }

  draft_ring_config cfg_;
  draft_ring_requirements req_;
  draft_ring_books<Ring> books_;
  std::vector<unsigned char> stale_;  ///< per slot: host books behind the device (CUDA store only)
};

}  // namespace dhisparse::detail
