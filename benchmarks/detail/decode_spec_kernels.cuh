#pragma once
/// \file
/// Kernels of the speculative decode step (benchmarks/detail/decode_step.cuh, `run_options::spec`):
/// one round per step of a DFlash2-like drafter with a fixed block K for every session.
///
///   ring       the drafter's ring traffic: the block's K positions written in every draft layer
///              allocation, the W positions before them read (its compute is not modelled)
///   writes     the target's KV rows and index keys of the block's positions n .. n+K-1 (the
///              target's forward over the block), then `stage_blocks` (resident: the flat KV)
///   index      query j of entry e (j < K) is the query at position n+j: one drift step from the
///              committed walk, scored over rows < n+j+1 (the committed rows and the block up to j)
///   top-k      the same sort as plain decode over K segments per entry, gathered into a
///              verify_batch_view's buffers (query j of entry e at e * K + j)
///   verify     `verify(source, verify_batch_view, producer_only)` (resident: slot * max_rows + row)
///   attention  attention<row_bytes, value_dims> over K * cap virtual entries (entry e's query j at
///              e * K + j)
///   commit     accepted counts precomputed on the host from the documented distribution, uploaded
///              before the replay; `commit(source, commit_view)`; then the walk and the token count
///              move past the accepted tokens (spec_advance_kernel)
/// Rows of rejected positions are rewritten with the same bytes by a later round (the content is a
/// function of the position), so the exactness check stays a function of (session, layer, row).
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include <dhisparse/types.hpp>

#include "decode_kernels.cuh"

