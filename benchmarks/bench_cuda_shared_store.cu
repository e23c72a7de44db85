// bench_cuda_shared_store: tensor-parallel ranks resolving at the same moment, each GPU from one
// host store shared by every rank (docs/multi-gpu.md) or from a store of its own. It asks whether
// each GPU keeps its host-recovery bandwidth when every rank reads one copy of the histories, and
// how much host memory that copy saves. See docs/benchmarks.md.
//
//   own     every rank a plain cuda::hierarchy with its own pinned host store; every rank appends
//           the same rows into its own store (N copies of every history)
//   shared  one cuda::pinned_shared_host_store, rank r's hierarchy built over it with
//           hierarchy(cfg, store, r, stream); every rank appends the same rows, each page's host
//           copy is written by its owner only (one copy)
//
// Configuration: C = 128 requests, k = 2048, B = 4096, 20 % fresh host misses per request and step,
// 576-byte rows in one source of one payload layer (layouts::single_source), 32K-row histories,
// T = 64. Rank r runs on device r and on its own thread, with its own stream; every rank resolves
// the same selections, as tensor-parallel ranks do. Selections come from benchmarks/detail/
// workload.cuh as in bench_cuda_resolver: each step keeps k - m rows of the previous selection (hot
// hits) and draws m rows never selected before (fresh host misses). Both modes draw the same
// streams (walks of the same seed), so they resolve exactly the same rows.
//
// One iteration = one step of every rank: a std::barrier releases the rank threads together; each
// queues an L2 flush, then CUDA events around its resolve on its own stream (the flush keeps the
// stream busy, so the host's launch latency stays outside the events, as in bench_cuda_resolver).
// After every step, outside the events, each rank checks its resolve: no error entries, exactly
// C x m rows copied from host (after the fill step), and every returned location holding the
// generator's bytes of its selected row (a device compare, benchmarks/detail/common.cuh). The
// iteration time (UseManualTime) is the median over ranks of the step's event times.
//
// Counters (per rank r): rank<r>_us (median step), rank<r>_p10_us, rank<r>_p90_us, rank<r>_GBps
// (host bytes copied per step, from the hierarchy's resolve stats, / median step), rank<r>_device;
// in `shared`, rank<r>_vs_own (its GB/s over its GB/s in `own` of the same run: 1 means the GPU
// kept its host bandwidth). Also GBps_sum, launch_skew_us (median over steps of the spread of the
// ranks' host enqueue times: how close to "at once" the launches were), host_bytes (host-store
// bytes in use: the shared store's, or the sum of the own stores), host_bytes_saved (shared: the
// own run's sum, or N x its own when `own` was filtered out, less the shared bytes; own: 0) and
// pinned_bytes (pinned host memory the mode allocated, stores and per-rank staging).
//
// One GPU: ranks = min(--dh_ranks, devices), so one GPU gives one rank, and the two modes then do
// the same work (a store of one rank): the figures only show that the shared path costs nothing,
// and nothing is saved. --dh_same_device=1 puts all --dh_ranks ranks on device 0: the host bytes
// saved are then real, but the ranks share one GPU and one PCIe link, so rank<r>_GBps is each
// rank's share of that link, not an answer to the per-GPU bandwidth question.
//
// Extra flags (removed before Google Benchmark sees the command line):
//   --dh_ranks=N          tensor-parallel ranks (default 2; capped to the device count unless
//                         --dh_same_device=1)
//   --dh_same_device=0|1  every rank on device 0 (default 0)
//   --dh_timed_steps=N    timed steps (default 40, at least 10)
//   --dh_warmup_steps=N   warm-up steps after the fill step (default 5, at least 1)
//   --dh_flush_l2=0|1     overwrite 4x the L2 size before every step, outside the events (default 1)
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <dhisparse/cuda/hierarchy.cuh>
#include <dhisparse/cuda/shared_host_store.cuh>
#include <dhisparse/hierarchy_types.hpp>
#include <dhisparse/layouts/single_source.hpp>
#include <dhisparse/policies/hot_cache.hpp>
#include <dhisparse/policies/residency.hpp>
#include <dhisparse/types.hpp>

