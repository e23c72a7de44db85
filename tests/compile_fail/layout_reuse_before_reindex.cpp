// A source whose first consumer reuses a selection nobody produced is a broken layout.
// expect: first consumer of each source must be a reindex consumer
#include <array>
#include <dhisparse/layout.hpp>
struct broken {
  static constexpr std::size_t top_k = 8, page_rows = 4;
  static constexpr std::array<dhisparse::source_desc, 1> sources{{{64, 1, 1, 0}}};
  static constexpr std::array<dhisparse::consumer_desc, 1> consumers{{{0, dhisparse::consumer_kind::reuse, 0}}};
};
static_assert(dhisparse::check_layout<broken>());
