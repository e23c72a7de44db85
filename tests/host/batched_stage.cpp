// Batched speculative stages on the host reference hierarchy (the twin of the CUDA backend's
// stage_view / stage_step_view launches): `stage_blocks` and `stage_step` against a second
// hierarchy driven by per-request `stage_block` calls, then verify and commit on both.
//
// Expected values come from the test's own model: each round stages blocks whose rows are a
// function of (request, round, source, layer, row) (support/row_content.hpp), so a row that was
// not written by the latest stage cannot pass; the model records which round completed each
// history row and where each ring row lives ([hot N x B | tail N x (T + K_max) | ...]). A bad
// batch must throw its typed error and leave both the books and every byte unchanged.
#include "../support/catch.hpp"

#include <dhisparse/host/hierarchy.hpp>
#include <dhisparse/layouts/tiny.hpp>

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
using dhisparse_testing::request_tag;
using dhisparse_testing::row_matches;

constexpr std::size_t kN = 6, kRows = 96, kT = 8, kB = 16, kK = 4;

hierarchy_config config() {
  hierarchy_config c;
  c.max_requests = kN;
  c.max_rows = kRows;
  c.tail_rows = kT;
  c.optional_pages = 4;
  c.max_block = kK;
  return c;
}

/// tiny with source 1 packing 2 positions per stored row (a partial boundary row stays in the tail).
struct packed {
  static constexpr std::size_t top_k = 16;
  static constexpr std::size_t page_rows = 8;
  static constexpr std::array<source_desc, 2> sources{{{64, 1, 2, 32}, {32, 2, 1, 32}}};
  static constexpr std::array<consumer_desc, 3> consumers{{
      {0, consumer_kind::reindex, 0}, {0, consumer_kind::follower, 1}, {1, consumer_kind::reindex, 0}}};
};

/// Content tag of the block a request stages in `round` (0: never staged).
std::uint64_t round_tag(request_id id, int round) { return request_tag(id, static_cast<std::uint64_t>(round) + 1); }

/// Tail location of `row` of a slot (ring of T + K_max rows after N x B hot rows).
location tail_location(std::size_t slot, std::int64_t row) {
  constexpr std::size_t ring = kT + kK;
  return static_cast<location>(kN * kB + slot * ring + static_cast<std::size_t>(row) % ring);
}

/// Both hierarchies hold the same bytes everywhere (pools, staging, host rows) and the same books.
template <class H>
void check_same(const H& a, const H& b, std::span<const request_id> ids) {
  for (std::size_t s = 0; s < H::sources; ++s) {
    REQUIRE(a.free_host_pages(s) == b.free_host_pages(s));
    for (std::size_t l = 0; l < H::layout::sources[s].payload_layers; ++l)
      for (location loc = 0; loc < static_cast<location>(a.space().rows()); ++loc) {
        const auto x = a.payload(s, l, loc), y = b.payload(s, l, loc);
        INFO("source " << s << " layer " << l << " location " << loc);
        REQUIRE(std::equal(x.begin(), x.end(), y.begin(), y.end()));
      }
    for (request_id id : ids) {
      REQUIRE(a.frontier(id, s) == b.frontier(id, s));
      REQUIRE(a.positions(id, s) == b.positions(id, s));
      REQUIRE(a.staged_rows(id, s) == b.staged_rows(id, s));
      REQUIRE(a.verified_queries(id, s) == b.verified_queries(id, s));
      for (std::size_t l = 0; l < H::layout::sources[s].payload_layers; ++l)
        for (std::int64_t r = 0; r < a.frontier(id, s); ++r) {
          const auto x = a.host_row(id, s, l, r), y = b.host_row(id, s, l, r);
          REQUIRE(std::equal(x.begin(), x.end(), y.begin(), y.end()));
        }
    }
  }
}