#include "detail/common.cuh"
#include "detail/workload.cuh"

namespace {

using namespace dhisparse_bench;

// --- the configuration ----------------------------------------------------------------------------

constexpr std::uint32_t kTopK = 2048;     // k
constexpr std::uint32_t kHotRows = 4096;  // B
constexpr std::uint32_t kTailRows = 64;   // T: one page (the hierarchy's default)
constexpr std::uint32_t kBatch = 128;     // C: every request of the histories, in every step
constexpr std::uint32_t kHist = 32768;    // rows of every request's history
constexpr int kRowBytes = 576;
constexpr double kMissRate = 0.20;
constexpr std::uint64_t kSeed = 0x5A4ED000ull;  // both modes: the same walk, so the same rows

using layout = dhisparse::layouts::single_source<kRowBytes, kTopK>;
using hierarchy = dhisparse::cuda::hierarchy<layout, dhisparse::lru_hot_cache<kHotRows>, dhisparse::fixed_budget_policy>;
using shared_store = dhisparse::cuda::pinned_shared_host_store<layout>;
constexpr std::uint32_t kPageRows = layout::page_rows;
constexpr std::size_t kHostPages = std::size_t(kBatch) * ((kHist + kPageRows - 1) / kPageRows);

std::uint32_t g_ranks_flag = 2;
bool g_same_device = false;
std::uint32_t g_timed_steps = 40;
std::uint32_t g_warmup_steps = 5;
bool g_flush_l2 = true;
int g_failures = 0;

std::uint32_t misses() { return static_cast<std::uint32_t>(std::llround(kMissRate * kTopK)); }

dhisparse::hierarchy_config config() {
  dhisparse::hierarchy_config cfg;
  cfg.max_requests = kBatch;
  cfg.max_rows = kHist;
  cfg.tail_rows = kTailRows;
  return cfg;  // host_pages 0: every slot at full capacity, kHostPages (the shared store's)
}

enum class mode { own, shared };
const char* name_of(mode x) { return x == mode::own ? "own" : "shared"; }

/// The devices of the ranks: rank r on device r, or all on device 0 (--dh_same_device).
std::vector<int> rank_devices() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) {
    (void)cudaGetLastError();
    devices = 0;
  }
  if (devices == 0) return {};
  const std::uint32_t n = g_same_device ? g_ranks_flag : std::min<std::uint32_t>(g_ranks_flag, devices);
  std::vector<int> d(n);
  for (std::uint32_t r = 0; r < n; ++r) d[r] = g_same_device ? 0 : static_cast<int>(r);
  return d;
}

int use_device(int d) {
  DHB_CHECK(cudaSetDevice(d));  // this thread's allocations, streams and launches go to device d
  return d;
}

/// The histories every rank appends, [request][row][row bytes], in mapped pinned memory: every GPU
/// reads it (portable). Written once by a kernel on device 0 through the mapping.
const pinned_buffer& pinned_history() {
  struct generated {
    pinned_buffer buf;
    generated() : buf((use_device(0), std::size_t(kBatch) * kHist * kRowBytes)) {
      fill_history_kernel<<<1024, 512>>>(reinterpret_cast<std::uint64_t*>(buf.get()), kBatch, kHist, kRowBytes / 8);
      DHB_CHECK(cudaGetLastError());
      DHB_CHECK(cudaDeviceSynchronize());
    }
  };
  static const generated h;
  return h.buf;
}

// --- what the ranks share with the benchmark's thread ---------------------------------------------

enum class command { setup, step, stop };

/// One rank's figures for the last command.
struct rank_report {
  float us = 0;                 ///< the step's event time
  std::uint64_t host_bytes = 0; ///< bytes the step copied from host (resolve stats)
  std::int64_t enqueue_ns = 0;  ///< host time just before the start event was queued
  std::size_t store_bytes_in_use = 0;  ///< after setup: the rank's host_bytes_in_use()
};

