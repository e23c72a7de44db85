// One host store shared by the tensor-parallel ranks of a host, CUDA backend (docs/multi-gpu.md).
//
// N = 2 and 4 CUDA hierarchies, one per rank, over one `cuda::pinned_shared_host_store`, beside N
// `host_hierarchy` ranks over a host `shared_host_store`, all driven in lockstep with the same calls
// (ranks in a random order, so owners are sometimes last): admissions, re-admissions of completed
// ids (a rank that completed first waits), appends (decode rows and chunks longer than the tail),
// step-wide writes with reservations (backup on its own stream, or inline), optional pages,
// resolves with fresh selections that miss to the host store, completions. The engine's ordering
// (docs/multi-gpu.md, "Ordering on the CUDA backend") is a barrier after every write: each rank
// joins its backup and synchronises its stream before any rank resolves.
//
// Expected values come from the test's own model: row bytes are a function of (request tag,
// source, layer, row) (support/row_content.hpp); the pages each history holds and the owner of
// each page (history page p: rank p mod N) are counted here. Checked after every operation: each
// CUDA rank's locations and hot rows equal its host rank's; every resolved location holds the exact
// bytes in every payload layer; both stores hold the model's pages (1/N of N private stores) and
// map every history page to the same host page, held by every rank; every stored row's host copy
// is exact; each rank wrote exactly the rows of the pages it owns; pages return to the store after
// the last rank completes.
//
// One GPU: every rank on device 0, each with its own streams. Two GPUs or more (skipped
// otherwise): rank r on device r.
#include "cuda_test_support.cuh"

#include <memory>

#include "../support/row_content.hpp"
#include "../support/shared_store_model.hpp"
#include "dhisparse/cuda/shared_host_store.cuh"
#include "dhisparse/host/shared_host_store.hpp"

namespace {

using namespace dhtest;
namespace rc = dhisparse_testing;
using namespace shared_store_model;
constexpr std::size_t kMaxStep = 4;
using Hot = dh::lru_hot_cache<kB>;
using HH = dh::host_hierarchy<L, Hot>;
using CH = dhc::hierarchy<L, Hot>;
constexpr std::size_t kSources = HH::sources;
constexpr std::size_t K = L::top_k;
constexpr std::size_t kStepLayers = CH::step_layers;


std::size_t pages_for(std::int64_t rows) { return (static_cast<std::size_t>(rows) + kP - 1) / kP; }

int use_device(int d) {
  DHTEST_CUDA(cudaSetDevice(d));
  return d;
}

/// One CUDA rank: its hierarchy on its device, its streams and its device buffers (created with
/// the rank's device current: `device` is initialised first).
struct gpu_rank {
  int device;
  cudaStream_t stream = nullptr, backup = nullptr;
  std::unique_ptr<CH> h;
  dhc::device_buffer<row_index> sel{kSlots * K};
  dhc::device_buffer<location> loc{kSlots * K};
  dhc::device_buffer<std::int32_t> step_slots{kSlots}, step_rows{kSources * kSlots};
  std::vector<dhc::device_buffer<std::byte>> step_layer;
  dhc::device_buffer<const std::byte*> step_layer_ptrs{kStepLayers};

