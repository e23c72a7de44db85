// Per-step results without device-wide synchronisation: copy_stats_async / copy_errors_async write
// a resolve's per-entry stats and its error state into caller memory in stream order (pinned or
// device), equal to the synchronous readbacks and to the host reference's stats; an error record
// taken asynchronously throws later the typed error check_errors would have thrown; both can be
// captured in a CUDA graph with the resolve; and no readback, synchronous or not, waits for work
// on an unrelated stream (a kernel that spins until the host opens it after the readbacks return).
#include "cuda_test_support.cuh"

namespace {

using namespace dhtest;
using Layout = dh::layouts::tiny;
using Hot = dh::lru_hot_cache<16>;
using HH = dh::host_hierarchy<Layout, Hot>;
using DH = dhc::hierarchy<Layout, Hot>;
constexpr std::size_t K = Layout::top_k;
constexpr std::size_t N = 6;

dh::hierarchy_config make_cfg() {
  dh::hierarchy_config c;
  c.max_requests = N;
  c.max_rows = 128;
  c.optional_pages = 4;
  return c;
}

bool zero_stats(const dhc::entry_stats& s) {
  return s.selected == 0 && s.direct == 0 && s.hot == 0 && s.host == 0 && s.rows_copied == 0 && s.layers_copied == 0;
}

/// A host reference and a CUDA hierarchy on a non-blocking stream, fed the same histories.
struct fixture {
  dh::hierarchy_config cfg = make_cfg();
  cudaStream_t stream = nullptr;
  HH host;
  std::optional<DH> dev;
  std::vector<request_id> ids{11, 12, 13, 14};
  std::mt19937_64 rng{77};
  dhc::device_buffer<row_index> dsel{N * K};
  dhc::device_buffer<location> dloc{N * K};
  // pinned mapped results, prefilled with garbage so that "written" is observable
  dhc::pinned_buffer stats_pinned{N * sizeof(dhc::entry_stats)};
  dhc::pinned_buffer record_pinned{sizeof(dhc::error_record)};
  dhc::device_buffer<dhc::entry_stats> stats_device{N};

  fixture() : host(cfg) {
    require_device();
    DHTEST_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    dev.emplace(cfg, stream);
    for (request_id id : ids) {
      REQUIRE(host.admit(id).admitted);
      REQUIRE(dev->admit(id, stream).admitted);
      for (std::size_t s = 0; s < DH::sources; ++s) {
        const std::size_t n = 40 + 13 * (id % 5);
        const auto rows = make_rows<Layout>(id, s, 0, n);
        host.append(id, s, rows, n);
        dev->append(id, s, std::span<const std::byte>(rows), n, stream);
      }
    }
    wait_or_die(stream, "fixture appends");
  }
  ~fixture() {
    dev.reset();
    cudaStreamDestroy(stream);
  }
  std::span<dhc::entry_stats> stats_out() {
    return {reinterpret_cast<dhc::entry_stats*>(stats_pinned.data()), N};
  }
  dhc::error_record& record() { return *reinterpret_cast<dhc::error_record*>(record_pinned.data()); }
  void poison() {
    std::memset(stats_pinned.data(), 0xCD, stats_pinned.bytes());
    std::memset(record_pinned.data(), 0xCD, record_pinned.bytes());
  }

  std::vector<row_index> selection(request_id id, std::size_t s) {
    const std::int64_t f = host.frontier(id, s);
    std::vector<row_index> sel(K);
    for (std::size_t i = 0; i < K; ++i) {
      const auto u = rng() % 10;
      sel[i] = u == 0 ? dh::no_row : u < 3 && i > 0 ? sel[rng() % i] : static_cast<row_index>(rng() % static_cast<std::uint64_t>(f));
    }
    return sel;
  }

