#pragma once
/// \file
/// Geometry of a source's GPU payload pool, shared by both backends. Locations are row indices:
///
///   [ hot cache: N slots x B rows | tail: N slots x T rows | optional history: P pages x p rows
///     | verification staging: N slots x S rows ]
///
/// so one int32 location addresses the same row in every payload layer of the source, and an
/// attention kernel reads row `loc` of layer l at `layer_base(l) + loc * row_bytes`. With shared
/// staging arenas (`staging_arenas<chi>`) the staging rows are not in the pool: a location
/// `loc >= staging_begin()` is row `loc - staging_begin()` of the arena that layer l uses.
/// With speculative verification (max_block K_max > 1) the tail ring holds T + K_max rows (the
/// committed window plus one tentative block) and S = K_max * top_k; otherwise S = 0 and nothing moves.
#include <cstddef>
#include <cstdint>
#include <limits>

#include "detail/config.hpp"
#include "errors.hpp"
#include "types.hpp"

namespace dhisparse {

/// Location arithmetic for one source's pool. Trivially copyable; usable in device code.
struct location_space {
  std::size_t slots = 0;           ///< N: request slots
  std::size_t hot_rows = 0;        ///< B: hot-cache rows per slot
  std::size_t tail_rows = 0;       ///< T: tail rows per slot (a ring over the newest rows)
  std::size_t optional_pages = 0;  ///< P: pages of optional history shared by all slots
  std::size_t page_rows = 0;       ///< p: rows per page
  std::size_t staging_rows = 0;    ///< S: verification staging rows per slot (K_max * top_k; 0 without speculation)

  /// Location of hot-cache way `way` (0 <= way < B) of a slot.
  DHISPARSE_HD constexpr location hot(std::size_t slot, std::size_t way) const {
    return static_cast<location>(slot * hot_rows + way);
  }
  /// Location of history row `row` in a slot's tail ring (ring row `row % tail_rows`).
  DHISPARSE_HD constexpr location tail(std::size_t slot, std::int64_t row) const {
    return static_cast<location>(slots * hot_rows + slot * tail_rows + static_cast<std::size_t>(row) % tail_rows);
  }
  /// Location of history row `row` in optional pool page `page` (offset `row % page_rows` in the page).
  DHISPARSE_HD constexpr location optional(std::size_t page, std::int64_t row) const {
    return static_cast<location>(slots * (hot_rows + tail_rows) + page * page_rows +
                                 static_cast<std::size_t>(row) % page_rows);
  }
  /// First staging location: locations at or past it are staging rows.
  DHISPARSE_HD constexpr std::size_t staging_begin() const {
    return slots * (hot_rows + tail_rows) + optional_pages * page_rows;
  }
  /// Staging row `i` (0 <= i < staging_rows) of a slot: overflow rows of a verification union.
  DHISPARSE_HD constexpr location staging(std::size_t slot, std::size_t i) const {
    return static_cast<location>(staging_begin() + slot * staging_rows + i);
  }
  /// Rows of the location range (pool rows plus staging rows, wherever the staging lives).
  DHISPARSE_HD constexpr std::size_t rows() const { return staging_begin() + slots * staging_rows; }
  /// True when every location fits a non-negative int32.
  constexpr bool addressable() const {
    return rows() <= static_cast<std::size_t>(std::numeric_limits<location>::max());
  }
};

}  // namespace dhisparse
