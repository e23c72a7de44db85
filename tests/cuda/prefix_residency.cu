// Shared prefixes under residency on the CUDA backend (cuda/residency_manager.cuh,
// docs/prefixes.md): the CUDA manager against the host manager (host/residency_manager.hpp, itself
// checked by tests/host/prefix_residency.cpp and prefix_model.cpp), driven in lockstep with the same
// random calls over three policies: plain admissions (history from host or device buffers, so some
// pages are device-only), retains of whole and partial histories (LRU evictions under a small
// budget; device-only pages retained are backed up), admissions on retained prefixes with suffixes
// from host or device buffers, decode steps, completions, releases, repopulation and pressure
// spikes that reclaim whole requests mapping shared pages.
//
// Two modes per policy:
//  - lockstep: after every operation the GPU manager is drained, audited (Invariant 3, shared pool
//    pages: the page serving each host page, mapper counts, M_opt counting each page once) and
//    compared with the host manager: admission results (reclaim choices, pages reclaimed and mapped), ledgers, every
// request's optional page count and host page table, the sharing structure of the optional maps
// (two pages share a pool page on the GPU exactly when they do on the host; the device maps are
// read back), every mapped pool page's mapper count, free pools, retained prefixes and their budget.
//  - asynchronous (the GPU manager alone): no drains, only poll(), so joins of shared pages whose
//    fill is still in flight, completions and resolves during fills, and admissions that find
//    shared pages being reclaimed (an admission that answers wait_for_reclaim is withdrawn, its
//    victims go on retiring) all happen; audit() after every operation.
// Every resolve checks every selected row's bytes against the rows the test wrote (its own tags:
// a prefix's rows carry the tag of the request that wrote them). Every few operations (after a
// drain in the asynchronous mode): every mapped page's pool bytes and every host-backed page's
// host bytes are exact.
#include "cuda_test_support.cuh"

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

#ifndef DHISPARSE_GPU_PREFIX_RESIDENCY_OPS
constexpr std::size_t kOps = 3'000;  // per policy and mode: 3 policies x 2 modes = 18k operations
#else
constexpr std::size_t kOps = DHISPARSE_GPU_PREFIX_RESIDENCY_OPS;
#endif

constexpr std::size_t kMaxRequests = 8, kMaxRows = 64, kOptionalPages = 24, kRequired = 2, kReserve = 2;
constexpr std::size_t kPagesPerRequest = kMaxRows / kPageRows;

using tags = std::array<std::vector<request_id>, kSources>;  // the writer of every row, per source

template <class Policy>
class harness {
 public:
  using Gpu = dhc::residency_manager<Device, Policy>;
  using Ref = dh::residency_manager<Host, Policy>;

  harness(std::uint64_t seed, bool lockstep)
      : lockstep_(lockstep), rng_(seed), m_(hcfg(), {kRequired, kReserve}, make_stream()),
        ref_(hcfg(), {kRequired, kReserve}), dsel_(kMaxRequests * K), dloc_(kMaxRequests * K) {}
  ~harness() {
    try {
      m_.drain();
    } catch (...) {
    }
  }