/// The rounds of one layout: stage (batched on `a`, per request on `b`), verify, commit on both.
template <class L>
void run_rounds(std::uint64_t seed) {
  using H = host_hierarchy<L, lru_hot_cache<kB>>;
  H a(config()), b(config());
  const std::vector<request_id> ids{3, 5, 8, 13, 21};
  std::map<request_id, std::array<std::int64_t, 2>> positions;  // the model's committed positions
  std::map<std::pair<request_id, std::size_t>, std::vector<std::uint64_t>> row_tag;  // tag of each history row
  for (request_id id : ids) {
    REQUIRE(a.admit(id).slot == b.admit(id).slot);
    positions[id] = {0, 0};
    for (std::size_t s = 0; s < 2; ++s) row_tag[{id, s}] = {};
  }
  std::mt19937_64 rng(seed);
  std::map<std::pair<request_id, std::size_t>, int> staged_round;  // round of the staged block, if any
  for (int round = 0; round < 60; ++round) {
    for (std::size_t s = 0; s < 2; ++s) {
      const auto& d = L::sources[s];
      const auto m = static_cast<std::int64_t>(d.positions_per_row);
      std::vector<std::vector<std::byte>> buffers;
      std::vector<stage_item> items;
      std::map<request_id, std::size_t> counts;
      for (request_id id : ids) {
        if (rng() % 4 == 0) continue;  // not staging this round (an older block may stay staged)
        const std::int64_t n = positions[id][s];
        if (n + static_cast<std::int64_t>(kK) > static_cast<std::int64_t>(kRows) * m) continue;  // full
        const std::size_t count = 1 + rng() % kK;
        const std::size_t rows = a.block_rows(id, s, count);
        REQUIRE(rows == static_cast<std::size_t>(((n % m) + static_cast<std::int64_t>(count) - 1) / m + 1));
        buffers.push_back(make_append_buffer(round_tag(id, round), s, d.payload_layers, d.row_bytes, n / m, rows));
        counts[id] = count;
      }
      std::size_t at = 0;
      for (const auto& [id, count] : counts) items.push_back({id, buffers[at++], count});
      std::shuffle(items.begin(), items.end(), rng);  // any order: the requests are distinct
      a.stage_blocks(s, items);
      for (const auto& item : items) b.stage_block(item.request, s, item.rows, item.count);
      for (const auto& item : items) {
        staged_round[{item.request, s}] = round;
        REQUIRE(a.staged_rows(item.request, s) == item.count);
        // The model: the block rows sit in the ring at their own rows, with this round's bytes.
        const std::int64_t f = positions[item.request][s] / m;
        for (std::size_t l = 0; l < d.payload_layers; ++l)
          for (std::int64_t i = 0; i < static_cast<std::int64_t>(a.block_rows(item.request, s, item.count)); ++i) {
            INFO("request " << item.request << " source " << s << " layer " << l << " block row " << f + i);
            REQUIRE(row_matches(a.payload(s, l, tail_location(a.slot_of(item.request), f + i)),
                                round_tag(item.request, round), s, l, f + i));
          }
      }
      check_same(a, b, ids);

      // Verify every staged request (fresh blocks and older ones) on both, with the same queries.
      std::vector<request_id> vids;
      for (request_id id : ids)
        if (a.staged_rows(id, s) > 0 && a.verified_queries(id, s) == 0 && rng() % 5 != 0) vids.push_back(id);
      std::vector<std::vector<std::vector<row_index>>> sel(vids.size());
      std::vector<std::vector<std::vector<location>>> la(vids.size()), lb(vids.size());
      std::vector<std::vector<std::span<const row_index>>> qs(vids.size());
      std::vector<std::vector<std::span<location>>> sa(vids.size()), sb(vids.size());
      std::vector<verify_item> va, vb;
      for (std::size_t e = 0; e < vids.size(); ++e) {
        const request_id id = vids[e];
        const std::int64_t n = positions[id][s];
        const std::size_t kr = 1 + rng() % a.staged_rows(id, s);
        for (std::size_t j = 0; j < kr; ++j) {
          const std::int64_t visible = (n + static_cast<std::int64_t>(j) + 1) / m;  // complete rows at n + j
          std::vector<row_index> q(1 + rng() % L::top_k, -1);
          for (auto& x : q)
            if (visible > 0 && rng() % 6 != 0) x = static_cast<row_index>(rng() % static_cast<std::uint64_t>(visible));
          std::sort(q.begin(), q.end());
          q.erase(std::unique(q.begin(), q.end()), q.end());
          sel[e].push_back(q);
          la[e].emplace_back(q.size());
          lb[e].emplace_back(q.size());
        }
        for (std::size_t j = 0; j < kr; ++j) {
          qs[e].push_back(sel[e][j]);
          sa[e].push_back(la[e][j]);
          sb[e].push_back(lb[e][j]);
        }
        va.push_back({id, qs[e], sa[e]});
        vb.push_back({id, qs[e], sb[e]});
      }
      if (!va.empty()) {
        a.verify(s, va);
        b.verify(s, vb);
        for (std::size_t e = 0; e < vids.size(); ++e) {
          REQUIRE(la[e] == lb[e]);
          for (std::size_t j = 0; j < la[e].size(); ++j)
            for (std::size_t i = 0; i < la[e][j].size(); ++i) {
              const row_index r = sel[e][j][i];
              if (r < 0) continue;
              // A row of the history holds the bytes of the round that completed it; a block row
              // (only the packed boundary row can be seen here) those of the staged round.
              const auto& hist = row_tag[{vids[e], s}];
              const std::uint64_t tag = static_cast<std::size_t>(r) < hist.size()
                                            ? hist[static_cast<std::size_t>(r)]
                                            : round_tag(vids[e], staged_round[{vids[e], s}]);
              for (std::size_t l = 0; l < d.payload_layers; ++l)
                REQUIRE(row_matches(a.payload(s, l, la[e][j][i]), tag, s, l, r));
            }
        }
      }

      // Commit most verified rounds: a batched commit on `a`, per-request commits on `b`.
      std::vector<commit_item> commits;
      for (request_id id : vids) {
        if (rng() % 6 == 0) continue;  // verified but not committed: the next stage replaces it
        const std::size_t acc = rng() % a.verified_queries(id, s);
        commits.push_back({id, acc});
        const std::int64_t before = positions[id][s] / m;
        positions[id][s] += static_cast<std::int64_t>(acc) + 1;
        auto& hist = row_tag[{id, s}];
        for (std::int64_t r = before; r < positions[id][s] / m; ++r) hist.push_back(round_tag(id, staged_round[{id, s}]));
        staged_round.erase({id, s});
      }
      a.reserve_ahead(2 * kK);
      b.reserve_ahead(2 * kK);
      a.commit(s, commits);
      for (const auto& c : commits) b.commit(c.request, s, c.accepted);
      check_same(a, b, ids);
      for (request_id id : ids) {
        INFO("request " << id << " source " << s << " round " << round);
        REQUIRE(a.positions(id, s) == positions[id][s]);
        const auto& hist = row_tag[{id, s}];
        REQUIRE(a.frontier(id, s) == static_cast<std::int64_t>(hist.size()));
        for (std::size_t l = 0; l < d.payload_layers; ++l)
          for (std::size_t r = 0; r < hist.size(); ++r)
            REQUIRE(row_matches(a.host_row(id, s, l, static_cast<std::int64_t>(r)), hist[r], s, l,
                                static_cast<std::int64_t>(r)));
      }
    }
  }
}

}  // namespace

