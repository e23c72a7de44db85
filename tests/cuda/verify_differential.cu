// Speculative verification on the CUDA backend, differential against the host reference
// hierarchy (the executable specification) on identical randomized rounds: several requests stage
// a block (anchor + proposals) and verify K_r queries (K_r random per request, up to the staged
// count) mixing block rows visible to the query, committed tail rows, hot rows, old rows, ready
// optional rows, duplicates within and across queries and -1 padding; then a random acceptance is
// committed (or the round is abandoned). Plain appends, resolves, optional pages, producer-only
// verifies with follower copies and readmissions are mixed in. After every verify: locations of
// every query, per-entry stats, the copy plan (each distinct missing row once), the staging bound,
// and the exact bytes at every returned location; after every commit: the committed rows in both
// host stores; periodically hot rows, LRU order, optional map, frontier and every pool byte.
// The same runs cover packed sources (m = 2 and m = 4 positions per stored row): blocks counted in
// positions and staged as the rows they touch (the boundary row first), queries selecting only
// block rows complete at their position, commits adding exactly the completed rows.
// A second test drives speculative and plain decoding of the same accepted tokens on the GPU and
// requires bit-identical histories.
#include <chrono>
#include <cstdlib>
#include <map>
#include <set>
#include <thread>

#include "cuda_test_support.cuh"

#include <dhisparse/cuda/verify_batch.cuh>

namespace {

using namespace dhtest;

/// Content key of a row: appended rows (tag 0) use the request id like the rest of the GPU tests;
/// staged rows carry their round's tag, so a stale block row never matches.
inline std::uint64_t content_key(request_id id, std::uint64_t tag) {
  return tag == 0 ? id : mix64(id * 0x9E3779B97F4A7C15ull + tag);
}

struct spec_workload {
  std::size_t rounds = 500;
  std::size_t max_batch = 4;
  std::size_t state_every = 10;
  std::size_t initial_rows = 0;  ///< rows appended on admission (0: random)
  std::uint64_t seed = 1;
  bool programmatic = false;  ///< every per-step kernel launched with programmatic dependent launch
};

template <class Layout, class Hot, class Staging = dh::dedicated_staging>
class spec_run {
 public:
  using T = twin<Layout, Hot, Staging>;
  static constexpr std::size_t K = Layout::top_k;
  static constexpr std::size_t S = T::sources;
  static constexpr std::size_t P = Layout::page_rows;

  spec_run(const dh::hierarchy_config& cfg, const spec_workload& w, const char* name)
      : tw(cfg, w.seed), w_(w), name_(name), km_(cfg.max_block),
        dsel_(cfg.max_requests * cfg.max_block * K), dloc_(cfg.max_requests * cfg.max_block * K) {
    tw.dev.set_programmatic_launch(w.programmatic);
    for (std::size_t i = 0; i < cfg.max_requests; ++i) admit_new();
  }

  T tw;

  struct counters {
    std::size_t verifies = 0, commits = 0, abandoned = 0, entries = 0, block = 0, hot = 0, host = 0, staged = 0,
                staging_rows = 0, rows_copied = 0, union_saved = 0, producer_only = 0, resolves = 0, releases = 0,
                held_probes = 0;
  } n;

  void run() {
    for (std::size_t step = 0; step < w_.rounds; ++step) {
      const std::string ctx = std::string(name_) + " round " + std::to_string(step);
      INFO(ctx);
      one_step(ctx);
      if (step % w_.state_every == 0 || step + 1 == w_.rounds) {
        tw.compare_state(ctx);
        tw.compare_pools(ctx);
        compare_spec_books(ctx);
      }
    }
    INFO(name_ << ": " << n.verifies << " verifies, " << n.commits << " commits, " << n.abandoned << " abandoned, "
               << n.entries << " entries (" << n.block << " block, " << n.hot << " hot, " << n.host << " host, "
               << n.staged << " staged), " << n.rows_copied << " rows copied, " << n.staging_rows
               << " staging rows, " << n.union_saved << " copies saved by the union, " << n.resolves << " resolves");
    CHECK(n.verifies > w_.rounds / 3);
    CHECK(n.commits > 0);
    CHECK(n.block > 0);
    CHECK(n.hot > 0);
    CHECK(n.host > 0);
    CHECK(n.union_saved > 0);
    if constexpr (Staging::shared) {
      CHECK(n.releases > w_.rounds / 4);
      CHECK(n.held_probes > 0);
    }
  }

 private:
  spec_workload w_;
  const char* name_;
  std::size_t km_;
  dhc::device_buffer<row_index> dsel_;
  dhc::device_buffer<location> dloc_;
  std::map<request_id, std::array<std::vector<std::uint64_t>, S>> tags_;   // per committed row
  std::map<request_id, std::array<std::vector<std::uint64_t>, S>> block_;  // per staged block row
  std::map<request_id, std::array<std::size_t, S>> bpos_;                  // positions of the staged block
  static std::int64_t m_of(std::size_t s) { return static_cast<std::int64_t>(Layout::sources[s].positions_per_row); }
  /// Rows query j of the current round may select: those whose m positions are all <= n + j.
  std::int64_t visible_end(request_id id, std::size_t s, std::size_t j) const {
    return (tw.host.positions(id, s) + static_cast<std::int64_t>(j) + 1) / m_of(s);
  }
  std::uint64_t next_tag_ = 1;
  std::vector<std::vector<std::byte>> pools_;  // the device pools of one source, copied once per check

  std::vector<std::byte> rows_for(request_id id, std::size_t s, std::int64_t first,
                                  const std::vector<std::uint64_t>& tags) {
    const auto& d = Layout::sources[s];
    const std::size_t count = tags.size();
    std::vector<std::byte> v(count * d.payload_layers * d.row_bytes);
    for (std::size_t l = 0; l < d.payload_layers; ++l)
      for (std::size_t i = 0; i < count; ++i)
        fill_row(v.data() + (l * count + i) * d.row_bytes, d.row_bytes, content_key(id, tags[i]), s, l,
                 static_cast<row_index>(first + static_cast<std::int64_t>(i)));
    return v;
  }

  void admit_new() {
    const request_id id = tw.next_id++;
    if (!tw.admit(id)) return;
    auto& t = tags_[id];
    for (std::size_t s = 0; s < S; ++s) {
      const std::size_t rows = w_.initial_rows != 0 ? w_.initial_rows : 1 + tw.uniform(tw.cfg.max_rows / 3);
      tw.append(id, s, rows);  // tag 0
      t[s].assign(rows, 0);
      block_[id][s].clear();
      bpos_[id][s] = 0;
    }
  }
  void complete(request_id id) {
    tw.complete(id);
    tags_.erase(id);
    block_.erase(id);
    bpos_.erase(id);
  }
  void append_one(request_id id, std::size_t s) {
    tw.append(id, s, 1);
    tags_[id][s].push_back(0);
    block_[id][s].clear();  // append closes the round on both backends
    bpos_[id][s] = 0;
    REQUIRE(tw.dev.staged_rows(id, s) == 0);
    REQUIRE(tw.dev.positions(id, s) == tw.host.positions(id, s));
  }

