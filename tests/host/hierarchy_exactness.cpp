// Invariant 2 (exactness) of the host reference hierarchy under randomized workloads.
//
// Several requests are admitted, fed rows, resolved in batches, given and stripped of optional
// pages, completed and admitted again. After every resolve, every returned location must hold the
// exact bytes of the selected row in every materialised payload layer (follower layers after
// `copy_follower` when the resolve used `copy_layers::producer_only`). Locations, stats and copy
// plans are also compared with the independent reference model (tests/support/reference_model.hpp),
// and the stats are checked against the hierarchy's own observable state.
//
// Size: kRowsScale (or -DDHISPARSE_EXACTNESS_ROWS=n) resolved rows per configuration unit; the
// three configurations together resolve well over 10^6 rows at the default.
#include "../support/catch.hpp"

#include <dhisparse/host/hierarchy.hpp>
#include <dhisparse/layouts/tiny.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "../support/reference_model.hpp"
#include "../support/row_content.hpp"
#include "../support/test_layouts.hpp"

namespace {

#ifndef DHISPARSE_EXACTNESS_ROWS
#  if defined(__SANITIZE_ADDRESS__)
constexpr std::size_t kRowsScale = 100'000;  // sanitizer builds: same paths, fewer rows
#  else
constexpr std::size_t kRowsScale = 400'000;
#  endif
#else
constexpr std::size_t kRowsScale = DHISPARSE_EXACTNESS_ROWS;
#endif

using namespace dhisparse;
using dhisparse_testing::predicted_resolve;
using dhisparse_testing::model_geometry;
using dhisparse_testing::reference_hierarchy;
using dhisparse_testing::resolved_from;
using dhisparse_testing::test_rng;

using dhisparse_testing::two_source_layout;

struct run_totals {
  std::size_t resolved_rows = 0, calls = 0, batches = 0, direct = 0, hot = 0, host = 0, optional_direct = 0;
  std::size_t admissions = 0, completions = 0, readmissions = 0, appends = 0, follower_copies = 0;
  std::size_t producer_only = 0, exhausted = 0;
};

template <class Layout, class Hot>
class exactness_run {
 public:
  using H = host_hierarchy<Layout, Hot>;
  static constexpr std::size_t S = H::sources;

  exactness_run(const hierarchy_config& cfg, std::uint64_t seed)
      : h_(cfg),
        ref_(model_geometry::of(cfg, Hot::rows, Layout::page_rows), S, cfg.max_rows,
             model_geometry::host_pages_of(cfg, Layout::page_rows)),
        rng_(seed) {
    // the library's pool geometry agrees with the one the model derived from the configuration
    const auto& sp = h_.space();
    const auto& g = ref_.space();
    REQUIRE(sp.slots == g.slots);
    REQUIRE(sp.hot_rows == g.hot_rows);
    REQUIRE(sp.tail_rows == g.tail_ring);
    REQUIRE(sp.optional_pages == g.optional_pages);
    REQUIRE(sp.page_rows == g.page_rows);
    for (std::size_t s = 0; s < S; ++s) {
      initial_free_host_[s] = h_.free_host_pages(s);
      initial_free_optional_[s] = h_.free_optional_pages(s);
    }
  }

  run_totals run(std::size_t target_rows) {
    while (totals_.resolved_rows < target_rows) step();
    // drain: every page returns
    for (std::uint64_t id : ref_.admitted()) complete(id);
    for (std::size_t s = 0; s < S; ++s) {
      REQUIRE(h_.free_host_pages(s) == initial_free_host_[s]);
      REQUIRE(h_.free_optional_pages(s) == initial_free_optional_[s]);
    }
    REQUIRE(h_.admitted_count() == 0);
    return totals_;
  }

 private:
  static constexpr std::size_t layers(std::size_t s) { return Layout::sources[s].payload_layers; }
  static constexpr std::size_t row_bytes(std::size_t s) { return Layout::sources[s].row_bytes; }

  void step() {
    const std::size_t r = rng_.below(100);
    const std::size_t live = ref_.admitted_count();
    if (live == 0 || (live < h_.config().max_requests && r < 5)) admit();
    else if (r < 30) append_random();
    else if (r < 36) map_random();
    else if (r < 40) unmap_random();
    else if (r < 42) complete(pick_live());
    else resolve_random();
  }

