// Step-wide writes and commits on the host reference hierarchy (`append_step`, `commit_step`: the
// executable spec of the CUDA backend's one-launch-per-step kv_step_write_view / commit_step_view).
//
// Every expected value comes from the test's own model: row contents are a function of (request
// tag, source, layer, row) (support/row_content.hpp), frontiers and positions are counted here,
// tail locations are computed from the pool geometry the test states, and step_layer_index is
// checked against a prefix sum written out by hand. The step-wide calls are also compared, byte
// for byte, with a second hierarchy driven by the per-source batched calls. Errors are checked to
// leave every byte and every book unchanged, with the bad item last so that a call that applied
// items before validating all of them would be caught.
#include "../support/catch.hpp"

#include <dhisparse/host/hierarchy.hpp>
#include <dhisparse/host/residency_manager.hpp>
#include <dhisparse/layouts/glm53.hpp>
#include <dhisparse/layouts/tiny.hpp>
#include <dhisparse/step_handle.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <random>
#include <span>
#include <vector>

#include "../support/row_content.hpp"

namespace {

using namespace dhisparse;
using dhisparse_testing::make_append_buffer;
using dhisparse_testing::row_matches;

constexpr std::size_t kN = 6, kRows = 96, kT = 8, kB = 16;

/// tiny with source 1 packing 2 positions per stored row (a partial boundary row stays in the tail),
/// plus a third source of 48-byte rows in 3 payload layers.
struct three {
  static constexpr std::size_t top_k = 16;
  static constexpr std::size_t page_rows = 8;
  static constexpr std::array<source_desc, 3> sources{{{64, 1, 2, 32}, {32, 2, 1, 32}, {48, 1, 3, 32}}};
  static constexpr std::array<consumer_desc, 6> consumers{{{0, consumer_kind::reindex, 0},
                                                           {0, consumer_kind::follower, 1},
                                                           {1, consumer_kind::reindex, 0},
                                                           {2, consumer_kind::reindex, 0},
                                                           {2, consumer_kind::follower, 1},
                                                           {2, consumer_kind::follower, 2}}};
};
static_assert(check_layout<three>());

using H = host_hierarchy<three, lru_hot_cache<kB>>;
constexpr std::size_t kSources = 3;

hierarchy_config config(std::size_t max_block = 1) {
  hierarchy_config c;
  c.max_requests = kN;
  c.max_rows = kRows;
  c.tail_rows = kT;
  c.optional_pages = 4;
  c.max_block = max_block;
  return c;
}

std::uint64_t tag_of(request_id id) { return dhisparse_testing::request_tag(id); }

/// Tail location of `row` of a slot, from the geometry: [hot N x B | tail N x ring | ...].
location tail_location(std::size_t slot, std::int64_t row, std::size_t ring) {
  return static_cast<location>(kN * kB + slot * ring + static_cast<std::size_t>(row) % ring);
}

using model_t = std::map<request_id, std::array<std::int64_t, kSources>>;

/// Every stored row's host copy and every tail-window row's pool bytes against the byte model.
void check_against_model(const H& h, const model_t& frontier, std::size_t ring) {
  for (const auto& [id, f] : frontier)
    for (std::size_t s = 0; s < kSources; ++s) {
      REQUIRE(h.frontier(id, s) == f[s]);
      const auto& d = three::sources[s];
      for (std::size_t l = 0; l < d.payload_layers; ++l)
        for (std::int64_t r = 0; r < f[s]; ++r) {
          INFO("request " << id << " source " << s << " layer " << l << " row " << r);
          REQUIRE(row_matches(h.host_row(id, s, l, r), tag_of(id), s, l, r));
          if (r >= f[s] - static_cast<std::int64_t>(kT))
            REQUIRE(row_matches(h.payload(s, l, tail_location(h.slot_of(id), r, ring)), tag_of(id), s, l, r));
        }
    }
}

/// Everything a call may change: pool bytes, stored host rows, books.
struct state {
  std::vector<std::vector<std::byte>> pools;
  std::vector<std::vector<std::byte>> host;
  std::vector<std::int64_t> books;
  friend bool operator==(const state&, const state&) = default;
};
state snapshot(const H& h, std::span<const request_id> ids) {
  state st;
  for (std::size_t s = 0; s < kSources; ++s) {
    st.books.push_back(static_cast<std::int64_t>(h.free_host_pages(s)));
    for (std::size_t l = 0; l < three::sources[s].payload_layers; ++l) {
      std::vector<std::byte> pool;
      for (location loc = 0; loc < static_cast<location>(h.space().rows()); ++loc) {
        const auto x = h.payload(s, l, loc);
        pool.insert(pool.end(), x.begin(), x.end());
      }
      st.pools.push_back(std::move(pool));
    }
    for (request_id id : ids) {
      st.books.push_back(h.frontier(id, s));
      st.books.push_back(h.positions(id, s));
      st.books.push_back(h.reserved_rows(id, s));
      st.books.push_back(static_cast<std::int64_t>(h.staged_rows(id, s)));
      st.books.push_back(static_cast<std::int64_t>(h.verified_queries(id, s)));
      for (std::size_t l = 0; l < three::sources[s].payload_layers; ++l)
        for (std::int64_t r = 0; r < h.frontier(id, s); ++r) {
          const auto x = h.host_row(id, s, l, r);
          st.host.emplace_back(x.begin(), x.end());
        }
    }
  }
  return st;
}

/// Both hierarchies hold the same bytes everywhere and the same books.
void check_same(const H& a, const H& b, std::span<const request_id> ids) { REQUIRE(snapshot(a, ids) == snapshot(b, ids)); }

/// Stages a block of `count` positions (the model's row contents) and verifies `kr` empty queries.
void stage_verify(H& h, request_id id, std::size_t s, std::size_t count, std::size_t kr) {
  const auto& d = three::sources[s];
  const std::size_t nrows = h.block_rows(id, s, count);
  std::vector<std::byte> rows(d.payload_layers * nrows * d.row_bytes);
  dhisparse_testing::fill_append_buffer(rows, tag_of(id), s, d.payload_layers, d.row_bytes, h.frontier(id, s), nrows);
  h.stage_block(id, s, rows, count);
  std::vector<std::vector<row_index>> q(kr);
  std::vector<std::vector<location>> loc(kr);
  std::vector<std::span<const row_index>> qs(q.begin(), q.end());
  std::vector<std::span<location>> ls(loc.begin(), loc.end());
  const verify_item vi{id, qs, ls};
  h.verify(s, std::span<const verify_item>(&vi, 1));
}

}  // namespace

