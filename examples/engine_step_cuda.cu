// engine_step_cuda: an engine's whole decode step on the CUDA backend, captured ONCE in ONE CUDA
// graph and replayed step after step: the integration template to copy (the host twin is
// engine_step.cpp: same model, same calls). A small GLM-like model (4 index-producer sources, each
// leading 2 or 3 payload layers: the producer layer reads through its indexer's selection, the
// others follow its locations) runs decode steps and speculative rounds, with requests completing
// and new ones admitted into their slots between replays.
//
//   decode graph:                               speculative graph (max_block > 1):
//     KV-producing kernels -> new rows of         block kernel -> every block on every source,
//       every source                              ONE stage_step(stage_step_view, stream); per source:
//     ONE append_step(kv_step_write_view,         indexer kernel -> K_r selections per request
//       backup, stream): every source, the host   verify(source, verify_batch_view, producer_only)
//       copy forked onto the backup stream        copy_follower(source, l) for every follower
//     per source: indexer kernel -> selections,   attention reads exactly the returned locations
//       resolve(source, batch_view,             then: sampler kernel -> accepted counts,
//       producer_only), copy_follower(source, l)  ONE commit_step(commit_step_view, backup, stream)
//       for every follower, attention reads       join_backup(stream) at the end of the graph
//       exactly the returned locations
//   then: step stats, advance the engine's sequence lengths, all on the device;
//     join_backup(stream) as the graph's last node (the backup ran beside the resolves)
//
//   between replays (host): complete/admit requests (prefill: eager append), upload the step's
//   entry list (slots, counts, a round's K_r) with cudaMemcpyAsync, reserve_ahead every few steps,
//   check_errors every few steps (it also synchronises the stream).
//
// Every graph reads what changes (entries, their slots and counts, the step number, the sequence
// lengths) from device buffers the engine owns, so the graphs stay valid while requests come and
// go. The attention stand-in checks on the device that every row it reads holds the bytes the
// KV-producing kernel wrote for that (request, source, layer, row); at the end the host store and
// frontiers are checked too. Exits 0 on success and when no GPU is present (it says so); 1 on any
// wrong byte, error or unexercised path.
#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include <dhisparse/cuda/hierarchy.cuh>

