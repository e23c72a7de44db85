// Synthetic selection generator: determinism, well-formed selections (distinct rows below the
// frontier, -1 padding, score order), the mix of recent / heavy-hitter / random rows, heavy-hitter
// persistence and drift, the miss-target mode, the batch helper, and a run through the host
// hierarchy with the demo layout.
#include "../support/catch.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <set>
#include <span>
#include <unordered_set>
#include <vector>

#include <dhisparse/host/hierarchy.hpp>
#include <dhisparse/layouts/demo.hpp>
#include <dhisparse/workload/selection_generator.hpp>

#include "../support/row_content.hpp"

namespace {

using namespace dhisparse;
using namespace dhisparse::workload;

constexpr std::int64_t long_history = 100'000;

std::vector<row_index> draw(selection_generator& g, std::int64_t frontier) {
  std::vector<row_index> out(g.top_k(), 12345);
  g.next(frontier, out);
  return out;
}

std::vector<row_index> entries_of(const std::vector<row_index>& sel) {
  std::vector<row_index> v;
  for (row_index r : sel)
    if (r != no_row) v.push_back(r);
  return v;
}

/// Entries of `b` that also appear in `a`, over `b`'s entries.
double overlap(const std::vector<row_index>& a, const std::vector<row_index>& b) {
  const std::unordered_set<row_index> in_a(a.begin(), a.end());
  std::size_t n = 0, common = 0;
  for (row_index r : b) {
    if (r == no_row) continue;
    ++n;
    common += in_a.contains(r) ? 1 : 0;
  }
  return n == 0 ? 0.0 : static_cast<double>(common) / static_cast<double>(n);
}

double set_overlap(std::span<const row_index> a, std::span<const row_index> b) {
  const std::unordered_set<row_index> in_a(a.begin(), a.end());
  std::size_t common = 0;
  for (row_index r : b) common += in_a.contains(r) ? 1 : 0;
  return b.empty() ? 0.0 : static_cast<double>(common) / static_cast<double>(b.size());
}

/// Checks the shape every selection must have; returns the entry count.
std::size_t check_well_formed(const std::vector<row_index>& sel, std::int64_t frontier) {
  std::size_t entries = 0;
  bool padding = false;
  std::unordered_set<row_index> seen;
  for (row_index r : sel) {
    if (r == no_row) {
      padding = true;
      continue;
    }
    REQUIRE_FALSE(padding);  // padding only at the end
    REQUIRE(r >= 0);
    REQUIRE(r < frontier);
    REQUIRE(seen.insert(r).second);  // distinct
    ++entries;
  }
  REQUIRE(entries == static_cast<std::size_t>(std::min<std::int64_t>(frontier, static_cast<std::int64_t>(sel.size()))));
  return entries;
}


}  // namespace

TEST_CASE("selection_generator: the same seed gives the same selections", "[selection_generator]") {
  const selection_params p;
  selection_generator a(p, 42), b(p, 42), c(p, 43);
  bool differs = false;
  for (std::int64_t t = 0; t < 40; ++t) {
    const std::int64_t frontier = 50'000 + t;
    const auto sa = draw(a, frontier), sb = draw(b, frontier), sc = draw(c, frontier);
    REQUIRE(sa == sb);
    differs = differs || sa != sc;
  }
  REQUIRE(differs);

  SECTION("miss-target mode too") {
    selection_generator x(p, 9), y(p, 9);
    std::vector<row_index> ox(p.top_k), oy(p.top_k);
    for (std::int64_t t = 0; t < 10; ++t) {
      const auto sx = x.generate_with_miss_target(long_history + t, ox, {0.3, 2});
      const auto sy = y.generate_with_miss_target(long_history + t, oy, {0.3, 2});
      REQUIRE(ox == oy);
      REQUIRE(sx.fresh == sy.fresh);
    }
  }
}

