// Bad input to speculative verification on the CUDA backend: every typed error of the host
// reference, with the state unchanged. Errors the host can see (configuration, K_r, staging,
// lengths, duplicates, commit rules, pending follower copies) throw at the call; entries only the
// device reads (out of range, not visible to their query) leave that batch entry untouched and are
// thrown by check_errors. After each error the device state (hot rows, LRU order, optional map,
// frontier, staged/verified books, every pool byte) still equals the host reference's.
#include "cuda_test_support.cuh"

namespace {

using namespace dhtest;
using L = dh::layouts::tiny;
using Hot = dh::lru_hot_cache<16>;
using T = twin<L, Hot>;
constexpr std::size_t K = L::top_k;

/// A layout with a packed source (m = 2 positions per stored row).
struct packed_layout {
  static constexpr std::size_t top_k = 16;
  static constexpr std::size_t page_rows = 8;
  static constexpr std::array<dh::source_desc, 1> sources{{{64, 2, 1, 32}}};
  static constexpr std::array<dh::consumer_desc, 1> consumers{{{0, dh::consumer_kind::reindex, 0}}};
};
static_assert(dh::valid_layout<packed_layout>);

dh::hierarchy_config spec_config() {
  dh::hierarchy_config cfg;
  cfg.max_requests = 3;
  cfg.max_rows = 200;
  cfg.optional_pages = 4;
  cfg.max_block = 4;
  return cfg;
}

/// Host and device hierarchies with two requests of 60 rows on every source, plus device buffers
/// for up to max_block queries of top_k entries per request.
struct fixture {
  T tw{spec_config(), 5};
  dhc::device_buffer<row_index> dsel{3 * 4 * K};
  dhc::device_buffer<location> dloc{3 * 4 * K};
  request_id a = 1, b = 2;

  fixture() {
    require_device();
    REQUIRE(tw.admit(a));
    REQUIRE(tw.admit(b));
    for (std::size_t s = 0; s < T::sources; ++s) {
      tw.append(a, s, 60);
      tw.append(b, s, 60);
    }
  }
  void stage(request_id id, std::size_t s, std::size_t count) {
    const auto rows = make_rows<L>(id, s, tw.host.frontier(id, s), count);
    tw.host.stage_block(id, s, rows, count);
    tw.dev.stage_block(id, s, std::span<const std::byte>(rows), count);
  }
  /// Device queries of batch entry e over `sel` (uploaded), locations pre-filled with 0x7A.
  std::vector<dhc::verify_query> upload(std::size_t e, const std::vector<std::vector<row_index>>& sel) {
    std::vector<dhc::verify_query> q;
    for (std::size_t j = 0; j < sel.size(); ++j) {
      const std::size_t at = (e * 4 + j) * K;
      if (!sel[j].empty())
        DHTEST_CUDA(cudaMemcpy(dsel.data() + at, sel[j].data(), sel[j].size() * sizeof(row_index), cudaMemcpyHostToDevice));
      q.push_back({dsel.data() + at, static_cast<std::int32_t>(sel[j].size()), dloc.data() + at});
    }
    return q;
  }
  /// Host verify of one request (the reference).
  dh::verify_stats host_verify(request_id id, std::size_t s, const std::vector<std::vector<row_index>>& sel,
                               std::vector<std::vector<location>>& out) {
    std::vector<std::span<const row_index>> qs;
    std::vector<std::span<location>> ls;
    out.assign(sel.size(), {});
    for (std::size_t j = 0; j < sel.size(); ++j) {
      out[j].assign(sel[j].size(), 0);
      qs.emplace_back(sel[j]);
      ls.emplace_back(out[j]);
    }
    return tw.host.verify(id, s, qs, ls);
  }
  void same_state(const std::string& ctx) {
    tw.compare_state(ctx);
    tw.compare_pools(ctx);
    for (request_id id : tw.live)
      for (std::size_t s = 0; s < T::sources; ++s) {
        INFO(ctx << ": request " << id << " source " << s);
        REQUIRE(tw.host.staged_rows(id, s) == tw.dev.staged_rows(id, s));
        REQUIRE(tw.host.verified_queries(id, s) == tw.dev.verified_queries(id, s));
        REQUIRE(tw.host.frontier(id, s) == tw.dev.frontier(id, s));
      }
  }
  std::vector<row_index> old_rows(std::size_t n, row_index first = 0) {
    std::vector<row_index> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = first + static_cast<row_index>(i);
    return v;
  }
};

}  // namespace

