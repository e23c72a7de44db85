// Ordering rules of load-adaptive residency on the CUDA backend (cuda/residency_manager.cuh),
// observed while the copy stream is held back by a gate (a kernel spinning on a host flag):
//  - a page whose fill is pending is never returned by resolve (the resolver serves its rows from
//    the tail, the hot cache and the host), and is returned once published;
//  - a device-only page under reclaim stays mapped until its host backup is complete, and its
//    rows are still exact after it is retired;
//  - a request completed while its fills are pending leaves nothing behind in a reused slot;
//  - pages backed up ahead of time (`back_up`) are unmapped at once by a reclaim;
//  - with the step stream held, an unmapped page stays retiring (readers may still run) while
//    admit and poll return at once;
//  - bad admissions throw typed errors and change nothing;
//  - streamed chunks (import_history) place pages as the host manager does: pages wholly in a chunk
//    are written and published on the step stream at once, the page an earlier chunk began is
//    filled on the (held) copy stream and stays invisible until published; an import from another
//    stream waits for it and that stream's later work waits for the import; bad chunks throw.
// Nothing here synchronises the whole device while the gate is closed: reads are stream-ordered
// copies on the step stream into pinned buffers allocated up front, waited for with a deadline
// shorter than the gate's own timeout (~10 s), and every read made while the gate is closed also
// checks that the gate was still closed when the read completed. So a step path that waits for
// the held copy stream (in the manager, or in the harness) fails here instead of passing late.
#include "cuda_test_support.cuh"

#include "dhisparse/cuda/residency_manager.cuh"
#include "dhisparse/host/hierarchy.hpp"

