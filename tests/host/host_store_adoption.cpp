// Adopted host stores on the host reference: a hierarchy built over caller-owned store bytes
// resolves exactly like one that owns its stores (same locations, stats, plans and pool bytes),
// keeps every history row where the documented page-major layout says (row r of layer l in host
// page g at g * P + (l * p + r % p) * row_bytes; a fresh store hands out pages lowest first), and
// reads what the caller places there. Bad stores are rejected with typed errors before anything is built.
#include "../support/catch.hpp"

#include <dhisparse/host/hierarchy.hpp>
#include <dhisparse/host/residency_manager.hpp>
#include <dhisparse/layouts/tiny.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "../support/row_content.hpp"

namespace {

using namespace dhisparse;
namespace rc = dhisparse_testing;
using L = layouts::tiny;
using H = host_hierarchy<L, lru_hot_cache<16>>;
constexpr std::size_t p = L::page_rows;

hierarchy_config make_cfg() {
  hierarchy_config c;
  c.max_requests = 3;
  c.max_rows = 96;
  c.optional_pages = 2;
  c.host_pages = 30;
  return c;
}

/// The test's own model of the store size: host_pages pages of p rows of every payload layer.
std::size_t model_bytes(const hierarchy_config& c, std::size_t s) {
  return c.host_pages * p * L::sources[s].payload_layers * L::sources[s].row_bytes;
}

/// Caller storage: 64-byte aligned, with room to misalign on purpose.
struct store_bytes {
  std::vector<std::byte> raw;
  std::span<std::byte> span;
  store_bytes(std::size_t n, std::size_t shift = 0) : raw(n + 128 + shift) {
    auto at = reinterpret_cast<std::uintptr_t>(raw.data());
    const std::size_t pad = (64 - at % 64) % 64;
    span = std::span<std::byte>(raw.data() + pad + shift, n);
  }
};

}  // namespace

TEST_CASE("host_store_bytes is the page-major size of each source's store", "[host][adopt]") {
  const auto c = make_cfg();
  for (std::size_t s = 0; s < H::sources; ++s) CHECK(H::host_store_bytes(c, s) == model_bytes(c, s));
  // host_pages = 0 means max_requests * ceil(max_rows / p)
  auto d = c;
  d.host_pages = 0;
  CHECK(H::host_store_bytes(d, 0) == 3 * (96 / p) * p * 2 * 64);
  CHECK_THROWS_AS(H::host_store_bytes(c, H::sources), invalid_source);
}

TEST_CASE("bad adopted stores throw typed errors", "[host][adopt]") {
  const auto c = make_cfg();
  store_bytes a(model_bytes(c, 0)), b(model_bytes(c, 1));
  {
    const std::array<std::span<std::byte>, 1> one{a.span};
    CHECK_THROWS_AS(H(c, one), size_mismatch);
  }
  {
    const std::array<std::span<std::byte>, 2> small{a.span, b.span.first(b.span.size() - 1)};
    try {
      H h(c, small);
      FAIL("a store one byte short was accepted");
    } catch (const size_mismatch& e) {
      CHECK(std::string(e.what()).find("source 1") != std::string::npos);
    }
  }
  {
    store_bytes shifted(model_bytes(c, 0), 8);
    const std::array<std::span<std::byte>, 2> mis{shifted.span, b.span};
    CHECK_THROWS_AS(H(c, mis), invalid_configuration);
  }
  {
    const std::array<std::span<std::byte>, 2> ok{a.span, b.span};
    H h(c, ok);
    CHECK(h.admitted_count() == 0);
  }
}

