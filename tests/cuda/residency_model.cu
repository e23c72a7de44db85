// Model-based test of load-adaptive residency on the CUDA backend (cuda/residency_manager.cuh),
// the GPU counterpart of tests/host/residency_model.cpp, shorter. Random operations (admissions
// with imported history from device or host buffers, or streamed: admitted first, then the history
// in random chunks through import_history from host buffers, device buffers and device buffers
// written on a producer stream; decode steps with resolves checked byte for
// byte then one appended row per source, completions, pressure spikes, retries of waiting
// admissions, proactive backups, repopulation) over four policies, two ways:
//  - lockstep: after every operation the GPU manager is drained and compared with the host
//    manager (host/residency_manager.hpp) driven with the same calls: ledgers, every request's
//    optional page count, admissions and reclaim choices (an admission the host admits after
//    reclaim answers wait_for_reclaim on the GPU and is admitted by the retry after the drain);
//  - asynchronous: no drains; copy-stream fills and backups overlap the steps. After every
//    operation: audit() (Invariant 3 with retiring pages counted, page conservation, books), and
//    every resolve is exact. Every few hundred operations, and at the end, a drain and a full
//    recoverability check: every row of every request is ready on the GPU (device map read back,
//    pool bytes exact) or host-backed (host-store bytes exact), and no device-only page is absent.
// At the end every request that waited has been admitted and completed and every page is free.
#include "cuda_test_support.cuh"

#include <deque>
#include <map>
#include <memory>

#include "dhisparse/cuda/residency_manager.cuh"
#include "dhisparse/host/residency_manager.hpp"

namespace {
using namespace dhtest;
using Layout = dh::layouts::tiny;
using Hot = dh::lru_hot_cache<16>;
using Device = dhc::hierarchy<Layout, Hot>;
using Host = dh::host_hierarchy<Layout, Hot>;
constexpr std::size_t kSources = Device::sources;
constexpr std::size_t kPageRows = Device::page_rows;
constexpr std::size_t K = Layout::top_k;

#ifndef DHISPARSE_GPU_RESIDENCY_OPS
constexpr std::size_t kOps = 6'000;  // per policy and mode: 4 policies x 2 modes = 48k operations
#else
constexpr std::size_t kOps = DHISPARSE_GPU_RESIDENCY_OPS;
#endif

struct model_config {
  std::size_t max_requests = 8, max_rows = 64, optional_pages = 24, required = 3, reserve = 2;
  std::uint64_t seed = 1;
};

/// A request's prefill, kept alive (host and device copies) until it is admitted.
struct prefill {
  std::int64_t rows = 0;
  bool from_device = false;
  bool streamed = false;  // admit(id) first, then the history in chunks through import_history
  std::array<std::vector<std::byte>, kSources> host;
  std::array<std::unique_ptr<dhc::device_buffer<std::byte>>, kSources> dev;
};

template <class Policy>
class harness {
 public:
  using Gpu = dhc::residency_manager<Device, Policy>;
  using Ref = dh::residency_manager<Host, Policy>;

  harness(const model_config& mc, bool lockstep)
      : mc_(mc), lockstep_(lockstep), rng_(mc.seed), m_(hcfg(mc), {mc.required, mc.reserve}, make_stream()),
        dsel_(mc.max_requests * K), dloc_(mc.max_requests * K) {
    if (lockstep_) ref_ = std::make_unique<Ref>(hcfg(mc), dh::residency_config{mc.required, mc.reserve});
  }
  ~harness() {
    try {
      m_.drain();  // a failed check may leave work queued; the manager's destructor waits too
    } catch (...) {
    }
  }

