#pragma once
/// \file
/// Host draft ring store: owns the draft KV of `slots` request slots in a DraftRing policy's ring
/// (R_d rows per slot and drafter layer, position t of slot i at phi(i, t)), and keeps the books of
/// which positions are committed, written and live. Memory does not depend on context length.
///
///   using ring = dhisparse::draft_ring<2048, 8, 64>;
///   dhisparse::draft_ring_config cfg{.slots = 35, .row_bytes = 2048, .layers = 6};
///   auto need = dhisparse::draft_ring_store<ring>::requirements(cfg);  // bytes before allocating
///   dhisparse::draft_ring_store<ring> ring_kv(cfg);
///   ring_kv.write(slot, n, anchor_kv);           // block positions n, n+1, ... in order
///   auto w = ring_kv.window(slot);               // ring rows the drafter attends over
///   ring_kv.commit(slot, accepted);              // after verification: n' = n + accepted + 1
///   ring_kv.reset(slot);                         // request completed
///
/// Every call validates first and throws a typed error with the store unchanged.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "../detail/draft_ring_books.hpp"

namespace dhisparse {

template <DraftRingPolicy Ring>
class draft_ring_store {
 public:
  using policy = Ring;
  using ref_type = draft_ring_ref<Ring>;
  static constexpr std::size_t rows_per_slot = Ring::rows_per_slot;

  /// Bytes a store of `cfg` allocates; throws invalid_configuration on zero sizes or overflow.
  [[nodiscard]] static draft_ring_requirements requirements(const draft_ring_config& cfg) {
    return detail::draft_ring_sizing<Ring>(cfg);
  }

  explicit draft_ring_store(const draft_ring_config& cfg)
      : cfg_(cfg), req_(requirements(cfg)), bytes_(req_.bytes), books_(cfg.slots) {}

  [[nodiscard]] const draft_ring_config& config() const { return cfg_; }
  [[nodiscard]] const draft_ring_requirements& memory() const { return req_; }
  /// Bytes one position occupies over all drafter layers (a write's source size per position).
  [[nodiscard]] std::size_t position_bytes() const { return cfg_.layers * cfg_.row_bytes; }
  /// Raw view of all rows (no liveness checks): what a kernel-style reader uses.
  [[nodiscard]] ref_type ref() { return {bytes_.data(), cfg_.slots, cfg_.row_bytes, cfg_.layers}; }
  [[nodiscard]] std::span<const std::byte> storage() const { return bytes_; }

  /// Writes positions [first, first + count) of `slot` from `rows`, laid out layer-major as a
  /// drafter produces them: rows[(l * count + j) * row_bytes ...] is layer l of position first + j.
  /// first must be in the current block (>= the committed prefix) and at most the next unwritten
  /// position; the block ends K_max after the committed prefix. Later written positions are dropped.
  void write(std::size_t slot, std::uint64_t first, std::span<const std::byte> rows, std::size_t count = 1) {
    books_.check_write(slot, first, count);
    if (rows.size() != count * position_bytes())
      throw size_mismatch("draft ring write of " + std::to_string(count) + " position(s) needs " +
                          std::to_string(count * position_bytes()) + " bytes, got " + std::to_string(rows.size()));
    const ref_type r = ref();
    for (std::size_t l = 0; l < cfg_.layers; ++l)
      for (std::size_t j = 0; j < count; ++j)
        std::memcpy(r.row(slot, first + j, l), rows.data() + (l * count + j) * cfg_.row_bytes, cfg_.row_bytes);
    books_.note_write(slot, first, count);
  }
  /// Records positions [first, first + count) as written by the caller through ref() (same rules
  /// as write), for drafters that store their KV in place.
  void claim(std::size_t slot, std::uint64_t first, std::size_t count = 1) {
    books_.check_write(slot, first, count);
    books_.note_write(slot, first, count);
  }

  /// After verification with `accepted` proposals accepted (anchor not counted): positions
  /// n .. n + accepted join the committed window, n' = n + accepted + 1, the rest of the block is
  /// dropped. acceptance_beyond_block unless all of n .. n + accepted are written.
  void commit(std::size_t slot, std::size_t accepted) {
    books_.check_commit(slot, accepted);
    books_.note_commit(slot, accepted);
  }
  /// Drops the current block without committing anything.
  void rollback(std::size_t slot) { books_.rollback(slot); }
  /// Frees the slot for a new request (positions restart at 0).
  void reset(std::size_t slot) { books_.reset(slot); }

  /// Next position to commit (n) and one past the last written position of a slot.
  [[nodiscard]] std::uint64_t committed(std::size_t slot) const { return books_.state(slot).committed; }
  [[nodiscard]] std::uint64_t written(std::size_t slot) const { return books_.state(slot).written; }

  /// Ring location (row index in [0, slots * R_d)) of a live position; draft_position_not_live otherwise.
  [[nodiscard]] std::size_t location(std::size_t slot, std::uint64_t position) const {
    books_.check_live(slot, position);
    return Ring::address(slot, position);
  }
  /// Bytes of a live position in one drafter layer.
  [[nodiscard]] std::span<const std::byte> row(std::size_t slot, std::uint64_t position, std::size_t layer = 0) const {
    books_.check_live(slot, position);
    if (layer >= cfg_.layers)
      throw invalid_source("draft ring layer " + std::to_string(layer) + " out of range (" +
                           std::to_string(cfg_.layers) + " layers)");
    return {bytes_.data() + layer * cfg_.slots * rows_per_slot * cfg_.row_bytes +
                Ring::address(slot, position) * cfg_.row_bytes,
            cfg_.row_bytes};
  }
  /// Live positions of a slot: the last W committed, then the written part of the block.
  [[nodiscard]] draft_window window(std::size_t slot) const { return books_.window(slot); }
  /// Ring locations of the live positions in position order into `out` (size >= W + K_max suffices).
  draft_window window_into(std::size_t slot, std::span<std::size_t> out) const { return books_.window_into(slot, out); }
  /// The same, as a new vector.
  [[nodiscard]] std::vector<std::size_t> window_locations(std::size_t slot) const {
    std::vector<std::size_t> out(Ring::window + Ring::max_block);
    out.resize(books_.window_into(slot, out).count);
    return out;
  }

 private:
  draft_ring_config cfg_;
  draft_ring_requirements req_;
  std::vector<std::byte> bytes_;  // zeroed: rows never written read as zeros through ref()
  detail::draft_ring_books<Ring> books_;
};

}  // namespace dhisparse
