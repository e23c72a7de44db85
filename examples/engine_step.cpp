// An engine's decode step on the host reference hierarchy: the integration template of the batched
// write path (the CUDA twin captures the same calls in one graph). A small multi-layer model (4
// index-producer sources, each leading 3 payload layers) runs decode steps and speculative rounds
// for many steps, with requests admitted and completed between steps:
//
//   every few steps (outside the step): reserve_ahead(rows for those steps)
//   decode step: append_step(step_write_items)                <- the step's new KV rows, every source, one call
//                then per source: resolve(source, batch, producer_only), copy_follower(source, l),
//                            attention reads exactly the returned locations of every layer
//   speculative round: stage_step(step_stage_items)             <- every block, every source, one call
//                then per source: verify(source, batch), copy_follower(source, l),
//                            attention over every query;
//                then commit_step(step_commit_items)                <- every source, one call
//
// Every byte attention reads is compared with the bytes the model produced for that row: the
// program exits non-zero on any wrong byte.
#include <dhisparse/host/hierarchy.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <map>
#include <random>
#include <span>
#include <vector>

namespace {

using namespace dhisparse;

/// 4 sources of 3 payload layers (producer + 2 followers), 128-byte rows, k = 64, pages of 16 rows.
struct model_layout {
  static constexpr std::size_t top_k = 64;
  static constexpr std::size_t page_rows = 16;
  static constexpr std::size_t row_bytes = 128;
  static constexpr std::array<source_desc, 4> sources = [] {
    std::array<source_desc, 4> s{};
    for (auto& x : s) x = source_desc{row_bytes, 1, 3, 32};
    return s;
  }();
  static constexpr std::array<consumer_desc, 12> consumers = [] {
    std::array<consumer_desc, 12> c{};
    for (std::size_t i = 0; i < 4; ++i)
      for (std::size_t l = 0; l < 3; ++l)
        c[i * 3 + l] = consumer_desc{i, l == 0 ? consumer_kind::reindex : consumer_kind::follower, l};
    return c;
  }();
};
static_assert(check_layout<model_layout>());

using H = host_hierarchy<model_layout, lru_hot_cache<128>>;
constexpr std::size_t kSources = model_layout::sources.size(), kLayers = 3, kRowBytes = model_layout::row_bytes;
constexpr std::size_t kSlots = 8, kBlock = 4, kReserveEvery = 8, kSteps = 400;

/// The KV the model produces for (request, source, layer, row): deterministic bytes.
std::byte kv_byte(std::uint64_t tag, std::size_t s, std::size_t l, std::int64_t row, std::size_t i) {
  std::uint64_t x = tag * 0x9E3779B97F4A7C15ull ^ (s << 48) ^ (l << 40) ^ (static_cast<std::uint64_t>(row) << 8) ^ i;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return static_cast<std::byte>(x & 0xFF);
}
/// New rows [first, first + count) of a request on a source, laid out [layer][count][row_bytes].
std::vector<std::byte> produce_rows(std::uint64_t tag, std::size_t s, std::int64_t first, std::size_t count) {
  std::vector<std::byte> out(kLayers * count * kRowBytes);
  for (std::size_t l = 0; l < kLayers; ++l)
    for (std::size_t r = 0; r < count; ++r)
      for (std::size_t i = 0; i < kRowBytes; ++i)
        out[(l * count + r) * kRowBytes + i] = kv_byte(tag, s, l, first + static_cast<std::int64_t>(r), i);
  return out;
}

struct engine {
  H h;
  std::map<request_id, std::uint64_t> tag;  // live requests
  std::mt19937_64 rng{2026};
  std::size_t wrong_bytes = 0, rows_read = 0;
  request_id next_id = 1;

  explicit engine(const hierarchy_config& c) : h(c) {}

  void admit() {
    const request_id id = next_id++;
    if (h.admit(id).admitted) tag[id] = rng();
  }
  void complete_one() {
    auto it = tag.begin();
    std::advance(it, static_cast<long>(rng() % tag.size()));
    h.complete(it->first);
    tag.erase(it);
  }

  /// Attention of one consumer: reads exactly the returned locations and checks every byte.
  void attend(request_id id, std::size_t s, std::size_t layer, std::span<const row_index> sel,
              std::span<const location> loc) {
    for (std::size_t i = 0; i < sel.size(); ++i) {
      if (sel[i] == no_row) {
        wrong_bytes += loc[i] != no_location;
        continue;
      }
      const auto row = h.payload(s, layer, loc[i]);
      for (std::size_t b = 0; b < kRowBytes; ++b) wrong_bytes += row[b] != kv_byte(tag[id], s, layer, sel[i], b);
      ++rows_read;
    }
  }

  std::vector<row_index> select(std::int64_t visible) {
    std::vector<row_index> sel(model_layout::top_k, no_row);
    for (auto& x : sel)
      if (visible > 0 && rng() % 8 != 0) x = static_cast<row_index>(rng() % static_cast<std::uint64_t>(visible));
    return sel;
  }

