// bench_cuda_resolver: one decode step's resolve for a whole batch, dhisparse's fused CUDA
// resolver against same-run baselines, on fresh misses every step. See docs/benchmarks.md.
//
//   pinned_memcpy        cudaMemcpyAsync H2D of a 1 GiB pinned buffer (PCIe ceiling)
//   resident             every row in HBM: location = request base + row (C*k locations)
//   naive_gather         flat warp-per-row zero-copy gather of exactly the step's missing rows
//   claimed_gather       the same copy, warps claiming rows from a device counter, at 4, 8, 16,
//                        32 and 64 warps per SM (/warps_per_sm:N); with naive_gather the
//                        copy-only kernels dhisparse is held against (best_copy_us, vs_best_copy)
//   one_cta_per_request  the public HiSparse design (benchmarks/detail/one_cta_per_request.cuh),
//                        at 256, 512, 960 and 1024 threads (/threads:N); targets use the best
//   dhisparse            dhisparse::cuda::hierarchy::resolve through the raw batch view
//   dhisparse_graph      the same resolve captured once in a CUDA graph and replayed
//                        (only at ~0 misses; informational)
//   indexer              a stand-in for the engine's indexer: a kernel that copies the step's
//                        selections into the batch buffer (only at ~0 misses)
//   dhisparse_after_indexer       indexer, then the resolve of what it wrote (~0 misses)
//   dhisparse_programmatic        the same with the resolve launched programmatically
//                        (hierarchy::set_programmatic_launch; ~0 misses); both report
//                        added_us, the step's time beyond the indexer's alone
//   dhisparse_idle       C = 1, ~0 misses: the resolve queued on an idle stream (the host's
//                        launch latency inside the events; launch_gap_us against dhisparse)
//
// Sweep: C in {1, 8, 32, 128, 256}, misses {0.1%, 5%, 20%} of k, rows of 576 and 656 bytes,
// k = 2048, B = 4096, 100K-row histories, one source with one payload layer; every
// configuration with warm address translations and translation-cold (/translation:warm|cold).
// One iteration = one step; times are CUDA-event times of that step (UseManualTime); counters
// carry the median, p10 and p90 over the timed steps and ratios against the baselines run
// just before in the same process. Every method reading host rows reads rows that no other
// method of its configuration touched (benchmarks/detail/workload.cuh), and every step after
// the fill step is checked outside the events.
//
// Extra flags (removed before Google Benchmark sees the command line):
//   --dh_timed_steps=N   timed steps of dhisparse's methods and resident (default 64, at least 20)
//   --dh_warmup_steps=N  their warm-up steps after the fill step (default 5, at least 1)
//   --dh_baseline_timed_steps=N   timed steps of each copy-only and one-CTA run (default 20)
//   --dh_baseline_warmup_steps=N  their warm-up steps (default 1, at least 1)
//   --dh_warps_per_sm=LIST        claimed_gather's sweep (default 4,8,16,32,64; 0: none)
//   --dh_claim_rows=N             rows a claimed_gather warp claims at a time (default 1)
//   --dh_one_cta_threads=LIST     one_cta_per_request's block sizes (default 256,512,960,1024)
//   --dh_translation_cold=0|1|both  warm translations, translation-cold, or both (default both)
//   --dh_scrub_gb=X      translation scrub buffer in GB (default 16; capped to free memory less 2 GiB)
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
std::uint32_t g_base_timed_steps = 20;   // --dh_baseline_timed_steps
std::uint32_t g_base_warmup_steps = 1;   // --dh_baseline_warmup_steps
std::vector<int> g_warps_per_sm = {4, 8, 16, 32, 64};
int g_claim_rows = 1;
std::vector<int> g_one_cta_threads = {256, 512, 960, 1024};
std::vector<bool> g_translations = {false, true};  // translation-cold off, on
double g_scrub_gb = 16;
constexpr std::size_t kScrubStride = 4096;  // one store per 4 KiB page of the scrub buffer
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
  claimed_gather,
  one_cta_per_request,
  dhisparse,
  dhisparse_graph,
  indexer,
  dhisparse_after_indexer,
  dhisparse_programmatic,
  dhisparse_idle
};
/// Methods that run dhisparse's resolver (and share its cache state).
bool runs_dhisparse(method m) {
  return m == method::dhisparse || m == method::dhisparse_graph || m == method::dhisparse_after_indexer ||
         m == method::dhisparse_programmatic || m == method::dhisparse_idle;
}
/// Methods that read the baselines' pinned history (dhisparse reads its own host store).
bool reads_baseline_history(method m) {
  return m == method::naive_gather || m == method::claimed_gather || m == method::one_cta_per_request;
}
bool copy_only(method m) { return m == method::naive_gather || m == method::claimed_gather; }
/// Methods whose timed step starts with the indexer stand-in.
bool after_indexer(method m) { return m == method::dhisparse_after_indexer || m == method::dhisparse_programmatic; }
const char* name_of(method m) {
  switch (m) {
    case method::resident: return "resident";
    case method::naive_gather: return "naive_gather";
    case method::claimed_gather: return "claimed_gather";
    case method::one_cta_per_request: return "one_cta_per_request";
    case method::dhisparse: return "dhisparse";
    case method::dhisparse_graph: return "dhisparse_graph";
    case method::indexer: return "indexer";
    case method::dhisparse_after_indexer: return "dhisparse_after_indexer";
    case method::dhisparse_programmatic: return "dhisparse_programmatic";
    case method::dhisparse_idle: return "dhisparse_idle";
  }
  return "?";
}
/// Which cache state a method's steps change: two methods on one state cannot share a stream
/// (the second would find the first one's "fresh" rows cached).
const char* state_of(method m) { return runs_dhisparse(m) ? "dhisparse" : name_of(m); }

