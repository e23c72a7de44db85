#pragma once
/// \file
/// Kernels of the model-scale decode step (benchmarks/bench_decode.cu, tests/cuda/decode_exactness.cu):
/// the model's writes, the indexer (query walk, scores over the stored index keys, segment bounds,
/// top-k gather after CUB's segmented radix sort), resident locations, the sparse MLA decode
/// attention and the checks. Every kernel reads what changes (entries, counts, token positions)
/// from device memory and has a launch shape fixed at capture, so one CUDA graph replays the step.
///
/// Attention is deterministic: every reduction has a fixed order (see the attention section) and
/// uses explicitly rounded intrinsics (no contraction left to the compiler), so two runs that read
/// the same bytes for the same selections with the same split produce bit-identical outputs,
/// whichever memory the bytes came from.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include <dhisparse/types.hpp>

#include "decode_model.hpp"

namespace dhisparse_bench::decode {

/// Most payload layers of one source (GLM-5.3: 4) and most attention heads the kernel holds.
inline constexpr unsigned max_layers = 4;
inline constexpr unsigned max_heads = 16;
static_assert(max_layers == 4, "attention_split_kernel picks the layer's pool among four with constant indices");

/// Per-slot and per-entry state of the step, shared by every kernel (device pointers; POD).
struct step_state {
  std::int32_t* slots = nullptr;   ///< [cap] slot of entry e, -1 padding
  std::uint32_t* count = nullptr;  ///< live entries (first)
  std::int32_t* rows = nullptr;    ///< [cap] stored rows entry e writes this step (0 or 1)
  std::uint64_t* tag = nullptr;    ///< [cap] content tag by slot
  std::int64_t* tokens = nullptr;  ///< [cap] committed token positions by slot
  float* qstate = nullptr;         ///< [sources][cap][index_dims] query walk by slot
  int* qint = nullptr;             ///< [sources][cap][index_dims] quantised query by slot
  std::int8_t* keys = nullptr;     ///< [sources][cap][max_rows][index_dims] stored index keys by slot
  float* scales = nullptr;         ///< [sources][cap][max_rows] their scales
  unsigned cap = 0;                ///< slots = entries
  unsigned max_rows = 0;           ///< stored rows per slot and source
  unsigned positions_per_row = 1;  ///< m
  float rho = 0.0f;                ///< query drift
};

/// Stored rows visible to the step's query once its token is written: floor((tokens + 1) / m).
__device__ inline std::int64_t visible_rows(const step_state& st, std::int32_t slot) {
  return (st.tokens[slot] + 1) / st.positions_per_row;
}

// ------------------------------------------------------------------ setup (outside the graph)

/// History rows [first, first + count) of (tag, source) in payload layers [first_layer,
/// first_layer + layers), layer by layer `layer_stride_words` apart ([layer][count][row_bytes] is
/// what the eager append takes).
template <int = 0>
__global__ void history_rows_kernel(std::uint64_t tag, unsigned source, unsigned first_layer, unsigned layers,
                                    std::int64_t first, std::int64_t count, unsigned words, std::uint64_t* out,
                                    std::size_t layer_stride_words) {
  const std::size_t total = static_cast<std::size_t>(layers) * static_cast<std::size_t>(count) * words;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::size_t w = i % words, r = (i / words) % static_cast<std::size_t>(count), l = i / words / count;
    out[l * layer_stride_words + r * words + w] =
        kv_word(tag, source, first_layer + static_cast<unsigned>(l), first + static_cast<std::int64_t>(r), static_cast<unsigned>(w));
  }
}

/// Index keys and scales of rows [0, count) of `slot` on `source`; the query walk's initial state.
template <int = 0>
__global__ void history_keys_kernel(step_state st, unsigned source, std::int32_t slot, std::int64_t count) {
  const std::uint64_t tag = st.tag[slot];
  const std::size_t base = (static_cast<std::size_t>(source) * st.cap + slot) * st.max_rows;
  const std::size_t total = static_cast<std::size_t>(count) * (index_dims / 8);
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::size_t r = i / (index_dims / 8), w = i % (index_dims / 8);
    reinterpret_cast<std::uint64_t*>(st.keys)[(base + r) * (index_dims / 8) + w] =
        key_word(tag, source, static_cast<std::int64_t>(r), static_cast<unsigned>(w));
    if (w == 0) st.scales[base + r] = key_scale(tag, source, static_cast<std::int64_t>(r));
  }
  if (blockIdx.x == 0)
    for (unsigned d = threadIdx.x; d < index_dims; d += blockDim.x)
      st.qstate[(static_cast<std::size_t>(source) * st.cap + slot) * index_dims + d] = innovation(tag, source, 0, d);
}