TEST_CASE("stage_blocks equals per-request stage_block, then verify and commit agree (m = 1)", "[speculative][stage]") {
  run_rounds<layouts::tiny>(7);
}

TEST_CASE("stage_blocks equals per-request stage_block on a packed source (m = 2)", "[speculative][stage]") {
  run_rounds<packed>(11);
}

TEST_CASE("a bad stage_blocks batch throws its typed error and changes nothing", "[speculative][stage]") {
  using L = packed;
  using H = host_hierarchy<L, lru_hot_cache<kB>>;
  H a(config()), b(config());
  const std::vector<request_id> ids{1, 2, 3};
  for (request_id id : ids) {
    REQUIRE(a.admit(id).admitted);
    REQUIRE(b.admit(id).admitted);
  }
  // Request 3 is 2 positions short of capacity on source 0 (m = 1, 2 layers of 64 B): 94 rows stored.
  for (H* h : {&a, &b}) {
    h->append(3, 0, make_append_buffer(request_tag(3), 0, 2, 64, 0, 94), 94);
    // A staged block on request 1 that a bad batch must leave in place.
    h->stage_block(1, 0, make_append_buffer(request_tag(1, 9), 0, 2, 64, 0, 2), 2);
  }
  const auto block = [](request_id id, std::int64_t first, std::size_t rows) {
    return make_append_buffer(request_tag(id, 1), 0, 2, 64, first, rows);
  };
  const auto good1 = block(1, 0, 3), good2 = block(2, 0, 2);
  const auto check_rejected = [&](std::vector<stage_item> items, errc code) {
    bool thrown = false;
    try {
      a.stage_blocks(0, items);
    } catch (const error& e) {
      thrown = true;
      INFO(e.what());
      REQUIRE(e.code() == code);
    }
    REQUIRE(thrown);
    check_same(a, b, ids);  // b never saw the batch
    REQUIRE(a.staged_rows(1, 0) == 2);
    REQUIRE(a.staged_rows(2, 0) == 0);
  };
  // Each batch holds good items before the bad one: none of them may be staged.
  check_rejected({{1, good1, 3}, {2, good2, 2}, {7, good2, 2}}, errc::unknown_request);
  check_rejected({{1, good1, 3}, {2, good2, 2}, {1, good1, 3}}, errc::duplicate_in_batch);
  check_rejected({{1, good1, 3}, {2, {}, 0}}, errc::size_mismatch);
  check_rejected({{1, good1, 3}, {2, block(2, 0, kK + 1), kK + 1}}, errc::block_too_wide);
  check_rejected({{1, good1, 3}, {2, block(2, 0, 3), 2}}, errc::size_mismatch);  // 3 rows for 2 positions
  check_rejected({{1, good1, 3}, {3, block(3, 94, 3), 3}}, errc::capacity_exceeded);
  REQUIRE_THROWS_AS(a.stage_blocks(2, std::vector<stage_item>{{1, good1, 3}}), invalid_source);
  // Without speculation the call is refused as stage_block is.
  hierarchy_config plain = config();
  plain.max_block = 1;
  H p(plain);
  REQUIRE(p.admit(1).admitted);
  REQUIRE_THROWS_AS(p.stage_blocks(0, std::vector<stage_item>{{1, block(1, 0, 1), 1}}), invalid_configuration);

  // The good batch then stages everything it holds, replacing request 1's block.
  a.stage_blocks(0, std::vector<stage_item>{{1, good1, 3}, {2, good2, 2}, {3, block(3, 94, 2), 2}});
  b.stage_block(1, 0, good1, 3);
  b.stage_block(2, 0, good2, 2);
  b.stage_block(3, 0, block(3, 94, 2), 2);
  check_same(a, b, ids);
  REQUIRE(a.staged_rows(1, 0) == 3);
}

