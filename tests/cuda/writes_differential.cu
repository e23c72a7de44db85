// Batched step writes (kv_write_view) and batched speculative commits (commit_view) on the CUDA
// hierarchy, against the host reference hierarchy driven with the same batches (host write_item /
// commit_item spans): tail and every other pool byte, host-store bytes of every row, frontiers,
// committed positions, and hot-cache rows and LRU order after resolves that follow the writes. Row
// contents come from the test's own generator (support/row_content.hpp), so both backends are also
// checked against bytes neither of them produced. Bad entries (slot without a request, the same
// slot twice, a row count outside the view, rows past the reservation, commits without a verify
// or beyond it) must be left untouched while the other entries proceed, and be thrown by
// check_errors as their typed error.
#include "cuda_test_support.cuh"
#include "step_write_buffers.cuh"

#include <map>

#include "../support/row_content.hpp"
#include "dhisparse/cuda/kv_write.cuh"
#include "dhisparse/cuda/residency_manager.cuh"

namespace {

using namespace dhtest;
using dhisparse_testing::fill_row;
using dhisparse_testing::request_tag;
using dhisparse_testing::row_matches;

using Layout = layout_576;  // source 0: 576-byte rows, 2 payload layers; source 1: 656-byte rows, 1 layer
using Hot = dh::lru_hot_cache<512>;
using CH = dhc::hierarchy<Layout, Hot>;
using HH = dh::host_hierarchy<Layout, Hot>;
constexpr std::size_t N = 8;          // request slots = view capacity
constexpr std::size_t kMaxRows = 4;   // rows one entry may write in a step (view max_rows)
constexpr std::size_t K = Layout::top_k;

dh::hierarchy_config config(std::size_t max_block = 1) {
  dh::hierarchy_config c;
  c.max_requests = N;
  c.max_rows = 2048;
  c.tail_rows = 64;
  c.optional_pages = 8;
  c.max_block = max_block;
  return c;
}

/// Device buffers of one source's kv_write_view (capacity N, rows [token][row_bytes] per layer).
struct write_buffers {
  std::size_t layers = 0, row_bytes = 0;
  dhc::device_buffer<std::int32_t> slots{N}, rows{N};
  std::vector<dhc::device_buffer<std::byte>> layer;
  dhc::device_buffer<const std::byte*> layer_ptrs;
  std::vector<std::int32_t> h_slots = std::vector<std::int32_t>(N, -1), h_rows = std::vector<std::int32_t>(N, 0);
  std::vector<std::vector<std::byte>> h_layer;  // [layer][N * kMaxRows * row_bytes]

  write_buffers(std::size_t layers_, std::size_t row_bytes_) : layers(layers_), row_bytes(row_bytes_), layer_ptrs(layers_) {
    std::vector<const std::byte*> ptrs;
    for (std::size_t l = 0; l < layers; ++l) {
      layer.emplace_back(N * kMaxRows * row_bytes);
      ptrs.push_back(layer.back().data());
      h_layer.emplace_back(N * kMaxRows * row_bytes);
    }
    DHTEST_CUDA(cudaMemcpy(layer_ptrs.data(), ptrs.data(), layers * sizeof(void*), cudaMemcpyHostToDevice));
  }
  void clear() {
    std::fill(h_slots.begin(), h_slots.end(), -1);
    std::fill(h_rows.begin(), h_rows.end(), 0);
  }
  /// Entry e writes `count` rows of (tag, source) starting at history row `first_row`.
  void set(std::size_t e, std::int32_t slot, std::size_t count, std::uint64_t tag, std::size_t source,
           std::int64_t first_row) {
    h_slots[e] = slot;
    h_rows[e] = static_cast<std::int32_t>(count);
    for (std::size_t l = 0; l < layers; ++l)
      for (std::size_t i = 0; i < count && i < kMaxRows; ++i)
        fill_row(h_layer[l].data() + (e * kMaxRows + i) * row_bytes, row_bytes, tag, source, l,
                 first_row + static_cast<std::int64_t>(i));
  }
  /// The host twin's item for entry e: [layer][count][row_bytes].
  std::vector<std::byte> item_rows(std::size_t e) const {
    const auto count = static_cast<std::size_t>(h_rows[e]);
    std::vector<std::byte> out(layers * count * row_bytes);
    for (std::size_t l = 0; l < layers; ++l)
      std::memcpy(out.data() + l * count * row_bytes, h_layer[l].data() + e * kMaxRows * row_bytes, count * row_bytes);
    return out;
  }
  void upload(cudaStream_t s) {
    DHTEST_CUDA(cudaMemcpyAsync(slots.data(), h_slots.data(), N * 4, cudaMemcpyHostToDevice, s));
    DHTEST_CUDA(cudaMemcpyAsync(rows.data(), h_rows.data(), N * 4, cudaMemcpyHostToDevice, s));
    for (std::size_t l = 0; l < layers; ++l)
      DHTEST_CUDA(cudaMemcpyAsync(layer[l].data(), h_layer[l].data(), h_layer[l].size(), cudaMemcpyHostToDevice, s));
    DHTEST_CUDA(cudaStreamSynchronize(s));  // the host vectors are pageable and reused
  }
  dhc::kv_write_view view() const {
    dhc::kv_write_view v;
    v.slots = slots.data();
    v.rows = rows.data();
    v.layer_rows = layer_ptrs.data();
    v.max_rows = kMaxRows;
    v.capacity = N;
    return v;
  }
};

template <class A, class B>
void compare_pools(A& cuda_h, const B& host_h, const std::string& ctx) {
  compare_pool_images<Layout>(cuda_h, host_h, ctx);
}

/// Frontiers, positions and every host-store row of each request: the test's model, both backends.
template <class A, class B>
void compare_books(A& cuda_h, const B& host_h, const std::map<request_id, std::uint64_t>& tags,
                   const std::map<request_id, std::array<std::int64_t, 2>>& positions, const std::string& ctx) {
  for (const auto& [id, tag] : tags)
    for (std::size_t s = 0; s < Layout::sources.size(); ++s) {
      INFO(ctx << ": request " << id << " source " << s);
      const auto m = static_cast<std::int64_t>(Layout::sources[s].positions_per_row);
      REQUIRE(host_h.positions(id, s) == positions.at(id)[s]);
      REQUIRE(cuda_h.positions(id, s) == positions.at(id)[s]);
      REQUIRE(cuda_h.frontier(id, s) == positions.at(id)[s] / m);
      REQUIRE(cuda_h.device_frontier(id, s) == positions.at(id)[s] / m);
      for (std::size_t l = 0; l < Layout::sources[s].payload_layers; ++l)
        for (std::int64_t r = 0; r < positions.at(id)[s] / m; ++r) {
          INFO("layer " << l << " row " << r);
          REQUIRE(row_matches(cuda_h.host_row(id, s, l, r), tag, s, l, r));
          REQUIRE(row_matches(host_h.host_row(id, s, l, r), tag, s, l, r));
        }
    }
}

/// One eager resolve of random selections on both backends; locations, hot rows and LRU order equal.
void resolve_both(CH& ch, HH& hh, std::size_t s, const std::map<request_id, std::uint64_t>& tags,
                  std::mt19937_64& rng, cudaStream_t stream) {
  std::vector<std::vector<row_index>> sels;
  std::vector<request_id> ids;
  for (const auto& [id, tag] : tags) {
    const std::int64_t f = hh.frontier(id, s);
    if (f == 0) continue;
    std::vector<row_index> sel(K);
    for (auto& x : sel) x = rng() % 8 == 0 ? -1 : static_cast<row_index>(rng() % static_cast<std::uint64_t>(f));
    sels.push_back(std::move(sel));
    ids.push_back(id);
  }
  if (ids.empty()) return;
  dhc::device_buffer<row_index> d_sel(ids.size() * K);
  dhc::device_buffer<location> d_loc(ids.size() * K);
  std::vector<row_index> flat;
  for (const auto& v : sels) flat.insert(flat.end(), v.begin(), v.end());
  DHTEST_CUDA(cudaMemcpy(d_sel.data(), flat.data(), flat.size() * sizeof(row_index), cudaMemcpyHostToDevice));
  std::vector<dhc::batch_item> cb;
  std::vector<dh::resolve_item> hb;
  std::vector<std::vector<location>> hloc(ids.size(), std::vector<location>(K));
  for (std::size_t e = 0; e < ids.size(); ++e) {
    cb.push_back({ids[e], d_sel.data() + e * K, static_cast<std::int32_t>(K), d_loc.data() + e * K});
    hb.push_back({ids[e], sels[e], hloc[e]});
  }
  ch.resolve(s, cb, stream);
  ch.check_errors(stream);
  hh.resolve(s, hb);
  std::vector<location> got(ids.size() * K);
  DHTEST_CUDA(cudaMemcpy(got.data(), d_loc.data(), got.size() * sizeof(location), cudaMemcpyDeviceToHost));
  for (std::size_t e = 0; e < ids.size(); ++e) {
    INFO("resolve of request " << ids[e] << " on source " << s);
    DHTEST_REQUIRE_SAME(location, "locations (cuda vs host)", hloc[e],
                        std::vector<location>(got.begin() + e * K, got.begin() + (e + 1) * K));
    const auto hot_h = hh.hot_rows_of(ids[e], s);
    const auto lru_h = hh.lru_order_of(ids[e], s);
    DHTEST_REQUIRE_SAME(row_index, "hot rows", std::vector<row_index>(hot_h.begin(), hot_h.end()), ch.hot_rows_of(ids[e], s));
    DHTEST_REQUIRE_SAME(Hot::order_index, "LRU order", std::vector<Hot::order_index>(lru_h.begin(), lru_h.end()),
                        ch.lru_order_of(ids[e], s));
  }
}

}  // namespace

