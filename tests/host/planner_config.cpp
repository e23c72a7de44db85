// Configurations from the planner: plan_hierarchy() turns a layout, budgets, context lengths and a
// slot count into a hierarchy_config and residency budgets; the host hierarchy built from them
// allocates exactly the planned bytes. Expected values come from each layout's own numbers.
#include "../support/catch.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <dhisparse/host/hierarchy.hpp>
#include <dhisparse/host/residency_manager.hpp>
#include <dhisparse/layouts/deepseek_v41_flash.hpp>
#include <dhisparse/layouts/glm53.hpp>
#include <dhisparse/layouts/tiny.hpp>
#include <dhisparse/planner.hpp>

namespace {

using namespace dhisparse;

constexpr std::uint64_t mib = std::uint64_t{1} << 20;

/// The test's own byte model, from the layout's source list: every payload layer keeps
/// N * (B + T + [K_max if speculative]) + P * p rows (plus N * K_max * k staging rows with dedicated
/// staging); shared arenas keep chi * N * K_max * k rows of the widest row; a host page holds p rows
/// of every payload layer.
struct expected_bytes {
  std::uint64_t pool = 0, arenas = 0, store = 0;
};
template <KvLayout L>
expected_bytes expect(std::uint64_t slots, std::uint64_t hot, std::uint64_t tail, std::uint64_t optional_pages,
                      std::uint64_t host_pages, std::uint64_t max_block, std::uint64_t chi /* 0: dedicated */) {
  std::uint64_t payload = 0, widest = 0;
  for (const auto& s : L::sources) {
    payload += s.payload_layers * s.row_bytes;
    widest = s.row_bytes > widest ? s.row_bytes : widest;
  }
  const bool spec = max_block > 1;
  const std::uint64_t staging = spec ? max_block * L::top_k : 0;
  std::uint64_t rows = slots * (hot + tail + (spec ? max_block : 0)) + optional_pages * L::page_rows;
  if (chi == 0) rows += slots * staging;
  return {rows * payload, chi != 0 ? chi * slots * staging * widest : 0, host_pages * L::page_rows * payload};
}

template <class H>
void require_allocates(const H& h, const hierarchy_plan& p, const expected_bytes& e) {
  const auto req = H::requirements(p.config);
  CHECK(req.pool_bytes == e.pool);
  CHECK(req.staging_arena_bytes == e.arenas);
  CHECK(req.host_store_bytes == e.store);
  CHECK(h.pool_bytes() == e.pool);  // what it holds
  CHECK(h.staging_arena_bytes() == e.arenas);
  CHECK(h.host_store_bytes() == e.store);
  CHECK(p.bytes.host_pool_bytes == e.pool);  // what the planner said
  CHECK(p.bytes.host_staging_arena_bytes == e.arenas);
  CHECK(p.bytes.host_store_bytes == e.store);
  CHECK(p.bytes.cuda_pinned_bytes == e.store);
  for (std::size_t s = 0; s < H::sources; ++s) {
    CHECK(h.free_host_pages(s) == p.config.host_pages);
    CHECK(h.free_optional_pages(s) == p.config.optional_pages);
  }
}

/// `count` rows of every payload layer of source `s`, [layer][row][byte] (bytes name the row).
template <KvLayout L>
std::vector<std::byte> history_rows(std::size_t s, std::size_t count) {
  const auto& d = L::sources[s];
  std::vector<std::byte> out(d.payload_layers * count * d.row_bytes);
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<std::byte>((i * 7 + s) & 0xFF);
  return out;
}

}  // namespace

// plan_hierarchy is constexpr: a configuration can be checked at compile time.
static_assert(plan_hierarchy<layouts::tiny>({.slots = 3, .max_context_tokens = 100, .live_context_tokens = 150,
                                             .gpu_bytes = 64 * mib, .hot_rows = 16})
                  .config.host_pages == 21);

