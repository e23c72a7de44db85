// Speculative verification on the host reference hierarchy: randomized rounds and an end-to-end
// comparison with plain decoding.
//
// Randomized rounds: several requests stage a block (anchor + proposals), verify K_r queries that
// mix committed tail rows, old rows, hot-cache rows, visible block rows, duplicates within and
// across queries and -1 padding, then commit a random acceptance (or abandon the round). Every
// returned location must hold the exact bytes of its row (committed rows: their committed content;
// block rows: the staged content), host copies per round must equal the distinct missing rows of
// the union (predicted independently from the state before the call), staging use must stay within
// K_max * top_k, and the hot cache never exceeds B rows nor holds a row twice. Hot rows, LRU order
// and the location of every union row are also compared with a small independent model of the
// rule (hits protected; misses ascending take the first non-hit ways of the LRU order; the rest
// overflow into staging in order; order becomes [kept, hits, victims]).
//
// The same runs cover packed sources (m = 2 and m = 4 positions per stored row): the block is
// counted in positions, staged as the rows it touches (the boundary row first), a query may select
// a block row only once every position of that row is at or before its own, and a commit adds to
// the host store exactly the rows the accepted prefix completes; a partially filled boundary row
// stays in the tail.
#include "../support/catch.hpp"

#include <dhisparse/host/hierarchy.hpp>
#include <dhisparse/layouts/tiny.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <span>
#include <vector>

#include "../support/reference_model.hpp"
#include "../support/row_content.hpp"

namespace {

using namespace dhisparse;
using dhisparse_testing::fill_row;
using dhisparse_testing::row_matches;
using dhisparse_testing::test_rng;

#ifndef DHISPARSE_SPECULATIVE_ROUNDS
#  if defined(__SANITIZE_ADDRESS__)
constexpr std::size_t kRounds = 30'000;
#  else
constexpr std::size_t kRounds = 120'000;
#  endif
#else
constexpr std::size_t kRounds = DHISPARSE_SPECULATIVE_ROUNDS;
#endif

using layout = layouts::tiny;  // source 0: 2 payload layers (producer + follower), source 1: 1 layer

/// Like tiny, but source 0 packs 2 positions per stored row and source 1 packs 4 (DeepSeek V4.1
/// Flash's compressed sources have m = 4).
struct packed_tiny {
  static constexpr std::size_t top_k = 16;
  static constexpr std::size_t page_rows = 8;
  static constexpr std::array<source_desc, 2> sources{{
      {64, 2, 2, 32},
      {32, 4, 1, 32},
  }};
  static constexpr std::array<consumer_desc, 3> consumers{{
      {0, consumer_kind::reindex, 0},
      {0, consumer_kind::follower, 1},
      {1, consumer_kind::reindex, 0},
  }};
};
static_assert(valid_layout<packed_tiny>);

/// Bytes of `count` rows starting at `first`, `[layer][count][row_bytes]`, each row with its own tag.
template <class L = layout>
std::vector<std::byte> make_rows(std::span<const std::uint64_t> tags, std::size_t s, std::int64_t first) {
  const auto& d = L::sources[s];
  const std::size_t count = tags.size();
  std::vector<std::byte> buf(d.payload_layers * count * d.row_bytes);
  for (std::size_t l = 0; l < d.payload_layers; ++l)
    for (std::size_t i = 0; i < count; ++i)
      fill_row(buf.data() + (l * count + i) * d.row_bytes, d.row_bytes, tags[i], s, l,
               first + static_cast<std::int64_t>(i));
  return buf;
}

struct totals {
  std::size_t rounds = 0, entries = 0, block = 0, hot = 0, host = 0, staged = 0, staging_rows = 0;
  std::size_t commits = 0, abandoned = 0, restaged = 0, producer_only = 0, readmissions = 0, optional = 0;
  std::size_t no_row_completed = 0, partial_left = 0;  // packed sources: commits completing no row / leaving a partial row
};

template <std::size_t B, class L = layout>
class speculative_run {
 public:
  using H = host_hierarchy<L, lru_hot_cache<B>>;
  static constexpr std::size_t S = H::sources;
  static constexpr std::size_t K = L::top_k;

  speculative_run(const hierarchy_config& cfg, std::uint64_t seed) : h_(cfg), rng_(seed) {
    kmax_ = h_.config().max_block;
    T_ = static_cast<std::int64_t>(h_.config().tail_rows);
    for (std::size_t r = 0; r < h_.config().max_requests; ++r) admit();
  }