TEST_CASE("an adopted store resolves like an owned one and keeps the documented layout", "[host][adopt]") {
  const auto c = make_cfg();
  // Bytes outside the pages must stay untouched: a larger span with a guard pattern at the end.
  constexpr std::byte guard{0x5A};
  store_bytes a(model_bytes(c, 0) + 64), b(model_bytes(c, 1) + 64);
  std::memset(a.span.data(), 0x5A, a.span.size());
  std::memset(b.span.data(), 0x5A, b.span.size());
  const std::array<std::span<std::byte>, 2> stores{a.span, b.span};
  H own(c), ad(c, stores);

  const std::array<request_id, 3> ids{7, 8, 9};
  const std::array<std::size_t, 3> rows{60, 41, 90};
  std::array<std::array<std::vector<page_id>, 2>, 3> pages_of;  // the model: which host page each history page got
  std::array<page_id, 2> next_page{0, 0};
  for (std::size_t r = 0; r < ids.size(); ++r) {
    REQUIRE(own.admit(ids[r]).admitted);
    REQUIRE(ad.admit(ids[r]).admitted);
    for (std::size_t s = 0; s < H::sources; ++s) {
      const auto& d = L::sources[s];
      const auto buf = rc::make_append_buffer(rc::request_tag(ids[r]), s, d.payload_layers, d.row_bytes, 0, rows[r]);
      own.append(ids[r], s, buf, rows[r]);
      ad.append(ids[r], s, buf, rows[r]);
      // pages are handed out lowest free first, in append order
      for (std::size_t g = 0; g < (rows[r] + p - 1) / p; ++g) pages_of[r][s].push_back(next_page[s]++);
    }
  }

  // Every row sits where the layout contract says, in the caller's bytes.
  for (std::size_t r = 0; r < ids.size(); ++r)
    for (std::size_t s = 0; s < H::sources; ++s) {
      const auto& d = L::sources[s];
      const std::size_t page_bytes = p * d.payload_layers * d.row_bytes;
      const std::span<std::byte> mem = stores[s];
      for (std::size_t row = 0; row < rows[r]; ++row)
        for (std::size_t l = 0; l < d.payload_layers; ++l) {
          const std::size_t at = static_cast<std::size_t>(pages_of[r][s][row / p]) * page_bytes +
                                 (l * p + row % p) * d.row_bytes;
          const auto got = mem.subspan(at, d.row_bytes);
          INFO("request " << ids[r] << " " << rc::describe_row_mismatch(got, rc::request_tag(ids[r]), s, l,
                                                                         static_cast<std::int64_t>(row)));
          REQUIRE(rc::row_matches(got, rc::request_tag(ids[r]), s, l, static_cast<std::int64_t>(row)));
        }
      for (std::size_t i = model_bytes(c, s); i < mem.size(); ++i) REQUIRE(mem[i] == guard);
    }

  // Identical resolves on both, step after step (hot hits, misses, tail, duplicates, -1).
  std::mt19937_64 rng(11);
  for (int step = 0; step < 40; ++step) {
    const std::size_t s = static_cast<std::size_t>(step) % H::sources;
    std::vector<std::vector<row_index>> sel(ids.size());
    std::vector<std::vector<location>> lo(ids.size()), la(ids.size());
    std::vector<resolve_item> io, ia;
    for (std::size_t r = 0; r < ids.size(); ++r) {
      sel[r].resize(L::top_k);
      for (auto& x : sel[r]) x = rng() % 10 == 0 ? no_row : static_cast<row_index>(rng() % rows[r]);
      lo[r].assign(L::top_k, -7);
      la[r].assign(L::top_k, -7);
      io.push_back({ids[r], sel[r], lo[r]});
      ia.push_back({ids[r], sel[r], la[r]});
    }
    const auto so = own.resolve(s, io);
    const auto sa = ad.resolve(s, ia);
    INFO("step " << step << " source " << s);
    REQUIRE(so == sa);
    REQUIRE(lo == la);
    const auto po = own.last_plan(s), pa = ad.last_plan(s);
    REQUIRE(po.size() == pa.size());
    for (std::size_t i = 0; i < po.size(); ++i)
      REQUIRE((po[i].slot == pa[i].slot && po[i].row == pa[i].row && po[i].dst == pa[i].dst));
    for (std::size_t r = 0; r < ids.size(); ++r)
      for (std::size_t i = 0; i < L::top_k; ++i) {
        if (sel[r][i] == no_row) continue;
        for (std::size_t l = 0; l < L::sources[s].payload_layers; ++l) {
          const auto got = ad.payload(s, l, la[r][i]);
          REQUIRE(rc::row_matches(got, rc::request_tag(ids[r]), s, l, sel[r][i]));
        }
      }
  }

  // Bytes the caller places in the store are what a miss brings to the GPU pool: overwrite row 3
  // of request 8 (source 0, both layers) in place, then select it when it is not cached.
  const std::size_t s = 0, r = 1;
  const auto& d = L::sources[s];
  const std::size_t page_bytes = p * d.payload_layers * d.row_bytes;
  const std::int64_t row = 3;
  constexpr std::uint64_t placed_tag = 0xADA97ull;
  // Evict row 3 from the hot cache: fill it with other rows first (B = 16 ways, k = 16).
  for (int round = 0; round < 3; ++round) {
    std::vector<row_index> fill(L::top_k);
    for (std::size_t i = 0; i < L::top_k; ++i) fill[i] = static_cast<row_index>(8 + i + 16 * (round % 2));
    std::vector<location> out(L::top_k);
    ad.resolve(ids[r], s, fill, out);
  }
  const auto hot = ad.hot_rows_of(ids[r], s);
  REQUIRE(std::find(hot.begin(), hot.end(), row) == hot.end());
  for (std::size_t l = 0; l < d.payload_layers; ++l) {
    const std::size_t at = static_cast<std::size_t>(pages_of[r][s][row / p]) * page_bytes + (l * p + row % p) * d.row_bytes;
    rc::fill_row(stores[s].data() + at, d.row_bytes, placed_tag, s, l, row);
  }
  std::vector<row_index> one{static_cast<row_index>(row)};
  std::vector<location> where(1);
  const auto st = ad.resolve(ids[r], s, one, where);
  REQUIRE(st.host == 1);
  for (std::size_t l = 0; l < d.payload_layers; ++l) {
    INFO("layer " << l << ": " << rc::describe_row_mismatch(ad.payload(s, l, where[0]), placed_tag, s, l, row));
    REQUIRE(rc::row_matches(ad.payload(s, l, where[0]), placed_tag, s, l, row));
    REQUIRE(rc::row_matches(ad.host_row(ids[r], s, l, row), placed_tag, s, l, row));
  }

  // Completion returns the pages and a new request reuses them; wherever its pages land, host_row
  // (the documented way to learn a page) points into the caller's bytes at the layout's offsets.
  ad.complete(ids[0]);
  REQUIRE(ad.admit(50).admitted);
  const auto buf = rc::make_append_buffer(rc::request_tag(50), 0, d.payload_layers, d.row_bytes, 0, 2 * p);
  ad.append(50, 0, buf, 2 * p);
  std::vector<std::size_t> freed(pages_of[0][0].begin(), pages_of[0][0].end());
  for (std::size_t page = 0; page < 2; ++page) {
    const std::size_t off = static_cast<std::size_t>(ad.host_row(50, 0, 0, static_cast<row_index>(page * p)).data() -
                                                     stores[0].data());
    REQUIRE(off % page_bytes == 0);
    const std::size_t g = off / page_bytes;
    REQUIRE(std::find(freed.begin(), freed.end(), g) != freed.end());  // a page request 7 gave back
    for (std::size_t i = 0; i < p; ++i)
      for (std::size_t l = 0; l < d.payload_layers; ++l)
        REQUIRE(rc::row_matches(stores[0].subspan(g * page_bytes + (l * p + i) * d.row_bytes, d.row_bytes),
                                rc::request_tag(50), 0, l, static_cast<std::int64_t>(page * p + i)));
  }
}

