// Forward progress: every kernel of a step completes while a kernel on another stream holds all but
// a few SMs (docs/design.md, "Forward progress"). An engine overlaps the step with kernels that
// spin (communication kernels waiting on their peers, persistent kernels waiting on flags), so a
// resolve, verify or follower copy that needs its CTAs resident at once, or dispatched in index
// order, hangs until they end.
//
// An occupier kernel on a non-blocking stream takes whole SMs (one CTA per SM: each asks for the
// device's maximum shared memory per block, which leaves no room for any other CTA) and spins on a
// flag in mapped pinned memory, with a hard limit of 10 s (%globaltimer) so the test can never hang
// for good. While it holds `held` SMs, the test launches on its own stream
//  * resolve of C = 64 and 128 (576-byte rows, a follower layer; producer_only + copy_follower
//    and `all` alternate) and C = 256 (656-byte rows), k = 2048, >= 20 % fresh misses, 8K-row
//    histories (on a 132-SM GPU, one resolver CTA per SM: at C = 64 the entry CTAs copy nothing
//    and are counted at their start; at 128 they copy and, before, waited for each other; 256 is
//    more entries than CTAs, drawn from the ticket counter);
//  * speculative verify of C = 128 rounds of two queries (k = 2048, producer_only) and its
//    follower copy;
// and requires the stream to finish within 3 s while the occupier still holds its SMs (it FAILS
// otherwise). Held SMs: all but 4, all but 1 (far fewer free SMs than the grid's co-resident
// need), and half (the trust issue's 66 of 132). Then the occupier is released and the results
// are checked exactly against the host backend (locations, stats) and the test's own model (every
// returned location holds the selected row's bytes in every materialised layer,
// tests/support/row_content.hpp).
// Run: ctest -L gpu -R test_cuda_forward_progress
#include "cuda_test_support.cuh"
#include "fresh_rows.cuh"

#include <cstdlib>

#include <dhisparse/workload/selection_generator.hpp>

#include "../support/row_content.hpp"

namespace {

using namespace dhtest;
namespace rc = ::dhisparse_testing;

// Every kernel is loaded when the context is created: a lazily loaded kernel may synchronise the
// context at its first launch, which would wait for the occupier (and so measure nothing).
const int eager_loading = [] { return setenv("CUDA_MODULE_LOADING", "EAGER", 1); }();

constexpr std::size_t kTopK = 2048, kHotRows = 4096, kPageRows = 64, kTail = 64, kHistory = 8192;
constexpr double kFreshShare = 0.25;        // asked of the generator; at least 20 % is required
constexpr double kDeadlineSeconds = 3.0;    // the held kernel must finish within this
constexpr unsigned long long kOccupierLimitNs = 10'000'000'000ull;  // the occupier gives up after 10 s


// ------------------------------------------------------------------ occupier

/// ctl[0]: release flag (host writes 1); ctl[1]: set when a CTA gave up at the time limit;
/// ctl[2 + b]: CTA b is running. One CTA per SM (maximum shared memory); only thread 0 spins.
__global__ void occupy_sms(volatile int* ctl, unsigned long long limit_ns) {
  extern __shared__ unsigned char held_shared[];
  if (threadIdx.x != 0) return;
  held_shared[0] = 1;
  ctl[2 + blockIdx.x] = 1;
  __threadfence_system();
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  for (;;) {
    if (ctl[0] != 0) return;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    if (now - start > limit_ns) {
      ctl[1] = 1;
      __threadfence_system();
      return;
    }
    __nanosleep(1000);
  }
}

class occupier {
 public:
  occupier() {
    int device = 0;
    DHTEST_CUDA(cudaGetDevice(&device));
    DHTEST_CUDA(cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, device));
    DHTEST_CUDA(cudaDeviceGetAttribute(&shared_, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    DHTEST_CUDA(cudaFuncSetAttribute(occupy_sms, cudaFuncAttributeMaxDynamicSharedMemorySize, shared_));
    int per_sm = 0;
    DHTEST_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, occupy_sms, 32, shared_));
    REQUIRE(per_sm == 1);  // each occupier CTA holds a whole SM
    int* ctl = nullptr;
    DHTEST_CUDA(cudaHostAlloc(&ctl, (2 + sms_) * sizeof(int), cudaHostAllocMapped));
    ctl_ = ctl;  // read and written through volatile: the occupier writes it while the host polls
    DHTEST_CUDA(cudaHostGetDevicePointer(reinterpret_cast<void**>(&dctl_), ctl, 0));
    DHTEST_CUDA(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
  }
  ~occupier() {
    ctl_[0] = 1;
    cudaStreamSynchronize(side_);
    cudaStreamDestroy(side_);
    cudaFreeHost(const_cast<int*>(ctl_));
  }
  [[nodiscard]] int sms() const { return sms_; }

