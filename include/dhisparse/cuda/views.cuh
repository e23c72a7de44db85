#pragma once
/// \file
/// Trivially copyable views passed to the CUDA kernels by value (the owning-container / `ref`
/// split of cuCollections; FlashInfer's `paged_kv_t`). The owning `cuda::hierarchy` builds them;
/// engines build a `batch_view` over their own device buffers to launch the resolver from a
/// CUDA graph.
#include "detail/minimum_arch.cuh"  // first: stops below sm_80 with a clear message
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "../detail/config.hpp"
#include "../detail/owner_rule.hpp"
#include "../errors.hpp"
#include "../location_space.hpp"
#include "../types.hpp"

namespace dhisparse::cuda {

/// Per-entry status written by the resolver: 0 = resolved, otherwise `1 + errc`.
using status_code = std::int32_t;
/// Status of an entry that resolved.
inline constexpr status_code status_ok = 0;
/// Status code of an error category (1 + errc).
DHISPARSE_HD constexpr status_code to_status(errc e) { return 1 + static_cast<status_code>(e); }
/// Error category of a status code other than status_ok (the inverse of to_status).
constexpr errc to_errc(status_code s) { return static_cast<errc>(s - 1); }

/// Outcome of one batch entry of one resolver launch.
struct entry_error {
  status_code code = status_ok;  ///< 0, or 1 + errc of the first broken rule
  std::int32_t index = -1;       ///< selection entry at fault (-1: the entry as a whole)
  std::int64_t value = 0;        ///< offending row, length or slot
  std::int64_t frontier = 0;     ///< rows stored for the request when it was checked
  std::uint32_t epoch = 0;       ///< launch that wrote the record
  std::int32_t slot = -1;        ///< request slot named by the batch entry
};
static_assert(sizeof(entry_error) == 32);

/// Where one batch entry's selection was found (see `resolve_stats`); bytes = rows_copied *
/// layers_copied * row_bytes.
struct entry_stats {
  /// Counts as in `resolve_stats`, plus the payload layers the entry's rows were copied into.
  std::uint32_t selected = 0, direct = 0, hot = 0, host = 0, rows_copied = 0, layers_copied = 0;
  /// Padding to 32 bytes.
  std::uint32_t reserved[2] = {0, 0};
};
static_assert(sizeof(entry_stats) == 32);

/// One planned host->GPU row copy: the row's layer-0 byte offset in the host store and its
/// destination location (layer l adds `l * page_rows * row_bytes` on the host side).
struct alignas(16) plan_entry {
  /// Byte offset of the row's layer-0 copy in the host store.
  std::uint64_t host_offset = 0;
  /// Destination location of the copy.
  location dst = 0;
  /// History row copied.
  row_index row = 0;
};
static_assert(sizeof(plan_entry) == 16);

/// Work-distribution counters of one source's resolver. The last counted CTA of a launch resets
/// them and advances `epoch`, so consecutive launches (and graph replays) need no host
/// involvement. CTAs that are not counted (entry CTAs of small batches) may still be writing
/// results then: `epoch` and `last_count` are read in stream order, never polled as a sign that
/// a launch is complete.
struct alignas(8) control_block {
  std::uint32_t ticket = 0;        ///< next metadata task (batches larger than the grid)
  std::uint32_t last_count = 0;    ///< batch entries of the last launch
  /// Resolver: arrivals and departures of the launch's CTAs. `done` and `epoch` form one 64-bit
  /// word (done low): a CTA reads the epoch and counts its arrival with one atomic.
  std::uint32_t done = 0;
  std::uint32_t epoch = 0;         ///< launches completed, counted with `detail::next_epoch` (wraps to 1)
  std::uint32_t last_layers = 0;   ///< payload layers the last launch copied
  std::uint32_t sticky_epoch = 0;  ///< first launch with a bad entry since errors were last checked
  std::uint32_t overflow = 0;      ///< a batch count above capacity seen since the last check (the count)
  std::uint32_t copy_cursor = 0;   ///< next copy unit of an early-copy launch
};

static_assert(offsetof(control_block, done) % 8 == 0 && offsetof(control_block, epoch) == offsetof(control_block, done) + 4,
              "dhisparse: the resolver updates control_block::done and ::epoch as one 64-bit word");

namespace detail {
/// The epoch after `e`. Epochs wrap from 2^32 - 1 to 1, never to 0: the per-entry words stamped
/// with a launch's epoch (the resolver's `ready` and `claim`, `sticky_epoch`) start at 0 and mean
/// "no launch yet", so a launch numbered 0 would take every never-used entry for one of its own.
DHISPARSE_HD constexpr std::uint32_t next_epoch(std::uint32_t e) { return e == 0xFFFFFFFFu ? 1u : e + 1u; }
static_assert(next_epoch(0) == 1 && next_epoch(41) == 42 && next_epoch(0xFFFFFFFFu) == 1);
}  // namespace detail

/// Reverse-map value of a row that is not in the hot cache (all bits set).
template <class OrderIndex>
inline constexpr OrderIndex no_way = static_cast<OrderIndex>(~OrderIndex(0));

/// Device state of one payload source (its pool geometry, cache state and page tables).
template <class OrderIndex>
struct source_view {
  /// Location geometry of the source's pool.
  location_space space{};
  row_index* hot_row = nullptr;             ///< [slots * B] row held by each hot way, -1 when empty
  OrderIndex* order = nullptr;              ///< [slots * B] LRU order, least recently used first
  std::int64_t* frontier = nullptr;         ///< [slots] rows stored
  std::int32_t* optional_page = nullptr;    ///< [slots * pages_per_request] pool page or -1
  std::int32_t* host_page = nullptr;        ///< [slots * pages_per_request] host-store page or -1
  OrderIndex* way_of_row = nullptr;         ///< [slots * max_rows] hot way holding each row, `no_way` if none
  const std::uint32_t* live = nullptr;      ///< [slots] non-zero while a request holds the slot
  std::byte* host_store = nullptr;          ///< device address of the mapped pinned host store
  /// [layers] device base of each payload layer: every location of the source, staging rows
  /// included (shared arenas lie `space.staging_gap` rows past the pool), is at `base + loc * row_bytes`.
  std::byte* const* layer_pool = nullptr;
  std::uint64_t page_bytes = 0;             ///< host-store bytes per page (all layers)
  std::int64_t max_rows = 0;                ///< history capacity per request
  std::uint32_t row_bytes = 0;              ///< bytes per row (multiple of 16)
  std::uint32_t layers = 0;                 ///< payload layers of the source
  std::uint32_t page_rows = 0;              ///< rows per page
  std::uint32_t tail_rows = 0;              ///< T
  std::uint32_t pages_per_request = 0;      ///< ceil(max_rows / page_rows)
  /// Shared host store (docs/multi-gpu.md): the ranks sharing it, 0 when the store is this
  /// hierarchy's own, and this hierarchy's rank. Host copies are written only for owned pages.
  std::uint32_t owner_ranks = 0;
  std::uint32_t owner_rank = 0;          ///< this hierarchy's rank on the shared store

