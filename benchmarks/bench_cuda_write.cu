// bench_cuda_write: the write part of an engine's decode step on the CUDA backend. Every admitted
// request writes one new row into every payload layer of every source, replayed from a CUDA graph
// step after step. See docs/design.md ("Batched writes").
//
//   dhisparse   a graph of per-source `hierarchy::append(source, kv_write_view, stream)` launches
//               (one per source, write-through host copy in each): the per-source path
//   step        a graph of ONE `append_step(kv_step_write_view, backup, stream)` (every source, one
//               launch) with the host backup forked onto a second stream and joined at the end of
//               the graph. median_us is the critical path: from the step's start to the event the
//               graph records on `stream` right after the critical launch (tails, window-external
//               rows, frontiers); total_us runs to the end of the graph (backup joined);
//               backup_GBps = step bytes / (backup end - critical end), the backup launch's own rate
//   step_inline the same step with backup == stream: one launch that also writes the host copy
//   flat        baseline: ONE kernel (graph-replayed) that writes the same bytes from the same
//               input buffers into a flat per-layer cache at slot-mapping indices (vLLM's
//               reshape_and_cache shape), one warp per row, all layers in one launch
//   d2h_memcpy  the same bytes as one pinned device-to-host cudaMemcpyAsync: the bandwidth a
//               host backup of the step's rows can reach (the write-through's PCIe share)
//
// Layouts: the sources of layouts::glm53 (21 sources, 78 payload layers, 576-byte rows) and
// layouts::deepseek_v32 (61 sources, 656-byte rows), with top_k and B cut to 64 (writes do not
// depend on them; the pools stay small enough for C = 256 slots). C in {1, 32, 128, 256}. Times are
// CUDA-event medians of graph replays. After every timed step, outside the events, every written
// row is checked on the device: tail row and host-store row (dhisparse) or flat-cache row (flat)
// against the step's input bytes, which change every step.
//
// Extra flag (removed before Google Benchmark sees the command line):
//   --dh_timed_steps=N   timed steps per configuration (default 100, 5 .. 200)
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include <dhisparse/cuda/hierarchy.cuh>
#include <dhisparse/cuda/kv_write.cuh>
#include <dhisparse/layouts/deepseek_v32.hpp>
#include <dhisparse/layouts/glm53.hpp>

#include "detail/common.cuh"

namespace {

using namespace dhisparse_bench;
namespace dh = dhisparse;

constexpr std::uint32_t kSlots = 256;
constexpr std::uint32_t kWarmupSteps = 5;
constexpr std::array<std::uint32_t, 4> kBatches{1, 32, 128, 256};
std::uint32_t g_timed_steps = 100;

/// The sources and consumers of `Base` with a small top_k / B: the write path is the same.
template <class Base>
struct write_layout {
  static constexpr std::size_t top_k = 64;
  static constexpr std::size_t page_rows = Base::page_rows;
  static constexpr auto sources = Base::sources;
  static constexpr auto consumers = Base::consumers;
};

enum class method { dhisparse, step, step_inline, flat, d2h_memcpy };
const char* name_of(method x) {
  switch (x) {
    case method::dhisparse: return "dhisparse";
    case method::step: return "step";
    case method::step_inline: return "step_inline";
    case method::flat: return "flat";
    default: return "d2h_memcpy";
  }
}

// --- device kernels ------------------------------------------------------------------------------

/// Step input: row e of global layer g holds words of (step, g, e).
__global__ void fill_input(std::uint64_t* const* in, unsigned layers, unsigned C, unsigned words, unsigned step) {
  const std::size_t total = static_cast<std::size_t>(layers) * C * words;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const auto g = static_cast<unsigned>(i / (static_cast<std::size_t>(C) * words));
    const std::size_t rest = i - static_cast<std::size_t>(g) * C * words;
    in[g][rest] = row_word(step * 131u + g, static_cast<std::uint32_t>(rest / words), static_cast<std::uint32_t>(rest % words));
  }
}

/// The flat baseline: one warp per (layer, entry) row, 16-byte vectors.
__global__ void __launch_bounds__(256) flat_write(const int4* const* in, int4* const* cache, const std::int64_t* slot_mapping,
                                                  unsigned layers, unsigned C, unsigned vecs) {
  const unsigned lane = threadIdx.x & 31u;
  const unsigned warps = (gridDim.x * blockDim.x) >> 5;
  for (unsigned u = (blockIdx.x * blockDim.x + threadIdx.x) >> 5; u < layers * C; u += warps) {
    const unsigned g = u / C, e = u - g * C;
    const int4* src = in[g] + static_cast<std::size_t>(e) * vecs;
    int4* dst = cache[g] + static_cast<std::size_t>(slot_mapping[e]) * vecs;
    for (unsigned v = lane; v < vecs; v += 32) dst[v] = src[v];
  }
}

