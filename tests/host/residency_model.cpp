// Model-based test of load-adaptive residency (host/residency_manager.hpp): >= 10^6 random
// operations over four policies (adaptive most-recent-first and least-recent-first, fixed-budget,
// resident): admissions with imported history, decode steps (random selections resolved and
// checked byte for byte, then one appended row per source), completions, pressure spikes (several
// admissions at once), retries of waiting admissions and repopulation, against a simple reference
// model of the ledger. After every operation: Invariant 3, page conservation of the optional and
// host pools, every request's optional map against the reference and the manager's books. At the
// end every request that ever waited has been admitted and completed and every page is free.
#include "../support/catch.hpp"

#include <dhisparse/host/hierarchy.hpp>
#include <dhisparse/host/residency_manager.hpp>
#include <dhisparse/layouts/tiny.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "../support/reference_model.hpp"
#include "../support/row_content.hpp"

namespace {

using namespace dhisparse;
using dhisparse_testing::request_tag;
using dhisparse_testing::test_rng;
using H = host_hierarchy<layouts::tiny, lru_hot_cache<16>>;
constexpr std::size_t kSources = H::sources;
// The model's own geometry: layouts::tiny stores 8 rows a page (checked once, not read from the library).
constexpr std::size_t kPageRows = 8;
static_assert(H::page_rows == kPageRows, "residency model: layouts::tiny changed its page size");

#ifndef DHISPARSE_RESIDENCY_OPS
#  if defined(__SANITIZE_ADDRESS__)
constexpr std::size_t kOpsPerPolicy = 25'000;
#  else
constexpr std::size_t kOpsPerPolicy = 250'000;  // x 4 policies = 10^6 operations
#  endif
#else
constexpr std::size_t kOpsPerPolicy = DHISPARSE_RESIDENCY_OPS;
#endif

struct model_config {
  std::size_t max_requests = 8, max_rows = 64, optional_pages = 24, required = 3, reserve = 2;
  std::uint64_t seed = 1;
};

/// What each policy promises, restated by the test from policies/residency.hpp and docs/residency.md
/// (the model does not read the library's residency_traits).
struct policy_rules {
  bool keeps_optional_history = false;  ///< complete imported pages may stay as optional history
  bool pins_history = false;            ///< every complete page stays, never reclaimed
  reclaim_order order = reclaim_order::most_recent_first;
  std::size_t pages_per_attempt = 16;   ///< the documented default
};

/// The reference: what the ledger and every request's optional pages must be.
struct ref_request {
  request_id id = 0;
  std::array<std::int64_t, kSources> imported{}, frontier{};
  std::array<std::size_t, kSources> mapped{};
};

struct reference {
  policy_rules rules;
  model_config cfg;
  std::size_t pin = 0;  // pinned pages per request
  std::vector<ref_request> admitted;  // admission order
  residency_counters counters;

  std::size_t req(std::size_t s) const {
    std::size_t r = 0;
    for (const auto& a : admitted) r += cfg.required + (rules.pins_history ? pin - a.mapped[s] : 0);
    return r;
  }
  std::size_t opt(std::size_t s) const {
    std::size_t o = 0;
    for (const auto& a : admitted) o += a.mapped[s];
    return o;
  }
  std::size_t spare(std::size_t s) const { return cfg.optional_pages - req(s) - opt(s) - cfg.reserve; }
  std::size_t eligible(const ref_request& a, std::size_t s) const {
    if (rules.pins_history) return static_cast<std::size_t>(a.frontier[s]) / kPageRows;
    if (rules.keeps_optional_history) return static_cast<std::size_t>(a.imported[s]) / kPageRows;
    return 0;
  }
  ref_request* find(request_id id) {
    for (auto& a : admitted)
      if (a.id == id) return &a;
    return nullptr;
  }