namespace {

namespace dh = dhisparse;
namespace dhc = dhisparse::cuda;

// ------------------------------------------------------------------ the model

constexpr std::size_t kSources = 4, kMaxLayers = 3;
constexpr std::size_t kRowBytes = 144;  // 576-byte MLA rows scaled down 4x (a multiple of 16)
constexpr std::size_t kWords = kRowBytes / 8;
constexpr std::size_t K = 64;           // top-k of every indexer
constexpr std::array<std::size_t, kSources> kLayersOf = {3, 2, 3, 2};

/// 4 sources of 2-3 payload layers (a reindex producer + followers), pages of 16 rows.
struct model_layout {
  static constexpr std::size_t top_k = K;
  static constexpr std::size_t page_rows = 16;
  static constexpr std::array<dh::source_desc, kSources> sources = [] {
    std::array<dh::source_desc, kSources> s{};
    for (std::size_t i = 0; i < kSources; ++i) s[i] = dh::source_desc{kRowBytes, 1, kLayersOf[i], 32};
    return s;
  }();
  static constexpr std::array<dh::consumer_desc, 10> consumers = [] {
    std::array<dh::consumer_desc, 10> c{};
    std::size_t n = 0;
    for (std::size_t i = 0; i < kSources; ++i)
      for (std::size_t l = 0; l < kLayersOf[i]; ++l)
        c[n++] = dh::consumer_desc{i, l == 0 ? dh::consumer_kind::reindex : dh::consumer_kind::follower, l};
    return c;
  }();
};
static_assert(dh::check_layout<model_layout>());
static_assert(dh::max_payload_layers_per_source<model_layout>() == kMaxLayers);

// Dedicated staging (the default): every location a verify returns, staging included, lies in
// pool(source, layer), so attention reads `pool + loc * row_bytes` exactly as after a resolve.
using Hierarchy = dhc::hierarchy<model_layout, dh::lru_hot_cache<128>>;

constexpr std::uint32_t kSlots = 8;     // N: request slots = the step's batch capacity
constexpr std::uint32_t kBlock = 4;     // K_max: anchor + up to 3 proposals
constexpr int kSteps = 300;             // every kSpecEvery-th step is a speculative round
constexpr int kSpecEvery = 5, kReserveEvery = 8, kCheckEvery = 25, kChurnEvery = 20;
constexpr std::size_t kMaxPrefill = 1000;

// ------------------------------------------------------------------ deterministic KV content

__host__ __device__ std::uint64_t mix(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
/// Word w of the KV row the model produces for (request tag, source, payload layer, row).
__host__ __device__ std::uint64_t kv_word(std::uint64_t tag, unsigned s, unsigned l, std::int64_t row, unsigned w) {
  const std::uint64_t where =
      (static_cast<std::uint64_t>(s) << 56) ^ (static_cast<std::uint64_t>(l) << 48) ^ static_cast<std::uint64_t>(row);
  return mix(mix(tag ^ mix(where)) + w);
}
/// Bytes that differ between two words.
__host__ __device__ unsigned wrong_bytes(std::uint64_t got, std::uint64_t want) {
  const std::uint64_t d = got ^ want;
  unsigned n = 0;
  for (unsigned b = 0; b < 8; ++b) n += ((d >> (8 * b)) & 0xFFu) != 0 ? 1u : 0u;
  return n;
}

// ------------------------------------------------------------------ engine-owned device state

/// What the host looks at every few steps (device memory, read back then).
struct step_counters {
  unsigned long long wrong_bytes = 0, bad_locations = 0, rows_read = 0, tokens = 0;
  unsigned long long selected = 0, direct = 0, hot = 0, host = 0, block = 0, rows_copied = 0;
};

/// The engine's per-step arrays (device pointers, fixed for the life of the graphs; the contents
/// change between replays). Passed to the kernels by value.
struct step_control {
  std::int32_t* slots = nullptr;     // [kSlots] request slot of each entry, live entries first, -1 padding
  std::int32_t* rows = nullptr;      // [kSlots] new rows of each entry in a decode step (1; padding 0)
  std::uint32_t* count = nullptr;    // live entries
  std::int32_t* block = nullptr;     // [kSlots] K_r of each entry's speculative round
  std::int32_t* accepted = nullptr;  // [kSlots] the sampler's accepted proposals
  std::uint64_t* tag = nullptr;      // [slot] content tag of the request holding the slot
  std::int64_t* length = nullptr;    // [slot] committed positions of the request (the same on every source)
  std::uint64_t* step = nullptr;     // step number, advanced by the last kernel of each replay
  std::uint64_t* out = nullptr;      // attention output: a checksum per (entry, query, source, layer)
  step_counters* counters = nullptr;
};

/// Buffer addresses of the model (fixed once the hierarchy and buffers exist).
struct model_buffers {
  std::uint32_t layers[kSources] = {};
  std::uint32_t pool_rows = 0;
  const std::byte* pool[kSources][kMaxLayers] = {};  // h.pool(s, l): row `loc` at pool + loc * kRowBytes
  std::byte* new_rows[kSources][kMaxLayers] = {};    // a decode step's new rows, entry e at e * kRowBytes
  std::byte* block_rows[kSources][kMaxLayers] = {};  // a round's blocks: entry e's row j at (e * kBlock + j) * kRowBytes
};

// ------------------------------------------------------------------ stand-in kernels

/// Stand-in for the attention layers' KV projections of source s: the new row (at position
/// length[slot]) of every payload layer of every live entry, entry e at row e of each layer's
/// buffer, as kv_step_write_view expects with `first` null and max_rows 1. (Here every source's row
/// exists before the first resolve, so one step-wide write covers them all; in a model whose layer
/// l's row needs layer l-1's output, see docs/integration.md, "Step-wide writes".)
__global__ void produce_kv_kernel(step_control c, model_buffers m, unsigned s) {
  const unsigned e = blockIdx.x;
  const std::int32_t slot = c.slots[e];
  if (slot < 0) return;
  const std::int64_t row = c.length[slot];
  for (unsigned u = threadIdx.x; u < m.layers[s] * kWords; u += blockDim.x) {
    const unsigned l = u / kWords, w = u % kWords;
    reinterpret_cast<std::uint64_t*>(m.new_rows[s][l] + e * kRowBytes)[w] = kv_word(c.tag[slot], s, l, row, w);
  }
}

/// The model's prefill output of one request on one source: rows [0, n) laid out [layer][n][row].
__global__ void prefill_kernel(std::uint64_t tag, unsigned s, unsigned layers, std::int64_t n, std::uint64_t* out) {
  const std::size_t total = static_cast<std::size_t>(layers) * static_cast<std::size_t>(n) * kWords;
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::size_t w = i % kWords, r = (i / kWords) % static_cast<std::size_t>(n), l = i / kWords / n;
    out[i] = kv_word(tag, s, static_cast<unsigned>(l), static_cast<std::int64_t>(r), static_cast<unsigned>(w));
  }
}

/// Stand-in for the target model's forward over a speculative block: positions length .. length
/// + K_r - 1 of every payload layer of source blockIdx.y, entry e's row j at row e * kBlock + j of
/// each (source, layer) buffer, as stage_step_view expects with `first` null and max_block kBlock.
/// (The content depends only on the position, so a rejected proposal's position later holds the
/// same bytes: the checks stay a function of (request, source, layer, row).)
__global__ void produce_block_kernel(step_control c, model_buffers m) {
  const unsigned e = blockIdx.x, s = blockIdx.y;
  const std::int32_t slot = c.slots[e];
  if (slot < 0) return;
  const auto kr = static_cast<unsigned>(c.block[e]);
  const std::int64_t n = c.length[slot];
  for (unsigned u = threadIdx.x; u < m.layers[s] * kr * kWords; u += blockDim.x) {
    const unsigned w = u % kWords, j = (u / kWords) % kr, l = u / kWords / kr;
    reinterpret_cast<std::uint64_t*>(m.block_rows[s][l] + (e * kBlock + j) * kRowBytes)[w] =
        kv_word(c.tag[slot], s, l, n + j, w);
  }
}

/// Row at position i of an indexer's ordered top-k over `n` visible rows: min(K, n) distinct rows
/// less a few -1 at the end. Mostly the newest rows (the tail ring, and just past it: hot-cache
/// hits), a window of older rows that moves every 16 steps (hits after its first misses) and
/// the rest anywhere (misses, copied from host memory).
__device__ dh::row_index pick_row(std::uint64_t tag, unsigned s, unsigned j, std::uint64_t step, unsigned i,
                                  std::int64_t n) {
  const std::int64_t avail = n < static_cast<std::int64_t>(K) ? n : static_cast<std::int64_t>(K);
  const std::uint64_t h = mix(tag ^ mix(step * 131 + s * 7 + j));
  const auto pad_max = static_cast<std::int64_t>(h % (K / 8 + 1));
  const std::int64_t len = avail - (pad_max < avail - 1 ? pad_max : avail - 1);
  if (static_cast<std::int64_t>(i) >= len) return dh::no_row;
  constexpr std::int64_t prime = 1000003;  // > any length or row count here: i -> p is a permutation
  const std::int64_t p = (static_cast<std::int64_t>(i) * prime + static_cast<std::int64_t>((h >> 8) % len)) % len;
  const std::int64_t recent = 3 * len / 4;
  if (p < recent) return static_cast<dh::row_index>(n - 1 - p);
  const std::int64_t old = n - recent, window = (len - recent) / 2, q = p - recent;
  const auto focus = static_cast<std::int64_t>(mix(tag ^ mix((step / 16) * 977 + s)) % (old - window + 1));
  if (q < window) return static_cast<dh::row_index>(focus + q);
  const std::int64_t rest = old - window;  // rows outside the window: as many as the picks left, or more
  const std::int64_t x = (static_cast<std::int64_t>(h % rest) + (q - window) * prime) % rest;
  return static_cast<dh::row_index>(x < focus ? x : x + window);
}

/// Where an indexer writes: a batch_view's buffers (decode: one query per entry) or a
/// verify_batch_view's (K_r queries per entry, query j of entry e at e * max_block + j).
struct selection_out {
  std::int32_t* slots = nullptr;
  std::int32_t* queries = nullptr;  // verify: K_r per entry; decode: null
  std::int32_t* lengths = nullptr;  // per query
  dh::row_index* selections = nullptr;
  std::uint32_t* count = nullptr;
  std::uint32_t max_block = 1;
};

/// Stand-in for source s's indexer: each live entry's selection (query j of a round sees the
/// committed rows and block positions up to j; a decode step's query sees the row it just wrote).
/// One CTA per (entry, query), one thread per selection entry. Also writes the batch's slots and count.
__global__ void indexer_kernel(step_control c, unsigned s, selection_out o, bool speculative) {
  const unsigned e = blockIdx.x, j = blockIdx.y;
  const std::uint32_t count = *c.count;
  if (e == 0 && j == 0 && threadIdx.x == 0) *o.count = count;
  if (e >= count) return;
  const std::int32_t slot = c.slots[e];
  const std::int32_t queries = speculative ? c.block[e] : 1;
  if (static_cast<std::int32_t>(j) >= queries) return;
  if (j == 0 && threadIdx.x == 0) {
    o.slots[e] = slot;
    if (o.queries != nullptr) o.queries[e] = queries;
  }
  const std::size_t q = static_cast<std::size_t>(e) * o.max_block + j;
  if (threadIdx.x == 0) o.lengths[q] = static_cast<std::int32_t>(K);  // full stride, -1 padded
  const std::int64_t visible = c.length[slot] + 1 + j;
  for (unsigned i = threadIdx.x; i < K; i += blockDim.x)
    o.selections[q * K + i] = pick_row(c.tag[slot], s, j, *c.step, i, visible);
}

/// Stand-in for sparse attention of every payload layer of source s: reads exactly the returned
/// locations (`pool(s, l) + loc * row_bytes`), writes a checksum per (entry, query, layer), and
/// counts every byte that differs from what the model wrote for that row. Query j of entry e at
/// (e * qstride + j) * K.
__global__ void attention_kernel(step_control c, model_buffers m, unsigned s, const dh::row_index* selections,
                                 const dh::location* locations, unsigned qstride, bool speculative) {
  const unsigned e = blockIdx.x, j = blockIdx.y;
  if (e >= *c.count) return;
  const std::int32_t slot = c.slots[e];
  if (static_cast<std::int32_t>(j) >= (speculative ? c.block[e] : 1)) return;
  const std::size_t q = static_cast<std::size_t>(e) * qstride + j;
  const dh::row_index* sel = selections + q * K;
  const dh::location* loc = locations + q * K;
  const std::uint64_t tag = c.tag[slot];
  __shared__ unsigned long long checksum[kMaxLayers], wrong, bad, rows;
  if (threadIdx.x < kMaxLayers) checksum[threadIdx.x] = 0;
  if (threadIdx.x == 0) wrong = bad = rows = 0;
  __syncthreads();
  for (unsigned u = threadIdx.x; u < m.layers[s] * K; u += blockDim.x) {
    const unsigned l = u / K, i = u % K;
    const dh::row_index r = sel[i];
    const dh::location at = loc[i];
    if (r == dh::no_row) {  // padding resolves to no location
      if (at != dh::no_location) atomicAdd(&bad, 1ull);
      continue;
    }
    if (at < 0 || static_cast<std::uint32_t>(at) >= m.pool_rows) {
      atomicAdd(&bad, 1ull);
      continue;
    }
    const auto* row = reinterpret_cast<const std::uint64_t*>(m.pool[s][l] + static_cast<std::size_t>(at) * kRowBytes);
    unsigned long long sum = 0, diff = 0;
    for (unsigned w = 0; w < kWords; ++w) {
      const std::uint64_t v = row[w];
      sum += v;
      diff += wrong_bytes(v, kv_word(tag, s, l, r, w));
    }
    atomicAdd(&checksum[l], sum);
    atomicAdd(&rows, 1ull);
    if (diff != 0) atomicAdd(&wrong, diff);
  }
  __syncthreads();
  if (threadIdx.x < m.layers[s]) c.out[(q * kSources + s) * kMaxLayers + threadIdx.x] = checksum[threadIdx.x];
  if (threadIdx.x == 0) {
    atomicAdd(&c.counters->rows_read, rows);
    if (wrong != 0) atomicAdd(&c.counters->wrong_bytes, wrong);
    if (bad != 0) atomicAdd(&c.counters->bad_locations, bad);
  }
}

/// Adds a step's per-entry resolve stats (copy_stats_async of every source) to the totals.
__global__ void add_resolve_stats_kernel(const dhc::entry_stats* st, unsigned n, step_counters* t) {
  for (unsigned i = threadIdx.x; i < n; i += blockDim.x) {
    if (st[i].selected == 0) continue;
    atomicAdd(&t->selected, static_cast<unsigned long long>(st[i].selected));
    atomicAdd(&t->direct, static_cast<unsigned long long>(st[i].direct));
    atomicAdd(&t->hot, static_cast<unsigned long long>(st[i].hot));
    atomicAdd(&t->host, static_cast<unsigned long long>(st[i].host));
    atomicAdd(&t->rows_copied, static_cast<unsigned long long>(st[i].rows_copied));
  }
}
/// The same for a round's verify stats (copy_verify_stats_async).
__global__ void add_verify_stats_kernel(const dhc::verify_entry_stats* st, unsigned n, step_counters* t) {
  for (unsigned i = threadIdx.x; i < n; i += blockDim.x) {
    if (st[i].selected == 0) continue;
    atomicAdd(&t->selected, static_cast<unsigned long long>(st[i].selected));
    atomicAdd(&t->direct, static_cast<unsigned long long>(st[i].direct));
    atomicAdd(&t->block, static_cast<unsigned long long>(st[i].block));
    atomicAdd(&t->hot, static_cast<unsigned long long>(st[i].hot));
    atomicAdd(&t->host, static_cast<unsigned long long>(st[i].host));
    atomicAdd(&t->rows_copied, static_cast<unsigned long long>(st[i].rows_copied));
  }
}

/// Stand-in for the sampler: accepts a pseudo-random prefix of each entry's proposals.
__global__ void sampler_kernel(step_control c) {
  const unsigned e = threadIdx.x;
  if (e >= kSlots) return;
  const std::int32_t slot = c.slots[e];
  c.accepted[e] = slot < 0 ? 0
                           : static_cast<std::int32_t>(mix(c.tag[slot] ^ mix(*c.step + 0xACCull)) %
                                                       static_cast<std::uint64_t>(c.block[e]));
}

/// The engine's sequence lengths follow the step (decode: its rows; a round: anchor + accepted),
/// and the step number advances: the next replay selects differently with no host upload.
__global__ void advance_kernel(step_control c, bool speculative) {
  const unsigned e = threadIdx.x;
  if (e < kSlots) {
    const std::int32_t slot = c.slots[e];
    if (slot >= 0) {
      const std::int64_t added = speculative ? c.accepted[e] + 1 : c.rows[e];
      c.length[slot] += added;
      atomicAdd(&c.counters->tokens, static_cast<unsigned long long>(added));
    }
  }
  __syncthreads();
  if (e == 0) ++*c.step;
}

void launched() { DHISPARSE_CUDA_TRY(cudaGetLastError()); }

// ------------------------------------------------------------------ the engine

class engine {
 public:
  engine(const dh::hierarchy_config& cfg, cudaStream_t stream, cudaStream_t backup)
      : h_(cfg, stream), stream_(stream), backup_(backup) {
    c_.slots = slots_.data();
    c_.rows = rows_.data();
    c_.count = count_.data();
    c_.block = block_.data();
    c_.accepted = accepted_.data();
    c_.tag = tag_.data();
    c_.length = length_.data();
    c_.step = step_.data();
    c_.out = out_.data();
    c_.counters = counters_.data();
    m_.pool_rows = static_cast<std::uint32_t>(h_.pool_rows());
    std::vector<const std::byte*> step_ptrs(Hierarchy::step_layers), block_ptrs(Hierarchy::step_layers);
    for (std::size_t s = 0; s < kSources; ++s) {
      m_.layers[s] = static_cast<std::uint32_t>(kLayersOf[s]);
      for (std::size_t l = 0; l < kLayersOf[s]; ++l) {
        m_.pool[s][l] = h_.pool(s, l);
        m_.new_rows[s][l] = new_rows_.data() + (s * kMaxLayers + l) * kSlots * kRowBytes;
        m_.block_rows[s][l] = block_bytes_.data() + (s * kMaxLayers + l) * kSlots * kBlock * kRowBytes;
        step_ptrs[Hierarchy::step_layer_index(s, l)] = m_.new_rows[s][l];
        block_ptrs[Hierarchy::step_layer_index(s, l)] = m_.block_rows[s][l];
      }
    }
    // kv_step_write_view and stage_step_view read one buffer address per (source, payload layer)
    // from device memory.
    DHISPARSE_CUDA_TRY(cudaMemcpy(layer_rows_.data(), step_ptrs.data(), step_ptrs.size() * sizeof(void*),
                                  cudaMemcpyHostToDevice));
    DHISPARSE_CUDA_TRY(cudaMemcpy(block_layer_rows_.data(), block_ptrs.data(), block_ptrs.size() * sizeof(void*),
                                  cudaMemcpyHostToDevice));
    DHISPARSE_CUDA_TRY(cudaMemsetAsync(step_.data(), 0, step_.bytes(), stream_));
    DHISPARSE_CUDA_TRY(cudaMemsetAsync(counters_.data(), 0, counters_.bytes(), stream_));
    DHISPARSE_CUDA_TRY(cudaMemsetAsync(block_.data(), 0, block_.bytes(), stream_));
    DHISPARSE_CUDA_TRY(cudaMemsetAsync(accepted_.data(), 0, accepted_.bytes(), stream_));
    upload_entries();
  }