  void run(std::size_t ops) {
    const std::string name = std::string(Policy::name) + (lockstep_ ? " lockstep" : " async");
    for (std::size_t op = 0; op < ops; ++op) {
      ctx_ = name + ", op " + std::to_string(op);
      const std::size_t u = uniform(100);
      if (u < 14) submit(1);
      else if (u < 17) submit(2 + uniform(3));  // pressure spike
      else if (u < 60) decode_step();
      else if (u < 72) complete_one();
      else if (u < 84) retry_waiting();
      else if (u < 89) m_.back_up(1 + uniform(6));  // proactive backups: no ledger change
      else repopulate();
      if (lockstep_) m_.drain();
      else m_.poll();
      check_books();
      if (lockstep_) compare_with_reference();
      if (!lockstep_ && op % 400 == 399) {
        m_.drain();
        check_recoverable();
      }
    }
    // Wind down: everything waiting is admitted, everything completes, every page comes back.
    for (int round = 0; round < 1000 && (!waiting_.empty() || !live_.empty()); ++round) {
      ctx_ = name + ", wind-down round " + std::to_string(round);
      m_.drain();
      check_recoverable();
      while (!live_.empty()) complete_one();
      m_.drain();
      retry_waiting();
      if (lockstep_) compare_with_reference();
    }
    m_.drain();
    ctx_ = name + ", end";
    check_books();
    INFO(ctx_);
    REQUIRE(waiting_.empty());
    REQUIRE(live_.empty());
    REQUIRE(m_.claims() == 0);
    for (std::size_t s = 0; s < kSources; ++s) {
      REQUIRE(m_.hierarchy().free_optional_pages(s) == mc_.optional_pages);
      REQUIRE(m_.hierarchy().free_host_pages(s) == m_.hierarchy().config().host_pages);
      REQUIRE(m_.retiring_pages(s) == 0);
    }
    for (request_id id : submitted_) REQUIRE(completed_.contains(id));
    const auto& c = m_.counters();
    std::printf("%-28s ops %zu: admitted %zu (waits: memory %zu, reclaim %zu, slot %zu), reclaimed %zu requests / %zu "
                "pages, mapped %zu (repopulated %zu), resolved entries %zu, device imports %zu, streamed chunks %zu\n",
                name.c_str(), ops, c.admissions, c.waits_for_memory, c.waits_for_reclaim, c.waits_for_slot,
                c.requests_reclaimed, c.pages_reclaimed, c.pages_mapped, c.pages_repopulated, resolved_entries_,
                device_imports_, streamed_chunks_);
    REQUIRE(c.admissions == submitted_.size());
    REQUIRE(streamed_chunks_ > 0);
  }

 private:
  static dh::hierarchy_config hcfg(const model_config& mc) {
    dh::hierarchy_config hc;
    hc.max_requests = mc.max_requests;
    hc.max_rows = mc.max_rows;
    hc.optional_pages = mc.optional_pages;
    return hc;
  }
  static cudaStream_t make_stream() {
    // Non-blocking: the test's legacy-stream copies must not wait for it. Leaked on purpose (one a
    // harness; the manager's destructor synchronises it).
    cudaStream_t s = nullptr;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    return s;
  }
  std::size_t uniform(std::size_t n) { return n == 0 ? 0 : static_cast<std::size_t>(rng_() % n); }
  cudaStream_t step() const { return m_.step_stream(); }

  // ---------------------------------------------------------------- operations

  void submit(std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) {
      const request_id id = next_id_++;
      auto p = std::make_unique<prefill>();
      p->rows = static_cast<std::int64_t>(uniform(mc_.max_rows - 4));  // leave room for decode rows
      p->from_device = uniform(2) == 0;
      p->streamed = uniform(3) == 0;
      for (std::size_t s = 0; s < kSources; ++s) {
        p->host[s] = make_rows<Layout>(id, s, 0, static_cast<std::size_t>(p->rows));
        if (p->from_device && p->rows > 0) {
          p->dev[s] = std::make_unique<dhc::device_buffer<std::byte>>(p->host[s].size());
          DHTEST_CUDA(cudaMemcpy(p->dev[s]->data(), p->host[s].data(), p->host[s].size(), cudaMemcpyHostToDevice));
        }
      }
      submitted_.push_back(id);
      waiting_.push_back(id);
      prefills_[id] = std::move(p);
    }
    retry_waiting();
  }

  /// Tries the waiting admissions, oldest first (each once).
  void retry_waiting() {
    const std::size_t n = waiting_.size();
    for (std::size_t i = 0; i < n; ++i) {
      const request_id id = waiting_.front();
      waiting_.pop_front();
      if (!try_admit(id)) waiting_.push_back(id);
    }
  }