// ------------------------------------------------------------------ writes

/// Where a step's new KV rows go: the engine's write buffers (hierarchy: then `append`), or the
/// resident KV directly (row r of slot at `resident[l] + (slot * max_rows + r) * row_bytes`).
struct write_target {
  std::byte* new_rows[max_layers] = {};        ///< [cap][row_bytes] per layer (hierarchy)
  std::byte* resident[max_layers] = {};        ///< flat resident KV per layer, or null
  unsigned layers = 0, row_bytes = 0, source = 0;
};

/// The model's output of one step on one source: for each live entry, the stored row its token
/// completes (rows[e] = 1; 0 while a packed row is still filling) in every payload layer, and that
/// row's index key. One CTA per entry.
template <int = 0>
__global__ void produce_kernel(step_state st, write_target wt) {
  const unsigned e = blockIdx.x;
  const bool live = e < *st.count && st.slots[e] >= 0;
  const std::int32_t slot = live ? st.slots[e] : 0;
  const std::int64_t n = live ? st.tokens[slot] + 1 : 0;  // positions once this token is in
  const bool completes = live && n % st.positions_per_row == 0;
  if (threadIdx.x == 0 && wt.source == 0) st.rows[e] = completes ? 1 : 0;
  if (!completes) return;
  const std::int64_t row = n / st.positions_per_row - 1;
  const std::uint64_t tag = st.tag[slot];
  const unsigned words = wt.row_bytes / 8;
  for (unsigned u = threadIdx.x; u < wt.layers * words; u += blockDim.x) {
    const unsigned l = u / words, w = u % words;
    const std::uint64_t v = kv_word(tag, wt.source, l, row, w);
    if (wt.resident[l] != nullptr)
      reinterpret_cast<std::uint64_t*>(wt.resident[l] + (static_cast<std::size_t>(slot) * st.max_rows + row) * wt.row_bytes)[w] = v;
    else
      reinterpret_cast<std::uint64_t*>(wt.new_rows[l] + static_cast<std::size_t>(e) * wt.row_bytes)[w] = v;
  }
  const std::size_t at = (static_cast<std::size_t>(wt.source) * st.cap + slot) * st.max_rows + static_cast<std::size_t>(row);
  for (unsigned w = threadIdx.x; w < index_dims / 8; w += blockDim.x)
    reinterpret_cast<std::uint64_t*>(st.keys)[at * (index_dims / 8) + w] = key_word(tag, wt.source, row, w);
  if (threadIdx.x == 0) st.scales[at] = key_scale(tag, wt.source, row);
}

/// Advances every live slot by one token (the last kernel of a step).
template <int = 0>
__global__ void advance_kernel(step_state st) {
  for (unsigned e = threadIdx.x; e < st.cap; e += blockDim.x)
    if (e < *st.count && st.slots[e] >= 0) st.tokens[st.slots[e]] += 1;
}

// ------------------------------------------------------------------ indexer

/// Per live entry: one step of its query walk on `source` (step = tokens + 1), quantised; and the
/// sort segment [e * max_rows, e * max_rows + visible) (empty for padding). One CTA per entry.
template <int = 0>
__global__ void query_kernel(step_state st, unsigned source, int* seg_begin, int* seg_end) {
  const unsigned e = blockIdx.x;
  const bool live = e < *st.count && st.slots[e] >= 0;
  if (threadIdx.x == 0) {
    seg_begin[e] = static_cast<int>(e * st.max_rows);
    seg_end[e] = static_cast<int>(e * st.max_rows + (live ? visible_rows(st, st.slots[e]) : 0));
  }
  if (!live) return;
  const std::int32_t slot = st.slots[e];
  const std::uint64_t tag = st.tag[slot];
  const auto step = static_cast<std::uint64_t>(st.tokens[slot] + 1);
  const std::size_t at = (static_cast<std::size_t>(source) * st.cap + slot) * index_dims;
  for (unsigned d = threadIdx.x; d < index_dims; d += blockDim.x) {
    const float q = drift_query(st.qstate[at + d], st.rho, innovation(tag, source, step, d));
    st.qstate[at + d] = q;
    st.qint[at + d] = quantise_query(q);
  }
}

