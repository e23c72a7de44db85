// shared_host_store: the tensor-parallel ranks of one host over ONE host store (docs/multi-gpu.md),
// host backend. The integration template of a TP engine: each rank (one per GPU, here a thread)
// owns a host_hierarchy over the same shared_host_store, so every request's history is stored
// once instead of once per rank. The CUDA twin is shared_host_store_cuda.cu.
//
//   every rank, on its own thread, in lockstep:
//     admit each request, append its prefill (longer than the tail: rows go to the store at once)
//     per decode step: reserve_ahead every few steps, append_step (one row per request and source)
//                      barrier                   <- every rank's writes before any rank's reads
//                      resolve per source, attention reads exactly the returned locations
//     midway: complete one request on every rank, barrier, admit the same id again (a new history)
//
// Each rank writes to the store only the rows of the history pages it owns (page p: rank p mod N)
// and reads the others' rows from it, so a resolve may read a row another rank wrote: the barrier
// between a step's appends and its resolves is what makes that row be there.
//
// Checks: every resolved location on every rank holds the exact bytes of the selected row (rows
// are computed here from (request, source, layer, row)); host bytes in use equal one hierarchy's
// worth; each rank wrote exactly the rows of the pages it owns. Exits non-zero on any failure.
#include <dhisparse/host/hierarchy.hpp>
#include <dhisparse/host/shared_host_store.hpp>

#include <algorithm>
#include <array>
#include <barrier>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace dhisparse;

/// Source 0: 128-byte rows in 2 payload layers (producer + follower); source 1: 64-byte rows in 1.
struct model_layout {
  static constexpr std::size_t top_k = 32;
  static constexpr std::size_t page_rows = 16;
  static constexpr std::array<source_desc, 2> sources{{{128, 1, 2, 32}, {64, 1, 1, 32}}};
  static constexpr std::array<consumer_desc, 3> consumers{{
      {0, consumer_kind::reindex, 0}, {0, consumer_kind::follower, 1}, {1, consumer_kind::reindex, 0}}};
};
static_assert(check_layout<model_layout>());

using H = host_hierarchy<model_layout, lru_hot_cache<64>>;
using Store = shared_host_store<model_layout>;
constexpr std::size_t kRanks = 4, kSources = 2, kSlots = 4, kRequests = 3, kP = model_layout::page_rows;
constexpr std::size_t kTail = 16, kMaxRows = 256, kSteps = 50, kReserveEvery = 8, kReadmitStep = 25;
constexpr request_id kReadmitted = 2;

std::size_t layers(std::size_t s) { return model_layout::sources[s].payload_layers; }
std::size_t row_bytes(std::size_t s) { return model_layout::sources[s].row_bytes; }

/// The KV the model produces for (request tag, source, layer, row): deterministic bytes.
std::byte kv_byte(std::uint64_t tag, std::size_t s, std::size_t l, std::int64_t row, std::size_t i) {
  std::uint64_t x = tag * 0x9E3779B97F4A7C15ull ^ (s << 48) ^ (l << 40) ^ (static_cast<std::uint64_t>(row) << 8) ^ i;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return static_cast<std::byte>(x & 0xFF);
}
/// Rows [first, first + count) of a request on a source, laid out [layer][count][row_bytes].
std::vector<std::byte> produce_rows(std::uint64_t tag, std::size_t s, std::int64_t first, std::size_t count) {
  std::vector<std::byte> out(layers(s) * count * row_bytes(s));
  for (std::size_t l = 0; l < layers(s); ++l)
    for (std::size_t r = 0; r < count; ++r)
      for (std::size_t i = 0; i < row_bytes(s); ++i)
        out[(l * count + r) * row_bytes(s) + i] = kv_byte(tag, s, l, first + static_cast<std::int64_t>(r), i);
  return out;
}

/// What a rank knows of a live request. Every rank runs the same script, so every rank's copy is
/// the same (an engine's scheduler decides once and broadcasts to its ranks).
struct request_state {
  std::uint64_t tag = 0;                          // content of this history (a new one on re-admission)
  std::array<std::int64_t, kSources> rows{};      // stored rows
  std::array<std::int64_t, kSources> covered{};   // rows with host pages (stored or reserved)
};

