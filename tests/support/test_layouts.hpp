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

/// Sixty-one sources, one reindexing consumer each (a DeepSeek-V3.2-like model: every layer has its
/// own indexer), with small rows and pages so that per-source fairness and streamed admission run
/// at that source count in milliseconds.
struct sixty_one_source_layout {
  static constexpr std::size_t n_sources = 61;
  static constexpr std::size_t top_k = 16;
  static constexpr std::size_t page_rows = 4;
  static constexpr std::array<dhisparse::source_desc, n_sources> sources = [] {
    std::array<dhisparse::source_desc, n_sources> s{};
    for (auto& d : s) d = {16, 1, 1, 0};
    return s;
  }();
  static constexpr std::array<dhisparse::consumer_desc, n_sources> consumers = [] {
    std::array<dhisparse::consumer_desc, n_sources> c{};
    for (std::size_t i = 0; i < n_sources; ++i) c[i] = {i, dhisparse::consumer_kind::reindex, 0};
    return c;
  }();
};
static_assert(dhisparse::valid_layout<sixty_one_source_layout>);

}  // namespace dhisparse_testing