/// Index scores of every visible stored row of every live entry, from the keys in HBM:
/// scores[e * max_rows + r] = scale * dot(q, key). Grid (ceil(max_rows / 256), cap), 256 threads.
/// The integer dot product of a query (index_dims ints, in shared memory) with one stored index
/// key (index_dims int8 values, 16-byte aligned), read 16 bytes at a time.
__device__ inline int key_dot(const int* q, const std::int8_t* stored) {
  const uint4* key = reinterpret_cast<const uint4*>(stored);
  int dot = 0;
#pragma unroll
  for (unsigned v = 0; v < index_dims / 16; ++v) {
    const uint4 k4 = key[v];
    const unsigned parts[4] = {k4.x, k4.y, k4.z, k4.w};
#pragma unroll
    for (unsigned p = 0; p < 4; ++p)
#pragma unroll
      for (unsigned b = 0; b < 4; ++b) dot += q[v * 16 + p * 4 + b] * key_dim(parts[p] >> (8 * b));
  }
  return dot;
}

template <int = 0>
__global__ void score_kernel(step_state st, unsigned source, float* scores) {
  const unsigned e = blockIdx.y;
  if (e >= *st.count || st.slots[e] < 0) return;
  const std::int32_t slot = st.slots[e];
  __shared__ int q[index_dims];
  for (unsigned d = threadIdx.x; d < index_dims; d += blockDim.x)
    q[d] = st.qint[(static_cast<std::size_t>(source) * st.cap + slot) * index_dims + d];
  __syncthreads();
  const std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= visible_rows(st, slot)) return;
  const std::size_t at = (static_cast<std::size_t>(source) * st.cap + slot) * st.max_rows + static_cast<std::size_t>(r);
  scores[static_cast<std::size_t>(e) * st.max_rows + static_cast<std::size_t>(r)] =
      static_cast<float>(key_dot(q, st.keys + at * index_dims)) * st.scales[at];
}

/// The sort's values: row r at e * max_rows + r (constant; set once).
template <int = 0>
__global__ void iota_rows_kernel(int* rows, unsigned cap, unsigned max_rows) {
  const std::size_t total = static_cast<std::size_t>(cap) * max_rows;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    rows[i] = static_cast<int>(i % max_rows);
}

/// Device buffers of one source's batch (a device_batch's, or the resident run's own).
struct batch_out {
  std::int32_t* slots = nullptr;
  std::int32_t* lengths = nullptr;
  dhisparse::row_index* selections = nullptr;
  dhisparse::location* locations = nullptr;
  std::uint32_t* count = nullptr;
};

/// The top-k: the first min(k, visible) rows of each sorted segment (score descending, row
/// ascending: a stable sort over ascending rows), -1 padded to k; also the batch's slots, lengths
/// and count. One CTA per entry.
template <int = 0>
__global__ void gather_top_k_kernel(step_state st, const int* sorted_rows, unsigned k, batch_out b) {
  const unsigned e = blockIdx.x;
  const std::uint32_t count = *st.count;
  if (e == 0 && threadIdx.x == 0) *b.count = count;
  const bool live = e < count && st.slots[e] >= 0;
  if (threadIdx.x == 0) {
    b.slots[e] = live ? st.slots[e] : -1;
    b.lengths[e] = static_cast<std::int32_t>(k);
  }
  const std::int64_t n = live ? visible_rows(st, st.slots[e]) : 0;
  for (unsigned i = threadIdx.x; i < k; i += blockDim.x)
    b.selections[static_cast<std::size_t>(e) * k + i] =
        static_cast<std::int64_t>(i) < n ? sorted_rows[static_cast<std::size_t>(e) * st.max_rows + i] : dhisparse::no_row;
}

/// Resident "resolve": every selected row is in HBM at slot * max_rows + row. Counts the selected
/// entries (all direct) into counters[0] and [1].
/// One selection's resident locations (row r of `slot` at slot * max_rows + r), counted into
/// counters[0] (selected) and [1] (direct); the block's threads share the k entries.
__device__ inline void write_resident_locations(std::int32_t slot, std::int64_t max_rows,
                                                const dhisparse::row_index* selection, dhisparse::location* locations,
                                                unsigned k, unsigned long long* counters) {
  unsigned selected = 0;
  for (unsigned i = threadIdx.x; i < k; i += blockDim.x) {
    const auto r = selection[i];
    locations[i] = r < 0 ? dhisparse::no_location : static_cast<dhisparse::location>(slot * max_rows + r);
    selected += r >= 0 ? 1u : 0u;
  }
  atomicAdd(&counters[0], static_cast<unsigned long long>(selected));
  atomicAdd(&counters[1], static_cast<unsigned long long>(selected));
}

template <int = 0>
__global__ void resident_locations_kernel(step_state st, unsigned k, batch_out b, unsigned long long* counters) {
  const unsigned e = blockIdx.x;
  if (e >= *st.count || st.slots[e] < 0) return;
  const std::size_t at = static_cast<std::size_t>(e) * k;
  write_resident_locations(st.slots[e], st.max_rows, b.selections + at, b.locations + at, k, counters);
}

