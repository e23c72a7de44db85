// Speculative verification, bad input: every call throws its typed error and leaves the state
// unchanged (frontier, staged block, verify state, hot rows, LRU order, optional map, host rows and
// the bytes of the pool).
#include "../support/catch.hpp"

#include <dhisparse/host/hierarchy.hpp>
#include <dhisparse/layouts/tiny.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>

#include "../support/row_content.hpp"

namespace {

using namespace dhisparse;
using layout = layouts::tiny;
using H = host_hierarchy<layout, lru_hot_cache<16>>;
constexpr std::size_t kmax = 3;
constexpr std::size_t max_rows = 64;

/// A layout whose only source packs two positions per stored row.
struct packed_layout {
  static constexpr std::size_t top_k = 4;
  static constexpr std::size_t page_rows = 4;
  static constexpr std::array<source_desc, 1> sources{{{32, 2, 1, 0}}};
  static constexpr std::array<consumer_desc, 1> consumers{{{0, consumer_kind::reindex, 0}}};
};

struct snapshot {
  std::vector<std::int64_t> frontier;
  std::vector<std::size_t> staged, verified;
  std::vector<std::vector<row_index>> hot;
  std::vector<std::vector<std::size_t>> order;
  std::vector<std::vector<std::int32_t>> optional;
  std::vector<std::vector<std::byte>> host;
  std::vector<std::vector<std::byte>> pool;
  std::vector<std::size_t> plan;
  bool operator==(const snapshot&) const = default;
};

template <class Hier = H>
snapshot take(const Hier& h, std::span<const request_id> ids) {
  using L = typename Hier::layout;
  snapshot sn;
  for (request_id id : ids)
    for (std::size_t s = 0; s < Hier::sources; ++s) {
      sn.frontier.push_back(h.frontier(id, s));
      sn.frontier.push_back(h.positions(id, s));
      sn.staged.push_back(h.staged_rows(id, s));
      sn.verified.push_back(h.verified_queries(id, s));
      sn.hot.emplace_back(h.hot_rows_of(id, s).begin(), h.hot_rows_of(id, s).end());
      sn.order.emplace_back(h.lru_order_of(id, s).begin(), h.lru_order_of(id, s).end());
      sn.optional.emplace_back(h.optional_map_of(id, s).begin(), h.optional_map_of(id, s).end());
      std::vector<std::byte> rows;
      for (std::int64_t r = 0; r < h.frontier(id, s); ++r)
        for (std::size_t l = 0; l < L::sources[s].payload_layers; ++l) {
          const auto b = h.host_row(id, s, l, r);
          rows.insert(rows.end(), b.begin(), b.end());
        }
      sn.host.push_back(std::move(rows));
    }
  for (std::size_t s = 0; s < Hier::sources; ++s) {
    sn.plan.push_back(h.last_plan(s).size());
    for (std::size_t l = 0; l < L::sources[s].payload_layers; ++l) {
      std::vector<std::byte> p;
      for (std::size_t loc = 0; loc < h.space().rows(); ++loc) {
        const auto b = h.payload(s, l, static_cast<location>(loc));
        p.insert(p.end(), b.begin(), b.end());
      }
      sn.pool.push_back(std::move(p));
    }
  }
  return sn;
}

std::vector<std::byte> rows_for(std::size_t s, std::int64_t first, std::size_t count, std::uint64_t tag) {
  return dhisparse_testing::make_append_buffer(tag, s, layout::sources[s].payload_layers, layout::sources[s].row_bytes,
                                               first, count);
}

/// Queries and their location buffers for one verify item.
struct round_input {
  std::vector<std::vector<row_index>> q;
  std::vector<std::vector<location>> l;
  std::vector<std::span<const row_index>> qs;
  std::vector<std::span<location>> ls;
  round_input(const round_input&) = delete;
  round_input& operator=(const round_input&) = delete;
  round_input(std::initializer_list<std::vector<row_index>> queries) : q(queries) {
    for (auto& x : q) l.emplace_back(x.size());
    for (std::size_t j = 0; j < q.size(); ++j) {
      qs.emplace_back(q[j]);
      ls.emplace_back(l[j]);
    }
  }
  verify_item item(request_id id) const { return {id, qs, ls}; }
};

}  // namespace

