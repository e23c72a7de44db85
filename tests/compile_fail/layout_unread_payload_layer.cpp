// A payload layer that no consumer reads is an error (its bytes would be stored and copied for
// nobody): source 1 has three payload layers, and no consumer reads layer 2.
// expect: a payload layer of this source is read by no consumer
// expect: source_at_fault<1, unread_layer>
#include <array>
#include <dhisparse/layout.hpp>
struct unread_layer {
  static constexpr std::size_t top_k = 8, page_rows = 4;
  static constexpr std::array<dhisparse::source_desc, 2> sources{{{64, 1, 2, 0}, {64, 1, 3, 0}}};
  static constexpr std::array<dhisparse::consumer_desc, 4> consumers{{
      {0, dhisparse::consumer_kind::reindex, 0},
      {0, dhisparse::consumer_kind::follower, 1},
      {1, dhisparse::consumer_kind::reindex, 0},
      {1, dhisparse::consumer_kind::follower, 1},
  }};
};
static_assert(dhisparse::check_layout<unread_layer>());