/// Adds resolve entry stats ([n], selected/direct/hot/host/rows_copied first in each 32-byte entry)
/// into counters[0..4].
template <int = 0>
__global__ void add_entry_stats_kernel(const std::uint32_t* stats, unsigned n, unsigned long long* counters) {
  for (unsigned i = threadIdx.x; i < n; i += blockDim.x)
    for (unsigned f = 0; f < 5; ++f) atomicAdd(&counters[f], static_cast<unsigned long long>(stats[i * 8 + f]));
}

// ------------------------------------------------------------------ attention
//
// Sparse MLA decode attention, flash-decoding style: the k selected rows of each (entry, payload
// layer) are split among `splits` CTAs (attention_split_kernel); each CTA walks its rows in tiles
// of 32 with an online softmax and writes its per-head max, sum and weighted accumulators to
// scratch; attention_combine_kernel merges the splits in ascending order. Deterministic: every
// sum has a fixed order (a thread's FMA chain over ascending dims or rows, the eight warps' dot
// product slices added in warp order, xor butterflies whose partners add the same two values,
// the splits in ascending order), no float atomics, and explicitly rounded intrinsics where the
// compiler could otherwise contract. The `generate` reference differs only in where a row's 16
// bytes come from. The output depends on the split (attention_split), fixed at capture.

/// Rows of one tile of the split kernel, its threads, and the most splits the combine holds.
inline constexpr unsigned attention_tile = 32;
inline constexpr unsigned attention_threads = 256;
inline constexpr unsigned attention_max_splits = 64;
/// SMs the split is planned for: an H100's. A constant rather than the device's count, so a
/// configuration's output (whose summation order depends on the split) is the same on every GPU.
inline constexpr unsigned attention_plan_sms = 132;

/// One source's attention launch: layer l reads row `loc` at `base[l] + loc * row_bytes`
/// (`generate`: the row's bytes are recomputed from (tag, source, layer, selected row) instead, the
/// reference the checks compare with).
struct attention_args {
  const std::int32_t* slots = nullptr;
  const std::uint32_t* count = nullptr;
  const std::uint64_t* tag = nullptr;
  const dhisparse::row_index* selections = nullptr;
  const dhisparse::location* locations = nullptr;
  const std::byte* base[max_layers] = {};
  float* out = nullptr;      ///< [layers][cap][heads][value_dims]
  /// [layers][cap][splits] blocks of attention_partial_floats: per split, each head's weighted
  /// sums ([heads][value_dims]), then the heads' score maxima and exponential sums (16 each).
  float* scratch = nullptr;
  unsigned cap = 0, k = 0, row_bytes = 0, value_dims = 0, heads = 0, source = 0;
  unsigned splits = 1, split_rows = attention_tile;  ///< attention_split's
  bool generate = false;
};

/// How the k selected rows of an (entry, layer) are split among CTAs: `splits` CTAs of `rows`
/// rows each (a multiple of the tile; the last may hold fewer).
struct attention_split_shape {
  unsigned splits = 1, rows = attention_tile;
};

template <unsigned D>
constexpr std::size_t attention_smem_bytes();

/// Split CTAs an SM holds at once: by shared memory (228 KiB an SM, 1 KiB reserved a CTA), at
/// most two (256 threads of up to 128 registers; the 576-byte kernel takes more).
template <unsigned D>
constexpr unsigned attention_ctas_per_sm() {
  const std::size_t by_smem = (228u << 10) / (attention_smem_bytes<D>() + 1024);
  return by_smem >= 2 ? 2u : 1u;
}

/// The split of `entries` x `layers` (entry, layer) pairs of k rows of D bytes: the count that
/// minimises waves x (tiles a split + 1) on attention_plan_sms SMs (the 1: a CTA's fixed cost,
/// queries and partial result), the fewest splits among equals. Small batches get many splits
/// (C1 of GLM-5.3: 32, one wave), large ones one (no partials to write and merge).
template <unsigned D>
constexpr attention_split_shape attention_split(unsigned entries, unsigned layers, unsigned k) {
  const unsigned tiles = k == 0 ? 1 : (k + attention_tile - 1) / attention_tile;
  const std::uint64_t pairs = entries * layers == 0 ? 1 : static_cast<std::uint64_t>(entries) * layers;
  const std::uint64_t slots = static_cast<std::uint64_t>(attention_plan_sms) * attention_ctas_per_sm<D>();
  unsigned best = 1;
  std::uint64_t best_cost = ~std::uint64_t{0};
  for (unsigned s = 1; s <= tiles && s <= attention_max_splits; ++s) {
    const unsigned per = (tiles + s - 1) / s;
    if ((tiles + per - 1) / per != s) continue;  // the same tiles a split as fewer splits
    const std::uint64_t cost = (pairs * s + slots - 1) / slots * (per + 1);
    if (cost < best_cost) {
      best = s;
      best_cost = cost;
    }
  }
  const unsigned per = (tiles + best - 1) / best;
  return {best, per * attention_tile};
}

