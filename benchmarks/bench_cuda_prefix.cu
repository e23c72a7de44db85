// bench_cuda_prefix: shared prefixes under residency on the CUDA backend (issue 28,
// docs/prefixes.md, cuda/residency_manager.cuh), GLM-5.3 shape (layouts::glm53: 21 sources, 78
// payload layers of 576-byte rows, k = 2048, pages of 64 rows). See docs/benchmarks.md.
//
//   prefix/<shared|unshared>/R:<n>
//       R requests (default 64) whose histories start with the same 32K tokens and end with 1K
//       private tokens each:
//        - shared: one request imports the 32K-token prefix, it is retained (`retain_prefix`) and
//          that request completes; then each of the R requests is admitted on the prefix with its
//          1K-token suffix (`admit(id, prefix, suffix)`, suffix from device memory);
//        - unshared: each of the R requests imports all 33K tokens (`admit(id, history)`, from
//          device memory).
//       Both under the adaptive policy with the same GPU optional pool M (pages per source, sized
//       so that the shared workload fits whole: --dh_optional_pages to change it).
//       Reported: host bytes of the requests' and prefixes' histories (host-store pages in use x
//       page bytes, over every source), GPU optional pages in use (M_opt over every source, and
//       its bytes), sessions fully resident (every complete imported page mapped on every
//       source), the time to admit each request (host wall time from the admit call until its
//       enqueued work has finished on the step stream (page fills on the copy stream go on in the
//       background), retries after wait_for_reclaim included;
//       median and max), and one decode step's resolve at C = R (21 resolver calls, selections
//       from the locality generator, L2 flushed before each step outside the events; CUDA-event
//       median over --dh_timed_steps steps after --dh_warmup_steps). Every resolved row of every
//       source is checked on the device against its content (prefix rows are the same tokens for
//       every request) outside timing.
//
// Memory: the unshared configuration's host store holds R x 33K tokens x 78 layers x 576 B
// (about 97 GB pinned for R = 64); the shared one about 5 GB. A configuration whose memory
// cannot be allocated reports the error and the other still runs (--dh_requests=N to shrink both).
// Extra flags: --dh_requests=N (default 64), --dh_optional_pages=N, --dh_timed_steps=N (default
// 10), --dh_warmup_steps=N (default 3).
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
#include <vector>

#include <dhisparse/cuda/hierarchy.cuh>
#include <dhisparse/cuda/residency_manager.cuh>
#include <dhisparse/layouts/glm53.hpp>
#include <dhisparse/policies/hot_cache.hpp>
#include <dhisparse/policies/residency.hpp>
#include <dhisparse/workload/selection_generator.hpp>

#include "detail/common.cuh"

