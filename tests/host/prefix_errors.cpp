// Shared prefixes, case by case (docs/prefixes.md): every bad call throws its typed error and leaves
// the whole observable state unchanged (a snapshot of every request's books, hot cache and
// optional map, every host page's holders, the free pools and the retained prefixes, compared
// before and after); waits change nothing either; the partial last page is copied at admission and
// the copies diverge afterwards; a prefix outlives the request it came from; LRU eviction order.
// Expected values are written out here from the documented rules, never read from the library.
#include "../support/catch.hpp"

#include <dhisparse/host/hierarchy.hpp>
#include <dhisparse/host/residency_manager.hpp>
#include <dhisparse/layouts/tiny.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "../support/row_content.hpp"

namespace {

using namespace dhisparse;
using dhisparse_testing::make_append_buffer;
using dhisparse_testing::request_tag;
using dhisparse_testing::row_matches;
using H = host_hierarchy<layouts::tiny, lru_hot_cache<16>>;
constexpr std::size_t kPageRows = 8;  // layouts::tiny
static_assert(H::page_rows == kPageRows);
constexpr std::array<std::size_t, 2> kLayers{2, 1};
constexpr std::array<std::size_t, 2> kRowBytes{64, 32};

/// Everything a caller can observe of the hierarchy's books.
struct snapshot {
  std::vector<std::int64_t> numbers;
  bool operator==(const snapshot&) const = default;
};
snapshot take(const H& h, std::span<const request_id> ids, std::span<const prefix_id> prefixes) {
  snapshot s;
  auto& v = s.numbers;
  v.push_back(static_cast<std::int64_t>(h.admitted_count()));
  for (std::size_t src = 0; src < H::sources; ++src) {
    v.push_back(static_cast<std::int64_t>(h.free_host_pages(src)));
    v.push_back(static_cast<std::int64_t>(h.free_optional_pages(src)));
    v.push_back(static_cast<std::int64_t>(h.prefix_pages_held(src)));
    for (page_id g = 0; g < static_cast<page_id>(h.config().host_pages); ++g) {
      v.push_back(h.host_page_refs(src, g));
      v.push_back(h.host_page_prefix_refs(src, g));
    }
    for (request_id id : ids) {
      v.push_back(h.contains(id));
      if (!h.contains(id)) continue;
      v.push_back(h.frontier(id, src));
      v.push_back(h.reserved_rows(id, src));
      for (auto g : h.host_pages_of(id, src)) v.push_back(g);
      for (auto g : h.optional_map_of(id, src)) v.push_back(g);
      for (auto r : h.hot_rows_of(id, src)) v.push_back(r);
      for (auto o : h.lru_order_of(id, src)) v.push_back(o);
    }
    for (prefix_id p : prefixes) {
      v.push_back(h.contains_prefix(p));
      if (!h.contains_prefix(p)) continue;
      v.push_back(h.prefix_rows(p, src));
      for (auto g : h.prefix_host_pages(p, src)) v.push_back(g);
    }
  }
  for (prefix_id p : h.retained_prefixes()) v.push_back(static_cast<std::int64_t>(p));
  return s;
}

void append_rows(H& h, request_id id, std::uint64_t tag, std::int64_t first, std::size_t count) {
  for (std::size_t s = 0; s < H::sources; ++s)
    h.append(id, s, make_append_buffer(tag, s, kLayers[s], kRowBytes[s], first, count), count);
}

hierarchy_config small_config() {
  return {.max_requests = 4, .max_rows = 64, .host_pages = 24, .optional_pages = 6, .prefix_pages = 6};
}

}  // namespace

