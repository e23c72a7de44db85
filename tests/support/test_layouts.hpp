#pragma once
// Layouts shared by the host tests beyond the library's ready-made ones.
#include <array>
#include <cstddef>

#include <dhisparse/layout.hpp>

namespace dhisparse_testing {

/// Two sources, three payload layers each (one producer + two followers), 48-byte rows.
struct two_source_layout {
  static constexpr std::size_t top_k = 64;
  static constexpr std::size_t page_rows = 16;
  static constexpr std::array<dhisparse::source_desc, 2> sources{{{48, 1, 3, 0}, {48, 1, 3, 0}}};
  static constexpr std::array<dhisparse::consumer_desc, 6> consumers{{
      {0, dhisparse::consumer_kind::reindex, 0},
      {0, dhisparse::consumer_kind::follower, 1},
      {0, dhisparse::consumer_kind::follower, 2},
      {1, dhisparse::consumer_kind::reindex, 0},
      {1, dhisparse::consumer_kind::follower, 1},
      {1, dhisparse::consumer_kind::follower, 2},
  }};
};
static_assert(dhisparse::valid_layout<two_source_layout>);

}  // namespace dhisparse_testing