TEST_CASE("batched writes equal the host twin: tails, host store, frontiers, LRU after resolves", "[gpu][writes]") {
  require_device();
  cudaStream_t stream = nullptr;
  DHTEST_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CH ch(config(), stream);
  HH hh(config());
  std::array<write_buffers, 2> wb{write_buffers(2, 576), write_buffers(1, 656)};
  std::map<request_id, std::uint64_t> tags;
  std::map<request_id, std::array<std::int64_t, 2>> frontier;
  std::mt19937_64 rng(2323);
  request_id next = 1;
  auto admit = [&] {
    const request_id id = next++;
    const auto a = ch.admit(id, stream), b = hh.admit(id);
    REQUIRE(a.admitted == b.admitted);
    REQUIRE(a.slot == b.slot);
    tags[id] = request_tag(id, 7);
    frontier[id] = {0, 0};
  };
  for (std::size_t i = 0; i < 6; ++i) admit();

  constexpr int kSteps = 240, kReserveEvery = 8;
  for (int step = 0; step < kSteps; ++step) {
    if (step % kReserveEvery == 0) {  // outside the step: covers kReserveEvery steps of up to kMaxRows rows
      ch.reserve_ahead(kReserveEvery * kMaxRows, stream);
      hh.reserve_ahead(kReserveEvery * kMaxRows);
      for (const auto& [id, tag] : tags)
        for (std::size_t s = 0; s < 2; ++s) REQUIRE(ch.reserved_rows(id, s) == hh.reserved_rows(id, s));
    }
    for (std::size_t s = 0; s < 2; ++s) {
      auto& w = wb[s];
      w.clear();
      std::vector<std::size_t> entries(N);
      for (std::size_t e = 0; e < N; ++e) entries[e] = e;
      std::shuffle(entries.begin(), entries.end(), rng);  // entries anywhere in the view, padding between
      std::size_t k = 0;
      std::vector<std::vector<std::byte>> item_bytes;
      std::vector<dh::write_item> items;
      for (const auto& [id, tag] : tags) {
        const std::size_t e = entries[k++];
        if (rng() % 6 == 0) continue;  // padding this step
        const std::size_t count = rng() % 5 == 0 ? 1 + rng() % kMaxRows : (rng() % 8 == 0 ? 0 : 1);  // chunk, decode, none
        w.set(e, static_cast<std::int32_t>(hh.slot_of(id)), count, tag, s, frontier[id][s]);
        item_bytes.push_back(w.item_rows(e));
        items.push_back({id, item_bytes.back(), count});
        frontier[id][s] += static_cast<std::int64_t>(count);
      }
      w.upload(stream);
      ch.append(s, w.view(), stream);
      hh.append(s, items);
    }
    ch.check_errors(stream);
    if (step % 3 == 0) resolve_both(ch, hh, step % 2, tags, rng, stream);  // eager: absorbs nothing it needs
    if (step % 40 == 39) {
      ch.sync_books(stream);
      std::map<request_id, std::array<std::int64_t, 2>> pos = frontier;
      compare_books(ch, hh, tags, pos, "step " + std::to_string(step));
      compare_pools(ch, hh, "step " + std::to_string(step));
      const request_id gone = tags.begin()->first;  // completion and admission between steps
      ch.complete(gone, stream);
      hh.complete(gone);
      tags.erase(gone);
      frontier.erase(gone);
      admit();
      for (std::size_t s = 0; s < 2; ++s) REQUIRE(ch.free_host_pages(s) == hh.free_host_pages(s));
    }
  }
  ch.sync_books(stream);
  compare_books(ch, hh, tags, frontier, "end");
  compare_pools(ch, hh, "end");
  // The per-request append keeps working after batched ones (it absorbs the device books first).
  const request_id id = tags.begin()->first;
  const auto more = dhisparse_testing::make_append_buffer(tags[id], 1, 1, 656, frontier[id][1], 3);
  ch.append(id, 1, more, 3, stream);
  hh.append(id, 1, more, 3);
  frontier[id][1] += 3;
  ch.check_errors(stream);
  compare_books(ch, hh, tags, frontier, "per-request append after batched ones");
  compare_pools(ch, hh, "per-request append after batched ones");
  DHTEST_CUDA(cudaStreamDestroy(stream));
}