TEST_CASE("cuda verify: configuration errors", "[gpu][verify][errors]") {
  require_device();
  dh::hierarchy_config cfg;
  cfg.max_requests = 2;
  cfg.max_rows = 100;
  {
    dhc::hierarchy<L, Hot> plain(cfg);  // max_block 1: no speculation
    REQUIRE(plain.admit(1).admitted);
    std::vector<std::byte> rows(2 * L::sources[0].row_bytes);
    REQUIRE_THROWS_AS(plain.stage_block(1, 0, std::span<const std::byte>(rows), 1), dh::invalid_configuration);
    REQUIRE_THROWS_AS(plain.commit(1, 0, 0), dh::invalid_configuration);
    std::vector<dhc::verify_batch_item> none;
    REQUIRE_THROWS_AS(plain.verify(0, std::span<const dhc::verify_batch_item>(none)), dh::invalid_configuration);
  }
  cfg.max_block = 0;
  REQUIRE_THROWS_AS((dhc::hierarchy<L, Hot>(cfg)), dh::invalid_configuration);
  cfg.max_block = dhc::max_verify_block + 1;
  REQUIRE_THROWS_AS((dhc::hierarchy<L, Hot>(cfg)), dh::invalid_configuration);
  {
    dh::hierarchy_config narrow = cfg;
    narrow.max_rows = 10;
    narrow.max_block = 11;  // wider than the history
    REQUIRE_THROWS_AS((dhc::hierarchy<L, Hot>(narrow)), dh::invalid_configuration);
  }
  // packed sources are speculative on both backends: a block of 3 positions from position 0 of an
  // m = 2 source touches rows 0 and 1, and both backends ask for exactly those bytes
  cfg.max_block = 4;
  dhc::hierarchy<packed_layout, Hot> packed(cfg);
  dh::host_hierarchy<packed_layout, Hot> packed_host(cfg);
  REQUIRE(packed.admit(1).admitted);
  REQUIRE(packed_host.admit(1).admitted);
  REQUIRE(packed.block_rows(1, 0, 3) == 2);
  REQUIRE(packed_host.block_rows(1, 0, 3) == 2);
  std::vector<std::byte> rows(64);
  REQUIRE_THROWS_AS(packed.stage_block(1, 0, std::span<const std::byte>(rows), 3), dh::size_mismatch);
  REQUIRE_THROWS_AS(packed_host.stage_block(1, 0, rows, 3), dh::size_mismatch);
  packed.stage_block(1, 0, std::span<const std::byte>(rows), 1);
  packed_host.stage_block(1, 0, rows, 1);
  REQUIRE(packed_host.staged_rows(1, 0) == 1);  // the device books: test_cuda_verify_differential
  // the speculative geometry: tail ring T + K_max, staging K_max * top_k, as the host
  dh::host_hierarchy<L, Hot> host(cfg);
  dhc::hierarchy<L, Hot> dev(cfg);
  REQUIRE(dev.space().tail_rows == host.space().tail_rows);
  REQUIRE(dev.space().staging_rows == host.space().staging_rows);
  REQUIRE(dev.space().rows() == host.space().rows());
}