/// Counts rows of the flat cache that differ from the input.
__global__ void check_flat(const std::uint64_t* const* in, std::uint64_t* const* cache, const std::int64_t* slot_mapping,
                           unsigned layers, unsigned C, unsigned words, unsigned long long* bad) {
  for (unsigned u = blockIdx.x * blockDim.x + threadIdx.x; u < layers * C; u += gridDim.x * blockDim.x) {
    const unsigned g = u / C, e = u - g * C;
    for (unsigned w = 0; w < words; ++w)
      if (cache[g][static_cast<std::size_t>(slot_mapping[e]) * words + w] != in[g][static_cast<std::size_t>(e) * words + w]) {
        atomicAdd(bad, 1ull);
        break;
      }
  }
}

/// Counts rows of one source whose tail row or host-store row differs from the input (row `row`
/// of slots 0 .. C-1; input layer l of the source is global layer first_layer + l).
template <class View>
__global__ void check_source(View v, const std::uint64_t* const* in, unsigned first_layer, unsigned C, long long row,
                             unsigned long long* bad) {
  const unsigned words = v.row_bytes / 8u;
  for (unsigned u = blockIdx.x * blockDim.x + threadIdx.x; u < v.layers * C; u += gridDim.x * blockDim.x) {
    const unsigned l = u / C, slot = u - l * C;
    const std::uint64_t* want = in[first_layer + l] + static_cast<std::size_t>(slot) * words;
    const auto* tail = reinterpret_cast<const std::uint64_t*>(v.layer_pool[l] +
                                                              static_cast<std::size_t>(v.space.tail(slot, row)) * v.row_bytes);
    const std::int32_t hp = v.host_page[static_cast<std::size_t>(slot) * v.pages_per_request + row / v.page_rows];
    const auto* host = reinterpret_cast<const std::uint64_t*>(
        v.host_store + static_cast<std::uint64_t>(hp) * v.page_bytes +
        (static_cast<std::uint64_t>(l) * v.page_rows + static_cast<std::uint64_t>(row) % v.page_rows) * v.row_bytes);
    for (unsigned w = 0; w < words; ++w)
      if (hp < 0 || tail[w] != want[w] || host[w] != want[w]) {
        atomicAdd(bad, 1ull);
        break;
      }
  }
}

// --- one layout's setup ---------------------------------------------------------------------------

template <class Base>
struct write_setup {
  using L = write_layout<Base>;
  using H = dh::cuda::hierarchy<L, dh::lru_hot_cache<64>>;
  static constexpr std::size_t S = dh::source_count<L>;
  static constexpr std::size_t row_bytes = L::sources[0].row_bytes;  // uniform in both layouts
  unsigned layers = 0;
  cudaStream_t stream{}, backup_stream{};
  std::unique_ptr<H> h;
  dh::cuda::device_buffer<std::byte> input;                // [global layer][kSlots][row_bytes]
  dh::cuda::device_buffer<std::byte*> input_ptrs;          // [global layer]
  dh::cuda::device_buffer<std::byte> cache;                // flat baseline: [global layer][kSlots * kSlots rows]
  dh::cuda::device_buffer<std::byte*> cache_ptrs;
  dh::cuda::device_buffer<std::int64_t> slot_mapping{kSlots};
  dh::cuda::device_buffer<std::int32_t> slots{kSlots}, rows{kSlots};
  dh::cuda::device_buffer<unsigned long long> bad{1};
  dh::cuda::pinned_buffer backup;                          // d2h target
  std::array<std::uint32_t, S> first_layer{};
  std::vector<dh::cuda::device_buffer<const std::byte*>> source_ptrs;  // per source: its layers' input rows

