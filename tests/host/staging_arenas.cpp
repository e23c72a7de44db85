// Shared staging arenas (staging_arenas<chi>) on the host reference, against dedicated staging.
//
// Two hierarchies run the same randomized speculative rounds in lockstep: one with every payload
// layer's staging in its own pool (dedicated_staging, covered by speculative_rounds), one with chi
// arenas shared by every source. Rounds move from source to source as an engine moves through its
// layer groups: verify a source (producer-only now and then, followers copied later), check every
// returned location, release the arenas, go on with the next source. Checked after every round:
// the same locations (staged rows at the shared layout's staging locations, computed here from
// the layout: each source's arena follows the pools of the sources with at least as many payload
// layers, 256-byte aligned), the same bytes at every location, also read as a stock kernel would
// at `pool(s, l) + loc * row_bytes` (and the committed content for committed rows), the same hot rows and LRU order, and that every hot-cache row of every source still holds
// its exact bytes after other sources overwrote the arenas (promoted rows live at stable
// addresses). Misuse is typed and changes nothing: a verify while another source holds the arenas,
// a release or a staging read by a source that does not hold them, a release before the followers
// copied. Memory: the shared pools are smaller by the dedicated staging rows, the arenas are
// exactly chi * N * K_max * k rows of the widest row (M_stage), as the planner counts.
#include "../support/catch.hpp"

#include <dhisparse/host/hierarchy.hpp>
#include <dhisparse/layouts/tiny.hpp>
#include <dhisparse/planner.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "../support/reference_model.hpp"
#include "../support/row_content.hpp"

namespace {

using namespace dhisparse;
using dhisparse_testing::fill_row;
using dhisparse_testing::row_matches;
using dhisparse_testing::test_rng;

using L = layouts::tiny;  // source 0: 64 B rows, 2 payload layers; source 1: 32 B rows, 1 layer
using Hot = lru_hot_cache<16>;
using Dedicated = host_hierarchy<L, Hot, fixed_budget_policy, dedicated_staging>;
using Shared = host_hierarchy<L, Hot, fixed_budget_policy, staging_arenas<2>>;
constexpr std::size_t S = source_count<L>;

#if defined(__SANITIZE_ADDRESS__)
constexpr std::size_t kRounds = 4'000;
#else
constexpr std::size_t kRounds = 100'000;
#endif

/// First staging location of source `s` with shared arenas, from the layout alone: block l holds
/// the layer-l pools of source 1 (32 B rows, 1 layer), then of source 0 (64 B rows, 2 layers), then
/// the arena; source 0's pool ends where the arena starts, rounded up to 256 bytes and to its row,
/// and source 1's pool ends where source 0's begins, rounded likewise.
std::size_t shared_staging_begin(const location_space& sp, std::size_t s) {
  static_assert(L::sources[0].row_bytes == 64 && L::sources[1].row_bytes == 32 && L::sources[0].payload_layers == 2 &&
                L::sources[1].payload_layers == 1);
  const std::size_t rows = sp.slots * (sp.hot_rows + sp.tail_rows) + sp.optional_pages * sp.page_rows;
  const auto up256 = [](std::size_t x) { return (x + 255) / 256 * 256; };
  const std::size_t d0 = up256(rows * 64);       // bytes from source 0's pool to the arena
  const std::size_t d1 = up256(d0 + rows * 32);  // from source 1's pool
  return s == 0 ? d0 / 64 : d1 / 32;
}

hierarchy_config config() {
  hierarchy_config c;
  c.max_requests = 3;
  c.max_rows = 160;
  c.tail_rows = 4;
  c.optional_pages = 2;
  c.max_block = 4;
  return c;
}

/// `[layer][count][row_bytes]` rows of one source, row first + i tagged tags[i].
std::vector<std::byte> rows_of(std::size_t s, std::int64_t first, const std::vector<std::uint64_t>& tags) {
  const auto& d = L::sources[s];
  std::vector<std::byte> buf(d.payload_layers * tags.size() * d.row_bytes);
  for (std::size_t l = 0; l < d.payload_layers; ++l)
    for (std::size_t i = 0; i < tags.size(); ++i)
      fill_row(buf.data() + (l * tags.size() + i) * d.row_bytes, d.row_bytes, tags[i], s, l,
               first + static_cast<std::int64_t>(i));
  return buf;
}

class lockstep {
 public:
  explicit lockstep(std::uint64_t seed) : ded_(config()), sh_(config()), rng_(seed) {
    for (std::size_t r = 0; r < config().max_requests; ++r) admit();
  }