TEST_CASE("speculative calls reject bad input with typed errors and no state change") {
  H h(hierarchy_config{.max_requests = 2, .max_rows = max_rows, .optional_pages = 2, .max_block = kmax});
  const std::array<request_id, 2> ids{5, 6};
  for (request_id id : ids) {
    REQUIRE(h.admit(id).admitted);
    for (std::size_t s = 0; s < H::sources; ++s) h.append(id, s, rows_for(s, 0, 40, id), 40);
  }
  REQUIRE(h.map_optional_page(5, 0, 1));
  // warm the hot cache and stage a block for request 5 on source 0; request 6 has none
  std::vector<row_index> warm{0, 3, 17, 20, 25};
  std::vector<location> warm_loc(warm.size());
  h.resolve(5, 0, warm, warm_loc);
  const std::int64_t f = h.frontier(5, 0);
  h.stage_block(5, 0, rows_for(0, f, kmax, 99), kmax);
  const auto before = take(h, ids);

  auto unchanged = [&] { REQUIRE(take(h, ids) == before); };

  SECTION("stage_block") {
    REQUIRE_THROWS_AS(h.stage_block(5, 0, rows_for(0, f, 0, 1), 0), size_mismatch);
    unchanged();
    REQUIRE_THROWS_AS(h.stage_block(5, 0, rows_for(0, f, kmax + 1, 1), kmax + 1), block_too_wide);
    unchanged();
    REQUIRE_THROWS_AS(h.stage_block(5, 0, rows_for(0, f, 1, 1), 2), size_mismatch);
    unchanged();
    REQUIRE_THROWS_AS(h.stage_block(77, 0, rows_for(0, f, 1, 1), 1), unknown_request);
    unchanged();
    REQUIRE_THROWS_AS(h.stage_block(5, 2, rows_for(0, f, 1, 1), 1), invalid_source);
    unchanged();
  }
  SECTION("stage_block past the capacity") {
    H g(hierarchy_config{.max_requests = 1, .max_rows = 10, .max_block = 4});
    REQUIRE(g.admit(1).admitted);
    g.append(1, 1, rows_for(1, 0, 8, 1), 8);
    REQUIRE_THROWS_AS(g.stage_block(1, 1, rows_for(1, 8, 3, 2), 3), capacity_exceeded);
    REQUIRE(g.staged_rows(1, 1) == 0);
    REQUIRE(g.frontier(1, 1) == 8);
    g.stage_block(1, 1, rows_for(1, 8, 2, 2), 2);  // exactly fits
    REQUIRE(g.staged_rows(1, 1) == 2);
  }
  SECTION("verify") {
    auto bad = [&](round_input in, request_id id = 5) {
      const verify_item it = in.item(id);
      return h.verify(0, std::span<const verify_item>(&it, 1));
    };
    // query j may see committed rows and block rows f .. f+j only
    REQUIRE_THROWS_AS(bad(round_input({{0, static_cast<row_index>(f + 1)}})), position_not_visible);
    unchanged();
    REQUIRE_THROWS_AS(bad(round_input({{0}, {static_cast<row_index>(f + 1), static_cast<row_index>(f + 2)}})),
                      position_not_visible);
    unchanged();
    REQUIRE_THROWS_AS(bad(round_input({{0}, {1}, {static_cast<row_index>(f + 3)}})), position_not_visible);
    unchanged();
    REQUIRE_THROWS_AS(bad(round_input({{-2}})), position_out_of_range);
    unchanged();
    REQUIRE_THROWS_AS(bad(round_input({{static_cast<row_index>(max_rows)}})), position_out_of_range);
    unchanged();
    REQUIRE_THROWS_AS(bad(round_input({{0}, {1}, {2}, {3}})), block_too_wide);  // K_r > K_max
    unchanged();
    REQUIRE_THROWS_AS(bad(round_input({})), size_mismatch);  // K_r = 0
    unchanged();
    REQUIRE_THROWS_AS(bad(round_input({{0}}), 6), no_staged_block);
    unchanged();
    REQUIRE_THROWS_AS(bad(round_input({std::vector<row_index>(layout::top_k + 1, 0)})), selection_too_long);
    unchanged();
    {
      round_input in({{0, 1}, {2}});
      in.l[1].push_back(0);
      in.ls[1] = in.l[1];
      REQUIRE_THROWS_AS(h.verify(5, 0, in.qs, in.ls), size_mismatch);  // location list length
      unchanged();
      in.ls.pop_back();
      REQUIRE_THROWS_AS(h.verify(5, 0, in.qs, in.ls), size_mismatch);  // number of location lists
      unchanged();
    }
    {  // a good item first, a bad one second: nothing of the first is applied
      h.stage_block(6, 0, rows_for(0, h.frontier(6, 0), 2, 98), 2);
      const auto before6 = take(h, ids);
      round_input good({{0, 1, 2, 30}}), worse({{0}, {static_cast<row_index>(f + 2)}});
      const std::array<verify_item, 2> batch{good.item(6), worse.item(5)};
      REQUIRE_THROWS_AS(h.verify(0, batch), position_not_visible);
      REQUIRE(take(h, ids) == before6);
      const std::array<verify_item, 2> twice{good.item(6), good.item(6)};
      REQUIRE_THROWS_AS(h.verify(0, twice), duplicate_in_batch);
      REQUIRE(take(h, ids) == before6);
      // K_r beyond the staged block of 2
      REQUIRE_THROWS_AS(bad(round_input({{0}, {1}, {2}}), 6), block_too_wide);
      REQUIRE(take(h, ids) == before6);
    }
    REQUIRE_THROWS_AS(bad(round_input({{0}}), 77), unknown_request);
  }
  SECTION("verify with follower copies pending") {
    round_input in({{0, 7, 33}, {8, static_cast<row_index>(f + 1)}});
    h.verify(5, 0, in.qs, in.ls, copy_layers::producer_only);
    const auto mid = take(h, ids);
    round_input again({{1}});
    REQUIRE_THROWS_AS(h.verify(5, 0, again.qs, again.ls), pending_follower_copies);
    REQUIRE(take(h, ids) == mid);
    h.copy_follower(0, 1);
    h.verify(5, 0, again.qs, again.ls);  // fine now, and a second verify of the same block is allowed
    REQUIRE(h.verified_queries(5, 0) == 1);
  }
  SECTION("commit") {
    REQUIRE_THROWS_AS(h.commit(5, 0, 0), commit_without_verify);  // staged, not verified
    unchanged();
    REQUIRE_THROWS_AS(h.commit(6, 0, 0), commit_without_verify);  // nothing staged
    unchanged();
    REQUIRE_THROWS_AS(h.commit(77, 0, 0), unknown_request);
    unchanged();
    {  // a failed verify does not count as a verify
      round_input in({{static_cast<row_index>(f + 1)}});
      REQUIRE_THROWS_AS(h.verify(5, 0, in.qs, in.ls), position_not_visible);
      REQUIRE_THROWS_AS(h.commit(5, 0, 0), commit_without_verify);
      unchanged();
    }
    round_input in({{0, static_cast<row_index>(f)}, {static_cast<row_index>(f + 1)}});
    h.verify(5, 0, in.qs, in.ls);
    const auto verified = take(h, ids);
    REQUIRE_THROWS_AS(h.commit(5, 0, 2), acceptance_beyond_block);  // K_r = 2: at most 1 proposal
    REQUIRE(take(h, ids) == verified);
    REQUIRE_THROWS_AS(h.commit(5, 0, 99), acceptance_beyond_block);
    REQUIRE(take(h, ids) == verified);
    h.commit(5, 0, 1);
    REQUIRE(h.frontier(5, 0) == f + 2);
    for (std::int64_t r = f; r < f + 2; ++r)
      for (std::size_t l = 0; l < 2; ++l) REQUIRE(dhisparse_testing::row_matches(h.host_row(5, 0, l, r), 99, 0, l, r));
    REQUIRE_THROWS_AS(h.host_row(5, 0, 0, f + 2), position_beyond_frontier);  // the third block row is discarded
    const auto committed = take(h, ids);
    REQUIRE_THROWS_AS(h.commit(5, 0, 0), commit_without_verify);  // the round is closed
    REQUIRE(take(h, ids) == committed);
    round_input after({{0}});
    REQUIRE_THROWS_AS(h.verify(5, 0, after.qs, after.ls), no_staged_block);  // the block is gone
    REQUIRE(take(h, ids) == committed);
  }
  SECTION("a new stage_block closes the verified round") {
    round_input in({{0}});
    h.verify(5, 0, in.qs, in.ls);
    h.stage_block(5, 0, rows_for(0, f, 1, 97), 1);
    REQUIRE_THROWS_AS(h.commit(5, 0, 0), commit_without_verify);
  }
  SECTION("an append supersedes the staged block") {
    h.append(5, 0, rows_for(0, f, 1, 5), 1);
    REQUIRE(h.staged_rows(5, 0) == 0);
    round_input in({{0}});
    REQUIRE_THROWS_AS(h.verify(5, 0, in.qs, in.ls), no_staged_block);
  }
}

