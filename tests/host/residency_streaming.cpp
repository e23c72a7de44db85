// Streamed admission and fair refill on a 61-source layout (host/residency_manager.hpp,
// docs/residency.md): a request admitted before its history exists gets optional pages as the
// history arrives in chunks, newest page of each chunk first, within Invariant 3 after every call;
// chunks that break the rules throw typed errors and change nothing; and repopulation hands pages
// out round-robin over requests and, within a request, evenly over its 61 sources after every call.
#include "../support/catch.hpp"

#include <dhisparse/host/hierarchy.hpp>
#include <dhisparse/host/residency_manager.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <climits>
#include <map>
#include <string>
#include <vector>

#include "../support/row_content.hpp"
#include "../support/test_layouts.hpp"

namespace {

using namespace dhisparse;
using dhisparse_testing::make_append_buffer;
using dhisparse_testing::request_tag;
using L = dhisparse_testing::sixty_one_source_layout;
using H = host_hierarchy<L, lru_hot_cache<16>>;
constexpr std::size_t kSources = H::sources;
constexpr std::size_t kPage = L::page_rows;
static_assert(kSources == 61);

hierarchy_config hcfg(std::size_t optional_pages, std::size_t max_requests, std::size_t max_rows,
                      std::size_t host_pages = 0, std::size_t max_block = 1) {
  hierarchy_config c;
  c.max_requests = max_requests;
  c.max_rows = max_rows;
  c.optional_pages = optional_pages;
  c.host_pages = host_pages;
  c.max_block = max_block;
  return c;
}

std::vector<std::byte> rows_of(request_id id, std::size_t source, std::size_t first, std::size_t count) {
  const auto& d = L::sources[source];
  return make_append_buffer(request_tag(id), source, d.payload_layers, d.row_bytes, static_cast<std::int64_t>(first),
                            count);
}

/// The same history on every source, for `admit(id, history)`.
struct history {
  std::array<std::vector<std::byte>, kSources> bytes;
  std::array<history_import, kSources> imports;
  history(request_id id, std::size_t rows) {
    for (std::size_t s = 0; s < kSources; ++s) {
      bytes[s] = rows_of(id, s, 0, rows);
      imports[s] = {bytes[s], rows};
    }
  }
};

template <class M>
std::vector<std::size_t> mapped_pages(const M& m, request_id id, std::size_t source) {
  std::vector<std::size_t> pages;
  const auto map = m.hierarchy().optional_map_of(id, source);
  for (std::size_t p = 0; p < map.size(); ++p)
    if (map[p] >= 0) pages.push_back(p);
  return pages;
}

/// Everything observable about one request and the manager, for before/after comparisons.
template <class M>
std::map<std::string, std::vector<std::int64_t>> snapshot(const M& m, request_id id) {
  std::map<std::string, std::vector<std::int64_t>> out;
  const auto& h = m.hierarchy();
  for (std::size_t s = 0; s < kSources; ++s) {
    const auto l = m.ledger(s);
    const std::string src = std::to_string(s);
    out["ledger " + src] = {static_cast<std::int64_t>(l.required), static_cast<std::int64_t>(l.optional)};
    out["free " + src] = {static_cast<std::int64_t>(h.free_optional_pages(s)),
                          static_cast<std::int64_t>(h.free_host_pages(s))};
    const auto map = h.optional_map_of(id, s);
    out["map " + src].assign(map.begin(), map.end());
    out["rows " + src] = {h.frontier(id, s), h.positions(id, s), m.imported_rows(id, s)};
  }
  const auto& c = m.counters();
  out["counters"] = {static_cast<std::int64_t>(c.admissions), static_cast<std::int64_t>(c.pages_mapped),
                     static_cast<std::int64_t>(c.completions)};
  return out;
}

}  // namespace

