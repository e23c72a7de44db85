// bench_cuda_verify: speculative verification on the CUDA backend. One verify launch resolves K
// target queries per request against one retrieval union; the baseline resolves the same K
// selections as K separate single-query resolves (the fused resolver, raw batch view) on the same
// hierarchy. See docs/benchmarks.md ("Speculative verification").
//
//   verify      dhisparse::cuda::hierarchy::verify over a device descriptor (verify_batch_view, the
//               graph-capturable call; like the resolves, nothing is uploaded inside the timing)
//   k_resolves  K x hierarchy::resolve(source, batch_view) of the same selections, back to back
//   verify_programmatic  verify with hierarchy::set_programmatic_launch(true): its copy kernel may
//               start while its metadata kernel finishes (vs_verify: its median / verify's)
//   memory      per-session bytes of ring + staging: the planner against hierarchy::requirements;
//               GLM-5.3 verification memory with dedicated staging against four shared arenas
//
// Sweep: K in {1, 4, 6, 8}, C in {1, 8, 32, 128}; k = 2048, B = 4096, 576-byte rows, one source
// with one payload layer, 65,536-row histories, K_max = 8. Every query selects its visible block
// rows (positions f .. f+j; -1 in the K resolves, which cannot name them), 5% fresh misses (never selected before: 75% shared by the round's
// queries, 25% its own) and the rest from a hot set the cache holds. L2 is flushed before every
// timed step, outside the events; times are CUDA-event medians over the timed steps. Results are
// verified outside timing: after the warm-up and after the timed steps every location of every
// query must hold its row's exact bytes, and the union's host copies must equal the distinct
// fresh rows.
//
// Extra flags (removed before Google Benchmark sees the command line):
//   --dh_timed_steps=N   timed steps per configuration (default 20, at least 5)
//   --dh_flush_l2=0|1    flush L2 before every step (default 1)
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <dhisparse/cuda/draft_ring_store.cuh>
#include <dhisparse/cuda/hierarchy.cuh>
#include <dhisparse/hierarchy_types.hpp>
#include <dhisparse/layout.hpp>
#include <dhisparse/layouts/glm53.hpp>
#include <dhisparse/planner.hpp>
#include <dhisparse/policies/hot_cache.hpp>
#include <dhisparse/policies/staging_arena.hpp>
#include <dhisparse/types.hpp>

#include "detail/common.cuh"

