// One host store shared by the tensor-parallel ranks of a host (shared_host_store; docs/multi-gpu.md).
//
// N = 2 and 4 ranks, each a host_hierarchy over one shared store, are driven in lockstep through
// admissions, appends (per request and step-wide, with reservations), speculative rounds, resolves
// with changing selections, optional pages, completions and re-admissions, beside N independent
// hierarchies given the same calls. Every expected value comes from the test's own model: row bytes
// are a function of (request tag, source, layer, row) (support/row_content.hpp), the pages a history
// holds and the owner of each page (history page p: rank p mod N) are counted here. Checked after
// every operation: each rank's locations equal its independent twin's and hold the selected rows'
// exact bytes; host bytes in use with sharing are 1/N of the N independent hierarchies'; every rank
// maps each history page to the same host page; each stored row was written to the shared store
// exactly once, by its page's owner; pages return to the store after the last rank completes.
#include "../support/catch.hpp"

#include <dhisparse/host/hierarchy.hpp>
#include <dhisparse/host/shared_host_store.hpp>
#include <dhisparse/layouts/tiny.hpp>

#include <algorithm>
#include <array>
#include <barrier>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <thread>
#include <vector>

#include "../support/row_content.hpp"
#include "../support/shared_store_model.hpp"

namespace {

using namespace dhisparse;
namespace rc = dhisparse_testing;
using namespace shared_store_model;
using H = host_hierarchy<L, lru_hot_cache<kB>>;
using Store = shared_host_store<L>;
constexpr std::size_t kSources = H::sources;
constexpr std::size_t kPagesPerRequest = kRows / kP;


std::size_t pages_for(std::int64_t rows) { return (static_cast<std::size_t>(rows) + kP - 1) / kP; }

/// What the test knows of one admitted request (the same on every rank).
struct model_request {
  std::uint64_t tag = 0;
  std::array<std::int64_t, kSources> rows{};      // stored rows
  std::array<std::size_t, kSources> pages{};      // history pages holding host pages (stored or reserved)
};

/// N ranks over one shared store plus N independent twins, driven in lockstep by one model.
struct cluster {
  std::size_t n;
  std::size_t max_block;
  Store store;
  std::vector<std::unique_ptr<H>> ranks, twins;
  std::map<request_id, model_request> live;
  std::map<request_id, std::uint64_t> generation;
  std::vector<std::uint64_t> rows_owned;  // per rank: stored rows of pages it owns, every incarnation
  std::mt19937_64 rng;

  cluster(std::size_t ranks_, std::uint64_t seed, std::size_t max_block_ = 1)
      : n(ranks_), max_block(max_block_), store(ranks_, kHostPages), rows_owned(ranks_, 0), rng(seed) {
    for (std::size_t k = 0; k < n; ++k) {
      ranks.push_back(std::make_unique<H>(config(max_block), store, k));
      twins.push_back(std::make_unique<H>(config(max_block)));
    }
  }

  /// Every rank in a random order (owners sometimes last), then every twin.
  template <class F>
  void each(F&& f) {
    std::vector<std::size_t> order(n);
    for (std::size_t k = 0; k < n; ++k) order[k] = k;
    std::shuffle(order.begin(), order.end(), rng);
    for (std::size_t k : order) f(*ranks[k], k);
    for (std::size_t k = 0; k < n; ++k) f(*twins[k], k);
  }