  Hierarchy& hierarchy() { return h_; }
  [[nodiscard]] std::size_t live() const { return live_.size(); }

  // ---- the step graphs (enqueued once, under capture)

  /// One decode step: the new KV rows of every source and ONE step-wide write; per source the
  /// indexer, the resolve, the follower copies and attention; then stats, the engine's lengths and
  /// the join of the host backup.
  void enqueue_decode_step() {
    for (unsigned s = 0; s < kSources; ++s) {
      produce_kv_kernel<<<kSlots, 128, 0, stream_>>>(c_, m_, s);
      launched();
    }
    // Slots, counts and rows are read on the device: one capturable launch for every request and
    // source. The host copy of the new rows is made on backup_, beside the resolves below.
    dhc::kv_step_write_view w;
    w.slots = slots_.data();
    w.rows = rows_.data();  // rows_pitch 0: the same count on every source
    w.layer_rows = layer_rows_.data();
    w.max_rows = 1;
    w.capacity = kSlots;
    h_.append_step(w, backup_, stream_);
    for (unsigned s = 0; s < kSources; ++s) {
      const auto& b = batch_[s];
      indexer_kernel<<<dim3(kSlots, 1), K, 0, stream_>>>(
          c_, s, selection_out{b.slots(), nullptr, b.lengths(), b.selections(), b.count(), 1}, false);
      launched();
      // Producer layer first; in a real model the follower layers run later in the forward pass,
      // each copying just before it attends.
      h_.resolve(s, b.view(), stream_, dh::copy_layers::producer_only);
      for (std::size_t l = 1; l < kLayersOf[s]; ++l) h_.copy_follower(s, l, stream_);
      attention_kernel<<<dim3(kSlots, 1), 128, 0, stream_>>>(c_, m_, s, b.selections(), b.locations(), 1, false);
      launched();
      h_.copy_stats_async(s, std::span<dhc::entry_stats>(resolve_stats_.data() + s * kSlots, kSlots), stream_);
    }
    add_resolve_stats_kernel<<<1, 128, 0, stream_>>>(resolve_stats_.data(), kSources * kSlots, c_.counters);
    launched();
    advance_kernel<<<1, kSlots, 0, stream_>>>(c_, false);
    launched();
    h_.join_backup(stream_);  // last: nothing of the step waited for the backup
  }

