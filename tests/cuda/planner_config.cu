// Configurations from the planner on the CUDA backend: cuda::hierarchy built from plan_hierarchy()'s
// config allocates what the planner announced.
//
// Tolerances, and why:
//  - requirements().device_bytes lies in [cuda_device_bytes - cuda_device_allowance, cuda_device_bytes]:
//    the planner itemises pools, arenas, metadata and workspace exactly and bounds the rest (alignment
//    padding, control blocks, per-slot records, descriptors) by the allowance it reports;
//  - requirements().pinned_bytes lies in [cuda_pinned_bytes, cuda_pinned_bytes + cuda_pinned_allowance]:
//    the host stores exactly, plus the launch-descriptor rings the allowance bounds;
//  - cudaMemGetInfo's drop while the hierarchy is alive is requirements().device_bytes to within
//    2 MiB per device allocation, plus 2 MiB: the driver hands out device memory in 2 MiB pages, and the
//    hierarchy makes one allocation per source, one for the live flags and one for shared arenas. A
//    hierarchy of the same type is built and destroyed first, so loading its kernels is not counted.
#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <cstdint>

#include "../support/catch.hpp"
#include "dhisparse/cuda/hierarchy.cuh"
#include "dhisparse/layouts/deepseek_v41_flash.hpp"
#include "dhisparse/layouts/glm53.hpp"
#include "dhisparse/layouts/tiny.hpp"
#include "dhisparse/planner.hpp"

namespace {

using namespace dhisparse;
namespace dhc = ::dhisparse::cuda;  // `cuda` alone is ambiguous with CUDA's own ::cuda

constexpr std::uint64_t mib = std::uint64_t{1} << 20;
constexpr std::uint64_t gib = std::uint64_t{1} << 30;
constexpr std::uint64_t device_page = 2 * mib;

std::uint64_t free_device_bytes() {
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  std::size_t free = 0, total = 0;
  REQUIRE(cudaMemGetInfo(&free, &total) == cudaSuccess);
  return free;
}

template <class H>
void require_planned_allocation(const hierarchy_plan& p) {
  const dhc::memory_requirements req = H::requirements(p.config);
  INFO("planned device " << p.bytes.cuda_device_bytes << " (allowance " << p.bytes.cuda_device_allowance
                         << "), requirements " << req.device_bytes << "; planned pinned " << p.bytes.cuda_pinned_bytes
                         << " (allowance " << p.bytes.cuda_pinned_allowance << "), requirements " << req.pinned_bytes);
  CHECK(req.device_bytes <= p.bytes.cuda_device_bytes);
  CHECK(req.device_bytes >= p.bytes.cuda_device_bytes - p.bytes.cuda_device_allowance);
  CHECK(req.pinned_bytes >= p.bytes.cuda_pinned_bytes);
  CHECK(req.pinned_bytes <= p.bytes.cuda_pinned_bytes + p.bytes.cuda_pinned_allowance);

  {  // load the type's kernels before measuring
    hierarchy_config warm = p.config;
    warm.max_requests = 1;
    warm.max_rows = 64;
    warm.host_pages = 1;
    warm.optional_pages = 0;
    H h(warm);
  }
  const std::uint64_t before = free_device_bytes();
  {
    H h(p.config);
    const std::uint64_t after = free_device_bytes();
    const std::uint64_t drop = before - after;
    const std::uint64_t allocations = H::sources + 1 + (p.bytes.cuda_staging_arena_bytes > 0 ? 1 : 0);
    INFO("cudaMemGetInfo drop " << drop << " for " << allocations << " allocations");
    CHECK(drop + device_page >= req.device_bytes);
    CHECK(drop <= req.device_bytes + (allocations + 1) * device_page);
    CHECK(drop <= p.bytes.cuda_device_bytes + (allocations + 1) * device_page);
    CHECK(h.config().max_requests == p.config.max_requests);
    CHECK(h.config().max_rows == p.config.max_rows);
    CHECK(h.config().host_pages == p.config.host_pages);
    CHECK(h.config().optional_pages == p.config.optional_pages);
    CHECK(h.config().tail_rows == p.config.tail_rows);
    for (std::size_t s = 0; s < H::sources; ++s) CHECK(h.free_host_pages(s) == p.config.host_pages);
  }
}

/// The issue's DeepSeek-V3.2-like model: 61 reindex sources of 656-byte rows, k = 2048, p = 64.
struct v32_like {
  static constexpr std::size_t top_k = 2048;
  static constexpr std::size_t page_rows = 64;
  static constexpr std::array<source_desc, 61> sources = [] {
    std::array<source_desc, 61> s{};
    for (auto& x : s) x = source_desc{656, 1, 1, 132};
    return s;
  }();
  static constexpr std::array<consumer_desc, 61> consumers = [] {
    std::array<consumer_desc, 61> c{};
    for (std::size_t i = 0; i < c.size(); ++i) c[i] = consumer_desc{i, consumer_kind::reindex, 0};
    return c;
  }();
};

}  // namespace

TEST_CASE("cuda planned config: tiny, adaptive, dedicated staging", "[planner][config][cuda]") {
  const auto p = plan_hierarchy<layouts::tiny>({.slots = 3, .max_context_tokens = 100, .live_context_tokens = 150,
                                                .gpu_bytes = 64 * mib, .hot_rows = 16, .max_block = 4,
                                                .required_pages = 1, .reserve_pages = 2});
  require_planned_allocation<dhc::hierarchy<layouts::tiny, lru_hot_cache<16>, adaptive_policy<>>>(p);
}

TEST_CASE("cuda planned config: GLM-5.3, shared staging arenas, the budget binds", "[planner][config][cuda]") {
  const auto p = plan_hierarchy<layouts::glm53>({.slots = 4, .max_context_tokens = 32'000,
                                                 .live_context_tokens = 64'000, .gpu_bytes = 2 * gib,
                                                 .max_block = 8, .staging_arenas = 4});
  REQUIRE(p.config.optional_pages < p.optional_pages_needed);
  require_planned_allocation<
      dhc::hierarchy<layouts::glm53, lru_hot_cache<4096>, adaptive_policy<>, staging_arenas<4>>>(p);
}

TEST_CASE("cuda planned config: DeepSeek-V4.1-Flash, resident", "[planner][config][cuda]") {
  const auto p = plan_hierarchy<layouts::deepseek_v41_flash>({.slots = 8, .max_context_tokens = 100'000,
                                                              .gpu_bytes = 4 * gib, .hot_rows = 512,
                                                              .residency = residency_kind::resident});
  REQUIRE(p.config.optional_pages == 8 * (25'000 / 64));
  require_planned_allocation<dhc::hierarchy<layouts::deepseek_v41_flash, lru_hot_cache<512>, resident_policy>>(p);
}

TEST_CASE("cuda planned config: the 61-layer model pins 3.66 GB, not 6.7 GB", "[planner][config][cuda]") {
  const auto p = plan_hierarchy<v32_like>({.slots = 4, .max_context_tokens = 41'800, .live_context_tokens = 91'200,
                                           .gpu_bytes = 8 * gib, .hot_rows = 2048});
  REQUIRE(p.config.host_pages == 1428);
  REQUIRE(p.bytes.cuda_pinned_bytes == 1428ull * 61 * 64 * 656);  // 3,657,142,272 bytes
  require_planned_allocation<dhc::hierarchy<v32_like, lru_hot_cache<2048>, adaptive_policy<>>>(p);
}
