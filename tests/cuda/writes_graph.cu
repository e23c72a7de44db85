// One CUDA graph per step: the batched write of every source (kv_write_view) followed by its
// resolve (batch_view), captured once and replayed for more than 1,000 steps. Between replays the
// test writes new rows, entry orders, padding and selections into the same device buffers, admits
// and completes requests, and reserves host pages every few steps outside the graph (reserve_ahead,
// which absorbs the device frontiers first). After every replay every resolved location of every
// payload layer must hold exactly the bytes the test generated for the selected row (so a row the
// step itself wrote must already be readable by the step's resolve), no entry may report an
// error, and at the end every host-store row and frontier must match the test's model.
#include "cuda_test_support.cuh"

#include <algorithm>
#include <map>
#include <random>

#include "../support/row_content.hpp"
#include "dhisparse/cuda/kv_write.cuh"
#include "dhisparse/cuda/verify_batch.cuh"

namespace {

using namespace dhtest;
using dhisparse_testing::fill_row;
using dhisparse_testing::first_mismatch;
using dhisparse_testing::request_tag;

using Layout = layout_576;  // source 0: 576-byte rows in 2 payload layers; source 1: 656-byte rows
using Hot = dh::lru_hot_cache<512>;
using CH = dhc::hierarchy<Layout, Hot>;
constexpr std::size_t S = Layout::sources.size();
constexpr std::size_t N = 8;
constexpr std::size_t K = Layout::top_k;
constexpr std::size_t kMaxRows = 2;  // rows one entry writes in a step
constexpr int kSteps = 1200, kReserveEvery = 16, kChurnEvery = 45;

/// Pinned host staging and device buffers of one source's step (write view + resolve batch).
struct source_step {
  std::size_t layers, row_bytes;
  dhc::pinned_buffer host;  // [slots N][rows N][count 1 + pad][sel N*K] then layer rows
  dhc::device_buffer<std::byte> dev;
  dhc::device_buffer<const std::byte*> layer_ptrs;
  dhc::device_buffer<location> locations{N * K};
  std::vector<location> h_locations = std::vector<location>(N * K);
  static constexpr std::size_t off_wslots = 0, off_wrows = 64, off_rslots = 128, off_rlen = 192, off_count = 256,
                               off_sel = 512;
  std::size_t off_layer = 0, bytes = 0;

  source_step(std::size_t layers_, std::size_t row_bytes_) : layers(layers_), row_bytes(row_bytes_), layer_ptrs(layers_) {
    off_layer = off_sel + N * K * sizeof(row_index);
    bytes = off_layer + layers * N * kMaxRows * row_bytes;
    host = dhc::pinned_buffer(bytes);
    dev = dhc::device_buffer<std::byte>(bytes);
    std::vector<const std::byte*> ptrs;
    for (std::size_t l = 0; l < layers; ++l) ptrs.push_back(dev.data() + off_layer + l * N * kMaxRows * row_bytes);
    DHTEST_CUDA(cudaMemcpy(layer_ptrs.data(), ptrs.data(), layers * sizeof(void*), cudaMemcpyHostToDevice));
  }
  template <class T>
  T* h(std::size_t off) { return reinterpret_cast<T*>(host.span().data() + off); }
  template <class T>
  T* d(std::size_t off) const { return reinterpret_cast<T*>(dev.data() + off); }
  std::byte* h_row(std::size_t l, std::size_t e, std::size_t i) {
    return host.span().data() + off_layer + ((l * N + e) * kMaxRows + i) * row_bytes;
  }
  dhc::kv_write_view write_view() const {
    dhc::kv_write_view v;
    v.slots = d<const std::int32_t>(off_wslots);
    v.rows = d<const std::int32_t>(off_wrows);
    v.layer_rows = layer_ptrs.data();
    v.max_rows = kMaxRows;
    v.capacity = N;
    return v;
  }
  dhc::batch_view resolve_view() {
    dhc::batch_view v;
    v.slots = d<const std::int32_t>(off_rslots);
    v.lengths = d<const std::int32_t>(off_rlen);
    v.count = d<const std::uint32_t>(off_count);
    v.selections = d<const row_index>(off_sel);
    v.locations = locations.data();
    v.stride = K;
    v.capacity = N;
    return v;
  }
};

}  // namespace