namespace {

using namespace dhisparse_bench;

constexpr std::uint32_t kTopK = 2048;     // k
constexpr std::uint32_t kHotRows = 4096;  // B
constexpr std::uint32_t kPageRows = 64;   // p
constexpr std::uint32_t kTailRows = 64;   // T
constexpr std::uint32_t kHist = 65536;    // rows of every request's history
constexpr std::uint32_t kMaxBlock = 8;    // K_max
constexpr int kRowBytes = 576;
constexpr std::uint32_t kMissesPerQuery = 102;  // 5% of k
constexpr std::uint32_t kSharedMisses = 77;     // of which shared by the round's queries
constexpr std::uint32_t kWarmupSteps = 3;
const std::vector<std::uint32_t> kBlocks = {1, 4, 6, 8};
const std::vector<std::uint32_t> kBatches = {1, 8, 32, 128};

std::uint32_t g_timed_steps = 20;
bool g_flush_l2 = true;
int g_failures = 0;

struct bench_layout {
  static constexpr std::size_t top_k = kTopK;
  static constexpr std::size_t page_rows = kPageRows;
  static constexpr std::array<dhisparse::source_desc, 1> sources{{{kRowBytes, 1, 1, 0}}};
  static constexpr std::array<dhisparse::consumer_desc, 1> consumers{{{0, dhisparse::consumer_kind::reindex, 0}}};
};
static_assert(dhisparse::valid_layout<bench_layout>);
using hierarchy = dhisparse::cuda::hierarchy<bench_layout, dhisparse::lru_hot_cache<kHotRows>>;

/// Requests 0..N-1: each batch size has its own requests, so every configuration has fresh rows.
std::uint32_t first_request(std::uint32_t C) {
  std::uint32_t first = 0;
  for (std::uint32_t c : kBatches) {
    if (c == C) return first;
    first += c;
  }
  return first;
}
std::uint32_t total_requests() { return std::accumulate(kBatches.begin(), kBatches.end(), 0u); }

dhisparse::hierarchy_config config(std::uint32_t requests, std::size_t max_block) {
  dhisparse::hierarchy_config cfg;
  cfg.max_requests = requests;
  cfg.max_rows = kHist + kMaxBlock;  // room for the staged block past the history
  cfg.tail_rows = kTailRows;
  cfg.max_block = max_block;
  return cfg;
}

/// Rows [first, first+count) of request q with the benchmark's content (row_word).
__global__ void fill_rows_kernel(std::uint64_t* dst, std::uint32_t q, std::uint32_t first, std::uint32_t count,
                                 std::uint32_t words) {
  const std::size_t total = std::size_t(count) * words;
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < total;
       i += std::size_t(gridDim.x) * blockDim.x) {
    const auto r = static_cast<std::uint32_t>(i / words);
    dst[i] = row_word(q, first + r, static_cast<std::uint32_t>(i - std::size_t(r) * words));
  }
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

/// The hierarchy with every history appended and a K_max block staged for every request.
class setup {
 public:
  setup() {
    const auto t0 = std::chrono::steady_clock::now();
    DHB_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking));
    const std::uint32_t n = total_requests();
    h_ = std::make_unique<hierarchy>(config(n, kMaxBlock), s_);
    device_buffer<std::byte> rows(std::size_t(kHist) * kRowBytes);
    constexpr std::uint32_t words = kRowBytes / 8;
    for (std::uint32_t q = 0; q < n; ++q) {
      if (!h_->admit(q, s_)) throw std::runtime_error("admission of request " + std::to_string(q) + " waited");
      fill_rows_kernel<<<sm_count() * 4, 256, 0, s_>>>(reinterpret_cast<std::uint64_t*>(rows.get()), q, 0, kHist, words);
      DHB_CHECK(cudaGetLastError());
      h_->append(q, 0, rows.get(), kHist, s_);
      DHB_CHECK(cudaStreamSynchronize(s_));  // `rows` is reused for the next request
      fill_rows_kernel<<<1, 256, 0, s_>>>(reinterpret_cast<std::uint64_t*>(rows.get()), q, kHist, kMaxBlock, words);
      DHB_CHECK(cudaGetLastError());
      h_->stage_block(q, 0, rows.get(), kMaxBlock, s_);  // re-verified every round, never committed
      DHB_CHECK(cudaStreamSynchronize(s_));
    }
    h_->check_errors(s_);
    next_fresh_.assign(n, 0);
    for (auto& f : next_fresh_) f = kHist - kTailRows - 1;  // fresh rows walk down from below the tail
    int dev = 0, l2 = 0;
    DHB_CHECK(cudaGetDevice(&dev));
    DHB_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
    flush_ = device_buffer<std::byte>(std::max<std::size_t>(4 * std::size_t(l2), std::size_t(64) << 20));
    const std::size_t cap = std::size_t(kBatches.back()) * kMaxBlock * kTopK;
    sel_d_ = device_buffer<std::int32_t>(cap);
    loc_d_ = device_buffer<std::int32_t>(cap);
    req_d_ = device_buffer<std::int32_t>(std::size_t(kBatches.back()) * kMaxBlock);
    slots_d_ = device_buffer<std::int32_t>(kBatches.back());
    lengths_d_ = device_buffer<std::int32_t>(kBatches.back());
    count_d_ = device_buffer<std::uint32_t>(1);
    queries_d_ = device_buffer<std::int32_t>(kBatches.back());
    qlengths_d_ = device_buffer<std::int32_t>(std::size_t(kBatches.back()) * kMaxBlock);
    selp_d_ = device_buffer<const std::int32_t*>(std::size_t(kBatches.back()) * kMaxBlock);
    locp_d_ = device_buffer<std::int32_t*>(std::size_t(kBatches.back()) * kMaxBlock);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const auto req = hierarchy::requirements(config(n, kMaxBlock));
    std::fprintf(stderr, "bench_cuda_verify: %u histories of %u rows; hierarchy: %.2f GB device, %.2f GB pinned; setup %.1f s\n",
                 n, kHist, req.device_bytes / 1e9, req.pinned_bytes / 1e9, secs);
  }
  ~setup() { cudaStreamDestroy(s_); }
  setup(const setup&) = delete;
  setup& operator=(const setup&) = delete;

  hierarchy& h() { return *h_; }
  cudaStream_t stream() const { return s_; }
  void flush_l2() { DHB_CHECK(cudaMemsetAsync(flush_.get(), static_cast<int>(++flushes_ & 0xff), flush_.bytes(), s_)); }
  step_timer& timer() { return timer_; }

  /// One round's selections of requests [q0, q0+C), K queries each, [b][j][k] on the host and the
  /// device; returns the distinct fresh rows (the union's misses) and the per-query misses summed.
  struct round_info {
    std::size_t union_misses = 0, per_query_misses = 0;
  };
  round_info make_round(std::uint32_t q0, std::uint32_t C, std::uint32_t K, bool with_block) {
    sel_h_.assign(std::size_t(C) * K * kTopK, -1);
    round_info info;
    for (std::uint32_t b = 0; b < C; ++b) {
      const std::uint32_t q = q0 + b;
      std::vector<std::int32_t> shared(kSharedMisses);
      for (auto& r : shared) r = take_fresh(q);
      info.union_misses += shared.size();
      for (std::uint32_t j = 0; j < K; ++j) {
        std::int32_t* s = sel_h_.data() + (std::size_t(b) * K + j) * kTopK;
        std::uint32_t i = 0;
        // visible block rows (a plain resolve cannot name positions past the frontier: -1 there)
        for (std::uint32_t x = 0; x <= j; ++x) s[i++] = with_block ? static_cast<std::int32_t>(kHist + x) : -1;
        for (std::int32_t r : shared) s[i++] = r;
        for (std::uint32_t x = 0; x < kMissesPerQuery - kSharedMisses; ++x) s[i++] = take_fresh(q);
        info.union_misses += kMissesPerQuery - kSharedMisses;
        info.per_query_misses += kMissesPerQuery;
        for (std::int32_t hot = 0; i < kTopK; ++hot) s[i++] = hot;  // the hot set: rows 0 .. (prefix shared by all)
      }
    }
    DHB_CHECK(cudaMemcpyAsync(sel_d_.get(), sel_h_.data(), sel_h_.size() * 4, cudaMemcpyHostToDevice, s_));
    DHB_CHECK(cudaStreamSynchronize(s_));
    return info;
  }

  /// Device batch buffers of requests [q0, q0+C) with K queries (both methods).
  void set_batch(std::uint32_t q0, std::uint32_t C, std::uint32_t K) {
    std::vector<std::int32_t> slots(C), lengths(C, static_cast<std::int32_t>(kTopK)), req(std::size_t(C) * K);
    for (std::uint32_t b = 0; b < C; ++b) {
      slots[b] = static_cast<std::int32_t>(h_->slot_of(q0 + b));
      for (std::uint32_t j = 0; j < K; ++j) req[std::size_t(b) * K + j] = static_cast<std::int32_t>(q0 + b);
    }
    DHB_CHECK(cudaMemcpyAsync(slots_d_.get(), slots.data(), C * 4, cudaMemcpyHostToDevice, s_));
    DHB_CHECK(cudaMemcpyAsync(lengths_d_.get(), lengths.data(), C * 4, cudaMemcpyHostToDevice, s_));
    DHB_CHECK(cudaMemcpyAsync(req_d_.get(), req.data(), req.size() * 4, cudaMemcpyHostToDevice, s_));
    DHB_CHECK(cudaMemcpyAsync(count_d_.get(), &C, 4, cudaMemcpyHostToDevice, s_));
    DHB_CHECK(cudaStreamSynchronize(s_));
    // The verify descriptor: query j of entry b at (b*K + j)*k, per-query arrays strided by K_max.
    std::vector<std::int32_t> kr(C, static_cast<std::int32_t>(K)), qlen(std::size_t(C) * kMaxBlock, 0);
    std::vector<const std::int32_t*> selp(std::size_t(C) * kMaxBlock, nullptr);
    std::vector<std::int32_t*> locp(std::size_t(C) * kMaxBlock, nullptr);
    for (std::uint32_t b = 0; b < C; ++b)
      for (std::uint32_t j = 0; j < K; ++j) {
        const std::size_t at = (std::size_t(b) * K + j) * kTopK;
        qlen[std::size_t(b) * kMaxBlock + j] = static_cast<std::int32_t>(kTopK);
        selp[std::size_t(b) * kMaxBlock + j] = sel_d_.get() + at;
        locp[std::size_t(b) * kMaxBlock + j] = loc_d_.get() + at;
      }
    DHB_CHECK(cudaMemcpyAsync(queries_d_.get(), kr.data(), C * 4, cudaMemcpyHostToDevice, s_));
    DHB_CHECK(cudaMemcpyAsync(qlengths_d_.get(), qlen.data(), qlen.size() * 4, cudaMemcpyHostToDevice, s_));
    DHB_CHECK(cudaMemcpyAsync(selp_d_.get(), selp.data(), selp.size() * sizeof(void*), cudaMemcpyHostToDevice, s_));
    DHB_CHECK(cudaMemcpyAsync(locp_d_.get(), locp.data(), locp.size() * sizeof(void*), cudaMemcpyHostToDevice, s_));
    DHB_CHECK(cudaStreamSynchronize(s_));  // the host vectors die with this call
    C_ = C;
    K_ = K;
  }

  void enqueue_verify() {
    dhisparse::cuda::verify_batch_view v;
    v.count = count_d_.get();
    v.slots = slots_d_.get();
    v.queries = queries_d_.get();
    v.lengths = qlengths_d_.get();
    v.selection_ptrs = selp_d_.get();
    v.location_ptrs = locp_d_.get();
    v.max_block = kMaxBlock;
    v.capacity = C_;
    h_->verify(0, v, s_);
  }
  /// Query j of every request through the raw batch view: entries of request b at (b*K + j)*k.
  void enqueue_resolve(std::uint32_t j) {
    dhisparse::cuda::batch_view v;
    v.slots = slots_d_.get();
    v.selections = sel_d_.get() + std::size_t(j) * kTopK;
    v.locations = loc_d_.get() + std::size_t(j) * kTopK;
    v.lengths = lengths_d_.get();
    v.count = count_d_.get();
    v.stride = K_ * kTopK;
    v.capacity = C_;
    h_->resolve(0, v, s_, dhisparse::copy_layers::all);
  }

  /// Exact bytes at every location of every query of the current batch (outside timing).
  void check_bytes(const std::string& what) {
    DHB_CHECK(cudaStreamSynchronize(s_));
    const auto r = verifier_.locations(sel_d_.get(), loc_d_.get(), req_d_.get(), static_cast<int>(C_ * K_),
                                       static_cast<int>(kTopK), static_cast<int>(kTopK), h_->pool(0, 0),
                                       h_->space().rows(), kRowBytes, s_);
    if (r.bad)
      throw std::runtime_error("WRONG BYTES: " + what + ": " + std::to_string(r.bad) +
                               " entries do not hold their selected row (first: flat entry " + std::to_string(r.first) + ")");
  }

 private:
  std::int32_t take_fresh(std::uint32_t q) {
    if (next_fresh_[q] < 2 * kTopK) throw std::runtime_error("request " + std::to_string(q) + " ran out of fresh rows");
    return static_cast<std::int32_t>(next_fresh_[q]--);
  }
  cudaStream_t s_{};
  std::unique_ptr<hierarchy> h_;
  std::vector<std::uint32_t> next_fresh_;
  device_buffer<std::byte> flush_;
  unsigned flushes_ = 0;
  device_buffer<std::int32_t> sel_d_, loc_d_, req_d_, slots_d_, lengths_d_, queries_d_, qlengths_d_;
  device_buffer<const std::int32_t*> selp_d_;
  device_buffer<std::int32_t*> locp_d_;
  device_buffer<std::uint32_t> count_d_;
  std::vector<std::int32_t> sel_h_;
  std::uint32_t C_ = 0, K_ = 0;
  verifier verifier_;
  step_timer timer_;
};