  bool try_admit(request_id id) {
    auto& p = *prefills_.at(id);
    dh::residency_admission r;
    auto gpu_admit = [&] {
      if (p.streamed) return m_.admit(id);
      if (p.from_device) {
        std::array<dhc::device_history_import, kSources> h{};
        for (std::size_t s = 0; s < kSources; ++s)
          h[s] = {p.rows > 0 ? p.dev[s]->data() : nullptr, static_cast<std::size_t>(p.rows)};
        return m_.admit(id, std::span<const dhc::device_history_import>(h));
      }
      std::array<dh::history_import, kSources> h{};
      for (std::size_t s = 0; s < kSources; ++s) h[s] = {p.host[s], static_cast<std::size_t>(p.rows)};
      return m_.admit(id, std::span<const dh::history_import>(h));
    };
    r = gpu_admit();
    if (lockstep_) {
      std::array<dh::history_import, kSources> h{};
      for (std::size_t s = 0; s < kSources; ++s) h[s] = {p.host[s], static_cast<std::size_t>(p.rows)};
      const auto e = p.streamed ? ref_->admit(id) : ref_->admit(id, std::span<const dh::history_import>(h));
      if (r.status == dh::admit_status::wait_for_reclaim) {
        // The host reclaims and admits in one call; the GPU retires the pages first.
        if (e.status != dh::admit_status::admitted || e.reclaimed_requests != r.reclaimed_requests ||
            e.reclaimed_pages != r.reclaimed_pages)
          fail("admission of " + std::to_string(id) + ": GPU waits for reclaim of " +
               std::to_string(r.reclaimed_requests) + " requests / " + std::to_string(r.reclaimed_pages) +
               " pages, host says " + dh::to_string(e.status) + " after reclaiming " +
               std::to_string(e.reclaimed_requests) + " / " + std::to_string(e.reclaimed_pages));
        m_.drain();
        r = gpu_admit();
        if (r.status != dh::admit_status::admitted)
          fail("admission of " + std::to_string(id) + " after the drain: " + dh::to_string(r.status));
      } else if (r.status != e.status || r.reclaimed_requests != e.reclaimed_requests ||
                 (r && r.mapped_pages != e.mapped_pages)) {
        fail("admission of " + std::to_string(id) + ": GPU " + dh::to_string(r.status) + " (reclaimed " +
             std::to_string(r.reclaimed_requests) + ", mapped " + std::to_string(r.mapped_pages) + "), host " +
             dh::to_string(e.status) + " (reclaimed " + std::to_string(e.reclaimed_requests) + ", mapped " +
             std::to_string(e.mapped_pages) + ")");
      }
    }
    if (!r) return false;
    if (p.streamed) stream_in(id, p);
    else if (p.from_device) ++device_imports_;
    live_.push_back(id);
    frontier_[id] = p.rows;
    // the prefill's buffers are no longer needed once the import is ordered on the step stream
    DHTEST_CUDA(cudaStreamSynchronize(step()));
    prefills_.erase(id);
    return true;
  }

  /// Delivers an admitted request's history in random chunks, sources interleaved at random: from
  /// host memory, from device buffers ready on the step stream, and from device buffers written on
  /// a producer stream, which overwrites each buffer right after the import (the manager orders
  /// that after the import; a wrong order shows as wrong bytes in later resolves). In lockstep the
  /// host manager takes the same chunks and must map the same pages for each.
  void stream_in(request_id id, const prefill& p) {
    const auto rows = static_cast<std::size_t>(p.rows);
    std::array<std::size_t, kSources> at{};
    std::vector<std::unique_ptr<dhc::device_buffer<std::byte>>> keep;
    for (;;) {
      std::vector<std::size_t> open;
      for (std::size_t s = 0; s < kSources; ++s)
        if (at[s] < rows) open.push_back(s);
      if (open.empty()) break;
      const std::size_t s = open[uniform(open.size())];
      const std::size_t count = 1 + uniform(std::min<std::size_t>(rows - at[s], 20));
      const auto host = make_rows<Layout>(id, s, static_cast<std::int64_t>(at[s]), count);
      std::size_t got = 0;
      const std::size_t how = uniform(3);
      if (how == 0) {
        got = m_.import_history(id, s, std::span<const std::byte>(host), count);
      } else {
        keep.push_back(std::make_unique<dhc::device_buffer<std::byte>>(host.size()));
        std::byte* dev = keep.back()->data();
        if (how == 1) {
          DHTEST_CUDA(cudaMemcpy(dev, host.data(), host.size(), cudaMemcpyHostToDevice));
          got = m_.import_history(id, s, dev, count);
        } else {
          DHTEST_CUDA(cudaMemcpyAsync(dev, host.data(), host.size(), cudaMemcpyHostToDevice, producer_));
          got = m_.import_history(id, s, dev, count, producer_);
          DHTEST_CUDA(cudaMemsetAsync(dev, 0xA5, host.size(), producer_));  // after the import
        }
        ++device_imports_;
      }
      if (lockstep_) {
        const std::size_t want = ref_->import_history(id, s, host, count);
        if (got != want)
          fail("chunk of " + std::to_string(count) + " rows at row " + std::to_string(at[s]) + " of request " +
               std::to_string(id) + " on source " + std::to_string(s) + ": GPU mapped " + std::to_string(got) +
               " pages, host " + std::to_string(want));
      }
      at[s] += count;
      ++streamed_chunks_;
    }
    DHTEST_CUDA(cudaStreamSynchronize(producer_));
    DHTEST_CUDA(cudaStreamSynchronize(step()));
  }

