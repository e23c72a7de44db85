// Your own model on the host backend, first integration (docs/quickstart.md walks through it).
// A layout of the model's KV, a configuration from the planner, a hierarchy; requests admitted
// with their prefill; decode steps that write the new rows of every request in one call and
// resolve each source's selections; a request completed and another admitted; a misuse caught as
// a typed error. Every row "attention" reads is compared with the bytes the model wrote: the
// program exits non-zero on any wrong byte. examples/engine_step.cpp adds speculative rounds,
// examples/engine_step_cuda.cu the same step on the GPU in one CUDA graph.
#include <dhisparse/host/hierarchy.hpp>
#include <dhisparse/planner.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <map>
#include <numeric>
#include <random>
#include <vector>

namespace dh = dhisparse;

// [layout]
// Two indexer sources; each leads two payload layers (the layer its indexer selects for, and one
// follower that attends over the same positions with its own KV bytes). 256-byte rows, pages of
// 32 rows, top-k 64.
struct my_model {
  static constexpr std::size_t top_k = 64;
  static constexpr std::size_t page_rows = 32;
  //                       row_bytes, positions per row, payload layers, index key bytes
  static constexpr std::array<dh::source_desc, 2> sources = {dh::source_desc{256, 1, 2, 64},
                                                             dh::source_desc{256, 1, 2, 64}};
  static constexpr std::array<dh::consumer_desc, 4> consumers = {
      dh::consumer_desc{0, dh::consumer_kind::reindex, 0}, dh::consumer_desc{0, dh::consumer_kind::follower, 1},
      dh::consumer_desc{1, dh::consumer_kind::reindex, 0}, dh::consumer_desc{1, dh::consumer_kind::follower, 1}};
};
static_assert(dh::check_layout<my_model>());  // a bad layout fails here, with a message naming it
// [layout]

namespace {

constexpr std::size_t kSources = 2, kLayers = 2, kRowBytes = 256;

/// The bytes the model produces for row `row` of (request, source, layer): any deterministic rule.
std::byte model_byte(dh::request_id id, std::size_t s, std::size_t l, std::int64_t row, std::size_t i) {
  return static_cast<std::byte>((id * 131 + s * 31 + l * 17 + static_cast<std::size_t>(row) * 7 + i) & 0xFF);
}
/// `count` new rows of (request, source) from row `first`, laid out [payload layer][row][row_bytes].
std::vector<std::byte> model_rows(dh::request_id id, std::size_t s, std::int64_t first, std::size_t count) {
  std::vector<std::byte> out(kLayers * count * kRowBytes);
  for (std::size_t l = 0; l < kLayers; ++l)
    for (std::size_t r = 0; r < count; ++r)
      for (std::size_t i = 0; i < kRowBytes; ++i)
        out[(l * count + r) * kRowBytes + i] = model_byte(id, s, l, first + static_cast<std::int64_t>(r), i);
  return out;
}

}  // namespace