  gpu_rank(int d, dh::shared_host_store<L>& store, std::size_t rank) : device(use_device(d)) {
    DHTEST_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    DHTEST_CUDA(cudaStreamCreateWithFlags(&backup, cudaStreamNonBlocking));
    h = std::make_unique<CH>(config(), store, rank, stream);
    REQUIRE(h->device() == d);
    REQUIRE(h->shares_host_store());
    REQUIRE(h->rank() == rank);
    std::vector<const std::byte*> ptrs(kStepLayers);
    for (std::size_t s = 0; s < kSources; ++s)
      for (std::size_t l = 0; l < layers(s); ++l) {
        step_layer.emplace_back(kSlots * kMaxStep * row_bytes(s));
        ptrs[CH::step_layer_index(s, l)] = step_layer.back().data();
      }
    DHTEST_CUDA(cudaMemcpy(step_layer_ptrs.data(), ptrs.data(), kStepLayers * sizeof(void*), cudaMemcpyHostToDevice));
  }
  gpu_rank(const gpu_rank&) = delete;
  gpu_rank& operator=(const gpu_rank&) = delete;
  ~gpu_rank() {
    h.reset();  // waits for its device before its memory goes
    cudaSetDevice(device);
    cudaStreamDestroy(backup);
    cudaStreamDestroy(stream);
  }
  /// The engine's barrier after a step's writes: the rank's host backup joined, its books absorbed,
  /// its stream idle (so every host row it owns is written before any rank's next launch).
  void barrier() {
    h->join_backup(stream);
    h->sync_books(stream);
    wait_or_die(stream, "rank barrier");
  }
};

/// What the test knows of one admitted request (the same on every rank).
struct model_request {
  std::uint64_t tag = 0;
  std::array<std::int64_t, kSources> rows{};  // stored rows
  std::array<std::size_t, kSources> pages{};  // history pages holding host pages (stored or reserved)
};

struct cluster {
  std::size_t n;
  dh::shared_host_store<L> host_store;
  dhc::pinned_shared_host_store<L> dev_store;
  std::vector<std::unique_ptr<HH>> host;
  std::vector<std::unique_ptr<gpu_rank>> gpu;  // after the stores: destroyed first
  std::map<request_id, model_request> live;
  std::map<request_id, std::uint64_t> generation;
  std::vector<std::uint64_t> rows_owned;  // per rank: stored rows of pages it owns, every incarnation
  std::mt19937_64 rng;
  std::size_t resolves = 0, host_reads = 0;

  cluster(std::size_t ranks, const std::vector<int>& devices, std::uint64_t seed)
      : n(ranks), host_store(ranks, kHostPages), dev_store(ranks, kHostPages), rows_owned(ranks, 0), rng(seed) {
    for (std::size_t k = 0; k < n; ++k) {
      host.push_back(std::make_unique<HH>(config(), host_store, k));
      gpu.push_back(std::make_unique<gpu_rank>(devices[k], dev_store, k));
    }
    use_device(devices[0]);
  }

  std::vector<std::size_t> order() {
    std::vector<std::size_t> o(n);
    for (std::size_t k = 0; k < n; ++k) o[k] = k;
    std::shuffle(o.begin(), o.end(), rng);
    return o;
  }
  void barrier() {
    for (auto& g : gpu) g->barrier();
  }

