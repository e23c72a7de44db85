// bench_cuda_write: the write part of an engine's decode step on the CUDA backend. Every admitted
// request writes one new row into every payload layer of every source, replayed from a CUDA graph
// step after step; and the write part of a speculative round (stage the block, commit the accepted
// prefix). See docs/design.md ("Batched writes").
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
//   spec        a speculative round of every request on every source, one graph: `stage_step`
//               (the block's K rows into the tail ring), a `verify` per source (not a write: its
//               time is left out), `commit_step` with the host backup forked as for `step`.
//               median_us is the round's write critical path: stage + commit (to the event after
//               the critical commit launch); stage_us, commit_us apart; total_us the whole graph.
//               K by load as in the paper (8 up to C 32, 6 at C 64, 4 from C 128); entry e
//               accepts (e + round) % K proposals, so every acceptance 0 .. K-1 occurs each round
//               and a request commits (K + 1) / 2 rows a round on average
//   flat_block  baseline of spec: ONE kernel writing the round's C x K rows of every layer into the
//               flat cache (an engine without a hierarchy writes the block's KV in place during the
//               verify forward and has nothing to commit)
//
// Layouts: the sources of layouts::glm53 (21 sources, 78 payload layers, 576-byte rows) and
// layouts::deepseek_v32 (61 sources, 656-byte rows), with top_k and B cut to 64 (writes do not
// depend on them; the pools stay small enough for C = 256 slots). C in {1, 32, 128, 256}. Times are
// CUDA-event medians of graph replays. After every timed step, outside the events, every written
// row is checked on the device: tail row and host-store row (dhisparse; spec: every committed row,
// at the frontier the benchmark's own model expects) or flat-cache row (flat) against the step's
// input bytes, which change every step.
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
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include <dhisparse/cuda/hierarchy.cuh>
#include <dhisparse/cuda/kv_write.cuh>
#include <dhisparse/cuda/verify_batch.cuh>
#include <dhisparse/layouts/deepseek_v32.hpp>
#include <dhisparse/layouts/glm53.hpp>

#include "detail/common.cuh"

namespace {

using namespace dhisparse_bench;
namespace dh = dhisparse;

constexpr std::uint32_t kSlots = 256;
constexpr std::uint32_t kWarmupSteps = 5;
constexpr std::array<std::uint32_t, 4> kBatches{1, 32, 128, 256};
constexpr std::uint32_t kMaxBlock = 8;  ///< K_max of the speculative hierarchy
std::uint32_t g_timed_steps = 100;

/// Draft block by load, the paper's schedule: 8 up to C 32, 6 at C 64, 4 from C 128.
constexpr std::uint32_t block_of(std::uint32_t C) { return C <= 32 ? 8u : C <= 64 ? 6u : 4u; }
/// Proposals entry e accepts in round `round` of a block of K: every value 0 .. K-1 each round.
constexpr std::int32_t accepted_of(std::uint32_t e, std::uint32_t round, std::uint32_t K) {
  return static_cast<std::int32_t>((e + round) % K);
}

/// The sources and consumers of `Base` with a small top_k / B: the write path is the same.
template <class Base>
struct write_layout {
  static constexpr std::size_t top_k = 64;
  static constexpr std::size_t page_rows = Base::page_rows;
  static constexpr auto sources = Base::sources;
  static constexpr auto consumers = Base::consumers;
};

enum class method { dhisparse, step, step_inline, flat, d2h_memcpy, spec, flat_block };
const char* name_of(method x) {
  switch (x) {
    case method::dhisparse: return "dhisparse";
    case method::step: return "step";
    case method::step_inline: return "step_inline";
    case method::flat: return "flat";
    case method::spec: return "spec";
    case method::flat_block: return "flat_block";
    default: return "d2h_memcpy";
  }
}
constexpr bool writes_hierarchy(method x) {
  return x == method::dhisparse || x == method::step || x == method::step_inline || x == method::spec;
}

// --- device kernels ------------------------------------------------------------------------------

/// Step input: row e (< n) of global layer g holds words of (step, g, e).
__global__ void fill_input(std::uint64_t* const* in, unsigned layers, unsigned n, unsigned words, unsigned step) {
  const std::size_t total = static_cast<std::size_t>(layers) * n * words;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const auto g = static_cast<unsigned>(i / (static_cast<std::size_t>(n) * words));
    const std::size_t rest = i - static_cast<std::size_t>(g) * n * words;
    in[g][rest] = row_word(step * 131u + g, static_cast<std::uint32_t>(rest / words), static_cast<std::uint32_t>(rest % words));
  }
}