TEST_CASE("a residency manager adopts the engine's host stores", "[host][adopt][residency]") {
  auto c = make_cfg();
  c.optional_pages = 12;
  store_bytes a(model_bytes(c, 0)), b(model_bytes(c, 1));
  const std::array<std::span<std::byte>, 2> stores{a.span, b.span};
  residency_config rc_cfg;
  rc_cfg.required_pages = 1;
  residency_manager<H, adaptive_policy<>> m(c, rc_cfg, stores);
  // A history imported through the manager lands in the caller's bytes at the layout's offsets, and
  // resolves to exactly those rows.
  const auto& d = L::sources[0];
  const std::size_t rows = 3 * p + 5, page_bytes = p * d.payload_layers * d.row_bytes;
  const auto buf = rc::make_append_buffer(rc::request_tag(3), 0, d.payload_layers, d.row_bytes, 0, rows);
  REQUIRE(m.admit(3));
  CHECK(m.import_history(3, 0, buf, rows) == 3);  // three whole pages, mapped newest first while spare
  REQUIRE(m.audit().empty());
  for (std::size_t row = 0; row < rows; ++row)
    for (std::size_t l = 0; l < d.payload_layers; ++l) {
      const std::size_t at = (row / p) * page_bytes + (l * p + row % p) * d.row_bytes;  // fresh store: pages 0, 1, ...
      REQUIRE(rc::row_matches(stores[0].subspan(at, d.row_bytes), rc::request_tag(3), 0, l,
                              static_cast<std::int64_t>(row)));
    }
  std::vector<row_index> sel{0, static_cast<row_index>(p), static_cast<row_index>(rows - 1), no_row};
  std::vector<location> loc(sel.size());
  m.step().resolve(3, 0, sel, loc);
  for (std::size_t i = 0; i + 1 < sel.size(); ++i)
    for (std::size_t l = 0; l < d.payload_layers; ++l)
      REQUIRE(rc::row_matches(m.hierarchy().payload(0, l, loc[i]), rc::request_tag(3), 0, l, sel[i]));
  // The adopting manager checks the stores as the hierarchy does, and its ledger as the owning one.
  const std::array<std::span<std::byte>, 1> one{a.span};
  CHECK_THROWS_AS((residency_manager<H, adaptive_policy<>>(c, rc_cfg, one)), size_mismatch);
  residency_config too_big;
  too_big.required_pages = c.optional_pages + 1;
  CHECK_THROWS_AS((residency_manager<H, adaptive_policy<>>(c, too_big, stores)), invalid_configuration);
}