/// State shared by the benchmark's thread and the rank threads. The barrier orders every write
/// before an arrival ahead of every read after the phase completes, so plain fields suffice.
struct context {
  mode x;
  std::vector<int> devices;
  const stream* st = nullptr;
  shared_store* store = nullptr;  // shared mode only
  std::barrier<> sync;
  command cmd = command::setup;
  std::uint32_t step = 0;
  std::vector<rank_report> reports;
  std::mutex error_mutex;
  std::string error;

  context(mode m, std::vector<int> d)
      : x(m), devices(std::move(d)), sync(static_cast<std::ptrdiff_t>(devices.size()) + 1), reports(devices.size()) {}
  std::size_t ranks() const { return devices.size(); }
  void fail(const std::string& what) {
    const std::lock_guard<std::mutex> lock(error_mutex);
    if (error.empty()) error = what;
  }
  std::string failure() {
    const std::lock_guard<std::mutex> lock(error_mutex);
    return error;
  }
};

// =================================================================================================
// One rank: everything on its own device, created and used on its own thread.
// =================================================================================================
class rank_state {
 public:
  /// Builds the rank's hierarchy (own store, or rank `r` of the shared store), admits requests
  /// 0..C-1 and appends each whole history from the pinned history, then uploads the selections
  /// of every step. Returns once the rank's appends have finished (its stream synchronised): the
  /// setup phase's barrier then orders every owner's host writes before any rank's resolve
  /// (docs/multi-gpu.md, "Ordering on the CUDA backend").
  rank_state(context& c, std::size_t r)
      : device_(use_device(c.devices[r])), sel_(c.st->sel.size()), req_(kBatch), slots_(kBatch), loc_(std::size_t(kBatch) * kTopK),
        count_(1) {
    DHB_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking));
    h_ = c.store ? std::make_unique<hierarchy>(config(), *c.store, r, s_) : std::make_unique<hierarchy>(config(), s_);
    const std::byte* history = pinned_history().get();
    std::vector<std::int32_t> slots(kBatch);
    constexpr std::size_t chunk = 16384;
    for (std::uint32_t q = 0; q < kBatch; ++q) {
      const auto a = h_->admit(q, s_);
      if (!a) throw std::runtime_error("admission of request " + std::to_string(q) + " waited");
      slots[q] = static_cast<std::int32_t>(a.slot);
      for (std::size_t row = 0; row < kHist; row += chunk) {
        const std::size_t n = std::min<std::size_t>(chunk, kHist - row);
        h_->append(q, 0, history + (std::size_t(q) * kHist + row) * kRowBytes, n, s_);
      }
    }
    h_->check_errors(s_);  // synchronises s_
    h_->sync_books(s_);    // the books hold every row this rank wrote
    const stream& st = *c.st;
    const std::uint32_t n = kBatch;
    DHB_CHECK(cudaMemcpyAsync(sel_.get(), st.sel.data(), st.sel.size() * 4, cudaMemcpyHostToDevice, s_));
    DHB_CHECK(cudaMemcpyAsync(req_.get(), st.requests.data(), kBatch * 4, cudaMemcpyHostToDevice, s_));
    DHB_CHECK(cudaMemcpyAsync(slots_.get(), slots.data(), kBatch * 4, cudaMemcpyHostToDevice, s_));
    DHB_CHECK(cudaMemcpyAsync(count_.get(), &n, 4, cudaMemcpyHostToDevice, s_));
    int l2 = 0;
    DHB_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device_));
    flush_ = device_buffer<std::byte>(std::max<std::size_t>(4 * std::size_t(l2), std::size_t(64) << 20));
    DHB_CHECK(cudaStreamSynchronize(s_));  // the host vectors die with this call
    c.reports[r].store_bytes_in_use = h_->host_bytes_in_use();
  }
  rank_state(const rank_state&) = delete;
  rank_state& operator=(const rank_state&) = delete;
  ~rank_state() {
    cudaSetDevice(device_);
    h_.reset();  // waits for its device before its memory goes
    cudaStreamDestroy(s_);
  }

  /// Step `step` of the stream: the flush, then the timed resolve, then the checks (untimed).
  void run_step(const stream& st, std::uint32_t step, rank_report& out) {
    const std::int32_t* sel = sel_.get() + std::size_t(step) * kBatch * kTopK;
    if (g_flush_l2) DHB_CHECK(cudaMemsetAsync(flush_.get(), static_cast<int>(++flushes_ & 0xff), flush_.bytes(), s_));
    out.enqueue_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                         std::chrono::steady_clock::now().time_since_epoch())
                         .count();
    const float ms = timer_.time(s_, [&] { resolve(sel); });
    out.us = ms * 1e3f;
    out.host_bytes = check(st, step, sel);
  }

 private:
  /// One resolve of the whole batch through the raw (graph-capturable) batch view: selections
  /// [C][k], locations out in selection order.
  void resolve(const std::int32_t* sel) {
    dhisparse::cuda::batch_view v;
    v.slots = slots_.get();
    v.selections = sel;
    v.locations = loc_.get();
    v.count = count_.get();
    v.stride = kTopK;
    v.capacity = kBatch;
    h_->resolve(0, v, s_, dhisparse::copy_layers::all);
  }

  /// Throws unless the step resolved cleanly: no bad entry, exactly the rows the stream makes
  /// fresh copied from host, every location holding its row's bytes. Returns the host bytes copied.
  std::uint64_t check(const stream& st, std::uint32_t step, const std::int32_t* sel) {
    h_->check_errors(s_);  // synchronises s_; throws the typed error of a bad entry
    std::size_t bad = 0;
    for (const auto& e : h_->last_errors(0)) bad += e.code != dhisparse::cuda::status_ok;
    if (bad) throw std::runtime_error(std::to_string(bad) + " batch entries report an error");
    const auto stats = h_->last_stats(0);  // synchronises the hierarchy's stream, s_
    if (stats.size() != kBatch)
      throw std::runtime_error("resolved " + std::to_string(stats.size()) + " entries, expected " + std::to_string(kBatch));
    std::uint64_t rows = 0, bytes = 0;
    for (const auto& x : stats) {
      rows += x.rows_copied;
      bytes += x.bytes_copied;
    }
    // After the fill step, exactly the m rows per request drawn fresh are copied
    // (benchmarks/detail/workload.cuh); the fill's count is not pinned, as in bench_cuda_resolver.
    const std::uint64_t want = std::uint64_t(kBatch) * st.m;
    if (step > 0 && rows != want)
      throw std::runtime_error("WRONG BYTES: step " + std::to_string(step) + " copied " + std::to_string(rows) +
                               " rows from host, expected " + std::to_string(want));
    const verifier::result v = verify_.locations(sel, loc_.get(), req_.get(), static_cast<int>(kBatch),
                                                 static_cast<int>(kTopK), static_cast<int>(kTopK), h_->pool(0, 0),
                                                 h_->space().rows(), kRowBytes, s_);
    if (v.bad)
      throw std::runtime_error("WRONG BYTES: step " + std::to_string(step) + ": " + std::to_string(v.bad) +
                               " entries do not hold their selected row (first: flat entry " +
                               std::to_string(v.first) + ")");
    return bytes;
  }

  int device_;  // first: the members below are created with it current
  cudaStream_t s_{};
  std::unique_ptr<hierarchy> h_;
  device_buffer<std::int32_t> sel_, req_, slots_, loc_;
  device_buffer<std::uint32_t> count_;
  device_buffer<std::byte> flush_;
  unsigned flushes_ = 0;
  verifier verify_;
  step_timer timer_;
};

