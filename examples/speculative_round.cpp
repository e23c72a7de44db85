// speculative_round: how an engine drives one speculative decoding round trip through the host
// reference hierarchy, round after round (the CUDA twin is speculative_round_cuda.cu).
//
//   1. size a hierarchy with K_max > 1 and shared staging arenas, and a draft ring store for the
//      same request slots (ask for the bytes first, then construct);
//   2. admit requests and prefill their history on every source (and the drafter's ring);
//   3. each round: the drafter's blocks of all requests go into the ring in one batched write at
//      the positions the ring's books hold (write_step), the target stages each block's KV on
//      every source;
//   4. one source (layer group) at a time: verify the batch, let attention read the returned
//      locations, release the shared staging arenas for the next source;
//   5. accept a prefix, commit it on every source and in the draft ring (one batched commit_step);
//   6. at the end, the committed history must equal a plain decode of the accepted tokens.
//
// Exit status: 0 success, 1 a byte did not match, 3 a dhisparse error.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <random>
#include <span>
#include <vector>

#include <dhisparse/host/draft_ring_store.hpp>
#include <dhisparse/host/hierarchy.hpp>
#include <dhisparse/layouts/tiny.hpp>
#include <dhisparse/policies/draft_ring.hpp>
#include <dhisparse/policies/staging_arena.hpp>

#include "speculative_workload.hpp"