  void stage(request_id id, std::size_t s) {
    const std::int64_t f = tw.host.frontier(id, s);
    const std::int64_t pos = tw.host.positions(id, s);
    REQUIRE(tw.dev.positions(id, s) == pos);
    const auto room = static_cast<std::size_t>(static_cast<std::int64_t>(tw.cfg.max_rows) * m_of(s) - pos);
    const std::size_t c = 1 + tw.uniform(std::min(km_, room));
    const std::size_t nrows = tw.host.block_rows(id, s, c);  // the boundary row first
    REQUIRE(tw.dev.block_rows(id, s, c) == nrows);
    std::vector<std::uint64_t> tags(nrows);
    for (auto& t : tags) t = next_tag_++;
    const auto rows = rows_for(id, s, f, tags);
    tw.host.stage_block(id, s, rows, c);
    tw.dev.stage_block(id, s, std::span<const std::byte>(rows), c);
    block_[id][s] = tags;
    bpos_[id][s] = c;
    REQUIRE(tw.host.staged_rows(id, s) == c);
    REQUIRE(tw.dev.staged_rows(id, s) == c);
  }

  /// Expected content key of row x for a reader of request id (block rows: the staged block).
  std::uint64_t key_of(request_id id, std::size_t s, row_index x) {
    const auto& committed = tags_[id][s];
    if (static_cast<std::size_t>(x) < committed.size()) return content_key(id, committed[static_cast<std::size_t>(x)]);
    return content_key(id, block_[id][s][static_cast<std::size_t>(x) - committed.size()]);
  }

  std::vector<row_index> make_query(request_id id, std::size_t s, std::size_t j, const std::vector<row_index>& earlier) {
    const std::int64_t f = tw.host.frontier(id, s);
    const auto hot = tw.host.hot_rows_of(id, s);
    const auto opt = tw.host.optional_map_of(id, s);
    const std::int64_t T = static_cast<std::int64_t>(tw.host.config().tail_rows);
    const std::size_t len = tw.chance(0.25) ? tw.uniform(K + 1) : K / 2 + tw.uniform(K / 2 + 1);
    std::vector<row_index> q;
    q.reserve(len);
    for (std::size_t i = 0; i < len; ++i) {
      const std::size_t kind = tw.uniform(100);
      row_index e;
      if (kind < 7) e = dh::no_row;
      else if (kind < 18 && visible_end(id, s, j) > f)  // a block row complete at this query's position
        e = static_cast<row_index>(f + static_cast<std::int64_t>(tw.uniform(static_cast<std::size_t>(visible_end(id, s, j) - f))));
      else if (kind < 18) e = static_cast<row_index>(tw.uniform(static_cast<std::size_t>(f)));
      else if (kind < 28)
        e = static_cast<row_index>(std::max<std::int64_t>(0, f - 1 - static_cast<std::int64_t>(tw.uniform(static_cast<std::size_t>(T + km_)))));
      else if (kind < 48) {
        const row_index r = hot[tw.uniform(hot.size())];
        e = r != dh::no_row ? r : static_cast<row_index>(tw.uniform(static_cast<std::size_t>(f)));
      } else if (kind < 62 && !earlier.empty()) e = earlier[tw.uniform(earlier.size())];  // across queries
      else if (kind < 70 && !q.empty()) e = q[tw.uniform(q.size())];                       // within the query
      else if (kind < 76) {
        const std::size_t pg = tw.uniform(opt.size());
        e = opt[pg] >= 0 ? static_cast<row_index>(pg * P + tw.uniform(P)) : static_cast<row_index>(tw.uniform(static_cast<std::size_t>(f)));
      } else e = static_cast<row_index>(tw.uniform(static_cast<std::size_t>(f)));
      q.push_back(e);
    }
    return q;
  }

  void one_step(const std::string& ctx) {
    // a request near capacity leaves and a new one comes
    for (request_id id : std::vector<request_id>(tw.live))
      for (std::size_t s = 0; s < S; ++s)
        if (static_cast<std::size_t>(tw.host.frontier(id, s)) + km_ + 1 > tw.cfg.max_rows) {
          complete(id);
          admit_new();
          return;
        }
    if (tw.live.empty()) {
      admit_new();
      return;
    }
    const double op = std::uniform_real_distribution<double>(0, 1)(tw.rng);
    const std::size_t s = tw.uniform(S);
    if (op < 0.04) {  // a plain decode step
      append_one(tw.live[tw.uniform(tw.live.size())], s);
      return;
    }
    if (op < 0.08) {  // optional history comes and goes
      const request_id id = tw.live[tw.uniform(tw.live.size())];
      const std::size_t pages = static_cast<std::size_t>(tw.host.frontier(id, s)) / P;
      if (pages > 0) {
        const std::size_t page = tw.uniform(pages);
        if (tw.chance(0.7)) tw.map_page(id, s, page);
        else tw.unmap_page(id, s, page);
      }
      return;
    }
    if (op < 0.12) {  // a plain resolve between rounds: the resolver sees the ring geometry
      plain_resolve(s, ctx);
      return;
    }
    if (op < 0.13) {  // readmission
      const request_id id = tw.live[tw.uniform(tw.live.size())];
      complete(id);
      admit_new();
      return;
    }
    round(s, ctx);
  }

  void plain_resolve(std::size_t s, const std::string& ctx) {
    const request_id id = tw.live[tw.uniform(tw.live.size())];
    std::vector<typename T::request_selection> batch{{id, tw.make_selection(id, s, K)}};
    const auto locs = tw.resolve(s, batch, dh::copy_layers::all, true, ctx + " plain resolve");
    snapshot(s);
    check_bytes(s, id, batch[0].selection, locs[0], Layout::sources[s].payload_layers, ctx + " plain resolve");
    ++n.resolves;
  }

  /// Copies every payload layer's pool of source s once (check_bytes reads the copy).
  void snapshot(std::size_t s) {
    const auto& d = Layout::sources[s];
    pools_.resize(d.payload_layers);
    const std::size_t pool_bytes = tw.dev.pool_rows() * d.row_bytes;
    for (std::size_t l = 0; l < d.payload_layers; ++l) {
      // the image is indexed by location: shared arenas lie space(s).staging_gap rows past the pool
      const auto& sp = tw.dev.space(s);
      pools_[l].assign(sp.rows() * d.row_bytes, std::byte{0});
      tw.dev.copy_pool(s, l, std::span<std::byte>(pools_[l]).first(pool_bytes));
      if (Staging::shared && tw.dev.staging_holder() == s)
        tw.dev.copy_staging(s, l, std::span<std::byte>(pools_[l]).subspan(sp.staging_begin() * d.row_bytes));
    }
  }

  /// Exact bytes at every returned location (layers [0, layers)) in the last `snapshot(s)`.
  void check_bytes(std::size_t s, request_id id, const std::vector<row_index>& sel, const std::vector<location>& locs,
                   std::size_t layers, const std::string& ctx) {
    const auto& d = Layout::sources[s];
    std::vector<std::byte> want(d.row_bytes);
    for (std::size_t l = 0; l < layers; ++l) {
      const std::vector<std::byte>& pool = pools_[l];
      for (std::size_t i = 0; i < sel.size(); ++i) {
        if (sel[i] == dh::no_row) {
          if (locs[i] != dh::no_location) DHTEST_FAIL(ctx << ": entry " << i << " is -1 but got location " << locs[i]);
          continue;
        }
        fill_row(want.data(), d.row_bytes, key_of(id, s, sel[i]), s, l, sel[i]);
        const std::byte* have = pool.data() + static_cast<std::size_t>(locs[i]) * d.row_bytes;
        if (std::memcmp(have, want.data(), d.row_bytes) != 0)
          DHTEST_FAIL(ctx << ": source " << s << " layer " << l << " request " << id << " entry " << i << " row "
                          << sel[i] << " (frontier " << tw.host.frontier(id, s) << ") at location " << locs[i]
                          << " holds " << hex_prefix(have, d.row_bytes) << "..., expected "
                          << hex_prefix(want.data(), d.row_bytes) << "...");
      }
    }
  }