/// The body of rank r's thread: waits for a command, runs it, reports, until told to stop. A rank
/// that failed keeps meeting the barrier (doing nothing), so no other thread waits for it forever.
void rank_thread(context& c, std::size_t r) {
  std::unique_ptr<rank_state> rs;
  bool dead = false;
  for (;;) {
    c.sync.arrive_and_wait();  // go: every rank starts the command at once
    if (c.cmd == command::stop) break;
    if (!dead) {
      try {
        if (c.cmd == command::setup) rs = std::make_unique<rank_state>(c, r);
        else rs->run_step(*c.st, c.step, c.reports[r]);
      } catch (const std::exception& e) {
        dead = true;
        c.fail("rank " + std::to_string(r) + " (device " + std::to_string(c.devices[r]) + "): " + e.what());
      }
    }
    c.sync.arrive_and_wait();  // done
  }
  try {
    rs.reset();  // on its own thread, before the benchmark's thread frees the shared store
  } catch (...) {
  }
}

/// The rank threads of one benchmark run; run() is one command, every rank at once.
class rank_pool {
 public:
  explicit rank_pool(context& c) : c_(c) {
    for (std::size_t r = 0; r < c.ranks(); ++r) threads_.emplace_back(rank_thread, std::ref(c), r);
  }
  ~rank_pool() {
    c_.cmd = command::stop;
    c_.sync.arrive_and_wait();
    for (auto& t : threads_) t.join();
  }
  rank_pool(const rank_pool&) = delete;
  rank_pool& operator=(const rank_pool&) = delete;
  /// Runs `cmd` (at `step`) on every rank; false when a rank has failed (context::failure says why).
  bool run(command cmd, std::uint32_t step = 0) {
    c_.cmd = cmd;
    c_.step = step;
    c_.sync.arrive_and_wait();  // go
    c_.sync.arrive_and_wait();  // done
    return c_.failure().empty();
  }