  bool admit(request_id id) {
    bool ok = true;
    each([&](H& h, std::size_t) { ok = h.admit(id).admitted && ok; });
    if (!ok) return false;
    live[id].tag = rc::request_tag(static_cast<std::uint64_t>(id), generation[id]++);
    return true;
  }
  void complete(request_id id) {
    each([&](H& h, std::size_t) { h.complete(id); });
    live.erase(id);
  }
  /// Counts the rows the model says are written: rows [from, to) of a source, by page owner.
  void count_written(std::int64_t from, std::int64_t to) {
    for (std::int64_t r = from; r < to; ++r) ++rows_owned[(static_cast<std::size_t>(r) / kP) % n];
  }
  void append(request_id id, std::size_t s, std::size_t count) {
    auto& m = live.at(id);
    const auto buf = rc::make_append_buffer(m.tag, s, layers(s), row_bytes(s), m.rows[s], count);
    each([&](H& h, std::size_t) { h.append(id, s, buf, count); });
    count_written(m.rows[s], m.rows[s] + static_cast<std::int64_t>(count));
    m.rows[s] += static_cast<std::int64_t>(count);
    m.pages[s] = std::max(m.pages[s], pages_for(m.rows[s]));
  }
  /// A step-wide write of `count` rows to every live request and source, within reservations.
  void append_step(std::size_t count) {
    std::vector<std::vector<std::byte>> bufs;
    std::vector<step_write_item> items;
    for (auto& [id, m] : live)
      for (std::size_t s = 0; s < kSources; ++s) {
        const auto room = static_cast<std::size_t>(static_cast<std::int64_t>(kRows) - m.rows[s]);
        const std::size_t c = std::min(count, room);
        if (c == 0) continue;
        bufs.push_back(rc::make_append_buffer(m.tag, s, layers(s), row_bytes(s), m.rows[s], c));
        items.push_back({id, s, bufs.back(), c});
      }
    each([&](H& h, std::size_t) { h.reserve_ahead(count); });
    for (auto& [id, m] : live)
      for (std::size_t s = 0; s < kSources; ++s)
        m.pages[s] = std::max(m.pages[s], pages_for(std::min<std::int64_t>(kRows, m.rows[s] + static_cast<std::int64_t>(count))));
    each([&](H& h, std::size_t) { h.append_step(items); });
    for (const auto& it : items) {
      auto& m = live.at(it.request);
      count_written(m.rows[it.source], m.rows[it.source] + static_cast<std::int64_t>(it.count));
      m.rows[it.source] += static_cast<std::int64_t>(it.count);
    }
  }
  /// A speculative round on source 0: stage K positions, verify one query each, commit `accepted`.
  void speculate(request_id id, std::size_t k, std::size_t accepted) {
    auto& m = live.at(id);
    const std::size_t s = 0;
    const auto buf = rc::make_append_buffer(m.tag, s, layers(s), row_bytes(s), m.rows[s], k);
    std::vector<std::vector<row_index>> queries(k);
    for (std::size_t j = 0; j < k; ++j) queries[j] = random_selection(m.rows[s] + static_cast<std::int64_t>(j) + 1);
    std::vector<std::vector<location>> mine(k), twin(k);
    for (std::size_t k2 = 0; k2 < n; ++k2) {
      for (auto* h : {ranks[k2].get(), twins[k2].get()}) {
        h->stage_block(id, s, buf, k);
        std::vector<std::span<const row_index>> q;
        std::vector<std::vector<location>> out(k);
        std::vector<std::span<location>> o;
        for (std::size_t j = 0; j < k; ++j) {
          out[j].assign(queries[j].size(), -2);
          q.emplace_back(queries[j]);
          o.emplace_back(out[j]);
        }
        h->verify(id, s, q, o);
        (h == ranks[k2].get() ? mine : twin) = out;
      }
      REQUIRE(mine == twin);
      for (std::size_t j = 0; j < k; ++j) check_bytes(*ranks[k2], s, m.tag, queries[j], mine[j]);
    }
    each([&](H& h, std::size_t) { h.commit(id, s, accepted); });
    count_written(m.rows[s], m.rows[s] + static_cast<std::int64_t>(accepted) + 1);
    m.rows[s] += static_cast<std::int64_t>(accepted) + 1;
    m.pages[s] = std::max(m.pages[s], pages_for(m.rows[s]));
  }

