// HotCache<B> replacement of the host reference hierarchy: the exact LRU rule of
// policies/hot_cache.hpp, checked three ways:
//   * hand-worked scenarios with the expected slots and order written out;
//   * after every call, the documented order-list rule recomputed from the hierarchy's own state
//     before the call (victims = first M unprotected slots of the old order, new order =
//     [untouched] ++ [hits] ++ [victims]) plus structural invariants;
//   * a differential test against the timestamp formulation of tests/support/reference_model.hpp
//     over >= 10^5 random calls in all (kCalls), comparing hot rows, LRU order, locations, stats and plans.
#include "../support/catch.hpp"

#include <dhisparse/host/hierarchy.hpp>
#include <dhisparse/layouts/tiny.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "../support/reference_model.hpp"
#include "../support/row_content.hpp"
#include "../support/test_layouts.hpp"

namespace {

// Total resolve calls of the three differential runs (split 45% / 32% / 23%: the B=128 run costs
// the most per call). >= 10^5 by default; sanitizer builds run a quarter.
#ifndef DHISPARSE_LRU_CALLS
#  if defined(__SANITIZE_ADDRESS__)
constexpr std::size_t kCalls = 110'000 / 4;
#  else
constexpr std::size_t kCalls = 110'000;
#  endif
#else
constexpr std::size_t kCalls = DHISPARSE_LRU_CALLS;
#endif

using namespace dhisparse;
using dhisparse_testing::model_geometry;
using dhisparse_testing::reference_hierarchy;
using dhisparse_testing::test_rng;
using dhisparse_testing::two_source_layout;

template <class T>
std::vector<T> vec(std::span<const T> s) {
  return std::vector<T>(s.begin(), s.end());
}
template <class T>
std::vector<std::size_t> as_size(std::span<const T> s) {
  return std::vector<std::size_t>(s.begin(), s.end());
}

/// Appends rows [frontier, frontier + count) with their deterministic content.
template <class H>
void append_rows(H& h, request_id id, std::size_t source, std::size_t count, std::uint64_t tag = 0) {
  const auto& d = H::layout::sources[source];
  const auto buf = dhisparse_testing::make_append_buffer(tag ? tag : dhisparse_testing::request_tag(id), source,
                                                         d.payload_layers, d.row_bytes, h.frontier(id, source), count);
  h.append(id, source, buf, count);
}

/// Resolves one selection; returns the locations.
template <class H>
std::vector<location> resolve(H& h, request_id id, std::size_t source, const std::vector<row_index>& sel,
                              resolve_stats* stats = nullptr) {
  std::vector<location> loc(sel.size(), -7);
  const resolve_stats st = h.resolve(id, source, sel, loc);
  if (stats) *stats = st;
  return loc;
}

/// The structural invariants of one (request, source) after any call; empty when they hold,
/// otherwise what is broken. (One REQUIRE per call keeps the assertion count, and the run time, low.)
template <class H>
std::string structure_error(const H& h, request_id id, std::size_t source) {
  const auto rows = h.hot_rows_of(id, source);
  const auto order = h.lru_order_of(id, source);
  const std::int64_t tail_begin = h.frontier(id, source) - static_cast<std::int64_t>(h.config().tail_rows);
  if (rows.size() != H::hot_rows || order.size() != H::hot_rows) return "hot cache or order is not B entries";
  // order is a permutation of 0..B-1
  std::vector<std::size_t> sorted = as_size(order);
  std::sort(sorted.begin(), sorted.end());
  for (std::size_t j = 0; j < sorted.size(); ++j)
    if (sorted[j] != j) return "order is not a permutation of 0..B-1";
  // never a row twice; every cached row exists and has left the tail (a row is never both)
  std::set<row_index> seen;
  std::size_t filled = 0;
  for (row_index r : rows) {
    if (r == no_row) continue;
    ++filled;
    if (r < 0 || r >= tail_begin) return "cached row " + std::to_string(r) + " is not history before the tail";
    if (!seen.insert(r).second) return "row " + std::to_string(r) + " is cached twice";
  }
  if (filled > H::hot_rows) return "more than B rows";
  // empty slots form the front of the order, lowest slot first
  const std::size_t empty = H::hot_rows - filled;
  for (std::size_t k = 0; k < H::hot_rows; ++k) {
    if (k < empty && rows[order[k]] != no_row) return "a filled slot precedes an empty slot in the order";
    if (k < empty && k > 0 && order[k - 1] > order[k]) return "empty slots are not in ascending slot order";
    if (k >= empty && rows[order[k]] == no_row) return "an empty slot follows a filled slot in the order";
  }
  return {};
}
template <class H>
void check_structure(const H& h, request_id id, std::size_t source) {
  const std::string err = structure_error(h, id, source);
  CAPTURE(id, source);
  INFO(err);
  REQUIRE(err.empty());
}

/// The documented order-list rule, applied to the hierarchy's own state before a call
/// (`rows0`, `order0`), must give its state after the call. `pending` are the selection's
/// distinct rows that did not resolve directly (tail, ready optional page).
void check_documented_rule(const std::vector<row_index>& rows0, const std::vector<std::size_t>& order0,
                           const std::set<row_index>& pending, const std::vector<row_index>& rows1,
                           const std::vector<std::size_t>& order1) {
  if (pending.empty()) {  // no hot-cache work at all
    REQUIRE(rows1 == rows0);
    REQUIRE(order1 == order0);
    return;
  }
  std::set<std::size_t> hit;
  std::vector<row_index> misses;  // ascending (pending is a std::set)
  for (row_index r : pending) {
    auto it = std::find(rows0.begin(), rows0.end(), r);
    if (it != rows0.end()) hit.insert(static_cast<std::size_t>(it - rows0.begin()));
    else misses.push_back(r);
  }
  std::vector<std::size_t> kept, hits, victims;
  for (std::size_t j : order0) {
    if (hit.count(j)) hits.push_back(j);
    else if (victims.size() < misses.size()) victims.push_back(j);
    else kept.push_back(j);
  }
  REQUIRE(victims.size() == misses.size());
  std::vector<row_index> rows = rows0;
  for (std::size_t t = 0; t < victims.size(); ++t) rows[victims[t]] = misses[t];
  std::vector<std::size_t> order = kept;
  order.insert(order.end(), hits.begin(), hits.end());
  order.insert(order.end(), victims.begin(), victims.end());
  REQUIRE(rows1 == rows);
  REQUIRE(order1 == order);
  // no selected row was evicted: every pending row is cached now
  bool all_cached = true;
  for (row_index r : pending) all_cached = all_cached && std::find(rows1.begin(), rows1.end(), r) != rows1.end();
  REQUIRE(all_cached);
}

}  // namespace

