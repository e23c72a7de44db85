// A consumer that names a payload layer its source does not have is rejected, naming consumer 2.
// expect: this consumer names a payload layer its source does not have
// expect: consumer_at_fault<2, missing_layer>
#include <array>
#include <dhisparse/layout.hpp>
struct missing_layer {
  static constexpr std::size_t top_k = 8, page_rows = 4;
  static constexpr std::array<dhisparse::source_desc, 1> sources{{{64, 1, 2, 0}}};
  static constexpr std::array<dhisparse::consumer_desc, 3> consumers{{
      {0, dhisparse::consumer_kind::reindex, 0},
      {0, dhisparse::consumer_kind::follower, 1},
      {0, dhisparse::consumer_kind::follower, 2},
  }};
};
static_assert(dhisparse::check_layout<missing_layer>());
