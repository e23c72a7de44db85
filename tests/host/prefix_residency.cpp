// Shared prefixes under load-adaptive residency (docs/prefixes.md, "Residency"): a prefix's optional
// pages are mapped once and serve every request sharing them (one pool page, counted once in
// M_opt); completing or reclaiming one sharer leaves the page mapped for the others; whole-request
// reclaim counts only the pool pages it really frees. Then a randomized run over two policies:
// plain admissions with history, admissions on prefixes with suffixes, decode appends, resolves
// checked byte for byte, retains, releases, repopulation and completions, with audit() and the
// test's own count of distinct mapped pool pages (M_opt) after every operation.
#include "../support/catch.hpp"

#include <dhisparse/host/hierarchy.hpp>
#include <dhisparse/host/residency_manager.hpp>
#include <dhisparse/layouts/tiny.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <iostream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "../support/reference_model.hpp"
#include "../support/row_content.hpp"

namespace {

using namespace dhisparse;
using dhisparse_testing::make_append_buffer;
using dhisparse_testing::request_tag;
using dhisparse_testing::row_matches;
using dhisparse_testing::test_rng;
using H = host_hierarchy<layouts::tiny, lru_hot_cache<16>>;
constexpr std::size_t kPageRows = 8;  // layouts::tiny
static_assert(H::page_rows == kPageRows);
constexpr std::array<std::size_t, 2> kLayers{2, 1};
constexpr std::array<std::size_t, 2> kRowBytes{64, 32};

/// Imports of rows [first, first + count) of every source, tag `tag`, buffers kept in `keep`.
std::vector<history_import> imports(std::uint64_t tag, std::int64_t first, std::size_t count,
                                    std::vector<std::vector<std::byte>>& keep) {
  std::vector<history_import> v;
  keep.clear();
  for (std::size_t s = 0; s < 2; ++s) keep.push_back(make_append_buffer(tag, s, kLayers[s], kRowBytes[s], first, count));
  for (std::size_t s = 0; s < 2; ++s) v.push_back({keep[s], count, first});
  return v;
}

/// Distinct optional pool pages mapped by the given requests on a source (the test's M_opt).
template <class M>
std::size_t distinct_mapped(const M& m, std::span<const request_id> ids, std::size_t s) {
  std::set<std::int32_t> pages;
  for (request_id id : ids)
    for (std::int32_t g : m.hierarchy().optional_map_of(id, s))
      if (g >= 0) pages.insert(g);
  return pages.size();
}

}  // namespace

TEST_CASE("a shared prefix's optional pages are mapped once and counted once") {
  using M = residency_manager<H, adaptive_policy<>>;
  M m({.max_requests = 4, .max_rows = 64, .optional_pages = 16}, {.required_pages = 1, .reserve_pages = 1});
  std::vector<std::vector<std::byte>> keep;
  const auto h1 = imports(request_tag(1), 0, 32, keep);  // 4 complete pages
  const auto a1 = m.admit(1, h1);
  REQUIRE(a1);
  CHECK(a1.mapped_pages == 8);  // 4 per source
  REQUIRE(m.retain_prefix(50, 1).empty());
  CHECK(m.ledger(0).optional == 4);

  const auto s2 = imports(request_tag(2), 32, 12, keep);  // one more complete page, 4 rows over
  const auto a2 = m.admit(2, prefix_id{50}, s2);
  REQUIRE(a2);
  CHECK(a2.mapped_pages == 10);  // per source: 4 shared (free) + 1 of its own
  CHECK(m.ledger(0).optional == 5);  // 4 shared pages counted once, plus request 2's page 4
  CHECK(m.optional_pages_of(2, 0) == 5);
  for (std::size_t s = 0; s < 2; ++s)
    for (std::size_t page = 0; page < 4; ++page)
      CHECK(m.hierarchy().optional_map_of(2, s)[page] == m.hierarchy().optional_map_of(1, s)[page]);
  CHECK(m.imported_rows(2, 0) == 44);
  CHECK(m.audit().empty());

  // Every row of request 2 resolves to the right bytes (shared pages, its own page, its tail).
  for (std::size_t s = 0; s < 2; ++s) {
    const std::vector<row_index> sel{0, 7, 8, 31, 32, 39, 40, 43, 20, 3};
    std::vector<location> loc(sel.size());
    const auto st = m.step().resolve(2, s, sel, loc);
    CHECK(st.host == 0);  // every page mapped or in the tail
    for (std::size_t i = 0; i < sel.size(); ++i)
      for (std::size_t l = 0; l < kLayers[s]; ++l)
        CHECK(row_matches(m.hierarchy().payload(s, l, loc[i]), sel[i] < 32 ? request_tag(1) : request_tag(2), s, l,
                          sel[i]));
  }

  // Completing request 1 leaves the shared pages mapped for request 2.
  m.complete(1);
  CHECK(m.ledger(0).optional == 5);
  CHECK(m.hierarchy().free_optional_pages(0) == 11);
  CHECK(m.audit().empty());
  m.release_prefix(50);
  m.complete(2);
  CHECK(m.ledger(0).optional == 0);
  CHECK(m.hierarchy().free_optional_pages(0) == 16);
  CHECK(m.hierarchy().free_host_pages(0) == m.hierarchy().config().host_pages);
  CHECK(m.audit().empty());
}