namespace {
using namespace dhtest;
using Layout = dh::layouts::tiny;
using Hot = dh::lru_hot_cache<16>;
using Device = dhc::hierarchy<Layout, Hot>;
using Manager = dhc::residency_manager<Device, dh::adaptive_policy<>>;
constexpr std::size_t K = Layout::top_k;
constexpr std::size_t kPageRows = Layout::page_rows;
constexpr std::size_t kRows = 64;  // 8 pages

/// Seconds a read of the step stream may take while a gate is closed: well below the gate's own
/// timeout, so a read that waits for the held stream is caught before the gate gives way.
constexpr double kHeldReadSeconds = 4.0;

/// Waits for the step stream's work so far. With a gate closed on another stream, the work must
/// finish within kHeldReadSeconds and while the gate is still closed: the step path never waits
/// for the held stream.
void wait_step(cudaStream_t stream, const std::string& ctx, const gate* held) {
  if (held == nullptr) {
    wait_or_die(stream, ctx);
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  cudaError_t e = cudaErrorNotReady;
  while ((e = cudaStreamQuery(stream)) == cudaErrorNotReady &&
         std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < kHeldReadSeconds)
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  INFO(ctx << ": the step stream's work took " << waited << " s with the gate closed (it must not wait for the held stream)");
  REQUIRE(e != cudaErrorNotReady);
  DHTEST_CUDA(e);
  REQUIRE(held->closed());  // finished while the held stream was still held
}

cudaStream_t new_stream() {
  cudaStream_t s = nullptr;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  return s;
}

struct fixture {
  dh::hierarchy_config hc() {
    dh::hierarchy_config c;
    c.max_requests = 2;
    c.max_rows = kRows;
    c.optional_pages = 16;
    return c;
  }
  cudaStream_t stream = new_stream();
  // required 6 of 16 pages: one request maps all 8 of its pages, a second one forces a reclaim
  Manager m{hc(), {6, 0}, stream};
  dhc::device_buffer<row_index> dsel{K};
  dhc::device_buffer<location> dloc{K};
  // Pinned host ends of every read and upload, allocated before any gate closes (allocating or
  // freeing pinned memory may synchronise the device; pageable copies may wait on the host).
  dhc::pinned_buffer hsel{K * sizeof(row_index)};
  dhc::pinned_buffer hloc{K * sizeof(location)};
  dhc::pinned_buffer hmap{m.hierarchy().view(0).pages_per_request * sizeof(std::int32_t)};
  std::array<std::vector<dhc::pinned_buffer>, Device::sources> hpool = [this] {
    std::array<std::vector<dhc::pinned_buffer>, Device::sources> p;
    for (std::size_t s = 0; s < Device::sources; ++s)
      for (std::size_t l = 0; l < Layout::sources[s].payload_layers; ++l)
        p[s].emplace_back(m.hierarchy().space().rows() * Layout::sources[s].row_bytes);
    return p;
  }();

  /// Nothing queued may still write the pinned buffers when they go.
  ~fixture() { cudaStreamSynchronize(stream); }

  /// The device optional map of a request, read in step-stream order (no device-wide sync). With
  /// `held`, the read must complete while that gate is still closed.
  std::vector<std::int32_t> device_map(request_id id, std::size_t s, const gate* held = nullptr) {
    const auto& v = m.hierarchy().view(s);
    std::vector<std::int32_t> out(v.pages_per_request);
    auto* h = reinterpret_cast<std::int32_t*>(hmap.data());
    DHTEST_CUDA(cudaMemcpyAsync(h, v.optional_page + m.hierarchy().slot_of(id) * v.pages_per_request,
                                out.size() * sizeof(std::int32_t), cudaMemcpyDeviceToHost, stream));
    wait_step(stream, "device map read", held);
    std::copy(h, h + out.size(), out.begin());
    return out;
  }

  bool in_optional_region(location l) const {
    const auto& sp = m.hierarchy().space();
    return static_cast<std::size_t>(l) >= sp.slots * (sp.hot_rows + sp.tail_rows) &&
           static_cast<std::size_t>(l) < sp.slots * (sp.hot_rows + sp.tail_rows) + sp.optional_pages * sp.page_rows;
  }

  /// Resolves every row of [0, kRows) of a request on source `s`, K at a time; checks every row
  /// byte for byte (all layers); returns how many locations were in the optional region. With
  /// `held`, each resolve and its reads must complete while that gate is still closed.
  std::size_t resolve_all(request_id id, std::size_t s, const std::string& ctx, const gate* held = nullptr) {
    const auto& d = Layout::sources[s];
    std::size_t optional = 0;
    auto* hs = reinterpret_cast<row_index*>(hsel.data());
    const auto* hl = reinterpret_cast<const location*>(hloc.data());
    for (std::size_t first = 0; first < kRows; first += K) {
      std::vector<row_index> sel(K);
      for (std::size_t i = 0; i < K; ++i) sel[i] = hs[i] = static_cast<row_index>(first + i);
      DHTEST_CUDA(cudaMemcpyAsync(dsel.data(), hs, K * sizeof(row_index), cudaMemcpyHostToDevice, stream));
      const typename Device::batch_item item{id, dsel.data(), static_cast<std::int32_t>(K), dloc.data()};
      m.step().resolve(s, std::span<const typename Device::batch_item>(&item, 1), stream);
      DHTEST_CUDA(cudaMemcpyAsync(hloc.data(), dloc.data(), K * sizeof(location), cudaMemcpyDeviceToHost, stream));
      for (std::size_t l = 0; l < d.payload_layers; ++l)
        DHTEST_CUDA(cudaMemcpyAsync(hpool[s][l].data(), m.hierarchy().pool(s, l), hpool[s][l].bytes(),
                                    cudaMemcpyDeviceToHost, stream));
      wait_step(stream, ctx + ": resolve", held);
      m.step().check_errors(stream);  // the step stream is idle: no wait; no device-wide sync unless it throws
      const std::vector<location> loc(hl, hl + K);
      std::vector<std::byte> want(d.row_bytes);
      for (std::size_t i = 0; i < K; ++i) {
        if (in_optional_region(loc[i])) ++optional;
        for (std::size_t l = 0; l < d.payload_layers; ++l) {
          fill_row(want.data(), d.row_bytes, id, s, l, sel[i]);
          const std::byte* got = hpool[s][l].data() + static_cast<std::size_t>(loc[i]) * d.row_bytes;
          INFO(ctx << ": request " << id << " source " << s << " layer " << l << " row " << sel[i] << " at location "
                   << loc[i] << " holds " << hex_prefix(got, d.row_bytes) << ", expected "
                   << hex_prefix(want.data(), d.row_bytes));
          REQUIRE(std::memcmp(got, want.data(), d.row_bytes) == 0);
        }
      }
    }
    return optional;
  }

  /// Admits a request with kRows rows on every source, imported from device buffers.
  dh::residency_admission admit_from_device(request_id id, std::vector<std::unique_ptr<dhc::device_buffer<std::byte>>>& keep) {
    std::array<dhc::device_history_import, Device::sources> h{};
    for (std::size_t s = 0; s < Device::sources; ++s) {
      const auto rows = make_rows<Layout>(id, s, 0, kRows);
      keep.push_back(std::make_unique<dhc::device_buffer<std::byte>>(rows.size()));
      DHTEST_CUDA(cudaMemcpy(keep.back()->data(), rows.data(), rows.size(), cudaMemcpyHostToDevice));
      h[s] = {keep.back()->data(), kRows};
    }
    return m.admit(id, std::span<const dhc::device_history_import>(h));
  }
  dh::residency_admission admit_from_host(request_id id) {
    std::array<std::vector<std::byte>, Device::sources> rows;
    std::array<dh::history_import, Device::sources> h{};
    for (std::size_t s = 0; s < Device::sources; ++s) {
      rows[s] = make_rows<Layout>(id, s, 0, kRows);
      h[s] = {rows[s], kRows};
    }
    return m.admit(id, std::span<const dh::history_import>(h));
  }
  void require_audit(const std::string& ctx) {
    const std::string a = m.audit();
    INFO(ctx << ": audit: " << a);
    REQUIRE(a.empty());
    REQUIRE(m.invariant_holds());
  }
};

}  // namespace

TEST_CASE("a device-only page is backed up before it is unmapped, and its rows stay exact", "[gpu][residency]") {
  require_device();
  fixture f;
  std::vector<std::unique_ptr<dhc::device_buffer<std::byte>>> keep;
  const auto a = f.admit_from_device(1, keep);
  REQUIRE(a.status == dh::admit_status::admitted);
  REQUIRE(a.mapped_pages == 2 * (kRows / kPageRows));
  for (std::size_t s = 0; s < Device::sources; ++s)
    for (std::size_t p = 0; p < kRows / kPageRows; ++p) {
      const auto st = f.m.page_of(1, s, p);
      REQUIRE(st.state == dhc::page_state::ready);
      REQUIRE(st.device_only);
    }
  // every non-tail row resolves into the optional region, exactly
  for (std::size_t s = 0; s < Device::sources; ++s) REQUIRE(f.resolve_all(1, s, "device-only, mapped") == kRows - kPageRows);

  gate g;
  g.close(f.m.copy_stream());
  const auto b = f.admit_from_host(2);
  INFO("admission of 2: " << dh::to_string(b.status));
  REQUIRE(b.status == dh::admit_status::wait_for_reclaim);
  REQUIRE(b.reclaimed_requests == 1);
  for (int i = 0; i < 5; ++i) f.m.poll();
  f.require_audit("backups held back");
  for (std::size_t s = 0; s < Device::sources; ++s) {
    const auto map = f.device_map(1, s, &g);
    for (std::size_t p = 0; p < kRows / kPageRows; ++p) {
      INFO("source " << s << " page " << p);
      CHECK(f.m.page_of(1, s, p).state == dhc::page_state::backing_up);
      REQUIRE(map[p] >= 0);  // not unmapped before its backup completes
    }
    REQUIRE(f.resolve_all(1, s, "backup pending", &g) == kRows - kPageRows);
  }
  REQUIRE(f.admit_from_host(2).status == dh::admit_status::wait_for_reclaim);

  g.open();
  f.m.drain();
  f.require_audit("after the reclaim");
  for (std::size_t s = 0; s < Device::sources; ++s) {
    const auto map = f.device_map(1, s);
    for (std::size_t p = 0; p < kRows / kPageRows; ++p) {
      const auto st = f.m.page_of(1, s, p);
      REQUIRE(st.state == dhc::page_state::absent);
      REQUIRE_FALSE(st.device_only);
      REQUIRE(map[p] == -1);
      for (std::size_t r = p * kPageRows; r < (p + 1) * kPageRows; ++r)
        for (std::size_t l = 0; l < Layout::sources[s].payload_layers; ++l) {
          std::vector<std::byte> want(Layout::sources[s].row_bytes);
          fill_row(want.data(), want.size(), 1, s, l, static_cast<row_index>(r));
          const auto got = f.m.hierarchy().host_row(1, s, l, static_cast<row_index>(r));
          INFO("host copy of request 1 source " << s << " layer " << l << " row " << r);
          REQUIRE(std::memcmp(got.data(), want.data(), want.size()) == 0);
        }
    }
  }
  const auto b2 = f.admit_from_host(2);
  REQUIRE(b2.status == dh::admit_status::admitted);
  REQUIRE(f.m.claims() == 0);
  // the reclaimed request's rows now come from the tail, the hot cache and the host, exactly
  for (std::size_t s = 0; s < Device::sources; ++s) REQUIRE(f.resolve_all(1, s, "reclaimed") == 0);
  f.m.drain();
  f.require_audit("end");
}

TEST_CASE("a pending page is never returned by resolve; it is once published", "[gpu][residency]") {
  require_device();
  fixture f;
  REQUIRE(f.admit_from_host(1).status == dh::admit_status::admitted);
  // make request 1 lose its pages: a second admission reclaims them
  REQUIRE(f.admit_from_host(2).status == dh::admit_status::wait_for_reclaim);
  f.m.drain();
  REQUIRE(f.admit_from_host(2).status == dh::admit_status::admitted);
  REQUIRE(f.m.optional_pages_of(1, 0) == 0);
  f.m.complete(2);
  f.m.drain();

  gate g;
  g.close(f.m.copy_stream());
  const std::size_t mapped = f.m.repopulate();
  REQUIRE(mapped == 2 * (kRows / kPageRows));
  for (int i = 0; i < 5; ++i) f.m.poll();
  f.require_audit("fills held back");
  for (std::size_t s = 0; s < Device::sources; ++s) {
    const auto map = f.device_map(1, s, &g);
    for (std::size_t p = 0; p < kRows / kPageRows; ++p) {
      INFO("source " << s << " page " << p);
      REQUIRE(f.m.page_of(1, s, p).state == dhc::page_state::filling);
      REQUIRE(map[p] == -1);  // reserved, not published
    }
    REQUIRE(f.resolve_all(1, s, "fills pending", &g) == 0);
  }
  g.open();
  f.m.drain();
  f.require_audit("fills done");
  for (std::size_t s = 0; s < Device::sources; ++s) {
    const auto map = f.device_map(1, s);
    for (std::size_t p = 0; p < kRows / kPageRows; ++p) {
      REQUIRE(f.m.page_of(1, s, p).state == dhc::page_state::ready);
      REQUIRE(map[p] == f.m.page_of(1, s, p).pool_page);
    }
    REQUIRE(f.resolve_all(1, s, "published") == kRows - kPageRows);
  }
}

TEST_CASE("completing a request with fills in flight leaves nothing in its reused slot", "[gpu][residency]") {
  require_device();
  fixture f;
  REQUIRE(f.admit_from_host(1).status == dh::admit_status::admitted);
  REQUIRE(f.admit_from_host(2).status == dh::admit_status::wait_for_reclaim);
  f.m.drain();
  REQUIRE(f.admit_from_host(2).status == dh::admit_status::admitted);
  f.m.complete(2);
  f.m.drain();
  const std::size_t slot1 = f.m.hierarchy().slot_of(1);

  gate g;
  g.close(f.m.copy_stream());
  REQUIRE(f.m.repopulate() > 0);
  f.m.complete(1);  // its fills and publishes are still held back
  f.require_audit("completed with fills pending");
  REQUIRE(f.m.retiring_pages(0) > 0);
  g.open();
  f.m.drain();
  f.require_audit("after the drain");
  for (std::size_t s = 0; s < Device::sources; ++s) {
    REQUIRE(f.m.retiring_pages(s) == 0);
    REQUIRE(f.m.hierarchy().free_optional_pages(s) == 16);
  }
  // a new request in the same slot: its map holds only its own pages
  REQUIRE(f.admit_from_host(3).status == dh::admit_status::admitted);
  REQUIRE(f.m.hierarchy().slot_of(3) == slot1);
  for (std::size_t s = 0; s < Device::sources; ++s) {
    const auto map = f.device_map(3, s);
    for (std::size_t p = 0; p < kRows / kPageRows; ++p) {
      const auto st = f.m.page_of(3, s, p);
      INFO("source " << s << " page " << p);
      REQUIRE(map[p] == (st.state == dhc::page_state::ready ? st.pool_page : -1));
    }
    f.resolve_all(3, s, "reused slot");
  }
  f.m.drain();
  f.require_audit("end");
}

TEST_CASE("pages backed up ahead of time retire without waiting for a backup", "[gpu][residency]") {
  require_device();
  fixture f;
  std::vector<std::unique_ptr<dhc::device_buffer<std::byte>>> keep;
  REQUIRE(f.admit_from_device(1, keep).status == dh::admit_status::admitted);
  REQUIRE(f.m.back_up(1000) == 2 * (kRows / kPageRows));
  f.m.drain();
  f.require_audit("backed up");
  for (std::size_t s = 0; s < Device::sources; ++s)
    for (std::size_t p = 0; p < kRows / kPageRows; ++p) {
      const auto st = f.m.page_of(1, s, p);
      REQUIRE(st.state == dhc::page_state::ready);
      REQUIRE_FALSE(st.device_only);
      for (std::size_t r = p * kPageRows; r < (p + 1) * kPageRows; ++r) {
        std::vector<std::byte> want(Layout::sources[s].row_bytes);
        fill_row(want.data(), want.size(), 1, s, 0, static_cast<row_index>(r));
        const auto got = f.m.hierarchy().host_row(1, s, 0, static_cast<row_index>(r));
        INFO("host copy of request 1 source " << s << " row " << r);
        REQUIRE(std::memcmp(got.data(), want.data(), want.size()) == 0);
      }
    }
  REQUIRE(f.m.back_up(1000) == 0);  // nothing device-only is left
  // a reclaim now unmaps at once: no page waits in backing_up
  REQUIRE(f.admit_from_host(2).status == dh::admit_status::wait_for_reclaim);
  for (std::size_t s = 0; s < Device::sources; ++s) {
    REQUIRE(f.m.optional_pages_of(1, s) == 0);
    REQUIRE(f.m.retiring_pages(s) == kRows / kPageRows);
  }
  f.require_audit("retiring");
  f.m.drain();
  REQUIRE(f.admit_from_host(2).status == dh::admit_status::admitted);
  for (std::size_t s = 0; s < Device::sources; ++s) REQUIRE(f.resolve_all(1, s, "after reclaim") == 0);
  f.m.drain();
  f.require_audit("end");
}

TEST_CASE("bad admissions throw typed errors and change nothing", "[gpu][residency]") {
  require_device();
  fixture f;
  REQUIRE(f.admit_from_host(1).status == dh::admit_status::admitted);
  f.m.drain();
  const auto ledger = f.m.ledger(0);
  const auto free_host = f.m.hierarchy().free_host_pages(0);
  REQUIRE_THROWS_AS(f.admit_from_host(1), dh::duplicate_admission);
  {
    std::vector<std::byte> rows(10);
    std::array<dh::history_import, Device::sources> h{{{rows, 3}, {rows, 3}}};
    REQUIRE_THROWS_AS(f.m.admit(5, std::span<const dh::history_import>(h)), dh::size_mismatch);
  }
  {
    std::array<dhc::device_history_import, Device::sources> h{{{nullptr, 8}, {nullptr, 8}}};
    REQUIRE_THROWS_AS(f.m.admit(5, std::span<const dhc::device_history_import>(h)), dh::size_mismatch);
  }
  {
    dhc::device_buffer<std::byte> big((kRows + 1) * 64 * 2);
    std::array<dhc::device_history_import, Device::sources> h{{{big.data(), kRows + 1}, {big.data(), kRows + 1}}};
    REQUIRE_THROWS_AS(f.m.admit(5, std::span<const dhc::device_history_import>(h)), dh::capacity_exceeded);
  }
  {
    std::array<dhc::device_history_import, 1> h{{{nullptr, 0}}};
    REQUIRE_THROWS_AS(f.m.admit(5, std::span<const dhc::device_history_import>(h)), dh::size_mismatch);
  }
  REQUIRE_THROWS_AS(f.m.complete(77), dh::unknown_request);
  REQUIRE_FALSE(f.m.contains(5));
  REQUIRE(f.m.ledger(0) == ledger);
  REQUIRE(f.m.hierarchy().free_host_pages(0) == free_host);
  f.require_audit("after bad input");
}

TEST_CASE("retirement waits for earlier step-stream work, and the host never waits for it", "[gpu][residency]") {
  require_device();
  fixture f;
  REQUIRE(f.admit_from_host(1).status == dh::admit_status::admitted);
  REQUIRE(f.m.back_up(1000) == 2 * (kRows / kPageRows));  // host-backed: the reclaim unmaps at once
  f.m.drain();
  gate g;
  g.close(f.stream);  // the step stream is held: it stands for readers of the pages still running
  const auto t0 = std::chrono::steady_clock::now();
  const auto r = f.admit_from_host(2);
  for (int i = 0; i < 5; ++i) f.m.poll();
  const auto r2 = f.admit_from_host(2);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO("admit, poll and the retry took " << seconds << " s with the step stream held (they must not wait for it)");
  CHECK(seconds < 2.0);
  REQUIRE(r.status == dh::admit_status::wait_for_reclaim);
  REQUIRE(r2.status == dh::admit_status::wait_for_reclaim);
  f.require_audit("unmapped, readers pending");
  for (std::size_t s = 0; s < Device::sources; ++s) {
    REQUIRE(f.m.optional_pages_of(1, s) == 0);
    REQUIRE(f.m.retiring_pages(s) == kRows / kPageRows);                  // not back in the pool
    REQUIRE(f.m.hierarchy().free_optional_pages(s) == 16 - kRows / kPageRows);
    REQUIRE(f.m.ledger(s).optional == kRows / kPageRows);                 // still counted in M_opt
  }
  g.open();
  f.m.drain();
  for (std::size_t s = 0; s < Device::sources; ++s) {
    REQUIRE(f.m.retiring_pages(s) == 0);
    REQUIRE(f.m.hierarchy().free_optional_pages(s) == 16);
  }
  REQUIRE(f.admit_from_host(2).status == dh::admit_status::admitted);
  for (std::size_t s = 0; s < Device::sources; ++s) REQUIRE(f.resolve_all(1, s, "after retirement") == 0);
  f.m.drain();
  f.require_audit("end");
}

TEST_CASE("streamed chunks place pages as the host manager does; a page an earlier chunk began is filled, not written",
          "[gpu][residency][streaming]") {
  require_device();
  fixture f;
  using HostRef = dh::residency_manager<dh::host_hierarchy<Layout, Hot>, dh::adaptive_policy<>>;
  HostRef ref(f.hc(), {6, 0});
  REQUIRE(f.m.admit(1).status == dh::admit_status::admitted);  // no history yet: 10 spare pages a source
  REQUIRE(ref.admit(1));
  // Chunks of 12 rows (pages of 8): every other chunk completes a page the previous chunk began.
  // Device buffers are prepared before the gate closes (allocations may synchronise the device).
  constexpr std::size_t kChunk = 12;
  std::vector<std::unique_ptr<dhc::device_buffer<std::byte>>> keep;
  std::vector<std::vector<std::byte>> host_chunks;
  for (std::size_t s = 0; s < Device::sources; ++s)
    for (std::size_t first = 0; first < kRows; first += kChunk) {
      const std::size_t count = std::min(kChunk, kRows - first);
      host_chunks.push_back(make_rows<Layout>(1, s, static_cast<std::int64_t>(first), count));
      keep.push_back(std::make_unique<dhc::device_buffer<std::byte>>(host_chunks.back().size()));
      DHTEST_CUDA(cudaMemcpy(keep.back()->data(), host_chunks.back().data(), host_chunks.back().size(),
                             cudaMemcpyHostToDevice));
    }
  gate g;
  g.close(f.m.copy_stream());  // fills of straddling pages stay pending; direct writes do not need it
  std::size_t chunk = 0;
  for (std::size_t s = 0; s < Device::sources; ++s)
    for (std::size_t first = 0; first < kRows; first += kChunk, ++chunk) {
      const std::size_t count = std::min(kChunk, kRows - first);
      INFO("source " << s << " rows " << first << ".." << first + count - 1);
      const std::size_t got = f.m.import_history(1, s, keep[chunk]->data(), count);
      REQUIRE(got == ref.import_history(1, s, host_chunks[chunk], count));
      f.require_audit("chunk imported");
      // pages wholly in the chunk are written and published on the step stream; the page the
      // previous chunk began is filling on the held copy stream
      for (std::size_t p = first / kPageRows; p < (first + count) / kPageRows; ++p) {
        const auto st = f.m.page_of(1, s, p);
        INFO("page " << p);
        if (p * kPageRows >= first) {
          REQUIRE(st.state == dhc::page_state::ready);
          REQUIRE(st.device_only);
        } else {
          REQUIRE(st.state == dhc::page_state::filling);
          REQUIRE_FALSE(st.device_only);
        }
      }
    }
  for (std::size_t s = 0; s < Device::sources; ++s) {
    const auto map = f.device_map(1, s, &g);
    for (std::size_t p = 0; p < kRows / kPageRows; ++p)
      REQUIRE(map[p] == (f.m.page_of(1, s, p).state == dhc::page_state::ready ? f.m.page_of(1, s, p).pool_page : -1));
    f.resolve_all(1, s, "fills of straddling pages held", &g);  // exact, pending pages not returned
  }
  g.open();
  f.m.drain();
  f.require_audit("drained");
  for (std::size_t s = 0; s < Device::sources; ++s) {
    const auto want = ref.hierarchy().optional_map_of(1, s);
    const auto map = f.device_map(1, s);
    for (std::size_t p = 0; p < kRows / kPageRows; ++p) {
      INFO("source " << s << " page " << p);
      REQUIRE((want[p] >= 0) == (f.m.page_of(1, s, p).state == dhc::page_state::ready));
      REQUIRE(map[p] == (want[p] >= 0 ? f.m.page_of(1, s, p).pool_page : -1));
    }
    REQUIRE(f.m.ledger(s) == ref.ledger(s));
    f.resolve_all(1, s, "after the fills");
  }
}

TEST_CASE("an import from another stream is ordered after it, and that stream's later work after the import",
          "[gpu][residency][streaming]") {
  require_device();
  fixture f;
  REQUIRE(f.m.admit(1).status == dh::admit_status::admitted);
  {
    // bad chunks: typed errors, state unchanged
    const auto ledger = f.m.ledger(0);
    const auto two = make_rows<Layout>(1, 0, 0, 2);
    REQUIRE_THROWS_AS(f.m.import_history(9, 0, std::span<const std::byte>(two), 2), dh::unknown_request);
    REQUIRE_THROWS_AS(f.m.import_history(1, 2, std::span<const std::byte>(two), 2), dh::invalid_source);
    REQUIRE_THROWS_AS(f.m.import_history(1, 0, std::span<const std::byte>(two), 1), dh::size_mismatch);
    REQUIRE_THROWS_AS(f.m.import_history(1, 0, nullptr, 3), dh::size_mismatch);
    REQUIRE_THROWS_AS(f.m.import_history(1, 0, nullptr, kRows + 1), dh::capacity_exceeded);
    int pageable = 0;
    DHTEST_CUDA(cudaDeviceGetAttribute(&pageable, cudaDevAttrPageableMemoryAccess, 0));
    if (pageable == 0)  // pageable host rows through the device-pointer overload
      REQUIRE_THROWS_AS(f.m.import_history(1, 0, two.data(), 2), dh::invalid_configuration);
    REQUIRE(f.m.ledger(0) == ledger);
    REQUIRE(f.m.hierarchy().frontier(1, 0) == 0);
    f.require_audit("after bad chunks");
  }
  cudaStream_t producer = new_stream();
  for (std::size_t s = 0; s < Device::sources; ++s) {
    const auto rows = make_rows<Layout>(1, s, 0, kRows);
    dhc::device_buffer<std::byte> buf(rows.size());
    DHTEST_CUDA(cudaMemsetAsync(buf.data(), 0, rows.size(), producer));
    gate g;
    g.close(producer);  // the producer's "prefill" has not run yet
    dhc::pinned_buffer staged(rows.size());
    std::memcpy(staged.data(), rows.data(), rows.size());
    DHTEST_CUDA(cudaMemcpyAsync(buf.data(), staged.data(), rows.size(), cudaMemcpyHostToDevice, producer));
    REQUIRE(f.m.import_history(1, s, buf.data(), kRows, producer) == kRows / kPageRows);
    DHTEST_CUDA(cudaMemsetAsync(buf.data(), 0x5A, rows.size(), producer));  // the engine reuses its buffer
    g.open();
    DHTEST_CUDA(cudaStreamSynchronize(producer));
    f.m.drain();
    REQUIRE(f.resolve_all(1, s, "imported from the producer stream") == kRows - kPageRows);
  }
  f.require_audit("end");
  cudaStreamDestroy(producer);
}

TEST_CASE("history after a source's first decode row is refused", "[gpu][residency][streaming]") {
  require_device();
  fixture f;
  REQUIRE(f.m.admit(1).status == dh::admit_status::admitted);
  const auto rows = make_rows<Layout>(1, 0, 0, 8);
  REQUIRE(f.m.import_history(1, 0, std::span<const std::byte>(rows), 8) == 1);
  const auto next = make_rows<Layout>(1, 0, 8, 1);
  f.m.append(1, 0, std::span<const std::byte>(next), 1);  // decoding starts on source 0
  const auto more = make_rows<Layout>(1, 0, 9, 1);
  const auto ledger = f.m.ledger(0);
  REQUIRE_THROWS_AS(f.m.import_history(1, 0, std::span<const std::byte>(more), 1), dh::import_after_decode);
  REQUIRE(f.m.ledger(0) == ledger);
  REQUIRE(f.m.hierarchy().frontier(1, 0) == 9);
  const auto other = make_rows<Layout>(1, 1, 0, 8);
  REQUIRE(f.m.import_history(1, 1, std::span<const std::byte>(other), 8) == 1);  // source 1 still takes history
  f.m.drain();
  f.require_audit("end");
}