TEST_CASE("step_layer_index is the prefix sum of payload layers", "[writes][step]") {
  STATIC_REQUIRE(step_layers<three> == 6);
  STATIC_REQUIRE(step_layer_index<three>(0, 0) == 0);
  STATIC_REQUIRE(step_layer_index<three>(0, 1) == 1);
  STATIC_REQUIRE(step_layer_index<three>(1, 0) == 2);
  STATIC_REQUIRE(step_layer_index<three>(2, 0) == 3);
  STATIC_REQUIRE(step_layer_index<three>(2, 2) == 5);
  STATIC_REQUIRE(step_layer_index<three>(2, 3) == step_layers<three>);  // past a source: one past the end
  STATIC_REQUIRE(step_layer_index<three>(3, 0) == step_layers<three>);
  using G = layouts::glm53;
  STATIC_REQUIRE(step_layers<G> == 78);
  std::size_t base = 0;  // the prefix sum, by hand
  for (std::size_t s = 0; s < source_count<G>; ++s)
    for (std::size_t l = 0; l < G::sources[s].payload_layers; ++l) REQUIRE(step_layer_index<G>(s, l) == base++);
  REQUIRE(base == 78);
}

TEST_CASE("append_step equals per-source batched appends and the byte model", "[writes][step]") {
  H step(config()), per_source(config());
  std::mt19937_64 rng(2323);
  model_t model;
  std::vector<request_id> ids;
  request_id next_id = 100;
  auto admit = [&] {
    const request_id id = next_id++;
    REQUIRE(step.admit(id).admitted);
    REQUIRE(per_source.admit(id).admitted);
    model[id] = {0, 0, 0};
    ids.push_back(id);
  };
  for (std::size_t i = 0; i < 5; ++i) admit();

  for (int t = 0; t < 150; ++t) {
    if (t % 8 == 0) {  // the engine's reservation, outside the step
      step.reserve_ahead(24);
      per_source.reserve_ahead(24);
    }
    std::vector<std::vector<std::byte>> bufs;
    bufs.reserve(ids.size() * kSources);
    std::vector<step_write_item> items;
    for (request_id id : ids)
      for (std::size_t s = 0; s < kSources; ++s) {
        if (rng() % 7 == 0) continue;  // this (request, source) writes nothing this step
        const auto& d = three::sources[s];
        const std::size_t room = static_cast<std::size_t>(step.reserved_rows(id, s) - model[id][s]);
        // decode (1 row), a prefill chunk (up to 11 rows: past the 8-row tail window), or nothing
        const std::size_t want = rng() % 9 == 0 ? 1 + rng() % 11 : rng() % 5 == 0 ? 0 : 1;
        const std::size_t count = std::min(want, room);
        bufs.push_back(make_append_buffer(tag_of(id), s, d.payload_layers, d.row_bytes, model[id][s], count));
        items.push_back({id, s, bufs.back(), count});
      }
    std::shuffle(items.begin(), items.end(), rng);  // item order is free, sources interleaved
    step.append_step(items);
    for (std::size_t s = 0; s < kSources; ++s) {
      std::vector<write_item> batch;
      for (const auto& it : items)
        if (it.source == s) batch.push_back({it.request, it.rows, it.count});
      per_source.append(s, batch);
    }
    for (const auto& it : items) model[it.request][it.source] += static_cast<std::int64_t>(it.count);
    for (request_id id : ids)
      for (std::size_t s = 0; s < kSources; ++s) REQUIRE(step.frontier(id, s) == model[id][s]);
    if (t % 29 == 28) {  // completion and admission between steps
      const request_id gone = ids.front();
      step.complete(gone);
      per_source.complete(gone);
      model.erase(gone);
      ids.erase(ids.begin());
      admit();
    }
    if (t % 25 == 0) check_against_model(step, model, kT);
  }
  check_against_model(step, model, kT);
  check_same(step, per_source, ids);
  REQUIRE_FALSE(step.backup_pending());  // the host backend writes host copies at once
  step.join_backup();
}