  void run(std::size_t ops) {
    const std::string name = std::string(Policy::name) + (lockstep_ ? " lockstep" : " async");
    for (std::size_t op = 0; op < ops; ++op) {
      ctx_ = name + ", op " + std::to_string(op);
      const std::size_t u = uniform(100);
      if (u < 12) admit_plain(uniform(kMaxRows - 8));
      else if (u < 22) retain();
      else if (u < 44) admit_on_prefix();
      else if (u < 70) decode_step();
      else if (u < 80) complete_one();
      else if (u < 84) release();
      else if (u < 92) repopulate();
      else admit_plain(kMaxRows - 8 - uniform(8));  // pressure: a long history, reclaim likely
      if (lockstep_) m_.drain();
      else m_.poll();
      compare();
      if (op % 50 == 49) {
        if (!lockstep_) m_.drain();
        check_recoverable();
      }
    }
    ctx_ = name + ", wind-down";
    while (!writer_.empty()) {
      complete_one();
      m_.drain();
      compare();
    }
    for (const auto p : m_.hierarchy().retained_prefixes()) {
      if (lockstep_) ref_.release_prefix(p);
      m_.release_prefix(p);
    }
    m_.drain();
    compare();
    INFO(ctx_);
    for (std::size_t s = 0; s < kSources; ++s) {
      REQUIRE(m_.hierarchy().free_optional_pages(s) == kOptionalPages);
      REQUIRE(m_.hierarchy().free_host_pages(s) == m_.hierarchy().config().host_pages);
      REQUIRE(m_.retiring_pages(s) == 0);
    }
    const auto& c = m_.counters();
    std::printf("%-32s ops %zu: admitted %zu (on a prefix %zu, waits %zu), reclaimed %zu requests / %zu pages, "
                "mapped %zu, shared page joins seen %zu, resolved entries %zu\n",
                name.c_str(), ops, c.admissions, prefix_admissions_, c.admissions_waited, c.requests_reclaimed,
                c.pages_reclaimed, c.pages_mapped, joins_seen_, resolved_entries_);
    REQUIRE(prefix_admissions_ > 0);
    if (!lockstep_) return;
    const auto& h = ref_.counters();  // the GPU also counts its wait_for_reclaim answers
    REQUIRE(c.admissions == h.admissions);
    REQUIRE(c.completions == h.completions);
    REQUIRE(c.pages_mapped == h.pages_mapped);
    REQUIRE(c.pages_repopulated == h.pages_repopulated);
    REQUIRE(c.requests_reclaimed == h.requests_reclaimed);
    REQUIRE(c.pages_reclaimed == h.pages_reclaimed);
  }

 private:
  static dh::hierarchy_config hcfg() {
    dh::hierarchy_config hc;
    hc.max_requests = kMaxRequests;
    hc.max_rows = kMaxRows;
    hc.optional_pages = kOptionalPages;
    hc.host_pages = kMaxRequests * kPagesPerRequest + 16;
    hc.prefix_pages = 16;
    return hc;
  }
  static cudaStream_t make_stream() {
    cudaStream_t s = nullptr;  // leaked on purpose: one a harness, synchronised by the manager's destructor
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    return s;
  }
  std::size_t uniform(std::size_t n) { return n == 0 ? 0 : static_cast<std::size_t>(rng_() % n); }
  cudaStream_t step() const { return m_.step_stream(); }
  request_id pick() {
    auto it = writer_.begin();
    std::advance(it, static_cast<long>(uniform(writer_.size())));
    return it->first;
  }

  [[noreturn]] void fail(const std::string& what) const {
    INFO(ctx_ << ": " << what);
    REQUIRE(false);
    throw std::logic_error(what);  // not reached
  }

  // ---------------------------------------------------------------- operations

  /// Admits on both managers: the GPU answers wait_for_reclaim where the host reclaims and admits
  /// in one call, and admits on the retry after a drain. Returns whether both admitted.
  template <class GpuAdmit, class RefAdmit>
  bool admit_both(request_id id, GpuAdmit gpu_admit, RefAdmit ref_admit) {
    auto r = gpu_admit();
    if (!lockstep_) {
      if (r.status == dh::admit_status::wait_for_reclaim) m_.withdraw(id);  // its victims go on retiring
      if (r) DHTEST_CUDA(cudaStreamSynchronize(step()));  // the import buffers may go
      return static_cast<bool>(r);
    }
    const auto e = ref_admit();
    if (r.status == dh::admit_status::wait_for_reclaim) {
      if (e.status != dh::admit_status::admitted || e.reclaimed_requests != r.reclaimed_requests ||
          e.reclaimed_pages != r.reclaimed_pages)
        fail("admission of " + std::to_string(id) + ": GPU waits for reclaim of " + std::to_string(r.reclaimed_requests) +
             " requests / " + std::to_string(r.reclaimed_pages) + " pages, host says " + dh::to_string(e.status) +
             " after reclaiming " + std::to_string(e.reclaimed_requests) + " / " + std::to_string(e.reclaimed_pages));
      m_.drain();
      r = gpu_admit();
      if (r.status != dh::admit_status::admitted)
        fail("admission of " + std::to_string(id) + " after the drain: " + dh::to_string(r.status));
      if (r.mapped_pages != e.mapped_pages)
        fail("admission of " + std::to_string(id) + " after the drain mapped " + std::to_string(r.mapped_pages) +
             " pages, host " + std::to_string(e.mapped_pages));
    } else if (r.status != e.status || r.reclaimed_requests != e.reclaimed_requests ||
               r.reclaimed_pages != e.reclaimed_pages || (r && r.mapped_pages != e.mapped_pages)) {
      fail("admission of " + std::to_string(id) + ": GPU " + dh::to_string(r.status) + " (reclaimed " +
           std::to_string(r.reclaimed_requests) + "/" + std::to_string(r.reclaimed_pages) + ", mapped " +
           std::to_string(r.mapped_pages) + "), host " + dh::to_string(e.status) + " (reclaimed " +
           std::to_string(e.reclaimed_requests) + "/" + std::to_string(e.reclaimed_pages) + ", mapped " +
           std::to_string(e.mapped_pages) + ")");
    }
    if (r) DHTEST_CUDA(cudaStreamSynchronize(step()));  // the import buffers may go
    return static_cast<bool>(r);
  }

