// Batched writes and speculative commits on the host reference hierarchy (the twin of the CUDA
// backend's kv_write_view / commit_view launches).
//
// Every expected value comes from the test's own model: row contents are a function of (request
// tag, source, layer, row) (support/row_content.hpp), frontiers and reserved rows are counted here,
// and tail locations are computed from the pool geometry the test states. The batched calls are
// also compared, byte for byte, with a second hierarchy driven by per-request calls.
#include "../support/catch.hpp"

#include <dhisparse/host/hierarchy.hpp>
#include <dhisparse/layouts/deepseek_v32.hpp>
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
using dhisparse_testing::row_matches;
using layout = layouts::tiny;
using host_h = host_hierarchy<layout, lru_hot_cache<16>>;

constexpr std::size_t kN = 6, kRows = 96, kT = 8, kB = 16;

hierarchy_config config(std::size_t max_block = 1, std::size_t host_pages = 0) {
  hierarchy_config c;
  c.max_requests = kN;
  c.max_rows = kRows;
  c.tail_rows = kT;
  c.optional_pages = 4;
  c.max_block = max_block;
  c.host_pages = host_pages;
  return c;
}

std::uint64_t tag_of(request_id id) { return dhisparse_testing::request_tag(id); }

/// Tail location of `row` of a slot, from the geometry: [hot N x B | tail N x ring | ...].
location tail_location(std::size_t slot, std::int64_t row, std::size_t ring) {
  return static_cast<location>(kN * kB + slot * ring + static_cast<std::size_t>(row) % ring);
}

/// Checks every stored row's host copy and every tail row's pool bytes against the model.
template <class H>
void check_against_model(const H& h, const std::map<request_id, std::array<std::int64_t, 2>>& frontier,
                         std::size_t ring) {
  for (const auto& [id, f] : frontier)
    for (std::size_t s = 0; s < H::sources; ++s) {
      REQUIRE(h.frontier(id, s) == f[s]);
      const auto& d = layout::sources[s];
      for (std::size_t l = 0; l < d.payload_layers; ++l)
        for (std::int64_t r = 0; r < f[s]; ++r) {
          INFO("request " << id << " source " << s << " layer " << l << " row " << r);
          REQUIRE(row_matches(h.host_row(id, s, l, r), tag_of(id), s, l, r));
          if (r >= f[s] - static_cast<std::int64_t>(kT))
            REQUIRE(row_matches(h.payload(s, l, tail_location(h.slot_of(id), r, ring)), tag_of(id), s, l, r));
        }
    }
}

/// Both hierarchies hold the same bytes everywhere (pools and host rows) and the same books.
template <class H>
void check_same(const H& a, const H& b, std::span<const request_id> ids) {
  for (std::size_t s = 0; s < H::sources; ++s) {
    REQUIRE(a.free_host_pages(s) == b.free_host_pages(s));
    for (std::size_t l = 0; l < layout::sources[s].payload_layers; ++l)
      for (location loc = 0; loc < static_cast<location>(a.space().staging_begin()); ++loc) {
        const auto x = a.payload(s, l, loc), y = b.payload(s, l, loc);
        REQUIRE(std::equal(x.begin(), x.end(), y.begin(), y.end()));
      }
    for (request_id id : ids) {
      REQUIRE(a.frontier(id, s) == b.frontier(id, s));
      REQUIRE(a.positions(id, s) == b.positions(id, s));
      for (std::size_t l = 0; l < layout::sources[s].payload_layers; ++l)
        for (std::int64_t r = 0; r < a.frontier(id, s); ++r) {
          const auto x = a.host_row(id, s, l, r), y = b.host_row(id, s, l, r);
          REQUIRE(std::equal(x.begin(), x.end(), y.begin(), y.end()));
        }
    }
  }
}

/// tiny with source 1 packing 2 positions per stored row (a partial boundary row stays in the tail).
struct packed {
  static constexpr std::size_t top_k = 16;
  static constexpr std::size_t page_rows = 8;
  static constexpr std::array<source_desc, 2> sources{{{64, 1, 2, 32}, {32, 2, 1, 32}}};
  static constexpr std::array<consumer_desc, 3> consumers{{
      {0, consumer_kind::reindex, 0}, {0, consumer_kind::follower, 1}, {1, consumer_kind::reindex, 0}}};
};

}  // namespace

