// Early copies read their sources before `placed` without a fence, so a copy CTA may start from
// an earlier launch's source and must fetch the row again once `placed` shows the current one.
// This program compiles the resolver with its test hooks: every entry publishes its early-copy
// count, then holds its sources back until some copy warp has loaded sources (at most 2 ms, so
// the test cannot hang), and each re-fetch is counted. Waiting for a read rather than for a fixed
// time keeps stale reads happening under compute-sanitizer's memcheck, whose instrumentation slows
// the copy CTAs far more than the entry's wait. The shared differential workload must still match
// the host reference bit for bit, and the re-fetch path must have run.
#include <cuda_runtime.h>

namespace stale_sources {
__device__ unsigned long long refetches = 0;
__device__ unsigned long long early_reads = 0;
}  // namespace stale_sources
#define DHISPARSE_RESOLVE_TEST_LATE_EARLY_SOURCES_NS 2000000ull
#define DHISPARSE_RESOLVE_TEST_EARLY_READS() \
  ::cuda::atomic_ref<unsigned long long, ::cuda::thread_scope_device>(::stale_sources::early_reads) \
      .load(::cuda::memory_order_relaxed)
#define DHISPARSE_RESOLVE_TEST_EARLY_READ() atomicAdd(&::stale_sources::early_reads, 1ull)
#define DHISPARSE_RESOLVE_TEST_REFETCH() atomicAdd(&::stale_sources::refetches, 1ull)

#include "differential_workload.cuh"

namespace {

unsigned long long refetch_count() {
  unsigned long long n = 0;
  REQUIRE(cudaMemcpyFromSymbol(&n, stale_sources::refetches, sizeof n) == cudaSuccess);
  return n;
}

}  // namespace

TEST_CASE("early copies that read stale sources fetch them again and match the host hierarchy",
          "[gpu][differential]") {
  const unsigned long long before = refetch_count();
  // Every entry with a miss copies early (no self copies): tiny rows and 576/656-byte rows.
  run_differential<dh::layouts::tiny, dh::lru_hot_cache<16>>(
      tiny_b16_config, {.steps = 600, .max_batch = 4, .state_every = 5, .seed = 51, .self_copy_units = 0},
      "tiny/B16/stale early sources");
  run_differential<layout_576, dh::lru_hot_cache<512>>(
      rows_576_config, {.steps = 300, .max_batch = 6, .state_every = 10, .seed = 52, .self_copy_units = 0},
      "576/k256/B512/stale early sources");
  const unsigned long long refetched = refetch_count() - before;
  INFO("rows fetched again: " << refetched);
  CHECK(refetched > 0);
}
