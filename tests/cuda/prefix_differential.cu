// Differential test of shared prefixes (docs/prefixes.md): the CUDA hierarchy against the host
// reference (itself checked by tests/host/prefix_model.cpp), driven with the same random calls:
// plain admissions, admissions on retained prefixes (page-aligned and with a partial last page),
// appends, retains of whole and partial histories (with LRU evictions under a small budget),
// releases, optional pages mapped and unmapped (shared pool pages), completions, and resolves.
// After every resolve: locations, stats and copy plans equal (twin::resolve) and every selected
// row's bytes on the device equal the rows the test wrote (its own tags: prefix rows carry the tag
// of the request that wrote them). Every few operations: every pool byte of both backends, every
// request's hot rows, LRU order, optional map, device frontier and host page table, every host
// page's holder counts, the retained prefixes and the free pools.
#include "cuda_test_support.cuh"

#include <map>

namespace {
using namespace dhtest;
using Layout = dh::layouts::tiny;
using Hot = dh::lru_hot_cache<16>;
using Twin = twin<Layout, Hot>;
constexpr std::size_t kSources = Twin::sources;
constexpr std::size_t kPageRows = Layout::page_rows;

struct prefix_run {
  Twin t;
  std::map<request_id, std::array<std::vector<request_id>, kSources>> writer;  // the tag of every row
  std::map<dh::prefix_id, std::array<std::vector<request_id>, kSources>> prefix_writer;
  dh::prefix_id next_prefix = 1;
  std::size_t shared_admits = 0, evictions = 0, resolves = 0;

  prefix_run(const dh::hierarchy_config& cfg, std::uint64_t seed) : t(cfg, seed) {}

  request_id pick() { return t.live[t.uniform(t.live.size())]; }