TEST_CASE("prefix errors are typed and leave the state unchanged") {
  H h(small_config());
  REQUIRE(h.admit(1));
  append_rows(h, 1, request_tag(1), 0, 20);  // 2 full pages + 4 rows
  REQUIRE(h.retain_prefix(100, 1).empty());
  const std::array<request_id, 3> ids{1, 2, 3};
  const std::array<prefix_id, 3> prefixes{100, 101, 102};
  const snapshot before = take(h, ids, prefixes);
  auto unchanged = [&] { CHECK(take(h, ids, prefixes) == before); };

  SECTION("admission on a prefix never retained") {
    REQUIRE_THROWS_AS(h.admit(2, prefix_id{101}), unknown_prefix);
    unchanged();
  }
  SECTION("admission of an admitted id on a prefix") {
    REQUIRE_THROWS_AS(h.admit(1, prefix_id{100}), duplicate_admission);
    unchanged();
  }
  SECTION("retaining an id already retained") {
    REQUIRE_THROWS_AS(h.retain_prefix(100, 1), duplicate_prefix);
    unchanged();
  }
  SECTION("retaining from a request not admitted") {
    REQUIRE_THROWS_AS(h.retain_prefix(101, 9), unknown_request);
    unchanged();
  }
  SECTION("retain rows: wrong source count, negative, past the frontier") {
    const std::array<std::int64_t, 1> one{8};
    REQUIRE_THROWS_AS(h.retain_prefix(101, 1, one), size_mismatch);
    const std::array<std::int64_t, 2> negative{8, -1};
    REQUIRE_THROWS_AS(h.retain_prefix(101, 1, negative), position_out_of_range);
    const std::array<std::int64_t, 2> beyond{8, 21};
    REQUIRE_THROWS_AS(h.retain_prefix(101, 1, beyond), position_beyond_frontier);
    unchanged();
  }
  SECTION("a prefix past the budget even with every other prefix evicted") {
    append_rows(h, 1, request_tag(1), 20, 36);  // 56 rows: 7 pages on each source, the budget is 6
    const snapshot grown = take(h, ids, prefixes);
    REQUIRE_THROWS_AS(h.retain_prefix(101, 1), prefix_budget_exceeded);
    CHECK(take(h, ids, prefixes) == grown);  // prefix 100 was not evicted either
    CHECK(h.contains_prefix(100));
  }
  SECTION("releasing a prefix twice; admitting on a released prefix") {
    h.release_prefix(100);
    const snapshot released = take(h, ids, prefixes);
    REQUIRE_THROWS_AS(h.release_prefix(100), unknown_prefix);
    REQUIRE_THROWS_AS(h.admit(2, prefix_id{100}), unknown_prefix);
    CHECK(take(h, ids, prefixes) == released);
  }
  SECTION("admission on a prefix waits when no slot is free") {
    REQUIRE(h.admit(2));
    REQUIRE(h.admit(3));
    REQUIRE(h.admit(4));
    const std::array<request_id, 4> all{1, 2, 3, 4};
    const snapshot full = take(h, all, prefixes);
    CHECK_FALSE(h.admit(5, prefix_id{100}).admitted);
    CHECK(take(h, all, prefixes) == full);
  }
}

TEST_CASE("admission on a prefix: a partial last page needs one free host page, a page-aligned prefix none") {
  H h({.max_requests = 3, .max_rows = 64, .host_pages = 11});
  REQUIRE(h.admit(1));
  append_rows(h, 1, request_tag(1), 0, 20);  // 3 pages per source
  const std::array<std::int64_t, 2> aligned{16, 16};
  REQUIRE(h.retain_prefix(100, 1).empty());          // 20 rows: pages 0, 1 and the partial page 2
  REQUIRE(h.retain_prefix(101, 1, aligned).empty());  // 16 rows: pages 0 and 1
  REQUIRE(h.admit(2));
  append_rows(h, 2, request_tag(2), 0, 64);  // the other 8 pages
  REQUIRE(h.free_host_pages(0) == 0);
  REQUIRE(h.free_host_pages(1) == 0);
  const std::array<request_id, 3> ids{1, 2, 3};
  const std::array<prefix_id, 2> prefixes{100, 101};
  const snapshot before = take(h, ids, prefixes);
  CHECK_FALSE(h.admit(3, prefix_id{100}).admitted);  // a wait: the boundary copy has no page
  CHECK(take(h, ids, prefixes) == before);
  CHECK(h.retained_prefixes() == std::vector<prefix_id>{100, 101});  // a wait does not count as a use
  const admission a = h.admit(3, prefix_id{101});    // shares pages 0 and 1, copies nothing
  REQUIRE(a.admitted);
  CHECK(h.frontier(3, 0) == 16);
  CHECK(h.free_host_pages(0) == 0);
  CHECK(h.host_pages_of(3, 0)[0] == h.host_pages_of(1, 0)[0]);
  CHECK(h.host_page_refs(0, h.host_pages_of(1, 0)[0]) == 4);  // requests 1 and 3, prefixes 100 and 101
  CHECK(h.host_page_refs(0, h.host_pages_of(1, 0)[2]) == 2);  // request 1 and prefix 100
  CHECK(h.retained_prefixes() == std::vector<prefix_id>{100, 101});
  // Its own first row needs a page: none is free.
  REQUIRE_THROWS_AS(h.append(3, 0, make_append_buffer(request_tag(3), 0, 2, 64, 16, 1), 1), host_pool_exhausted);
}