TEST_CASE("selection_generator: ranges, drift rate and locality hold for every seed", "[selection_generator]") {
  // Properties the parameters promise, measured over several seeds and two shapes (no pinned
  // output: a pinned sequence only detects change, these detect a generator that is wrong).
  struct shape {
    std::size_t top_k, window, sinks;
    double drift, concentration;
  };
  for (const shape sh : {shape{512, 1024, 4, 0.02, 2.0}, shape{2048, 2048, 0, 0.05, 1.0}}) {
    for (std::uint64_t seed : {1u, 77u, 4242u}) {
      selection_params p;
      p.top_k = sh.top_k;
      p.recent_window = sh.window;
      p.sink_rows = sh.sinks;
      p.drift_rate = sh.drift;
      p.recent_concentration = sh.concentration;
      p.drift_recent_bias = 0.0;  // replacements uniform over the history: the window holds recent draws
      selection_generator g(p, seed);
      CAPTURE(sh.top_k, sh.window, sh.sinks, sh.drift, seed);
      constexpr int steps = 200;
      std::size_t replaced = 0, hitters_seen = 0, in_window = 0, in_half_window = 0, entries = 0;
      std::vector<row_index> before;
      for (int t = 0; t < steps; ++t) {
        const std::int64_t frontier = long_history + t;
        const auto sel = draw(g, frontier);
        // ranges: distinct rows in [0, frontier), -1 only as trailing padding, sinks every step
        check_well_formed(sel, frontier);
        for (std::size_t i = 0; i < sh.sinks; ++i)
          REQUIRE(std::find(sel.begin(), sel.end(), static_cast<row_index>(i)) != sel.end());
        const std::vector<row_index> after(g.heavy_hitters().begin(), g.heavy_hitters().end());
        for (row_index r : after) REQUIRE((r >= 0 && r < frontier));
        REQUIRE(std::set<row_index>(after.begin(), after.end()).size() == after.size());
        if (!before.empty()) {
          // drift: the share of hitters replaced per step is drift_rate
          const std::set<row_index> now(after.begin(), after.end());
          for (row_index r : before) replaced += now.count(r) ? 0 : 1;
          hitters_seen += before.size();
        }
        before = after;
        for (row_index r : sel) {
          if (r == no_row) continue;
          ++entries;
          const std::int64_t d = frontier - 1 - r;
          in_window += d < static_cast<std::int64_t>(sh.window) ? 1 : 0;
          in_half_window += d < static_cast<std::int64_t>(sh.window) / 2 ? 1 : 0;
        }
      }
      const double drift = static_cast<double>(replaced) / static_cast<double>(hitters_seen);
      INFO("replaced per step " << drift);
      CHECK(drift > sh.drift * 0.8);
      CHECK(drift < sh.drift * 1.2);
      // locality: at least the recent share lies in the window; with W * u^c, a share 2^(-1/c) of the
      // recent draws lies in its nearer half (0.71 for c = 2, 0.5 for c = 1); the other kinds are
      // spread over 100,000 rows and put only ~1 % of their draws into the window.
      const double window_share = static_cast<double>(in_window) / static_cast<double>(entries);
      const double near_share = static_cast<double>(in_half_window) / static_cast<double>(in_window);
      INFO("window share " << window_share << ", nearer half of the window " << near_share);
      CHECK(window_share >= p.recent_share);
      CHECK(near_share > std::pow(0.5, 1.0 / sh.concentration) - 0.06);
      CHECK(near_share < std::pow(0.5, 1.0 / sh.concentration) + 0.06);
    }
  }
}