TEST_CASE("bad step-wide appends throw and change nothing", "[writes][step]") {
  H h(config());
  const std::array<request_id, 2> ids{1, 2};
  for (request_id id : ids) REQUIRE(h.admit(id).admitted);
  h.reserve_ahead(8);
  // some history first, so unchanged bytes are not all zero
  std::vector<std::vector<std::byte>> bufs;
  std::vector<step_write_item> warm;
  for (request_id id : ids)
    for (std::size_t s = 0; s < kSources; ++s) {
      const auto& d = three::sources[s];
      bufs.push_back(make_append_buffer(tag_of(id), s, d.payload_layers, d.row_bytes, 0, 3));
      warm.push_back({id, s, bufs.back(), 3});
    }
  h.append_step(warm);
  auto row = [&](request_id id, std::size_t s, std::size_t count) {
    const auto& d = three::sources[s];
    bufs.push_back(make_append_buffer(tag_of(id), s, d.payload_layers, d.row_bytes, 3, count));
    return std::span<const std::byte>(bufs.back());
  };
  // good items on every source first; the bad one last
  std::vector<step_write_item> good;
  for (request_id id : ids)
    for (std::size_t s = 0; s < kSources; ++s) good.push_back({id, s, row(id, s, 1), 1});
  const state before = snapshot(h, ids);
  auto fails_unchanged = [&](const step_write_item& bad, auto expected) {
    auto batch = good;
    batch.push_back(bad);
    REQUIRE_THROWS_AS(h.append_step(batch), decltype(expected));
    REQUIRE(snapshot(h, ids) == before);
  };
  SECTION("unknown request") { fails_unchanged({7, 0, row(1, 0, 1), 1}, unknown_request{""}); }
  SECTION("source outside the layout") { fails_unchanged({1, 3, row(1, 0, 1), 1}, invalid_source{""}); }
  SECTION("the same (request, source) twice") { fails_unchanged({2, 1, row(2, 1, 1), 1}, duplicate_in_batch{""}); }
  SECTION("byte count of the item's own source") {
    auto batch = std::vector<step_write_item>{good.begin(), good.end() - 1};  // drop (2, source 2)
    batch.push_back({2, 2, row(2, 0, 1), 1});                                // source 0's bytes for source 2
    REQUIRE_THROWS_AS(h.append_step(batch), size_mismatch);
    REQUIRE(snapshot(h, ids) == before);
  }
  SECTION("past the reservation") {
    auto batch = std::vector<step_write_item>{good.begin(), good.end() - 1};  // drop (2, source 2)
    batch.push_back({2, 2, row(2, 2, 6), 6});                                // 3 + 6 > 8 reserved
    REQUIRE_THROWS_AS(h.append_step(batch), capacity_exceeded);
    REQUIRE(snapshot(h, ids) == before);
  }
  SECTION("the same request on different sources is not a duplicate; 0-row items are skipped") {
    auto batch = good;
    batch[0] = {1, 0, {}, 0};
    h.append_step(batch);
    REQUIRE(h.frontier(1, 0) == 3);
    for (std::size_t s = 1; s < kSources; ++s) REQUIRE(h.frontier(1, s) == 4);
    for (std::size_t s = 0; s < kSources; ++s) REQUIRE(h.frontier(2, s) == 4);
    REQUIRE(row_matches(h.host_row(2, 2, 2, 3), tag_of(2), 2, 2, 3));
  }
}