/// One registered run: a method, its sweep point (warps per SM of claimed_gather, block size of
/// one_cta_per_request; 0 otherwise) and whether address translations are scrubbed.
struct run_spec {
  method x;
  int variant = 0;
  bool cold = false;
};
std::string variant_text(const run_spec& r) {
  if (r.x == method::claimed_gather) return "/warps_per_sm:" + std::to_string(r.variant);
  if (r.x == method::one_cta_per_request) return "/threads:" + std::to_string(r.variant);
  return "";
}
std::uint32_t timed_steps_of(method x) { return reads_baseline_history(x) ? g_base_timed_steps : g_timed_steps; }
std::uint32_t warmup_steps_of(method x) { return reads_baseline_history(x) ? g_base_warmup_steps : g_warmup_steps; }

// --- same-run results, for the ratio counters ----------------------------------------------------

struct measured {
  double median_us = 0, host_gbps = 0;
  int variant = 0;
};
/// (row bytes, misses, C, translation-cold) -> method name -> the best (lowest-median) run of it.
using config_key = std::tuple<int, std::uint32_t, std::uint32_t, bool>;
std::map<config_key, std::map<std::string, measured>> g_results;
double g_memcpy_gbps = 0;

void record(const config_key& c, const std::string& name, const measured& r) {
  auto& slot = g_results[c];
  auto it = slot.find(name);
  if (it == slot.end() || r.median_us < it->second.median_us) slot[name] = r;
}
const measured* result_of(const config_key& c, const std::string& name) {
  auto it = g_results.find(c);
  if (it == g_results.end()) return nullptr;
  auto jt = it->second.find(name);
  return jt == it->second.end() ? nullptr : &jt->second;
}
const measured* result_of(const config_key& c, method x) { return result_of(c, name_of(x)); }

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
    // Two walks: dhisparse reads its own host store, the baselines the pinned history; each
    // walk keeps the rows of one configuration's streams disjoint (benchmarks/detail/workload.cuh).
    dh_walk_ = std::make_unique<history_walk>(kRequests, kHist, kTailRows, kTopK, 0xD1500000ull + RowBytes, kHotRows);
    base_walk_ = std::make_unique<history_walk>(kRequests, kHist, kTailRows, kTopK, 0xBA5E0000ull + RowBytes, kHotRows);
    one_cta_ = std::make_unique<one_cta::resolver<RowBytes, kTopK, kHotRows>>(kRequests, pinned_history().get(),
                                                                               static_cast<int>(kHist));
    const std::uint32_t max_misses = misses_for(*std::max_element(kMissRates.begin(), kMissRates.end()));
    gathered_ = device_buffer<std::byte>(std::size_t(kRequests) * std::max(max_misses, 1u) * RowBytes);
    locations_ = device_buffer<std::int32_t>(std::size_t(kRequests) * kTopK);
    claim_next_ = device_buffer<unsigned>(1);
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
    // Last: the translation scrub buffer takes what the rest left (less a margin).
    if (std::find(g_translations.begin(), g_translations.end(), true) != g_translations.end()) {
      std::size_t free_b = 0, total_b = 0;
      DHB_CHECK(cudaMemGetInfo(&free_b, &total_b));
      const std::size_t margin = std::size_t(2) << 30;
      std::size_t want = static_cast<std::size_t>(g_scrub_gb * 1e9);
      want = std::min(want, free_b > margin ? free_b - margin : 0);
      want = want / kScrubStride * kScrubStride;
      if (want >= kScrubStride) scrub_ = device_buffer<std::byte>(want);
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const std::size_t dh_pinned = dh_adapter<RowBytes>::pinned_bytes(kRequests);
    std::fprintf(stderr,
                 "bench_cuda_resolver: row size %d B: %u histories of %u rows; pinned: baseline history %.1f GB + "
                 "dhisparse %.1f GB; HBM resident copy %.1f GB; translation scrub %.1f GB; setup %.1f s%s%s\n",
                 RowBytes, kRequests, kHist, pinned_history().bytes() / 1e9, dh_pinned / 1e9, resident_.bytes() / 1e9,
                 scrub_.bytes() / 1e9, secs, dh_error_.empty() ? "" : "; dhisparse unavailable: ", dh_error_.c_str());
  }
  ~phase() {
    if (graph_exec_) cudaGraphExecDestroy(graph_exec_);
    cudaStreamDestroy(stream_);
  }
  phase(const phase&) = delete;
  phase& operator=(const phase&) = delete;

  /// The stream of a run of configuration (C, m, translation). A method reading the baselines'
  /// pinned history always gets a new stream of its own (rows no other method of the
  /// configuration reads); dhisparse's methods, resident and the indexer share the current
  /// stream of dhisparse's walk unless the method's state has already consumed it (then a new
  /// one). A new configuration starts a new configuration on both walks.
  stream& stream_for(std::uint32_t C, std::uint32_t m, bool cold, method x) {
    const config_key key{RowBytes, m, C, cold};
    if (key != cfg_) {
      cfg_ = key;
      dh_walk_->begin_configuration();
      base_walk_->begin_configuration();
      cur_.reset();
      base_.reset();
      consumed_.clear();
      graph_for_ = {};
    }
    if (reads_baseline_history(x)) {
      base_ = std::make_unique<stream>(stream_builder::build(*base_walk_, requests_for(C, kBatches), m,
                                                             warmup_steps_of(x), timed_steps_of(x)));
      return *base_;
    }
    const std::string state = state_of(x);
    if (!(cur_ && cur_->timed == timed_steps_of(x) && !consumed_.count(state))) {
      cur_ = std::make_unique<stream>(
          stream_builder::build(*dh_walk_, requests_for(C, kBatches), m, warmup_steps_of(x), timed_steps_of(x)));
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
  /// Evicts the GPU's address translations (stream ordered): a store to every 4 KiB of the
  /// scrub buffer, other device memory than any method's rows or state.
  void scrub_translations() {
    if (scrub_.bytes() == 0) throw std::runtime_error("no memory left for the translation scrub buffer");
    launch_translation_scrub(scrub_.get(), scrub_.bytes(), kScrubStride, static_cast<int>(++scrubs_), sm_count(),
                             stream_);
    DHB_CHECK(cudaGetLastError());
  }
  double scrub_gb() const { return scrub_.bytes() / 1e9; }
  unsigned* claim_counter() const { return claim_next_.get(); }
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
  device_buffer<std::byte> flush_, scrub_;
  device_buffer<unsigned> claim_next_;
  unsigned flushes_ = 0, scrubs_ = 0;
  std::unique_ptr<history_walk> dh_walk_, base_walk_;
  std::unique_ptr<one_cta::resolver<RowBytes, kTopK, kHotRows>> one_cta_;
  verifier verifier_;
  step_timer timer_;
  config_key cfg_{};
  std::unique_ptr<stream> cur_, base_;
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
void bm_resolve(benchmark::State& state, run_spec run, std::uint32_t C, double rate) {
  const method x = run.x;
  const std::uint32_t m = misses_for(rate);
  const std::string what = std::string(name_of(x)) + variant_text(run) + " rb=" + std::to_string(RowBytes) +
                           " C=" + std::to_string(C) + " m=" + std::to_string(m) +
                           (run.cold ? " translation-cold" : " translation-warm");
  try {
    auto& ph = get_phase<RowBytes>();
    if (runs_dhisparse(x) && !ph.has_dh()) {
      fail(state, what + ": " + ph.dhisparse_error());
      return;
    }
    stream& st = ph.stream_for(C, m, run.cold, x);
    const cudaStream_t s = ph.cuda_stream();
    const std::uint32_t k = kTopK;
    std::int32_t* loc = ph.locations();
    if (runs_dhisparse(x)) ph.dh().set_batch(st.requests);
    // A one-CTA run starts from empty caches: they then hold only rows of its own stream.
    if (x == method::one_cta_per_request) ph.one_cta().reset(st.requests, s);
    cudaGraphExec_t graph = x == method::dhisparse_graph ? ph.dhisparse_graph(st) : nullptr;

    // Everything that must happen before a step's events (graph inputs are copied in place).
    auto prepare = [&](std::uint32_t step) {
      if (x == method::dhisparse_graph)
        DHB_CHECK(cudaMemcpyAsync(ph.fixed_selection(), st.sel_step_d(step), std::size_t(C) * k * 4,
                                  cudaMemcpyDeviceToDevice, s));
      if (x == method::claimed_gather) DHB_CHECK(cudaMemsetAsync(ph.claim_counter(), 0, sizeof(unsigned), s));
      if (x == method::one_cta_per_request) ph.one_cta().clear_misses(s);
      if (run.cold) ph.scrub_translations();
      if (g_flush_l2) ph.flush_l2();
      // The idle-stream variant: the step is queued on a stream with nothing left to run, so the
      // host's launch latency falls between the events.
      if (x == method::dhisparse_idle) DHB_CHECK(cudaStreamSynchronize(s));
    };
    // The timed work of one step.
    auto enqueue = [&](std::uint32_t step) {
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
        case method::claimed_gather:
          if (step > 0 && m > 0)
            launch_claimed_gather<RowBytes>(pinned_history().get(), ph.gathered(), st.miss_step_d(step),
                                            static_cast<int>(C * m), g_claim_rows, ph.claim_counter(), sm_count(),
                                            run.variant, s);
          break;
        case method::one_cta_per_request:
          ph.one_cta().resolve(st.sel_step_d(step), static_cast<int>(k), static_cast<int>(k), st.requests_d.get(),
                               static_cast<int>(C), loc, s, true, run.variant);
          break;
        case method::dhisparse:
        case method::dhisparse_idle:
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
    // Outside the events, after every step but the fill: the step's output holds exactly the
    // selected rows, and a method that counts the rows it copied copied exactly C x m. One
    // device-side compare and one small readback (plus dhisparse's own status readback).
    auto verify = [&](std::uint32_t step) {
      DHB_CHECK(cudaStreamSynchronize(s));
      DHB_CHECK(cudaGetLastError());
      verifier::result r;
      std::string rows_error;
      const std::int32_t* sel = st.sel_step_d(step);
      switch (x) {
        case method::resident:
          r = ph.verify().locations(sel, loc, st.requests_d.get(), static_cast<int>(C), static_cast<int>(k),
                                    static_cast<int>(k), ph.resident(), std::size_t(kRequests) * kHist, RowBytes, s);
          break;
        case method::naive_gather:
        case method::claimed_gather:
          r = ph.verify().gather(st.miss_step_d(step), static_cast<int>(C * m), ph.gathered(), RowBytes, kHist, s);
          break;
        case method::one_cta_per_request: {
          const unsigned got = ph.one_cta().misses_counted(s);
          if (got != C * m) rows_error = "copied " + std::to_string(got) + " rows, expected " + std::to_string(C * m);
          r = ph.verify().locations(sel, loc, st.requests_d.get(), static_cast<int>(C), static_cast<int>(k),
                                    static_cast<int>(k), ph.one_cta().buffer(), ph.one_cta().buffer_rows(), RowBytes, s);
          break;
        }
        case method::indexer:
          r = ph.verify().equal(sel, ph.fixed_selection(), static_cast<long long>(C) * k, s);
          break;
        case method::dhisparse:
        case method::dhisparse_graph:
        case method::dhisparse_after_indexer:
        case method::dhisparse_programmatic:
        case method::dhisparse_idle: {
          const std::size_t copied = ph.dh().check_last();
          if (copied != std::size_t(C) * m)
            rows_error = "copied " + std::to_string(copied) + " rows, expected " + std::to_string(C * m);
          r = ph.verify().locations(sel, loc, st.requests_d.get(), static_cast<int>(C), static_cast<int>(k),
                                    static_cast<int>(k), ph.dh().pool(), ph.dh().pool_rows(), RowBytes, s);
          break;
        }
      }
      if (!rows_error.empty())
        throw std::runtime_error(std::string("WRONG BYTES: ") + name_of(x) + variant_text(run) + " step " +
                                 std::to_string(step) + ": " + rows_error);
      if (r.bad)
        throw std::runtime_error(std::string("WRONG BYTES: ") + name_of(x) + variant_text(run) + " step " +
                                 std::to_string(step) + ": " + std::to_string(r.bad) +
                                 " entries do not hold their selected row (first: flat entry " +
                                 std::to_string(r.first) + ")");
    };

    // Fill and warm-up steps (untimed); every step after the fill is verified.
    for (std::uint32_t step = 0; step < st.first_timed(); ++step) {
      prepare(step);
      enqueue(step);
      DHB_CHECK(cudaStreamSynchronize(s));
      DHB_CHECK(cudaGetLastError());
      if (step > 0) verify(step);
    }

    std::vector<double> us;
    us.reserve(st.timed);
    std::uint32_t step = st.first_timed();
    for (auto _ : state) {
      if (step >= st.steps()) throw std::runtime_error("more iterations than generated steps");
      prepare(step);
      const float ms = ph.timer().time(s, [&] { enqueue(step); });
      state.SetIterationTime(ms / 1e3);
      us.push_back(ms * 1e3);
      verify(step);  // outside the events; the next step's prepare() flushes what it left
      ++step;
    }

    const step_stats ss = summarize(us);
    const double miss_bytes = double(C) * m * RowBytes;
    const bool copies = x != method::resident && x != method::indexer;
    const double gbps = copies && ss.median_us > 0 ? miss_bytes / (ss.median_us * 1e3) : 0;
    const config_key key{RowBytes, m, C, run.cold};
    record(key, name_of(x), {ss.median_us, gbps, run.variant});
    if (copy_only(x)) record(key, "best_copy", {ss.median_us, gbps, run.variant});

    state.SetLabel(std::string(name_of(x)) + variant_text(run));
    auto& c = state.counters;
    c["row_bytes"] = RowBytes;
    c["C"] = C;
    c["k"] = k;
    c["B"] = kHotRows;
    c["miss_pct"] = rate * 100;
    c["misses_per_step"] = double(C) * m;
    c["miss_bytes_per_step"] = miss_bytes;
    c["timed_steps"] = double(us.size());
    c["verified_steps"] = double(us.size() + st.warmup);
    c["translation_cold"] = run.cold ? 1 : 0;
    if (run.cold) c["scrub_GB"] = ph.scrub_gb();
    if (x == method::claimed_gather) c["warps_per_sm"] = run.variant;
    if (x == method::one_cta_per_request) c["threads"] = run.variant;
    c["rows_drawn"] = double(st.drawn);
    c["rows_drawn_before"] = double(st.reused);  // drawn by an earlier configuration (walk wrapped)
    c["median_us"] = ss.median_us;
    c["p10_us"] = ss.p10_us;
    c["p90_us"] = ss.p90_us;
    c["min_us"] = ss.min_us;
    c["max_us"] = ss.max_us;
    if (copies) c["host_GBps"] = gbps;
    if (copies && g_memcpy_gbps > 0) c["bw_vs_memcpy"] = gbps / g_memcpy_gbps;
    if (const measured* r = result_of(key, method::resident); r && x != method::resident && r->median_us > 0)
      c["vs_resident"] = ss.median_us / r->median_us;
    if (after_indexer(x))
      if (const measured* r = result_of(key, method::indexer); r && r->median_us > 0)
        c["added_us"] = ss.median_us - r->median_us;  // the resolve's share of indexer + resolve
    // Against the best copy-only run so far (naive_gather and every claimed_gather point) and the
    // best one-CTA block size so far: every configuration runs those first.
    if (const measured* r = result_of(key, "best_copy"); r && r->median_us > 0) {
      c["best_copy_us"] = r->median_us;
      if (!copy_only(x) && x != method::resident && x != method::indexer) c["vs_best_copy"] = ss.median_us / r->median_us;
    }
    if (runs_dhisparse(x)) {
      if (const measured* r = result_of(key, method::one_cta_per_request); r && ss.median_us > 0) {
        c["one_cta_best_us"] = r->median_us;
        c["one_cta_best_threads"] = r->variant;
        c["vs_one_cta"] = ss.median_us / r->median_us;
        c["speedup_vs_one_cta"] = r->median_us / ss.median_us;
      }
    }
    if (x == method::dhisparse_idle)
      if (const measured* r = result_of(key, method::dhisparse); r)
        c["launch_gap_us"] = ss.median_us - r->median_us;  // idle stream minus busy (flushing) stream
  } catch (const std::exception& e) {
    fail(state, what + ": " + e.what());
  }
}

template <int RowBytes>
void register_row_size() {
  for (double rate : kMissRates)
    for (std::uint32_t C : kBatches)
      for (bool cold : g_translations) {
        // Copy-only runs and every one-CTA block size first: dhisparse's counters compare with
        // the best of them. Each reads rows no other run of the configuration reads.
        std::vector<run_spec> runs = {{method::resident, 0, cold}, {method::naive_gather, 0, cold}};
        for (int w : g_warps_per_sm) runs.push_back({method::claimed_gather, w, cold});
        for (int t : g_one_cta_threads) runs.push_back({method::one_cta_per_request, t, cold});
        runs.push_back({method::dhisparse, 0, cold});
        if (misses_for(rate) <= 2) {  // latency-bound: launch cost matters
          for (method x : {method::dhisparse_graph, method::indexer, method::dhisparse_after_indexer,
                           method::dhisparse_programmatic})
            runs.push_back({x, 0, cold});
          if (C == 1) runs.push_back({method::dhisparse_idle, 0, cold});
        }
        for (const run_spec& r : runs) {
          char name[200];
          std::snprintf(name, sizeof name, "resolve/%s/row_bytes:%d/miss_pct:%g/C:%u%s/translation:%s", name_of(r.x),
                        RowBytes, rate * 100, C, variant_text(r).c_str(), cold ? "cold" : "warm");
          benchmark::RegisterBenchmark(name, [r, C, rate](benchmark::State& s) { bm_resolve<RowBytes>(s, r, C, rate); })
              ->UseManualTime()
              ->Iterations(timed_steps_of(r.x))
              ->Unit(benchmark::kMicrosecond);
        }
      }
}

/// "4,8,16" -> {4, 8, 16}; "0" or "" -> {} (the sweep off). False on anything else.
bool parse_list(const char* text, std::vector<int>& out) {
  std::vector<int> v;
  std::string t(text);
  std::size_t at = 0;
  while (at <= t.size()) {
    const std::size_t end = std::min(t.find(',', at), t.size());
    const std::string item = t.substr(at, end - at);
    if (!item.empty()) {
      char* stop = nullptr;
      const long x = std::strtol(item.c_str(), &stop, 10);
      if (*stop != 0 || x < 0 || x > 4096) return false;
      if (x > 0) v.push_back(static_cast<int>(x));
    }
    at = end + 1;
  }
  out = v;
  return true;
}

/// Removes --dh_* flags from argv (Google Benchmark rejects flags it does not know). False on a
/// malformed value of one of ours.
bool parse_own_flags(int& argc, char** argv) {
  int out = 1;
  bool ok = true;
  auto value_of = [](const char* arg, const char* flag) -> const char* {
    const std::size_t n = std::strlen(flag);
    return std::strncmp(arg, flag, n) == 0 ? arg + n : nullptr;
  };
  for (int i = 1; i < argc; ++i) {
    unsigned v = 0;
    double d = 0;
    const char* text = nullptr;
    if (std::sscanf(argv[i], "--dh_timed_steps=%u", &v) == 1) g_timed_steps = std::max(20u, v);
    else if (std::sscanf(argv[i], "--dh_warmup_steps=%u", &v) == 1) g_warmup_steps = std::max(1u, v);
    else if (std::sscanf(argv[i], "--dh_baseline_timed_steps=%u", &v) == 1) g_base_timed_steps = std::max(20u, v);
    else if (std::sscanf(argv[i], "--dh_baseline_warmup_steps=%u", &v) == 1) g_base_warmup_steps = std::max(1u, v);
    else if (std::sscanf(argv[i], "--dh_claim_rows=%u", &v) == 1) g_claim_rows = static_cast<int>(std::max(1u, v));
    else if (std::sscanf(argv[i], "--dh_scrub_gb=%lf", &d) == 1) g_scrub_gb = std::max(0.0, d);
    else if ((text = value_of(argv[i], "--dh_warps_per_sm="))) {
      ok = parse_list(text, g_warps_per_sm) && ok;
      for (int w : g_warps_per_sm) ok = ok && w <= 64;  // 64 warps: 2048 threads, an SM's most
    } else if ((text = value_of(argv[i], "--dh_one_cta_threads="))) {
      ok = parse_list(text, g_one_cta_threads) && ok;
      for (int t : g_one_cta_threads)
        ok = ok && std::find(std::begin(one_cta::block_sizes), std::end(one_cta::block_sizes), t) !=
                       std::end(one_cta::block_sizes);
    } else if ((text = value_of(argv[i], "--dh_translation_cold="))) {
      if (std::strcmp(text, "0") == 0) g_translations = {false};
      else if (std::strcmp(text, "1") == 0) g_translations = {true};
      else if (std::strcmp(text, "both") == 0) g_translations = {false, true};
      else ok = false;
    }
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
  return ok;
}

}  // namespace

/// Rows one request draws in the largest configuration, per walk: every baseline run reads its
/// own stream of the baselines' walk; dhisparse's methods share dhisparse's walk (resident and
/// the indexer reuse dhisparse's stream). A fill step draws k rows when a request has no last
/// selection yet.
std::uint64_t rows_per_configuration(bool baseline_walk) {
  const double top = *std::max_element(kMissRates.begin(), kMissRates.end());
  std::uint64_t need = kTopK;
  if (baseline_walk) {
    const std::uint64_t runs = 1 + g_warps_per_sm.size() + g_one_cta_threads.size();
    need += runs * std::uint64_t(g_base_warmup_steps + g_base_timed_steps) * misses_for(top);
  } else {
    // At ~0 misses dhisparse, its graph, the two indexer runs and the idle-stream run: five streams.
    const std::uint64_t low = misses_for(*std::min_element(kMissRates.begin(), kMissRates.end()));
    need += std::max<std::uint64_t>(std::uint64_t(g_warmup_steps + g_timed_steps) * misses_for(top),
                                    5 * std::uint64_t(g_warmup_steps + g_timed_steps) * low);
  }
  return need;
}

int main(int argc, char** argv) {
  if (!parse_own_flags(argc, argv)) {
    std::fprintf(stderr, "bench_cuda_resolver: a --dh_ flag has a bad value (see docs/benchmarks.md)\n");
    return 2;
  }
  {
    // The walks' bound: rows a request may draw in one configuration (its history less the tail,
    // the cache guard of B + k rows and the current selection; benchmarks/detail/workload.cuh).
    const std::uint64_t limit = kHist - kTailRows - (kHotRows + 2 * kTopK);
    for (bool base : {true, false})
      if (rows_per_configuration(base) > limit) {
        std::fprintf(stderr,
                     "bench_cuda_resolver: one configuration draws %llu rows per request from the %s walk, a history "
                     "allows %llu; use fewer steps or sweep points\n",
                     static_cast<unsigned long long>(rows_per_configuration(base)), base ? "baselines'" : "dhisparse's",
                     static_cast<unsigned long long>(limit));
        return 2;
      }
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
  benchmark::AddCustomContext("dhisparse_baseline_timed_steps", std::to_string(g_base_timed_steps));
  benchmark::AddCustomContext("dhisparse_baseline_warmup_steps", std::to_string(g_base_warmup_steps));
  {
    auto join = [](const std::vector<std::string>& items) {
      std::string out;
      for (const auto& i : items) {
        if (!out.empty()) out.push_back(',');
        out.append(i);
      }
      return out;
    };
    std::vector<std::string> wv, tv, trv;
    for (int x : g_warps_per_sm) wv.push_back(std::to_string(x));
    for (int x : g_one_cta_threads) tv.push_back(std::to_string(x));
    for (bool x : g_translations) trv.push_back(x ? "cold" : "warm");
    const std::string w = join(wv), t = join(tv), tr = join(trv);
    benchmark::AddCustomContext("dhisparse_warps_per_sm", w.empty() ? "none" : w);
    benchmark::AddCustomContext("dhisparse_claim_rows", std::to_string(g_claim_rows));
    benchmark::AddCustomContext("dhisparse_one_cta_threads", t.empty() ? "none" : t);
    benchmark::AddCustomContext("dhisparse_translation", tr);
    benchmark::AddCustomContext("dhisparse_scrub_gb_requested", std::to_string(g_scrub_gb));
  }
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
