// A source whose first consumer reuses a selection nobody produced is a broken layout; the
// diagnostic names consumer 1 (the first consumer of source 1).
// expect: first consumer of each source must be a reindex consumer
// expect: consumer_at_fault<1, broken>
#include <array>
#include <dhisparse/layout.hpp>
struct broken {
  static constexpr std::size_t top_k = 8, page_rows = 4;
  static constexpr std::array<dhisparse::source_desc, 2> sources{{{64, 1, 1, 0}, {64, 1, 1, 0}}};
  static constexpr std::array<dhisparse::consumer_desc, 3> consumers{{
      {0, dhisparse::consumer_kind::reindex, 0},
      {1, dhisparse::consumer_kind::reuse, 0},
      {1, dhisparse::consumer_kind::reindex, 0},
  }};
};
static_assert(dhisparse::check_layout<broken>());