TEST_CASE("commit_step equals per-source batched commits, packed rows included", "[writes][step][speculative]") {
  constexpr std::size_t K = 4;
  H step(config(K)), per_source(config(K));
  const std::vector<request_id> ids{1, 2, 3, 4};
  for (request_id id : ids) {
    REQUIRE(step.admit(id).admitted);
    REQUIRE(per_source.admit(id).admitted);
  }
  std::mt19937_64 rng(55);
  std::map<request_id, std::array<std::int64_t, kSources>> positions;  // the model: committed positions
  for (request_id id : ids) positions[id] = {0, 0, 0};
  for (int round = 0; round < 160; ++round) {
    if (round % 4 == 0) {  // 4 rounds of at most K positions each fit 16 rows
      step.reserve_ahead(16);
      per_source.reserve_ahead(16);
    }
    std::vector<step_commit_item> commits;
    for (request_id id : ids)
      for (std::size_t s = 0; s < kSources; ++s) {
        if (rng() % 5 == 0) continue;  // not in this round
        if (step.frontier(id, s) + static_cast<std::int64_t>(K) >= static_cast<std::int64_t>(kRows)) continue;
        const std::size_t count = 1 + rng() % K, kr = 1 + rng() % count;
        stage_verify(step, id, s, count, kr);
        stage_verify(per_source, id, s, count, kr);
        const std::size_t accepted = rng() % kr;
        commits.push_back({id, s, accepted});
        positions[id][s] += static_cast<std::int64_t>(accepted) + 1;
      }
    std::shuffle(commits.begin(), commits.end(), rng);
    step.commit_step(commits);
    for (std::size_t s = 0; s < kSources; ++s) {
      std::vector<commit_item> batch;
      for (const auto& c : commits)
        if (c.source == s) batch.push_back({c.request, c.accepted});
      per_source.commit(s, batch);
    }
    for (request_id id : ids)
      for (std::size_t s = 0; s < kSources; ++s) REQUIRE(step.positions(id, s) == positions[id][s]);
  }
  for (request_id id : ids)
    for (std::size_t s = 0; s < kSources; ++s) {
      const auto m = static_cast<std::int64_t>(three::sources[s].positions_per_row);
      REQUIRE(step.frontier(id, s) == positions[id][s] / m);
      REQUIRE(step.staged_rows(id, s) == 0);
      for (std::size_t l = 0; l < three::sources[s].payload_layers; ++l)
        for (std::int64_t r = 0; r < step.frontier(id, s); ++r)
          REQUIRE(row_matches(step.host_row(id, s, l, r), tag_of(id), s, l, r));
    }
  check_same(step, per_source, ids);
}

