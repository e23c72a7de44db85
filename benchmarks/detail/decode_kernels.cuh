#pragma once
/// \file
/// Kernels of the model-scale decode step (benchmarks/bench_decode.cu, tests/cuda/decode_exactness.cu):
/// the model's writes, the indexer (query walk, scores over the stored index keys, segment bounds,
/// top-k gather after CUB's segmented radix sort), resident locations, the sparse MLA decode
/// attention and the checks. Every kernel reads what changes (entries, counts, token positions)
/// from device memory and has a launch shape fixed at capture, so one CUDA graph replays the step.
///
/// Attention is deterministic: every reduction has a fixed order (warp butterflies, shared-memory
/// trees of fixed shape, the weighted sum in ascending selection order) and uses explicitly
/// rounded intrinsics (no contraction left to the compiler), so two runs that read the same bytes
/// for the same selections produce bit-identical outputs, whichever memory the bytes came from.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include <dhisparse/types.hpp>

#include "decode_model.hpp"

namespace dhisparse_bench::decode {

/// Most payload layers of one source (GLM-5.3: 4) and most attention heads the kernel holds.
inline constexpr unsigned max_layers = 4;
inline constexpr unsigned max_heads = 16;
inline constexpr unsigned attention_threads = 256;
static_assert(max_layers == 4, "attention_kernel picks the layer's pool among four with constant indices");

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
  float* scratch = nullptr;  ///< [cap][max_layers][heads][k]
  unsigned cap = 0, k = 0, row_bytes = 0, value_dims = 0, heads = 0, source = 0;
  bool generate = false;
};

/// Dynamic shared memory of the attention kernel.
constexpr std::size_t attention_smem_bytes(unsigned heads, unsigned row_bytes) {
  return sizeof(float) * (static_cast<std::size_t>(heads) * row_bytes + static_cast<std::size_t>(heads) * attention_threads +
                          attention_threads + 2 * max_heads);
}

/// The attention query of (tag, source, layer, head, dim): fixed per session (the selections carry
/// the step's variation), in [-1, 1) / sqrt(row dims).
__device__ inline float attention_query(std::uint64_t tag, unsigned s, unsigned l, unsigned h, unsigned d, unsigned dims) {
  const float u = unit_float(mix64(tag ^ 0xA77Eull ^ (static_cast<std::uint64_t>(s) << 48) ^
                                   (static_cast<std::uint64_t>(l) << 40) ^ (static_cast<std::uint64_t>(h) << 24) ^ d));
  return __fmul_rn(__fsub_rn(__fmul_rn(2.0f, u), 1.0f), rsqrtf(static_cast<float>(dims)));
}

/// Byte d of the row a layer reads for selection entry (row, loc): from `base` (the layer's pool),
/// or recomputed from (tag, source, layer, row) when `generate`.
__device__ inline std::uint8_t attention_byte(bool generate, const std::byte* base, unsigned row_bytes, unsigned source,
                                              unsigned l, std::uint64_t tag, dhisparse::row_index row,
                                              dhisparse::location loc, unsigned d) {
  if (generate) return static_cast<std::uint8_t>(kv_word(tag, source, l, row, d / 8) >> (8 * (d % 8)));
  return static_cast<std::uint8_t>(base[static_cast<std::size_t>(loc) * row_bytes + d]);
}

