// Memory planner: the paper's figures, the ring-size property, monotonicity, fit arithmetic,
// the DeepSeek-V4.1-Flash layout (the dhisparse-plan tool is tested in tools/tests).
#include "../support/catch.hpp"

#include <cstdint>
#include <set>
#include <string_view>
#include <vector>

#include <dhisparse/layouts/deepseek_v41_flash.hpp>
#include <dhisparse/layouts/glm53.hpp>
#include <dhisparse/layouts/tiny.hpp>
#include <dhisparse/planner.hpp>

namespace {

using namespace dhisparse;

constexpr std::uint64_t paper_context = 100'000;
constexpr std::uint64_t paper_history_rows = 100'032;  // 100,000 rounded up to 64-row pages
constexpr std::uint64_t glm_payload_layers = 78;
constexpr std::uint64_t glm_producers = 21;
constexpr std::uint64_t glm_row_bytes = 576;
constexpr std::uint64_t glm_index_key_bytes = 132;
constexpr std::uint64_t paper_slots = 35;

constexpr session_plan glm_plan(std::uint64_t context, drafter_shape drafter = drafters::none,
                                std::optional<std::uint64_t> arenas = std::nullopt) {
  return plan<layouts::glm53>({.context_tokens = context, .drafter = drafter, .staging_arenas = arenas});
}

constexpr session_plan glm_none = glm_plan(paper_context);
constexpr session_plan glm_dflash2 = glm_plan(paper_context, drafters::dflash2);
constexpr session_plan glm_dflash2_per_layer = glm_plan(paper_context, drafters::dflash2, glm_payload_layers);

// Compile-time: the paper's Table 1 and Section 3.4 figures, GiB = 2^30 bytes.
static_assert(glm_none.resident_total ==
              (glm_payload_layers * glm_row_bytes + glm_producers * glm_index_key_bytes) * paper_history_rows);
static_assert(gib_rounded(glm_none.hierarchical_total, 3) == 432);
static_assert(gib_rounded(glm_none.resident_total, 3) == 4444);
static_assert(gib_rounded(glm_dflash2.hierarchical_total, 3) == 492);
static_assert(gib_rounded(glm_dflash2.resident_total, 3) == 4469);
static_assert(glm_dflash2.ring_rows == 2176);
static_assert(gib_rounded(glm_dflash2.ring_bytes_for_slots, 2) == 87);
static_assert(gib_rounded(glm_dflash2.staging_bytes_for_slots, 2) == 123);
static_assert(gib_rounded(glm_dflash2_per_layer.staging_bytes_for_slots, 1) == 240);
static_assert(gib_rounded(glm_dflash2.hierarchical_total - glm_none.hierarchical_total, 3) == 60);
static_assert(gib_rounded(glm_dflash2.draft_ring, 3) == 25);

/// round(numerator / denominator * 10^decimals), integers only.
constexpr std::uint64_t rounded_ratio(std::uint64_t numerator, std::uint64_t denominator, unsigned decimals) {
  std::uint64_t scale = 1;
  for (unsigned i = 0; i < decimals; ++i) scale *= 10;
  return (numerator * scale + denominator / 2) / denominator;
}

}  // namespace