TEST_CASE("bad step-wide commits throw and change nothing", "[writes][step][speculative]") {
  H h(config(4));
  const std::array<request_id, 2> ids{1, 2};
  for (request_id id : ids) REQUIRE(h.admit(id).admitted);
  h.reserve_ahead(8);
  for (request_id id : ids)
    for (std::size_t s = 0; s < kSources; ++s) stage_verify(h, id, s, 4, 4);
  std::vector<step_commit_item> good;
  for (std::size_t s = 0; s < kSources; ++s) good.push_back({1, s, 1});
  const state before = snapshot(h, ids);
  auto fails_unchanged = [&](const step_commit_item& bad, auto expected) {
    auto batch = good;
    batch.push_back(bad);
    REQUIRE_THROWS_AS(h.commit_step(batch), decltype(expected));
    REQUIRE(snapshot(h, ids) == before);
  };
  SECTION("unknown request") { fails_unchanged({9, 0, 0}, unknown_request{""}); }
  SECTION("source outside the layout") { fails_unchanged({2, 5, 0}, invalid_source{""}); }
  SECTION("the same (request, source) twice") { fails_unchanged({1, 2, 0}, duplicate_in_batch{""}); }
  SECTION("acceptance beyond the verified block") { fails_unchanged({2, 0, 4}, acceptance_beyond_block{""}); }
  SECTION("commit without verify") {
    h.commit_step(std::array<step_commit_item, 1>{{{2, 1, 0}}});  // closes (2, source 1)'s round
    const state now = snapshot(h, ids);
    auto batch = good;
    batch.push_back({2, 1, 0});
    REQUIRE_THROWS_AS(h.commit_step(batch), commit_without_verify);
    REQUIRE(snapshot(h, ids) == now);
  }
  SECTION("past the reservation") {
    // (2, source 0): commit 4 rows twice would reach 8; stage again and a third reaches 12 > 8
    h.commit_step(std::array<step_commit_item, 1>{{{2, 0, 3}}});
    stage_verify(h, 2, 0, 4, 4);
    h.commit_step(std::array<step_commit_item, 1>{{{2, 0, 3}}});
    stage_verify(h, 2, 0, 4, 4);
    REQUIRE(h.positions(2, 0) == 8);
    const state now = snapshot(h, ids);
    auto batch = good;
    batch.push_back({2, 0, 0});
    REQUIRE_THROWS_AS(h.commit_step(batch), capacity_exceeded);
    REQUIRE(snapshot(h, ids) == now);
  }
  SECTION("without speculation") {
    H plain(config());
    REQUIRE(plain.admit(1).admitted);
    REQUIRE_THROWS_AS(plain.commit_step(std::array<step_commit_item, 1>{{{1, 0, 0}}}), invalid_configuration);
  }
}

TEST_CASE("step_handle forwards commit_step and join_backup; the manager's append_step maps as append does",
          "[writes][step][residency]") {
  using T = layouts::tiny;
  using TH = host_hierarchy<T, lru_hot_cache<16>>;
  hierarchy_config c;
  c.max_requests = 4;
  c.max_rows = 32;
  c.tail_rows = 8;
  c.optional_pages = 40;
  residency_manager<TH, resident_policy> stepped(c, {1, 1}), single(c, {1, 1});
  for (request_id id : {1, 2}) {
    REQUIRE(stepped.admit(id));
    REQUIRE(single.admit(id));
  }
  stepped.reserve_ahead(32);
  std::int64_t f = 0;
  for (std::size_t count : {3u, 6u, 9u, 1u, 13u}) {  // crosses page boundaries: pages get mapped
    std::vector<std::vector<std::byte>> bufs;
    std::vector<step_write_item> items;
    for (request_id id : {1, 2})
      for (std::size_t s = 0; s < source_count<T>; ++s) {
        const auto& d = T::sources[s];
        bufs.push_back(make_append_buffer(tag_of(id), s, d.payload_layers, d.row_bytes, f, count));
        items.push_back({id, s, bufs.back(), count});
        single.append(id, s, bufs.back(), count);
      }
    stepped.append_step(items);
    f += static_cast<std::int64_t>(count);
    for (request_id id : {1, 2})
      for (std::size_t s = 0; s < source_count<T>; ++s) {
        REQUIRE(stepped.hierarchy().frontier(id, s) == f);
        const auto a = stepped.hierarchy().optional_map_of(id, s), b = single.hierarchy().optional_map_of(id, s);
        std::size_t mapped = 0;
        for (std::size_t p = 0; p < a.size(); ++p) mapped += a[p] >= 0 ? 1 : 0;
        REQUIRE(mapped == static_cast<std::size_t>(f) / T::page_rows);  // every complete page, as append maps
        REQUIRE(std::count(b.begin(), b.end(), -1) == std::count(a.begin(), a.end(), -1));
      }
    REQUIRE(stepped.audit().empty());
  }
  REQUIRE(stepped.counters().pages_mapped == single.counters().pages_mapped);
  auto handle = stepped.step();
  REQUIRE_FALSE(handle.backup_pending());
  handle.join_backup();
  REQUIRE_THROWS_AS(handle.commit_step(std::span<const step_commit_item>{}), invalid_configuration);  // max_block 1
}
