// The ready-made layouts (tiny, GLM-5.3-like, DeepSeek-V4.1-Flash-like): their compile-time facts,
// which host_hierarchy instantiations model FusedResolver, and a decode step end to end through
// every consumer of a layout (reindex -> resolve, follower -> copy_follower, reuse -> the previous
// locations), checking the bytes every consumer would read.
#include "../support/catch.hpp"

#include <dhisparse/host/hierarchy.hpp>
#include <dhisparse/layouts/deepseek_v41_flash.hpp>
#include <dhisparse/layouts/glm53.hpp>
#include <dhisparse/layouts/tiny.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <type_traits>
#include <vector>

#include "../support/reference_model.hpp"
#include "../support/row_content.hpp"

using namespace dhisparse;

namespace {

/// GLM-5.3's structure (21 producers, 78 payload layers of 576-byte rows, pages of 64) with a
/// reduced top_k, so that a hot cache of a few hundred rows suffices for a quick end-to-end run.
struct glm53_reduced {
  static constexpr std::size_t top_k = 96;
  static constexpr std::size_t page_rows = layouts::glm53::page_rows;
  static constexpr auto sources = layouts::glm53::sources;
  static constexpr auto consumers = layouts::glm53::consumers;
};

/// Policies written by a user, to show the concepts are the only contract.
struct user_hot_cache {
  static constexpr std::size_t rows = 3000;  // not a power of two; >= top_k of every layout here
  using order_index = std::uint32_t;
};
struct user_residency {
  static constexpr bool keeps_optional_history = true;
  static constexpr const char* name = "user";
};

struct bad_row_bytes_layout {  // 40-byte rows: not a multiple of 16
  static constexpr std::size_t top_k = 8;
  static constexpr std::size_t page_rows = 8;
  static constexpr std::array<source_desc, 1> sources{{{40, 1, 1, 0}}};
  static constexpr std::array<consumer_desc, 1> consumers{{{0, consumer_kind::reindex, 0}}};
};
struct follower_first_layout {  // a source whose first consumer does not resolve
  static constexpr std::size_t top_k = 8;
  static constexpr std::size_t page_rows = 8;
  static constexpr std::array<source_desc, 1> sources{{{32, 1, 2, 0}}};
  static constexpr std::array<consumer_desc, 2> consumers{{{0, consumer_kind::follower, 1},
                                                           {0, consumer_kind::reindex, 0}}};
};
struct bad_consumer_layer_layout {  // a consumer reading a payload layer the source does not have
  static constexpr std::size_t top_k = 8;
  static constexpr std::size_t page_rows = 8;
  static constexpr std::array<source_desc, 1> sources{{{32, 1, 1, 0}}};
  static constexpr std::array<consumer_desc, 2> consumers{{{0, consumer_kind::reindex, 0},
                                                           {0, consumer_kind::follower, 1}}};
};

// --- compile-time facts ---------------------------------------------------------------------------
// GLM-5.3: 21 index producers, 78 payload layers of 576 B, top-k 2048, pages of 64.
static_assert(valid_layout<layouts::glm53>);
static_assert(layouts::glm53::top_k == 2048 && layouts::glm53::page_rows == 64);
static_assert(source_count<layouts::glm53> == 21 && consumer_count<layouts::glm53> == 78);
static_assert(payload_layer_count<layouts::glm53>() == 78);
static_assert(resolver_calls_per_step<layouts::glm53>() == 21);
static_assert(follower_copies_per_step<layouts::glm53>() == 57);
static_assert(payload_bytes_per_row<layouts::glm53>() == 78 * 576);
static_assert(layouts::glm53::index_key_bytes == 132);
// DeepSeek-V4.1-Flash: 8 resolver calls a step, no follower copy, rows about half of GLM's.
static_assert(valid_layout<layouts::deepseek_v41_flash>);
static_assert(layouts::deepseek_v41_flash::top_k == 512 && layouts::deepseek_v41_flash::page_rows == 64);
static_assert(source_count<layouts::deepseek_v41_flash> == 8 && consumer_count<layouts::deepseek_v41_flash> == 40);
static_assert(resolver_calls_per_step<layouts::deepseek_v41_flash>() == 8);
static_assert(follower_copies_per_step<layouts::deepseek_v41_flash>() == 0);
static_assert(payload_layer_count<layouts::deepseek_v41_flash>() == 8);
static_assert(2 * layouts::deepseek_v41_flash::payload_row_bytes == layouts::glm53::payload_row_bytes);
// tiny: a producer with a follower, and a shared source read by reindex, reuse, reindex.
static_assert(valid_layout<layouts::tiny>);
static_assert(source_count<layouts::tiny> == 2 && consumer_count<layouts::tiny> == 5);
static_assert(payload_layer_count<layouts::tiny>() == 3);
static_assert(resolver_calls_per_step<layouts::tiny>() == 3);
static_assert(follower_copies_per_step<layouts::tiny>() == 1);
static_assert(payload_bytes_per_row<layouts::tiny>() == 2 * 64 + 32);
static_assert(valid_layout<glm53_reduced>);
// Broken layouts are recognised.
static_assert(!KvLayout<int>);
static_assert(!valid_layout<bad_row_bytes_layout>);
static_assert(!valid_layout<follower_first_layout>);
static_assert(!valid_layout<bad_consumer_layer_layout>);

// --- FusedResolver --------------------------------------------------------------------------------
static_assert(FusedResolver<host_hierarchy<layouts::tiny, lru_hot_cache<16>>>);
static_assert(FusedResolver<host_hierarchy<layouts::tiny, lru_hot_cache<32>>>);
static_assert(FusedResolver<host_hierarchy<layouts::tiny>>);  // default HotCache<4096>
static_assert(FusedResolver<host_hierarchy<layouts::glm53>>);
static_assert(FusedResolver<host_hierarchy<layouts::glm53, lru_hot_cache<2048>>>);
static_assert(FusedResolver<host_hierarchy<layouts::deepseek_v41_flash, lru_hot_cache<512>>>);
static_assert(FusedResolver<host_hierarchy<layouts::deepseek_v41_flash>>);
static_assert(FusedResolver<host_hierarchy<glm53_reduced, lru_hot_cache<128>>>);
static_assert(FusedResolver<host_hierarchy<layouts::glm53, user_hot_cache>>);
static_assert(FusedResolver<host_hierarchy<layouts::tiny, lru_hot_cache<70000>, user_residency>>);
static_assert(!FusedResolver<int>);
static_assert(!FusedResolver<layouts::tiny>);
static_assert(HotCachePolicy<user_hot_cache> && ResidencyPolicy<user_residency>);
static_assert(!HotCachePolicy<int> && !ResidencyPolicy<int>);
// order_index is wide enough for B slots
static_assert(std::is_same_v<host_hierarchy<layouts::tiny, lru_hot_cache<65536>>::order_index, std::uint16_t>);
static_assert(std::is_same_v<host_hierarchy<layouts::tiny, lru_hot_cache<65537>>::order_index, std::uint32_t>);
static_assert(host_hierarchy<layouts::glm53>::sources == 21 && host_hierarchy<layouts::glm53>::hot_rows == 4096 &&
              host_hierarchy<layouts::glm53>::top_k == 2048 && host_hierarchy<layouts::glm53>::page_rows == 64);

// --- one decode step through every consumer --------------------------------------------------------

struct step_totals {
  std::size_t resolves = 0, follower_copies = 0, reuses = 0, rows_checked = 0, rows_copied = 0, hot = 0;
};

/// Admits `requests` requests, appends `history` rows to every source, then runs `steps` decode
/// steps: each step appends one row everywhere and walks the layout's consumers in order. Every
/// consumer's bytes are checked at the locations it would read.
template <class Layout, class Hot>
step_totals run_steps(const hierarchy_config& cfg, std::size_t requests, std::size_t history, std::size_t steps,
                      std::uint64_t seed) {
  using H = host_hierarchy<Layout, Hot>;
  H h(cfg);
  using dhisparse_testing::model_geometry;
  dhisparse_testing::reference_hierarchy ref(model_geometry::of(cfg, Hot::rows, Layout::page_rows), H::sources,
                                             cfg.max_rows, model_geometry::host_pages_of(cfg, Layout::page_rows));
  dhisparse_testing::test_rng rng(seed);
  step_totals t;
  std::vector<request_id> ids;
  auto append = [&](request_id id, std::size_t s, std::size_t count) {
    const auto& d = Layout::sources[s];
    const auto buf = dhisparse_testing::make_append_buffer(dhisparse_testing::request_tag(id), s, d.payload_layers,
                                                           d.row_bytes, h.frontier(id, s), count);
    h.append(id, s, buf, count);
    ref.append(id, s, count);
  };
  for (std::size_t i = 0; i < requests; ++i) {
    const request_id id = 7000 + 13 * i;
    REQUIRE(h.admit(id).admitted);
    REQUIRE(ref.admit(id).has_value());
    ids.push_back(id);
    for (std::size_t s = 0; s < H::sources; ++s) append(id, s, history);
  }
  auto check = [&](request_id id, std::size_t s, std::size_t layer, const std::vector<row_index>& sel,
                   const std::vector<location>& loc) {
    for (std::size_t i = 0; i < sel.size(); ++i) {
      if (sel[i] == no_row) {
        REQUIRE(loc[i] == no_location);
        continue;
      }
      ++t.rows_checked;
      const auto bytes = h.payload(s, layer, loc[i]);
      if (dhisparse_testing::row_matches(bytes, dhisparse_testing::request_tag(id), s, layer, sel[i])) continue;
      CAPTURE(id, s, layer, i, sel[i], loc[i]);
      INFO(dhisparse_testing::describe_row_mismatch(bytes, dhisparse_testing::request_tag(id), s, layer, sel[i]));
      REQUIRE(false);
    }
  };

  for (std::size_t step = 0; step < steps; ++step) {
    for (request_id id : ids)
      for (std::size_t s = 0; s < H::sources; ++s) append(id, s, 1);
    // the locations each source's last resolving consumer produced, per request
    std::map<std::size_t, std::vector<std::pair<std::vector<row_index>, std::vector<location>>>> current;
    for (const consumer_desc& c : Layout::consumers) {
      const std::size_t s = c.source;
      const std::size_t layers = Layout::sources[s].payload_layers;
      if (c.kind == consumer_kind::reindex) {
        auto& cur = current[s];
        cur.clear();
        std::vector<std::pair<std::uint64_t, std::vector<row_index>>> batch;
        for (request_id id : ids) {
          dhisparse_testing::selection_mix mix;
          mix.window_rows = 2 * Layout::top_k;
          auto sel = dhisparse_testing::make_selection(rng, ref.model(id, s), Layout::top_k, mix);
          batch.emplace_back(id, sel);
          cur.emplace_back(std::move(sel), std::vector<location>(Layout::top_k, -7));
        }
        std::vector<resolve_item> items;
        for (std::size_t b = 0; b < ids.size(); ++b) items.push_back({ids[b], cur[b].first, cur[b].second});
        const copy_layers mode = layers > 1 ? copy_layers::producer_only : copy_layers::all;
        const resolve_stats st = h.resolve(s, items, mode);
        const auto want = ref.resolve(s, batch);
        for (std::size_t b = 0; b < ids.size(); ++b)
          for (std::size_t i = 0; i < Layout::top_k; ++i) {
            if (cur[b].second[i] == want[b].entries[i].loc) continue;
            CAPTURE(b, i, cur[b].first[i], cur[b].second[i], want[b].entries[i].loc);
            REQUIRE(cur[b].second[i] == want[b].entries[i].loc);
          }
        REQUIRE(st.selected == st.direct + st.hot + st.host);
        ++t.resolves;
        t.rows_copied += st.rows_copied;
        t.hot += st.hot;
        for (std::size_t b = 0; b < ids.size(); ++b)
          for (std::size_t l = 0; l < (mode == copy_layers::all ? layers : 1); ++l)
            check(ids[b], s, l, cur[b].first, cur[b].second);
      } else if (c.kind == consumer_kind::follower) {
        const std::size_t bytes = h.copy_follower(s, c.payload_layer);
        REQUIRE(bytes == h.last_plan(s).size() * Layout::sources[s].row_bytes);
        ++t.follower_copies;
        for (std::size_t b = 0; b < ids.size(); ++b)
          check(ids[b], s, c.payload_layer, current[s][b].first, current[s][b].second);
      } else {  // reuse: the previous consumer's locations and payload
        ++t.reuses;
        for (std::size_t b = 0; b < ids.size(); ++b)
          check(ids[b], s, c.payload_layer, current[s][b].first, current[s][b].second);
      }
    }
  }
  for (request_id id : ids) h.complete(id);
  for (std::size_t s = 0; s < H::sources; ++s) REQUIRE(h.free_host_pages(s) == h.config().host_pages);
  return t;
}

}  // namespace

