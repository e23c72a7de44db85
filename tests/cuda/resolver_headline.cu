// The benchmarks' headline setup under test: k = 2048, B = 4096, one page (64 rows) of tail, and a
// batch of C = 128 or 256 requests whose selections carry at least 20 % fresh misses, for 50 decode
// steps. Every step:
//  * differential: the CUDA hierarchy returns the host backend's locations for every entry, the
//    same copy plan and stats; every 10 steps the same hot rows and LRU order for every request;
//  * rows_copied: device, host and the test's own count (distinct selected rows in neither the
//    tail nor the hot cache before the step) agree, and are at least 20 % of the selected entries;
//  * exactness: a device kernel regenerates the bytes of every selected row (tests/support/
//    row_content.hpp) and compares them with the row at its returned location, in every payload
//    layer the step materialised.
// C = 128 uses 576-byte rows with a follower layer (steps alternate `all` and producer_only +
// copy_follower); C = 256 uses the benchmark's single-layer 656-byte rows. Histories hold 8,192
// rows (the benchmarks use 100,000; fresh rows are drawn over the whole history either way).
// Run: ctest -L gpu -R test_cuda_resolver_headline
#include "cuda_test_support.cuh"
#include "fresh_rows.cuh"


#include <dhisparse/workload/selection_generator.hpp>

#include "../support/row_content.hpp"

