// The books of a shared host store (detail/shared_store_books.hpp) under churn, against a model the
// test keeps in std::map: random attaches, detaches, page acquires and releases by several ranks,
// owner writes and rank unbinds, with few host pages so the page table (open addressing, deletion
// by backward shift) runs near its load limit and probe chains cross deleted slots. After every
// operation each (request, history page) key of the test's universe is looked up and compared with
// the model: its host page, the rows with a host copy, the page's holders; and the free pages,
// requests and attached ranks.
#include "../support/catch.hpp"

#include <dhisparse/detail/shared_store_books.hpp>

#include <cstddef>
#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <tuple>
#include <vector>

namespace {

using namespace dhisparse;
using books = detail::shared_store_books;
constexpr std::size_t kRanks = 3, kPages = 24, kSources = 2, kRequests = 12, kHistoryPages = 10, kRows = 4;

struct fixture {
  books::shape sh{kRanks, kPages, kRanks * kRequests, {{kRows, 1, 16}, {kRows, 2, 16}}};
  std::vector<std::byte> region = std::vector<std::byte>(books::region_bytes(sh) + 128);
  std::vector<std::vector<std::byte>> bytes;
  std::vector<host_store> stores() {
    std::vector<host_store> out;
    for (std::size_t s = 0; s < kSources; ++s) {
      bytes.emplace_back(host_store::bytes_required(kRows, sh.sources[s].layers, 16, kPages));
      out.emplace_back(kRows, sh.sources[s].layers, 16, kPages, bytes.back());
    }
    return out;
  }
  std::span<std::byte> aligned(std::size_t shift = 0) {
    const auto off = (64 - reinterpret_cast<std::uintptr_t>(region.data()) % 64) % 64;
    return std::span(region).subspan(off + shift, books::region_bytes(sh));
  }
};

/// The model: keys -> host page, host page -> holders / key / rows written, requests -> ranks.
struct model {
  std::map<std::tuple<std::size_t, request_id, std::size_t>, page_id> page;  // (source, id, page)
  std::map<std::pair<std::size_t, page_id>, std::uint64_t> holders;
  std::map<std::pair<std::size_t, page_id>, std::tuple<request_id, std::size_t>> key;
  std::map<std::pair<std::size_t, page_id>, std::uint64_t> written;
  std::map<request_id, std::pair<std::uint64_t, std::uint64_t>> requests;  // attached, seen
  std::vector<std::uint64_t> rows_written = std::vector<std::uint64_t>(kRanks, 0);
};

}  // namespace