TEST_CASE("layouts: runtime view of the compile-time facts", "[hierarchy][layouts]") {
  // the same facts as the static_asserts above, visible in a test report
  CHECK(payload_layer_count<layouts::glm53>() == 78);
  CHECK(resolver_calls_per_step<layouts::glm53>() == 21);
  CHECK(follower_copies_per_step<layouts::glm53>() == 57);
  std::size_t four = 0, three = 0;
  for (const auto& s : layouts::glm53::sources) {
    CHECK(s.row_bytes == 576);
    CHECK(s.positions_per_row == 1);
    four += s.payload_layers == 4 ? 1 : 0;
    three += s.payload_layers == 3 ? 1 : 0;
  }
  CHECK(four == 15);
  CHECK(three == 6);
  for (const auto& s : layouts::deepseek_v41_flash::sources) {
    CHECK(s.row_bytes == 288);
    CHECK(s.positions_per_row == 4);
    CHECK(s.payload_layers == 1);
  }
  // DeepSeek: every source is resolved once, then reused four times
  for (std::size_t i = 0; i < layouts::deepseek_v41_flash::consumers.size(); ++i) {
    const auto& c = layouts::deepseek_v41_flash::consumers[i];
    CHECK(c.source == i / 5);
    CHECK(c.kind == (i % 5 == 0 ? consumer_kind::reindex : consumer_kind::reuse));
  }
}

