// Programmatic dependent launch (`hierarchy::set_programmatic_launch`): a resolve launched this
// way may start while the kernel before it in the stream still runs. Here that kernel is a stand-in
// for an engine's indexer that lets its dependents launch at once, waits, and only then writes the
// step's selections over stale ones; a kernel after the resolve, launched the same way, stands in
// for the sparse attention and reads every selected row through the returned locations. The
// locations, stats, cache state and pool bytes must match the host reference, and every row the
// consumer read must be the selected row: a resolver that read the batch before the indexer
// finished would resolve the stale selections instead.
#include "cuda_test_support.cuh"

namespace {

using namespace dhtest;
using Layout = layout_576;
using Hot = dh::lru_hot_cache<512>;
using Twin = twin<Layout, Hot>;
constexpr std::size_t K = Layout::top_k;
constexpr std::size_t N = 6;

/// The indexer stand-in: lets dependent grids launch immediately, waits `delay_ns`, then copies
/// `n` selection entries from `staged` into the batch buffer.
__global__ void late_indexer(const row_index* staged, row_index* selections, std::size_t n, unsigned long long delay_ns) {
  NV_IF_TARGET(NV_PROVIDES_SM_90, (cudaTriggerProgrammaticLaunchCompletion();))
  if (threadIdx.x == 0) {
    unsigned long long start = 0, now = 0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
      __nanosleep(1000);
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < delay_ns);
  }
  __syncthreads();
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    selections[i] = staged[i];
}

/// The attention stand-in: after the resolve's completion (grid dependency), copies the row at
/// each of the `n` locations (16-byte vectors; no_location copies nothing) into `rows`.
__global__ void gather_selected_rows(const location* locations, std::size_t n, const std::byte* pool,
                                     std::size_t row_bytes, std::byte* rows) {
  NV_IF_TARGET(NV_PROVIDES_SM_90, (cudaGridDependencySynchronize();))
  const std::size_t vecs = row_bytes / 16;
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n * vecs; i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::size_t e = i / vecs, v = i % vecs;
    const location at = locations[e];
    if (at != dh::no_location)
      reinterpret_cast<int4*>(rows + e * row_bytes)[v] = reinterpret_cast<const int4*>(pool + static_cast<std::size_t>(at) * row_bytes)[v];
  }
}

}  // namespace