TEST_CASE("bad batched write entries are untouched, the others proceed, check_errors names them", "[gpu][writes]") {
  require_device();
  cudaStream_t stream = nullptr;
  DHTEST_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CH ch(config(), stream);
  for (request_id id : {1, 2, 3}) REQUIRE(ch.admit(id, stream).admitted);
  ch.reserve_ahead(8, stream);  // pages cover rows [0, 64)
  write_buffers w(1, 656);
  const auto good_slot = static_cast<std::int32_t>(ch.slot_of(1));
  const auto other = static_cast<std::int32_t>(ch.slot_of(2));
  struct bad_case {
    const char* what;
    std::int32_t slot;
    std::size_t rows;
    dh::errc code;
  };
  const std::array<bad_case, 4> cases{{
      {"slot without a request", 7, 1, dh::errc::unknown_request},
      {"the same slot twice", good_slot, 1, dh::errc::duplicate_in_batch},
      {"row count above the view's max_rows", other, kMaxRows + 1, dh::errc::size_mismatch},
      {"rows past the reservation", other, 65, dh::errc::capacity_exceeded},
  }};
  std::int64_t good_rows = 0;
  for (const auto& c : cases) {
    INFO(c.what);
    w.clear();
    w.set(0, good_slot, 1, request_tag(1), 1, good_rows);
    w.set(3, c.slot, std::min<std::size_t>(c.rows, kMaxRows), request_tag(2), 1, 0);
    w.h_rows[3] = static_cast<std::int32_t>(c.rows);
    w.upload(stream);
    dhc::kv_write_view v = w.view();
    if (c.code == dh::errc::capacity_exceeded) v.max_rows = 100;  // a prefill chunk: only the reservation stops it
    ch.append(1, v, stream);
    bool thrown = false;
    try {
      ch.check_errors(stream);
    } catch (const dh::error& e) {
      thrown = true;
      INFO(e.what());
      REQUIRE(e.code() == c.code);
    }
    REQUIRE(thrown);
    ch.check_errors(stream);  // the record is cleared
    ++good_rows;
    REQUIRE(ch.frontier(1, 1) == good_rows);  // the good entry went through
    REQUIRE(ch.frontier(2, 1) == 0);          // the bad one is untouched
    REQUIRE(ch.frontier(3, 1) == 0);
    REQUIRE(row_matches(ch.host_row(1, 1, 0, good_rows - 1), request_tag(1), 1, 0, good_rows - 1));
  }
  // Host checks of the view itself.
  dhc::kv_write_view too_wide = w.view();
  too_wide.capacity = N + 1;
  REQUIRE_THROWS_AS(ch.append(1, too_wide, stream), dh::size_mismatch);
  dhc::kv_write_view no_rows = w.view();
  no_rows.layer_rows = nullptr;
  REQUIRE_THROWS_AS(ch.append(1, no_rows, stream), dh::size_mismatch);
  DHTEST_CUDA(cudaStreamDestroy(stream));
}

TEST_CASE("batched commits equal the host twin and reject rounds that were not verified", "[gpu][writes][speculative]") {
  require_device();
  constexpr std::size_t KB = 4;
  cudaStream_t stream = nullptr;
  DHTEST_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CH ch(config(KB), stream);
  HH hh(config(KB));
  std::map<request_id, std::uint64_t> tags;
  std::map<request_id, std::array<std::int64_t, 2>> positions;
  for (request_id id = 1; id <= 6; ++id) {
    REQUIRE(ch.admit(id, stream).slot == hh.admit(id).slot);
    tags[id] = request_tag(id, 3);
    positions[id] = {0, 0};
  }
  dhc::device_buffer<std::int32_t> d_slots(N), d_accepted(N);
  std::mt19937_64 rng(99);
  for (int round = 0; round < 120; ++round) {
    if (round % 4 == 0) {
      ch.reserve_ahead(4 * KB, stream);
      hh.reserve_ahead(4 * KB);
    }
    for (std::size_t s = 0; s < 2; ++s) {
      const auto& d = Layout::sources[s];
      std::vector<std::int32_t> slots(N, -1), accepted(N, 0);
      std::vector<dh::commit_item> items;
      std::size_t e = 0;
      for (const auto& [id, tag] : tags) {
        const std::size_t at = e++;
        if (rng() % 5 == 0) continue;  // not committing this round
        const std::size_t count = 1 + rng() % KB;
        const std::int64_t f = hh.frontier(id, s);
        const auto rows = dhisparse_testing::make_append_buffer(tag, s, d.payload_layers, d.row_bytes, f, count);
        ch.stage_block(id, s, rows, count, stream);
        hh.stage_block(id, s, rows, count);
        const std::size_t kr = 1 + rng() % count;
        std::vector<dhc::verify_query> cq(kr);  // empty queries: the round's K_r is what a commit checks
        dhc::verify_batch_item ci{id, cq};
        ch.verify(s, std::span<const dhc::verify_batch_item>(&ci, 1), stream);
        std::vector<std::vector<row_index>> q(kr);
        std::vector<std::vector<location>> ql(kr);
        std::vector<std::span<const row_index>> qs(q.begin(), q.end());
        std::vector<std::span<location>> ls(ql.begin(), ql.end());
        const dh::verify_item hi{id, qs, ls};
        hh.verify(s, std::span<const dh::verify_item>(&hi, 1));
        const std::size_t acc = rng() % kr;
        slots[at] = static_cast<std::int32_t>(hh.slot_of(id));
        accepted[at] = static_cast<std::int32_t>(acc);
        items.push_back({id, acc});
        positions[id][s] += static_cast<std::int64_t>(acc) + 1;
      }
      DHTEST_CUDA(cudaMemcpyAsync(d_slots.data(), slots.data(), N * 4, cudaMemcpyHostToDevice, stream));
      DHTEST_CUDA(cudaMemcpyAsync(d_accepted.data(), accepted.data(), N * 4, cudaMemcpyHostToDevice, stream));
      ch.commit(s, dhc::commit_view{d_slots.data(), d_accepted.data(), N}, stream);
      DHTEST_CUDA(cudaStreamSynchronize(stream));  // `slots` / `accepted` are pageable and go out of scope
      hh.commit(s, items);
    }
    ch.check_errors(stream);
  }
  ch.sync_books(stream);
  compare_books(ch, hh, tags, positions, "after batched commits");
  compare_pools(ch, hh, "after batched commits");
  for (const auto& [id, tag] : tags) REQUIRE(ch.staged_rows(id, 0) == 0);

  // A commit without a verify, and one beyond the verified round: untouched and reported.
  const request_id a = 1, b = 2;  // b has no verified round
  const auto rows = dhisparse_testing::make_append_buffer(tags[a], 1, 1, 656, hh.frontier(a, 1), 2);
  ch.stage_block(a, 1, rows, 2, stream);
  std::vector<dhc::verify_query> cq(2);
  dhc::verify_batch_item ci{a, cq};
  ch.verify(1, std::span<const dhc::verify_batch_item>(&ci, 1), stream);
  for (const auto& [who, acc, code] : {std::tuple{b, 0, dh::errc::commit_without_verify},
                                       std::tuple{a, 2, dh::errc::acceptance_beyond_block}}) {
    const std::array<std::int32_t, 1> s1{static_cast<std::int32_t>(ch.slot_of(who))};
    const std::array<std::int32_t, 1> a1{acc};
    DHTEST_CUDA(cudaMemcpy(d_slots.data(), s1.data(), 4, cudaMemcpyHostToDevice));
    DHTEST_CUDA(cudaMemcpy(d_accepted.data(), a1.data(), 4, cudaMemcpyHostToDevice));
    const auto before = ch.positions(who, 1);
    ch.commit(1, dhc::commit_view{d_slots.data(), d_accepted.data(), 1}, stream);
    bool thrown = false;
    try {
      ch.check_errors(stream);
    } catch (const dh::error& e) {
      thrown = true;
      INFO(e.what());
      REQUIRE(e.code() == code);
    }
    REQUIRE(thrown);
    REQUIRE(ch.positions(who, 1) == before);
  }
  DHTEST_CUDA(cudaStreamDestroy(stream));
}

