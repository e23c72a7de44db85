// Device bytes of payload pools and staging under the three staging layouts, at the paper's 35
// slots and 100K tokens: dedicated staging (every payload layer's pool has its own staging rows),
// separate shared arenas (staging_arenas<chi> before the one-base-per-layer layout: each layer's
// pool carved alone, chi arenas apart) and the one-block-per-layer-index layout that the CUDA
// hierarchy now allocates (detail/staging_blocks.hpp). The first two are computed here from the
// carving rules (every range rounded to 256 bytes); the third comes from the planner, which mirrors
// cuda::hierarchy::requirements, and is checked against the rows it must hold plus a padding
// bound of lcm(row bytes, 256) per pool. Prints the table quoted in docs/speculative.md.
#include "../support/catch.hpp"

#include <dhisparse/layouts/deepseek_v41_flash.hpp>
#include <dhisparse/layouts/glm53.hpp>
#include <dhisparse/planner.hpp>

#include <cstdint>
#include <algorithm>
#include <cstdio>
#include <numeric>

namespace {

using namespace dhisparse;

constexpr std::uint64_t up256(std::uint64_t x) { return (x + 255) / 256 * 256; }

template <class L>
void report(const char* name, std::uint64_t max_block) {
  constexpr std::uint64_t chi = max_payload_layers_per_source<L>();
  config_inputs in{.slots = 35, .max_context_tokens = 100'000, .gpu_bytes = std::uint64_t{1} << 40,
                   .max_block = max_block, .residency = residency_kind::fixed_budget};
  const hierarchy_plan ded = plan_hierarchy<L>(in);
  in.staging_arenas = chi;
  const hierarchy_plan sh = plan_hierarchy<L>(in);
  const hierarchy_config& c = sh.config;
  REQUIRE(c.optional_pages == 0);  // fixed budget: pools are hot caches and tails

  const std::uint64_t n = c.max_requests, staged = c.max_block * L::top_k;
  const std::uint64_t pool_rows = n * (in.hot_rows + c.tail_rows + c.max_block);
  std::uint64_t dedicated = 0, separate = 0, rows_only = 0, pad_bound = 0, widest = 0;
  for (const auto& d : L::sources) {
    dedicated += d.payload_layers * up256((pool_rows + n * staged) * d.row_bytes);
    separate += d.payload_layers * up256(pool_rows * d.row_bytes);
    rows_only += d.payload_layers * pool_rows * d.row_bytes;
    pad_bound += d.payload_layers * std::lcm<std::uint64_t>(d.row_bytes, 256);
    widest = std::max<std::uint64_t>(widest, d.row_bytes);
  }
  const std::uint64_t arena = up256(n * staged * widest);
  separate += chi * arena;
  rows_only += chi * n * staged * widest;
  const std::uint64_t blocks = sh.bytes.cuda_pool_bytes + sh.bytes.cuda_staging_arena_bytes;

  CHECK(ded.bytes.cuda_pool_bytes == dedicated);  // the planner's dedicated pools, by the same rule
  CHECK(sh.bytes.cuda_staging_arena_bytes == chi * arena);
  CHECK(blocks >= rows_only);
  CHECK(blocks - rows_only < pad_bound + chi * 256);

  const double gib = 1024.0 * 1024 * 1024;
  std::printf("| %s | %llu | %llu | %llu | %.3f GiB | %.3f GiB | %.3f GiB | %llu B (bound %llu B) |\n", name,
              static_cast<unsigned long long>(n), static_cast<unsigned long long>(c.max_block),
              static_cast<unsigned long long>(chi), dedicated / gib, separate / gib, blocks / gib,
              static_cast<unsigned long long>(blocks - rows_only), static_cast<unsigned long long>(pad_bound + chi * 256));
  std::printf("|   bytes | | | | %llu | %llu | %llu | blocks - separate: %lld |\n", static_cast<unsigned long long>(dedicated),
              static_cast<unsigned long long>(separate), static_cast<unsigned long long>(blocks),
              static_cast<long long>(blocks) - static_cast<long long>(separate));
}

}  // namespace

TEST_CASE("staging layouts: device bytes of pools and staging at the paper's slot counts", "[staging][memory]") {
  std::printf("| layout | N | K_max | chi | dedicated | separate arenas | one block per layer | padding (share) |\n");
  report<layouts::glm53>("GLM-5.3, DFlash2", drafters::dflash2.max_block);
  report<layouts::deepseek_v41_flash>("DeepSeek-V4.1-Flash, DSpark", drafters::dspark.max_block);
  // a ring of T + 7 rows: pool rows no longer a multiple of 8, so the layout pads
  report<layouts::glm53>("GLM-5.3, K_max 7", 7);
  report<layouts::deepseek_v41_flash>("DeepSeek-V4.1-Flash, K_max 7", 7);
}
