// Payload layer 0 is the producer's: a follower consumer on it is an error, naming consumer 3.
// expect: a follower consumer cannot read payload layer 0
// expect: consumer_at_fault<3, follower_on_producer_layer>
#include <array>
#include <dhisparse/layout.hpp>
struct follower_on_producer_layer {
  static constexpr std::size_t top_k = 8, page_rows = 4;
  static constexpr std::array<dhisparse::source_desc, 2> sources{{{64, 1, 1, 0}, {64, 1, 2, 0}}};
  static constexpr std::array<dhisparse::consumer_desc, 4> consumers{{
      {0, dhisparse::consumer_kind::reindex, 0},
      {1, dhisparse::consumer_kind::reindex, 0},
      {1, dhisparse::consumer_kind::follower, 1},
      {1, dhisparse::consumer_kind::follower, 0},
  }};
};
static_assert(dhisparse::check_layout<follower_on_producer_layer>());
