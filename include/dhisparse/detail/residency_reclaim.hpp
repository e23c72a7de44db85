#pragma once
/// \file
/// Whole-request reclaim choice, shared by the host and CUDA residency managers (paper §3.2):
/// walk admitted requests in the policy's reclaim order, pass over those holding no optional
/// page, and take the first q whose pages together cover the deficit of every source. A request is
/// reclaimed whole (every page, every source), never trimmed.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <vector>

#include "../policies/residency.hpp"
#include "../types.hpp"

namespace dhisparse::detail {

/// Admitted requests in the policy's reclaim order; `by_seq` holds their books (with an `id`)
/// keyed by admission number.
template <reclaim_order Order, class Books>
std::vector<request_id> reclaim_sequence(const std::map<std::uint64_t, Books>& by_seq) {
  std::vector<request_id> ids;
  ids.reserve(by_seq.size());
  for (const auto& [seq, b] : by_seq) ids.push_back(b.id);
  if constexpr (Order == reclaim_order::most_recent_first) std::reverse(ids.begin(), ids.end());
  return ids;
}

/// Deficit of each source: pages by which `used + take` exceeds `capacity` (0 when it fits).
template <std::size_t Sources>
std::array<std::size_t, Sources> residency_deficit(const std::array<std::size_t, Sources>& used, std::size_t take,
                                                   std::size_t capacity) {
  std::array<std::size_t, Sources> d{};
  for (std::size_t s = 0; s < Sources; ++s) d[s] = used[s] + take > capacity ? used[s] + take - capacity : 0;
  return d;
}

/// `held[i]`: optional pages held on each source by the i-th candidate, candidates in reclaim
/// order. Returns the indices of the first q candidates holding pages that cover every
/// `deficit[s]` (empty when nothing is short), or nullopt when all of them together cannot.
template <std::size_t Sources>
std::optional<std::vector<std::size_t>> pick_whole_requests(std::span<const std::array<std::size_t, Sources>> held,
                                                            const std::array<std::size_t, Sources>& deficit) {
  std::array<std::size_t, Sources> covered{};
  auto covers = [&] {
    for (std::size_t s = 0; s < Sources; ++s)
      if (covered[s] < deficit[s]) return false;
    return true;
  };
  std::vector<std::size_t> victims;
  for (std::size_t i = 0; i < held.size() && !covers(); ++i) {
    std::size_t total = 0;
    for (std::size_t s = 0; s < Sources; ++s) total += held[i][s];
    if (total == 0) continue;  // holds nothing: not one of the q
    victims.push_back(i);
    for (std::size_t s = 0; s < Sources; ++s) covered[s] += held[i][s];
  }
  if (!covers()) return std::nullopt;
  return victims;
}

}  // namespace dhisparse::detail
