#pragma once
/// \file
/// Direct / hot / host census of the drifting-query locality model (decode_model.hpp) on the HOST
/// hierarchy, at small scale: the reference for the census bench_decode reports from the GPU, and
/// what the drift knob's documentation in docs/benchmarks.md is checked against
/// (tests/host/decode_model.cpp).
///
/// Every session is admitted, given `context_rows` rows of history, then decodes `steps` steps: one
/// new row appended, the query walk advanced, the top-k of the visible rows resolved. Placement:
///  - fixed-budget: no optional pages; rows come from the tail, the hot cache or the host;
///  - adaptive: complete pages are mapped into the optional pool newest first, while it has room
///    (`optional_pages` per source; the GPU benchmark sizes it with the planner), as the residency
///    manager's resident-first admission places them. Pages completed while decoding stay
///    unmapped (a repopulation pass would map them later; the census is conservative).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include <dhisparse/host/hierarchy.hpp>

#include "decode_model.hpp"

namespace dhisparse_bench::decode {

/// Where selected entries were found, after the warm-up steps.
struct census {
  std::size_t selected = 0, direct = 0, hot = 0, host = 0;
  [[nodiscard]] double share(std::size_t n) const { return selected == 0 ? 0.0 : static_cast<double>(n) / static_cast<double>(selected); }
};

/// Inputs of a host census run.
struct census_inputs {
  policy placement = policy::fixed_budget;  ///< fixed_budget or adaptive (resident is all direct by definition)
  float rho = 0.05f;                        ///< query drift per step
  std::size_t sessions = 4;
  std::size_t context_rows = 1024;
  std::size_t steps = 24;
  std::size_t warmup = 4;          ///< steps not counted (the hot cache fills)
  std::size_t optional_pages = 0;  ///< adaptive: pool pages per source (0: every complete page of every session)
};

/// Runs the census on `host_hierarchy<Layout, lru_hot_cache<B>>` (source 0 only: its first payload layer).
template <class Layout, std::size_t B>
census run_host_census(const census_inputs& in) {
  using H = dhisparse::host_hierarchy<Layout, dhisparse::lru_hot_cache<B>>;
  constexpr std::size_t p = Layout::page_rows, k = Layout::top_k;
  constexpr auto src = Layout::sources[0];
  const std::size_t max_rows = in.context_rows + in.steps + 1;
  dhisparse::hierarchy_config cfg;
  cfg.max_requests = in.sessions;
  cfg.max_rows = max_rows;
  cfg.tail_rows = p;
  const std::size_t all_pages = in.sessions * (in.context_rows / p);
  cfg.optional_pages = in.placement == policy::adaptive ? (in.optional_pages == 0 ? all_pages : in.optional_pages) : 0;
  H h(cfg);

  const auto rows_of = [&](std::uint64_t tag, std::int64_t first, std::size_t count) {
    std::vector<std::byte> b(src.payload_layers * count * src.row_bytes);
    for (std::size_t l = 0; l < src.payload_layers; ++l)
      for (std::size_t i = 0; i < count; ++i)
        for (std::size_t w = 0; w < src.row_bytes / 8; ++w) {
          const std::uint64_t v = kv_word(tag, 0, static_cast<unsigned>(l), first + static_cast<std::int64_t>(i),
                                          static_cast<unsigned>(w));
          std::memcpy(b.data() + (l * count + i) * src.row_bytes + w * 8, &v, 8);
        }
    return b;
  };

  std::vector<query_walk> walks;
  for (std::size_t q = 0; q < in.sessions; ++q) {
    const std::uint64_t tag = session_tag(q + 1);
    (void)h.admit(q + 1);
    h.append(q + 1, 0, rows_of(tag, 0, in.context_rows), in.context_rows);
    walks.emplace_back(tag, 0u, in.rho);
  }
  if (in.placement == policy::adaptive)  // newest pages first, session by session, while the pool has room
    for (std::size_t pg = in.context_rows / p; pg-- > 0;)
      for (std::size_t q = 0; q < in.sessions; ++q) (void)h.map_optional_page(q + 1, 0, pg);

  census c;
  std::vector<dhisparse::location> locs(k);
  for (std::size_t t = 0; t < in.steps; ++t)
    for (std::size_t q = 0; q < in.sessions; ++q) {
      const auto visible = static_cast<std::int64_t>(in.context_rows + t + 1);
      h.append(q + 1, 0, rows_of(walks[q].tag, visible - 1, 1), 1);
      walks[q].advance();
      const auto sel = select_top_k(walks[q].quantised(), walks[q].tag, 0, visible, k);
      const auto st = h.resolve(q + 1, 0, sel, locs);
      if (t < in.warmup) continue;
      c.selected += st.selected;
      c.direct += st.direct;
      c.hot += st.hot;
      c.host += st.host;
    }
  return c;
}

}  // namespace dhisparse_bench::decode