  static std::string vstats_text(const dh::verify_stats& s) {
    std::ostringstream o;
    o << "{selected " << s.selected << ", direct " << s.direct << ", block " << s.block << ", hot " << s.hot
      << ", host " << s.host << ", staged " << s.staged << ", rows " << s.rows_copied << ", bytes " << s.bytes_copied
      << ", staging_rows " << s.staging_rows << "}";
    return o.str();
  }

  /// Shared arenas held by another source: misuse is refused with nothing changed, then the
  /// holder releases them (its layer group is over).
  void take_arenas(std::size_t s) {
    if constexpr (Staging::shared) {
      const auto h = tw.host.staging_holder();
      REQUIRE(tw.dev.staging_holder() == h);
      if (!h || *h == s) return;
      std::vector<dhc::verify_batch_item> none;
      REQUIRE_THROWS_AS(tw.dev.verify(s, std::span<const dhc::verify_batch_item>(none)), dh::staging_in_use);
      REQUIRE_THROWS_AS(tw.dev.release_staging(s), dh::staging_not_held);
      REQUIRE_THROWS_AS(tw.dev.payload_row(s, 0, tw.dev.space(s).staging(0, 0)), dh::staging_not_held);
      REQUIRE(tw.dev.staging_holder() == h);
      ++n.held_probes;
      release(*h);
    }
  }
  void release(std::size_t s) {
    tw.host.release_staging(s);
    tw.dev.release_staging(s);
    REQUIRE(!tw.dev.staging_holder());
    ++n.releases;
  }

