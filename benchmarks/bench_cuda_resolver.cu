// bench_cuda_resolver: one decode step's resolve for a whole batch, dhisparse's fused CUDA
// resolver against same-run baselines, on fresh misses every step. See docs/benchmarks.md.
//
//   pinned_memcpy        cudaMemcpyAsync H2D of a 1 GiB pinned buffer (PCIe ceiling)
//   resident             every row in HBM: location = request base + row (C*k locations)
//   naive_gather         flat warp-per-row zero-copy gather of exactly the step's missing rows
//   one_cta_per_request  the public HiSparse design (benchmarks/detail/one_cta_per_request.cuh)
//   dhisparse            dhisparse::cuda::hierarchy::resolve through the raw batch view
//   dhisparse_graph      the same resolve captured once in a CUDA graph and replayed
//                        (only at ~0 misses; informational)
//   indexer              a stand-in for the engine's indexer: a kernel that copies the step's
//                        selections into the batch buffer (only at ~0 misses)
//   dhisparse_after_indexer       indexer, then the resolve of what it wrote (~0 misses)
//   dhisparse_programmatic        the same with the resolve launched programmatically
//                        (hierarchy::set_programmatic_launch; ~0 misses); both report
//                        added_us, the step's time beyond the indexer's alone
//
// Sweep: C in {1, 8, 32, 128, 256}, misses {0.1%, 5%, 20%} of k, rows of 576 and 656 bytes,
// k = 2048, B = 4096, 100K-row histories, one source with one payload layer.
// One iteration = one step; times are CUDA-event times of that step (UseManualTime); counters
// carry the median, p10 and p90 over the timed steps and ratios against the baselines run
// just before in the same process.
//
// Extra flags (removed before Google Benchmark sees the command line):
//   --dh_timed_steps=N   timed steps per configuration (default 64, at least 20)
//   --dh_warmup_steps=N  warm-up steps after the fill step (default 5, at least 1)
//   --dh_self_copy_units=N  most copy units a batch entry copies with its own CTA (0: every copy
//                        by the whole grid; default: the library's)
//   --dh_flush_l2=0|1    overwrite a buffer of 4x the L2 size before every step, outside the
//                        events (default 1: no method finds rows or state another method or
//                        step left in L2, as after the other kernels of a real decode step)
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include <dhisparse/cuda/hierarchy.cuh>
#include <dhisparse/hierarchy_types.hpp>
#include <dhisparse/layout.hpp>
#include <dhisparse/policies/hot_cache.hpp>
#include <dhisparse/policies/residency.hpp>
#include <dhisparse/types.hpp>

#include "detail/baselines.cuh"
#include "detail/common.cuh"
#include "detail/one_cta_per_request.cuh"
#include "detail/workload.cuh"


