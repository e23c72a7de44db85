// Adopted host stores on the CUDA backend: a hierarchy built over caller-owned pinned stores
// (cudaHostAlloc, or cudaHostRegister'ed memory) resolves exactly like one that allocates its own
// (locations, stats, pool bytes), writes each history row where the documented page-major layout
// says, and copies to the GPU the bytes the caller places there. Bad stores (wrong count, too
// small, misaligned, not pinned) are rejected with typed errors before anything is allocated.
#include <sys/mman.h>

#include "cuda_test_support.cuh"
#include "dhisparse/cuda/residency_manager.cuh"

namespace {

using namespace dhtest;
using Layout = dh::layouts::tiny;
using Hot = dh::lru_hot_cache<16>;
using DH = dhc::hierarchy<Layout, Hot>;
using HH = dh::host_hierarchy<Layout, Hot>;
constexpr std::size_t K = Layout::top_k;
constexpr std::size_t p = Layout::page_rows;

dh::hierarchy_config make_cfg() {
  dh::hierarchy_config c;
  c.max_requests = 4;
  c.max_rows = 128;
  c.optional_pages = 4;
  c.host_pages = 40;
  return c;
}

/// The test's own model of a store's size: host_pages pages of p rows of every payload layer.
std::size_t model_bytes(const dh::hierarchy_config& c, std::size_t s) {
  return c.host_pages * p * Layout::sources[s].payload_layers * Layout::sources[s].row_bytes;
}
std::size_t page_bytes(std::size_t s) { return p * Layout::sources[s].payload_layers * Layout::sources[s].row_bytes; }

}  // namespace

TEST_CASE("host_store_bytes matches the page-major model", "[gpu][adopt]") {
  const auto c = make_cfg();
  for (std::size_t s = 0; s < DH::sources; ++s) {
    CHECK(DH::host_store_bytes(c, s) == model_bytes(c, s));
    CHECK(DH::host_store_bytes(c, s) == HH::host_store_bytes(c, s));
  }
}

TEST_CASE("bad adopted host stores throw typed errors", "[gpu][adopt]") {
  require_device();
  const auto c = make_cfg();
  dhc::pinned_buffer a(model_bytes(c, 0) + 64), b(model_bytes(c, 1) + 64);
  {
    const std::array<std::span<std::byte>, 1> one{a.span()};
    CHECK_THROWS_AS(DH(c, one, nullptr), dh::size_mismatch);
  }
  {
    const std::array<std::span<std::byte>, 2> small{a.span(), b.span().first(model_bytes(c, 1) - 1)};
    CHECK_THROWS_AS(DH(c, small, nullptr), dh::size_mismatch);
  }
  {
    const std::array<std::span<std::byte>, 2> mis{a.span().subspan(8), b.span()};
    CHECK_THROWS_AS(DH(c, mis, nullptr), dh::invalid_configuration);
  }
  {
    std::vector<std::byte> heap(model_bytes(c, 0) + 64);
    auto* at = heap.data() + (16 - reinterpret_cast<std::uintptr_t>(heap.data()) % 16) % 16;
    const std::array<std::span<std::byte>, 2> pageable{std::span<std::byte>(at, model_bytes(c, 0)), b.span()};
    CHECK_THROWS_AS(DH(c, pageable, nullptr), dh::invalid_configuration);
  }
  {
    const std::array<std::span<std::byte>, 2> ok{a.span(), b.span()};
    DH h(c, ok, nullptr);
    CHECK(h.admitted_count() == 0);
  }
}