  totals run(std::size_t rounds) {
    while (t_.rounds < rounds) step();
    return t_;
  }

 private:
  struct request_state {
    std::uint64_t id = 0;
    std::array<std::vector<std::uint64_t>, S> tags;  // content tag of every committed row
    std::array<std::vector<std::uint64_t>, S> block;  // tags of the staged block rows (boundary row first)
    std::array<std::size_t, S> block_positions{};     // positions of the staged block, 0 if none
    std::array<std::size_t, S> partial{};             // committed positions of the boundary row (< m)
  };
  static std::int64_t m_of(std::size_t s) { return static_cast<std::int64_t>(L::sources[s].positions_per_row); }
  /// Committed positions n of a request/source.
  std::int64_t positions(const request_state& rq, std::size_t s) const {
    return frontier(rq, s) * m_of(s) + static_cast<std::int64_t>(rq.partial[s]);
  }
  /// End of the rows query j of the current round may select: rows whose m positions are all <= n + j.
  std::int64_t visible_end(const request_state& rq, std::size_t s, std::size_t j) const {
    return (positions(rq, s) + static_cast<std::int64_t>(j) + 1) / m_of(s);
  }

  void admit() {
    request_state rq;
    rq.id = next_id_++;
    REQUIRE(h_.admit(rq.id).admitted);
    for (std::size_t s = 0; s < S; ++s) {  // a prompt
      const std::size_t n = 1 + rng_.below(h_.config().max_rows / 4);
      std::vector<std::uint64_t> tags(n, rng_.next());
      h_.append(rq.id, s, make_rows<L>(tags, s, 0), n);
      rq.tags[s] = tags;
    }
    reqs_.push_back(std::move(rq));
  }

  void step() {
    // a finished request leaves and a new one comes
    for (std::size_t i = 0; i < reqs_.size(); ++i)
      for (std::size_t s = 0; s < S; ++s)
        if (reqs_[i].tags[s].size() + kmax_ + 1 > h_.config().max_rows) {
          h_.complete(reqs_[i].id);
          reqs_.erase(reqs_.begin() + static_cast<std::ptrdiff_t>(i));
          admit();
          ++t_.readmissions;
          return;
        }
    const std::size_t s = rng_.below(S);
    if (rng_.chance(1, 20)) {  // a plain decode step now and then
      auto& rq = reqs_[rng_.below(reqs_.size())];
      std::vector<std::uint64_t> tags{rng_.next()};
      h_.append(rq.id, s, make_rows<L>(tags, s, frontier(rq, s)), 1);
      rq.tags[s].push_back(tags[0]);
      rq.block[s].clear();  // append supersedes a staged block
      rq.block_positions[s] = 0;
      rq.partial[s] = 0;    // and its complete row covers a partially filled boundary row
      REQUIRE(h_.staged_rows(rq.id, s) == 0);
      REQUIRE(h_.positions(rq.id, s) == positions(rq, s));
      return;
    }
    if (rng_.chance(1, 30)) {  // optional history comes and goes
      auto& rq = reqs_[rng_.below(reqs_.size())];
      const std::size_t pages = rq.tags[s].size() / L::page_rows;
      if (pages > 0) {
        const std::size_t p = rng_.below(pages);
        if (rng_.chance(1, 2)) t_.optional += h_.map_optional_page(rq.id, s, p) ? 1 : 0;
        else h_.unmap_optional_page(rq.id, s, p);
      }
      return;
    }
    round(s);
  }

  std::int64_t frontier(const request_state& rq, std::size_t s) const {
    return static_cast<std::int64_t>(rq.tags[s].size());
  }

  void stage(request_state& rq, std::size_t s) {
    const std::size_t c = 1 + rng_.below(kmax_);
    const std::size_t rows = (rq.partial[s] + c - 1) / static_cast<std::size_t>(m_of(s)) + 1;  // boundary row first
    REQUIRE(h_.block_rows(rq.id, s, c) == rows);
    std::vector<std::uint64_t> tags(rows);
    for (auto& t : tags) t = rng_.next();
    h_.stage_block(rq.id, s, make_rows<L>(tags, s, frontier(rq, s)), c);
    rq.block[s] = tags;
    rq.block_positions[s] = c;
    REQUIRE(h_.staged_rows(rq.id, s) == c);
  }

