// A consumer that names a source the layout does not have is rejected, naming consumer 1.
// expect: this consumer names a source the layout does not have
// expect: consumer_at_fault<1, missing_source>
#include <array>
#include <dhisparse/layout.hpp>
struct missing_source {
  static constexpr std::size_t top_k = 8, page_rows = 4;
  static constexpr std::array<dhisparse::source_desc, 1> sources{{{64, 1, 1, 0}}};
  static constexpr std::array<dhisparse::consumer_desc, 2> consumers{{
      {0, dhisparse::consumer_kind::reindex, 0},
      {1, dhisparse::consumer_kind::reindex, 0},
  }};
};
static_assert(dhisparse::check_layout<missing_source>());
