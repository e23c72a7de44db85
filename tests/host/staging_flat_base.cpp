// A stock attention kernel on shared staging arenas: given the base of payload layer l of a source
// and an int32 location, it reads `base + loc * row_bytes` with no branch. With staging_arenas<chi>
// every location the hierarchy returns (tail, hot, optional, staged) must satisfy that, in every
// payload layer, so this test reads every returned location that way and compares the bytes with
// the selected row's content, computed from the test's own tags (tests/support/row_content.hpp).
//
// The layout has three sources with different payload-layer counts and row sizes, the one with
// the most layers not first, so the blocks' packing order (most layers first, nearest the arena)
// differs from the source order. The staging locations are checked against the test's own model
// of that packing, and the arena a payload layer's rows are staged in is checked to be one buffer
// shared by every source with that layer.
#include "../support/catch.hpp"

#include <dhisparse/host/hierarchy.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <span>
#include <vector>

#include "../support/reference_model.hpp"
#include "../support/row_content.hpp"

namespace {

using namespace dhisparse;
using dhisparse_testing::fill_append_buffer;
using dhisparse_testing::request_tag;
using dhisparse_testing::row_matches;
using dhisparse_testing::test_rng;

struct three_sources {
  static constexpr std::size_t top_k = 8;
  static constexpr std::size_t page_rows = 8;
  // 48 B x 1 layer, 96 B x 3 layers, 32 B x 2 layers
  static constexpr std::array<source_desc, 3> sources{{{48, 1, 1, 16}, {96, 1, 3, 16}, {32, 1, 2, 16}}};
  static constexpr std::array<consumer_desc, 6> consumers{{{0, consumer_kind::reindex, 0},
                                                           {1, consumer_kind::reindex, 0},
                                                           {1, consumer_kind::follower, 1},
                                                           {1, consumer_kind::follower, 2},
                                                           {2, consumer_kind::reindex, 0},
                                                           {2, consumer_kind::follower, 1}}};
};
static_assert(valid_layout<three_sources>);

/// Rows of 1 MiB and of 32 B: the narrow source's arena lies far past its pool in its own rows.
struct wide {
  static constexpr std::size_t top_k = 8;
  static constexpr std::size_t page_rows = 8;
  static constexpr std::array<source_desc, 2> sources{{{1 << 20, 1, 2, 16}, {32, 1, 1, 16}}};
  static constexpr std::array<consumer_desc, 3> consumers{
      {{0, consumer_kind::reindex, 0}, {0, consumer_kind::follower, 1}, {1, consumer_kind::reindex, 0}}};
};

constexpr std::size_t kN = 3, kB = 8, kT = 4, kP = 4, kK = 4, kS = 3;
using H = host_hierarchy<three_sources, lru_hot_cache<kB>, fixed_budget_policy, staging_arenas<3>>;

hierarchy_config config() {
  return {.max_requests = kN, .max_rows = 120, .tail_rows = kT, .optional_pages = kP, .max_block = kK};
}

// The test's model of the location space: N x B hot rows, N rings of T + K_max rows, P pages, then
// (past a gap) the source's arena of N x K_max x k rows.
constexpr std::size_t kRing = kT + kK;
constexpr std::size_t kHotEnd = kN * kB, kTailEnd = kHotEnd + kN * kRing, kPoolRows = kTailEnd + kP * three_sources::page_rows;
constexpr std::size_t kStagingPerSlot = kK * three_sources::top_k;

/// First staging location of each source: sources packed backwards from the arena, most payload
/// layers nearest (1, then 2, then 0), each distance rounded up to 256 bytes and to its own row.
std::array<std::size_t, kS> model_staging_begin() {
  const auto up = [](std::size_t x, std::size_t m) { return (x + m - 1) / m * m; };
  std::array<std::size_t, kS> out{};
  std::size_t d = 0;
  for (std::size_t s : {1u, 2u, 0u}) {
    const std::size_t rb = three_sources::sources[s].row_bytes;
    d = up(d + kPoolRows * rb, std::lcm(rb, std::size_t{256}));
    out[s] = d / rb;
  }
  return out;
}

enum kind { hot, tail, optional, staged, kinds };

class flat_reader {
 public:
  explicit flat_reader(std::uint64_t seed) : h_(config()), rng_(seed) {
    for (std::size_t i = 0; i < kN; ++i) admit();
  }