  /// One speculative round: the target's forward over every block and ONE step-wide stage of
  /// every block on every source; per source the indexer's K_r queries, the verify, the follower
  /// copies and attention; then the sampler's accepted counts and one step-wide commit.
  void enqueue_speculative_round() {
    produce_block_kernel<<<dim3(kSlots, kSources), 128, 0, stream_>>>(c_, m_);
    launched();
    dhc::stage_step_view stage;
    stage.slots = slots_.data();
    stage.counts = block_.data();  // K_r of each entry, the drafter's (uploaded between replays)
    stage.layer_rows = block_layer_rows_.data();
    stage.max_block = kBlock;
    stage.capacity = kSlots;
    h_.stage_step(stage, stream_);
    for (unsigned s = 0; s < kSources; ++s) {
      const auto& v = verify_[s];
      indexer_kernel<<<dim3(kSlots, kBlock), K, 0, stream_>>>(
          c_, s, selection_out{v.slots(), v.queries(), v.lengths(), v.selections(), v.count(), kBlock}, true);
      launched();
      h_.verify(s, v.view(), stream_, dh::copy_layers::producer_only);
      for (std::size_t l = 1; l < kLayersOf[s]; ++l) h_.copy_follower(s, l, stream_);
      attention_kernel<<<dim3(kSlots, kBlock), 128, 0, stream_>>>(c_, m_, s, v.selections(), v.locations(), kBlock,
                                                                  true);
      launched();
      h_.copy_verify_stats_async(s, std::span<dhc::verify_entry_stats>(verify_stats_.data() + s * kSlots, kSlots),
                                 stream_);
    }
    add_verify_stats_kernel<<<1, 128, 0, stream_>>>(verify_stats_.data(), kSources * kSlots, c_.counters);
    launched();
    sampler_kernel<<<1, kSlots, 0, stream_>>>(c_);
    launched();
    // The same tokens are accepted on every source: ONE step-wide commit over the sampler's output.
    h_.commit_step(dhc::commit_step_view{slots_.data(), accepted_.data(), kSlots}, backup_, stream_);
    advance_kernel<<<1, kSlots, 0, stream_>>>(c_, true);
    launched();
    h_.join_backup(stream_);
  }