TEST_CASE("cuda verify: stage_block errors leave the state unchanged", "[gpu][verify][errors]") {
  fixture fx;
  auto& tw = fx.tw;
  const auto rows1 = make_rows<L>(fx.a, 0, 60, 1);
  REQUIRE_THROWS_AS(tw.host.stage_block(fx.a, 0, rows1, 0), dh::size_mismatch);
  REQUIRE_THROWS_AS(tw.dev.stage_block(fx.a, 0, std::span<const std::byte>(rows1), 0), dh::size_mismatch);
  const auto rows5 = make_rows<L>(fx.a, 0, 60, 5);
  REQUIRE_THROWS_AS(tw.host.stage_block(fx.a, 0, rows5, 5), dh::block_too_wide);
  REQUIRE_THROWS_AS(tw.dev.stage_block(fx.a, 0, std::span<const std::byte>(rows5), 5), dh::block_too_wide);
  REQUIRE_THROWS_AS(tw.host.stage_block(fx.a, 0, rows1, 2), dh::size_mismatch);
  REQUIRE_THROWS_AS(tw.dev.stage_block(fx.a, 0, std::span<const std::byte>(rows1), 2), dh::size_mismatch);
  REQUIRE_THROWS_AS(tw.dev.stage_block(999, 0, std::span<const std::byte>(rows1), 1), dh::unknown_request);
  REQUIRE_THROWS_AS(tw.dev.stage_block(fx.a, 7, std::span<const std::byte>(rows1), 1), dh::invalid_source);
  // near capacity
  tw.append(fx.b, 1, 200 - 60 - 2);
  const auto rows3 = make_rows<L>(fx.b, 1, 198, 3);
  REQUIRE_THROWS_AS(tw.host.stage_block(fx.b, 1, rows3, 3), dh::capacity_exceeded);
  REQUIRE_THROWS_AS(tw.dev.stage_block(fx.b, 1, std::span<const std::byte>(rows3), 3), dh::capacity_exceeded);
  fx.same_state("stage_block errors");
}

TEST_CASE("cuda verify: host-checked verify and commit errors leave the state unchanged", "[gpu][verify][errors]") {
  fixture fx;
  auto& tw = fx.tw;
  const std::size_t s = 0;
  std::vector<std::vector<row_index>> sel{fx.old_rows(K)};
  std::vector<std::vector<location>> out;
  // nothing staged
  auto q = fx.upload(0, sel);
  dhc::verify_batch_item item{fx.a, q};
  REQUIRE_THROWS_AS(fx.host_verify(fx.a, s, sel, out), dh::no_staged_block);
  REQUIRE_THROWS_AS(tw.dev.verify(s, std::span<const dhc::verify_batch_item>(&item, 1)), dh::no_staged_block);
  REQUIRE_THROWS_AS(tw.host.commit(fx.a, s, 0), dh::commit_without_verify);
  REQUIRE_THROWS_AS(tw.dev.commit(fx.a, s, 0), dh::commit_without_verify);
  fx.stage(fx.a, s, 3);
  // staged but not verified
  REQUIRE_THROWS_AS(tw.host.commit(fx.a, s, 0), dh::commit_without_verify);
  REQUIRE_THROWS_AS(tw.dev.commit(fx.a, s, 0), dh::commit_without_verify);
  // K_r above the staged block, above max_block, zero
  {
    std::vector<std::vector<row_index>> four(4, fx.old_rows(4));
    auto q4 = fx.upload(0, four);
    dhc::verify_batch_item it{fx.a, q4};
    REQUIRE_THROWS_AS(fx.host_verify(fx.a, s, four, out), dh::block_too_wide);
    REQUIRE_THROWS_AS(tw.dev.verify(s, std::span<const dhc::verify_batch_item>(&it, 1)), dh::block_too_wide);
    std::vector<dhc::verify_query> q5(5, q4[0]);
    dhc::verify_batch_item it5{fx.a, q5};
    REQUIRE_THROWS_AS(tw.dev.verify(s, std::span<const dhc::verify_batch_item>(&it5, 1)), dh::block_too_wide);
    dhc::verify_batch_item it0{fx.a, {}};
    REQUIRE_THROWS_AS(tw.dev.verify(s, std::span<const dhc::verify_batch_item>(&it0, 1)), dh::size_mismatch);
  }
  // a query longer than top_k, a negative length, a null pointer
  {
    auto bad = q;
    bad[0].length = static_cast<std::int32_t>(K + 1);
    dhc::verify_batch_item it{fx.a, bad};
    REQUIRE_THROWS_AS(tw.dev.verify(s, std::span<const dhc::verify_batch_item>(&it, 1)), dh::selection_too_long);
    bad[0].length = -1;
    REQUIRE_THROWS_AS(tw.dev.verify(s, std::span<const dhc::verify_batch_item>(&it, 1)), dh::size_mismatch);
    bad[0].length = 4;
    bad[0].selection = nullptr;
    REQUIRE_THROWS_AS(tw.dev.verify(s, std::span<const dhc::verify_batch_item>(&it, 1)), dh::size_mismatch);
    std::vector<std::vector<row_index>> too_long{fx.old_rows(K + 1)};
    REQUIRE_THROWS_AS(fx.host_verify(fx.a, s, too_long, out), dh::selection_too_long);
  }
  // the same request twice, an unknown request
  {
    dhc::verify_batch_item two[2] = {item, item};
    REQUIRE_THROWS_AS(tw.dev.verify(s, std::span<const dhc::verify_batch_item>(two, 2)), dh::duplicate_in_batch);
    dhc::verify_batch_item unknown{999, q};
    REQUIRE_THROWS_AS(tw.dev.verify(s, std::span<const dhc::verify_batch_item>(&unknown, 1)), dh::unknown_request);
  }
  fx.same_state("host-checked verify errors");
  // a good verify of K_r = 2, then acceptance beyond the block
  {
    std::vector<std::vector<row_index>> two_q{fx.old_rows(K), {60, 61, 5, -1}};
    auto q2 = fx.upload(0, two_q);
    dhc::verify_batch_item it{fx.a, q2};
    fx.host_verify(fx.a, s, two_q, out);
    tw.dev.verify_sync(s, std::span<const dhc::verify_batch_item>(&it, 1), tw.dev.stream());
    REQUIRE(tw.dev.verified_queries(fx.a, s) == 2);
    REQUIRE_THROWS_AS(tw.host.commit(fx.a, s, 2), dh::acceptance_beyond_block);
    REQUIRE_THROWS_AS(tw.dev.commit(fx.a, s, 2), dh::acceptance_beyond_block);
    fx.same_state("acceptance beyond the block");
    tw.commit(fx.a, s, 1, 2);  // m = 1: the anchor and one accepted proposal complete two rows
    REQUIRE(tw.dev.frontier(fx.a, s) == 62);
    fx.same_state("after a good commit");
    // the round is closed: a second commit has no verify
    REQUIRE_THROWS_AS(tw.host.commit(fx.a, s, 0), dh::commit_without_verify);
    REQUIRE_THROWS_AS(tw.dev.commit(fx.a, s, 0), dh::commit_without_verify);
  }
}

