#pragma once
/// \file
/// Whole-request reclaim choice, shared by the host and CUDA residency managers (paper §3.2):
/// walk admitted requests in the policy's reclaim order, pass over those holding no optional
/// page, and take the first q whose pages together free enough to cover the deficit of every
/// source (a page shared through a prefix frees only with all its mappers). A request is
/// reclaimed whole (every page, every source), never trimmed.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <unordered_map>
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

/// The whole requests to reclaim (both managers' choice, sharing-aware): walks `by_seq` in the
/// policy's reclaim order, passes over requests that `skip` or that hold no optional page
/// (`b.mapped`), and takes the first q until the pool pages they free cover every `deficit[s]`.
/// A pool page frees only when every request that maps it and is not being reclaimed already is a
/// victim: `pool_pages(b, s, f)` calls `f(g)` for each pool page `g` request `b` maps on source
/// `s`, and `mappers(s, g)` counts the requests left to drop it. `freed` starts at what is freed
/// already and ends at what the victims add. Returns the victims (empty when nothing is short),
/// or nullopt when all of them together cannot cover the deficit.
template <reclaim_order Order, std::size_t Sources, class Books, class Skip, class PoolPages, class Mappers>
std::optional<std::vector<Books*>> pick_whole_requests(std::map<std::uint64_t, Books>& by_seq,
                                                       const std::array<std::size_t, Sources>& deficit,
                                                       std::array<std::size_t, Sources>& freed, Skip&& skip,
                                                       PoolPages&& pool_pages, Mappers&& mappers) {
  auto covers = [&] {
    for (std::size_t s = 0; s < Sources; ++s)
      if (freed[s] < deficit[s]) return false;
    return true;
  };
  std::vector<Books*> victims;
  std::array<std::unordered_map<std::int32_t, std::uint32_t>, Sources> dropped;  // victims mapping each page
  auto visit = [&](Books& b) {
    if (covers() || skip(b)) return;
    std::size_t total = 0;
    for (std::size_t s = 0; s < Sources; ++s) total += b.mapped[s];
    if (total == 0) return;  // holds nothing: not one of the q
    victims.push_back(&b);
    for (std::size_t s = 0; s < Sources; ++s)
      pool_pages(b, s, [&](std::int32_t g) {
        if (++dropped[s][g] == mappers(s, g)) ++freed[s];
      });
  };
  if (covers()) return victims;
  if constexpr (Order == reclaim_order::most_recent_first)
    for (auto it = by_seq.rbegin(); it != by_seq.rend(); ++it) visit(it->second);
  else
    for (auto& [seq, b] : by_seq) visit(b);
  if (!covers()) return std::nullopt;
  return victims;
}

}  // namespace dhisparse::detail