// ------------------------------------------------------------------------------------------------
// Step-wide writes and commits (append_step / commit_step: one launch over every source, the host
// backup forked onto a second stream) against the host twin's append_step / commit_step.

namespace {

constexpr std::size_t kSources = 2;
constexpr std::size_t kStepLayers = CH::step_layers;
static_assert(kStepLayers == 3 && CH::step_layer_index(1, 0) == 2);

using step_buffers = step_write_buffers<Layout, CH, N, kMaxRows>;

/// A short tail (2 rows) so that chunks of up to kMaxRows rows also write rows outside the window,
/// which the critical launch sends straight to the host store.
dh::hierarchy_config step_config(std::size_t max_block = 1) {
  dh::hierarchy_config c = config(max_block);
  c.tail_rows = 2;
  return c;
}

}  // namespace

TEST_CASE("step-wide writes with the backup on its own stream equal the host twin", "[gpu][writes][step]") {
  require_device();
  cudaStream_t stream = nullptr, backup = nullptr;
  DHTEST_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  DHTEST_CUDA(cudaStreamCreateWithFlags(&backup, cudaStreamNonBlocking));
  CH ch(step_config(), stream);
  HH hh(step_config());
  step_buffers w;
  std::map<request_id, std::uint64_t> tags;
  std::map<request_id, std::array<std::int64_t, 2>> frontier;
  std::mt19937_64 rng(4242);
  request_id next = 1;
  auto admit = [&] {
    const request_id id = next++;
    const auto a = ch.admit(id, stream), b = hh.admit(id);
    REQUIRE(a.slot == b.slot);
    tags[id] = request_tag(id, 11);
    frontier[id] = {0, 0};
  };
  for (std::size_t i = 0; i < 6; ++i) admit();

  constexpr int kSteps = 200, kReserveEvery = 8;
  for (int step = 0; step < kSteps; ++step) {
    if (step % kReserveEvery == 0) {  // joins the pending backup first (it absorbs the books)
      ch.reserve_ahead(kReserveEvery * kMaxRows, stream);
      hh.reserve_ahead(kReserveEvery * kMaxRows);
      REQUIRE_FALSE(ch.backup_pending());
    }
    w.clear();
    std::vector<std::size_t> entries(N);
    for (std::size_t e = 0; e < N; ++e) entries[e] = e;
    std::shuffle(entries.begin(), entries.end(), rng);  // entries anywhere in the view, padding between
    std::size_t k = 0;
    std::vector<std::vector<std::byte>> item_bytes;
    std::vector<dh::step_write_item> items;
    item_bytes.reserve(tags.size() * kSources);
    for (const auto& [id, tag] : tags) {
      const std::size_t e = entries[k++];
      if (rng() % 6 == 0) continue;  // padding this step
      for (std::size_t s = 0; s < kSources; ++s) {
        const std::size_t count = rng() % 5 == 0 ? 1 + rng() % kMaxRows : (rng() % 8 == 0 ? 0 : 1);
        w.set(e, static_cast<std::int32_t>(hh.slot_of(id)), s, count, tag, frontier[id][s]);
        item_bytes.push_back(w.item_rows(s, e));
        items.push_back({id, s, item_bytes.back(), count});
        frontier[id][s] += static_cast<std::int64_t>(count);
      }
    }
    w.upload(stream);
    const bool inline_host = step % 5 == 4;  // backup == stream: write-through in the critical launch
    ch.append_step(w.view(), inline_host ? stream : backup, stream);
    REQUIRE(ch.backup_pending() == !inline_host);
    hh.append_step(items);
    ch.check_errors(stream);
    if (step % 3 == 0) {  // an eager resolve fetches from the host store: it joins the backup first
      const std::size_t rs = static_cast<std::size_t>(step % 2);
      const bool any = std::any_of(tags.begin(), tags.end(), [&](const auto& t) { return hh.frontier(t.first, rs) > 0; });
      resolve_both(ch, hh, rs, tags, rng, stream);
      if (any) REQUIRE_FALSE(ch.backup_pending());
    }
    if (step % 40 == 39) {
      ch.join_backup(stream);
      REQUIRE_FALSE(ch.backup_pending());
      ch.sync_books(stream);
      compare_books(ch, hh, tags, frontier, "step " + std::to_string(step));
      compare_pools(ch, hh, "step " + std::to_string(step));
      const request_id gone = tags.begin()->first;  // completion and admission between steps
      ch.complete(gone, stream);
      hh.complete(gone);
      tags.erase(gone);
      frontier.erase(gone);
      admit();
      for (std::size_t s = 0; s < kSources; ++s) REQUIRE(ch.free_host_pages(s) == hh.free_host_pages(s));
    }
  }
  // host_row waits for a pending backup by itself (no join_backup before reading).
  ch.sync_books(stream);
  compare_books(ch, hh, tags, frontier, "end");
  compare_pools(ch, hh, "end");
  DHTEST_CUDA(cudaStreamDestroy(backup));
  DHTEST_CUDA(cudaStreamDestroy(stream));
}