  /// One random selection for query j of a request.
  std::vector<row_index> make_query(const request_state& rq, std::size_t s, std::size_t j,
                                    const std::vector<row_index>& earlier) {
    const std::int64_t f = frontier(rq, s);
    const auto hot = h_.hot_rows_of(rq.id, s);
    const std::size_t n = rng_.chance(1, 4) ? rng_.below(K + 1) : K / 2 + rng_.below(K / 2 + 1);
    std::vector<row_index> q;
    q.reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t kind = rng_.below(100);
      row_index e = no_row;
      if (kind < 8) e = no_row;
      else if (kind < 20 && visible_end(rq, s, j) > f)  // a block row complete at this query's position
        e = static_cast<row_index>(f + static_cast<std::int64_t>(rng_.below(static_cast<std::size_t>(visible_end(rq, s, j) - f))));
      else if (kind < 20) e = static_cast<row_index>(rng_.below(static_cast<std::size_t>(f)));
      else if (kind < 32) e = static_cast<row_index>(std::max<std::int64_t>(0, f - 1 - static_cast<std::int64_t>(rng_.below(static_cast<std::size_t>(T_)))));
      else if (kind < 55) {  // a hot-cache row (or an old row if the way is empty)
        const row_index r = hot[rng_.below(hot.size())];
        e = r != no_row ? r : static_cast<row_index>(rng_.below(static_cast<std::size_t>(f)));
      } else if (kind < 70 && !earlier.empty()) e = earlier[rng_.below(earlier.size())];  // across queries
      else if (kind < 78 && !q.empty()) e = q[rng_.below(q.size())];                       // within the query
      else e = static_cast<row_index>(rng_.below(static_cast<std::size_t>(f)));            // any old row
      q.push_back(e);
    }
    return q;
  }

