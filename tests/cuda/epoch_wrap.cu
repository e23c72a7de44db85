// Launch epochs across the 32-bit wrap. Every resolver and verifier of this test starts counting
// at 2^32 - 1 (the DHISPARSE_TEST_FIRST_EPOCH hook of cuda/hierarchy.cuh), so the first launch is
// the one that wraps. Epochs wrap to 1, never to 0: the resolver's per-entry words (`ready`,
// `claim`) and the sticky error epoch start at 0 and mean "no launch yet", and a launch numbered
// 0 took every entry it had never used for one already published (its misses were not copied)
// and dropped its own errors. Here the wrap launch and the ones after it must resolve exactly as
// the host reference and report a bad entry.
#define DHISPARSE_TEST_FIRST_EPOCH 0xFFFFFFFFu
#include "differential_workload.cuh"

#include <dhisparse/cuda/verify_views.cuh>

namespace {

using namespace dhtest;

dh::hierarchy_config spec_config() {
  dh::hierarchy_config cfg;
  cfg.max_requests = 3;
  cfg.max_rows = 200;
  cfg.optional_pages = 4;
  cfg.max_block = 4;
  return cfg;
}

}  // namespace

TEST_CASE("resolves from the epoch wrap on match the host hierarchy", "[gpu][differential][epoch]") {
  run_differential<dh::layouts::tiny, dh::lru_hot_cache<16>>(
      tiny_b16_config, {.steps = 300, .max_batch = 4, .state_every = 5, .seed = 91}, "tiny/B16 from the wrap");
  run_differential<layout_576, dh::lru_hot_cache<512>>(
      rows_576_config, {.steps = 150, .max_batch = 6, .state_every = 10, .seed = 92}, "576/k256/B512 from the wrap");
}

TEST_CASE("a bad entry of the launch at the epoch wrap is reported by check_errors", "[gpu][errors][epoch]") {
  require_device();
  using L = dh::layouts::tiny;
  using T = twin<L, dh::lru_hot_cache<16>>;
  constexpr std::size_t K = L::top_k;
  T tw(tiny_b16_config, 5);
  for (request_id id : {7u, 8u}) {
    REQUIRE(tw.admit(id));
    for (std::size_t s = 0; s < T::sources; ++s) tw.append(id, s, 40);
  }
  dhc::device_batch batch(2, K);
  const auto slot7 = static_cast<std::int32_t>(tw.dev.slot_of(7)), slot8 = static_cast<std::int32_t>(tw.dev.slot_of(8));
  std::vector<row_index> sel(2 * K, dh::no_row);
  for (std::size_t i = 0; i < K; ++i) sel[i] = static_cast<row_index>(i);  // entry 0 (request 7): rows 0..K-1
  sel[K] = 100;                                                             // entry 1 (request 8): beyond its 40 rows
  batch.upload(std::vector<std::int32_t>{slot7, slot8}, sel,
               std::vector<std::int32_t>{static_cast<std::int32_t>(K), 1}, tw.dev.stream());
  tw.dev.resolve(0, batch.view(), tw.dev.stream());  // the first launch: the wrap
  wait_or_die(tw.dev.stream(), "resolve at the wrap");
  REQUIRE(tw.dev.last_errors(0).at(1).code == dhc::to_status(dh::errc::position_beyond_frontier));
  REQUIRE_THROWS_AS(tw.dev.check_errors(tw.dev.stream()), dh::position_beyond_frontier);
  REQUIRE_NOTHROW(tw.dev.check_errors(tw.dev.stream()));
}

TEST_CASE("a bad entry of the verify at the epoch wrap is reported by check_errors", "[gpu][verify][errors][epoch]") {
  require_device();
  using L = dh::layouts::tiny;
  using T = twin<L, dh::lru_hot_cache<16>>;
  constexpr std::size_t K = L::top_k;
  T tw(spec_config(), 5);
  REQUIRE(tw.admit(1));
  for (std::size_t s = 0; s < T::sources; ++s) tw.append(1, s, 60);
  const auto rows = make_rows<L>(1, 0, tw.host.frontier(1, 0), 3);
  tw.host.stage_block(1, 0, rows, 3);
  tw.dev.stage_block(1, 0, std::span<const std::byte>(rows), 3);
  const std::vector<row_index> bad{3, -5, 4};  // a negative row other than -1
  dhc::device_buffer<row_index> dsel(K);
  dhc::device_buffer<location> dloc(K);
  DHTEST_CUDA(cudaMemcpy(dsel.data(), bad.data(), bad.size() * sizeof(row_index), cudaMemcpyHostToDevice));
  const dhc::verify_query q{dsel.data(), static_cast<std::int32_t>(bad.size()), dloc.data()};
  const dhc::verify_batch_item item{1, std::span<const dhc::verify_query>(&q, 1)};
  tw.dev.verify(0, std::span<const dhc::verify_batch_item>(&item, 1), tw.dev.stream());  // the first verify: the wrap
  wait_or_die(tw.dev.stream(), "verify at the wrap");
  REQUIRE_THROWS_AS(tw.dev.check_errors(tw.dev.stream()), dh::position_out_of_range);
  REQUIRE(tw.dev.verified_queries(1, 0) == 0);
}