  void admit_plain() {
    const request_id id = t.next_id++;
    if (t.admit(id)) writer[id] = {};
  }
  void admit_on_prefix() {
    const auto held = t.host.retained_prefixes();
    REQUIRE(held == t.dev.retained_prefixes());
    if (held.empty()) return;
    const dh::prefix_id p = held[t.uniform(held.size())];
    const request_id id = t.next_id++;
    const auto a = t.host.admit(id, p);
    const auto b = t.dev.admit(id, p);
    REQUIRE(a.admitted == b.admitted);
    if (!a.admitted) return;
    REQUIRE(a.slot == b.slot);
    ++shared_admits;
    t.live.push_back(id);
    writer[id] = prefix_writer.at(p);
    for (std::size_t s = 0; s < kSources; ++s) t.own_rows[id][s] = static_cast<std::int64_t>(writer[id][s].size());
  }
  void append() {
    if (t.live.empty()) return;
    const request_id id = pick();
    const std::size_t s = t.uniform(kSources);
    const std::int64_t f = t.host.frontier(id, s);
    const std::size_t count = 1 + t.uniform(t.chance(0.2) ? 12 : 3);
    if (f + static_cast<std::int64_t>(count) > static_cast<std::int64_t>(t.cfg.max_rows)) return;
    const std::size_t want = (static_cast<std::size_t>(f) + count + kPageRows - 1) / kPageRows;
    const std::size_t have = static_cast<std::size_t>(t.host.reserved_rows(id, s)) / kPageRows;
    if (want > have && want - have > t.host.free_host_pages(s)) return;  // both would throw host_pool_exhausted
    t.append(id, s, count);
    writer[id][s].resize(writer[id][s].size() + count, id);
  }
  void retain() {
    if (t.live.empty()) return;
    const request_id id = pick();
    const dh::prefix_id p = next_prefix++;
    std::array<std::int64_t, kSources> rows{};
    for (std::size_t s = 0; s < kSources; ++s) {
      const auto f = static_cast<std::size_t>(t.host.frontier(id, s));
      rows[s] = t.chance(0.5) ? static_cast<std::int64_t>(f) : static_cast<std::int64_t>(t.uniform(f + 1));
    }
    std::vector<dh::prefix_id> a, b;
    bool host_threw = false, dev_threw = false;
    try {
      a = t.host.retain_prefix(p, id, rows);
    } catch (const dh::prefix_budget_exceeded&) {
      host_threw = true;
    }
    try {
      b = t.dev.retain_prefix(p, id, rows);
    } catch (const dh::prefix_budget_exceeded&) {
      dev_threw = true;
    }
    REQUIRE(host_threw == dev_threw);
    if (host_threw) return;
    REQUIRE(a == b);
    evictions += a.size();
    for (auto v : a) prefix_writer.erase(v);
    auto& w = prefix_writer[p];
    for (std::size_t s = 0; s < kSources; ++s)
      w[s].assign(writer[id][s].begin(), writer[id][s].begin() + rows[s]);
  }
  void release() {
    const auto held = t.host.retained_prefixes();
    if (held.empty()) return;
    const dh::prefix_id p = held[t.uniform(held.size())];
    t.host.release_prefix(p);
    t.dev.release_prefix(p);
    prefix_writer.erase(p);
    REQUIRE_THROWS_AS(t.dev.release_prefix(p), dh::unknown_prefix);
  }
  void map() {
    if (t.live.empty()) return;
    const request_id id = pick();
    const std::size_t s = t.uniform(kSources);
    const std::size_t complete = static_cast<std::size_t>(t.host.frontier(id, s)) / kPageRows;
    if (complete == 0) return;
    t.map_page(id, s, t.uniform(complete));
  }
  void unmap() {
    if (t.live.empty()) return;
    const request_id id = pick();
    const std::size_t s = t.uniform(kSources);
    t.unmap_page(id, s, t.uniform((t.cfg.max_rows + kPageRows - 1) / kPageRows));
  }
  void complete() {
    if (t.live.empty()) return;
    const request_id id = pick();
    t.complete(id);
    writer.erase(id);
  }
  void resolve(const std::string& ctx) {
    if (t.live.empty()) return;
    const std::size_t s = t.uniform(kSources);
    std::vector<Twin::request_selection> batch;
    std::vector<request_id> ids = t.live;
    std::shuffle(ids.begin(), ids.end(), t.rng);
    ids.resize(std::min<std::size_t>(ids.size(), 1 + t.uniform(4)));
    for (request_id id : ids) batch.push_back({id, t.make_selection(id, s, 1 + t.uniform(Layout::top_k))});
    const auto locs = t.resolve(s, batch, dh::copy_layers::all, false, ctx);
    ++resolves;
    // Every selected row holds the bytes its writer wrote (a prefix row: the prefix's writer).
    const auto& d = Layout::sources[s];
    std::vector<std::byte> want(d.row_bytes);
    for (std::size_t l = 0; l < d.payload_layers; ++l) {
      std::vector<std::byte> pool(t.dev.pool_rows() * d.row_bytes);
      t.dev.copy_pool(s, l, pool);
      for (std::size_t e = 0; e < batch.size(); ++e)
        for (std::size_t i = 0; i < batch[e].selection.size(); ++i) {
          const row_index r = batch[e].selection[i];
          if (r == dh::no_row) continue;
          const request_id w = writer.at(batch[e].id)[s].at(static_cast<std::size_t>(r));
          fill_row(want.data(), d.row_bytes, w, s, l, r);
          if (std::memcmp(pool.data() + static_cast<std::size_t>(locs[e][i]) * d.row_bytes, want.data(), d.row_bytes) != 0)
            DHTEST_FAIL(ctx << ": request " << batch[e].id << " source " << s << " layer " << l << " row " << r
                            << " (written by " << w << ") has other bytes at location " << locs[e][i]);
        }
    }
  }
  void compare(const std::string& ctx) {
    INFO(ctx);
    t.compare_pools(ctx);
    for (request_id id : t.live)
      for (std::size_t s = 0; s < kSources; ++s) {
        INFO("request " << id << " source " << s);
        DHTEST_REQUIRE_SAME(row_index, "hot rows", t.host.hot_rows_of(id, s), t.dev.hot_rows_of(id, s));
        DHTEST_REQUIRE_SAME(Hot::order_index, "LRU order", t.host.lru_order_of(id, s), t.dev.lru_order_of(id, s));
        DHTEST_REQUIRE_SAME(std::int32_t, "optional map", t.host.optional_map_of(id, s), t.dev.optional_map_of(id, s));
        REQUIRE(t.dev.device_frontier(id, s) == static_cast<std::int64_t>(writer.at(id)[s].size()));
        REQUIRE(t.host.frontier(id, s) == static_cast<std::int64_t>(writer.at(id)[s].size()));
        const auto hp = t.host.host_pages_of(id, s);
        const auto dp = t.dev.host_pages_of(id, s);
        REQUIRE(std::equal(hp.begin(), hp.end(), dp.begin(), dp.end()));
      }
    for (std::size_t s = 0; s < kSources; ++s) {
      REQUIRE(t.host.free_host_pages(s) == t.dev.free_host_pages(s));
      REQUIRE(t.host.free_optional_pages(s) == t.dev.free_optional_pages(s));
      REQUIRE(t.host.prefix_pages_held(s) == t.dev.prefix_pages_held(s));
      for (dh::page_id g = 0; g < static_cast<dh::page_id>(t.cfg.host_pages); ++g) {
        REQUIRE(t.host.host_page_refs(s, g) == t.dev.host_page_refs(s, g));
        REQUIRE(t.host.host_page_prefix_refs(s, g) == t.dev.host_page_prefix_refs(s, g));
      }
    }
    REQUIRE(t.host.retained_prefixes() == t.dev.retained_prefixes());
  }