TEST_CASE("cuda verify: bad entries fail on the device, leave their entry untouched, and are thrown by check_errors",
          "[gpu][verify][errors]") {
  fixture fx;
  auto& tw = fx.tw;
  const std::size_t s = 0;
  fx.stage(fx.a, s, 3);
  fx.stage(fx.b, s, 3);
  std::vector<std::vector<location>> out;
  const std::int64_t f = tw.host.frontier(fx.a, s);  // 60
  struct bad_case {
    const char* what;
    std::vector<std::vector<row_index>> sel;
    dh::errc code;
  };
  const std::vector<bad_case> cases{
      {"a row past max_rows", {fx.old_rows(K), {1, 2, 200}}, dh::errc::position_out_of_range},
      {"a negative row other than -1", {{3, -5, 4}}, dh::errc::position_out_of_range},
      {"the anchor selecting the next position", {{1, static_cast<row_index>(f + 1)}}, dh::errc::position_not_visible},
      {"query 1 selecting position f+2", {fx.old_rows(4), {static_cast<row_index>(f + 1), static_cast<row_index>(f + 2)}},
       dh::errc::position_not_visible},
      {"a row past the staged block", {{static_cast<row_index>(f + 10)}}, dh::errc::position_not_visible},
  };
  for (const auto& c : cases) {
    INFO(c.what);
    REQUIRE_THROWS_AS(fx.host_verify(fx.a, s, c.sel, out), dh::error);
    try {
      fx.host_verify(fx.a, s, c.sel, out);
    } catch (const dh::error& e) {
      REQUIRE(e.code() == c.code);
    }
    // device: entry 0 is bad, entry 1 (request b) is good and resolves
    std::vector<std::vector<row_index>> good{fx.old_rows(K, 10), {static_cast<row_index>(f), 20, 21}};
    auto qa = fx.upload(0, c.sel);
    auto qb = fx.upload(1, good);
    DHTEST_CUDA(cudaMemset(fx.dloc.data(), 0x7A, fx.dloc.bytes()));
    dhc::verify_batch_item items[2] = {{fx.a, qa}, {fx.b, qb}};
    tw.dev.verify(s, std::span<const dhc::verify_batch_item>(items, 2), tw.dev.stream());
    wait_or_die(tw.dev.stream(), c.what);
    bool thrown = false;
    try {
      tw.dev.check_errors(tw.dev.stream());
    } catch (const dh::error& e) {
      thrown = true;
      INFO("device error: " << e.what());
      REQUIRE(e.code() == c.code);
      CHECK(std::string(e.what()).find("request 1") != std::string::npos);
    }
    REQUIRE(thrown);
    REQUIRE_NOTHROW(tw.dev.check_errors(tw.dev.stream()));  // cleared
    // entry 0 untouched: no location written
    std::vector<location> got(4 * K);
    DHTEST_CUDA(cudaMemcpy(got.data(), fx.dloc.data(), got.size() * sizeof(location), cudaMemcpyDeviceToHost));
    for (std::size_t i = 0; i < got.size(); ++i) REQUIRE(got[i] == 0x7A7A7A7A);
    // its round is not verified on the device; the host reference never verified it
    REQUIRE(tw.dev.verified_queries(fx.a, s) == 0);
    REQUIRE_THROWS_AS(tw.dev.commit(fx.a, s, 0), dh::commit_without_verify);
    // entry 1 resolved: the host reference verifies it alone, then both states agree
    std::vector<std::vector<location>> want;
    fx.host_verify(fx.b, s, good, want);
    for (std::size_t j = 0; j < good.size(); ++j) {
      std::vector<location> g(good[j].size());
      DHTEST_CUDA(cudaMemcpy(g.data(), fx.dloc.data() + (4 + j) * K, g.size() * sizeof(location), cudaMemcpyDeviceToHost));
      DHTEST_REQUIRE_SAME(location, "good entry's locations", std::span<const location>(want[j]), std::span<const location>(g));
    }
    fx.same_state(c.what);
  }
}