  void admit_plain(std::size_t rows) {
    const request_id id = next_id_++;
    std::array<std::vector<std::byte>, kSources> host;
    std::array<std::unique_ptr<dhc::device_buffer<std::byte>>, kSources> dev;
    const bool from_device = uniform(2) == 0;
    std::array<dh::history_import, kSources> h{};
    std::array<dhc::device_history_import, kSources> d{};
    for (std::size_t s = 0; s < kSources; ++s) {
      host[s] = make_rows<Layout>(id, s, 0, rows);
      h[s] = {host[s], rows};
      if (from_device && rows > 0) {
        dev[s] = std::make_unique<dhc::device_buffer<std::byte>>(host[s].size());
        DHTEST_CUDA(cudaMemcpy(dev[s]->data(), host[s].data(), host[s].size(), cudaMemcpyHostToDevice));
      }
      d[s] = {rows > 0 && from_device ? dev[s]->data() : nullptr, rows};
    }
    const bool ok = admit_both(
        id,
        [&] {
          return from_device ? m_.admit(id, std::span<const dhc::device_history_import>(d))
                             : m_.admit(id, std::span<const dh::history_import>(h));
        },
        [&] { return ref_.admit(id, std::span<const dh::history_import>(h)); });
    if (!ok) return;
    auto& w = writer_[id];
    for (std::size_t s = 0; s < kSources; ++s) w[s].assign(rows, id);
  }

  void retain() {
    if (writer_.empty()) return;
    const request_id id = pick();
    const dh::prefix_id p = next_prefix_++;
    const bool whole = uniform(2) == 0;
    std::array<std::int64_t, kSources> rows{};
    for (std::size_t s = 0; s < kSources; ++s) {
      const std::size_t f = writer_.at(id)[s].size();
      rows[s] = static_cast<std::int64_t>(whole ? f : uniform(2) == 0 ? f / kPageRows * kPageRows : uniform(f + 1));
    }
    std::vector<dh::prefix_id> a, b;
    bool host_threw = false, dev_threw = false;
    try {
      if (lockstep_) a = whole ? ref_.retain_prefix(p, id) : ref_.retain_prefix(p, id, rows);
    } catch (const dh::prefix_budget_exceeded&) {
      host_threw = true;
    }
    try {
      b = whole ? m_.retain_prefix(p, id) : m_.retain_prefix(p, id, rows);
    } catch (const dh::prefix_budget_exceeded&) {
      dev_threw = true;
    }
    if (!lockstep_) a = b, host_threw = dev_threw;
    if (host_threw != dev_threw) fail("retain_prefix: host threw " + std::to_string(host_threw) + ", GPU " + std::to_string(dev_threw));
    if (host_threw) return;
    if (a != b) fail("retain_prefix evicted different prefixes");
    for (auto v : a) prefix_writer_.erase(v);
    auto& w = prefix_writer_[p];
    for (std::size_t s = 0; s < kSources; ++s)
      w[s].assign(writer_.at(id)[s].begin(), writer_.at(id)[s].begin() + rows[s]);
  }