namespace {

using namespace dhisparse_bench;

// --- the configuration ----------------------------------------------------------------------------

constexpr std::uint32_t kTopK = 2048;      // k
constexpr std::uint32_t kHotRows = 4096;   // B
constexpr std::uint32_t kPageRows = 64;    // p
constexpr std::uint32_t kTailRows = 64;    // T: one page (the hierarchy's default)
constexpr std::uint32_t kHist = 100000;    // rows of every request's history
constexpr std::size_t kMemcpyBytes = std::size_t(1) << 30;
constexpr int kMemcpyReps = 10;
const std::vector<std::uint32_t> kBatches = {1, 8, 32, 128, 256};
const std::vector<double> kMissRates = {0.001, 0.05, 0.20};
constexpr int kRowBytesA = 576, kRowBytesB = 656;
const std::uint32_t kRequests = 256;       // histories held (= max C)

std::uint32_t g_timed_steps = 64;
std::uint32_t g_warmup_steps = 5;
bool g_flush_l2 = true;
unsigned g_copy_warps = 0;     // --dh_copy_warps: resolver copy warps per CTA (0: library default)
unsigned g_rows_per_warp = 0;  // --dh_rows_per_warp: rows in flight per copying warp (0: library default)
unsigned g_early_copy_warps = 0;     // --dh_early_copy_warps: early-copy warps per CTA (0: library default)
unsigned g_early_rows_per_warp = 0;  // --dh_early_rows_per_warp: rows per early-copy warp (0: library default)
int g_resolver_ctas = 0;  // --dh_resolver_ctas: CTAs per resolve (0: the whole persistent grid)
int g_early_copy_max_batch = -1;  // --dh_early_copy_max_batch: largest early-copy batch (-1: library default)
int g_self_copy_units = -1;  // --dh_self_copy_units: most copy units an entry copies itself (-1: library default)
int g_failures = 0;

std::uint32_t misses_for(double rate) { return static_cast<std::uint32_t>(std::llround(rate * kTopK)); }

/// A one-source, one-payload-layer layout with the benchmark's row size.
template <int RowBytes>
struct bench_layout {
  static constexpr std::size_t top_k = kTopK;
  static constexpr std::size_t page_rows = kPageRows;
  static constexpr std::array<dhisparse::source_desc, 1> sources{{{RowBytes, 1, 1, 0}}};
  static constexpr std::array<dhisparse::consumer_desc, 1> consumers{{{0, dhisparse::consumer_kind::reindex, 0}}};
};
static_assert(dhisparse::valid_layout<bench_layout<kRowBytesA>> && dhisparse::valid_layout<bench_layout<kRowBytesB>>);

enum class method {
  resident,
  naive_gather,
  one_cta_per_request,
  dhisparse,
  dhisparse_graph,
  indexer,
  dhisparse_after_indexer,
  dhisparse_programmatic
};
/// Methods that run dhisparse's resolver (and share its cache state).
bool runs_dhisparse(method m) {
  return m == method::dhisparse || m == method::dhisparse_graph || m == method::dhisparse_after_indexer ||
         m == method::dhisparse_programmatic;
}
/// Methods whose timed step starts with the indexer stand-in.
bool after_indexer(method m) { return m == method::dhisparse_after_indexer || m == method::dhisparse_programmatic; }
const char* name_of(method m) {
  switch (m) {
    case method::resident: return "resident";
    case method::naive_gather: return "naive_gather";
    case method::one_cta_per_request: return "one_cta_per_request";
    case method::dhisparse: return "dhisparse";
    case method::dhisparse_graph: return "dhisparse_graph";
    case method::indexer: return "indexer";
    case method::dhisparse_after_indexer: return "dhisparse_after_indexer";
    case method::dhisparse_programmatic: return "dhisparse_programmatic";
  }
  return "?";
}
/// Which cache state a method's steps change: two methods on one state cannot share a stream
/// (the second would find the first one's "fresh" rows cached).
const char* state_of(method m) { return runs_dhisparse(m) ? "dhisparse" : name_of(m); }

// --- same-run results, for the ratio counters ----------------------------------------------------

struct measured {
  double median_us = 0, host_gbps = 0;
};
std::map<std::tuple<int, std::uint32_t, std::uint32_t, std::string>, measured> g_results;  // (rb, m, C, method)
double g_memcpy_gbps = 0;

const measured* result_of(int rb, std::uint32_t m, std::uint32_t C, method x) {
  auto it = g_results.find({rb, m, C, name_of(x)});
  return it == g_results.end() ? nullptr : &it->second;
}

// --- shared host memory ------------------------------------------------------------------------

/// The pinned host history of the baselines, [request][row][row bytes], sized for the larger row
/// and reused by both row sizes (pinned memory is the scarce resource: see docs/benchmarks.md).
pinned_buffer& pinned_history() {
  static pinned_buffer buf(std::size_t(kRequests) * kHist * std::max(kRowBytesA, kRowBytesB));
  return buf;
}

int sm_count() {
  static int n = [] {
    int dev = 0, v = 0;
    DHB_CHECK(cudaGetDevice(&dev));
    DHB_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev));
    return v;
  }();
  return n;
}

// =================================================================================================
// dhisparse adapter: every use of the dhisparse CUDA API is in this section.
// =================================================================================================
template <int RowBytes>
class dh_adapter {
 public:
  using hierarchy = dhisparse::cuda::hierarchy<bench_layout<RowBytes>, dhisparse::lru_hot_cache<kHotRows>,
                                               dhisparse::fixed_budget_policy>;

  static dhisparse::hierarchy_config config(std::uint32_t requests) {
    dhisparse::hierarchy_config cfg;
    cfg.max_requests = requests;
    cfg.max_rows = kHist;
    cfg.tail_rows = kTailRows;
    return cfg;
  }
  /// Pinned host bytes the hierarchy allocates (its host store and staging).
  static std::size_t pinned_bytes(std::uint32_t requests) { return hierarchy::requirements(config(requests)).pinned_bytes; }