  std::vector<row_index> random_selection(std::int64_t rows) {
    std::vector<row_index> sel(std::uniform_int_distribution<std::size_t>(1, L::top_k)(rng));
    for (auto& e : sel) {
      const bool pad = rows == 0 || rng() % 8 == 0;
      e = pad ? no_row : static_cast<row_index>(rng() % static_cast<std::uint64_t>(rows));
    }
    return sel;
  }
  void check_bytes(const H& h, std::size_t s, std::uint64_t tag, std::span<const row_index> sel,
                   std::span<const location> loc) const {
    for (std::size_t i = 0; i < sel.size(); ++i) {
      if (sel[i] == no_row) {
        CHECK(loc[i] == no_location);
        continue;
      }
      for (std::size_t l = 0; l < layers(s); ++l) {
        const std::span<const std::byte> got{h.pool(s, l) + static_cast<std::size_t>(loc[i]) * row_bytes(s), row_bytes(s)};
        INFO(rc::describe_row_mismatch(got, tag, s, l, sel[i]));
        REQUIRE(rc::row_matches(got, tag, s, l, sel[i]));
      }
    }
  }
  /// Resolves a fresh random selection of every live request on every source, on every rank and twin.
  void resolve_all() {
    for (std::size_t s = 0; s < kSources; ++s) {
      std::vector<std::vector<row_index>> sels;
      std::vector<request_id> ids;
      for (auto& [id, m] : live) {
        ids.push_back(id);
        sels.push_back(random_selection(m.rows[s]));
      }
      for (std::size_t k = 0; k < n; ++k) {
        std::vector<std::vector<location>> out_rank, out_twin;
        for (auto* h : {ranks[k].get(), twins[k].get()}) {
          auto& out = h == ranks[k].get() ? out_rank : out_twin;
          std::vector<resolve_item> batch;
          out.assign(ids.size(), {});
          for (std::size_t b = 0; b < ids.size(); ++b) {
            out[b].assign(sels[b].size(), -2);
            batch.push_back({ids[b], sels[b], out[b]});
          }
          h->resolve(s, batch);
        }
        REQUIRE(out_rank == out_twin);  // differential: the rank resolves as an independent hierarchy
        for (std::size_t b = 0; b < ids.size(); ++b) check_bytes(*ranks[k], s, live.at(ids[b]).tag, sels[b], out_rank[b]);
        for (auto& [id, m] : live)
          REQUIRE(std::ranges::equal(ranks[k]->hot_rows_of(id, s), twins[k]->hot_rows_of(id, s)));
      }
    }
  }
  void map_some_page() {
    if (live.empty()) return;
    auto it = std::next(live.begin(), static_cast<std::ptrdiff_t>(rng() % live.size()));
    const std::size_t s = rng() % kSources;
    const auto complete_pages = static_cast<std::size_t>(it->second.rows[s]) / kP;
    if (complete_pages == 0) return;
    const std::size_t page = rng() % complete_pages;
    std::vector<int> mapped;
    each([&](H& h, std::size_t) { mapped.push_back(h.map_optional_page(it->first, s, page) ? 1 : 0); });
    REQUIRE(std::adjacent_find(mapped.begin(), mapped.end(), std::not_equal_to<>()) == mapped.end());
  }

