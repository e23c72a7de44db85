// Differential test: the CUDA resolver against the host reference on the shared randomized
// workload (differential_workload.cuh), across layouts, hot-cache sizes, copy paths and shapes.
#include "differential_workload.cuh"

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

// Batches on both sides of the whole grid (132 CTAs on an H200): up to 2C <= grid the entry CTAs
// leave every copy to the spare CTAs, up to C = grid they copy as well, above it CTAs take several
// entries from the ticket counter. Early copies (the default at every size) and address-ordered
// copies alike.
TEST_CASE("cuda resolver matches the host hierarchy: batches around the grid size", "[gpu][differential]") {
  using tiny = dh::layouts::tiny;
  using b16 = dh::lru_hot_cache<16>;
  constexpr dh::hierarchy_config many{.max_requests = 200, .max_rows = 200, .optional_pages = 40};
  run_differential<tiny, b16>(many, {.steps = 300, .max_batch = 200, .state_every = 10, .seed = 71},
                              "tiny/200 requests/early copies");
  run_differential<tiny, b16>(many,
                              {.steps = 300, .max_batch = 200, .state_every = 10, .seed = 72, .early_copy_max_batch = 0},
                              "tiny/200 requests/ordered copies");
}

// Grids smaller than the batch: with 1, 3 and 5 CTAs, batches of up to 6 entries fall on both
// sides of 2C <= grid (entry CTAs that claim no copies and are not counted on the done counter,
// or entry CTAs that copy and are counted) and above C = grid (CTAs that take several entries),
// with self copies and with every copy made by the grid.
TEST_CASE("cuda resolver matches the host hierarchy: grids smaller than the batch", "[gpu][differential]") {
  using b512 = dh::lru_hot_cache<512>;
  for (unsigned ctas : {1u, 3u, 5u}) {
    const std::string name = "576/" + std::to_string(ctas) + " CTAs";
    run_differential<layout_576, b512>(
        rows_576_config, {.steps = 400, .max_batch = 6, .state_every = 10, .seed = 50 + ctas, .resolver_ctas = ctas},
        name.c_str());
    const std::string grid_name = name + "/grid copies";
    run_differential<layout_576, b512>(rows_576_config,
                                       {.steps = 400, .max_batch = 6, .state_every = 10, .seed = 60 + ctas,
                                        .self_copy_units = 0, .resolver_ctas = ctas},
                                       grid_name.c_str());
  }
}

// Resolves and follower copies launched with programmatic dependent launch: each waits for the
// kernel before it (the twin's uploads, the previous resolve, the producer's plan), so nothing changes.
TEST_CASE("cuda resolver matches the host hierarchy: programmatic launch", "[gpu][differential][programmatic]") {
  SECTION("tiny layout, B=64, wide tail") {
    const dh::hierarchy_config cfg{.max_requests = 6, .max_rows = 400, .tail_rows = 12, .optional_pages = 10};
    run_differential<dh::layouts::tiny, dh::lru_hot_cache<64>>(
        cfg, {.steps = 1500, .max_batch = 6, .state_every = 7, .seed = 17, .programmatic = true}, "programmatic/tiny/B64");
  }
  SECTION("576/656-byte rows, k=256, B=512") {
    run_differential<layout_576, dh::lru_hot_cache<512>>(
        rows_576_config, {.steps = 600, .max_batch = 6, .state_every = 10, .seed = 18, .programmatic = true},
        "programmatic/576/k256/B512");
  }
}