  void round(std::size_t s) {
    const auto& d = L::sources[s];
    // every request stages (sometimes twice: the first block is replaced) and joins the batch
    for (auto& rq : reqs_) {
      if (rq.block_positions[s] == 0 || rng_.chance(1, 3)) stage(rq, s);
      if (rng_.chance(1, 10)) {
        stage(rq, s);
        ++t_.restaged;
      }
    }
    std::vector<std::vector<std::vector<row_index>>> queries(reqs_.size());
    std::vector<std::vector<std::vector<location>>> locs(reqs_.size());
    std::vector<std::vector<std::span<const row_index>>> qspans(reqs_.size());
    std::vector<std::vector<std::span<location>>> lspans(reqs_.size());
    std::vector<verify_item> batch;
    std::size_t predicted_copies = 0, predicted_staging = 0;
    std::vector<std::set<row_index>> union_rows(reqs_.size());
    // independent model of the hot cache after the call: rows, LRU order, location of each union row
    std::vector<std::vector<row_index>> want_hot(reqs_.size());
    std::vector<std::vector<std::size_t>> want_order(reqs_.size());
    std::vector<std::map<row_index, location>> want_loc(reqs_.size());
    for (std::size_t b = 0; b < reqs_.size(); ++b) {
      auto& rq = reqs_[b];
      const std::int64_t f = frontier(rq, s);
      const std::size_t kr = 1 + rng_.below(rq.block_positions[s]);
      std::vector<row_index> earlier;
      for (std::size_t j = 0; j < kr; ++j) {
        queries[b].push_back(make_query(rq, s, j, earlier));
        earlier.insert(earlier.end(), queries[b].back().begin(), queries[b].back().end());
      }
      // independent prediction of the union's misses from the state before the call
      const auto hot = h_.hot_rows_of(rq.id, s);
      const auto opt = h_.optional_map_of(rq.id, s);
      std::set<row_index> missing;
      std::size_t hits = 0;
      for (const auto& q : queries[b])
        for (row_index e : q) {
          if (e == no_row || e >= f - T_ || opt[static_cast<std::size_t>(e) / L::page_rows] >= 0) continue;
          union_rows[b].insert(e);
        }
      for (row_index e : union_rows[b]) {
        if (std::find(hot.begin(), hot.end(), e) != hot.end()) ++hits;
        else missing.insert(e);
      }
      predicted_copies += missing.size();
      const std::size_t to_hot = std::min(missing.size(), B - hits);
      predicted_staging += missing.size() - to_hot;
      {
        const std::size_t slot = h_.slot_of(rq.id);
        want_hot[b].assign(hot.begin(), hot.end());
        want_order[b].assign(h_.lru_order_of(rq.id, s).begin(), h_.lru_order_of(rq.id, s).end());
        if (!union_rows[b].empty()) {  // stable partition: kept, hits, victims
          std::vector<std::size_t> kept, hit_ways, victims;
          for (std::size_t w : want_order[b]) {
            if (want_hot[b][w] != no_row && union_rows[b].contains(want_hot[b][w])) hit_ways.push_back(w);
            else if (victims.size() < to_hot) victims.push_back(w);
            else kept.push_back(w);
          }
          for (std::size_t w : hit_ways) want_loc[b][want_hot[b][w]] = h_.space().hot(slot, w);
          std::size_t t = 0;
          for (row_index r : missing) {
            if (t < to_hot) {
              want_hot[b][victims[t]] = r;
              want_loc[b][r] = h_.space().hot(slot, victims[t]);
            } else {
              want_loc[b][r] = h_.space().staging(slot, t - to_hot);
            }
            ++t;
          }
          want_order[b] = kept;
          want_order[b].insert(want_order[b].end(), hit_ways.begin(), hit_ways.end());
          want_order[b].insert(want_order[b].end(), victims.begin(), victims.end());
        }
      }
      for (const auto& q : queries[b]) locs[b].emplace_back(q.size(), location{-7});
      for (std::size_t j = 0; j < kr; ++j) {
        qspans[b].emplace_back(queries[b][j]);
        lspans[b].emplace_back(locs[b][j]);
      }
      batch.push_back({rq.id, qspans[b], lspans[b]});
    }
    const bool producer_only = d.payload_layers > 1 && rng_.chance(1, 4);
    const auto stats = h_.verify(s, batch, producer_only ? copy_layers::producer_only : copy_layers::all);
    const std::size_t layers = d.payload_layers;
    if (producer_only) {
      ++t_.producer_only;
      for (std::size_t l = 1; l < layers; ++l) h_.copy_follower(s, l);
    }
    REQUIRE(stats.rows_copied == predicted_copies);
    REQUIRE(h_.last_plan(s).size() == predicted_copies);
    REQUIRE(stats.staging_rows == predicted_staging);
    REQUIRE(stats.bytes_copied == predicted_copies * (producer_only ? 1 : layers) * d.row_bytes);

    const auto& sp = h_.space();
    for (std::size_t b = 0; b < reqs_.size(); ++b) {
      auto& rq = reqs_[b];
      const std::int64_t f = frontier(rq, s);
      const std::size_t slot = h_.slot_of(rq.id);
      REQUIRE(h_.verified_queries(rq.id, s) == queries[b].size());
      std::set<location> staging_used;
      for (std::size_t j = 0; j < queries[b].size(); ++j) {
        const auto& q = queries[b][j];
        for (std::size_t i = 0; i < q.size(); ++i) {
          const row_index e = q[i];
          const location loc = locs[b][j][i];
          if (e == no_row) {
            REQUIRE(loc == no_location);
            continue;
          }
          REQUIRE(e < visible_end(rq, s, j));  // generator sanity: never an invisible row
          ++t_.entries;
          const std::uint64_t tag = e >= f ? rq.block[s][static_cast<std::size_t>(e - f)]
                                           : rq.tags[s][static_cast<std::size_t>(e)];
          for (std::size_t l = 0; l < layers; ++l) {
            INFO("request " << rq.id << " source " << s << " layer " << l << " query " << j << " row " << e
                            << " frontier " << f << " location " << loc);
            REQUIRE(row_matches(h_.payload(s, l, loc), tag, s, l, e));
          }
          if (auto it = want_loc[b].find(e); it != want_loc[b].end()) REQUIRE(loc == it->second);
          // where it may live
          const auto staging0 = sp.staging(slot, 0);
          if (e >= f - T_) {
            REQUIRE(loc == sp.tail(slot, e));
            if (e >= f) ++t_.block;
          } else if (loc >= staging0) {
            REQUIRE(static_cast<std::size_t>(loc - staging0) < kmax_ * K);
            staging_used.insert(loc);
          } else if (loc < static_cast<location>(sp.slots * sp.hot_rows)) {
            REQUIRE(loc >= sp.hot(slot, 0));
            REQUIRE(loc < sp.hot(slot, 0) + static_cast<location>(B));
            ++t_.hot;
          }
        }
      }
      REQUIRE(staging_used.size() <= kmax_ * K);
      // hot cache: at most B rows, never a row twice, and every union row that did not overflow is there
      const auto hot = h_.hot_rows_of(rq.id, s);
      std::set<row_index> seen;
      for (row_index r : hot)
        if (r != no_row) REQUIRE(seen.insert(r).second);
      REQUIRE(seen.size() <= B);
      std::size_t union_in_hot = 0;
      for (row_index r : union_rows[b]) union_in_hot += seen.contains(r) ? 1 : 0;
      REQUIRE(union_in_hot + staging_used.size() == union_rows[b].size());
      // hot rows and LRU order as the model predicts; the order is a permutation of the ways
      REQUIRE(std::equal(hot.begin(), hot.end(), want_hot[b].begin(), want_hot[b].end()));
      std::vector<std::size_t> order(h_.lru_order_of(rq.id, s).begin(), h_.lru_order_of(rq.id, s).end());
      REQUIRE(order == want_order[b]);
      std::sort(order.begin(), order.end());
      for (std::size_t w = 0; w < B; ++w) REQUIRE(order[w] == w);
      ++t_.rounds;
    }
    t_.staging_rows += stats.staging_rows;
    t_.staged += stats.staged;
    t_.host += stats.host;

    // commit a random acceptance, or abandon the round (the next stage replaces the block)
    for (std::size_t b = 0; b < reqs_.size(); ++b) {
      auto& rq = reqs_[b];
      if (rng_.chance(1, 12)) {
        ++t_.abandoned;
        continue;
      }
      const std::int64_t f = frontier(rq, s);
      const std::size_t kr = queries[b].size();
      const std::size_t a = rng_.below(kr);
      const std::size_t free_before = h_.free_host_pages(s);
      h_.commit(rq.id, s, a);
      ++t_.commits;
      // exactly the rows the accepted prefix completes join the history; the boundary stays partial
      const std::int64_t n_next = positions(rq, s) + static_cast<std::int64_t>(a) + 1;
      const std::int64_t completed = n_next / m_of(s) - f;
      for (std::int64_t i = 0; i < completed; ++i) rq.tags[s].push_back(rq.block[s][static_cast<std::size_t>(i)]);
      rq.partial[s] = static_cast<std::size_t>(n_next % m_of(s));
      if (completed == 0) ++t_.no_row_completed;
      if (rq.partial[s] != 0) ++t_.partial_left;
      rq.block[s].clear();
      rq.block_positions[s] = 0;
      REQUIRE(h_.frontier(rq.id, s) == f + completed);
      REQUIRE(h_.positions(rq.id, s) == n_next);
      REQUIRE(h_.staged_rows(rq.id, s) == 0);
      REQUIRE(free_before - h_.free_host_pages(s) ==
              (static_cast<std::size_t>(f + completed) + L::page_rows - 1) / L::page_rows -
                  (static_cast<std::size_t>(f) + L::page_rows - 1) / L::page_rows);
      for (std::int64_t r = f; r < f + completed; ++r)
        for (std::size_t l = 0; l < layers; ++l)
          REQUIRE(row_matches(h_.host_row(rq.id, s, l, r), rq.tags[s][static_cast<std::size_t>(r)], s, l, r));
    }
  }

