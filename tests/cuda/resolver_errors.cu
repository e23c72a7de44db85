// Bad input: a bad batch entry gets a per-entry error code on the device, nothing is written for
// it (locations and cache state untouched), the other entries resolve exactly as the host backend
// resolves them alone, and check_errors() throws the typed error of the first bad entry.
// Host-detectable errors of the eager path throw before anything is queued.
#include "cuda_test_support.cuh"

namespace {

using namespace dhtest;
using Layout = dh::layouts::tiny;
using Hot = dh::lru_hot_cache<16>;
using T = twin<Layout, Hot>;
constexpr std::size_t K = Layout::top_k;
constexpr location sentinel = 0x7A7A7A7A;

struct raw_entry {
  std::int32_t slot;
  std::vector<row_index> selection;
  std::int32_t length;  // may differ from selection.size()
};

struct fixture {
  dh::hierarchy_config cfg;
  T tw;
  std::vector<request_id> ids;
  dhc::device_batch batch;

  fixture() : cfg(make_cfg()), tw(cfg, 5), batch(6, K + 4) {
    require_device();
    for (request_id id : {71u, 72u, 73u, 74u}) {
      REQUIRE(tw.admit(id));
      ids.push_back(id);
      for (std::size_t s = 0; s < T::sources; ++s) tw.append(id, s, 60 + 9 * (id % 4));
    }
    // warm the hot caches so untouched state is not trivially empty
    for (int round = 0; round < 3; ++round) {
      std::vector<T::request_selection> b;
      for (request_id id : ids) b.push_back({id, tw.make_selection(id, 0, K)});
      tw.resolve(0, b, dh::copy_layers::all, true, "warm-up");
    }
  }
  static dh::hierarchy_config make_cfg() {
    dh::hierarchy_config c;
    c.max_requests = 6;
    c.max_rows = 128;
    c.optional_pages = 4;
    return c;
  }

  /// Launches a raw batch on the device; resolves the entries listed in `good` on the host alone;
  /// checks good entries against the host, bad ones untouched; returns the device's per-entry status.
  std::vector<dhc::entry_error> run(std::size_t source, const std::vector<raw_entry>& entries,
                                    const std::vector<std::size_t>& good) {
    const std::uint32_t stride = batch.stride();
    std::vector<std::int32_t> slots, lengths;
    std::vector<row_index> sel(entries.size() * stride, dh::no_row);
    for (std::size_t e = 0; e < entries.size(); ++e) {
      slots.push_back(entries[e].slot);
      lengths.push_back(entries[e].length);
      std::copy(entries[e].selection.begin(), entries[e].selection.end(), sel.begin() + static_cast<long>(e * stride));
    }
    std::vector<location> fill(static_cast<std::size_t>(batch.capacity()) * stride, sentinel);
    DHTEST_CUDA(cudaMemcpy(batch.locations(), fill.data(), fill.size() * sizeof(location), cudaMemcpyHostToDevice));
    // state before
    std::vector<std::vector<row_index>> hot_before;
    std::vector<std::vector<Hot::order_index>> order_before;
    for (request_id id : ids) {
      hot_before.push_back(tw.dev.hot_rows_of(id, source));
      order_before.push_back(tw.dev.lru_order_of(id, source));
    }
    // host: good entries alone
    std::vector<std::vector<location>> expect(entries.size());
    std::vector<dh::resolve_item> items;
    for (std::size_t e : good) {
      const auto& en = entries[e];
      expect[e].assign(static_cast<std::size_t>(en.length), 0);
      const request_id id = ids[static_cast<std::size_t>(std::find(ids.begin(), ids.end(), id_of(en.slot)) - ids.begin())];
      items.push_back({id, std::span<const row_index>(en.selection.data(), static_cast<std::size_t>(en.length)), expect[e]});
    }
    tw.host.resolve(source, items);

    batch.upload(slots, sel, lengths, tw.dev.stream());
    tw.dev.resolve(source, batch.view(), tw.dev.stream());
    wait_or_die(tw.dev.stream(), "raw resolve of a mixed batch");
    const auto status = tw.dev.last_errors(source);
    REQUIRE(status.size() == entries.size());
    const auto got = batch.download_locations(static_cast<std::uint32_t>(entries.size()), tw.dev.stream());
    for (std::size_t e = 0; e < entries.size(); ++e) {
      const bool is_good = std::find(good.begin(), good.end(), e) != good.end();
      INFO("batch entry " << e << " slot " << entries[e].slot << (is_good ? " (good)" : " (bad)") << " status code "
                          << status[e].code << " index " << status[e].index << " value " << status[e].value);
      const std::span<const location> g(got.data() + e * stride, stride);
      if (is_good) {
        REQUIRE(status[e].code == dhc::status_ok);
        DHTEST_REQUIRE_SAME(location, "good entry locations", expect[e], g.first(expect[e].size()));
      } else {
        REQUIRE(status[e].code != dhc::status_ok);
        for (std::size_t i = 0; i < stride; ++i)
          if (g[i] != sentinel) DHTEST_FAIL("bad entry wrote location " << g[i] << " at selection entry " << i);
      }
    }
    // every request's state equals the host's (bad entries changed nothing on either side)
    tw.compare_state("after mixed batch");
    tw.compare_pools("after mixed batch");
    for (std::size_t r = 0; r < ids.size(); ++r) {
      bool touched = false;
      for (std::size_t e : good) touched = touched || id_of(entries[e].slot) == ids[r];
      if (!touched) {
        INFO("request " << ids[r] << " was only named by bad entries");
        DHTEST_REQUIRE_SAME(row_index, "hot rows", hot_before[r], tw.dev.hot_rows_of(ids[r], source));
        DHTEST_REQUIRE_SAME(Hot::order_index, "LRU order", order_before[r], tw.dev.lru_order_of(ids[r], source));
      }
    }
    return status;
  }
  request_id id_of(std::int32_t slot) const {
    for (request_id id : ids)
      if (static_cast<std::int32_t>(tw.host.slot_of(id)) == slot) return id;
    return 0;
  }
  std::int32_t slot(std::size_t r) const { return static_cast<std::int32_t>(tw.host.slot_of(ids[r])); }
  raw_entry good_entry(std::size_t r, std::size_t source = 0) {
    auto s = tw.make_selection(ids[r], source, K);
    return {slot(r), s, static_cast<std::int32_t>(K)};
  }
};

}  // namespace