/// Floats of one split's partial result: weighted sums, then 16 maxima and 16 sums (so every
/// block stays 16-byte aligned for the sums' vector stores, whatever the head count).
__host__ __device__ constexpr std::size_t attention_partial_floats(unsigned heads, unsigned value_dims) {
  return static_cast<std::size_t>(heads) * value_dims + 2 * max_heads;
}

/// Floats of attention_args::scratch for a split over `entries` entries of `layers` layers.
constexpr std::size_t attention_scratch_floats(attention_split_shape s, unsigned entries, unsigned layers, unsigned heads,
                                               unsigned value_dims) {
  return static_cast<std::size_t>(s.splits) * entries * layers * attention_partial_floats(heads, value_dims);
}

/// Dynamic shared memory of attention_split_kernel<D, V>: the tile's rows and the queries as
/// floats (D + 4 a row, so the warps' 16-byte reads of four heads or eight rows hit distinct
/// banks), the warps' dot-product slices, scores, probabilities and the heads' running statistics.
template <unsigned D>
constexpr std::size_t attention_smem_bytes() {
  constexpr std::size_t xs = D + 4, warps = attention_threads / 32;
  return sizeof(float) * (attention_tile * xs + max_heads * xs + warps * max_heads * attention_tile +
                          2 * max_heads * attention_tile + 3 * max_heads);
}

/// Four fp8 e4m3 bytes (little-endian in `w`) as floats, exactly: each byte's magnitude bits,
/// shifted into a half's exponent and mantissa, are the value / 2^8 (fp16's bias is 15, e4m3's 7;
/// e4m3 subnormals land on fp16 subnormals), then scaled back. Equal to fp8_e4m3_to_float.
__device__ inline float4 fp8x4_to_float4(unsigned w) {
  const auto pair = [](unsigned two) {  // bytes at bits 0 and 16
    const unsigned bits = ((two & 0x007F007Fu) << 7) | ((two & 0x00800080u) << 8);
    __half2_raw raw;
    raw.x = static_cast<unsigned short>(bits & 0xFFFFu);
    raw.y = static_cast<unsigned short>(bits >> 16);
    return __half22float2(__half2(raw));
  };
  const float2 lo = pair(__byte_perm(w, 0u, 0x4140u)), hi = pair(__byte_perm(w, 0u, 0x4342u));
  return make_float4(__fmul_rn(lo.x, 256.0f), __fmul_rn(lo.y, 256.0f), __fmul_rn(hi.x, 256.0f), __fmul_rn(hi.y, 256.0f));
}