  H h_;
  test_rng rng_;
  std::size_t kmax_ = 1;
  std::int64_t T_ = 0;
  std::uint64_t next_id_ = 100;
  std::vector<request_state> reqs_;
  totals t_;
};

}  // namespace

TEST_CASE("speculative rounds: exact bytes, visibility, one copy per missing row, bounded staging") {
  SECTION("K_max 4, B = top_k = 16 (overflow into staging is common)") {
    speculative_run<16> run(hierarchy_config{.max_requests = 3, .max_rows = 1024, .optional_pages = 6, .max_block = 4},
                            0xC0FFEEull);
    const totals t = run.run(kRounds / 2);
    CAPTURE(t.rounds, t.entries, t.block, t.hot, t.host, t.staged, t.staging_rows, t.commits, t.abandoned,
            t.restaged, t.producer_only, t.readmissions, t.optional);
    CHECK(t.rounds >= kRounds / 2);
    CHECK(t.staging_rows > 0);
    CHECK(t.block > 0);
    CHECK(t.abandoned > 0);
    CHECK(t.readmissions > 0);
  }
  SECTION("K_max 3, B 64, tail of 12 rows") {
    speculative_run<64> run(
        hierarchy_config{.max_requests = 2, .max_rows = 700, .tail_rows = 12, .optional_pages = 4, .max_block = 3},
        0xBEEFull);
    const totals t = run.run(kRounds / 2);
    CAPTURE(t.rounds, t.entries, t.block, t.hot, t.host, t.staged, t.staging_rows, t.commits, t.abandoned);
    CHECK(t.rounds >= kRounds / 2);
    CHECK(t.block > 0);
  }
}