TEST_CASE("speculative calls need max_block >= 2") {
  SECTION("max_block = 1 (the default) keeps the tail ring as it is and refuses blocks") {
    H h(hierarchy_config{.max_requests = 1, .max_rows = 32});
    REQUIRE(h.space().tail_rows == h.config().tail_rows);
    REQUIRE(h.space().staging_rows == 0);
    REQUIRE(h.admit(1).admitted);
    h.append(1, 0, rows_for(0, 0, 4, 1), 4);
    REQUIRE_THROWS_AS(h.stage_block(1, 0, rows_for(0, 4, 1, 2), 1), invalid_configuration);
    REQUIRE(h.frontier(1, 0) == 4);
    REQUIRE_THROWS_AS(H(hierarchy_config{.max_requests = 1, .max_rows = 32, .max_block = 0}), invalid_configuration);
  }
  SECTION("the ring and the staging region with max_block > 1") {
    H h(hierarchy_config{.max_requests = 3, .max_rows = 32, .optional_pages = 2, .max_block = 4});
    const auto& sp = h.space();
    REQUIRE(h.config().tail_rows == layout::page_rows);
    REQUIRE(sp.tail_rows == layout::page_rows + 4);
    REQUIRE(sp.staging_rows == 4 * layout::top_k);
    REQUIRE(sp.staging(0, 0) == static_cast<location>(3 * (16 + sp.tail_rows) + 2 * layout::page_rows));
    REQUIRE(sp.rows() == 3 * (16 + sp.tail_rows) + 2 * layout::page_rows + 3 * 4 * layout::top_k);
  }
}

