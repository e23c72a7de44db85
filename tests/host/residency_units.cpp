// Load-adaptive residency on the host hierarchy (host/residency_manager.hpp, docs/residency.md):
// whole-request reclaim takes the first q requests in the policy's reclaim order, a wait leaves
// everything unchanged, fixed-budget never maps, resident keeps everything, repopulation is
// bounded per attempt and round-robin, and bad input throws typed errors with the state unchanged.
#include "../support/catch.hpp"

#include <dhisparse/host/hierarchy.hpp>
#include <dhisparse/host/residency_manager.hpp>
#include <dhisparse/layouts/tiny.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "../support/row_content.hpp"

namespace {

using namespace dhisparse;
using dhisparse_testing::make_append_buffer;
using dhisparse_testing::request_tag;
using H = host_hierarchy<layouts::tiny, lru_hot_cache<16>>;
constexpr std::size_t kSources = H::sources;

/// Prefilled history of `rows` rows on every source, with the request's own content.
struct history {
  std::array<std::vector<std::byte>, kSources> bytes;
  std::array<history_import, kSources> imports;
  history(request_id id, std::size_t rows) {
    for (std::size_t s = 0; s < kSources; ++s) {
      const auto& d = layouts::tiny::sources[s];
      bytes[s] = make_append_buffer(request_tag(id), s, d.payload_layers, d.row_bytes, 0, rows);
      imports[s] = {bytes[s], rows};
    }
  }
  std::span<const history_import> span() const { return imports; }
};

hierarchy_config hcfg(std::size_t optional_pages, std::size_t max_requests = 8, std::size_t max_rows = 64) {
  hierarchy_config c;
  c.max_requests = max_requests;
  c.max_rows = max_rows;
  c.optional_pages = optional_pages;
  return c;
}

template <class M>
std::vector<std::size_t> mapped_pages(const M& m, request_id id, std::size_t source) {
  std::vector<std::size_t> pages;
  const auto map = m.hierarchy().optional_map_of(id, source);
  for (std::size_t p = 0; p < map.size(); ++p)
    if (map[p] >= 0) pages.push_back(p);
  return pages;
}

/// Everything observable about a manager, for before/after comparisons.
template <class M>
std::map<std::string, std::vector<std::int64_t>> snapshot(const M& m, const std::vector<request_id>& ids) {
  std::map<std::string, std::vector<std::int64_t>> s;
  const auto& h = m.hierarchy();
  s["admitted"] = {static_cast<std::int64_t>(m.admitted_count()), static_cast<std::int64_t>(h.admitted_count())};
  for (std::size_t src = 0; src < kSources; ++src) {
    const auto l = m.ledger(src);
    s["ledger " + std::to_string(src)] = {static_cast<std::int64_t>(l.required), static_cast<std::int64_t>(l.optional)};
    s["free " + std::to_string(src)] = {static_cast<std::int64_t>(h.free_optional_pages(src)),
                                        static_cast<std::int64_t>(h.free_host_pages(src))};
  }
  for (request_id id : ids) {
    const std::string r = "request " + std::to_string(id);
    s[r] = {m.contains(id)};
    if (!m.contains(id)) continue;
    for (std::size_t src = 0; src < kSources; ++src) {
      const auto map = h.optional_map_of(id, src);
      s[r + " map " + std::to_string(src)].assign(map.begin(), map.end());
      s[r + " frontier " + std::to_string(src)] = {h.frontier(id, src)};
    }
  }
  const auto& c = m.counters();
  s["counters"] = {static_cast<std::int64_t>(c.admissions), static_cast<std::int64_t>(c.pages_mapped),
                   static_cast<std::int64_t>(c.pages_reclaimed), static_cast<std::int64_t>(c.requests_reclaimed),
                   static_cast<std::int64_t>(c.completions)};
  return s;
}

}  // namespace