 private:
  context& c_;
  std::vector<std::thread> threads_;
};

// =================================================================================================
// Benchmarks
// =================================================================================================

/// The `own` run's figures, for the shared run's ratios (both modes run in one process).
struct own_figures {
  std::vector<double> gbps;
  std::size_t host_bytes = 0;
};
std::optional<own_figures> g_own;

void fail(benchmark::State& state, const std::string& what) {
  ++g_failures;
  std::fprintf(stderr, "bench_cuda_shared_store: %s\n", what.c_str());
  state.SkipWithError(what.c_str());
}

double median_of(std::vector<double> v) { return summarize(std::move(v)).median_us; }

void bm_mode(benchmark::State& state, mode x) {
  const std::string what = name_of(x);
  try {
    const std::vector<int> devices = rank_devices();
    if (devices.empty()) {
      fail(state, what + ": no CUDA device");
      return;
    }
    const std::size_t N = devices.size();
    (void)pinned_history();  // generated once, before any rank starts
    // The same walk for both modes: the same selections and fresh rows, drawn on the host.
    history_walk walk(kBatch, kHist, kTailRows, kTopK, kSeed, kHotRows);
    std::vector<std::int32_t> requests(kBatch);
    std::iota(requests.begin(), requests.end(), 0);
    const stream st = stream_builder::generate(walk, requests, misses(), g_warmup_steps, g_timed_steps);

    use_device(devices[0]);
    // Declared before the ranks' pool: the hierarchies over it go first (docs/multi-gpu.md).
    std::unique_ptr<shared_store> store;
    if (x == mode::shared) store = std::make_unique<shared_store>(N, kHostPages);
    context c(x, devices);
    c.st = &st;
    c.store = store.get();
    rank_pool pool(c);
    if (!pool.run(command::setup)) {
      fail(state, what + ": setup: " + c.failure());
      return;
    }
    std::size_t host_bytes = 0;
    if (store) host_bytes = store->host_bytes_in_use();
    else
      for (const auto& r : c.reports) host_bytes += r.store_bytes_in_use;

    for (std::uint32_t step = 0; step < st.first_timed(); ++step)  // fill and warm-up, checked
      if (!pool.run(command::step, step)) {
        fail(state, what + ": step " + std::to_string(step) + ": " + c.failure());
        return;
      }

    std::vector<std::vector<double>> us(N);
    std::vector<double> skew_us;
    std::vector<std::uint64_t> bytes(N, 0);
    std::uint32_t step = st.first_timed();
    bool failed = false;
    for (auto _ : state) {
      if (step >= st.steps()) {
        fail(state, what + ": more iterations than generated steps");
        failed = true;
        break;
      }
      if (!pool.run(command::step, step)) {
        fail(state, what + ": step " + std::to_string(step) + ": " + c.failure());
        failed = true;
        break;
      }
      std::vector<double> step_us(N);
      std::int64_t first = c.reports[0].enqueue_ns, last = first;
      for (std::size_t r = 0; r < N; ++r) {
        step_us[r] = c.reports[r].us;
        us[r].push_back(c.reports[r].us);
        bytes[r] = c.reports[r].host_bytes;  // every timed step copies C x m rows: checked
        first = std::min(first, c.reports[r].enqueue_ns);
        last = std::max(last, c.reports[r].enqueue_ns);
      }
      skew_us.push_back(double(last - first) / 1e3);
      state.SetIterationTime(median_of(step_us) / 1e6);
      ++step;
    }
    if (failed || us[0].empty()) return;  // no figures from a failed run

    auto& k = state.counters;
    k["ranks"] = double(N);
    k["devices"] = double(std::set<int>(devices.begin(), devices.end()).size());
    k["C"] = kBatch;
    k["k"] = kTopK;
    k["B"] = kHotRows;
    k["row_bytes"] = kRowBytes;
    k["history_rows"] = kHist;
    k["miss_pct"] = kMissRate * 100;
    k["misses_per_step"] = double(kBatch) * misses();
    k["timed_steps"] = double(us[0].size());
    k["verified_steps"] = double(us[0].size() + st.first_timed());
    k["rows_drawn"] = double(st.drawn);
    std::vector<double> medians(N), gbps(N);
    double sum_gbps = 0;
    for (std::size_t r = 0; r < N; ++r) {
      const step_stats s = summarize(us[r]);
      medians[r] = s.median_us;
      gbps[r] = s.median_us > 0 ? double(bytes[r]) / (s.median_us * 1e3) : 0;
      sum_gbps += gbps[r];
      const std::string p = "rank" + std::to_string(r) + "_";
      k[p + "device"] = devices[r];
      k[p + "us"] = s.median_us;
      k[p + "p10_us"] = s.p10_us;
      k[p + "p90_us"] = s.p90_us;
      k[p + "GBps"] = gbps[r];
      if (x == mode::shared && g_own && g_own->gbps.size() == N && g_own->gbps[r] > 0)
        k[p + "vs_own"] = gbps[r] / g_own->gbps[r];
    }
    k["median_us"] = median_of(medians);
    k["host_bytes_per_step"] = double(bytes[0]);
    k["GBps_sum"] = sum_gbps;
    k["launch_skew_us"] = median_of(skew_us);
    k["host_bytes"] = double(host_bytes);
    // Pinned memory allocated: N own stores and staging, or one store plus each rank's staging.
    const auto req = hierarchy::requirements(config());
    const std::size_t store_bytes = hierarchy::host_store_bytes(config(), 0);
    k["pinned_bytes"] = x == mode::own ? double(N * req.pinned_bytes)
                                       : double(store->host_store_bytes() + N * (req.pinned_bytes - store_bytes));
    if (x == mode::own) {
      g_own = own_figures{gbps, host_bytes};
      k["host_bytes_saved"] = 0;
    } else {
      // The own run's bytes in use, or N copies of this store's (what N own stores hold).
      const std::size_t own = g_own && g_own->gbps.size() == N ? g_own->host_bytes : N * host_bytes;
      k["host_bytes_own"] = double(own);
      k["host_bytes_saved"] = double(own) - double(host_bytes);
    }
    state.SetLabel(what);
  } catch (const std::exception& e) {
    fail(state, what + ": " + e.what());
  }
}