// ------------------------------------------------------------------------------------------------
TEST_CASE("LRU: a hand-worked sequence on tiny/16", "[hierarchy][lru]") {
  using H = host_hierarchy<layouts::tiny, lru_hot_cache<16>>;
  hierarchy_config cfg;
  cfg.max_requests = 2;
  cfg.max_rows = 128;  // tail: one page, 8 rows
  H h(cfg);
  const auto geo = model_geometry::of(cfg, 16, layouts::tiny::page_rows);  // the test's own arithmetic
  const request_id a = 11, b = 22;
  REQUIRE(h.admit(a).slot == 0);
  REQUIRE(h.admit(b).slot == 1);
  append_rows(h, a, 0, 64);  // rows 0..55 history, 56..63 tail
  append_rows(h, b, 0, 64);
  const std::size_t slot = h.slot_of(a);
  auto hot = [&](std::size_t way) { return geo.hot(slot, way); };
  auto order = [&] { return as_size(h.lru_order_of(a, 0)); };
  auto rows = [&] { return vec(h.hot_rows_of(a, 0)); };

  // Fresh cache: order is 0..15, all empty.
  {
    std::vector<std::size_t> identity(16);
    for (std::size_t j = 0; j < 16; ++j) identity[j] = j;
    REQUIRE(order() == identity);
    REQUIRE(rows() == std::vector<row_index>(16, no_row));
  }

  // 1. Misses take the empty slots, lowest first, ascending row to ascending slot, whatever the
  //    selection order; tail rows and -1 do not touch the cache.
  resolve_stats st;
  auto loc = resolve(h, a, 0, {3, 60, 1, -1, 2, 0, 3}, &st);
  REQUIRE(loc == std::vector<location>{hot(3), geo.tail(slot, 60), hot(1), -1, hot(2), hot(0), hot(3)});
  REQUIRE(st.selected == 6);
  REQUIRE(st.direct == 1);
  REQUIRE(st.host == 5);  // entries, the duplicate 3 counts twice
  REQUIRE(st.rows_copied == 4);
  REQUIRE(rows() == std::vector<row_index>{0, 1, 2, 3, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1});
  REQUIRE(order() == std::vector<std::size_t>{4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3});

  // 2. A hit is protected and moves behind the untouched slots; misses still take empty slots.
  loc = resolve(h, a, 0, {5, 2, 4}, &st);
  REQUIRE(loc == std::vector<location>{hot(5), hot(2), hot(4)});
  REQUIRE(st.hot == 1);
  REQUIRE(st.host == 2);
  REQUIRE(rows() == std::vector<row_index>{0, 1, 2, 3, 4, 5, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1});
  //                       untouched-empty ........................ untouched-filled  hit  victims
  REQUIRE(order() == std::vector<std::size_t>{6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 3, 2, 4, 5});

  // 3. Fill the remaining 10 empty slots.
  loc = resolve(h, a, 0, {19, 18, 17, 16, 15, 14, 13, 12, 11, 10});
  REQUIRE(rows() == std::vector<row_index>{0, 1, 2, 3, 4, 5, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19});
  REQUIRE(order() == std::vector<std::size_t>{0, 1, 3, 2, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15});
  REQUIRE(loc[0] == hot(15));  // row 19: the last victim
  REQUIRE(loc[9] == hot(6));   // row 10: the first victim

  // 4. Full cache: the least recently used unselected slots are evicted. Row 0 (LRU) is selected
  //    and therefore protected; the victims are the next two in order: slot 1 (row 1) and slot 3
  //    (row 3, used in call 1, older than row 2 which call 2 used).
  loc = resolve(h, a, 0, {31, 0, 30}, &st);
  REQUIRE(st.hot == 1);
  REQUIRE(st.host == 2);
  REQUIRE(loc == std::vector<location>{hot(3), hot(0), hot(1)});
  REQUIRE(rows() == std::vector<row_index>{0, 30, 2, 31, 4, 5, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19});
  REQUIRE(order() == std::vector<std::size_t>{2, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 3});

  // 5. Ties among rows used by the same call: hits keep their previous recency and come before
  //    the call's victims. Hits: slot 5 (row 5) and slot 2 (row 2), in old order 2, 5.
  loc = resolve(h, a, 0, {5, 40, 2});
  REQUIRE(loc == std::vector<location>{hot(5), hot(4), hot(2)});  // victim: slot 4 (row 4), the LRU unselected
  REQUIRE(rows() == std::vector<row_index>{0, 30, 2, 31, 40, 5, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19});
  REQUIRE(order() == std::vector<std::size_t>{6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 3, 2, 5, 4});

  // 6. A selection of B distinct missing rows replaces the whole cache in order-list order.
  std::vector<row_index> all_new;
  for (row_index r = 55; r >= 40; --r) all_new.push_back(r == 40 ? 39 : r);  // 39, 41..55: none cached
  loc = resolve(h, a, 0, all_new, &st);
  REQUIRE(st.rows_copied == 16);
  // ascending rows 39, 41, ..., 55 go to slots 6, 7, ..., 15, 0, 1, 3, 2, 5, 4
  const std::vector<std::size_t> old_order{6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 3, 2, 5, 4};
  std::vector<row_index> asc{39};
  for (row_index r = 41; r <= 55; ++r) asc.push_back(r);
  std::vector<row_index> want_rows(16);
  for (std::size_t t = 0; t < 16; ++t) want_rows[old_order[t]] = asc[t];
  REQUIRE(rows() == want_rows);
  REQUIRE(order() == old_order);  // all victims, in old order

  // 7. Rows leaving the tail are not cached: after an append, the old tail rows miss.
  append_rows(h, a, 0, 8);  // frontier 72: rows 56..63 leave the tail
  loc = resolve(h, a, 0, {56}, &st);
  REQUIRE(st.host == 1);
  REQUIRE(loc[0] == hot(6));  // the LRU slot (row 39)

  // 8. The other request's cache was never touched.
  REQUIRE(vec(h.hot_rows_of(b, 0)) == std::vector<row_index>(16, no_row));
  // ... nor the other source of the same request.
  REQUIRE(vec(h.hot_rows_of(a, 1)) == std::vector<row_index>(16, no_row));
}