TEST_CASE("streamed admission: chunks of a 61-source history map the pages they complete", "[residency][streaming]") {
  // M = 63, required 2, reserve 2: 59 spare pages per source once the request is admitted.
  residency_manager<H, adaptive_policy<>> m(hcfg(63, 2, 256), {2, 2});
  const auto r = m.admit(1);  // before any history exists
  REQUIRE(r);
  CHECK(r.mapped_pages == 0);
  for (std::size_t s = 0; s < kSources; ++s) REQUIRE(m.ledger(s) == residency_ledger{63, 2, 0, 2});

  // The test's model: per source, a chunk completes pages [before / p, after / p); they are mapped
  // newest first while spare pages remain; nothing mapped earlier moves.
  constexpr std::size_t kChunk = 10, kRows = 250;  // chunks straddle page boundaries; 62 complete pages
  std::array<std::size_t, kSources> spare{}, delivered{};
  std::array<std::vector<std::size_t>, kSources> model;
  spare.fill(59);
  std::size_t total_mapped = 0;
  for (std::size_t k = 0; k * kChunk < kRows; ++k) {
    for (std::size_t i = 0; i < kSources; ++i) {
      const std::size_t s = k % 2 == 0 ? i : kSources - 1 - i;  // sources in either order
      const std::size_t first = delivered[s], count = std::min(kChunk, kRows - first);
      std::size_t expect = 0;
      for (std::size_t page = (first + count) / kPage; page-- > first / kPage && spare[s] > 0;) {
        model[s].push_back(page);
        --spare[s];
        ++expect;
      }
      CAPTURE(k, s);
      const auto got = m.import_history(1, s, rows_of(1, s, first, count), count);
      delivered[s] += count;
      total_mapped += got;
      REQUIRE(got == expect);
      auto want = model[s];
      std::sort(want.begin(), want.end());
      REQUIRE(mapped_pages(m, 1, s) == want);
      REQUIRE(m.ledger(s) == residency_ledger{63, 2, want.size(), 2});
      REQUIRE(m.ledger(s).holds());  // M_req + M_opt + M_res <= M after every call
      REQUIRE(m.imported_rows(1, s) == static_cast<std::int64_t>(delivered[s]));
    }
    REQUIRE(m.audit().empty());
  }
  CHECK(total_mapped == 59 * kSources);
  CHECK(m.counters().pages_mapped == 59 * kSources);
  // The spare ran out inside the chunk of rows 230..239, which completed pages 57, 58 and 59 with
  // two spare pages left: its newest two were mapped. Later chunks (pages 60, 61) found none.
  for (std::size_t s = 0; s < kSources; ++s) {
    CHECK(m.optional_pages_of(1, s) == 59);
    const auto pages = mapped_pages(m, 1, s);
    CHECK(pages.size() == 59);
    CHECK(pages[56] == 56);
    CHECK(pages[57] == 58);
    CHECK(pages[58] == 59);
  }

  // Imported rows are exact through every path: optional pages, the host copy (via the hot cache)
  // and the tail.
  const std::array<row_index, 5> sel{0, 100, 229, 241, 249};  // pages 0, 25 (optional), 57, 60 (host), tail
  for (std::size_t s : {std::size_t{0}, std::size_t{30}, std::size_t{60}}) {
    std::array<location, 5> loc{};
    const auto st = m.step().resolve(1, s, sel, loc);
    CHECK(st.direct == 3);  // two optional pages and the tail row
    CHECK(st.host == 2);
    for (std::size_t i = 0; i < sel.size(); ++i)
      CHECK(dhisparse_testing::row_matches(m.hierarchy().payload(s, 0, loc[i]), request_tag(1), s, 0, sel[i]));
  }

  // Decode rows keep today's rules: they are never optional history under adaptive_policy.
  m.complete(1);
  REQUIRE(m.admit(2));
  m.import_history(2, 0, rows_of(2, 0, 0, 8), 8);
  CHECK(mapped_pages(m, 2, 0) == std::vector<std::size_t>{0, 1});
  for (std::size_t i = 8; i < 16; ++i) m.append(2, 0, rows_of(2, 0, i, 1), 1);
  CHECK(m.repopulate() == 0);  // pages 2 and 3 hold decode rows only
  CHECK(mapped_pages(m, 2, 0) == std::vector<std::size_t>{0, 1});
  CHECK(m.audit().empty());
}

