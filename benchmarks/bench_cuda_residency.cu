// bench_cuda_residency: load-adaptive residency on the CUDA backend (cuda/residency_manager.cuh),
// with the locality-bearing selection generator (workload/selection_generator.hpp, as the demo).
// See docs/benchmarks.md.
//
//   load_share/<policy>/load:<low|high>/C:<n>
//       share of selected rows resolved directly (tail or optional history), from the hot cache and
//       from host, adaptive vs fixed-budget, at low load (every imported page fits the optional
//       pool) and high load (a fraction does). Counts, not timings; also the median step time.
//   load_step/<policy>
//       a load step: 8 new requests arrive at once while 3 hold their whole history on the GPU.
//       Memory released by whole-request reclaim (MiB) and time to admit (wall time from the first
//       admit call until admitted; between attempts one decode step runs and `poll()` is called),
//       median and max over the 8 requests, and the decode steps it took.
//   resolve/<with_optional|without_optional>/C:<8|32|128>
//       one decode step's resolve for C requests with all imported history resident as optional
//       history (adaptive policy, a pool large enough) vs none (fixed budget): CUDA-event medians,
//       L2 flushed before every step outside the events, fresh selections every step.
//
// Every configuration: k = 2048, B = 4096, 576-byte rows, one source with one payload layer,
// 32K-row imported histories (from device buffers: what a disaggregated prefill hands over).
// Every resolved row is checked on the device against the generated content outside timing.
// Extra flags: --dh_timed_steps=N (default 30), --dh_warmup_steps=N (default 5).
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <dhisparse/cuda/hierarchy.cuh>
#include <dhisparse/cuda/residency_manager.cuh>
#include <dhisparse/layout.hpp>
#include <dhisparse/policies/hot_cache.hpp>
#include <dhisparse/policies/residency.hpp>
#include <dhisparse/workload/selection_generator.hpp>

#include "detail/common.cuh"

namespace {

using namespace dhisparse_bench;
namespace dh = ::dhisparse;

constexpr std::size_t kTopK = 2048;
constexpr std::size_t kRowBytes = 576;
constexpr std::size_t kWords = kRowBytes / 8;
constexpr std::size_t kPageRows = 64;
constexpr std::size_t kHist = 32768;  // imported rows per request (512 pages)
constexpr std::size_t kHistPages = kHist / kPageRows;
constexpr std::size_t kRequired = 8, kReserve = 16;

struct bench_layout {
  static constexpr std::size_t top_k = kTopK;
  static constexpr std::size_t page_rows = kPageRows;
  static constexpr std::array<dh::source_desc, 1> sources{{{kRowBytes, 1, 1, 132}}};
  static constexpr std::array<dh::consumer_desc, 1> consumers{{{0, dh::consumer_kind::reindex, 0}}};
};
static_assert(dh::valid_layout<bench_layout>);
using Device = dh::cuda::hierarchy<bench_layout, dh::lru_hot_cache<4096>>;
using Adaptive = dh::adaptive_policy<>;
using Fixed = dh::fixed_budget_policy;

unsigned g_timed_steps = 30, g_warmup_steps = 5;
int g_failures = 0;

void fail(benchmark::State& state, const std::string& what) {
  ++g_failures;
  state.SkipWithError(what.c_str());
}

/// Rows [first, first + count) of request q, in the layout of row_word.
__global__ void fill_rows_kernel(std::uint64_t* dst, std::uint32_t q, std::uint32_t first, std::uint32_t count) {
  const std::size_t total = std::size_t(count) * kWords;
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < total; i += std::size_t(gridDim.x) * blockDim.x) {
    const auto r = static_cast<std::uint32_t>(i / kWords), w = static_cast<std::uint32_t>(i % kWords);
    dst[i] = row_word(q, first + r, w);
  }
}

dh::workload::selection_params selection_shape() {
  dh::workload::selection_params p;  // the defaults are for k = 2048 (GLM-5.3), as in the demo
  p.top_k = kTopK;
  p.remembered_steps = 0;
  return p;
}