TEST_CASE("resident-first admission maps the newest complete imported pages while pages are spare", "[residency]") {
  residency_manager<H, adaptive_policy<>> m(hcfg(20), {1, 1});
  const history a(1, 24), d(4, 60);  // 3 complete pages; 7 complete pages + a partial one
  REQUIRE(m.admit(1, a.span()).status == admit_status::admitted);
  for (std::size_t s = 0; s < kSources; ++s) CHECK(mapped_pages(m, 1, s) == std::vector<std::size_t>{0, 1, 2});
  CHECK(m.ledger(0) == residency_ledger{20, 1, 3, 1});
  // spare is 20 - 2 - 3 - 1 = 14: all 7 complete pages of d fit, the partial page 7 never maps
  const auto r = m.admit(4, d.span());
  REQUIRE(r);
  CHECK(r.mapped_pages == 2 * 7);
  CHECK(mapped_pages(m, 4, 0) == std::vector<std::size_t>{0, 1, 2, 3, 4, 5, 6});
  const history e(5, 64);  // 8 pages, only 20 - 3 - 10 - 1 = 6 spare: the newest 6
  REQUIRE(m.admit(5, e.span()));
  CHECK(mapped_pages(m, 5, 1) == std::vector<std::size_t>{2, 3, 4, 5, 6, 7});
  CHECK(m.ledger(1) == residency_ledger{20, 3, 16, 1});
  CHECK(m.audit().empty());
  // imported rows are exact through every path
  std::array<row_index, 4> sel{0, 23, 59, -1};
  std::array<location, 4> loc{};
  const auto st = m.step().resolve(4, 0, sel, loc);
  CHECK(st.direct == 3);  // pages 0 and 2 are optional, row 59 is in the tail
  for (std::size_t i = 0; i < 3; ++i)
    for (std::size_t l = 0; l < 2; ++l)
      CHECK(dhisparse_testing::row_matches(m.hierarchy().payload(0, l, loc[i]), request_tag(4), 0, l, sel[i]));
}

TEST_CASE("whole-request reclaim takes the first q requests in reclaim order", "[residency]") {
  // required 4, M = 29: A, B, C (3 pages each) and D (4 of its 7 pages) leave no spare page
  const history a(1, 24), b(2, 24), c(3, 24), d(4, 56);
  auto setup = [&](auto& m) {
    for (const auto* h : {&a, &b, &c}) REQUIRE(m.admit(static_cast<request_id>(h == &a ? 1 : h == &b ? 2 : 3), h->span()));
    REQUIRE(m.admit(4, d.span()));
    REQUIRE(mapped_pages(m, 4, 0) == std::vector<std::size_t>{3, 4, 5, 6});
    REQUIRE(m.ledger(0).spare() == 0);
    REQUIRE(m.audit().empty());
  };
  SECTION("most recently admitted first: D alone covers the deficit of 4") {
    residency_manager<H, adaptive_policy<reclaim_order::most_recent_first>> m(hcfg(29), {4, 0});
    setup(m);
    CHECK(m.reclaim_sequence() == std::vector<request_id>{4, 3, 2, 1});
    const auto r = m.admit(9);
    REQUIRE(r);
    CHECK(r.reclaimed_requests == 1);
    CHECK(r.reclaimed_pages == 2 * 4);
    for (std::size_t s = 0; s < kSources; ++s) {
      CHECK(m.optional_pages_of(4, s) == 0);
      for (request_id id : {1, 2, 3}) CHECK(m.optional_pages_of(id, s) == 3);
    }
    CHECK(m.counters().requests_reclaimed == 1);
    CHECK(m.audit().empty());
  }
  SECTION("least recently admitted first: A and B (q = 2) cover it, C and D keep every page") {
    residency_manager<H, adaptive_policy<reclaim_order::least_recent_first>> m(hcfg(29), {4, 0});
    setup(m);
    const auto r = m.admit(9);
    REQUIRE(r);
    CHECK(r.reclaimed_requests == 2);
    CHECK(r.reclaimed_pages == 2 * 6);  // whole requests: 6 pages a source for a deficit of 4
    for (std::size_t s = 0; s < kSources; ++s) {
      CHECK(m.optional_pages_of(1, s) == 0);
      CHECK(m.optional_pages_of(2, s) == 0);
      CHECK(m.optional_pages_of(3, s) == 3);
      CHECK(m.optional_pages_of(4, s) == 4);
    }
    CHECK(m.ledger(0) == residency_ledger{29, 20, 7, 0});
    CHECK(m.audit().empty());
    // reclaimed requests still resolve their history exactly (from host through the hot cache)
    std::array<row_index, 3> sel{0, 8, 9};  // rows 16.. are in the tail
    std::array<location, 3> loc{};
    const auto st = m.step().resolve(1, 1, sel, loc);
    CHECK(st.host == 3);
    for (std::size_t i = 0; i < 3; ++i)
      CHECK(dhisparse_testing::row_matches(m.hierarchy().payload(1, 0, loc[i]), request_tag(1), 1, 0, sel[i]));
  }
}