  void run(std::size_t rounds) {
    for (std::size_t i = 0; i < rounds; ++i) step();
    INFO("rounds " << rounds << ", staged entries " << staged_entries_ << ", in_use probes " << in_use_probes_);
    CHECK(staged_entries_ > rounds);  // the unions really overflow into the arenas
    CHECK(in_use_probes_ > rounds / 20);
  }

 private:
  struct request {
    request_id id = 0;
    std::array<std::vector<std::uint64_t>, S> tags;   // committed rows
    std::array<std::vector<std::uint64_t>, S> block;  // staged block rows
  };

  void admit() {
    request rq;
    rq.id = next_id_++;
    REQUIRE(ded_.admit(rq.id).admitted);
    REQUIRE(sh_.admit(rq.id).admitted);
    for (std::size_t s = 0; s < S; ++s) {
      const std::size_t n = 8 + rng_.below(40);
      std::vector<std::uint64_t> tags(n);
      for (auto& t : tags) t = rng_.next();
      const auto buf = rows_of(s, 0, tags);
      ded_.append(rq.id, s, buf, n);
      sh_.append(rq.id, s, buf, n);
      rq.tags[s] = tags;
    }
    reqs_.push_back(rq);
  }

  /// Misuse while `holder` holds the arenas: typed errors, nothing changes.
  void probe_misuse(std::size_t holder) {
    const std::size_t other = (holder + 1) % S;
    const auto hot_before = sh_.hot_rows_of(reqs_[0].id, other);
    const std::vector<row_index> hot_copy(hot_before.begin(), hot_before.end());
    REQUIRE_THROWS_AS(sh_.release_staging(other), staging_not_held);
    REQUIRE_THROWS_AS(sh_.payload(other, 0, sh_.space(other).staging(0, 0)), staging_not_held);
    // the gap between a source's pool and its staging rows holds no location of the source
    if (shared_staging_begin(ded_.space(), other) > ded_.space().pool_rows())
      REQUIRE_THROWS_AS(sh_.payload(other, 0, static_cast<location>(ded_.space().pool_rows())), position_out_of_range);
    // a verify of the other source (a staged block and a valid query) must wait for the release
    auto& rq = reqs_[0];
    stage(rq, other);
    std::vector<row_index> q{0};
    std::vector<location> out(1, -7);
    const std::array<std::span<const row_index>, 1> qs{q};
    const std::array<std::span<location>, 1> os{out};
    REQUIRE_THROWS_AS(sh_.verify(rq.id, other, qs, os), staging_in_use);
    CHECK(out[0] == -7);
    CHECK(sh_.staging_holder() == holder);
    CHECK(sh_.verified_queries(rq.id, other) == 0);
    const auto hot_after = sh_.hot_rows_of(rq.id, other);
    CHECK(std::equal(hot_after.begin(), hot_after.end(), hot_copy.begin(), hot_copy.end()));
    ++in_use_probes_;
  }

  void stage(request& rq, std::size_t s) {
    const std::size_t c = 1 + rng_.below(config().max_block);
    std::vector<std::uint64_t> tags(c);
    for (auto& t : tags) t = rng_.next();
    const auto f = static_cast<std::int64_t>(rq.tags[s].size());
    const auto buf = rows_of(s, f, tags);
    ded_.stage_block(rq.id, s, buf, c);
    sh_.stage_block(rq.id, s, buf, c);
    rq.block[s] = tags;
  }

  /// Content tag of row `e` as query-visible now (committed or staged block row).
  std::uint64_t tag_of(const request& rq, std::size_t s, row_index e) const {
    const auto f = static_cast<row_index>(rq.tags[s].size());
    return e < f ? rq.tags[s][static_cast<std::size_t>(e)] : rq.block[s][static_cast<std::size_t>(e - f)];
  }

