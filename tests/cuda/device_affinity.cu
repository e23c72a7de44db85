// Device affinity of the CUDA backend: every owning object is bound to the device that was current
// when it was created (`device()`); its calls work from any thread, whatever that thread's current
// device, and leave that device as it was; a stream of another device is refused with
// wrong_device and nothing changes.
//  - One GPU or more: a hierarchy created on the main thread is driven from a std::thread, and
//    every result equals the host backend's.
//  - Two GPUs or more (skipped otherwise): a hierarchy, a speculative hierarchy, a device batch, a
//    residency manager and a draft ring store are created on device 1 and every public operation
//    is called while device 0 is current: exact results against the host backend, the thread's
//    device unchanged after each call, and streams of device 0 refused with the state unchanged.
// Test-side CUDA calls on device-1 memory run with device 1 current (`use_device`), so only the
// library's calls run while device 0 is current.
#include <array>
#include <exception>
#include <stdexcept>
#include <thread>
#include <utility>

#include "cuda_test_support.cuh"

#include "dhisparse/cuda/batch.cuh"
#include "dhisparse/cuda/draft_ring_store.cuh"
#include "dhisparse/cuda/residency_manager.cuh"
#include "dhisparse/host/draft_ring_store.hpp"
#include "dhisparse/host/residency_manager.hpp"
#include "dhisparse/policies/draft_ring.hpp"

namespace {

using namespace dhtest;
using Layout = dh::layouts::tiny;
using Hot = dh::lru_hot_cache<16>;
using Device = dhc::hierarchy<Layout, Hot>;
using Host = dh::host_hierarchy<Layout, Hot>;
constexpr std::size_t K = Layout::top_k;
constexpr std::size_t S = dh::source_count<Layout>;

/// The calling thread's current device, -1 when the runtime cannot tell (no Catch2 assertion: a
/// worker thread may call it).
int current_device() {
  int d = -1;
  return cudaGetDevice(&d) == cudaSuccess ? d : -1;
}

/// Throws (no Catch2 assertion: worker threads use it) when a test-side CUDA call fails.
void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

/// Makes `device` current for a test-side CUDA call and restores the thread's device after it.
class use_device {
 public:
  explicit use_device(int device) {
    check(cudaGetDevice(&previous_), "cudaGetDevice");
    check(cudaSetDevice(device), "cudaSetDevice");
  }
  use_device(const use_device&) = delete;
  use_device& operator=(const use_device&) = delete;
  ~use_device() { (void)cudaSetDevice(previous_); }

 private:
  int previous_ = 0;
};

/// Waits for `stream` of `device` with that device current.
void finish(int device, cudaStream_t stream) {
  const use_device on(device);
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}

dh::hierarchy_config config(std::size_t max_block = 1) {
  dh::hierarchy_config c;
  c.max_requests = 4;
  c.max_rows = 128;
  c.optional_pages = 8;
  c.max_block = max_block;
  return c;
}

/// A valid selection of a history of `frontier` rows (frontier >= 1): `length` entries spread over
/// the history, varying with `round`, with a duplicate and a -1 pad at the end.
std::vector<row_index> selection(std::int64_t frontier, std::size_t round, std::size_t length = K) {
  std::vector<row_index> sel(length);
  for (std::size_t i = 0; i < length; ++i)
    sel[i] = static_cast<row_index>(static_cast<std::int64_t>(i * 5 + round * 11) % frontier);
  if (length > 2) {
    sel[length - 2] = sel[0];
    sel[length - 1] = dh::no_row;
  }
  return sel;
}

using request_selection = std::pair<request_id, std::vector<row_index>>;

/// Device buffers of eager batches (selections and locations of up to 4 entries), allocated on
/// the device current at construction.
struct resolve_buffers {
  dhc::device_buffer<row_index> sel{4 * K};
  dhc::device_buffer<location> loc{4 * K};
};

/// Eager resolve of `batch` on `dev` (span overload on `stream`), then `check_errors(stream)`;
/// returns the locations of every entry. The selection upload and the location download are the
/// test's own CUDA calls and run on the hierarchy's device; the library's run on the caller's.
std::vector<std::vector<location>> device_resolve(Device& dev, resolve_buffers& b, std::size_t source,
                                                  const std::vector<request_selection>& batch, cudaStream_t stream) {
  std::vector<row_index> staged(batch.size() * K, dh::no_row);
  std::vector<Device::batch_item> items(batch.size());
  for (std::size_t e = 0; e < batch.size(); ++e) {
    std::copy(batch[e].second.begin(), batch[e].second.end(), staged.begin() + static_cast<long>(e * K));
    items[e] = {batch[e].first, b.sel.data() + e * K, static_cast<std::int32_t>(batch[e].second.size()),
                b.loc.data() + e * K};
  }
  {
    const use_device on(dev.device());
    check(cudaMemcpyAsync(b.sel.data(), staged.data(), staged.size() * sizeof(row_index), cudaMemcpyHostToDevice, stream),
          "upload selections");
  }
  dev.resolve(source, std::span<const Device::batch_item>(items), stream);
  dev.check_errors(stream);
  std::vector<location> got(batch.size() * K);
  {
    const use_device on(dev.device());
    check(cudaMemcpyAsync(got.data(), b.loc.data(), got.size() * sizeof(location), cudaMemcpyDeviceToHost, stream),
          "download locations");
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  }
  std::vector<std::vector<location>> out(batch.size());
  for (std::size_t e = 0; e < batch.size(); ++e)
    out[e].assign(got.begin() + static_cast<long>(e * K),
                  got.begin() + static_cast<long>(e * K + batch[e].second.size()));
  return out;
}

/// The host backend's resolve of the same batch.
std::vector<std::vector<location>> host_resolve(Host& host, std::size_t source, const std::vector<request_selection>& batch,
                                                dh::resolve_stats* total = nullptr) {
  std::vector<std::vector<location>> out(batch.size());
  std::vector<dh::resolve_item> items(batch.size());
  for (std::size_t e = 0; e < batch.size(); ++e) {
    out[e].assign(batch[e].second.size(), 0);
    items[e] = {batch[e].first, batch[e].second, out[e]};
  }
  const auto t = host.resolve(source, items);
  if (total != nullptr) *total = t;
  return out;
}

void require_same_plan(std::span<const dh::planned_copy> expect, const std::vector<dh::planned_copy>& got) {
  REQUIRE(got.size() == expect.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("plan entry " << i);
    REQUIRE((got[i].slot == expect[i].slot && got[i].row == expect[i].row && got[i].dst == expect[i].dst));
  }
}

/// Hot rows, LRU order, optional map and frontier of `ids` on every source, device against host.
void require_same_state(const Host& host, const Device& dev, std::initializer_list<request_id> ids) {
  for (request_id id : ids)
    for (std::size_t s = 0; s < S; ++s) {
      INFO("request " << id << " source " << s);
      const auto hr = host.hot_rows_of(id, s);
      const auto dr = dev.hot_rows_of(id, s);
      DHTEST_REQUIRE_SAME(row_index, "hot rows", hr, dr);
      const auto ho = host.lru_order_of(id, s);
      const auto dor = dev.lru_order_of(id, s);
      DHTEST_REQUIRE_SAME(Hot::order_index, "LRU order", ho, dor);
      const auto hm = host.optional_map_of(id, s);
      const auto dm = dev.optional_map_of(id, s);
      DHTEST_REQUIRE_SAME(std::int32_t, "optional map", hm, dm);
      REQUIRE(dev.device_frontier(id, s) == host.frontier(id, s));
      REQUIRE(dev.frontier(id, s) == host.frontier(id, s));
      REQUIRE(dev.positions(id, s) == host.positions(id, s));
    }
}

}  // namespace