/// Sparse MLA decode attention of the rows [split * split_rows, +split_rows) of the k selected
/// rows of one (entry, payload layer): the 16 query heads (those past `heads` are zero) scored
/// against all D fp8 dims (latent + rope), an online softmax per head, and the weighted sums of the
/// first V (latent) dims; the partial result goes to scratch. Grid (splits, cap, layers), 256
/// threads, attention_smem_bytes<D>() of dynamic shared memory. Per tile of 32 rows:
///   load     16-byte vectors of the rows, the next tile's loads in flight while this one computes
///            (padding entries are zero rows with score -inf: no weight)
///   scores   warp w takes dims [w D/8, (w+1) D/8); each lane 4 heads x 4 rows of them from
///            16-byte shared reads, FMAs over ascending dims; the 8 slices added in warp order
///   softmax  16 lanes a head: max and sum by xor butterflies, running max / sum rescaled
///   values   each thread 4 value dims of 8 heads (V 512) or 4 (V 256): rescaled, then FMAs
///            over the tile's rows in ascending order
template <unsigned D, unsigned V>
__global__ void __launch_bounds__(attention_threads) attention_split_kernel(attention_args a) {
  constexpr unsigned T = attention_tile, NT = attention_threads, W = NT / 32, XS = D + 4, H16 = max_heads;
  constexpr unsigned chunks = D / 16;                 // 16-byte vectors a row
  constexpr unsigned NV = (T * chunks + NT - 1) / NT;  // vectors a thread loads per tile
  constexpr unsigned DS = D / W;                       // dims of a warp's score slice
  constexpr unsigned DG = V / 4, HQ = NT / DG, HP = H16 / HQ;  // value dims in fours; head groups; heads a group
  static_assert(T == 32 && H16 == 16, "the softmax step gives each head 16 lanes of two rows");
  static_assert(D % 32 == 0 && DS % 4 == 0 && D <= 576, "rows of whole 16-byte vectors; 4-dim steps per warp slice");
  static_assert(V % 4 == 0 && V <= D && NT % DG == 0 && HP % 4 == 0, "value dims: 256 or 512");

  const unsigned split = blockIdx.x, e = blockIdx.y, l = blockIdx.z;
  if (e >= *a.count || a.slots[e] < 0) return;
  const unsigned tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const std::uint64_t tag = a.tag[a.slots[e]];
  const unsigned H = a.heads, src = a.source;
  const bool generate = a.generate;
  // The layer's pool, chosen with constant indices (a runtime index would copy the parameters to local memory).
  const std::byte* base = l == 0 ? a.base[0] : l == 1 ? a.base[1] : l == 2 ? a.base[2] : a.base[3];
  const dhisparse::row_index* sel = a.selections + static_cast<std::size_t>(e) * a.k;
  const dhisparse::location* loc = a.locations + static_cast<std::size_t>(e) * a.k;
  const unsigned first = split * a.split_rows;
  const unsigned last = first + a.split_rows < a.k ? first + a.split_rows : a.k;

  extern __shared__ float4 smem4[];
  float* xs = reinterpret_cast<float*>(smem4);  // [T][XS] the tile's rows
  float* qs = xs + T * XS;                      // [16][XS] queries
  float* part = qs + H16 * XS;                  // [W][16][T] score slices
  float* ss = part + W * H16 * T;               // [16][T] scores
  float* ps = ss + H16 * T;                     // [T][16] probabilities
  float* stat = ps + T * H16;                   // running max [16], sum [16], this tile's rescale [16]
  for (unsigned i = tid; i < H16 * XS; i += NT) {
    const unsigned h = i / XS, d = i % XS;
    qs[i] = h < H && d < D ? attention_query(tag, src, l, h, d, D) : 0.0f;
  }
  if (tid < H16) {
    stat[tid] = -INFINITY;
    stat[H16 + tid] = 0.0f;
    stat[2 * H16 + tid] = 1.0f;
  }

  uint4 buf[NV];
  const auto load = [&](unsigned t0) {
#pragma unroll
    for (unsigned j = 0; j < NV; ++j) {
      const unsigned u = tid + j * NT, r = u / chunks, c = u % chunks, i = t0 + r;
      uint4 v = make_uint4(0u, 0u, 0u, 0u);
      const dhisparse::row_index row = u < T * chunks && i < last ? sel[i] : dhisparse::no_row;
      if (row >= 0) {
        if (generate) {
          const std::uint64_t w0 = kv_word(tag, src, l, row, 2 * c), w1 = kv_word(tag, src, l, row, 2 * c + 1);
          v = make_uint4(static_cast<unsigned>(w0), static_cast<unsigned>(w0 >> 32), static_cast<unsigned>(w1),
                         static_cast<unsigned>(w1 >> 32));
        } else {
          v = __ldg(reinterpret_cast<const uint4*>(base + static_cast<std::size_t>(loc[i]) * D) + c);
        }
      }
      buf[j] = v;
    }
  };
  const auto store = [&] {
#pragma unroll
    for (unsigned j = 0; j < NV; ++j) {
      const unsigned u = tid + j * NT;
      if (u >= T * chunks) continue;
      float4* dst = reinterpret_cast<float4*>(xs + (u / chunks) * XS + (u % chunks) * 16);
      dst[0] = fp8x4_to_float4(buf[j].x);
      dst[1] = fp8x4_to_float4(buf[j].y);
      dst[2] = fp8x4_to_float4(buf[j].z);
      dst[3] = fp8x4_to_float4(buf[j].w);
    }
  };

  // Score lanes: heads hg + 4i, rows rg + 8j (i, j < 4). Value threads: dims 4 dg.., heads hq HP..
  const unsigned hg = lane & 3, rg = lane >> 2, dg = tid % DG, hq = tid / DG;
  float acc[HP][4];
#pragma unroll
  for (unsigned i = 0; i < HP; ++i)
#pragma unroll
    for (unsigned c = 0; c < 4; ++c) acc[i][c] = 0.0f;

  load(first);
  for (unsigned t0 = first; t0 < last; t0 += T) {
    __syncthreads();  // the previous tile's values are done with xs and ps (and the queries are in)
    store();
    if (t0 + T < last) load(t0 + T);  // in flight during this tile
    __syncthreads();

    // Scores: this warp's slice of the dims.
    {
      float s[4][4];
#pragma unroll
      for (unsigned i = 0; i < 4; ++i)
#pragma unroll
        for (unsigned j = 0; j < 4; ++j) s[i][j] = 0.0f;
      const float* qb = qs + hg * XS + warp * DS;
      const float* xb = xs + rg * XS + warp * DS;
#pragma unroll 3
      for (unsigned d = 0; d < DS; d += 4) {
        float4 q4[4], x4[4];
#pragma unroll
        for (unsigned i = 0; i < 4; ++i) q4[i] = *reinterpret_cast<const float4*>(qb + 4 * i * XS + d);
#pragma unroll
        for (unsigned j = 0; j < 4; ++j) x4[j] = *reinterpret_cast<const float4*>(xb + 8 * j * XS + d);
#pragma unroll
        for (unsigned i = 0; i < 4; ++i)
#pragma unroll
          for (unsigned j = 0; j < 4; ++j) {
            s[i][j] = __fmaf_rn(q4[i].x, x4[j].x, s[i][j]);
            s[i][j] = __fmaf_rn(q4[i].y, x4[j].y, s[i][j]);
            s[i][j] = __fmaf_rn(q4[i].z, x4[j].z, s[i][j]);
            s[i][j] = __fmaf_rn(q4[i].w, x4[j].w, s[i][j]);
          }
      }
#pragma unroll
      for (unsigned i = 0; i < 4; ++i)
#pragma unroll
        for (unsigned j = 0; j < 4; ++j) part[(warp * H16 + hg + 4 * i) * T + rg + 8 * j] = s[i][j];
    }
    __syncthreads();
    for (unsigned o = tid; o < H16 * T; o += NT) {
      const unsigned r = o % T, i = t0 + r;
      float v = part[o];
#pragma unroll
      for (unsigned w = 1; w < W; ++w) v = __fadd_rn(v, part[w * H16 * T + o]);
      ss[o] = i < last && sel[i] >= 0 ? v : -INFINITY;
    }
    __syncthreads();

    // Online softmax: 16 lanes a head, rows j and j + 16.
    {
      const unsigned h = tid / 16, j = tid % 16;
      const float s0 = ss[h * T + j], s1 = ss[h * T + j + 16];
      float mx = fmaxf(s0, s1);
#pragma unroll
      for (unsigned o = 8; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      const float m_old = stat[h], m_new = fmaxf(m_old, mx);
      float p0 = 0.0f, p1 = 0.0f, rescale = 1.0f;
      if (m_new != -INFINITY) {  // else every row so far is padding: nothing to weigh or rescale
        rescale = expf(__fsub_rn(m_old, m_new));  // 0 for the first weighted tile
        if (s0 != -INFINITY) p0 = expf(__fsub_rn(s0, m_new));
        if (s1 != -INFINITY) p1 = expf(__fsub_rn(s1, m_new));
      }
      float sum = __fadd_rn(p0, p1);
#pragma unroll
      for (unsigned o = 8; o > 0; o >>= 1) sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, o));
      ps[j * H16 + h] = p0;
      ps[(j + 16) * H16 + h] = p1;
      const float l_old = stat[H16 + h];
      __syncwarp();  // every lane of the head read the statistics before they change
      if (j == 0) {
        stat[h] = m_new;
        stat[H16 + h] = __fadd_rn(__fmul_rn(l_old, rescale), sum);
        stat[2 * H16 + h] = rescale;
      }
    }
    __syncthreads();

    // Values: rescale, then the tile's rows in ascending order.
#pragma unroll
    for (unsigned i = 0; i < HP; ++i) {
      const float f = stat[2 * H16 + hq * HP + i];
#pragma unroll
      for (unsigned c = 0; c < 4; ++c) acc[i][c] = __fmul_rn(acc[i][c], f);
    }
#pragma unroll 4
    for (unsigned r = 0; r < T; ++r) {
      const float4 x = *reinterpret_cast<const float4*>(xs + r * XS + 4 * dg);
#pragma unroll
      for (unsigned i4 = 0; i4 < HP / 4; ++i4) {
        const float4 p = *reinterpret_cast<const float4*>(ps + r * H16 + hq * HP + 4 * i4);
        const float pv[4] = {p.x, p.y, p.z, p.w};
#pragma unroll
        for (unsigned u = 0; u < 4; ++u) {
          float* c = acc[4 * i4 + u];
          c[0] = __fmaf_rn(pv[u], x.x, c[0]);
          c[1] = __fmaf_rn(pv[u], x.y, c[1]);
          c[2] = __fmaf_rn(pv[u], x.z, c[2]);
          c[3] = __fmaf_rn(pv[u], x.w, c[3]);
        }
      }
    }
  }

  // The split's partial result (the statistics were last written before the final barrier).
  float* out = a.scratch + ((static_cast<std::size_t>(l) * a.cap + e) * a.splits + split) * attention_partial_floats(H, V);
