#pragma once
/// \file
/// The deterministic LRU order update of HotCache<B> (see policies/hot_cache.hpp), written once
/// for the host backend; the CUDA backend implements the same partition with block-wide scans.
#include <cstddef>
#include <span>
#include <vector>

namespace dhisparse::detail {

/// Stable three-way partition of `order` (slots, least recently used first).
/// `is_hit[slot]` marks slots holding a selected row. The first `misses` non-hit entries become
/// victims and are returned in order; `order` becomes [kept..., hits..., victims...].
/// Requires misses <= number of non-hit slots.
template <class Index>
std::vector<Index> lru_take_victims(std::span<Index> order, std::span<const unsigned char> is_hit, std::size_t misses) {
  std::vector<Index> kept, hits, victims;
  kept.reserve(order.size());
  hits.reserve(order.size());
  victims.reserve(misses);
  for (Index slot : order) {
    if (is_hit[slot]) hits.push_back(slot);
    else if (victims.size() < misses) victims.push_back(slot);
    else kept.push_back(slot);
  }
  auto out = order.begin();
  for (Index s : kept) *out++ = s;
  for (Index s : hits) *out++ = s;
  for (Index s : victims) *out++ = s;
  return victims;
}

}  // namespace dhisparse::detail
