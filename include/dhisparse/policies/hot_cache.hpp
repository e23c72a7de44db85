#pragma once
/// \file
/// HotCache<B>: the bounded per-request, per-source cache of recently useful rows.
///
/// Replacement is exact LRU with a deterministic order, identical on both backends:
/// each (request, source) keeps its B slots in an order list, least recently used first.
/// Only selected rows that did not resolve directly (tail, ready optional page) take part: a
/// resolver call that finds H of them in the cache and must recover M distinct rows from host
/// takes as victims the first M slots of the order that hold none of them (empty slots sit at
/// the front, so they are used first, lowest slot first). A cached row served directly is
/// neither protected nor refreshed by that call. The missing rows,
/// in ascending row index, go to the victims in order-list order. The new order is
/// `[untouched slots, in old order] ++ [hit slots, in old order] ++ [victim slots, in old order]`:
/// LRU with ties among rows used by the same call broken by their previous recency.
#include <concepts>
#include <cstddef>
#include <cstdint>

namespace dhisparse {

/// Requirements on a hot-cache policy type.
template <class H>
concept HotCachePolicy = requires {
  { H::rows } -> std::convertible_to<std::size_t>;
  typename H::order_index;  // unsigned type wide enough to hold a slot index
} && (H::rows > 0) && std::unsigned_integral<typename H::order_index>;

/// Exact LRU hot cache of `B` rows per request and source.
template <std::size_t B>
struct lru_hot_cache {
  static_assert(B > 0, "dhisparse: HotCache<B> needs B > 0 rows");
  /// B: cache rows per request and source.
  static constexpr std::size_t rows = B;
  /// Unsigned type of an LRU order entry: 16-bit for B <= 65536, else 32-bit.
  using order_index = std::conditional_t<(B <= 65536), std::uint16_t, std::uint32_t>;
};
static_assert(HotCachePolicy<lru_hot_cache<4096>>);
static_assert(HotCachePolicy<lru_hot_cache<100000>>);

}  // namespace dhisparse