TEST_CASE("LRU: direct rows do not touch the cache, even when also cached", "[hierarchy][lru]") {
  using H = host_hierarchy<layouts::tiny, lru_hot_cache<16>>;
  hierarchy_config cfg;
  cfg.max_requests = 1;
  cfg.max_rows = 128;
  cfg.optional_pages = 2;
  H h(cfg);
  const auto geo = model_geometry::of(cfg, 16, layouts::tiny::page_rows);  // the test's own arithmetic
  const request_id a = 5;
  REQUIRE(h.admit(a));
  append_rows(h, a, 1, 64);
  const std::size_t slot = h.slot_of(a);

  // Only tail rows and -1: no hot-cache work, order unchanged.
  const auto order0 = as_size(h.lru_order_of(a, 1));
  resolve_stats st;
  auto loc = resolve(h, a, 1, {63, -1, 56, 63}, &st);
  REQUIRE(st.direct == 3);
  REQUIRE(as_size(h.lru_order_of(a, 1)) == order0);

  // Cache rows 8..23, then map page 1 (rows 8..15): those rows now resolve directly, are not
  // protected, and their slots are evicted first if they are the least recently used.
  std::vector<row_index> fill;
  for (row_index r = 8; r < 24; ++r) fill.push_back(r);
  resolve(h, a, 1, fill);
  REQUIRE(h.map_optional_page(a, 1, 1));
  const std::int32_t g = h.optional_map_of(a, 1)[1];
  REQUIRE(g == 0);  // lowest free optional page
  loc = resolve(h, a, 1, {8, 30, 9}, &st);
  REQUIRE(st.direct == 2);
  REQUIRE(st.host == 1);
  REQUIRE(loc[0] == geo.optional(0, 8));
  REQUIRE(loc[2] == geo.optional(0, 9));
  REQUIRE(loc[1] == geo.hot(slot, 0));  // slot 0 held row 8: the LRU slot, unprotected
  REQUIRE(h.hot_rows_of(a, 1)[0] == 30);
  REQUIRE(h.hot_rows_of(a, 1)[1] == 9);  // still cached, not refreshed
  REQUIRE(h.lru_order_of(a, 1)[0] == 1);
  // bytes at the optional locations are the rows
  const auto tag = dhisparse_testing::request_tag(a);
  REQUIRE(dhisparse_testing::row_matches(h.payload(1, 0, loc[0]), tag, 1, 0, 8));
  REQUIRE(dhisparse_testing::row_matches(h.payload(1, 0, loc[1]), tag, 1, 0, 30));

  // Unmapping: row 9 is found in the cache again (a hit), row 8 misses.
  h.unmap_optional_page(a, 1, 1);
  loc = resolve(h, a, 1, {9, 8}, &st);
  REQUIRE(st.hot == 1);
  REQUIRE(st.host == 1);
  REQUIRE(loc[0] == geo.hot(slot, 1));
}