  std::uint64_t pick_live() {
    const auto ids = ref_.admitted();
    return ids[rng_.below(ids.size())];
  }

  void admit() {
    std::uint64_t id;
    if (!retired_.empty() && rng_.chance(1, 2)) {  // the same id again: a new incarnation
      const std::size_t k = rng_.below(retired_.size());
      id = retired_[k];
      retired_.erase(retired_.begin() + static_cast<std::ptrdiff_t>(k));
      ++totals_.readmissions;
    } else {
      id = next_id_;
      next_id_ += 1 + rng_.below(1000);
    }
    const auto want = ref_.admit(id);
    const admission got = h_.admit(id);
    REQUIRE(got.admitted == want.has_value());
    if (!got) return;
    REQUIRE(got.slot == *want);
    tag_[id] = dhisparse_testing::request_tag(id, generation_[id]++);
    ++totals_.admissions;
    // prefill: a prompt of random length per source, in chunks of random size
    for (std::size_t s = 0; s < S; ++s) {
      std::size_t prompt = rng_.below(ref_.max_rows() / 2);
      while (prompt > 0) {
        const std::size_t chunk = std::min(prompt, 1 + rng_.below(8 * Layout::page_rows));
        if (ref_.pages_needed(id, s, chunk) > ref_.free_host_pages(s)) break;
        append_rows(id, s, chunk);
        prompt -= chunk;
      }
    }
  }

  void complete(std::uint64_t id) {
    h_.complete(id);
    ref_.complete(id);
    tag_.erase(id);
    retired_.push_back(id);
    ++totals_.completions;
    REQUIRE(!h_.contains(id));
    for (std::size_t s = 0; s < S; ++s) {
      REQUIRE(h_.free_host_pages(s) == ref_.free_host_pages(s));
      REQUIRE(h_.free_optional_pages(s) == ref_.free_optional_pages(s));
    }
  }

  void append_rows(std::uint64_t id, std::size_t s, std::size_t count) {
    const std::int64_t first = ref_.model(id, s).frontier();
    const auto buf =
        dhisparse_testing::make_append_buffer(tag_.at(id), s, layers(s), row_bytes(s), first, count);
    h_.append(id, s, buf, count);
    ref_.append(id, s, count);
    ++totals_.appends;
    REQUIRE(h_.frontier(id, s) == ref_.model(id, s).frontier());
  }

  void append_random() {
    const std::uint64_t id = pick_live();
    const std::size_t s = rng_.below(S);
    const std::size_t p = Layout::page_rows;
    const std::int64_t f = ref_.model(id, s).frontier();
    const std::size_t room = ref_.max_rows() - static_cast<std::size_t>(f);
    if (room == 0) {  // full history: the request finishes
      complete(id);
      return;
    }
    // mostly decode-sized appends, sometimes a prefill chunk of several pages
    std::size_t count = rng_.chance(1, 8) ? 1 + rng_.below(4 * p) : 1 + rng_.below(3);
    count = std::min(count, room);
    if (ref_.pages_needed(id, s, count) > ref_.free_host_pages(s)) {
      const auto buf = dhisparse_testing::make_append_buffer(tag_.at(id), s, layers(s), row_bytes(s), f, count);
      REQUIRE_THROWS_AS(h_.append(id, s, buf, count), host_pool_exhausted);
      REQUIRE(h_.frontier(id, s) == f);
      ++totals_.exhausted;
      complete(pick_live());  // make room: some request finishes
      return;
    }
    append_rows(id, s, count);
  }

  void map_random() {
    const std::uint64_t id = pick_live();
    const std::size_t s = rng_.below(S);
    const std::size_t complete_pages = static_cast<std::size_t>(ref_.model(id, s).frontier()) / Layout::page_rows;
    if (complete_pages == 0) return;
    const std::size_t page = rng_.below(complete_pages);
    const bool want = ref_.map_optional_page(id, s, page);
    REQUIRE(h_.map_optional_page(id, s, page) == want);
    check_optional_map(id, s);
    // a freshly mapped page holds its rows in every layer
    if (want) {
      const std::int32_t g = ref_.model(id, s).optional_pages().at(page);
      for (std::size_t i = 0; i < Layout::page_rows; ++i) {
        const auto row = static_cast<row_index>(page * Layout::page_rows + i);
        const location loc = ref_.space().optional(static_cast<std::size_t>(g), row);
        for (std::size_t l = 0; l < layers(s); ++l) check_bytes(id, s, l, row, loc);
      }
    }
  }