  // ---- between replays (host)

  /// The drafter's block widths of the next round: K_r of every live entry (padding 0), uploaded
  /// before the replay. Nothing else of the round runs on the host: the blocks are produced and
  /// staged inside the speculative graph.
  void draft_round(std::mt19937_64& rng) {
    for (std::size_t e = 0; e < kSlots; ++e) h_block_[e] = e < live_.size() ? static_cast<std::int32_t>(1 + rng() % kBlock) : 0;
    DHISPARSE_CUDA_TRY(cudaMemcpyAsync(block_.data(), h_block_.data(), block_.bytes(), cudaMemcpyHostToDevice, stream_));
  }

  /// Admits a request (if a slot is free), writes its prefill on every source (eager appends,
  /// which allocate their own host pages) and reserves pages for the coming steps.
  bool admit(std::mt19937_64& rng) {
    const dh::request_id id = next_id_++;
    const dh::admission a = h_.admit(id, stream_);
    if (!a) return false;
    const std::uint64_t tag = mix(id * 0x51ull + 7);
    const auto n = static_cast<std::int64_t>(200 + rng() % (kMaxPrefill - 200));
    for (unsigned s = 0; s < kSources; ++s) {
      prefill_kernel<<<64, 256, 0, stream_>>>(tag, s, static_cast<unsigned>(kLayersOf[s]), n, prefill_.data());
      launched();
      h_.append(id, s, reinterpret_cast<const std::byte*>(prefill_.data()), static_cast<std::size_t>(n), stream_);
      h_.reserve_rows(id, s, kReserveEvery * kBlock, stream_);  // covers it until the next reserve_ahead
    }
    h_tag_[a.slot] = tag;
    h_length_[a.slot] = n;
    DHISPARSE_CUDA_TRY(cudaMemcpyAsync(tag_.data() + a.slot, &h_tag_[a.slot], sizeof(std::uint64_t),
                                       cudaMemcpyHostToDevice, stream_));
    DHISPARSE_CUDA_TRY(cudaMemcpyAsync(length_.data() + a.slot, &h_length_[a.slot], sizeof(std::int64_t),
                                       cudaMemcpyHostToDevice, stream_));
    live_.push_back({id, a.slot});
    return true;
  }