  void admit_on_prefix() {
    const auto held = m_.hierarchy().retained_prefixes();
    if (held.empty()) return;
    const dh::prefix_id p = held[uniform(held.size())];
    const request_id id = next_id_++;
    const auto& pw = prefix_writer_.at(p);
    std::array<std::vector<std::byte>, kSources> host;
    std::array<std::unique_ptr<dhc::device_buffer<std::byte>>, kSources> dev;
    std::array<dh::history_import, kSources> h{};
    std::array<dhc::device_history_import, kSources> d{};
    const bool with_suffix = uniform(4) != 0, from_device = uniform(2) == 0;
    std::array<std::size_t, kSources> count{};
    for (std::size_t s = 0; s < kSources; ++s) {
      const std::size_t base = pw[s].size();
      count[s] = with_suffix ? uniform(std::min<std::size_t>(kMaxRows - 4 - std::min(base, kMaxRows - 4), 24) + 1) : 0;
      host[s] = make_rows<Layout>(id, s, static_cast<std::int64_t>(base), count[s]);
      h[s] = {host[s], count[s], static_cast<std::int64_t>(base)};
      if (from_device && count[s] > 0) {
        dev[s] = std::make_unique<dhc::device_buffer<std::byte>>(host[s].size());
        DHTEST_CUDA(cudaMemcpy(dev[s]->data(), host[s].data(), host[s].size(), cudaMemcpyHostToDevice));
      }
      d[s] = {count[s] > 0 && from_device ? dev[s]->data() : nullptr, count[s], static_cast<std::int64_t>(base)};
    }
    // A suffix cut at the wrong place is refused, state unchanged.
    if (with_suffix && pw[0].size() > 0) {
      auto bad = h;
      bad[0].first_row = 0;
      REQUIRE_THROWS_AS(m_.admit(id, p, std::span<const dh::history_import>(bad)), dh::suffix_misaligned);
      REQUIRE(m_.audit().empty());
    }
    const bool ok = admit_both(
        id,
        [&] {
          if (!with_suffix) return m_.admit(id, p);
          return from_device ? m_.admit(id, p, std::span<const dhc::device_history_import>(d))
                             : m_.admit(id, p, std::span<const dh::history_import>(h));
        },
        [&] {
          return with_suffix ? ref_.admit(id, p, std::span<const dh::history_import>(h)) : ref_.admit(id, p);
        });
    if (!ok) return;
    ++prefix_admissions_;
    auto& w = writer_[id];
    for (std::size_t s = 0; s < kSources; ++s) {
      w[s] = pw[s];
      w[s].resize(pw[s].size() + count[s], id);
    }
  }

  void complete_one() {
    if (writer_.empty()) return;
    const request_id id = pick();
    m_.complete(id);
    if (lockstep_) ref_.complete(id);
    writer_.erase(id);
  }

  void release() {
    const auto held = m_.hierarchy().retained_prefixes();
    if (held.empty()) return;
    const dh::prefix_id p = held[uniform(held.size())];
    if (lockstep_) ref_.release_prefix(p);
    m_.release_prefix(p);
    prefix_writer_.erase(p);
    REQUIRE_THROWS_AS(m_.release_prefix(p), dh::unknown_prefix);  // releasing twice
  }

  void repopulate() {
    const std::size_t a = m_.repopulate();
    if (!lockstep_) return;
    const std::size_t b = ref_.repopulate();
    if (a != b) fail("repopulate mapped " + std::to_string(a) + " pages, host " + std::to_string(b));
  }