namespace {

using namespace dhisparse_bench;
namespace dh = ::dhisparse;
using Layout = dh::layouts::glm53;
using Device = dh::cuda::hierarchy<Layout, dh::lru_hot_cache<Layout::top_k>>;
using Manager = dh::cuda::residency_manager<Device, dh::adaptive_policy<>>;

constexpr std::size_t kSources = Layout::producers;
constexpr std::size_t kTopK = Layout::top_k;
constexpr std::size_t kPageRows = Layout::page_rows;
constexpr std::size_t kRowBytes = Layout::payload_row_bytes;
constexpr std::size_t kWords = kRowBytes / 8;
constexpr std::size_t kMaxLayers = 4;
constexpr std::size_t kPrefix = 32768;  // tokens (stored rows on every source) of the shared prefix
constexpr std::size_t kSuffix = 1024;   // private tokens of each request
constexpr std::size_t kHist = kPrefix + kSuffix;
constexpr std::size_t kRequired = 8, kReserve = 16;
constexpr dh::prefix_id kPrefixId = 0x5eed;

unsigned g_requests = 64, g_timed_steps = 10, g_warmup_steps = 3;
std::size_t g_optional_pages = 0;  // 0: the shared workload's pages plus the ledger's required and reserve
int g_failures = 0;

void fail(benchmark::State& state, const std::string& what) {
  ++g_failures;
  state.SkipWithError(what.c_str());
}

/// Content of history row `row` of benchmark request `q` (q >= 1): the prefix's rows are the same
/// tokens for every request (tag 0), the suffix's are the request's own. Every payload layer and
/// source holds the same row content (per-layer exactness is the tests' business).
__host__ __device__ constexpr std::uint32_t tag_of(std::uint32_t q, std::uint32_t row) {
  return row < kPrefix ? 0u : q;
}

/// Rows [first, first + count) of request q, [layer][count][words] for kMaxLayers layers.
__global__ void fill_import_kernel(std::uint64_t* dst, std::uint32_t q, std::uint32_t first, std::uint32_t count) {
  const std::size_t per_layer = std::size_t(count) * kWords, total = per_layer * kMaxLayers;
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < total; i += std::size_t(gridDim.x) * blockDim.x) {
    const std::size_t in_layer = i % per_layer;
    const auto r = static_cast<std::uint32_t>(in_layer / kWords), w = static_cast<std::uint32_t>(in_layer % kWords);
    dst[i] = row_word(tag_of(q, first + r), first + r, w);
  }
}

/// Rows below the prefix's end carry the prefix's content (tag 0), the rest their request's.
struct prefix_tag {
  __device__ std::uint32_t operator()(std::uint32_t q, std::uint32_t row) const { return tag_of(q, row); }
};

dh::workload::selection_params selection_shape() {
  dh::workload::selection_params p;  // the defaults are for k = 2048 (GLM-5.3), as in the demo
  p.top_k = kTopK;
  p.remembered_steps = 0;
  return p;
}

std::size_t optional_pages_for(std::size_t requests) {
  if (g_optional_pages != 0) return g_optional_pages;
  return kPrefix / kPageRows + requests * (kSuffix / kPageRows + 1 + kRequired) + kReserve;
}

dh::hierarchy_config config(bool shared, std::size_t requests) {
  dh::hierarchy_config c;
  c.max_requests = requests;
  c.max_rows = kHist + kPageRows;  // room for a page of decode rows
  c.optional_pages = optional_pages_for(requests);
  // Host pages: unshared, every request's 33K rows; shared, the prefix once plus each request's
  // boundary page and suffix (the prefix is page-aligned: no boundary copy).
  c.host_pages = shared ? kPrefix / kPageRows + requests * (kSuffix / kPageRows + 2) + 2
                        : requests * ((kHist + kPageRows - 1) / kPageRows + 1);
  c.prefix_pages = shared ? kPrefix / kPageRows : 0;
  return c;
}

double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