TEST_CASE("admit(id, history) is one chunk per source of the streamed path", "[residency][streaming]") {
  residency_manager<H, adaptive_policy<>> whole(hcfg(20, 2, 64), {1, 1});
  residency_manager<H, adaptive_policy<>> streamed(hcfg(20, 2, 64), {1, 1});
  const history h(5, 45);  // 11 complete pages, 18 spare: the newest 11 fit
  const auto r = whole.admit(5, h.imports);
  REQUIRE(r);
  REQUIRE(streamed.admit(5));
  std::size_t mapped = 0;
  for (std::size_t s = 0; s < kSources; ++s) mapped += streamed.import_history(5, s, h.bytes[s], 45);
  CHECK(r.mapped_pages == mapped);
  CHECK(mapped == 11 * kSources);
  for (std::size_t s = 0; s < kSources; ++s) {
    CHECK(mapped_pages(whole, 5, s) == mapped_pages(streamed, 5, s));
    CHECK(whole.ledger(s) == streamed.ledger(s));
  }
  CHECK(whole.counters() == streamed.counters());
}

TEST_CASE("streamed chunks that break the rules throw typed errors and change nothing", "[residency][streaming]") {
  residency_manager<H, adaptive_policy<>> m(hcfg(32, 2, 64, 20, 2), {1, 1});  // 20 host pages per source
  REQUIRE(m.admit(1));
  m.import_history(1, 3, rows_of(1, 3, 0, 10), 10);
  const auto before = snapshot(m, 1);
  CHECK_THROWS_AS(m.import_history(9, 3, rows_of(9, 3, 0, 4), 4), unknown_request);
  CHECK_THROWS_AS(m.import_history(1, kSources, rows_of(1, 0, 10, 4), 4), invalid_source);
  CHECK_THROWS_AS(m.import_history(1, 3, rows_of(1, 3, 10, 4), 5), size_mismatch);     // bytes of 4 rows
  CHECK_THROWS_AS(m.import_history(1, 3, rows_of(1, 3, 10, 55), 55), capacity_exceeded);  // 65 > max_rows
  CHECK(snapshot(m, 1) == before);

  // The host store: 20 pages a source; request 1 holds 3 (rows 0..9), request 2 takes 13, 4 stay
  // free: rows 10..31 of request 1 need 5 new pages (3..7) and are refused, rows 10..23 need 3 and fit.
  REQUIRE(m.admit(2));
  m.import_history(2, 3, rows_of(2, 3, 0, 52), 52);
  REQUIRE(m.hierarchy().free_host_pages(3) == 4);
  const auto before_host = snapshot(m, 1);
  CHECK_THROWS_AS(m.import_history(1, 3, rows_of(1, 3, 10, 22), 22), host_pool_exhausted);  // pages 3..7: 5 new, 4 free
  CHECK(snapshot(m, 1) == before_host);
  m.import_history(1, 3, rows_of(1, 3, 10, 14), 14);  // pages 3..5: 3 new, fits
  CHECK(m.imported_rows(1, 3) == 24);

  // Decode rows first, then history: refused, per source.
  m.append(1, 3, rows_of(1, 3, 24, 1), 1);  // the last free host page
  const auto before_decode = snapshot(m, 1);
  CHECK_THROWS_AS(m.import_history(1, 3, {}, 0), import_after_decode);
  CHECK(snapshot(m, 1) == before_decode);
  m.import_history(1, 4, rows_of(1, 4, 0, 8), 8);  // another source still takes history
  // A staged speculative block counts as decoding too.
  m.step().stage_block(1, 4, rows_of(1, 4, 8, 1), 1);
  const auto before_stage = snapshot(m, 1);
  CHECK_THROWS_AS(m.import_history(1, 4, rows_of(1, 4, 8, 4), 4), import_after_decode);
  CHECK(snapshot(m, 1) == before_stage);
  CHECK(m.audit().empty());
}