  void run(std::size_t rounds) {
    const auto begin = model_staging_begin();
    for (std::size_t s = 0; s < kS; ++s) {
      REQUIRE(h_.space(s).staging_begin() == begin[s]);
      REQUIRE(h_.space(s).pool_rows() == kPoolRows);
    }
    // Arena l is one buffer: every source with a layer l stages into the same bytes.
    for (std::size_t l = 0; l < 3; ++l) {
      const std::byte* arena = nullptr;
      for (std::size_t s = 0; s < kS; ++s) {
        if (l >= three_sources::sources[s].payload_layers) continue;
        const std::byte* a = h_.pool(s, l) + begin[s] * three_sources::sources[s].row_bytes;
        if (arena == nullptr) arena = a;
        REQUIRE(a == arena);
      }
    }
    for (std::size_t i = 0; i < rounds; ++i) step();
    INFO("hot " << seen_[hot] << ", tail " << seen_[tail] << ", optional " << seen_[optional] << ", staged "
                << seen_[staged]);
    for (std::size_t k = 0; k < kinds; ++k) CHECK(seen_[k] > rounds);
  }

 private:
  struct request {
    request_id id = 0;
    std::array<std::int64_t, kS> rows{};  // committed rows per source
  };

  void admit() {
    request rq{next_id_++, {}};
    REQUIRE(h_.admit(rq.id).admitted);
    for (std::size_t s = 0; s < kS; ++s) append(rq, s, 10 + rng_.below(30));
    reqs_.push_back(rq);
  }
  void append(request& rq, std::size_t s, std::size_t n) {
    const auto& d = three_sources::sources[s];
    std::vector<std::byte> buf(d.payload_layers * n * d.row_bytes);
    fill_append_buffer(buf, request_tag(rq.id), s, d.payload_layers, d.row_bytes, rq.rows[s], n);
    h_.append(rq.id, s, buf, n);
    rq.rows[s] += static_cast<std::int64_t>(n);
  }

  /// Reads `at` as a stock kernel does and compares with row `row`'s content in every layer.
  void read_flat(const request& rq, std::size_t s, row_index row, location at) {
    const auto& d = three_sources::sources[s];
    REQUIRE(at >= 0);
    const auto u = static_cast<std::size_t>(at);
    const std::size_t slot = h_.slot_of(rq.id);
    const std::size_t first = model_staging_begin()[s] + slot * kStagingPerSlot;
    if (u < kHotEnd) {
      REQUIRE(u / kB == slot);
      ++seen_[hot];
    } else if (u < kTailEnd) {
      REQUIRE((u - kHotEnd) / kRing == slot);
      ++seen_[tail];
    } else if (u < kPoolRows) {
      ++seen_[optional];
    } else {
      REQUIRE(u >= first);  // the slot's own staging rows, past the gap
      REQUIRE(u < first + kStagingPerSlot);
      ++seen_[staged];
    }
    for (std::size_t l = 0; l < d.payload_layers; ++l) {
      const std::span<const std::byte> flat(h_.pool(s, l) + u * d.row_bytes, d.row_bytes);
      INFO("source " << s << " layer " << l << " row " << row << " location " << at);
      REQUIRE(row_matches(flat, request_tag(rq.id), s, l, row));
    }
  }

  void step() {
    for (std::size_t i = 0; i < reqs_.size(); ++i)  // a long request leaves, a new one comes
      for (std::size_t s = 0; s < kS; ++s)
        if (reqs_[i].rows[s] + static_cast<std::int64_t>(2 * kK) > static_cast<std::int64_t>(config().max_rows)) {
          h_.complete(reqs_[i].id);
          reqs_.erase(reqs_.begin() + static_cast<std::ptrdiff_t>(i));
          admit();
          return;
        }
    const std::size_t s = rng_.below(kS);
    for (auto& rq : reqs_) {
      if (rng_.chance(1, 3)) append(rq, s, 1 + rng_.below(3));
      const std::size_t complete_pages = static_cast<std::size_t>(rq.rows[s]) / three_sources::page_rows;
      if (complete_pages > 0 && rng_.chance(1, 2)) {
        const std::size_t page = rng_.below(complete_pages);
        if (rng_.chance(1, 3)) h_.unmap_optional_page(rq.id, s, page);
        else (void)h_.map_optional_page(rq.id, s, page);
      }
    }
    resolve(s);
    verify(s);
  }