std::unique_ptr<setup> g_setup;
setup& get_setup() {
  if (!g_setup) g_setup = std::make_unique<setup>();
  return *g_setup;
}

std::map<std::pair<std::uint32_t, std::uint32_t>, double> g_verify_us;  // (K, C) -> median

void fail(benchmark::State& state, const std::string& what) {
  ++g_failures;
  std::fprintf(stderr, "bench_cuda_verify: %s\n", what.c_str());
  state.SkipWithError(what.c_str());
}

enum class method { verify, k_resolves, verify_programmatic };
const char* name_of(method m) {
  switch (m) {
    case method::verify: return "verify";
    case method::k_resolves: return "k_resolves";
    case method::verify_programmatic: return "verify_programmatic";
  }
  return "?";
}
bool verifies(method m) { return m != method::k_resolves; }

void bm_round(benchmark::State& state, method x, std::uint32_t K, std::uint32_t C) {
  const std::string what = std::string(name_of(x)) + " K=" + std::to_string(K) + " C=" + std::to_string(C);
  try {
    auto& st = get_setup();
    auto& h = st.h();
    h.set_programmatic_launch(x == method::verify_programmatic);
    const std::uint32_t q0 = first_request(C);
    st.set_batch(q0, C, K);
    auto enqueue = [&] {
      if (verifies(x)) st.enqueue_verify();
      else
        for (std::uint32_t j = 0; j < K; ++j) st.enqueue_resolve(j);
    };
    // Warm-up (the first round fills the hot set), verified.
    setup::round_info info;
    for (std::uint32_t w = 0; w < kWarmupSteps; ++w) {
      info = st.make_round(q0, C, K, verifies(x));
      enqueue();
      h.check_errors(st.stream());
    }
    st.check_bytes(what + " after warm-up");
    // The union's host copies (one untimed round with stats after every launch).
    std::size_t copies = 0;
    info = st.make_round(q0, C, K, verifies(x));
    if (verifies(x)) {
      st.enqueue_verify();
      h.check_errors(st.stream());
      for (const auto& s : h.last_verify_stats(0)) copies += s.rows_copied;
    } else {
      for (std::uint32_t j = 0; j < K; ++j) {
        st.enqueue_resolve(j);
        h.check_errors(st.stream());
        for (const auto& s : h.last_stats(0)) copies += s.rows_copied;
      }
    }
    st.check_bytes(what + " (copy count round)");
    if (copies != info.union_misses)
      throw std::runtime_error("host copies " + std::to_string(copies) + ", expected the union's " +
                               std::to_string(info.union_misses) + " distinct fresh rows");

    std::vector<double> us;
    for (auto _ : state) {
      st.make_round(q0, C, K, verifies(x));  // fresh misses every step (untimed: manual time)
      if (g_flush_l2) st.flush_l2();
      const float ms = st.timer().time(st.stream(), enqueue);
      state.SetIterationTime(ms / 1e3);
      us.push_back(ms * 1e3);
    }
    h.check_errors(st.stream());
    st.check_bytes(what + " after the timed steps");

    const step_stats ss = summarize(us);
    if (x == method::verify) g_verify_us[{K, C}] = ss.median_us;
    state.SetLabel(name_of(x));
    auto& c = state.counters;
    c["K"] = K;
    c["C"] = C;
    c["median_us"] = ss.median_us;
    c["p10_us"] = ss.p10_us;
    c["p90_us"] = ss.p90_us;
    c["host_copies"] = static_cast<double>(copies);
    c["copies_per_query_sum"] = static_cast<double>(info.per_query_misses);
    c["copies_saved_by_union"] = static_cast<double>(info.per_query_misses) - static_cast<double>(copies);
    if (x != method::verify)
      if (auto it = g_verify_us.find({K, C}); it != g_verify_us.end() && it->second > 0)
        c[x == method::k_resolves ? "k_resolves_per_verify" : "vs_verify"] = ss.median_us / it->second;
  } catch (const std::exception& e) {
    fail(state, what + ": " + e.what());
  }
}