  void round(std::size_t s, const std::string& ctx) {
    take_arenas(s);
    // the batch: distinct live requests, each stages a block (sometimes restages) and picks K_r
    std::vector<request_id> ids = tw.live;
    std::shuffle(ids.begin(), ids.end(), tw.rng);
    ids.resize(1 + tw.uniform(std::min(w_.max_batch, ids.size())));
    const std::size_t b = ids.size();
    std::vector<std::size_t> kr(b);
    std::vector<std::vector<std::vector<row_index>>> queries(b);
    for (std::size_t e = 0; e < b; ++e) {
      const request_id id = ids[e];
      if (bpos_[id][s] == 0 || tw.chance(0.4)) stage(id, s);
      if (tw.chance(0.05)) stage(id, s);  // replaced before verification
      kr[e] = 1 + tw.uniform(bpos_[id][s]);
      std::vector<row_index> earlier;
      for (std::size_t j = 0; j < kr[e]; ++j) {
        queries[e].push_back(make_query(id, s, j, earlier));
        earlier.insert(earlier.end(), queries[e].back().begin(), queries[e].back().end());
      }
    }
    const bool producer_only = Layout::sources[s].payload_layers > 1 && tw.chance(0.3);
    const auto mode = producer_only ? dh::copy_layers::producer_only : dh::copy_layers::all;

    // host: per request in `all` mode (per-entry stats), one batch call in producer_only
    std::vector<std::vector<std::vector<location>>> expect(b);
    std::vector<dh::verify_stats> expect_stats(b);
    std::vector<dh::planned_copy> expect_plan;
    dh::verify_stats expect_total;
    {
      std::vector<std::vector<std::span<const row_index>>> qs(b);
      std::vector<std::vector<std::span<location>>> ls(b);
      std::vector<dh::verify_item> items(b);
      for (std::size_t e = 0; e < b; ++e) {
        expect[e].resize(kr[e]);
        for (std::size_t j = 0; j < kr[e]; ++j) {
          expect[e][j].assign(queries[e][j].size(), 0x7A7A7A7A);
          qs[e].push_back(queries[e][j]);
          ls[e].push_back(expect[e][j]);
        }
        items[e] = {ids[e], qs[e], ls[e]};
      }
      if (!producer_only) {
        for (std::size_t e = 0; e < b; ++e) {
          expect_stats[e] = tw.host.verify(s, std::span<const dh::verify_item>(&items[e], 1), mode);
          expect_total += expect_stats[e];
          const auto p = tw.host.last_plan(s);
          expect_plan.insert(expect_plan.end(), p.begin(), p.end());
        }
      } else {
        expect_total = tw.host.verify(s, items, mode);
        const auto p = tw.host.last_plan(s);
        expect_plan.assign(p.begin(), p.end());
      }
    }

    // device
    std::vector<row_index> staged(b * km_ * K, dh::no_row);
    std::vector<std::vector<dhc::verify_query>> dq(b);
    std::vector<dhc::verify_batch_item> ditems(b);
    for (std::size_t e = 0; e < b; ++e) {
      for (std::size_t j = 0; j < kr[e]; ++j) {
        const std::size_t at = (e * km_ + j) * K;
        std::copy(queries[e][j].begin(), queries[e][j].end(), staged.begin() + static_cast<long>(at));
        dq[e].push_back({dsel_.data() + at, static_cast<std::int32_t>(queries[e][j].size()), dloc_.data() + at});
      }
      ditems[e] = {ids[e], dq[e]};
    }
    DHTEST_CUDA(cudaMemcpy(dsel_.data(), staged.data(), staged.size() * sizeof(row_index), cudaMemcpyHostToDevice));
    DHTEST_CUDA(cudaMemset(dloc_.data(), 0x7A, dloc_.bytes()));
    tw.dev.verify(s, std::span<const dhc::verify_batch_item>(ditems), tw.dev.stream(), mode);
    wait_or_die(tw.dev.stream(), ctx + ": verify");
    tw.dev.check_errors(tw.dev.stream());
    std::vector<location> got(b * km_ * K);
    DHTEST_CUDA(cudaMemcpy(got.data(), dloc_.data(), got.size() * sizeof(location), cudaMemcpyDeviceToHost));
    const auto stats = tw.dev.last_verify_stats(s);
    const auto plan = tw.dev.last_verify_plan(s);
    ++n.verifies;
    if (producer_only) ++n.producer_only;

    INFO(ctx << " verify on source " << s << ", batch " << b << ", mode " << (producer_only ? "producer_only" : "all"));
    REQUIRE(stats.size() == b);
    dh::verify_stats total;
    for (std::size_t e = 0; e < b; ++e) {
      const request_id id = ids[e];
      INFO("batch entry " << e << " request " << id << " (slot " << tw.host.slot_of(id) << ") K_r " << kr[e]
                          << " staged " << block_[id][s].size() << " frontier " << tw.host.frontier(id, s));
      std::size_t entries = 0;
      std::set<row_index> distinct;
      for (std::size_t j = 0; j < kr[e]; ++j) {
        const std::span<const location> g(got.data() + (e * km_ + j) * K, queries[e][j].size());
        const std::string diff = diff_sequence<location, location>("locations of query " + std::to_string(j), expect[e][j], g);
        if (!diff.empty()) {
          const long m = first_mismatch(std::span<const location>(expect[e][j]), g);
          DHTEST_FAIL(diff << "\nlocation mismatch at query " << j << " entry " << m << " (row "
                           << queries[e][j][static_cast<std::size_t>(m)] << ")");
        }
        entries += queries[e][j].size();
      }
      if (!producer_only) {
        INFO("host stats " << vstats_text(expect_stats[e]) << " device " << vstats_text(stats[e]));
        REQUIRE(stats[e] == expect_stats[e]);
      }
      REQUIRE(stats[e].staging_rows <= km_ * K);  // the staging bound
      REQUIRE(stats[e].staging_rows <= kr[e] * K);
      total += stats[e];
    }
    {
      INFO("host total " << vstats_text(expect_total) << " device " << vstats_text(total));
      REQUIRE(total == expect_total);
    }
    {
      INFO("copy plan: " << expect_plan.size() << " host copies vs " << plan.size() << " device");
      REQUIRE(plan.size() == expect_plan.size());
      for (std::size_t i = 0; i < plan.size(); ++i) {
        INFO("plan entry " << i << ": host {slot " << expect_plan[i].slot << ", row " << expect_plan[i].row << ", dst "
                           << expect_plan[i].dst << "} device {slot " << plan[i].slot << ", row " << plan[i].row
                           << ", dst " << plan[i].dst << "}");
        REQUIRE((plan[i].slot == expect_plan[i].slot && plan[i].row == expect_plan[i].row &&
                 plan[i].dst == expect_plan[i].dst));
      }
    }
    n.entries += total.selected;
    n.block += total.block;
    n.hot += total.hot;
    n.host += total.host;
    n.staged += total.staged;
    n.staging_rows += total.staging_rows;
    n.rows_copied += total.rows_copied;
    n.union_saved += total.host - total.rows_copied;  // entries served by a copy another entry caused

    // followers: sometimes left pending, then both backends refuse the next verify
    if (producer_only) {
      if (tw.chance(0.2)) {
        std::vector<location> sink(queries[0][0].size());
        std::vector<std::span<const row_index>> q1{queries[0][0]};
        std::vector<std::span<location>> l1{sink};
        REQUIRE_THROWS_AS(tw.host.verify(ids[0], s, q1, l1), dh::pending_follower_copies);
        std::vector<dhc::verify_batch_item> none;
        REQUIRE_THROWS_AS(tw.dev.verify(s, std::span<const dhc::verify_batch_item>(none)),
                          dh::pending_follower_copies);
      }
      for (std::size_t l = 1; l < Layout::sources[s].payload_layers; ++l) {
        tw.host.copy_follower(s, l);
        tw.dev.copy_follower(s, l);
      }
    }
    snapshot(s);
    for (std::size_t e = 0; e < b; ++e)
      for (std::size_t j = 0; j < kr[e]; ++j) {
        const std::vector<location> g(got.begin() + static_cast<long>((e * km_ + j) * K),
                                      got.begin() + static_cast<long>((e * km_ + j) * K + queries[e][j].size()));
        check_bytes(s, ids[e], queries[e][j], g, Layout::sources[s].payload_layers,
                    ctx + " query " + std::to_string(j) + " of request " + std::to_string(ids[e]));
      }

    // acceptance: commit A in [0, K_r - 1] (sometimes abandon, sometimes verify again first)
    for (std::size_t e = 0; e < b; ++e) {
      const request_id id = ids[e];
      REQUIRE(tw.dev.verified_queries(id, s) == kr[e]);
      if (tw.chance(0.1)) {
        ++n.abandoned;
        continue;
      }
      const std::size_t a = tw.uniform(kr[e]);
      const std::int64_t f = tw.host.frontier(id, s);
      const std::int64_t next = tw.host.positions(id, s) + static_cast<std::int64_t>(a) + 1;
      const std::int64_t completed = next / m_of(s) - f;  // rows the accepted prefix completes (m = 1: a + 1)
      tw.commit(id, s, a, completed);
      wait_or_die(tw.dev.stream(), ctx + ": commit");  // the device writes the host store asynchronously
      auto& t = tags_[id][s];
      for (std::int64_t i = 0; i < completed; ++i) t.push_back(block_[id][s][static_cast<std::size_t>(i)]);
      block_[id][s].clear();
      bpos_[id][s] = 0;
      ++n.commits;
      REQUIRE(tw.host.frontier(id, s) == f + completed);
      REQUIRE(tw.host.positions(id, s) == next);
      REQUIRE(tw.dev.positions(id, s) == next);
      REQUIRE(tw.dev.frontier(id, s) == tw.host.frontier(id, s));
      REQUIRE(tw.dev.device_frontier(id, s) == tw.host.frontier(id, s));
      REQUIRE(tw.dev.staged_rows(id, s) == 0);
      // the committed rows in both host stores, bit for bit
      const auto& d = Layout::sources[s];
      std::vector<std::byte> want(d.row_bytes);
      for (std::int64_t r = f; r < f + completed; ++r)
        for (std::size_t l = 0; l < d.payload_layers; ++l) {
          fill_row(want.data(), d.row_bytes, key_of(id, s, static_cast<row_index>(r)), s, l, static_cast<row_index>(r));
          const auto hr = tw.host.host_row(id, s, l, static_cast<row_index>(r));
          const auto dr = tw.dev.host_row(id, s, l, static_cast<row_index>(r));
          if (std::memcmp(hr.data(), want.data(), d.row_bytes) != 0 || std::memcmp(dr.data(), want.data(), d.row_bytes) != 0)
            DHTEST_FAIL(ctx << ": committed row " << r << " of request " << id << " source " << s << " layer " << l
                            << ": host store " << hex_prefix(hr.data(), d.row_bytes) << "..., device store "
                            << hex_prefix(dr.data(), d.row_bytes) << "..., expected "
                            << hex_prefix(want.data(), d.row_bytes) << "...");
        }
    }
    // the attention consumers of the round are done: release the arenas (sometimes the same source
    // verifies again first)
    if (Staging::shared && tw.chance(0.6)) release(s);
  }

  void compare_spec_books(const std::string& ctx) {
    for (request_id id : tw.live)
      for (std::size_t s = 0; s < S; ++s) {
        INFO(ctx << ": request " << id << " source " << s);
        REQUIRE(tw.host.staged_rows(id, s) == tw.dev.staged_rows(id, s));
        REQUIRE(tw.host.verified_queries(id, s) == tw.dev.verified_queries(id, s));
        REQUIRE(tw.host.positions(id, s) == tw.dev.positions(id, s));
      }
  }
};

}  // namespace

TEST_CASE("cuda verify matches the host hierarchy: tiny layout, B = top_k (staging overflow), K_max 4",
          "[gpu][verify][differential]") {
  require_device();
  const dh::hierarchy_config cfg{.max_requests = 4, .max_rows = 300, .optional_pages = 6, .max_block = 4};
  const spec_workload w{.rounds = 2500, .max_batch = 4, .state_every = 5, .seed = 51};
  spec_run<dh::layouts::tiny, dh::lru_hot_cache<16>>(cfg, w, "tiny/B16/K4").run();
}

TEST_CASE("cuda verify matches the host hierarchy: tiny layout, B=64, 12-row tail, K_max 3",
          "[gpu][verify][differential]") {
  require_device();
  const dh::hierarchy_config cfg{.max_requests = 6, .max_rows = 500, .tail_rows = 12, .optional_pages = 10, .max_block = 3};
  const spec_workload w{.rounds = 2500, .max_batch = 6, .state_every = 7, .seed = 52};
  spec_run<dh::layouts::tiny, dh::lru_hot_cache<64>>(cfg, w, "tiny/B64/K3").run();
}