TEST_CASE("LRU: a completed and re-admitted slot starts empty", "[hierarchy][lru]") {
  using H = host_hierarchy<layouts::tiny, lru_hot_cache<16>>;
  hierarchy_config cfg;
  cfg.max_requests = 2;
  cfg.max_rows = 64;
  H h(cfg);
  const auto geo = model_geometry::of(cfg, 16, layouts::tiny::page_rows);  // the test's own arithmetic
  REQUIRE(h.admit(1));
  append_rows(h, 1, 0, 40);
  resolve(h, 1, 0, {5, 3, 1});
  h.complete(1);
  REQUIRE(h.admit(1).slot == 0);
  append_rows(h, 1, 0, 40, dhisparse_testing::request_tag(1, 1));
  REQUIRE(vec(h.hot_rows_of(1, 0)) == std::vector<row_index>(16, no_row));
  check_structure(h, 1, 0);
  resolve_stats st;
  const auto loc = resolve(h, 1, 0, {3}, &st);
  REQUIRE(st.host == 1);  // the old incarnation's row 3 is not a hit
  REQUIRE(loc[0] == geo.hot(0, 0));
  REQUIRE(dhisparse_testing::row_matches(h.payload(0, 1, loc[0]), dhisparse_testing::request_tag(1, 1), 0, 1, 3));
}

