// The randomized differential workload shared by the resolver's differential tests: host_hierarchy
// (the executable specification) against cuda::hierarchy on identical workloads: admit, append,
// resolve (tail / hot / miss rows, duplicates, -1 padding, shorter selections), optional pages
// mapped and unmapped, producer-only resolves with follower copies, complete and readmit. After
// every resolve: locations, per-entry stats, copy plan and the payload bytes at every returned
// location; periodically the hot rows, LRU order, optional map and frontier of every
// request/source and every byte of every pool. Include once per test program.
#pragma once

#include "cuda_test_support.cuh"

namespace {

using namespace dhtest;

struct workload {
  std::size_t steps = 1000;
  std::size_t max_batch = 4;
  std::size_t state_every = 10;  ///< compare state and pools every this many steps
  std::size_t initial_rows = 0;  ///< rows appended on admission (0: a random amount)
  std::uint64_t seed = 1;
  /// Most copy units an entry copies with its own CTA (-1: the library default; 0: every copy by
  /// the whole grid; small: entries on both sides of the threshold).
  int self_copy_units = -1;
  /// Largest batch that copies early (-1: the library default; 0: every batch copies its distinct
  /// rows in address order, the path of large batches).
  int early_copy_max_batch = -1;
  /// Copy shapes, warps per CTA x rows per warp (0 x 0: the library default): address-ordered
  /// copies and early copies.
  unsigned copy_warps = 0, rows_per_warp = 0, early_copy_warps = 0, early_rows_per_warp = 0;
  /// CTAs per resolve (0: the whole persistent grid). Small grids put batches on both sides of
  /// 2C <= grid (entry CTAs that copy nothing and are not counted) and above C = grid.
  unsigned resolver_ctas = 0;
  /// Resolves and follower copies launched with programmatic dependent launch.
  bool programmatic = false;
};

template <class Layout, class Hot>
void run_differential(const dh::hierarchy_config& cfg, const workload& w, const char* name) {
  require_device();
  twin<Layout, Hot> tw(cfg, w.seed);
  if (w.self_copy_units >= 0) tw.dev.set_self_copy_units(static_cast<unsigned>(w.self_copy_units));
  if (w.early_copy_max_batch >= 0) tw.dev.set_early_copy_max_batch(static_cast<unsigned>(w.early_copy_max_batch));
  if (w.copy_warps != 0) tw.dev.set_copy_shape(w.copy_warps, w.rows_per_warp);
  if (w.early_copy_warps != 0) tw.dev.set_early_copy_shape(w.early_copy_warps, w.early_rows_per_warp);
  if (w.resolver_ctas != 0) tw.dev.set_resolver_ctas(w.resolver_ctas);
  tw.dev.set_programmatic_launch(w.programmatic);
  using T = twin<Layout, Hot>;
  constexpr std::size_t K = Layout::top_k;
  constexpr std::size_t P = Layout::page_rows;
  std::size_t resolves = 0, copied = 0, hot = 0, direct = 0;

  auto admit_new = [&] {
    const request_id id = tw.next_id++;
    if (!tw.admit(id)) return;
    for (std::size_t s = 0; s < T::sources; ++s) {
      const std::size_t rows = w.initial_rows != 0 ? w.initial_rows : 1 + tw.uniform(cfg.max_rows / 2);
      tw.append(id, s, rows);
    }
  };
  for (std::size_t i = 0; i < cfg.max_requests; ++i) admit_new();

  for (std::size_t step = 0; step < w.steps; ++step) {
    const std::string ctx = std::string(name) + " step " + std::to_string(step);
    INFO(ctx);
    const double op = std::uniform_real_distribution<double>(0, 1)(tw.rng);
    if (op < 0.06) {
      admit_new();
    } else if (op < 0.10) {
      if (!tw.live.empty()) {
        const request_id id = tw.live[tw.uniform(tw.live.size())];
        tw.complete(id);
        if (tw.chance(0.5)) {  // readmit the same id with a fresh history
          REQUIRE(tw.admit(id));
          for (std::size_t s = 0; s < T::sources; ++s) tw.append(id, s, 1 + tw.uniform(3 * P));
        }
      }
    } else if (op < 0.28) {
      if (!tw.live.empty()) {
        const request_id id = tw.live[tw.uniform(tw.live.size())];
        const std::size_t s = tw.uniform(T::sources);
        const std::int64_t room = static_cast<std::int64_t>(cfg.max_rows) - tw.host.frontier(id, s);
        if (room > 0) tw.append(id, s, 1 + tw.uniform(std::min<std::size_t>(static_cast<std::size_t>(room), 2 * P)));
      }
    } else if (op < 0.36) {
      if (!tw.live.empty()) {
        const request_id id = tw.live[tw.uniform(tw.live.size())];
        const std::size_t s = tw.uniform(T::sources);
        const std::size_t pages = static_cast<std::size_t>(tw.host.frontier(id, s)) / P;
        if (pages > 0) {
          const std::size_t page = tw.uniform(pages);
          if (tw.chance(0.7)) tw.map_page(id, s, page);
          else tw.unmap_page(id, s, page);
        }
      }
    } else if (!tw.live.empty()) {
      // resolve a batch of distinct requests on one source
      const std::size_t s = tw.uniform(T::sources);
      std::vector<request_id> ids = tw.live;
      std::shuffle(ids.begin(), ids.end(), tw.rng);
      ids.resize(1 + tw.uniform(std::min(w.max_batch, ids.size())));
      std::vector<typename T::request_selection> batch;
      for (request_id id : ids) {
        const std::size_t len = tw.chance(0.7) ? K : tw.uniform(K + 1);
        batch.push_back({id, tw.make_selection(id, s, len)});
      }
      const bool producer_only = Layout::sources[s].payload_layers > 1 && tw.chance(0.4);
      const auto mode = producer_only ? dh::copy_layers::producer_only : dh::copy_layers::all;
      const bool leave_pending = producer_only && tw.chance(0.2);
      const auto locs = tw.resolve(s, batch, mode, !leave_pending, ctx);
      ++resolves;
      for (const auto& st : tw.dev.last_stats(s)) {
        copied += st.rows_copied;
        hot += st.hot;
        direct += st.direct;
      }
      tw.check_contents(s, batch, locs, producer_only && leave_pending ? 1 : Layout::sources[s].payload_layers, ctx);
      if (leave_pending) {
        // Both backends refuse to resolve the source again before the followers copied the plan.
        typename T::request_selection again{batch[0].id, batch[0].selection};
        std::vector<location> sink(again.selection.size());
        REQUIRE_THROWS_AS(tw.host.resolve(again.id, s, again.selection, sink), dh::pending_follower_copies);
        std::vector<typename T::device_type::batch_item> none;
        REQUIRE_THROWS_AS(tw.dev.resolve(s, std::span<const typename T::device_type::batch_item>(none)),
                          dh::pending_follower_copies);
        for (std::size_t l = 1; l < Layout::sources[s].payload_layers; ++l) {
          tw.host.copy_follower(s, l);
          tw.dev.copy_follower(s, l);
        }
        tw.check_contents(s, batch, locs, Layout::sources[s].payload_layers, ctx + " after follower copies");
      }
    }
    if (step % w.state_every == 0 || step + 1 == w.steps) {
      tw.compare_state(ctx);
      tw.compare_pools(ctx);
    }
  }
  INFO(name << ": " << resolves << " resolves, " << copied << " rows recovered, " << hot << " hot entries, " << direct
            << " direct entries");
  CHECK(resolves > w.steps / 4);
  CHECK(copied > 0);
  CHECK(hot > 0);
  CHECK(direct > 0);
}

/// Configurations used by more than one case.
constexpr dh::hierarchy_config tiny_b16_config{.max_requests = 4, .max_rows = 200, .optional_pages = 6};
constexpr dh::hierarchy_config rows_576_config{.max_requests = 6, .max_rows = 4096, .optional_pages = 24};  ///< k 256, B 512

}  // namespace