TEST_CASE("a hierarchy driven from another thread matches the host backend", "[gpu][affinity]") {
  require_device();
  const int home = current_device();
  REQUIRE(home >= 0);
  const auto cfg = config();
  Host host(cfg);
  Device dev(cfg);
  REQUIRE(dev.device() == home);
  cudaStream_t stream = nullptr;
  DHTEST_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  resolve_buffers buf;
  REQUIRE(buf.sel.device() == home);
  REQUIRE(buf.loc.device() == home);

  const std::array<request_id, 2> ids{11, 12};
  const std::array<std::size_t, S> rows{40, 25};
  constexpr std::size_t rounds = 3;

  // The host reference of the whole sequence.
  std::vector<dh::admission> expect_admitted;
  std::vector<std::vector<std::vector<location>>> expect;  // [source * rounds + round][entry]
  std::vector<dh::resolve_stats> expect_total;
  std::vector<std::vector<dh::planned_copy>> expect_plan;
  for (request_id id : ids) {
    expect_admitted.push_back(host.admit(id));
    for (std::size_t s = 0; s < S; ++s) host.append(id, s, make_rows<Layout>(id, s, 0, rows[s]), rows[s]);
  }
  const auto batch_of = [&](std::size_t s, std::size_t round) {
    std::vector<request_selection> b;
    for (request_id id : ids) b.push_back({id, selection(static_cast<std::int64_t>(rows[s]), round + id)});
    return b;
  };
  for (std::size_t s = 0; s < S; ++s)
    for (std::size_t r = 0; r < rounds; ++r) {
      dh::resolve_stats total;
      expect.push_back(host_resolve(host, s, batch_of(s, r), &total));
      expect_total.push_back(total);
      const auto p = host.last_plan(s);
      expect_plan.emplace_back(p.begin(), p.end());
    }

  // The same calls from a worker thread; its results are checked here, after the join (Catch2
  // assertions are made on this thread only).
  struct {
    std::vector<dh::admission> admitted;
    std::vector<std::vector<std::vector<location>>> locations;
    std::vector<dh::resolve_stats> totals;
    std::vector<std::vector<dh::planned_copy>> plans;
    std::vector<std::pair<std::string, int>> devices;  // the worker's current device after each call
    int device_before = -1;
    std::exception_ptr error;
  } got;
  std::thread worker([&] {
    try {
      got.device_before = current_device();
      const auto after = [&](const char* call) { got.devices.emplace_back(call, current_device()); };
      for (request_id id : ids) {
        got.admitted.push_back(dev.admit(id, stream));
        after("admit");
        for (std::size_t s = 0; s < S; ++s) {
          const auto r = make_rows<Layout>(id, s, 0, rows[s]);
          dev.append(id, s, std::span<const std::byte>(r), rows[s], stream);
          after("append");
        }
      }
      for (std::size_t s = 0; s < S; ++s)
        for (std::size_t r = 0; r < rounds; ++r) {
          got.locations.push_back(device_resolve(dev, buf, s, batch_of(s, r), stream));
          after("resolve and check_errors");
          dh::resolve_stats total;
          for (const auto& e : dev.last_stats(s)) total += e;
          after("last_stats");
          got.totals.push_back(total);
          got.plans.push_back(dev.last_plan(s));
          after("last_plan");
        }
    } catch (...) {
      got.error = std::current_exception();
    }
  });
  worker.join();
  if (got.error) REQUIRE_NOTHROW(std::rethrow_exception(got.error));

  REQUIRE(current_device() == home);
  for (const auto& [call, device] : got.devices) {
    INFO("the worker's current device after " << call);
    REQUIRE(device == got.device_before);
  }
  REQUIRE(got.admitted.size() == expect_admitted.size());
  for (std::size_t i = 0; i < got.admitted.size(); ++i) {
    REQUIRE(got.admitted[i].admitted == expect_admitted[i].admitted);
    REQUIRE(got.admitted[i].slot == expect_admitted[i].slot);
  }
  REQUIRE(got.locations.size() == expect.size());
  for (std::size_t c = 0; c < expect.size(); ++c) {
    INFO("source " << c / rounds << " round " << c % rounds);
    REQUIRE(got.locations[c].size() == expect[c].size());
    for (std::size_t e = 0; e < expect[c].size(); ++e)
      DHTEST_REQUIRE_SAME(location, "locations", expect[c][e], got.locations[c][e]);
    REQUIRE(got.totals[c] == expect_total[c]);
    require_same_plan(expect_plan[c], got.plans[c]);
  }
  require_same_state(host, dev, {11, 12});
  DHTEST_CUDA(cudaStreamSynchronize(stream));
  DHTEST_CUDA(cudaStreamDestroy(stream));
}