  /// Predicted outcome of an admission (applied to the model when admitted).
  residency_admission admit(request_id id, std::int64_t rows) {
    residency_admission r;
    if (admitted.size() >= cfg.max_requests) {
      r.status = admit_status::wait_for_slot;
      ++counters.admissions_waited;
      ++counters.waits_for_slot;
      return r;
    }
    const std::size_t take = cfg.required + pin;
    std::array<std::size_t, kSources> deficit{}, covered{};
    for (std::size_t s = 0; s < kSources; ++s) {
      const std::size_t used = req(s) + opt(s) + cfg.reserve + take;
      deficit[s] = used > cfg.optional_pages ? used - cfg.optional_pages : 0;
    }
    auto covers = [&] {
      for (std::size_t s = 0; s < kSources; ++s)
        if (covered[s] < deficit[s]) return false;
      return true;
    };
    std::vector<ref_request*> victims;
    std::vector<ref_request*> walk;
    for (auto& a : admitted) walk.push_back(&a);
    if (rules.order == reclaim_order::most_recent_first) std::reverse(walk.begin(), walk.end());
    for (ref_request* a : walk) {
      if (covers() || rules.pins_history) break;
      if (a->mapped[0] + a->mapped[1] == 0) continue;
      victims.push_back(a);
      for (std::size_t s = 0; s < kSources; ++s) covered[s] += a->mapped[s];
    }
    if (!covers()) {
      r.status = admit_status::wait_for_memory;
      ++counters.admissions_waited;
      ++counters.waits_for_memory;
      return r;
    }
    for (ref_request* v : victims)
      for (std::size_t s = 0; s < kSources; ++s) {
        r.reclaimed_pages += v->mapped[s];
        v->mapped[s] = 0;
      }
    r.reclaimed_requests = victims.size();
    counters.requests_reclaimed += victims.size();
    counters.pages_reclaimed += r.reclaimed_pages;
    ref_request n;
    n.id = id;
    n.imported.fill(rows);
    n.frontier.fill(rows);
    admitted.push_back(n);
    auto& a = admitted.back();
    for (std::size_t s = 0; s < kSources; ++s) {
      const std::size_t complete = static_cast<std::size_t>(rows) / kPageRows;
      a.mapped[s] = rules.pins_history ? complete
                    : rules.keeps_optional_history ? std::min(spare(s), complete)
                                                     : 0;
      r.mapped_pages += a.mapped[s];
    }
    counters.pages_mapped += r.mapped_pages;
    ++counters.admissions;
    r.status = admit_status::admitted;
    return r;
  }
};

template <class Policy>
void run_model(const model_config& mc, const policy_rules& rules, std::size_t ops) {
  hierarchy_config hc;
  hc.max_requests = mc.max_requests;
  hc.max_rows = mc.max_rows;
  hc.optional_pages = mc.optional_pages;
  residency_manager<H, Policy> m(hc, {mc.required, mc.reserve});
  reference ref;
  ref.rules = rules;
  ref.cfg = mc;
  ref.pin = rules.pins_history ? mc.max_rows / kPageRows : 0;
  const std::size_t host_pages_total = m.hierarchy().config().host_pages;

  test_rng rng(mc.seed);
  std::deque<std::pair<request_id, std::int64_t>> waiting;  // (id, history rows), oldest first
  std::vector<request_id> ever_submitted, ever_admitted, ever_completed;
  request_id next_id = 1;
  std::array<std::vector<std::byte>, kSources> buf;
  std::size_t ops_done = 0, decode_steps = 0, spikes = 0, repopulated = 0, resolved_entries = 0;

  // Checks run ~10^6 times: plain comparisons collected into one message, one REQUIRE per call.
  auto check_all = [&](const char* op) {
    std::string bad = m.audit();
    auto expect = [&bad](bool ok, const std::string& what) {
      if (!ok && bad.empty()) bad = what;
    };
    expect(m.invariant_holds(), "Invariant 3 broken");
    expect(m.admitted_count() == ref.admitted.size(), "admitted count differs from the reference");
    for (std::size_t s = 0; s < kSources && bad.empty(); ++s) {
      const std::string src = "source " + std::to_string(s) + ": ";
      const auto l = m.ledger(s);
      expect(l.required == ref.req(s), src + "M_req " + std::to_string(l.required) + ", reference " + std::to_string(ref.req(s)));
      expect(l.optional == ref.opt(s), src + "M_opt " + std::to_string(l.optional) + ", reference " + std::to_string(ref.opt(s)));
      expect(l.required + l.optional + l.reserve <= l.capacity, src + "M_req + M_opt + M_res > M");
      expect(m.hierarchy().free_optional_pages(s) + l.optional == mc.optional_pages, src + "optional pages leaked");
      std::size_t host_used = 0;
      for (const auto& a : ref.admitted) {
        const std::string who = src + "request " + std::to_string(a.id) + ": ";
        expect(m.hierarchy().frontier(a.id, s) == a.frontier[s], who + "frontier differs");
        host_used += (static_cast<std::size_t>(a.frontier[s]) + kPageRows - 1) / kPageRows;
        // the optional map is exactly the newest `mapped` eligible pages
        const auto map = m.hierarchy().optional_map_of(a.id, s);
        const std::size_t e = ref.eligible(a, s);
        expect(m.optional_pages_of(a.id, s) == a.mapped[s],
               who + std::to_string(m.optional_pages_of(a.id, s)) + " optional pages, reference " +
                   std::to_string(a.mapped[s]));
        for (std::size_t p = 0; p < map.size(); ++p)
          expect((map[p] >= 0) == (p < e && p + a.mapped[s] >= e),
                 who + "page " + std::to_string(p) + " mapped " + std::to_string(map[p] >= 0) + ", expected the newest " +
                     std::to_string(a.mapped[s]) + " of " + std::to_string(e) + " eligible pages");
      }
      expect(m.hierarchy().free_host_pages(s) + host_used == host_pages_total, src + "host pages leaked");
    }
    const auto& c = m.counters();
    const auto& w = ref.counters;
    expect(c.admissions == w.admissions && c.admissions_waited == w.admissions_waited &&
               c.waits_for_slot == w.waits_for_slot && c.waits_for_memory == w.waits_for_memory &&
               c.pages_reclaimed == w.pages_reclaimed && c.requests_reclaimed == w.requests_reclaimed &&
               c.pages_mapped == w.pages_mapped && c.completions == w.completions,
           "counters differ from the reference");
    if (!bad.empty()) {
      INFO("op " << ops_done << " (" << op << ") policy " << Policy::name << ": " << bad);
      REQUIRE(bad.empty());
    }
  };

  auto admit = [&](request_id id, std::int64_t rows) {
    std::array<history_import, kSources> imports;
    for (std::size_t s = 0; s < kSources; ++s) {
      const auto& d = layouts::tiny::sources[s];
      buf[s].resize(d.payload_layers * static_cast<std::size_t>(rows) * d.row_bytes);
      dhisparse_testing::fill_append_buffer(buf[s], request_tag(id), s, d.payload_layers, d.row_bytes, 0,
                                            static_cast<std::size_t>(rows));
      imports[s] = {buf[s], static_cast<std::size_t>(rows)};
    }
    const auto want = ref.admit(id, rows);
    const auto got = m.admit(id, imports);
    INFO("admission of " << id << " with " << rows << " rows");
    REQUIRE(got.status == want.status);
    if (!got) return false;
    REQUIRE(got.reclaimed_requests == want.reclaimed_requests);
    REQUIRE(got.reclaimed_pages == want.reclaimed_pages);
    REQUIRE(got.mapped_pages == want.mapped_pages);
    ever_admitted.push_back(id);
    return true;
  };
  auto submit = [&] {
    const request_id id = next_id++;
    const std::int64_t rows = rng.chance(1, 8) ? 0 : rng.between(1, static_cast<std::int64_t>(mc.max_rows) - 8);
    ever_submitted.push_back(id);
    if (!admit(id, rows)) waiting.emplace_back(id, rows);
  };
  auto complete = [&](std::size_t i) {
    const request_id id = ref.admitted[i].id;
    m.complete(id);
    ref.admitted.erase(ref.admitted.begin() + static_cast<std::ptrdiff_t>(i));
    ++ref.counters.completions;
    ever_completed.push_back(id);
  };
  auto decode = [&](std::size_t i) {
    auto& a = ref.admitted[i];
    if (a.frontier[0] >= static_cast<std::int64_t>(mc.max_rows)) return complete(i);
    ++decode_steps;
    for (std::size_t s = 0; s < kSources; ++s) {
      const auto& d = layouts::tiny::sources[s];
      std::vector<row_index> sel(1 + rng.below(H::top_k), no_row);
      for (auto& e : sel) {
        if (a.frontier[s] == 0 || rng.chance(1, 10)) continue;
        const row_index r = static_cast<row_index>(rng.below(static_cast<std::size_t>(a.frontier[s])));
        if (std::find(sel.begin(), sel.end(), r) == sel.end()) e = r;
      }
      std::vector<location> loc(sel.size());
      const auto st = m.step().resolve(a.id, s, sel, loc);
      if (st.selected != st.direct + st.hot + st.host) REQUIRE(st.selected == st.direct + st.hot + st.host);
      for (std::size_t j = 0; j < sel.size(); ++j) {
        if (sel[j] == no_row) {
          if (loc[j] != no_location) REQUIRE(loc[j] == no_location);
          continue;
        }
        ++resolved_entries;
        for (std::size_t l = 0; l < d.payload_layers; ++l)
          if (!dhisparse_testing::row_matches(m.hierarchy().payload(s, l, loc[j]), request_tag(a.id), s, l, sel[j])) {
            INFO(dhisparse_testing::describe_row_mismatch(m.hierarchy().payload(s, l, loc[j]), request_tag(a.id), s,
                                                          l, sel[j]));
            REQUIRE(false);
          }
      }
      const auto row = dhisparse_testing::make_append_buffer(request_tag(a.id), s, d.payload_layers, d.row_bytes,
                                                             a.frontier[s], 1);
      m.append(a.id, s, row, 1);
      ++a.frontier[s];
      if (rules.pins_history && a.frontier[s] % static_cast<std::int64_t>(kPageRows) == 0) {
        ++a.mapped[s];  // a pinning policy maps each page the append completes
        ++ref.counters.pages_mapped;
      }
    }
  };
  auto repopulate = [&] {
    std::array<std::size_t, kSources> spare{}, unmapped{};
    std::size_t want = 0;
    for (std::size_t s = 0; s < kSources; ++s) {
      spare[s] = ref.spare(s);
      for (const auto& a : ref.admitted) unmapped[s] += ref.eligible(a, s) - a.mapped[s];
      want += rules.pins_history ? unmapped[s] : std::min(spare[s], unmapped[s]);
    }
    want = std::min(want, rules.pages_per_attempt);
    if (!rules.keeps_optional_history) want = 0;
    const std::size_t got = m.repopulate();
    REQUIRE(got == want);
    repopulated += got;
    std::array<std::size_t, kSources> gained{};
    for (auto& a : ref.admitted)
      for (std::size_t s = 0; s < kSources; ++s) {
        const std::size_t now = m.optional_pages_of(a.id, s);
        REQUIRE(now >= a.mapped[s]);
        gained[s] += now - a.mapped[s];
        a.mapped[s] = now;
      }
    for (std::size_t s = 0; s < kSources; ++s) REQUIRE(gained[s] <= (rules.pins_history ? unmapped[s] : spare[s]));
    REQUIRE(gained[0] + gained[1] == got);
    ref.counters.pages_mapped += got;
  };

  for (; ops_done < ops; ++ops_done) {
    const std::size_t k = rng.below(100);
    const char* op = "";
    if (k < 45 && !ref.admitted.empty()) {
      op = "decode";
      decode(rng.below(ref.admitted.size()));
    } else if (k < 60) {
      op = "admit";
      if (waiting.size() < 16) submit();
    } else if (k < 70) {
      op = "retry";
      if (!waiting.empty()) {
        const auto [id, rows] = waiting.front();
        if (admit(id, rows)) waiting.pop_front();
      }
    } else if (k < 80) {
      op = "complete";
      if (!ref.admitted.empty()) complete(rng.below(ref.admitted.size()));
    } else if (k < 95) {
      op = "repopulate";
      repopulate();
    } else {
      op = "pressure spike";
      ++spikes;
      for (std::size_t n = 3 + rng.below(3); n-- > 0;)
        if (waiting.size() < 16) submit();
    }
    check_all(op);
  }
  // Drain: complete everything, admit every waiting request, complete it: nothing is lost.
  while (!ref.admitted.empty() || !waiting.empty()) {
    while (!ref.admitted.empty()) complete(0);
    check_all("drain complete");
    while (!waiting.empty()) {
      const auto [id, rows] = waiting.front();
      if (!admit(id, rows)) break;
      waiting.pop_front();
      check_all("drain admit");
    }
    REQUIRE((waiting.empty() || !ref.admitted.empty()));  // a waiting request always fits an idle pool
  }
  std::sort(ever_submitted.begin(), ever_submitted.end());
  std::sort(ever_admitted.begin(), ever_admitted.end());
  std::sort(ever_completed.begin(), ever_completed.end());
  REQUIRE(ever_admitted == ever_submitted);  // each submitted request admitted exactly once
  REQUIRE(ever_completed == ever_submitted);
  for (std::size_t s = 0; s < kSources; ++s) {
    REQUIRE(m.hierarchy().free_optional_pages(s) == mc.optional_pages);
    REQUIRE(m.hierarchy().free_host_pages(s) == host_pages_total);
    REQUIRE(m.ledger(s) == residency_ledger{mc.optional_pages, 0, 0, mc.reserve});
  }
  const auto& c = m.counters();
  std::printf("[residency model] %-13s ops %zu: %zu requests, %zu waits (%zu memory, %zu slot), %zu decode steps, "
              "%zu spikes, %zu entries checked, pages mapped %zu (repopulated %zu), reclaimed %zu from %zu requests\n",
              Policy::name, ops, ever_submitted.size(), c.admissions_waited, c.waits_for_memory, c.waits_for_slot,
              decode_steps, spikes, resolved_entries, c.pages_mapped, c.pages_repopulated, c.pages_reclaimed,
              c.requests_reclaimed);
  // the workload exercised what it is meant to
  CHECK(c.admissions_waited > 0);
  if (rules.keeps_optional_history && !rules.pins_history) {
    CHECK(c.requests_reclaimed > 0);
    CHECK(c.pages_repopulated > 0);
  }
  if (rules.pins_history) CHECK(c.pages_reclaimed == 0);
  if (!rules.keeps_optional_history) CHECK(c.pages_mapped == 0);
}

}  // namespace

TEST_CASE("residency manager against a reference ledger model, 10^6 random operations", "[residency][model]") {
  SECTION("adaptive, most recently admitted reclaimed first, 3 pages per attempt") {
    run_model<adaptive_policy<reclaim_order::most_recent_first, 3>>(
        {8, 64, 24, 3, 2, 11}, {true, false, reclaim_order::most_recent_first, 3}, kOpsPerPolicy);
  }
  SECTION("adaptive, least recently admitted reclaimed first, 1 page per attempt") {
    run_model<adaptive_policy<reclaim_order::least_recent_first, 1>>(
        {8, 64, 30, 2, 1, 22}, {true, false, reclaim_order::least_recent_first, 1}, kOpsPerPolicy);
  }
  SECTION("fixed budget") { run_model<fixed_budget_policy>({8, 64, 20, 3, 2, 33}, {false, false}, kOpsPerPolicy); }
  SECTION("resident") { run_model<resident_policy>({8, 64, 40, 1, 2, 44}, {true, true}, kOpsPerPolicy); }
}