TEST_CASE("packed sources (m = 2): bad rounds throw typed errors and leave the state unchanged") {
  using P = host_hierarchy<packed_layout, lru_hot_cache<8>>;
  P h(hierarchy_config{.max_requests = 1, .max_rows = 16, .max_block = 3});
  const std::array<request_id, 1> ids{1};
  REQUIRE(h.admit(1).admitted);
  const auto rows = [](std::int64_t first, std::size_t count) {
    return dhisparse_testing::make_append_buffer(9, 0, 1, 32, first, count);
  };
  h.append(1, 0, rows(0, 5), 5);  // rows 0..4: positions 0..9
  REQUIRE(h.positions(1, 0) == 10);
  REQUIRE(h.block_rows(1, 0, 1) == 1);
  REQUIRE(h.block_rows(1, 0, 2) == 1);
  REQUIRE(h.block_rows(1, 0, 3) == 2);
  // a block of 3 positions (10, 11, 12) touches rows 5 and 6: exactly two rows of bytes
  const auto before_stage = take(h, ids);
  REQUIRE_THROWS_AS(h.stage_block(1, 0, rows(5, 3), 3), size_mismatch);
  REQUIRE_THROWS_AS(h.stage_block(1, 0, rows(5, 1), 3), size_mismatch);
  REQUIRE_THROWS_AS(h.stage_block(1, 0, rows(5, 2), 4), block_too_wide);
  REQUIRE(take(h, ids) == before_stage);
  h.stage_block(1, 0, rows(5, 2), 3);
  REQUIRE(h.staged_rows(1, 0) == 3);
  {
    // row 5 (positions 10, 11) is complete for query 1 (position 11), not for query 0 (position 10)
    const auto before = take(h, ids);
    round_input bad0{{5}, {5}};
    REQUIRE_THROWS_AS(h.verify(1, 0, bad0.qs, bad0.ls), position_not_visible);
    round_input bad1{{4}, {4, 6}};  // row 6 packs positions 12 and 13: never complete in this block
    REQUIRE_THROWS_AS(h.verify(1, 0, bad1.qs, bad1.ls), position_not_visible);
    round_input bad2{{4}, {4}, {6}};
    REQUIRE_THROWS_AS(h.verify(1, 0, bad2.qs, bad2.ls), position_not_visible);
    REQUIRE_THROWS_AS(h.commit(1, 0, 0), commit_without_verify);
    REQUIRE(take(h, ids) == before);
  }
  round_input ok{{4, 0}, {5, 4}, {5}};
  h.verify(1, 0, ok.qs, ok.ls);
  REQUIRE(ok.l[1][0] == h.space().tail(0, 5));
  {
    const auto before = take(h, ids);
    REQUIRE_THROWS_AS(h.commit(1, 0, 3), acceptance_beyond_block);
    REQUIRE(take(h, ids) == before);
  }
  h.commit(1, 0, 0);  // position 10 committed: row 5 is half filled and stays in the tail
  REQUIRE(h.frontier(1, 0) == 5);
  REQUIRE(h.positions(1, 0) == 11);
  REQUIRE(h.free_host_pages(0) == h.config().host_pages - 2);  // rows 0..4: two 4-row pages, no new one
  // next round starts at position 11 with the boundary row 5: 2 positions still touch only row 5
  REQUIRE(h.block_rows(1, 0, 2) == 2);
  REQUIRE(h.block_rows(1, 0, 1) == 1);
  h.stage_block(1, 0, rows(5, 1), 1);
  round_input anchor{{5}};  // query 0 sits at position 11: row 5 is complete for it
  h.verify(1, 0, anchor.qs, anchor.ls);
  REQUIRE(anchor.l[0][0] == h.space().tail(0, 5));
  h.commit(1, 0, 0);  // position 11 completes row 5: it joins the history
  REQUIRE(h.frontier(1, 0) == 6);
  REQUIRE(h.positions(1, 0) == 12);
  REQUIRE(dhisparse_testing::row_matches(h.host_row(1, 0, 0, 5), 9, 0, 0, 5));
  // capacity: 16 rows hold 32 positions; at position 30 a block of 3 would reach position 32
  h.append(1, 0, rows(6, 9), 9);
  REQUIRE(h.positions(1, 0) == 30);
  const auto before_cap = take(h, ids);
  REQUIRE_THROWS_AS(h.stage_block(1, 0, rows(15, 2), 3), capacity_exceeded);
  REQUIRE(take(h, ids) == before_cap);
  h.stage_block(1, 0, rows(15, 1), 2);
  // append over a partially filled boundary row: the appended complete row covers it
  round_input last{{15}, {15}};
  REQUIRE_THROWS_AS(h.verify(1, 0, last.qs, last.ls), position_not_visible);
  round_input last_ok{{14}, {15}};
  h.verify(1, 0, last_ok.qs, last_ok.ls);
  h.commit(1, 0, 0);
  REQUIRE(h.positions(1, 0) == 31);
  h.append(1, 0, rows(15, 1), 1);
  REQUIRE(h.positions(1, 0) == 32);
  REQUIRE(h.frontier(1, 0) == 16);
}

TEST_CASE("errc values of speculative verification are appended after the existing ones") {
  REQUIRE(static_cast<int>(errc::device_error) == 12);
  REQUIRE(static_cast<int>(errc::block_too_wide) == 13);
  REQUIRE(static_cast<int>(errc::packed_rows_unsupported) == 18);  // kept: part of the CUDA status encoding
  REQUIRE(std::string(to_string(errc::position_not_visible)) == "position_not_visible");
  REQUIRE_THROWS_AS(throw_error(errc::acceptance_beyond_block, "x"), acceptance_beyond_block);
  REQUIRE_THROWS_AS(throw_error(errc::commit_without_verify, "x"), commit_without_verify);
  REQUIRE_THROWS_AS(throw_error(errc::no_staged_block, "x"), no_staged_block);
}