/// Per-session bytes of ring + staging: the planner's terms against what the hierarchy allocates
/// for speculation (requirements with K_max = 8 minus requirements without speculation, per slot).
void bm_memory(benchmark::State& state) {
  for (auto _ : state) {
  }
  const std::uint32_t n = total_requests();
  const auto with = hierarchy::requirements(config(n, kMaxBlock));
  const auto without = hierarchy::requirements(config(n, 1));
  dhisparse::drafter_shape drafter = dhisparse::drafters::dflash2;  // W 2048, K_max 8, p 64
  dhisparse::plan_inputs in;
  in.context_tokens = kHist;
  in.hot_rows = kHotRows;
  in.tail_rows = kTailRows;
  in.drafter = drafter;
  in.slots = n;
  in.staging_arenas = 1;  // one source, one payload layer live
  dhisparse::session_plan p;
  try {
    p = dhisparse::plan<bench_layout>(in);
  } catch (const std::exception& e) {
    fail(state, std::string("memory: ") + e.what());
    return;
  }
  auto& c = state.counters;
  c["slots"] = n;
  c["planner_staging_per_session_B"] = static_cast<double>(p.staging);
  c["planner_draft_ring_per_session_B"] = static_cast<double>(p.draft_ring);
  c["planner_ring_plus_staging_per_session_B"] = static_cast<double>(p.staging + p.draft_ring);
  const double extra_dev = static_cast<double>(with.device_bytes - without.device_bytes) / n;
  const double staging = double(kMaxBlock) * kTopK * kRowBytes;
  const double tail_growth = double(kMaxBlock) * kRowBytes;
  c["hierarchy_speculative_device_per_session_B"] = extra_dev;
  c["hierarchy_staging_per_session_B"] = staging;
  c["hierarchy_tail_ring_growth_per_session_B"] = tail_growth;
  c["hierarchy_verify_workspace_per_session_B"] = extra_dev - staging - tail_growth;
  c["hierarchy_speculative_pinned_B"] = static_cast<double>(with.pinned_bytes - without.pinned_bytes);
  // The draft ring a DFlash2 drafter allocates: cuda::draft_ring_store for the same W, K_max, p and
  // draft row (six layers, K and V of 1024 B each) over the same slots. It holds exactly R_d rows
  // per slot and no device metadata, so it equals the planner's term; a difference is a bug.
  using dflash2_ring = dhisparse::draft_ring<2048, 8, 64>;
  static_assert(dflash2_ring::window == dhisparse::drafters::dflash2.window &&
                dflash2_ring::max_block == dhisparse::drafters::dflash2.max_block &&
                dflash2_ring::page_rows == dhisparse::drafters::dflash2.page_rows);
  const auto ring = dhisparse::cuda::draft_ring_store<dflash2_ring>::requirements(
      {.slots = n,
       .row_bytes = dhisparse::drafters::dflash2_allocations_per_layer * dhisparse::drafters::dflash2_allocation_row_bytes,
       .layers = dhisparse::drafters::dflash2_draft_layers});
  c["allocated_draft_ring_per_session_B"] = static_cast<double>(ring.bytes) / n;
  c["allocated_ring_plus_staging_per_session_B"] = static_cast<double>(ring.bytes) / n + staging;
  if (ring.bytes_per_slot != p.draft_ring) fail(state, "memory: allocated draft ring differs from the planner's");
  state.SetLabel("memory (draft ring: planner vs cuda::draft_ring_store; staging: planner vs hierarchy)");
}