/// C requests under residency policy P, admitted with imported 32K-row histories, decoding with
/// the locality generator. One source, one payload layer.
template <class P>
class scenario {
 public:
  using Manager = dh::cuda::residency_manager<Device, P>;

  scenario(std::size_t max_requests, std::size_t optional_pages, std::uint64_t seed)
      : stream_(make_stream()), m_(config(max_requests, optional_pages), {kRequired, kReserve}, stream_),
        prefill_(kHist * kWords), append_row_(kWords), sel_(max_requests * kTopK), loc_(max_requests * kTopK),
        slots_(max_requests), req_(max_requests), count_(1), seed_(seed) {
    int l2 = 0, dev = 0;
    DHB_CHECK(cudaGetDevice(&dev));
    DHB_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
    flush_ = device_buffer<std::byte>(std::max<std::size_t>(4 * std::size_t(l2), std::size_t(64) << 20));
  }
  ~scenario() {
    try {
      m_.drain();
    } catch (...) {  // a failed configuration already reported its error
    }
  }

  Manager& manager() { return m_; }
  cudaStream_t stream() const { return stream_; }
  std::size_t live() const { return ids_.size(); }

  /// One admission attempt of request index q (its prefill generated on the device, imported from
  /// there). Returns the status.
  dh::admit_status try_admit(std::uint32_t q) {
    fill_rows_kernel<<<264, 256, 0, stream_>>>(prefill_.get(), q, 0, kHist);
    DHB_CHECK(cudaGetLastError());
    const std::array<dh::cuda::device_history_import, 1> imp{
        {{reinterpret_cast<const std::byte*>(prefill_.get()), kHist}}};
    const auto r = m_.admit(q + 1, std::span<const dh::cuda::device_history_import>(imp));
    if (r) {
      ids_.push_back(q);
      gens_.emplace_back(selection_shape(), dh::workload::stream_seed(seed_, q));
    }
    return r.status;
  }

  /// Admits requests 0..n-1, retrying (after a poll) until all are in; throws if one cannot be.
  void admit_all(std::uint32_t n) {
    for (std::uint32_t q = 0; q < n; ++q)
      for (int attempt = 0;; ++attempt) {
        const auto st = try_admit(q);
        if (st == dh::admit_status::admitted) break;
        if (st != dh::admit_status::wait_for_reclaim || attempt > 1000)
          throw cuda_failure("request " + std::to_string(q) + " could not be admitted: " + dh::to_string(st));
        m_.drain();
      }
    DHB_CHECK(cudaStreamSynchronize(stream_));
  }

