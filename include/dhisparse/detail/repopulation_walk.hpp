#pragma once
/// \file
/// Bounded round-robin repopulation, shared by the host and CUDA residency managers (paper §3.2),
/// fair across requests and across sources:
///  - requests take turns in admission order, starting after the request served last (by this
///    call or the previous one); a turn gives each request at most **one** page, so after any call
///    the pages a call handed out differ by at most one between the requests that could take them;
///  - within a request, the page goes to the source on which the request holds the fewest optional
///    pages, ties broken round-robin from the source after the one it was last served on. On a
///    balanced workload a request's pages therefore differ by at most one across its sources after
///    every call, however many sources there are and however small the per-call bound is.
/// The walk stops after `limit` pages or a turn that mapped none. What "take a page" means (map it
/// now, or queue a fill) is the caller's.
#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

namespace dhisparse::detail {

/// `by_seq`: request books keyed by admission number; each `Books` has a `std::size_t
/// refill_source` member (the walk's per-request source cursor: the source to prefer among ties).
/// `cursor`: admission number of the last request served (updated). `held(books, source)`: optional
/// pages the request holds on that source. `serve(books, source)` maps one page of that source for
/// that request and returns whether it did. Returns the pages mapped.
template <class Books, class Held, class Serve>
std::size_t repopulation_walk(std::map<std::uint64_t, Books>& by_seq, std::uint64_t& cursor, std::size_t limit,
                              std::size_t sources, Held&& held, Serve&& serve) {
  std::size_t mapped = 0;
  if (by_seq.empty() || sources == 0) return 0;
  // (request, source) pairs that could not take a page in this call: nothing eligible, or no spare
  // page. Neither comes back within one call, so they are not asked again.
  std::map<std::uint64_t, std::vector<char>> dead;
  auto serve_one = [&](std::uint64_t seq, Books& books) {
    auto& no = dead[seq];
    if (no.empty()) no.assign(sources, 0);
    for (;;) {
      std::size_t best = sources, best_held = 0;
      for (std::size_t i = 0; i < sources; ++i) {
        const std::size_t s = (books.refill_source + i) % sources;
        if (no[s]) continue;
        const std::size_t h = held(books, s);
        if (best == sources || h < best_held) {
          best = s;
          best_held = h;
        }
      }
      if (best == sources) return false;
      if (serve(books, best)) {
        books.refill_source = (best + 1) % sources;
        return true;
      }
      no[best] = 1;
    }
  };
  while (mapped < limit) {
    bool progress = false;
    auto at = by_seq.upper_bound(cursor);
    for (std::size_t n = 0, total = by_seq.size(); n < total && mapped < limit; ++n, ++at) {
      if (at == by_seq.end()) at = by_seq.begin();
      auto& [seq, books] = *at;
      if (serve_one(seq, books)) {
        ++mapped;
        cursor = seq;
        progress = true;
      }
    }
    if (!progress) break;
  }
  return mapped;
}

}  // namespace dhisparse::detail