TEST_CASE("shared store books match a model under churn", "[host][shared_store]") {
  const std::uint64_t seed = GENERATE(1u, 2u, 3u, 4u);
  fixture f;
  books b(f.aligned(), f.sh, f.stores());
  model m;
  std::mt19937_64 rng(seed);
  // Ids spread over the whole 64-bit range and a few near each other: both collide in the tables.
  std::vector<request_id> ids;
  for (std::size_t i = 0; i < kRequests; ++i) ids.push_back(i < 6 ? i + 1 : rng());
  auto check = [&](const char* op) {
    INFO("after " << op);
    for (std::size_t s = 0; s < kSources; ++s) {
      std::size_t used = 0;
      for (request_id id : ids)
        for (std::size_t p = 0; p < kHistoryPages; ++p) {
          const auto it = m.page.find({s, id, p});
          const page_id want = it == m.page.end() ? no_page : it->second;
          REQUIRE(b.page_of(s, id, p) == want);
          const std::uint64_t w = want == no_page ? 0 : m.written[{s, want}];
          REQUIRE(b.rows_copied(s, id, p) == w);
          if (want != no_page) {
            REQUIRE(b.holders(s, want) == m.holders[{s, want}]);
            ++used;
          }
        }
      REQUIRE(b.free_pages(s) == kPages - used);
    }
    REQUIRE(b.requests() == m.requests.size());
    for (request_id id : ids) {
      const auto it = m.requests.find(id);
      REQUIRE(b.attached(id) == (it == m.requests.end() ? 0 : it->second.first));
    }
    for (std::size_t r = 0; r < kRanks; ++r) REQUIRE(b.rows_written(r) == m.rows_written[r]);
  };
  auto release_model = [&](std::size_t s, page_id g, std::size_t rank) {
    auto& h = m.holders[{s, g}];
    h &= ~(std::uint64_t{1} << rank);
    if (h == 0) {
      const auto [id, p] = m.key[{s, g}];
      m.page.erase({s, id, p});
      m.holders.erase({s, g});
      m.key.erase({s, g});
      m.written.erase({s, g});
    }
  };
  auto release = [&](std::size_t s, page_id g, std::size_t rank) {
    b.release(s, g, rank);
    release_model(s, g, rank);
  };
  for (std::size_t r = 0; r < kRanks; ++r) b.bind(r, kRequests);
  for (int step = 0; step < 4000; ++step) {
    const request_id id = ids[rng() % ids.size()];
    const std::size_t rank = rng() % kRanks, s = rng() % kSources, p = rng() % kHistoryPages;
    const auto bit = std::uint64_t{1} << rank;
    switch (rng() % 8) {
      case 0: {  // attach
        const auto it = m.requests.find(id);
        const bool may = it == m.requests.end() || !(it->second.second & bit);
        REQUIRE(b.can_attach(id, rank) == may);
        if (may) {
          b.attach(id, rank);
          m.requests[id].first |= bit;
          m.requests[id].second |= bit;
        }
        check("attach");
        break;
      }
      case 1: {  // detach: the rank's holds of the request go first, as a hierarchy's complete does
        if (!m.requests.count(id) || !(m.requests[id].first & bit)) break;
        for (std::size_t src = 0; src < kSources; ++src)
          for (std::size_t q = 0; q < kHistoryPages; ++q)
            if (const auto it = m.page.find({src, id, q}); it != m.page.end() && (m.holders[{src, it->second}] & bit))
              release(src, it->second, rank);
        b.detach(id, rank);
        if ((m.requests[id].first &= ~bit) == 0) m.requests.erase(id);
        check("detach");
        break;
      }
      case 2:
      case 3:
      case 4: {  // acquire, when the model has room (else the books must say host_pool_exhausted)
        if (!m.requests.count(id) || !(m.requests[id].first & bit)) break;
        const auto it = m.page.find({s, id, p});
        if (it == m.page.end() && b.free_pages(s) == 0) {
          REQUIRE_THROWS_AS(b.acquire(s, id, p, rank), host_pool_exhausted);
          check("acquire (none free)");
          break;
        }
        REQUIRE(b.pages_missing(s, id, p, p + 1) == (it == m.page.end() ? 1u : 0u));
        const page_id g = b.acquire(s, id, p, rank);
        if (it == m.page.end()) {
          REQUIRE(m.holders.count({s, g}) == 0);  // a free page, not one in use
          m.page[{s, id, p}] = g;
          m.key[{s, g}] = {id, p};
          m.written[{s, g}] = 0;
        } else {
          REQUIRE(g == it->second);
        }
        m.holders[{s, g}] |= bit;
        check("acquire");
        break;
      }
      case 5: {  // release a hold of this rank
        std::vector<page_id> held;
        for (const auto& [k, h] : m.holders)
          if (k.first == s && (h & bit)) held.push_back(k.second);
        if (held.empty()) break;
        release(s, held[rng() % held.size()], rank);
        check("release");
        break;
      }
      case 6: {  // the owner of page p writes some of its rows
        const auto it = m.page.find({s, id, p});
        if (it == m.page.end()) break;
        const std::size_t owner = p % kRanks;
        auto& w = m.written[{s, it->second}];
        if (w == kRows) break;
        const std::uint64_t n = 1 + rng() % (kRows - w);
        const auto first = static_cast<std::int64_t>(p * kRows + w);
        b.wrote(s, id, first, first + static_cast<std::int64_t>(n), owner);
        b.wrote(s, id, first, first + static_cast<std::int64_t>(n), (owner + 1) % kRanks);  // not its page: no record
        w += n;
        m.rows_written[owner] += n;
        REQUIRE(b.has_copy(s, id, first));
        if (w < kRows) REQUIRE_FALSE(b.has_copy(s, id, static_cast<std::int64_t>(p * kRows + w)));
        check("wrote");
        break;
      }
      case 7: {  // a rank goes (its hierarchy destroyed) and comes back, rarely
        if (rng() % 16 != 0) break;
        b.unbind(rank);
        for (auto it = m.holders.begin(); it != m.holders.end();) {
          const auto k = (it++)->first;
          if (m.holders[k] & bit) release_model(k.first, k.second, rank);  // the books released it
        }
        for (auto it = m.requests.begin(); it != m.requests.end();)
          it = (it->second.first &= ~bit) == 0 ? m.requests.erase(it) : std::next(it);
        REQUIRE_FALSE(b.bound(rank));
        b.bind(rank, kRequests);
        check("unbind");
        break;
      }
    }
  }
}

TEST_CASE("shared store books refuse bad shapes, regions and bindings", "[host][shared_store]") {
  fixture f;
  auto bad = f.sh;
  bad.ranks = 65;
  CHECK_THROWS_AS(books::region_bytes(bad), invalid_configuration);
  bad = f.sh;
  bad.request_capacity = 0;
  CHECK_THROWS_AS(books::region_bytes(bad), invalid_configuration);
  CHECK_THROWS_AS(books(f.aligned().first(64), f.sh, f.stores()), size_mismatch);
  CHECK_THROWS_AS(books(f.aligned(8), f.sh, f.stores()), invalid_configuration);
  books b(f.aligned(), f.sh, f.stores());
  CHECK(books::ready(f.aligned()));
  CHECK_THROWS_AS(b.bind(0, kRequests + 1), invalid_configuration);  // 3 x 13 > 36 requests
  CHECK_FALSE(b.bound(0));
  b.bind(0, kRequests);
  CHECK_THROWS_AS(b.bind(0, kRequests), invalid_configuration);
  CHECK_THROWS_AS(b.bind(kRanks, 1), invalid_configuration);
  // A second view of the same region (what another process does) sees the same books.
  auto other = f.sh;
  books view(f.aligned(), other, f.stores(), true);
  CHECK(view.bound(0));
  other.sources[1].row_bytes = 32;
  CHECK_THROWS_AS(books(f.aligned(), other, f.stores(), true), invalid_configuration);
}