TEST_CASE("write + resolve captured in one graph replay for 1,200 steps with churn", "[gpu][writes][graph]") {
  require_device();
  cudaStream_t stream = nullptr;
  DHTEST_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  dh::hierarchy_config cfg;
  cfg.max_requests = N;
  cfg.max_rows = 4096;
  cfg.tail_rows = 64;
  cfg.optional_pages = 8;
  CH ch(cfg, stream);
  std::array<source_step, S> st{source_step(2, 576), source_step(1, 656)};

  std::map<request_id, std::uint64_t> tags;
  std::map<request_id, std::array<std::int64_t, S>> frontier;
  std::mt19937_64 rng(0x23);
  request_id next = 1;
  auto admit = [&] {
    const request_id id = next++;
    REQUIRE(ch.admit(id, stream).admitted);
    tags[id] = request_tag(id, 1);
    frontier[id] = {0, 0};
  };
  for (std::size_t i = 0; i < N - 1; ++i) admit();
  ch.reserve_ahead(kReserveEvery * kMaxRows, stream);

  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  DHTEST_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (std::size_t s = 0; s < S; ++s) {
    ch.append(s, st[s].write_view(), stream);
    ch.resolve(s, st[s].resolve_view(), stream);
  }
  DHTEST_CUDA(cudaStreamEndCapture(stream, &graph));
  DHTEST_CUDA(cudaGraphInstantiate(&exec, graph, 0));

  std::size_t checked = 0;
  for (int step = 0; step < kSteps; ++step) {
    if (step % kChurnEvery == kChurnEvery - 1) {  // between replays: one request leaves, one arrives
      auto it = tags.begin();
      std::advance(it, static_cast<long>(rng() % tags.size()));
      const request_id gone = it->first;
      ch.complete(gone, stream);
      tags.erase(gone);
      frontier.erase(gone);
      admit();
      ch.reserve_ahead(kReserveEvery * kMaxRows, stream);  // the newcomer's pages
    }
    if (step % kReserveEvery == 0) ch.reserve_ahead(kReserveEvery * kMaxRows, stream);

    std::array<std::vector<std::pair<request_id, std::size_t>>, S> resolved;  // (request, entry) per source
    for (std::size_t s = 0; s < S; ++s) {
      auto& x = st[s];
      std::vector<std::size_t> order(N);
      for (std::size_t e = 0; e < N; ++e) order[e] = e;
      std::shuffle(order.begin(), order.end(), rng);
      for (std::size_t e = 0; e < N; ++e) {
        x.h<std::int32_t>(source_step::off_wslots)[e] = -1;
        x.h<std::int32_t>(source_step::off_wrows)[e] = 0;
      }
      std::size_t k = 0, count = 0;
      for (const auto& [id, tag] : tags) {
        const std::size_t e = order[k++];
        const std::size_t rows = rng() % 10 == 0 ? 0 : (rng() % 7 == 0 ? 2 : 1);
        x.h<std::int32_t>(source_step::off_wslots)[e] = static_cast<std::int32_t>(ch.slot_of(id));
        x.h<std::int32_t>(source_step::off_wrows)[e] = static_cast<std::int32_t>(rows);
        for (std::size_t l = 0; l < x.layers; ++l)
          for (std::size_t i = 0; i < rows; ++i)
            fill_row(x.h_row(l, e, i), x.row_bytes, tag, s, l, frontier[id][s] + static_cast<std::int64_t>(i));
        frontier[id][s] += static_cast<std::int64_t>(rows);
        // The step's resolve: recent rows (the tail, including the row written this step), old rows, padding.
        const std::int64_t f = frontier[id][s];
        if (f == 0) continue;
        const std::size_t len = 1 + rng() % K;
        auto* sel = x.h<row_index>(source_step::off_sel) + count * K;
        for (std::size_t i = 0; i < len; ++i) {
          const auto pick = rng() % 4;
          sel[i] = pick == 0   ? -1
                   : pick == 1 ? static_cast<row_index>(f - 1 - static_cast<std::int64_t>(rng() % std::min<std::int64_t>(f, 70)))
                               : static_cast<row_index>(rng() % static_cast<std::uint64_t>(f));
        }
        x.h<std::int32_t>(source_step::off_rslots)[count] = static_cast<std::int32_t>(ch.slot_of(id));
        x.h<std::int32_t>(source_step::off_rlen)[count] = static_cast<std::int32_t>(len);
        resolved[s].emplace_back(id, count);
        ++count;
      }
      *x.h<std::uint32_t>(source_step::off_count) = static_cast<std::uint32_t>(count);
      DHTEST_CUDA(cudaMemcpyAsync(x.dev.data(), x.host.span().data(), x.bytes, cudaMemcpyHostToDevice, stream));
    }
    DHTEST_CUDA(cudaGraphLaunch(exec, stream));
    for (auto& x : st)
      DHTEST_CUDA(cudaMemcpyAsync(x.h_locations.data(), x.locations.data(), N * K * sizeof(location),
                                  cudaMemcpyDeviceToHost, stream));
    ch.check_errors(stream);  // synchronises; no entry may fail

    for (std::size_t s = 0; s < S; ++s) {
      auto& x = st[s];
      for (std::size_t l = 0; l < x.layers; ++l) {
        std::vector<std::byte> pool(ch.pool_rows() * x.row_bytes);
        ch.copy_pool(s, l, pool);
        for (const auto& [id, e] : resolved[s]) {
          const auto len = static_cast<std::size_t>(x.h<std::int32_t>(source_step::off_rlen)[e]);
          const row_index* sel = x.h<row_index>(source_step::off_sel) + e * K;
          for (std::size_t i = 0; i < len; ++i) {
            const location loc = x.h_locations[e * K + i];
            if (sel[i] < 0) {
              REQUIRE(loc == dh::no_location);
              continue;
            }
            if (loc < 0 || static_cast<std::size_t>(loc) >= ch.pool_rows()) {
              INFO("step " << step << " source " << s << " request " << id << " entry " << i << " row " << sel[i]);
              REQUIRE(loc >= 0);
              REQUIRE(static_cast<std::size_t>(loc) < ch.pool_rows());
            }
            const std::byte* got = pool.data() + static_cast<std::size_t>(loc) * x.row_bytes;
            if (first_mismatch(got, x.row_bytes, tags[id], s, l, sel[i]) != x.row_bytes) {
              INFO("step " << step << " source " << s << " layer " << l << " request " << id << " selection entry "
                           << i << " row " << sel[i] << " (frontier " << frontier[id][s] << ") at location " << loc);
              REQUIRE(false);
            }
            ++checked;
          }
        }
      }
    }
  }
  INFO("resolved rows checked: " << checked);
  REQUIRE(checked > 1'000'000);

  ch.sync_books(stream);
  for (const auto& [id, tag] : tags)
    for (std::size_t s = 0; s < S; ++s) {
      INFO("request " << id << " source " << s);
      REQUIRE(ch.frontier(id, s) == frontier[id][s]);
      REQUIRE(ch.reserved_rows(id, s) >= frontier[id][s]);
      for (std::size_t l = 0; l < Layout::sources[s].payload_layers; ++l)
        for (std::int64_t r = 0; r < frontier[id][s]; ++r) {
          const auto row = ch.host_row(id, s, l, r);
          REQUIRE(first_mismatch(row.data(), row.size(), tag, s, l, r) == row.size());
        }
    }
  DHTEST_CUDA(cudaGraphExecDestroy(exec));
  DHTEST_CUDA(cudaGraphDestroy(graph));
  DHTEST_CUDA(cudaStreamDestroy(stream));
}

