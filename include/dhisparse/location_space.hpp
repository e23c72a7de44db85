#pragma once
/// \file
/// Geometry of a source's GPU payload pool, shared by both backends. Locations are row indices:
///
///   [ hot cache: N slots x B rows | tail: N slots x T rows | optional history: P pages x p rows
///     | verification staging: N slots x S rows ]
///
/// so one int32 location addresses the same row in every payload layer of the source, and an
/// attention kernel reads row `loc` of layer l at `layer_base(l) + loc * row_bytes`, staging rows
/// included. With shared staging arenas (`staging_arenas<chi>`) the staging rows are arena l's,
/// which lies `staging_gap` rows past the end of every layer-l pool of the source
/// (detail/staging_blocks.hpp), so the same formula reaches them:
///
///   [ hot | tail | optional | gap: other sources' pools of layer l | arena l: N slots x S rows ]
///
/// Locations in the gap are never returned.
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
  /// Rows between the end of the pool and the first staging location: 0 with dedicated staging,
  /// the distance to the source's arena with `staging_arenas<chi>` (the same for every layer).
  std::size_t staging_gap = 0;

  /// Location of hot-cache way `way` (0 <= way < B) of a slot.
  DHISPARSE_HD constexpr location hot(std::size_t slot, std::size_t way) const {
    return static_cast<location>(slot * hot_rows + way);
  }
  /// Location of history row `row` in a slot's tail ring (ring row `row % tail_rows`).
  DHISPARSE_HD constexpr location tail(std::size_t slot, std::int64_t row) const {
    return tail_ring(slot, static_cast<std::size_t>(row) % tail_rows);
  }
  /// Location of ring row `ring_row` (< tail_rows) of a slot's tail ring, for callers that reduce
  /// the history row themselves (the CUDA write kernels divide in 32 bits while it fits).
  DHISPARSE_HD constexpr location tail_ring(std::size_t slot, std::size_t ring_row) const {
    return static_cast<location>(slots * hot_rows + slot * tail_rows + ring_row);
  }
  /// Location of history row `row` in optional pool page `page` (offset `row % page_rows` in the page).
  DHISPARSE_HD constexpr location optional(std::size_t page, std::int64_t row) const {
    return static_cast<location>(slots * (hot_rows + tail_rows) + page * page_rows +
                                 static_cast<std::size_t>(row) % page_rows);
  }
  /// Rows of each payload layer's own range: hot caches, tails and optional pages (locations below it).
  DHISPARSE_HD constexpr std::size_t pool_rows() const {
    return slots * (hot_rows + tail_rows) + optional_pages * page_rows;
  }
  /// First staging location: locations at or past it are staging rows.
  DHISPARSE_HD constexpr std::size_t staging_begin() const { return pool_rows() + staging_gap; }
  /// Staging row `i` (0 <= i < staging_rows) of a slot: overflow rows of a verification union.
  DHISPARSE_HD constexpr location staging(std::size_t slot, std::size_t i) const {
    return static_cast<location>(staging_begin() + slot * staging_rows + i);
  }
  /// One past the last location (the last staging row; the gap, if any, included).
  DHISPARSE_HD constexpr std::size_t rows() const { return staging_begin() + slots * staging_rows; }
  /// True when `loc` is a location this geometry can return: a pool row or a staging row, not the gap.
  DHISPARSE_HD constexpr bool valid(location loc) const {
    if (loc < 0) return false;
    const auto at = static_cast<std::size_t>(loc);
    return at < pool_rows() || (at >= staging_begin() && at < rows());
  }
  /// True when every location fits a non-negative int32.
  constexpr bool addressable() const {
    return rows() <= static_cast<std::size_t>(std::numeric_limits<location>::max());
  }
};

}  // namespace dhisparse