  void run(std::size_t ops, const std::string& name) {
    for (std::size_t i = 0; i < ops; ++i) {
      const std::string ctx = name + " op " + std::to_string(i);
      const std::size_t roll = t.uniform(100);
      if (roll < 8) admit_plain();
      else if (roll < 20) admit_on_prefix();
      else if (roll < 45) append();
      else if (roll < 55) retain();
      else if (roll < 59) release();
      else if (roll < 65) map();
      else if (roll < 68) unmap();
      else if (roll < 75) complete();
      else resolve(ctx);
      if (i % 25 == 0) compare(ctx);
    }
    compare(name + " end");
  }
};

}  // namespace

TEST_CASE("shared prefixes: the CUDA hierarchy matches the host reference", "[gpu][differential][prefix]") {
  require_device();
  {
    prefix_run run({.max_requests = 6, .max_rows = 64, .host_pages = 40, .optional_pages = 10, .prefix_pages = 12}, 101);
    run.run(4000, "tiny/budget 12");
    INFO(run.shared_admits << " admissions on a prefix, " << run.evictions << " evictions");
    CHECK(run.shared_admits > 50);
    CHECK(run.evictions > 0);
  }
  {
    // A tail that is not a whole page (the tail fill crosses the boundary page).
    prefix_run run({.max_requests = 4, .max_rows = 96, .tail_rows = 11, .optional_pages = 16, .prefix_pages = 20}, 102);
    run.run(3000, "tiny/tail 11");
    CHECK(run.shared_admits > 50);
  }
}

TEST_CASE("shared prefixes on the CUDA hierarchy: typed errors leave the state unchanged", "[gpu][prefix]") {
  require_device();
  Twin t({.max_requests = 3, .max_rows = 64, .optional_pages = 4, .prefix_pages = 3}, 7);
  REQUIRE(t.admit(1));
  t.append(1, 0, 20);
  t.append(1, 1, 20);
  REQUIRE(t.dev.retain_prefix(5, 1).empty());
  const std::size_t free0 = t.dev.free_host_pages(0);
  REQUIRE_THROWS_AS(t.dev.retain_prefix(5, 1), dh::duplicate_prefix);
  REQUIRE_THROWS_AS(t.dev.admit(2, dh::prefix_id{6}), dh::unknown_prefix);
  REQUIRE_THROWS_AS(t.dev.admit(1, dh::prefix_id{5}), dh::duplicate_admission);
  const std::array<std::int64_t, 2> beyond{21, 0};
  REQUIRE_THROWS_AS(t.dev.retain_prefix(6, 1, beyond), dh::position_beyond_frontier);
  t.append(1, 0, 20);  // 40 rows: 5 pages on source 0, the budget is 3
  REQUIRE_THROWS_AS(t.dev.retain_prefix(6, 1), dh::prefix_budget_exceeded);
  CHECK(t.dev.contains_prefix(5));
  CHECK(t.dev.free_host_pages(0) == free0 - 2);  // only the two new pages of request 1
  t.dev.release_prefix(5);
  REQUIRE_THROWS_AS(t.dev.release_prefix(5), dh::unknown_prefix);
  CHECK_FALSE(t.dev.contains(2));
}