namespace dhisparse_bench::decode {

/// Per-entry inputs of a speculative step (device pointers; POD).
struct spec_state {
  const std::int32_t* accepted = nullptr;  ///< [cap] accepted proposals of entry e this round (< block)
  int* qint = nullptr;                     ///< [cap * block][index_dims] quantised query j of entry e
  unsigned block = 1;                      ///< K
  unsigned sources = 1;                    ///< sources of the step (the walk of each advances)
};

/// Buffers of a round's K selections per entry: a device_verify_batch's (query j of entry e at e * K + j).
struct verify_out {
  std::uint32_t* count = nullptr;
  std::int32_t* slots = nullptr;
  std::int32_t* queries = nullptr;
  std::int32_t* lengths = nullptr;
  dhisparse::row_index* selections = nullptr;
  dhisparse::location* locations = nullptr;
};

/// The drafter's ring traffic of one round: for live entry blockIdx.x and ring allocation
/// blockIdx.y, the block's K positions written, then the W positions before them read (the
/// drafter's attention window); the sum goes to `sink` so the reads are not elided.
template <class Ref>
__global__ void spec_ring_kernel(step_state st, Ref ring, unsigned block, unsigned window, unsigned long long* sink) {
  const unsigned e = blockIdx.x, layer = blockIdx.y;
  if (e >= *st.count || st.slots[e] < 0) return;
  const std::int32_t slot = st.slots[e];
  const std::int64_t n = st.tokens[slot];
  const unsigned words = static_cast<unsigned>(ring.row_bytes / 8);
  for (unsigned u = threadIdx.x; u < block * words; u += blockDim.x) {
    const unsigned j = u / words, w = u % words;
    reinterpret_cast<std::uint64_t*>(ring.row(static_cast<std::size_t>(slot), static_cast<std::uint64_t>(n + j), layer))[w] =
        mix64(st.tag[slot] ^ (static_cast<std::uint64_t>(n + j) << 20) ^ (static_cast<std::uint64_t>(layer) << 8) ^ w);
  }
  const std::int64_t first = n > static_cast<std::int64_t>(window) ? n - window : 0;
  unsigned long long acc = 0;
  for (std::int64_t t = first; t < n; ++t) {
    const auto* row = reinterpret_cast<const uint4*>(ring.row(static_cast<std::size_t>(slot), static_cast<std::uint64_t>(t), layer));
    for (unsigned v = threadIdx.x; v < words / 2; v += blockDim.x) {
      const uint4 x = row[v];
      acc += static_cast<unsigned long long>(x.x ^ x.y ^ x.z ^ x.w);
    }
  }
  if (acc == 0x5EEDull) atomicAdd(sink, acc);  // practically never: keeps the loads, costs no atomics
}

/// The target's output over the block on one source (m = 1): rows n .. n+K-1 of every payload
/// layer (hierarchy: row j of entry e at e * K + j of each layer's buffer, as stage_view reads
/// with `first` null; resident: the flat KV) and their index keys. One CTA per entry.
template <int = 0>
__global__ void spec_produce_kernel(step_state st, write_target wt, unsigned block) {
  const unsigned e = blockIdx.x;
  if (e >= *st.count || st.slots[e] < 0) return;
  const std::int32_t slot = st.slots[e];
  const std::int64_t n = st.tokens[slot];
  const std::uint64_t tag = st.tag[slot];
  const unsigned words = wt.row_bytes / 8;
  for (unsigned u = threadIdx.x; u < block * wt.layers * words; u += blockDim.x) {
    const unsigned w = u % words, j = (u / words) % block, l = u / words / block;
    const std::int64_t row = n + j;
    const std::uint64_t v = kv_word(tag, wt.source, l, row, w);
    if (wt.resident[l] != nullptr)
      reinterpret_cast<std::uint64_t*>(wt.resident[l] + (static_cast<std::size_t>(slot) * st.max_rows + row) * wt.row_bytes)[w] = v;
    else
      reinterpret_cast<std::uint64_t*>(wt.new_rows[l] + (static_cast<std::size_t>(e) * block + j) * wt.row_bytes)[w] = v;
  }
  for (unsigned u = threadIdx.x; u < block * (index_dims / 8); u += blockDim.x) {
    const unsigned j = u / (index_dims / 8), w = u % (index_dims / 8);
    const std::int64_t row = n + j;
    const std::size_t at = (static_cast<std::size_t>(wt.source) * st.cap + slot) * st.max_rows + static_cast<std::size_t>(row);
    reinterpret_cast<std::uint64_t*>(st.keys)[at * (index_dims / 8) + w] = key_word(tag, wt.source, row, w);
    if (w == 0) st.scales[at] = key_scale(tag, wt.source, row);
  }
}

/// Query j (blockIdx.y) of entry e (blockIdx.x): one drift step of the committed walk with the
/// innovation of position n+j, quantised; its sort segment [q * max_rows, q * max_rows + n+j+1)
/// with q = e * K + j (empty for padding). The walk itself moves in spec_advance_kernel.
template <int = 0>
__global__ void spec_query_kernel(step_state st, spec_state sp, unsigned source, int* seg_begin, int* seg_end) {
  const unsigned e = blockIdx.x, j = blockIdx.y, q = e * sp.block + j;
  const bool live = e < *st.count && st.slots[e] >= 0;
  const std::int64_t n = live ? st.tokens[st.slots[e]] : 0;
  if (threadIdx.x == 0) {
    seg_begin[q] = static_cast<int>(static_cast<std::size_t>(q) * st.max_rows);
    seg_end[q] = static_cast<int>(static_cast<std::size_t>(q) * st.max_rows + (live ? n + j + 1 : 0));
  }
  if (!live) return;
  const std::int32_t slot = st.slots[e];
  const std::uint64_t tag = st.tag[slot];
  const std::size_t at = (static_cast<std::size_t>(source) * st.cap + slot) * index_dims;
  for (unsigned d = threadIdx.x; d < index_dims; d += blockDim.x)
    sp.qint[static_cast<std::size_t>(q) * index_dims + d] =
        quantise_query(drift_query(st.qstate[at + d], st.rho, innovation(tag, source, static_cast<std::uint64_t>(n + 1 + j), d)));
}

/// Scores of query q = blockIdx.y (entry q / K, query q % K) over its visible rows, as score_kernel.
template <int = 0>
__global__ void spec_score_kernel(step_state st, spec_state sp, unsigned source, float* scores) {
  const unsigned q = blockIdx.y, e = q / sp.block, j = q % sp.block;
  if (e >= *st.count || st.slots[e] < 0) return;
  const std::int32_t slot = st.slots[e];
  __shared__ int qv[index_dims];
  for (unsigned d = threadIdx.x; d < index_dims; d += blockDim.x) qv[d] = sp.qint[static_cast<std::size_t>(q) * index_dims + d];
  __syncthreads();
  const std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= st.tokens[slot] + j + 1) return;
  const std::size_t at = (static_cast<std::size_t>(source) * st.cap + slot) * st.max_rows + static_cast<std::size_t>(r);
  scores[static_cast<std::size_t>(q) * st.max_rows + static_cast<std::size_t>(r)] =
      static_cast<float>(key_dot(qv, st.keys + at * index_dims)) * st.scales[at];
}