TEST_CASE("planned config: tiny, adaptive, speculative with dedicated staging", "[planner][config]") {
  using L = layouts::tiny;  // p = 8, k = 16, sources: 2 layers x 64 B and 1 layer x 32 B (160 B per row)
  const config_inputs in{.slots = 3, .max_context_tokens = 100, .live_context_tokens = 150,
                         .gpu_bytes = 64 * mib, .hot_rows = 16, .max_block = 4,
                         .residency = residency_kind::adaptive, .required_pages = 1, .reserve_pages = 2};
  const hierarchy_plan p = plan_hierarchy<L>(in);
  // max_rows = 100 (m = 1); 13 pages per request; host pages: min(3 * 13, floor((150 + 3 * 7) / 8)) = 21;
  // mappable complete pages: min(3 * 12, floor(150 / 8)) = 18, plus 3 * 1 required and 2 reserve = 23.
  CHECK(p.config.max_requests == 3);
  CHECK(p.config.max_rows == 100);
  CHECK(p.config.tail_rows == 8);
  CHECK(p.config.max_block == 4);
  CHECK(p.default_host_pages == 39);
  CHECK(p.config.host_pages == 21);
  CHECK(p.optional_pages_needed == 23);
  CHECK(p.config.optional_pages == 23);  // the budget is generous: the pool is sized to what can be used
  CHECK(p.residency.required_pages == 1);
  CHECK(p.residency.reserve_pages == 2);
  CHECK(p.hot_rows == 16);
  CHECK_FALSE(p.staging_arenas.has_value());
  CHECK(p.index_key_bytes == 3 * 100 * (32 + 32));

  using H = host_hierarchy<L, lru_hot_cache<16>, adaptive_policy<>>;
  residency_manager<H> m(p.config, p.residency);
  require_allocates(m.hierarchy(), p, expect<L>(3, 16, 8, 23, 21, 4, 0));

  // The live context fits: one request at max context and one with the rest; every complete page of
  // both histories is mapped (the pool was sized for exactly that), and the host stores hold them.
  const std::array<std::size_t, 2> rows{100, 50};
  std::size_t mapped = 0;
  for (std::size_t r = 0; r < rows.size(); ++r) {
    std::vector<std::vector<std::byte>> bytes;
    std::vector<history_import> imports;
    for (std::size_t s = 0; s < H::sources; ++s) bytes.push_back(history_rows<L>(s, rows[r]));
    for (std::size_t s = 0; s < H::sources; ++s) imports.push_back({bytes[s], rows[r]});
    const auto a = m.admit(static_cast<request_id>(r + 1), imports);
    REQUIRE(a.status == admit_status::admitted);
    mapped += a.mapped_pages;
  }
  CHECK(mapped == (100 / 8 + 50 / 8) * H::sources);  // 12 + 6 pages on each source
  for (std::size_t s = 0; s < H::sources; ++s) {
    CHECK(m.ledger(s) == residency_ledger{23, 2, 18, 2});
    CHECK(m.hierarchy().free_host_pages(s) == 21 - (13 + 7));
  }
  CHECK(m.audit().empty());
}