TEST_CASE("cuda verify matches the host hierarchy: 576/656-byte rows, k=256, B=512, K_max 8",
          "[gpu][verify][differential]") {
  require_device();
  const dh::hierarchy_config cfg{.max_requests = 5, .max_rows = 4096, .optional_pages = 16, .max_block = 8};
  const spec_workload w{.rounds = 500, .max_batch = 5, .state_every = 10, .seed = 53};
  spec_run<layout_576, dh::lru_hot_cache<512>>(cfg, w, "576/k256/B512/K8").run();
}

TEST_CASE("cuda verify matches the host hierarchy: GLM-like k=2048, B=4096, K_max 8", "[gpu][verify][differential]") {
  require_device();
  const dh::hierarchy_config cfg{.max_requests = 3, .max_rows = 20000, .optional_pages = 16, .max_block = 8};
  const spec_workload w{.rounds = 30, .max_batch = 3, .state_every = 5, .initial_rows = 12000, .seed = 54};
  spec_run<layout_glm_like, dh::lru_hot_cache<4096>>(cfg, w, "glm-like/k2048/B4096/K8").run();
}

/// Like tiny, with packed sources: source 0 packs 2 positions per row (two payload layers), source 1
/// packs 4 (DeepSeek V4.1 Flash's compressed sources).
struct layout_packed {
  static constexpr std::size_t top_k = 16;
  static constexpr std::size_t page_rows = 8;
  static constexpr std::array<dh::source_desc, 2> sources{{{64, 2, 2, 32}, {32, 4, 1, 32}}};
  static constexpr std::array<dh::consumer_desc, 3> consumers{{
      {0, dh::consumer_kind::reindex, 0}, {0, dh::consumer_kind::follower, 1}, {1, dh::consumer_kind::reindex, 0}}};
};
static_assert(dh::valid_layout<layout_packed>);

TEST_CASE("cuda verify matches the host hierarchy: packed rows (m = 2 and 4), B = top_k, K_max 4",
          "[gpu][verify][differential][packed]") {
  require_device();
  const dh::hierarchy_config cfg{.max_requests = 4, .max_rows = 300, .optional_pages = 6, .max_block = 4};
  const spec_workload w{.rounds = 2500, .max_batch = 4, .state_every = 5, .seed = 61};
  spec_run<layout_packed, dh::lru_hot_cache<16>>(cfg, w, "packed/B16/K4").run();
}

TEST_CASE("cuda verify matches the host hierarchy: packed rows (m = 2 and 4), B=64, 12-row tail, K_max 7",
          "[gpu][verify][differential][packed]") {
  require_device();
  const dh::hierarchy_config cfg{.max_requests = 5, .max_rows = 400, .tail_rows = 12, .optional_pages = 8, .max_block = 7};
  const spec_workload w{.rounds = 2500, .max_batch = 5, .state_every = 7, .seed = 62};
  spec_run<layout_packed, dh::lru_hot_cache<64>>(cfg, w, "packed/B64/K7").run();
}

TEST_CASE("cuda verify matches the host hierarchy with every per-step kernel launched programmatically",
          "[gpu][verify][differential][programmatic]") {
  require_device();
  SECTION("packed rows, B=64, 12-row tail, K_max 7 (follower copies after producer-only verifies)") {
    const dh::hierarchy_config cfg{.max_requests = 5, .max_rows = 400, .tail_rows = 12, .optional_pages = 8, .max_block = 7};
    const spec_workload w{.rounds = 1500, .max_batch = 5, .state_every = 7, .seed = 63, .programmatic = true};
    spec_run<layout_packed, dh::lru_hot_cache<64>>(cfg, w, "programmatic/packed/B64/K7").run();
  }
  SECTION("576/656-byte rows, k=256, B=512, K_max 8") {
    const dh::hierarchy_config cfg{.max_requests = 5, .max_rows = 4096, .optional_pages = 16, .max_block = 8};
    const spec_workload w{.rounds = 300, .max_batch = 5, .state_every = 10, .seed = 64, .programmatic = true};
    spec_run<layout_576, dh::lru_hot_cache<512>>(cfg, w, "programmatic/576/k256/B512/K8").run();
  }
}