TEST_CASE("layouts: location space geometry of an instantiation", "[hierarchy][layouts]") {
  hierarchy_config cfg;
  cfg.max_requests = 3;
  cfg.max_rows = 64;
  cfg.tail_rows = 5;
  cfg.optional_pages = 2;
  host_hierarchy<layouts::tiny, lru_hot_cache<16>> h(cfg);
  const location_space sp = h.space();
  REQUIRE(sp.slots == 3);
  REQUIRE(sp.hot_rows == 16);
  REQUIRE(sp.tail_rows == 5);
  REQUIRE(sp.optional_pages == 2);
  REQUIRE(sp.page_rows == 8);
  REQUIRE(sp.rows() == 3 * (16 + 5) + 2 * 8);
  // hot, tail and optional regions are disjoint and cover the pool
  std::vector<int> owner(sp.rows(), 0);
  for (std::size_t s = 0; s < 3; ++s) {
    for (std::size_t w = 0; w < 16; ++w) ++owner[static_cast<std::size_t>(sp.hot(s, w))];
    for (std::int64_t r = 100; r < 105; ++r) ++owner[static_cast<std::size_t>(sp.tail(s, r))];
  }
  for (std::size_t g = 0; g < 2; ++g)
    for (std::int64_t r = 8; r < 16; ++r) ++owner[static_cast<std::size_t>(sp.optional(g, r))];
  for (int o : owner) REQUIRE(o == 1);
  // the default tail is one page, the default host store holds every slot at full capacity
  hierarchy_config d;
  d.max_requests = 2;
  d.max_rows = 20;
  host_hierarchy<layouts::tiny, lru_hot_cache<16>> h2(d);
  REQUIRE(h2.space().tail_rows == 8);
  REQUIRE(h2.config().host_pages == 2 * 3);
  REQUIRE(h2.free_host_pages(0) == 6);
  REQUIRE(h2.free_host_pages(1) == 6);
}