  bool admit(request_id id) {
    std::optional<bool> admitted;
    for (std::size_t k : order()) {
      const auto a = host[k]->admit(id);
      const auto b = gpu[k]->h->admit(id, gpu[k]->stream);
      INFO("admit " << id << " on rank " << k);
      REQUIRE(a.admitted == b.admitted);
      if (a.admitted) REQUIRE(a.slot == b.slot);
      if (admitted) REQUIRE(*admitted == a.admitted);
      admitted = a.admitted;
    }
    if (!*admitted) return false;
    live[id].tag = rc::request_tag(static_cast<std::uint64_t>(id), generation[id]++);
    return true;
  }
  /// Completes `id` rank by rank: its pages stay until the last rank, a rank that completed waits
  /// to admit the id again, and the id's pages return to both stores with the last rank.
  void complete(request_id id) {
    const auto o = order();
    const std::size_t held = dev_store.host_bytes_in_use();
    for (std::size_t i = 0; i < o.size(); ++i) {
      const std::size_t k = o[i];
      host[k]->complete(id);
      gpu[k]->h->complete(id, gpu[k]->stream);
      if (i + 1 == o.size()) break;
      INFO("rank " << k << " completed " << id << " first");
      REQUIRE(dev_store.host_bytes_in_use() == held);
      REQUIRE((dev_store.attached_ranks(id) >> k & 1u) == 0);
      REQUIRE(dev_store.attached_ranks(id) == host_store.attached_ranks(id));
      if (i == 0) {  // the earlier history is still held: admission waits, nothing changes
        REQUIRE_FALSE(host[k]->admit(id).admitted);
        REQUIRE_FALSE(gpu[k]->h->admit(id, gpu[k]->stream).admitted);
        REQUIRE_FALSE(gpu[k]->h->contains(id));
      }
    }
    live.erase(id);
    REQUIRE(dev_store.attached_ranks(id) == 0);
    REQUIRE(host_store.attached_ranks(id) == 0);
  }
  void count_written(std::int64_t from, std::int64_t to) {
    for (std::int64_t r = from; r < to; ++r) ++rows_owned[dh::detail::page_owner(static_cast<std::uint64_t>(r) / kP, n)];
  }
  void append(request_id id, std::size_t s, std::size_t count) {
    auto& m = live.at(id);
    const auto buf = rc::make_append_buffer(m.tag, s, layers(s), row_bytes(s), m.rows[s], count);
    for (std::size_t k : order()) {
      host[k]->append(id, s, buf, count);
      gpu[k]->h->append(id, s, std::span<const std::byte>(buf), count, gpu[k]->stream);
    }
    barrier();
    count_written(m.rows[s], m.rows[s] + static_cast<std::int64_t>(count));
    m.rows[s] += static_cast<std::int64_t>(count);
    m.pages[s] = std::max(m.pages[s], pages_for(m.rows[s]));
  }
  /// A step-wide write of up to `count` rows to every live request and source, within reservations:
  /// `append_step` on every CUDA rank (backup on its own stream unless `inline_host`), the host
  /// ranks' `append_step` with the same rows.
  void append_step(std::size_t count, bool inline_host) {
    for (std::size_t k : order()) {
      host[k]->reserve_ahead(count);
      gpu[k]->h->reserve_ahead(count, gpu[k]->stream);
    }
    for (auto& [id, m] : live)
      for (std::size_t s = 0; s < kSources; ++s)
        m.pages[s] = std::max(m.pages[s], pages_for(std::min<std::int64_t>(kRows, m.rows[s] + static_cast<std::int64_t>(count))));
    std::vector<std::int32_t> h_slots(kSlots, -1), h_rows(kSources * kSlots, 0);
    std::vector<std::vector<std::byte>> h_layer(kStepLayers);
    for (std::size_t s = 0; s < kSources; ++s)
      for (std::size_t l = 0; l < layers(s); ++l) h_layer[CH::step_layer_index(s, l)].assign(kSlots * kMaxStep * row_bytes(s), std::byte{0});
    std::vector<std::vector<std::byte>> bufs;
    std::vector<dh::step_write_item> items;
    bufs.reserve(live.size() * kSources);
    std::size_t e = 0;
    for (auto& [id, m] : live) {
      h_slots[e] = static_cast<std::int32_t>(host[0]->slot_of(id));
      for (std::size_t s = 0; s < kSources; ++s) {
        const auto room = static_cast<std::size_t>(static_cast<std::int64_t>(kRows) - m.rows[s]);
        const std::size_t c = std::min(count, room);
        h_rows[s * kSlots + e] = static_cast<std::int32_t>(c);
        for (std::size_t l = 0; l < layers(s); ++l)
          for (std::size_t i = 0; i < c; ++i)
            rc::fill_row(h_layer[CH::step_layer_index(s, l)].data() + (e * kMaxStep + i) * row_bytes(s), row_bytes(s),
                         m.tag, s, l, m.rows[s] + static_cast<std::int64_t>(i));
        if (c == 0) continue;
        bufs.push_back(rc::make_append_buffer(m.tag, s, layers(s), row_bytes(s), m.rows[s], c));
        items.push_back({id, s, bufs.back(), c});
      }
      ++e;
    }
    for (std::size_t k : order()) {
      auto& g = *gpu[k];
      use_device(g.device);
      DHTEST_CUDA(cudaMemcpyAsync(g.step_slots.data(), h_slots.data(), kSlots * 4, cudaMemcpyHostToDevice, g.stream));
      DHTEST_CUDA(cudaMemcpyAsync(g.step_rows.data(), h_rows.data(), h_rows.size() * 4, cudaMemcpyHostToDevice, g.stream));
      for (std::size_t i = 0; i < kStepLayers; ++i)
        DHTEST_CUDA(cudaMemcpyAsync(g.step_layer[i].data(), h_layer[i].data(), h_layer[i].size(), cudaMemcpyHostToDevice,
                                    g.stream));
      DHTEST_CUDA(cudaStreamSynchronize(g.stream));  // the host vectors are pageable and shared by the ranks
      dhc::kv_step_write_view v;
      v.slots = g.step_slots.data();
      v.rows = g.step_rows.data();
      v.rows_pitch = kSlots;
      v.layer_rows = g.step_layer_ptrs.data();
      v.max_rows = kMaxStep;
      v.capacity = kSlots;
      g.h->append_step(v, inline_host ? g.stream : g.backup, g.stream);
      REQUIRE(g.h->backup_pending() == !inline_host);
      g.h->check_errors(g.stream);
      host[k]->append_step(items);
    }
    barrier();
    for (const auto& it : items) {
      auto& m = live.at(it.request);
      count_written(m.rows[it.source], m.rows[it.source] + static_cast<std::int64_t>(it.count));
      m.rows[it.source] += static_cast<std::int64_t>(it.count);
    }
  }
  void map_page(request_id id, std::size_t s, std::size_t page) {
    std::optional<bool> mapped;
    for (std::size_t k : order()) {
      const bool a = host[k]->map_optional_page(id, s, page);
      const bool b = gpu[k]->h->map_optional_page(id, s, page, gpu[k]->stream);
      INFO("map page " << page << " of " << id << " source " << s << " on rank " << k);
      REQUIRE(a == b);
      if (mapped) REQUIRE(*mapped == a);
      mapped = a;
    }
    barrier();
  }