namespace {

constexpr std::size_t kStepLayers = CH::step_layers;  // (source 0: 2) + (source 1: 1)

/// Pinned staging and device buffers of a step-wide write: slots [N], counts [S][N] (rows_pitch N),
/// then one row buffer per (source, payload layer) at step_layer_index.
struct step_write {
  static constexpr std::size_t off_slots = 0, off_rows = 64, off_layers = 256;
  dhc::pinned_buffer host;
  dhc::device_buffer<std::byte> dev;
  dhc::device_buffer<const std::byte*> layer_ptrs{kStepLayers};
  std::array<std::size_t, kStepLayers> off_layer{};
  std::size_t bytes = 0;

  step_write() {
    std::size_t at = off_layers;
    for (std::size_t s = 0; s < S; ++s)
      for (std::size_t l = 0; l < Layout::sources[s].payload_layers; ++l) {
        off_layer[CH::step_layer_index(s, l)] = at;
        at += N * kMaxRows * Layout::sources[s].row_bytes;
      }
    bytes = at;
    host = dhc::pinned_buffer(bytes);
    dev = dhc::device_buffer<std::byte>(bytes);
    std::vector<const std::byte*> ptrs(kStepLayers);
    for (std::size_t i = 0; i < kStepLayers; ++i) ptrs[i] = dev.data() + off_layer[i];
    DHTEST_CUDA(cudaMemcpy(layer_ptrs.data(), ptrs.data(), kStepLayers * sizeof(void*), cudaMemcpyHostToDevice));
  }
  std::int32_t* slots() { return reinterpret_cast<std::int32_t*>(host.span().data() + off_slots); }
  std::int32_t* rows(std::size_t s) { return reinterpret_cast<std::int32_t*>(host.span().data() + off_rows) + s * N; }
  std::byte* row(std::size_t s, std::size_t l, std::size_t e, std::size_t i) {
    return host.span().data() + off_layer[CH::step_layer_index(s, l)] + (e * kMaxRows + i) * Layout::sources[s].row_bytes;
  }
  dhc::kv_step_write_view view() const {
    dhc::kv_step_write_view v;
    v.slots = reinterpret_cast<const std::int32_t*>(dev.data() + off_slots);
    v.rows = reinterpret_cast<const std::int32_t*>(dev.data() + off_rows);
    v.rows_pitch = N;
    v.layer_rows = layer_ptrs.data();
    v.max_rows = kMaxRows;
    v.capacity = N;
    return v;
  }
};

}  // namespace