namespace {

namespace dh = dhisparse;
using namespace spec_workload;  // Layout, top_k, the drafter's shape, synthetic KV, queries

constexpr std::size_t max_block = 4;  // K_max: anchor + up to 3 proposals
using Staging = dh::staging_arenas<2>;  // chi = the most payload layers of one source (source 0)
using Hierarchy = dh::host_hierarchy<Layout, dh::lru_hot_cache<16>, dh::fixed_budget_policy, Staging>;
using PerLayerStaging = dh::host_hierarchy<Layout, dh::lru_hot_cache<16>, dh::fixed_budget_policy, dh::dedicated_staging>;  // sizing only
using Ring = dh::draft_ring<16, max_block, 8>;  // the drafter reads W = 16 prior positions; ring pages of 8
using RingStore = dh::draft_ring_store<Ring>;
static_assert(Ring::max_block == max_block, "the drafter and the target agree on K_max");

constexpr std::size_t requests = 3;
constexpr std::size_t rounds = 40;

int run() {
  std::mt19937_64 rng(2024);

  // 1. Two-phase sizing: ask for the bytes (an engine budgets them), then construct.
  dh::hierarchy_config cfg;
  cfg.max_requests = requests;
  cfg.max_rows = 256;
  cfg.tail_rows = 4;  // a short committed tail, so that verify recovers rows from host memory
  cfg.max_block = max_block;
  // chi shared arenas of N * K_max * k rows of the widest row, instead of N * K_max * k staging
  // rows in every payload layer's own pool (dedicated_staging).
  const dh::host_memory_requirements need = Hierarchy::requirements(cfg);
  const std::size_t arena_bytes = need.staging_arena_bytes;
  const std::size_t per_layer_staging_bytes = PerLayerStaging::requirements(cfg).pool_bytes - need.pool_bytes;
  const dh::draft_ring_config ring_cfg{.slots = cfg.max_requests, .row_bytes = draft_row_bytes, .layers = draft_layers};
  const dh::draft_ring_requirements ring_need = RingStore::requirements(ring_cfg);
  std::printf("speculative_round: %zu requests, K_max %zu, %zu rounds\n", requests, max_block, rounds);
  std::printf("  sizing: pools %zu B, staging arenas %zu B (per-layer staging would take %zu B), "
              "draft ring %zu rows per slot, %zu B\n",
              need.pool_bytes, arena_bytes, per_layer_staging_bytes, ring_need.rows_per_slot, ring_need.bytes);

  Hierarchy h(cfg);
  RingStore ring(ring_cfg);  // one ring slot per hierarchy slot
  if (h.pool_bytes() != need.pool_bytes || h.staging_arena_bytes() != arena_bytes || ring.memory().bytes != ring_need.bytes) {
    std::fprintf(stderr, "speculative_round: allocated memory differs from the requirements\n");
    return 1;
  }

  // 2. Admit and prefill: the prompt's KV on every source, and its last W positions in the
  //    drafter's ring (all the drafter will read of it).
  std::vector<request_state> reqs(requests);
  for (std::size_t r = 0; r < requests; ++r) {
    auto& rq = reqs[r];
    rq.id = 100 + r;
    const dh::admission a = h.admit(rq.id);
    if (!a) throw dh::invalid_configuration("no free request slot");
    rq.slot = a.slot;
    rq.tokens.resize(24 + 8 * r);
    for (auto& t : rq.tokens) t = rng();
    for (std::size_t s = 0; s < sources; ++s) h.append(rq.id, s, target_rows(rq.id, s, 0, rq.tokens), rq.tokens.size());
    const std::size_t live = std::min<std::size_t>(rq.tokens.size(), Ring::window);
    const std::size_t first = rq.tokens.size() - live;
    ring.prefill(rq.slot, rq.tokens.size(),
                 draft_rows(rq.id, static_cast<std::int64_t>(first), std::span<const std::uint64_t>(rq.tokens).subspan(first)));
  }

  // Per round and source: K_max query slots of top_k entries per request (K_r of them used).
  std::vector<dh::row_index> selections(requests * max_block * top_k);
  std::vector<dh::location> locations(selections.size());
  std::vector<std::span<const dh::row_index>> queries(requests * max_block);
  std::vector<std::span<dh::location>> outputs(requests * max_block);
  for (std::size_t q = 0; q < queries.size(); ++q) {
    queries[q] = std::span<const dh::row_index>(selections).subspan(q * top_k, top_k);
    outputs[q] = std::span<dh::location>(locations).subspan(q * top_k, top_k);
  }
  std::vector<dh::verify_item> batch(requests);

  dh::verify_stats verified;
  std::size_t proposed = 0, accepted_proposals = 0, accepted_tokens = 0, checked = 0, mismatches = 0;
  for (std::size_t round = 0; round < rounds; ++round) {
    // 3. Per request: the drafter's block (anchor + proposals), then the target's forward pass over
    //    the block stages its KV on every source. The ring takes every request's block in one
    //    batched write at the positions its books hold (the CUDA twin does it on the device).
    std::vector<std::vector<std::byte>> drafts(requests);
    std::vector<dh::draft_write_item> ring_writes;
    for (auto& rq : reqs) {
      const auto n = static_cast<std::int64_t>(rq.tokens.size());  // == h.positions(id, s) on every source
      const std::size_t kr = 1 + rng() % max_block;                // K_r may differ per request and round
      rq.block.resize(kr);
      for (auto& t : rq.block) t = rng();  // block[0]: the anchor, the token the target sampled last round
      drafts[ring_writes.size()] = draft_rows(rq.id, n, rq.block);
      ring_writes.push_back({rq.slot, 0, drafts[ring_writes.size()], kr});  // block offset 0: position n
      for (std::size_t s = 0; s < sources; ++s) h.stage_block(rq.id, s, target_rows(rq.id, s, n, rq.block), kr);
      proposed += kr - 1;
    }
    ring.write_step(ring_writes);

    // 4. One source (layer group) at a time: verify, attention, release the shared arenas.
    for (std::size_t s = 0; s < sources; ++s) {
      for (std::size_t r = 0; r < requests; ++r) {
        const auto& rq = reqs[r];
        const std::size_t kr = rq.block.size();
        for (std::size_t j = 0; j < kr; ++j) {  // each query its own selection (the indexer's top-k)
          const auto q = make_query(rng, static_cast<std::int64_t>(rq.tokens.size()), j);
          std::copy(q.begin(), q.end(), selections.begin() + static_cast<std::ptrdiff_t>((r * max_block + j) * top_k));
        }
        batch[r] = dh::verify_item{rq.id, std::span(queries).subspan(r * max_block, kr),
                                   std::span(outputs).subspan(r * max_block, kr)};
      }
      verified += h.verify(s, batch);

      // Attention of this layer group: every returned location, in every payload layer, holds the
      // selected row's bytes (committed rows, or this round's block rows up to the query).
      for (std::size_t r = 0; r < requests; ++r)
        for (std::size_t j = 0; j < reqs[r].block.size(); ++j)
          for (std::size_t i = 0; i < top_k; ++i) {
            const dh::row_index e = queries[r * max_block + j][i];
            const dh::location loc = outputs[r * max_block + j][i];
            if (e == dh::no_row) {
              ++checked;
              mismatches += loc == dh::no_location ? 0 : 1;
              continue;
            }
            // as a stock attention kernel reads it: the layer's base plus loc rows, staged or not
            const std::size_t rb = Layout::sources[s].row_bytes;
            for (std::size_t l = 0; l < Layout::sources[s].payload_layers; ++l, ++checked)
              if (!same_bytes(std::span<const std::byte>(h.pool(s, l) + static_cast<std::size_t>(loc) * rb, rb),
                              reqs[r].id, s, l, e, token_at(reqs[r], e)))
                ++mismatches;
          }
      h.release_staging(s);  // this source's attention is done: the next source may reuse the arenas
    }

    // 5. Acceptance (here random): the anchor and A proposals become committed on every source
    //    and in the draft ring (one batched commit); the rest of the block is discarded.
    std::vector<dh::draft_commit_item> ring_commits;
    for (auto& rq : reqs) {
      const std::size_t accepted = rng() % rq.block.size();  // 0 <= A <= K_r - 1
      for (std::size_t s = 0; s < sources; ++s) h.commit(rq.id, s, accepted);
      ring_commits.push_back({rq.slot, accepted});
      rq.tokens.insert(rq.tokens.end(), rq.block.begin(), rq.block.begin() + static_cast<std::ptrdiff_t>(accepted + 1));
      accepted_proposals += accepted;
      accepted_tokens += accepted + 1;
    }
    ring.commit_step(ring_commits);
  }

  // 6. The committed history equals a plain decode of the accepted tokens, bit for bit: every
  //    host row is the row a plain decode would have appended, and the drafter's window holds the
  //    draft KV of the last W accepted tokens.
  std::size_t history_rows = 0;
  for (const auto& rq : reqs) {
    for (std::size_t s = 0; s < sources; ++s) {
      if (h.frontier(rq.id, s) != static_cast<std::int64_t>(rq.tokens.size())) ++mismatches;
      for (std::size_t row = 0; row < rq.tokens.size(); ++row, ++history_rows)
        for (std::size_t l = 0; l < Layout::sources[s].payload_layers; ++l, ++checked)
          if (!same_bytes(h.host_row(rq.id, s, l, static_cast<dh::row_index>(row)), rq.id, s, l,
                          static_cast<std::int64_t>(row), rq.tokens[row]))
            ++mismatches;
    }
    const dh::draft_window w = ring.window(rq.slot);
    if (ring.committed(rq.slot) != rq.tokens.size() || w.first + w.count != rq.tokens.size()) ++mismatches;
    for (std::uint64_t t = w.first; t < w.first + w.count; ++t)
      for (std::size_t l = 0; l < draft_layers; ++l, ++checked)
        if (!same_bytes(ring.row(rq.slot, t, l), rq.id, drafter, l, static_cast<std::int64_t>(t), rq.tokens[t]))
          ++mismatches;
  }

  std::printf("  %zu rounds x %zu requests: %zu tokens committed (%zu anchors + %zu of %zu proposals accepted)\n",
              rounds, requests, accepted_tokens, accepted_tokens - accepted_proposals, accepted_proposals, proposed);
  std::printf("  verify: %zu entries (%zu direct, of them %zu block; %zu hot; %zu from host), "
              "%zu rows copied from host, %zu staged rows\n",
              verified.selected, verified.direct, verified.block, verified.hot, verified.host, verified.rows_copied,
              verified.staging_rows);
  std::printf("  staging: %zu B in %zu shared arenas vs %zu B of per-layer staging\n", h.staging_arena_bytes(),
              Staging::arenas, per_layer_staging_bytes);
  std::printf("  checks: %zu reads and %zu committed rows against a plain decode, %zu mismatches\n", checked,
              history_rows, mismatches);

  for (const auto& rq : reqs) {
    h.complete(rq.id);
    ring.reset(rq.slot);
  }
  if (mismatches != 0) {
    std::printf("FAILED\n");
    return 1;
  }
  std::printf("OK: the speculative history equals plain decoding, bit for bit\n");
  return 0;
}

}  // namespace

int main() {
  try {
    return run();
  } catch (const dh::error& e) {
    std::fprintf(stderr, "speculative_round: %s (%s)\n", e.what(), dh::to_string(e.code()));
    return 3;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "speculative_round: %s\n", e.what());
    return 3;
  }
}
