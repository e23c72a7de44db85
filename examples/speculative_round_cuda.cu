// speculative_round_cuda: how an engine drives one speculative decoding round trip through the
// CUDA backend, round after round (the host twin is speculative_round.cpp; same steps, same checks).
//
//   1. size a hierarchy with K_max > 1 and shared staging arenas, and a draft ring store for the
//      same request slots (ask for the bytes first, then construct);
//   2. admit requests and prefill their history on every source (and the drafter's ring);
//   3. each round, per request: the drafter writes its block into the ring, the target stages the
//      block's KV on every source;
//   4. one source (layer group) at a time: verify the batch, let attention (here a gather kernel)
//      read the returned locations, release the shared staging arenas for the next source;
//   5. accept a prefix, commit it on every source and in the draft ring;
//   6. at the end, the committed history must equal a plain decode of the accepted tokens.
//
// Exits 0 on success, and also when no GPU is present (it says so); 1 a byte did not match,
// 3 a dhisparse or CUDA error.
#include <cuda_runtime.h>

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

#include <dhisparse/cuda/draft_ring_store.cuh>
#include <dhisparse/cuda/hierarchy.cuh>
#include <dhisparse/layouts/tiny.hpp>
#include <dhisparse/policies/draft_ring.hpp>
#include <dhisparse/policies/staging_arena.hpp>

#include "speculative_workload.hpp"

