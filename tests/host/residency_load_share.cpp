// Informational: where the selected rows of a demo-like decode come from (directly: tail or ready
// optional history; hot cache; recovered from host) at low load (few requests) and high load (many
// requests) under adaptive residency and the fixed budget, with the locality generator of
// workload/selection_generator.hpp. Prints the shares; asserts no timing, only that optional
// history never lowers the direct share and that the run stays exact and within Invariant 3.
#include "../support/catch.hpp"

#include <dhisparse/host/hierarchy.hpp>
#include <dhisparse/host/residency_manager.hpp>
#include <dhisparse/workload/selection_generator.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "../support/row_content.hpp"

namespace {

using namespace dhisparse;

/// One GLM-5.3-shaped source scaled down (top-k 256, pages of 64 rows), small rows to stay fast.
struct demo_like {
  static constexpr std::size_t top_k = 256;
  static constexpr std::size_t page_rows = 64;
  static constexpr std::array<source_desc, 1> sources{{{64, 1, 1, 32}}};
  static constexpr std::array<consumer_desc, 1> consumers{{{0, consumer_kind::reindex, 0}}};
};
static_assert(valid_layout<demo_like> && check_layout<demo_like>());
using H = host_hierarchy<demo_like, lru_hot_cache<512>>;

constexpr std::size_t kMaxRows = 8192, kImported = 6144, kSteps = 48;

struct shares {
  resolve_stats stats;
  std::size_t optional_pages = 0, reclaimed = 0, requests = 0;
  double direct() const { return static_cast<double>(stats.direct) / static_cast<double>(stats.selected); }
  double hot() const { return static_cast<double>(stats.hot) / static_cast<double>(stats.selected); }
  double host() const { return static_cast<double>(stats.host) / static_cast<double>(stats.selected); }
};

template <class Policy>
shares run(std::size_t requests) {
  hierarchy_config hc;
  hc.max_requests = requests;
  hc.max_rows = kMaxRows;
  hc.optional_pages = 512;  // M per source; 8 required pages a request, reserve 16
  residency_manager<H, Policy> m(hc, {8, 16});
  workload::selection_params p;
  p.top_k = demo_like::top_k;
  p.recent_window = 1024;
  p.drift_recent_rows = 2048;
  std::vector<workload::selection_generator> gens;
  for (std::size_t i = 0; i < requests; ++i) {
    const auto id = static_cast<request_id>(i + 1);
    const auto hist = dhisparse_testing::make_append_buffer(dhisparse_testing::request_tag(id), 0, 1, 64, 0, kImported);
    const std::array<history_import, 1> imp{{{hist, kImported}}};
    REQUIRE(m.admit(id, imp));
    REQUIRE(m.audit().empty());
    gens.emplace_back(p, workload::stream_seed(7, i));
  }
  shares out;
  out.requests = requests;
  std::vector<row_index> sel(demo_like::top_k);
  std::vector<location> loc(demo_like::top_k);
  for (std::size_t step = 0; step < kSteps; ++step) {
    m.repopulate();
    for (std::size_t i = 0; i < requests; ++i) {
      const auto id = static_cast<request_id>(i + 1);
      const auto tag = dhisparse_testing::request_tag(id);
      const std::int64_t f = m.hierarchy().frontier(id, 0);
      gens[i].next(f, sel);
      out.stats += m.step().resolve(id, 0, sel, loc);
      for (std::size_t j = 0; j < sel.size(); ++j)
        if (sel[j] != no_row && !dhisparse_testing::row_matches(m.hierarchy().payload(0, 0, loc[j]), tag, 0, 0, sel[j]))
          REQUIRE(dhisparse_testing::row_matches(m.hierarchy().payload(0, 0, loc[j]), tag, 0, 0, sel[j]));
      const auto row = dhisparse_testing::make_append_buffer(tag, 0, 1, 64, f, 1);
      m.append(id, 0, row, 1);
    }
    REQUIRE(m.audit().empty());
  }
  out.optional_pages = m.ledger(0).optional;
  out.reclaimed = m.counters().pages_reclaimed;
  return out;
}

void print(const char* policy, const char* load, const shares& s) {
  std::printf("[residency load share] %-13s %-4s load, %2zu requests: direct %5.1f%%  hot %5.1f%%  host %5.1f%%  "
              "(optional pages held %zu of %zu imported, %zu reclaimed)\n",
              policy, load, s.requests, 100 * s.direct(), 100 * s.hot(), 100 * s.host(), s.optional_pages,
              s.requests * (kImported / demo_like::page_rows), s.reclaimed);
}

}  // namespace

TEST_CASE("share of selected rows resolved directly vs from host, adaptive vs fixed budget", "[residency][info]") {
  using adaptive = adaptive_policy<>;
  const auto al = run<adaptive>(2), fl = run<fixed_budget_policy>(2);
  const auto ah = run<adaptive>(24), fh = run<fixed_budget_policy>(24);
  print(adaptive::name, "low", al);
  print(fixed_budget_policy::name, "low", fl);
  print(adaptive::name, "high", ah);
  print(fixed_budget_policy::name, "high", fh);
  CHECK(al.stats.direct >= fl.stats.direct);
  CHECK(ah.stats.direct >= fh.stats.direct);
  CHECK(al.optional_pages == 2 * (kImported / demo_like::page_rows));  // low load: every imported page
  CHECK(fl.optional_pages == 0);
  CHECK(fh.optional_pages == 0);
}
