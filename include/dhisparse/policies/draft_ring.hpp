#pragma once
/// \file
/// DraftRing<W, K_max, p>: window-bounded draft KV. A drafter that reads at most W prior positions
/// plus a block of at most K_max needs R_d = p * ceil((W + K_max + p - 1) / p) rows per request
/// slot; draft position t of slot i lives at phi(i, t) = i * R_d + (t mod R_d). Two positions that
/// are live together (less than R_d apart) never share a row, and slots occupy disjoint ranges.
#include <concepts>
#include <cstddef>
#include <cstdint>

#include "../detail/config.hpp"

namespace dhisparse {

/// R_d = p * ceil((W + K_max + p - 1) / p): rows one request slot's ring needs for a window of W
/// positions, a block of up to K_max and page alignment (p >= 1).
constexpr std::uint64_t draft_ring_rows(std::uint64_t window, std::uint64_t max_block, std::uint64_t page_rows) {
  const std::uint64_t span = window + max_block + page_rows - 1;
  return page_rows * ((span + page_rows - 1) / page_rows);
}

/// Requirements on a draft-ring policy type.
template <class R>
concept DraftRingPolicy = requires(std::size_t slot, std::uint64_t position) {
  { R::window } -> std::convertible_to<std::size_t>;
  { R::max_block } -> std::convertible_to<std::size_t>;
  { R::page_rows } -> std::convertible_to<std::size_t>;
  { R::rows_per_slot } -> std::convertible_to<std::size_t>;
  { R::address(slot, position) } -> std::convertible_to<std::size_t>;
};

/// The ring of the paper: R_d rows per slot, addresses by phi(i, t).
template <std::size_t W, std::size_t KMax, std::size_t P>
struct draft_ring {
  static_assert(P > 0 && KMax > 0, "dhisparse: DraftRing needs p > 0 and K_max > 0");
  /// W: prior positions the drafter reads.
  static constexpr std::size_t window = W;
  /// K_max: widest block (anchor + proposals).
  static constexpr std::size_t max_block = KMax;
  /// p: page alignment of the ring, in rows.
  static constexpr std::size_t page_rows = P;
  /// R_d: ring rows per request slot.
  static constexpr std::size_t rows_per_slot = static_cast<std::size_t>(draft_ring_rows(W, KMax, P));
  /// phi(i, t): physical row of draft position t in request slot i.
  DHISPARSE_HD static constexpr std::size_t address(std::size_t slot, std::uint64_t position) {
    return slot * rows_per_slot + static_cast<std::size_t>(position % rows_per_slot);
  }
};
static_assert(DraftRingPolicy<draft_ring<2048, 8, 64>>);
static_assert(draft_ring<2048, 8, 64>::rows_per_slot == 2176);  // the paper's GLM-5.3/DFlash2 ring

}  // namespace dhisparse