TEST_CASE("bad step-wide (source, entry) pairs are untouched, the others proceed, check_errors names them",
          "[gpu][writes][step]") {
  require_device();
  cudaStream_t stream = nullptr, backup = nullptr;
  DHTEST_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  DHTEST_CUDA(cudaStreamCreateWithFlags(&backup, cudaStreamNonBlocking));
  CH ch(config(), stream);
  for (request_id id : {1, 2, 3}) REQUIRE(ch.admit(id, stream).admitted);
  ch.reserve_ahead(8, stream);  // pages cover rows [0, 64)
  step_buffers w;
  const auto good_slot = static_cast<std::int32_t>(ch.slot_of(1));
  const auto other = static_cast<std::int32_t>(ch.slot_of(2));
  struct bad_case {
    const char* what;
    std::int32_t slot;
    std::size_t rows;  // on source 1 only; source 0 of the same entry writes 1 row
    dh::errc code;
  };
  const std::array<bad_case, 3> cases{{
      {"slot without a request", 7, 1, dh::errc::unknown_request},
      {"row count above the view's max_rows", other, kMaxRows + 1, dh::errc::size_mismatch},
      {"rows past the reservation", other, 65, dh::errc::capacity_exceeded},
  }};
  std::int64_t good_rows = 0, other_rows0 = 0;
  for (const auto& c : cases) {
    INFO(c.what);
    w.clear();
    w.set(0, good_slot, 0, 1, request_tag(1), good_rows);
    w.set(0, good_slot, 1, 1, request_tag(1), good_rows);
    // (source 0, entry 3) is good only in the size_mismatch case (max_rows stays kMaxRows there,
    // so entry 3's buffer rows exist; with max_rows 100 they would lie past the buffers)
    const bool good0 = c.code == dh::errc::size_mismatch;
    w.set(3, c.slot, 0, good0 ? 1 : 0, request_tag(2), other_rows0);
    w.set(3, c.slot, 1, std::min<std::size_t>(c.rows, kMaxRows), request_tag(2), 0);
    w.h_rows[1 * N + 3] = static_cast<std::int32_t>(c.rows);
    w.upload(stream);
    dhc::kv_step_write_view v = w.view();
    if (c.code == dh::errc::capacity_exceeded) v.max_rows = 100;  // only the reservation stops it
    ch.append_step(v, backup, stream);
    // One check_errors takes every source's records: it throws the first (lowest source) and
    // names the others in its message. An unknown slot is bad on both sources, the other cases
    // on source 1 only.
    std::vector<std::string> thrown;
    for (std::size_t i = 0; i <= kSources; ++i) {
      try {
        ch.check_errors(stream);
        break;
      } catch (const dh::error& e) {
        INFO(e.what());
        REQUIRE(e.code() == c.code);
        thrown.emplace_back(e.what());
      }
    }
    REQUIRE(thrown.size() == 1);
    if (c.code == dh::errc::unknown_request) {
      const std::string& m = thrown[0];
      const auto more = m.find("1 more error record cleared by this check");
      REQUIRE(m.find("source 0") < more);
      REQUIRE(more != std::string::npos);
      REQUIRE(m.find("source 1", more) != std::string::npos);
    } else {
      REQUIRE(thrown[0].find("source 1") != std::string::npos);
      REQUIRE(thrown[0].find("more error record") == std::string::npos);
    }
    ch.check_errors(stream);  // every record is cleared
    ++good_rows;
    if (good0) ++other_rows0;
    ch.join_backup(stream);
    for (std::size_t s = 0; s < kSources; ++s) REQUIRE(ch.frontier(1, s) == good_rows);
    REQUIRE(ch.frontier(2, 0) == other_rows0);
    REQUIRE(ch.frontier(2, 1) == 0);  // the bad pair is untouched
    REQUIRE(ch.frontier(3, 0) == 0);
    for (std::size_t s = 0; s < kSources; ++s)
      REQUIRE(row_matches(ch.host_row(1, s, 0, good_rows - 1), request_tag(1), s, 0, good_rows - 1));
  }
  // Host checks of the view itself.
  dhc::kv_step_write_view bad = w.view();
  bad.capacity = N + 1;
  REQUIRE_THROWS_AS(ch.append_step(bad, backup, stream), dh::size_mismatch);
  bad = w.view();
  bad.row_stride = 576;  // below the widest row (656)
  REQUIRE_THROWS_AS(ch.append_step(bad, backup, stream), dh::size_mismatch);
  bad = w.view();
  bad.rows_pitch = N - 1;
  REQUIRE_THROWS_AS(ch.append_step(bad, backup, stream), dh::size_mismatch);
  bad = w.view();
  bad.layer_rows = nullptr;
  REQUIRE_THROWS_AS(ch.append_step(bad, backup, stream), dh::size_mismatch);
  ch.join_backup(stream);
  DHTEST_CUDA(cudaStreamDestroy(backup));
  DHTEST_CUDA(cudaStreamDestroy(stream));
}

TEST_CASE("step-wide commits equal the host twin; an unverified (source, entry) is reported", "[gpu][writes][step][speculative]") {
  require_device();
  constexpr std::size_t KB = 4;
  cudaStream_t stream = nullptr, backup = nullptr;
  DHTEST_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  DHTEST_CUDA(cudaStreamCreateWithFlags(&backup, cudaStreamNonBlocking));
  CH ch(step_config(KB), stream);
  HH hh(step_config(KB));
  std::map<request_id, std::uint64_t> tags;
  std::map<request_id, std::array<std::int64_t, 2>> positions;
  for (request_id id = 1; id <= 6; ++id) {
    REQUIRE(ch.admit(id, stream).slot == hh.admit(id).slot);
    tags[id] = request_tag(id, 5);
    positions[id] = {0, 0};
  }
  dhc::device_buffer<std::int32_t> d_slots(N), d_accepted(N);
  std::mt19937_64 rng(77);
  for (int round = 0; round < 100; ++round) {
    if (round % 4 == 0) {
      ch.reserve_ahead(4 * KB, stream);
      hh.reserve_ahead(4 * KB);
    }
    std::vector<std::int32_t> slots(N, -1), accepted(N, 0);
    std::vector<dh::step_commit_item> items;
    std::size_t e = 0;
    for (const auto& [id, tag] : tags) {
      const std::size_t at = e++;
      if (rng() % 5 == 0) continue;  // not committing this round
      const std::size_t count = 1 + rng() % KB, kr = 1 + rng() % count, acc = rng() % kr;
      for (std::size_t s = 0; s < kSources; ++s) {  // a round on every source: one accepted count
        const auto& d = Layout::sources[s];
        const auto rows =
            dhisparse_testing::make_append_buffer(tag, s, d.payload_layers, d.row_bytes, hh.frontier(id, s), count);
        ch.stage_block(id, s, rows, count, stream);
        hh.stage_block(id, s, rows, count);
        std::vector<dhc::verify_query> cq(kr);
        dhc::verify_batch_item ci{id, cq};
        ch.verify(s, std::span<const dhc::verify_batch_item>(&ci, 1), stream);
        std::vector<std::vector<row_index>> q(kr);
        std::vector<std::vector<location>> ql(kr);
        std::vector<std::span<const row_index>> qs(q.begin(), q.end());
        std::vector<std::span<location>> ls(ql.begin(), ql.end());
        const dh::verify_item hi{id, qs, ls};
        hh.verify(s, std::span<const dh::verify_item>(&hi, 1));
        items.push_back({id, s, acc});
        positions[id][s] += static_cast<std::int64_t>(acc) + 1;
      }
      slots[at] = static_cast<std::int32_t>(hh.slot_of(id));
      accepted[at] = static_cast<std::int32_t>(acc);
    }
    DHTEST_CUDA(cudaMemcpyAsync(d_slots.data(), slots.data(), N * 4, cudaMemcpyHostToDevice, stream));
    DHTEST_CUDA(cudaMemcpyAsync(d_accepted.data(), accepted.data(), N * 4, cudaMemcpyHostToDevice, stream));
    ch.commit_step(dhc::commit_step_view{d_slots.data(), d_accepted.data(), N}, round % 3 == 2 ? stream : backup,
                   stream);
    DHTEST_CUDA(cudaStreamSynchronize(stream));  // `slots` / `accepted` are pageable and go out of scope
    hh.commit_step(items);
    ch.check_errors(stream);
  }
  ch.join_backup(stream);
  ch.sync_books(stream);
  compare_books(ch, hh, tags, positions, "after step-wide commits");
  compare_pools(ch, hh, "after step-wide commits");

  // Request 1 verified on source 0 only: its source-1 pair fails, its source-0 pair commits.
  ch.reserve_ahead(8, stream);  // the last rounds may have used up the reservation
  const request_id a = 1;
  const auto rows = dhisparse_testing::make_append_buffer(tags[a], 0, 2, 576, hh.frontier(a, 0), 2);
  ch.stage_block(a, 0, rows, 2, stream);
  std::vector<dhc::verify_query> cq(2);
  dhc::verify_batch_item ci{a, cq};
  ch.verify(0, std::span<const dhc::verify_batch_item>(&ci, 1), stream);
  const std::array<std::int32_t, 1> s1{static_cast<std::int32_t>(ch.slot_of(a))};
  const std::array<std::int32_t, 1> a1{1};
  DHTEST_CUDA(cudaMemcpy(d_slots.data(), s1.data(), 4, cudaMemcpyHostToDevice));
  DHTEST_CUDA(cudaMemcpy(d_accepted.data(), a1.data(), 4, cudaMemcpyHostToDevice));
  const auto before0 = ch.positions(a, 0), before1 = ch.positions(a, 1);
  ch.commit_step(dhc::commit_step_view{d_slots.data(), d_accepted.data(), 1}, backup, stream);
  bool thrown = false;
  try {
    ch.check_errors(stream);
  } catch (const dh::error& e) {
    thrown = true;
    INFO(e.what());
    REQUIRE(e.code() == dh::errc::commit_without_verify);
  }
  REQUIRE(thrown);
  ch.join_backup(stream);
  REQUIRE(ch.positions(a, 0) == before0 + 2);
  REQUIRE(ch.positions(a, 1) == before1);
  for (std::int64_t r = before0; r < before0 + 2; ++r)
    for (std::size_t l = 0; l < 2; ++l) REQUIRE(row_matches(ch.host_row(a, 0, l, r), tags[a], 0, l, r));
  DHTEST_CUDA(cudaStreamDestroy(backup));
  DHTEST_CUDA(cudaStreamDestroy(stream));
}