TEST_CASE("objects of device 1 work while device 0 is current and refuse streams of device 0", "[gpu][affinity]") {
  if (device_count() < 2) DHTEST_SKIP("device affinity across GPUs needs two GPUs; this machine has fewer");
  DHTEST_CUDA(cudaSetDevice(0));
  cudaStream_t s0 = nullptr;  // a stream of device 0: refused by every object of device 1
  DHTEST_CUDA(cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking));
  DHTEST_CUDA(cudaSetDevice(1));
  cudaStream_t s1 = nullptr;  // blocking: ordered with device 1's legacy stream (the null stream below)
  DHTEST_CUDA(cudaStreamCreate(&s1));
  const auto still_on_0 = [](const char* call) {
    INFO("the thread's current device after " << call);
    REQUIRE(current_device() == 0);
  };

  SECTION("hierarchy") {
    const auto cfg = config();
    Host host(cfg);
    Device dev(cfg, s1);
    resolve_buffers buf;
    dhc::device_batch batch(4, K);
    dhc::pinned_buffer stats_bytes(cfg.max_requests * sizeof(dhc::entry_stats));
    dhc::pinned_buffer record_bytes(sizeof(dhc::error_record));
    const std::span<dhc::entry_stats> stats{reinterpret_cast<dhc::entry_stats*>(stats_bytes.data()), cfg.max_requests};
    auto* record = reinterpret_cast<dhc::error_record*>(record_bytes.data());
    REQUIRE(dev.device() == 1);
    REQUIRE(batch.device() == 1);
    REQUIRE(buf.loc.device() == 1);
#if CUDART_VERSION >= 12080
    // A hierarchy refuses a stream of another device at construction, before allocating.
    REQUIRE_THROWS_AS(Device(cfg, s0), dh::wrong_device);
#endif
    DHTEST_CUDA(cudaSetDevice(0));

    // Admission: the constructor's stream, a given one, and the null stream (device 1's).
    REQUIRE(dev.admit(1).slot == host.admit(1).slot);
    still_on_0("admit");
    REQUIRE(dev.admit(2, s1).slot == host.admit(2).slot);
    still_on_0("admit(stream)");
    REQUIRE(dev.admit(3, nullptr).slot == host.admit(3).slot);
    still_on_0("admit(null stream)");

    // History: host rows on the constructor's stream and on s1, pinned rows read by the kernel.
    const std::array<std::size_t, S> rows{48, 30};
    dhc::pinned_buffer pinned(rows[0] * Layout::sources[0].payload_layers * Layout::sources[0].row_bytes);
    for (std::size_t s = 0; s < S; ++s) {
      for (request_id id : {1u, 2u, 3u}) host.append(id, s, make_rows<Layout>(id, s, 0, rows[s]), rows[s]);
      dev.append(1, s, make_rows<Layout>(1, s, 0, rows[s]), rows[s]);
      still_on_0("append");
      dev.append(2, s, make_rows<Layout>(2, s, 0, rows[s]), rows[s], s1);
      still_on_0("append(stream)");
      const auto r3 = make_rows<Layout>(3, s, 0, rows[s]);
      std::memcpy(pinned.data(), r3.data(), r3.size());
      dev.append(3, s, pinned.data(), rows[s], s1);
      still_on_0("append(device-accessible rows)");
      finish(1, s1);  // the pinned rows are read before they are overwritten
    }
    require_same_state(host, dev, {1, 2, 3});
    still_on_0("the readbacks");

    // Eager resolves, their stats, errors and plan.
    for (std::size_t s = 0; s < S; ++s)
      for (std::size_t round = 0; round < 3; ++round) {
        INFO("source " << s << " round " << round);
        std::vector<request_selection> b;
        for (request_id id : {1u, 2u, 3u}) b.push_back({id, selection(static_cast<std::int64_t>(rows[s]), round * 3 + id)});
        dh::resolve_stats expect_total;
        const auto expect = host_resolve(host, s, b, &expect_total);
        const auto got = device_resolve(dev, buf, s, b, s1);
        still_on_0("resolve and check_errors");
        for (std::size_t e = 0; e < b.size(); ++e) DHTEST_REQUIRE_SAME(location, "locations", expect[e], got[e]);
        dh::resolve_stats total;
        for (const auto& st : dev.last_stats(s)) total += st;
        still_on_0("last_stats");
        REQUIRE(total == expect_total);
        require_same_plan(host.last_plan(s), dev.last_plan(s));
        still_on_0("last_plan");
        for (const auto& err : dev.last_errors(s)) REQUIRE(err.code == dhc::status_ok);
        still_on_0("last_errors");
      }

    // resolve_sync, and the asynchronous stats and errors of the same launch.
    {
      std::vector<request_selection> b{{1, selection(static_cast<std::int64_t>(rows[0]), 40)},
                                       {2, selection(static_cast<std::int64_t>(rows[0]), 41)}};
      dh::resolve_stats expect_total;
      const auto expect = host_resolve(host, 0, b, &expect_total);
      std::vector<row_index> staged(b.size() * K, dh::no_row);
      std::vector<Device::batch_item> items(b.size());
      for (std::size_t e = 0; e < b.size(); ++e) {
        std::copy(b[e].second.begin(), b[e].second.end(), staged.begin() + static_cast<long>(e * K));
        items[e] = {b[e].first, buf.sel.data() + e * K, static_cast<std::int32_t>(K), buf.loc.data() + e * K};
      }
      {
        const use_device on(1);
        DHTEST_CUDA(cudaMemcpyAsync(buf.sel.data(), staged.data(), staged.size() * sizeof(row_index),
                                    cudaMemcpyHostToDevice, s1));
      }
      REQUIRE(dev.resolve_sync(0, std::span<const Device::batch_item>(items), s1) == expect_total);
      still_on_0("resolve_sync");
      dev.copy_stats_async(0, stats, s1);
      still_on_0("copy_stats_async");
      dev.copy_errors_async(0, record, s1);
      still_on_0("copy_errors_async");
      finish(1, s1);
      dh::resolve_stats total;
      for (const auto& e : stats) total += Device::to_resolve_stats(0, e);
      REQUIRE(total == expect_total);
      REQUIRE(record->ok());
      dev.throw_if_error(*record);
      std::vector<location> got(b.size() * K);
      {
        const use_device on(1);
        DHTEST_CUDA(cudaMemcpy(got.data(), buf.loc.data(), got.size() * sizeof(location), cudaMemcpyDeviceToHost));
      }
      for (std::size_t e = 0; e < b.size(); ++e)
        DHTEST_REQUIRE_SAME(location, "resolve_sync locations", expect[e],
                            std::span<const location>(got.data() + e * K, K));
    }

    // The capturable raw path over a device batch of device 1, uploaded while device 0 is current.
    {
      std::vector<request_selection> b{{3, selection(static_cast<std::int64_t>(rows[1]), 50)},
                                       {1, selection(static_cast<std::int64_t>(rows[1]), 51)}};
      const auto expect = host_resolve(host, 1, b);
      std::vector<std::int32_t> slots;
      std::vector<row_index> sel;
      for (const auto& [id, s] : b) {
        slots.push_back(static_cast<std::int32_t>(dev.slot_of(id)));
        sel.insert(sel.end(), s.begin(), s.end());
      }
      batch.upload(slots, sel, {}, s1);
      still_on_0("device_batch::upload");
      dev.resolve(1, batch.view(), s1);
      still_on_0("resolve(batch_view)");
      const auto got = batch.download_locations(static_cast<std::uint32_t>(b.size()), s1);
      still_on_0("device_batch::download_locations");
      for (std::size_t e = 0; e < b.size(); ++e)
        DHTEST_REQUIRE_SAME(location, "batch_view locations", expect[e], std::span<const location>(got.data() + e * K, K));
      dev.check_errors(s1);
    }

    // Optional history.
    REQUIRE(dev.map_optional_page(1, 0, 1, s1) == host.map_optional_page(1, 0, 1));
    still_on_0("map_optional_page");
    REQUIRE(dev.map_optional_page(2, 1, 0) == host.map_optional_page(2, 1, 0));
    still_on_0("map_optional_page (constructor's stream)");
    {
      std::vector<request_selection> b{{1, selection(static_cast<std::int64_t>(rows[0]), 60)}};
      const auto expect = host_resolve(host, 0, b);
      const auto got = device_resolve(dev, buf, 0, b, s1);
      DHTEST_REQUIRE_SAME(location, "locations with an optional page", expect[0], got[0]);
    }
    require_same_state(host, dev, {1, 2, 3});
    dev.unmap_optional_page(1, 0, 1, s1);
    host.unmap_optional_page(1, 0, 1);
    still_on_0("unmap_optional_page");
    REQUIRE(dev.free_optional_pages(0) == host.free_optional_pages(0));

    // Pool bytes and host rows.
    for (std::size_t s = 0; s < S; ++s)
      for (std::size_t l = 0; l < Layout::sources[s].payload_layers; ++l) {
        INFO("source " << s << " layer " << l);
        const std::size_t rb = Layout::sources[s].row_bytes;
        std::vector<std::byte> pool(dev.pool_rows() * rb);
        dev.copy_pool(s, l, pool);
        still_on_0("copy_pool");
        const auto& sp = dev.space(s);
        for (std::size_t r = 0; r < dev.pool_rows(); ++r) {
          if (!sp.valid(static_cast<location>(r))) continue;
          const auto want = host.payload(s, l, static_cast<location>(r));
          if (std::memcmp(want.data(), pool.data() + r * rb, rb) != 0) DHTEST_FAIL("pool differs at location " << r);
        }
        const location newest = dev.space().tail(dev.slot_of(1), static_cast<std::int64_t>(rows[s]) - 1);
        const auto one = dev.payload_row(s, l, newest);
        still_on_0("payload_row");
        const auto want = host.payload(s, l, newest);
        REQUIRE(std::equal(one.begin(), one.end(), want.begin(), want.end()));
        const auto hr = dev.host_row(2, s, l, 7);
        still_on_0("host_row");
        const auto hw = host.host_row(2, s, l, 7);
        REQUIRE(std::equal(hr.begin(), hr.end(), hw.begin(), hw.end()));
      }

    // Reservations, books, backups.
    dev.reserve_rows(1, 0, 16, s1);
    host.reserve_rows(1, 0, 16);
    still_on_0("reserve_rows");
    dev.reserve_ahead(8, s1);
    host.reserve_ahead(8);
    still_on_0("reserve_ahead");
    for (request_id id : {1u, 2u, 3u})
      for (std::size_t s = 0; s < S; ++s) REQUIRE(dev.reserved_rows(id, s) == host.reserved_rows(id, s));
    dev.sync_books(s1);
    still_on_0("sync_books");
    dev.join_backup(s1);
    still_on_0("join_backup");
    REQUIRE_FALSE(dev.backup_pending());

    // Shared prefixes.
    REQUIRE(dev.retain_prefix(dh::prefix_id{77}, 2) == host.retain_prefix(dh::prefix_id{77}, 2));
    still_on_0("retain_prefix");
    REQUIRE(dev.admit(4, dh::prefix_id{77}, s1).slot == host.admit(4, dh::prefix_id{77}).slot);
    still_on_0("admit on a prefix");
    {
      std::vector<request_selection> b{{4, selection(static_cast<std::int64_t>(rows[0]), 70)}};
      const auto expect = host_resolve(host, 0, b);
      const auto got = device_resolve(dev, buf, 0, b, s1);
      DHTEST_REQUIRE_SAME(location, "locations of a request admitted on a prefix", expect[0], got[0]);
    }
    require_same_state(host, dev, {1, 2, 3, 4});
    dev.release_prefix(dh::prefix_id{77});
    host.release_prefix(dh::prefix_id{77});

#if CUDART_VERSION >= 12080
    // Streams of device 0: wrong_device, nothing changed, the thread's device unchanged.
    {
      const auto r = make_rows<Layout>(1, 0, rows[0], 1);
      const std::int64_t f = dev.frontier(1, 0);
      REQUIRE_THROWS_AS(dev.admit(9, s0), dh::wrong_device);
      still_on_0("a refused admit");
      REQUIRE_FALSE(dev.contains(9));
      REQUIRE_THROWS_AS(dev.append(1, 0, std::span<const std::byte>(r), 1, s0), dh::wrong_device);
      REQUIRE(dev.frontier(1, 0) == f);
      const auto hot = dev.hot_rows_of(1, 0);
      std::vector<Device::batch_item> items{{1, buf.sel.data(), static_cast<std::int32_t>(K), buf.loc.data()}};
      REQUIRE_THROWS_AS(dev.resolve(0, std::span<const Device::batch_item>(items), s0), dh::wrong_device);
      REQUIRE_THROWS_AS(dev.resolve(0, batch.view(), s0), dh::wrong_device);
      REQUIRE(dev.hot_rows_of(1, 0) == hot);
      REQUIRE_THROWS_AS(dev.check_errors(s0), dh::wrong_device);
      REQUIRE_THROWS_AS(dev.copy_stats_async(0, stats, s0), dh::wrong_device);
      REQUIRE_THROWS_AS(dev.copy_follower(0, 1, s0), dh::wrong_device);
      REQUIRE_THROWS_AS(dev.map_optional_page(1, 0, 2, s0), dh::wrong_device);
      REQUIRE(dev.free_optional_pages(0) == host.free_optional_pages(0));
      REQUIRE_THROWS_AS(dev.reserve_ahead(64, s0), dh::wrong_device);
      REQUIRE(dev.reserved_rows(1, 0) == host.reserved_rows(1, 0));
      REQUIRE_THROWS_AS(dev.sync_books(s0), dh::wrong_device);
      REQUIRE_THROWS_AS(dev.join_backup(s0), dh::wrong_device);
      REQUIRE_THROWS_AS(dev.complete(1, s0), dh::wrong_device);
      REQUIRE(dev.contains(1));
      REQUIRE_THROWS_AS(batch.upload(std::vector<std::int32_t>{0}, std::vector<row_index>(K, 0), {}, s0),
                        dh::wrong_device);
      REQUIRE_THROWS_AS((void)batch.download_locations(1, s0), dh::wrong_device);
      still_on_0("the refused calls");
      require_same_state(host, dev, {1, 2, 3, 4});
      // The hierarchy goes on exactly as the host backend after the refusals.
      std::vector<request_selection> b{{1, selection(static_cast<std::int64_t>(rows[0]), 80)}};
      const auto expect = host_resolve(host, 0, b);
      const auto got = device_resolve(dev, buf, 0, b, s1);
      DHTEST_REQUIRE_SAME(location, "locations after the refused calls", expect[0], got[0]);
    }
#else
    WARN("CUDA runtime older than 12.8: streams are not checked against the object's device");
#endif

    // Device memory of device 0 handed to an object of device 1. Where device 1 cannot reach
    // device 0's memory: wrong_device before anything is launched (the kernel would fault on it),
    // nothing changed. Where it can: the rows are read through peer access, which the engine
    // enables (docs/integration.md), and the append is exact.
    {
      const auto r = make_rows<Layout>(1, 0, dev.frontier(1, 0), 1);
      dhc::device_buffer<std::byte> rows0(r.size());  // device 0 is current
      REQUIRE(rows0.device() == 0);
      DHTEST_CUDA(cudaMemcpy(rows0.data(), r.data(), r.size(), cudaMemcpyHostToDevice));
      int peer = 0;
      DHTEST_CUDA(cudaDeviceCanAccessPeer(&peer, 1, 0));
      if (peer == 0) {
        const std::int64_t f = dev.frontier(1, 0);
        REQUIRE_THROWS_AS(dev.append(1, 0, rows0.data(), 1, s1), dh::wrong_device);
        REQUIRE(dev.frontier(1, 0) == f);
        dhc::device_buffer<dhc::entry_stats> stats0(cfg.max_requests);
        REQUIRE_THROWS_AS(dev.copy_stats_async(0, std::span<dhc::entry_stats>(stats0.data(), cfg.max_requests), s1),
                          dh::wrong_device);
      } else {
        {
          const use_device on(1);
          const cudaError_t e = cudaDeviceEnablePeerAccess(0, 0);
          if (e == cudaErrorPeerAccessAlreadyEnabled) (void)cudaGetLastError();
          else DHTEST_CUDA(e);
        }
        dev.append(1, 0, rows0.data(), 1, s1);
        host.append(1, 0, r, 1);
        DHTEST_CUDA(cudaStreamSynchronize(s1));
        const use_device on(1);
        DHTEST_CUDA(cudaDeviceDisablePeerAccess(0));
      }
      still_on_0("calls given memory of device 0");
      require_same_state(host, dev, {1, 2, 3, 4});
    }

    for (request_id id : {1u, 2u, 3u, 4u}) {
      dev.complete(id, s1);
      host.complete(id);
      still_on_0("complete");
    }
    REQUIRE(dev.admitted_count() == 0);
    for (std::size_t s = 0; s < S; ++s) REQUIRE(dev.free_host_pages(s) == host.free_host_pages(s));
    finish(1, s1);
    // `dev`, `batch` and the buffers are destroyed here with device 0 current: they free on device 1.
  }

  SECTION("speculative round") {
    const auto cfg = config(4);
    Host host(cfg);
    Device dev(cfg, s1);
    resolve_buffers buf;  // 4 * K selections and locations: two queries
    DHTEST_CUDA(cudaSetDevice(0));
    const std::size_t n0 = 36;
    REQUIRE(dev.admit(5, s1).slot == host.admit(5).slot);
    for (std::size_t s = 0; s < S; ++s) {
      host.append(5, s, make_rows<Layout>(5, s, 0, n0), n0);
      dev.append(5, s, make_rows<Layout>(5, s, 0, n0), n0, s1);
    }
    // Stage a block of 3 positions on source 0 (content of its own: tag 1000).
    const std::size_t count = 3;
    REQUIRE(dev.block_rows(5, 0, count) == count);
    const auto block = make_rows<Layout>(1005, 0, static_cast<std::int64_t>(n0), count);
    host.stage_block(5, 0, block, count);
    dev.stage_block(5, 0, std::span<const std::byte>(block), count, s1);
    still_on_0("stage_block");
    REQUIRE(dev.staged_rows(5, 0) == count);
    // Verify K_r = 2 queries: query j sees rows below n0 + j + 1.
    std::array<std::vector<row_index>, 2> q{selection(static_cast<std::int64_t>(n0 + 1), 3),
                                            selection(static_cast<std::int64_t>(n0 + 2), 4)};
    std::array<std::vector<location>, 2> hloc{std::vector<location>(K), std::vector<location>(K)};
    const std::array<std::span<const row_index>, 2> hq{q[0], q[1]};
    const std::array<std::span<location>, 2> hl{hloc[0], hloc[1]};
    const auto expect_total = host.verify(5, 0, hq, hl);
    {
      std::vector<row_index> staged(2 * K);
      std::copy(q[0].begin(), q[0].end(), staged.begin());
      std::copy(q[1].begin(), q[1].end(), staged.begin() + static_cast<long>(K));
      const use_device on(1);
      DHTEST_CUDA(cudaMemcpyAsync(buf.sel.data(), staged.data(), staged.size() * sizeof(row_index),
                                  cudaMemcpyHostToDevice, s1));
    }
    const std::array<dhc::verify_query, 2> dq{
        dhc::verify_query{buf.sel.data(), static_cast<std::int32_t>(K), buf.loc.data()},
        dhc::verify_query{buf.sel.data() + K, static_cast<std::int32_t>(K), buf.loc.data() + K}};
    const std::array<dhc::verify_batch_item, 1> items{dhc::verify_batch_item{5, dq}};
    const auto total = dev.verify_sync(0, items, s1);
    still_on_0("verify_sync");
    REQUIRE(total == expect_total);
    dh::verify_stats summed;
    for (const auto& st : dev.last_verify_stats(0)) summed += st;
    still_on_0("last_verify_stats");
    REQUIRE(summed == expect_total);
    require_same_plan(host.last_plan(0), dev.last_verify_plan(0));
    still_on_0("last_verify_plan");
    std::vector<location> got(2 * K);
    {
      const use_device on(1);
      DHTEST_CUDA(cudaMemcpy(got.data(), buf.loc.data(), got.size() * sizeof(location), cudaMemcpyDeviceToHost));
    }
    DHTEST_REQUIRE_SAME(location, "query 0", hloc[0], std::span<const location>(got.data(), K));
    DHTEST_REQUIRE_SAME(location, "query 1", hloc[1], std::span<const location>(got.data() + K, K));
    REQUIRE(dev.verified_queries(5, 0) == 2);
    still_on_0("verified_queries");
#if CUDART_VERSION >= 12080
    REQUIRE_THROWS_AS(dev.commit(5, 0, 1, s0), dh::wrong_device);
    REQUIRE(dev.positions(5, 0) == host.positions(5, 0));
    REQUIRE(dev.verified_queries(5, 0) == 2);
    REQUIRE_THROWS_AS(dev.verify(0, std::span<const dhc::verify_batch_item>(items), s0), dh::wrong_device);
    REQUIRE_THROWS_AS(dev.release_staging(0, s0), dh::wrong_device);
#endif
    dev.commit(5, 0, 1, s1);
    host.commit(5, 0, 1);
    still_on_0("commit");
    REQUIRE(dev.positions(5, 0) == host.positions(5, 0));
    REQUIRE(dev.frontier(5, 0) == host.frontier(5, 0));
    dev.release_staging(0, s1);
    host.release_staging(0);
    still_on_0("release_staging");
#if CUDART_VERSION >= 12080
    REQUIRE_THROWS_AS(dev.stage_block(5, 0, std::span<const std::byte>(block), count, s0), dh::wrong_device);
    REQUIRE(dev.staged_rows(5, 0) == 0);
#endif
    require_same_state(host, dev, {5});
    dev.complete(5, s1);
    host.complete(5);
    finish(1, s1);
  }

  SECTION("residency manager") {
    using Manager = dhc::residency_manager<Device, dh::adaptive_policy<>>;
    using HostManager = dh::residency_manager<Host, dh::adaptive_policy<>>;
    dh::hierarchy_config hc;
    hc.max_requests = 2;
    hc.max_rows = 64;
    hc.optional_pages = 16;
    const dh::residency_config rc{6, 0};
    HostManager hm(hc, rc);
    Manager m(hc, rc, s1);
    REQUIRE(m.device() == 1);
    REQUIRE(m.hierarchy().device() == 1);
#if CUDART_VERSION >= 12080
    REQUIRE_THROWS_AS(Manager(hc, rc, s0), dh::wrong_device);
#endif
    DHTEST_CUDA(cudaSetDevice(0));
    const std::size_t n = 40;
    std::array<std::vector<std::byte>, S> rows;
    std::array<dh::history_import, S> h{};
    for (std::size_t s = 0; s < S; ++s) {
      rows[s] = make_rows<Layout>(21, s, 0, n);
      h[s] = {rows[s], n};
    }
    const auto a = m.admit(21, std::span<const dh::history_import>(h));
    still_on_0("residency admit");
    REQUIRE(a.status == hm.admit(21, std::span<const dh::history_import>(h)).status);
    REQUIRE(a.status == dh::admit_status::admitted);
    m.poll();
    still_on_0("poll");
    for (std::size_t s = 0; s < S; ++s) {
      const auto r = make_rows<Layout>(21, s, static_cast<std::int64_t>(n), 1);
      m.append(21, s, r, 1);
      hm.append(21, s, r, 1);
      still_on_0("residency append");
    }
    REQUIRE(m.repopulate() == hm.repopulate());
    still_on_0("repopulate");
    (void)m.back_up(4);
    still_on_0("back_up");
    m.drain();
    still_on_0("drain");
    REQUIRE(m.audit().empty());
    for (std::size_t s = 0; s < S; ++s) {
      REQUIRE(m.ledger(s) == hm.ledger(s));
      REQUIRE(m.optional_pages_of(21, s) == hm.optional_pages_of(21, s));
      REQUIRE(m.hierarchy().frontier(21, s) == hm.hierarchy().frontier(21, s));
    }
#if CUDART_VERSION >= 12080
    {
      dhc::pinned_buffer one(Layout::sources[0].payload_layers * Layout::sources[0].row_bytes);
      REQUIRE_THROWS_AS(m.import_history(21, 0, one.data(), 1, s0), dh::wrong_device);
      REQUIRE(m.imported_rows(21, 0) == static_cast<std::int64_t>(n));
      REQUIRE_THROWS_AS(m.step().check_errors(s0), dh::wrong_device);
      still_on_0("the refused calls");
    }
#endif
    if (int peer = 0; cudaDeviceCanAccessPeer(&peer, 1, 0) == cudaSuccess && peer == 0) {
      // rows in device memory of device 0, which device 1 cannot reach: wrong_device, nothing imported
      dhc::device_buffer<std::byte> rows0(Layout::sources[0].payload_layers * Layout::sources[0].row_bytes);
      REQUIRE_THROWS_AS(m.import_history(21, 0, rows0.data(), 1, s1), dh::wrong_device);
      REQUIRE(m.imported_rows(21, 0) == static_cast<std::int64_t>(n));
      still_on_0("import_history given memory of device 0");
    }
    m.step().check_errors(s1);
    still_on_0("step().check_errors");
    m.complete(21);
    hm.complete(21);
    still_on_0("residency complete");
    m.drain();
    REQUIRE(m.audit().empty());
    for (std::size_t s = 0; s < S; ++s) REQUIRE(m.ledger(s) == hm.ledger(s));
    // `m` is destroyed here with device 0 current: it waits for and frees on device 1.
  }

  SECTION("draft ring store") {
    using Ring = dh::draft_ring<16, 4, 8>;
    const dh::draft_ring_config cfg{2, 64, 2};
    dh::draft_ring_store<Ring> host(cfg);
    dhc::draft_ring_store<Ring> ring(cfg, s1);
    REQUIRE(ring.device() == 1);
#if CUDART_VERSION >= 12080
    REQUIRE_THROWS_AS(dhc::draft_ring_store<Ring>(cfg, s0), dh::wrong_device);
#endif
    DHTEST_CUDA(cudaSetDevice(0));
    const std::size_t pb = cfg.row_bytes * cfg.layers;
    std::vector<std::byte> prompt(5 * pb), block(3 * pb);
    for (std::size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<std::byte>(i * 7 + 1);
    for (std::size_t i = 0; i < block.size(); ++i) block[i] = static_cast<std::byte>(i * 13 + 5);
    host.prefill(0, 5, prompt);
    REQUIRE(ring.prefill(0, 5, prompt.data(), 5, s1) == cudaSuccess);
    still_on_0("draft ring prefill");
    host.write(0, 5, block, 3);
    REQUIRE(ring.write(0, 5, block.data(), 3, s1) == cudaSuccess);
    still_on_0("draft ring write");
#if CUDART_VERSION >= 12080
    REQUIRE_THROWS_AS(ring.commit(0, 1, s0), dh::wrong_device);
    REQUIRE(ring.committed(0) == host.committed(0));
    REQUIRE_THROWS_AS(ring.check_errors(s0), dh::wrong_device);
#endif
    if (int peer = 0; cudaDeviceCanAccessPeer(&peer, 1, 0) == cudaSuccess && peer == 0) {
      // a destination in device memory of device 0, which device 1 cannot reach: wrong_device
      dhc::device_buffer<dh::draft_slot_state> books0(cfg.slots);
      REQUIRE_THROWS_AS(ring.copy_books_async(std::span<dh::draft_slot_state>(books0.data(), cfg.slots), s1),
                        dh::wrong_device);
    }
    host.commit(0, 1);
    ring.commit(0, 1, s1);
    still_on_0("draft ring commit");
    ring.check_errors(s1);
    still_on_0("draft ring check_errors");
    ring.sync_books(s1);
    still_on_0("draft ring sync_books");
    REQUIRE(ring.committed(0) == host.committed(0));
    REQUIRE(ring.written(0) == host.written(0));
    std::vector<std::byte> got(ring.allocated_bytes());
    {
      const use_device on(1);
      DHTEST_CUDA(cudaMemcpy(got.data(), ring.ref().base, got.size(), cudaMemcpyDeviceToHost));
    }
    REQUIRE(std::equal(got.begin(), got.end(), host.storage().begin(), host.storage().end()));
    finish(1, s1);
  }

  DHTEST_CUDA(cudaSetDevice(0));
  DHTEST_CUDA(cudaStreamDestroy(s0));
  DHTEST_CUDA(cudaSetDevice(1));
  DHTEST_CUDA(cudaStreamDestroy(s1));
  DHTEST_CUDA(cudaSetDevice(0));
}