  void complete_one() {
    if (live_.empty()) return;
    const std::size_t i = uniform(live_.size());
    const request_id id = live_[i];
    m_.complete(id);
    if (lockstep_) ref_->complete(id);
    live_.erase(live_.begin() + static_cast<long>(i));
    frontier_.erase(id);
    completed_.insert({id, true});
  }

  void repopulate() {
    const std::size_t a = m_.repopulate();
    if (lockstep_) {
      const std::size_t b = ref_->repopulate();
      if (a != b) fail("repopulate mapped " + std::to_string(a) + " pages, host " + std::to_string(b));
    }
  }

  /// Resolves a random batch on each source, checks every returned row byte for byte, then
  /// appends one row per source to each request of the batch.
  void decode_step() {
    if (live_.empty()) return;
    std::vector<request_id> batch;
    for (request_id id : live_)
      if (batch.size() < 4 && uniform(2) == 0) batch.push_back(id);
    if (batch.empty()) batch.push_back(live_[uniform(live_.size())]);
    for (std::size_t s = 0; s < kSources; ++s) {
      std::vector<row_index> sel(batch.size() * K, dh::no_row);
      std::vector<typename Device::batch_item> items(batch.size());
      for (std::size_t e = 0; e < batch.size(); ++e) {
        const std::int64_t f = frontier_.at(batch[e]);
        for (std::size_t i = 0; i < K && f > 0; ++i)
          if (uniform(10) != 0) sel[e * K + i] = static_cast<row_index>(uniform(static_cast<std::size_t>(f)));
        items[e] = {batch[e], dsel_.data() + e * K, static_cast<std::int32_t>(K), dloc_.data() + e * K};
      }
      DHTEST_CUDA(cudaMemcpyAsync(dsel_.data(), sel.data(), sel.size() * sizeof(row_index), cudaMemcpyHostToDevice, step()));
      m_.step().resolve(s, std::span<const typename Device::batch_item>(items), step());
      std::vector<location> loc(sel.size());
      DHTEST_CUDA(cudaMemcpyAsync(loc.data(), dloc_.data(), loc.size() * sizeof(location), cudaMemcpyDeviceToHost, step()));
      const auto pools = read_pools(s);
      wait_or_die(step(), ctx_ + ": resolve");
      try {
        m_.step().check_errors(step());
      } catch (const std::exception& ex) {
        fail(std::string("resolve reported an error: ") + ex.what());
      }
      check_rows(s, batch, sel, loc, pools);
    }
    if (lockstep_) {
      // keep the host reference's decode rows in step (resolves do not change its ledger)
    }
    for (request_id id : batch)
      for (std::size_t s = 0; s < kSources; ++s) {
        const std::int64_t f = frontier_.at(id);
        if (static_cast<std::size_t>(f) >= mc_.max_rows) continue;
        const auto rows = make_rows<Layout>(id, s, f, 1);
        m_.append(id, s, std::span<const std::byte>(rows), 1);
        if (lockstep_) ref_->append(id, s, rows, 1);
      }
    for (request_id id : batch)
      if (static_cast<std::size_t>(frontier_.at(id)) < mc_.max_rows) ++frontier_.at(id);
  }

  /// Every payload layer's pool of a source, read in step-stream order (the copy stream runs on).
  std::vector<std::vector<std::byte>> read_pools(std::size_t s) {
    const auto& d = Layout::sources[s];
    std::vector<std::vector<std::byte>> out(d.payload_layers);
    for (std::size_t l = 0; l < d.payload_layers; ++l) {
      out[l].resize(m_.hierarchy().space().rows() * d.row_bytes);
      DHTEST_CUDA(cudaMemcpyAsync(out[l].data(), m_.hierarchy().pool(s, l), out[l].size(), cudaMemcpyDeviceToHost, step()));
    }
    return out;
  }

