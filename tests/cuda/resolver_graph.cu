// CUDA graph capture: one decode step's resolves (source 0 producer-only + follower copy,
// source 1 all layers) over device batch descriptors are captured once and replayed for many
// steps with new selections, batch members and counts written into the same buffers between
// replays. A twin hierarchy runs the same steps through the eager path; both must agree on every
// location, per-entry stats, cache state and pool byte, and the graph must report bad entries.
// Every step, every location the graph returned is also checked against the bytes the test
// generated for the selected row (the eager twin is under test too, so agreement alone is not enough).
// The captured hierarchy launches with and without programmatic dependent launch.
#include "cuda_test_support.cuh"

namespace {

using namespace dhtest;
using Layout = layout_576;
using Hot = dh::lru_hot_cache<512>;
using H = dhc::hierarchy<Layout, Hot>;
constexpr std::size_t K = Layout::top_k;
constexpr std::size_t N = 6;

struct step_batch {
  std::vector<std::int32_t> slots;
  std::vector<std::int32_t> lengths;
  std::vector<row_index> selections;  // entry e at e * K
};

void compare_hierarchies(H& a, H& b, const std::vector<request_id>& ids, const std::string& ctx) {
  for (request_id id : ids)
    for (std::size_t s = 0; s < H::sources; ++s) {
      INFO(ctx << ": request " << id << " source " << s);
      DHTEST_REQUIRE_SAME(row_index, "hot rows (graph vs eager)", a.hot_rows_of(id, s), b.hot_rows_of(id, s));
      DHTEST_REQUIRE_SAME(Hot::order_index, "LRU order (graph vs eager)", a.lru_order_of(id, s), b.lru_order_of(id, s));
      DHTEST_REQUIRE_SAME(std::int32_t, "optional map (graph vs eager)", a.optional_map_of(id, s),
                          b.optional_map_of(id, s));
    }
  for (std::size_t s = 0; s < H::sources; ++s)
    for (std::size_t l = 0; l < Layout::sources[s].payload_layers; ++l) {
      const std::size_t bytes = a.space().rows() * Layout::sources[s].row_bytes;
      std::vector<std::byte> pa(bytes), pb(bytes);
      a.copy_pool(s, l, pa);
      b.copy_pool(s, l, pb);
      const long m = first_mismatch(pa, pb);
      INFO(ctx << ": pool of source " << s << " layer " << l << " first differs at byte " << m << " (location "
               << (m < 0 ? -1 : m / static_cast<long>(Layout::sources[s].row_bytes)) << ")");
      REQUIRE(m < 0);
    }
}

/// Every location the replayed graph returned holds, in every payload layer, the bytes the test
/// generated for the selected row (make_rows): a check that does not lean on the eager twin, which
/// is under test too.
std::size_t check_generated_rows(H& a, std::size_t s, const step_batch& x, const std::vector<location>& got,
                                 const std::vector<request_id>& ids, long skip_entry, const std::string& ctx) {
  const auto& d = Layout::sources[s];
  std::vector<std::byte> want(d.row_bytes), pool(a.space().rows() * d.row_bytes);
  std::size_t checked = 0;
  for (std::size_t l = 0; l < d.payload_layers; ++l) {
    a.copy_pool(s, l, pool);
    for (std::size_t e = 0; e < x.slots.size(); ++e) {
      if (static_cast<long>(e) == skip_entry) continue;
      request_id id = 0;
      for (request_id r : ids)
        if (static_cast<std::int32_t>(a.slot_of(r)) == x.slots[e]) id = r;
      for (std::size_t i = 0; i < static_cast<std::size_t>(x.lengths[e]); ++i) {
        const row_index row = x.selections[e * K + i];
        const location loc = got[e * K + i];
        if (row == dh::no_row) {
          if (loc != dh::no_location) DHTEST_FAIL(ctx << ": padding entry " << i << " resolved to " << loc);
          continue;
        }
        if (loc < 0 || static_cast<std::size_t>(loc) >= a.space().rows())
          DHTEST_FAIL(ctx << ": source " << s << " entry " << e << " row " << row << " resolved outside the pool: " << loc);
        fill_row(want.data(), d.row_bytes, id, s, l, row);
        const std::byte* have = pool.data() + static_cast<std::size_t>(loc) * d.row_bytes;
        if (std::memcmp(have, want.data(), d.row_bytes) != 0)
          DHTEST_FAIL(ctx << ": source " << s << " layer " << l << " request " << id << " entry " << i << " row " << row
                          << " at location " << loc << " holds " << hex_prefix(have, d.row_bytes) << "..., generated "
                          << hex_prefix(want.data(), d.row_bytes) << "...");
        ++checked;
      }
    }
  }
  return checked;
}

}  // namespace

