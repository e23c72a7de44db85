// decode_demo_cuda: the decode demo on the CUDA backend (scripts/demo runs it when a GPU is present).
//
// The same workload as decode_demo (examples/demo_workload.hpp): several requests with long
// imported histories decode step by step; per step and source (index producer) every request's
// top-k is resolved in one batched launch that copies the producer layer, each follower layer
// replays the copy plan with its own bytes (layer-wise prefetch), sampled locations are read back
// from the GPU pools and compared with the original rows, and one new row per request joins the
// history. Prints where the selected rows came from, what was recovered from pinned host memory and
// the resolver's GPU time (CUDA events).
//
// Exit status: 0 success, 1 an exactness check failed, 2 bad arguments, 3 a dhisparse or CUDA error.
#include <cuda_runtime.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <exception>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <dhisparse/cuda/hierarchy.cuh>
#include <dhisparse/planner.hpp>

#include "demo_workload.hpp"

namespace {

namespace dh = dhisparse;
namespace dhc = dhisparse::cuda;
using demo::layout;
using demo::row_bytes;
using Hierarchy = dhc::hierarchy<layout, dh::lru_hot_cache<1024>>;
constexpr std::size_t sources = dh::source_count<layout>;
constexpr std::size_t k = layout::top_k;

struct options {
  std::size_t requests = 4, history = 16384, steps = 200, verify = 32, every = 20;
  std::uint64_t seed = 1;
  bool quiet = false;
};

bool parse(int argc, char** argv, options& o) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    auto value = [&](std::size_t& out) {
      if (i + 1 >= argc) return false;
      out = std::stoull(argv[++i]);
      return true;
    };
    std::size_t seed = 0;
    if (a == "--quiet") o.quiet = true;
    else if (a == "--requests") { if (!value(o.requests) || o.requests == 0 || o.requests > 64) return false; }
    else if (a == "--history") { if (!value(o.history) || o.history < 1 || o.history > (1u << 20)) return false; }
    else if (a == "--steps") { if (!value(o.steps)) return false; }
    else if (a == "--verify") { if (!value(o.verify) || o.verify > k) return false; }
    else if (a == "--every") { if (!value(o.every) || o.every == 0) return false; }
    else if (a == "--seed") { if (!value(seed)) return false; o.seed = seed; }
    else return false;
  }
  return true;
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw dh::device_error(std::string(what) + ": " + cudaGetErrorString(e));
}

struct totals {
  std::size_t selected = 0, direct = 0, hot = 0, host = 0, rows_copied = 0, bytes = 0, checked = 0, mismatches = 0;
};