#pragma unroll
  for (unsigned i = 0; i < HP; ++i) {
    const unsigned h = hq * HP + i;
    if (h < H)
      *reinterpret_cast<float4*>(out + static_cast<std::size_t>(h) * V + 4 * dg) =
          make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
  }
  if (tid < H) {
    out[H * V + tid] = stat[tid];
    out[H * V + H16 + tid] = stat[H16 + tid];
  }
}

/// Merges the splits of one (entry, layer) in ascending order: per head the largest max M, each
/// split's weight exp(m_s - M) (0 for a split of padding only), output = sum_s w_s acc_s /
/// sum_s w_s l_s. Grid (cap, layers), 256 threads.
template <unsigned V>
__global__ void __launch_bounds__(attention_threads) attention_combine_kernel(attention_args a) {
  const unsigned e = blockIdx.x, l = blockIdx.y, tid = threadIdx.x;
  if (e >= *a.count || a.slots[e] < 0) return;
  const unsigned H = a.heads, S = a.splits;
  const std::size_t stride = attention_partial_floats(H, V);
  const float* part = a.scratch + (static_cast<std::size_t>(l) * a.cap + e) * S * stride;
  __shared__ float weight[attention_max_splits][max_heads];
  __shared__ float total[max_heads];
  if (tid < H) {
    float m = -INFINITY;
    for (unsigned s = 0; s < S; ++s) m = fmaxf(m, part[s * stride + H * V + tid]);
    float sum = 0.0f;
    for (unsigned s = 0; s < S; ++s) {
      const float ms = part[s * stride + H * V + tid];
      const float w = ms == -INFINITY ? 0.0f : expf(__fsub_rn(ms, m));
      weight[s][tid] = w;
      sum = __fmaf_rn(w, part[s * stride + H * V + max_heads + tid], sum);
    }
    total[tid] = sum;
  }
  __syncthreads();
  float* out = a.out + (static_cast<std::size_t>(l) * a.cap + e) * H * V;
  for (unsigned i = tid; i < H * V; i += attention_threads) {
    const unsigned h = i / V;
    float num = 0.0f;
    for (unsigned s = 0; s < S; ++s) num = __fmaf_rn(weight[s][h], part[s * stride + i], num);
    out[i] = total[h] > 0.0f ? __fdiv_rn(num, total[h]) : 0.0f;
  }
}