namespace {

using namespace dhtest;
namespace rc = ::dhisparse_testing;

constexpr std::size_t kTopK = 2048, kHotRows = 4096, kPageRows = 64, kTail = 64;
constexpr std::size_t kHistory = 8192, kSteps = 50;
constexpr double kFreshShare = 0.25;  // asked of the generator; at least 20 % is required


template <std::size_t RowBytes, std::size_t Layers>
void run_headline(std::size_t C, std::uint64_t seed) {
  using L = headline_layout<RowBytes, Layers>;
  static_assert(L::top_k == kTopK && L::page_rows == kPageRows);
  using Hot = dh::lru_hot_cache<kHotRows>;
  using host_type = dh::host_hierarchy<L, Hot>;
  using device_type = dhc::hierarchy<L, Hot>;
  static_assert(dh::valid_layout<L>);
  INFO("C = " << C << ", " << RowBytes << "-byte rows, " << Layers << " payload layer(s)");

  dh::hierarchy_config cfg;
  cfg.max_requests = C;
  cfg.max_rows = kHistory + kSteps;
  cfg.tail_rows = kTail;
  cudaStream_t stream = nullptr;
  DHTEST_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    host_type host(cfg);
    device_type dev(cfg, stream);
    std::vector<request_id> ids(C);
    std::vector<std::uint64_t> tags(C);
    std::vector<std::int64_t> frontier(C, 0);  // the test's own count of stored rows
    for (std::size_t i = 0; i < C; ++i) {
      ids[i] = 9000 + 7 * i;
      tags[i] = rc::request_tag(ids[i]);
      REQUIRE(host.admit(ids[i]).admitted);
      REQUIRE(dev.admit(ids[i], stream).admitted);
      const auto rows = rc::make_append_buffer(tags[i], 0, Layers, RowBytes, 0, kHistory);
      host.append(ids[i], 0, rows, kHistory);
      dev.append(ids[i], 0, std::span<const std::byte>(rows), kHistory, stream);
      DHTEST_CUDA(cudaStreamSynchronize(stream));  // `rows` is reused: the pageable copy must finish
      frontier[i] = static_cast<std::int64_t>(kHistory);
    }

    dhc::device_buffer<row_index> dsel(C * kTopK);
    dhc::device_buffer<location> dloc(C * kTopK);
    dhc::device_buffer<std::uint64_t> dtags(C);
    DHTEST_CUDA(cudaMemcpy(dtags.data(), tags.data(), C * sizeof(std::uint64_t), cudaMemcpyHostToDevice));

    dh::workload::selection_params params;
    params.top_k = kTopK;
    dh::workload::selection_batch gens(params, seed, C);
    std::vector<row_index> sel(C * kTopK);
    std::vector<location> want(C * kTopK), got(C * kTopK);
    std::size_t rows_checked = 0, total_selected = 0, total_copied = 0;

    for (std::size_t step = 0; step < kSteps; ++step) {
      const bool producer_only = Layers > 1 && step % 2 == 1;
      const auto mode = producer_only ? dh::copy_layers::producer_only : dh::copy_layers::all;
      const std::string ctx = "step " + std::to_string(step) + (producer_only ? " (producer_only)" : " (all)");
      INFO(ctx);

      // Selections: fresh rows are rows in neither the tail nor the hot cache (the spec's state);
      // the test's own miss count: distinct selected rows that are not.
      const auto [own_copied, selected] =
          generate_fresh_step(host, std::span<const request_id>(ids), frontier, kTail, kTopK, {kFreshShare, 2}, gens, sel);

      // Host backend (the specification).
      std::vector<dh::resolve_item> hitems(C);
      for (std::size_t i = 0; i < C; ++i)
        hitems[i] = {ids[i], std::span<const row_index>(sel).subspan(i * kTopK, kTopK),
                     std::span<location>(want).subspan(i * kTopK, kTopK)};
      const dh::resolve_stats host_total = host.resolve(0, std::span<const dh::resolve_item>(hitems), mode);
      const auto host_plan = host.last_plan(0);
      if (producer_only)
        for (std::size_t l = 1; l < Layers; ++l) host.copy_follower(0, l);

      // CUDA backend.
      DHTEST_CUDA(cudaMemcpyAsync(dsel.data(), sel.data(), sel.size() * sizeof(row_index), cudaMemcpyHostToDevice, stream));
      DHTEST_CUDA(cudaMemsetAsync(dloc.data(), 0x7A, dloc.bytes(), stream));
      std::vector<dhc::batch_item> ditems(C);
      for (std::size_t i = 0; i < C; ++i)
        ditems[i] = {ids[i], dsel.data() + i * kTopK, static_cast<std::int32_t>(kTopK), dloc.data() + i * kTopK};
      dev.resolve(0, std::span<const dhc::batch_item>(ditems), stream, mode);
      if (producer_only)
        for (std::size_t l = 1; l < Layers; ++l) dev.copy_follower(0, l, stream);
      wait_or_die(stream, ctx + ": resolve");
      dev.check_errors(stream);
      DHTEST_CUDA(cudaMemcpy(got.data(), dloc.data(), got.size() * sizeof(location), cudaMemcpyDeviceToHost));

      // Differential: locations, plan, stats.
      for (std::size_t i = 0; i < C; ++i) {
        const std::string diff = diff_sequence<location, location>(
            "locations of request " + std::to_string(ids[i]), std::span<const location>(want).subspan(i * kTopK, kTopK),
            std::span<const location>(got).subspan(i * kTopK, kTopK));
        if (!diff.empty()) DHTEST_FAIL(ctx << ": " << diff);
      }
      const auto dev_plan = dev.last_plan(0);
      REQUIRE(dev_plan.size() == host_plan.size());
      for (std::size_t p = 0; p < dev_plan.size(); ++p)
        if (!(dev_plan[p].slot == host_plan[p].slot && dev_plan[p].row == host_plan[p].row &&
              dev_plan[p].dst == host_plan[p].dst))
          DHTEST_FAIL(ctx << ": plan entry " << p << " differs: host {slot " << host_plan[p].slot << ", row "
                          << host_plan[p].row << ", dst " << host_plan[p].dst << "} device {slot " << dev_plan[p].slot
                          << ", row " << dev_plan[p].row << ", dst " << dev_plan[p].dst << "}");
      dh::resolve_stats dev_total;
      for (const auto& s : dev.last_stats(0)) dev_total += s;
      INFO("host " << stats_text(host_total) << ", device " << stats_text(dev_total) << ", own rows copied "
                   << own_copied << " of " << selected << " selected");
      REQUIRE(dev_total == host_total);
      REQUIRE(host_total.selected == selected);
      REQUIRE(host_total.rows_copied == own_copied);
      REQUIRE(dev_total.rows_copied == own_copied);
      REQUIRE(static_cast<double>(own_copied) >= 0.20 * static_cast<double>(selected));
      total_selected += selected;
      total_copied += own_copied;

      // Exactness on the device, every materialised layer.
      for (std::size_t l = 0; l < Layers; ++l) {
        const auto entries = static_cast<std::uint32_t>(C * kTopK);
        const auto bad = count_wrong_rows(dev, stream, dsel, dloc, dtags, entries, static_cast<std::uint32_t>(kTopK),
                                          RowBytes, l, ctx);
        if (bad.count != 0)
          DHTEST_FAIL(ctx << ": layer " << l << ": " << bad.count << " entries do not hold their row's bytes; first: request "
                          << ids[bad.first / kTopK] << " entry " << bad.first % kTopK << " row " << sel[bad.first]
                          << " at location " << got[bad.first]);
        rows_checked += entries;
      }

      // Cache state, every 10 steps.
      if (step % 10 == 9)
        for (std::size_t i = 0; i < C; ++i) {
          INFO(ctx << ": request " << ids[i]);
          DHTEST_REQUIRE_SAME(row_index, "hot rows", host.hot_rows_of(ids[i], 0), dev.hot_rows_of(ids[i], 0));
          DHTEST_REQUIRE_SAME(typename Hot::order_index, "LRU order", host.lru_order_of(ids[i], 0),
                              dev.lru_order_of(ids[i], 0));
        }

      // Decode: one new row per request on both backends.
      for (std::size_t i = 0; i < C; ++i) {
        const auto row = rc::make_append_buffer(tags[i], 0, Layers, RowBytes, frontier[i], 1);
        host.append(ids[i], 0, row, 1);
        dev.append(ids[i], 0, std::span<const std::byte>(row), 1, stream);
        DHTEST_CUDA(cudaStreamSynchronize(stream));
        ++frontier[i];
        REQUIRE(dev.frontier(ids[i], 0) == frontier[i]);
      }
    }
    std::printf("[headline] C = %zu, %zu-byte rows, %zu layer(s): %zu steps, %zu rows copied of %zu selected (%.1f %%), "
                "%zu rows byte-checked\n",
                C, RowBytes, Layers, kSteps, total_copied, total_selected,
                100.0 * static_cast<double>(total_copied) / static_cast<double>(total_selected), rows_checked);
    CHECK(rows_checked == kSteps * Layers * C * kTopK);
  }
  DHTEST_CUDA(cudaStreamDestroy(stream));
}

}  // namespace

TEST_CASE("headline setup, C = 128: differential and exact every step", "[gpu][headline]") {
  require_device();
  run_headline<576, 2>(128, 0x4EAD'0128);
}

TEST_CASE("headline setup, C = 256: differential and exact every step", "[gpu][headline]") {
  require_device();
  run_headline<656, 1>(256, 0x4EAD'0256);
}
