#pragma once
/// \file
/// Bounded round-robin repopulation, shared by the host and CUDA residency managers (paper §3.2):
/// turns over the admitted requests in admission order, starting after the last request served;
/// in a turn each request may take one page per source. The walk stops after `limit` pages or a
/// turn that mapped none. What "take a page" means (map it now, or queue a fill) is the caller's.
#include <cstddef>
#include <cstdint>
#include <map>

namespace dhisparse::detail {

/// `by_seq`: request books keyed by admission number; `cursor`: admission number of the last
/// request served (updated); `serve(books, source)` maps one page of that source for that request
/// and returns whether it did. Returns the pages mapped.
template <class Books, class Serve>
std::size_t repopulation_walk(std::map<std::uint64_t, Books>& by_seq, std::uint64_t& cursor, std::size_t limit,
                              std::size_t sources, Serve&& serve) {
  std::size_t mapped = 0;
  while (mapped < limit && !by_seq.empty()) {
    bool progress = false;
    auto at = by_seq.upper_bound(cursor);
    for (std::size_t n = 0, total = by_seq.size(); n < total && mapped < limit; ++n, ++at) {
      if (at == by_seq.end()) at = by_seq.begin();
      auto& [seq, books] = *at;
      bool served = false;
      for (std::size_t s = 0; s < sources && mapped < limit; ++s)
        if (serve(books, s)) {
          ++mapped;
          served = true;
        }
      if (served) {
        cursor = seq;
        progress = true;
      }
    }
    if (!progress) break;
  }
  return mapped;
}

}  // namespace dhisparse::detail