TEST_CASE("speculative decoding on the GPU leaves the history of plain decoding, bit for bit",
          "[gpu][verify][end_to_end]") {
  require_device();
  using L = dh::layouts::tiny;
  using H = dhc::hierarchy<L, dh::lru_hot_cache<16>>;
  constexpr std::size_t S = dh::source_count<L>;
  dh::hierarchy_config spec_cfg;
  spec_cfg.max_requests = 2;
  spec_cfg.max_rows = 600;
  spec_cfg.max_block = 5;
  dh::hierarchy_config plain_cfg = spec_cfg;
  plain_cfg.max_block = 1;
  H spec(spec_cfg), plain(plain_cfg);
  dh::host_hierarchy<L, dh::lru_hot_cache<16>> ref(spec_cfg);
  std::mt19937_64 rng(77);
  const request_id id = 7;
  REQUIRE(spec.admit(id).admitted);
  REQUIRE(plain.admit(id).admitted);
  REQUIRE(ref.admit(id).admitted);
  const std::size_t prompt = 40;
  for (std::size_t s = 0; s < S; ++s) {
    const auto rows = make_rows<L>(id, s, 0, prompt);
    spec.append(id, s, std::span<const std::byte>(rows), prompt);
    plain.append(id, s, std::span<const std::byte>(rows), prompt);
    ref.append(id, s, rows, prompt);
  }
  constexpr std::size_t K = L::top_k;
  dhc::device_buffer<row_index> dsel(spec_cfg.max_block * K);
  dhc::device_buffer<location> dloc(spec_cfg.max_block * K);
  std::uint64_t tag = 1;
  std::size_t rounds = 0, accepted_total = 0;
  const auto room_left = [&] {
    for (std::size_t s = 0; s < S; ++s)
      if (static_cast<std::size_t>(spec.frontier(id, s)) + spec_cfg.max_block + 1 >= spec_cfg.max_rows) return false;
    return true;
  };
  while (room_left()) {
    ++rounds;
    INFO("round " << rounds);
    for (std::size_t s = 0; s < S; ++s) {
      const auto& d = L::sources[s];
      const std::int64_t f = spec.frontier(id, s);
      const std::size_t c = 1 + rng() % spec_cfg.max_block;
      // the drafted block: row i of the block has content of (tag + i)
      std::vector<std::byte> block(c * d.payload_layers * d.row_bytes);
      for (std::size_t l = 0; l < d.payload_layers; ++l)
        for (std::size_t i = 0; i < c; ++i)
          fill_row(block.data() + (l * c + i) * d.row_bytes, d.row_bytes, content_key(id, tag + i), s, l,
                   static_cast<row_index>(f + static_cast<std::int64_t>(i)));
      spec.stage_block(id, s, std::span<const std::byte>(block), c);
      ref.stage_block(id, s, block, c);
      // every query selects old rows and the block up to itself
      std::vector<row_index> sel(c * K, dh::no_row);
      std::vector<std::vector<location>> want(c, std::vector<location>(K));
      std::vector<std::span<const row_index>> qs;
      std::vector<std::span<location>> ls;
      std::vector<dhc::verify_query> dq;
      for (std::size_t j = 0; j < c; ++j) {
        for (std::size_t i = 0; i < K; ++i)
          sel[j * K + i] = i < 3 ? static_cast<row_index>(f + static_cast<std::int64_t>(rng() % (j + 1)))
                                 : static_cast<row_index>(rng() % static_cast<std::size_t>(f));
        qs.emplace_back(sel.data() + j * K, K);
        ls.emplace_back(want[j]);
        dq.push_back({dsel.data() + j * K, static_cast<std::int32_t>(K), dloc.data() + j * K});
      }
      DHTEST_CUDA(cudaMemcpy(dsel.data(), sel.data(), sel.size() * sizeof(row_index), cudaMemcpyHostToDevice));
      ref.verify(id, s, qs, ls);
      const dhc::verify_batch_item item{id, dq};
      spec.verify_sync(s, std::span<const dhc::verify_batch_item>(&item, 1), spec.stream());
      std::vector<location> got(c * K);
      DHTEST_CUDA(cudaMemcpy(got.data(), dloc.data(), got.size() * sizeof(location), cudaMemcpyDeviceToHost));
      for (std::size_t j = 0; j < c; ++j)
        DHTEST_REQUIRE_SAME(location, "verify locations vs host reference", std::span<const location>(want[j]),
                            std::span<const location>(got.data() + j * K, K));
      const std::size_t a = rng() % c;
      spec.commit(id, s, a);
      ref.commit(id, s, a);
      // plain decoding appends the same accepted tokens (anchor + a proposals), one step each
      for (std::size_t i = 0; i <= a; ++i) {
        std::vector<std::byte> one(d.payload_layers * d.row_bytes);
        for (std::size_t l = 0; l < d.payload_layers; ++l)
          std::memcpy(one.data() + l * d.row_bytes, block.data() + (l * c + i) * d.row_bytes, d.row_bytes);
        plain.append(id, s, std::span<const std::byte>(one), 1);
      }
      REQUIRE(spec.frontier(id, s) == plain.frontier(id, s));
      if (s == 0) accepted_total += a + 1;
    }
    tag += 64;
  }
  DHTEST_CUDA(cudaDeviceSynchronize());
  for (std::size_t s = 0; s < S; ++s) {
    const auto& d = L::sources[s];
    REQUIRE(spec.device_frontier(id, s) == plain.device_frontier(id, s));
    for (row_index r = 0; r < static_cast<row_index>(spec.frontier(id, s)); ++r)
      for (std::size_t l = 0; l < d.payload_layers; ++l) {
        const auto a = spec.host_row(id, s, l, r);
        const auto b = plain.host_row(id, s, l, r);
        const auto c = ref.host_row(id, s, l, r);
        if (std::memcmp(a.data(), b.data(), d.row_bytes) != 0 || std::memcmp(a.data(), c.data(), d.row_bytes) != 0)
          DHTEST_FAIL("source " << s << " layer " << l << " row " << r << ": speculative " << hex_prefix(a.data(), d.row_bytes)
                                << "..., plain " << hex_prefix(b.data(), d.row_bytes) << "..., host reference "
                                << hex_prefix(c.data(), d.row_bytes) << "...");
      }
    // and a resolve over the whole history reads the same bytes from both (locations may differ:
    // the plain hierarchy's tail is smaller)
    std::vector<row_index> sel(K);
    for (std::size_t i = 0; i < K; ++i) sel[i] = static_cast<row_index>(rng() % static_cast<std::size_t>(spec.frontier(id, s)));
    DHTEST_CUDA(cudaMemcpy(dsel.data(), sel.data(), K * sizeof(row_index), cudaMemcpyHostToDevice));
    for (H* h : {&spec, &plain}) {
      const typename H::batch_item it{id, dsel.data(), static_cast<std::int32_t>(K), dloc.data()};
      h->resolve_sync(s, std::span<const typename H::batch_item>(&it, 1), h->stream());
      std::vector<location> loc(K);
      DHTEST_CUDA(cudaMemcpy(loc.data(), dloc.data(), K * sizeof(location), cudaMemcpyDeviceToHost));
      for (std::size_t i = 0; i < K; ++i)
        for (std::size_t l = 0; l < d.payload_layers; ++l) {
          const auto got = h->payload_row(s, l, loc[i]);
          const auto want = spec.host_row(id, s, l, sel[i]);
          REQUIRE(std::memcmp(got.data(), want.data(), d.row_bytes) == 0);
        }
    }
  }
  INFO(rounds << " rounds, " << accepted_total << " positions accepted on source 0");
  CHECK(rounds > 50);
}