  /// The whole-state checks of the file comment.
  void check() {
    std::size_t model_bytes = 0;
    for (std::size_t s = 0; s < kSources; ++s) {
      std::size_t pages = 0;
      for (const auto& [id, m] : live) pages += m.pages[s];
      model_bytes += pages * page_bytes(s);
      REQUIRE(store.free_host_pages(s) == kHostPages - pages);
    }
    REQUIRE(store.host_bytes_in_use() == model_bytes);
    std::size_t independent = 0;
    for (const auto& t : twins) independent += t->host_bytes_in_use();
    REQUIRE(independent == n * model_bytes);  // sharing: 1/N of the independent hierarchies' bytes
    for (const auto& r : ranks) REQUIRE(r->host_bytes_in_use() == model_bytes);
    REQUIRE(store.requests() == live.size());

    std::uint64_t total = 0;
    for (std::size_t k = 0; k < n; ++k) {
      REQUIRE(store.rows_written(k) == rows_owned[k]);  // each rank wrote exactly its pages' rows
      total += store.rows_written(k);
    }
    std::uint64_t model_total = 0;
    for (auto v : rows_owned) model_total += v;
    REQUIRE(total == model_total);  // with per-rank counts equal to the owners' rows: no row twice

    const std::uint64_t every = n == 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << n) - 1;
    for (const auto& [id, m] : live) {
      REQUIRE(store.attached_ranks(id) == every);
      for (std::size_t s = 0; s < kSources; ++s) {
        const auto pages = ranks[0]->host_pages_of(id, s);
        for (std::size_t k = 1; k < n; ++k) REQUIRE(std::ranges::equal(ranks[k]->host_pages_of(id, s), pages));
        for (std::size_t g = 0; g < kPagesPerRequest; ++g) {
          REQUIRE(store.host_page(id, s, g) == pages[g]);
          REQUIRE((g < m.pages[s]) == (pages[g] != no_page));
          if (pages[g] != no_page) REQUIRE(store.page_holders(s, pages[g]) == every);
        }
        for (std::int64_t r = 0; r < m.rows[s]; ++r) {
          REQUIRE(store.has_host_copy(id, s, r));
          for (std::size_t l = 0; l < layers(s); ++l)
            REQUIRE(rc::row_matches(store.row(s, pages[static_cast<std::size_t>(r) / kP], l, r), m.tag, s, l, r));
        }
      }
    }
  }
};

void run_model(std::size_t n, std::uint64_t seed, std::size_t ops, std::size_t max_block) {
  cluster c(n, seed, max_block);
  request_id next = 1;
  std::vector<request_id> completed;
  for (std::size_t op = 0; op < ops; ++op) {
    const auto roll = c.rng() % 100;
    if (roll < 12 && c.live.size() < kSlots) {  // admit: a new id, or re-admit a completed one
      request_id id = next;
      if (!completed.empty() && c.rng() % 2 == 0) {
        const auto at = c.rng() % completed.size();
        id = completed[at];
        completed.erase(completed.begin() + static_cast<std::ptrdiff_t>(at));
      } else {
        ++next;
      }
      REQUIRE(c.admit(id));
    } else if (roll < 18 && !c.live.empty()) {
      auto it = std::next(c.live.begin(), static_cast<std::ptrdiff_t>(c.rng() % c.live.size()));
      const request_id id = it->first;
      c.complete(id);
      completed.push_back(id);
    } else if (roll < 45 && !c.live.empty()) {  // per-request append: decode rows or a prefill chunk > T
      auto it = std::next(c.live.begin(), static_cast<std::ptrdiff_t>(c.rng() % c.live.size()));
      const std::size_t s = c.rng() % kSources;
      const auto room = static_cast<std::size_t>(static_cast<std::int64_t>(kRows) - it->second.rows[s]);
      const std::size_t want = c.rng() % 4 == 0 ? 1 + c.rng() % 24 : 1 + c.rng() % 3;
      if (std::min(want, room) > 0) c.append(it->first, s, std::min(want, room));
    } else if (roll < 55 && !c.live.empty()) {
      c.append_step(1 + c.rng() % 3);
    } else if (roll < 62 && max_block > 1 && !c.live.empty()) {
      auto it = std::next(c.live.begin(), static_cast<std::ptrdiff_t>(c.rng() % c.live.size()));
      const auto room = static_cast<std::size_t>(static_cast<std::int64_t>(kRows) - it->second.rows[0]);
      const std::size_t k = std::min<std::size_t>(1 + c.rng() % max_block, room);
      if (k > 0) c.speculate(it->first, k, c.rng() % k);
    } else if (roll < 68) {
      c.map_some_page();
    } else {
      c.resolve_all();
    }
    c.check();
  }
  while (!c.live.empty()) {  // pages return to the store after the last rank completes
    const request_id id = c.live.begin()->first;
    for (std::size_t k = 0; k < c.n; ++k) {
      const std::size_t before = c.store.free_host_pages(0);
      c.ranks[k]->complete(id);
      if (k + 1 < c.n) {
        CHECK(c.store.free_host_pages(0) == before);  // other ranks still hold the pages
        CHECK(c.store.attached_ranks(id) != 0);
      }
    }
    for (std::size_t k = 0; k < c.n; ++k) c.twins[k]->complete(id);
    c.live.erase(id);
    c.check();
  }
  for (std::size_t s = 0; s < kSources; ++s) CHECK(c.store.free_host_pages(s) == kHostPages);
  CHECK(c.store.host_bytes_in_use() == 0);
}

}  // namespace