  /// Admits requests 0..N-1 (request id = benchmark request index) and appends each whole history
  /// with the device-accessible `append` overload, reading the pinned host history in chunks.
  dh_adapter(std::uint32_t requests, const std::byte* history, cudaStream_t s) : stream_(s) {
    h_ = std::make_unique<hierarchy>(config(requests), s);
    if (g_copy_warps != 0 || g_rows_per_warp != 0) h_->set_copy_shape(g_copy_warps, g_rows_per_warp);
    if (g_early_copy_warps != 0 || g_early_rows_per_warp != 0) {
      const dhisparse::cuda::resolve_params defaults;
      h_->set_early_copy_shape(g_early_copy_warps != 0 ? g_early_copy_warps : defaults.early_copy_warps,
                               g_early_rows_per_warp != 0 ? g_early_rows_per_warp : defaults.early_rows_per_warp);
    }
    if (g_early_copy_max_batch >= 0) h_->set_early_copy_max_batch(static_cast<unsigned>(g_early_copy_max_batch));
    if (g_resolver_ctas > 0) h_->set_resolver_ctas(static_cast<unsigned>(g_resolver_ctas));
    if (g_self_copy_units >= 0) h_->set_self_copy_units(static_cast<unsigned>(g_self_copy_units));
    slot_of_.resize(requests);
    constexpr std::size_t chunk = 25000;
    for (std::uint32_t q = 0; q < requests; ++q) {
      const auto a = h_->admit(q, s);
      if (!a) throw std::runtime_error("dhisparse: admission of request " + std::to_string(q) + " waited");
      slot_of_[q] = static_cast<std::int32_t>(a.slot);
      for (std::size_t r = 0; r < kHist; r += chunk) {
        const std::size_t n = std::min<std::size_t>(chunk, kHist - r);
        h_->append(q, 0, history + (std::size_t(q) * kHist + r) * RowBytes, n, s);
      }
    }
    h_->check_errors(s);  // synchronises
    slots_ = device_buffer<std::int32_t>(requests);
    count_ = device_buffer<std::uint32_t>(1);
  }

  /// Prepares the batch of benchmark requests `req`: device slot array and device count.
  void set_batch(const std::vector<std::int32_t>& req) {
    std::vector<std::int32_t> slots(req.size());
    for (std::size_t b = 0; b < req.size(); ++b) slots[b] = slot_of_[static_cast<std::size_t>(req[b])];
    // Resolves already queued on stream_ may still read the previous batch: wait for them, then
    // copy in stream order (stream_ is non-blocking, so a legacy-stream copy would not be ordered).
    DHB_CHECK(cudaStreamSynchronize(stream_));
    DHB_CHECK(cudaMemcpyAsync(slots_.get(), slots.data(), slots.size() * 4, cudaMemcpyHostToDevice, stream_));
    const auto n = static_cast<std::uint32_t>(req.size());
    DHB_CHECK(cudaMemcpyAsync(count_.get(), &n, 4, cudaMemcpyHostToDevice, stream_));
    DHB_CHECK(cudaStreamSynchronize(stream_));  // the host vectors die with this call
    items_ = n;
  }

  /// Enqueues one resolve of the batch through the raw (graph-capturable) batch_view:
  /// selections [items][kTopK] (strided), locations out in selection order.
  void resolve(const std::int32_t* sel, std::int32_t* loc, bool programmatic = false) {
    h_->set_programmatic_launch(programmatic);
    dhisparse::cuda::batch_view v;
    v.slots = slots_.get();
    v.selections = sel;
    v.locations = loc;
    v.count = count_.get();
    v.stride = kTopK;
    v.capacity = items_;
    h_->resolve(0, v, stream_, dhisparse::copy_layers::all);
  }

  /// Device base of payload layer 0 of source 0, and its rows.
  const void* pool() const { return h_->pool(0, 0); }
  std::size_t pool_rows() const { return h_->space().rows(); }

  /// After a resolve (outside timing): throws dhisparse's typed error for a bad entry, otherwise
  /// returns the rows recovered from host by the last launch (sum over entries).
  std::size_t check_last() {
    h_->check_errors(stream_);
    std::size_t bad = 0;
    for (const auto& e : h_->last_errors(0)) bad += e.code != dhisparse::cuda::status_ok;
    if (bad) throw std::runtime_error("dhisparse: " + std::to_string(bad) + " batch entries report an error");
    const auto stats = h_->last_stats(0);
    if (stats.size() != items_)
      throw std::runtime_error("dhisparse: last launch resolved " + std::to_string(stats.size()) + " entries, expected " +
                               std::to_string(items_));
    std::size_t copied = 0;
    for (const auto& st : stats) copied += st.rows_copied;
    return copied;
  }

 private:
  cudaStream_t stream_;
  std::unique_ptr<hierarchy> h_;
  std::vector<std::int32_t> slot_of_;
  device_buffer<std::int32_t> slots_;
  device_buffer<std::uint32_t> count_;
  std::uint32_t items_ = 0;
};