TEST_CASE("cuda verify over a device descriptor, captured once in a CUDA graph and replayed, matches the host",
          "[gpu][verify][graph]") {
  require_device();
  using L = dh::layouts::tiny;
  using Hot = dh::lru_hot_cache<16>;
  using T = twin<L, Hot>;
  constexpr std::size_t K = L::top_k;
  dh::hierarchy_config cfg;
  cfg.max_requests = 3;
  cfg.max_rows = 600;
  cfg.max_block = 4;
  T tw(cfg, 61);
  const std::size_t N = cfg.max_requests, KM = cfg.max_block, s = 0;
  for (request_id id = 1; id <= N; ++id) {
    REQUIRE(tw.admit(id));
    for (std::size_t src = 0; src < T::sources; ++src) tw.append(id, src, 40);
  }
  // The descriptor's buffers (device_verify_batch): query j of entry e at (e * K_max + j) * top_k.
  dhc::device_verify_batch batch(static_cast<std::uint32_t>(N), static_cast<std::uint32_t>(KM), static_cast<std::uint32_t>(K));
  const dhc::verify_batch_view v = batch.view();
  cudaStream_t st = nullptr;
  DHTEST_CUDA(cudaStreamCreate(&st));  // blocking: ordered with the legacy stream the twin's calls use
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  DHTEST_CUDA(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  tw.dev.verify(s, v, st);
  DHTEST_CUDA(cudaStreamEndCapture(st, &graph));
  DHTEST_CUDA(cudaGraphInstantiate(&exec, graph, 0));

  // One replay of `rounds` (request, queries): upload, launch the graph, check errors.
  struct round {
    request_id id;
    std::vector<std::vector<row_index>> q;
  };
  auto replay = [&](const std::vector<round>& rounds) {
    std::vector<std::vector<std::span<const row_index>>> qs(rounds.size());
    std::vector<dhc::device_verify_batch::round> up(rounds.size());
    for (std::size_t e = 0; e < rounds.size(); ++e) {
      for (const auto& q : rounds[e].q) qs[e].push_back(q);
      up[e] = {static_cast<std::int32_t>(tw.dev.slot_of(rounds[e].id)), qs[e]};
    }
    batch.upload(up, st);
    DHTEST_CUDA(cudaGraphLaunch(exec, st));
    wait_or_die(st, "graph replay of verify");
  };

  std::size_t verified_rounds = 0;
  for (std::size_t r = 0; r < 300; ++r) {
    INFO("replay " << r);
    // the batch: distinct requests in random order, each stages a fresh block
    std::vector<request_id> ids(tw.live);
    std::shuffle(ids.begin(), ids.end(), tw.rng);
    ids.resize(1 + tw.uniform(ids.size()));
    std::vector<round> rounds;
    for (request_id id : ids) {
      const std::int64_t f = tw.host.frontier(id, s);
      if (static_cast<std::size_t>(f) + KM + 1 >= cfg.max_rows) continue;
      const std::size_t c = 1 + tw.uniform(KM);
      const auto rows = make_rows<L>(id, s, f, c);
      tw.host.stage_block(id, s, rows, c);
      tw.dev.stage_block(id, s, std::span<const std::byte>(rows), c);
      round rd{id, {}};
      const std::size_t kr = 1 + tw.uniform(c);
      for (std::size_t j = 0; j < kr; ++j) {
        std::vector<row_index> q = tw.make_selection(id, s, tw.uniform(K + 1));
        for (auto& e : q)
          if (e != dh::no_row && tw.chance(0.15)) e = static_cast<row_index>(f + static_cast<std::int64_t>(tw.uniform(j + 1)));
        rd.q.push_back(std::move(q));
      }
      rounds.push_back(std::move(rd));
    }
    // host reference, one request at a time (per-entry stats and plans)
    std::vector<std::vector<std::vector<location>>> want(rounds.size());
    std::vector<dh::verify_stats> want_stats(rounds.size());
    std::vector<dh::planned_copy> want_plan;
    for (std::size_t e = 0; e < rounds.size(); ++e) {
      std::vector<std::span<const row_index>> qs;
      std::vector<std::span<location>> ls;
      want[e].resize(rounds[e].q.size());
      for (std::size_t j = 0; j < rounds[e].q.size(); ++j) {
        want[e][j].assign(rounds[e].q[j].size(), 0);
        qs.emplace_back(rounds[e].q[j]);
        ls.emplace_back(want[e][j]);
      }
      want_stats[e] = tw.host.verify(rounds[e].id, s, qs, ls);
      const auto p = tw.host.last_plan(s);
      want_plan.insert(want_plan.end(), p.begin(), p.end());
    }
    replay(rounds);
    tw.dev.check_errors(st);
    const auto stats = tw.dev.last_verify_stats(s);
    const auto plan = tw.dev.last_verify_plan(s);
    REQUIRE(stats.size() == rounds.size());
    REQUIRE(plan.size() == want_plan.size());
    for (std::size_t i = 0; i < plan.size(); ++i)
      REQUIRE((plan[i].row == want_plan[i].row && plan[i].dst == want_plan[i].dst && plan[i].slot == want_plan[i].slot));
    for (std::size_t e = 0; e < rounds.size(); ++e) {
      REQUIRE(stats[e] == want_stats[e]);
      for (std::size_t j = 0; j < rounds[e].q.size(); ++j) {
        std::vector<location> got(rounds[e].q[j].size());
        if (!got.empty())
          DHTEST_CUDA(cudaMemcpy(got.data(), batch.locations(static_cast<std::uint32_t>(e), static_cast<std::uint32_t>(j)), got.size() * sizeof(location),
                                 cudaMemcpyDeviceToHost));
        DHTEST_REQUIRE_SAME(location, "locations of a replayed verify", std::span<const location>(want[e][j]),
                            std::span<const location>(got));
      }
      // the device books hold K_r; commit reads them
      REQUIRE(tw.dev.verified_queries(rounds[e].id, s) == rounds[e].q.size());
      const std::size_t a = tw.uniform(rounds[e].q.size());
      static_assert(L::sources[0].positions_per_row == 1);
      tw.commit(rounds[e].id, s, a, static_cast<std::int64_t>(a) + 1);  // m = 1: anchor + accepted rows
      ++verified_rounds;
    }
    if (r % 10 == 0) {
      tw.compare_state("replay " + std::to_string(r));
      tw.compare_pools("replay " + std::to_string(r));
    }
  }
  CHECK(verified_rounds > 300);

  // A bad entry in a replay: typed error from check_errors, the request's last good round kept.
  {
    const request_id id = tw.live.front();
    const std::int64_t f = tw.host.frontier(id, s);
    const auto rows = make_rows<L>(id, s, f, 2);
    tw.host.stage_block(id, s, rows, 2);
    tw.dev.stage_block(id, s, std::span<const std::byte>(rows), 2);
    replay({{id, {{1, 2}, {static_cast<row_index>(f + 1)}}}});
    tw.dev.check_errors(st);
    REQUIRE(tw.dev.verified_queries(id, s) == 2);
    replay({{id, {{static_cast<row_index>(f + 1)}}}});  // the anchor cannot see position f+1
    REQUIRE_THROWS_AS(tw.dev.check_errors(st), dh::position_not_visible);
    REQUIRE(tw.dev.verified_queries(id, s) == 2);
    replay({{id, {{1}, {2}, {3}}}});  // K_r above the staged block: checked on the device here
    REQUIRE_THROWS_AS(tw.dev.check_errors(st), dh::block_too_wide);
    REQUIRE(tw.dev.verified_queries(id, s) == 2);
    REQUIRE_THROWS_AS(tw.dev.commit(id, s, 2), dh::acceptance_beyond_block);
    tw.dev.commit(id, s, 1);
    REQUIRE(tw.dev.frontier(id, s) == f + 2);
    replay({{id, {{1}}}});  // the round is closed: nothing staged
    REQUIRE_THROWS_AS(tw.dev.check_errors(st), dh::no_staged_block);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(st);
}

// ------------------------------------------------------------------ shared staging arenas

TEST_CASE("cuda verify with shared staging arenas matches the host: tiny layout, B = top_k, K_max 4",
          "[gpu][verify][differential][staging]") {
  require_device();
  const dh::hierarchy_config cfg{.max_requests = 4, .max_rows = 300, .optional_pages = 6, .max_block = 4};
  const spec_workload w{.rounds = 2500, .max_batch = 4, .state_every = 5, .seed = 71};
  spec_run<dh::layouts::tiny, dh::lru_hot_cache<16>, dh::staging_arenas<2>>(cfg, w, "tiny/B16/K4/arenas2").run();
}

TEST_CASE("cuda verify with shared staging arenas matches the host: packed rows, B=64, 12-row tail, K_max 7",
          "[gpu][verify][differential][staging][packed]") {
  require_device();
  const dh::hierarchy_config cfg{.max_requests = 5, .max_rows = 400, .tail_rows = 12, .optional_pages = 8, .max_block = 7};
  const spec_workload w{.rounds = 1500, .max_batch = 5, .state_every = 7, .seed = 72};
  spec_run<layout_packed, dh::lru_hot_cache<64>, dh::staging_arenas<3>>(cfg, w, "packed/B64/K7/arenas3").run();
}

TEST_CASE("shared staging arenas: memory is chi arenas of the widest row; pools lose their staging rows",
          "[gpu][verify][staging]") {
  using L = dh::layouts::tiny;
  using Ded = dhc::hierarchy<L, dh::lru_hot_cache<16>>;
  using Sh = dhc::hierarchy<L, dh::lru_hot_cache<16>, dh::fixed_budget_policy, dh::staging_arenas<2>>;
  dh::hierarchy_config cfg;
  cfg.max_requests = 8;
  cfg.max_rows = 4096;
  cfg.max_block = 8;
  const std::size_t per_slot = cfg.max_block * L::top_k;
  CHECK(Ded::staging_arena_bytes(cfg) == 0);
  CHECK(Sh::staging_arena_bytes(cfg) == dh::staging_arenas<2>::bytes(8, 8, L::top_k, 64));
  std::size_t dedicated_staging = 0;
  for (const auto& d : L::sources) dedicated_staging += d.payload_layers * cfg.max_requests * per_slot * d.row_bytes;
  const auto ded = Ded::requirements(cfg), sh = Sh::requirements(cfg);
  // pools shrink by every layer's staging (up to 256-byte alignment per layer), arenas add M_stage
  const long long delta = static_cast<long long>(ded.device_bytes) - static_cast<long long>(sh.device_bytes);
  const long long want = static_cast<long long>(dedicated_staging) - static_cast<long long>(Sh::staging_arena_bytes(cfg));
  CHECK(std::llabs(delta - want) <= 4096);
  CHECK(ded.pinned_bytes == sh.pinned_bytes);
}

TEST_CASE("shared staging arenas: a verify on another stream waits on the device for the release",
          "[gpu][verify][staging]") {
  require_device();
  using L = dh::layouts::tiny;
  using H = dhc::hierarchy<L, dh::lru_hot_cache<16>, dh::fixed_budget_policy, dh::staging_arenas<2>>;
  constexpr std::size_t K = L::top_k, KM = 4, S = dh::source_count<L>;
  dh::hierarchy_config cfg;
  cfg.max_requests = 2;
  cfg.max_rows = 256;
  cfg.max_block = KM;
  H dev(cfg);
  const request_id id = 5;
  REQUIRE(dev.admit(id).admitted);
  const std::size_t prompt = 200;
  for (std::size_t s = 0; s < S; ++s) {
    dev.append(id, s, std::span<const std::byte>(make_rows<L>(id, s, 0, prompt)), prompt);
    const auto block = make_rows<L>(id, s, prompt, KM);  // the block rows carry the same content rule
    dev.stage_block(id, s, std::span<const std::byte>(block), KM);
  }
  // K_max queries of 16 distinct old rows each: a 64-row union, 48 rows past the 16-row hot cache
  std::vector<row_index> sel(KM * K);
  for (std::size_t i = 0; i < sel.size(); ++i) sel[i] = static_cast<row_index>(i * 3);
  dhc::device_buffer<row_index> dsel(sel.size());
  dhc::device_buffer<location> dloc0(sel.size()), dloc1(sel.size());
  DHTEST_CUDA(cudaMemcpy(dsel.data(), sel.data(), sel.size() * sizeof(row_index), cudaMemcpyHostToDevice));
  const auto items = [&](location* out) {
    std::vector<dhc::verify_query> q;
    for (std::size_t j = 0; j < KM; ++j) q.push_back({dsel.data() + j * K, static_cast<std::int32_t>(K), out + j * K});
    return q;
  };
  cudaStream_t a = nullptr, b = nullptr;
  DHTEST_CUDA(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  DHTEST_CUDA(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  const auto read = [&](const dhc::device_buffer<location>& d) {
    std::vector<location> v(sel.size());
    DHTEST_CUDA(cudaMemcpy(v.data(), d.data(), v.size() * sizeof(location), cudaMemcpyDeviceToHost));
    return v;
  };
  const auto check_rows = [&](std::size_t s, const std::vector<location>& locs, std::size_t& staged) {
    const auto& d = L::sources[s];
    std::vector<std::byte> want(d.row_bytes);
    for (std::size_t i = 0; i < sel.size(); ++i) {
      if (static_cast<std::size_t>(locs[i]) >= dev.space(s).staging_begin()) ++staged;
      for (std::size_t l = 0; l < d.payload_layers; ++l) {
        fill_row(want.data(), d.row_bytes, id, s, l, sel[i]);
        REQUIRE(dev.payload_row(s, l, locs[i]) == want);
        // as a stock attention kernel reads it: the layer's one base, no branch on the location
        std::vector<std::byte> flat(d.row_bytes);
        DHTEST_CUDA(cudaMemcpy(flat.data(), dev.pool(s, l) + static_cast<std::size_t>(locs[i]) * d.row_bytes,
                               d.row_bytes, cudaMemcpyDeviceToHost));
        REQUIRE(flat == want);
      }
    }
  };

  const auto q0 = items(dloc0.data());
  const std::array<dhc::verify_batch_item, 1> batch0{{{id, q0}}};
  dev.verify(0, std::span<const dhc::verify_batch_item>(batch0), a);
  wait_or_die(a, "verify of source 0");
  dev.check_errors(a);
  const auto locs0 = read(dloc0);
  std::size_t staged0 = 0;
  check_rows(0, locs0, staged0);
  CHECK(staged0 == KM * K - 16);

  // source 0's attention still reads the arenas on stream a (held by the gate) when it releases them
  gate g;
  g.close(a);
  dev.release_staging(0, a);
  const auto q1 = items(dloc1.data());
  const std::array<dhc::verify_batch_item, 1> batch1{{{id, q1}}};
  dev.verify(1, std::span<const dhc::verify_batch_item>(batch1), b);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  REQUIRE(g.closed());
  CHECK(cudaStreamQuery(b) == cudaErrorNotReady);  // the verify of source 1 waits for the release
  g.open();
  wait_or_die(b, "verify of source 1");
  dev.check_errors(b);
  std::size_t staged1 = 0;
  check_rows(1, read(dloc1), staged1);
  CHECK(staged1 == KM * K - 16);
  CHECK_THROWS_AS(dev.payload_row(0, 0, locs0.back()), dh::staging_not_held);
  // source 0's hot rows kept their bytes: they never lived in the arenas
  std::size_t hot0 = 0;
  for (std::size_t i = 0; i < sel.size(); ++i)
    if (static_cast<std::size_t>(locs0[i]) < dev.space(0).staging_begin()) {
      ++hot0;
      for (std::size_t l = 0; l < L::sources[0].payload_layers; ++l) {
        std::vector<std::byte> want(L::sources[0].row_bytes);
        fill_row(want.data(), want.size(), id, 0, l, sel[i]);
        REQUIRE(dev.payload_row(0, l, locs0[i]) == want);
      }
    }
  CHECK(hot0 == 16);

  // A verify captured in a graph on stream a after an eager release on stream b: the wait becomes
  // an external event node (a plain cross-stream wait would not be allowed in the capture).
  dev.release_staging(1, b);
  dhc::device_verify_batch vb(1, static_cast<std::uint32_t>(KM), static_cast<std::uint32_t>(K));
  std::vector<std::span<const row_index>> qspans;
  for (std::size_t j = 0; j < KM; ++j) qspans.emplace_back(sel.data() + j * K, K);
  const std::array<dhc::device_verify_batch::round, 1> vround{{{static_cast<std::int32_t>(dev.slot_of(id)), qspans}}};
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  DHTEST_CUDA(cudaStreamBeginCapture(a, cudaStreamCaptureModeThreadLocal));
  dev.verify(0, vb.view(), a);
  DHTEST_CUDA(cudaStreamEndCapture(a, &graph));
  DHTEST_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  vb.upload(vround, a);
  DHTEST_CUDA(cudaGraphLaunch(exec, a));
  wait_or_die(a, "captured verify of source 0");
  dev.check_errors(a);
  std::vector<location> relocs(sel.size());
  for (std::size_t j = 0; j < KM; ++j) {
    const auto got = vb.download_locations(0, static_cast<std::uint32_t>(j), K, a);
    std::copy(got.begin(), got.end(), relocs.begin() + static_cast<long>(j * K));
  }
  std::size_t restaged = 0;
  check_rows(0, relocs, restaged);
  CHECK(restaged == KM * K - 16);  // the hot cache holds 16 rows of the union, the rest is staged again
  dev.release_staging(0, b);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(a);
  cudaStreamDestroy(b);
}