TEST_CASE("ranks over a shared host store resolve exactly like independent hierarchies", "[host][shared_store]") {
  for (std::size_t n : {2u, 4u})
    for (std::uint64_t seed : {1u, 2u, 3u}) {
      CAPTURE(n, seed);
      run_model(n, seed, 400, 1);
    }
}

TEST_CASE("speculative commits over a shared host store write each row once, by its owner", "[host][shared_store]") {
  for (std::size_t n : {2u, 4u})
    for (std::uint64_t seed : {7u, 8u}) {
      CAPTURE(n, seed);
      run_model(n, seed, 300, 4);
    }
}

TEST_CASE("ranks on their own threads share one store", "[host][shared_store]") {
  // Each rank's thread runs the same script; a barrier separates a step's appends from its resolves
  // (the lockstep an engine's collectives give), so every row a resolve may read from the host store
  // has been written by its owner.
  constexpr std::size_t n = 4, requests = kSlots, steps = 60;
  Store store(n, kHostPages);
  std::vector<std::unique_ptr<H>> ranks;
  for (std::size_t k = 0; k < n; ++k) ranks.push_back(std::make_unique<H>(config(), store, k));
  std::barrier sync(static_cast<std::ptrdiff_t>(n));
  std::vector<int> failures(n, 0);
  auto run = [&](std::size_t k) {
    H& h = *ranks[k];
    std::mt19937_64 rng(99);  // the same selections on every rank
    for (std::size_t r = 0; r < requests; ++r) failures[k] += h.admit(static_cast<request_id>(r + 1)) ? 0 : 1;
    for (std::size_t t = 0; t < steps; ++t) {
      for (std::size_t r = 0; r < requests; ++r)
        for (std::size_t s = 0; s < kSources; ++s) {
          const auto count = static_cast<std::size_t>(t % 5 == 0 ? 3 : 1);
          const auto rows = h.frontier(static_cast<request_id>(r + 1), s);
          if (rows + static_cast<std::int64_t>(count) > static_cast<std::int64_t>(kRows)) continue;
          h.append(static_cast<request_id>(r + 1), s,
                   rc::make_append_buffer(rc::request_tag(r + 1), s, layers(s), row_bytes(s), rows, count), count);
        }
      sync.arrive_and_wait();
      for (std::size_t r = 0; r < requests; ++r)
        for (std::size_t s = 0; s < kSources; ++s) {
          const auto rows = h.frontier(static_cast<request_id>(r + 1), s);
          std::vector<row_index> sel(L::top_k);
          for (auto& e : sel) e = static_cast<row_index>(rng() % static_cast<std::uint64_t>(rows));
          std::vector<location> loc(sel.size());
          h.resolve(static_cast<request_id>(r + 1), s, sel, loc);
          for (std::size_t i = 0; i < sel.size(); ++i)
            for (std::size_t l = 0; l < layers(s); ++l)
              if (!rc::row_matches({h.pool(s, l) + static_cast<std::size_t>(loc[i]) * row_bytes(s), row_bytes(s)},
                                   rc::request_tag(r + 1), s, l, sel[i]))
                ++failures[k];
        }
      sync.arrive_and_wait();  // nobody appends the next step while another rank still resolves
    }
    for (std::size_t r = 0; r < requests; ++r) h.complete(static_cast<request_id>(r + 1));
  };
  std::vector<std::thread> threads;
  for (std::size_t k = 0; k < n; ++k) threads.emplace_back(run, k);
  for (auto& t : threads) t.join();
  for (std::size_t k = 0; k < n; ++k) CHECK(failures[k] == 0);
  std::uint64_t total = 0, model = 0;
  for (std::size_t k = 0; k < n; ++k) total += store.rows_written(k);
  std::int64_t rows = 0;  // the script's rows per (request, source)
  for (std::size_t t = 0; t < steps; ++t)
    if (const std::int64_t c = t % 5 == 0 ? 3 : 1; rows + c <= static_cast<std::int64_t>(kRows)) rows += c;
  model = requests * kSources * static_cast<std::uint64_t>(rows);
  CHECK(total == model);
  for (std::size_t s = 0; s < kSources; ++s) CHECK(store.free_host_pages(s) == kHostPages);
  CHECK(store.requests() == 0);
}