  /// Device address of location `loc` in payload layer `layer`: one formula for every location,
  /// so a stock attention kernel given `layer_pool[layer]` reads the same bytes with no branch.
  DHISPARSE_HD std::byte* row_address(unsigned layer, location loc) const {
    return layer_pool[layer] + static_cast<std::size_t>(loc) * row_bytes;
  }
  /// True when this hierarchy writes row `r`'s host copy: every row of its own store; on a shared
  /// store only the rows of the pages it owns (page mod ranks == rank, detail/owner_rule.hpp).
  DHISPARSE_HD bool writes_host_copy(std::int64_t r) const {
    return dhisparse::detail::writes_host_copy(r, page_rows, owner_ranks, owner_rank);
  }
};

/// The resolver's per-source scratch and results (capacity = max_requests batch entries).
struct workspace_view {
  /// Work-distribution counters of the source's resolver.
  control_block* control = nullptr;
  std::uint64_t* ready = nullptr;     ///< [capacity] published entry: epoch (low word), copy units (high word)
  /// [capacity] epoch of the launch whose CTA claimed each entry (batches that fit the grid): a CTA
  /// waits only for claimed entries, whose CTAs are running (resolve_kernel.cuh, "Forward progress").
  std::uint32_t* claim = nullptr;
  plan_entry* plan = nullptr;         ///< [capacity * top_k] misses of each entry, ascending rows
  /// [capacity * top_k] small batches: the copies in selection order, repeats dropped (no_location)
  plan_entry* early_plan = nullptr;
  entry_error* errors = nullptr;      ///< [capacity] status of each entry of the last launch
  entry_error* sticky = nullptr;      ///< [capacity] records of the first failing launch (check_errors)
  entry_stats* stats = nullptr;       ///< [capacity] stats of each entry of the last launch
  /// Batch entries each array holds (max_requests).
  std::uint32_t capacity = 0;
};

/// A batch of selections on the device, for one resolver launch on one source.
///
/// Entry e (0 <= e < *count) names request slot `slots[e]` (`hierarchy::slot_of`), reads
/// `lengths[e]` selection entries (all `stride` when `lengths` is null) and writes as many
/// locations. Two layouts: *strided* (`selections`/`locations` hold entry e at `e * stride`) or
/// *gathered* (`selection_ptrs[e]`/`location_ptrs[e]`, used when non-null). Everything is read on
/// the device when the kernel runs, so a captured CUDA graph can change contents and `*count`
/// between replays; `capacity` and the pointers are fixed at capture. The resolver may read the
/// slot, length, pointers and strided selection of entries up to `capacity` before it knows
/// `*count` (what lies past the count is ignored), so every buffer must be readable to capacity.
struct batch_view {
  const std::int32_t* slots = nullptr;               ///< [capacity]
  const row_index* selections = nullptr;             ///< [capacity * stride], -1 padded
  location* locations = nullptr;                     ///< [capacity * stride]
  const row_index* const* selection_ptrs = nullptr;  ///< [capacity] (gathered layout)
  location* const* location_ptrs = nullptr;          ///< [capacity] (gathered layout)
  const std::int32_t* lengths = nullptr;             ///< [capacity] or null
  const std::uint32_t* count = nullptr;              ///< device scalar: entries in this launch
  std::uint32_t stride = 0;                          ///< strided layout: entries per selection
  std::uint32_t capacity = 0;                        ///< entries the buffers hold (<= max_requests)