struct rank_run {
  std::map<request_id, request_state> live;
  std::array<std::uint64_t, kRanks> owned{};  // rows appended, by the rank that owns their page
  std::uint64_t appended = 0, rows_read = 0, wrong_bytes = 0;
  std::string error;
};

/// One rank's thread: the whole script on its own hierarchy.
void run_rank(H& h, std::barrier<>& sync, rank_run& out) {
  auto& live = out.live;
  std::mt19937_64 rng(2026);  // the same draws on every rank: TP ranks resolve the same selections
  const auto wrote = [&](request_state& r, std::size_t s, std::size_t count) {
    for (std::size_t i = 0; i < count; ++i) ++out.owned[(static_cast<std::size_t>(r.rows[s]) + i) / kP % kRanks];
    out.appended += count;
    r.rows[s] += static_cast<std::int64_t>(count);
    r.covered[s] = std::max(r.covered[s], r.rows[s]);
  };
  const auto admit = [&](request_id id, std::uint64_t generation, std::size_t prefill) {
    if (!h.admit(id).admitted) throw std::runtime_error("admission of " + std::to_string(id) + " had to wait");
    auto& r = live[id] = request_state{};
    r.tag = id * 1000003 + generation;
    for (std::size_t s = 0; s < kSources; ++s) {  // eager: allocates the pages the prefill needs
      h.append(id, s, produce_rows(r.tag, s, 0, prefill), prefill);
      wrote(r, s, prefill);
    }
  };
  const auto reserve = [&](std::size_t ahead) {  // host pages for the next steps, outside the step
    h.reserve_ahead(ahead);
    for (auto& [id, r] : live)
      for (std::size_t s = 0; s < kSources; ++s)
        r.covered[s] = std::max(r.covered[s], std::min<std::int64_t>(kMaxRows, r.rows[s] + std::int64_t(ahead)));
  };

  for (std::size_t i = 0; i < kRequests; ++i) admit(static_cast<request_id>(i + 1), 0, 40 + 13 * i);
  reserve(kReserveEvery);
  for (std::size_t step = 0; step < kSteps; ++step) {
    if (step == kReadmitStep) {
      h.complete(kReadmitted);
      live.erase(kReadmitted);
      sync.arrive_and_wait();  // the old history's pages go with the last rank's complete; then admit
      admit(kReadmitted, 1, 45);
      reserve(kReserveEvery);
    } else if (step % kReserveEvery == 0) {
      reserve(kReserveEvery);
    }
    // The step's KV writes: one row per request and source, one step-wide call.
    std::vector<std::vector<std::byte>> bytes;
    std::vector<step_write_item> writes;
    bytes.reserve(live.size() * kSources);
    for (auto& [id, r] : live)
      for (std::size_t s = 0; s < kSources; ++s) {
        bytes.push_back(produce_rows(r.tag, s, r.rows[s], 1));
        writes.push_back({id, s, bytes.back(), 1});
      }
    h.append_step(writes);
    for (auto& [id, r] : live)
      for (std::size_t s = 0; s < kSources; ++s) wrote(r, s, 1);
    sync.arrive_and_wait();  // the TP collective: every owner's rows (prefills too) are written before anyone resolves
    for (std::size_t s = 0; s < kSources; ++s) {
      std::vector<std::vector<row_index>> sel;
      std::vector<std::vector<location>> loc;
      std::vector<resolve_item> batch;
      for (auto& [id, r] : live) {  // the indexer's top-k: old rows (other ranks' pages) and recent ones
        auto& x = sel.emplace_back(model_layout::top_k);
        for (auto& e : x)
          e = rng() % 8 == 0 ? no_row : static_cast<row_index>(rng() % static_cast<std::uint64_t>(r.rows[s]));
        loc.emplace_back(x.size());
        batch.push_back({id, sel.back(), loc.back()});
      }
      h.resolve(s, batch);
      std::size_t e = 0;
      for (auto& [id, r] : live) {  // attention: reads exactly the returned locations, every layer
        for (std::size_t i = 0; i < sel[e].size(); ++i) {
          if (sel[e][i] == no_row) continue;
          for (std::size_t l = 0; l < layers(s); ++l) {
            const auto got = h.payload(s, l, loc[e][i]);
            for (std::size_t b = 0; b < row_bytes(s); ++b)
              out.wrong_bytes += got[b] != kv_byte(r.tag, s, l, sel[e][i], b);
          }
          ++out.rows_read;
        }
        ++e;
      }
    }
  }
}

}  // namespace