  void resolve(std::size_t s) {
    for (const auto& rq : reqs_) {
      std::vector<row_index> sel(1 + rng_.below(three_sources::top_k));
      for (auto& e : sel) e = static_cast<row_index>(rng_.below(static_cast<std::size_t>(rq.rows[s])));
      std::vector<location> out(sel.size());
      h_.resolve(rq.id, s, sel, out);
      for (std::size_t i = 0; i < sel.size(); ++i) read_flat(rq, s, sel[i], out[i]);
    }
  }

  void verify(std::size_t s) {
    const auto& d = three_sources::sources[s];
    std::vector<std::vector<std::vector<row_index>>> queries(reqs_.size());
    std::vector<std::vector<std::vector<location>>> locs(reqs_.size());
    std::vector<std::vector<std::span<const row_index>>> qs(reqs_.size());
    std::vector<std::vector<std::span<location>>> os(reqs_.size());
    std::vector<verify_item> batch;
    for (std::size_t b = 0; b < reqs_.size(); ++b) {
      auto& rq = reqs_[b];
      const std::size_t c = 1 + rng_.below(kK);
      std::vector<std::byte> block(d.payload_layers * c * d.row_bytes);
      fill_append_buffer(block, request_tag(rq.id), s, d.payload_layers, d.row_bytes, rq.rows[s], c);
      h_.stage_block(rq.id, s, block, c);
      const auto f = static_cast<row_index>(rq.rows[s]);
      for (std::size_t j = 0; j < c; ++j) {
        std::vector<row_index> q(1 + rng_.below(three_sources::top_k));
        for (auto& e : q)
          e = rng_.chance(1, 5) ? f + static_cast<row_index>(rng_.below(j + 1))
                                : static_cast<row_index>(rng_.below(static_cast<std::size_t>(f)));
        queries[b].push_back(std::move(q));
        locs[b].emplace_back(queries[b].back().size(), no_location);
      }
      for (std::size_t j = 0; j < c; ++j) {
        qs[b].push_back(queries[b][j]);
        os[b].push_back(locs[b][j]);
      }
      batch.push_back({rq.id, qs[b], os[b]});
    }
    const bool producer_only = d.payload_layers > 1 && rng_.chance(1, 4);
    h_.verify(s, batch, producer_only ? copy_layers::producer_only : copy_layers::all);
    if (producer_only)
      for (std::size_t l = 1; l < d.payload_layers; ++l) (void)h_.copy_follower(s, l);
    for (std::size_t b = 0; b < reqs_.size(); ++b)
      for (std::size_t j = 0; j < queries[b].size(); ++j)
        for (std::size_t i = 0; i < queries[b][j].size(); ++i) read_flat(reqs_[b], s, queries[b][j][i], locs[b][j][i]);
    h_.release_staging(s);
    for (std::size_t b = 0; b < reqs_.size(); ++b) {  // the block rows carry their final content already
      const std::size_t a = rng_.below(queries[b].size());
      h_.commit(reqs_[b].id, s, a);
      reqs_[b].rows[s] += static_cast<std::int64_t>(a + 1);
    }
  }

  H h_;
  test_rng rng_;
  std::vector<request> reqs_;
  request_id next_id_ = 1;
  std::array<std::size_t, kinds> seen_{};
};

}  // namespace

TEST_CASE("staging_arenas: every returned location reads right through one flat base per payload layer",
          "[speculative][staging]") {
  flat_reader(0xF1A7'BA5Eull).run(3'000);
}

TEST_CASE("staging_arenas: locations of a layout past int32 are rejected before anything is allocated",
          "[speculative][staging]") {
  using W = host_hierarchy<wide, lru_hot_cache<8>, fixed_budget_policy, staging_arenas<2>>;
  // 8192 optional pages of 8 rows make each pool about 2^16 rows: source 0's pool is 2^36 bytes,
  // so source 1's arena lies about 2^36 / 32 = 2^31 of its rows past its pool start.
  const hierarchy_config c{.max_requests = 1, .max_rows = 64, .tail_rows = 8, .optional_pages = 1 << 13, .max_block = 2};
  CHECK_THROWS_AS((void)W(c), invalid_configuration);
  // without shared arenas the same pools are addressable
  CHECK_NOTHROW((void)host_hierarchy<wide, lru_hot_cache<8>>::requirements(c));
}