TEST_CASE("the CUDA manager's append_step fills completed pages under a pinning policy, after the backup",
          "[gpu][writes][step][residency]") {
  require_device();
  cudaStream_t stream = nullptr, backup = nullptr;
  DHTEST_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  DHTEST_CUDA(cudaStreamCreateWithFlags(&backup, cudaStreamNonBlocking));
  {  // the manager synchronises its step stream when it is destroyed: it goes before the streams
    dh::hierarchy_config c = config();
    c.max_rows = 256;  // 4 pinned pages a request and source
    c.optional_pages = 16;
    dhc::residency_manager<CH, dh::resident_policy> m(c, {1, 1}, stream);
    const std::array<request_id, 2> ids{1, 2};
    for (request_id id : ids) REQUIRE(m.admit(id));
    m.reserve_ahead(c.max_rows);
    step_buffers w;
    std::array<std::int64_t, 2> f{0, 0};  // the same on both sources
    for (int step = 0; step < 40; ++step) {  // 4 rows a step: page 0 completes at step 15, page 1 at 31
      w.clear();
      for (std::size_t e = 0; e < ids.size(); ++e)
        for (std::size_t s = 0; s < kSources; ++s)
          w.set(e, static_cast<std::int32_t>(m.hierarchy().slot_of(ids[e])), s, kMaxRows, request_tag(ids[e], 9), f[e]);
      w.upload(stream);
      m.append_step(w.view(), backup);  // the fills read host rows the backup wrote: joined first
      for (auto& x : f) x += static_cast<std::int64_t>(kMaxRows);
    }
    m.drain();
    REQUIRE(m.audit().empty());
    const auto& h = m.hierarchy();
    for (std::size_t e = 0; e < ids.size(); ++e)
      for (std::size_t s = 0; s < kSources; ++s) {
        REQUIRE(h.frontier(ids[e], s) == f[e]);
        const auto map = h.optional_map_of(ids[e], s);
        const std::size_t rb = Layout::sources[s].row_bytes;
        for (std::size_t l = 0; l < Layout::sources[s].payload_layers; ++l) {
          std::vector<std::byte> pool(h.pool_rows() * rb);
          h.copy_pool(s, l, pool);
          for (std::size_t page = 0; page < static_cast<std::size_t>(f[e]) / Layout::page_rows; ++page) {
            INFO("request " << ids[e] << " source " << s << " layer " << l << " page " << page);
            REQUIRE(map[page] >= 0);  // every complete page is mapped, as append maps it
            for (std::size_t i = 0; i < Layout::page_rows; ++i) {
              const auto r = static_cast<std::int64_t>(page * Layout::page_rows + i);
              const location loc = h.space().optional(static_cast<std::size_t>(map[page]), r);
              REQUIRE(row_matches(std::span<const std::byte>(pool.data() + static_cast<std::size_t>(loc) * rb, rb),
                                  request_tag(ids[e], 9), s, l, r));
            }
          }
        }
      }
  }
  DHTEST_CUDA(cudaStreamDestroy(backup));
  DHTEST_CUDA(cudaStreamDestroy(stream));
}

// ------------------------------------------------------------------------------------------------
// Batched speculative stages (stage_view / stage_step_view: one launch, slots and counts read on
// the device) against the host twin's stage_blocks / stage_step, followed by verifies and commits
// on both, eager and batched, so that the host books are seen to follow the device's.

namespace {

/// A stage_view over write_buffers (entry e's block at buffer rows e * kMaxRows ..; m = 1, so the
/// buffer's row count is the block's position count).
dhc::stage_view stage_view_of(const write_buffers& b) {
  dhc::stage_view v;
  v.slots = b.slots.data();
  v.counts = b.rows.data();
  v.layer_rows = b.layer_ptrs.data();
  v.max_block = kMaxRows;
  v.capacity = N;
  return v;
}

/// An eager verify of `kr` empty queries on both backends: the round's K_r is what a commit checks.
void verify_both(CH& ch, HH& hh, request_id id, std::size_t s, std::size_t kr, cudaStream_t stream) {
  std::vector<dhc::verify_query> cq(kr);
  dhc::verify_batch_item ci{id, cq};
  ch.verify(s, std::span<const dhc::verify_batch_item>(&ci, 1), stream);
  std::vector<std::vector<row_index>> q(kr);
  std::vector<std::vector<location>> ql(kr);
  std::vector<std::span<const row_index>> qs(q.begin(), q.end());
  std::vector<std::span<location>> ls(ql.begin(), ql.end());
  const dh::verify_item hi{id, qs, ls};
  hh.verify(s, std::span<const dh::verify_item>(&hi, 1));
}

/// Throws-check of one batched launch's device error.
template <class F>
void require_device_error(CH& ch, cudaStream_t stream, dh::errc code, F&& launch) {
  launch();
  bool thrown = false;
  try {
    ch.check_errors(stream);
  } catch (const dh::error& e) {
    thrown = true;
    INFO(e.what());
    REQUIRE(e.code() == code);
  }
  REQUIRE(thrown);
}

}  // namespace