  void step() {
    for (std::size_t i = 0; i < reqs_.size(); ++i)  // a long request leaves, a new one comes
      for (std::size_t s = 0; s < S; ++s)
        if (reqs_[i].tags[s].size() + config().max_block + 1 > config().max_rows) {
          if (const auto h = sh_.staging_holder()) release(*h);  // the layer group ends before the request leaves
          ded_.complete(reqs_[i].id);
          sh_.complete(reqs_[i].id);
          reqs_.erase(reqs_.begin() + static_cast<std::ptrdiff_t>(i));
          admit();
          return;
        }
    const std::size_t s = rng_.below(S);
    if (const auto h = sh_.staging_holder(); h && *h != s) {
      probe_misuse(*h);
      release(*h);
    }
    round(s);
    if (rng_.chance(3, 4)) release(s);  // sometimes the same source verifies again before releasing
    check_hot_rows_exact();
  }

  /// Follower layers replay a producer-only verify's plan (into the arenas for staged rows).
  void copy_followers(std::size_t s) {
    for (std::size_t l = 1; l < L::sources[s].payload_layers; ++l) {
      CHECK(ded_.copy_follower(s, l) == sh_.copy_follower(s, l));
      check_locations(s, l);
    }
    pending_followers_[s] = false;
  }

  void release(std::size_t s) {
    if (pending_followers_[s]) {
      REQUIRE_THROWS_AS(sh_.release_staging(s), pending_follower_copies);
      CHECK(sh_.staging_holder() == s);
      copy_followers(s);
    }
    ded_.release_staging(s);  // checks the source only
    sh_.release_staging(s);
    CHECK(!sh_.staging_holder());
    CHECK(!ded_.staging_holder());
  }

  void round(std::size_t s) {
    const auto& d = L::sources[s];
    if (pending_followers_[s]) copy_followers(s);  // the same source verifies again before releasing
    std::vector<std::vector<std::vector<row_index>>> queries(reqs_.size());
    std::vector<std::vector<std::vector<location>>> loc_d(reqs_.size()), loc_s(reqs_.size());
    std::vector<std::vector<std::span<const row_index>>> qs(reqs_.size());
    std::vector<std::vector<std::span<location>>> os_d(reqs_.size()), os_s(reqs_.size());
    std::vector<verify_item> batch_d, batch_s;
    for (std::size_t b = 0; b < reqs_.size(); ++b) {
      auto& rq = reqs_[b];
      stage(rq, s);
      const std::size_t kr = 1 + rng_.below(rq.block[s].size());
      const auto f = static_cast<row_index>(rq.tags[s].size());
      for (std::size_t j = 0; j < kr; ++j) {
        std::vector<row_index> q(rng_.below(L::top_k + 1));
        for (auto& e : q) {
          const std::size_t kind = rng_.below(10);
          if (kind == 0) e = no_row;
          else if (kind == 1) e = f + static_cast<row_index>(rng_.below(j + 1));  // block rows it sees
          else e = static_cast<row_index>(rng_.below(static_cast<std::size_t>(f)));
        }
        queries[b].push_back(std::move(q));
      }
      for (std::size_t j = 0; j < kr; ++j) {
        loc_d[b].emplace_back(queries[b][j].size());
        loc_s[b].emplace_back(queries[b][j].size());
      }
      for (std::size_t j = 0; j < kr; ++j) {
        qs[b].push_back(queries[b][j]);
        os_d[b].push_back(loc_d[b][j]);
        os_s[b].push_back(loc_s[b][j]);
      }
      batch_d.push_back({rq.id, qs[b], os_d[b]});
      batch_s.push_back({rq.id, qs[b], os_s[b]});
    }
    const bool producer_only = d.payload_layers > 1 && rng_.chance(1, 4);
    const auto mode = producer_only ? copy_layers::producer_only : copy_layers::all;
    const auto st_d = ded_.verify(s, batch_d, mode);
    const auto st_s = sh_.verify(s, batch_s, mode);
    CHECK(sh_.staging_holder() == s);
    CHECK(st_d.rows_copied == st_s.rows_copied);
    CHECK(st_d.staging_rows == st_s.staging_rows);
    staged_entries_ += st_s.staged;
    // the same locations, staged rows moved from dedicated staging to the shared layout's
    const auto& sp = ded_.space();
    const std::size_t shift = shared_staging_begin(sp, s) - sp.staging_begin();
    CHECK(sh_.space(s).staging_begin() == shared_staging_begin(sp, s));
    auto want_s = loc_d;
    for (auto& per_req : want_s)
      for (auto& q : per_req)
        for (auto& at : q)
          if (at != no_location && static_cast<std::size_t>(at) >= sp.staging_begin()) at += static_cast<location>(shift);
    REQUIRE(want_s == loc_s);
    last_.queries = queries;
    last_.locs = loc_s;
    last_.locs_d = loc_d;
    last_.tags.assign(reqs_.size(), {});
    for (std::size_t b = 0; b < reqs_.size(); ++b)
      for (const auto& q : queries[b]) {
        auto& t = last_.tags[b].emplace_back(q.size());
        for (std::size_t i = 0; i < q.size(); ++i)
          if (q[i] != no_row) t[i] = tag_of(reqs_[b], s, q[i]);
      }
    pending_followers_[s] = producer_only;
    for (std::size_t l = 0; l < (producer_only ? 1 : d.payload_layers); ++l) check_locations(s, l);

    for (std::size_t b = 0; b < reqs_.size(); ++b) {  // commit a random acceptance, or abandon
      auto& rq = reqs_[b];
      if (rng_.chance(1, 8)) continue;
      const std::size_t a = rng_.below(queries[b].size());
      ded_.commit(rq.id, s, a);
      sh_.commit(rq.id, s, a);
      for (std::size_t i = 0; i <= a; ++i) rq.tags[s].push_back(rq.block[s][i]);
    }
  }