TEST_CASE("stage_step equals the per-source stage_blocks of its items", "[speculative][stage][step]") {
  using L = packed;
  using H = host_hierarchy<L, lru_hot_cache<kB>>;
  H a(config()), b(config());
  const std::vector<request_id> ids{4, 6};
  for (request_id id : ids) {
    REQUIRE(a.admit(id).admitted);
    REQUIRE(b.admit(id).admitted);
    for (H* h : {&a, &b})
      for (std::size_t s = 0; s < 2; ++s) {
        const auto& d = L::sources[s];
        const std::size_t rows = s == 0 ? 5 : 7;
        h->append(id, s, make_append_buffer(request_tag(id), s, d.payload_layers, d.row_bytes, 0, rows), rows);
      }
  }
  std::vector<std::vector<std::byte>> bufs;
  std::vector<step_stage_item> items;
  std::vector<stage_item> per_source[2];
  for (request_id id : ids)
    for (std::size_t s = 0; s < 2; ++s) {
      const auto& d = L::sources[s];
      const std::size_t count = id == 4 ? 3 : 4;
      bufs.push_back(make_append_buffer(request_tag(id, 5), s, d.payload_layers, d.row_bytes, a.frontier(id, s),
                                        a.block_rows(id, s, count)));
    }
  std::size_t at = 0;
  for (request_id id : ids)
    for (std::size_t s = 0; s < 2; ++s) {
      const std::size_t count = id == 4 ? 3 : 4;
      items.push_back({id, s, bufs[at], count});
      per_source[s].push_back({id, bufs[at], count});
      ++at;
    }
  // A bad item (the same (request, source) twice) changes nothing.
  auto dup = items;
  dup.push_back(items.front());
  REQUIRE_THROWS_AS(a.stage_step(dup), duplicate_in_batch);
  check_same(a, b, ids);
  auto bad_source = items;
  bad_source.push_back({4, 2, bufs[0], 3});
  REQUIRE_THROWS_AS(a.stage_step(bad_source), invalid_source);
  check_same(a, b, ids);

  a.stage_step(items);
  for (std::size_t s = 0; s < 2; ++s) b.stage_blocks(s, per_source[s]);
  check_same(a, b, ids);
  for (request_id id : ids)
    for (std::size_t s = 0; s < 2; ++s) REQUIRE(a.staged_rows(id, s) == (id == 4 ? 3u : 4u));
}