TEST_CASE("selection_generator: distinct rows below the frontier, -1 padding", "[selection_generator]") {
  selection_params p;
  p.top_k = 256;
  p.recent_window = 512;
  selection_generator g(p, 1);
  for (std::int64_t frontier : {0, 1, 3, 4, 5, 100, 255, 256, 257, 300, 511, 512, 513, 1000, 5000, 200'000}) {
    const auto sel = draw(g, frontier);
    const std::size_t n = check_well_formed(sel, frontier);
    if (frontier <= 256) {
      // A short history selects every row, padded with -1 as the model's top-k emits it.
      auto rows = entries_of(sel);
      std::sort(rows.begin(), rows.end());
      std::vector<row_index> all(static_cast<std::size_t>(frontier));
      std::iota(all.begin(), all.end(), 0);
      REQUIRE(rows == all);
      REQUIRE(std::count(sel.begin(), sel.end(), no_row) == static_cast<std::ptrdiff_t>(256 - n));
    } else {
      REQUIRE(n == 256);
    }
  }

  SECTION("with no sinks, no recent rows and no heavy hitters, barely longer histories still fill k") {
    selection_params q;
    q.top_k = 64;
    q.sink_rows = 0;
    q.recent_share = 0;
    q.random_share = 1;
    selection_generator r(q, 5);
    for (std::int64_t frontier = 60; frontier < 80; ++frontier) check_well_formed(draw(r, frontier), frontier);
  }
}

TEST_CASE("selection_generator: entries come in score order, not row order", "[selection_generator]") {
  selection_params p;
  selection_generator g(p, 3);
  const auto sel = draw(g, long_history);
  REQUIRE_FALSE(std::is_sorted(sel.begin(), sel.end()));
  REQUIRE_FALSE(std::is_sorted(sel.rbegin(), sel.rend()));
  // Sinks score highest: the first entries are the sink rows.
  std::vector<row_index> head(sel.begin(), sel.begin() + static_cast<std::ptrdiff_t>(p.sink_rows));
  std::sort(head.begin(), head.end());
  REQUIRE(head == std::vector<row_index>{0, 1, 2, 3});
  // The random tail scores lowest: the last quarter holds mostly rows far from the frontier.
  std::size_t far = 0;
  for (std::size_t i = sel.size() * 3 / 4; i < sel.size(); ++i)
    far += sel[i] < long_history - static_cast<std::int64_t>(p.recent_window) ? 1 : 0;
  REQUIRE(far > sel.size() / 8);
}

TEST_CASE("selection_generator: shares follow the parameters", "[selection_generator]") {
  selection_params p;  // k = 2048, 25% recent over 2048 rows, >= 15% random, 4 sinks
  p.drift_recent_bias = 0.0;  // heavy hitters spread over the whole history, so the window holds only recent picks
  selection_generator g(p, 11);
  REQUIRE(g.recent_quota() == 512);
  REQUIRE(g.heavy_quota() == 2048 - 4 - 512 - 307);
  REQUIRE(g.heavy_hitter_target() == 1362);  // ceil(1225 / 0.9)

  constexpr int steps = 50;
  std::size_t entries = 0, in_window = 0, heavy = 0, sinks = 0, other = 0;
  for (int t = 0; t < steps; ++t) {
    const std::int64_t frontier = long_history + t;
    const auto sel = draw(g, frontier);
    const std::unordered_set<row_index> hitters(g.heavy_hitters().begin(), g.heavy_hitters().end());
    for (row_index r : sel) {
      ++entries;
      if (r < 4) ++sinks;
      else if (r >= frontier - static_cast<std::int64_t>(p.recent_window)) ++in_window;
      else if (hitters.contains(r)) ++heavy;
      else ++other;
    }
  }
  const double n = static_cast<double>(entries);
  INFO("window " << in_window / n << " heavy " << heavy / n << " other " << other / n);
  REQUIRE(sinks == 4u * steps);
  // The window holds the recent quota, plus the few heavy/random rows that land in it (2% of history).
  CHECK(in_window / n >= 0.25);
  CHECK(in_window / n <= 0.25 + 0.02);
  // Heavy hitters fill their quota (1225/2048 = 59.8%) up to Bernoulli shortfalls.
  CHECK(heavy / n >= 0.57);
  CHECK(heavy / n <= 0.60);
  // The random tail: at least random_share, plus the heavy quota's shortfall.
  CHECK(other / n >= 0.14);
  CHECK(other / n <= 0.18);
}

TEST_CASE("selection_generator: recent rows concentrate near the frontier", "[selection_generator]") {
  selection_params p;
  p.top_k = 512;
  p.recent_share = 0.5;
  p.recent_window = 4096;
  p.random_share = 0.5;
  p.sink_rows = 0;
  p.recent_concentration = 3.0;
  selection_generator g(p, 4);
  const auto sel = draw(g, long_history);
  std::size_t near = 0, window = 0;
  for (row_index r : sel) {
    if (r >= long_history - 4096) ++window;
    if (r >= long_history - 512) ++near;
  }
  // P(d < W/8) = (1/8)^(1/3) = 0.5 of the recent draws.
  REQUIRE(window >= 256);
  REQUIRE(near >= 100);
  REQUIRE(near <= 160);
}

TEST_CASE("selection_generator: heavy hitters persist and drift slowly", "[selection_generator]") {
  const selection_params p;  // drift 1% a step
  selection_generator g(p, 21);
  auto prev = draw(g, long_history);
  const std::vector<row_index> first_hitters(g.heavy_hitters().begin(), g.heavy_hitters().end());
  REQUIRE(first_hitters.size() == g.heavy_hitter_target());

  SECTION("consecutive selections overlap heavily") {
    for (int t = 1; t <= 20; ++t) {
      std::vector<row_index> before(g.heavy_hitters().begin(), g.heavy_hitters().end());
      const auto sel = draw(g, long_history + t);
      const double o = overlap(prev, sel);
      INFO("step " << t << " overlap " << o);
      CHECK(o >= 0.55);  // sinks + most heavy hitters (0.9^2) + part of the recent window
      CHECK(set_overlap(before, g.heavy_hitters()) >= 0.96);
      prev = sel;
    }
  }

  SECTION("over many steps the set and the selections move on") {
    std::vector<row_index> sel;
    for (int t = 1; t <= 400; ++t) sel = draw(g, long_history + t);
    // 400 steps at 1% replace all but about e^-4 = 1.8% of the original hitters.
    CHECK(set_overlap(first_hitters, g.heavy_hitters()) < 0.05);
    CHECK(overlap(prev, sel) < 0.1);
    // Replacements favour recent history: half come from the newest 8192 rows (8% of the history).
    std::size_t recent = 0;
    for (row_index r : g.heavy_hitters()) recent += r >= long_history + 400 - 8192 ? 1 : 0;
    CHECK(static_cast<double>(recent) / static_cast<double>(g.heavy_hitters().size()) > 0.4);
  }

  SECTION("without drift the set never changes") {
    selection_params q = p;
    q.drift_rate = 0;
    selection_generator s(q, 21);
    draw(s, long_history);
    const std::vector<row_index> h0(s.heavy_hitters().begin(), s.heavy_hitters().end());
    for (int t = 1; t <= 50; ++t) draw(s, long_history + t);
    REQUIRE(std::vector<row_index>(s.heavy_hitters().begin(), s.heavy_hitters().end()) == h0);
  }
}

TEST_CASE("selection_generator: heavy hitters grow with a short history", "[selection_generator]") {
  selection_params p;
  p.top_k = 64;
  p.recent_window = 32;
  selection_generator g(p, 8);
  draw(g, 10);
  REQUIRE(g.heavy_hitters().size() <= 5);  // at most half the history
  for (std::int64_t f = 11; f < 2000; ++f) check_well_formed(draw(g, f), f);
  REQUIRE(g.heavy_hitters().size() == g.heavy_hitter_target());
  for (row_index r : g.heavy_hitters()) REQUIRE(r < 2000);
}

TEST_CASE("selection_generator: miss-target mode hits its fresh share", "[selection_generator][miss]") {
  selection_params p;
  p.top_k = 2048;
  selection_generator g(p, 31);
  std::vector<row_index> out(p.top_k);
  for (int t = 0; t < 3; ++t) g.next(long_history + t, out);  // warm-up: something to be cheap

  for (double share : {0.0, 0.05, 0.2, 0.5, 1.0}) {
    for (std::size_t lookback : {1u, 2u, 4u}) {
      const std::int64_t frontier = long_history + 3;
      const auto s = g.generate_with_miss_target(frontier, out, {share, lookback});
      check_well_formed(out, frontier);
      INFO("share " << share << " lookback " << lookback);
      REQUIRE(s.entries == 2048);
      REQUIRE(s.fresh == static_cast<std::size_t>(std::llround(share * 2048)));
    }
  }
}

TEST_CASE("selection_generator: fresh rows are not in the last N selections", "[selection_generator][miss]") {
  selection_params p;
  p.top_k = 512;
  p.recent_window = 1024;
  selection_generator g(p, 77);
  std::vector<row_index> out(p.top_k);
  std::vector<std::vector<row_index>> history;
  for (int t = 0; t < 6; ++t) {
    g.next(50'000 + t, out);
    history.push_back(out);
  }
  const std::size_t lookback = 3;
  const auto s = g.generate_with_miss_target(50'006, out, {0.25, lookback});
  std::unordered_set<row_index> recent;
  for (std::size_t j = history.size() - lookback; j < history.size(); ++j)
    recent.insert(history[j].begin(), history[j].end());
  std::size_t fresh = 0;
  for (row_index r : out) fresh += recent.contains(r) ? 0 : 1;
  REQUIRE(fresh == s.fresh);
  REQUIRE(fresh == 128);
  // The generator remembers what it emitted.
  REQUIRE(g.selected_within(out[0], 1));
  REQUIRE(g.steps() == 7);
}

TEST_CASE("selection_generator: miss-target mode with the caller's cheap predicate", "[selection_generator][miss]") {
  selection_params p;
  p.top_k = 256;
  p.recent_window = 512;
  selection_generator g(p, 5);
  std::vector<row_index> out(p.top_k);
  const std::int64_t frontier = 20'000;
  // "Cheap": the newest 64 rows (the tail) and every row divisible by 7 (say, the hot cache).
  auto cheap = [&](row_index r) { return r >= frontier - 64 || r % 7 == 0; };
  for (int t = 0; t < 5; ++t) {
    const auto s = g.generate_with_miss_target(frontier, out, {0.1, 1}, cheap);
    check_well_formed(out, frontier);
    REQUIRE(s.fresh == 26);  // round(0.1 * 256)
    std::size_t cheap_entries = 0;
    for (row_index r : out) cheap_entries += cheap(r) ? 1 : 0;
    REQUIRE(cheap_entries == 256 - 26);
  }

  SECTION("with too few cheap rows the fresh side fills in and says so") {
    selection_generator h(p, 6);
    auto nothing_cheap = [](row_index) { return false; };
    const auto s = h.generate_with_miss_target(frontier, out, {0.1, 0}, nothing_cheap);
    check_well_formed(out, frontier);
    REQUIRE(s.entries == 256);
    REQUIRE(s.fresh == 256);
  }
}

TEST_CASE("selection_generator: invalid use throws typed errors", "[selection_generator]") {
  selection_params p;
  p.recent_share = 0.7;
  p.random_share = 0.5;
  REQUIRE_THROWS_AS(selection_generator(p, 1), invalid_configuration);
  p = {};
  p.top_k = 0;
  REQUIRE_THROWS_AS(selection_generator(p, 1), invalid_configuration);
  p = {};
  p.heavy_select_probability = 0;
  REQUIRE_THROWS_AS(selection_generator(p, 1), invalid_configuration);
  p = {};
  p.recent_concentration = 0.5;
  REQUIRE_THROWS_AS(selection_generator(p, 1), invalid_configuration);

  selection_generator g(selection_params{}, 1);
  std::vector<row_index> short_out(100);
  REQUIRE_THROWS_AS(g.next(1000, short_out), size_mismatch);
  std::vector<row_index> out(2048);
  REQUIRE_THROWS_AS(g.next(-1, out), position_out_of_range);
  REQUIRE_THROWS_AS(g.generate_with_miss_target(1000, out, {1.5, 1}), invalid_configuration);
  REQUIRE_THROWS_AS(g.generate_with_miss_target(1000, out, {0.5, 5}), invalid_configuration);  // remembers 4
  REQUIRE(g.steps() == 0);
}

TEST_CASE("selection_batch: one independent stream per request", "[selection_generator][batch]") {
  selection_params p;
  p.top_k = 128;
  p.recent_window = 256;
  constexpr std::size_t streams = 5;
  selection_batch batch(p, 99, streams);
  std::vector<selection_generator> alone;
  for (std::size_t i = 0; i < streams; ++i) alone.emplace_back(p, stream_seed(99, i));
  std::vector<std::int64_t> frontiers{10, 200, 5000, 70'000, 128};
  std::vector<row_index> out(streams * p.top_k);
  for (int t = 0; t < 5; ++t) {
    const std::size_t entries = batch.next(frontiers, out);
    std::size_t expected = 0;
    for (std::int64_t f : frontiers) expected += static_cast<std::size_t>(std::min<std::int64_t>(f, 128));
    REQUIRE(entries == expected);
    for (std::size_t i = 0; i < streams; ++i) {
      const std::vector<row_index> mine(out.begin() + static_cast<std::ptrdiff_t>(i * p.top_k),
                                        out.begin() + static_cast<std::ptrdiff_t>((i + 1) * p.top_k));
      REQUIRE(mine == draw(alone[i], frontiers[i]));
      check_well_formed(mine, frontiers[i]);
    }
    for (auto& f : frontiers) ++f;
  }
  REQUIRE(stream_seed(99, 0) != stream_seed(99, 1));
  std::vector<std::int64_t> wrong(streams - 1, 100);
  REQUIRE_THROWS_AS(batch.next(wrong, out), size_mismatch);

  SECTION("miss-target mode over the batch") {
    const auto s = batch.generate_with_miss_target(frontiers, out, {0.5, 1},
                                                   [](std::size_t, row_index r) { return r % 2 == 0; });
    REQUIRE(s.entries == 15 + 4 * 128);
  }
}

TEST_CASE("selection_generator: selections drive the host hierarchy", "[selection_generator][hierarchy]") {
  // A miniature decode_demo: generated selections are valid resolver input, and every returned
  // location holds the row's bytes.
  using hierarchy = host_hierarchy<layouts::demo, lru_hot_cache<512>>;
  constexpr std::size_t requests = 2, history = 2048, steps = 10;
  hierarchy h(hierarchy_config{.max_requests = requests, .max_rows = history + steps});
  selection_params p;
  p.top_k = layouts::demo::top_k;
  p.recent_window = 256;
  std::vector<selection_batch> gens;
  for (std::size_t s = 0; s < hierarchy::sources; ++s) gens.emplace_back(p, stream_seed(3, s), requests);
  // Every byte of a row is a function of (request, source, layer, row): a wrong row fails bit for bit.
  auto append = [&](std::size_t r, std::size_t s, std::int64_t first, std::size_t count) {
    const std::size_t layers = layouts::demo::sources[s].payload_layers, bytes = layouts::demo::payload_row_bytes;
    const auto buf = dhisparse_testing::make_append_buffer(dhisparse_testing::request_tag(r), s, layers, bytes,
                                                           first, count);
    h.append(r, s, buf, count);
  };
  for (std::size_t r = 0; r < requests; ++r) {
    REQUIRE(h.admit(r));
    for (std::size_t s = 0; s < hierarchy::sources; ++s) append(r, s, 0, history);
  }
  std::vector<row_index> sel(requests * p.top_k);
  std::vector<location> loc(requests * p.top_k);
  resolve_stats total;
  for (std::size_t step = 0; step < steps; ++step) {
    for (std::size_t s = 0; s < hierarchy::sources; ++s) {
      std::vector<std::int64_t> frontiers;
      for (std::size_t r = 0; r < requests; ++r) frontiers.push_back(h.frontier(r, s));
      gens[s].next(frontiers, sel);
      std::vector<resolve_item> batch;
      for (std::size_t r = 0; r < requests; ++r)
        batch.push_back({r, std::span<const row_index>(sel).subspan(r * p.top_k, p.top_k),
                         std::span<location>(loc).subspan(r * p.top_k, p.top_k)});
      total += h.resolve(s, batch, copy_layers::producer_only);
      for (std::size_t l = 1; l < layouts::demo::sources[s].payload_layers; ++l) h.copy_follower(s, l);
      for (std::size_t r = 0; r < requests; ++r)
        for (std::size_t i = 0; i < p.top_k; ++i)
          for (std::size_t l = 0; l < layouts::demo::sources[s].payload_layers; ++l)
            if (!dhisparse_testing::row_matches(h.payload(s, l, loc[r * p.top_k + i]),
                                                dhisparse_testing::request_tag(r), s, l, sel[r * p.top_k + i])) {
              INFO(dhisparse_testing::describe_row_mismatch(h.payload(s, l, loc[r * p.top_k + i]),
                                                            dhisparse_testing::request_tag(r), s, l,
                                                            sel[r * p.top_k + i]));
              REQUIRE(false);
            }
    }
    for (std::size_t r = 0; r < requests; ++r)
      for (std::size_t s = 0; s < hierarchy::sources; ++s) append(r, s, h.frontier(r, s), 1);
  }
  REQUIRE(total.selected == steps * hierarchy::sources * requests * p.top_k);
  REQUIRE(total.host > 0);
  REQUIRE(total.hot > total.host);  // heavy hitters and the recent window stay in the hot cache
}

TEST_CASE("selection_generator: cost of a 128-request step at k = 2048", "[.perf][selection_generator]") {
  // Hidden (run with "[.perf]"): prints the cost per 2048-entry selection.
  const selection_params p;
  constexpr std::size_t requests = 128;
  selection_batch batch(p, 1, requests);
  std::vector<std::int64_t> frontiers(requests, long_history);
  std::vector<row_index> out(requests * p.top_k);
  batch.next(frontiers, out);
  constexpr int steps = 20;
  auto t0 = std::chrono::steady_clock::now();
  for (int t = 0; t < steps; ++t) {
    for (auto& f : frontiers) ++f;
    batch.next(frontiers, out);
  }
  const double natural_us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / (steps * requests);
  t0 = std::chrono::steady_clock::now();
  for (int t = 0; t < steps; ++t) {
    for (auto& f : frontiers) ++f;
    batch.generate_with_miss_target(frontiers, out, {0.2, 2});
  }
  const double miss_us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / (steps * requests);
  std::printf("selection_generator, k = 2048, 128 requests: next %.1f us, generate_with_miss_target %.1f us "
              "per selection\n",
              natural_us, miss_us);
  CHECK(natural_us < 1000.0);
  CHECK(miss_us < 1000.0);
}
