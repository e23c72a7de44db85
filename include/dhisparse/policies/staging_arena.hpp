#pragma once
/// \file
/// Staging policies: where a verification round puts the rows its union adds beyond the hot cache
/// (paper §3.4). Chosen at compile time as the hierarchies' fourth template argument.
///
/// * `dedicated_staging` — every payload layer of every source keeps K_max * k staging rows per
///   request slot at the end of its own pool. Nothing to acquire or release.
/// * `staging_arenas<chi>` — chi arenas, each N * K_max * k rows of the layout's widest row, shared
///   by all sources: the source being verified holds them (payload layer l writes arena l) until
///   the engine releases them after that source's attention consumers have finished; the next
///   source's verify then reuses them. M_stage = chi * N * K_max * k * d_KV instead of one
///   reservation per payload layer (GLM-5.3: 4 arenas instead of 78). Arena l ends one block that
///   also holds payload layer l's pool of every source (detail/staging_blocks.hpp), so a staged
///   row is an ordinary location of the layer's base, `space(source).staging_begin()` on.
#include <concepts>
#include <cstddef>

namespace dhisparse {

/// Requirements on a staging policy type.
template <class S>
concept StagingArenaPolicy = requires(std::size_t n) {
  { S::shared } -> std::convertible_to<bool>;
  { S::arenas } -> std::convertible_to<std::size_t>;
  { S::bytes(n, n, n, n) } -> std::convertible_to<std::size_t>;
};

/// Staging rows inside each payload layer's pool (no sharing; `bytes` counts no shared arena).
struct dedicated_staging {
  /// Staging rows live in each payload layer's own pool.
  static constexpr bool shared = false;
  static constexpr std::size_t arenas = 0;  ///< none shared: one region per payload layer, in its pool
  /// Rows one payload layer reserves for one request slot.
  static constexpr std::size_t rows_per_slot(std::size_t max_block, std::size_t top_k) {
    return max_block > 1 ? max_block * top_k : 0;
  }
  /// Bytes of shared arenas: none (the rows are part of every pool).
  static constexpr std::size_t bytes(std::size_t, std::size_t, std::size_t, std::size_t) { return 0; }
};
static_assert(StagingArenaPolicy<dedicated_staging>);

/// chi arenas shared by every source, each bounded by K_max * k rows per request slot.
template <std::size_t Chi>
struct staging_arenas {
  static_assert(Chi > 0, "dhisparse: StagingArena<chi> needs chi >= 1");
  /// Staging rows live in arenas shared by every source.
  static constexpr bool shared = true;
  /// chi: number of shared arenas (payload layer l of the verified source uses arena l).
  static constexpr std::size_t arenas = Chi;
  /// Rows one arena reserves for one request slot.
  static constexpr std::size_t rows_per_slot(std::size_t max_block, std::size_t top_k) {
    return max_block > 1 ? max_block * top_k : 0;
  }
  /// M_stage for `slots` request slots and the widest row `row_bytes`.
  static constexpr std::size_t bytes(std::size_t slots, std::size_t max_block, std::size_t top_k, std::size_t row_bytes) {
    return Chi * slots * rows_per_slot(max_block, top_k) * row_bytes;
  }
};
static_assert(StagingArenaPolicy<staging_arenas<4>>);

}  // namespace dhisparse