TEST_CASE("bad entries are flagged, untouched, and the rest of the batch resolves", "[gpu][errors]") {
  fixture fx;
  auto& dev = fx.tw.dev;
  const cudaStream_t st = dev.stream();
  const std::int64_t f1 = fx.tw.host.frontier(fx.ids[1], 0), f3 = fx.tw.host.frontier(fx.ids[3], 0);

  SECTION("out of range and beyond the frontier") {
    auto b1 = fx.good_entry(1);
    b1.selection[5] = static_cast<row_index>(fx.cfg.max_rows + 3);
    b1.selection[9] = -7;
    auto b3 = fx.good_entry(3);
    b3.selection[2] = static_cast<row_index>(f3);  // does not exist yet
    const auto status = fx.run(0, {fx.good_entry(0), b1, fx.good_entry(2), b3}, {0, 2});
    CHECK(status[1].code == dhc::to_status(dh::errc::position_out_of_range));
    CHECK(status[1].index == 5);
    CHECK(status[1].value == static_cast<std::int64_t>(fx.cfg.max_rows + 3));
    CHECK(status[3].code == dhc::to_status(dh::errc::position_beyond_frontier));
    CHECK(status[3].index == 2);
    CHECK(status[3].frontier == f3);
    // the first bad entry of the launch decides the error type; the message names request and entry
    REQUIRE_THROWS_AS(dev.check_errors(st), dh::position_out_of_range);
    dev.check_errors(st);  // cleared
    (void)f1;
  }

  SECTION("message names the request, the batch entry and the selection entry") {
    auto b0 = fx.good_entry(0);
    b0.selection[4] = static_cast<row_index>(fx.tw.host.frontier(fx.ids[0], 0) + 1);
    fx.run(0, {b0, fx.good_entry(1)}, {1});
    std::string message;
    try {
      dev.check_errors(st);
    } catch (const dh::position_beyond_frontier& e) {
      message = e.what();
    }
    INFO("message: " << message);
    CHECK(message.find("selection entry 4 of request " + std::to_string(fx.ids[0])) != std::string::npos);
    CHECK(message.find("batch entry 0") != std::string::npos);
  }

  SECTION("selection longer than top_k, negative length, length above the stride") {
    auto too_long = fx.good_entry(0);
    too_long.selection.resize(K + 2, 0);
    too_long.length = static_cast<std::int32_t>(K + 1);
    auto negative = fx.good_entry(2);
    negative.length = -1;
    const auto status = fx.run(0, {too_long, fx.good_entry(1), negative}, {1});
    CHECK(status[0].code == dhc::to_status(dh::errc::selection_too_long));
    CHECK(status[2].code == dhc::to_status(dh::errc::size_mismatch));
    REQUIRE_THROWS_AS(dev.check_errors(st), dh::selection_too_long);
  }

  SECTION("unknown request slots") {
    auto far = fx.good_entry(0);
    far.slot = 99;
    auto free_slot = fx.good_entry(1);
    free_slot.slot = 5;  // within range, no request admitted there
    auto negative = fx.good_entry(2);
    negative.slot = -1;
    const auto status = fx.run(0, {fx.good_entry(3), far, free_slot, negative}, {0});
    for (std::size_t e = 1; e < 4; ++e) CHECK(status[e].code == dhc::to_status(dh::errc::unknown_request));
    REQUIRE_THROWS_AS(dev.check_errors(st), dh::unknown_request);
  }

  SECTION("the same request twice in one batch: both entries fail") {
    auto a = fx.good_entry(1), b = fx.good_entry(1);
    const auto status = fx.run(0, {fx.good_entry(0), a, fx.good_entry(2), b}, {0, 2});
    CHECK(status[1].code == dhc::to_status(dh::errc::duplicate_in_batch));
    CHECK(status[3].code == dhc::to_status(dh::errc::duplicate_in_batch));
    REQUIRE_THROWS_AS(dev.check_errors(st), dh::duplicate_in_batch);
  }

  SECTION("a later clean launch does not hide an earlier failure") {
    auto bad = fx.good_entry(2);
    bad.selection[0] = static_cast<row_index>(fx.tw.host.frontier(fx.ids[2], 0) + 5);
    fx.run(0, {bad}, {});
    fx.run(0, {fx.good_entry(0), fx.good_entry(1)}, {0, 1});
    REQUIRE_THROWS_AS(dev.check_errors(st), dh::position_beyond_frontier);
    dev.check_errors(st);
  }

  SECTION("a batch count above the view's capacity") {
    std::uint32_t big = fx.batch.capacity() + 3;
    DHTEST_CUDA(cudaMemcpy(fx.batch.count(), &big, sizeof big, cudaMemcpyHostToDevice));
    dev.resolve(0, fx.batch.view(), st);
    wait_or_die(st, "batch count above capacity");
    REQUIRE_THROWS_AS(dev.check_errors(st), dh::size_mismatch);
  }
}