// ------------------------------------------------------------------------------------------------
namespace {

struct differential_totals {
  std::size_t calls = 0, hits = 0, misses = 0, evictions = 0, direct_cached = 0;
};

/// Random calls on a few requests; after each: the hierarchy against the reference model and
/// against the documented rule, plus the structural invariants.
template <class Layout, class Hot>
differential_totals run_differential(const hierarchy_config& cfg, std::uint64_t seed, std::size_t calls) {
  using H = host_hierarchy<Layout, Hot>;
  constexpr std::size_t S = H::sources;
  H h(cfg);
  reference_hierarchy ref(model_geometry::of(cfg, Hot::rows, Layout::page_rows), S, cfg.max_rows,
                          model_geometry::host_pages_of(cfg, Layout::page_rows));
  test_rng rng(seed);
  differential_totals t;
  std::uint64_t next_id = 1;
  std::map<std::uint64_t, std::uint64_t> tag;
  const std::size_t B = H::hot_rows;
  // histories of a few B rows: frequent hits and evictions
  const std::size_t cap = std::min<std::size_t>(h.config().max_rows, 5 * B);

  auto admit = [&] {
    const std::uint64_t id = next_id++;
    REQUIRE(h.admit(id).slot == *ref.admit(id));
    tag[id] = dhisparse_testing::request_tag(id);
    for (std::size_t s = 0; s < S; ++s) {
      const std::size_t n = B + rng.below(2 * B);
      append_rows(h, id, s, n, tag[id]);
      ref.append(id, s, n);
    }
  };
  for (std::size_t i = 0; i < cfg.max_requests; ++i) admit();

  while (t.calls < calls) {
    const auto ids = ref.admitted();
    const std::uint64_t id = ids[rng.below(ids.size())];
    const std::size_t s = rng.below(S);
    auto& m = ref.model(id, s);
    const std::size_t r = rng.below(100);
    if (r < 6) {  // append a little: rows leave the tail
      const std::size_t n = 1 + rng.below(Layout::page_rows);
      if (static_cast<std::size_t>(m.frontier()) + n > cap) {
        h.complete(id);
        ref.complete(id);
        admit();
      } else {
        append_rows(h, id, s, n, tag[id]);
        ref.append(id, s, n);
      }
      continue;
    }
    if (r < 9) {  // optional page churn (mapped rows resolve directly, cached or not)
      const std::size_t pages = static_cast<std::size_t>(m.frontier()) / Layout::page_rows;
      const std::size_t page = rng.below(pages);
      if (m.page_mapped(page)) {
        h.unmap_optional_page(id, s, page);
        ref.unmap_optional_page(id, s, page);
      } else {
        REQUIRE(h.map_optional_page(id, s, page) == ref.map_optional_page(id, s, page));
      }
      continue;
    }

    // a resolve
    const std::size_t len = rng.chance(1, 3) ? H::top_k : 1 + rng.below(H::top_k);
    dhisparse_testing::selection_mix mix;
    mix.window_rows = 2 * B;
    mix.cached = 35;
    mix.oldest_cached = 10;
    const std::vector<row_index> sel = dhisparse_testing::make_selection(rng, m, len, mix);
    const auto rows0 = vec(h.hot_rows_of(id, s));
    const auto order0 = as_size(h.lru_order_of(id, s));
    const auto optmap = vec(h.optional_map_of(id, s));
    const std::int64_t tail_begin = h.frontier(id, s) - static_cast<std::int64_t>(h.config().tail_rows);
    std::set<row_index> pending;
    for (row_index e : sel) {
      if (e == no_row || e >= tail_begin) continue;
      if (optmap[static_cast<std::size_t>(e) / Layout::page_rows] >= 0) {
        if (std::find(rows0.begin(), rows0.end(), e) != rows0.end()) ++t.direct_cached;
        continue;
      }
      pending.insert(e);
    }

    std::vector<location> loc(sel.size(), -7);
    const resolve_stats got = h.resolve(id, s, sel, loc);
    const auto want = ref.resolve(s, {{id, sel}})[0];
    ++t.calls;

    const auto rows1 = vec(h.hot_rows_of(id, s));
    const auto order1 = as_size(h.lru_order_of(id, s));
    CAPTURE(t.calls, id, s);
    // 1. the reference model (timestamp formulation)
    REQUIRE(rows1 == m.hot_rows());
    REQUIRE(order1 == m.lru_order());
    for (std::size_t i = 0; i < sel.size(); ++i) {
      if (loc[i] == want.entries[i].loc) continue;
      CAPTURE(i, sel[i], dhisparse_testing::to_string(want.entries[i].from), want.entries[i].loc, loc[i]);
      REQUIRE(loc[i] == want.entries[i].loc);
    }
    resolve_stats want_stats = want.stats;
    want_stats.bytes_copied = want_stats.rows_copied * Layout::sources[s].payload_layers * Layout::sources[s].row_bytes;
    REQUIRE(got == want_stats);
    // 2. the documented order-list rule on the hierarchy's own state, and the invariants
    check_documented_rule(rows0, order0, pending, rows1, order1);
    check_structure(h, id, s);
    // every selected row is ready afterwards: tail, ready optional page or hot cache
    for (row_index e : sel) {
      if (e == no_row || e >= tail_begin || optmap[static_cast<std::size_t>(e) / Layout::page_rows] >= 0) continue;
      if (std::find(rows1.begin(), rows1.end(), e) != rows1.end()) continue;
      CAPTURE(e);
      REQUIRE(false);  // a selected row is not ready after the call that selected it
    }
    // exact bytes at every returned location (layer 0 and the last layer)
    const std::size_t last = Layout::sources[s].payload_layers - 1;
    for (std::size_t i = 0; i < sel.size(); ++i) {
      if (sel[i] == no_row) continue;
      for (std::size_t l : {std::size_t{0}, last}) {
        const auto bytes = h.payload(s, l, loc[i]);
        if (dhisparse_testing::row_matches(bytes, tag[id], s, l, sel[i])) continue;
        INFO(dhisparse_testing::describe_row_mismatch(bytes, tag[id], s, l, sel[i]));
        REQUIRE(false);
      }
    }
    t.hits += got.hot;
    t.misses += got.rows_copied;
    for (row_index r : rows0)
      if (r != no_row && std::find(rows1.begin(), rows1.end(), r) == rows1.end()) ++t.evictions;
  }
  return t;
}

void report(const char* name, const differential_totals& t) {
  std::printf("%s: %zu calls, %zu hit entries, %zu rows copied, %zu evictions, %zu cached rows resolved directly\n",
              name, t.calls, t.hits, t.misses, t.evictions, t.direct_cached);
  CHECK(t.hits > t.calls);        // plenty of hits ...
  CHECK(t.evictions > t.calls);   // ... and evictions
  CHECK(t.direct_cached > 0);     // cached rows of mapped pages were selected
}

}  // namespace