TEST_CASE("layouts: tiny, a decode step through every consumer", "[hierarchy][layouts]") {
  hierarchy_config cfg;
  cfg.max_requests = 3;
  cfg.max_rows = 256;
  const step_totals t = run_steps<layouts::tiny, lru_hot_cache<16>>(cfg, 3, 100, 20, 0x7171);
  CHECK(t.resolves == 20 * 3);
  CHECK(t.follower_copies == 20);
  CHECK(t.reuses == 20);
  CHECK(t.rows_copied > 0);
  CHECK(t.hot > 0);  // the second reindex of source 1 reuses rows the first one brought in
}

TEST_CASE("layouts: GLM-5.3 structure (21 producers, 78 payload layers of 576 B), reduced top_k",
          "[hierarchy][layouts]") {
  hierarchy_config cfg;
  cfg.max_requests = 2;
  cfg.max_rows = 3 * 64;
  cfg.optional_pages = 1;
  const step_totals t = run_steps<glm53_reduced, lru_hot_cache<128>>(cfg, 2, 150, 2, 0x6153);
  CHECK(t.resolves == 2 * 21);
  CHECK(t.follower_copies == 2 * 57);
  CHECK(t.reuses == 0);
  CHECK(t.rows_copied > 0);
}

TEST_CASE("layouts: DeepSeek-V4.1-Flash layout as shipped (top_k 512, 8 sources, reuse)", "[hierarchy][layouts]") {
  hierarchy_config cfg;
  cfg.max_requests = 2;
  cfg.max_rows = 1024;
  cfg.optional_pages = 2;
  const step_totals t = run_steps<layouts::deepseek_v41_flash, lru_hot_cache<512>>(cfg, 2, 900, 3, 0xD5E4);
  CHECK(t.resolves == 3 * 8);
  CHECK(t.follower_copies == 0);
  CHECK(t.reuses == 3 * 8 * 4);
  CHECK(t.rows_copied > 0);
  CHECK(t.hot > 0);
}