/// Sparse MLA decode attention of one (entry, payload layer) per CTA: `heads` query heads over the
/// entry's k selected rows (row_bytes fp8 dims: latent + rope), softmax, and the weighted sum of
/// the first value_dims (latent) dims. Padding (-1) entries take no weight. Grid (cap, layers).
template <int = 0>
__global__ void __launch_bounds__(attention_threads) attention_kernel(attention_args a) {
  const unsigned e = blockIdx.x, l = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  constexpr unsigned warps = attention_threads / 32;
  if (e >= *a.count || a.slots[e] < 0) return;
  const std::uint64_t tag = a.tag[a.slots[e]];
  const unsigned D = a.row_bytes, H = a.heads, K = a.k, V = a.value_dims, src = a.source;
  const bool generate = a.generate;
  // The layer's pool, chosen with constant indices (a runtime index would copy the parameters to local memory).
  const std::byte* base = l == 0 ? a.base[0] : l == 1 ? a.base[1] : l == 2 ? a.base[2] : a.base[3];
  extern __shared__ float smem[];
  float* q = smem;                              // [H][D]
  float* tile = q + H * D;                      // [H][attention_threads]
  float* red = tile + H * attention_threads;    // [attention_threads]
  float* stat = red + attention_threads;        // max [max_heads], 1/sum [max_heads]
  for (unsigned i = tid; i < H * D; i += attention_threads) q[i] = attention_query(tag, src, l, i / D, i % D, D);
  __syncthreads();
  const dhisparse::row_index* sel = a.selections + static_cast<std::size_t>(e) * K;
  const dhisparse::location* loc = a.locations + static_cast<std::size_t>(e) * K;
  float* sc = a.scratch + (static_cast<std::size_t>(e) * max_layers + l) * H * K;

  // Scores: a warp per selected row, lanes over dims d = lane + 32 j; butterfly sums.
  constexpr unsigned max_j = 18;  // 576 / 32
  const unsigned nj = D / 32;
  for (unsigned i = warp; i < K; i += warps) {
    const dhisparse::row_index row = sel[i];
    if (row < 0) {
      if (lane < H) sc[lane * K + i] = -INFINITY;
      continue;
    }
    float x[max_j];
#pragma unroll
    for (unsigned j = 0; j < max_j; ++j)
      x[j] = j < nj ? fp8_e4m3_to_float(attention_byte(generate, base, D, src, l, tag, row, loc[i], lane + 32 * j)) : 0.0f;
    for (unsigned h = 0; h < H; ++h) {
      float p = 0.0f;
#pragma unroll
      for (unsigned j = 0; j < max_j; ++j)
        if (j < nj) p = __fmaf_rn(q[h * D + lane + 32 * j], x[j], p);
#pragma unroll
      for (unsigned o = 16; o > 0; o >>= 1) p = __fadd_rn(p, __shfl_xor_sync(0xffffffffu, p, o));
      if (lane == 0) sc[h * K + i] = p;
    }
  }
  __syncthreads();

  // Softmax statistics per head: strided partials in ascending order, then a fixed tree.
  for (unsigned h = 0; h < H; ++h) {
    float mx = -INFINITY;
    for (unsigned i = tid; i < K; i += attention_threads) mx = fmaxf(mx, sc[h * K + i]);
    red[tid] = mx;
    __syncthreads();
    for (unsigned s = attention_threads / 2; s > 0; s >>= 1) {
      if (tid < s) red[tid] = fmaxf(red[tid], red[tid + s]);
      __syncthreads();
    }
    mx = red[0];
    __syncthreads();
    float sum = 0.0f;
    for (unsigned i = tid; i < K; i += attention_threads) {
      const float v = sc[h * K + i];
      if (v != -INFINITY) sum = __fadd_rn(sum, expf(__fsub_rn(v, mx)));
    }
    red[tid] = sum;
    __syncthreads();
    for (unsigned s = attention_threads / 2; s > 0; s >>= 1) {
      if (tid < s) red[tid] = __fadd_rn(red[tid], red[tid + s]);
      __syncthreads();
    }
    if (tid == 0) {
      stat[h] = mx;
      stat[max_heads + h] = __frcp_rn(red[0]);
    }
    __syncthreads();
  }

  // Output: thread tid owns value dims tid and tid + 256 of every head; rows in ascending order.
  float acc[2][max_heads];
#pragma unroll
  for (unsigned v = 0; v < 2; ++v)
#pragma unroll
    for (unsigned h = 0; h < max_heads; ++h) acc[v][h] = 0.0f;
  for (unsigned t0 = 0; t0 < K; t0 += attention_threads) {
    __syncthreads();
    for (unsigned u = tid; u < H * attention_threads; u += attention_threads) {
      const unsigned h = u / attention_threads, i = t0 + u % attention_threads;
      const float v = i < K ? sc[h * K + i] : -INFINITY;
      tile[u] = v == -INFINITY ? 0.0f : __fmul_rn(expf(__fsub_rn(v, stat[h])), stat[max_heads + h]);
    }
    __syncthreads();
    const unsigned n = K - t0 < attention_threads ? K - t0 : attention_threads;
    // Eight rows at a time: their bytes are loaded together (eight loads in flight), then
    // accumulated in ascending selection order, as one row at a time would.
    constexpr unsigned chunk = 8;
    for (unsigned j0 = 0; j0 < n; j0 += chunk) {
      dhisparse::row_index rows[chunk];
      float xs[chunk][2];
#pragma unroll
      for (unsigned u = 0; u < chunk; ++u) rows[u] = j0 + u < n ? sel[t0 + j0 + u] : dhisparse::no_row;
#pragma unroll
      for (unsigned u = 0; u < chunk; ++u)
#pragma unroll
        for (unsigned vv = 0; vv < 2; ++vv) {
          const unsigned v = tid + vv * attention_threads;
          xs[u][vv] = rows[u] >= 0 && v < V
                          ? fp8_e4m3_to_float(attention_byte(generate, base, D, src, l, tag, rows[u], loc[t0 + j0 + u], v))
                          : 0.0f;
        }
#pragma unroll
      for (unsigned u = 0; u < chunk; ++u) {
        if (rows[u] < 0) continue;  // padding takes no weight (the same for every thread)
#pragma unroll
        for (unsigned vv = 0; vv < 2; ++vv) {
          if (tid + vv * attention_threads >= V) continue;
#pragma unroll
          for (unsigned h = 0; h < max_heads; ++h)
            if (h < H) acc[vv][h] = __fmaf_rn(tile[h * attention_threads + j0 + u], xs[u][vv], acc[vv][h]);
        }
      }
    }
  }
#pragma unroll
  for (unsigned vv = 0; vv < 2; ++vv) {
    const unsigned v = tid + vv * attention_threads;
    if (v >= V) continue;
#pragma unroll
    for (unsigned h = 0; h < max_heads; ++h)  // constant indices keep acc in registers
      if (h < H) a.out[((static_cast<std::size_t>(l) * a.cap + e) * H + h) * V + v] = acc[vv][h];
  }
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