  void unmap_random() {
    const std::uint64_t id = pick_live();
    const std::size_t s = rng_.below(S);
    const auto& mapped = ref_.model(id, s).optional_pages();
    if (mapped.empty()) return;
    auto it = mapped.begin();
    std::advance(it, static_cast<std::ptrdiff_t>(rng_.below(mapped.size())));
    const std::size_t page = it->first;
    h_.unmap_optional_page(id, s, page);
    ref_.unmap_optional_page(id, s, page);
    check_optional_map(id, s);
  }

  void check_optional_map(std::uint64_t id, std::size_t s) {
    const auto got = h_.optional_map_of(id, s);
    const auto& want = ref_.model(id, s).optional_pages();
    for (std::size_t page = 0; page < got.size(); ++page) {
      auto it = want.find(page);
      CAPTURE(id, s, page);
      REQUIRE(got[page] == (it == want.end() ? -1 : it->second));
    }
    REQUIRE(h_.free_optional_pages(s) == ref_.free_optional_pages(s));
  }

  void check_bytes(std::uint64_t id, std::size_t s, std::size_t layer, row_index row, location loc) {
    const auto bytes = h_.payload(s, layer, loc);
    if (!dhisparse_testing::row_matches(bytes, tag_.at(id), s, layer, row)) {
      INFO("request " << id << " source " << s << " layer " << layer << " row " << row << " location " << loc);
      INFO(dhisparse_testing::describe_row_mismatch(bytes, tag_.at(id), s, layer, row));
      REQUIRE(false);
    }
  }

