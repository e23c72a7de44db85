// speculative_round_cuda: how an engine drives one speculative decoding round trip through the
// CUDA backend, round after round (the host twin is speculative_round.cpp; same steps, same checks).
//
//   1. size a hierarchy with K_max > 1 and shared staging arenas, and a draft ring store for the
//      same request slots (ask for the bytes first, then construct);
//   2. admit requests and prefill their history on every source (and the drafter's ring);
//   3. each round, ONE CUDA graph, captured once and replayed every round over device buffers: the
//      drafter's block written into its ring at the position the ring's DEVICE books hold
//      (draft ring write_step), the drafter reading its block back through the ring's step ref,
//      the block's KV staged on every source (stage_step, one launch),
//   4. one source (layer group) at a time: verify over a device descriptor, attention (here a
//      gather kernel) reading the returned locations, release of the shared staging arenas,
//   5. the accepted prefix committed on every source and in the draft ring (hierarchy commit_step
//      and ring commit_step over the same device accepted counts: no host count anywhere);
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
#include <dhisparse/cuda/kv_write.cuh>
#include <dhisparse/cuda/verify_batch.cuh>
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

/// A stand-in for the drafter reading its own block: the anchor row (block position 0) of every
/// request in every drafter layer, found through the ring's step ref from the DEVICE books.
__global__ void read_anchor(RingStore::step_ref_type ring, const std::int32_t* slots, std::byte* out) {
  const std::int32_t slot = slots[blockIdx.x];
  for (std::size_t l = 0; l < ring.ring.layers; ++l)
    for (std::size_t b = threadIdx.x; b < ring.ring.row_bytes; b += blockDim.x)
      out[(blockIdx.x * ring.ring.layers + l) * ring.ring.row_bytes + b] = ring.block_row(slot, 0, l)[b];
}

