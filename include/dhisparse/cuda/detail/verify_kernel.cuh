#pragma once
/// \file
/// The speculative verification kernels of the CUDA backend (docs/speculative.md): staging a
/// block into the tail ring, verifying K_r queries per request against one retrieval union,
/// copying the union's missing rows from pinned host memory, and committing the accepted prefix.
///
/// Verify is two launches on one stream, with no host synchronisation or allocation between or
/// inside them (capturable):
///
///  * metadata (`verify_metadata_kernel`, one CTA per batch entry at a time; a fixed grid of
///    min(N, SMs) CTAs walks the entries): the CTA validates the entry (nothing is written for a
///    bad entry; the typed error is recorded per entry as the resolver does), classifies every
///    entry of every query (block or committed tail row -> ring, ready optional page, hot way
///    through the reverse map `way_of_row`, or missing), and marks missing rows in a per-slot bitmap. The bitmap deduplicates the union across queries
///    and, read in word order, *is* the ascending order of the distinct missing rows: a block scan
///    of the words' population counts gives each missing row its rank with no sort. The first
///    non-hit ways of the LRU order are the victims of the lowest ranks (cub::BlockScan partition,
///    the rule of the host reference); ranks past the non-hit ways go to the slot's staging rows in
///    order. Every query entry then gets its own location, and the entry's plan lists the distinct
///    missing rows in ascending order (one host copy each). The bitmap words it touched are zeroed
///    again before the CTA ends.
///  * copy (`verify_copy_kernel`, flat grid): the plans of all entries, flattened request-major into
///    (row, layer) units, two units in flight per warp; the same kernel replays a plan into
///    follower layers.
///
/// The entry points share nothing with the fused resolver except the device views.
#include <cuda/atomic>
#include <cub/block/block_scan.cuh>

#include <climits>
#include <cstddef>
#include <cstdint>

#include "../verify_views.cuh"
#include "../views.cuh"
#include "last_at_or_below.cuh"
#include "programmatic_launch.cuh"
#include "rows_copied_scan.cuh"