TEST_CASE("planner: GLM-5.3 shape derived from the layout", "[planner]") {
  constexpr model_shape s = shape_of<layouts::glm53>();
  STATIC_REQUIRE(s.payload_bytes_per_row == glm_payload_layers * glm_row_bytes);
  REQUIRE(s.payload_bytes_per_row == 44'928);
  REQUIRE(s.index_key_bytes_per_row == glm_producers * glm_index_key_bytes);
  REQUIRE(s.positions_per_row == 1);
  REQUIRE(s.page_rows == 64);
  REQUIRE(s.top_k == 2048);
  REQUIRE(s.payload_layers == glm_payload_layers);
  REQUIRE(s.sources == glm_producers);
  REQUIRE(s.max_live_payload_layers == 4);
  REQUIRE(s.widest_row_bytes == glm_row_bytes);
  REQUIRE(model_shape_by_name("glm-5.3") == s);
  REQUIRE(model_shape_by_name("deepseek-v4.1-flash") == shape_of<layouts::deepseek_v41_flash>());
  REQUIRE_FALSE(model_shape_by_name("glm-5").has_value());
}

TEST_CASE("planner: the paper's per-session figures at 100K (Table 1)", "[planner][paper]") {
  SECTION("without a drafter: 0.432 vs 4.444 GiB, 10.3x") {
    const auto p = plan<layouts::glm53>({.context_tokens = paper_context});
    REQUIRE(p.stored_rows == paper_context);
    REQUIRE(p.history_rows == paper_history_rows);
    REQUIRE(p.tail_rows == 64);
    REQUIRE(p.resident_total == 4'771'526'400);
    REQUIRE(p.hierarchical_total == 464'189'184);
    REQUIRE(p.index_keys == glm_producers * glm_index_key_bytes * paper_history_rows);
    REQUIRE(p.hot_cache == 4096 * glm_payload_layers * glm_row_bytes);
    REQUIRE(p.tail == 64 * glm_payload_layers * glm_row_bytes);
    REQUIRE(p.draft_ring == 0);
    REQUIRE(p.staging == 0);
    REQUIRE(gib_rounded(p.hierarchical_total, 3) == 432);
    REQUIRE(gib_rounded(p.resident_total, 3) == 4444);
    REQUIRE(rounded_ratio(p.resident_total, p.hierarchical_total, 1) == 103);  // "10.3x less"
    REQUIRE(p.resident_per_hierarchical > 10.25);
    REQUIRE(p.resident_per_hierarchical < 10.35);
  }
  SECTION("with DFlash2: 0.492 vs 4.469 GiB, +0.060 GiB, ring 0.025 GiB") {
    const auto none = plan<layouts::glm53>({.context_tokens = paper_context});
    const auto p = plan<layouts::glm53>({.context_tokens = paper_context, .drafter = drafters::dflash2});
    REQUIRE(p.staging_arenas == 4);
    REQUIRE(gib_rounded(p.hierarchical_total, 3) == 492);
    REQUIRE(gib_rounded(p.resident_total, 3) == 4469);
    REQUIRE(gib_rounded(p.hierarchical_total - none.hierarchical_total, 3) == 60);
    REQUIRE(p.hierarchical_total - none.hierarchical_total == p.draft_ring + p.staging);
    REQUIRE(p.resident_total - none.resident_total == p.draft_ring);  // resident needs no staging
    REQUIRE(gib_rounded(p.draft_ring, 3) == 25);
  }
}

TEST_CASE("planner: draft ring and staging per GPU (Section 3.4)", "[planner][paper]") {
  REQUIRE(drafters::dflash2.draft_row_bytes == 12'288);
  const auto p = plan<layouts::glm53>({.context_tokens = paper_context, .drafter = drafters::dflash2});
  REQUIRE(p.slots == paper_slots);
  REQUIRE(p.ring_rows == 2176);
  REQUIRE(p.draft_ring == 2176 * 12'288);
  REQUIRE(p.ring_bytes_for_slots == paper_slots * 2176 * 12'288);
  REQUIRE(gib_rounded(p.ring_bytes_for_slots, 2) == 87);  // 0.87 GiB

  SECTION("four reusable arenas: 1.23 GiB") {
    REQUIRE(p.staging == 4 * 8 * 2048 * glm_row_bytes);
    REQUIRE(gib_rounded(p.staging_bytes_for_slots, 2) == 123);
  }
  SECTION("one arena per payload layer: 24.0 GiB, 19.5x more") {
    const auto per_layer = plan<layouts::glm53>(
        {.context_tokens = paper_context, .drafter = drafters::dflash2, .staging_arenas = glm_payload_layers});
    REQUIRE(per_layer.staging_arenas == glm_payload_layers);
    REQUIRE(gib_rounded(per_layer.staging_bytes_for_slots, 1) == 240);
    REQUIRE(rounded_ratio(per_layer.staging_bytes_for_slots, p.staging_bytes_for_slots, 1) == 195);
  }
  SECTION("the ring is the same at 32K and 100K") {
    const auto at_32k = plan<layouts::glm53>({.context_tokens = 32'000, .drafter = drafters::dflash2});
    REQUIRE(at_32k.draft_ring == p.draft_ring);
    REQUIRE(gib_rounded(at_32k.draft_ring, 3) == 25);
  }
}

TEST_CASE("planner: R_d = p * ceil((W + K_max + p - 1) / p) covers every live position", "[planner][ring]") {
  struct case_t {
    std::uint64_t window, max_block, page;
  };
  const std::vector<case_t> cases{{2048, 8, 64}, {2048, 6, 64}, {2048, 4, 64}, {1024, 8, 64}, {0, 1, 1},
                                  {1, 1, 1},     {7, 3, 4},     {8, 8, 8},     {63, 1, 64},  {64, 1, 64},
                                  {100, 16, 16}, {5, 2, 3}};
  for (const auto& c : cases) {
    const drafter_shape d{.window = c.window, .max_block = c.max_block, .page_rows = c.page, .draft_row_bytes = 16};
    const std::uint64_t rows = draft_ring_rows(d);
    const std::uint64_t span = c.window + c.max_block + c.page - 1;
    INFO("W=" << c.window << " K_max=" << c.max_block << " p=" << c.page << " R_d=" << rows);
    REQUIRE(rows % c.page == 0);            // whole pages
    REQUIRE(rows >= span);                  // window + block + alignment
    REQUIRE(rows < span + c.page);          // the smallest such multiple
    // Live positions: a window of W plus a block of K_max; none share a ring row (phi(i,t) = t mod R_d).
    const std::uint64_t live = c.window + c.max_block;
    for (std::uint64_t start = 0; start < 2 * rows; start += 1 + rows / 7) {
      std::set<std::uint64_t> used;
      for (std::uint64_t t = start; t < start + live; ++t) used.insert(t % rows);
      REQUIRE(used.size() == live);
    }
  }
  REQUIRE(draft_ring_rows(drafters::none) == 0);
  REQUIRE(draft_ring_rows(drafters::dflash2) == 2176);
  // The paper: 2176 also covers the six- and four-query blocks.
  REQUIRE(draft_ring_rows({.window = 2048, .max_block = 6, .page_rows = 64, .draft_row_bytes = 1}) <= 2176);
  REQUIRE(draft_ring_rows({.window = 2048, .max_block = 4, .page_rows = 64, .draft_row_bytes = 1}) <= 2176);
}

TEST_CASE("planner: monotonic in context; the hierarchy's payload does not grow with it", "[planner]") {
  for (const auto& drafter : drafters::all) {
    INFO("drafter " << drafter.name);
    const auto base = glm_plan(1, drafter);
    const std::uint64_t fixed = base.hot_cache + base.tail + base.draft_ring + base.staging;
    std::uint64_t previous_resident = 0, previous_index_keys = 0, previous_host = 0;
    for (std::uint64_t context = 0; context <= 300'000; context += 997) {
      const auto p = glm_plan(context, drafter);
      REQUIRE(p.resident_total >= previous_resident);
      REQUIRE(p.index_keys >= previous_index_keys);
      REQUIRE(p.host_per_session >= previous_host);
      REQUIRE(p.hot_cache + p.tail + p.draft_ring + p.staging == fixed);
      REQUIRE(p.hierarchical_total == p.index_keys + fixed);
      REQUIRE(p.hierarchical_total <= p.resident_total + fixed);
      previous_resident = p.resident_total;
      previous_index_keys = p.index_keys;
      previous_host = p.host_per_session;
    }
  }
  SECTION("page rounding: rows of a partial page cost a whole page") {
    REQUIRE(glm_plan(64).history_rows == 64);
    REQUIRE(glm_plan(65).history_rows == 128);
    REQUIRE(glm_plan(0).history_rows == 0);
    REQUIRE(glm_plan(65).resident_total == glm_plan(128).resident_total);
  }
}

TEST_CASE("planner: sessions that fit in the pool", "[planner]") {
  const auto p = glm_plan(paper_context);
  REQUIRE(sessions_that_fit(10 * p.hierarchical_total, p.hierarchical_total) == 10);
  REQUIRE(sessions_that_fit(10 * p.hierarchical_total - 1, p.hierarchical_total) == 9);
  REQUIRE(sessions_that_fit(0, p.hierarchical_total) == 0);
  REQUIRE(sessions_that_fit(100, 0) == 0);
  REQUIRE_FALSE(p.resident_sessions_in_pool.has_value());

  SECTION("the pool counts are floor(pool / per-session total)") {
    const std::uint64_t pool = 100 * bytes_per_gib;
    const auto q = plan<layouts::glm53>({.context_tokens = paper_context, .pool_bytes = pool});
    REQUIRE(q.resident_sessions_in_pool == pool / q.resident_total);
    REQUIRE(q.hierarchical_sessions_in_pool == pool / q.hierarchical_total);
    REQUIRE(*q.resident_sessions_in_pool == 22);
    REQUIRE(*q.hierarchical_sessions_in_pool == 231);
  }
  SECTION("a 90 GiB pool gives the paper's 20 resident and 208 hierarchical sessions at 100K") {
    const auto q = plan<layouts::glm53>({.context_tokens = paper_context, .pool_bytes = 90 * bytes_per_gib});
    REQUIRE(*q.resident_sessions_in_pool == 20);
    REQUIRE(*q.hierarchical_sessions_in_pool == 208);
  }
  SECTION("host memory: 208 sessions back up 0.93 TB; a 4.3 TB host holds about 950") {
    constexpr std::uint64_t bytes_per_tb = 1'000'000'000'000;
    REQUIRE(rounded_ratio(208 * p.host_per_session, bytes_per_tb, 2) == 93);
    const std::uint64_t host_sessions = sessions_that_fit(43 * bytes_per_tb / 10, p.host_per_session);
    REQUIRE(host_sessions >= 940);
    REQUIRE(host_sessions <= 960);
  }
}

TEST_CASE("planner: metadata is reported separately", "[planner]") {
  const auto p = glm_plan(paper_context, drafters::dflash2);
  REQUIRE(p.metadata_hot_cache_map == glm_producers * 4096 * (sizeof(std::int32_t) + sizeof(std::uint16_t)));
  REQUIRE(p.history_pages == paper_history_rows / 64);
  REQUIRE(p.metadata_page_table == glm_producers * p.history_pages * 2 * sizeof(std::int32_t));
  REQUIRE(p.metadata_reverse_map == glm_producers * p.history_rows * sizeof(std::uint16_t));
  REQUIRE(p.metadata == p.metadata_hot_cache_map + p.metadata_page_table + p.metadata_reverse_map);
  REQUIRE(p.hierarchical_total == p.index_keys + p.hot_cache + p.tail + p.draft_ring + p.staging);
}

TEST_CASE("planner: DeepSeek-V4.1-Flash packs m = 4 positions per row", "[planner][deepseek]") {
  constexpr model_shape s = shape_of<layouts::deepseek_v41_flash>();
  REQUIRE(s.positions_per_row == 4);
  REQUIRE(s.sources == 8);
  REQUIRE(s.payload_layers == 8);
  REQUIRE(s.payload_bytes_per_row == 8 * 288);
  REQUIRE(s.index_key_bytes_per_row == 8 * 132);
  REQUIRE(s.top_k == 512);
  REQUIRE(s.max_live_payload_layers == 1);
  REQUIRE(s.widest_row_bytes == 288);

  const auto p = plan<layouts::deepseek_v41_flash>({.context_tokens = paper_context, .drafter = drafters::dspark});
  REQUIRE(p.stored_rows == paper_context / 4);
  REQUIRE(p.history_rows == 25'024);  // 25,000 rows in 391 pages
  REQUIRE(p.resident_total == 25'024 * (8 * 288 + 8 * 132) + p.draft_ring);
  REQUIRE(p.staging_arenas == 1);
  REQUIRE(p.staging == 1 * 8 * 512 * 288);
  REQUIRE(p.ring_rows == 64 * 18);  // ceil((1024 + 8 + 63) / 64) = 18 pages
  REQUIRE(plan<layouts::deepseek_v41_flash>({.context_tokens = 5}).stored_rows == 2);  // partial row counts
  // Per stored token, DeepSeek's GPU-resident history is far smaller than GLM-5.3's.
  REQUIRE(p.resident_total < glm_plan(paper_context, drafters::dspark).resident_total / 10);
}

TEST_CASE("planner: the tiny layout", "[planner]") {
  constexpr model_shape s = shape_of<layouts::tiny>();
  REQUIRE(s.payload_bytes_per_row == 2 * 64 + 32);
  REQUIRE(s.index_key_bytes_per_row == 64);
  REQUIRE(s.max_live_payload_layers == 2);
  REQUIRE(s.widest_row_bytes == 64);
  REQUIRE(s.page_rows == 8);
  const auto p = plan<layouts::tiny>({.context_tokens = 100, .hot_rows = 16});
  REQUIRE(p.history_rows == 104);
  REQUIRE(p.hierarchical_total == 104 * 64 + 16 * 160 + 8 * 160);
}

TEST_CASE("planner: invalid inputs throw planner_error", "[planner]") {
  const model_shape glm = shape_of<layouts::glm53>();
  REQUIRE_THROWS_AS(plan(glm, {.context_tokens = 1, .hot_rows = 2047}), planner_error);
  REQUIRE_THROWS_AS(plan(glm, {.context_tokens = 1, .tail_rows = 0}), planner_error);
  REQUIRE_THROWS_AS(plan(glm, {.context_tokens = 1, .slots = 0}), planner_error);
  REQUIRE_THROWS_AS(plan(glm, {.context_tokens = 1, .staging_arenas = 0}), planner_error);
  REQUIRE_THROWS_AS(plan(glm, {.context_tokens = 1, .staging_arenas = 79}), planner_error);
  REQUIRE_THROWS_AS(plan(glm, {.context_tokens = 1, .tail_rows = 7, .drafter = drafters::dflash2}), planner_error);
  REQUIRE_THROWS_AS(plan(glm, {.context_tokens = std::uint64_t{1} << 62}), planner_error);  // bytes overflow
  REQUIRE_NOTHROW(plan(glm, {.context_tokens = 1, .hot_rows = 2048, .staging_arenas = 78}));
  REQUIRE(plan_input_problem(glm, {.context_tokens = 1}).empty());
}