/// The K top-k selections of entry blockIdx.x (query blockIdx.y) from the sorted segments, -1
/// padded to k, into a verify_batch_view's buffers; also its slots, K_r, lengths and count.
template <int = 0>
__global__ void spec_gather_kernel(step_state st, spec_state sp, const int* sorted_rows, unsigned k, verify_out v) {
  const unsigned e = blockIdx.x, j = blockIdx.y, q = e * sp.block + j;
  const std::uint32_t count = *st.count;
  if (e == 0 && j == 0 && threadIdx.x == 0) *v.count = count;
  const bool live = e < count && st.slots[e] >= 0;
  if (threadIdx.x == 0) {
    if (j == 0) {
      v.slots[e] = live ? st.slots[e] : -1;
      v.queries[e] = live ? static_cast<std::int32_t>(sp.block) : 0;
    }
    v.lengths[q] = static_cast<std::int32_t>(k);
  }
  const std::int64_t n = live ? st.tokens[st.slots[e]] + j + 1 : 0;
  for (unsigned i = threadIdx.x; i < k; i += blockDim.x)
    v.selections[static_cast<std::size_t>(q) * k + i] =
        static_cast<std::int64_t>(i) < n ? sorted_rows[static_cast<std::size_t>(q) * st.max_rows + i] : dhisparse::no_row;
}

/// Resident "verify": every selected row of every query is in HBM at slot * max_rows + row;
/// counts the selected entries (all direct) into counters[0] and [1].
template <int = 0>
__global__ void spec_resident_locations_kernel(step_state st, spec_state sp, unsigned k, verify_out v,
                                               unsigned long long* counters) {
  const unsigned e = blockIdx.x, q = e * sp.block + blockIdx.y;
  if (e >= *st.count || st.slots[e] < 0) return;
  const std::size_t at = static_cast<std::size_t>(q) * k;
  write_resident_locations(st.slots[e], st.max_rows, v.selections + at, v.locations + at, k, counters);
}

/// Adds verify entry stats (12 words each: selected, direct, block, hot, host, ...) into the
/// census: counters[0] selected, [1] direct + block (in HBM where they were), [2] hot, [3] host.
template <int = 0>
__global__ void add_verify_stats_kernel(const std::uint32_t* stats, unsigned n, unsigned long long* counters) {
  for (unsigned i = threadIdx.x; i < n; i += blockDim.x) {
    const std::uint32_t* s = stats + i * 12;
    atomicAdd(&counters[0], static_cast<unsigned long long>(s[0]));
    atomicAdd(&counters[1], static_cast<unsigned long long>(s[1]) + s[2]);
    atomicAdd(&counters[2], static_cast<unsigned long long>(s[3]));
    atomicAdd(&counters[3], static_cast<unsigned long long>(s[4]));
  }
}

/// After the commit: each live slot's walk takes the drift step of its last committed position
/// n + accepted (the query of that position, as spec_query_kernel computed it), and its token
/// count moves by accepted + 1. One CTA per entry.
template <int = 0>
__global__ void spec_advance_kernel(step_state st, spec_state sp) {
  const unsigned e = blockIdx.x;
  if (e >= *st.count || st.slots[e] < 0) return;
  const std::int32_t slot = st.slots[e];
  const std::int64_t n = st.tokens[slot];
  const int acc = sp.accepted[e];
  const std::uint64_t tag = st.tag[slot];
  for (unsigned s = 0; s < sp.sources; ++s) {
    const std::size_t at = (static_cast<std::size_t>(s) * st.cap + slot) * index_dims;
    for (unsigned d = threadIdx.x; d < index_dims; d += blockDim.x)
      st.qstate[at + d] = drift_query(st.qstate[at + d], st.rho, innovation(tag, s, static_cast<std::uint64_t>(n + 1 + acc), d));
  }
  __syncthreads();  // every thread read n before it moves
  if (threadIdx.x == 0) st.tokens[slot] = n + acc + 1;
}

}  // namespace dhisparse_bench::decode