TEST_CASE("reclaim frees a shared page only with every request that maps it") {
  using M = residency_manager<H, adaptive_policy<reclaim_order::least_recent_first>>;
  // M = 10, required 2, reserve 0.
  M m({.max_requests = 4, .max_rows = 64, .optional_pages = 10}, {.required_pages = 2, .reserve_pages = 0});
  std::vector<std::vector<std::byte>> keep;
  REQUIRE(m.admit(1, imports(request_tag(1), 0, 32, keep)));  // M_req 2, maps 4: M_opt 4
  REQUIRE(m.retain_prefix(1, 1).empty());
  REQUIRE(m.admit(2, prefix_id{1}));  // M_req 4, shares the 4 pages: M_opt 4, spare 2
  CHECK(m.ledger(0).optional == 4);
  CHECK(m.ledger(0).required == 4);
  REQUIRE(m.admit(3));  // M_req 6, M_opt 4: full
  CHECK(m.ledger(0).spare() == 0);
  // Request 4 needs 2 pages. Request 1 (least recent) alone frees nothing (request 2 maps the same
  // pages); with request 2 too, 4 pages are freed: both are the q.
  const auto a = m.admit(4);
  REQUIRE(a);
  CHECK(a.reclaimed_requests == 2);
  CHECK(a.reclaimed_pages == 8);  // 4 per source
  CHECK(m.optional_pages_of(1, 0) == 0);
  CHECK(m.optional_pages_of(2, 0) == 0);
  CHECK(m.ledger(0).optional == 0);
  CHECK(m.audit().empty());
  // Repopulation maps them again; the second request shares at no cost.
  while (m.repopulate() > 0) {
  }
  CHECK(m.ledger(0).optional == 2);  // spare was 2
  CHECK(m.audit().empty());
}

namespace {

template <class Policy>
struct residency_prefix_run {
  using M = residency_manager<H, Policy>;
  explicit residency_prefix_run(std::uint64_t seed)
      : m({.max_requests = 6, .max_rows = 64, .host_pages = 44, .optional_pages = 20, .prefix_pages = 14},
          {.required_pages = 2, .reserve_pages = 1}),
        rng(seed) {}

  M m;
  test_rng rng;
  std::map<request_id, std::array<std::vector<std::uint64_t>, 2>> tags;  // content tag of each row
  std::map<prefix_id, std::array<std::vector<std::uint64_t>, 2>> prefix_tags;
  request_id next_id = 1;
  prefix_id next_prefix = 1;
  std::size_t ops = 0, checks = 0, shared_admits = 0, rows_checked = 0, shared_mappings = 0;
  std::vector<std::vector<std::byte>> keep;

  void fail(const std::string& what) {
    INFO("op " << ops << ": " << what);
    REQUIRE(false);
  }
  request_id pick() {
    auto it = tags.begin();
    std::advance(it, static_cast<std::ptrdiff_t>(rng.below(tags.size())));
    return it->first;
  }