TEST_CASE("reserve_rows and reserve_ahead cover [0, min(max_rows, frontier + ahead)), all or nothing", "[writes]") {
  host_h h(config(1, 3 * kRows / layout::page_rows));  // pages for three full requests per source
  for (request_id id : {10, 11, 12, 13}) REQUIRE(h.admit(id).admitted);
  const std::size_t free0 = h.free_host_pages(0);
  REQUIRE(h.reserved_rows(10, 0) == 0);
  h.reserve_rows(10, 0, 9);  // two pages of 8
  REQUIRE(h.reserved_rows(10, 0) == 16);
  REQUIRE(h.free_host_pages(0) == free0 - 2);
  h.reserve_rows(10, 0, 3);  // less than held: nothing released
  REQUIRE(h.reserved_rows(10, 0) == 16);
  h.reserve_rows(10, 0, 1000);  // capped at max_rows
  REQUIRE(h.reserved_rows(10, 0) == static_cast<std::int64_t>(kRows));
  REQUIRE(h.free_host_pages(0) == free0 - kRows / layout::page_rows);
  REQUIRE(h.reserved_rows(10, 1) == 0);  // sources are independent

  SECTION("reserve_ahead that does not fit changes nothing") {
    const std::size_t f0 = h.free_host_pages(0), f1 = h.free_host_pages(1);
    // 3 more requests at full capacity need 36 pages on each source, 24 remain on source 0.
    REQUIRE_THROWS_AS(h.reserve_ahead(kRows), host_pool_exhausted);
    REQUIRE(h.free_host_pages(0) == f0);
    REQUIRE(h.free_host_pages(1) == f1);
    for (request_id id : {11, 12, 13}) REQUIRE(h.reserved_rows(id, 0) == 0);
    REQUIRE_THROWS_AS(h.reserve_rows(99, 0, 1), unknown_request);
    REQUIRE_THROWS_AS(h.reserve_rows(11, 2, 1), invalid_source);
  }
  SECTION("reserve_ahead that fits reserves for every admitted request and source") {
    h.reserve_ahead(17);  // three pages each
    for (request_id id : {11, 12, 13})
      for (std::size_t s = 0; s < 2; ++s) REQUIRE(h.reserved_rows(id, s) == 24);
    REQUIRE(h.reserved_rows(10, 0) == static_cast<std::int64_t>(kRows));
    REQUIRE(h.reserved_rows(10, 1) == 24);
  }
  SECTION("a per-request append uses reserved pages first") {
    const std::size_t f1 = h.free_host_pages(1);
    h.reserve_rows(11, 1, 8);
    REQUIRE(h.free_host_pages(1) == f1 - 1);
    h.append(11, 1, make_append_buffer(tag_of(11), 1, 1, 32, 0, 12), 12);  // 1 reserved + 1 new page
    REQUIRE(h.free_host_pages(1) == f1 - 2);
    REQUIRE(h.reserved_rows(11, 1) == 16);
    h.complete(11);  // reserved and stored pages go back
    REQUIRE(h.free_host_pages(1) == f1);
  }
  SECTION("a host store that runs out refuses the reservation whole") {
    host_h small(config(1, 3));
    REQUIRE(small.admit(1).admitted);
    REQUIRE_THROWS_AS(small.reserve_rows(1, 0, 25), host_pool_exhausted);  // 4 pages, 3 exist
    REQUIRE(small.free_host_pages(0) == 3);
    REQUIRE(small.reserved_rows(1, 0) == 0);
  }
}

