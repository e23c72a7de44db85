#pragma once
/// \file
/// StagingArena<chi>: verification staging reused across layer groups. With chi payload sources
/// live at once, N request slots, K_max queries of top-k k and d_KV-byte rows, the reservation is
/// M_stage = chi * N * K_max * k * d_KV.
#include <concepts>
#include <cstddef>

namespace dhisparse {

/// Requirements on a staging policy type.
template <class S>
concept StagingArenaPolicy = requires(std::size_t n) {
  { S::arenas } -> std::convertible_to<std::size_t>;
  { S::bytes(n, n, n, n) } -> std::convertible_to<std::size_t>;
};

/// chi arenas, each bounded by K_max * k rows per live request slot.
template <std::size_t Chi>
struct staging_arenas {
  static_assert(Chi > 0, "dhisparse: StagingArena<chi> needs chi >= 1");
  static constexpr std::size_t arenas = Chi;
  /// Rows one arena reserves for one request slot.
  static constexpr std::size_t rows_per_slot(std::size_t max_block, std::size_t top_k) { return max_block * top_k; }
  /// M_stage for `slots` request slots.
  static constexpr std::size_t bytes(std::size_t slots, std::size_t max_block, std::size_t top_k, std::size_t row_bytes) {
    return Chi * slots * rows_per_slot(max_block, top_k) * row_bytes;
  }
};
static_assert(StagingArenaPolicy<staging_arenas<4>>);

}  // namespace dhisparse