TEST_CASE("shared host store misuse throws typed errors with the state unchanged", "[host][shared_store]") {
  Store store(2, kHostPages);
  SECTION("ranks, configurations and copies") {
    CHECK_THROWS_AS(H(config(), store, 2), invalid_configuration);  // rank out of range
    CHECK_THROWS_AS(Store(0, kHostPages), invalid_configuration);
    CHECK_THROWS_AS(Store(65, kHostPages), invalid_configuration);
    auto bad = config();
    bad.host_pages = kHostPages + 1;
    CHECK_THROWS_AS(H(bad, store, 0), invalid_configuration);  // not the store's pages
    {
      H a(config(), store, 0);
      CHECK_THROWS_AS(H(config(), store, 0), invalid_configuration);  // rank 0 taken
      CHECK_THROWS_AS(H(a), invalid_configuration);                   // a copy would be a second rank 0
      H moved(std::move(a));
      CHECK(moved.rank() == 0);
      CHECK(moved.shares_host_store());
    }
    H again(config(), store, 0);  // the rank is free once its hierarchy is gone
    CHECK(again.rank() == 0);
    std::array<std::int64_t, kSources> rows{};
    CHECK(again.admit(1).admitted);
    CHECK_THROWS_AS(again.retain_prefix(5, 1, rows), invalid_configuration);
    CHECK_THROWS_AS(again.admit(2, prefix_id{5}), invalid_configuration);
  }
  SECTION("admissions") {
    H r0(config(), store, 0), r1(config(), store, 1);
    CHECK(r0.admit(7).admitted);
    CHECK_THROWS_AS(r0.admit(7), duplicate_admission);
    CHECK(r0.admitted_count() == 1);
    CHECK(r1.admit(7).admitted);
    r0.append(7, 0, rc::make_append_buffer(rc::request_tag(7), 0, 2, 64, 0, 3), 3);
    r1.append(7, 0, rc::make_append_buffer(rc::request_tag(7), 0, 2, 64, 0, 3), 3);
    r0.complete(7);
    // rank 0 re-admits 7 while rank 1 still holds the earlier history: a wait, nothing changes
    CHECK_FALSE(r0.admit(7).admitted);
    CHECK_FALSE(r0.contains(7));
    CHECK(store.attached_ranks(7) == 0b10);
    CHECK(store.free_host_pages(0) == kHostPages - 1);
    r1.complete(7);
    CHECK(store.free_host_pages(0) == kHostPages);
    CHECK(r0.admit(7).admitted);  // a new history
    CHECK(store.host_page(7, 0, 0) == no_page);
  }
  SECTION("a read before the owner's write") {
    H r0(config(), store, 0), r1(config(), store, 1);
    REQUIRE(r0.admit(3));
    REQUIRE(r1.admit(3));
    // 20 rows: pages 0 and 2 are rank 0's, page 1 (rows 8..15) rank 1's; rank 0's tail is rows 12..19
    const auto buf = rc::make_append_buffer(rc::request_tag(3), 1, 1, 32, 0, 20);
    r0.append(3, 1, buf, 20);
    CHECK(store.rows_written(0) == 12);
    CHECK(store.rows_written(1) == 0);
    const std::vector<row_index> own{0, 7, 19}, pending{3, 9};
    std::vector<location> loc(2, -2);
    const auto hot = std::vector<row_index>(r0.hot_rows_of(3, 1).begin(), r0.hot_rows_of(3, 1).end());
    CHECK_THROWS_AS(r0.resolve(3, 1, pending, loc), host_copy_pending);
    CHECK(loc == std::vector<location>{-2, -2});
    CHECK(std::ranges::equal(r0.hot_rows_of(3, 1), hot));
    CHECK_THROWS_AS(r0.map_optional_page(3, 1, 1), host_copy_pending);
    CHECK(r0.optional_map_of(3, 1)[1] == -1);
    CHECK_THROWS_AS(r0.host_row(3, 1, 0, 9), host_copy_pending);
    std::vector<location> own_loc(3);
    r0.resolve(3, 1, own, own_loc);  // rows of rank 0's pages and of its tail resolve
    r1.append(3, 1, buf, 20);        // the owner catches up
    CHECK(store.rows_written(1) == 8);
    r0.resolve(3, 1, pending, loc);
    for (std::size_t i = 0; i < pending.size(); ++i)
      CHECK(rc::row_matches({r0.pool(1, 0) + static_cast<std::size_t>(loc[i]) * 32, 32}, rc::request_tag(3), 1, 0,
                            pending[i]));
    CHECK(r0.map_optional_page(3, 1, 1));
  }
  SECTION("host pages run out: the second rank needs none, a new request waits for pages") {
    Store small(2, 3);
    auto cfg = config();
    cfg.host_pages = 0;  // the store's
    H r0(cfg, small, 0), r1(cfg, small, 1);
    REQUIRE(r0.admit(1));
    REQUIRE(r1.admit(1));
    const auto buf = rc::make_append_buffer(rc::request_tag(1), 1, 1, 32, 0, 24);
    r0.append(1, 1, buf, 24);  // all 3 pages
    CHECK(small.free_host_pages(1) == 0);
    r1.append(1, 1, buf, 24);  // the same pages: nothing to allocate
    CHECK(small.free_host_pages(1) == 0);
    REQUIRE(r0.admit(2));
    CHECK_THROWS_AS(r0.append(2, 1, rc::make_append_buffer(rc::request_tag(2), 1, 1, 32, 0, 1), 1), host_pool_exhausted);
    CHECK(r0.frontier(2, 1) == 0);
    CHECK_THROWS_AS(r0.reserve_rows(2, 1, 1), host_pool_exhausted);
    CHECK(r0.reserved_rows(2, 1) == 0);
    r0.complete(1);
    CHECK(small.free_host_pages(1) == 0);  // rank 1 still holds them
    r1.complete(1);
    CHECK(small.free_host_pages(1) == 3);
  }
  SECTION("a rank's hierarchy going away releases its holds") {
    auto r0 = std::make_unique<H>(config(), store, 0);
    H r1(config(), store, 1);
    REQUIRE(r0->admit(4));
    REQUIRE(r1.admit(4));
    const auto buf = rc::make_append_buffer(rc::request_tag(4), 1, 1, 32, 0, 16);
    r0->append(4, 1, buf, 16);
    r1.append(4, 1, buf, 16);
    r0.reset();
    CHECK(store.attached_ranks(4) == 0b10);
    CHECK(store.free_host_pages(1) == kHostPages - 2);
    r1.complete(4);
    CHECK(store.free_host_pages(1) == kHostPages);
    CHECK(store.requests() == 0);
  }
}