  /// Resolves a random batch on each source, checks every returned row byte for byte, then
  /// appends one row per source to each request of the batch (on both managers).
  void decode_step() {
    if (writer_.empty()) return;
    std::vector<request_id> batch;
    for (const auto& [id, w] : writer_)
      if (batch.size() < 4 && uniform(2) == 0) batch.push_back(id);
    if (batch.empty()) batch.push_back(pick());
    for (std::size_t s = 0; s < kSources; ++s) {
      std::vector<row_index> sel(batch.size() * K, dh::no_row);
      std::vector<typename Device::batch_item> items(batch.size());
      for (std::size_t e = 0; e < batch.size(); ++e) {
        const std::size_t f = writer_.at(batch[e])[s].size();
        for (std::size_t i = 0; i < K && f > 0; ++i)
          if (uniform(10) != 0) sel[e * K + i] = static_cast<row_index>(uniform(f));
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
    for (request_id id : batch)
      for (std::size_t s = 0; s < kSources; ++s) {
        auto& w = writer_.at(id)[s];
        if (w.size() >= kMaxRows) continue;
        const std::size_t want = (w.size() + 1 + kPageRows - 1) / kPageRows;
        const std::size_t have = static_cast<std::size_t>(m_.hierarchy().reserved_rows(id, s)) / kPageRows;
        if (want > have && m_.hierarchy().free_host_pages(s) == 0) continue;  // both would throw host_pool_exhausted
        const auto rows = make_rows<Layout>(id, s, static_cast<std::int64_t>(w.size()), 1);
        m_.append(id, s, std::span<const std::byte>(rows), 1);
        if (lockstep_) ref_.append(id, s, rows, 1);
        w.push_back(id);
      }
  }

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
        const request_id tag = writer_.at(batch[e])[s][static_cast<std::size_t>(r)];
        for (std::size_t layer = 0; layer < d.payload_layers; ++layer) {
          fill_row(want.data(), d.row_bytes, tag, s, layer, r);
          const std::byte* got = pools[layer].data() + static_cast<std::size_t>(l) * d.row_bytes;
          if (std::memcmp(got, want.data(), d.row_bytes) != 0)
            fail("request " + std::to_string(batch[e]) + " source " + std::to_string(s) + " layer " +
                 std::to_string(layer) + " row " + std::to_string(r) + " (written by " + std::to_string(tag) +
                 ") resolved to location " + std::to_string(l) + " holding " + hex_prefix(got, d.row_bytes) +
                 ", expected " + hex_prefix(want.data(), d.row_bytes));
        }
      }
  }

  // ---------------------------------------------------------------- checks

  void compare() {
    const std::string a = m_.audit();
    if (!a.empty()) fail("audit: " + a);
    if (!m_.invariant_holds()) fail("Invariant 3 broken");
    if (!lockstep_) {
      if (m_.admitted_count() != writer_.size()) fail("admitted count differs from the test's");
      for (const auto& [id, w] : writer_)
        for (std::size_t s = 0; s < kSources; ++s)
          if (m_.hierarchy().frontier(id, s) != static_cast<std::int64_t>(w[s].size()))
            fail("request " + std::to_string(id) + " source " + std::to_string(s) + ": frontier differs");
      return;
    }
    const std::string b = ref_.audit();
    if (!b.empty()) fail("host audit: " + b);
    if (m_.admitted_count() != writer_.size() || ref_.admitted_count() != writer_.size())
      fail("admitted counts differ from the test's");
    if (m_.hierarchy().retained_prefixes() != ref_.hierarchy().retained_prefixes()) fail("retained prefixes differ");
    for (std::size_t s = 0; s < kSources; ++s) {
      const std::string src = "source " + std::to_string(s) + ": ";
      const auto lg = m_.ledger(s), lh = ref_.ledger(s);
      if (!(lg == lh))
        fail(src + "ledger M_req/M_opt " + std::to_string(lg.required) + "/" + std::to_string(lg.optional) + ", host " +
             std::to_string(lh.required) + "/" + std::to_string(lh.optional));
      if (m_.hierarchy().free_optional_pages(s) != ref_.hierarchy().free_optional_pages(s))
        fail(src + "free optional pages differ");
      if (m_.hierarchy().free_host_pages(s) != ref_.hierarchy().free_host_pages(s)) fail(src + "free host pages differ");
      if (m_.hierarchy().prefix_pages_held(s) != ref_.hierarchy().prefix_pages_held(s)) fail(src + "prefix pages differ");
      std::map<std::int32_t, std::int32_t> gpu_to_host, host_to_gpu;  // the sharing structure, a bijection
      for (const auto& [id, w] : writer_) {
        const std::string who = src + "request " + std::to_string(id) + ": ";
        if (m_.hierarchy().frontier(id, s) != static_cast<std::int64_t>(w[s].size()))
          fail(who + "frontier " + std::to_string(m_.hierarchy().frontier(id, s)) + ", expected " +
               std::to_string(w[s].size()));
        if (m_.optional_pages_of(id, s) != ref_.optional_pages_of(id, s))
          fail(who + std::to_string(m_.optional_pages_of(id, s)) + " optional pages, host " +
               std::to_string(ref_.optional_pages_of(id, s)));
        const auto hp = m_.hierarchy().host_pages_of(id, s), rp = ref_.hierarchy().host_pages_of(id, s);
        if (!std::equal(hp.begin(), hp.end(), rp.begin(), rp.end())) fail(who + "host page tables differ");
        const auto gm = m_.hierarchy().optional_map_of(id, s);  // read back from the device
        const auto hm = ref_.hierarchy().optional_map_of(id, s);
        for (std::size_t page = 0; page < gm.size(); ++page) {
          const std::string pg = who + "page " + std::to_string(page) + ": ";
          if ((gm[page] >= 0) != (hm[page] >= 0))
            fail(pg + "GPU maps pool page " + std::to_string(gm[page]) + ", host " + std::to_string(hm[page]));
          if (gm[page] < 0) continue;
          if (m_.page_of(id, s, page).pool_page != gm[page]) fail(pg + "device map and books differ");
          const auto [ig, newg] = gpu_to_host.emplace(gm[page], hm[page]);
          const auto [ih, newh] = host_to_gpu.emplace(hm[page], gm[page]);
          if (ig->second != hm[page] || ih->second != gm[page]) fail(pg + "shared with different pages than on the host");
          if (!newg) ++joins_seen_;
          if (m_.hierarchy().optional_page_refs(s, gm[page]) != ref_.hierarchy().optional_page_refs(s, hm[page]))
            fail(pg + "mapper counts differ");
        }
      }
    }
  }