TEST_CASE("refill is fair across requests and across 61 sources after every repopulate call",
          "[residency][repopulation]") {
  // X holds every optional page while A, B and C are admitted with 10 complete pages a source
  // each; X's completion frees the pool (30 pages a source) and repopulation refills it.
  constexpr std::size_t kPerRequest = 10, kRequests = 3, kPerCall = residency_traits<adaptive_policy<>>::pages_per_attempt;
  residency_manager<H, adaptive_policy<>> m(hcfg(30, 4, 128), {0, 0});
  const history x(100, 120), a(1, kPerRequest * kPage), b(2, kPerRequest * kPage), c(3, kPerRequest * kPage);
  REQUIRE(m.admit(100, x.imports).mapped_pages == 30 * kSources);
  for (const auto* h : {&a, &b, &c}) {
    const request_id id = h == &a ? 1 : h == &b ? 2 : 3;
    const auto r = m.admit(id, h->imports);
    REQUIRE(r);
    REQUIRE(r.mapped_pages == 0);
  }
  m.complete(100);

  const std::size_t total = kRequests * kPerRequest * kSources;  // 1830 pages
  std::size_t calls = 0, mapped = 0;
  std::map<request_id, std::size_t> held_total;
  while (const std::size_t got = m.repopulate()) {
    ++calls;
    CAPTURE(calls);
    REQUIRE(got == std::min(kPerCall, total - mapped));
    mapped += got;
    std::size_t lo_total = SIZE_MAX, hi_total = 0, sum = 0;
    for (request_id id : {1, 2, 3}) {
      std::size_t lo = SIZE_MAX, hi = 0, n = 0;
      for (std::size_t s = 0; s < kSources; ++s) {
        const std::size_t k = m.optional_pages_of(id, s);
        lo = std::min(lo, k);
        hi = std::max(hi, k);
        n += k;
        // newest first: the k pages held are the newest k
        const auto pages = mapped_pages(m, id, s);
        REQUIRE(pages.size() == k);
        if (k > 0) REQUIRE(pages.front() == kPerRequest - k);
      }
      CAPTURE(id, lo, hi);
      REQUIRE(hi - lo <= 1);  // within a request, sources differ by at most one page
      lo_total = std::min(lo_total, n);
      hi_total = std::max(hi_total, n);
      sum += n;
    }
    REQUIRE(hi_total - lo_total <= 1);  // round-robin: requests differ by at most one page
    REQUIRE(sum == mapped);
    REQUIRE(m.invariant_holds());
  }
  CHECK(mapped == total);
  CHECK(calls == (total + kPerCall - 1) / kPerCall);  // 115: every call but the last maps 16 pages
  std::printf("fair refill, 61 sources, 3 requests x 10 pages, %zu pages a call: %zu calls\n", kPerCall, calls);
  for (request_id id : {1, 2, 3})
    for (std::size_t s = 0; s < kSources; ++s) CHECK(m.optional_pages_of(id, s) == kPerRequest);
  CHECK(m.audit().empty());
}

TEST_CASE("under a pinning policy every page a chunk completes is mapped from the reservation", "[residency][streaming]") {
  // max_rows 32: 8 pages pinned per request and source; required 1, reserve 1, M = 12
  residency_manager<H, resident_policy> m(hcfg(12, 2, 32), {1, 1});
  REQUIRE(m.admit(1));
  CHECK(m.ledger(7) == residency_ledger{12, 9, 0, 1});  // the whole reservation is in M_req
  std::size_t delivered = 0;
  for (std::size_t count : {6, 6, 6, 6, 6}) {
    const std::size_t expect = (delivered + count) / kPage - delivered / kPage;
    CHECK(m.import_history(1, 7, rows_of(1, 7, delivered, count), count) == expect);
    delivered += count;
    const std::size_t pages = delivered / kPage;
    CHECK(m.optional_pages_of(1, 7) == pages);
    CHECK(m.ledger(7) == residency_ledger{12, 9 - pages, pages, 1});  // reserved pages move to M_opt
    CHECK(m.audit().empty());
  }
  CHECK(mapped_pages(m, 1, 7) == std::vector<std::size_t>{0, 1, 2, 3, 4, 5, 6});
}

TEST_CASE("import_after_decode is a typed error appended after the existing categories", "[residency][streaming]") {
  REQUIRE(static_cast<int>(errc::import_after_decode) == static_cast<int>(errc::staging_not_held) + 1);
  REQUIRE(std::string(to_string(errc::import_after_decode)) == "import_after_decode");
  REQUIRE_THROWS_AS(throw_error(errc::import_after_decode, "x"), import_after_decode);
}