int main() {
  hierarchy_config cfg;
  cfg.max_requests = kSlots;
  cfg.max_rows = kMaxRows;
  cfg.tail_rows = kTail;
  Store store(kRanks, kSlots * kMaxRows / kP);  // pages for every slot at full length, stored once
  std::vector<std::unique_ptr<H>> ranks;
  for (std::size_t k = 0; k < kRanks; ++k) ranks.push_back(std::make_unique<H>(cfg, store, k));

  std::barrier sync(static_cast<std::ptrdiff_t>(kRanks));
  std::vector<rank_run> runs(kRanks);
  std::vector<std::thread> threads;
  for (std::size_t k = 0; k < kRanks; ++k)
    threads.emplace_back([&, k] {
      try {
        run_rank(*ranks[k], sync, runs[k]);
      } catch (const std::exception& e) {
        runs[k].error = e.what();
        sync.arrive_and_drop();  // the other ranks go on (and fail on their own) instead of waiting
      }
    });
  for (auto& t : threads) t.join();

  bool ok = true;
  std::uint64_t rows_read = 0, wrong = 0;
  for (std::size_t k = 0; k < kRanks; ++k) {
    if (!runs[k].error.empty()) {
      std::printf("rank %zu failed: %s\n", k, runs[k].error.c_str());
      ok = false;
    }
    rows_read += runs[k].rows_read;
    wrong += runs[k].wrong_bytes;
  }
  ok = ok && wrong == 0 && rows_read > 0;
  // One copy of each history: the pages the requests cover (stored or reserved), once, not per rank.
  const rank_run& model = runs[0];
  std::size_t one_copy = 0;
  for (const auto& [id, r] : model.live)
    for (std::size_t s = 0; s < kSources; ++s)
      one_copy += (static_cast<std::size_t>(r.covered[s]) + kP - 1) / kP * kP * layers(s) * row_bytes(s);
  const std::size_t in_use = store.host_bytes_in_use();
  ok = ok && in_use == one_copy;
  for (const auto& h : ranks) ok = ok && h->host_bytes_in_use() == in_use;
  // The owner rule: each rank wrote the rows of the pages it owns, and no row was written twice.
  std::uint64_t total = 0;
  std::string per_rank;
  for (std::size_t k = 0; k < kRanks; ++k) {
    total += store.rows_written(k);
    if (k > 0) per_rank += ' ';
    per_rank += std::to_string(store.rows_written(k));
    ok = ok && store.rows_written(k) == model.owned[k];
  }
  ok = ok && total == model.appended;
  for (std::size_t k = 0; k < kRanks; ++k)
    for (const auto& [id, r] : model.live) ranks[k]->complete(id);
  ok = ok && store.host_bytes_in_use() == 0 && store.requests() == 0;

  std::printf("shared_host_store: %zu ranks on %zu threads over one host store, %zu requests (request %llu "
              "completed and re-admitted at step %zu), %zu decode steps\n",
              kRanks, kRanks, kRequests, static_cast<unsigned long long>(kReadmitted), kReadmitStep, kSteps);
  std::printf("  resolved rows read on all ranks: %llu, wrong bytes: %llu\n",
              static_cast<unsigned long long>(rows_read), static_cast<unsigned long long>(wrong));
  std::printf("  host bytes in use: %zu (expected %zu); %zu independent hierarchies would hold %zu\n", in_use,
              one_copy, kRanks, kRanks * in_use);
  std::printf("  rows written per rank: %s (sum %llu, rows appended %llu; page p written by rank p mod %zu)\n",
              per_rank.c_str(), static_cast<unsigned long long>(total),
              static_cast<unsigned long long>(model.appended), kRanks);
  std::printf("%s\n", ok ? "OK" : "FAILED");
  return ok ? 0 : 1;
}
