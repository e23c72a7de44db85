// Step-wide writes over a layout of many sources of mixed shapes: 40 sources of three row sizes
// with one or two payload layers (40 error books, a step table of 40 entries), decode steps (1 row
// an entry) and chunks of up to 2 and 4 rows, the host backup forked or
// inline, against the host twin and the test's own model: frontiers, every host-store row (bytes
// from the test's generator), every pool byte, free host pages. Bad (source, entry) pairs (a row
// count above the view's on a high source, a slot with no request, a slot named twice) are left
// untouched while the other pairs of the same entry proceed, and one check_errors names every
// source's record.
#include "cuda_test_support.cuh"
#include "step_write_buffers.cuh"

#include <algorithm>
#include <map>
#include <optional>

#include "../support/row_content.hpp"
#include "dhisparse/cuda/kv_write.cuh"

namespace {

using namespace dhtest;
using dhisparse_testing::fill_row;
using dhisparse_testing::row_matches;

constexpr std::size_t kSources = 40;

/// 576-, 656- and 144-byte rows; the 144-byte sources have a second payload layer, read by a
/// follower.
struct layout_many_sources {
  static constexpr std::size_t top_k = 64;
  static constexpr std::size_t page_rows = 64;
  static constexpr std::array<dh::source_desc, kSources> sources = [] {
    std::array<dh::source_desc, kSources> a{};
    constexpr std::array<std::size_t, 3> bytes{576, 656, 144};
    for (std::size_t s = 0; s < kSources; ++s) a[s] = {bytes[s % 3], 1, s % 3 == 2 ? 2u : 1u, 132};
    return a;
  }();
  static constexpr std::array<dh::consumer_desc, kSources + kSources / 3> consumers = [] {
    std::array<dh::consumer_desc, kSources + kSources / 3> a{};
    std::size_t n = 0;
    for (std::size_t s = 0; s < kSources; ++s) {
      a[n++] = {s, dh::consumer_kind::reindex, 0};
      if (s % 3 == 2) a[n++] = {s, dh::consumer_kind::follower, 1};
    }
    return a;
  }();
};
static_assert(dh::valid_layout<layout_many_sources>);

using Layout = layout_many_sources;
using Hot = dh::lru_hot_cache<64>;
using CH = dhc::hierarchy<Layout, Hot>;
using HH = dh::host_hierarchy<Layout, Hot>;
constexpr std::size_t N = 8;            // request slots = view capacity
constexpr std::size_t kMaxRows = 4;     // rows an entry may write in a chunk step

constexpr std::size_t kHistory = 256;   // rows a request may hold: 4 pages, all reserved at admission

using step_buffers = step_write_buffers<Layout, CH, N, kMaxRows>;

dh::hierarchy_config config() {
  dh::hierarchy_config c;
  c.max_requests = N;
  c.max_rows = kHistory;
  c.tail_rows = 2;  // chunks of up to 4 rows also write rows outside the window (critical host writes)
  c.optional_pages = 4;
  return c;
}

/// The error check_errors throws for the launch, or none; at most one throw per launch.
std::optional<std::pair<dh::errc, std::string>> take_error(CH& ch, cudaStream_t stream) {
  try {
    ch.check_errors(stream);
    return std::nullopt;
  } catch (const dh::error& e) {
    ch.check_errors(stream);  // one check takes every record of every source
    return std::make_pair(e.code(), std::string(e.what()));
  }
}

}  // namespace