TEST_CASE("a wait leaves everything unchanged and a later retry admits", "[residency]") {
  const std::vector<request_id> ids{1, 2, 3, 4, 5};
  SECTION("wait for memory: the optional pages cannot cover the deficit") {
    residency_manager<H, adaptive_policy<>> m(hcfg(12), {3, 1});
    const history a(1, 16), b(2, 64), c(3, 8);
    REQUIRE(m.admit(1, a.span()));
    REQUIRE(m.admit(2, b.span()));
    REQUIRE(m.admit(3, c.span()));  // required 9 + reserve 1: 2 pages left for optional history
    REQUIRE(m.ledger(0).optional == 2);
    const auto before = snapshot(m, ids);
    const history e(4, 40);
    const auto r = m.admit(4, e.span());  // deficit 3 > 2 optional pages
    CHECK(r.status == admit_status::wait_for_memory);
    CHECK_FALSE(r);
    CHECK(snapshot(m, ids) == before);
    CHECK(m.counters().admissions_waited == 1);
    CHECK(m.counters().waits_for_memory == 1);
    CHECK(m.audit().empty());
    m.complete(2);
    REQUIRE(m.admit(4, e.span()));
    CHECK(m.audit().empty());
  }
  SECTION("wait for a slot") {
    residency_manager<H, adaptive_policy<>> m(hcfg(12, 2), {1, 1});
    const history a(1, 16), b(2, 16), c(3, 16);
    REQUIRE(m.admit(1, a.span()));
    REQUIRE(m.admit(2, b.span()));
    const auto before = snapshot(m, ids);
    CHECK(m.admit(3, c.span()).status == admit_status::wait_for_slot);
    CHECK(snapshot(m, ids) == before);
    CHECK(m.counters().waits_for_slot == 1);
    m.complete(1);
    CHECK(m.admit(3, c.span()));
    CHECK(m.audit().empty());
  }
  SECTION("bad input throws typed errors and changes nothing") {
    residency_manager<H, adaptive_policy<>> m(hcfg(12), {1, 1});
    const history a(1, 16);
    REQUIRE(m.admit(1, a.span()));
    const auto before = snapshot(m, ids);
    REQUIRE_THROWS_AS(m.admit(1, a.span()), duplicate_admission);
    std::array<history_import, 1> one{a.imports[0]};
    REQUIRE_THROWS_AS(m.admit(2, one), size_mismatch);
    auto bad = a.imports;
    bad[1].count = 15;
    REQUIRE_THROWS_AS(m.admit(2, bad), size_mismatch);
    const history too_long(2, 64);
    auto over = too_long.imports;
    over[0].count = 65;
    REQUIRE_THROWS_AS(m.admit(2, over), capacity_exceeded);
    REQUIRE_THROWS_AS(m.complete(7), unknown_request);
    REQUIRE_THROWS_AS(m.ledger(2), invalid_source);
    CHECK(snapshot(m, ids) == before);
    CHECK(m.counters().admissions_waited == 0);
    REQUIRE_THROWS_AS((residency_manager<H, adaptive_policy<>>(hcfg(4), {3, 2})), invalid_configuration);
  }
}

TEST_CASE("fixed-budget never maps optional history", "[residency]") {
  residency_manager<H, fixed_budget_policy> m(hcfg(10), {3, 1});
  const history a(1, 64), b(2, 40), c(3, 24), d(4, 8);
  REQUIRE(m.admit(1, a.span()));
  REQUIRE(m.admit(2, b.span()));
  REQUIRE(m.admit(3, c.span()));
  CHECK(m.repopulate() == 0);
  CHECK(m.admit(4, d.span()).status == admit_status::wait_for_memory);  // nothing to reclaim
  for (request_id id : {1, 2, 3})
    for (std::size_t s = 0; s < kSources; ++s) CHECK(mapped_pages(m, id, s).empty());
  CHECK(m.counters().pages_mapped == 0);
  CHECK(m.ledger(0) == residency_ledger{10, 9, 0, 1});
  CHECK(m.audit().empty());
}