TEST_CASE("eager resolve rejects host-detectable errors before launching", "[gpu][errors]") {
  fixture fx;
  auto& dev = fx.tw.dev;
  dhc::device_buffer<row_index> sel(2 * (K + 1));
  dhc::device_buffer<location> loc(2 * (K + 1));
  std::vector<row_index> zeros(2 * (K + 1), 0);
  DHTEST_CUDA(cudaMemcpy(sel.data(), zeros.data(), zeros.size() * sizeof(row_index), cudaMemcpyHostToDevice));
  const auto hot_before = dev.hot_rows_of(fx.ids[0], 0);
  const auto order_before = dev.lru_order_of(fx.ids[0], 0);

  std::vector<dhc::batch_item> unknown{{fx.ids[0], sel.data(), static_cast<std::int32_t>(K), loc.data()},
                                       {999, sel.data() + K, static_cast<std::int32_t>(K), loc.data() + K}};
  REQUIRE_THROWS_AS(dev.resolve(0, std::span<const dhc::batch_item>(unknown)), dh::unknown_request);
  std::vector<dhc::batch_item> twice{{fx.ids[0], sel.data(), static_cast<std::int32_t>(K), loc.data()},
                                     {fx.ids[0], sel.data() + K, static_cast<std::int32_t>(K), loc.data() + K}};
  REQUIRE_THROWS_AS(dev.resolve(0, std::span<const dhc::batch_item>(twice)), dh::duplicate_in_batch);
  std::vector<dhc::batch_item> too_long{{fx.ids[0], sel.data(), static_cast<std::int32_t>(K + 1), loc.data()}};
  REQUIRE_THROWS_AS(dev.resolve(0, std::span<const dhc::batch_item>(too_long)), dh::selection_too_long);
  REQUIRE_THROWS_AS(dev.resolve(7, std::span<const dhc::batch_item>(too_long)), dh::invalid_source);
  dev.check_errors(dev.stream());  // nothing was launched
  DHTEST_REQUIRE_SAME(row_index, "hot rows", hot_before, dev.hot_rows_of(fx.ids[0], 0));
  DHTEST_REQUIRE_SAME(Hot::order_index, "LRU order", order_before, dev.lru_order_of(fx.ids[0], 0));

  // pending follower copies, as on the host
  std::vector<dhc::batch_item> one{{fx.ids[0], sel.data(), static_cast<std::int32_t>(K), loc.data()}};
  dev.resolve(0, std::span<const dhc::batch_item>(one), dev.stream(), dh::copy_layers::producer_only);
  REQUIRE_THROWS_AS(dev.resolve(0, std::span<const dhc::batch_item>(one)), dh::pending_follower_copies);
  REQUIRE_THROWS_AS(dev.copy_follower(0, 0), dh::invalid_source);
  // A follower copy shape other than 1-16 or 32 warps per SM and 1-2 rows per warp is refused;
  // the pending copy then runs with the shape left as it was.
  REQUIRE_THROWS_AS(dev.set_follower_copy_shape(0, 1), dh::invalid_configuration);
  REQUIRE_THROWS_AS(dev.set_follower_copy_shape(17, 1), dh::invalid_configuration);
  REQUIRE_THROWS_AS(dev.set_follower_copy_shape(64, 1), dh::invalid_configuration);
  REQUIRE_THROWS_AS(dev.set_follower_copy_shape(8, 0), dh::invalid_configuration);
  REQUIRE_THROWS_AS(dev.set_follower_copy_shape(8, 3), dh::invalid_configuration);
  dev.copy_follower(0, 1);
  dev.resolve(0, std::span<const dhc::batch_item>(one));
  wait_or_die(dev.stream(), "eager resolves after a follower copy");
  dev.check_errors(dev.stream());
}