  /// Every location of the last round, in payload layer `l` of source `s`: the same bytes in both
  /// hierarchies and the row's content.
  void check_locations(std::size_t s, std::size_t l) {
    const auto& queries = last_.queries;
    const auto& locs = last_.locs;
    const std::size_t rb = L::sources[s].row_bytes;
    for (std::size_t b = 0; b < reqs_.size(); ++b)
      for (std::size_t j = 0; j < queries[b].size(); ++j)
        for (std::size_t i = 0; i < queries[b][j].size(); ++i) {
          const row_index e = queries[b][j][i];
          const location at = locs[b][j][i];
          if (e == no_row) {
            REQUIRE(at == no_location);
            continue;
          }
          const auto got = sh_.payload(s, l, at);
          REQUIRE(std::equal(got.begin(), got.end(), ded_.payload(s, l, last_.locs_d[b][j][i]).begin()));
          REQUIRE(row_matches(got, last_.tags[b][j][i], s, l, e));
          // a stock kernel: one base per layer, no branch on the location
          const std::span<const std::byte> flat(sh_.pool(s, l) + static_cast<std::size_t>(at) * rb, rb);
          REQUIRE(row_matches(flat, last_.tags[b][j][i], s, l, e));
        }
  }

  /// Every hot-cache row of every request and source holds its exact bytes in every layer, and
  /// both hierarchies agree on hot rows and LRU order.
  void check_hot_rows_exact() {
    for (const auto& rq : reqs_)
      for (std::size_t s = 0; s < S; ++s) {
        const auto hot = sh_.hot_rows_of(rq.id, s);
        const auto hot_d = ded_.hot_rows_of(rq.id, s);
        REQUIRE(std::equal(hot.begin(), hot.end(), hot_d.begin(), hot_d.end()));
        const auto order = sh_.lru_order_of(rq.id, s);
        const auto order_d = ded_.lru_order_of(rq.id, s);
        REQUIRE(std::equal(order.begin(), order.end(), order_d.begin(), order_d.end()));
        const std::size_t layers = pending_followers_[s] ? 1 : L::sources[s].payload_layers;
        for (std::size_t w = 0; w < hot.size(); ++w) {
          if (hot[w] == no_row) continue;
          for (std::size_t l = 0; l < layers; ++l)
            REQUIRE(row_matches(sh_.payload(s, l, sh_.space().hot(sh_.slot_of(rq.id), w)),
                                rq.tags[s][static_cast<std::size_t>(hot[w])], s, l, hot[w]));
        }
      }
  }