  void check_rows(std::size_t s, const std::vector<request_id>& batch, const std::vector<row_index>& sel,
                  const std::vector<location>& loc, const std::vector<std::vector<std::byte>>& pools) {
    const auto& d = Layout::sources[s];
    const auto& space = m_.hierarchy().space();
    std::vector<std::byte> want(d.row_bytes);
    for (std::size_t e = 0; e < batch.size(); ++e)
      for (std::size_t i = 0; i < K; ++i) {
        const row_index r = sel[e * K + i];
        const location l = loc[e * K + i];
        if (r == dh::no_row) continue;
        ++resolved_entries_;
        if (l < 0 || static_cast<std::size_t>(l) >= space.rows())
          fail("request " + std::to_string(batch[e]) + " source " + std::to_string(s) + " row " + std::to_string(r) +
               ": location " + std::to_string(l) + " outside the pool");
        for (std::size_t layer = 0; layer < d.payload_layers; ++layer) {
          fill_row(want.data(), d.row_bytes, batch[e], s, layer, r);
          const std::byte* got = pools[layer].data() + static_cast<std::size_t>(l) * d.row_bytes;
          if (std::memcmp(got, want.data(), d.row_bytes) != 0)
            fail("request " + std::to_string(batch[e]) + " source " + std::to_string(s) + " layer " +
                 std::to_string(layer) + " row " + std::to_string(r) + " resolved to location " + std::to_string(l) +
                 " (" + region(l) + ") holding " + hex_prefix(got, d.row_bytes) + ", expected " +
                 hex_prefix(want.data(), d.row_bytes));
        }
      }
  }

  std::string region(location l) const {
    const auto& sp = m_.hierarchy().space();
    const auto hot_end = static_cast<location>(sp.slots * sp.hot_rows);
    const auto tail_end = static_cast<location>(sp.slots * (sp.hot_rows + sp.tail_rows));
    if (l < hot_end) return "hot cache";
    if (l < tail_end) return "tail";
    return "optional page " + std::to_string((static_cast<std::size_t>(l) - static_cast<std::size_t>(tail_end)) / sp.page_rows);
  }

  // ---------------------------------------------------------------- checks

  [[noreturn]] void fail(const std::string& what) const {
    INFO(ctx_ << ": " << what);
    REQUIRE(false);
    throw std::logic_error(what);  // not reached
  }

  void check_books() {
    const std::string a = m_.audit();
    if (!a.empty()) fail("audit: " + a);
    if (!m_.invariant_holds()) fail("Invariant 3 broken");
    if (m_.admitted_count() != live_.size()) fail("admitted count differs from the test's");
    for (std::size_t s = 0; s < kSources; ++s) {
      std::size_t host_used = 0;
      for (request_id id : live_) {
        if (m_.hierarchy().frontier(id, s) != frontier_.at(id))
          fail("request " + std::to_string(id) + " source " + std::to_string(s) + ": frontier " +
               std::to_string(m_.hierarchy().frontier(id, s)) + ", expected " + std::to_string(frontier_.at(id)));
        host_used += (static_cast<std::size_t>(frontier_.at(id)) + kPageRows - 1) / kPageRows;
      }
      if (host_used + m_.hierarchy().free_host_pages(s) != m_.hierarchy().config().host_pages)
        fail("source " + std::to_string(s) + ": host pages leaked (" + std::to_string(host_used) + " used + " +
             std::to_string(m_.hierarchy().free_host_pages(s)) + " free != " +
             std::to_string(m_.hierarchy().config().host_pages) + ")");
    }
  }

  void compare_with_reference() {
    for (std::size_t s = 0; s < kSources; ++s) {
      const auto a = m_.ledger(s), b = ref_->ledger(s);
      if (!(a == b))
        fail("source " + std::to_string(s) + ": ledger M_req/M_opt " + std::to_string(a.required) + "/" +
             std::to_string(a.optional) + ", host " + std::to_string(b.required) + "/" + std::to_string(b.optional));
      for (request_id id : live_)
        if (m_.optional_pages_of(id, s) != ref_->optional_pages_of(id, s))
          fail("request " + std::to_string(id) + " source " + std::to_string(s) + ": " +
               std::to_string(m_.optional_pages_of(id, s)) + " optional pages, host " +
               std::to_string(ref_->optional_pages_of(id, s)));
    }
  }