// =================================================================================================
// One phase = one row size: histories, baseline states, the dhisparse hierarchy, the streams.
// =================================================================================================
template <int RowBytes>
class phase {
 public:
  phase() {
    const auto t0 = std::chrono::steady_clock::now();
    DHB_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    // The history: generated in HBM (the resident baseline's copy), then copied to pinned memory.
    resident_ = device_buffer<std::byte>(std::size_t(kRequests) * kHist * RowBytes);
    fill_history_kernel<<<sm_count() * 8, 512, 0, stream_>>>(reinterpret_cast<std::uint64_t*>(resident_.get()),
                                                             kRequests, kHist, RowBytes / 8);
    DHB_CHECK(cudaGetLastError());
    DHB_CHECK(cudaMemcpyAsync(pinned_history().get(), resident_.get(), resident_.bytes(), cudaMemcpyDeviceToHost,
                              stream_));
    DHB_CHECK(cudaStreamSynchronize(stream_));
    walk_ = std::make_unique<history_walk>(kRequests, kHist, kTailRows, kTopK, 0xD1500000ull + RowBytes);
    one_cta_ = std::make_unique<one_cta::resolver<RowBytes, kTopK, kHotRows>>(kRequests, pinned_history().get(),
                                                                               static_cast<int>(kHist));
    const std::uint32_t max_misses = misses_for(*std::max_element(kMissRates.begin(), kMissRates.end()));
    gathered_ = device_buffer<std::byte>(std::size_t(kRequests) * std::max(max_misses, 1u) * RowBytes);
    locations_ = device_buffer<std::int32_t>(std::size_t(kRequests) * kTopK);
    fixed_sel_ = device_buffer<std::int32_t>(std::size_t(kRequests) * kTopK);
    {
      int dev = 0, l2 = 0;
      DHB_CHECK(cudaGetDevice(&dev));
      DHB_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
      flush_ = device_buffer<std::byte>(std::max<std::size_t>(4 * std::size_t(l2), std::size_t(64) << 20));
    }
    try {
      dh_ = std::make_unique<dh_adapter<RowBytes>>(kRequests, pinned_history().get(), stream_);
    } catch (const std::exception& e) {
      dh_error_ = e.what();
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const std::size_t dh_pinned = dh_adapter<RowBytes>::pinned_bytes(kRequests);
    std::fprintf(stderr,
                 "bench_cuda_resolver: row size %d B: %u histories of %u rows; pinned: baseline history %.1f GB + "
                 "dhisparse %.1f GB; HBM resident copy %.1f GB; setup %.1f s%s%s\n",
                 RowBytes, kRequests, kHist, pinned_history().bytes() / 1e9, dh_pinned / 1e9, resident_.bytes() / 1e9,
                 secs, dh_error_.empty() ? "" : "; dhisparse unavailable: ", dh_error_.c_str());
  }
  ~phase() {
    if (graph_exec_) cudaGraphExecDestroy(graph_exec_);
    cudaStreamDestroy(stream_);
  }
  phase(const phase&) = delete;
  phase& operator=(const phase&) = delete;

  /// The stream of configuration (C, m) for a method: the current one unless the method's state
  /// has already consumed it (then a new one, continuing the fresh-row walks).
  stream& stream_for(std::uint32_t C, std::uint32_t m, method x) {
    const std::string state = state_of(x);
    if (!(cur_ && cur_->C == C && cur_->m == m && cur_->timed == g_timed_steps && !consumed_.count(state))) {
      cur_ = std::make_unique<stream>(
          stream_builder::build(*walk_, requests_for(C, kBatches), m, g_warmup_steps, g_timed_steps));
      consumed_.clear();
      graph_for_ = {};
    }
    consumed_.insert(state);
    return *cur_;
  }

  cudaStream_t cuda_stream() const { return stream_; }
  const std::byte* resident() const { return resident_.get(); }
  std::byte* gathered() const { return gathered_.get(); }
  std::int32_t* locations() const { return locations_.get(); }
  std::int32_t* fixed_selection() const { return fixed_sel_.get(); }
  /// Evicts L2 (stream ordered): overwrites a buffer of 4x the L2 size.
  void flush_l2() {
    DHB_CHECK(cudaMemsetAsync(flush_.get(), static_cast<int>(++flushes_ & 0xff), flush_.bytes(), stream_));
  }
  one_cta::resolver<RowBytes, kTopK, kHotRows>& one_cta() { return *one_cta_; }
  verifier& verify() { return verifier_; }
  step_timer& timer() { return timer_; }
  const std::string& dhisparse_error() const { return dh_error_; }
  dh_adapter<RowBytes>& dh() { return *dh_; }
  bool has_dh() const { return dh_ != nullptr; }

  /// The CUDA graph of one dhisparse resolve of the current batch reading fixed_selection().
  cudaGraphExec_t dhisparse_graph(const stream& st) {
    if (graph_exec_ && graph_for_ == std::make_pair(st.serial, st.C)) return graph_exec_;
    if (graph_exec_) {
      cudaGraphExecDestroy(graph_exec_);
      graph_exec_ = nullptr;
    }
    cudaGraph_t g = nullptr;
    DHB_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    try {
      dh_->resolve(fixed_sel_.get(), locations_.get());
    } catch (...) {
      // leave the stream usable: end (and drop) the broken capture before reporting
      if (cudaStreamEndCapture(stream_, &g) == cudaSuccess && g) cudaGraphDestroy(g);
      cudaGetLastError();
      throw;
    }
    DHB_CHECK(cudaStreamEndCapture(stream_, &g));
    const cudaError_t e = cudaGraphInstantiate(&graph_exec_, g, 0);
    cudaGraphDestroy(g);
    DHB_CHECK(e);
    graph_for_ = {st.serial, st.C};
    return graph_exec_;
  }

 private:
  cudaStream_t stream_{};
  device_buffer<std::byte> resident_, gathered_;
  device_buffer<std::int32_t> locations_, fixed_sel_;
  device_buffer<std::byte> flush_;
  unsigned flushes_ = 0;
  std::unique_ptr<history_walk> walk_;
  std::unique_ptr<one_cta::resolver<RowBytes, kTopK, kHotRows>> one_cta_;
  verifier verifier_;
  step_timer timer_;
  std::unique_ptr<stream> cur_;
  std::set<std::string> consumed_;
  cudaGraphExec_t graph_exec_ = nullptr;
  std::pair<std::uint64_t, std::uint32_t> graph_for_{};
  std::string dh_error_;
  std::unique_ptr<dh_adapter<RowBytes>> dh_;
};

// Only one phase lives at a time (each holds a full set of histories).
std::unique_ptr<phase<kRowBytesA>> g_phase_a;
std::unique_ptr<phase<kRowBytesB>> g_phase_b;

template <int RowBytes>
phase<RowBytes>& get_phase() {
  if constexpr (RowBytes == kRowBytesA) {
    if (!g_phase_a) {
      g_phase_b.reset();
      g_phase_a = std::make_unique<phase<kRowBytesA>>();
    }
    return *g_phase_a;
  } else {
    static_assert(RowBytes == kRowBytesB);
    if (!g_phase_b) {
      g_phase_a.reset();
      g_phase_b = std::make_unique<phase<kRowBytesB>>();
    }
    return *g_phase_b;
  }
}

// =================================================================================================
// Benchmarks
// =================================================================================================

void fail(benchmark::State& state, const std::string& what) {
  ++g_failures;
  std::fprintf(stderr, "bench_cuda_resolver: %s\n", what.c_str());
  state.SkipWithError(what.c_str());
}

void bm_pinned_memcpy(benchmark::State& state) {
  try {
    auto& host = pinned_history();
    device_buffer<std::byte> dst(kMemcpyBytes);
    cudaStream_t s;
    DHB_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    step_timer timer;
    for (int i = 0; i < 2; ++i)  // warm-up
      timer.time(s, [&] { DHB_CHECK(cudaMemcpyAsync(dst.get(), host.get(), kMemcpyBytes, cudaMemcpyHostToDevice, s)); });
    std::vector<double> us;
    for (auto _ : state) {
      const float ms =
          timer.time(s, [&] { DHB_CHECK(cudaMemcpyAsync(dst.get(), host.get(), kMemcpyBytes, cudaMemcpyHostToDevice, s)); });
      state.SetIterationTime(ms / 1e3);
      us.push_back(ms * 1e3);
    }
    DHB_CHECK(cudaStreamDestroy(s));
    const step_stats st = summarize(us);
    g_memcpy_gbps = double(kMemcpyBytes) / (st.median_us * 1e3);
    state.SetLabel("pinned_memcpy");
    state.counters["bytes"] = double(kMemcpyBytes);
    state.counters["median_us"] = st.median_us;
    state.counters["p10_us"] = st.p10_us;
    state.counters["p90_us"] = st.p90_us;
    state.counters["GBps"] = g_memcpy_gbps;
    state.SetBytesProcessed(static_cast<std::int64_t>(kMemcpyBytes) * state.iterations());
  } catch (const std::exception& e) {
    fail(state, std::string("pinned_memcpy: ") + e.what());
  }
}

template <int RowBytes>
void bm_resolve(benchmark::State& state, method x, std::uint32_t C, double rate) {
  const std::uint32_t m = misses_for(rate);
  const std::string what = std::string(name_of(x)) + " rb=" + std::to_string(RowBytes) + " C=" + std::to_string(C) +
                           " m=" + std::to_string(m);
  try {
    auto& ph = get_phase<RowBytes>();
    if (runs_dhisparse(x) && !ph.has_dh()) {
      fail(state, what + ": " + ph.dhisparse_error());
      return;
    }
    stream& st = ph.stream_for(C, m, x);
    const cudaStream_t s = ph.cuda_stream();
    const std::uint32_t k = kTopK;
    std::int32_t* loc = ph.locations();
    if (runs_dhisparse(x)) ph.dh().set_batch(st.requests);
    cudaGraphExec_t graph = x == method::dhisparse_graph ? ph.dhisparse_graph(st) : nullptr;

    // Everything that must happen before a step's events (graph inputs are copied in place).
    auto prepare = [&](std::uint32_t step) {
      if (x == method::dhisparse_graph)
        DHB_CHECK(cudaMemcpyAsync(ph.fixed_selection(), st.sel_step_d(step), std::size_t(C) * k * 4,
                                  cudaMemcpyDeviceToDevice, s));
      if (g_flush_l2) ph.flush_l2();
    };
    // The timed work of one step.
    auto enqueue = [&](std::uint32_t step, bool count) {
      switch (x) {
        case method::resident:
          launch_resident(st.sel_step_d(step), loc, st.requests_d.get(), static_cast<int>(C), static_cast<int>(k),
                          static_cast<int>(kHist), s);
          break;
        case method::naive_gather:
          if (step > 0 && m > 0)
            launch_naive_gather<RowBytes>(pinned_history().get(), ph.gathered(), st.miss_step_d(step),
                                          static_cast<int>(C * m), sm_count(), s);
          break;
        case method::one_cta_per_request:
          ph.one_cta().resolve(st.sel_step_d(step), static_cast<int>(k), static_cast<int>(k), st.requests_d.get(),
                               static_cast<int>(C), loc, s, count);
          break;
        case method::dhisparse:
          ph.dh().resolve(st.sel_step_d(step), loc);
          break;
        case method::dhisparse_graph:
          DHB_CHECK(cudaGraphLaunch(graph, s));
          break;
        case method::indexer:
          launch_indexer_standin(st.sel_step_d(step), ph.fixed_selection(), static_cast<int>(C), static_cast<int>(k), s);
          break;
        case method::dhisparse_after_indexer:
        case method::dhisparse_programmatic:
          launch_indexer_standin(st.sel_step_d(step), ph.fixed_selection(), static_cast<int>(C), static_cast<int>(k), s);
          ph.dh().resolve(ph.fixed_selection(), loc, x == method::dhisparse_programmatic);
          break;
      }
    };
    // Outside timing: the step's output holds exactly the selected rows (and the miss count is right).
    auto verify = [&](std::uint32_t step) {
      DHB_CHECK(cudaStreamSynchronize(s));
      DHB_CHECK(cudaGetLastError());
      verifier::result r;
      const std::int32_t* sel = st.sel_step_d(step);
      switch (x) {
        case method::resident:
          r = ph.verify().locations(sel, loc, st.requests_d.get(), static_cast<int>(C), static_cast<int>(k),
                                    static_cast<int>(k), ph.resident(), std::size_t(kRequests) * kHist, RowBytes, s);
          break;
        case method::naive_gather:
          r = ph.verify().gather(st.miss_step_d(step), static_cast<int>(C * m), ph.gathered(), RowBytes, kHist, s);
          break;
        case method::one_cta_per_request: {
          const unsigned got = ph.one_cta().misses_counted(s);
          if (got != C * m)
            throw std::runtime_error("one_cta_per_request recovered " + std::to_string(got) + " rows, expected " +
                                     std::to_string(C * m));
          r = ph.verify().locations(sel, loc, st.requests_d.get(), static_cast<int>(C), static_cast<int>(k),
                                    static_cast<int>(k), ph.one_cta().buffer(), ph.one_cta().buffer_rows(), RowBytes, s);
          break;
        }
        case method::indexer: {
          std::vector<std::int32_t> want(std::size_t(C) * k), have(want.size());
          DHB_CHECK(cudaMemcpy(want.data(), sel, want.size() * 4, cudaMemcpyDeviceToHost));
          DHB_CHECK(cudaMemcpy(have.data(), ph.fixed_selection(), have.size() * 4, cudaMemcpyDeviceToHost));
          r.bad = want == have ? 0 : 1;
          break;
        }
        case method::dhisparse:
        case method::dhisparse_graph:
        case method::dhisparse_after_indexer:
        case method::dhisparse_programmatic: {
          const std::size_t misses = ph.dh().check_last();
          if (misses != std::size_t(C) * m)
            throw std::runtime_error("dhisparse recovered " + std::to_string(misses) + " rows, expected " +
                                     std::to_string(C * m));
          r = ph.verify().locations(sel, loc, st.requests_d.get(), static_cast<int>(C), static_cast<int>(k),
                                    static_cast<int>(k), ph.dh().pool(), ph.dh().pool_rows(), RowBytes, s);
          break;
        }
      }
      if (r.bad)
        throw std::runtime_error(std::string("WRONG BYTES: ") + name_of(x) + " step " + std::to_string(step) + ": " +
                                 std::to_string(r.bad) + " entries do not hold their selected row (first: flat entry " +
                                 std::to_string(r.first) + ")");
    };

    // Fill and warm-up steps (untimed); the last warm-up step is verified.
    for (std::uint32_t step = 0; step < st.first_timed(); ++step) {
      prepare(step);
      enqueue(step, step + 1 == st.first_timed());
      DHB_CHECK(cudaStreamSynchronize(s));
      DHB_CHECK(cudaGetLastError());
    }
    verify(st.first_timed() - 1);

    std::vector<double> us;
    us.reserve(st.timed);
    std::uint32_t step = st.first_timed();
    for (auto _ : state) {
      if (step >= st.steps()) throw std::runtime_error("more iterations than generated steps");
      prepare(step);
      const float ms = ph.timer().time(s, [&] { enqueue(step, false); });
      state.SetIterationTime(ms / 1e3);
      us.push_back(ms * 1e3);
      ++step;
    }
    // The last timed step is verified too (state after many steps).
    if (x == method::one_cta_per_request) {
      // re-run nothing: the miss counter was off; check bytes only
      const auto r = ph.verify().locations(st.sel_step_d(step - 1), loc, st.requests_d.get(), static_cast<int>(C),
                                           static_cast<int>(k), static_cast<int>(k), ph.one_cta().buffer(),
                                           ph.one_cta().buffer_rows(), RowBytes, s);
      if (r.bad) throw std::runtime_error("WRONG BYTES: one_cta_per_request after the timed steps");
    } else {
      verify(step - 1);
    }

    const step_stats ss = summarize(us);
    const double miss_bytes = double(C) * m * RowBytes;
    const bool copies = x != method::resident && x != method::indexer;
    const double gbps = copies && ss.median_us > 0 ? miss_bytes / (ss.median_us * 1e3) : 0;
    g_results[{RowBytes, m, C, name_of(x)}] = {ss.median_us, gbps};

    state.SetLabel(name_of(x));
    auto& c = state.counters;
    c["row_bytes"] = RowBytes;
    c["C"] = C;
    c["k"] = k;
    c["B"] = kHotRows;
    c["miss_pct"] = rate * 100;
    c["misses_per_step"] = double(C) * m;
    c["miss_bytes_per_step"] = miss_bytes;
    c["timed_steps"] = double(us.size());
    c["median_us"] = ss.median_us;
    c["p10_us"] = ss.p10_us;
    c["p90_us"] = ss.p90_us;
    c["min_us"] = ss.min_us;
    c["max_us"] = ss.max_us;
    if (copies) c["host_GBps"] = gbps;
    if (copies && g_memcpy_gbps > 0) c["bw_vs_memcpy"] = gbps / g_memcpy_gbps;
    if (const measured* r = result_of(RowBytes, m, C, method::resident); r && x != method::resident && r->median_us > 0)
      c["vs_resident"] = ss.median_us / r->median_us;
    if (after_indexer(x))
      if (const measured* r = result_of(RowBytes, m, C, method::indexer); r && r->median_us > 0)
        c["added_us"] = ss.median_us - r->median_us;  // the resolve's share of indexer + resolve
    if (runs_dhisparse(x)) {
      if (const measured* r = result_of(RowBytes, m, C, method::one_cta_per_request); r && ss.median_us > 0) {
        c["vs_one_cta"] = ss.median_us / r->median_us;
        c["speedup_vs_one_cta"] = r->median_us / ss.median_us;
      }
    }
  } catch (const std::exception& e) {
    fail(state, what + ": " + e.what());
  }
}

template <int RowBytes>
void register_row_size() {
  for (double rate : kMissRates)
    for (std::uint32_t C : kBatches) {
      // naive_gather reads the same pinned buffer as one_cta_per_request: it runs after it, so that
      // one_cta_per_request meets the step's host pages first (dhisparse reads its own host store).
      std::vector<method> methods = {method::resident, method::one_cta_per_request, method::dhisparse,
                                     method::naive_gather};
      if (misses_for(rate) <= 2)  // latency-bound: launch cost matters
        methods.insert(methods.end(), {method::dhisparse_graph, method::indexer, method::dhisparse_after_indexer,
                                       method::dhisparse_programmatic});
      for (method x : methods) {
        char name[160];
        std::snprintf(name, sizeof name, "resolve/%s/row_bytes:%d/miss_pct:%g/C:%u", name_of(x), RowBytes, rate * 100, C);
        benchmark::RegisterBenchmark(name, [x, C, rate](benchmark::State& s) { bm_resolve<RowBytes>(s, x, C, rate); })
            ->UseManualTime()
            ->Iterations(g_timed_steps)
            ->Unit(benchmark::kMicrosecond);
      }
    }
}

/// Removes --dh_* flags from argv (Google Benchmark rejects flags it does not know).
void parse_own_flags(int& argc, char** argv) {
  int out = 1;
  for (int i = 1; i < argc; ++i) {
    unsigned v = 0;
    if (std::sscanf(argv[i], "--dh_timed_steps=%u", &v) == 1) g_timed_steps = std::max(20u, v);
    else if (std::sscanf(argv[i], "--dh_warmup_steps=%u", &v) == 1) g_warmup_steps = std::max(1u, v);
    else if (std::sscanf(argv[i], "--dh_flush_l2=%u", &v) == 1) g_flush_l2 = v != 0;
    else if (std::sscanf(argv[i], "--dh_copy_warps=%u", &v) == 1) g_copy_warps = v;
    else if (std::sscanf(argv[i], "--dh_rows_per_warp=%u", &v) == 1) g_rows_per_warp = v;
    else if (std::sscanf(argv[i], "--dh_early_copy_warps=%u", &v) == 1) g_early_copy_warps = v;
    else if (std::sscanf(argv[i], "--dh_early_rows_per_warp=%u", &v) == 1) g_early_rows_per_warp = v;
    else if (std::sscanf(argv[i], "--dh_early_copy_max_batch=%u", &v) == 1) g_early_copy_max_batch = static_cast<int>(v);
    else if (std::sscanf(argv[i], "--dh_self_copy_units=%u", &v) == 1) g_self_copy_units = static_cast<int>(v);
    else if (std::sscanf(argv[i], "--dh_resolver_ctas=%u", &v) == 1) g_resolver_ctas = static_cast<int>(v);
    else argv[out++] = argv[i];
  }
  argc = out;
}

}  // namespace