/// The flat baseline: one warp per (layer, input row) of n rows, 16-byte vectors.
__global__ void __launch_bounds__(256) flat_write(const int4* const* in, int4* const* cache, const std::int64_t* slot_mapping,
                                                  unsigned layers, unsigned n, unsigned vecs) {
  const unsigned lane = threadIdx.x & 31u;
  const unsigned warps = (gridDim.x * blockDim.x) >> 5;
  for (unsigned u = (blockIdx.x * blockDim.x + threadIdx.x) >> 5; u < layers * n; u += warps) {
    const unsigned g = u / n, e = u - g * n;
    const int4* src = in[g] + static_cast<std::size_t>(e) * vecs;
    int4* dst = cache[g] + static_cast<std::size_t>(slot_mapping[e]) * vecs;
    for (unsigned v = lane; v < vecs; v += 32) dst[v] = src[v];
  }
}

/// Counts rows of the flat cache that differ from the input (n rows a layer).
__global__ void check_flat(const std::uint64_t* const* in, std::uint64_t* const* cache, const std::int64_t* slot_mapping,
                           unsigned layers, unsigned n, unsigned words, unsigned long long* bad) {
  for (unsigned u = blockIdx.x * blockDim.x + threadIdx.x; u < layers * n; u += gridDim.x * blockDim.x) {
    const unsigned g = u / n, e = u - g * n;
    for (unsigned w = 0; w < words; ++w)
      if (cache[g][static_cast<std::size_t>(slot_mapping[e]) * words + w] != in[g][static_cast<std::size_t>(e) * words + w]) {
        atomicAdd(bad, 1ull);
        break;
      }
  }
}

/// Whether row `row` of payload layer l of `slot` holds `want` both in the tail ring and in the
/// host store (a reserved page).
template <class View>
__device__ bool row_written(const View& v, unsigned l, unsigned slot, long long row, const std::uint64_t* want) {
  const std::int32_t hp = v.host_page[static_cast<std::size_t>(slot) * v.pages_per_request + row / v.page_rows];
  if (hp < 0) return false;
  const auto* tail = reinterpret_cast<const std::uint64_t*>(v.layer_pool[l] +
                                                            static_cast<std::size_t>(v.space.tail(slot, row)) * v.row_bytes);
  const auto* host = reinterpret_cast<const std::uint64_t*>(
      v.host_store + static_cast<std::uint64_t>(hp) * v.page_bytes +
      (static_cast<std::uint64_t>(l) * v.page_rows + static_cast<std::uint64_t>(row) % v.page_rows) * v.row_bytes);
  for (unsigned w = 0; w < v.row_bytes / 8u; ++w)
    if (tail[w] != want[w] || host[w] != want[w]) return false;
  return true;
}

/// Counts rows of one source whose tail row or host-store row differs from the input (row `row`
/// of slots 0 .. C-1; input layer l of the source is global layer first_layer + l).
template <class View>
__global__ void check_source(View v, const std::uint64_t* const* in, unsigned first_layer, unsigned C, long long row,
                             unsigned long long* bad) {
  const unsigned words = v.row_bytes / 8u;
  for (unsigned u = blockIdx.x * blockDim.x + threadIdx.x; u < v.layers * C; u += gridDim.x * blockDim.x) {
    const unsigned l = u / C, slot = u - l * C;
    if (!row_written(v, l, slot, row, in[first_layer + l] + static_cast<std::size_t>(slot) * words)) atomicAdd(bad, 1ull);
  }
}