  std::vector<row_index> random_selection(std::int64_t rows) {
    std::vector<row_index> sel(std::uniform_int_distribution<std::size_t>(1, K)(rng));
    for (auto& e : sel) {
      const bool pad = rows == 0 || rng() % 8 == 0;
      e = pad ? dh::no_row : static_cast<row_index>(rng() % static_cast<std::uint64_t>(rows));
    }
    return sel;
  }
  /// A fresh selection per live request and source, resolved on every host rank and CUDA rank.
  void resolve_all(const std::string& ctx) {
    for (std::size_t s = 0; s < kSources; ++s) {
      std::vector<request_id> ids;
      std::vector<std::vector<row_index>> sels;
      for (const auto& [id, m] : live) {
        ids.push_back(id);
        sels.push_back(random_selection(m.rows[s]));
        for (row_index r : sels.back())
          host_reads += r != dh::no_row && r < m.rows[s] - static_cast<std::int64_t>(kT) ? 1 : 0;
      }
      if (ids.empty()) return;
      for (std::size_t k : order()) resolve_rank(k, s, ids, sels, ctx);
      ++resolves;
    }
  }
  void resolve_rank(std::size_t k, std::size_t s, const std::vector<request_id>& ids,
                    const std::vector<std::vector<row_index>>& sels, const std::string& ctx) {
    auto& g = *gpu[k];
    use_device(g.device);
    std::vector<std::vector<location>> want(ids.size());
    std::vector<row_index> staged(kSlots * K, dh::no_row);
    std::vector<CH::batch_item> items(ids.size());
    for (std::size_t e = 0; e < ids.size(); ++e) {
      want[e].assign(sels[e].size(), 0x7A7A7A7A);
      host[k]->resolve(ids[e], s, sels[e], want[e]);
      std::copy(sels[e].begin(), sels[e].end(), staged.begin() + static_cast<long>(e * K));
      items[e] = {ids[e], g.sel.data() + e * K, static_cast<std::int32_t>(sels[e].size()), g.loc.data() + e * K};
    }
    DHTEST_CUDA(cudaMemcpy(g.sel.data(), staged.data(), staged.size() * sizeof(row_index), cudaMemcpyHostToDevice));
    DHTEST_CUDA(cudaMemset(g.loc.data(), 0x7A, g.loc.bytes()));
    g.h->resolve(s, std::span<const CH::batch_item>(items), g.stream);
    wait_or_die(g.stream, ctx + ": resolve");
    g.h->check_errors(g.stream);
    std::vector<location> got(kSlots * K);
    DHTEST_CUDA(cudaMemcpy(got.data(), g.loc.data(), got.size() * sizeof(location), cudaMemcpyDeviceToHost));
    std::vector<std::vector<std::byte>> pool(layers(s));
    for (std::size_t l = 0; l < layers(s); ++l) {
      pool[l].resize(g.h->pool_rows() * row_bytes(s));
      g.h->copy_pool(s, l, pool[l]);
    }
    for (std::size_t e = 0; e < ids.size(); ++e) {
      INFO(ctx << ": rank " << k << " (device " << g.device << ") source " << s << " request " << ids[e] << " frontier "
               << live.at(ids[e]).rows[s]);
      const std::span<const location> mine(got.data() + e * K, sels[e].size());
      DHTEST_REQUIRE_SAME(location, "locations", std::span<const location>(want[e]), mine);
      for (std::size_t i = 0; i < sels[e].size(); ++i) {
        if (sels[e][i] == dh::no_row) continue;
        for (std::size_t l = 0; l < layers(s); ++l) {
          const std::span<const std::byte> bytes(pool[l].data() + static_cast<std::size_t>(mine[i]) * row_bytes(s),
                                                 row_bytes(s));
          INFO("selection entry " << i << ": " << rc::describe_row_mismatch(bytes, live.at(ids[e]).tag, s, l, sels[e][i]));
          REQUIRE(rc::row_matches(bytes, live.at(ids[e]).tag, s, l, sels[e][i]));
        }
      }
      const auto hr = host[k]->hot_rows_of(ids[e], s);
      const auto dr = g.h->hot_rows_of(ids[e], s);
      DHTEST_REQUIRE_SAME(row_index, "hot rows", hr, dr);
    }
  }