TEST_CASE("LRU differential: tiny/16 against the reference model", "[hierarchy][lru][differential]") {
  hierarchy_config cfg;
  cfg.max_requests = 3;
  cfg.max_rows = 256;
  cfg.optional_pages = 4;
  report("tiny/16", run_differential<layouts::tiny, lru_hot_cache<16>>(cfg, 0x1u, kCalls * 45 / 100));
}

TEST_CASE("LRU differential: tiny/32, tail of 5 rows", "[hierarchy][lru][differential]") {
  hierarchy_config cfg;
  cfg.max_requests = 2;
  cfg.max_rows = 256;
  cfg.tail_rows = 5;
  cfg.optional_pages = 3;
  report("tiny/32", run_differential<layouts::tiny, lru_hot_cache<32>>(cfg, 0x2u, kCalls * 32 / 100));
}

TEST_CASE("LRU differential: two sources, top_k 64, lru_hot_cache<128>", "[hierarchy][lru][differential]") {
  hierarchy_config cfg;
  cfg.max_requests = 3;
  cfg.max_rows = 1024;
  cfg.tail_rows = 16;
  cfg.optional_pages = 6;
  const std::size_t calls = kCalls - kCalls * 45 / 100 - kCalls * 32 / 100;
  report("two-source/128", run_differential<two_source_layout, lru_hot_cache<128>>(cfg, 0x3u, calls));
}