namespace {

/// Drives an owning and an adopting hierarchy (plus the host reference) with the same calls.
template <class Stores>
void run_equivalence(const dh::hierarchy_config& c, const Stores& stores, const std::string& how) {
  INFO("stores: " << how);
  cudaStream_t stream = nullptr;
  DHTEST_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    HH host(c);
    DH own(c, stream), ad(c, std::span<const std::span<std::byte>>(stores), stream);
    const std::array<request_id, 3> ids{21, 22, 23};
    const std::array<std::size_t, 3> rows{70, 33, 120};
    std::array<std::array<std::vector<std::size_t>, 2>, 3> pages_of{};
    std::array<std::size_t, 2> next{0, 0};
    for (std::size_t r = 0; r < ids.size(); ++r) {
      REQUIRE(host.admit(ids[r]).admitted);
      REQUIRE(own.admit(ids[r], stream).admitted);
      REQUIRE(ad.admit(ids[r], stream).admitted);
      for (std::size_t s = 0; s < DH::sources; ++s) {
        const auto buf = make_rows<Layout>(ids[r], s, 0, rows[r]);
        host.append(ids[r], s, buf, rows[r]);
        own.append(ids[r], s, std::span<const std::byte>(buf), rows[r], stream);
        ad.append(ids[r], s, std::span<const std::byte>(buf), rows[r], stream);
        for (std::size_t g = 0; g < (rows[r] + p - 1) / p; ++g) pages_of[r][s].push_back(next[s]++);  // fresh store: lowest first
      }
    }
    wait_or_die(stream, "appends");

    // Every row lies in the caller's bytes where the layout contract says.
    std::vector<std::byte> want;
    for (std::size_t r = 0; r < ids.size(); ++r)
      for (std::size_t s = 0; s < DH::sources; ++s) {
        const auto& d = Layout::sources[s];
        want.resize(d.row_bytes);
        for (std::size_t row = 0; row < rows[r]; ++row)
          for (std::size_t l = 0; l < d.payload_layers; ++l) {
            const std::size_t at = pages_of[r][s][row / p] * page_bytes(s) + (l * p + row % p) * d.row_bytes;
            fill_row(want.data(), d.row_bytes, ids[r], s, l, static_cast<row_index>(row));
            INFO("request " << ids[r] << " source " << s << " layer " << l << " row " << row << " at byte " << at);
            REQUIRE(std::memcmp(stores[s].data() + at, want.data(), d.row_bytes) == 0);
            REQUIRE(ad.host_row(ids[r], s, l, static_cast<row_index>(row)).data() == stores[s].data() + at);
          }
      }

    // Identical resolves: locations, stats and pool bytes.
    std::mt19937_64 rng(5);
    dhc::device_buffer<row_index> dsel(ids.size() * K);
    dhc::device_buffer<location> dloc_own(ids.size() * K), dloc_ad(ids.size() * K);
    for (int step = 0; step < 30; ++step) {
      const std::size_t s = static_cast<std::size_t>(step) % DH::sources;
      INFO("step " << step << " source " << s);
      std::vector<row_index> sel(ids.size() * K);
      for (std::size_t r = 0; r < ids.size(); ++r)
        for (std::size_t i = 0; i < K; ++i)
          sel[r * K + i] = rng() % 11 == 0 ? dh::no_row : static_cast<row_index>(rng() % rows[r]);
      std::vector<dh::resolve_stats> expect;
      std::vector<location> expect_loc(ids.size() * K);
      for (std::size_t r = 0; r < ids.size(); ++r)
        expect.push_back(host.resolve(ids[r], s, std::span<const row_index>(sel.data() + r * K, K),
                                      std::span<location>(expect_loc.data() + r * K, K)));
      DHTEST_CUDA(cudaMemcpyAsync(dsel.data(), sel.data(), sel.size() * sizeof(row_index), cudaMemcpyHostToDevice, stream));
      std::vector<DH::batch_item> io, ia;
      for (std::size_t r = 0; r < ids.size(); ++r) {
        io.push_back({ids[r], dsel.data() + r * K, static_cast<std::int32_t>(K), dloc_own.data() + r * K});
        ia.push_back({ids[r], dsel.data() + r * K, static_cast<std::int32_t>(K), dloc_ad.data() + r * K});
      }
      own.resolve(s, std::span<const DH::batch_item>(io), stream);
      ad.resolve(s, std::span<const DH::batch_item>(ia), stream);
      wait_or_die(stream, "resolves");
      own.check_errors(stream);
      ad.check_errors(stream);
      std::vector<location> lo(ids.size() * K), la(ids.size() * K);
      DHTEST_CUDA(cudaMemcpy(lo.data(), dloc_own.data(), lo.size() * sizeof(location), cudaMemcpyDeviceToHost));
      DHTEST_CUDA(cudaMemcpy(la.data(), dloc_ad.data(), la.size() * sizeof(location), cudaMemcpyDeviceToHost));
      DHTEST_REQUIRE_SAME(location, "locations (host vs owning)", expect_loc, lo);
      DHTEST_REQUIRE_SAME(location, "locations (owning vs adopting)", lo, la);
      const auto so = own.last_stats(s), sa = ad.last_stats(s);
      REQUIRE(so.size() == ids.size());
      REQUIRE(sa.size() == ids.size());
      for (std::size_t r = 0; r < ids.size(); ++r) {
        REQUIRE(so[r] == expect[r]);
        REQUIRE(sa[r] == expect[r]);
      }
      for (std::size_t l = 0; l < Layout::sources[s].payload_layers; ++l) {
        std::vector<std::byte> po(own.pool_rows() * Layout::sources[s].row_bytes), pa(po.size());
        own.copy_pool(s, l, po);
        ad.copy_pool(s, l, pa);
        REQUIRE(first_mismatch(po, pa) < 0);
      }
    }

    // Bytes the caller places over a stored row are what a miss on it copies to the GPU.
    const std::size_t s = 0, r = 2;
    const auto& d = Layout::sources[s];
    const row_index row = 9;  // not in the tail (120 rows stored, T = 8)
    for (int round = 0; round < 2; ++round) {  // fill the hot cache with other rows: row 9 leaves it
      std::vector<row_index> fill(K);
      for (std::size_t i = 0; i < K; ++i) fill[i] = static_cast<row_index>(40 + i + K * static_cast<std::size_t>(round));
      DHTEST_CUDA(cudaMemcpy(dsel.data(), fill.data(), K * sizeof(row_index), cudaMemcpyHostToDevice));
      const std::array<DH::batch_item, 1> item{{{ids[r], dsel.data(), static_cast<std::int32_t>(K), dloc_ad.data()}}};
      ad.resolve(s, std::span<const DH::batch_item>(item), stream);
      wait_or_die(stream, "evicting resolve");
    }
    const auto hot = ad.hot_rows_of(ids[r], s);
    REQUIRE(std::find(hot.begin(), hot.end(), row) == hot.end());
    constexpr request_id placed = 0xADA97;  // content of another "request": recognisably not the old row
    for (std::size_t l = 0; l < d.payload_layers; ++l) {
      const std::size_t at = pages_of[r][s][static_cast<std::size_t>(row) / p] * page_bytes(s) +
                             (l * p + static_cast<std::size_t>(row) % p) * d.row_bytes;
      fill_row(stores[s].data() + at, d.row_bytes, placed, s, l, row);
    }
    DHTEST_CUDA(cudaMemcpy(dsel.data(), &row, sizeof(row), cudaMemcpyHostToDevice));
    const std::array<DH::batch_item, 1> one{{{ids[r], dsel.data(), 1, dloc_ad.data()}}};
    const auto st = ad.resolve_sync(s, std::span<const DH::batch_item>(one), stream);
    REQUIRE(st.host == 1);
    location where = -1;
    DHTEST_CUDA(cudaMemcpy(&where, dloc_ad.data(), sizeof(where), cudaMemcpyDeviceToHost));
    for (std::size_t l = 0; l < d.payload_layers; ++l) {
      std::vector<std::byte> placed_row(d.row_bytes);
      fill_row(placed_row.data(), d.row_bytes, placed, s, l, row);
      REQUIRE(ad.payload_row(s, l, where) == placed_row);
    }
  }
  cudaStreamDestroy(stream);
}

}  // namespace