  /// After a drain: the device maps equal the books, and every row is ready on the GPU with exact
  /// bytes or host-backed with exact bytes (Invariant 1).
  void check_recoverable() {
    DHTEST_CUDA(cudaDeviceSynchronize());
    for (std::size_t s = 0; s < kSources; ++s) {
      const auto& d = Layout::sources[s];
      std::vector<std::vector<std::byte>> pools(d.payload_layers);
      for (std::size_t l = 0; l < d.payload_layers; ++l) {
        pools[l].resize(m_.hierarchy().space().rows() * d.row_bytes);
        m_.hierarchy().copy_pool(s, l, pools[l]);
      }
      std::vector<std::byte> want(d.row_bytes);
      for (request_id id : live_) {
        const auto map = m_.hierarchy().optional_map_of(id, s);
        const std::int64_t f = frontier_.at(id);
        for (std::size_t page = 0; page < map.size(); ++page) {
          const auto st = m_.page_of(id, s, page);
          const std::string who = "request " + std::to_string(id) + " source " + std::to_string(s) + " page " +
                                  std::to_string(page) + ": ";
          const bool on_gpu = st.state == dhc::page_state::ready;
          if (st.state == dhc::page_state::filling || st.state == dhc::page_state::backing_up)
            fail(who + "still in flight after a drain");
          if ((map[page] >= 0) != on_gpu || (on_gpu && map[page] != st.pool_page))
            fail(who + "device map holds " + std::to_string(map[page]) + ", books say " +
                 (on_gpu ? "pool page " + std::to_string(st.pool_page) : std::string("absent")));
          if (st.device_only && !on_gpu) fail(who + "device-only but not on the GPU (Invariant 1)");
          for (std::int64_t r = static_cast<std::int64_t>(page * kPageRows);
               r < std::min<std::int64_t>(f, static_cast<std::int64_t>((page + 1) * kPageRows)); ++r)
            for (std::size_t layer = 0; layer < d.payload_layers; ++layer) {
              fill_row(want.data(), d.row_bytes, id, s, layer, r);
              if (on_gpu) {
                const location l = m_.hierarchy().space().optional(static_cast<std::size_t>(map[page]), r);
                if (std::memcmp(pools[layer].data() + static_cast<std::size_t>(l) * d.row_bytes, want.data(), d.row_bytes) != 0)
                  fail(who + "row " + std::to_string(r) + " layer " + std::to_string(layer) + " wrong in its pool page");
              }
              if (!st.device_only) {
                const auto got = m_.hierarchy().host_row(id, s, layer, r);
                if (std::memcmp(got.data(), want.data(), d.row_bytes) != 0)
                  fail(who + "row " + std::to_string(r) + " layer " + std::to_string(layer) +
                       " is not host-backed: host copy " + hex_prefix(got.data(), d.row_bytes) + ", expected " +
                       hex_prefix(want.data(), d.row_bytes));
              }
            }
        }
      }
    }
  }

  model_config mc_;
  bool lockstep_;
  std::mt19937_64 rng_;
  Gpu m_;
  std::unique_ptr<Ref> ref_;
  cudaStream_t producer_ = make_stream();  // a prefill engine's stream (streamed imports)
  std::size_t streamed_chunks_ = 0;
  dhc::device_buffer<row_index> dsel_;
  dhc::device_buffer<location> dloc_;
  std::string ctx_;
  request_id next_id_ = 1;
  std::deque<request_id> waiting_;
  std::vector<request_id> live_, submitted_;
  std::map<request_id, bool> completed_;
  std::map<request_id, std::int64_t> frontier_;
  std::map<request_id, std::unique_ptr<prefill>> prefills_;
  std::size_t resolved_entries_ = 0, device_imports_ = 0;
};

template <class Policy>
void run_both(std::uint64_t seed) {
  model_config mc;
  mc.seed = seed;
  {
    harness<Policy> h(mc, true);
    h.run(kOps);
  }
  mc.seed = seed + 100;
  {
    harness<Policy> h(mc, false);
    h.run(kOps);
  }
}

}  // namespace

TEST_CASE("GPU residency model: adaptive, most recent first", "[gpu][residency]") {
  require_device();
  run_both<dh::adaptive_policy<>>(11);
}
TEST_CASE("GPU residency model: adaptive, least recent first, one page an attempt", "[gpu][residency]") {
  require_device();
  run_both<dh::adaptive_policy<dh::reclaim_order::least_recent_first, 1>>(23);
}
TEST_CASE("GPU residency model: fixed budget", "[gpu][residency]") {
  require_device();
  run_both<dh::fixed_budget_policy>(37);
}
TEST_CASE("GPU residency model: resident", "[gpu][residency]") {
  require_device();
  run_both<dh::resident_policy>(41);
}