TEST_CASE("speculative rounds on packed sources (m = 2 and m = 4): rows join the history only when complete") {
  SECTION("K_max 4, B = top_k = 16") {
    speculative_run<16, packed_tiny> run(
        hierarchy_config{.max_requests = 3, .max_rows = 512, .optional_pages = 6, .max_block = 4}, 0xFACADEull);
    const totals t = run.run(kRounds / 2);
    CAPTURE(t.rounds, t.entries, t.block, t.hot, t.host, t.staged, t.staging_rows, t.commits, t.abandoned,
            t.restaged, t.producer_only, t.readmissions, t.optional, t.no_row_completed, t.partial_left);
    CHECK(t.rounds >= kRounds / 2);
    CHECK(t.staging_rows > 0);
    CHECK(t.block > 0);
    CHECK(t.abandoned > 0);
    CHECK(t.readmissions > 0);
    CHECK(t.no_row_completed > 0);
    CHECK(t.partial_left > 0);
  }
  SECTION("K_max 7 (blocks spanning several rows), B 64, tail of 12 rows") {
    speculative_run<64, packed_tiny> run(
        hierarchy_config{.max_requests = 2, .max_rows = 400, .tail_rows = 12, .optional_pages = 4, .max_block = 7},
        0xD15EA5Eull);
    const totals t = run.run(kRounds / 2);
    CAPTURE(t.rounds, t.entries, t.block, t.hot, t.host, t.staged, t.staging_rows, t.commits, t.abandoned,
            t.no_row_completed, t.partial_left);
    CHECK(t.rounds >= kRounds / 2);
    CHECK(t.block > 0);
    CHECK(t.partial_left > 0);
  }
}