  /// Generates every live request's selection and uploads the batch (outside timing).
  void prepare_step() {
    const std::size_t n = ids_.size();
    host_sel_.assign(n * kTopK, dh::no_row);
    std::vector<std::int32_t> slots(n), req(n);
    for (std::size_t i = 0; i < n; ++i) {
      const auto id = static_cast<dh::request_id>(ids_[i] + 1);
      gens_[i].next(m_.hierarchy().frontier(id, 0), std::span<dh::row_index>(host_sel_.data() + i * kTopK, kTopK));
      slots[i] = static_cast<std::int32_t>(m_.hierarchy().slot_of(id));
      req[i] = static_cast<std::int32_t>(ids_[i]);
    }
    const auto cnt = static_cast<std::uint32_t>(n);
    DHB_CHECK(cudaMemcpyAsync(sel_.get(), host_sel_.data(), n * kTopK * sizeof(dh::row_index), cudaMemcpyHostToDevice, stream_));
    DHB_CHECK(cudaMemcpyAsync(slots_.get(), slots.data(), n * sizeof(std::int32_t), cudaMemcpyHostToDevice, stream_));
    DHB_CHECK(cudaMemcpyAsync(req_.get(), req.data(), n * sizeof(std::int32_t), cudaMemcpyHostToDevice, stream_));
    DHB_CHECK(cudaMemcpyAsync(count_.get(), &cnt, sizeof cnt, cudaMemcpyHostToDevice, stream_));
    DHB_CHECK(cudaStreamSynchronize(stream_));  // pageable sources above
  }
  void flush_l2() {
    DHB_CHECK(cudaMemsetAsync(flush_.get(), static_cast<int>(++flushes_ & 0xff), flush_.bytes(), stream_));
  }
  /// The step's resolve (raw batch view, as an engine's captured step would launch it).
  void resolve() {
    dh::cuda::batch_view v;
    v.slots = slots_.get();
    v.selections = sel_.get();
    v.locations = loc_.get();
    v.count = count_.get();
    v.stride = static_cast<std::uint32_t>(kTopK);
    v.capacity = static_cast<std::uint32_t>(m_.hierarchy().config().max_requests);
    m_.step().resolve(0, v, stream_);
  }
  /// Checks every resolved row on the device; throws on a mismatch or a device-reported error.
  void verify(verifier& ver) {
    m_.step().check_errors(stream_);
    const auto r = ver.locations(sel_.get(), loc_.get(), req_.get(), static_cast<int>(ids_.size()), static_cast<int>(kTopK),
                                 static_cast<int>(kTopK), m_.hierarchy().pool(0, 0), m_.hierarchy().space().rows(),
                                 static_cast<int>(kRowBytes), stream_);
    if (r.bad != 0)
      throw cuda_failure(std::to_string(r.bad) + " resolved rows differ from their content (first at flat entry " +
                         std::to_string(r.first) + ")");
  }
  /// Shares of the last resolve (synchronises).
  dh::resolve_stats stats() {
    dh::resolve_stats total;
    for (const auto& s : m_.hierarchy().last_stats(0)) total += s;
    return total;
  }
  /// One decode row per live request (outside timing), then `poll()`.
  void append_rows() {
    for (std::uint32_t q : ids_) {
      const auto id = static_cast<dh::request_id>(q + 1);
      const auto f = static_cast<std::uint32_t>(m_.hierarchy().frontier(id, 0));
      fill_rows_kernel<<<1, 128, 0, stream_>>>(append_row_.get(), q, f, 1);
      DHB_CHECK(cudaGetLastError());
      m_.append(id, 0, reinterpret_cast<const std::byte*>(append_row_.get()), 1);
    }
    m_.poll();
  }

 private:
  static dh::hierarchy_config config(std::size_t max_requests, std::size_t optional_pages) {
    dh::hierarchy_config c;
    c.max_requests = max_requests;
    c.max_rows = kHist + 256;  // room for the decode rows of every step
    c.optional_pages = optional_pages;
    return c;
  }
  static cudaStream_t make_stream() {
    cudaStream_t s = nullptr;
    DHB_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return s;
  }

  cudaStream_t stream_;  // leaked on purpose: the manager synchronises it in its destructor
  Manager m_;
  device_buffer<std::uint64_t> prefill_, append_row_;
  device_buffer<dh::row_index> sel_;
  device_buffer<dh::location> loc_;
  device_buffer<std::int32_t> slots_, req_;
  device_buffer<std::uint32_t> count_;
  device_buffer<std::byte> flush_;
  unsigned flushes_ = 0;
  std::uint64_t seed_;
  std::vector<std::uint32_t> ids_;
  std::vector<dh::workload::selection_generator> gens_;
  std::vector<dh::row_index> host_sel_;
};

// --- load_share ------------------------------------------------------------------------------------

constexpr std::size_t kSharePool = 4 * kHistPages;  // M: four requests' whole imported history