namespace dhisparse::cuda::detail {

/// Threads per CTA of the verification metadata kernel.
inline constexpr int verify_block_threads = 1024;
/// Threads per CTA of the verification copy, stage and commit kernels.
inline constexpr int verify_copy_threads = 256;

__host__ __device__ constexpr std::size_t verify_round16(std::size_t x) { return (x + 15) / 16 * 16; }

/// Dynamic shared memory of the metadata kernel for a hot cache of `hot_rows` ways: the slot's LRU
/// order, the victim of each rank and a hit flag per way.
template <class OrderIndex>
constexpr std::size_t verify_shared_bytes(std::size_t hot_rows) {
  return verify_round16(hot_rows * sizeof(OrderIndex)) * 2 + verify_round16(hot_rows);
}

__device__ __forceinline__ void verify_record_error(const verify_workspace_view& ws, unsigned t, const entry_error& rec) {
  ws.errors[t] = rec;
  ::cuda::atomic_ref<std::uint32_t, ::cuda::thread_scope_device> sticky(ws.control->sticky_epoch);
  std::uint32_t expected = 0;
  // The first failing launch since the last check keeps its records (check_errors reports it).
  if (sticky.compare_exchange_strong(expected, rec.epoch, ::cuda::memory_order_relaxed) || expected == rec.epoch)
    ws.sticky[t] = rec;
}

// --------------------------------------------------------------------------------------------
// metadata: one CTA per batch entry at a time

template <int Block, int HotRows, class OrderIndex>
__device__ void verify_entry(const source_view<OrderIndex>& src, const verify_workspace_view& ws,
                             const verify_batch_view& batch, std::uint32_t layers_to_copy, std::uint32_t top_k,
                             unsigned t, unsigned C) {
  using scan_t = cub::BlockScan<int, Block>;
  constexpr int B = HotRows;
  constexpr int WPT = (HotRows + Block - 1) / Block;  // LRU positions per thread (contiguous)
  static_assert(WPT <= 32, "dhisparse::cuda: verification supports B <= 32 * block threads");
  constexpr int QMAX = static_cast<int>(max_verify_block);
  constexpr int U = 4;  // entries per thread in flight in each pass

  __shared__ typename scan_t::TempStorage scan;
  __shared__ const row_index* q_sel[QMAX];
  __shared__ location* q_out[QMAX];
  __shared__ int q_begin[QMAX + 1];
  __shared__ long long s_frontier, s_positions, s_value;
  __shared__ int s_slot, s_kr, s_code, s_index, s_dup, s_bad;
  __shared__ unsigned s_epoch, s_count[6];
  extern __shared__ __align__(16) unsigned char dhisparse_verify_smem[];
  auto* ord = reinterpret_cast<OrderIndex*>(dhisparse_verify_smem);
  auto* victim = reinterpret_cast<OrderIndex*>(dhisparse_verify_smem + verify_round16(B * sizeof(OrderIndex)));
  auto* is_hit = dhisparse_verify_smem + 2 * verify_round16(B * sizeof(OrderIndex));

  const int tid = static_cast<int>(threadIdx.x);
  const location_space space = src.space;
  // Round trip 1: slot, K_r, liveness and frontier.
  if (tid == 0) {
    s_epoch = next_epoch(__ldcg(&ws.control->epoch));
    const int slot = batch.slots[t];
    const int kr = batch.queries[t];
    int code = status_ok;
    long long value = 0;
    s_frontier = 0;
    s_positions = 0;
    if (slot < 0 || static_cast<std::size_t>(slot) >= space.slots || src.live[slot] == 0) {
      code = to_status(errc::unknown_request);
      value = slot;
    } else {
      s_frontier = src.frontier[slot];
      // committed positions n: complete rows times m plus the boundary row's committed positions
      s_positions = s_frontier * static_cast<long long>(ws.positions_per_row) + ws.partial[slot];
      if (kr < 1) {
        code = to_status(errc::size_mismatch);
        value = kr;
      } else if (kr > static_cast<int>(batch.max_block) || kr > QMAX) {
        code = to_status(errc::block_too_wide);
        value = kr;
      } else if (const std::int32_t staged = ws.staged[slot]; staged == 0) {
        code = to_status(errc::no_staged_block);
      } else if (kr > staged) {
        code = to_status(errc::block_too_wide);
        value = kr;
      }
    }
    s_slot = slot;
    s_kr = code == status_ok ? kr : 0;
    s_code = code;
    s_index = -1;
    s_value = value;
    s_dup = 0;
    s_bad = INT_MAX;
    for (int c = 0; c < 6; ++c) s_count[c] = 0;
  }
  __syncthreads();
  // Round trip 2: every query's length and pointers, one thread each.
  if (tid < s_kr) {
    const std::size_t q = static_cast<std::size_t>(t) * batch.max_block + static_cast<std::size_t>(tid);
    q_begin[tid + 1] = batch.lengths[q];  // the length for now; prefix below
    q_sel[tid] = batch.selection_ptrs[q];
    q_out[tid] = batch.location_ptrs[q];
  }
  __syncthreads();
  if (tid == 0) {
    q_begin[0] = 0;
    for (int j = 0; j < s_kr; ++j) {
      const int len = q_begin[j + 1];
      if (s_code == status_ok) {
        if (len < 0 || (len > 0 && (q_sel[j] == nullptr || q_out[j] == nullptr))) {
          s_code = to_status(errc::size_mismatch);
          s_value = len;
          s_index = j << 24;
        } else if (static_cast<std::uint32_t>(len) > top_k) {
          s_code = to_status(errc::selection_too_long);
          s_value = len;
          s_index = j << 24;
        }
      }
      q_begin[j + 1] = q_begin[j] + (s_code == status_ok ? len : 0);
    }
    if (s_code != status_ok) s_kr = 0;
  }
  __syncthreads();
  if (s_code != to_status(errc::unknown_request))
    for (unsigned j = static_cast<unsigned>(tid); j < C; j += Block)  // the same request twice: both fail
      if (j != t && batch.slots[j] == s_slot) s_dup = 1;
  const int slot = s_code == to_status(errc::unknown_request) ? 0 : s_slot;
  const int kr = s_kr;
  const std::int64_t F = s_frontier;
  const std::int64_t N = s_positions;
  const auto m = static_cast<std::int64_t>(ws.positions_per_row);
  const std::size_t hot_base = static_cast<std::size_t>(slot) * B;
  const std::size_t page_base = static_cast<std::size_t>(slot) * src.pages_per_request;
  const std::size_t rev_base = static_cast<std::size_t>(slot) * static_cast<std::size_t>(src.max_rows);
  const std::size_t seen_base = static_cast<std::size_t>(slot) * ws.words;

  // Entries first, nothing written: query j (position N + j) sees a row only once every position it
  // packs is visible, rows < (N + j + 1) / m (m = 1: rows < F + j + 1). The first bad entry in
  // (query, entry) order wins, as in the host reference. U entries per thread per iteration, all
  // loads issued before they are used (the passes below do the same).
  for (int j = 0; j < kr; ++j) {
    const int len = q_begin[j + 1] - q_begin[j];
    const row_index* sel = q_sel[j];
    for (int i0 = tid; i0 < len; i0 += U * Block) {
      row_index x[U];
#pragma unroll
      for (int u = 0; u < U; ++u) x[u] = i0 + u * Block < len ? sel[i0 + u * Block] : no_row;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (x[u] == no_row) continue;
        int kind = -1;
        if (x[u] < 0 || x[u] >= src.max_rows) kind = 0;
        else if (x[u] >= (N + j + 1) / m) kind = 1;
        if (kind >= 0) atomicMin(&s_bad, ((q_begin[j] + i0 + u * Block) << 1) | kind);
      }
    }
  }
  // Stage the slot's LRU order and clear the hit flags while the checks finish.
  if (s_code == status_ok)
    for (int w = tid; w < B; w += Block) {
      ord[w] = src.order[hot_base + w];
      is_hit[w] = 0;
    }
  __syncthreads();