  /// The stores, the page maps and the host copies against the model.
  void check(const std::string& ctx) {
    INFO(ctx);
    barrier();  // every rank's batched writes absorbed: the stores' books are complete
    std::size_t bytes = 0;
    for (const auto& [id, m] : live)
      for (std::size_t s = 0; s < kSources; ++s) bytes += m.pages[s] * page_bytes(s);
    REQUIRE(dev_store.host_bytes_in_use() == bytes);  // one copy: 1/N of N private stores
    REQUIRE(host_store.host_bytes_in_use() == bytes);
    for (std::size_t k = 0; k < n; ++k) {
      INFO("rank " << k);
      REQUIRE(gpu[k]->h->host_bytes_in_use() == bytes);
      REQUIRE(dev_store.rows_written(k) == rows_owned[k]);  // the owner rule, no row twice
      REQUIRE(host_store.rows_written(k) == rows_owned[k]);
      for (std::size_t s = 0; s < kSources; ++s) REQUIRE(gpu[k]->h->free_host_pages(s) == host[k]->free_host_pages(s));
    }
    const std::uint64_t all = n == 64 ? ~0ull : (std::uint64_t{1} << n) - 1;
    for (const auto& [id, m] : live)
      for (std::size_t s = 0; s < kSources; ++s) {
        INFO("request " << id << " source " << s);
        for (std::size_t p = 0; p < m.pages[s]; ++p) {
          const dh::page_id g = dev_store.host_page(id, s, p);
          REQUIRE(g != dh::no_page);
          REQUIRE(g == host_store.host_page(id, s, p));  // both stores give pages in the same order
          REQUIRE(dev_store.page_holders(s, g) == all);
          for (std::size_t k = 0; k < n; ++k) REQUIRE(gpu[k]->h->host_pages_of(id, s)[p] == g);
        }
        for (row_index r = 0; r < m.rows[s]; ++r) {
          REQUIRE(dev_store.has_host_copy(id, s, r));
          const dh::page_id g = dev_store.host_page(id, s, static_cast<std::size_t>(r) / kP);
          for (std::size_t l = 0; l < layers(s); ++l) {
            const auto row = dev_store.row(s, g, l, r);
            INFO("host copy: " << rc::describe_row_mismatch(row, m.tag, s, l, r));
            REQUIRE(rc::row_matches(row, m.tag, s, l, r));
          }
          if (r % 13 == 0)  // the rank's own reading of the store agrees (host_row: books and owner checks)
            for (std::size_t k = 0; k < n; ++k)
              REQUIRE(gpu[k]->h->host_row(id, s, 0, r).data() == dev_store.row(s, g, 0, r).data());
        }
      }
  }
};

void run(std::size_t ranks, const std::vector<int>& devices, std::uint64_t seed) {
  cluster c(ranks, devices, seed);
  request_id next = 1;
  for (int i = 0; i < 3; ++i) REQUIRE(c.admit(next++));
  c.check("admitted");
  constexpr int kSteps = 70;
  for (int step = 0; step < kSteps; ++step) {
    const std::string ctx = "step " + std::to_string(step);
    const auto op = c.rng() % 10;
    std::vector<request_id> ids;
    for (const auto& [id, m] : c.live) ids.push_back(id);
    if (ids.empty()) {
      REQUIRE(c.admit(next++));
      continue;
    }
    const request_id id = ids[c.rng() % ids.size()];
    const std::size_t s = c.rng() % kSources;
    const auto& m = c.live.at(id);
    const auto room = static_cast<std::size_t>(static_cast<std::int64_t>(kRows) - m.rows[s]);
    if (op < 4) {  // decode rows, or a prefill chunk longer than the tail (rows that leave it at once)
      const std::size_t want = c.rng() % 3 == 0 ? kT + 1 + c.rng() % (2 * kT) : 1;
      if (room > 0) c.append(id, s, std::min(want, room));
    } else if (op < 6) {
      c.append_step(1 + c.rng() % kMaxStep, c.rng() % 4 == 0);
    } else if (op == 6) {
      const auto complete_pages = static_cast<std::size_t>(m.rows[s]) / kP;
      if (complete_pages > 0) c.map_page(id, s, c.rng() % complete_pages);
    } else if (op == 7 && ids.size() > 1) {
      c.complete(id);
      if (c.rng() % 2 == 0) REQUIRE(c.admit(id));  // the same id again: a new history
    } else if (op == 8 && c.live.size() < kSlots) {
      REQUIRE(c.admit(next++));
    }
    c.resolve_all(ctx);
    c.check(ctx);
  }
  while (!c.live.empty()) c.complete(c.live.begin()->first);
  c.check("all completed");
  REQUIRE(c.dev_store.host_bytes_in_use() == 0);
  REQUIRE(c.dev_store.requests() == 0);
  for (std::size_t s = 0; s < kSources; ++s) REQUIRE(c.dev_store.free_host_pages(s) == kHostPages);
  INFO("resolves " << c.resolves << ", selected rows outside the tail " << c.host_reads);
  REQUIRE(c.host_reads > 0);  // the runs did read rows other ranks wrote
}

}  // namespace