TEST_CASE("a captured resolve replays like eager resolves", "[gpu][graph]") {
  require_device();
  dh::hierarchy_config cfg;
  cfg.max_requests = N;
  cfg.max_rows = 4096;
  cfg.optional_pages = 16;
  cudaStream_t sa = nullptr, sb = nullptr;
  DHTEST_CUDA(cudaStreamCreateWithFlags(&sa, cudaStreamNonBlocking));
  DHTEST_CUDA(cudaStreamCreateWithFlags(&sb, cudaStreamNonBlocking));
  // The captured twin also runs on a grid of 5 CTAs: replays whose batch count crosses 2C <= grid
  // (uncounted entry CTAs) and C = grid, against the eager twin on the whole grid.
  const unsigned ctas = GENERATE(0u, 5u);
  INFO("captured resolver CTAs: " << (ctas == 0 ? std::string("whole grid") : std::to_string(ctas)));
  // Captured with programmatic dependent launch too: the resolves become programmatic edges (after
  // the follower copy's kernel, for source 1).
  const bool programmatic = GENERATE(false, true);
  INFO("captured with programmatic launch: " << programmatic);
  {
    H a(cfg, sa), b(cfg, sb);
    a.set_resolver_ctas(ctas);
    a.set_programmatic_launch(programmatic);
    std::mt19937_64 rng(2024);
    std::vector<request_id> ids;
    for (std::size_t r = 0; r < N; ++r) {
      const request_id id = 40 + r;
      REQUIRE(a.admit(id).admitted);
      REQUIRE(b.admit(id).admitted);
      ids.push_back(id);
      for (std::size_t s = 0; s < H::sources; ++s) {
        const std::size_t n = 1500 + rng() % 1500;
        const auto rows = make_rows<Layout>(id, s, 0, n);
        a.append(id, s, std::span<const std::byte>(rows), n, sa);
        b.append(id, s, std::span<const std::byte>(rows), n, sb);
      }
      REQUIRE(a.map_optional_page(id, 1, r, sa));
      REQUIRE(b.map_optional_page(id, 1, r, sb));
    }

    // Capture one decode step on `sa`: source 0 producer-only + follower copy, source 1 all layers.
    dhc::device_batch batch0(N, K), batch1(N, K);
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    DHTEST_CUDA(cudaStreamSynchronize(sa));
    DHTEST_CUDA(cudaStreamBeginCapture(sa, cudaStreamCaptureModeThreadLocal));
    a.resolve(0, batch0.view(), sa, dh::copy_layers::producer_only);
    a.copy_follower(0, 1, sa);
    a.resolve(1, batch1.view(), sa);
    DHTEST_CUDA(cudaStreamEndCapture(sa, &graph));
    DHTEST_CUDA(cudaGraphInstantiate(&exec, graph, 0));

    // The eager twin's buffers.
    dhc::device_buffer<row_index> bsel(N * K);
    dhc::device_buffer<location> bloc(N * K);

    auto make_batch = [&](std::size_t s, std::size_t count, bool corrupt) {
      step_batch sb_;
      std::vector<request_id> pick = ids;
      std::shuffle(pick.begin(), pick.end(), rng);
      pick.resize(count);
      sb_.selections.assign(N * K, dh::no_row);
      for (std::size_t e = 0; e < count; ++e) {
        const request_id id = pick[e];
        sb_.slots.push_back(static_cast<std::int32_t>(a.slot_of(id)));
        const std::size_t len = rng() % 4 == 0 ? rng() % (K + 1) : K;
        sb_.lengths.push_back(static_cast<std::int32_t>(len));
        const std::int64_t f = a.frontier(id, s);
        const auto hot = a.hot_rows_of(id, s);
        for (std::size_t i = 0; i < len; ++i) {
          const auto u = rng() % 100;
          row_index v = static_cast<row_index>(rng() % static_cast<std::uint64_t>(f));
          if (u < 5) v = dh::no_row;
          else if (u < 15) v = static_cast<row_index>(f - 1 - static_cast<std::int64_t>(rng() % 64));
          else if (u < 50 && hot[rng() % hot.size()] >= 0) v = hot[rng() % hot.size()];
          else if (u < 60 && i > 0) v = sb_.selections[e * K + rng() % i];
          sb_.selections[e * K + i] = v;
        }
      }
      if (corrupt && count > 1) sb_.selections[1 * K + 0] = static_cast<row_index>(a.frontier(pick[1], s) + 2);
      return sb_;
    };

    std::size_t recovered = 0, rows_checked = 0;
    for (std::size_t step = 0; step < 60; ++step) {
      const std::string ctx = "step " + std::to_string(step);
      INFO(ctx);
      const bool corrupt = step == 17;
      const std::size_t count0 = corrupt ? N : step % 10 == 3 ? 0 : 1 + rng() % N;
      const std::size_t count1 = 1 + rng() % N;
      const step_batch s0 = make_batch(0, count0, corrupt), s1 = make_batch(1, count1, false);

      // graph: write the new step into the captured buffers, then replay
      batch0.upload(s0.slots, std::span<const row_index>(s0.selections.data(), count0 * K), s0.lengths, sa);
      batch1.upload(s1.slots, std::span<const row_index>(s1.selections.data(), count1 * K), s1.lengths, sa);
      DHTEST_CUDA(cudaGraphLaunch(exec, sa));
      wait_or_die(sa, ctx + ": graph replay");

      // eager twin: the same step through batch_items
      const auto eager = [&](std::size_t s, const step_batch& x, dh::copy_layers mode) {
        std::vector<row_index> staged(N * K, dh::no_row);
        std::copy(x.selections.begin(), x.selections.end(), staged.begin());
        DHTEST_CUDA(cudaMemcpyAsync(bsel.data(), staged.data(), staged.size() * sizeof(row_index), cudaMemcpyHostToDevice, sb));
        std::vector<dhc::batch_item> items;
        for (std::size_t e = 0; e < x.slots.size(); ++e)
          items.push_back({ids[0], bsel.data() + e * K, x.lengths[e], bloc.data() + e * K});
        for (std::size_t e = 0; e < x.slots.size(); ++e)
          for (request_id id : ids)
            if (static_cast<std::int32_t>(b.slot_of(id)) == x.slots[e]) items[e].request = id;
        b.resolve(s, std::span<const dhc::batch_item>(items), sb, mode);
      };
      eager(0, s0, dh::copy_layers::producer_only);
      b.copy_follower(0, 1, sb);
      wait_or_die(sb, ctx + ": eager resolve");
      std::vector<location> eager0(N * K);
      DHTEST_CUDA(cudaMemcpyAsync(eager0.data(), bloc.data(), eager0.size() * sizeof(location), cudaMemcpyDeviceToHost, sb));
      DHTEST_CUDA(cudaStreamSynchronize(sb));
      const auto eager_stats0 = b.last_stats(0);
      eager(1, s1, dh::copy_layers::all);
      wait_or_die(sb, ctx + ": eager resolve of source 1");
      std::vector<location> eager1(N * K);
      DHTEST_CUDA(cudaMemcpyAsync(eager1.data(), bloc.data(), eager1.size() * sizeof(location), cudaMemcpyDeviceToHost, sb));
      DHTEST_CUDA(cudaStreamSynchronize(sb));

      if (corrupt) {
        REQUIRE_THROWS_AS(a.check_errors(sa), dh::position_beyond_frontier);
        REQUIRE_THROWS_AS(b.check_errors(sb), dh::position_beyond_frontier);
      } else {
        a.check_errors(sa);
        b.check_errors(sb);
      }

      const auto g0 = batch0.download_locations(static_cast<std::uint32_t>(count0), sa);
      const auto g1 = batch1.download_locations(static_cast<std::uint32_t>(count1), sa);
      for (std::size_t e = 0; e < count0; ++e) {
        INFO("source 0 batch entry " << e << " slot " << s0.slots[e] << " length " << s0.lengths[e]);
        if (corrupt && e == 1) continue;  // untouched on both sides, through different buffers
        const std::size_t len = static_cast<std::size_t>(s0.lengths[e]);
        DHTEST_REQUIRE_SAME(location, "graph vs eager locations",
                            std::span<const location>(eager0.data() + e * K, len),
                            std::span<const location>(g0.data() + e * K, len));
      }
      for (std::size_t e = 0; e < count1; ++e) {
        INFO("source 1 batch entry " << e << " slot " << s1.slots[e] << " length " << s1.lengths[e]);
        const std::size_t len = static_cast<std::size_t>(s1.lengths[e]);
        DHTEST_REQUIRE_SAME(location, "graph vs eager locations",
                            std::span<const location>(eager1.data() + e * K, len),
                            std::span<const location>(g1.data() + e * K, len));
      }
      // the replay's bytes against the generator's rows, every step
      rows_checked += check_generated_rows(a, 0, s0, g0, ids, corrupt ? 1 : -1, ctx + " (graph, source 0)");
      rows_checked += check_generated_rows(a, 1, s1, g1, ids, -1, ctx + " (graph, source 1)");

      const auto graph_stats0 = a.last_stats(0);
      const auto graph_stats1 = a.last_stats(1);
      const auto eager_stats1 = b.last_stats(1);
      REQUIRE(graph_stats0.size() == count0);
      REQUIRE(graph_stats1.size() == count1);
      for (std::size_t e = 0; e < count0; ++e) {
        INFO("source 0 entry " << e << ": graph " << stats_text(graph_stats0[e]) << " eager " << stats_text(eager_stats0[e]));
        REQUIRE(graph_stats0[e] == eager_stats0[e]);
        recovered += graph_stats0[e].rows_copied;
      }
      for (std::size_t e = 0; e < count1; ++e) {
        INFO("source 1 entry " << e << ": graph " << stats_text(graph_stats1[e]) << " eager " << stats_text(eager_stats1[e]));
        REQUIRE(graph_stats1[e] == eager_stats1[e]);
        recovered += graph_stats1[e].rows_copied;
      }
      if (step % 6 == 0 || corrupt) compare_hierarchies(a, b, ids, ctx);

      // between replays the engine appends new rows (outside the graph) on both
      if (step % 5 == 4)
        for (request_id id : ids)
          for (std::size_t s = 0; s < H::sources; ++s) {
            const auto rows = make_rows<Layout>(id, s, a.frontier(id, s), 3);
            a.append(id, s, std::span<const std::byte>(rows), 3, sa);
            b.append(id, s, std::span<const std::byte>(rows), 3, sb);
          }
    }
    compare_hierarchies(a, b, ids, "final");
    CHECK(recovered > 1000);
    CHECK(rows_checked > 60 * K);
    DHTEST_CUDA(cudaGraphExecDestroy(exec));
    DHTEST_CUDA(cudaGraphDestroy(graph));
  }
  DHTEST_CUDA(cudaStreamDestroy(sa));
  DHTEST_CUDA(cudaStreamDestroy(sb));
}