TEST_CASE("the partial last page is copied at admission; the copies then diverge") {
  H h({.max_requests = 3, .max_rows = 64});
  REQUIRE(h.admit(1));
  append_rows(h, 1, request_tag(1), 0, 13);  // page 0 full, page 1 holds rows 8..12
  REQUIRE(h.retain_prefix(7, 1).empty());
  REQUIRE(h.admit(2, prefix_id{7}));
  for (std::size_t s = 0; s < H::sources; ++s) {
    CHECK(h.frontier(2, s) == 13);
    CHECK(h.host_pages_of(2, s)[0] == h.host_pages_of(1, s)[0]);  // shared
    CHECK(h.host_pages_of(2, s)[1] != h.host_pages_of(1, s)[1]);  // the boundary copy
    CHECK(h.host_page_refs(s, h.host_pages_of(1, s)[0]) == 3);
    CHECK(h.host_page_refs(s, h.host_pages_of(1, s)[1]) == 2);    // request 1 and the prefix
    CHECK(h.host_page_refs(s, h.host_pages_of(2, s)[1]) == 1);
  }
  append_rows(h, 1, request_tag(1), 13, 5);   // request 1 continues its own history
  append_rows(h, 2, request_tag(2), 13, 5);   // request 2 writes the same rows of its copy
  for (std::size_t s = 0; s < H::sources; ++s)
    for (std::size_t l = 0; l < kLayers[s]; ++l)
      for (std::int64_t r = 0; r < 18; ++r) {
        const std::uint64_t tag2 = r < 13 ? request_tag(1) : request_tag(2);
        CHECK(row_matches(h.host_row(1, s, l, r), request_tag(1), s, l, r));
        CHECK(row_matches(h.host_row(2, s, l, r), tag2, s, l, r));
      }
  // Every row of request 2 resolves to its own bytes: tail, hot cache and host recovery.
  for (std::size_t s = 0; s < H::sources; ++s) {
    std::vector<row_index> sel;
    for (row_index r = 0; r < 18; ++r) sel.push_back(r);
    sel.resize(std::min<std::size_t>(sel.size(), H::top_k));
    std::vector<location> loc(sel.size());
    (void)h.resolve(2, s, sel, loc);
    for (std::size_t i = 0; i < sel.size(); ++i)
      for (std::size_t l = 0; l < kLayers[s]; ++l)
        CHECK(row_matches(h.payload(s, l, loc[i]), sel[i] < 13 ? request_tag(1) : request_tag(2), s, l, sel[i]));
  }
}

TEST_CASE("a prefix outlives its request; its pages are freed with their last holder") {
  H h({.max_requests = 2, .max_rows = 64, .optional_pages = 4});
  const std::size_t all = h.free_host_pages(0);
  REQUIRE(h.admit(1));
  append_rows(h, 1, request_tag(1), 0, 24);
  REQUIRE(h.retain_prefix(5, 1).empty());
  h.complete(1);
  CHECK(h.free_host_pages(0) == all - 3);  // held by the prefix alone
  CHECK(h.prefix_pages_held(0) == 3);
  REQUIRE(h.admit(2, prefix_id{5}));
  REQUIRE(h.map_optional_page(2, 0, 1));
  std::vector<row_index> sel{0, 9, 23, 17, -1, 3};
  std::vector<location> loc(sel.size());
  (void)h.resolve(2, 0, sel, loc);
  for (std::size_t i = 0; i < sel.size(); ++i) {
    if (sel[i] < 0) continue;
    for (std::size_t l = 0; l < 2; ++l) CHECK(row_matches(h.payload(0, l, loc[i]), request_tag(1), 0, l, sel[i]));
  }
  h.release_prefix(5);
  CHECK(h.free_host_pages(0) == all - 3);  // request 2 holds them now
  CHECK(h.prefix_pages_held(0) == 0);
  h.complete(2);
  CHECK(h.free_host_pages(0) == all);
  CHECK(h.free_optional_pages(0) == 4);
}