namespace {

namespace dh = dhisparse;
using namespace spec_workload;  // Layout, top_k, the drafter's shape, synthetic KV, queries
namespace dhc = dhisparse::cuda;

constexpr std::size_t max_block = 4;  // K_max: anchor + up to 3 proposals
using Hot = dh::lru_hot_cache<16>;
using Staging = dh::staging_arenas<2>;  // chi = the most payload layers of one source (source 0)
using Hierarchy = dhc::hierarchy<Layout, Hot, dh::fixed_budget_policy, Staging>;
using PerLayerStaging = dhc::hierarchy<Layout, Hot, dh::fixed_budget_policy, dh::dedicated_staging>;  // sizing only
using Ring = dh::draft_ring<16, max_block, 8>;  // the drafter reads W = 16 prior positions; ring pages of 8
using RingStore = dhc::draft_ring_store<Ring>;
static_assert(Ring::max_block == max_block, "the drafter and the target agree on K_max");

constexpr std::size_t requests = 3;
constexpr std::size_t rounds = 40;
constexpr std::size_t query_slots = requests * max_block;  // K_max queries of top_k entries per request

/// A stand-in for an attention kernel of one payload layer: reads the row at every returned
/// location (row_address covers the pool and, for staging locations, the shared arena) into `out`.
__global__ void gather_rows(Hierarchy::view_type view, unsigned layer, const dh::location* locations, std::size_t n,
                            std::byte* out) {
  for (std::size_t i = blockIdx.x; i < n; i += gridDim.x) {
    if (locations[i] == dh::no_location) continue;
    const std::byte* row = view.row_address(layer, locations[i]);
    for (std::size_t b = threadIdx.x; b < view.row_bytes; b += blockDim.x) out[i * view.row_bytes + b] = row[b];
  }
}

int run() {
  std::mt19937_64 rng(2024);

  // 1. Two-phase sizing: ask for the bytes (an engine budgets them), then construct.
  dh::hierarchy_config cfg;
  cfg.max_requests = requests;
  cfg.max_rows = 256;
  cfg.tail_rows = 4;  // a short committed tail, so that verify recovers rows from host memory
  cfg.max_block = max_block;
  const dhc::memory_requirements need = Hierarchy::requirements(cfg);
  const dhc::memory_requirements need_per_layer = PerLayerStaging::requirements(cfg);
  const std::size_t arena_bytes = Hierarchy::staging_arena_bytes(cfg);
  std::size_t per_layer_staging_bytes = 0;  // N * K_max * k rows in every payload layer's own pool
  for (const auto& d : Layout::sources)
    per_layer_staging_bytes += d.payload_layers * cfg.max_requests *
                               dh::dedicated_staging::rows_per_slot(cfg.max_block, top_k) * d.row_bytes;
  const dh::draft_ring_config ring_cfg{.slots = cfg.max_requests, .row_bytes = draft_row_bytes, .layers = draft_layers};
  const dh::draft_ring_requirements ring_need = RingStore::requirements(ring_cfg);
  std::printf("speculative_round_cuda: %zu requests, K_max %zu, %zu rounds\n", requests, max_block, rounds);
  std::printf("  sizing: hierarchy %zu device B (%zu with per-layer staging), %zu pinned B; staging arenas %zu B; "
              "draft ring %zu rows per slot, %zu B\n",
              need.device_bytes, need_per_layer.device_bytes, need.pinned_bytes, arena_bytes, ring_need.rows_per_slot,
              ring_need.bytes);

  cudaStream_t stream = nullptr;
  DHISPARSE_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  Hierarchy h(cfg, stream);
  RingStore ring(ring_cfg, stream);  // one ring slot per hierarchy slot

  // 2. Admit and prefill: the prompt's KV on every source, and its last W positions in the
  //    drafter's ring (all the drafter will read of it).
  std::vector<request_state> reqs(requests);
  for (std::size_t r = 0; r < requests; ++r) {
    auto& rq = reqs[r];
    rq.id = 100 + r;
    const dh::admission a = h.admit(rq.id, stream);
    if (!a) throw dh::invalid_configuration("no free request slot");
    rq.slot = a.slot;
    rq.tokens.resize(24 + 8 * r);
    for (auto& t : rq.tokens) t = rng();
    for (std::size_t s = 0; s < sources; ++s) {
      const auto rows = target_rows(rq.id, s, 0, rq.tokens);
      h.append(rq.id, s, std::span<const std::byte>(rows), rq.tokens.size(), stream);
    }
    const std::size_t live = std::min<std::size_t>(rq.tokens.size(), Ring::window);
    const std::size_t first = rq.tokens.size() - live;
    const auto rows =
        draft_rows(rq.id, static_cast<std::int64_t>(first), std::span<const std::uint64_t>(rq.tokens).subspan(first));
    DHISPARSE_CUDA_TRY(ring.prefill(rq.slot, rq.tokens.size(), rows.data(), live, stream));  // pageable: staged now
  }

  // Device buffers of one verify: K_max query slots of top_k entries per request (K_r used), their
  // locations, and what the gather "attention" read per payload layer.
  constexpr std::size_t max_layers = dh::max_payload_layers_per_source<Layout>();
  constexpr std::size_t widest = dh::widest_row_bytes<Layout>();
  dhc::device_buffer<dh::row_index> d_selections(query_slots * top_k);
  dhc::device_buffer<dh::location> d_locations(query_slots * top_k);
  std::array<dhc::device_buffer<std::byte>, max_layers> d_read;
  for (auto& b : d_read) b = dhc::device_buffer<std::byte>(query_slots * top_k * widest);
  std::vector<dh::row_index> selections(query_slots * top_k);
  std::vector<dh::location> locations(selections.size());
  std::vector<std::byte> read(query_slots * top_k * widest);
  std::vector<dhc::verify_query> queries(query_slots);
  for (std::size_t q = 0; q < query_slots; ++q)
    queries[q] = {d_selections.data() + q * top_k, static_cast<std::int32_t>(top_k), d_locations.data() + q * top_k};
  std::vector<dhc::verify_batch_item> batch(requests);

  dh::verify_stats verified;
  std::size_t proposed = 0, accepted_proposals = 0, accepted_tokens = 0, checked = 0, mismatches = 0;
  for (std::size_t round = 0; round < rounds; ++round) {
    // 3. Per request: the drafter writes its block (anchor + proposals) into the ring, then the
    //    target's forward pass over the block stages its KV on every source.
    for (auto& rq : reqs) {
      const auto n = static_cast<std::int64_t>(rq.tokens.size());  // == h.positions(id, s) on every source
      const std::size_t kr = 1 + rng() % max_block;                // K_r may differ per request and round
      rq.block.resize(kr);
      for (auto& t : rq.block) t = rng();  // block[0]: the anchor, the token the target sampled last round
      const auto draft = draft_rows(rq.id, n, rq.block);
      DHISPARSE_CUDA_TRY(ring.write(rq.slot, static_cast<std::uint64_t>(n), draft.data(), kr, stream));
      for (std::size_t s = 0; s < sources; ++s) {
        const auto rows = target_rows(rq.id, s, n, rq.block);
        h.stage_block(rq.id, s, std::span<const std::byte>(rows), kr, stream);
      }
      proposed += kr - 1;
    }

    // 4. One source (layer group) at a time: verify, attention, release the shared arenas.
    for (std::size_t s = 0; s < sources; ++s) {
      const auto& d = Layout::sources[s];
      std::fill(selections.begin(), selections.end(), dh::no_row);
      for (std::size_t r = 0; r < requests; ++r) {
        const std::size_t kr = reqs[r].block.size();
        for (std::size_t j = 0; j < kr; ++j) {  // each query its own selection (the indexer's top-k)
          const auto q = make_query(rng, static_cast<std::int64_t>(reqs[r].tokens.size()), j);
          std::copy(q.begin(), q.end(), selections.begin() + static_cast<std::ptrdiff_t>((r * max_block + j) * top_k));
        }
        batch[r] = dhc::verify_batch_item{reqs[r].id,
                                          std::span<const dhc::verify_query>(queries).subspan(r * max_block, kr)};
      }
      DHISPARSE_CUDA_TRY(cudaMemcpyAsync(d_selections.data(), selections.data(), d_selections.bytes(),
                                         cudaMemcpyHostToDevice, stream));
      // query slots past a request's K_r are not verified: they read as no_location (-1)
      DHISPARSE_CUDA_TRY(cudaMemsetAsync(d_locations.data(), 0xFF, d_locations.bytes(), stream));
      h.verify(s, std::span<const dhc::verify_batch_item>(batch), stream);

      // Attention of this layer group, enqueued behind the verify: every payload layer reads the
      // rows at the returned locations. Then the arenas may go to the next source's verify.
      for (std::size_t l = 0; l < d.payload_layers; ++l)
        gather_rows<<<static_cast<unsigned>(query_slots), 64, 0, stream>>>(h.view(s), static_cast<unsigned>(l),
                                                                          d_locations.data(), query_slots * top_k,
                                                                          d_read[l].data());
      DHISPARSE_CUDA_TRY(cudaGetLastError());
      h.release_staging(s, stream);  // this source's attention is enqueued: the next source may reuse the arenas

      // Checks outside the hot path: device-side errors of the verify, then the bytes attention read.
      h.check_errors(stream);  // synchronises the stream
      for (const auto& st : h.last_verify_stats(s)) verified += st;
      DHISPARSE_CUDA_TRY(cudaMemcpy(locations.data(), d_locations.data(), locations.size() * sizeof(dh::location),
                                    cudaMemcpyDeviceToHost));
      for (std::size_t l = 0; l < d.payload_layers; ++l) {
        DHISPARSE_CUDA_TRY(cudaMemcpy(read.data(), d_read[l].data(), read.size(), cudaMemcpyDeviceToHost));
        for (std::size_t r = 0; r < requests; ++r)
          for (std::size_t j = 0; j < reqs[r].block.size(); ++j)
            for (std::size_t i = 0; i < top_k; ++i, ++checked) {
              const std::size_t at = (r * max_block + j) * top_k + i;
              const dh::row_index e = selections[at];
              if (e == dh::no_row) {
                mismatches += locations[at] == dh::no_location ? 0 : 1;
                continue;
              }
              const std::span<const std::byte> got(read.data() + at * d.row_bytes, d.row_bytes);
              if (!same_bytes(got, reqs[r].id, s, l, e, token_at(reqs[r], e))) ++mismatches;
            }
      }
    }

    // 5. Acceptance (here random): the anchor and A proposals become committed on every source
    //    and in the draft ring; the rest of the block is discarded.
    for (auto& rq : reqs) {
      const std::size_t accepted = rng() % rq.block.size();  // 0 <= A <= K_r - 1
      for (std::size_t s = 0; s < sources; ++s) h.commit(rq.id, s, accepted, stream);
      ring.commit(rq.slot, accepted);  // books only: no device work
      rq.tokens.insert(rq.tokens.end(), rq.block.begin(), rq.block.begin() + static_cast<std::ptrdiff_t>(accepted + 1));
      accepted_proposals += accepted;
      accepted_tokens += accepted + 1;
    }
  }

  // 6. The committed history equals a plain decode of the accepted tokens, bit for bit: every
  //    host row is the row a plain decode would have appended, and the drafter's window holds the
  //    draft KV of the last W accepted tokens.
  h.check_errors(stream);
  DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));  // commits reached the pinned host store
  std::size_t history_rows = 0;
  std::vector<std::byte> draft_row(draft_row_bytes);
  for (const auto& rq : reqs) {
    for (std::size_t s = 0; s < sources; ++s) {
      if (h.frontier(rq.id, s) != static_cast<std::int64_t>(rq.tokens.size()) ||
          h.device_frontier(rq.id, s) != h.frontier(rq.id, s))
        ++mismatches;
      for (std::size_t row = 0; row < rq.tokens.size(); ++row, ++history_rows)
        for (std::size_t l = 0; l < Layout::sources[s].payload_layers; ++l, ++checked)
          if (!same_bytes(h.host_row(rq.id, s, l, static_cast<dh::row_index>(row)), rq.id, s, l,
                          static_cast<std::int64_t>(row), rq.tokens[row]))
            ++mismatches;
    }
    const dh::draft_window w = ring.window(rq.slot);
    if (ring.committed(rq.slot) != rq.tokens.size() || w.first + w.count != rq.tokens.size()) ++mismatches;
    for (std::uint64_t t = w.first; t < w.first + w.count; ++t)
      for (std::size_t l = 0; l < draft_layers; ++l, ++checked) {
        DHISPARSE_CUDA_TRY(
            cudaMemcpy(draft_row.data(), ring.row(rq.slot, t, l), draft_row_bytes, cudaMemcpyDeviceToHost));
        if (!same_bytes(draft_row, rq.id, drafter, l, static_cast<std::int64_t>(t), rq.tokens[t])) ++mismatches;
      }
  }

  std::printf("  %zu rounds x %zu requests: %zu tokens committed (%zu anchors + %zu of %zu proposals accepted)\n",
              rounds, requests, accepted_tokens, accepted_tokens - accepted_proposals, accepted_proposals, proposed);
  std::printf("  verify: %zu entries (%zu direct, of them %zu block; %zu hot; %zu from host), "
              "%zu rows copied from host, %zu staged rows\n",
              verified.selected, verified.direct, verified.block, verified.hot, verified.host, verified.rows_copied,
              verified.staging_rows);
  std::printf("  staging: %zu B in %zu shared arenas vs %zu B of per-layer staging\n", arena_bytes, Staging::arenas,
              per_layer_staging_bytes);
  std::printf("  checks: %zu reads and %zu committed rows against a plain decode, %zu mismatches\n", checked,
              history_rows, mismatches);

  for (const auto& rq : reqs) {
    h.complete(rq.id, stream);
    ring.reset(rq.slot);
  }
  DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
  DHISPARSE_CUDA_TRY(cudaStreamDestroy(stream));
  if (mismatches != 0) {
    std::printf("FAILED\n");
    return 1;
  }
  std::printf("OK: the speculative history equals plain decoding, bit for bit\n");
  return 0;
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("speculative_round_cuda: no CUDA device, nothing to run\n");
    return 0;
  }
  try {
    return run();
  } catch (const dh::error& e) {
    std::fprintf(stderr, "speculative_round_cuda: %s (%s)\n", e.what(), dh::to_string(e.code()));
    return 3;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "speculative_round_cuda: %s\n", e.what());
    return 3;
  }
}