TEST_CASE("batched stages equal the host twin; verifies and commits follow the device's books",
          "[gpu][writes][speculative][stage]") {
  require_device();
  constexpr std::size_t KB = kMaxRows;  // one write_buffers entry holds one block
  cudaStream_t stream = nullptr;
  DHTEST_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CH ch(config(KB), stream);
  HH hh(config(KB));
  std::map<request_id, std::uint64_t> tags;
  std::map<request_id, std::array<std::int64_t, 2>> positions;
  for (request_id id = 1; id <= 6; ++id) {
    REQUIRE(ch.admit(id, stream).slot == hh.admit(id).slot);
    tags[id] = request_tag(id, 7);
    positions[id] = {0, 0};
  }
  std::vector<write_buffers> bufs;
  bufs.emplace_back(2, 576);
  bufs.emplace_back(1, 656);
  dhc::device_buffer<std::int32_t> d_slots(N), d_accepted(N);
  std::mt19937_64 rng(4242);
  for (int round = 0; round < 120; ++round) {
    INFO("round " << round);
    if (round % 4 == 0) {
      ch.reserve_ahead(4 * KB, stream);
      hh.reserve_ahead(4 * KB);
    }
    for (std::size_t s = 0; s < 2; ++s) {
      auto& b = bufs[s];
      b.clear();
      std::vector<std::vector<std::byte>> rows;
      std::vector<dh::stage_item> items;
      std::vector<std::pair<request_id, std::size_t>> staged;  // (request, count) staged this round
      std::size_t e = 0;
      for (const auto& [id, tag] : tags) {
        const std::size_t at = e++;
        if (rng() % 5 == 0) continue;  // not staging: an older block may stay staged
        const std::size_t count = 1 + rng() % KB;
        b.set(at, static_cast<std::int32_t>(hh.slot_of(id)), count, tag, s, hh.frontier(id, s));
        rows.push_back(b.item_rows(at));
        staged.emplace_back(id, count);
      }
      for (std::size_t i = 0; i < staged.size(); ++i) items.push_back({staged[i].first, rows[i], staged[i].second});
      b.upload(stream);
      ch.stage_blocks(s, stage_view_of(b), stream);
      hh.stage_blocks(s, items);
      for (const auto& [id, tag] : tags) REQUIRE(ch.staged_rows(id, s) == hh.staged_rows(id, s));  // device books

      // Verify most staged rounds eagerly (the eager verify absorbs the device's staged counts).
      std::vector<std::pair<request_id, std::size_t>> verified;  // (request, K_r)
      for (const auto& [id, count] : staged) {
        if (rng() % 5 == 0) continue;
        const std::size_t kr = 1 + rng() % count;
        verify_both(ch, hh, id, s, kr, stream);
        verified.emplace_back(id, kr);
      }
      for (const auto& [id, tag] : tags) REQUIRE(ch.verified_queries(id, s) == hh.verified_queries(id, s));

      // Commit: batched over a commit_view on even rounds, per request (eager, reading the
      // device's round books) on odd ones.
      std::vector<std::int32_t> slots(N, -1), accepted(N, 0);
      std::vector<dh::commit_item> commits;
      std::size_t at = 0;
      for (const auto& [id, kr] : verified) {
        if (rng() % 6 == 0) continue;  // verified, not committed: the next stage replaces it
        const std::size_t acc = rng() % kr;
        slots[at] = static_cast<std::int32_t>(hh.slot_of(id));
        accepted[at++] = static_cast<std::int32_t>(acc);
        commits.push_back({id, acc});
        positions[id][s] += static_cast<std::int64_t>(acc) + 1;
      }
      if (round % 2 == 0) {
        DHTEST_CUDA(cudaMemcpyAsync(d_slots.data(), slots.data(), N * 4, cudaMemcpyHostToDevice, stream));
        DHTEST_CUDA(cudaMemcpyAsync(d_accepted.data(), accepted.data(), N * 4, cudaMemcpyHostToDevice, stream));
        ch.commit(s, dhc::commit_view{d_slots.data(), d_accepted.data(), N}, stream);
        DHTEST_CUDA(cudaStreamSynchronize(stream));  // `slots` / `accepted` are pageable
      } else {
        for (const auto& c : commits) ch.commit(c.request, s, c.accepted, stream);
      }
      hh.commit(s, commits);
    }
    ch.check_errors(stream);
    if (round % 30 == 29) {
      ch.sync_books(stream);
      compare_books(ch, hh, tags, positions, "after batched stages");
      compare_pools(ch, hh, "after batched stages");  // the ring rows of blocks still staged included
    }
  }

  // Bad entries: each launch holds a good entry (request 1) and one bad one. The bad entry is left
  // untouched, the good one is staged, and check_errors throws the bad one's typed error.
  ch.reserve_ahead(8, stream);
  hh.reserve_ahead(8);
  const request_id a = 1, full = 6;
  {  // request 6 is 2 rows short of max_rows on source 1
    const std::int64_t f = hh.frontier(full, 1);
    const auto n = static_cast<std::size_t>(2048 - 2 - f);
    const auto rows = dhisparse_testing::make_append_buffer(tags[full], 1, 1, 656, f, n);
    ch.append(full, 1, rows, n, stream);
    hh.append(full, 1, rows, n);
  }
  auto& b = bufs[1];
  const std::int32_t slot_a = static_cast<std::int32_t>(hh.slot_of(a)), slot_full = static_cast<std::int32_t>(hh.slot_of(full));
  std::map<std::int32_t, request_id> id_of_slot;
  for (const auto& [id, tag] : tags) id_of_slot[static_cast<std::int32_t>(hh.slot_of(id))] = id;
  std::int32_t free_slot = 0;  // a slot that holds no request (6 requests, N = 8 slots)
  while (id_of_slot.count(free_slot) != 0) ++free_slot;
  struct bad_case {
    std::int32_t slot;
    std::size_t count;  // block positions (buffer rows filled: min(count, kMaxRows))
    dh::errc code;
  };
  for (const bad_case& bc : {bad_case{free_slot, 2, dh::errc::unknown_request}, bad_case{slot_a, 2, dh::errc::duplicate_in_batch},
                             bad_case{static_cast<std::int32_t>(hh.slot_of(2)), 0, dh::errc::size_mismatch},
                             bad_case{static_cast<std::int32_t>(hh.slot_of(3)), KB + 1, dh::errc::block_too_wide},
                             bad_case{slot_full, 3, dh::errc::capacity_exceeded}}) {
    INFO("bad entry code " << static_cast<int>(bc.code));
    b.clear();
    const std::size_t good = 1 + rng() % KB;
    b.set(0, slot_a, good, tags[a], 1, hh.frontier(a, 1));
    const auto good_rows = b.item_rows(0);
    b.set(1, bc.slot, bc.count, request_tag(99), 1, 0);  // bytes that must not land anywhere
    b.upload(stream);
    const request_id bad_id = bc.slot == free_slot ? 0 : id_of_slot.at(bc.slot);
    const std::size_t staged_before = bad_id == 0 ? 0 : hh.staged_rows(bad_id, 1);
    require_device_error(ch, stream, bc.code, [&] { ch.stage_blocks(1, stage_view_of(b), stream); });
    hh.stage_blocks(1, std::vector<dh::stage_item>{{a, good_rows, good}});
    REQUIRE(ch.staged_rows(a, 1) == good);
    if (bad_id != 0 && bad_id != a) REQUIRE(ch.staged_rows(bad_id, 1) == staged_before);
    compare_pools(ch, hh, "after a stage with a bad entry");
  }
  // Checked on the host at the call, nothing launched.
  {
    dhc::stage_view v = stage_view_of(b);
    v.max_block = KB + 1;
    REQUIRE_THROWS_AS(ch.stage_blocks(1, v, stream), dh::size_mismatch);
    v = stage_view_of(b);
    v.counts = nullptr;
    REQUIRE_THROWS_AS(ch.stage_blocks(1, v, stream), dh::size_mismatch);
    v = stage_view_of(b);
    v.capacity = N + 1;
    REQUIRE_THROWS_AS(ch.stage_blocks(1, v, stream), dh::size_mismatch);
    REQUIRE_THROWS_AS(ch.stage_blocks(2, stage_view_of(b), stream), dh::invalid_source);
  }
  // The round staged in the loop above still verifies and commits on both.
  verify_both(ch, hh, a, 1, 1, stream);
  ch.commit(a, 1, 0, stream);
  hh.commit(a, 1, 0);
  ch.check_errors(stream);
  ch.sync_books(stream);
  compare_pools(ch, hh, "after the last commit");
  for (const auto& [id, tag] : tags)
    for (std::size_t s = 0; s < 2; ++s) {
      REQUIRE(ch.positions(id, s) == hh.positions(id, s));
      REQUIRE(ch.staged_rows(id, s) == hh.staged_rows(id, s));
    }
  DHTEST_CUDA(cudaStreamDestroy(stream));
}