  /// Takes `held` SMs and returns once every occupier CTA runs.
  void hold(int held) {
    REQUIRE(held >= 1);
    REQUIRE(held < sms_);
    held_ = held;
    for (int i = 0; i < 2 + sms_; ++i) ctl_[i] = 0;
    occupy_sms<<<held, 32, static_cast<std::size_t>(shared_), side_>>>(dctl_, kOccupierLimitNs);
    DHTEST_CUDA(cudaGetLastError());
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
      int running = 0;
      for (int b = 0; b < held; ++b) running += ctl_[2 + b];
      if (running == held) return;
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > 5.0) {
        release();
        DHTEST_FAIL("the occupier's " << held << " CTAs did not all start (" << running << " running)");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  /// The occupier still runs and none of its CTAs gave up.
  [[nodiscard]] bool holding() const { return cudaStreamQuery(side_) == cudaErrorNotReady && ctl_[1] == 0; }
  void release() {
    ctl_[0] = 1;
    wait_or_die(side_, "occupier release", 30.0);
  }

  /// Waits for `stream` while the SMs are held: true when it finished within the deadline with
  /// every occupier CTA still spinning. Releases the occupier either way.
  bool finishes_while_held(cudaStream_t stream, const std::string& ctx) {
    const auto start = std::chrono::steady_clock::now();
    double seconds = 0;
    bool done = false;
    for (;;) {
      const cudaError_t e = cudaStreamQuery(stream);
      seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (e == cudaSuccess) {
        done = true;
        break;
      }
      if (e != cudaErrorNotReady) {
        release();
        DHTEST_FAIL(ctx << ": cudaStreamQuery -> " << cudaGetErrorName(e));
      }
      if (seconds > kDeadlineSeconds) break;
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
    const bool held = holding();
    release();
    std::printf("[forward progress] %s: %d of %d SMs held, %s after %.3f ms%s\n", ctx.c_str(), held_, sms_,
                done ? "finished" : "NOT finished", seconds * 1e3, held ? "" : " (occupier no longer holding)");
    if (done && !held)
      DHTEST_FAIL(ctx << ": the occupier stopped holding its SMs before the kernel finished: the test proves nothing");
    if (!done) wait_or_die(stream, ctx + ": after the occupier was released");
    return done;
  }

 private:
  int sms_ = 0, shared_ = 0, held_ = 0;
  volatile int* ctl_ = nullptr;
  int* dctl_ = nullptr;
  cudaStream_t side_ = nullptr;
};

/// The SM counts a test holds: all but 4, all but 1, half.
std::vector<int> held_counts(int sms) { return {sms - 4, sms - 1, sms / 2}; }

// ------------------------------------------------------------------ exactness on the device

/// Every entry of `dsel`/`dloc` holds its row's bytes in payload layers [0, layers).
template <class Device>
void check_bytes(Device& dev, cudaStream_t stream, const dhc::device_buffer<row_index>& dsel,
                 const dhc::device_buffer<location>& dloc, const dhc::device_buffer<std::uint64_t>& dtags,
                 std::uint32_t entries, std::uint32_t entries_per_tag, std::size_t row_bytes, std::size_t layers,
                 const std::string& ctx) {
  for (std::size_t l = 0; l < layers; ++l) {
    const auto bad = count_wrong_rows(dev, stream, dsel, dloc, dtags, entries, entries_per_tag, row_bytes, l, ctx);
    if (bad.count != 0)
      DHTEST_FAIL(ctx << ": layer " << l << ": " << bad.count << " entries do not hold their row's bytes; first: entry "
                      << bad.first);
  }
}

// ------------------------------------------------------------------ resolve

template <std::size_t RowBytes, std::size_t Layers>
void run_resolve(std::size_t C, std::uint64_t seed) {
  using L = headline_layout<RowBytes, Layers>;
  static_assert(L::top_k == kTopK && L::page_rows == kPageRows);
  using Hot = dh::lru_hot_cache<kHotRows>;
  INFO("resolve, C = " << C << ", " << RowBytes << "-byte rows, " << Layers << " payload layer(s)");
  occupier occ;
  const std::vector<int> holds = held_counts(occ.sms());

  dh::hierarchy_config cfg;
  cfg.max_requests = C;
  cfg.max_rows = kHistory;
  cfg.tail_rows = kTail;
  cudaStream_t stream = nullptr;
  DHTEST_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    dh::host_hierarchy<L, Hot> host(cfg);
    dhc::hierarchy<L, Hot> dev(cfg, stream);
    std::vector<request_id> ids(C);
    std::vector<std::uint64_t> tags(C);
    const std::vector<std::int64_t> frontier(C, static_cast<std::int64_t>(kHistory));
    for (std::size_t i = 0; i < C; ++i) {
      ids[i] = 7000 + 3 * i;
      tags[i] = rc::request_tag(ids[i]);
      REQUIRE(host.admit(ids[i]).admitted);
      REQUIRE(dev.admit(ids[i], stream).admitted);
      const auto rows = rc::make_append_buffer(tags[i], 0, Layers, RowBytes, 0, kHistory);
      host.append(ids[i], 0, rows, kHistory);
      dev.append(ids[i], 0, std::span<const std::byte>(rows), kHistory, stream);
      DHTEST_CUDA(cudaStreamSynchronize(stream));  // `rows` is reused
    }
    dhc::device_buffer<row_index> dsel(C * kTopK);
    dhc::device_buffer<location> dloc(C * kTopK);
    dhc::device_buffer<std::uint64_t> dtags(C);
    DHTEST_CUDA(cudaMemcpy(dtags.data(), tags.data(), C * sizeof(std::uint64_t), cudaMemcpyHostToDevice));

    dh::workload::selection_params params;
    params.top_k = kTopK;
    dh::workload::selection_batch gens(params, seed, C);
    std::vector<row_index> sel(C * kTopK);
    std::vector<location> want(C * kTopK), got(C * kTopK);

    // Step 0 runs with every SM free (it also loads the kernels); then one step per held count.
    for (std::size_t step = 0; step <= holds.size(); ++step) {
      const int held = step == 0 ? 0 : holds[step - 1];
      const bool producer_only = Layers > 1 && step % 2 == 1;
      const auto mode = producer_only ? dh::copy_layers::producer_only : dh::copy_layers::all;
      const std::string ctx = "resolve C=" + std::to_string(C) + " step " + std::to_string(step) +
                              (producer_only ? " (producer_only + copy_follower)" : " (all)");
      INFO(ctx << ", " << held << " SMs held");

      const auto [own_copied, selected] =
          generate_fresh_step(host, std::span<const request_id>(ids), frontier, kTail, kTopK, {kFreshShare, 2}, gens, sel);
      REQUIRE(static_cast<double>(own_copied) >= 0.20 * static_cast<double>(selected));

      // Host backend (the specification).
      std::vector<dh::resolve_item> hitems(C);
      for (std::size_t i = 0; i < C; ++i)
        hitems[i] = {ids[i], std::span<const row_index>(sel).subspan(i * kTopK, kTopK),
                     std::span<location>(want).subspan(i * kTopK, kTopK)};
      const dh::resolve_stats host_total = host.resolve(0, std::span<const dh::resolve_item>(hitems), mode);
      if (producer_only)
        for (std::size_t l = 1; l < Layers; ++l) host.copy_follower(0, l);

      // CUDA backend, with `held` SMs taken by another stream's kernel.
      DHTEST_CUDA(cudaMemcpyAsync(dsel.data(), sel.data(), sel.size() * sizeof(row_index), cudaMemcpyHostToDevice, stream));
      DHTEST_CUDA(cudaMemsetAsync(dloc.data(), 0x7A, dloc.bytes(), stream));
      DHTEST_CUDA(cudaStreamSynchronize(stream));
      std::vector<dhc::batch_item> ditems(C);
      for (std::size_t i = 0; i < C; ++i)
        ditems[i] = {ids[i], dsel.data() + i * kTopK, static_cast<std::int32_t>(kTopK), dloc.data() + i * kTopK};
      DHTEST_CUDA(cudaDeviceSynchronize());  // nothing of the hierarchy's own streams is still in flight
      if (held > 0) occ.hold(held);
      dev.resolve(0, std::span<const dhc::batch_item>(ditems), stream, mode);
      if (producer_only)
        for (std::size_t l = 1; l < Layers; ++l) dev.copy_follower(0, l, stream);
      if (held > 0) {
        const bool done = occ.finishes_while_held(stream, ctx);
        if (!done)
          DHTEST_FAIL(ctx << ": did not finish within " << kDeadlineSeconds << " s while another stream held " << held
                          << " of " << occ.sms() << " SMs (it finished once they were released)");
      } else {
        wait_or_die(stream, ctx);
      }

      // Exact: the host's locations and stats, and every location holds its row's bytes.
      dev.check_errors(stream);
      DHTEST_CUDA(cudaMemcpy(got.data(), dloc.data(), got.size() * sizeof(location), cudaMemcpyDeviceToHost));
      for (std::size_t i = 0; i < C; ++i) {
        const std::string diff = diff_sequence<location, location>(
            "locations of request " + std::to_string(ids[i]), std::span<const location>(want).subspan(i * kTopK, kTopK),
            std::span<const location>(got).subspan(i * kTopK, kTopK));
        if (!diff.empty()) DHTEST_FAIL(ctx << ": " << diff);
      }
      dh::resolve_stats dev_total;
      for (const auto& s : dev.last_stats(0)) dev_total += s;
      INFO("host " << stats_text(host_total) << ", device " << stats_text(dev_total));
      REQUIRE(dev_total == host_total);
      REQUIRE(dev_total.rows_copied == own_copied);
      check_bytes(dev, stream, dsel, dloc, dtags, static_cast<std::uint32_t>(C * kTopK), kTopK, RowBytes, Layers, ctx);
      for (std::size_t i = 0; i < C; i += 17) {
        INFO(ctx << ": request " << ids[i]);
        DHTEST_REQUIRE_SAME(row_index, "hot rows", host.hot_rows_of(ids[i], 0), dev.hot_rows_of(ids[i], 0));
        DHTEST_REQUIRE_SAME(typename Hot::order_index, "LRU order", host.lru_order_of(ids[i], 0),
                            dev.lru_order_of(ids[i], 0));
      }
    }
  }
  DHTEST_CUDA(cudaStreamDestroy(stream));
}

// ------------------------------------------------------------------ verify

void run_verify(std::size_t C, std::uint64_t seed) {
  constexpr std::size_t RowBytes = 576, Layers = 2, Kr = 2;
  using L = headline_layout<RowBytes, Layers>;
  static_assert(L::top_k == kTopK && L::page_rows == kPageRows);
  using Hot = dh::lru_hot_cache<kHotRows>;
  INFO("verify, C = " << C << ", K_r = " << Kr);
  occupier occ;
  const std::vector<int> holds = held_counts(occ.sms());

  dh::hierarchy_config cfg;
  cfg.max_requests = C;
  cfg.max_rows = kHistory + 16;  // a round commits one position and stages K_r
  cfg.tail_rows = kTail;
  cfg.max_block = Kr;
  cudaStream_t stream = nullptr;
  DHTEST_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    dh::host_hierarchy<L, Hot> host(cfg);
    dhc::hierarchy<L, Hot> dev(cfg, stream);
    std::vector<request_id> ids(C);
    std::vector<std::uint64_t> tags(C);
    std::vector<std::int64_t> frontier(C, static_cast<std::int64_t>(kHistory));
    for (std::size_t i = 0; i < C; ++i) {
      ids[i] = 5000 + 11 * i;
      tags[i] = rc::request_tag(ids[i]);
      REQUIRE(host.admit(ids[i]).admitted);
      REQUIRE(dev.admit(ids[i], stream).admitted);
      const auto rows = rc::make_append_buffer(tags[i], 0, Layers, RowBytes, 0, kHistory);
      host.append(ids[i], 0, rows, kHistory);
      dev.append(ids[i], 0, std::span<const std::byte>(rows), kHistory, stream);
      DHTEST_CUDA(cudaStreamSynchronize(stream));
    }
    const std::size_t per_request = Kr * kTopK;
    dhc::device_buffer<row_index> dsel(C * per_request);
    dhc::device_buffer<location> dloc(C * per_request);
    dhc::device_buffer<std::uint64_t> dtags(C);
    DHTEST_CUDA(cudaMemcpy(dtags.data(), tags.data(), C * sizeof(std::uint64_t), cudaMemcpyHostToDevice));

    dh::workload::selection_params params;
    params.top_k = kTopK;
    dh::workload::selection_batch gens(params, seed, C);
    std::vector<row_index> sel(C * per_request), query(C * kTopK);
    std::vector<location> want(C * per_request), got(C * per_request);

    for (std::size_t round = 0; round <= holds.size(); ++round) {
      const int held = round == 0 ? 0 : holds[round - 1];
      const std::string ctx = "verify C=" + std::to_string(C) + " round " + std::to_string(round) +
                              " (producer_only + copy_follower)";
      INFO(ctx << ", " << held << " SMs held");
      // A block of K_r positions per request, then K_r queries over committed history (fresh rows).
      for (std::size_t i = 0; i < C; ++i) {
        const auto block = rc::make_append_buffer(tags[i], 0, Layers, RowBytes, frontier[i], Kr);
        host.stage_block(ids[i], 0, block, Kr);
        dev.stage_block(ids[i], 0, std::span<const std::byte>(block), Kr, stream);
        DHTEST_CUDA(cudaStreamSynchronize(stream));
      }
      for (std::size_t j = 0; j < Kr; ++j) {
        gens.generate_with_miss_target(frontier, query, {kFreshShare, 2});
        for (std::size_t i = 0; i < C; ++i)
          std::copy_n(query.begin() + static_cast<long>(i * kTopK), kTopK,
                      sel.begin() + static_cast<long>(i * per_request + j * kTopK));
      }
      for (std::size_t i = 0; i < C; ++i) {
        std::vector<std::span<const row_index>> qs;
        std::vector<std::span<location>> ls;
        for (std::size_t j = 0; j < Kr; ++j) {
          qs.emplace_back(sel.data() + i * per_request + j * kTopK, kTopK);
          ls.emplace_back(want.data() + i * per_request + j * kTopK, kTopK);
        }
        host.verify(ids[i], 0, qs, ls);
      }

      DHTEST_CUDA(cudaMemcpyAsync(dsel.data(), sel.data(), sel.size() * sizeof(row_index), cudaMemcpyHostToDevice, stream));
      DHTEST_CUDA(cudaMemsetAsync(dloc.data(), 0x7A, dloc.bytes(), stream));
      DHTEST_CUDA(cudaStreamSynchronize(stream));
      std::vector<std::vector<dhc::verify_query>> queries(C);
      std::vector<dhc::verify_batch_item> items(C);
      for (std::size_t i = 0; i < C; ++i) {
        for (std::size_t j = 0; j < Kr; ++j)
          queries[i].push_back({dsel.data() + i * per_request + j * kTopK, static_cast<std::int32_t>(kTopK),
                                dloc.data() + i * per_request + j * kTopK});
        items[i] = {ids[i], queries[i]};
      }
      DHTEST_CUDA(cudaDeviceSynchronize());
      if (held > 0) occ.hold(held);
      dev.verify(0, std::span<const dhc::verify_batch_item>(items), stream, dh::copy_layers::producer_only);
      for (std::size_t l = 1; l < Layers; ++l) dev.copy_follower(0, l, stream);
      if (held > 0) {
        const bool done = occ.finishes_while_held(stream, ctx);
        if (!done)
          DHTEST_FAIL(ctx << ": did not finish within " << kDeadlineSeconds << " s while another stream held " << held
                          << " of " << occ.sms() << " SMs");
      } else {
        wait_or_die(stream, ctx);
      }

      dev.check_errors(stream);
      DHTEST_CUDA(cudaMemcpy(got.data(), dloc.data(), got.size() * sizeof(location), cudaMemcpyDeviceToHost));
      for (std::size_t i = 0; i < C; ++i) {
        const std::string diff = diff_sequence<location, location>(
            "locations of request " + std::to_string(ids[i]),
            std::span<const location>(want).subspan(i * per_request, per_request),
            std::span<const location>(got).subspan(i * per_request, per_request));
        if (!diff.empty()) DHTEST_FAIL(ctx << ": " << diff);
      }
      check_bytes(dev, stream, dsel, dloc, dtags, static_cast<std::uint32_t>(C * per_request),
                  static_cast<std::uint32_t>(per_request), RowBytes, Layers, ctx);

      // Commit the anchor only: the next round's block starts one position later.
      for (std::size_t i = 0; i < C; ++i) {
        host.commit(ids[i], 0, 0);
        dev.commit(ids[i], 0, 0, stream);
        ++frontier[i];
      }
      DHTEST_CUDA(cudaStreamSynchronize(stream));
      for (std::size_t i = 0; i < C; i += 17) {
        INFO(ctx << ": request " << ids[i]);
        REQUIRE(dev.frontier(ids[i], 0) == frontier[i]);
        DHTEST_REQUIRE_SAME(row_index, "hot rows", host.hot_rows_of(ids[i], 0), dev.hot_rows_of(ids[i], 0));
        DHTEST_REQUIRE_SAME(typename Hot::order_index, "LRU order", host.lru_order_of(ids[i], 0),
                            dev.lru_order_of(ids[i], 0));
      }
    }
  }
  DHTEST_CUDA(cudaStreamDestroy(stream));
}

}  // namespace

TEST_CASE("forward progress: resolve C = 128 (follower layer) while another stream holds all but a few SMs",
          "[gpu][progress]") {
  require_device();
  REQUIRE(eager_loading == 0);
  run_resolve<576, 2>(128, 0xF0'0128);
}

TEST_CASE("forward progress: resolve C = 64 (entry CTAs copy nothing) while another stream holds all but a few SMs",
          "[gpu][progress]") {
  require_device();
  run_resolve<576, 2>(64, 0xF0'0064);
}

TEST_CASE("forward progress: resolve C = 256 while another stream holds all but a few SMs", "[gpu][progress]") {
  require_device();
  run_resolve<656, 1>(256, 0xF0'0256);
}

TEST_CASE("forward progress: verify C = 128 and its follower copy while another stream holds all but a few SMs",
          "[gpu][progress]") {
  require_device();
  run_verify(128, 0xF0'7128);
}