int main() {
  // [plan]
  constexpr std::size_t B = 128;  // hot-cache rows per request and source (B >= top_k; 2 x top_k is a good start)
  dh::config_inputs in;
  in.slots = 4;                      // requests decoding at once
  in.max_context_tokens = 2048;      // prompt + generated positions of the longest request
  in.gpu_bytes = 16ull << 20;        // GPU memory the hierarchy may use (on the host backend: its simulated pools)
  in.hot_rows = B;
  // A hierarchy alone keeps no optional history (fixed_budget_policy); size for that. With a
  // residency_manager<Hierarchy, adaptive_policy<>>, leave the default (adaptive) and pass plan.residency.
  in.residency = dh::residency_kind::fixed_budget;
  const dh::hierarchy_plan plan = dh::plan_hierarchy<my_model>(in);  // throws planner_input_error, naming the field
  using Hierarchy = dh::host_hierarchy<my_model, dh::lru_hot_cache<B>>;
  Hierarchy h(plan.config);
  // [plan]
  std::printf("planned: %zu slots, %zu rows each, %zu host pages, %zu optional pages\n", plan.config.max_requests,
              plan.config.max_rows, plan.config.host_pages, plan.config.optional_pages);

  std::map<dh::request_id, std::int64_t> rows_of;  // the engine's own count of each request's rows
  std::mt19937_64 rng(1);
  std::size_t checked = 0, wrong = 0;

  // [admit]
  // Admission: a slot, then the prefill's rows on every source. No free slot is a wait (the
  // admission is false), not an exception: keep the request queued and try again later. Host pages
  // running short is an exception (host_pool_exhausted) from append: complete the request then.
  // (residency_manager::admit takes the whole history and answers wait_for_host_pages instead.)
  const auto admit = [&](dh::request_id id, std::size_t prompt_rows) {
    if (!h.admit(id)) return false;
    for (std::size_t s = 0; s < kSources; ++s) {  // eager appends take the host pages they need
      const auto rows = model_rows(id, s, 0, prompt_rows);
      h.append(id, s, rows, prompt_rows);
    }
    rows_of[id] = static_cast<std::int64_t>(prompt_rows);
    return true;
  };
  // [admit]
  for (dh::request_id id = 1; id <= 3; ++id)
    if (!admit(id, 100 + 40 * id)) return 1;

  const auto decode_step = [&] {
    // [step]
    // 1. This step's new KV row of every request on every source, in one call (all or nothing).
    std::vector<std::vector<std::byte>> bytes;
    std::vector<dh::step_write_item> writes;
    for (const auto& [id, n] : rows_of)
      for (std::size_t s = 0; s < kSources; ++s) bytes.push_back(model_rows(id, s, n, 1));
    std::size_t b = 0;
    for (const auto& [id, n] : rows_of)
      for (std::size_t s = 0; s < kSources; ++s) writes.push_back({id, s, bytes[b++], 1});
    h.append_step(writes);
    for (auto& [id, n] : rows_of) ++n;

    // 2. Per source: the indexer's top-k (here: random distinct history rows), resolved to pool
    //    locations; the follower layer copies by the same plan; attention reads the locations.
    for (std::size_t s = 0; s < kSources; ++s) {
      std::vector<std::vector<dh::row_index>> sel;
      std::vector<std::vector<dh::location>> loc;
      std::vector<dh::resolve_item> batch;
      for (const auto& [id, n] : rows_of) {
        std::vector<dh::row_index> all(static_cast<std::size_t>(n));
        std::iota(all.begin(), all.end(), 0);
        std::shuffle(all.begin(), all.end(), rng);
        all.resize(my_model::top_k);
        sel.push_back(all);
        loc.emplace_back(my_model::top_k);
      }
      std::size_t i = 0;
      for (const auto& [id, n] : rows_of) batch.push_back({id, sel[i], loc[i]}), ++i;
      h.resolve(s, batch, dh::copy_layers::producer_only);
      h.copy_follower(s, 1);
      i = 0;
      for (const auto& [id, n] : rows_of) {
        for (std::size_t j = 0; j < sel[i].size(); ++j)
          for (std::size_t l = 0; l < kLayers; ++l) {
            const auto row = h.payload(s, l, loc[i][j]);  // attention's read: pool row loc of layer l
            for (std::size_t x = 0; x < kRowBytes; ++x) wrong += row[x] != model_byte(id, s, l, sel[i][j], x);
            ++checked;
          }
        ++i;
      }
    }
    // [step]
  };

  // [loop]
  // Between steps: completions, admissions, and host pages for the next steps' batched writes
  // (append_step takes no host pages; past its reservation it throws capacity_exceeded).
  constexpr std::size_t kReserveEvery = 16;
  for (std::size_t t = 0; t < 64; ++t) {
    if (t == 32) {  // request 1 finishes: its slot and pages go back; request 4 takes them
      h.complete(1);
      rows_of.erase(1);
      if (!admit(4, 90)) return 1;
    }
    if (t % kReserveEvery == 0) h.reserve_ahead(kReserveEvery);  // every admitted request, every source
    decode_step();
  }
  // [loop]

  // [errors]
  // Misuse is a typed error that leaves the hierarchy as it was.
  try {
    std::vector<dh::row_index> s1{0};
    std::vector<dh::location> l1(1);
    const dh::resolve_item bad{1, s1, l1};  // request 1 has completed
    h.resolve(0, std::span<const dh::resolve_item>(&bad, 1));
    return 1;
  } catch (const dh::unknown_request& e) {
    std::printf("caught as expected: %s\n", e.what());
  }
  // [errors]

  std::printf("%zu rows read by attention, %zu wrong bytes\n", checked, wrong);
  return wrong == 0 && checked > 0 ? 0 : 1;
}