class scenario {
 public:
  scenario(bool shared, std::size_t requests)
      : shared_(shared), requests_(requests), stream_(make_stream()),
        m_(config(shared, requests), {kRequired, kReserve}, stream_),
        import_(kMaxLayers * kHist * kWords), sel_(requests * kTopK), slots_(requests), req_(requests), count_(1),
        bad_(2) {
    for (std::size_t s = 0; s < kSources; ++s) loc_.emplace_back(requests * kTopK);
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

  /// Generates rows [first, first + count) of request q into the import buffer (outside timing).
  void generate(std::uint32_t q, std::size_t first, std::size_t count) {
    fill_import_kernel<<<264, 256, 0, stream_>>>(import_.get(), q, static_cast<std::uint32_t>(first),
                                                 static_cast<std::uint32_t>(count));
    DHB_CHECK(cudaGetLastError());
    DHB_CHECK(cudaStreamSynchronize(stream_));
  }
  std::array<dh::cuda::device_history_import, kSources> imports(std::size_t count, std::int64_t first_row) const {
    std::array<dh::cuda::device_history_import, kSources> imp{};
    for (auto& i : imp) i = {reinterpret_cast<const std::byte*>(import_.get()), count, first_row};
    return imp;
  }

  /// Shared only: request 0 imports the prefix, which is retained; the request completes.
  void retain_prefix() {
    generate(0, 0, kPrefix);
    const auto imp = imports(kPrefix, 0);
    const auto r = m_.admit(1'000'000, std::span<const dh::cuda::device_history_import>(imp));
    if (!r) throw cuda_failure(std::string("prefix writer not admitted: ") + dh::to_string(r.status));
    m_.retain_prefix(kPrefixId, 1'000'000);
    m_.complete(1'000'000);
    m_.drain();
  }

  /// Admits request q (ids q), timing the call until its work on the step stream has finished;
  /// retries after a drain while it waits for reclaim. Returns microseconds.
  double admit(std::uint32_t q) {
    if (shared_) generate(q, kPrefix, kSuffix);
    else generate(q, 0, kHist);
    const auto imp = shared_ ? imports(kSuffix, static_cast<std::int64_t>(kPrefix)) : imports(kHist, 0);
    const std::span<const dh::cuda::device_history_import> span(imp);
    const double t0 = now_us();
    for (int attempt = 0;; ++attempt) {
      const auto r = shared_ ? m_.admit(q, kPrefixId, span) : m_.admit(q, span);
      if (r) break;
      if (r.status != dh::admit_status::wait_for_reclaim || attempt > 100)
        throw cuda_failure("request " + std::to_string(q) + " could not be admitted: " + dh::to_string(r.status));
      m_.drain();
    }
    DHB_CHECK(cudaStreamSynchronize(stream_));
    const double us = now_us() - t0;
    ids_.push_back(q);
    gens_.emplace_back(selection_shape(), dh::workload::stream_seed(29, q));
    return us;
  }

  /// Host bytes of the histories: host-store pages in use over every source, times their bytes.
  [[nodiscard]] double host_bytes() const {
    double b = 0;
    for (std::size_t s = 0; s < kSources; ++s) {
      const auto& cfg = m_.hierarchy().config();
      const double page = double(kPageRows) * Layout::sources[s].payload_layers * kRowBytes;
      b += double(cfg.host_pages - m_.hierarchy().free_host_pages(s)) * page;
    }
    return b;
  }
  [[nodiscard]] std::size_t optional_pages() const {
    std::size_t n = 0;
    for (std::size_t s = 0; s < kSources; ++s) n += m_.ledger(s).optional;
    return n;
  }
  [[nodiscard]] double optional_bytes() const {
    double b = 0;
    for (std::size_t s = 0; s < kSources; ++s)
      b += double(m_.ledger(s).optional) * double(kPageRows) * Layout::sources[s].payload_layers * kRowBytes;
    return b;
  }
  /// Requests with every complete imported page mapped on every source.
  [[nodiscard]] std::size_t fully_resident() const {
    std::size_t n = 0;
    for (std::uint32_t q : ids_) {
      bool all = true;
      for (std::size_t s = 0; s < kSources; ++s)
        all = all && m_.optional_pages_of(q, s) == static_cast<std::size_t>(m_.imported_rows(q, s)) / kPageRows;
      n += all ? 1 : 0;
    }
    return n;
  }

  /// Every live request's selection (one for all sources), uploaded (outside timing).
  void prepare_step() {
    const std::size_t n = ids_.size();
    host_sel_.assign(n * kTopK, dh::no_row);
    std::vector<std::int32_t> slots(n), req(n);
    for (std::size_t i = 0; i < n; ++i) {
      gens_[i].next(m_.hierarchy().frontier(ids_[i], 0), std::span<dh::row_index>(host_sel_.data() + i * kTopK, kTopK));
      slots[i] = static_cast<std::int32_t>(m_.hierarchy().slot_of(ids_[i]));
      req[i] = static_cast<std::int32_t>(ids_[i]);
    }
    const auto cnt = static_cast<std::uint32_t>(n);
    DHB_CHECK(cudaMemcpyAsync(sel_.get(), host_sel_.data(), n * kTopK * sizeof(dh::row_index), cudaMemcpyHostToDevice, stream_));
    DHB_CHECK(cudaMemcpyAsync(slots_.get(), slots.data(), n * sizeof(std::int32_t), cudaMemcpyHostToDevice, stream_));
    DHB_CHECK(cudaMemcpyAsync(req_.get(), req.data(), n * sizeof(std::int32_t), cudaMemcpyHostToDevice, stream_));
    DHB_CHECK(cudaMemcpyAsync(count_.get(), &cnt, sizeof cnt, cudaMemcpyHostToDevice, stream_));
    DHB_CHECK(cudaStreamSynchronize(stream_));  // pageable sources above
  }
  void flush_l2() { DHB_CHECK(cudaMemsetAsync(flush_.get(), static_cast<int>(++flushes_ & 0xff), flush_.bytes(), stream_)); }
  /// One decode step's resolves: every source, the whole batch (raw batch views, as a captured step).
  void resolve() {
    for (std::size_t s = 0; s < kSources; ++s) {
      dh::cuda::batch_view v;
      v.slots = slots_.get();
      v.selections = sel_.get();
      v.locations = loc_[s].get();
      v.count = count_.get();
      v.stride = static_cast<std::uint32_t>(kTopK);
      v.capacity = static_cast<std::uint32_t>(requests_);
      m_.step().resolve(s, v, stream_);
    }
  }
  /// Checks every resolved row of every source on the device; throws on a mismatch.
  void verify() {
    m_.step().check_errors(stream_);
    for (std::size_t s = 0; s < kSources; ++s) {
      DHB_CHECK(cudaMemsetAsync(bad_.get(), 0, 2 * sizeof(unsigned long long), stream_));
      // payload layer 0 of each source; entries of item b at b * k
      verify_locations_kernel<<<1024, 256, 0, stream_>>>(
          sel_.get(), loc_[s].get(), req_.get(), static_cast<int>(ids_.size()), static_cast<int>(kTopK),
          static_cast<int>(kTopK), reinterpret_cast<const std::uint64_t*>(m_.hierarchy().pool(s, 0)),
          m_.hierarchy().space().rows(), static_cast<int>(kWords), bad_.get(), prefix_tag{});
      DHB_CHECK(cudaGetLastError());
      unsigned long long h[2];
      DHB_CHECK(cudaMemcpyAsync(h, bad_.get(), sizeof h, cudaMemcpyDeviceToHost, stream_));
      DHB_CHECK(cudaStreamSynchronize(stream_));
      if (h[0] != 0)
        throw cuda_failure("source " + std::to_string(s) + ": " + std::to_string(h[0]) +
                           " resolved rows differ from their content (first at flat entry " + std::to_string(h[1] - 1) + ")");
      checked_ += ids_.size() * kTopK;
    }
  }
  [[nodiscard]] std::size_t checked() const { return checked_; }
  /// Shares of the last resolve over every source (synchronises).
  dh::resolve_stats stats() {
    dh::resolve_stats total;
    for (std::size_t s = 0; s < kSources; ++s)
      for (const auto& st : m_.hierarchy().last_stats(s)) total += st;
    return total;
  }

 private:
  static cudaStream_t make_stream() {
    cudaStream_t s = nullptr;
    DHB_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return s;
  }

  bool shared_;
  std::size_t requests_;
  cudaStream_t stream_;  // leaked on purpose (the manager synchronises it in its destructor)
  Manager m_;
  device_buffer<std::uint64_t> import_;
  device_buffer<dh::row_index> sel_;
  std::vector<device_buffer<dh::location>> loc_;
  device_buffer<std::int32_t> slots_, req_;
  device_buffer<std::uint32_t> count_;
  device_buffer<unsigned long long> bad_;
  device_buffer<std::byte> flush_;
  unsigned flushes_ = 0;
  std::vector<std::uint32_t> ids_;
  std::vector<dh::workload::selection_generator> gens_;
  std::vector<dh::row_index> host_sel_;
  std::size_t checked_ = 0;
};

void bm_prefix(benchmark::State& state, bool shared) {
  try {
    const std::size_t R = g_requests;
    scenario sc(shared, R);
    if (shared) sc.retain_prefix();
    std::vector<double> admit_us;
    for (std::uint32_t q = 1; q <= R; ++q) admit_us.push_back(sc.admit(q));
    sc.manager().drain();
    if (const std::string a = sc.manager().audit(); !a.empty()) throw cuda_failure("audit: " + a);
    step_timer timer;
    for (unsigned w = 0; w < g_warmup_steps; ++w) {
      sc.prepare_step();
      sc.resolve();
      sc.verify();
    }
    std::vector<double> us;
    dh::resolve_stats total;
    for (auto _ : state) {
      sc.prepare_step();
      sc.flush_l2();
      const float ms = timer.time(sc.stream(), [&] { sc.resolve(); });
      state.SetIterationTime(ms / 1e3);
      us.push_back(ms * 1e3);
      sc.verify();
      total += sc.stats();
    }
    const auto as = summarize(admit_us);
    const auto rs = summarize(us);
    auto& c = state.counters;
    c["host_GiB"] = sc.host_bytes() / double(1ull << 30);
    c["gpu_opt_pages"] = double(sc.optional_pages());
    c["gpu_opt_GiB"] = sc.optional_bytes() / double(1ull << 30);
    c["M_pages_per_source"] = double(optional_pages_for(R));
    c["fully_resident"] = double(sc.fully_resident());
    c["admit_median_us"] = as.median_us;
    c["admit_max_us"] = as.max_us;
    c["resolve_median_us"] = rs.median_us;
    c["resolve_p90_us"] = rs.p90_us;
    c["host_share_pct"] = 100.0 * double(total.host) / double(std::max<std::size_t>(1, total.selected));
    c["rows_checked"] = double(sc.checked());
  } catch (const std::exception& e) {
    fail(state, e.what());
  }
}

void parse_own_flags(int& argc, char** argv) {
  int out = 1;
  for (int i = 1; i < argc; ++i) {
    unsigned v = 0;
    if (std::sscanf(argv[i], "--dh_timed_steps=%u", &v) == 1) g_timed_steps = std::max(3u, std::min(v, 200u));
    else if (std::sscanf(argv[i], "--dh_warmup_steps=%u", &v) == 1) g_warmup_steps = std::max(1u, std::min(v, 50u));
    else if (std::sscanf(argv[i], "--dh_requests=%u", &v) == 1) g_requests = std::max(1u, std::min(v, 256u));
    else if (std::sscanf(argv[i], "--dh_optional_pages=%u", &v) == 1) g_optional_pages = v;
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
  const std::string r = "/R:" + std::to_string(g_requests);
  add("prefix/shared" + r, [](benchmark::State& s) { bm_prefix(s, true); }, g_timed_steps);
  add("prefix/unshared" + r, [](benchmark::State& s) { bm_prefix(s, false); }, g_timed_steps);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0)
    std::fprintf(stderr, "bench_cuda_prefix: no CUDA device (every benchmark will fail)\n");
  benchmark::AddCustomContext("dhisparse_timed_steps", std::to_string(g_timed_steps));
  benchmark::AddCustomContext("dhisparse_warmup_steps", std::to_string(g_warmup_steps));
  benchmark::AddCustomContext("dhisparse_prefix_tokens", std::to_string(kPrefix));
  benchmark::AddCustomContext("dhisparse_suffix_tokens", std::to_string(kSuffix));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  if (g_failures) {
    std::fprintf(stderr, "bench_cuda_prefix: %d configuration(s) failed (see error_message in the output)\n", g_failures);
    return 1;
  }
  return 0;
}