TEST_CASE("batched appends equal per-request appends and the model, bytes and books", "[writes]") {
  host_h batched(config()), single(config());
  std::mt19937_64 rng(23);
  std::map<request_id, std::array<std::int64_t, 2>> model;  // frontier per source
  std::vector<request_id> ids;
  request_id next_id = 100;
  auto admit = [&] {
    const request_id id = next_id++;
    REQUIRE(batched.admit(id).admitted);
    REQUIRE(single.admit(id).admitted);
    model[id] = {0, 0};
    ids.push_back(id);
  };
  for (std::size_t i = 0; i < 4; ++i) admit();

  for (int step = 0; step < 120; ++step) {
    if (step % 10 == 0) {  // the engine's reservation, outside the step, every 10 steps
      batched.reserve_ahead(24);
      single.reserve_ahead(24);
    }
    for (std::size_t s = 0; s < 2; ++s) {
      const auto& d = layout::sources[s];
      std::vector<std::vector<std::byte>> bufs;
      std::vector<write_item> batch;
      for (request_id id : ids) {
        // decode (1 row), a prefill chunk (up to 2 rows a step within the 24 reserved), or nothing
        const std::size_t room = static_cast<std::size_t>(batched.reserved_rows(id, s) - model[id][s]);
        std::size_t count = std::min<std::size_t>(rng() % 4 == 0 ? 0 : 1 + rng() % 2, room);
        bufs.push_back(make_append_buffer(tag_of(id), s, d.payload_layers, d.row_bytes, model[id][s], count));
        batch.push_back({id, bufs.back(), count});
      }
      std::shuffle(batch.begin(), batch.end(), rng);  // entry order is free
      batched.append(s, batch);
      for (const auto& item : batch) {
        if (item.count > 0) single.append(item.request, s, item.rows, item.count);
        model[item.request][s] += static_cast<std::int64_t>(item.count);
      }
    }
    if (step % 37 == 36) {  // completion and admission between steps
      const request_id gone = ids.front();
      batched.complete(gone);
      single.complete(gone);
      model.erase(gone);
      ids.erase(ids.begin());
      admit();
    }
  }
  check_against_model(batched, model, kT);
  check_same(batched, single, ids);
}

TEST_CASE("bad batched appends throw and change nothing; empty entries are skipped", "[writes]") {
  host_h h(config());
  for (request_id id : {1, 2}) REQUIRE(h.admit(id).admitted);
  h.reserve_ahead(8);
  const auto& d = layout::sources[0];
  const auto one = make_append_buffer(tag_of(1), 0, d.payload_layers, d.row_bytes, 0, 1);
  const auto two = make_append_buffer(tag_of(2), 0, d.payload_layers, d.row_bytes, 0, 1);
  const std::size_t free0 = h.free_host_pages(0);
  auto unchanged = [&] {
    REQUIRE(h.frontier(1, 0) == 0);
    REQUIRE(h.frontier(2, 0) == 0);
    REQUIRE(h.free_host_pages(0) == free0);
  };
  SECTION("unknown request") {
    const std::array<write_item, 2> b{{{1, one, 1}, {7, two, 1}}};
    REQUIRE_THROWS_AS(h.append(0, b), unknown_request);
    unchanged();
  }
  SECTION("the same request twice") {
    const std::array<write_item, 2> b{{{1, one, 1}, {1, one, 1}}};
    REQUIRE_THROWS_AS(h.append(0, b), duplicate_in_batch);
    unchanged();
  }
  SECTION("byte count") {
    const std::array<write_item, 2> b{{{1, one, 1}, {2, std::span(two).first(8), 1}}};
    REQUIRE_THROWS_AS(h.append(0, b), size_mismatch);
    unchanged();
  }
  SECTION("past the reservation") {
    const auto nine = make_append_buffer(tag_of(2), 0, d.payload_layers, d.row_bytes, 0, 9);
    const std::array<write_item, 2> b{{{1, one, 1}, {2, nine, 9}}};
    REQUIRE_THROWS_AS(h.append(0, b), capacity_exceeded);
    unchanged();
  }
  SECTION("past max_rows") {
    const std::array<write_item, 1> b{{{1, one, kRows + 1}}};
    REQUIRE_THROWS_AS(h.append(0, b), capacity_exceeded);
    unchanged();
  }
  SECTION("an entry of 0 rows is skipped") {
    const std::array<write_item, 2> b{{{1, {}, 0}, {2, two, 1}}};
    h.append(0, b);
    REQUIRE(h.frontier(1, 0) == 0);
    REQUIRE(h.frontier(2, 0) == 1);
    REQUIRE(row_matches(h.host_row(2, 0, 1, 0), tag_of(2), 0, 1, 0));
    REQUIRE(h.free_host_pages(0) == free0);  // the reservation served the row
  }
}