TEST_CASE("CUDA ranks on one GPU over one shared host store equal host ranks, with owned-only backups",
          "[gpu][shared_store]") {
  require_device();
  for (std::size_t n : {2u, 4u}) {
    INFO(n << " ranks on device 0");
    run(n, std::vector<int>(n, 0), 7 + n);
  }
}

TEST_CASE("CUDA ranks on several GPUs share one pinned, portable host store", "[gpu][shared_store][multi_gpu]") {
  const int devices = device_count();
  if (devices < 2) DHTEST_SKIP("rank r on device r needs two GPUs; this machine has fewer");
  for (std::size_t n : {2u, 4u}) {
    if (static_cast<int>(n) > devices) break;
    std::vector<int> on(n);
    for (std::size_t k = 0; k < n; ++k) on[k] = static_cast<int>(k);
    INFO(n << " ranks, rank r on device r");
    run(n, on, 31 + n);
  }
}

TEST_CASE("a CUDA rank refuses what a shared store does not support, with nothing changed", "[gpu][shared_store]") {
  require_device();
  dhc::pinned_shared_host_store<L> store(2, kHostPages);
  cudaStream_t stream = nullptr;
  DHTEST_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    CH r0(config(), store, 0, stream);
    REQUIRE_THROWS_AS(CH(config(), store, 0, stream), dh::invalid_configuration);  // rank taken
    REQUIRE_THROWS_AS(CH(config(), store, 2, stream), dh::invalid_configuration);  // outside the store's ranks
    dh::hierarchy_config other = config();
    other.host_pages = kHostPages + 1;
    REQUIRE_THROWS_AS(CH(other, store, 1, stream), dh::invalid_configuration);
    {
      std::vector<std::vector<std::byte>> pageable(kSources);
      std::vector<std::span<std::byte>> spans;
      for (std::size_t s = 0; s < kSources; ++s) {
        pageable[s].resize(dh::shared_host_store<L>::store_bytes(kHostPages, s) + 16);
        auto* p = pageable[s].data();
        p += (16 - reinterpret_cast<std::uintptr_t>(p) % 16) % 16;
        spans.emplace_back(p, dh::shared_host_store<L>::store_bytes(kHostPages, s));
      }
      dh::shared_host_store<L> unpinned(2, kHostPages, spans);
      REQUIRE_THROWS_AS(CH(config(), unpinned, 0, stream), dh::invalid_configuration);  // not mapped for the device
    }
    CH r1(config(), store, 1, stream);  // the failed constructions gave rank 1 back
    REQUIRE(r0.admit(1, stream).admitted);
    REQUIRE(r1.admit(1, stream).admitted);
    const auto rows = rc::make_append_buffer(rc::request_tag(1, 0), 0, layers(0), row_bytes(0), 0, kP + 1);
    r0.append(1, 0, std::span<const std::byte>(rows), kP + 1, stream);  // page 0 (rank 0's) and row kP of page 1
    r0.sync_books(stream);
    REQUIRE(store.rows_written(0) == kP);  // rank 0 wrote only its page
    REQUIRE(store.rows_written(1) == 0);
    REQUIRE_THROWS_AS(r0.host_row(1, 0, 0, static_cast<row_index>(kP)), dh::host_copy_pending);  // rank 1's row
    REQUIRE(r0.host_row(1, 0, 0, 0).size() == row_bytes(0));
    REQUIRE_THROWS_AS(r0.retain_prefix(9, 1), dh::invalid_configuration);
    r1.append(1, 0, std::span<const std::byte>(rows), kP + 1, stream);
    r1.sync_books(stream);
    REQUIRE(store.rows_written(1) == 1);
    REQUIRE(r0.host_row(1, 0, 0, static_cast<row_index>(kP)).size() == row_bytes(0));
    REQUIRE(r0.map_optional_page(1, 0, 0, stream));
    r0.complete(1, stream);
    REQUIRE(store.host_bytes_in_use() == 2 * page_bytes(0));  // rank 1 still holds both pages
    r1.complete(1, stream);
    REQUIRE(store.host_bytes_in_use() == 0);
  }
  DHTEST_CUDA(cudaStreamDestroy(stream));
}