/// Lets attention_split_kernel<D, V> take its dynamic shared memory (once, before any launch or capture).
template <unsigned D, unsigned V>
cudaError_t attention_prepare() {
  return cudaFuncSetAttribute(attention_split_kernel<D, V>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(attention_smem_bytes<D>()));
}

/// Enqueues the attention of `layers` payload layers for every entry of `a` (row_bytes D,
/// value_dims V; the split and scratch of attention_split / attention_scratch_floats): the split
/// kernel, then the combine. Capturable.
template <unsigned D, unsigned V>
cudaError_t attention(const attention_args& a, unsigned layers, cudaStream_t stream) {
  if (a.row_bytes != D || a.value_dims != V || a.heads == 0 || a.heads > max_heads || layers == 0 || layers > max_layers ||
      a.splits == 0 || a.splits > attention_max_splits || a.split_rows % attention_tile != 0 ||
      static_cast<std::size_t>(a.splits) * a.split_rows < a.k)
    return cudaErrorInvalidValue;
  if (a.cap == 0) return cudaSuccess;
  attention_split_kernel<D, V><<<dim3(a.splits, a.cap, layers), attention_threads, attention_smem_bytes<D>(), stream>>>(a);
  if (const cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
  attention_combine_kernel<V><<<dim3(a.cap, layers), attention_threads, 0, stream>>>(a);
  return cudaGetLastError();
}

/// Bitwise comparison of two attention outputs over the live entries of `layers` layers:
/// counters[5] += differing floats, counters[6] += bytes compared.
template <int = 0>
__global__ void compare_outputs_kernel(const float* got, const float* want, const std::uint32_t* count, const std::int32_t* slots,
                                       unsigned layers, unsigned cap, unsigned per_entry, unsigned long long* counters) {
  const std::uint32_t n = *count;
  unsigned long long bad = 0, checked = 0;
  const std::size_t total = static_cast<std::size_t>(layers) * cap * per_entry;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::size_t e = (i / per_entry) % cap;
    if (e >= n || slots[e] < 0) continue;
    bad += __float_as_uint(got[i]) != __float_as_uint(want[i]) ? 1u : 0u;
    checked += sizeof(float);
  }
  if (bad != 0) atomicAdd(&counters[5], bad);
  if (checked != 0) atomicAdd(&counters[6], checked);
}

}  // namespace dhisparse_bench::decode