TEST_CASE("batched commits equal per-request commits, packed rows included", "[writes][speculative]") {
  using H = host_hierarchy<packed, lru_hot_cache<16>>;
  constexpr std::size_t K = 4;
  H batched(config(K)), single(config(K));
  std::vector<request_id> ids{1, 2, 3, 4};
  for (request_id id : ids) {
    REQUIRE(batched.admit(id).admitted);
    REQUIRE(single.admit(id).admitted);
  }
  std::mt19937_64 rng(5);
  std::map<request_id, std::array<std::int64_t, 2>> positions;  // the model: committed positions
  for (request_id id : ids) positions[id] = {0, 0};
  // Block rows of a position range: row content of (tag, source, layer, row) with the row index
  // the position range covers; each round's staged rows carry the round number in the tag so a
  // discarded proposal is told apart from the committed one.
  for (int round = 0; round < 200; ++round) {
    if (round % 4 == 0) {  // 4 rounds of at most K positions each fit 16 rows
      batched.reserve_ahead(16);
      single.reserve_ahead(16);
    }
    for (std::size_t s = 0; s < 2; ++s) {
      const auto& d = packed::sources[s];
      std::vector<commit_item> commits;
      for (request_id id : ids) {
        if (rng() % 5 == 0) continue;  // not in this round's batch
        const std::size_t count = 1 + rng() % K;
        if (batched.frontier(id, s) + static_cast<std::int64_t>(K) >= static_cast<std::int64_t>(kRows)) continue;  // full
        const std::size_t nrows = batched.block_rows(id, s, count);
        const std::int64_t f = batched.frontier(id, s);
        std::vector<std::byte> rows(d.payload_layers * nrows * d.row_bytes);
        dhisparse_testing::fill_append_buffer(rows, tag_of(id), s, d.payload_layers, d.row_bytes, f, nrows);
        batched.stage_block(id, s, rows, count);
        single.stage_block(id, s, rows, count);
        const std::size_t kr = 1 + rng() % count;
        std::vector<std::vector<row_index>> q(kr);
        std::vector<std::vector<location>> loc(kr);
        std::vector<std::span<const row_index>> qs(q.begin(), q.end());
        std::vector<std::span<location>> ls(loc.begin(), loc.end());
        const verify_item vi{id, qs, ls};
        batched.verify(s, std::span<const verify_item>(&vi, 1));
        single.verify(s, std::span<const verify_item>(&vi, 1));
        const std::size_t accepted = rng() % kr;
        commits.push_back({id, accepted});
        positions[id][s] += static_cast<std::int64_t>(accepted) + 1;
      }
      std::shuffle(commits.begin(), commits.end(), rng);
      batched.commit(s, commits);
      for (const auto& c : commits) single.commit(c.request, s, c.accepted);
    }
  }
  for (request_id id : ids)
    for (std::size_t s = 0; s < 2; ++s) {
      REQUIRE(batched.positions(id, s) == positions[id][s]);
      REQUIRE(batched.frontier(id, s) == positions[id][s] / static_cast<std::int64_t>(packed::sources[s].positions_per_row));
      REQUIRE(batched.staged_rows(id, s) == 0);  // every committed round is closed
      for (std::size_t l = 0; l < packed::sources[s].payload_layers; ++l)
        for (std::int64_t r = 0; r < batched.frontier(id, s); ++r)
          REQUIRE(row_matches(batched.host_row(id, s, l, r), tag_of(id), s, l, r));
      REQUIRE(batched.frontier(id, s) == single.frontier(id, s));
      REQUIRE(batched.positions(id, s) == single.positions(id, s));
    }
  for (std::size_t s = 0; s < 2; ++s) {
    REQUIRE(batched.free_host_pages(s) == single.free_host_pages(s));
    for (std::size_t l = 0; l < packed::sources[s].payload_layers; ++l)
      for (location loc = 0; loc < static_cast<location>(batched.space().staging_begin()); ++loc) {
        const auto x = batched.payload(s, l, loc), y = single.payload(s, l, loc);
        REQUIRE(std::equal(x.begin(), x.end(), y.begin(), y.end()));
      }
  }
}