TEST_CASE("cuda verify: pending follower copies block the next verify and resolve", "[gpu][verify][errors]") {
  fixture fx;
  auto& tw = fx.tw;
  const std::size_t s = 0;  // two payload layers
  fx.stage(fx.a, s, 2);
  std::vector<std::vector<row_index>> sel{fx.old_rows(K), {60, 61, 30}};
  auto q = fx.upload(0, sel);
  dhc::verify_batch_item it{fx.a, q};
  std::vector<std::span<const row_index>> qs{sel[0], sel[1]};
  std::vector<std::vector<location>> out(2);
  out[0].resize(sel[0].size());
  out[1].resize(sel[1].size());
  std::vector<std::span<location>> ls{out[0], out[1]};
  tw.host.verify(fx.a, s, qs, ls, dh::copy_layers::producer_only);
  tw.dev.verify(s, std::span<const dhc::verify_batch_item>(&it, 1), tw.dev.stream(), dh::copy_layers::producer_only);
  tw.dev.check_errors(tw.dev.stream());
  REQUIRE_THROWS_AS(tw.host.verify(fx.a, s, qs, ls), dh::pending_follower_copies);
  REQUIRE_THROWS_AS(tw.dev.verify(s, std::span<const dhc::verify_batch_item>(&it, 1)), dh::pending_follower_copies);
  std::vector<typename T::device_type::batch_item> none;
  REQUIRE_THROWS_AS(tw.dev.resolve(s, std::span<const typename T::device_type::batch_item>(none)),
                    dh::pending_follower_copies);
  tw.host.copy_follower(s, 1);
  tw.dev.copy_follower(s, 1);
  fx.same_state("after follower copies of a verify plan");
  const auto hp = tw.host.last_plan(s);
  const auto dp = tw.dev.last_verify_plan(s);
  REQUIRE(hp.size() == dp.size());
  for (std::size_t i = 0; i < hp.size(); ++i) REQUIRE((hp[i].row == dp[i].row && hp[i].dst == dp[i].dst));
}