  {
    // Priority as the resolver: slot, duplicate, K_r and lengths, entries.
    int code = s_code;
    long long value = s_value;
    int index = s_index;
    if (code != to_status(errc::unknown_request) && s_dup) {
      code = to_status(errc::duplicate_in_batch);
      value = s_slot;
      index = -1;
    }
    if (code == status_ok && s_bad != INT_MAX) {
      const int flat = s_bad >> 1;
      int j = 0;
      while (q_begin[j + 1] <= flat) ++j;
      const int i = flat - q_begin[j];
      code = to_status((s_bad & 1) ? errc::position_not_visible : errc::position_out_of_range);
      index = (j << 24) | i;
      value = q_sel[j][i];
    }
    if (code != status_ok) {
      if (tid == 0) {
        entry_error rec;
        rec.code = code;
        rec.index = index;
        rec.value = value;
        rec.frontier = N;  // committed positions (= rows for m = 1): the message names the query's position
        rec.epoch = s_epoch;
        rec.slot = s_slot;
        verify_record_error(ws, t, rec);
        ws.stats[t] = verify_entry_stats{};
      }
      return;  // uniform across the CTA
    }
  }

  // Pass 1: direct entries (block and committed tail rows in the ring, ready optional pages) and
  // hot-cache hits get their locations; missing rows are marked in the slot's bitmap.
  const std::int64_t tail_begin = F - static_cast<std::int64_t>(src.tail_rows);
  unsigned n_sel = 0, n_dir = 0, n_block = 0, n_hot = 0, n_host = 0, n_staged = 0;
  for (int j = 0; j < kr; ++j) {
    const int len = q_begin[j + 1] - q_begin[j];
    const row_index* sel = q_sel[j];
    location* out = q_out[j];
    for (int i0 = tid; i0 < len; i0 += U * Block) {
      row_index x[U];
#pragma unroll
      for (int u = 0; u < U; ++u) x[u] = i0 + u * Block < len ? sel[i0 + u * Block] : no_row;
      std::int32_t g[U];
      OrderIndex w[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {  // both lookups at once: they depend on the row only
        g[u] = -1;
        w[u] = no_way<OrderIndex>;
        if (x[u] != no_row && x[u] < tail_begin) {
          g[u] = src.optional_page[page_base + static_cast<std::size_t>(x[u]) / src.page_rows];
          w[u] = src.way_of_row[rev_base + static_cast<std::size_t>(x[u])];
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int i = i0 + u * Block;
        if (i >= len) continue;
        if (x[u] == no_row) {
          out[i] = no_location;
          continue;
        }
        ++n_sel;
        if (x[u] >= tail_begin) {
          out[i] = space.tail(static_cast<std::size_t>(slot), x[u]);
          ++n_dir;
          if (x[u] >= F) ++n_block;
        } else if (g[u] >= 0) {
          out[i] = space.optional(static_cast<std::size_t>(g[u]), x[u]);
          ++n_dir;
        } else if (w[u] != no_way<OrderIndex>) {
          is_hit[w[u]] = 1;
          out[i] = space.hot(static_cast<std::size_t>(slot), w[u]);
          ++n_hot;
        } else {
          ++n_host;
          const auto ux = static_cast<unsigned>(x[u]);
          atomicOr(ws.seen + seen_base + (ux >> 5), 1u << (ux & 31u));
        }
      }
    }
  }
  __syncthreads();

  // Ranks: missing rows before each bitmap word (ascending rows = ascending ranks).
  const int used_words = tail_begin > 0 ? static_cast<int>((tail_begin + 31) / 32) : 0;
  int M = 0;
  for (int base = 0; base < used_words; base += Block) {
    const int w = base + tid;
    // __ldcg: the words were set by atomics (L2); never read them through a possibly stale L1 line.
    const int c = w < used_words ? __popc(__ldcg(ws.seen + seen_base + w)) : 0;
    int before = 0, chunk = 0;
    scan_t(scan).ExclusiveSum(c, before, chunk);
    if (w < used_words) ws.word_rank[seen_base + w] = static_cast<std::uint32_t>(M + before);
    M += chunk;
    __syncthreads();  // the scan storage is reused
  }

  // LRU partition: [kept] ++ [hits] ++ [victims], each in old order; rank r < to_hot takes the
  // r-th non-hit way, the rest of the union overflows into staging.
  int to_hot = 0;
  {
    OrderIndex od[WPT];
    unsigned nh = 0;
#pragma unroll
    for (int k = 0; k < WPT; ++k) {
      const int q = tid * WPT + k;
      od[k] = q < B ? ord[q] : OrderIndex(0);
      if (q < B && !is_hit[od[k]]) nh |= 1u << k;
    }
    int rank = 0, NH = 0;
    scan_t(scan).ExclusiveSum(static_cast<int>(__popc(nh)), rank, NH);
    const int H = B - NH;
    to_hot = M < NH ? M : NH;
    const int kept = NH - to_hot;
#pragma unroll
    for (int k = 0; k < WPT; ++k) {
      const int q = tid * WPT + k;
      if (q < B) {
        const OrderIndex w = od[k];
        int at;
        if ((nh >> k) & 1u) {
          const int r = rank++;
          if (r < to_hot) {
            at = kept + H + r;
            victim[r] = w;
            const row_index old = src.hot_row[hot_base + w];
            if (old >= 0) src.way_of_row[rev_base + static_cast<std::size_t>(old)] = no_way<OrderIndex>;
          } else {
            at = r - to_hot;
          }
        } else {
          at = kept + (q - rank);  // hits before q = q - non-hits before q
        }
        src.order[hot_base + at] = w;
      }
    }
  }
  __syncthreads();

  // Pass 2: every entry of a missing row takes its rank's location (entries of the same row write
  // the same values); the plan lists each distinct row once, ascending.
  plan_entry* const plan = ws.plan + static_cast<std::size_t>(t) * ws.plan_stride;
  if (M != 0)
    for (int j = 0; j < kr; ++j) {
      const int len = q_begin[j + 1] - q_begin[j];
      const row_index* sel = q_sel[j];
      location* out = q_out[j];
      for (int i0 = tid; i0 < len; i0 += U * Block) {
        row_index x[U];
#pragma unroll
        for (int u = 0; u < U; ++u) x[u] = i0 + u * Block < len ? sel[i0 + u * Block] : no_row;
        std::uint32_t word[U], before[U];
        std::int32_t hp[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {  // bitmap word, its rank and the host page: all from the row
          word[u] = 0;
          before[u] = 0;
          hp[u] = 0;
          if (x[u] != no_row && x[u] < tail_begin) {
            const auto ux = static_cast<unsigned>(x[u]);
            word[u] = __ldcg(ws.seen + seen_base + (ux >> 5));
            before[u] = __ldcg(ws.word_rank + seen_base + (ux >> 5));
            hp[u] = src.host_page[page_base + ux / src.page_rows];
          }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const auto ux = static_cast<unsigned>(x[u]);
          if (x[u] == no_row || x[u] >= tail_begin || ((word[u] >> (ux & 31u)) & 1u) == 0)
            continue;  // -1, direct, optional or hot: resolved in pass 1
          const int r = static_cast<int>(before[u]) + __popc(word[u] & ((1u << (ux & 31u)) - 1u));
          location dst;
          if (r < to_hot) {
            const OrderIndex w = victim[r];
            dst = space.hot(static_cast<std::size_t>(slot), w);
            src.hot_row[hot_base + w] = x[u];
            src.way_of_row[rev_base + static_cast<std::size_t>(x[u])] = w;
          } else {
            dst = space.staging(static_cast<std::size_t>(slot), static_cast<std::size_t>(r - to_hot));
            ++n_staged;
          }
          out[i0 + u * Block] = dst;
          plan_entry pe;
          pe.host_offset = static_cast<std::uint64_t>(hp[u]) * src.page_bytes +
                           static_cast<std::uint64_t>(ux % src.page_rows) * src.row_bytes;
          pe.dst = dst;
          pe.row = x[u];
          plan[r] = pe;
        }
      }
    }
  __syncthreads();
  for (int w = tid; w < used_words; w += Block) ws.seen[seen_base + w] = 0u;  // the bitmap stays zero between launches

  // Stats.
  const unsigned lane = static_cast<unsigned>(tid) & 31u;
  unsigned v[6] = {n_sel, n_dir, n_block, n_hot, n_host, n_staged};
#pragma unroll
  for (int c = 0; c < 6; ++c) {
    const unsigned s = __reduce_add_sync(0xffffffffu, v[c]);
    if (lane == 0 && s != 0) atomicAdd(&s_count[c], s);
  }
  __syncthreads();
  if (tid == 0) {
    verify_entry_stats st;
    st.selected = s_count[0];
    st.direct = s_count[1];
    st.block = s_count[2];
    st.hot = s_count[3];
    st.host = s_count[4];
    st.staged = s_count[5];
    st.rows_copied = static_cast<std::uint32_t>(M);
    st.staging_rows = static_cast<std::uint32_t>(M - to_hot);
    st.layers_copied = layers_to_copy;
    ws.stats[t] = st;
    entry_error rec;
    rec.epoch = s_epoch;
    rec.slot = slot;
    rec.frontier = F;
    ws.errors[t] = rec;
    ws.verified[slot] = kr;  // the round may be committed (device books; read by commit after raw verifies)
  }
}

/// A fixed grid (set at construction, so a captured launch fits any batch) walks the entries.
template <int Block, int HotRows, class OrderIndex>
__global__ void __launch_bounds__(Block)
    verify_metadata_kernel(source_view<OrderIndex> src, verify_workspace_view ws, verify_batch_view batch,
                           std::uint32_t layers_to_copy, std::uint32_t top_k) {
  programmatic_launch_prologue();  // the engine's indexer may still be writing the queries
  const unsigned cap = batch.capacity < ws.capacity ? batch.capacity : ws.capacity;
  const unsigned requested = __ldcg(batch.count);
  const unsigned C = requested < cap ? requested : cap;
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    // Nothing else in this launch reads these; the copy kernel that follows in stream order does.
    ws.control->last_count = C;
    ws.control->last_layers = layers_to_copy;
    if (requested > cap) {
      ::cuda::atomic_ref<std::uint32_t, ::cuda::thread_scope_device> ov(ws.control->overflow);
      std::uint32_t expected = 0;
      ov.compare_exchange_strong(expected, requested, ::cuda::memory_order_relaxed);
    }
  }
  for (unsigned t = blockIdx.x; t < C; t += gridDim.x) {
    verify_entry<Block, HotRows, OrderIndex>(src, ws, batch, layers_to_copy, top_k, t, C);
    __syncthreads();  // the entry's shared memory is reused by the next
  }
}

// --------------------------------------------------------------------------------------------
// copy: the last verify's plans into payload layers [layer_begin, layer_end)

template <class OrderIndex>
__global__ void __launch_bounds__(verify_copy_threads)
    verify_copy_kernel(source_view<OrderIndex> src, verify_workspace_view ws, unsigned layer_begin, unsigned layer_end,
                       int finish) {
  programmatic_launch_prologue();  // the metadata kernel's plans may still be in flight
  extern __shared__ unsigned dhisparse_verify_prefix[];  // [capacity + 1]
  unsigned* prefix = dhisparse_verify_prefix;
  const unsigned C = ws.control->last_count < ws.capacity ? ws.control->last_count : ws.capacity;
  const unsigned layers = layer_end - layer_begin;
  const unsigned lane = threadIdx.x & 31u;
  scan_rows_copied(ws.stats, C, prefix);
  __syncthreads();
  if (finish && blockIdx.x == 0 && threadIdx.x == 0) ws.control->epoch = next_epoch(ws.control->epoch);  // the verify's epoch
  const std::uint64_t total = static_cast<std::uint64_t>(prefix[C]) * layers;
  const unsigned vecs = src.row_bytes / 16u;
  const std::uint64_t layer_host_stride = static_cast<std::uint64_t>(src.page_rows) * src.row_bytes;
  const std::uint64_t warp = (static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const std::uint64_t warps = (static_cast<std::uint64_t>(gridDim.x) * blockDim.x) >> 5;
  // Units are row-major within an entry (all layers of a row together) so neighbouring warps
  // read neighbouring host rows. Each warp keeps R rows in flight: every load of a batch is
  // issued before its stores (zero-copy reads of pinned memory are latency-bound).
  constexpr unsigned R = 2, H = 2;  // rows per warp, 16-byte vectors per lane and row per batch
  for (std::uint64_t u0 = warp * R; u0 < total; u0 += warps * R) {
    const int4* s[R];
    int4* d[R];
#pragma unroll
    for (unsigned k = 0; k < R; ++k) {
      s[k] = nullptr;
      d[k] = nullptr;
      const std::uint64_t u = u0 + k;
      if (u >= total) continue;
      const auto row_unit = static_cast<unsigned>(u / layers);
      const unsigned l = layer_begin + static_cast<unsigned>(u - static_cast<std::uint64_t>(row_unit) * layers);
      const unsigned lo = last_at_or_below(prefix, C, row_unit);  // the entry holding row_unit
      const plan_entry pe = ws.plan[static_cast<std::size_t>(lo) * ws.plan_stride + (row_unit - prefix[lo])];
      s[k] = reinterpret_cast<const int4*>(src.host_store + pe.host_offset + l * layer_host_stride);
      d[k] = reinterpret_cast<int4*>(src.row_address(l, pe.dst));  // staged rows included: one base per layer
    }
    for (unsigned v0 = 0; v0 < vecs; v0 += 32 * H) {
      int4 buf[R][H];
#pragma unroll
      for (unsigned k = 0; k < R; ++k)
#pragma unroll
        for (unsigned h = 0; h < H; ++h) {
          const unsigned v = v0 + lane + 32 * h;
          if (s[k] != nullptr && v < vecs) buf[k][h] = __ldg(s[k] + v);
        }
#pragma unroll
      for (unsigned k = 0; k < R; ++k)
#pragma unroll
        for (unsigned h = 0; h < H; ++h) {
          const unsigned v = v0 + lane + 32 * h;
          if (d[k] != nullptr && v < vecs) d[k][v] = buf[k][h];
        }
    }
  }
}

// --------------------------------------------------------------------------------------------
// stage: a block [layer][count][row_bytes] into the tail ring at positions first .. first+count-1

template <class OrderIndex>
__global__ void __launch_bounds__(verify_copy_threads)
    verify_stage_kernel(source_view<OrderIndex> src, unsigned slot, const std::byte* rows, std::int64_t first,
                        unsigned count) {
  const unsigned lane = threadIdx.x & 31u;
  const unsigned warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const unsigned warps = (gridDim.x * blockDim.x) >> 5;
  const unsigned vecs = src.row_bytes / 16u;
  const unsigned units = count * src.layers;
  for (unsigned u = warp; u < units; u += warps) {
    const unsigned l = u / count, i = u - l * count;
    const auto* in = reinterpret_cast<const int4*>(rows + (static_cast<std::size_t>(l) * count + i) * src.row_bytes);
    auto* out = reinterpret_cast<int4*>(src.layer_pool[l] +
                                        static_cast<std::size_t>(src.space.tail(slot, first + i)) * src.row_bytes);
    for (unsigned v = lane; v < vecs; v += 32) out[v] = in[v];
  }
}

// --------------------------------------------------------------------------------------------
// commit: ring rows [first, last) into the mapped host store (every layer), then the frontier

template <class OrderIndex>
__global__ void __launch_bounds__(verify_copy_threads)
    verify_commit_kernel(source_view<OrderIndex> src, unsigned slot, std::int64_t first, std::int64_t last) {
  const unsigned lane = threadIdx.x & 31u;
  const unsigned warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const unsigned warps = (gridDim.x * blockDim.x) >> 5;
  const unsigned vecs = src.row_bytes / 16u;
  const auto count = static_cast<unsigned>(last - first);
  const unsigned units = count * src.layers;
  for (unsigned u = warp; u < units; u += warps) {
    const unsigned l = u / count, i = u - l * count;
    const std::int64_t r = first + i;
    if (!src.writes_host_copy(r)) continue;  // shared host store: another rank owns the row's page
    const std::int32_t hp =
        src.host_page[static_cast<std::size_t>(slot) * src.pages_per_request + static_cast<std::size_t>(r) / src.page_rows];
    auto* host = reinterpret_cast<int4*>(src.host_store + static_cast<std::uint64_t>(hp) * src.page_bytes +
                                         (static_cast<std::uint64_t>(l) * src.page_rows +
                                          static_cast<std::uint64_t>(r) % src.page_rows) *
                                             src.row_bytes);
    const auto* ring = reinterpret_cast<const int4*>(src.layer_pool[l] +
                                                     static_cast<std::size_t>(src.space.tail(slot, r)) * src.row_bytes);
    for (unsigned v = lane; v < vecs; v += 32) host[v] = ring[v];
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) src.frontier[slot] = last;  // read only by later launches
}

// --------------------------------------------------------------------------------------------
// a completed slot's planned copies are dropped (its host pages are gone): follower replays skip them

// A template so that programs of several translation units link (one definition per program).
template <int = 0>
__global__ void verify_forget_slot_kernel(verify_workspace_view ws, int slot) {
  const unsigned C = ws.control->last_count < ws.capacity ? ws.control->last_count : ws.capacity;
  for (unsigned t = blockIdx.x * blockDim.x + threadIdx.x; t < C; t += gridDim.x * blockDim.x)
    if (ws.errors[t].slot == slot) ws.stats[t].rows_copied = 0;
}

// --------------------------------------------------------------------------------------------
// device books of a slot's round: staged rows and the last good verify's K_r

// A template so that programs of several translation units link (one definition per program).
template <int = 0>
__global__ void verify_set_round_kernel(verify_workspace_view ws, int slot, std::int32_t staged, std::int32_t verified,
                                        std::int32_t partial) {
  ws.staged[slot] = staged;
  ws.verified[slot] = verified;
  ws.partial[slot] = partial;
}

// --------------------------------------------------------------------------------------------
// launchers (stream last, cudaError_t, no allocation, no host synchronisation)

/// Sets a slot's device round books in stream order (stage: count/0; commit, append, complete: 0/0)
/// and the committed positions of its boundary row (changed by commit, append and complete only).
inline cudaError_t launch_verify_set_round(const verify_workspace_view& ws, int slot, std::int32_t staged,
                                           std::int32_t verified, std::int32_t partial, cudaStream_t stream) {
  verify_set_round_kernel<><<<1, 1, 0, stream>>>(ws, slot, staged, verified, partial);
  return cudaGetLastError();
}

/// One-time setup of the metadata kernel's shared memory (above the 48 KiB default for large B).
template <int HotRows, class OrderIndex>
cudaError_t prepare_verify() {
  const std::size_t smem = verify_shared_bytes<OrderIndex>(HotRows);
  return cudaFuncSetAttribute(verify_metadata_kernel<verify_block_threads, HotRows, OrderIndex>,
                              cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
}

/// Verifies one batch: metadata (`entry_grid` CTAs walk the entries), then the copies of every
/// layer in [0, layers_to_copy) (`copy_grid` CTAs).
template <int HotRows, class OrderIndex>
cudaError_t launch_verify(const source_view<OrderIndex>& src, const verify_workspace_view& ws,
                          const verify_batch_view& batch, std::uint32_t layers_to_copy, std::uint32_t top_k,
                          int entry_grid, int copy_grid, cudaStream_t stream, bool programmatic = false) {
  const cudaError_t err = launch_kernel(verify_metadata_kernel<verify_block_threads, HotRows, OrderIndex>,
                                        dim3(static_cast<unsigned>(entry_grid)), dim3(verify_block_threads),
                                        verify_shared_bytes<OrderIndex>(HotRows), stream, programmatic, src, ws, batch,
                                        layers_to_copy, top_k);
  if (err != cudaSuccess) return err;
  const std::size_t smem = (static_cast<std::size_t>(ws.capacity) + 1) * sizeof(unsigned);
  return launch_kernel(verify_copy_kernel<OrderIndex>, dim3(static_cast<unsigned>(copy_grid)), dim3(verify_copy_threads),
                       smem, stream, programmatic, src, ws, 0u, layers_to_copy, 1);
}

/// Replays the last verify's plan into payload layer `layer` (follower layers after producer_only).
template <class OrderIndex>
cudaError_t launch_verify_follower_copy(const source_view<OrderIndex>& src, const verify_workspace_view& ws,
                                        unsigned layer, int copy_grid, cudaStream_t stream,
                                        bool programmatic = false) {
  const std::size_t smem = (static_cast<std::size_t>(ws.capacity) + 1) * sizeof(unsigned);
  return launch_kernel(verify_copy_kernel<OrderIndex>, dim3(static_cast<unsigned>(copy_grid)), dim3(verify_copy_threads),
                       smem, stream, programmatic, src, ws, layer, layer + 1u, 0);
}

inline unsigned verify_grid_for(std::uint64_t units, int max_grid) {
  constexpr unsigned warps_per_block = verify_copy_threads / 32;
  std::uint64_t blocks = (units + warps_per_block - 1) / warps_per_block;
  if (blocks == 0) blocks = 1;
  if (blocks > static_cast<std::uint64_t>(max_grid)) blocks = static_cast<std::uint64_t>(max_grid);
  return static_cast<unsigned>(blocks);
}

/// Writes a staged block into the tail ring of `slot` (device-accessible `rows`).
template <class OrderIndex>
cudaError_t launch_verify_stage(const source_view<OrderIndex>& src, unsigned slot, const std::byte* rows,
                                std::int64_t first, unsigned count, int max_grid, cudaStream_t stream) {
  const unsigned grid = verify_grid_for(static_cast<std::uint64_t>(count) * src.layers, max_grid);
  verify_stage_kernel<OrderIndex><<<grid, verify_copy_threads, 0, stream>>>(src, slot, rows, first, count);
  return cudaGetLastError();
}

/// Backs up ring rows [first, last) of `slot` into its host pages and publishes frontier = last.
template <class OrderIndex>
cudaError_t launch_verify_commit(const source_view<OrderIndex>& src, unsigned slot, std::int64_t first,
                                 std::int64_t last, int max_grid, cudaStream_t stream) {
  const unsigned grid = verify_grid_for(static_cast<std::uint64_t>(last - first) * src.layers, max_grid);
  verify_commit_kernel<OrderIndex><<<grid, verify_copy_threads, 0, stream>>>(src, slot, first, last);
  return cudaGetLastError();
}

inline cudaError_t launch_verify_forget_slot(const verify_workspace_view& ws, int slot, cudaStream_t stream) {
  verify_forget_slot_kernel<><<<1, verify_copy_threads, 0, stream>>>(ws, slot);
  return cudaGetLastError();
}

}  // namespace dhisparse::cuda::detail