  /// Host: each entry resolved alone in batch order (per-entry stats). Device: one eager launch
  /// on `stream`, nothing waited for. Returns the host's per-entry stats.
  std::vector<dh::resolve_stats> resolve_both(std::size_t s, const std::vector<request_id>& batch,
                                              const std::vector<std::vector<row_index>>& sels) {
    std::vector<dh::resolve_stats> expect;
    std::vector<row_index> staged(N * K, dh::no_row);
    std::vector<DH::batch_item> items;
    for (std::size_t e = 0; e < batch.size(); ++e) {
      std::vector<location> out(K);
      expect.push_back(host.resolve(batch[e], s, sels[e], out));
      std::copy(sels[e].begin(), sels[e].end(), staged.begin() + static_cast<long>(e * K));
      items.push_back({batch[e], dsel.data() + e * K, static_cast<std::int32_t>(K), dloc.data() + e * K});
    }
    DHTEST_CUDA(cudaMemcpyAsync(dsel.data(), staged.data(), staged.size() * sizeof(row_index), cudaMemcpyHostToDevice,
                                stream));
    dev->resolve(s, std::span<const DH::batch_item>(items), stream);
    return expect;
  }
};

}  // namespace

TEST_CASE("async stats equal the synchronous readback and the host reference", "[gpu][readback]") {
  fixture f;
  for (int round = 0; round < 8; ++round) {
    const std::size_t s = static_cast<std::size_t>(round) % DH::sources;
    std::vector<request_id> batch = f.ids;
    std::shuffle(batch.begin(), batch.end(), f.rng);
    batch.resize(1 + static_cast<std::size_t>(round) % f.ids.size());
    std::vector<std::vector<row_index>> sels;
    for (request_id id : batch) sels.push_back(f.selection(id, s));
    INFO("round " << round << " source " << s << " batch " << batch.size());

    f.poison();
    DHTEST_CUDA(cudaMemsetAsync(f.stats_device.data(), 0xCD, f.stats_device.bytes(), f.stream));
    const auto expect = f.resolve_both(s, batch, sels);
    f.dev->copy_stats_async(s, f.stats_out(), f.stream);
    f.dev->copy_stats_async(s, std::span<dhc::entry_stats>(f.stats_device.data(), N), f.stream);
    f.dev->copy_errors_async(s, &f.record(), f.stream);
    wait_or_die(f.stream, "async readbacks");

    const auto sync = f.dev->last_stats(s);  // synchronises the hierarchy's stream only
    REQUIRE(sync.size() == batch.size());
    std::vector<dhc::entry_stats> from_device(N);
    DHTEST_CUDA(cudaMemcpy(from_device.data(), f.stats_device.data(), f.stats_device.bytes(), cudaMemcpyDeviceToHost));
    dh::resolve_stats total, expect_total;
    for (std::size_t e = 0; e < N; ++e) {
      const dhc::entry_stats& got = f.stats_out()[e];
      INFO("entry " << e);
      REQUIRE(std::memcmp(&got, &from_device[e], sizeof(got)) == 0);  // pinned and device copies agree
      if (e < batch.size()) {
        const auto st = DH::to_resolve_stats(s, got);
        INFO("host " << stats_text(expect[e]) << " async " << stats_text(st) << " sync " << stats_text(sync[e]));
        REQUIRE(st == expect[e]);
        REQUIRE(st == sync[e]);
        expect_total += expect[e];
      } else {
        REQUIRE(zero_stats(got));  // past the launch's count: zero, so a sum is the launch total
      }
      total += DH::to_resolve_stats(s, got);
    }
    REQUIRE(total == expect_total);
    REQUIRE(f.record().ok());
    REQUIRE(f.record().source == s);
    REQUIRE(f.record().entry == -1);
    REQUIRE_NOTHROW(f.dev->throw_if_error(f.record()));
  }
}