/// GLM-5.3 at the paper's 35 slots and 100K tokens with DFlash2 (K_max 8): verification memory per
/// GPU with every payload layer's own staging (dedicated_staging) against four shared arenas
/// (staging_arenas<4>), beside the planner's M_stage for chi = 4 and chi = 78. Byte counts from
/// hierarchy::requirements (K_max 8 minus K_max 1: staging, tail growth, verify workspace);
/// nothing is allocated.
void bm_memory_shared_staging(benchmark::State& state) {
  for (auto _ : state) {
  }
  using glm = dhisparse::layouts::glm53;
  using hot = dhisparse::lru_hot_cache<4096>;
  using dedicated = dhisparse::cuda::hierarchy<glm, hot>;
  using shared = dhisparse::cuda::hierarchy<glm, hot, dhisparse::fixed_budget_policy, dhisparse::staging_arenas<4>>;
  constexpr std::uint64_t slots = 35, context = 100'000;
  dhisparse::hierarchy_config spec;
  spec.max_requests = slots;
  spec.max_rows = context;
  spec.tail_rows = glm::page_rows;
  spec.max_block = dhisparse::drafters::dflash2.max_block;
  dhisparse::hierarchy_config plain = spec;
  plain.max_block = 1;
  const auto extra = [](const dhisparse::cuda::memory_requirements& with, const dhisparse::cuda::memory_requirements& without) {
    return static_cast<double>(with.device_bytes - without.device_bytes);
  };
  const double ded = extra(dedicated::requirements(spec), dedicated::requirements(plain));
  const double sh = extra(shared::requirements(spec), shared::requirements(plain));
  const auto p4 = dhisparse::plan<glm>({.context_tokens = context, .drafter = dhisparse::drafters::dflash2, .slots = slots});
  const auto p78 = dhisparse::plan<glm>(
      {.context_tokens = context, .drafter = dhisparse::drafters::dflash2, .slots = slots, .staging_arenas = 78});
  auto& c = state.counters;
  c["slots"] = static_cast<double>(slots);
  c["planner_staging_chi4_per_gpu_B"] = static_cast<double>(p4.staging_bytes_for_slots);
  c["planner_staging_chi78_per_gpu_B"] = static_cast<double>(p78.staging_bytes_for_slots);
  c["allocated_arenas_chi4_per_gpu_B"] = static_cast<double>(shared::staging_arena_bytes(spec));
  c["speculative_device_shared_per_gpu_B"] = sh;
  c["speculative_device_dedicated_per_gpu_B"] = ded;
  c["dedicated_per_shared"] = ded / sh;
  if (shared::staging_arena_bytes(spec) != p4.staging_bytes_for_slots)
    fail(state, "memory: shared staging arenas differ from the planner's M_stage");
  state.SetLabel("GLM-5.3, 35 slots, DFlash2: verification device bytes, dedicated vs 4 shared arenas");
}