TEST_CASE("packed sources: speculative decode and plain decode of the same accepted tokens end identical") {
  // Each stored row's bytes are a function of the tokens at its m positions (a stand-in for the
  // compressor). Plain decoding appends a row whenever its m positions are decoded; speculative
  // decoding stages the rows a block touches (a partially filled row from what is known so far,
  // proposals included) and commits a random acceptance. The committed histories must match bit
  // for bit, and so must the committed tails.
  using L = packed_tiny;
  using H = host_hierarchy<L, lru_hot_cache<32>>;
  constexpr std::size_t kmax = 7;
  constexpr std::size_t max_rows = 300;
  H spec(hierarchy_config{.max_requests = 2, .max_rows = max_rows, .optional_pages = 2, .max_block = kmax});
  H plain(hierarchy_config{.max_requests = 2, .max_rows = max_rows, .optional_pages = 2});
  test_rng rng(11);
  const std::array<request_id, 2> ids{21, 22};
  std::map<std::pair<request_id, std::size_t>, std::vector<std::uint64_t>> tokens;  // committed tokens
  // tag of the row holding positions [r*m, r*m + m) restricted to the tokens known so far
  const auto row_tag = [](std::span<const std::uint64_t> toks, std::int64_t r, std::int64_t m) {
    std::uint64_t h = 0x9E3779B97F4A7C15ull;
    for (std::int64_t p = r * m; p < std::min<std::int64_t>((r + 1) * m, static_cast<std::int64_t>(toks.size())); ++p)
      h = dhisparse_testing::splitmix64(h ^ toks[static_cast<std::size_t>(p)]);
    return h;
  };
  for (request_id id : ids) {
    REQUIRE(spec.admit(id).admitted);
    REQUIRE(plain.admit(id).admitted);
    for (std::size_t s = 0; s < H::sources; ++s) {
      const auto m = static_cast<std::int64_t>(L::sources[s].positions_per_row);
      auto& toks = tokens[{id, s}];
      for (std::size_t p = 0; p < 37 * static_cast<std::size_t>(m); ++p) toks.push_back(rng.next());
      std::vector<std::uint64_t> tags;
      for (std::int64_t r = 0; r < 37; ++r) tags.push_back(row_tag(toks, r, m));
      const auto buf = make_rows<L>(tags, s, 0);
      spec.append(id, s, buf, tags.size());
      plain.append(id, s, buf, tags.size());
    }
  }
  std::size_t rounds = 0, partial_commits = 0;
  bool room = true;
  while (room && rounds < 3000) {
    ++rounds;
    for (request_id id : ids)
      for (std::size_t s = 0; s < H::sources; ++s) {
        const auto m = static_cast<std::int64_t>(L::sources[s].positions_per_row);
        const std::int64_t f = spec.frontier(id, s);
        const std::int64_t n = spec.positions(id, s);
        if (f + static_cast<std::int64_t>(kmax) + 1 >= static_cast<std::int64_t>(max_rows)) {
          room = false;
          continue;
        }
        auto& toks = tokens[{id, s}];
        REQUIRE(n == static_cast<std::int64_t>(toks.size()));
        const std::size_t kr = 1 + rng.below(kmax);
        std::vector<std::uint64_t> all = toks;  // committed tokens, then the block's
        for (std::size_t i = 0; i < kr; ++i) all.push_back(rng.next());
        std::vector<std::uint64_t> tags;
        for (std::int64_t r = f; r <= (n + static_cast<std::int64_t>(kr) - 1) / m; ++r) tags.push_back(row_tag(all, r, m));
        spec.stage_block(id, s, make_rows<L>(tags, s, f), kr);
        // queries: old rows, tail rows and the block rows complete at the query's position
        std::vector<std::vector<row_index>> q(kr);
        std::vector<std::vector<location>> l(kr);
        std::vector<std::span<const row_index>> qs;
        std::vector<std::span<location>> ls;
        for (std::size_t j = 0; j < kr; ++j) {
          const std::int64_t vis = (n + static_cast<std::int64_t>(j) + 1) / m;
          for (std::size_t i = 0; i < L::top_k; ++i)
            q[j].push_back(vis > f && rng.chance(1, 4)
                               ? static_cast<row_index>(f + static_cast<std::int64_t>(rng.below(static_cast<std::size_t>(vis - f))))
                               : static_cast<row_index>(rng.below(static_cast<std::size_t>(f))));
          l[j].resize(q[j].size());
          qs.emplace_back(q[j]);
          ls.emplace_back(l[j]);
        }
        spec.verify(id, s, qs, ls);
        for (std::size_t j = 0; j < kr; ++j)
          for (std::size_t i = 0; i < q[j].size(); ++i) {
            const row_index e = q[j][i];
            const std::uint64_t want = e >= f ? tags[static_cast<std::size_t>(e - f)] : row_tag(toks, e, m);
            for (std::size_t lyr = 0; lyr < L::sources[s].payload_layers; ++lyr)
              REQUIRE(dhisparse_testing::row_matches(spec.payload(s, lyr, l[j][i]), want, s, lyr, e));
          }
        const std::size_t a = rng.below(kr);
        spec.commit(id, s, a);
        for (std::size_t i = 0; i <= a; ++i) {  // plain decode: one token at a time, a row when complete
          toks.push_back(all[static_cast<std::size_t>(n) + i]);
          if (toks.size() % static_cast<std::size_t>(m) == 0) {
            const std::int64_t r = static_cast<std::int64_t>(toks.size()) / m - 1;
            const std::uint64_t t = row_tag(toks, r, m);
            plain.append(id, s, make_rows<L>(std::span<const std::uint64_t>(&t, 1), s, r), 1);
          }
        }
        partial_commits += toks.size() % static_cast<std::size_t>(m) != 0 ? 1 : 0;
        REQUIRE(spec.frontier(id, s) == plain.frontier(id, s));
        REQUIRE(spec.positions(id, s) == static_cast<std::int64_t>(toks.size()));
      }
  }
  CAPTURE(rounds, partial_commits);
  REQUIRE(rounds > 50);
  REQUIRE(partial_commits > 0);
  for (request_id id : ids)
    for (std::size_t s = 0; s < H::sources; ++s) {
      REQUIRE(spec.frontier(id, s) == plain.frontier(id, s));
      for (std::int64_t r = 0; r < spec.frontier(id, s); ++r)
        for (std::size_t lyr = 0; lyr < L::sources[s].payload_layers; ++lyr) {
          const auto a = spec.host_row(id, s, lyr, r);
          const auto b = plain.host_row(id, s, lyr, r);
          REQUIRE(std::equal(a.begin(), a.end(), b.begin(), b.end()));
        }
      const auto T = static_cast<std::int64_t>(spec.config().tail_rows);
      for (std::int64_t r = spec.frontier(id, s) - T; r < spec.frontier(id, s); ++r)
        for (std::size_t lyr = 0; lyr < L::sources[s].payload_layers; ++lyr) {
          const auto a = spec.payload(s, lyr, spec.space().tail(spec.slot_of(id), r));
          const auto b = plain.payload(s, lyr, plain.space().tail(plain.slot_of(id), r));
          REQUIRE(std::equal(a.begin(), a.end(), b.begin(), b.end()));
        }
    }
}