  write_setup() {
    for (std::size_t s = 0; s < S; ++s) {
      first_layer[s] = layers;
      layers += static_cast<unsigned>(L::sources[s].payload_layers);
    }
    DHB_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    DHB_CHECK(cudaStreamCreateWithFlags(&backup_stream, cudaStreamNonBlocking));
    dh::hierarchy_config cfg;
    cfg.max_requests = kSlots;
    cfg.max_rows = 1024;
    cfg.tail_rows = 64;
    cfg.host_pages = kSlots * ((kWarmupSteps + 200 + 2 + 63) / 64 + 1);  // one configuration's rows
    h = std::make_unique<H>(cfg, stream);
    const std::size_t layer_bytes = static_cast<std::size_t>(kSlots) * row_bytes;
    input = dh::cuda::device_buffer<std::byte>(layers * layer_bytes);
    cache = dh::cuda::device_buffer<std::byte>(static_cast<std::size_t>(layers) * kSlots * layer_bytes);
    std::vector<std::byte*> ip(layers), cp(layers);
    for (unsigned g = 0; g < layers; ++g) {
      ip[g] = input.data() + g * layer_bytes;
      cp[g] = cache.data() + static_cast<std::size_t>(g) * kSlots * layer_bytes;
    }
    input_ptrs = dh::cuda::device_buffer<std::byte*>(layers);
    cache_ptrs = dh::cuda::device_buffer<std::byte*>(layers);
    DHB_CHECK(cudaMemcpy(input_ptrs.data(), ip.data(), layers * sizeof(void*), cudaMemcpyHostToDevice));
    DHB_CHECK(cudaMemcpy(cache_ptrs.data(), cp.data(), layers * sizeof(void*), cudaMemcpyHostToDevice));
    for (std::size_t s = 0; s < S; ++s) {
      source_ptrs.emplace_back(L::sources[s].payload_layers);
      DHB_CHECK(cudaMemcpy(source_ptrs.back().data(), ip.data() + first_layer[s],
                           L::sources[s].payload_layers * sizeof(void*), cudaMemcpyHostToDevice));
    }
    backup = dh::cuda::pinned_buffer(layers * layer_bytes);
    std::vector<std::int32_t> one(kSlots, 1), ids(kSlots);
    for (std::uint32_t e = 0; e < kSlots; ++e) ids[e] = static_cast<std::int32_t>(e);
    DHB_CHECK(cudaMemcpy(slots.data(), ids.data(), kSlots * 4, cudaMemcpyHostToDevice));  // entry e: slot e
    DHB_CHECK(cudaMemcpy(rows.data(), one.data(), kSlots * 4, cudaMemcpyHostToDevice));   // decode: one row
  }
  ~write_setup() {
    h.reset();
    cudaStreamDestroy(backup_stream);
    cudaStreamDestroy(stream);
  }
  std::size_t step_bytes(unsigned C) const { return static_cast<std::size_t>(layers) * C * row_bytes; }
  void fill(unsigned C, unsigned step) {
    fill_input<<<264, 256, 0, stream>>>(reinterpret_cast<std::uint64_t* const*>(input_ptrs.data()), layers, C,
                                       row_bytes / 8, step);
    DHB_CHECK(cudaGetLastError());
  }
  unsigned long long take_bad() {
    unsigned long long n = 0;
    DHB_CHECK(cudaMemcpyAsync(&n, bad.data(), sizeof(n), cudaMemcpyDeviceToHost, stream));
    DHB_CHECK(cudaMemsetAsync(bad.data(), 0, sizeof(n), stream));
    DHB_CHECK(cudaStreamSynchronize(stream));
    return n;
  }
};

template <class Base>
write_setup<Base>& setup_of() {
  static std::unique_ptr<write_setup<Base>> s;
  if (!s) s = std::make_unique<write_setup<Base>>();
  return *s;
}