  /// Completes a random live request (its slot is free for the next admission).
  void complete_one(std::mt19937_64& rng) {
    const std::size_t e = rng() % live_.size();
    h_.complete(live_[e].id, stream_);
    live_.erase(live_.begin() + static_cast<std::ptrdiff_t>(e));
  }

  /// Uploads the step's entry list after admissions and completions: live entries first, -1
  /// padding after, and their count. The graphs read these buffers, so they stay valid.
  void upload_entries() {
    for (std::size_t e = 0; e < kSlots; ++e) {
      h_slots_[e] = e < live_.size() ? static_cast<std::int32_t>(live_[e].slot) : -1;
      h_rows_[e] = e < live_.size() ? 1 : 0;
    }
    h_count_ = static_cast<std::uint32_t>(live_.size());
    // Pageable sources: staged before each call returns; the host arrays also outlive the copies.
    DHISPARSE_CUDA_TRY(cudaMemcpyAsync(slots_.data(), h_slots_.data(), slots_.bytes(), cudaMemcpyHostToDevice, stream_));
    DHISPARSE_CUDA_TRY(cudaMemcpyAsync(rows_.data(), h_rows_.data(), rows_.bytes(), cudaMemcpyHostToDevice, stream_));
    DHISPARSE_CUDA_TRY(cudaMemcpyAsync(count_.data(), &h_count_, sizeof(h_count_), cudaMemcpyHostToDevice, stream_));
  }