  /// The gathered layout is in use (both pointer arrays given); otherwise the strided one.
  DHISPARSE_HD bool gathered() const { return selection_ptrs != nullptr && location_ptrs != nullptr; }
};

/// Scalar parameters of one resolver launch.
struct resolve_params {
  std::uint32_t layers_to_copy = 1;  ///< payload layers materialised (all, or 1 for producer_only)
  std::uint32_t copy_warps = 0;      ///< warps per CTA that copy ordered copies (0: all)
  std::uint32_t rows_per_warp = 2;   ///< rows a copying warp keeps in flight (0 or more than 2: 2)
  /// Early copies (batches up to early_copy_max_batch) take groups from a counter in arrival
  /// order: few warps per CTA with one row each spread a step's rows over many SMs instead of the
  /// first CTAs to arrive, and keep few host reads in flight. Warps per CTA that copy early (0 or
  /// more than the CTA has: all).
  std::uint32_t early_copy_warps = 8;
  std::uint32_t early_rows_per_warp = 1;  ///< rows per early-copy warp (0 or more than 2: 2)
  /// Batches up to this size (default: every batch) copy their missing entries in selection
  /// order, published before the misses are ranked, claimed from a counter by a few warps per
  /// CTA; larger batches copy their distinct rows in address order once every entry is ranked,
  /// with a static share per warp. Early copies start sooner and keep fewer host reads in flight:
  /// on the H200 with fresh misses they are faster at every batch size measured (C = 128 at 20 %
  /// misses: 1.40 -> 1.01 ms, docs/benchmarks.md).
  std::uint32_t early_copy_max_batch = std::numeric_limits<std::uint32_t>::max();
  /// An entry with at most this many copy units (missing rows x layers_to_copy, capped at the
  /// resolver's self_copy_max_units) copies them with its own CTA: no cross-CTA publication to
  /// wait for, host reads overlapping its LRU work. Larger entries use the whole grid.
  std::uint32_t self_copy_units = 32;
};

static_assert(std::is_trivially_copyable_v<source_view<std::uint16_t>>);
static_assert(std::is_trivially_copyable_v<workspace_view>);
static_assert(std::is_trivially_copyable_v<batch_view>);

}  // namespace dhisparse::cuda
