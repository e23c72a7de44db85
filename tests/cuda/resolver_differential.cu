// Differential test: host_hierarchy (the executable specification) against cuda::hierarchy on
// identical randomized workloads: admit, append, resolve (tail / hot / miss rows, duplicates,
// -1 padding, shorter selections), optional pages mapped and unmapped, producer-only resolves
// with follower copies, complete and readmit. After every resolve: locations, per-entry stats,
// copy plan and the payload bytes at every returned location; periodically the hot rows, LRU
// order, optional map and frontier of every request/source and every byte of every pool.
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
};

template <class Layout, class Hot>
void run_differential(const dh::hierarchy_config& cfg, const workload& w, const char* name) {
  require_device();
  twin<Layout, Hot> tw(cfg, w.seed);
  if (w.self_copy_units >= 0) tw.dev.set_self_copy_units(static_cast<unsigned>(w.self_copy_units));
  if (w.early_copy_max_batch >= 0) tw.dev.set_early_copy_max_batch(static_cast<unsigned>(w.early_copy_max_batch));
  if (w.copy_warps != 0) tw.dev.set_copy_shape(w.copy_warps, w.rows_per_warp);
  if (w.early_copy_warps != 0) tw.dev.set_early_copy_shape(w.early_copy_warps, w.early_rows_per_warp);
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

TEST_CASE("cuda resolver matches the host hierarchy: tiny layout, B=16", "[gpu][differential]") {
  run_differential<dh::layouts::tiny, dh::lru_hot_cache<16>>(
      tiny_b16_config, {.steps = 3000, .max_batch = 4, .state_every = 5, .seed = 11}, "tiny/B16");
}

TEST_CASE("cuda resolver matches the host hierarchy: tiny layout, B=64, wide tail", "[gpu][differential]") {
  // A tail that is not a whole page.
  const dh::hierarchy_config cfg{.max_requests = 6, .max_rows = 400, .tail_rows = 12, .optional_pages = 10};
  run_differential<dh::layouts::tiny, dh::lru_hot_cache<64>>(
      cfg, {.steps = 3000, .max_batch = 6, .state_every = 7, .seed = 12}, "tiny/B64");
}

TEST_CASE("cuda resolver matches the host hierarchy: 576/656-byte rows, k=256, B=512", "[gpu][differential]") {
  run_differential<layout_576, dh::lru_hot_cache<512>>(
      rows_576_config, {.steps = 1500, .max_batch = 6, .state_every = 10, .seed = 13}, "576/k256/B512");
}

TEST_CASE("cuda resolver matches the host hierarchy: GLM-like k=2048, B=4096", "[gpu][differential]") {
  const dh::hierarchy_config cfg{.max_requests = 3, .max_rows = 20000, .optional_pages = 32};
  run_differential<layout_glm_like, dh::lru_hot_cache<4096>>(
      cfg, {.steps = 40, .max_batch = 3, .state_every = 4, .initial_rows = 12000, .seed = 14}, "glm-like/k2048/B4096");
}

// The same workloads with every copy made by the whole grid, and with a threshold that puts the
// entries of one batch on both sides of it (self copies next to grid copies).
TEST_CASE("cuda resolver matches the host hierarchy: grid copies only and mixed self copies", "[gpu][differential]") {
  using tiny = dh::layouts::tiny;
  using b16 = dh::lru_hot_cache<16>;
  run_differential<tiny, b16>(tiny_b16_config,
                              {.steps = 2000, .max_batch = 4, .state_every = 5, .seed = 21, .self_copy_units = 0},
                              "tiny/B16/grid copies");
  run_differential<tiny, b16>(tiny_b16_config,
                              {.steps = 2000, .max_batch = 4, .state_every = 5, .seed = 22, .self_copy_units = 3},
                              "tiny/B16/self copies <= 3 units");
  using b512 = dh::lru_hot_cache<512>;
  run_differential<layout_576, b512>(rows_576_config,
                                     {.steps = 800, .max_batch = 6, .state_every = 10, .seed = 23, .self_copy_units = 0},
                                     "576/k256/B512/grid copies");
  run_differential<layout_576, b512>(rows_576_config,
                                     {.steps = 800, .max_batch = 6, .state_every = 10, .seed = 24, .self_copy_units = 24},
                                     "576/k256/B512/self copies <= 24 units");
}

// Both copy paths under several shapes: address-ordered copies (forced for these small batches)
// with one warp per CTA and one or two rows in flight, and early copies with every warp and two
// rows each (the shape before early copies had their own) or one warp per CTA.
TEST_CASE("cuda resolver matches the host hierarchy: copy paths and shapes", "[gpu][differential]") {
  using b512 = dh::lru_hot_cache<512>;
  const auto run = [](const workload& w, const char* name) {
    run_differential<layout_576, b512>(rows_576_config, w, name);
  };
  run({.steps = 600, .max_batch = 6, .state_every = 10, .seed = 31, .self_copy_units = 0, .early_copy_max_batch = 0,
       .copy_warps = 1, .rows_per_warp = 1},
      "576/ordered copies/1 warp x 1 row");
  run({.steps = 600, .max_batch = 6, .state_every = 10, .seed = 32, .early_copy_max_batch = 0, .copy_warps = 3,
       .rows_per_warp = 2},
      "576/ordered copies/3 warps x 2 rows");
  run({.steps = 600, .max_batch = 6, .state_every = 10, .seed = 33, .self_copy_units = 0, .early_copy_warps = 32,
       .early_rows_per_warp = 2},
      "576/early copies/32 warps x 2 rows");
  run({.steps = 600, .max_batch = 6, .state_every = 10, .seed = 34, .self_copy_units = 4, .early_copy_warps = 1,
       .early_rows_per_warp = 1},
      "576/early copies/1 warp x 1 row");
}

// Long histories: more than 32 missing rows spread over more rows than the rank bitmap covers
// (64 x top_k = 16384 here) take the bitonic sort and the binary searches, early copies and
// address-ordered copies alike.
TEST_CASE("cuda resolver matches the host hierarchy: misses spanning more than the rank bitmap", "[gpu][differential]") {
  using b512 = dh::lru_hot_cache<512>;
  constexpr dh::hierarchy_config long_config{.max_requests = 4, .max_rows = 40000, .optional_pages = 24};
  static_assert(long_config.max_rows > 64 * layout_576::top_k);
  run_differential<layout_576, b512>(long_config,
                                     {.steps = 300, .max_batch = 4, .state_every = 10, .initial_rows = 30000, .seed = 41},
                                     "576/long histories/early copies");
  run_differential<layout_576, b512>(
      long_config,
      {.steps = 300, .max_batch = 4, .state_every = 10, .initial_rows = 30000, .seed = 42, .early_copy_max_batch = 0},
      "576/long histories/ordered copies");
}