/// Removes --dh_* flags from argv (Google Benchmark rejects flags it does not know). False on a
/// malformed value of one of ours.
bool parse_own_flags(int& argc, char** argv) {
  int out = 1;
  bool ok = true;
  for (int i = 1; i < argc; ++i) {
    unsigned v = 0;
    if (std::sscanf(argv[i], "--dh_ranks=%u", &v) == 1) {
      ok = ok && v >= 1 && v <= shared_store::max_ranks;
      g_ranks_flag = std::max(1u, v);
    } else if (std::sscanf(argv[i], "--dh_same_device=%u", &v) == 1) g_same_device = v != 0;
    else if (std::sscanf(argv[i], "--dh_timed_steps=%u", &v) == 1) g_timed_steps = std::max(10u, v);
    else if (std::sscanf(argv[i], "--dh_warmup_steps=%u", &v) == 1) g_warmup_steps = std::max(1u, v);
    else if (std::sscanf(argv[i], "--dh_flush_l2=%u", &v) == 1) g_flush_l2 = v != 0;
    else if (std::strncmp(argv[i], "--dh_", 5) == 0) ok = false;
    else argv[out++] = argv[i];
  }
  argc = out;
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  if (!parse_own_flags(argc, argv)) {
    std::fprintf(stderr, "bench_cuda_shared_store: a --dh_ flag is unknown or has a bad value (see docs/benchmarks.md)\n");
    return 2;
  }
  {
    // The walk's bound: fresh rows a request can draw in one configuration (its history less the
    // tail, the cache guard of B + k rows and the current selection; benchmarks/detail/workload.cuh).
    const std::uint64_t limit = kHist - kTailRows - (kHotRows + 2 * kTopK);
    const std::uint64_t need = kTopK + std::uint64_t(g_warmup_steps + g_timed_steps) * misses();
    if (need > limit) {
      std::fprintf(stderr,
                   "bench_cuda_shared_store: %llu fresh rows per request needed, a history allows %llu; use fewer "
                   "steps\n",
                   static_cast<unsigned long long>(need), static_cast<unsigned long long>(limit));
      return 2;
    }
  }
  const std::vector<int> devices = rank_devices();
  const std::size_t N = std::max<std::size_t>(devices.size(), 1);
  // `own` first: `shared` reports its ratios against it.
  for (mode x : {mode::own, mode::shared}) {
    char name[160];
    std::snprintf(name, sizeof name, "shared_store/%s/ranks:%zu/C:%u/miss_pct:%g", name_of(x), N, kBatch,
                  kMissRate * 100);
    benchmark::RegisterBenchmark(name, [x](benchmark::State& s) { bm_mode(s, x); })
        ->UseManualTime()
        ->Iterations(g_timed_steps)
        ->Unit(benchmark::kMicrosecond);
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  if (devices.empty()) std::fprintf(stderr, "bench_cuda_shared_store: no CUDA device (every benchmark will fail)\n");
  benchmark::AddCustomContext("dhisparse_ranks", std::to_string(devices.size()));
  benchmark::AddCustomContext("dhisparse_same_device", g_same_device ? "1" : "0");
  benchmark::AddCustomContext("dhisparse_timed_steps", std::to_string(g_timed_steps));
  benchmark::AddCustomContext("dhisparse_warmup_steps", std::to_string(g_warmup_steps));
  benchmark::AddCustomContext("dhisparse_history_rows", std::to_string(kHist));
  benchmark::AddCustomContext("dhisparse_flush_l2", g_flush_l2 ? "1" : "0");
  for (std::size_t r = 0; r < devices.size(); ++r) {
    // Which GPU, and where on the PCIe tree (two GPUs behind one switch share its uplink).
    cudaDeviceProp p{};
    char bus[32] = "?";
    if (cudaGetDeviceProperties(&p, devices[r]) != cudaSuccess ||
        cudaDeviceGetPCIBusId(bus, sizeof bus, devices[r]) != cudaSuccess)
      (void)cudaGetLastError();
    benchmark::AddCustomContext("dhisparse_rank" + std::to_string(r) + "_device",
                                std::to_string(devices[r]) + " " + p.name + " " + bus);
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  if (g_failures) {
    std::fprintf(stderr, "bench_cuda_shared_store: %d benchmark(s) failed (see error_message in the output)\n",
                 g_failures);
    return 1;
  }
  return 0;
}