template <class P>
void bm_load_share(benchmark::State& state, std::uint32_t C) {
  try {
    scenario<P> sc(C, kSharePool + C * kRequired + kReserve, 7);
    sc.admit_all(C);
    verifier ver;
    step_timer timer;
    dh::resolve_stats total;
    std::vector<double> us;
    for (unsigned w = 0; w < g_warmup_steps; ++w) {
      sc.prepare_step();
      sc.resolve();
      sc.verify(ver);
      sc.append_rows();
    }
    for (auto _ : state) {
      sc.prepare_step();
      sc.flush_l2();
      const float ms = timer.time(sc.stream(), [&] { sc.resolve(); });
      state.SetIterationTime(ms / 1e3);
      us.push_back(ms * 1e3);
      sc.verify(ver);
      total += sc.stats();
      sc.append_rows();
    }
    const auto ss = summarize(us);
    auto& c = state.counters;
    const double sel = total.selected > 0 ? double(total.selected) : 1.0;
    c["host_share_pct"] = 100.0 * double(total.host) / sel;
    c["direct_share_pct"] = 100.0 * double(total.direct) / sel;
    c["hot_share_pct"] = 100.0 * double(total.hot) / sel;
    c["optional_pages"] = double(sc.manager().ledger(0).optional);
    c["imported_pages"] = double(C * kHistPages);
    c["median_us"] = ss.median_us;
    c["p10_us"] = ss.p10_us;
    c["p90_us"] = ss.p90_us;
  } catch (const std::exception& e) {
    fail(state, e.what());
  }
}

// --- load_step -------------------------------------------------------------------------------------

template <class P>
void bm_load_step(benchmark::State& state) {
  constexpr std::uint32_t before = 3, arriving = 8;
  try {
    // M: exactly the three requests' required pages, their whole history and the reserve: no spare
    // page, so every arrival needs whole-request reclaim (adaptive) or fits at once (fixed budget,
    // which holds no optional history).
    scenario<P> sc(before + arriving, before * (kHistPages + kRequired) + kReserve + (std::is_same_v<P, Fixed> ? arriving * kRequired : 0), 11);
    sc.admit_all(before);
    verifier ver;
    for (unsigned w = 0; w < 3; ++w) {
      sc.prepare_step();
      sc.resolve();
      sc.verify(ver);
      sc.append_rows();
    }
    const std::size_t reclaimed_before = sc.manager().counters().pages_reclaimed;
    std::vector<double> wait_us;
    unsigned steps = 0;
    for (auto _ : state) {
      const auto t0 = std::chrono::steady_clock::now();
      std::vector<std::uint32_t> waiting;
      for (std::uint32_t q = before; q < before + arriving; ++q) waiting.push_back(q);
      while (!waiting.empty()) {
        std::vector<std::uint32_t> still;
        for (std::uint32_t q : waiting) {
          const auto st = sc.try_admit(q);
          if (st == dh::admit_status::admitted)
            wait_us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
          else if (st == dh::admit_status::wait_for_reclaim)
            still.push_back(q);
          else
            throw cuda_failure("arrival " + std::to_string(q) + " waits: " + dh::to_string(st));
        }
        waiting.swap(still);
        if (waiting.empty()) break;
        // one decode step of the admitted requests, then poll: what an engine does between attempts
        sc.prepare_step();
        sc.resolve();
        sc.verify(ver);
        sc.append_rows();
        if (++steps > 10000) throw cuda_failure("arrivals not admitted after 10000 steps");
      }
      const double total_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      state.SetIterationTime(total_s);
    }
    sc.manager().drain();
    sc.prepare_step();
    sc.resolve();
    sc.verify(ver);  // every request, the reclaimed ones included, resolves exactly afterwards
    const auto ws = summarize(wait_us);
    const std::size_t released = sc.manager().counters().pages_reclaimed - reclaimed_before;
    auto& c = state.counters;
    c["released_MiB"] = double(released * kPageRows * kRowBytes) / double(1 << 20);
    c["released_pages"] = double(released);
    c["admit_median_us"] = ws.median_us;
    c["admit_max_us"] = ws.max_us;
    c["steps_to_admit"] = double(steps);
  } catch (const std::exception& e) {
    fail(state, e.what());
  }
}

// --- resolve with / without optional history -----------------------------------------------------