int run(const options& o) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("decode_demo_cuda: no CUDA device; run decode_demo (host backend) instead\n");
    return 0;
  }
  dh::hierarchy_config cfg;
  cfg.max_requests = o.requests;
  cfg.max_rows = o.history + o.steps + 1;
  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  const auto need = Hierarchy::requirements(cfg);
  Hierarchy h(cfg, stream);
  std::printf("CUDA backend: %zu requests x %zu rows imported, %zu steps, %zu sources (%zu payload layers), "
              "top-k %zu, B = 1024\n  GPU state %.1f MiB, pinned host store %.1f MiB, resolver grid %d x %d\n",
              o.requests, o.history, o.steps, sources, dh::payload_layer_count<layout>(), k,
              need.device_bytes / 1048576.0, need.pinned_bytes / 1048576.0, h.resolver_grid(), Hierarchy::block_threads);

  // Admission and import of each request's history (a prefill hand-over), through pinned staging.
  std::vector<dh::request_id> ids;
  std::vector<std::byte> buf;
  for (std::size_t r = 0; r < o.requests; ++r) {
    const dh::request_id id = 1000 + r;
    if (!h.admit(id, stream)) throw dh::invalid_configuration("admission waited");
    ids.push_back(id);
    for (std::size_t s = 0; s < sources; ++s)
      for (std::size_t first = 0; first < o.history; first += 4096) {
        const std::size_t n = std::min<std::size_t>(4096, o.history - first);
        demo::fill_rows(buf, o.seed, r, s, static_cast<std::int64_t>(first), n);
        h.append(id, s, std::span<const std::byte>(buf), n, stream);
      }
  }
  check(cudaStreamSynchronize(stream), "import");

  std::array<dh::workload::selection_batch, sources> gens{
      dh::workload::selection_batch(demo::demo_selection_params(), dh::workload::stream_seed(o.seed, 0), o.requests),
      dh::workload::selection_batch(demo::demo_selection_params(), dh::workload::stream_seed(o.seed, 1), o.requests),
      dh::workload::selection_batch(demo::demo_selection_params(), dh::workload::stream_seed(o.seed, 2), o.requests)};
  static_assert(sources == 3, "one selection_batch per source of the demo layout");

  dhc::device_buffer<dh::row_index> d_sel(o.requests * k);
  dhc::device_buffer<dh::location> d_loc(o.requests * k);
  std::vector<dh::row_index> sel(o.requests * k);
  std::vector<dh::location> loc(o.requests * k);
  std::vector<std::int64_t> frontiers(o.requests);
  std::vector<Hierarchy::batch_item> items(o.requests);
  for (std::size_t r = 0; r < o.requests; ++r)
    items[r] = {ids[r], d_sel.data() + r * k, static_cast<std::int32_t>(k), d_loc.data() + r * k};
  std::vector<std::byte> pool(h.space().rows() * row_bytes), expected(row_bytes);
  dh::workload::splitmix64 sample_rng{dh::workload::stream_seed(o.seed, 0xC0FFEE)};
  cudaEvent_t before = nullptr, after = nullptr;
  check(cudaEventCreate(&before), "cudaEventCreate");
  check(cudaEventCreate(&after), "cudaEventCreate");
  double resolve_ms = 0;
  totals total;

  for (std::size_t step = 1; step <= o.steps; ++step) {
    for (std::size_t s = 0; s < sources; ++s) {
      const std::size_t layers = layout::sources[s].payload_layers;
      for (std::size_t r = 0; r < o.requests; ++r) frontiers[r] = h.frontier(ids[r], s);
      gens[s].next(frontiers, sel);
      check(cudaMemcpyAsync(d_sel.data(), sel.data(), sel.size() * sizeof(dh::row_index), cudaMemcpyHostToDevice,
                            stream),
            "upload selections");
      // One launch resolves every request's selection and copies the producer layer's misses;
      // followers replay the plan with their own bytes (layer-wise prefetch).
      check(cudaEventRecord(before, stream), "cudaEventRecord");
      h.resolve(s, std::span<const Hierarchy::batch_item>(items), stream, dh::copy_layers::producer_only);
      check(cudaEventRecord(after, stream), "cudaEventRecord");
      for (std::size_t l = 1; l < layers; ++l) h.copy_follower(s, l, stream);
      check(cudaMemcpyAsync(loc.data(), d_loc.data(), loc.size() * sizeof(dh::location), cudaMemcpyDeviceToHost,
                            stream),
            "download locations");
      h.check_errors(stream);  // synchronises
      float ms = 0;
      check(cudaEventElapsedTime(&ms, before, after), "cudaEventElapsedTime");
      resolve_ms += ms;
      for (const auto& st : h.last_stats(s)) {
        total.selected += st.selected;
        total.direct += st.direct;
        total.hot += st.hot;
        total.host += st.host;
        total.rows_copied += st.rows_copied;
        total.bytes += st.rows_copied * layers * row_bytes;
      }
      // Exactness: what attention reads at each sampled location is the original row.
      for (std::size_t l = 0; l < layers; ++l) {
        h.copy_pool(s, l, pool);
        for (std::size_t r = 0; r < o.requests; ++r)
          for (std::size_t c = 0; c < (o.verify == 0 ? k : o.verify); ++c) {
            const std::size_t i = r * k + (o.verify == 0 ? c : static_cast<std::size_t>(sample_rng.below(k)));
            ++total.checked;
            if (sel[i] == dh::no_row) {
              total.mismatches += loc[i] == dh::no_location ? 0 : 1;
              continue;
            }
            demo::fill_row(expected.data(), o.seed, r, s, l, sel[i]);
            if (std::memcmp(pool.data() + static_cast<std::size_t>(loc[i]) * row_bytes, expected.data(), row_bytes) != 0) {
              if (total.mismatches < 5)
                std::fprintf(stderr, "MISMATCH step %zu source %zu request %zu row %d layer %zu location %d\n", step, s,
                             r, sel[i], l, loc[i]);
              ++total.mismatches;
            }
          }
      }
    }
    // Decode: one new row per request and source joins the history.
    for (std::size_t r = 0; r < o.requests; ++r)
      for (std::size_t s = 0; s < sources; ++s) {
        demo::fill_rows(buf, o.seed, r, s, h.frontier(ids[r], s), 1);
        h.append(ids[r], s, std::span<const std::byte>(buf), 1, stream);
      }
    if (!o.quiet && (step % o.every == 0 || step == o.steps))
      std::printf("step %4zu: %zu entries, direct %.1f %%, hot %.1f %%, host %.1f %%, %.1f MiB recovered\n", step,
                  total.selected, 100.0 * total.direct / total.selected, 100.0 * total.hot / total.selected,
                  100.0 * total.host / total.selected, total.bytes / 1048576.0);
  }
  check(cudaStreamSynchronize(stream), "decode");

  const auto hier = dh::plan<layout>(dh::plan_inputs{.context_tokens = o.history + o.steps, .hot_rows = 1024});
  std::printf("\nSummary: %zu steps x %zu requests x %zu sources\n", o.steps, o.requests, sources);
  std::printf("  selection entries %zu: direct %.1f %%, hot %.1f %%, host %.1f %%\n", total.selected,
              100.0 * total.direct / total.selected, 100.0 * total.hot / total.selected,
              100.0 * total.host / total.selected);
  std::printf("  rows recovered from pinned host memory %zu (%.1f MiB over every materialised layer)\n",
              total.rows_copied, total.bytes / 1048576.0);
  std::printf("  resolver GPU time %.3f ms over %zu launches (%.1f us per launch)\n", resolve_ms, o.steps * sources,
              1000.0 * resolve_ms / static_cast<double>(o.steps * sources));
  std::printf("  per-session GPU memory (planner): hierarchical %.1f MiB vs resident %.1f MiB\n",
              hier.hierarchical_total / 1048576.0, hier.resident_total / 1048576.0);
  std::printf("  exactness checks %zu, mismatches %zu\n", total.checked, total.mismatches);
  cudaEventDestroy(before);
  cudaEventDestroy(after);
  cudaStreamDestroy(stream);
  if (total.mismatches != 0) return 1;
  std::printf("OK: every checked location held the original row, bit for bit\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  if (!parse(argc, argv, o)) {
    std::fprintf(stderr,
                 "usage: decode_demo_cuda [--requests N] [--history N] [--steps N] [--verify N] [--every N] "
                 "[--seed S] [--quiet]\n");
    return 2;
  }
  try {
    return run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "decode_demo_cuda: %s\n", e.what());
    return 3;
  }
}