  void op() {
    const std::size_t roll = rng.below(100);
    if (roll < 10) {  // plain admission with a prompt
      const std::size_t n = rng.below(40);
      const request_id id = next_id++;
      if (m.admit(id, imports(request_tag(id), 0, n, keep))) tags[id] = {std::vector<std::uint64_t>(n, request_tag(id)),
                                                                          std::vector<std::uint64_t>(n, request_tag(id))};
    } else if (roll < 25) {  // on a prefix, with a suffix
      const auto held = m.hierarchy().retained_prefixes();
      if (held.empty()) return;
      const prefix_id p = held[rng.below(held.size())];
      const auto& pt = prefix_tags.at(p);
      const request_id id = next_id++;
      const std::size_t n = rng.below(10);
      std::vector<history_import> suffix;
      std::vector<std::vector<std::byte>> bufs;
      for (std::size_t s = 0; s < 2; ++s) {
        const auto first = static_cast<std::int64_t>(pt[s].size());
        const std::size_t count = std::min<std::size_t>(n, 64 - pt[s].size());
        bufs.push_back(make_append_buffer(request_tag(id), s, kLayers[s], kRowBytes[s], first, count));
      }
      for (std::size_t s = 0; s < 2; ++s)
        suffix.push_back({bufs[s], std::min<std::size_t>(n, 64 - pt[s].size()), static_cast<std::int64_t>(pt[s].size())});
      if (m.admit(id, p, suffix)) {
        ++shared_admits;
        auto& t = tags[id];
        for (std::size_t s = 0; s < 2; ++s) {
          t[s] = pt[s];
          t[s].resize(pt[s].size() + suffix[s].count, request_tag(id));
        }
      }
    } else if (roll < 45) {  // a decode row
      if (tags.empty()) return;
      const request_id id = pick();
      for (std::size_t s = 0; s < 2; ++s) {
        auto& t = tags[id][s];
        if (t.size() >= 64) continue;
        const auto buf = make_append_buffer(request_tag(id), s, kLayers[s], kRowBytes[s],
                                            static_cast<std::int64_t>(t.size()), 1);
        try {
          m.append(id, s, buf, 1);
          t.push_back(request_tag(id));
        } catch (const host_pool_exhausted&) {
        }
      }
    } else if (roll < 70) {  // resolve, byte for byte
      if (tags.empty()) return;
      const request_id id = pick();
      const std::size_t s = rng.below(2);
      const auto& t = tags[id][s];
      std::vector<row_index> sel(rng.below(H::top_k + 1), no_row);
      for (auto& e : sel)
        if (!t.empty() && !rng.chance(1, 8)) e = static_cast<row_index>(rng.below(t.size()));
      std::vector<location> loc(sel.size());
      (void)m.step().resolve(id, s, sel, loc);
      for (std::size_t i = 0; i < sel.size(); ++i) {
        if (sel[i] == no_row) continue;
        for (std::size_t l = 0; l < kLayers[s]; ++l) {
          ++rows_checked;
          if (!row_matches(m.hierarchy().payload(s, l, loc[i]), t[static_cast<std::size_t>(sel[i])], s, l, sel[i]))
            fail("request " + std::to_string(id) + " row " + std::to_string(sel[i]) + " has the wrong bytes");
        }
      }
    } else if (roll < 80) {  // retain
      if (tags.empty()) return;
      const request_id id = pick();
      const prefix_id p = next_prefix++;
      try {
        for (prefix_id v : m.retain_prefix(p, id)) prefix_tags.erase(v);
        prefix_tags[p] = tags[id];
      } catch (const prefix_budget_exceeded&) {
      }
    } else if (roll < 84) {  // release
      const auto held = m.hierarchy().retained_prefixes();
      if (held.empty()) return;
      const prefix_id p = held[rng.below(held.size())];
      m.release_prefix(p);
      prefix_tags.erase(p);
    } else if (roll < 90) {
      (void)m.repopulate();
    } else {
      if (tags.empty()) return;
      const request_id id = pick();
      m.complete(id);
      tags.erase(id);
    }
  }

  void check() {
    ++checks;
    if (const std::string a = m.audit(); !a.empty()) fail("audit: " + a);
    if (!m.invariant_holds()) fail("Invariant 3");
    std::vector<request_id> ids;
    for (const auto& [id, t] : tags) ids.push_back(id);
    for (std::size_t s = 0; s < 2; ++s) {
      if (distinct_mapped(m, ids, s) != m.ledger(s).optional) fail("M_opt is not the number of distinct pool pages");
      std::size_t refs = 0;
      for (request_id id : ids) refs += m.optional_pages_of(id, s);
      shared_mappings += refs - m.ledger(s).optional;
      for (request_id id : ids)
        if (m.hierarchy().frontier(id, s) != static_cast<std::int64_t>(tags[id][s].size())) fail("frontier");
    }
    if (m.hierarchy().retained_prefixes().size() != prefix_tags.size()) fail("retained prefixes");
  }

  void run(std::size_t n) {
    for (std::size_t i = 0; i < n; ++i, ++ops) {
      op();
      check();
    }
    for (prefix_id p : m.hierarchy().retained_prefixes()) m.release_prefix(p);
    for (const auto& [id, t] : tags) m.complete(id);
    for (std::size_t s = 0; s < 2; ++s) {
      CHECK(m.hierarchy().free_host_pages(s) == m.hierarchy().config().host_pages);
      CHECK(m.hierarchy().free_optional_pages(s) == 20);
    }
    CHECK(m.audit().empty());
  }
};

}  // namespace

TEMPLATE_TEST_CASE("shared prefixes under residency: randomized, audited after every operation", "",
                   adaptive_policy<>, adaptive_policy<reclaim_order::least_recent_first>, fixed_budget_policy) {
  residency_prefix_run<TestType> run(0xC0FFEE);
  run.run(60'000);
  std::cout << "prefix residency: " << run.ops << " operations, " << run.shared_admits << " admissions on a prefix, "
            << run.rows_checked << " rows checked, " << run.shared_mappings << " shared page mappings seen\n";
  CHECK(run.shared_admits > 100);
}