/// A stand-in for a stock attention kernel of one payload layer: it knows nothing of dhisparse,
/// only the layer's base pointer and row stride, and reads `base + loc * row_bytes` for every
/// returned location, staged rows in the shared arena included (`h.pool(s, l)`).
__global__ void gather_rows(const std::byte* base, std::uint32_t row_bytes, const dh::location* locations,
                            std::size_t n, std::byte* out) {
  for (std::size_t i = blockIdx.x; i < n; i += gridDim.x) {
    if (locations[i] == dh::no_location) continue;
    const std::byte* row = base + static_cast<std::size_t>(locations[i]) * row_bytes;
    for (std::size_t b = threadIdx.x; b < row_bytes; b += blockDim.x) out[i * row_bytes + b] = row[b];
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

  // 3-5 as ONE CUDA graph, captured once and replayed every round, over device buffers whose
  // contents change between replays (nothing per request runs on the host inside a round):
  //   write_step   the drafter's block of every request into its ring (one launch), at the
  //                position the ring's device books hold; the drafter reads it back (step ref);
  //   stage_step   the block of every request on every source (one launch);
  //   per source   verify over a verify_batch_view, attention (the gather kernel) on every payload
  //                layer, release of the shared staging arenas for the next source;
  //   commit_step  the accepted prefix of every request on every source (one launch), and in the
  //                draft ring (one launch), with the accepted counts read on the device (an
  //                engine's sampler writes them there).
  constexpr std::size_t max_layers = dh::max_payload_layers_per_source<Layout>();
  constexpr std::size_t widest = dh::widest_row_bytes<Layout>();
  // Block rows of the stage: one buffer per (source, payload layer) (Hierarchy::step_layer_index),
  // request r's block at rows r * K_max .., as the target's forward pass would write them.
  std::vector<dhc::device_buffer<std::byte>> d_block;
  std::vector<std::vector<std::byte>> block_rows(Hierarchy::step_layers);
  std::vector<const std::byte*> block_ptrs(Hierarchy::step_layers);
  for (std::size_t s = 0; s < sources; ++s)
    for (std::size_t l = 0; l < Layout::sources[s].payload_layers; ++l) {  // step_layer_index order
      const std::size_t at = Hierarchy::step_layer_index(s, l);
      block_rows[at].resize(requests * max_block * Layout::sources[s].row_bytes);
      d_block.emplace_back(block_rows[at].size());
      block_ptrs[at] = d_block.back().data();
    }
  dhc::device_buffer<const std::byte*> d_block_ptrs(Hierarchy::step_layers);
  DHISPARSE_CUDA_TRY(cudaMemcpy(d_block_ptrs.data(), block_ptrs.data(), block_ptrs.size() * sizeof(void*),
                                cudaMemcpyHostToDevice));
  // Per request: its slot, its block's K_r and its accepted count (device arrays of the views).
  dhc::device_buffer<std::int32_t> d_slots(requests), d_counts(requests), d_accepted(requests);
  std::vector<std::int32_t> slots(requests), counts(requests), accepted_counts(requests);
  for (std::size_t r = 0; r < requests; ++r) slots[r] = static_cast<std::int32_t>(reqs[r].slot);
  DHISPARSE_CUDA_TRY(cudaMemcpy(d_slots.data(), slots.data(), requests * 4, cudaMemcpyHostToDevice));
  dhc::stage_step_view stage;
  stage.slots = d_slots.data();
  stage.counts = d_counts.data();
  stage.layer_rows = d_block_ptrs.data();
  stage.max_block = max_block;
  stage.capacity = requests;
  const dhc::commit_step_view commit{d_slots.data(), d_accepted.data(), requests};
  // The drafter's block rows: one buffer per drafter layer, request r's block at rows r * K_max, as
  // the drafter's forward pass writes them; the ring takes the same slots and K_r as the stage.
  std::vector<dhc::device_buffer<std::byte>> d_draft;
  std::vector<std::vector<std::byte>> draft_block(draft_layers, std::vector<std::byte>(requests * max_block * draft_row_bytes));
  std::vector<const std::byte*> draft_ptrs;
  for (std::size_t l = 0; l < draft_layers; ++l) {
    d_draft.emplace_back(requests * max_block * draft_row_bytes);
    draft_ptrs.push_back(d_draft.back().data());
  }
  dhc::device_buffer<const std::byte*> d_draft_ptrs(draft_layers);
  DHISPARSE_CUDA_TRY(cudaMemcpy(d_draft_ptrs.data(), draft_ptrs.data(), draft_ptrs.size() * sizeof(void*),
                                cudaMemcpyHostToDevice));
  dhc::draft_write_view ring_write;
  ring_write.slots = d_slots.data();  // ring slot = hierarchy slot
  ring_write.counts = d_counts.data();
  ring_write.layer_rows = d_draft_ptrs.data();
  ring_write.capacity = requests;
  dhc::device_buffer<std::byte> d_anchor(requests * draft_layers * draft_row_bytes);  // what read_anchor saw
  // The verify descriptors (one per source: its queries are the source's own indexer's top-k)
  // and what the gather "attention" read per payload layer.
  std::vector<dhc::device_verify_batch> verify_batches;
  for (std::size_t s = 0; s < sources; ++s)
    verify_batches.emplace_back(static_cast<std::uint32_t>(requests), static_cast<std::uint32_t>(max_block),
                                static_cast<std::uint32_t>(top_k));
  std::array<std::array<dhc::device_buffer<std::byte>, max_layers>, sources> d_read;
  for (auto& per_source : d_read)
    for (auto& b : per_source) b = dhc::device_buffer<std::byte>(query_slots * top_k * widest);

  h.reserve_ahead(8 * max_block, stream);  // host pages of the commits ahead (again every 8 rounds)
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t round_graph = nullptr;
  DHISPARSE_CUDA_TRY(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  ring.write_step(ring_write, stream);
  read_anchor<<<static_cast<unsigned>(requests), 32, 0, stream>>>(ring.step_ref(), d_slots.data(), d_anchor.data());
  DHISPARSE_CUDA_TRY(cudaGetLastError());
  h.stage_step(stage, stream);
  for (std::size_t s = 0; s < sources; ++s) {
    h.verify(s, verify_batches[s].view(), stream);
    // Attention of this layer group, behind the verify: every payload layer reads the rows at
    // the returned locations. Then the arenas may go to the next source's verify.
    for (std::size_t l = 0; l < Layout::sources[s].payload_layers; ++l)
      gather_rows<<<static_cast<unsigned>(query_slots), 64, 0, stream>>>(
          h.pool(s, l), static_cast<std::uint32_t>(Layout::sources[s].row_bytes), verify_batches[s].locations(),
          query_slots * top_k, d_read[s][l].data());
    DHISPARSE_CUDA_TRY(cudaGetLastError());
    h.release_staging(s, stream);
  }
  h.commit_step(commit, stream, stream);  // backup == stream: host copies written inline
  ring.commit_step(commit, stream);       // the same device accepted counts move the ring's books
  DHISPARSE_CUDA_TRY(cudaStreamEndCapture(stream, &graph));
  DHISPARSE_CUDA_TRY(cudaGraphInstantiate(&round_graph, graph, 0));

  std::vector<std::vector<dh::row_index>> selections(sources, std::vector<dh::row_index>(query_slots * top_k));
  std::vector<dh::location> locations(query_slots * top_k);
  std::vector<std::byte> read(query_slots * top_k * widest);
  dh::verify_stats verified;
  std::size_t proposed = 0, accepted_proposals = 0, accepted_tokens = 0, checked = 0, mismatches = 0;
  for (std::size_t round = 0; round < rounds; ++round) {
    if (round % 8 == 7) h.reserve_ahead(8 * max_block, stream);  // between replays, never inside the graph
    // The drafter's block (anchor + proposals; here written into the draft buffers) and the
    // target's KV over it (the stage buffers) stand in for forward passes on the GPU. Acceptance
    // (here random; an engine's sampler on the GPU) is known on the host only because this example
    // checks the round afterwards: neither the hierarchy nor the ring reads it from the host.
    for (std::size_t r = 0; r < requests; ++r) {
      auto& rq = reqs[r];
      const auto n = static_cast<std::int64_t>(rq.tokens.size());  // == h.positions(id, s) on every source
      const std::size_t kr = 1 + rng() % max_block;                // K_r may differ per request and round
      rq.block.resize(kr);
      for (auto& t : rq.block) t = rng();  // block[0]: the anchor, the token the target sampled last round
      const auto draft = draft_rows(rq.id, n, rq.block);  // [layer][kr][row_bytes]
      for (std::size_t l = 0; l < draft_layers; ++l)
        std::memcpy(draft_block[l].data() + r * max_block * draft_row_bytes, draft.data() + l * kr * draft_row_bytes,
                    kr * draft_row_bytes);
      for (std::size_t s = 0; s < sources; ++s) {
        const auto& d = Layout::sources[s];
        const auto rows = target_rows(rq.id, s, n, rq.block);  // [layer][kr][row_bytes]
        for (std::size_t l = 0; l < d.payload_layers; ++l)
          std::memcpy(block_rows[Hierarchy::step_layer_index(s, l)].data() + r * max_block * d.row_bytes,
                      rows.data() + l * kr * d.row_bytes, kr * d.row_bytes);
      }
      counts[r] = static_cast<std::int32_t>(kr);
      accepted_counts[r] = static_cast<std::int32_t>(rng() % kr);  // 0 <= A <= K_r - 1
      proposed += kr - 1;
    }
    for (std::size_t s = 0; s < sources; ++s) {
      std::vector<std::vector<std::span<const dh::row_index>>> queries(requests);
      std::vector<dhc::device_verify_batch::round> batch(requests);
      std::fill(selections[s].begin(), selections[s].end(), dh::no_row);
      for (std::size_t r = 0; r < requests; ++r) {
        for (std::size_t j = 0; j < reqs[r].block.size(); ++j) {  // each query its own selection (the indexer's top-k)
          const auto q = make_query(rng, static_cast<std::int64_t>(reqs[r].tokens.size()), j);
          auto* at = selections[s].data() + (r * max_block + j) * top_k;
          std::copy(q.begin(), q.end(), at);
          queries[r].emplace_back(at, top_k);
        }
        batch[r] = {slots[r], queries[r]};
      }
      verify_batches[s].upload(batch, stream);  // query slots past a request's K_r read as no_location
    }
    for (std::size_t i = 0; i < block_rows.size(); ++i)
      DHISPARSE_CUDA_TRY(cudaMemcpyAsync(d_block[i].data(), block_rows[i].data(), block_rows[i].size(),
                                         cudaMemcpyHostToDevice, stream));  // pageable: copied before it returns
    for (std::size_t l = 0; l < draft_layers; ++l)
      DHISPARSE_CUDA_TRY(cudaMemcpyAsync(d_draft[l].data(), draft_block[l].data(), draft_block[l].size(),
                                         cudaMemcpyHostToDevice, stream));
    DHISPARSE_CUDA_TRY(cudaMemcpyAsync(d_counts.data(), counts.data(), requests * 4, cudaMemcpyHostToDevice, stream));
    DHISPARSE_CUDA_TRY(
        cudaMemcpyAsync(d_accepted.data(), accepted_counts.data(), requests * 4, cudaMemcpyHostToDevice, stream));
    DHISPARSE_CUDA_TRY(cudaGraphLaunch(round_graph, stream));

    // Checks outside the hot path: device-side errors of the round, then the bytes attention read.
    h.check_errors(stream);     // synchronises the stream
    ring.check_errors(stream);  // the ring's write_step / commit_step entries
    {  // the drafter found its anchor through the device books: the row it wrote this round
      std::vector<std::byte> anchors(d_anchor.size());
      DHISPARSE_CUDA_TRY(cudaMemcpy(anchors.data(), d_anchor.data(), anchors.size(), cudaMemcpyDeviceToHost));
      for (std::size_t r = 0; r < requests; ++r)
        for (std::size_t l = 0; l < draft_layers; ++l, ++checked)
          if (!same_bytes(std::span<const std::byte>(anchors.data() + (r * draft_layers + l) * draft_row_bytes,
                                                     draft_row_bytes),
                          reqs[r].id, drafter, l, static_cast<std::int64_t>(reqs[r].tokens.size()), reqs[r].block[0]))
            ++mismatches;
    }
    for (std::size_t s = 0; s < sources; ++s) {
      const auto& d = Layout::sources[s];
      for (const auto& st : h.last_verify_stats(s)) verified += st;
      DHISPARSE_CUDA_TRY(cudaMemcpy(locations.data(), verify_batches[s].locations(),
                                    locations.size() * sizeof(dh::location), cudaMemcpyDeviceToHost));
      for (std::size_t l = 0; l < d.payload_layers; ++l) {
        DHISPARSE_CUDA_TRY(cudaMemcpy(read.data(), d_read[s][l].data(), read.size(), cudaMemcpyDeviceToHost));
        for (std::size_t r = 0; r < requests; ++r)
          for (std::size_t j = 0; j < reqs[r].block.size(); ++j)
            for (std::size_t i = 0; i < top_k; ++i, ++checked) {
              const std::size_t at = (r * max_block + j) * top_k + i;
              const dh::row_index e = selections[s][at];
              if (e == dh::no_row) {
                mismatches += locations[at] == dh::no_location ? 0 : 1;
                continue;
              }
              const std::span<const std::byte> got(read.data() + at * d.row_bytes, d.row_bytes);
              if (!same_bytes(got, reqs[r].id, s, l, e, token_at(reqs[r], e))) ++mismatches;
            }
      }
    }

    // The anchor and A proposals became committed on every source and in the draft ring (both on
    // the device); the rest of the block was discarded. The example's own record follows.
    for (std::size_t r = 0; r < requests; ++r) {
      auto& rq = reqs[r];
      const auto accepted = static_cast<std::size_t>(accepted_counts[r]);
      rq.tokens.insert(rq.tokens.end(), rq.block.begin(), rq.block.begin() + static_cast<std::ptrdiff_t>(accepted + 1));
      accepted_proposals += accepted;
      accepted_tokens += accepted + 1;
    }
  }
  DHISPARSE_CUDA_TRY(cudaGraphExecDestroy(round_graph));
  DHISPARSE_CUDA_TRY(cudaGraphDestroy(graph));

  // 6. The committed history equals a plain decode of the accepted tokens, bit for bit: every
  //    host row is the row a plain decode would have appended, and the drafter's window holds the
  //    draft KV of the last W accepted tokens.
  h.check_errors(stream);
  h.sync_books(stream);     // the host books absorb what the replayed commits did on the device
  ring.sync_books(stream);  // so do the ring's (its host calls are refused until then)
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
    ring.reset(rq.slot, stream);
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