TEST_CASE("speculative decode and plain decode of the same accepted tokens end with identical histories") {
  using H = host_hierarchy<layout, lru_hot_cache<32>>;
  constexpr std::size_t kmax = 5;
  H spec(hierarchy_config{.max_requests = 2, .max_rows = 600, .optional_pages = 2, .max_block = kmax});
  H plain(hierarchy_config{.max_requests = 2, .max_rows = 600, .optional_pages = 2});
  test_rng rng(7);
  const std::array<request_id, 2> ids{11, 12};
  for (request_id id : ids) {
    REQUIRE(spec.admit(id).admitted);
    REQUIRE(plain.admit(id).admitted);
    for (std::size_t s = 0; s < H::sources; ++s) {
      std::vector<std::uint64_t> tags(37, 1000 + id);
      const auto buf = make_rows(tags, s, 0);
      spec.append(id, s, buf, tags.size());
      plain.append(id, s, buf, tags.size());
    }
  }
  std::size_t rounds = 0;
  while (spec.frontier(ids[0], 0) + static_cast<std::int64_t>(kmax) < 600 &&
         spec.frontier(ids[1], 1) + static_cast<std::int64_t>(kmax) < 600 && rounds < 2000) {
    ++rounds;
    for (request_id id : ids)
      for (std::size_t s = 0; s < H::sources; ++s) {
        if (spec.frontier(id, s) + static_cast<std::int64_t>(kmax) >= 600) continue;
        const std::int64_t f = spec.frontier(id, s);
        const std::size_t kr = 1 + rng.below(kmax);
        std::vector<std::uint64_t> tags(kr);
        for (auto& t : tags) t = rng.next();
        spec.stage_block(id, s, make_rows(tags, s, f), kr);
        // queries: old rows, tail rows and the visible block
        std::vector<std::vector<row_index>> q(kr);
        std::vector<std::vector<location>> l(kr);
        std::vector<std::span<const row_index>> qs;
        std::vector<std::span<location>> ls;
        for (std::size_t j = 0; j < kr; ++j) {
          for (std::size_t i = 0; i < layout::top_k; ++i)
            q[j].push_back(rng.chance(1, 4) ? static_cast<row_index>(f + static_cast<std::int64_t>(rng.below(j + 1)))
                                            : static_cast<row_index>(rng.below(static_cast<std::size_t>(f))));
          l[j].resize(q[j].size());
          qs.emplace_back(q[j]);
          ls.emplace_back(l[j]);
        }
        spec.verify(id, s, qs, ls);
        const std::size_t a = rng.below(kr);
        spec.commit(id, s, a);
        for (std::size_t i = 0; i <= a; ++i) {  // plain decode appends the accepted rows one by one
          const std::uint64_t t = tags[i];
          plain.append(id, s, make_rows(std::span<const std::uint64_t>(&t, 1), s, f + static_cast<std::int64_t>(i)), 1);
        }
        REQUIRE(spec.frontier(id, s) == plain.frontier(id, s));
      }
  }
  CAPTURE(rounds);
  REQUIRE(rounds > 50);
  for (request_id id : ids)
    for (std::size_t s = 0; s < H::sources; ++s) {
      REQUIRE(spec.frontier(id, s) == plain.frontier(id, s));
      for (std::int64_t r = 0; r < spec.frontier(id, s); ++r)
        for (std::size_t lyr = 0; lyr < layout::sources[s].payload_layers; ++lyr) {
          const auto a = spec.host_row(id, s, lyr, r);
          const auto b = plain.host_row(id, s, lyr, r);
          REQUIRE(std::equal(a.begin(), a.end(), b.begin(), b.end()));
        }
      // and the committed tails read the same bytes
      const auto T = static_cast<std::int64_t>(spec.config().tail_rows);
      for (std::int64_t r = spec.frontier(id, s) - T; r < spec.frontier(id, s); ++r)
        for (std::size_t lyr = 0; lyr < layout::sources[s].payload_layers; ++lyr) {
          const auto a = spec.payload(s, lyr, spec.space().tail(spec.slot_of(id), r));
          const auto b = plain.payload(s, lyr, plain.space().tail(plain.slot_of(id), r));
          REQUIRE(std::equal(a.begin(), a.end(), b.begin(), b.end()));
        }
    }
}