  void resolve_random() {
    const std::size_t s = rng_.below(S);
    std::vector<std::uint64_t> candidates;
    for (std::uint64_t id : ref_.admitted())
      if (ref_.model(id, s).frontier() > 0) candidates.push_back(id);
    if (candidates.empty()) return;
    // batch: a random subset in random order
    for (std::size_t i = candidates.size(); i > 1; --i) std::swap(candidates[i - 1], candidates[rng_.below(i)]);
    candidates.resize(1 + rng_.below(candidates.size()));

    std::vector<std::pair<std::uint64_t, std::vector<row_index>>> batch;
    std::vector<std::vector<location>> locs;
    for (std::uint64_t id : candidates) {
      const std::size_t len = rng_.chance(1, 4) ? H::top_k : 1 + rng_.below(H::top_k);
      dhisparse_testing::selection_mix mix;
      mix.window_rows = 4 * H::hot_rows;
      batch.emplace_back(id, dhisparse_testing::make_selection(rng_, ref_.model(id, s), len, mix));
      locs.emplace_back(len, location{-7});
    }
    std::vector<resolve_item> items;
    for (std::size_t b = 0; b < batch.size(); ++b) items.push_back({batch[b].first, batch[b].second, locs[b]});

    // the hierarchy's own view before the call: which rows were cached
    std::vector<std::set<row_index>> cached_before;
    for (const auto& [id, sel] : batch) {
      const auto rows = h_.hot_rows_of(id, s);
      cached_before.emplace_back(rows.begin(), rows.end());
    }

    const bool producer_only = layers(s) > 1 && rng_.chance(1, 2);
    const copy_layers mode = producer_only ? copy_layers::producer_only : copy_layers::all;
    const resolve_stats got = h_.resolve(s, items, mode);
    const std::vector<predicted_resolve> want = ref_.resolve(s, batch);
    ++totals_.batches;
    totals_.producer_only += producer_only ? 1 : 0;

    // --- locations, stats and plan against the model; stats against observable state
    resolve_stats want_total;
    const auto& geo = ref_.space();
    const std::size_t hot_end = geo.slots * geo.hot_rows;
    const std::size_t tail_end = geo.slots * (geo.hot_rows + geo.tail_ring);
    std::size_t entries_direct = 0, entries_hot = 0, entries_host = 0, distinct_misses = 0;
    for (std::size_t b = 0; b < batch.size(); ++b) {
      const auto& [id, sel] = batch[b];
      const std::size_t slot = ref_.slot_of(id);
      want_total += want[b].stats;
      std::set<row_index> missed_rows;
      for (std::size_t i = 0; i < sel.size(); ++i) {
        const auto& w = want[b].entries[i];
        if (locs[b][i] != w.loc) {
          CAPTURE(id, s, i, sel[i], dhisparse_testing::to_string(w.from), w.loc, locs[b][i]);
          REQUIRE(locs[b][i] == w.loc);
        }
        if (sel[i] == no_row) continue;
        const auto loc = static_cast<std::size_t>(locs[b][i]);
        if (loc < hot_end) {
          if (loc / geo.hot_rows != slot) REQUIRE(loc / geo.hot_rows == slot);  // own hot slots
          if (cached_before[b].count(sel[i])) ++entries_hot;
          else { ++entries_host; missed_rows.insert(sel[i]); }
        } else {
          ++entries_direct;
          if (loc >= tail_end) ++totals_.optional_direct;
          else if ((loc - hot_end) / geo.tail_ring != slot)
            REQUIRE((loc - hot_end) / geo.tail_ring == slot);  // own tail ring
        }
      }
      distinct_misses += missed_rows.size();
    }
    const std::size_t materialised = producer_only ? 1 : layers(s);
    want_total.bytes_copied = want_total.rows_copied * materialised * row_bytes(s);
    CAPTURE(got.selected, got.direct, got.hot, got.host, got.rows_copied, got.bytes_copied);
    REQUIRE(got == want_total);
    REQUIRE(got.selected == got.direct + got.hot + got.host);
    REQUIRE(got.direct == entries_direct);
    REQUIRE(got.hot == entries_hot);
    REQUIRE(got.host == entries_host);
    REQUIRE(got.rows_copied == distinct_misses);
    REQUIRE(got.bytes_copied == got.rows_copied * materialised * row_bytes(s));

    const auto plan = h_.last_plan(s);
    const auto& want_plan = ref_.last_plan(s);
    REQUIRE(plan.size() == got.rows_copied);
    REQUIRE(plan.size() == want_plan.size());
    for (std::size_t k = 0; k < plan.size(); ++k) {
      CAPTURE(k, plan[k].slot, plan[k].row, plan[k].dst, want_plan[k].slot, want_plan[k].row, want_plan[k].dst);
      REQUIRE(plan[k].slot == want_plan[k].slot);
      REQUIRE(plan[k].row == want_plan[k].row);
      REQUIRE(plan[k].dst == want_plan[k].dst);
    }

    // --- bytes
    auto check_all = [&](std::size_t layer_end, bool skip_misses_beyond_layer0) {
      for (std::size_t b = 0; b < batch.size(); ++b) {
        const auto& [id, sel] = batch[b];
        for (std::size_t i = 0; i < sel.size(); ++i) {
          if (sel[i] == no_row) continue;
          const bool miss = want[b].entries[i].from == resolved_from::host;
          for (std::size_t l = 0; l < layer_end; ++l) {
            if (l > 0 && miss && skip_misses_beyond_layer0) continue;
            check_bytes(id, s, l, sel[i], locs[b][i]);
          }
        }
      }
    };
    if (!producer_only) {
      check_all(layers(s), false);
    } else {
      // Before the follower copies: layer 0 everywhere; followers wherever nothing was copied
      // (tail, optional pages, hot hits from earlier calls).
      check_all(layers(s), true);
      // Something unrelated may happen between the producer and its followers: work on another
      // source (the tail of this source must not move, or the tail locations above would change).
      if (S > 1 && rng_.chance(1, 3)) {
        const std::size_t other = (s + 1) % S;
        const std::uint64_t id = pick_live();
        if (static_cast<std::size_t>(ref_.model(id, other).frontier()) < ref_.max_rows() &&
            ref_.pages_needed(id, other, 1) <= ref_.free_host_pages(other))
          append_rows(id, other, 1);
      }
      std::vector<std::size_t> order;
      for (std::size_t l = 1; l < layers(s); ++l) order.push_back(l);
      for (std::size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng_.below(i)]);
      for (std::size_t l : order) {
        REQUIRE(h_.copy_follower(s, l) == plan.size() * row_bytes(s));
        REQUIRE(h_.copy_follower(s, l) == 0);  // already copied
        ++totals_.follower_copies;
      }
      check_all(layers(s), false);
    }