  /// The counters so far (synchronises the stream).
  step_counters read_counters() {
    DHISPARSE_CUDA_TRY(cudaMemcpyAsync(counters_readback_.data(), counters_.data(), sizeof(step_counters),
                                       cudaMemcpyDeviceToHost, stream_));
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream_));
    step_counters c;
    std::memcpy(&c, counters_readback_.data(), sizeof(c));
    return c;
  }

  /// After the run: the engine's lengths equal the hierarchy's frontiers, and the host store holds
  /// every committed row of every live request byte for byte. Returns the wrong bytes found.
  std::size_t check_histories() {
    h_.sync_books(stream_);
    std::vector<std::int64_t> length(kSlots);
    DHISPARSE_CUDA_TRY(cudaMemcpyAsync(length.data(), length_.data(), length_.bytes(), cudaMemcpyDeviceToHost, stream_));
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream_));
    std::size_t wrong = 0;
    for (const auto& r : live_)
      for (unsigned s = 0; s < kSources; ++s) {
        const std::int64_t f = h_.frontier(r.id, s);
        if (f != length[r.slot]) {
          std::printf("request %llu source %u: frontier %lld, the engine counted %lld\n",
                      static_cast<unsigned long long>(r.id), s, static_cast<long long>(f),
                      static_cast<long long>(length[r.slot]));
          wrong += kRowBytes;
        }
        for (unsigned l = 0; l < kLayersOf[s]; ++l)
          for (std::int64_t row = 0; row < f; ++row) {
            const auto bytes = h_.host_row(r.id, s, l, static_cast<dh::row_index>(row));
            for (unsigned w = 0; w < kWords; ++w) {
              std::uint64_t v = 0;
              std::memcpy(&v, bytes.data() + w * 8, 8);
              wrong += wrong_bytes(v, kv_word(h_tag_[r.slot], s, l, row, w));
            }
          }
      }
    return wrong;
  }

 private:
  struct live_request {
    dh::request_id id;
    std::size_t slot;
  };

  Hierarchy h_;
  cudaStream_t stream_;
  cudaStream_t backup_;  // host backups of the step-wide writes and commits
  std::vector<live_request> live_;  // in entry order
  dh::request_id next_id_ = 1;

  // Engine-owned device buffers, allocated once and captured in the graphs as they are.
  dhc::device_buffer<std::int32_t> slots_{kSlots}, rows_{kSlots}, block_{kSlots}, accepted_{kSlots};
  dhc::device_buffer<std::uint32_t> count_{1};
  dhc::device_buffer<std::uint64_t> tag_{kSlots}, step_{1};
  dhc::device_buffer<std::int64_t> length_{kSlots};
  dhc::device_buffer<std::uint64_t> out_{static_cast<std::size_t>(kSlots) * kBlock * kSources * kMaxLayers};
  dhc::device_buffer<step_counters> counters_{1};
  dhc::device_buffer<std::byte> new_rows_{kSources * kMaxLayers * kSlots * kRowBytes};
  dhc::device_buffer<std::byte> block_bytes_{kSources * kMaxLayers * kSlots * kBlock * kRowBytes};
  dhc::device_buffer<const std::byte*> layer_rows_{Hierarchy::step_layers};
  dhc::device_buffer<const std::byte*> block_layer_rows_{Hierarchy::step_layers};
  dhc::device_buffer<std::uint64_t> prefill_{kMaxLayers * kMaxPrefill * kWords};
  dhc::device_buffer<dhc::entry_stats> resolve_stats_{kSources * kSlots};
  dhc::device_buffer<dhc::verify_entry_stats> verify_stats_{kSources * kSlots};
  std::array<dhc::device_batch, kSources> batch_ = make_batches<dhc::device_batch>(kSlots, K);
  std::array<dhc::device_verify_batch, kSources> verify_ = make_batches<dhc::device_verify_batch>(kSlots, kBlock, K);
  dhc::pinned_buffer counters_readback_{sizeof(step_counters)};
  step_control c_;
  model_buffers m_;

  // Host sources of the uploads (kept alive for as long as the copies may read them).
  std::array<std::int32_t, kSlots> h_slots_{}, h_rows_{}, h_block_{};
  std::array<std::uint64_t, kSlots> h_tag_{};
  std::array<std::int64_t, kSlots> h_length_{};
  std::uint32_t h_count_ = 0;

  template <class B, class... A>
  static std::array<B, kSources> make_batches(A... a) {
    return [&]<std::size_t... I>(std::index_sequence<I...>) { return std::array<B, kSources>{((void)I, B(a...))...}; }(
        std::make_index_sequence<kSources>{});
  }
};