TEST_CASE("stage_blocks needs no staging arenas: it runs while another source holds them", "[speculative][stage]") {
  using L = layouts::tiny;
  using H = host_hierarchy<L, lru_hot_cache<kB>, fixed_budget_policy, staging_arenas<2>>;
  H h(config());
  REQUIRE(h.admit(1).admitted);
  h.append(1, 0, make_append_buffer(request_tag(1), 0, 2, 64, 0, 4), 4);
  h.append(1, 1, make_append_buffer(request_tag(1), 1, 1, 32, 0, 4), 4);
  for (std::size_t s = 0; s < 2; ++s) {
    const auto& d = L::sources[s];
    const auto rows = make_append_buffer(request_tag(1, 2), s, d.payload_layers, d.row_bytes, 4, 2);
    h.stage_blocks(s, std::vector<stage_item>{{1, rows, 2}});
  }
  std::vector<row_index> q{0, 1};
  std::vector<location> loc(2);
  const std::array<std::span<const row_index>, 1> qs{q};
  const std::array<std::span<location>, 1> ls{loc};
  h.verify(1, 0, qs, ls);
  REQUIRE(h.staging_holder() == std::optional<std::size_t>(0));
  // Source 1 restages while source 0 holds the arenas; its verify waits for the release.
  const auto again = make_append_buffer(request_tag(1, 3), 1, 1, 32, 4, 3);
  h.stage_blocks(1, std::vector<stage_item>{{1, again, 3}});
  REQUIRE(h.staging_holder() == std::optional<std::size_t>(0));
  REQUIRE_THROWS_AS(h.verify(1, 1, qs, ls), staging_in_use);
  h.release_staging(0);
  std::vector<location> l1(2), l2(2), l3(2);
  const std::array<std::span<const row_index>, 3> qs3{q, q, q};
  const std::array<std::span<location>, 3> ls3{l1, l2, l3};
  h.verify(1, 1, qs3, ls3);
  h.commit(1, 1, 2);
  REQUIRE(h.positions(1, 1) == 7);
  for (std::int64_t r = 4; r < 7; ++r) REQUIRE(row_matches(h.host_row(1, 1, 0, r), request_tag(1, 3), 1, 0, r));
}