TEST_CASE("prefixes are evicted least recently used first; an admission is a use") {
  H h({.max_requests = 4, .max_rows = 64, .prefix_pages = 4});
  REQUIRE(h.admit(1));
  append_rows(h, 1, request_tag(1), 0, 8);  // 1 page
  REQUIRE(h.retain_prefix(1, 1).empty());
  REQUIRE(h.admit(2));
  append_rows(h, 2, request_tag(2), 0, 16);  // 2 pages
  REQUIRE(h.retain_prefix(2, 2).empty());
  REQUIRE(h.admit(3));
  append_rows(h, 3, request_tag(3), 0, 8);
  REQUIRE(h.retain_prefix(3, 3).empty());  // 4 pages held: the budget
  CHECK(h.retained_prefixes() == std::vector<prefix_id>{1, 2, 3});
  REQUIRE(h.admit(4, prefix_id{1}));  // prefix 1 becomes the most recent
  CHECK(h.retained_prefixes() == std::vector<prefix_id>{2, 3, 1});
  // Request 1 extends its history: prefix 4 = prefix 1's page + 1 new page. Over by 1: evict 2
  // (2 pages), the least recently used.
  append_rows(h, 1, request_tag(1), 8, 8);
  CHECK(h.retain_prefix(4, 1) == std::vector<prefix_id>{2});
  CHECK(h.retained_prefixes() == std::vector<prefix_id>{3, 1, 4});
  CHECK(h.prefix_pages_held(0) == 3);  // page 0 of request 1 counts once for prefixes 1 and 4
  CHECK_FALSE(h.contains_prefix(2));
  CHECK(h.frontier(2, 0) == 16);  // request 2 keeps its pages
  CHECK(h.host_page_refs(0, h.host_pages_of(2, 0)[0]) == 1);
}

TEST_CASE("residency: suffix and prefix errors are typed and change nothing") {
  using M = residency_manager<H, adaptive_policy<>>;
  M m({.max_requests = 3, .max_rows = 64, .optional_pages = 12}, {.required_pages = 1, .reserve_pages = 1});
  const auto r0 = make_append_buffer(request_tag(1), 0, 2, 64, 0, 20);
  const auto r1 = make_append_buffer(request_tag(1), 1, 1, 32, 0, 20);
  REQUIRE(m.admit(1, {history_import{r0, 20}, history_import{r1, 20}}));
  REQUIRE(m.retain_prefix(9, 1).empty());
  const auto s0 = make_append_buffer(request_tag(2), 0, 2, 64, 20, 4);
  const auto s1 = make_append_buffer(request_tag(2), 1, 1, 32, 20, 4);
  const std::string before = m.audit();
  REQUIRE(before.empty());
  const auto ledger0 = m.ledger(0);
  // The suffix must start at the prefix's end (row 20) on every source.
  REQUIRE_THROWS_AS(m.admit(2, prefix_id{9}, {history_import{s0, 4, 20}, history_import{s1, 4, 16}}), suffix_misaligned);
  REQUIRE_THROWS_AS(m.admit(2, prefix_id{9}, {history_import{s0, 4}, history_import{s1, 4}}), suffix_misaligned);
  // A plain admission starts at row 0.
  REQUIRE_THROWS_AS(m.admit(2, {history_import{r0, 20, 20}, history_import{r1, 20}}), suffix_misaligned);
  REQUIRE_THROWS_AS(m.admit(2, prefix_id{8}, {history_import{s0, 4, 20}, history_import{s1, 4, 20}}), unknown_prefix);
  REQUIRE_THROWS_AS(m.admit(2, prefix_id{9}, {history_import{s0, 3, 20}, history_import{s1, 4, 20}}), size_mismatch);
  const auto big0 = make_append_buffer(request_tag(2), 0, 2, 64, 20, 45);
  REQUIRE_THROWS_AS(m.admit(2, prefix_id{9}, {history_import{big0, 45, 20}, history_import{s1, 4, 20}}),
                    capacity_exceeded);
  REQUIRE_THROWS_AS(m.retain_prefix(9, 1), duplicate_prefix);
  REQUIRE_THROWS_AS(m.retain_prefix(10, 7), unknown_request);
  m.release_prefix(9);
  REQUIRE_THROWS_AS(m.release_prefix(9), unknown_prefix);
  CHECK_FALSE(m.contains(2));
  CHECK(m.ledger(0) == ledger0);
  CHECK(m.audit().empty());
  CHECK(m.counters().admissions == 1);
}