TEST_CASE("planned config: GLM-5.3, fixed budget, shared staging arenas", "[planner][config]") {
  using L = layouts::glm53;  // 21 sources, 78 payload layers of 576 B, k = 2048, p = 64
  const config_inputs in{.slots = 1, .max_context_tokens = 1000, .gpu_bytes = 512 * mib, .hot_rows = 2048,
                         .max_block = 8, .staging_arenas = 4, .residency = residency_kind::fixed_budget};
  const hierarchy_plan p = plan_hierarchy<L>(in);
  CHECK(p.config.max_rows == 1000);
  CHECK(p.config.host_pages == 16);  // ceil(1000 / 64); one slot: the default and the need agree
  CHECK(p.default_host_pages == 16);
  CHECK(p.config.optional_pages == 0);
  CHECK(p.config.tail_rows == 64);
  CHECK(p.staging_arenas == 4u);
  CHECK(p.residency.required_pages == 0);
  CHECK(p.residency.reserve_pages == 0);

  using H = host_hierarchy<L, lru_hot_cache<2048>, fixed_budget_policy, staging_arenas<4>>;
  residency_manager<H> m(p.config, p.residency);
  require_allocates(m.hierarchy(), p, expect<L>(1, 2048, 64, 0, 16, 8, 4));
  // 78 * 576 = 44,928 bytes per row: (2048 + 64 + 8) rows of pool; 4 arenas of 8 * 2048 rows of 576 B.
  CHECK(p.bytes.host_pool_bytes == 2120ull * 44'928);
  CHECK(p.bytes.host_staging_arena_bytes == 4ull * 8 * 2048 * 576);
  CHECK(p.bytes.host_store_bytes == 16ull * 64 * 44'928);
}

TEST_CASE("planned config: DeepSeek-V4.1-Flash, resident, packed rows", "[planner][config]") {
  using L = layouts::deepseek_v41_flash;  // 8 sources of 288 B, m = 4, k = 512, p = 64
  const config_inputs in{.slots = 3, .max_context_tokens = 10'000, .live_context_tokens = 12'000,
                         .gpu_bytes = 256 * mib, .host_bytes = 8 * mib, .hot_rows = 512,
                         .residency = residency_kind::resident, .reserve_pages = 1};
  const hierarchy_plan p = plan_hierarchy<L>(in);
  // 2,500 rows (m = 4), 40 pages per request; host pages: min(120, floor((12,000 + 3 * 255) / 256)) = 49;
  // resident: every slot pins floor(2,500 / 64) = 39 complete pages, plus 1 reserve: 118.
  CHECK(p.config.max_rows == 2500);
  CHECK(p.pages_per_request == 40);
  CHECK(p.config.host_pages == 49);
  CHECK(p.config.optional_pages == 118);
  CHECK(p.residency.reserve_pages == 1);

  using H = host_hierarchy<L, lru_hot_cache<512>, resident_policy>;
  residency_manager<H> m(p.config, p.residency);
  require_allocates(m.hierarchy(), p, expect<L>(3, 512, 64, 118, 49, 1, 0));
  CHECK(p.bytes.host_store_bytes == 49ull * 64 * 8 * 288);
  CHECK(p.bytes.host_store_bytes <= 8 * mib);

  // Three requests at max context can all be admitted: the pool pins their whole histories.
  for (request_id id = 1; id <= 3; ++id) REQUIRE(m.admit(id).status == admit_status::admitted);
  for (std::size_t s = 0; s < H::sources; ++s) CHECK(m.ledger(s).required == 3 * 39);
}

namespace {
/// The issue's DeepSeek-V3.2-like model: 61 layers, each its own indexer (61 reindex sources) of
/// 656-byte rows; k = 2048, p = 64.
struct v32_like {
  static constexpr std::size_t top_k = 2048;
  static constexpr std::size_t page_rows = 64;
  static constexpr std::array<source_desc, 61> sources = [] {
    std::array<source_desc, 61> s{};
    for (auto& x : s) x = source_desc{656, 1, 1, 132};
    return s;
  }();
  static constexpr std::array<consumer_desc, 61> consumers = [] {
    std::array<consumer_desc, 61> c{};
    for (std::size_t i = 0; i < c.size(); ++i) c[i] = consumer_desc{i, consumer_kind::reindex, 0};
    return c;
  }();
};
static_assert(valid_layout<v32_like>);
}  // namespace

TEST_CASE("planned config: the 61-layer model pins 3.66 GB of host stores, not 6.7 GB", "[planner][config]") {
  // Four slots of up to 41,800 tokens: by default each source's store holds 4 * ceil(41,800 / 64) =
  // 2,616 pages (6.70 GB over 61 sources of 64 * 656 B pages). The run held at most 91,200 tokens
  // at once: floor((91,200 + 4 * 63) / 64) = 1,428 pages, 3.66 GB.
  constexpr std::uint64_t page_bytes_all_sources = 61ull * 64 * 656;  // 2,561,024
  const config_inputs in{.slots = 4, .max_context_tokens = 41'800, .live_context_tokens = 91'200,
                         .gpu_bytes = 8 * std::uint64_t{1} << 30, .hot_rows = 2048};
  const hierarchy_plan p = plan_hierarchy<v32_like>(in);
  using H = host_hierarchy<v32_like, lru_hot_cache<2048>, adaptive_policy<>>;

  hierarchy_config all_full = p.config;
  all_full.host_pages = 0;  // the hierarchy's default
  CHECK(H::requirements(all_full).host_store_bytes == 2616 * page_bytes_all_sources);
  CHECK((2616 * page_bytes_all_sources + 5'000'000) / 10'000'000 == 670);  // 6.70 GB

  CHECK(p.default_host_pages == 2616);
  CHECK(p.config.host_pages == 1428);
  CHECK(H::requirements(p.config).host_store_bytes == 1428 * page_bytes_all_sources);
  CHECK(p.bytes.host_store_bytes == 1428 * page_bytes_all_sources);
  CHECK((1428 * page_bytes_all_sources + 5'000'000) / 10'000'000 == 366);  // 3.66 GB
  // With a host budget below that, the planner says which input cannot be met.
  config_inputs tight = in;
  tight.host_bytes = 3'000'000'000;
  try {
    (void)plan_hierarchy<v32_like>(tight);
    FAIL("a 3 GB host budget cannot hold 1,428 pages per source");
  } catch (const planner_input_error& e) {
    CHECK(e.field() == "host_bytes");
    CHECK(std::string(e.what()).find("1171 pages fit") != std::string::npos);  // floor(3e9 / 2,561,024)
  }
}

TEST_CASE("planned config: the GPU budget bounds the optional pool", "[planner][config]") {
  using L = layouts::glm53;
  config_inputs in{.slots = 8, .max_context_tokens = 100'000, .gpu_bytes = 4 * std::uint64_t{1} << 30};
  const hierarchy_plan p = plan_hierarchy<L>(in);
  const std::uint64_t page = 64ull * 44'928;
  CHECK(p.optional_page_bytes == page);
  REQUIRE(p.config.optional_pages < p.optional_pages_needed);  // the budget binds
  CHECK(p.config.optional_pages == p.optional_pages_budget);
  CHECK(p.bytes.cuda_device_bytes <= in.gpu_bytes);
  // One more page would not fit (each of the 78 layer ranges may round by up to 256 bytes either way).
  CHECK(p.bytes.cuda_device_bytes + page + 2 * 78 * cuda_carve_alignment > in.gpu_bytes);
  // The device figure is the itemised terms plus the allowance.
  const auto& b = p.bytes;
  CHECK(b.cuda_device_bytes == b.cuda_pool_bytes + b.cuda_staging_arena_bytes + b.cuda_metadata_bytes +
                                   b.cuda_workspace_bytes + b.cuda_device_allowance);
  // Pools: 78 layers of (8 * (4096 + 64) + P * 64) rows of 576 B, each rounded to 256 B.
  const std::uint64_t layer = (8ull * 4160 + p.config.optional_pages * 64) * 576;
  CHECK(b.cuda_pool_bytes == 78 * ((layer + 255) / 256 * 256));
  // Metadata per source: hot row (4 B) + LRU order (2 B) per way, 8 B per history page, 2 B per history
  // row; 4 B of live flag per slot.
  CHECK(b.cuda_metadata_bytes == 21 * (8ull * 4096 * 6 + 8ull * 1563 * 8 + 8ull * 100'000 * 2) + 8 * 4);
  // Workspace per source: two copy plans of N * k 16-byte entries, and the write state: a 512 B
  // step-table entry, the error books of writes and commits (a 256 B control block and N 32 B
  // records each) and the backup work list (N 16 B items), in 256 B pieces.
  CHECK(b.cuda_workspace_bytes == 21 * (2ull * 8 * 2048 * 16 + 512 + 2 * (256 + 256) + 256));
  CHECK(p.gpu_bytes_left == in.gpu_bytes - b.cuda_device_bytes);
  // A larger budget maps more pages, up to the need.
  in.gpu_bytes *= 64;
  const hierarchy_plan q = plan_hierarchy<L>(in);
  CHECK(q.config.optional_pages == q.optional_pages_needed);
  CHECK(q.optional_pages_needed == 8 * (100'000 / 64));
}

TEST_CASE("planned config: inputs that cannot work name the field at fault", "[planner][config]") {
  using L = layouts::tiny;
  const config_inputs ok{.slots = 2, .max_context_tokens = 64, .gpu_bytes = 16 * mib, .hot_rows = 16};
  REQUIRE_NOTHROW(plan_hierarchy<L>(ok));
  const auto field_of = [](const config_inputs& in) -> std::string {
    try {
      (void)plan_hierarchy<L>(in);
    } catch (const planner_input_error& e) {
      CHECK(e.code() == errc::invalid_configuration);  // a planner_error, the typed invalid_configuration
      return e.field();
    }
    return "(accepted)";
  };
  auto in = ok;
  in.slots = 0;
  CHECK(field_of(in) == "slots");
  in = ok;
  in.max_context_tokens = 0;
  CHECK(field_of(in) == "max_context_tokens");
  in = ok;
  in.hot_rows = 15;  // below k = 16
  CHECK(field_of(in) == "hot_rows");
  in = ok;
  in.tail_rows = 0;
  CHECK(field_of(in) == "tail_rows");
  in = ok;
  in.max_block = 0;
  CHECK(field_of(in) == "max_block");
  in = ok;
  in.max_block = 65;  // more than 64 rows
  CHECK(field_of(in) == "max_block");
  in = ok;
  in.staging_arenas = 1;  // source 0 has 2 payload layers
  CHECK(field_of(in) == "staging_arenas");
  in = ok;
  in.live_context_tokens = 63;
  CHECK(field_of(in) == "live_context_tokens");
  in = ok;
  in.live_context_tokens = 129;
  CHECK(field_of(in) == "live_context_tokens");
  in = ok;
  in.gpu_bytes = 1000;
  CHECK(field_of(in) == "gpu_bytes");
  in = ok;
  in.host_bytes = 100;
  CHECK(field_of(in) == "host_bytes");
  in = ok;
  in.residency = residency_kind::fixed_budget;
  in.reserve_pages = 1;
  CHECK(field_of(in) == "reserve_pages");
  in = ok;
  in.residency = residency_kind::resident;
  in.max_context_tokens = 1'000'000;
  in.live_context_tokens.reset();
  CHECK(field_of(in) == "gpu_bytes");  // 2 slots pinning 125,000 pages of 1,280 B do not fit 16 MiB
  in = ok;
  in.required_pages = 1'000'000;  // one request's required pages exceed any pool the budget allows
  CHECK(field_of(in) == "gpu_bytes");
}

namespace {
std::string layout_error(std::size_t top_k, std::size_t page_rows, const std::vector<source_desc>& sources,
                         const std::vector<consumer_desc>& consumers) {
  const layout_desc l{top_k, page_rows, sources, consumers};
  try {
    (void)plan_hierarchy(l, {.slots = 1, .max_context_tokens = 64, .gpu_bytes = 1 << 30, .hot_rows = 4096});
  } catch (const planner_input_error& e) {
    CHECK(e.field() == "layout");
    return e.what();
  }
  return {};
}
bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }
}  // namespace

TEST_CASE("run-time layouts: checks name the source or consumer at fault", "[planner][config][layout]") {
  using ck = consumer_kind;
  const std::vector<source_desc> two{{64, 1, 2, 32}, {32, 1, 1, 32}};
  const std::vector<consumer_desc> reads_all{{0, ck::reindex, 0}, {0, ck::follower, 1}, {1, ck::reindex, 0}};
  CHECK(layout_error(16, 8, two, reads_all).empty());

  CHECK(contains(layout_error(0, 8, two, reads_all), "top_k"));
  CHECK(contains(layout_error(16, 0, two, reads_all), "page_rows"));
  CHECK(contains(layout_error(16, 8, {}, {}), "at least one source"));
  const auto bad_row = layout_error(16, 8, {{64, 1, 2, 32}, {40, 1, 1, 32}}, reads_all);
  CHECK(contains(bad_row, "source 1: row_bytes"));
  CHECK(contains(bad_row, "(value 40)"));
  CHECK(contains(layout_error(16, 8, {{64, 1, 2, 32}, {32, 0, 1, 32}}, reads_all), "source 1: positions_per_row"));
  CHECK(contains(layout_error(16, 8, {{64, 1, 0, 32}, {32, 1, 1, 32}}, reads_all), "source 0: payload_layers"));
  CHECK(contains(layout_error(16, 8, {{64, 1, 2, 32}, {32, 4, 1, 32}}, reads_all), "source 1: positions_per_row differs"));
  CHECK(contains(layout_error(16, 8, two, {{0, ck::reindex, 0}, {0, ck::follower, 1}, {2, ck::reindex, 0}}),
                 "consumer 2: names a source outside"));
  CHECK(contains(layout_error(16, 8, two, {{0, ck::reindex, 0}, {0, ck::follower, 2}, {1, ck::reindex, 0}}),
                 "consumer 1: names a payload layer outside"));
  CHECK(contains(layout_error(16, 8, two, {{0, ck::reindex, 0}, {0, ck::follower, 1}, {1, ck::reuse, 0}}),
                 "consumer 2: is the first consumer of its source"));
  CHECK(contains(layout_error(16, 8, two, {{0, ck::reindex, 0}, {0, ck::follower, 0}, {0, ck::follower, 1},
                                           {1, ck::reindex, 0}}),
                 "consumer 1: is a follower on payload layer 0"));
  CHECK(contains(layout_error(16, 8, two, {{0, ck::reindex, 0}, {1, ck::reindex, 0}}),
                 "source 0: has a payload layer that no consumer reads (value 1)"));

  // The compile-time layouts pass the same checks and give the same shape either way.
  CHECK_FALSE(find_layout_issue(describe_layout<layouts::glm53>()));
  CHECK_FALSE(find_layout_issue(describe_layout<layouts::deepseek_v41_flash>()));
  CHECK_FALSE(find_layout_issue(describe_layout<layouts::tiny>()));
  CHECK_FALSE(find_layout_issue(describe_layout<v32_like>()));
  const std::vector<source_desc> glm(layouts::glm53::sources.begin(), layouts::glm53::sources.end());
  const std::vector<consumer_desc> glm_c(layouts::glm53::consumers.begin(), layouts::glm53::consumers.end());
  CHECK(shape_of(layout_desc{2048, 64, glm, glm_c}) == shape_of<layouts::glm53>());
}