TEST_CASE("async readbacks reject what a kernel cannot write", "[gpu][readback]") {
  fixture f;
  std::vector<dhc::entry_stats> too_many(N + 1);
  dhc::pinned_buffer big((N + 1) * sizeof(dhc::entry_stats));
  CHECK_THROWS_AS(f.dev->copy_stats_async(0, std::span<dhc::entry_stats>(
                                                 reinterpret_cast<dhc::entry_stats*>(big.data()), N + 1),
                                          f.stream),
                  dh::size_mismatch);
  CHECK_THROWS_AS(f.dev->copy_stats_async(DH::sources, f.stats_out(), f.stream), dh::invalid_source);
  CHECK_THROWS_AS(f.dev->copy_errors_async(0, nullptr, f.stream), dh::size_mismatch);
  CHECK_THROWS_AS(f.dev->copy_verify_stats_async(0, {}, f.stream), dh::invalid_configuration);  // max_block = 1
  dhc::error_record junk;
  std::memset(static_cast<void*>(&junk), 0xCD, sizeof(junk));  // not written by copy_errors_async
  CHECK_THROWS_AS(f.dev->throw_if_error(junk), dh::invalid_configuration);
  junk = dhc::error_record{};
  junk.entry = static_cast<std::int32_t>(N);  // past max_requests
  junk.error.code = dhc::to_status(dh::errc::position_out_of_range);
  CHECK_THROWS_AS(f.dev->throw_if_error(junk), dh::invalid_configuration);
  REQUIRE_NOTHROW(f.dev->throw_if_error(dhc::error_record{}));  // an empty record: nothing to report
  int device = 0, pageable = 0;
  DHTEST_CUDA(cudaGetDevice(&device));
  DHTEST_CUDA(cudaDeviceGetAttribute(&pageable, cudaDevAttrPageableMemoryAccess, device));
  if (!pageable) {
    std::vector<dhc::entry_stats> heap(N);
    dhc::error_record rec;
    CHECK_THROWS_AS(f.dev->copy_stats_async(0, heap, f.stream), dh::invalid_configuration);
    CHECK_THROWS_AS(f.dev->copy_errors_async(0, &rec, f.stream), dh::invalid_configuration);
  }
}

TEST_CASE("an error record taken asynchronously throws later what check_errors throws", "[gpu][readback]") {
  fixture f;
  const std::size_t s = 1;
  const auto bad_batch = [&] {
    std::vector<std::vector<row_index>> sels{f.selection(f.ids[0], s), f.selection(f.ids[1], s), f.selection(f.ids[2], s)};
    sels[1][5] = static_cast<row_index>(f.host.frontier(f.ids[1], s) + 3);  // beyond the frontier: a device-side error
    return sels;
  };
  // The host reference cannot run the bad entry: resolve only the device here.
  const auto launch_bad = [&] {
    const auto sels = bad_batch();
    std::vector<row_index> staged(N * K, dh::no_row);
    std::vector<DH::batch_item> items;
    for (std::size_t e = 0; e < sels.size(); ++e) {
      std::copy(sels[e].begin(), sels[e].end(), staged.begin() + static_cast<long>(e * K));
      items.push_back({f.ids[e], f.dsel.data() + e * K, static_cast<std::int32_t>(K), f.dloc.data() + e * K});
    }
    DHTEST_CUDA(cudaMemcpyAsync(f.dsel.data(), staged.data(), staged.size() * sizeof(row_index), cudaMemcpyHostToDevice,
                                f.stream));
    f.dev->resolve(s, std::span<const DH::batch_item>(items), f.stream);
  };

  f.poison();
  launch_bad();
  f.dev->copy_errors_async(s, &f.record(), f.stream);
  wait_or_die(f.stream, "bad resolve");
  const dhc::error_record rec = f.record();  // a copy: the check happens later, off the step path
  REQUIRE_FALSE(rec.ok());
  REQUIRE(rec.source == s);
  REQUIRE(rec.entry == 1);
  REQUIRE(rec.overflow == 0);
  REQUIRE(rec.error.code == dhc::to_status(dh::errc::position_beyond_frontier));
  REQUIRE(rec.error.index == 5);
  std::string async_what;
  try {
    f.dev->throw_if_error(rec);
    FAIL("throw_if_error did not throw");
  } catch (const dh::position_beyond_frontier& e) {
    async_what = e.what();
  }
  // Taking the record cleared it: check_errors has nothing left to report.
  REQUIRE_NOTHROW(f.dev->check_errors(f.stream));

  // The same failure checked synchronously throws the same error with the same message.
  launch_bad();
  std::string sync_what;
  try {
    f.dev->check_errors(f.stream);
    FAIL("check_errors did not throw");
  } catch (const dh::position_beyond_frontier& e) {
    sync_what = e.what();
  }
  REQUIRE(async_what == sync_what);
  INFO(async_what);
  REQUIRE(async_what.find("request " + std::to_string(f.ids[1])) != std::string::npos);

  // A batch count above the batch_view's capacity is reported as size_mismatch.
  dhc::device_batch small(2, K);
  const std::vector<std::int32_t> slots{static_cast<std::int32_t>(f.dev->slot_of(f.ids[0])),
                                        static_cast<std::int32_t>(f.dev->slot_of(f.ids[1]))};
  std::vector<row_index> sel(2 * K, 0);
  small.upload(slots, sel, {}, f.stream);
  const std::uint32_t five = 5;
  DHTEST_CUDA(cudaMemcpyAsync(small.count(), &five, sizeof(five), cudaMemcpyHostToDevice, f.stream));
  f.dev->resolve(0, small.view(), f.stream);
  f.dev->copy_errors_async(0, &f.record(), f.stream);
  wait_or_die(f.stream, "over-capacity resolve");
  REQUIRE(f.record().overflow == 5);
  REQUIRE_FALSE(f.record().ok());
  CHECK_THROWS_AS(f.dev->throw_if_error(f.record()), dh::size_mismatch);
  REQUIRE_NOTHROW(f.dev->check_errors(f.stream));
}