/// Never-selected rows one request needs in the worst case (it serves two batch sizes, each with
/// one stream per miss rate plus the graph variant's own stream at ~0 misses).
std::uint64_t fresh_rows_needed() {
  std::uint64_t per_config = 0;
  for (double rate : kMissRates) per_config += std::uint64_t(misses_for(rate)) * (misses_for(rate) <= 2 ? 2 : 1);
  return kTopK + 2 * std::uint64_t(g_warmup_steps + g_timed_steps) * per_config;
}

int main(int argc, char** argv) {
  parse_own_flags(argc, argv);
  if (fresh_rows_needed() > kHist - kTailRows) {
    std::fprintf(stderr,
                 "bench_cuda_resolver: %u warm-up + %u timed steps need %llu never-selected rows per request, a "
                 "history has %u; use fewer steps\n",
                 g_warmup_steps, g_timed_steps, static_cast<unsigned long long>(fresh_rows_needed()), kHist - kTailRows);
    return 2;
  }
  benchmark::RegisterBenchmark("pinned_memcpy/bytes:1GiB", bm_pinned_memcpy)
      ->UseManualTime()
      ->Iterations(kMemcpyReps)
      ->Unit(benchmark::kMicrosecond);
  register_row_size<kRowBytesA>();
  register_row_size<kRowBytesB>();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0)
    std::fprintf(stderr, "bench_cuda_resolver: no CUDA device (every benchmark will fail)\n");
  benchmark::AddCustomContext("dhisparse_timed_steps", std::to_string(g_timed_steps));
  benchmark::AddCustomContext("dhisparse_warmup_steps", std::to_string(g_warmup_steps));
  benchmark::AddCustomContext("dhisparse_history_rows", std::to_string(kHist));
  benchmark::AddCustomContext("dhisparse_flush_l2", g_flush_l2 ? "1" : "0");
  benchmark::AddCustomContext("dhisparse_early_copy_max_batch",
                              g_early_copy_max_batch < 0 ? "default" : std::to_string(g_early_copy_max_batch));
  benchmark::AddCustomContext("dhisparse_self_copy_units",
                              g_self_copy_units < 0 ? "default" : std::to_string(g_self_copy_units));
  benchmark::AddCustomContext("dhisparse_resolver_ctas", g_resolver_ctas == 0 ? "grid" : std::to_string(g_resolver_ctas));
  benchmark::AddCustomContext("dhisparse_copy_shape",
                              std::to_string(g_copy_warps) + " warps x " + std::to_string(g_rows_per_warp) + " rows");
  benchmark::AddCustomContext("dhisparse_early_copy_shape", std::to_string(g_early_copy_warps) + " warps x " +
                                                                std::to_string(g_early_rows_per_warp) + " rows");
  benchmark::RunSpecifiedBenchmarks();
  g_phase_a.reset();
  g_phase_b.reset();
  benchmark::Shutdown();
  if (g_failures) {
    std::fprintf(stderr, "bench_cuda_resolver: %d configuration(s) failed (see error_message in the output)\n",
                 g_failures);
    return 1;
  }
  return 0;
}