  Dedicated ded_;
  Shared sh_;
  test_rng rng_;
  std::vector<request> reqs_;
  request_id next_id_ = 1;
  std::array<bool, S> pending_followers_{};
  struct {
    std::vector<std::vector<std::vector<row_index>>> queries;
    std::vector<std::vector<std::vector<location>>> locs;    // the shared hierarchy's
    std::vector<std::vector<std::vector<location>>> locs_d;  // the dedicated one's
    std::vector<std::vector<std::vector<std::uint64_t>>> tags;  // content of each entry's row at verify time
  } last_;
  std::size_t staged_entries_ = 0, in_use_probes_ = 0;
};

}  // namespace

TEST_CASE("shared staging arenas give the dedicated staging's locations and bytes, round after round") {
  lockstep(0x5A6E'A4E4ull).run(kRounds);
}

TEST_CASE("shared staging arenas: memory is chi arenas of the widest row instead of one region per layer") {
  const auto c = config();
  Dedicated ded(c);
  Shared sh(c);
  const std::size_t per_slot = c.max_block * L::top_k;
  std::size_t dedicated_staging_bytes = 0;
  for (const auto& d : L::sources) dedicated_staging_bytes += d.payload_layers * c.max_requests * per_slot * d.row_bytes;
  CHECK(ded.staging_arena_bytes() == 0);
  CHECK(sh.pool_bytes() == ded.pool_bytes() - dedicated_staging_bytes);
  CHECK(sh.staging_arena_bytes() == staging_arenas<2>::bytes(c.max_requests, c.max_block, L::top_k, widest_row_bytes<L>()));
  CHECK(sh.staging_arena_bytes() == 2 * c.max_requests * per_slot * 64);
  // two-phase sizing: what requirements() promises is what construction allocates
  CHECK(Shared::requirements(c).pool_bytes == sh.pool_bytes());
  CHECK(Shared::requirements(c).staging_arena_bytes == sh.staging_arena_bytes());
  CHECK(Dedicated::requirements(c).pool_bytes == ded.pool_bytes());
  CHECK(Dedicated::requirements(c).staging_arena_bytes == 0);
  CHECK(Shared::requirements(c).host_store_bytes == Dedicated::requirements(c).host_store_bytes);
  // the one-block-per-layer layout pads each pool to 256 bytes (block 0: both sources; block 1: source 0)
  const std::size_t rows = sh.space().pool_rows();
  const auto up256 = [](std::size_t x) { return (x + 255) / 256 * 256; };
  const std::size_t arena = up256(c.max_requests * per_slot * 64);
  const std::size_t block0 = up256(up256(rows * 64) + rows * 32) + arena, block1 = up256(rows * 64) + arena;
  CHECK(Shared::requirements(c).staging_padding_bytes == sh.staging_padding_bytes());
  CHECK(sh.staging_padding_bytes() == block0 + block1 - sh.pool_bytes() - sh.staging_arena_bytes());
  CHECK(Dedicated::requirements(c).staging_padding_bytes == 0);

  // M_stage as the planner counts it: chi * K_max * k * d_KV per session, N sessions.
  const auto shape = shape_of<layouts::glm53>();
  CHECK(shape.max_live_payload_layers == max_payload_layers_per_source<layouts::glm53>());
  const auto p = plan(shape, {.context_tokens = 100'000, .drafter = drafters::dflash2, .slots = 35});
  CHECK(p.staging_bytes_for_slots ==
        staging_arenas<max_payload_layers_per_source<layouts::glm53>()>::bytes(
            35, drafters::dflash2.max_block, layouts::glm53::top_k, widest_row_bytes<layouts::glm53>()));
}

TEST_CASE("shared staging arenas: nothing reserved without speculation; release checks its source") {
  auto c = config();
  c.max_block = 1;
  Shared sh(c);
  CHECK(sh.staging_arena_bytes() == 0);
  CHECK_THROWS_AS(sh.release_staging(S), invalid_source);
  CHECK_THROWS_AS(sh.release_staging(0), staging_not_held);
  Dedicated ded(config());
  ded.release_staging(0);  // dedicated staging: nothing held, nothing to release
  CHECK_THROWS_AS(ded.release_staging(S), invalid_source);
}