TEST_CASE("stats and errors captured with the resolve replay per step", "[gpu][readback][graph]") {
  fixture f;
  const std::size_t s = 0;
  dhc::device_batch batch(N, K);
  const std::span<dhc::entry_stats> out = f.stats_out();
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  DHTEST_CUDA(cudaStreamBeginCapture(f.stream, cudaStreamCaptureModeThreadLocal));
  f.dev->resolve(s, batch.view(), f.stream);
  f.dev->copy_stats_async(s, out, f.stream);
  f.dev->copy_errors_async(s, &f.record(), f.stream);
  DHTEST_CUDA(cudaStreamEndCapture(f.stream, &graph));
  DHTEST_CUDA(cudaGraphInstantiate(&exec, graph, 0));

  for (int step = 0; step < 12; ++step) {
    INFO("replay " << step);
    std::vector<request_id> pick = f.ids;
    std::shuffle(pick.begin(), pick.end(), f.rng);
    pick.resize(static_cast<std::size_t>(step) % (f.ids.size() + 1));  // 0 entries too
    std::vector<std::int32_t> slots;
    std::vector<row_index> sels(N * K, dh::no_row);
    std::vector<dh::resolve_stats> expect;
    const bool corrupt = step == 7 && pick.size() >= 2;
    for (std::size_t e = 0; e < pick.size(); ++e) {
      auto sel = f.selection(pick[e], s);
      slots.push_back(static_cast<std::int32_t>(f.dev->slot_of(pick[e])));
      if (corrupt && e == 1) sel[2] = static_cast<row_index>(f.host.frontier(pick[e], s) + 1);
      std::copy(sel.begin(), sel.end(), sels.begin() + static_cast<long>(e * K));
      if (!(corrupt && e == 1)) {
        std::vector<location> loc(K);
        expect.push_back(f.host.resolve(pick[e], s, sel, loc));
      } else {
        expect.push_back({});  // a bad entry changes nothing and reports zero stats
      }
    }
    batch.upload(slots, sels, {}, f.stream);
    f.poison();
    DHTEST_CUDA(cudaGraphLaunch(exec, f.stream));
    wait_or_die(f.stream, "replay");
    const auto sync = f.dev->last_stats(s);
    REQUIRE(sync.size() == pick.size());
    for (std::size_t e = 0; e < N; ++e) {
      INFO("entry " << e);
      if (e < pick.size()) {
        if (corrupt && e == 1) continue;
        REQUIRE(DH::to_resolve_stats(s, out[e]) == expect[e]);
        REQUIRE(DH::to_resolve_stats(s, out[e]) == sync[e]);
      } else {
        REQUIRE(zero_stats(out[e]));
      }
    }
    if (corrupt) {
      REQUIRE(f.record().entry == 1);
      CHECK_THROWS_AS(f.dev->throw_if_error(f.record()), dh::position_beyond_frontier);
    } else {
      REQUIRE(f.record().ok());
    }
  }
  REQUIRE_NOTHROW(f.dev->check_errors(f.stream));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

TEST_CASE("readbacks do not wait for work on an unrelated stream", "[gpu][readback]") {
  fixture f;
  const std::size_t s = 0;
  // Warm every path once (kernels loaded, staging ready) before anything is held.
  std::vector<std::vector<row_index>> sels{f.selection(f.ids[0], s), f.selection(f.ids[1], s)};
  f.resolve_both(s, {f.ids[0], f.ids[1]}, sels);
  f.dev->copy_stats_async(s, f.stats_out(), f.stream);
  f.dev->copy_errors_async(s, &f.record(), f.stream);
  wait_or_die(f.stream, "warm-up");
  std::vector<std::byte> pool(f.dev->pool_rows() * Layout::sources[s].row_bytes);

  // An unrelated stream is held by a kernel that spins until the host opens it (or ~10 s pass).
  cudaStream_t unrelated = nullptr;
  DHTEST_CUDA(cudaStreamCreateWithFlags(&unrelated, cudaStreamNonBlocking));
  gate g;
  g.close(unrelated);
  const auto start = std::chrono::steady_clock::now();

  sels = {f.selection(f.ids[2], s), f.selection(f.ids[3], s)};
  const auto expect = f.resolve_both(s, {f.ids[2], f.ids[3]}, sels);
  f.dev->copy_stats_async(s, f.stats_out(), f.stream);
  f.dev->copy_errors_async(s, &f.record(), f.stream);
  wait_or_die(f.stream, "async readbacks while another stream is held", 8.0);
  REQUIRE(g.closed());
  // The synchronous readbacks synchronise the hierarchy's stream only.
  const auto st = f.dev->last_stats(s);
  const auto er = f.dev->last_errors(s);
  const auto pl = f.dev->last_plan(s);
  f.dev->check_errors(f.stream);
  f.dev->check_errors();
  const auto hot = f.dev->hot_rows_of(f.ids[2], s);
  const auto order = f.dev->lru_order_of(f.ids[2], s);
  const auto map = f.dev->optional_map_of(f.ids[2], s);
  const auto front = f.dev->device_frontier(f.ids[2], s);
  f.dev->copy_pool(s, 0, pool);
  const auto row = f.dev->payload_row(s, 0, 0);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const bool still_held = g.closed();
  g.open();
  INFO("readbacks took " << seconds << " s");
  REQUIRE(still_held);  // nothing above waited for the spinning kernel
  REQUIRE(seconds < 8.0);

  REQUIRE(st.size() == 2);
  REQUIRE(st[0] == expect[0]);
  REQUIRE(st[1] == expect[1]);
  REQUIRE(DH::to_resolve_stats(s, f.stats_out()[0]) == expect[0]);
  REQUIRE(DH::to_resolve_stats(s, f.stats_out()[1]) == expect[1]);
  REQUIRE(f.record().ok());
  REQUIRE(er.size() == 2);
  REQUIRE(front == f.host.frontier(f.ids[2], s));
  const auto hot_host = f.host.hot_rows_of(f.ids[2], s);
  DHTEST_REQUIRE_SAME(row_index, "hot rows", std::vector<row_index>(hot_host.begin(), hot_host.end()), hot);
  (void)order;
  (void)map;
  (void)pl;
  (void)row;
  cudaStreamDestroy(unrelated);
}

TEST_CASE("async verify stats equal the synchronous readback and the host reference", "[gpu][readback][verify]") {
  require_device();
  dh::hierarchy_config cfg = make_cfg();
  cfg.max_block = 3;
  cudaStream_t stream = nullptr;
  DHTEST_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    HH host(cfg);
    DH dev(cfg, stream);
    const std::vector<request_id> ids{31, 32, 33};
    std::mt19937_64 rng(9);
    for (request_id id : ids) {
      REQUIRE(host.admit(id).admitted);
      REQUIRE(dev.admit(id, stream).admitted);
      for (std::size_t s = 0; s < DH::sources; ++s) {
        const std::size_t n = 50 + 7 * (id % 4);
        const auto rows = make_rows<Layout>(id, s, 0, n);
        host.append(id, s, rows, n);
        dev.append(id, s, std::span<const std::byte>(rows), n, stream);
      }
    }
    constexpr std::size_t KR = 2;  // queries per round: the anchor and one proposal
    dhc::device_buffer<row_index> dsel(ids.size() * KR * K);
    dhc::device_buffer<location> dloc(ids.size() * KR * K);
    dhc::pinned_buffer out_bytes(N * sizeof(dhc::verify_entry_stats));
    const std::span<dhc::verify_entry_stats> out(reinterpret_cast<dhc::verify_entry_stats*>(out_bytes.data()), N);
    for (std::size_t s = 0; s < DH::sources; ++s) {
      INFO("source " << s);
      // stage a block of 3 positions (3 rows: m = 1) for every request
      for (request_id id : ids) {
        const std::int64_t f = host.frontier(id, s);
        const auto block = make_rows<Layout>(id, s, f, 3);
        host.stage_block(id, s, block, 3);
        dev.stage_block(id, s, std::span<const std::byte>(block), 3, stream);
      }
      // K_r = 2 queries of committed rows each
      std::vector<std::vector<std::vector<row_index>>> q(ids.size(), std::vector<std::vector<row_index>>(KR));
      std::vector<row_index> staged(ids.size() * KR * K, dh::no_row);
      for (std::size_t e = 0; e < ids.size(); ++e)
        for (std::size_t j = 0; j < KR; ++j) {
          q[e][j].resize(K);
          for (std::size_t i = 0; i < K; ++i)
            q[e][j][i] = rng() % 9 == 0 ? dh::no_row
                                        : static_cast<row_index>(rng() % static_cast<std::uint64_t>(host.frontier(ids[e], s)));
          std::copy(q[e][j].begin(), q[e][j].end(), staged.begin() + static_cast<long>((e * KR + j) * K));
        }
      // host: one request at a time (per-entry stats)
      std::vector<dh::verify_stats> expect;
      for (std::size_t e = 0; e < ids.size(); ++e) {
        std::vector<std::vector<location>> locs(KR, std::vector<location>(K));
        std::vector<std::span<const row_index>> qs;
        std::vector<std::span<location>> ls;
        for (std::size_t j = 0; j < KR; ++j) {
          qs.push_back(q[e][j]);
          ls.push_back(locs[j]);
        }
        const dh::verify_item item{ids[e], qs, ls};
        expect.push_back(host.verify(s, std::span<const dh::verify_item>(&item, 1)));
      }
      // device: one batch
      DHTEST_CUDA(cudaMemcpyAsync(dsel.data(), staged.data(), staged.size() * sizeof(row_index), cudaMemcpyHostToDevice,
                                  stream));
      std::vector<std::vector<dhc::verify_query>> dq(ids.size());
      std::vector<dhc::verify_batch_item> items;
      for (std::size_t e = 0; e < ids.size(); ++e) {
        for (std::size_t j = 0; j < KR; ++j) {
          const std::size_t at = (e * KR + j) * K;
          dq[e].push_back({dsel.data() + at, static_cast<std::int32_t>(K), dloc.data() + at});
        }
        items.push_back({ids[e], dq[e]});
      }
      std::memset(out_bytes.data(), 0xCD, out_bytes.bytes());
      dev.verify(s, std::span<const dhc::verify_batch_item>(items), stream);
      dev.copy_verify_stats_async(s, out, stream);
      wait_or_die(stream, "verify");
      dev.check_errors(stream);
      const auto sync = dev.last_verify_stats(s);
      REQUIRE(sync.size() == ids.size());
      for (std::size_t e = 0; e < N; ++e) {
        INFO("entry " << e);
        if (e < ids.size()) {
          REQUIRE(DH::to_verify_stats(s, out[e]) == expect[e]);
          REQUIRE(DH::to_verify_stats(s, out[e]) == sync[e]);
        } else {
          const dhc::verify_entry_stats& z = out[e];
          REQUIRE((z.selected == 0 && z.direct == 0 && z.block == 0 && z.hot == 0 && z.host == 0 && z.staged == 0 &&
                   z.rows_copied == 0 && z.staging_rows == 0 && z.layers_copied == 0));
        }
      }
    }
  }
  cudaStreamDestroy(stream);
}