  void decode_step() {
    // 1. The step's KV writes: one step-wide call for every request and source.
    std::vector<std::vector<std::byte>> bytes;
    std::vector<step_write_item> writes;
    bytes.reserve(tag.size() * kSources);
    for (std::size_t s = 0; s < kSources; ++s)
      for (const auto& [id, t] : tag) {
        bytes.push_back(produce_rows(t, s, h.frontier(id, s), 1));
        writes.push_back({id, s, bytes.back(), 1});
      }
    h.append_step(writes);
    for (std::size_t s = 0; s < kSources; ++s) {
      // 2. The indexer's selections, resolved once for the source; followers replay the copies.
      std::vector<std::vector<row_index>> sel;
      std::vector<std::vector<location>> loc;
      std::vector<resolve_item> batch;
      for (const auto& [id, t] : tag) {
        sel.push_back(select(h.frontier(id, s)));
        loc.emplace_back(model_layout::top_k);
      }
      std::size_t e = 0;
      for (const auto& [id, t] : tag) {
        batch.push_back({id, sel[e], loc[e]});
        ++e;
      }
      h.resolve(s, batch, copy_layers::producer_only);
      for (std::size_t l = 1; l < kLayers; ++l) h.copy_follower(s, l);
      // 3. Sparse attention of every payload layer reads the locations.
      e = 0;
      for (const auto& [id, t] : tag) {
        for (std::size_t l = 0; l < kLayers; ++l) attend(id, s, l, sel[e], loc[e]);
        ++e;
      }
    }
  }

  void speculative_round() {
    std::map<request_id, std::size_t> accepted;  // the sampler's accepted proposals, the same on every source
    for (const auto& [id, t] : tag) accepted[id] = rng() % kBlock;
    std::vector<step_commit_item> commits;
    // The target's forward over every block: one step-wide stage of every request on every source.
    std::vector<std::vector<std::byte>> blocks;
    std::vector<step_stage_item> stage;
    for (const auto& [id, t] : tag)
      for (std::size_t s = 0; s < kSources; ++s)
        blocks.push_back(produce_rows(t, s, h.positions(id, s), kBlock));  // anchor + proposals
    std::size_t b = 0;
    for (const auto& [id, t] : tag)
      for (std::size_t s = 0; s < kSources; ++s) stage.push_back({id, s, blocks[b++], kBlock});
    h.stage_step(stage);
    for (std::size_t s = 0; s < kSources; ++s) {
      std::vector<request_id> ids;
      std::vector<std::vector<std::vector<row_index>>> q;
      std::vector<std::vector<std::vector<location>>> ql;
      for (const auto& [id, t] : tag) {
        const std::int64_t n = h.positions(id, s);
        ids.push_back(id);
        std::vector<std::vector<row_index>> queries;
        for (std::size_t j = 0; j < kBlock; ++j) queries.push_back(select(n + static_cast<std::int64_t>(j) + 1));
        q.push_back(std::move(queries));
        ql.emplace_back(kBlock, std::vector<location>(model_layout::top_k));
      }
      std::vector<std::vector<std::span<const row_index>>> qs(ids.size());
      std::vector<std::vector<std::span<location>>> ls(ids.size());
      std::vector<verify_item> batch;
      for (std::size_t e = 0; e < ids.size(); ++e) {
        for (std::size_t j = 0; j < kBlock; ++j) {
          qs[e].push_back(q[e][j]);
          ls[e].push_back(ql[e][j]);
        }
        batch.push_back({ids[e], qs[e], ls[e]});
      }
      h.verify(s, batch, copy_layers::producer_only);
      for (std::size_t l = 1; l < kLayers; ++l) h.copy_follower(s, l);
      for (std::size_t e = 0; e < ids.size(); ++e) {
        for (std::size_t j = 0; j < kBlock; ++j)
          for (std::size_t l = 0; l < kLayers; ++l) attend(ids[e], s, l, q[e][j], ql[e][j]);
        commits.push_back({ids[e], s, accepted[ids[e]]});
      }
    }
    h.commit_step(commits);  // one step-wide commit for every request and source
  }
};

}  // namespace

int main() {
  hierarchy_config cfg;
  cfg.max_requests = kSlots;
  cfg.max_rows = 8192;
  cfg.tail_rows = 32;
  cfg.max_block = kBlock;
  engine eng(cfg);
  for (std::size_t i = 0; i < kSlots - 2; ++i) eng.admit();
  for (std::size_t step = 0; step < kSteps; ++step) {
    if (step % kReserveEvery == 0) eng.h.reserve_ahead(kReserveEvery * kBlock);  // outside the step
    if (step % 5 == 4)
      eng.speculative_round();
    else
      eng.decode_step();
    if (step % 20 == 19) {  // between steps: one request completes, two may arrive
      eng.complete_one();
      eng.admit();
      if (eng.tag.size() < kSlots) eng.admit();
      eng.h.reserve_ahead(kReserveEvery * kBlock);  // pages for the newcomers
    }
  }
  std::printf("engine_step: %zu steps, %zu rows read by attention, %zu wrong bytes\n", kSteps, eng.rows_read,
              eng.wrong_bytes);
  return eng.wrong_bytes == 0 && eng.rows_read > 0 ? 0 : 1;
}
