// Exactness at scale (Invariant 2): every location the CUDA resolver returns holds the selected
// row's bytes, bit for bit, in every payload layer it materialised: well over 10^5 returned rows,
// most of them fresh misses recovered from the pinned host store, over full batches of 16
// requests, alternating `all` and `producer_only` + follower copies (of every launch shape), with
// optional pages mapped.
// Independent of the host backend: rows are checked against their generator.
#include "cuda_test_support.cuh"

namespace {

using namespace dhtest;

}  // namespace

TEST_CASE("every returned row is exact at scale", "[gpu][exactness]") {
  require_device();
  using Layout = layout_576;
  using Hot = dh::lru_hot_cache<512>;
  constexpr std::size_t K = Layout::top_k;
  constexpr std::size_t N = 16;
  constexpr std::size_t rows_per_request = 8000;
  dh::hierarchy_config cfg;
  cfg.max_requests = N;
  cfg.max_rows = 8192;
  cfg.optional_pages = 64;
  cudaStream_t stream = nullptr;
  DHTEST_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    dhc::hierarchy<Layout, Hot> h(cfg, stream);
    std::mt19937_64 rng(77);
    std::vector<request_id> ids;
    for (std::size_t r = 0; r < N; ++r) {
      const request_id id = 500 + r * 3;
      REQUIRE(h.admit(id).admitted);
      ids.push_back(id);
      for (std::size_t s = 0; s < h.sources; ++s) {
        // several appends, so pages of different requests interleave in the host store
        for (std::int64_t first = 0; first < static_cast<std::int64_t>(rows_per_request);) {
          const std::size_t n = std::min<std::size_t>(1000 + rng() % 700, rows_per_request - static_cast<std::size_t>(first));
          const auto rows = make_rows<Layout>(id, s, first, n);
          h.append(id, s, std::span<const std::byte>(rows), n, stream);
          first += static_cast<std::int64_t>(n);
        }
      }
      for (std::size_t g = 0; g < 3; ++g) REQUIRE(h.map_optional_page(id, rng() % 2, rng() % (rows_per_request / 64), stream));
    }
    DHTEST_CUDA(cudaStreamSynchronize(stream));

    dhc::device_buffer<row_index> dsel(N * K);
    dhc::device_buffer<location> dloc(N * K);
    std::size_t checked = 0, recovered = 0;
    std::vector<std::byte> pool, want;
    for (std::size_t step = 0; step < 48; ++step) {
      const std::size_t s = step % 2;
      const auto& d = Layout::sources[s];
      const bool producer_only = s == 0 && step % 4 == 0;
      INFO("step " << step << " source " << s << (producer_only ? " producer_only" : " all"));
      std::vector<row_index> sel(N * K);
      for (std::size_t r = 0; r < N; ++r) {
        const auto hot = h.hot_rows_of(ids[r], s);
        for (std::size_t i = 0; i < K; ++i) {
          const auto u = rng() % 100;
          row_index v;
          if (u < 3) v = dh::no_row;
          else if (u < 13) v = static_cast<row_index>(rows_per_request - 1 - rng() % 64);     // tail
          else if (u < 25 && hot[rng() % hot.size()] >= 0) v = hot[rng() % hot.size()];       // maybe hot
          else v = static_cast<row_index>(rng() % rows_per_request);                         // mostly misses
          if (v == dh::no_row && u >= 3) v = static_cast<row_index>(rng() % rows_per_request);
          sel[r * K + i] = v;
        }
      }
      DHTEST_CUDA(cudaMemcpyAsync(dsel.data(), sel.data(), sel.size() * sizeof(row_index), cudaMemcpyHostToDevice, stream));
      std::vector<dhc::batch_item> items(N);
      for (std::size_t r = 0; r < N; ++r)
        items[r] = {ids[r], dsel.data() + r * K, static_cast<std::int32_t>(K), dloc.data() + r * K};
      const auto mode = producer_only ? dh::copy_layers::producer_only : dh::copy_layers::all;
      h.resolve(s, items, stream, mode);
      wait_or_die(stream, "exactness step " + std::to_string(step));
      const dh::resolve_stats st = [&] {
        h.check_errors(stream);
        dh::resolve_stats total;
        for (const auto& x : h.last_stats(s)) total += x;
        return total;
      }();
      INFO("stats " << stats_text(st));
      REQUIRE(st.direct + st.hot + st.host == st.selected);
      recovered += st.rows_copied;
      if (producer_only) {
        // Every launch shape of the follower copy (warps per SM, rows per warp) copies the same rows.
        constexpr unsigned shapes[][2] = {{32, 2}, {1, 1}, {8, 1}, {16, 2}, {32, 1}, {5, 2}};
        const auto& shape = shapes[(step / 4) % std::size(shapes)];
        h.set_follower_copy_shape(shape[0], shape[1]);
        h.copy_follower(s, 1, stream);
        wait_or_die(stream, "exactness follower copy");
        h.check_errors(stream);
      }
      std::vector<location> loc(N * K);
      DHTEST_CUDA(cudaMemcpy(loc.data(), dloc.data(), loc.size() * sizeof(location), cudaMemcpyDeviceToHost));
      want.resize(d.row_bytes);
      for (std::size_t l = 0; l < d.payload_layers; ++l) {
        pool.resize(h.space().rows() * d.row_bytes);
        h.copy_pool(s, l, pool);
        for (std::size_t r = 0; r < N; ++r)
          for (std::size_t i = 0; i < K; ++i) {
            const row_index row = sel[r * K + i];
            const location at = loc[r * K + i];
            if (row == dh::no_row) {
              if (at != dh::no_location) DHTEST_FAIL("request " << ids[r] << " entry " << i << ": -1 resolved to " << at);
              continue;
            }
            if (at < 0 || static_cast<std::size_t>(at) >= h.space().rows())
              DHTEST_FAIL("request " << ids[r] << " entry " << i << " row " << row << ": location " << at << " outside the pool");
            fill_row(want.data(), d.row_bytes, ids[r], s, l, row);
            const std::byte* have = pool.data() + static_cast<std::size_t>(at) * d.row_bytes;
            if (std::memcmp(have, want.data(), d.row_bytes) != 0)
              DHTEST_FAIL("layer " << l << " request " << ids[r] << " (slot " << h.slot_of(ids[r]) << ") selection entry " << i
                            << " row " << row << " at location " << at << ": holds " << hex_prefix(have, d.row_bytes)
                            << "..., expected " << hex_prefix(want.data(), d.row_bytes) << "...");
            ++checked;
          }
      }
      // Fresh history keeps arriving: new rows enter the tail and the host store.
      if (step % 8 == 7)
        for (std::size_t r = 0; r < N; ++r) {
          const std::int64_t f = h.frontier(ids[r], s);
          if (f + 4 <= static_cast<std::int64_t>(cfg.max_rows)) {
            const auto rows = make_rows<Layout>(ids[r], s, f, 4);
            h.append(ids[r], s, std::span<const std::byte>(rows), 4, stream);
          }
        }
    }
    INFO(checked << " rows checked, " << recovered << " recovered from host");
    CHECK(checked >= 100000);
    CHECK(recovered >= 20000);
  }
  DHTEST_CUDA(cudaStreamDestroy(stream));
}