TEST_CASE("bad batched commits throw and change nothing", "[writes][speculative]") {
  host_h h(config(4));
  for (request_id id : {1, 2}) REQUIRE(h.admit(id).admitted);
  h.reserve_ahead(2);
  const auto& d = layout::sources[0];
  auto stage_verify = [&](request_id id, std::size_t count, std::size_t kr) {
    const auto rows = make_append_buffer(tag_of(id), 0, d.payload_layers, d.row_bytes, h.frontier(id, 0), count);
    h.stage_block(id, 0, rows, count);
    std::vector<std::vector<row_index>> q(kr);
    std::vector<std::vector<location>> loc(kr);
    std::vector<std::span<const row_index>> qs(q.begin(), q.end());
    std::vector<std::span<location>> ls(loc.begin(), loc.end());
    const verify_item vi{id, qs, ls};
    h.verify(0, std::span<const verify_item>(&vi, 1));
  };
  stage_verify(1, 4, 4);
  const std::size_t free0 = h.free_host_pages(0);
  auto unchanged = [&] {
    REQUIRE(h.positions(1, 0) == 0);
    REQUIRE(h.positions(2, 0) == 0);
    REQUIRE(h.verified_queries(1, 0) == 4);
    REQUIRE(h.free_host_pages(0) == free0);
  };
  SECTION("commit without verify") {
    const std::array<commit_item, 2> b{{{1, 0}, {2, 0}}};
    REQUIRE_THROWS_AS(h.commit(0, b), commit_without_verify);
    unchanged();
  }
  SECTION("acceptance beyond the verified block") {
    const std::array<commit_item, 1> b{{{1, 4}}};
    REQUIRE_THROWS_AS(h.commit(0, b), acceptance_beyond_block);
    unchanged();
  }
  SECTION("the same request twice") {
    const std::array<commit_item, 2> b{{{1, 0}, {1, 0}}};
    REQUIRE_THROWS_AS(h.commit(0, b), duplicate_in_batch);
    unchanged();
  }
  SECTION("past the reservation (8 rows reserved: a page)") {
    // commit 3 rows a time: 2 commits reach 6, a third would reach 9 > 8
    for (int i = 0; i < 2; ++i) {
      const std::array<commit_item, 1> b{{{1, 2}}};
      h.commit(0, b);
      stage_verify(1, 4, 4);
    }
    REQUIRE(h.positions(1, 0) == 6);
    const std::array<commit_item, 1> b{{{1, 2}}};
    REQUIRE_THROWS_AS(h.commit(0, b), capacity_exceeded);
    REQUIRE(h.positions(1, 0) == 6);
    REQUIRE(h.verified_queries(1, 0) == 4);
    const std::array<commit_item, 1> ok{{{1, 1}}};  // 8 rows: the reservation's end
    h.commit(0, ok);
    REQUIRE(h.positions(1, 0) == 8);
  }
}

TEST_CASE("a DeepSeek-V3.2-like layout (61 sources) builds, writes in batches and resolves", "[writes][layouts]") {
  using L = layouts::deepseek_v32;
  STATIC_REQUIRE(source_count<L> == 61);
  STATIC_REQUIRE(L::sources[60].row_bytes == 656);
  hierarchy_config c;
  c.max_requests = 2;
  c.max_rows = 4096;
  c.tail_rows = 64;
  host_hierarchy<L, lru_hot_cache<2048>> h(c);
  for (request_id id : {1, 2}) REQUIRE(h.admit(id).admitted);
  h.reserve_ahead(2500);
  for (std::size_t s = 0; s < source_count<L>; ++s) {
    const auto a = make_append_buffer(tag_of(1), s, 1, 656, 0, 2500);
    const auto b = make_append_buffer(tag_of(2), s, 1, 656, 0, 70);
    const std::array<write_item, 2> batch{{{1, a, 2500}, {2, b, 70}}};
    h.append(s, batch);
  }
  std::vector<row_index> sel(L::top_k);
  for (std::size_t i = 0; i < sel.size(); ++i) sel[i] = static_cast<row_index>(i);  // rows 0..2047
  std::vector<location> loc(sel.size());
  for (std::size_t s : {std::size_t{0}, std::size_t{30}, std::size_t{60}}) {
    h.resolve(1, s, sel, loc);
    for (std::size_t i = 0; i < sel.size(); ++i) REQUIRE(row_matches(h.payload(s, 0, loc[i]), tag_of(1), s, 0, sel[i]));
    REQUIRE(h.frontier(2, s) == 70);
    REQUIRE(row_matches(h.host_row(2, s, 0, 69), tag_of(2), s, 0, 69));
  }
}