template <class Base>
void bm_write(benchmark::State& state, method x, unsigned C) {
  try {
    auto& st = setup_of<Base>();
    auto& h = *st.h;
    const unsigned steps = kWarmupSteps + g_timed_steps;
    // Fresh requests in slots 0 .. C-1, their pages reserved outside the timing.
    for (std::uint32_t id = 0; id < kSlots; ++id)
      if (h.contains(id)) h.complete(id, st.stream);
    for (std::uint32_t id = 0; id < C; ++id)
      if (!h.admit(id, st.stream)) throw std::runtime_error("admission of request " + std::to_string(id) + " refused");
    h.reserve_ahead(steps + 1, st.stream);
    DHB_CHECK(cudaMemsetAsync(st.bad.data(), 0, sizeof(unsigned long long), st.stream));

    cudaGraph_t graph{};
    cudaGraphExec_t exec{};
    // step: event record nodes inside the graph mark the end of the critical launch on `stream`
    // and the end of the backup launch on the backup stream (timing events, external records).
    cudaEvent_t critical_end{}, backup_end{}, backup_joined{};
    DHB_CHECK(cudaEventCreate(&critical_end));
    DHB_CHECK(cudaEventCreate(&backup_end));
    DHB_CHECK(cudaEventCreateWithFlags(&backup_joined, cudaEventDisableTiming));
    DHB_CHECK(cudaStreamBeginCapture(st.stream, cudaStreamCaptureModeThreadLocal));
    if (x == method::step || x == method::step_inline) {
      dh::cuda::kv_step_write_view v;
      v.slots = st.slots.data();
      v.rows = st.rows.data();  // rows_pitch 0: one row per entry on every source
      v.layer_rows = reinterpret_cast<const std::byte* const*>(st.input_ptrs.data());  // global layer = step layer
      v.max_rows = 1;
      v.capacity = C;
      const cudaStream_t backup = x == method::step ? st.backup_stream : st.stream;
      h.append_step(v, backup, st.stream);
      DHB_CHECK(cudaEventRecordWithFlags(critical_end, st.stream, cudaEventRecordExternal));
      if (x == method::step) {
        DHB_CHECK(cudaEventRecordWithFlags(backup_end, backup, cudaEventRecordExternal));
        // The timing node sits on the backup stream after the hierarchy's own join point: join it
        // too (a capture cannot end with a node of a forked stream unjoined).
        DHB_CHECK(cudaEventRecord(backup_joined, backup));
        DHB_CHECK(cudaStreamWaitEvent(st.stream, backup_joined, 0));
      }
      h.join_backup(st.stream);
    } else if (x == method::dhisparse) {
      for (std::size_t s = 0; s < write_setup<Base>::S; ++s) {
        dh::cuda::kv_write_view v;
        v.slots = st.slots.data();
        v.rows = st.rows.data();
        v.layer_rows = st.source_ptrs[s].data();
        v.max_rows = 1;
        v.capacity = C;
        h.append(s, v, st.stream);
      }
    } else if (x == method::flat) {
      const unsigned vecs = static_cast<unsigned>(write_setup<Base>::row_bytes / 16);
      const unsigned grid = std::min(264u * 8u, (st.layers * C + 7) / 8);
      flat_write<<<grid, 256, 0, st.stream>>>(reinterpret_cast<const int4* const*>(st.input_ptrs.data()),
                                              reinterpret_cast<int4* const*>(st.cache_ptrs.data()), st.slot_mapping.data(),
                                              st.layers, C, vecs);
      DHB_CHECK(cudaGetLastError());
    } else {
      DHB_CHECK(cudaMemcpyAsync(st.backup.span().data(), st.input.data(), st.step_bytes(C), cudaMemcpyDeviceToHost,
                                st.stream));
    }
    DHB_CHECK(cudaStreamEndCapture(st.stream, &graph));
    DHB_CHECK(cudaGraphInstantiate(&exec, graph, 0));

    step_timer timer;
    std::vector<double> us, total_us, backup_us;
    cudaEvent_t step_start{};
    DHB_CHECK(cudaEventCreate(&step_start));
    std::vector<std::int64_t> mapping(kSlots);
    unsigned step = 0;
    auto one_step = [&](bool timed) {
      st.fill(C, step);
      for (std::uint32_t e = 0; e < kSlots; ++e) mapping[e] = static_cast<std::int64_t>(e) * kSlots + step % kSlots;
      DHB_CHECK(cudaMemcpyAsync(st.slot_mapping.data(), mapping.data(), kSlots * 8, cudaMemcpyHostToDevice, st.stream));
      const float ms = timer.time(st.stream, [&] {
        DHB_CHECK(cudaEventRecord(step_start, st.stream));
        DHB_CHECK(cudaGraphLaunch(exec, st.stream));
      });
      float critical_ms = ms, backup_ms = 0.f;
      if (x == method::step || x == method::step_inline)
        DHB_CHECK(cudaEventElapsedTime(&critical_ms, step_start, critical_end));
      if (x == method::step) DHB_CHECK(cudaEventElapsedTime(&backup_ms, critical_end, backup_end));
      if (timed) {
        us.push_back(critical_ms * 1e3);
        total_us.push_back(ms * 1e3);
        backup_us.push_back(backup_ms * 1e3);
        state.SetIterationTime(critical_ms / 1e3);
      }
      // Checks outside the events: every row the step wrote.
      if (x == method::dhisparse || x == method::step || x == method::step_inline) {
        h.check_errors(st.stream);
        for (std::size_t s = 0; s < write_setup<Base>::S; ++s)
          check_source<<<64, 256, 0, st.stream>>>(h.view(s), reinterpret_cast<const std::uint64_t* const*>(st.input_ptrs.data()),
                                                  st.first_layer[s], C, static_cast<long long>(step), st.bad.data());
      } else if (x == method::flat) {
        check_flat<<<264, 256, 0, st.stream>>>(reinterpret_cast<const std::uint64_t* const*>(st.input_ptrs.data()),
                                              reinterpret_cast<std::uint64_t* const*>(st.cache_ptrs.data()),
                                              st.slot_mapping.data(), st.layers, C,
                                              static_cast<unsigned>(write_setup<Base>::row_bytes / 8), st.bad.data());
      }
      DHB_CHECK(cudaGetLastError());
      if (const auto n = st.take_bad(); n != 0)
        throw std::runtime_error(std::string(name_of(x)) + ": " + std::to_string(n) + " rows wrong at step " +
                                 std::to_string(step));
      ++step;
    };
    for (unsigned i = 0; i < kWarmupSteps; ++i) one_step(false);
    for (auto _ : state) one_step(true);
    DHB_CHECK(cudaGraphExecDestroy(exec));
    DHB_CHECK(cudaGraphDestroy(graph));
    DHB_CHECK(cudaEventDestroy(critical_end));
    DHB_CHECK(cudaEventDestroy(backup_end));
    DHB_CHECK(cudaEventDestroy(backup_joined));
    DHB_CHECK(cudaEventDestroy(step_start));
    if (x != method::flat && x != method::d2h_memcpy) {  // the books absorb the device frontiers: one row per step
      h.sync_books(st.stream);
      for (std::uint32_t id = 0; id < C; ++id)
        if (h.frontier(id, 0) != static_cast<std::int64_t>(step))
          throw std::runtime_error("frontier " + std::to_string(h.frontier(id, 0)) + ", expected " + std::to_string(step));
    }

    const step_stats ss = summarize(us);
    static std::map<std::pair<std::string, unsigned>, double> flat_median;
    const std::string layout_name = std::is_same_v<Base, dh::layouts::glm53> ? "glm53" : "deepseek_v32";
    if (x == method::flat) flat_median[{layout_name, C}] = ss.median_us;
    auto& c = state.counters;
    c["C"] = C;
    c["layers"] = st.layers;
    c["step_bytes"] = static_cast<double>(st.step_bytes(C));
    c["median_us"] = ss.median_us;
    c["p10_us"] = ss.p10_us;
    c["p90_us"] = ss.p90_us;
    c["GBps"] = ss.median_us > 0 ? static_cast<double>(st.step_bytes(C)) / (ss.median_us * 1e3) : 0;
    if (x != method::flat && x != method::d2h_memcpy && flat_median.contains({layout_name, C}))
      c["vs_flat"] = ss.median_us / flat_median[{layout_name, C}];
    if (x == method::step || x == method::step_inline) c["total_us"] = summarize(total_us).median_us;
    if (x == method::step) {
      const double b = summarize(backup_us).median_us;
      c["backup_us"] = b;
      c["backup_GBps"] = b > 0 ? static_cast<double>(st.step_bytes(C)) / (b * 1e3) : 0;
    }
    state.SetLabel(layout_name + "/" + name_of(x));
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

void parse_own_flags(int& argc, char** argv) {
  int out = 1;
  for (int i = 1; i < argc; ++i) {
    unsigned v = 0;
    if (std::sscanf(argv[i], "--dh_timed_steps=%u", &v) == 1) g_timed_steps = std::clamp(v, 5u, 200u);
    else argv[out++] = argv[i];
  }
  argc = out;
}

template <class Base>
void register_layout(const char* name) {
  for (std::uint32_t C : kBatches)
    for (method x : {method::flat, method::dhisparse, method::step, method::step_inline,
                     method::d2h_memcpy}) {  // flat first: vs_flat
      const std::string full = std::string(name) + "/" + name_of(x) + "/C:" + std::to_string(C);
      benchmark::RegisterBenchmark(full.c_str(), [x, C](benchmark::State& s) { bm_write<Base>(s, x, C); })
          ->UseManualTime()
          ->Iterations(g_timed_steps)
          ->Unit(benchmark::kMicrosecond);
    }
}

}  // namespace

int main(int argc, char** argv) {
  parse_own_flags(argc, argv);
  register_layout<dh::layouts::glm53>("glm53");
  register_layout<dh::layouts::deepseek_v32>("deepseek_v32");
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0)
    std::fprintf(stderr, "bench_cuda_write: no CUDA device (every benchmark will fail)\n");
  benchmark::AddCustomContext("dhisparse_timed_steps", std::to_string(g_timed_steps));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