TEST_CASE("a programmatically launched resolve reads what the kernel before it wrote", "[gpu][programmatic]") {
  require_device();
  const dh::hierarchy_config cfg{.max_requests = N, .max_rows = 4096, .optional_pages = 16};
  Twin t(cfg, 0x9D1u);
  t.dev.set_programmatic_launch(true);
  REQUIRE(t.dev.programmatic_launch());
  for (std::size_t r = 0; r < N; ++r) {
    const request_id id = 70 + r;
    REQUIRE(t.admit(id));
    for (std::size_t s = 0; s < Twin::sources; ++s) t.append(id, s, 1500 + t.uniform(1500));
    REQUIRE(t.map_page(id, 1, r % 4));
  }

  const cudaStream_t s = t.dev.stream();
  dhc::device_batch batch(N, K);
  dhc::device_buffer<row_index> staged(N * K);
  dhc::device_buffer<std::byte> gathered(N * K * std::max(Layout::sources[0].row_bytes, Layout::sources[1].row_bytes));
  cudaLaunchAttribute programmatic{};
  programmatic.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  programmatic.val.programmaticStreamSerializationAllowed = 1;

  std::size_t rows_checked = 0;
  for (std::size_t step = 0; step < 40; ++step) {
    const std::string ctx = "step " + std::to_string(step);
    INFO(ctx);
    const std::size_t source = step % 2;
    const std::size_t row_bytes = Layout::sources[source].row_bytes;
    std::vector<request_id> pick = t.live;
    std::shuffle(pick.begin(), pick.end(), t.rng);
    pick.resize(1 + t.uniform(N));
    const std::size_t count = pick.size();

    // The host reference, and the step's batch: slots and lengths uploaded in stream order, the
    // selections staged elsewhere while the batch buffer holds row 0 everywhere (stale, valid).
    std::vector<std::int32_t> slots, lengths;
    std::vector<row_index> selections(N * K, dh::no_row), stale(count * K, 0);
    std::vector<std::vector<row_index>> sel(count);
    std::vector<std::vector<location>> expect(count);
    std::vector<dh::resolve_stats> expect_stats(count);
    for (std::size_t e = 0; e < count; ++e) {
      const std::size_t len = t.chance(0.25) ? t.uniform(K + 1) : K;
      sel[e] = t.make_selection(pick[e], source, len);
      std::copy(sel[e].begin(), sel[e].end(), selections.begin() + static_cast<long>(e * K));
      expect[e].assign(len, 0);
      expect_stats[e] = t.host.resolve(pick[e], source, sel[e], expect[e], dh::copy_layers::all);
      slots.push_back(static_cast<std::int32_t>(t.dev.slot_of(pick[e])));
      lengths.push_back(static_cast<std::int32_t>(len));
    }
    DHTEST_CUDA(cudaMemcpyAsync(staged.data(), selections.data(), count * K * sizeof(row_index), cudaMemcpyHostToDevice, s));
    batch.upload(slots, stale, lengths, s);
    DHTEST_CUDA(cudaMemsetAsync(gathered.data(), 0, gathered.bytes(), s));

    late_indexer<<<4, 256, 0, s>>>(staged.data(), batch.selections(), count * K, 30'000);
    DHTEST_CUDA(cudaGetLastError());
    t.dev.resolve(source, batch.view(), s);
    cudaLaunchConfig_t consumer{};
    consumer.gridDim = dim3(64);
    consumer.blockDim = dim3(256);
    consumer.stream = s;
    consumer.attrs = &programmatic;
    consumer.numAttrs = 1;
    DHTEST_CUDA(cudaLaunchKernelEx(&consumer, gather_selected_rows, static_cast<const location*>(batch.locations()),
                                   count * K, static_cast<const std::byte*>(t.dev.pool(source, 0)), row_bytes,
                                   gathered.data()));
    wait_or_die(s, ctx + ": indexer, resolve, consumer");
    t.dev.check_errors(s);

    const auto got = batch.download_locations(static_cast<std::uint32_t>(count), s);
    const auto stats = t.dev.last_stats(source);
    REQUIRE(stats.size() == count);
    std::vector<std::byte> rows(count * K * row_bytes), want(row_bytes);
    DHTEST_CUDA(cudaMemcpy(rows.data(), gathered.data(), rows.size(), cudaMemcpyDeviceToHost));
    for (std::size_t e = 0; e < count; ++e) {
      INFO("source " << source << " batch entry " << e << " request " << pick[e] << " length " << sel[e].size());
      DHTEST_REQUIRE_SAME(location, "locations (device vs host)", std::span<const location>(expect[e]),
                          std::span<const location>(got.data() + e * K, sel[e].size()));
      INFO("host stats " << stats_text(expect_stats[e]) << " device " << stats_text(stats[e]));
      REQUIRE(stats[e] == expect_stats[e]);
      for (std::size_t i = 0; i < sel[e].size(); ++i) {
        if (sel[e][i] == dh::no_row) continue;
        fill_row(want.data(), row_bytes, pick[e], source, 0, sel[e][i]);
        const std::byte* have = rows.data() + (e * K + i) * row_bytes;
        if (std::memcmp(have, want.data(), row_bytes) != 0)
          DHTEST_FAIL("the consumer read " << hex_prefix(have, row_bytes) << "... for selection entry " << i << " (row "
                                           << sel[e][i] << ", location " << got[e * K + i] << "), expected "
                                           << hex_prefix(want.data(), row_bytes) << "...");
        ++rows_checked;
      }
    }
  }
  INFO("rows read by the consumer and checked: " << rows_checked);
  REQUIRE(rows_checked > 10'000);
  t.compare_state("after the programmatic launches");
  t.compare_pools("after the programmatic launches");
}