TEST_CASE("an adopted pinned store resolves like an owned one, in the documented layout", "[gpu][adopt]") {
  require_device();
  const auto c = make_cfg();
  dhc::pinned_buffer a(model_bytes(c, 0)), b(model_bytes(c, 1));
  const std::array<std::span<std::byte>, 2> stores{a.span(), b.span()};
  run_equivalence(c, stores, "cudaHostAlloc");
}

TEST_CASE("memory registered with cudaHostRegister can be adopted", "[gpu][adopt]") {
  require_device();
  const auto c = make_cfg();
  std::array<void*, 2> raw{};
  std::array<std::span<std::byte>, 2> stores{};
  for (std::size_t s = 0; s < 2; ++s) {
    raw[s] = mmap(nullptr, model_bytes(c, s), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(raw[s] != MAP_FAILED);
    DHTEST_CUDA(cudaHostRegister(raw[s], model_bytes(c, s), cudaHostRegisterMapped | cudaHostRegisterPortable));
    stores[s] = std::span<std::byte>(static_cast<std::byte*>(raw[s]), model_bytes(c, s));
  }
  run_equivalence(c, stores, "cudaHostRegister");
  for (std::size_t s = 0; s < 2; ++s) {
    DHTEST_CUDA(cudaHostUnregister(raw[s]));
    munmap(raw[s], model_bytes(c, s));
  }
}

TEST_CASE("a residency manager adopts the engine's pinned host stores", "[gpu][adopt][residency]") {
  require_device();
  auto c = make_cfg();
  c.optional_pages = 12;
  dhc::pinned_buffer a(model_bytes(c, 0)), b(model_bytes(c, 1));
  const std::array<std::span<std::byte>, 2> stores{a.span(), b.span()};
  cudaStream_t stream{};
  DHTEST_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    dh::residency_config rc_cfg;
    rc_cfg.required_pages = 1;
    dhc::residency_manager<DH, dh::adaptive_policy<>> m(c, rc_cfg, stores, stream);
    const std::size_t s = 0, rows = 3 * p + 5;
    const auto& d = Layout::sources[s];
    const request_id id = 3;
    const auto buf = make_rows<Layout>(id, s, 0, rows);  // pageable: staged by the library
    REQUIRE(m.admit(id));
    CHECK(m.import_history(id, s, std::span<const std::byte>(buf), rows) == 3);
    // The three complete pages were imported resident-first: device-only, their host copies
    // deferred. Back them up now, so the whole history must be in the caller's bytes.
    m.drain();
    m.poll();
    CHECK(m.back_up(3) == 3);
    m.drain();
    m.poll();
    REQUIRE(m.audit().empty());
    // Every row is in the caller's bytes at the layout's offsets (a fresh store: pages 0, 1, ...).
    std::vector<std::byte> want(d.row_bytes);
    for (std::size_t row = 0; row < rows; ++row)
      for (std::size_t l = 0; l < d.payload_layers; ++l) {
        fill_row(want.data(), d.row_bytes, id, s, l, static_cast<row_index>(row));
        const std::size_t at = (row / p) * page_bytes(s) + (l * p + row % p) * d.row_bytes;
        INFO("row " << row << " layer " << l);
        REQUIRE(std::memcmp(stores[s].data() + at, want.data(), d.row_bytes) == 0);
      }
    // A resolve through the manager's step returns exactly those rows.
    const std::vector<row_index> sel{0, static_cast<row_index>(p), static_cast<row_index>(rows - 1)};
    dhc::device_buffer<row_index> dsel(sel.size());
    dhc::device_buffer<location> dloc(sel.size());
    DHTEST_CUDA(cudaMemcpy(dsel.data(), sel.data(), sel.size() * sizeof(row_index), cudaMemcpyHostToDevice));
    const std::array<DH::batch_item, 1> item{{{id, dsel.data(), static_cast<std::int32_t>(sel.size()), dloc.data()}}};
    m.step().resolve_sync(s, std::span<const DH::batch_item>(item), stream);
    std::vector<location> loc(sel.size());
    DHTEST_CUDA(cudaMemcpy(loc.data(), dloc.data(), loc.size() * sizeof(location), cudaMemcpyDeviceToHost));
    for (std::size_t i = 0; i < sel.size(); ++i)
      for (std::size_t l = 0; l < d.payload_layers; ++l) {
        fill_row(want.data(), d.row_bytes, id, s, l, sel[i]);
        REQUIRE(m.hierarchy().payload_row(s, l, loc[i]) == want);
      }
    m.complete(id);
    m.drain();
    // Bad stores are refused as by the hierarchy.
    const std::array<std::span<std::byte>, 1> one{a.span()};
    CHECK_THROWS_AS((dhc::residency_manager<DH, dh::adaptive_policy<>>(c, rc_cfg, one, stream)), dh::size_mismatch);
  }
  cudaStreamDestroy(stream);
}
