// Lifecycle cases found in review: two hierarchies of one type with different workspaces, and a
// request completed while its follower copies are pending (its planned copies are forgotten, as
// on the host).
#include "cuda_test_support.cuh"

namespace {
using namespace dhtest;
using Layout = dh::layouts::tiny;
using Hot = dh::lru_hot_cache<32>;
using Device = dhc::hierarchy<Layout, Hot>;
using Host = dh::host_hierarchy<Layout, Hot>;

// The resolver's shared memory for large shapes stays within the H200's 227 KiB opt-in limit, so
// construction accepts them: checked wherever this file compiles (CI included), not only on a GPU.
// The paper's GLM shape (top_k 2048, B 4096, 576-byte rows) and a 2x/4x larger one with 656-byte
// rows, each for 256 requests.
constexpr std::size_t h200_shared_limit = 227 * 1024;
template <std::size_t TopK, std::size_t HotRows>
constexpr std::size_t resolver_shared_bytes(std::size_t row_bytes) {
  return dhc::detail::resolve_shared_bytes<dhc::detail::resolve_traits<DHISPARSE_CUDA_RESOLVE_BLOCK, TopK, HotRows>>(
      256, row_bytes);
}
static_assert(resolver_shared_bytes<2048, 4096>(576) <= h200_shared_limit);
static_assert(resolver_shared_bytes<4096, 16384>(656) <= h200_shared_limit);

std::vector<row_index> every_row(std::int64_t n) {
  std::vector<row_index> sel(Layout::top_k, dh::no_row);
  for (std::int64_t i = 0; i < n && i < static_cast<std::int64_t>(sel.size()); ++i) sel[static_cast<std::size_t>(i)] = static_cast<row_index>(i);
  return sel;
}
}  // namespace

TEST_CASE("a second hierarchy of the same type does not break the first one's launches", "[gpu][lifecycle]") {
  require_device();
  dh::hierarchy_config big, small;
  big.max_requests = 4096;  // a large shared-memory prefix of copy units
  big.max_rows = 256;
  small.max_requests = 1;
  small.max_rows = 256;
  Device a(big);
  Device b(small);  // sets the kernel's shared-memory attribute again
  REQUIRE(a.admit(1).admitted);
  const auto rows = make_rows<Layout>(1, 0, 0, 200);
  a.append(1, 0, std::span<const std::byte>(rows), 200, a.stream());
  const auto sel = every_row(100);  // rows 0..15: all misses (the tail holds the newest 8)
  dhc::device_buffer<row_index> dsel(sel.size());
  dhc::device_buffer<location> dloc(sel.size());
  DHTEST_CUDA(cudaMemcpy(dsel.data(), sel.data(), sel.size() * sizeof(row_index), cudaMemcpyHostToDevice));
  const typename Device::batch_item item{1, dsel.data(), static_cast<std::int32_t>(sel.size()), dloc.data()};
  REQUIRE_NOTHROW(a.resolve_sync(0, std::span<const typename Device::batch_item>(&item, 1), a.stream()));
}

TEST_CASE("completing a request drops its pending follower copies, as on the host", "[gpu][lifecycle]") {
  require_device();
  dh::hierarchy_config cfg;
  cfg.max_requests = 2;
  cfg.max_rows = 256;
  Device dev(cfg);
  Host host(cfg);
  for (request_id id : {request_id{1}, request_id{2}}) {
    REQUIRE(dev.admit(id).admitted);
    REQUIRE(host.admit(id).admitted);
    const auto rows = make_rows<Layout>(id, 0, 0, 100);
    dev.append(id, 0, std::span<const std::byte>(rows), 100, dev.stream());
    host.append(id, 0, std::span<const std::byte>(rows), 100);
  }
  const auto sel = every_row(16);
  dhc::device_buffer<row_index> dsel(2 * sel.size());
  dhc::device_buffer<location> dloc(2 * sel.size());
  for (int r = 0; r < 2; ++r)
    DHTEST_CUDA(cudaMemcpy(dsel.data() + r * sel.size(), sel.data(), sel.size() * sizeof(row_index), cudaMemcpyHostToDevice));
  const std::array<typename Device::batch_item, 2> items{{{1, dsel.data(), 16, dloc.data()},
                                                          {2, dsel.data() + sel.size(), 16, dloc.data() + sel.size()}}};
  dev.resolve(0, std::span<const typename Device::batch_item>(items), dev.stream(), dh::copy_layers::producer_only);
  dev.check_errors(dev.stream());
  std::vector<location> l1(16), l2(16);
  const std::array<dh::resolve_item, 2> hitems{{{1, std::span<const row_index>(sel.data(), 16), l1},
                                                {2, std::span<const row_index>(sel.data(), 16), l2}}};
  host.resolve(0, std::span<const dh::resolve_item>(hitems), dh::copy_layers::producer_only);
  dev.complete(1, dev.stream());
  host.complete(1);
  const auto dp = dev.last_plan(0);
  const auto hp = host.last_plan(0);
  REQUIRE(dp.size() == hp.size());
  for (std::size_t i = 0; i < dp.size(); ++i) {
    CHECK(dp[i].slot == hp[i].slot);
    CHECK(dp[i].row == hp[i].row);
    CHECK(dp[i].dst == hp[i].dst);
  }
  REQUIRE_NOTHROW(dev.copy_follower(0, 1, dev.stream()));
  REQUIRE(host.copy_follower(0, 1) == hp.size() * Layout::sources[0].row_bytes);
  DHTEST_CUDA(cudaStreamSynchronize(dev.stream()));
}