int run() {
  dh::hierarchy_config cfg;
  cfg.max_requests = kSlots;
  cfg.max_rows = 2048;  // prefill + every step's rows, with room to spare
  cfg.tail_rows = 32;
  cfg.max_block = kBlock;
  cudaStream_t stream = nullptr, backup = nullptr;  // live as long as the process (the hierarchy uses them)
  DHISPARSE_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  DHISPARSE_CUDA_TRY(cudaStreamCreateWithFlags(&backup, cudaStreamNonBlocking));
  engine eng(cfg, stream, backup);
  Hierarchy& h = eng.hierarchy();
  std::mt19937_64 rng(2026);
  for (std::uint32_t i = 0; i < kSlots - 2; ++i) eng.admit(rng);
  eng.upload_entries();
  h.reserve_ahead(kReserveEvery * kBlock, stream);

  // Capture each step once. Nothing in them allocates or synchronises; every input is read from
  // device memory when the graph runs.
  const auto capture = [&](auto&& enqueue) {
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    DHISPARSE_CUDA_TRY(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    try {
      enqueue();
    } catch (...) {
      (void)cudaStreamEndCapture(stream, &graph);  // leave the stream usable, then report
      if (graph != nullptr) (void)cudaGraphDestroy(graph);
      throw;
    }
    DHISPARSE_CUDA_TRY(cudaStreamEndCapture(stream, &graph));
    DHISPARSE_CUDA_TRY(cudaGraphInstantiate(&exec, graph, 0));
    DHISPARSE_CUDA_TRY(cudaGraphDestroy(graph));
    return exec;
  };
  cudaGraphExec_t decode = capture([&] { eng.enqueue_decode_step(); });
  cudaGraphExec_t speculative = capture([&] { eng.enqueue_speculative_round(); });

  // No explicit sync_books in the loop: every eager call that reads the host books (reserve_ahead,
  // complete, append, reserve_rows) absorbs the device frontiers first on its stream.
  // An engine that reads frontier()/positions() itself, or its own books, calls
  // h.sync_books(stream) first (check_histories does).
  int decode_replays = 0, speculative_replays = 0, admitted = 0, completed = 0;
  for (int step = 0; step < kSteps; ++step) {
    // Host pages for the next kReserveEvery steps of every request, whatever they are (a decode
    // row or a whole accepted block each); absorbs the device frontiers first.
    if (step % kReserveEvery == 0) h.reserve_ahead(kReserveEvery * kBlock, stream);
    if (step % kSpecEvery == kSpecEvery - 1) {
      eng.draft_round(rng);
      DHISPARSE_CUDA_TRY(cudaGraphLaunch(speculative, stream));
      ++speculative_replays;
    } else {
      DHISPARSE_CUDA_TRY(cudaGraphLaunch(decode, stream));
      ++decode_replays;
    }
    // Device-side errors of every batched append, resolve, verify and commit since the last
    // check, as typed exceptions (copy_errors_async would not do here: it takes resolve errors
    // only). Synchronises the stream, so the counters are read here too.
    if (step % kCheckEvery == kCheckEvery - 1) {
      h.check_errors(stream);
      const step_counters c = eng.read_counters();
      if (c.wrong_bytes != 0 || c.bad_locations != 0) {
        std::printf("FAILED at step %d: %llu wrong bytes, %llu bad locations\n", step, c.wrong_bytes, c.bad_locations);
        return 1;
      }
    }
    // Between replays: one request completes, one or two arrive in freed slots.
    if (step % kChurnEvery == kChurnEvery - 1) {
      eng.complete_one(rng);
      ++completed;
      admitted += eng.admit(rng) ? 1 : 0;
      if (eng.live() < kSlots && rng() % 2 == 0) admitted += eng.admit(rng) ? 1 : 0;
      eng.upload_entries();
    }
  }
  h.check_errors(stream);
  const step_counters c = eng.read_counters();
  const std::size_t history_wrong = eng.check_histories();
  DHISPARSE_CUDA_TRY(cudaGraphExecDestroy(decode));
  DHISPARSE_CUDA_TRY(cudaGraphExecDestroy(speculative));

  std::printf("engine_step_cuda: %d steps (%d decode + %d speculative graph replays), %d admitted, %d completed, "
              "%zu live\n",
              kSteps, decode_replays, speculative_replays, admitted, completed, eng.live());
  std::printf("  %llu tokens committed; %llu entries selected: %llu direct (%llu in staged blocks), %llu hot, "
              "%llu from host (%llu rows copied)\n",
              c.tokens, c.selected, c.direct, c.block, c.hot, c.host, c.rows_copied);
  std::printf("  attention read %llu rows: %llu wrong bytes, %llu bad locations; host store: %zu wrong bytes\n",
              c.rows_read, c.wrong_bytes, c.bad_locations, history_wrong);
  if (c.wrong_bytes != 0 || c.bad_locations != 0 || history_wrong != 0) {
    std::printf("FAILED: a location or a stored row did not hold its bytes\n");
    return 1;
  }
  if (c.rows_read == 0 || c.hot == 0 || c.host == 0 || c.block == 0) {
    std::printf("FAILED: a path was not exercised (rows read, hot hits, host copies, staged blocks)\n");
    return 1;
  }
  std::printf("OK: every row attention read held the bytes the model wrote\n");
  return 0;
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("engine_step_cuda: no CUDA device, nothing to run\n");
    return 0;
  }
  try {
    return run();
  } catch (const dh::error& e) {
    std::printf("FAILED: %s (%s)\n", e.what(), dh::to_string(e.code()));
    return 1;
  } catch (const std::exception& e) {
    std::printf("FAILED: %s\n", e.what());
    return 1;
  }
}