TEST_CASE("resident keeps every complete page and waits when a request's history cannot fit", "[residency]") {
  // max_rows 32: 4 complete pages pinned per request; required 1 + 4 pinned = 5 pages a request
  residency_manager<H, resident_policy> m(hcfg(16, 8, 32), {1, 1});
  const history a(1, 20), b(2, 32), c(3, 0), d(4, 8);
  REQUIRE(m.admit(1, a.span()));
  CHECK(mapped_pages(m, 1, 0) == std::vector<std::size_t>{0, 1});
  CHECK(m.ledger(0) == residency_ledger{16, 3, 2, 1});  // 1 required + 2 reserved not yet mapped
  REQUIRE(m.admit(2, b.span()));
  REQUIRE(m.admit(3, c.span()));
  const auto before = snapshot(m, {1, 2, 3, 4});
  CHECK(m.admit(4, d.span()).status == admit_status::wait_for_memory);  // pinned pages are never reclaimed
  CHECK(snapshot(m, {1, 2, 3, 4}) == before);
  // decode rows: every page they complete is mapped at once
  const auto& d0 = layouts::tiny::sources[0];
  const auto rows = make_append_buffer(request_tag(1), 0, d0.payload_layers, d0.row_bytes, 20, 12);
  m.append(1, 0, rows, 12);
  CHECK(mapped_pages(m, 1, 0) == std::vector<std::size_t>{0, 1, 2, 3});
  CHECK(mapped_pages(m, 1, 1) == std::vector<std::size_t>{0, 1});
  for (request_id id : {2}) CHECK(mapped_pages(m, id, 0).size() == 4);
  CHECK(m.counters().pages_reclaimed == 0);
  CHECK(m.audit().empty());
  m.complete(3);
  CHECK(m.admit(4, d.span()));
  CHECK(m.audit().empty());
}

TEST_CASE("repopulation is bounded per attempt and round-robin over requests", "[residency]") {
  // A, B, C hold 4 pages each; X, Y, Z (required 4 each, no history) strip them whole, oldest first.
  residency_manager<H, adaptive_policy<reclaim_order::least_recent_first, 2>> m(hcfg(24), {4, 0});
  const history a(1, 32), b(2, 32), c(3, 32);
  REQUIRE(m.admit(1, a.span()));
  REQUIRE(m.admit(2, b.span()));
  REQUIRE(m.admit(3, c.span()));
  REQUIRE(m.ledger(0).spare() == 0);
  for (request_id x : {11, 12, 13}) {
    const auto r = m.admit(x);
    REQUIRE(r);
    CHECK(r.reclaimed_requests == 1);
  }
  for (request_id id : {1, 2, 3}) REQUIRE(m.optional_pages_of(id, 0) == 0);
  CHECK(m.repopulate() == 0);  // no spare page
  m.complete(11);
  m.complete(12);  // 8 spare pages per source
  // each call maps at most 2 pages; a turn gives each request (from after the last one served) one
  // page, its newest unmapped one, on the source where it holds the fewest (ties: after the source
  // it was served on last). Source 0 runs out of spare pages before the last call, so request 3
  // takes its page on source 1 there.
  struct grant {
    request_id id;
    std::size_t source, page;
  };
  const std::vector<std::array<grant, 2>> expected{
      {{{1, 0, 3}, {2, 0, 3}}}, {{{3, 0, 3}, {1, 1, 3}}}, {{{2, 1, 3}, {3, 1, 3}}}, {{{1, 0, 2}, {2, 0, 2}}},
      {{{3, 0, 2}, {1, 1, 2}}}, {{{2, 1, 2}, {3, 1, 2}}}, {{{1, 0, 1}, {2, 0, 1}}}, {{{3, 1, 1}, {1, 1, 1}}}};
  std::map<std::pair<request_id, std::size_t>, std::vector<std::size_t>> want;
  for (std::size_t call = 0; call < expected.size(); ++call) {
    CAPTURE(call);
    CHECK(m.repopulate() == 2);
    for (const auto& g : expected[call]) want[{g.id, g.source}].push_back(g.page);
    for (request_id id : {1, 2, 3})
      for (std::size_t s = 0; s < kSources; ++s) {
        auto pages = want[{id, s}];
        std::sort(pages.begin(), pages.end());
        CHECK(mapped_pages(m, id, s) == pages);
      }
    CHECK(m.audit().empty());
  }
  CHECK(m.repopulate() == 0);
  CHECK(m.ledger(0) == residency_ledger{24, 16, 8, 0});
  CHECK(m.counters().pages_repopulated == 16);
}