TEST_CASE("a step-wide stage equals the host twin's stage_step; commit_step follows", "[gpu][writes][step][speculative][stage]") {
  require_device();
  constexpr std::size_t KB = kMaxRows;
  cudaStream_t stream = nullptr, backup = nullptr;
  DHTEST_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  DHTEST_CUDA(cudaStreamCreateWithFlags(&backup, cudaStreamNonBlocking));
  CH ch(step_config(KB), stream);
  HH hh(step_config(KB));
  std::map<request_id, std::uint64_t> tags;
  std::map<request_id, std::array<std::int64_t, 2>> positions;
  for (request_id id = 1; id <= 6; ++id) {
    REQUIRE(ch.admit(id, stream).slot == hh.admit(id).slot);
    tags[id] = request_tag(id, 8);
    positions[id] = {0, 0};
  }
  step_buffers b;
  dhc::device_buffer<std::int32_t> d_slots(N), d_accepted(N);
  std::mt19937_64 rng(31337);
  for (int round = 0; round < 80; ++round) {
    INFO("round " << round);
    if (round % 4 == 0) {
      ch.reserve_ahead(4 * KB, stream);
      hh.reserve_ahead(4 * KB);
    }
    b.clear();
    std::vector<std::vector<std::byte>> rows;
    std::vector<std::tuple<request_id, std::size_t, std::size_t>> staged;  // (request, entry, count)
    std::size_t e = 0;
    for (const auto& [id, tag] : tags) {
      const std::size_t at = e++;
      if (rng() % 5 == 0) continue;
      const std::size_t count = 1 + rng() % KB;  // the same block on every source (m = 1: rows = count)
      for (std::size_t s = 0; s < kSources; ++s)
        b.set(at, static_cast<std::int32_t>(hh.slot_of(id)), s, count, tag, hh.frontier(id, s));
      staged.emplace_back(id, at, count);
    }
    std::vector<dh::step_stage_item> items;
    for (const auto& [id, at, count] : staged)
      for (std::size_t s = 0; s < kSources; ++s) rows.push_back(b.item_rows(s, at));
    std::size_t r = 0;
    for (const auto& [id, at, count] : staged)
      for (std::size_t s = 0; s < kSources; ++s) items.push_back({id, s, rows[r++], count});
    b.upload(stream);
    dhc::stage_step_view v;
    v.slots = b.slots.data();
    v.counts = b.rows.data();  // [source 0][entry]: the entry's count, equal on every source
    v.layer_rows = b.layer_ptrs.data();
    v.max_block = KB;
    v.capacity = N;
    ch.stage_step(v, stream);
    hh.stage_step(items);
    std::vector<std::int32_t> slots(N, -1), accepted(N, 0);
    std::vector<dh::step_commit_item> commits;
    for (const auto& [id, at, count] : staged) {
      if (rng() % 4 == 0) continue;
      const std::size_t kr = 1 + rng() % count, acc = rng() % kr;
      for (std::size_t s = 0; s < kSources; ++s) {
        verify_both(ch, hh, id, s, kr, stream);
        commits.push_back({id, s, acc});
        positions[id][s] += static_cast<std::int64_t>(acc) + 1;
      }
      slots[at] = static_cast<std::int32_t>(hh.slot_of(id));
      accepted[at] = static_cast<std::int32_t>(acc);
    }
    DHTEST_CUDA(cudaMemcpyAsync(d_slots.data(), slots.data(), N * 4, cudaMemcpyHostToDevice, stream));
    DHTEST_CUDA(cudaMemcpyAsync(d_accepted.data(), accepted.data(), N * 4, cudaMemcpyHostToDevice, stream));
    ch.commit_step(dhc::commit_step_view{d_slots.data(), d_accepted.data(), N}, backup, stream);
    DHTEST_CUDA(cudaStreamSynchronize(stream));
    hh.commit_step(commits);
    ch.check_errors(stream);
    if (round % 20 == 19) {
      ch.join_backup(stream);
      ch.sync_books(stream);
      compare_books(ch, hh, tags, positions, "after step-wide stages");
      compare_pools(ch, hh, "after step-wide stages");
      for (const auto& [id, tag] : tags)
        for (std::size_t s = 0; s < kSources; ++s) REQUIRE(ch.staged_rows(id, s) == hh.staged_rows(id, s));
    }
  }
  ch.join_backup(stream);
  DHTEST_CUDA(cudaStreamDestroy(backup));
  DHTEST_CUDA(cudaStreamDestroy(stream));
}
