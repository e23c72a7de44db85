// Rows move as 16-byte vectors; a row size that is not a multiple of 16 is rejected, naming source 2.
// expect: multiple of 16
// expect: source_at_fault<2, odd_rows>
#include <array>
#include <dhisparse/layout.hpp>
struct odd_rows {
  static constexpr std::size_t top_k = 8, page_rows = 4;
  static constexpr std::array<dhisparse::source_desc, 3> sources{{{64, 1, 1, 0}, {32, 1, 1, 0}, {72, 1, 1, 0}}};
  static constexpr std::array<dhisparse::consumer_desc, 3> consumers{{
      {0, dhisparse::consumer_kind::reindex, 0},
      {1, dhisparse::consumer_kind::reindex, 0},
      {2, dhisparse::consumer_kind::reindex, 0},
  }};
};
static_assert(dhisparse::check_layout<odd_rows>());