TEST_CASE("step-wide writes over 40 sources of mixed shapes equal the host twin and the test's model",
          "[gpu][writes][step]") {
  require_device();
  cudaStream_t stream = nullptr, backup = nullptr;
  DHTEST_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  DHTEST_CUDA(cudaStreamCreateWithFlags(&backup, cudaStreamNonBlocking));
  CH ch(config(), stream);
  HH hh(config());
  step_buffers w;
  std::map<request_id, std::array<std::int64_t, kSources>> model;  // rows each request stores per source
  std::mt19937_64 rng(8086);
  request_id next = 1;
  auto admit = [&] {
    const request_id id = next++;
    const auto a = ch.admit(id, stream), b = hh.admit(id);
    REQUIRE(a.admitted);
    REQUIRE(a.slot == b.slot);
    for (std::size_t s = 0; s < kSources; ++s) {
      ch.reserve_rows(id, s, kHistory, stream);
      hh.reserve_rows(id, s, kHistory);
    }
    model[id] = {};
  };
  for (std::size_t i = 0; i < 6; ++i) admit();
  const std::size_t pages_per_request = kHistory / Layout::page_rows;
  const std::size_t host_pages = N * pages_per_request;

  auto compare = [&](const std::string& ctx) {
    ch.join_backup(stream);
    ch.sync_books(stream);
    for (const auto& [id, rows] : model)
      for (std::size_t s = 0; s < kSources; ++s) {
        INFO(ctx << ": request " << id << " source " << s);
        REQUIRE(hh.frontier(id, s) == rows[s]);
        REQUIRE(ch.frontier(id, s) == rows[s]);
        REQUIRE(ch.device_frontier(id, s) == rows[s]);
        for (std::size_t l = 0; l < Layout::sources[s].payload_layers; ++l)
          for (std::int64_t r = 0; r < rows[s]; ++r) {
            INFO("layer " << l << " row " << r);
            REQUIRE(row_matches(ch.host_row(id, s, l, r), id, s, l, r));
            REQUIRE(row_matches(hh.host_row(id, s, l, r), id, s, l, r));
          }
      }
    for (std::size_t s = 0; s < kSources; ++s) {
      INFO(ctx << ": free host pages of source " << s);
      REQUIRE(ch.free_host_pages(s) == host_pages - model.size() * pages_per_request);
      REQUIRE(hh.free_host_pages(s) == host_pages - model.size() * pages_per_request);
    }
    compare_pool_images<Layout>(ch, hh, ctx);
  };

  constexpr int kSteps = 120;
  std::size_t faults = 0;
  for (int step = 0; step < kSteps; ++step) {
    const std::size_t max_rows = std::array<std::size_t, 3>{1, kMaxRows, 2}[static_cast<std::size_t>(step) % 3];
    const bool chunk = max_rows > 1;  // decode steps and prefill-like chunks in turn
    w.clear(max_rows);
    std::vector<std::size_t> entries(N);
    for (std::size_t e = 0; e < N; ++e) entries[e] = e;
    std::shuffle(entries.begin(), entries.end(), rng);
    std::vector<std::size_t> used;  // entries naming a request
    std::vector<std::vector<std::byte>> item_bytes;
    std::vector<dh::step_write_item> items;
    item_bytes.reserve(model.size() * kSources);
    std::size_t k = 0;
    std::map<std::size_t, request_id> entry_request;
    for (auto& [id, rows] : model) {
      const std::size_t e = entries[k++];
      if (rng() % 8 == 0) continue;  // padding this step
      used.push_back(e);
      entry_request[e] = id;
      for (std::size_t s = 0; s < kSources; ++s) {
        const std::size_t room = kHistory - static_cast<std::size_t>(rows[s]);
        std::size_t count = chunk ? rng() % (max_rows + 1) : (rng() % 6 == 0 ? 0 : 1);
        count = std::min(count, room);
        w.set(e, static_cast<std::int32_t>(hh.slot_of(id)), s, count, id, rows[s]);
      }
    }
    // One fault a step from step 3 on, in turn: a row count above the view's on one source of the
    // second half (only that pair is refused), a slot without a request (refused on every source),
    // and an earlier entry's slot named again (the later entry is refused on every source).
    enum class fault { none, too_many_rows, unknown_slot, duplicate } kind = fault::none;
    std::size_t bad_entry = N, bad_source = kSources;
    const std::vector<std::size_t> pads(entries.begin() + static_cast<long>(k), entries.end());
    if (step >= 3 && !used.empty()) {
      switch ((step / 3) % 3) {  // every fault with every view shape in turn
        case 0:
          kind = fault::too_many_rows;
          bad_entry = used[rng() % used.size()];
          bad_source = kSources / 2 + rng() % (kSources / 2);  // past the first sources
          w.h_rows[bad_source * N + bad_entry] = static_cast<std::int32_t>(max_rows + 1);
          break;
        case 1:
          if (pads.empty() || model.size() == N) break;
          kind = fault::unknown_slot;
          bad_entry = pads[rng() % pads.size()];
          for (std::int32_t slot = 0; slot < static_cast<std::int32_t>(N); ++slot)
            if (std::none_of(model.begin(), model.end(), [&](const auto& m) { return hh.slot_of(m.first) == static_cast<std::size_t>(slot); })) {
              w.h_slots[bad_entry] = slot;
              break;
            }
          for (std::size_t s = 0; s < kSources; ++s) w.h_rows[s * N + bad_entry] = 1;
          break;
        default: {
          const std::size_t first = *std::min_element(used.begin(), used.end());
          std::vector<std::size_t> later;
          for (std::size_t e : pads)
            if (e > first) later.push_back(e);
          if (later.empty()) break;
          kind = fault::duplicate;
          bad_entry = later[rng() % later.size()];
          w.h_slots[bad_entry] = w.h_slots[first];
          for (std::size_t s = 0; s < kSources; ++s) w.h_rows[s * N + bad_entry] = 1;
          break;
        }
      }
    }
    // The host twin and the model take the good pairs.
    for (std::size_t e : used)
      for (std::size_t s = 0; s < kSources; ++s) {
        if (kind == fault::too_many_rows && e == bad_entry && s == bad_source) continue;
        const auto count = static_cast<std::size_t>(w.h_rows[s * N + e]);
        item_bytes.push_back(w.item_rows(s, e));
        items.push_back({entry_request[e], s, item_bytes.back(), count});
        model[entry_request[e]][s] += static_cast<std::int64_t>(count);
      }
    w.upload(stream);
    const bool inline_host = step % 5 == 4;
    ch.append_step(w.view(), inline_host ? stream : backup, stream);
    hh.append_step(items);
    const auto thrown = take_error(ch, stream);
    INFO("step " << step << " fault " << static_cast<int>(kind) << " entry " << bad_entry << " source " << bad_source);
    switch (kind) {
      case fault::none:
        REQUIRE_FALSE(thrown.has_value());
        break;
      case fault::too_many_rows:
        REQUIRE(thrown.has_value());
        REQUIRE(thrown->first == dh::errc::size_mismatch);
        REQUIRE(thrown->second.find("source " + std::to_string(bad_source)) != std::string::npos);
        REQUIRE(thrown->second.find("more error record") == std::string::npos);
        ++faults;
        break;
      case fault::unknown_slot:
      case fault::duplicate: {
        REQUIRE(thrown.has_value());
        REQUIRE(thrown->first == (kind == fault::unknown_slot ? dh::errc::unknown_request : dh::errc::duplicate_in_batch));
        INFO(thrown->second);
        REQUIRE(thrown->second.find("source 0") != std::string::npos);
        REQUIRE(thrown->second.find(std::to_string(kSources - 1) + " more error records") != std::string::npos);
        ++faults;
        break;
      }
    }
    if (step % 10 == 9) compare("step " + std::to_string(step));
    if (step % 30 == 29) {  // completion and admission between steps
      const request_id gone = model.begin()->first;
      ch.complete(gone, stream);
      hh.complete(gone);
      model.erase(gone);
      admit();
    }
  }
  compare("end");
  REQUIRE(faults >= 60);
  DHTEST_CUDA(cudaStreamDestroy(backup));
  DHTEST_CUDA(cudaStreamDestroy(stream));
}
