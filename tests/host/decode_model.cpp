// The host model of the model-scale decode benchmark (benchmarks/detail/decode_model.hpp and
// decode_census.hpp): speculation schedule and accepted lengths, closed-loop admission against the
// paper's capacity figures, the queue, statistics, the drifting-query selections against a
// brute-force top-k computed here, the census on the host hierarchy, and the JSON/table writers.
#include "../support/catch.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include <dhisparse/layouts/deepseek_v41_flash.hpp>
#include <dhisparse/layouts/glm53.hpp>
#include <dhisparse/layouts/single_source.hpp>

#include "../../benchmarks/detail/decode_census.hpp"
#include "../../benchmarks/detail/decode_model.hpp"

namespace {

namespace dm = dhisparse_bench::decode;
constexpr std::uint64_t gib = 1ull << 30;

TEST_CASE("decode model: the paper's speculative block schedule by load") {
  for (std::uint64_t c : {1, 4, 16, 32}) CHECK(dm::spec_block_for_load(c) == 8);
  CHECK(dm::spec_block_for_load(33) == 6);
  CHECK(dm::spec_block_for_load(64) == 6);
  for (std::uint64_t c : {128, 208, 256}) CHECK(dm::spec_block_for_load(c) == 4);
}

TEST_CASE("decode model: accepted-length distribution is the truncated geometric it documents") {
  for (unsigned k : {4u, 6u, 8u}) {
    const dm::accepted_length_distribution d{0.7, k};
    double sum = 0.0, mean_tokens = 0.0;
    for (unsigned j = 0; j < k; ++j) {
      const double want = j + 1 < k ? std::pow(0.7, j) * 0.3 : std::pow(0.7, k - 1);
      CHECK(d.pmf(j) == Approx(want));
      sum += want;
      mean_tokens += (j + 1) * want;
    }
    CHECK(sum == Approx(1.0));
    CHECK(d.pmf(k) == 0.0);
    CHECK(d.mean_tokens() == Approx(mean_tokens));
    CHECK(d.mean_tokens() == Approx((1.0 - std::pow(0.7, k)) / 0.3));
    // Inverse CDF at the boundaries.
    CHECK(d.sample(0.0) == 0);
    CHECK(d.sample(0.2999) == 0);
    CHECK(d.sample(0.3001) == 1);
    CHECK(d.sample(0.999999) == k - 1);
    // The fixed stream reproduces the mean (20,000 draws: standard error well below 2 %).
    double drawn = 0.0;
    for (std::uint64_t r = 0; r < 20000; ++r) drawn += d.sample(dm::session_tag(r % 7), r) + 1.0;
    CHECK(drawn / 20000.0 == Approx(d.mean_tokens()).epsilon(0.02));
    CHECK(d.sample(123, 45) == d.sample(123, 45));
  }
}

TEST_CASE("decode model: Equation 13 as the paper applies it") {
  CHECK(dm::speculation_pays(1.0, 0.77));            // every session kept, faster tokens
  CHECK_FALSE(dm::speculation_pays(140.0 / 208.0, 0.71));  // the paper's C256 case: 0.67 < 0.71
}

TEST_CASE("decode model: Equation 13 verdict of a measured speculative run") {
  // 20 sessions without, 12 with the drafter (the paper's 100K crossover); plain step 10 ms.
  // 3 tokens a step in 20 ms: TPOT 6.67 ms against 10 ms, ratio 2/3 > 12/20 = 0.6: does not pay.
  const auto a = dm::speculation_verdict(12, 20, 20.0, 3.0, 10.0);
  CHECK(a.sessions_kept_share == Approx(0.6));
  CHECK(a.tpot_ratio == Approx(2.0 / 3.0));
  CHECK_FALSE(a.pays);
  // Every session kept and 2.5 tokens in 12 ms against 10 ms: ratio 0.48 < 1, pays.
  const auto b = dm::speculation_verdict(8, 8, 12.0, 2.5, 10.0);
  CHECK(b.tpot_ratio == Approx(0.48));
  CHECK(b.pays);
  // Nothing measured without speculation: no verdict.
  CHECK_FALSE(dm::speculation_verdict(8, 0, 12.0, 2.5, 10.0).pays);
  CHECK(dm::speculation_verdict(8, 8, 12.0, 2.5, 0.0).tpot_ratio == 0.0);
  // The drafter follows the schedule's block; the rest is DFlash2's.
  const auto d = dm::spec_drafter(4);
  CHECK(d.max_block == 4);
  CHECK(d.window == 2048);
  CHECK(d.draft_row_bytes == 12'288);
  // A smaller block charges less per session, so never fewer sessions are admitted.
  const auto glm = dhisparse::shape_of<dhisparse::layouts::glm53>();
  const std::uint64_t budget = 90ull << 30;
  const auto k8 = dm::admit_closed_loop(dm::policy::adaptive, glm, 100'000, 256, budget, dm::spec_drafter(8));
  const auto k4 = dm::admit_closed_loop(dm::policy::adaptive, glm, 100'000, 256, budget, dm::spec_drafter(4));
  const auto none = dm::admit_closed_loop(dm::policy::adaptive, glm, 100'000, 256, budget);
  CHECK(k8.admitted <= k4.admitted);
  CHECK(k4.admitted < none.admitted);
}

TEST_CASE("decode model: closed-loop admission matches the paper's capacity and the planner") {
  const auto glm = dhisparse::shape_of<dhisparse::layouts::glm53>();
  const std::uint64_t budget = 90 * gib;
  // Own arithmetic: 100,000 tokens = 100,032 rows of 64-row pages.
  const std::uint64_t resident_session = (78ull * 576 + 21ull * 132) * 100'032;
  SECTION("resident admits what fits whole: 20 sessions at 100K (the paper's 'about 20')") {
    const auto lp = dm::admit_closed_loop(dm::policy::resident, glm, 100'000, 208, budget);
    CHECK(lp.per_session_bytes == resident_session);
    CHECK(lp.admitted == budget / resident_session);
    CHECK(lp.admitted == 20);
    CHECK(lp.planner_count == lp.admitted);
    CHECK(lp.waiting == 188);
  }
  SECTION("the hierarchy admits 208 at 100K (the paper's figure); 140-ish with DFlash2") {
    const auto lp = dm::admit_closed_loop(dm::policy::adaptive, glm, 100'000, 256, budget);
    CHECK(lp.admitted == 208);
    CHECK(lp.planner_count == 208);
    CHECK(lp.waiting == 48);
    const auto fb = dm::admit_closed_loop(dm::policy::fixed_budget, glm, 100'000, 256, budget);
    CHECK(fb.admitted == lp.admitted);
    const auto spec = dm::admit_closed_loop(dm::policy::adaptive, glm, 100'000, 256, budget - 6.6 * gib,
                                            dhisparse::drafters::dflash2);
    // 83.4 GiB / 0.492 GiB: 169 sessions; the paper's 140 also holds staging for its slots.
    CHECK(spec.admitted == static_cast<std::uint64_t>((budget - 6.6 * gib) / spec.per_session_bytes));
    // bench_decode --spec charges the fixed allocations through speculative_budget.
    const auto fixed = static_cast<std::uint64_t>(dm::spec_fixed_gib_default * gib);
    CHECK(dm::speculative_budget(budget, fixed) == budget - fixed);
    CHECK(dm::speculative_budget(fixed, budget) == 0);
    CHECK(dm::speculative_budget(budget, 0) == budget);
  }
  SECTION("below capacity everything is admitted") {
    for (auto p : {dm::policy::resident, dm::policy::fixed_budget, dm::policy::adaptive}) {
      const auto lp = dm::admit_closed_loop(p, glm, 32'000, 4, budget);
      CHECK(lp.admitted == 4);
      CHECK(lp.waiting == 0);
    }
  }
  SECTION("DeepSeek-V4.1-Flash packs 4 positions a row") {
    const auto ds = dhisparse::shape_of<dhisparse::layouts::deepseek_v41_flash>();
    const std::uint64_t rows = (100'000 / 4 + 63) / 64 * 64;
    const auto lp = dm::admit_closed_loop(dm::policy::resident, ds, 100'000, 5000, budget);
    CHECK(lp.per_session_bytes == rows * 8 * (288 + 132));
    CHECK(lp.admitted == budget / lp.per_session_bytes);
  }
}

TEST_CASE("decode model: the closed-loop queue") {
  SECTION("no wait while every session has a slot") {
    const auto q = dm::simulate_queue(16, 20, 256, 1.0, 2000);
    CHECK(q.mean_wait_steps == 0.0);
    CHECK(q.fill_steps == 0.0);
  }
  SECTION("twice the slots: Little's law, wait = (C - A) / A * G / tokens per step") {
    const std::uint64_t slots = 20, c = 40, g = 200;
    const auto q = dm::simulate_queue(c, slots, g, 1.0, 20'000);
    const double want = static_cast<double>(c - slots) / slots * g;
    CHECK(q.mean_wait_steps == Approx(want).epsilon(0.05));
    CHECK(q.fill_steps == 200.0);
    // Speculation commits more tokens a step: proportionally shorter waits.
    const auto s = dm::simulate_queue(c, slots, g, 4.0, 5'000);
    CHECK(s.mean_wait_steps == Approx(want / 4.0).epsilon(0.05));
  }
}

TEST_CASE("decode model: statistics") {
  std::vector<double> v;
  for (int i = 10; i >= 1; --i) v.push_back(i);
  CHECK(dm::quantile(v, 0.5) == 5.0);
  CHECK(dm::quantile(v, 0.9) == 9.0);
  CHECK(dm::quantile(v, 1.0) == 10.0);
  CHECK(dm::quantile({}, 0.5) == 0.0);
  const auto s = dm::summarize_steps({2.0, 2.0, 4.0}, 8, 1.0);
  CHECK(s.p50_ms == 2.0);
  CHECK(s.tokens_per_s == Approx(8 * 1000.0 / 2.0));
}

TEST_CASE("decode model: content bytes are finite fp8 and decode as e4m3") {
  CHECK(dm::fp8_e4m3_to_float(0x38) == 1.0f);
  CHECK(dm::fp8_e4m3_to_float(0x3F) == 1.875f);
  CHECK(dm::fp8_e4m3_to_float(0xB8) == -1.0f);
  CHECK(dm::fp8_e4m3_to_float(0x08) == std::ldexp(1.0f, -6));
  CHECK(dm::fp8_e4m3_to_float(0x01) == std::ldexp(1.0f, -9));
  CHECK(dm::fp8_e4m3_to_float(0x30) == 0.5f);
  for (std::int64_t r = 0; r < 200; ++r)
    for (unsigned w = 0; w < 72; ++w) {
      const std::uint64_t x = dm::kv_word(dm::session_tag(3), 2, 1, r, w);
      for (unsigned b = 0; b < 8; ++b) {
        const float f = dm::fp8_e4m3_to_float(static_cast<std::uint8_t>(x >> (8 * b)));
        CHECK(std::abs(f) <= 1.875f);
      }
    }
  CHECK(dm::kv_word(1, 0, 0, 5, 0) != dm::kv_word(1, 0, 1, 5, 0));
  CHECK(dm::kv_word(1, 0, 0, 5, 0) != dm::kv_word(2, 0, 0, 5, 0));
}

TEST_CASE("decode model: attention queries are uniform in [-1, 1) / sqrt(row dims)") {
  for (unsigned dims : {576u, 288u}) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(dims));
    double sum = 0.0;
    std::set<float> seen;
    for (unsigned h = 0; h < 16; ++h)
      for (unsigned d = 0; d < dims; ++d) {
        const float q = dm::attention_query(dm::session_tag(4), 1, 2, h, d, dims);
        CHECK(q >= -bound * (1 + 1e-6));
        CHECK(q < bound * (1 + 1e-6));
        sum += static_cast<double>(q) / bound;
        seen.insert(q);
      }
    CHECK(std::abs(sum / (16.0 * dims)) < 0.05);  // mean 0, sd 1/sqrt(3) / sqrt(16 dims)
    CHECK(seen.size() > 16 * dims * 99 / 100);     // distinct per (head, dim)
  }
  // Every coordinate changes the query.
  const float q = dm::attention_query(7, 0, 0, 0, 0, 576);
  CHECK(q != dm::attention_query(8, 0, 0, 0, 0, 576));
  CHECK(q != dm::attention_query(7, 1, 0, 0, 0, 576));
  CHECK(q != dm::attention_query(7, 0, 1, 0, 0, 576));
  CHECK(q != dm::attention_query(7, 0, 0, 1, 0, 576));
  CHECK(q != dm::attention_query(7, 0, 0, 0, 1, 576));
}

// Brute-force top-k: every score computed from the key bytes here, then sorted.
std::vector<std::int32_t> brute_top_k(const std::array<int, dm::index_dims>& q, std::uint64_t tag, std::int64_t n,
                                      std::size_t k) {
  std::vector<std::pair<double, std::int32_t>> all;
  for (std::int64_t r = 0; r < n; ++r) {
    long dot = 0;
    for (unsigned d = 0; d < dm::index_dims; ++d) {
      const auto byte = static_cast<std::uint8_t>(dm::key_word(tag, 0, r, d / 8) >> (8 * (d % 8)));
      dot += static_cast<long>(q[d]) * (static_cast<int>(byte & 0x7F) - 64);  // documented: uniform in [-64, 63]
    }
    all.emplace_back(static_cast<double>(dot) * dm::key_scale(tag, 0, r), static_cast<std::int32_t>(r));
  }
  std::sort(all.begin(), all.end(), [](auto a, auto b) { return a.first != b.first ? a.first > b.first : a.second < b.second; });
  std::vector<std::int32_t> out(k, -1);
  for (std::size_t i = 0; i < std::min<std::size_t>(k, all.size()); ++i) out[i] = all[i].second;
  return out;
}

double overlap(const std::vector<std::int32_t>& a, const std::vector<std::int32_t>& b) {
  const std::set<std::int32_t> sa(a.begin(), a.end());
  std::size_t n = 0;
  for (auto x : b) n += x >= 0 && sa.count(x) ? 1 : 0;
  return static_cast<double>(n) / static_cast<double>(a.size());
}

TEST_CASE("decode model: selections are the exact top-k and drift controls their locality") {
  const std::uint64_t tag = dm::session_tag(9);
  dm::query_walk w(tag, 0, 0.1f);
  for (int i = 0; i < 3; ++i) w.advance();
  CHECK(dm::select_top_k(w.quantised(), tag, 0, 700, 64) == brute_top_k(w.quantised(), tag, 700, 64));
  const auto short_sel = dm::select_top_k(w.quantised(), tag, 0, 10, 16);
  CHECK(std::count(short_sel.begin(), short_sel.end(), -1) == 6);

  const auto mean_overlap = [&](float rho) {
    dm::query_walk q(tag, 0, rho);
    auto prev = dm::select_top_k(q.quantised(), tag, 0, 2048, 128);
    double sum = 0.0;
    for (int t = 0; t < 10; ++t) {
      q.advance();
      auto cur = dm::select_top_k(q.quantised(), tag, 0, 2048, 128);
      sum += overlap(prev, cur);
      prev = std::move(cur);
    }
    return sum / 10.0;
  };
  const double still = mean_overlap(0.0f), slow = mean_overlap(0.05f), fast = mean_overlap(0.5f), fresh = mean_overlap(1.0f);
  CHECK(still == 1.0);
  CHECK(slow > fast);
  CHECK(fast > fresh);
  CHECK(fresh < 0.3);  // independent queries: about k/n = 6 % in common, plus the rows whose keys score high for most queries
}

TEST_CASE("decode model: host census of the locality model") {
  using L = dhisparse::layouts::single_source<16, 64, 16>;
  dm::census_inputs in;
  in.sessions = 3;
  in.context_rows = 1024;
  in.steps = 16;
  in.warmup = 4;
  in.rho = 0.05f;
  const auto slow = dm::run_host_census<L, 128>(in);
  in.rho = 0.6f;
  const auto fast = dm::run_host_census<L, 128>(in);
  CHECK(slow.selected == 3 * 12 * 64);
  CHECK(slow.direct + slow.hot + slow.host == slow.selected);
  CHECK(slow.share(slow.host) < fast.share(fast.host));  // more drift, more misses
  CHECK(slow.share(slow.hot) > 0.5);
  in.placement = dm::policy::adaptive;
  const auto adaptive = dm::run_host_census<L, 128>(in);
  CHECK(adaptive.share(adaptive.direct) > 0.95);  // every complete page mapped: only rows past them miss
  CHECK(adaptive.host < fast.host);
  in.optional_pages = 32;  // a third of the pages: the rest served as under a fixed budget
  const auto partial = dm::run_host_census<L, 128>(in);
  CHECK(partial.direct < adaptive.direct);
  CHECK(partial.direct > 0);
}

TEST_CASE("decode model: results table and JSON") {
  dm::result_row r;
  r.model = "glm53";
  r.policy = "adaptive";
  r.context = 32000;
  r.target_c = 4;
  r.p50_ms = 1.5;
  r.tokens_per_s = 2666.7;
  r.phase_ms[4] = 0.25;
  r.note = "a \"quoted\" note";
  const std::string j = dm::to_json({r, r}, "{\"drift\": 0.05}");
  CHECK(j.find("\"schema\": \"dhisparse.bench_decode.v1\"") != std::string::npos);
  CHECK(j.find("\"settings\": {\"drift\": 0.05}") != std::string::npos);
  CHECK(j.find("\"attention\": 0.25") != std::string::npos);
  CHECK(j.find("a \\\"quoted\\\" note") != std::string::npos);
  CHECK(std::count(j.begin(), j.end(), '{') == std::count(j.begin(), j.end(), '}'));
  CHECK(dm::json_number(std::nan("")) == "null");
  // Every key benchmarks/plot_decode.py reads (tests/scripts/plot_decode_test.py uses the same).
  for (const char* key : {"\"model\"", "\"policy\"", "\"context\"", "\"target_c\"", "\"stand_in\"", "\"admitted\"",
                          "\"planner_count\"", "\"live\"", "\"p50_ms\"", "\"tokens_per_s\"", "\"host_share\"",
                          "\"phase_ms\"", "\"mismatches\"", "\"note\"", "\"follower_copies\"", "\"top_k\"",
                          "\"spec_block\"", "\"tokens_per_step\"", "\"eq13\": null", "\"tpot_ratio\""})
    CHECK(j.find(key) != std::string::npos);
  const std::string t = dm::to_table({r});
  CHECK(t.find("adaptive") != std::string::npos);
  CHECK(std::count(t.begin(), t.end(), '\n') == 2);
  r.spec_block = 8;
  r.eq13 = 1;
  CHECK(dm::to_table({r}).find(" pays ") != std::string::npos);
  CHECK(dm::to_json({r}, "").find("\"eq13\": true") != std::string::npos);
  CHECK(dm::to_json({}, "").find("\"results\": []") != std::string::npos);
  CHECK(dm::policy_by_name("fixed-budget") == dm::policy::fixed_budget);
  CHECK_FALSE(dm::policy_by_name("nope"));
}

}  // namespace