template <class P>
void bm_resolve(benchmark::State& state, std::uint32_t C) {
  try {
    scenario<P> sc(C, C * (kHistPages + kRequired) + kReserve, 23);
    sc.admit_all(C);
    if (dh::residency_traits<P>::keeps_optional_history && sc.manager().ledger(0).optional != C * kHistPages)
      throw cuda_failure("with_optional: only " + std::to_string(sc.manager().ledger(0).optional) + " of " +
                         std::to_string(C * kHistPages) + " pages are resident");
    verifier ver;
    step_timer timer;
    for (unsigned w = 0; w < g_warmup_steps; ++w) {
      sc.prepare_step();
      sc.resolve();
      sc.verify(ver);
      sc.append_rows();
    }
    std::vector<double> us;
    dh::resolve_stats total;
    for (auto _ : state) {
      sc.prepare_step();
      sc.flush_l2();
      const float ms = timer.time(sc.stream(), [&] { sc.resolve(); });
      state.SetIterationTime(ms / 1e3);
      us.push_back(ms * 1e3);
      sc.verify(ver);
      total += sc.stats();
      sc.append_rows();
    }
    const auto ss = summarize(us);
    auto& c = state.counters;
    c["median_us"] = ss.median_us;
    c["p10_us"] = ss.p10_us;
    c["p90_us"] = ss.p90_us;
    c["host_rows_per_step"] = double(total.host) / double(std::max<std::size_t>(1, us.size()));
    c["host_share_pct"] = 100.0 * double(total.host) / double(std::max<std::size_t>(1, total.selected));
  } catch (const std::exception& e) {
    fail(state, e.what());
  }
}

void parse_own_flags(int& argc, char** argv) {
  int out = 1;
  for (int i = 1; i < argc; ++i) {
    unsigned v = 0;
    if (std::sscanf(argv[i], "--dh_timed_steps=%u", &v) == 1) g_timed_steps = std::max(5u, std::min(v, 200u));
    else if (std::sscanf(argv[i], "--dh_warmup_steps=%u", &v) == 1) g_warmup_steps = std::max(1u, std::min(v, 50u));
    else argv[out++] = argv[i];
  }
  argc = out;
}

template <class F>
void add(const std::string& name, F f, unsigned iterations) {
  benchmark::RegisterBenchmark(name.c_str(), f)->UseManualTime()->Iterations(iterations)->Unit(benchmark::kMicrosecond);
}

}  // namespace

int main(int argc, char** argv) {
  parse_own_flags(argc, argv);
  for (std::uint32_t C : {2u, 32u}) {
    const std::string load = C == 2 ? "low" : "high";
    add("load_share/adaptive/load:" + load + "/C:" + std::to_string(C),
        [C](benchmark::State& s) { bm_load_share<Adaptive>(s, C); }, g_timed_steps);
    add("load_share/fixed_budget/load:" + load + "/C:" + std::to_string(C),
        [C](benchmark::State& s) { bm_load_share<Fixed>(s, C); }, g_timed_steps);
  }
  add("load_step/adaptive", [](benchmark::State& s) { bm_load_step<Adaptive>(s); }, 1);
  add("load_step/fixed_budget", [](benchmark::State& s) { bm_load_step<Fixed>(s); }, 1);
  for (std::uint32_t C : {8u, 32u, 128u}) {
    add("resolve/with_optional/C:" + std::to_string(C), [C](benchmark::State& s) { bm_resolve<Adaptive>(s, C); },
        g_timed_steps);
    add("resolve/without_optional/C:" + std::to_string(C), [C](benchmark::State& s) { bm_resolve<Fixed>(s, C); },
        g_timed_steps);
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0)
    std::fprintf(stderr, "bench_cuda_residency: no CUDA device (every benchmark will fail)\n");
  benchmark::AddCustomContext("dhisparse_timed_steps", std::to_string(g_timed_steps));
  benchmark::AddCustomContext("dhisparse_warmup_steps", std::to_string(g_warmup_steps));
  benchmark::AddCustomContext("dhisparse_history_rows", std::to_string(kHist));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  if (g_failures) {
    std::fprintf(stderr, "bench_cuda_residency: %d configuration(s) failed (see error_message in the output)\n",
                 g_failures);
    return 1;
  }
  return 0;
}
