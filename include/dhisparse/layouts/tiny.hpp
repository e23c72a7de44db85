#pragma once
/// \file
/// A tiny layout for tests and the demo: small rows and pages so that every path (tail, hot cache,
/// host recovery, follower copies, reuse and a second reindex on a shared source) runs in microseconds.
#include <array>

#include "../layout.hpp"

namespace dhisparse::layouts {

/// Tiny test layout: a producer source with one follower layer, and a shared source read by two reindex
/// consumers and one reuse consumer; top-k 16, 8-row pages.
struct tiny {
  /// k: entries per selection.
  static constexpr std::size_t top_k = 16;
  /// p: rows per history page.
  static constexpr std::size_t page_rows = 8;
  /// Source 0: 64-byte rows in 2 payload layers; source 1: 32-byte rows in 1; 32-byte index keys.
  static constexpr std::array<source_desc, 2> sources{{
      {64, 1, 2, 32},  // producer with one follower layer (GLM-5.3 style)
      {32, 1, 1, 32},  // shared physical source (DeepSeek-V4.1-Flash style)
  }};
  /// Producer and follower on source 0; reindex, reuse and reindex on source 1.
  static constexpr std::array<consumer_desc, 5> consumers{{
      {0, consumer_kind::reindex, 0},
      {0, consumer_kind::follower, 1},
      {1, consumer_kind::reindex, 0},
      {1, consumer_kind::reuse, 0},
      {1, consumer_kind::reindex, 0},
  }};
};
static_assert(valid_layout<tiny> && check_layout<tiny>());

}  // namespace dhisparse::layouts
