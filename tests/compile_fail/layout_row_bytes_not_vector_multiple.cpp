// Rows move as 16-byte vectors; a row size that is not a multiple of 16 is rejected.
// expect: multiple of 16
#include <array>
#include <dhisparse/layout.hpp>
struct odd_rows {
  static constexpr std::size_t top_k = 8, page_rows = 4;
  static constexpr std::array<dhisparse::source_desc, 1> sources{{{72, 1, 1, 0}}};
  static constexpr std::array<dhisparse::consumer_desc, 1> consumers{{{0, dhisparse::consumer_kind::reindex, 0}}};
};
static_assert(dhisparse::check_layout<odd_rows>());