/// Counts committed rows of one source whose tail row or host-store row differs from the round's
/// input: entry e (slot e) committed block rows i <= accepted[e] at rows frontier_before[e] + i
/// (the benchmark's model), read from input row e * K + i.
template <class View>
__global__ void check_commit(View v, const std::uint64_t* const* in, unsigned first_layer, unsigned C, unsigned K,
                             const std::int64_t* frontier_before, const std::int32_t* accepted, unsigned long long* bad) {
  const unsigned words = v.row_bytes / 8u;
  for (unsigned u = blockIdx.x * blockDim.x + threadIdx.x; u < v.layers * C * K; u += gridDim.x * blockDim.x) {
    const unsigned l = u / (C * K), rest = u - l * C * K, slot = rest / K, i = rest - slot * K;
    if (static_cast<std::int32_t>(i) > accepted[slot]) continue;
    const std::uint64_t* want = in[first_layer + l] + static_cast<std::size_t>(slot * K + i) * words;
    if (!row_written(v, l, slot, frontier_before[slot] + i, want)) atomicAdd(bad, 1ull);
  }
}

// --- one layout's setup ---------------------------------------------------------------------------

template <class Base>
struct write_setup {
  using L = write_layout<Base>;
  using H = dh::cuda::hierarchy<L, dh::lru_hot_cache<64>>;
  static constexpr std::size_t S = dh::source_count<L>;
  static constexpr std::size_t row_bytes = L::sources[0].row_bytes;  // uniform in both layouts
  static constexpr std::uint32_t input_rows = kSlots * kMaxBlock;  ///< per global layer
  unsigned layers = 0;
  cudaStream_t stream{}, backup_stream{};
  std::unique_ptr<H> h;  // one hierarchy at a time (see `hierarchy`): the decode one or the speculative one
  bool h_speculative = false;
  dh::cuda::device_buffer<std::byte> input;                // [global layer][input_rows][row_bytes]
  dh::cuda::device_buffer<std::byte*> input_ptrs;          // [global layer]
  dh::cuda::device_buffer<std::byte> cache;                // flat baseline: [global layer][kSlots * kSlots rows]
  dh::cuda::device_buffer<std::byte*> cache_ptrs;
  dh::cuda::device_buffer<std::int64_t> slot_mapping{input_rows};
  dh::cuda::device_buffer<std::int32_t> slots{kSlots}, rows{kSlots};
  dh::cuda::device_buffer<std::int32_t> counts{kSlots}, accepted{kSlots};  // spec: block and acceptance per entry
  dh::cuda::device_buffer<std::int64_t> frontier_before{kSlots};           // spec: the model's frontiers
  dh::cuda::device_verify_batch verify{kSlots, kMaxBlock, 1};               // spec: one selection a query
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
    const std::size_t layer_bytes = static_cast<std::size_t>(input_rows) * row_bytes;
    const std::size_t cache_layer_bytes = static_cast<std::size_t>(kSlots) * kSlots * row_bytes;
    input = dh::cuda::device_buffer<std::byte>(layers * layer_bytes);
    cache = dh::cuda::device_buffer<std::byte>(layers * cache_layer_bytes);
    std::vector<std::byte*> ip(layers), cp(layers);
    for (unsigned g = 0; g < layers; ++g) {
      ip[g] = input.data() + g * layer_bytes;
      cp[g] = cache.data() + g * cache_layer_bytes;
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
    backup = dh::cuda::pinned_buffer(step_bytes(kSlots));
    std::vector<std::int32_t> one(kSlots, 1), ids(kSlots);
    for (std::uint32_t e = 0; e < kSlots; ++e) ids[e] = static_cast<std::int32_t>(e);
    DHB_CHECK(cudaMemcpy(slots.data(), ids.data(), kSlots * 4, cudaMemcpyHostToDevice));  // entry e: slot e
    DHB_CHECK(cudaMemcpy(rows.data(), one.data(), kSlots * 4, cudaMemcpyHostToDevice));   // decode: one row
  }
  /// The hierarchy of a method: a speculative one (K_max = kMaxBlock, so verify books exist) for
  /// spec, a plain one otherwise (its writes keep no round books). Made on first use; only one is
  /// alive at a time (host stores of several GB each).
  H& hierarchy(bool speculative) {
    if (!h || h_speculative != speculative) {
      h.reset();
      dh::hierarchy_config cfg;
      cfg.max_requests = kSlots;
      cfg.tail_rows = 64;
      const std::uint32_t steps = kWarmupSteps + g_timed_steps + 1;
      if (speculative) {
        cfg.max_block = kMaxBlock;
        cfg.max_rows = steps * kMaxBlock + kMaxBlock;
        // A round commits (K + 1) / 2 rows on average (accepted_of); K = 4 at C 256, plus one
        // round reserved ahead and the page a history starts in.
        cfg.host_pages = kSlots * ((steps * 5 / 2 + 63) / 64 + 2);
      } else {
        cfg.max_rows = 1024;
        cfg.host_pages = kSlots * ((kWarmupSteps + 200 + 2 + 63) / 64 + 1);  // one configuration's rows
      }
      h = std::make_unique<H>(cfg, stream);
      h_speculative = speculative;
    }
    return *h;
  }
  ~write_setup() {
    h.reset();
    cudaStreamDestroy(backup_stream);
    cudaStreamDestroy(stream);
  }
  /// Bytes of n rows on every layer.
  std::size_t step_bytes(unsigned n) const { return static_cast<std::size_t>(layers) * n * row_bytes; }
  /// New input: the first n rows of every layer.
  void fill(unsigned n, unsigned step) {
    fill_input<<<264, 256, 0, stream>>>(reinterpret_cast<std::uint64_t* const*>(input_ptrs.data()), layers, n,
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
    constexpr std::size_t S = write_setup<Base>::S;
    const bool spec = x == method::spec;
    const unsigned K = spec || x == method::flat_block ? block_of(C) : 1u;  // rows per entry a step
    const unsigned n = C * K;                                                // input rows per layer a step
    const unsigned steps = kWarmupSteps + g_timed_steps;
    typename write_setup<Base>::H* hp = nullptr;
    std::vector<std::int64_t> model_frontier(C, 0);  // spec: committed rows of each request (all sources)
    if (writes_hierarchy(x)) {
      auto& h = st.hierarchy(spec);
      hp = &h;
      // Fresh requests in slots 0 .. C-1, their pages reserved outside the timing.
      for (std::uint32_t id = 0; id < kSlots; ++id)
        if (h.contains(id)) h.complete(id, st.stream);
      for (std::uint32_t id = 0; id < C; ++id)
        if (!h.admit(id, st.stream)) throw std::runtime_error("admission of request " + std::to_string(id) + " refused");
      if (!spec) h.reserve_ahead(steps + 1, st.stream);
      if (spec) {
        // Every round: entry e (slot e) stages K positions, its K queries each select row 0 (a
        // history row, or the anchor's own in the first round: the verify is not what is timed).
        const std::vector<std::int32_t> k_of(C, static_cast<std::int32_t>(K));
        DHB_CHECK(cudaMemcpy(st.counts.data(), k_of.data(), C * 4, cudaMemcpyHostToDevice));
        static constexpr dh::row_index row0[1] = {0};
        const std::vector<std::span<const dh::row_index>> queries(K, std::span<const dh::row_index>(row0));
        std::vector<dh::cuda::device_verify_batch::round> rounds(C);
        for (std::uint32_t e = 0; e < C; ++e) rounds[e] = {static_cast<std::int32_t>(h.slot_of(e)), queries};
        st.verify.upload(rounds, st.stream);
      }
    }
    DHB_CHECK(cudaMemsetAsync(st.bad.data(), 0, sizeof(unsigned long long), st.stream));

    cudaGraph_t graph{};
    cudaGraphExec_t exec{};
    // step and spec: event record nodes inside the graph mark the end of the critical launch on
    // `stream` and the end of the backup launch on the backup stream (timing events, external
    // records); spec also the ends of its stage and of its verifies.
    cudaEvent_t critical_end{}, backup_end{}, backup_joined{}, stage_end{}, verify_end{};
    DHB_CHECK(cudaEventCreate(&critical_end));
    DHB_CHECK(cudaEventCreate(&backup_end));
    DHB_CHECK(cudaEventCreate(&stage_end));
    DHB_CHECK(cudaEventCreate(&verify_end));
    DHB_CHECK(cudaEventCreateWithFlags(&backup_joined, cudaEventDisableTiming));
    const auto record_backup_end = [&](cudaStream_t backup) {
      DHB_CHECK(cudaEventRecordWithFlags(backup_end, backup, cudaEventRecordExternal));
      // The timing node sits on the backup stream after the hierarchy's own join point: join it
      // too (a capture cannot end with a node of a forked stream unjoined).
      DHB_CHECK(cudaEventRecord(backup_joined, backup));
      DHB_CHECK(cudaStreamWaitEvent(st.stream, backup_joined, 0));
    };
    DHB_CHECK(cudaStreamBeginCapture(st.stream, cudaStreamCaptureModeThreadLocal));
    if (x == method::step || x == method::step_inline) {
      dh::cuda::kv_step_write_view v;
      v.slots = st.slots.data();
      v.rows = st.rows.data();  // rows_pitch 0: one row per entry on every source
      v.layer_rows = reinterpret_cast<const std::byte* const*>(st.input_ptrs.data());  // global layer = step layer
      v.max_rows = 1;
      v.capacity = C;
      const cudaStream_t backup = x == method::step ? st.backup_stream : st.stream;
      hp->append_step(v, backup, st.stream);
      DHB_CHECK(cudaEventRecordWithFlags(critical_end, st.stream, cudaEventRecordExternal));
      if (x == method::step) record_backup_end(backup);
      hp->join_backup(st.stream);
    } else if (spec) {
      dh::cuda::stage_step_view sv;
      sv.slots = st.slots.data();
      sv.counts = st.counts.data();
      sv.layer_rows = reinterpret_cast<const std::byte* const*>(st.input_ptrs.data());  // entry e at row e * K
      sv.max_block = K;
      sv.capacity = C;
      hp->stage_step(sv, st.stream);
      DHB_CHECK(cudaEventRecordWithFlags(stage_end, st.stream, cudaEventRecordExternal));
      for (std::size_t s = 0; s < S; ++s) hp->verify(s, st.verify.view(), st.stream);
      DHB_CHECK(cudaEventRecordWithFlags(verify_end, st.stream, cudaEventRecordExternal));
      hp->commit_step(dh::cuda::commit_step_view{st.slots.data(), st.accepted.data(), C}, st.backup_stream, st.stream);
      DHB_CHECK(cudaEventRecordWithFlags(critical_end, st.stream, cudaEventRecordExternal));
      record_backup_end(st.backup_stream);
      hp->join_backup(st.stream);
    } else if (x == method::dhisparse) {
      for (std::size_t s = 0; s < S; ++s) {
        dh::cuda::kv_write_view v;
        v.slots = st.slots.data();
        v.rows = st.rows.data();
        v.layer_rows = st.source_ptrs[s].data();
        v.max_rows = 1;
        v.capacity = C;
        hp->append(s, v, st.stream);
      }
    } else if (x == method::flat || x == method::flat_block) {
      const unsigned vecs = static_cast<unsigned>(write_setup<Base>::row_bytes / 16);
      const unsigned grid = std::min(264u * 8u, (st.layers * n + 7) / 8);
      flat_write<<<grid, 256, 0, st.stream>>>(reinterpret_cast<const int4* const*>(st.input_ptrs.data()),
                                              reinterpret_cast<int4* const*>(st.cache_ptrs.data()), st.slot_mapping.data(),
                                              st.layers, n, vecs);
      DHB_CHECK(cudaGetLastError());
    } else {
      DHB_CHECK(cudaMemcpyAsync(st.backup.span().data(), st.input.data(), st.step_bytes(C), cudaMemcpyDeviceToHost,
                                st.stream));
    }
    DHB_CHECK(cudaStreamEndCapture(st.stream, &graph));
    DHB_CHECK(cudaGraphInstantiate(&exec, graph, 0));

    step_timer timer;
    std::vector<double> us, total_us, backup_us, stage_us, commit_us;
    cudaEvent_t step_start{};
    DHB_CHECK(cudaEventCreate(&step_start));
    std::vector<std::int64_t> mapping(write_setup<Base>::input_rows);
    std::vector<std::int32_t> accepted(C);
    // Flat cache rows: decode entry e at e * kSlots + step % kSlots; block row r at r * 32 + step % 32
    // (kSlots * kMaxBlock rows of 32: the same kSlots * kSlots rows a layer).
    const std::uint32_t spread = x == method::flat_block ? kSlots / kMaxBlock : kSlots;
    unsigned step = 0;
    auto one_step = [&](bool timed) {
      st.fill(n, step);
      // Pageable sources: cudaMemcpyAsync has staged them when it returns, so they may change at once.
      if (x == method::flat || x == method::flat_block) {  // the flat kernels' slot mapping
        for (std::uint32_t r = 0; r < n; ++r) mapping[r] = static_cast<std::int64_t>(r) * spread + step % spread;
        DHB_CHECK(cudaMemcpyAsync(st.slot_mapping.data(), mapping.data(), n * 8, cudaMemcpyHostToDevice, st.stream));
      }
      if (spec) {  // the round's acceptances (the sampler's, on the device), host pages for it, the model's frontiers
        for (std::uint32_t e = 0; e < C; ++e) accepted[e] = accepted_of(e, step, K);
        DHB_CHECK(cudaMemcpyAsync(st.accepted.data(), accepted.data(), C * 4, cudaMemcpyHostToDevice, st.stream));
        DHB_CHECK(cudaMemcpyAsync(st.frontier_before.data(), model_frontier.data(), C * 8, cudaMemcpyHostToDevice,
                                  st.stream));
        hp->reserve_ahead(K, st.stream);
      }
      const float ms = timer.time(st.stream, [&] {
        DHB_CHECK(cudaEventRecord(step_start, st.stream));
        DHB_CHECK(cudaGraphLaunch(exec, st.stream));
      });
      float critical_ms = ms, backup_ms = 0.f, stage_ms = 0.f, commit_ms = 0.f;
      if (x == method::step || x == method::step_inline)
        DHB_CHECK(cudaEventElapsedTime(&critical_ms, step_start, critical_end));
      if (x == method::step || spec) DHB_CHECK(cudaEventElapsedTime(&backup_ms, critical_end, backup_end));
      if (spec) {
        DHB_CHECK(cudaEventElapsedTime(&stage_ms, step_start, stage_end));
        DHB_CHECK(cudaEventElapsedTime(&commit_ms, verify_end, critical_end));
        critical_ms = stage_ms + commit_ms;
      }
      if (timed) {
        us.push_back(critical_ms * 1e3);
        total_us.push_back(ms * 1e3);
        backup_us.push_back(backup_ms * 1e3);
        stage_us.push_back(stage_ms * 1e3);
        commit_us.push_back(commit_ms * 1e3);
        state.SetIterationTime(critical_ms / 1e3);
      }
      // Checks outside the events: every row the step wrote (spec: committed).
      const auto in = reinterpret_cast<const std::uint64_t* const*>(st.input_ptrs.data());
      if (spec) {
        hp->check_errors(st.stream);
        for (std::size_t s = 0; s < S; ++s)
          check_commit<<<64, 256, 0, st.stream>>>(hp->view(s), in, st.first_layer[s], C, K, st.frontier_before.data(),
                                                  st.accepted.data(), st.bad.data());
        for (std::uint32_t e = 0; e < C; ++e) model_frontier[e] += accepted[e] + 1;
      } else if (writes_hierarchy(x)) {
        hp->check_errors(st.stream);
        for (std::size_t s = 0; s < S; ++s)
          check_source<<<64, 256, 0, st.stream>>>(hp->view(s), in, st.first_layer[s], C, static_cast<long long>(step),
                                                  st.bad.data());
      } else if (x == method::flat || x == method::flat_block) {
        check_flat<<<264, 256, 0, st.stream>>>(in, reinterpret_cast<std::uint64_t* const*>(st.cache_ptrs.data()),
                                              st.slot_mapping.data(), st.layers, n,
                                              static_cast<unsigned>(write_setup<Base>::row_bytes / 8), st.bad.data());
      }
      DHB_CHECK(cudaGetLastError());
      if (const auto bad = st.take_bad(); bad != 0)
        throw std::runtime_error(std::string(name_of(x)) + ": " + std::to_string(bad) + " rows wrong at step " +
                                 std::to_string(step));
      ++step;
    };
    for (unsigned i = 0; i < kWarmupSteps; ++i) one_step(false);
    for (auto _ : state) one_step(true);
    DHB_CHECK(cudaGraphExecDestroy(exec));
    DHB_CHECK(cudaGraphDestroy(graph));
    for (cudaEvent_t ev : {critical_end, backup_end, backup_joined, stage_end, verify_end, step_start})
      DHB_CHECK(cudaEventDestroy(ev));
    if (writes_hierarchy(x)) {  // the books absorb the device frontiers: one row a step, or the model's
      hp->sync_books(st.stream);
      for (std::uint32_t id = 0; id < C; ++id) {
        const std::int64_t want = spec ? model_frontier[id] : static_cast<std::int64_t>(step);
        for (std::size_t s : {std::size_t{0}, S - 1})
          if (hp->frontier(id, s) != want)
            throw std::runtime_error("request " + std::to_string(id) + " source " + std::to_string(s) + ": frontier " +
                                     std::to_string(hp->frontier(id, s)) + ", expected " + std::to_string(want));
      }
    }

    const step_stats ss = summarize(us);
    static std::map<std::tuple<std::string, unsigned, unsigned>, double> flat_median;  // (layout, C, K)
    const std::string layout_name = std::is_same_v<Base, dh::layouts::glm53> ? "glm53" : "deepseek_v32";
    if (x == method::flat || x == method::flat_block) flat_median[{layout_name, C, K}] = ss.median_us;
    auto& c = state.counters;
    c["C"] = C;
    c["K"] = K;
    c["layers"] = st.layers;
    c["step_bytes"] = static_cast<double>(st.step_bytes(n));
    c["median_us"] = ss.median_us;
    c["p10_us"] = ss.p10_us;
    c["p90_us"] = ss.p90_us;
    c["GBps"] = ss.median_us > 0 ? static_cast<double>(st.step_bytes(n)) / (ss.median_us * 1e3) : 0;
    if (writes_hierarchy(x) && flat_median.contains({layout_name, C, K}))
      c["vs_flat"] = ss.median_us / flat_median[{layout_name, C, K}];
    if (x == method::step || x == method::step_inline || spec) c["total_us"] = summarize(total_us).median_us;
    if (x == method::step || spec) {
      const double b = summarize(backup_us).median_us;
      c["backup_us"] = b;
      // spec: the backup copies the committed rows, (K + 1) / 2 of K a request on average
      const double backed = spec ? static_cast<double>(st.step_bytes(C)) * (K + 1) / 2.0 : static_cast<double>(st.step_bytes(C));
      c["backup_GBps"] = b > 0 ? backed / (b * 1e3) : 0;
    }
    if (spec) {
      c["stage_us"] = summarize(stage_us).median_us;
      c["commit_us"] = summarize(commit_us).median_us;
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
  const auto add = [name](method x, std::uint32_t C) {
    const std::string full = std::string(name) + "/" + name_of(x) + "/C:" + std::to_string(C);
    benchmark::RegisterBenchmark(full.c_str(), [x, C](benchmark::State& s) { bm_write<Base>(s, x, C); })
        ->UseManualTime()
        ->Iterations(g_timed_steps)
        ->Unit(benchmark::kMicrosecond);
  };
  // Baselines first (vs_flat); the speculative rounds after the decode steps (one hierarchy at a time).
  for (std::uint32_t C : kBatches)
    for (method x : {method::flat, method::dhisparse, method::step, method::step_inline, method::d2h_memcpy}) add(x, C);
  for (std::uint32_t C : kBatches)
    for (method x : {method::flat_block, method::spec}) add(x, C);
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