    totals_.resolved_rows += got.selected;
    totals_.direct += got.direct;
    totals_.hot += got.hot;
    totals_.host += got.host;
    totals_.calls += batch.size();

    // occasionally, the full per-request state against the model
    if (totals_.batches % 64 == 0)
      for (std::uint64_t id : ref_.admitted())
        for (std::size_t src = 0; src < S; ++src) {
          const auto rows = h_.hot_rows_of(id, src);
          const auto order = h_.lru_order_of(id, src);
          const auto want_rows = ref_.model(id, src).hot_rows();
          const auto want_order = ref_.model(id, src).lru_order();
          REQUIRE(std::vector<row_index>(rows.begin(), rows.end()) == want_rows);
          REQUIRE(std::vector<std::size_t>(order.begin(), order.end()) == want_order);
          check_optional_map(id, src);
        }
  }

  H h_;
  reference_hierarchy ref_;
  test_rng rng_;
  run_totals totals_;
  std::map<std::uint64_t, std::uint64_t> tag_;         // live id -> content tag of this incarnation
  std::map<std::uint64_t, std::uint64_t> generation_;  // id -> incarnations so far
  std::vector<std::uint64_t> retired_;                 // completed ids, candidates for re-admission
  std::uint64_t next_id_ = 1000;
  std::array<std::size_t, S> initial_free_host_{}, initial_free_optional_{};
};

void report(const char* name, const run_totals& t) {
  std::printf("%s: %zu rows resolved in %zu calls (%zu direct, %zu hot, %zu host)\n", name, t.resolved_rows, t.calls,
              t.direct, t.hot, t.host);
  INFO(name << ": rows " << t.resolved_rows << ", calls " << t.calls << ", batches " << t.batches << ", direct "
            << t.direct << " (optional " << t.optional_direct << "), hot " << t.hot << ", host " << t.host
            << ", admissions " << t.admissions << " (re-admitted ids " << t.readmissions << "), completions "
            << t.completions << ", producer-only batches " << t.producer_only << ", follower copies "
            << t.follower_copies << ", host pool exhausted " << t.exhausted);
  // Every path must actually have been exercised.
  CHECK(t.direct > 0);
  CHECK(t.optional_direct > 0);
  CHECK(t.hot > 0);
  CHECK(t.host > 0);
  CHECK(t.readmissions > 0);
  CHECK(t.completions > 0);
}

}  // namespace

TEST_CASE("exactness: tiny layout, lru_hot_cache<16>", "[hierarchy][exactness]") {
  hierarchy_config cfg;
  cfg.max_requests = 4;
  cfg.max_rows = 512;
  cfg.optional_pages = 6;  // tail: one page (8 rows)
  exactness_run<layouts::tiny, lru_hot_cache<16>> run(cfg, 0x7111'0016);
  const run_totals t = run.run(kRowsScale * 3 / 4);
  report("tiny/16", t);
  CHECK(t.producer_only > 0);
}

TEST_CASE("exactness: tiny layout, lru_hot_cache<32>, tail not a page multiple", "[hierarchy][exactness]") {
  hierarchy_config cfg;
  cfg.max_requests = 3;
  cfg.max_rows = 384;
  cfg.tail_rows = 12;
  cfg.optional_pages = 4;
  exactness_run<layouts::tiny, lru_hot_cache<32>> run(cfg, 0x7111'0032);
  const run_totals t = run.run(kRowsScale * 3 / 4);
  report("tiny/32", t);
}

TEST_CASE("exactness: two sources x three payload layers, 48-byte rows, lru_hot_cache<128>",
          "[hierarchy][exactness]") {
  hierarchy_config cfg;
  cfg.max_requests = 5;
  cfg.max_rows = 2048;
  cfg.tail_rows = 16;
  cfg.optional_pages = 12;
  cfg.host_pages = 200;  // under a third of full capacity (640): appends sometimes exhaust the host pool
  exactness_run<two_source_layout, lru_hot_cache<128>> run(cfg, 0x2500'0128);
  const run_totals t = run.run(kRowsScale * 3 / 2);
  report("two-source/128", t);
  CHECK(t.producer_only > 0);
  CHECK(t.exhausted > 0);
}