void parse_own_flags(int& argc, char** argv) {
  int out = 1;
  for (int i = 1; i < argc; ++i) {
    unsigned v = 0;
    if (std::sscanf(argv[i], "--dh_timed_steps=%u", &v) == 1) g_timed_steps = std::max(5u, v);
    else if (std::sscanf(argv[i], "--dh_flush_l2=%u", &v) == 1) g_flush_l2 = v != 0;
    else argv[out++] = argv[i];
  }
  argc = out;
}

}  // namespace

int main(int argc, char** argv) {
  parse_own_flags(argc, argv);
  // Fresh rows one request needs: every K, all three methods, warm-up + copy count + timed rounds.
  std::uint64_t fresh = 0;
  for (std::uint32_t K : kBlocks)
    fresh += 3ull * (kWarmupSteps + 1 + g_timed_steps) * (kSharedMisses + K * (kMissesPerQuery - kSharedMisses));
  if (fresh + 2 * kTopK + kTailRows > kHist) {
    std::fprintf(stderr, "bench_cuda_verify: %u timed steps need %llu fresh rows per request, a history has %u\n",
                 g_timed_steps, static_cast<unsigned long long>(fresh), kHist);
    return 2;
  }
  benchmark::RegisterBenchmark("memory/ring_and_staging", bm_memory)->Iterations(1);
  benchmark::RegisterBenchmark("memory/glm53_shared_staging", bm_memory_shared_staging)->Iterations(1);
  for (std::uint32_t K : kBlocks)
    for (std::uint32_t C : kBatches)
      for (method x : {method::verify, method::k_resolves, method::verify_programmatic}) {
        const std::string name = std::string(name_of(x)) + "/K:" + std::to_string(K) + "/C:" + std::to_string(C);
        benchmark::RegisterBenchmark(name.c_str(), [x, K, C](benchmark::State& s) { bm_round(s, x, K, C); })
            ->UseManualTime()
            ->Iterations(g_timed_steps)
            ->Unit(benchmark::kMicrosecond);
      }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0)
    std::fprintf(stderr, "bench_cuda_verify: no CUDA device (every benchmark will fail)\n");
  benchmark::AddCustomContext("dhisparse_timed_steps", std::to_string(g_timed_steps));
  benchmark::AddCustomContext("dhisparse_flush_l2", g_flush_l2 ? "1" : "0");
  benchmark::RunSpecifiedBenchmarks();
  g_setup.reset();
  benchmark::Shutdown();
  if (g_failures) {
    std::fprintf(stderr, "bench_cuda_verify: %d configuration(s) failed (see error_message in the output)\n", g_failures);
    return 1;
  }
  return 0;
}