TEST_CASE("step-wide write with the backup forked and joined, plus resolves, in one graph for 1,000 steps",
          "[gpu][writes][graph][step]") {
  require_device();
  cudaStream_t stream = nullptr, backup = nullptr;
  DHTEST_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  DHTEST_CUDA(cudaStreamCreateWithFlags(&backup, cudaStreamNonBlocking));
  dh::hierarchy_config cfg;
  cfg.max_requests = N;
  cfg.max_rows = 4096;
  cfg.tail_rows = 8;  // rows leave the window within a few steps: later resolves read their host copies
  cfg.optional_pages = 8;
  CH ch(cfg, stream);
  step_write w;
  std::array<source_step, S> st{source_step(2, 576), source_step(1, 656)};  // resolve batches only

  std::map<request_id, std::uint64_t> tags;
  std::map<request_id, std::array<std::int64_t, S>> frontier;
  std::mt19937_64 rng(0x2323);
  request_id next = 1;
  auto admit = [&] {
    const request_id id = next++;
    REQUIRE(ch.admit(id, stream).admitted);
    tags[id] = request_tag(id, 2);
    frontier[id] = {0, 0};
  };
  for (std::size_t i = 0; i < N - 1; ++i) admit();
  ch.reserve_ahead(kReserveEvery * kMaxRows, stream);

  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  DHTEST_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  ch.append_step(w.view(), backup, stream);  // critical launch on `stream`, backup forked onto `backup`
  REQUIRE(ch.backup_pending());
  for (std::size_t s = 0; s < S; ++s) ch.resolve(s, st[s].resolve_view(), stream);  // not behind the backup
  ch.join_backup(stream);  // the capture cannot end with the backup stream unjoined
  REQUIRE_FALSE(ch.backup_pending());
  DHTEST_CUDA(cudaStreamEndCapture(stream, &graph));
  DHTEST_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  std::size_t nodes = 0;
  DHTEST_CUDA(cudaGraphGetNodes(graph, nullptr, &nodes));
  REQUIRE(nodes >= 1 + 1 + S);  // the critical write, the backup, the resolves

  constexpr int kGraphSteps = 1000;
  std::size_t checked = 0;
  for (int step = 0; step < kGraphSteps; ++step) {
    if (step % kChurnEvery == kChurnEvery - 1) {
      auto it = tags.begin();
      std::advance(it, static_cast<long>(rng() % tags.size()));
      const request_id gone = it->first;
      ch.complete(gone, stream);
      tags.erase(gone);
      frontier.erase(gone);
      admit();
      ch.reserve_ahead(kReserveEvery * kMaxRows, stream);
    }
    if (step % kReserveEvery == 0) ch.reserve_ahead(kReserveEvery * kMaxRows, stream);

    std::vector<std::size_t> order(N);
    for (std::size_t e = 0; e < N; ++e) order[e] = e;
    std::shuffle(order.begin(), order.end(), rng);
    for (std::size_t e = 0; e < N; ++e) {
      w.slots()[e] = -1;
      for (std::size_t s = 0; s < S; ++s) w.rows(s)[e] = 0;
    }
    std::array<std::vector<std::pair<request_id, std::size_t>>, S> resolved;
    std::array<std::size_t, S> count{};
    std::size_t k = 0;
    for (const auto& [id, tag] : tags) {
      const std::size_t e = order[k++];
      w.slots()[e] = static_cast<std::int32_t>(ch.slot_of(id));
      for (std::size_t s = 0; s < S; ++s) {
        auto& x = st[s];
        const std::size_t rows = rng() % 10 == 0 ? 0 : (rng() % 7 == 0 ? 2 : 1);
        w.rows(s)[e] = static_cast<std::int32_t>(rows);
        for (std::size_t l = 0; l < Layout::sources[s].payload_layers; ++l)
          for (std::size_t i = 0; i < rows; ++i)
            fill_row(w.row(s, l, e, i), Layout::sources[s].row_bytes, tag, s, l,
                     frontier[id][s] + static_cast<std::int64_t>(i));
        frontier[id][s] += static_cast<std::int64_t>(rows);
        const std::int64_t f = frontier[id][s];
        if (f == 0) continue;
        const std::size_t len = 1 + rng() % K;
        auto* sel = x.h<row_index>(source_step::off_sel) + count[s] * K;
        for (std::size_t i = 0; i < len; ++i) {
          const auto pick = rng() % 4;
          sel[i] = pick == 0   ? -1
                   : pick == 1 ? static_cast<row_index>(f - 1 - static_cast<std::int64_t>(rng() % std::min<std::int64_t>(f, 20)))
                               : static_cast<row_index>(rng() % static_cast<std::uint64_t>(f));
        }
        x.h<std::int32_t>(source_step::off_rslots)[count[s]] = static_cast<std::int32_t>(ch.slot_of(id));
        x.h<std::int32_t>(source_step::off_rlen)[count[s]] = static_cast<std::int32_t>(len);
        resolved[s].emplace_back(id, count[s]);
        ++count[s];
      }
    }
    for (std::size_t s = 0; s < S; ++s) {
      *st[s].h<std::uint32_t>(source_step::off_count) = static_cast<std::uint32_t>(count[s]);
      DHTEST_CUDA(cudaMemcpyAsync(st[s].dev.data(), st[s].host.span().data(), st[s].bytes, cudaMemcpyHostToDevice, stream));
    }
    DHTEST_CUDA(cudaMemcpyAsync(w.dev.data(), w.host.span().data(), w.bytes, cudaMemcpyHostToDevice, stream));
    DHTEST_CUDA(cudaGraphLaunch(exec, stream));
    for (auto& x : st)
      DHTEST_CUDA(cudaMemcpyAsync(x.h_locations.data(), x.locations.data(), N * K * sizeof(location),
                                  cudaMemcpyDeviceToHost, stream));
    ch.check_errors(stream);  // synchronises `stream`, which the graph joined the backup into
    REQUIRE_FALSE(ch.backup_pending());

    for (std::size_t s = 0; s < S; ++s) {
      auto& x = st[s];
      for (std::size_t l = 0; l < x.layers; ++l) {
        std::vector<std::byte> pool(ch.pool_rows() * x.row_bytes);
        ch.copy_pool(s, l, pool);
        for (const auto& [id, e] : resolved[s]) {
          const auto len = static_cast<std::size_t>(x.h<std::int32_t>(source_step::off_rlen)[e]);
          const row_index* sel = x.h<row_index>(source_step::off_sel) + e * K;
          for (std::size_t i = 0; i < len; ++i) {
            const location loc = x.h_locations[e * K + i];
            if (sel[i] < 0) {
              REQUIRE(loc == dh::no_location);
              continue;
            }
            REQUIRE(loc >= 0);
            REQUIRE(static_cast<std::size_t>(loc) < ch.pool_rows());
            const std::byte* got = pool.data() + static_cast<std::size_t>(loc) * x.row_bytes;
            if (first_mismatch(got, x.row_bytes, tags[id], s, l, sel[i]) != x.row_bytes) {
              INFO("step " << step << " source " << s << " layer " << l << " request " << id << " selection entry "
                           << i << " row " << sel[i] << " (frontier " << frontier[id][s] << ") at location " << loc);
              REQUIRE(false);
            }
            ++checked;
          }
        }
      }
    }
    if (step % 100 == 99) {  // every host copy is there after each replay (the graph joined its backup)
      ch.sync_books(stream);
      for (const auto& [id, tag] : tags)
        for (std::size_t s = 0; s < S; ++s)
          for (std::size_t l = 0; l < Layout::sources[s].payload_layers; ++l)
            for (std::int64_t r = 0; r < frontier[id][s]; ++r) {
              const auto row = ch.host_row(id, s, l, r);
              if (first_mismatch(row.data(), row.size(), tag, s, l, r) != row.size()) {
                INFO("step " << step << " request " << id << " source " << s << " layer " << l << " host row " << r);
                REQUIRE(false);
              }
            }
    }
  }
  INFO("resolved rows checked: " << checked);
  REQUIRE(checked > 500'000);
  ch.sync_books(stream);
  for (const auto& [id, tag] : tags)
    for (std::size_t s = 0; s < S; ++s) REQUIRE(ch.frontier(id, s) == frontier[id][s]);

  // The same step eagerly: the backup stays pending until something joins it.
  ch.append_step(w.view(), backup, stream);  // replays the last contents once more, eagerly
  REQUIRE(ch.backup_pending());
  ch.join_backup(stream);
  REQUIRE_FALSE(ch.backup_pending());
  DHTEST_CUDA(cudaStreamSynchronize(stream));
  DHTEST_CUDA(cudaGraphExecDestroy(exec));
  DHTEST_CUDA(cudaGraphDestroy(graph));
  DHTEST_CUDA(cudaStreamDestroy(backup));
  DHTEST_CUDA(cudaStreamDestroy(stream));
}

// ------------------------------------------------------------------------------------------------
// A whole speculative round in one graph: on every source, the batched stage (stage_view), the
// verify over a device descriptor (verify_batch_view) and the batched commit (commit_view),
// captured once and replayed for 240 rounds. Between replays the test writes new blocks, slots,
// counts, selections and accepted counts into the same device buffers; nothing per request runs
// on the host. After each replay every location the verify returned must hold the bytes the test
// generated for the selected row: the round's own block rows (this replay's bytes), or history
// rows (the bytes of the replay that committed them). Rounds left unverified stay staged and are
// replaced later. At checkpoints the host books (sync_books) and every host-store row must match
// the test's model.

namespace {

constexpr std::size_t kBlock = 4;    // K_max
constexpr std::size_t kSel = 24;     // selection entries per query (<= top_k)
constexpr int kRounds = 240;

/// Device buffers of one source's round: the stage view's slots, counts and block rows, the
/// verify descriptor, and the commit view's slots and accepted counts.
struct round_buffers {
  std::size_t layers, row_bytes;
  dhc::device_buffer<std::int32_t> stage_slots{N}, counts{N}, commit_slots{N}, accepted{N};
  std::vector<dhc::device_buffer<std::byte>> layer;
  dhc::device_buffer<const std::byte*> layer_ptrs;
  dhc::device_verify_batch verify{static_cast<std::uint32_t>(N), static_cast<std::uint32_t>(kBlock),
                                  static_cast<std::uint32_t>(K)};
  std::vector<std::vector<std::byte>> h_layer;  // [layer][N * kBlock * row_bytes]

  round_buffers(std::size_t layers_, std::size_t row_bytes_) : layers(layers_), row_bytes(row_bytes_), layer_ptrs(layers_) {
    std::vector<const std::byte*> ptrs;
    for (std::size_t l = 0; l < layers; ++l) {
      layer.emplace_back(N * kBlock * row_bytes);
      ptrs.push_back(layer.back().data());
      h_layer.emplace_back(N * kBlock * row_bytes);
    }
    DHTEST_CUDA(cudaMemcpy(layer_ptrs.data(), ptrs.data(), layers * sizeof(void*), cudaMemcpyHostToDevice));
  }
  dhc::stage_view stage_view() const {
    dhc::stage_view v;
    v.slots = stage_slots.data();
    v.counts = counts.data();
    v.layer_rows = layer_ptrs.data();
    v.max_block = kBlock;
    v.capacity = N;
    return v;
  }
  dhc::commit_view commit_view() const { return dhc::commit_view{commit_slots.data(), accepted.data(), N}; }
};

}  // namespace

TEST_CASE("stage + verify + commit of every source captured in one graph, replayed for 240 rounds",
          "[gpu][writes][graph][speculative][stage]") {
  require_device();
  cudaStream_t stream = nullptr;
  DHTEST_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  dh::hierarchy_config cfg;
  cfg.max_requests = N;
  cfg.max_rows = 2048;
  cfg.tail_rows = 16;  // a short tail: committed rows soon leave it and are read from the host store
  cfg.optional_pages = 8;
  cfg.max_block = kBlock;
  CH ch(cfg, stream);
  std::mt19937_64 rng(2026);
  std::vector<request_id> ids{11, 12, 13, 14, 15, 16};
  std::map<request_id, std::array<std::vector<std::uint64_t>, S>> row_tag;  // tag of each history row
  for (request_id id : ids) {
    REQUIRE(ch.admit(id, stream).admitted);
    for (std::size_t s = 0; s < S; ++s) {  // a short prefill
      const auto& d = Layout::sources[s];
      const std::size_t n = 8 + rng() % 24;
      const auto rows = dhisparse_testing::make_append_buffer(request_tag(id), s, d.payload_layers, d.row_bytes, 0, n);
      ch.append(id, s, rows, n, stream);
      row_tag[id][s].assign(n, request_tag(id));
    }
  }
  ch.reserve_ahead(kRounds * kBlock + 64, stream);  // every commit of the run, reserved outside the graph
  std::vector<round_buffers> bufs;
  for (std::size_t s = 0; s < S; ++s) bufs.emplace_back(Layout::sources[s].payload_layers, Layout::sources[s].row_bytes);

  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  DHTEST_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (std::size_t s = 0; s < S; ++s) {
    ch.stage_blocks(s, bufs[s].stage_view(), stream);
    ch.verify(s, bufs[s].verify.view(), stream);
    ch.commit(s, bufs[s].commit_view(), stream);
  }
  DHTEST_CUDA(cudaStreamEndCapture(stream, &graph));
  DHTEST_CUDA(cudaGraphInstantiate(&exec, graph, 0));

  std::map<std::pair<request_id, std::size_t>, std::uint64_t> staged_tag;  // blocks staged, not committed
  std::size_t checked_rows = 0, committed_rounds = 0, left_staged = 0;
  for (int round = 0; round < kRounds; ++round) {
    INFO("round " << round);
    struct entry {
      request_id id;
      std::size_t e, count, kr, accepted;
      bool verified;
      std::vector<std::vector<row_index>> queries;
    };
    std::array<std::vector<entry>, S> entries;
    for (std::size_t s = 0; s < S; ++s) {
      auto& b = bufs[s];
      std::vector<std::int32_t> stage_slots(N, -1), counts(N, 0), commit_slots(N, -1), accepted(N, 0);
      std::vector<std::size_t> order(N);
      for (std::size_t e = 0; e < N; ++e) order[e] = e;
      std::shuffle(order.begin(), order.end(), rng);  // entry positions change: padding anywhere
      std::size_t next = 0;
      for (request_id id : ids) {
        if (rng() % 5 == 0) continue;  // not in this round
        const std::size_t e = order[next++];
        const auto f = static_cast<std::int64_t>(row_tag[id][s].size());
        entry en{id, e, 1 + rng() % kBlock, 0, 0, rng() % 6 != 0, {}};
        en.kr = 1 + rng() % en.count;
        en.accepted = rng() % en.kr;  // changes every round: what the sampler would write
        const std::uint64_t tag = request_tag(id, static_cast<std::uint64_t>(round) + 1);
        for (std::size_t l = 0; l < b.layers; ++l)
          for (std::size_t i = 0; i < en.count; ++i)
            dhisparse_testing::fill_row(b.h_layer[l].data() + (e * kBlock + i) * b.row_bytes, b.row_bytes, tag, s, l,
                                        f + static_cast<std::int64_t>(i));
        stage_slots[e] = static_cast<std::int32_t>(ch.slot_of(id));
        counts[e] = static_cast<std::int32_t>(en.count);
        if (en.verified) {
          commit_slots[e] = stage_slots[e];
          accepted[e] = static_cast<std::int32_t>(en.accepted);
          for (std::size_t j = 0; j < en.kr; ++j) {  // query j sees rows < f + j + 1 (the block's first j + 1)
            const auto visible = static_cast<std::uint64_t>(f) + j + 1;
            std::vector<row_index> q;
            for (std::size_t i = 0; i < kSel; ++i) {
              const row_index r = rng() % 3 == 0 ? static_cast<row_index>(f + static_cast<std::int64_t>(rng() % (j + 1)))
                                                 : static_cast<row_index>(rng() % visible);
              if (std::find(q.begin(), q.end(), r) == q.end()) q.push_back(r);
            }
            en.queries.push_back(std::move(q));
          }
        }
        entries[s].push_back(std::move(en));
      }
      // The verify batch lists the verified rounds, in their own order.
      std::vector<std::vector<std::span<const row_index>>> qs;
      std::vector<dhc::device_verify_batch::round> up;
      qs.reserve(entries[s].size());
      for (const auto& en : entries[s]) {
        if (!en.verified) continue;
        qs.emplace_back(en.queries.begin(), en.queries.end());
        up.push_back({static_cast<std::int32_t>(ch.slot_of(en.id)), qs.back()});
      }
      b.verify.upload(up, stream);
      DHTEST_CUDA(cudaMemcpyAsync(b.stage_slots.data(), stage_slots.data(), N * 4, cudaMemcpyHostToDevice, stream));
      DHTEST_CUDA(cudaMemcpyAsync(b.counts.data(), counts.data(), N * 4, cudaMemcpyHostToDevice, stream));
      DHTEST_CUDA(cudaMemcpyAsync(b.commit_slots.data(), commit_slots.data(), N * 4, cudaMemcpyHostToDevice, stream));
      DHTEST_CUDA(cudaMemcpyAsync(b.accepted.data(), accepted.data(), N * 4, cudaMemcpyHostToDevice, stream));
      for (std::size_t l = 0; l < b.layers; ++l)
        DHTEST_CUDA(cudaMemcpyAsync(b.layer[l].data(), b.h_layer[l].data(), b.h_layer[l].size(), cudaMemcpyHostToDevice,
                                    stream));
      DHTEST_CUDA(cudaStreamSynchronize(stream));  // the host vectors are pageable and reused
    }
    DHTEST_CUDA(cudaGraphLaunch(exec, stream));
    wait_or_die(stream, "graph replay of a speculative round");
    ch.check_errors(stream);  // no entry of the round may fail

    // Every verified location holds the selected row's bytes: the model's, never the library's.
    for (std::size_t s = 0; s < S; ++s) {
      const std::size_t rb = Layout::sources[s].row_bytes;
      std::vector<std::vector<std::byte>> pool(Layout::sources[s].payload_layers,
                                               std::vector<std::byte>(ch.pool_rows() * rb));
      for (std::size_t l = 0; l < pool.size(); ++l) ch.copy_pool(s, l, pool[l]);
      std::uint32_t ve = 0;  // entry of the verify batch
      for (auto& en : entries[s]) {
        const std::uint64_t tag = request_tag(en.id, static_cast<std::uint64_t>(round) + 1);
        auto& hist = row_tag[en.id][s];
        if (!en.verified) {
          staged_tag[{en.id, s}] = tag;
          ++left_staged;
          continue;
        }
        for (std::size_t j = 0; j < en.kr; ++j) {
          const auto locs = bufs[s].verify.download_locations(ve, static_cast<std::uint32_t>(j), en.queries[j].size(), stream);
          for (std::size_t i = 0; i < locs.size(); ++i) {
            const row_index r = en.queries[j][i];
            REQUIRE(locs[i] >= 0);
            const std::uint64_t want = static_cast<std::size_t>(r) < hist.size() ? hist[static_cast<std::size_t>(r)] : tag;
            for (std::size_t l = 0; l < pool.size(); ++l) {
              INFO("source " << s << " request " << en.id << " query " << j << " row " << r << " layer " << l);
              const std::span<const std::byte> got(pool[l].data() + static_cast<std::size_t>(locs[i]) * rb, rb);
              REQUIRE(dhisparse_testing::row_matches(got, want, s, l, r));
              ++checked_rows;
            }
          }
        }
        ++ve;
        hist.insert(hist.end(), en.accepted + 1, tag);  // m = 1: one row per committed position
        staged_tag.erase({en.id, s});
        ++committed_rounds;
      }
    }

    if (round % 60 == 59) {  // the host books follow the device's
      ch.sync_books(stream);
      for (request_id id : ids)
        for (std::size_t s = 0; s < S; ++s) {
          INFO("request " << id << " source " << s);
          const auto& hist = row_tag[id][s];
          REQUIRE(ch.frontier(id, s) == static_cast<std::int64_t>(hist.size()));
          REQUIRE(ch.positions(id, s) == static_cast<std::int64_t>(hist.size()));
          const auto st = staged_tag.find({id, s});
          if (st == staged_tag.end()) REQUIRE(ch.staged_rows(id, s) == 0);
          else REQUIRE(ch.staged_rows(id, s) > 0);
          for (std::size_t l = 0; l < Layout::sources[s].payload_layers; ++l)
            for (std::size_t r = 0; r < hist.size(); ++r)
              REQUIRE(dhisparse_testing::row_matches(ch.host_row(id, s, l, static_cast<std::int64_t>(r)), hist[r], s, l,
                                                     static_cast<std::int64_t>(r)));
        }
    }
  }
  INFO("rows checked " << checked_rows << ", rounds committed " << committed_rounds << ", left staged " << left_staged);
  REQUIRE(committed_rounds > 1000);
  REQUIRE(left_staged > 100);
  // An eager round after the graph: the host books absorbed the device's, so it starts from them.
  const request_id a = ids.front();
  const auto f = static_cast<std::int64_t>(row_tag[a][1].size());
  const auto rows = dhisparse_testing::make_append_buffer(request_tag(a, 9999), 1, 1, 656, f, 2);
  ch.stage_block(a, 1, rows, 2, stream);
  std::vector<dhc::verify_query> cq(2);
  dhc::verify_batch_item ci{a, cq};
  ch.verify(1, std::span<const dhc::verify_batch_item>(&ci, 1), stream);
  ch.commit(a, 1, 1, stream);
  ch.check_errors(stream);
  REQUIRE(ch.positions(a, 1) == f + 2);
  for (std::int64_t r = f; r < f + 2; ++r)
    REQUIRE(dhisparse_testing::row_matches(ch.host_row(a, 1, 0, r), request_tag(a, 9999), 1, 0, r));
  DHTEST_CUDA(cudaGraphExecDestroy(exec));
  DHTEST_CUDA(cudaGraphDestroy(graph));
  DHTEST_CUDA(cudaStreamDestroy(stream));
}