  /// Every mapped page's pool bytes, and every host-backed page's host bytes, are the rows written.
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
      for (const auto& [id, w] : writer_) {
        const auto map = m_.hierarchy().optional_map_of(id, s);
        for (std::size_t page = 0; page < map.size(); ++page) {
          const auto st = m_.page_of(id, s, page);
          const std::string who = "request " + std::to_string(id) + " source " + std::to_string(s) + " page " +
                                  std::to_string(page) + ": ";
          for (std::size_t r = page * kPageRows; r < std::min(w[s].size(), (page + 1) * kPageRows); ++r)
            for (std::size_t layer = 0; layer < d.payload_layers; ++layer) {
              fill_row(want.data(), d.row_bytes, w[s][r], s, layer, static_cast<row_index>(r));
              if (map[page] >= 0) {
                const location l = m_.hierarchy().space().optional(static_cast<std::size_t>(map[page]),
                                                                   static_cast<std::int64_t>(r));
                if (std::memcmp(pools[layer].data() + static_cast<std::size_t>(l) * d.row_bytes, want.data(), d.row_bytes) != 0)
                  fail(who + "row " + std::to_string(r) + " layer " + std::to_string(layer) + " wrong in its pool page");
              }
              if (!st.device_only) {
                const auto got = m_.hierarchy().host_row(id, s, layer, static_cast<std::int64_t>(r));
                if (std::memcmp(got.data(), want.data(), d.row_bytes) != 0)
                  fail(who + "row " + std::to_string(r) + " layer " + std::to_string(layer) + " not host-backed");
              }
            }
        }
      }
    }
  }

  bool lockstep_;
  std::mt19937_64 rng_;
  Gpu m_;
  Ref ref_;
  dhc::device_buffer<row_index> dsel_;
  dhc::device_buffer<location> dloc_;
  std::string ctx_;
  request_id next_id_ = 1;
  dh::prefix_id next_prefix_ = 1;
  std::map<request_id, tags> writer_;
  std::map<dh::prefix_id, tags> prefix_writer_;
  std::size_t prefix_admissions_ = 0, joins_seen_ = 0, resolved_entries_ = 0;
};

}  // namespace

namespace {
template <class Policy>
void run_both(std::uint64_t seed) {
  harness<Policy>(seed, true).run(kOps);
  harness<Policy>(seed + 100, false).run(kOps);
}
}  // namespace

TEST_CASE("GPU prefix residency: adaptive, most recent first", "[gpu][prefix]") {
  require_device();
  run_both<dh::adaptive_policy<>>(5);
}
TEST_CASE("GPU prefix residency: adaptive, least recent first, one page an attempt", "[gpu][prefix]") {
  require_device();
  run_both<dh::adaptive_policy<dh::reclaim_order::least_recent_first, 1>>(17);
}
TEST_CASE("GPU prefix residency: resident", "[gpu][prefix]") {
  require_device();
  run_both<dh::resident_policy>(29);
}
