#pragma once
/// \file
/// `dhisparse::cuda::hierarchy`: the CUDA backend. Same semantics as `host_hierarchy` (the
/// executable specification): the same locations, cache state, copy plans and errors on the same
/// inputs, with the GPU payload pools in device memory, the complete histories in mapped pinned
/// host memory, and one fused kernel launch per resolve (see detail/resolve_kernel.cuh).
///
/// Ordering: every call that takes a stream is asynchronous and stream ordered; calls without one
/// use the stream given at construction. Work on one hierarchy must be ordered by the caller
/// (one stream, or events): the host keeps bookkeeping (registry, page tables, free lists) in
/// call order and the device state follows in stream order.
///
/// Devices and threads: a hierarchy is bound to the device that was current when it was created
/// (`device()`). Every call makes that device current for its CUDA work and restores the calling
/// thread's device before it returns, so a hierarchy can be used from any thread whatever that
/// thread's current device (one thread at a time: nothing locks). A stream given to a call must
/// belong to the hierarchy's device, or the call throws wrong_device with nothing changed (checked
/// with CUDA 12.8 and newer, and not on a stream being captured); the null stream is allowed and
/// means the hierarchy's device's.
///
/// Several GPUs of one host (docs/multi-gpu.md): hierarchies built over one `shared_host_store`, one
/// per tensor-parallel rank (`hierarchy(cfg, store, rank, stream)`), keep one host copy of each
/// history; every kernel that writes host copies writes only the pages the rank owns (page p:
/// rank p mod N), and the engine orders an owner's host writes before other ranks' reads.
///
/// Errors: host-detectable errors (unknown request id, duplicate in batch, selection longer than
/// top_k, pending follower copies, capacity) throw at the call with nothing changed or queued.
/// Errors only visible on the device (selection entries out of range or beyond the frontier;
/// and, for raw `batch_view` launches, bad slots, lengths and duplicates) leave that batch entry
/// untouched (no location or state written), let the other entries resolve, and are thrown by
/// `check_errors(stream)` as the typed error of the first bad entry of the first failing launch,
/// or taken on the device by `copy_errors_async` and thrown later by `throw_if_error`.
///
/// Readbacks: the `_async` ones (`copy_stats_async`, `copy_verify_stats_async`,
/// `copy_errors_async`) write caller memory in stream order and are capturable; every other
/// readback synchronises one stream (the one given, or the hierarchy's), never the device
/// (docs/integration.md).
///
/// Speculative verification (hierarchy_config::max_block = K_max > 1, docs/speculative.md):
/// `stage_block`, `verify` and `commit` follow the host reference call for call, with the same pool
/// geometry (tail ring of T + K_max rows, K_max * top_k staging rows per slot); the kernels are in
/// detail/verify_kernel.cuh. Their batched, capturable forms over device views (`stage_blocks` /
/// `stage_step`, `verify(source, verify_batch_view)`, `commit(source, commit_view)` /
/// `commit_step`) let one CUDA graph hold a whole round (detail/write_kernel.cuh).
#include "detail/minimum_arch.cuh"  // first: stops below sm_80 with a clear message
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "../detail/prefix_registry.hpp"
#include "../detail/request_registry.hpp"
#include "../detail/staging_blocks.hpp"
#include "../detail/staging_holder.hpp"
#include "../detail/validate.hpp"
#include "../errors.hpp"
#include "../hierarchy_types.hpp"
#include "../detail/history_books.hpp"
#include "../detail/shared_rank.hpp"
#include "../host/host_store.hpp"
#include "../host/shared_host_store.hpp"
#include "../layout.hpp"
#include "../layouts/tiny.hpp"
#include "../location_space.hpp"
#include "../policies/hot_cache.hpp"
#include "../policies/residency.hpp"
#include "../policies/staging_arena.hpp"
#include "../resolver.hpp"
#include "../types.hpp"
#include "batch.cuh"
#include "verify_batch.cuh"
#include "buffers.cuh"
#include "detail/copy_kernel.cuh"
#include "detail/device_guard.cuh"
#include "detail/prefix_kernel.cuh"
#include "detail/residency_kernels.cuh"
#include "detail/resolve_kernel.cuh"
#include "detail/staging_ring.cuh"
#include "detail/verify_kernel.cuh"
#include "detail/write_kernel.cuh"
#include "error.cuh"
#include "kv_write.cuh"
#include "readback.cuh"
#include "shared_host_store.cuh"
#include "verify_views.cuh"
#include "views.cuh"

/// Threads per CTA of the fused resolver (512 or 1024; one 1024-thread CTA per SM halves the
/// per-launch coordination and gives each batch entry's metadata twice the threads).
#ifndef DHISPARSE_CUDA_RESOLVE_BLOCK
#define DHISPARSE_CUDA_RESOLVE_BLOCK 1024
#endif

namespace dhisparse::cuda {

/// One request's part of a batched device resolve (eager path). Pointers are device-accessible.
struct batch_item {
  /// The admitted request this part belongs to.
  request_id request = 0;
  const row_index* selection = nullptr;  ///< `length` entries, -1 padded
  std::int32_t length = 0;               ///< at most top_k
  location* locations = nullptr;         ///< `length` entries, written in selection order
};

/// Bytes a hierarchy needs (two-phase sizing: ask, then construct).
struct memory_requirements {
  std::size_t device_bytes = 0;  ///< device memory: pools, cache state, page tables, workspace
  std::size_t pinned_bytes = 0;  ///< page-locked host memory: host stores and staging
};

/// The CUDA hierarchy of `Layout`: `host_hierarchy` semantics with payload pools and cache state in device
/// memory and histories in mapped pinned host memory (see the file comment). Not copyable.
template <KvLayout Layout, HotCachePolicy Hot = lru_hot_cache<4096>, ResidencyPolicy Residency = fixed_budget_policy,
          StagingArenaPolicy Staging = dedicated_staging>
class hierarchy {
  static_assert(check_layout<Layout>());
  static_assert(!Staging::shared || Staging::arenas >= max_payload_layers_per_source<Layout>(),
                "dhisparse: staging_arenas<chi> needs chi >= the most payload layers of one source (a verify "
                "stages every payload layer of its source at once, layer l in arena l)");
  static_assert(Layout::top_k <= Hot::rows,
                "dhisparse: HotCache<B> must hold at least top_k rows (B >= top_k) so one selection always fits");
  static_assert(Hot::rows < static_cast<std::size_t>(static_cast<typename Hot::order_index>(~typename Hot::order_index(0))),
                "dhisparse::cuda: the reverse map (row -> hot way) reserves the largest order_index value for "
                "\"not cached\"; use B < 65535");

 public:
  /// The KV layout.
  using layout = Layout;
  /// Element of a batched eager `resolve` call (device pointers).
  using batch_item = cuda::batch_item;
  /// The hot-cache policy (B rows per request and source).
  using hot_cache = Hot;
  /// The residency policy (read by `residency_manager`).
  using residency = Residency;
  /// The staging policy of speculative verification.
  using staging = Staging;
  /// Unsigned type of an LRU order entry (a hot-cache way).
  using order_index = typename Hot::order_index;
  /// Number of payload sources in the layout.
  static constexpr std::size_t sources = source_count<Layout>;
  /// B: hot-cache rows per request and source.
  static constexpr std::size_t hot_rows = Hot::rows;
  /// k: most entries in one selection.
  static constexpr std::size_t top_k = Layout::top_k;
  /// p: rows per history page.
  static constexpr std::size_t page_rows = Layout::page_rows;
  /// Row buffers of a step-wide write: one per (source, payload layer) (`kv_step_write_view`).
  static constexpr std::size_t step_layers = dhisparse::step_layers<Layout>;
  /// Index of payload layer `l` of source `s` in `kv_step_write_view::layer_rows`.
  static constexpr std::size_t step_layer_index(std::size_t s, std::size_t l) {
    return dhisparse::step_layer_index<Layout>(s, l);
  }
  /// Threads per CTA of the fused resolver.
  static constexpr int block_threads = DHISPARSE_CUDA_RESOLVE_BLOCK;
  /// Compile-time shape of the fused resolver for this block size, top_k and B.
  using resolve_traits = detail::resolve_traits<block_threads, top_k, hot_rows>;
  /// Device view of one source (what `view(source)` returns).
  using view_type = source_view<order_index>;

  /// Device and pinned bytes the hierarchy allocates for `cfg`. `pinned_bytes` includes the host
  /// stores (`host_store_bytes` per source), which the adopting constructor does not allocate.
  static memory_requirements requirements(const hierarchy_config& cfg) {
    const hierarchy_config c = normalised(cfg);
    memory_requirements r;
    for (std::size_t s = 0; s < sources; ++s) {
      r.device_bytes += source_offsets(c, s).total;
      r.pinned_bytes += host_store::bytes_required(page_rows, Layout::sources[s].payload_layers,
                                                   Layout::sources[s].row_bytes, c.host_pages);
    }
    r.device_bytes += c.max_requests * sizeof(std::uint32_t);  // live flags
    if constexpr (Staging::shared) r.device_bytes += blocks_for(c).total_bytes;  // pools and arenas, one block per layer index
    r.device_bytes += write_state_bytes(c.max_requests, c.max_block > 1);  // step table, error books, backup work lists
    r.pinned_bytes += books_snapshot_bytes(c.max_requests);          // frontiers the host absorbs
    r.pinned_bytes += eager_bytes(c.max_requests) * staging_depth;
    if (c.max_block > 1) r.pinned_bytes += verify_eager_bytes(c) * staging_depth;  // verify descriptors
    return r;
  }

  /// Bytes of the shared staging arenas for `cfg` (`staging_arenas<chi>`: chi * N * K_max * k rows of
  /// the widest row, M_stage; 0 with dedicated staging or without speculation).
  static std::size_t staging_arena_bytes(const hierarchy_config& cfg) {
    const hierarchy_config c = normalised(cfg);
    return Staging::arenas * arena_stride(c);
  }

  /// Bytes of the host store of `source` for `cfg`: host_pages pages of page_rows rows of every
  /// payload layer (`host_store::bytes_required`). What the adopting constructor needs per source.
  static std::size_t host_store_bytes(const hierarchy_config& cfg, std::size_t source) {
    check_source(source);
    const hierarchy_config c = normalised(cfg);
    const auto& d = Layout::sources[source];
    return host_store::bytes_required(page_rows, d.payload_layers, d.row_bytes, c.host_pages);
  }
  /// Alignment an adopted host store needs (the copy kernels move rows in 16-byte vectors).
  static constexpr std::size_t host_store_alignment = 16;

  /// Allocates and initialises everything on the calling thread's current device, which the
  /// hierarchy is bound to from then on (`device()`), the host stores included (pinned with
  /// cudaHostAlloc, mapped and portable). Synchronises `stream` before returning. Throws
  /// wrong_device, before anything is allocated, when `stream` belongs to another device.
  explicit hierarchy(const hierarchy_config& cfg, cudaStream_t stream = nullptr)
      : hierarchy(cfg, stream, adopted_stores{}) {}

  /// As above, but the host stores are caller memory: `host_stores[s]` (one span per source, at
  /// least `host_store_bytes(cfg, s)` bytes, `host_store_alignment`-aligned) must be page-locked
  /// and mapped for this device, the current one (cudaHostAlloc with cudaHostAllocMapped, or
  /// cudaHostRegister with cudaHostRegisterMapped; add cudaHostAllocPortable /
  /// cudaHostRegisterPortable when the memory was pinned on another device or hierarchies of
  /// several devices read it) and outlive the hierarchy. Nothing is allocated or copied for them,
  /// so a large store costs no construction time. Layout (host_store.hpp): page g of source s
  /// occupies bytes [g * P, (g + 1) * P) of `host_stores[s]`, P = page_rows * payload_layers *
  /// row_bytes, and row r of payload layer l of a request lives in the host page g its history page
  /// r / page_rows was given, at g * P + (l * page_rows + r % page_rows) * row_bytes. Pages are
  /// given as histories grow (append, commit, imports; a fresh store gives the lowest first) and
  /// return at `complete`; `host_row(id, s, l, r).data()` is that address, so g = (host_row(id, s,
  /// 0, r).data() - host_stores[s].data()) / P. The bytes are not interpreted at construction:
  /// every store starts empty (no history, every page free) and rows enter through the history
  /// calls, which write them there; bytes a caller later writes in place over a stored row are what
  /// a miss on it copies to the GPU (zero-copy reads). Bytes past the pages are left alone. Throws
  /// size_mismatch (wrong span count, a span too small) or invalid_configuration (misaligned, not
  /// pinned, or not mapped for this device) or wrong_device (`stream`) before anything is
  /// allocated.
  hierarchy(const hierarchy_config& cfg, std::span<const std::span<std::byte>> host_stores, cudaStream_t stream)
      : hierarchy(cfg, stream, checked_host_stores(normalised(cfg), host_stores, "adopted host store")) {}

  /// Rank `rank` of the tensor-parallel hierarchies sharing `store` (docs/multi-gpu.md), bound to
  /// the current device as above: it allocates its own device state (hot caches, tail rings,
  /// optional pages, staging) and keeps no host store of its own. Its requests' histories live in
  /// `store`, one copy for every rank, whose bytes must be page-locked and mapped for this device
  /// (`cuda::pinned_shared_host_store`, or a `shared_host_store` over spans pinned with
  /// cudaHostAllocPortable | cudaHostAllocMapped); every kernel that writes a host copy (appends,
  /// commits, the step-wide writes' critical and backup launches) writes only the rows of the
  /// history pages this rank owns (`store.owner(p) == rank`). Reads of host rows happen on the
  /// device, so the host cannot check them per row as `host_hierarchy` does: the engine orders
  /// each owner's host writes before another rank's launches that may read them (docs/multi-gpu.md,
  /// "Ordering on the CUDA backend"). `store` must outlive the hierarchy; the rank's page holds and
  /// attachments end with it. `cfg.host_pages` is 0 or the store's `host_pages()`. Throws
  /// invalid_configuration (rank outside the store's ranks or already bound, host_pages not the
  /// store's, store bytes not mapped for this device, or what the other constructors reject) or
  /// wrong_device (`stream`). A hierarchy of another layout does not compile.
  hierarchy(const hierarchy_config& cfg, shared_host_store<Layout>& store, std::size_t rank, cudaStream_t stream)
      : hierarchy(dhisparse::detail::shared_config(cfg, store.host_pages()), stream,
                  checked_host_stores(normalised(dhisparse::detail::shared_config(cfg, store.host_pages())),
                                      store_spans(store), "shared host store"),
                  &store.books(), rank) {}

  hierarchy(const hierarchy&) = delete;
  hierarchy& operator=(const hierarchy&) = delete;
  /// Waits for the whole device, then frees its memory: a device-wide wait by design, off the step
  /// path. Waiting for fewer streams is not safe: the hierarchy's memory is used on streams it does
  /// not know (resolves, verifies and copies on caller streams, a residency manager's copy stream;
  /// its own stream may already be destroyed), and cudaFree of its device memory synchronises the
  /// device anyway (CUDA Programming Guide, stream-ordered memory allocator). Adopted host stores
  /// are not freed: they stay the caller's, and must outlive the work that used this hierarchy.
  /// Waits for and frees on the hierarchy's device, from any thread.
  ~hierarchy() {
    const detail::device_guard on(device_, std::nothrow);
    cudaDeviceSynchronize();
  }

  /// The configuration in use, with defaults filled in (tail_rows, host_pages).
  [[nodiscard]] const hierarchy_config& config() const { return cfg_; }
  /// Location geometry of the payload pools shared by every source: hot-cache, tail and optional
  /// locations. Staging locations differ by source with `staging_arenas<chi>`: use `space(source)`.
  [[nodiscard]] const location_space& space() const { return space_; }
  /// Location geometry of `source`, staging locations included (`space()` plus the source's
  /// `staging_gap`: 0 with dedicated staging; with `staging_arenas<chi>` the distance from the
  /// source's pools to the arenas, which share one block per payload-layer index with them).
  [[nodiscard]] const location_space& space(std::size_t source) const {
    check_source(source);
    return src_[source].view.space;
  }
  /// True while `id` is admitted.
  [[nodiscard]] bool contains(request_id id) const { return registry_.contains(id); }
  /// Request slot of an admitted request (what `batch_view::slots` names); throws unknown_request otherwise.
  [[nodiscard]] std::size_t slot_of(request_id id) const { return registry_.slot(id); }
  /// Number of requests admitted now.
  [[nodiscard]] std::size_t admitted_count() const { return registry_.size(); }
  /// The stream used by calls that take none.
  [[nodiscard]] cudaStream_t stream() const { return stream_; }
  /// The device the hierarchy was created on (the current device of the constructing thread). It
  /// is made current for every call that needs it, from any thread, and the calling thread's own
  /// device is restored when the call returns; streams given to calls must belong to it
  /// (wrong_device otherwise; the null stream is allowed and means this device's).
  [[nodiscard]] int device() const noexcept { return device_; }
  /// True when the hierarchy is a rank of a shared host store.
  [[nodiscard]] bool shares_host_store() const { return binding_.books() != nullptr; }
  /// Its rank on the shared host store (0 when it owns its stores).
  [[nodiscard]] std::size_t rank() const { return binding_.rank(); }
  /// CTAs of the persistent resolver grid (SMs x resident CTAs per SM), fixed at construction.
  [[nodiscard]] int resolver_grid() const { return grid_; }
  /// Dynamic shared memory of one resolver CTA.
  [[nodiscard]] std::size_t resolver_shared_bytes() const {
    return detail::resolve_shared_bytes<resolve_traits>(cfg_.max_requests, widest_row_bytes<Layout>());
  }
  /// Shape of the address-ordered copy phase of batches above early_copy_max_batch (a tuning
  /// switch): warps per CTA that copy (0: all) and rows each copying warp keeps in flight (1 or
  /// 2). Fewer rows in flight touch fewer host pages at once.
  void set_copy_shape(unsigned copy_warps, unsigned rows_per_warp) {
    tuning_.copy_warps = copy_warps;
    tuning_.rows_per_warp = rows_per_warp;
  }
  /// Shape of early copies (a tuning switch; default 8 warps per CTA, 1 row each; 0 warps: all,
  /// 0 rows: 2): see resolve_params::early_copy_warps.
  void set_early_copy_shape(unsigned copy_warps, unsigned rows_per_warp) {
    tuning_.early_copy_warps = copy_warps;
    tuning_.early_rows_per_warp = rows_per_warp;
  }
  /// Shape of `copy_follower` after a resolve (a tuning switch): copying warps per SM, 1-16 or
  /// 32 (default 32: every warp resident at once), and rows each warp keeps in flight, 1 or 2
  /// (default 2). Fewer rows in flight touch fewer host pages at once. Read at launch, so a
  /// captured graph keeps the shape it was captured with; follower copies after a verify keep
  /// their own. Throws invalid_configuration for other values, with the shape unchanged.
  void set_follower_copy_shape(unsigned warps_per_sm, unsigned rows_per_warp) {
    if (!detail::follower_copy_shape::valid(warps_per_sm, rows_per_warp))
      throw invalid_configuration("follower copy shape: warps per SM must be 1-16 or 32 and rows per warp 1 or 2 (got " +
                                  std::to_string(warps_per_sm) + ", " + std::to_string(rows_per_warp) + ")");
    follower_shape_ = {warps_per_sm, rows_per_warp};
  }
  /// Largest batch whose copies start early, in selection order (a tuning switch; default every
  /// batch, 0 turns early copies off): see resolve_params::early_copy_max_batch.
  void set_early_copy_max_batch(unsigned entries) { tuning_.early_copy_max_batch = entries; }
  /// CTAs a resolve launches (a tuning switch): 0 = the whole persistent grid (default), else at
  /// most `ctas`. The kernel is correct for any grid; fewer CTAs launch and retire sooner.
  void set_resolver_ctas(unsigned ctas) { resolver_ctas_ = ctas; }
  /// Most copy units (missing rows x copied layers) a batch entry copies with its own CTA (a
  /// tuning switch; default resolve_params::self_copy_units, capped at
  /// resolve_traits::self_copy_max_units; 0 leaves every copy to the whole grid).
  void set_self_copy_units(unsigned units) {
    tuning_.self_copy_units = std::min(units, resolve_traits::self_copy_max_units);
  }
  /// Launches the per-step kernels (resolve, follower copies, verify) with programmatic dependent
  /// launch (default off; for devices of compute capability 9.0 and up): each may begin while the
  /// kernel before it in the stream (the indexer that writes the selections, or the step's
  /// previous kernel) finishes, hiding most of its launch latency, and lets a kernel launched
  /// after it with programmatic stream serialization (the sparse attention) be scheduled as its
  /// CTAs retire. Each waits for the previous kernel's completion before it reads anything, so
  /// results are exact whatever that kernel does; a kernel launched after them this way must
  /// itself wait (`cudaGridDependencySynchronize`) before it reads the locations or the rows.
  /// Capturable: a captured launch becomes a programmatic edge of the graph.
  void set_programmatic_launch(bool on) { programmatic_launch_ = on; }
  /// Whether the per-step kernels launch with programmatic dependent launch (`set_programmatic_launch`).
  [[nodiscard]] bool programmatic_launch() const { return programmatic_launch_; }

  // ------------------------------------------------------------------ admission

  /// Admits a request with an empty history; waits (not admitted) when no slot is free.
  admission admit(request_id id) { return admit(id, stream_); }
  /// As above, marking the slot live on `stream`.
  admission admit(request_id id, cudaStream_t stream) {
    const auto guard = on_device(stream);
    const auto lock = binding_.lock();
    if (binding_.admission_waits(registry_, id)) return {};  // shared store: as host_hierarchy::admit
    auto slot = registry_.admit(id);
    if (!slot) return {};
    id_of_slot_[*slot] = id;
    DHISPARSE_CUDA_TRY(detail::launch_store_value<std::uint32_t>(live_buffer_.data() + *slot, 1u, stream));
    binding_.attach(id, *slot, sources, books_of_source());
    return {true, *slot};
  }

  /// Completes a request: its host pages, optional pages and slot are released and its device
  /// state is reset in stream order.
  void complete(request_id id) { complete(id, stream_); }
  /// As above, with the device state reset on `stream`.
  void complete(request_id id, cudaStream_t stream) {
    const auto guard = on_device(stream);
    const auto lock = binding_.lock();
    absorb(stream);  // nothing of the slot may still be in flight when its books are cleared
    const std::size_t slot = registry_.slot(id);
    DHISPARSE_CUDA_TRY(detail::launch_store_value<std::uint32_t>(live_buffer_.data() + slot, 0u, stream));
    for (std::size_t s = 0; s < sources; ++s) {
      auto& src = src_[s];
      src.books.release_slot(slot);
      DHISPARSE_CUDA_TRY(detail::launch_forget_slot_plan(src.ws, static_cast<int>(slot), stream));
      DHISPARSE_CUDA_TRY(detail::launch_reset_slots(src.view, static_cast<unsigned>(slot), 1u, stream));
      if (speculative()) {
        src.partial[slot] = 0;
        close_round(s, slot, stream);
        DHISPARSE_CUDA_TRY(detail::launch_verify_forget_slot(src.vws, static_cast<int>(slot), stream));
      }
    }
    books_changed(stream);
    binding_.detach(id);  // its pages were dropped above
    registry_.release(id);
    id_of_slot_[slot].reset();
  }

  // ------------------------------------------------------------------ history

  /// Rows stored for a request/source (host bookkeeping; the device copy follows in stream order).
  /// After batched writes or commits (`append`/`commit` over a device view) the device leads:
  /// the frontier is read back from the device then (synchronises).
  [[nodiscard]] std::int64_t frontier(request_id id, std::size_t source) const {
    check_source(source);
    if (src_[source].device_writes) return device_frontier(id, source);
    return src_[source].books.slot(registry_.slot(id)).frontier;
  }
  /// Committed token positions of a request/source: frontier · m plus the committed positions of a
  /// partially filled boundary row (host bookkeeping; as `host_hierarchy::positions`).
  [[nodiscard]] std::int64_t positions(request_id id, std::size_t source) const {
    check_source(source);
    if (src_[source].device_writes) {  // the device leads (see `frontier`)
      const auto m = static_cast<std::int64_t>(Layout::sources[source].positions_per_row);
      return device_frontier(id, source) * m + (speculative() ? device_partial(source, registry_.slot(id)) : 0);
    }
    return committed_positions(source, registry_.slot(id));
  }

  /// Appends `count` rows from device-accessible memory (device memory, or pinned host memory)
  /// laid out [payload layer][count][row_bytes]. A kernel writes them into the mapped host store
  /// and the newest T into the tail, then publishes the frontier. Not capturable (host pages are
  /// allocated here).
  void append(request_id id, std::size_t source, const std::byte* rows, std::size_t count, cudaStream_t stream) {
    const auto guard = on_device(stream);
    check_source(source);
    const auto lock = binding_.lock();
    absorb(stream);
    const std::size_t slot = registry_.slot(id);
    src_[source].books.check_append(id, source, slot, count);
    if (count == 0) return;
    check_device_accessible(rows, "append");
    append_checked(source, slot, rows, count, stream);
  }

  /// Appends `count` rows from any host memory, laid out as above (the host API's signature):
  /// stages them through a stream-ordered device allocation.
  void append(request_id id, std::size_t source, std::span<const std::byte> rows, std::size_t count,
              cudaStream_t stream) {
    const auto guard = on_device(stream);
    check_source(source);
    const auto lock = binding_.lock();
    absorb(stream);
    const std::size_t slot = registry_.slot(id);
    const auto& d = Layout::sources[source];
    src_[source].books.check_append(id, source, slot, count);  // capacity and host pages, before any size math
    if (rows.size() != count * d.payload_layers * d.row_bytes)  // count <= max_rows: no overflow
      throw size_mismatch("append of request " + std::to_string(id) + " to source " + std::to_string(source) + " got " +
                          std::to_string(rows.size()) + " bytes for " + std::to_string(count) + " rows, expected " +
                          std::to_string(count * d.payload_layers * d.row_bytes));
    if (count == 0) return;
    detail::with_device_copy(rows, stream, [&](const std::byte* copy) { append_checked(source, slot, copy, count, stream); });
  }
  /// As above, on the hierarchy's stream.
  void append(request_id id, std::size_t source, std::span<const std::byte> rows, std::size_t count) {
    append(id, source, rows, count, stream_);
  }

  // ------------------------------------------------------------------ batched writes (engine step)
  // An engine reserves host pages outside its step graph every few steps (`reserve_ahead`), then
  // captures `append(source, kv_write_view, stream)` (and `commit(source, commit_view, stream)`)
  // with its resolves. The device frontier leads from then on; `sync_books` brings the host books
  // up to date, and every eager call that depends on them does so itself (docs/design.md,
  // "Batched writes").

  /// Reserves host-store pages for a request/source ahead of its writes: afterwards pages cover
  /// rows [0, min(max_rows, frontier + rows_ahead)); the new page-table entries are uploaded on
  /// `stream`. All or nothing: throws host_pool_exhausted with nothing reserved. Not capturable.
  void reserve_rows(request_id id, std::size_t source, std::size_t rows_ahead, cudaStream_t stream) {
    const auto guard = on_device(stream);
    check_source(source);
    check_not_captured(stream, "reserve_rows");
    const auto lock = binding_.lock();
    absorb(stream);
    const std::size_t slot = registry_.slot(id);
    auto& books = src_[source].books;
    books.check_reserve(id, source, books.fresh_pages_to_reserve(slot, rows_ahead));
    const auto r = books.reserve(slot, rows_ahead);
    try {
      if (r.last_page > r.first_page)
        // Pageable source: cudaMemcpyAsync stages it before returning, so the books may change later.
        DHISPARSE_CUDA_TRY(cudaMemcpyAsync(src_[source].view.host_page + slot * pages_per_request_ + r.first_page,
                                           books.slot(slot).host_pages.data() + r.first_page,
                                           (r.last_page - r.first_page) * sizeof(std::int32_t),
                                           cudaMemcpyHostToDevice, stream));
    } catch (...) {
      books.undo_reserve(slot, r);
      throw;
    }
  }
  /// As above, on the hierarchy's stream.
  void reserve_rows(request_id id, std::size_t source, std::size_t rows_ahead) {
    reserve_rows(id, source, rows_ahead, stream_);
  }
  /// `reserve_rows(id, s, rows_ahead)` for every admitted request and every source, all or
  /// nothing (host_pool_exhausted names the first source short of pages); the page-table entries
  /// of every source travel in one upload and one launch on `stream`. Not capturable: the engine
  /// calls it between graph replays, every few steps.
  void reserve_ahead(std::size_t rows_ahead, cudaStream_t stream) {
    const auto guard = on_device(stream);
    check_not_captured(stream, "reserve_ahead");
    const auto lock = binding_.lock();
    absorb(stream);
    const auto admitted = registry_.admitted();
    for (std::size_t s = 0; s < sources; ++s) {
      std::size_t pages = 0;  // on a shared store, pages another rank already has are not taken again
      for (const auto& [id, slot] : admitted) pages += src_[s].books.fresh_pages_to_reserve(slot, rows_ahead);
      if (pages > src_[s].books.free_host_pages())
        throw host_pool_exhausted("reserve_ahead of " + std::to_string(rows_ahead) + " rows needs " +
                                  std::to_string(pages) + " host pages on source " + std::to_string(s) + ", " +
                                  std::to_string(src_[s].books.free_host_pages()) + " free");
    }
    struct done_reservation {
      std::size_t source, slot;
      dhisparse::detail::history_books::reserve_span span;
    };
    std::vector<done_reservation> done;
    std::vector<detail::page_table_update> updates;
    for (std::size_t s = 0; s < sources; ++s)
      for (const auto& [id, slot] : admitted) {
        const auto r = src_[s].books.reserve(slot, rows_ahead);
        if (r.last_page == r.first_page) continue;
        done.push_back({s, slot, r});
        for (std::size_t g = r.first_page; g < r.last_page; ++g)
          updates.push_back({src_[s].view.host_page, slot * pages_per_request_ + g,
                             static_cast<std::int32_t>(src_[s].books.slot(slot).host_pages[g])});
      }
    if (updates.empty()) return;
    try {
      void* tmp = nullptr;
      const std::size_t bytes = updates.size() * sizeof(detail::page_table_update);
      DHISPARSE_CUDA_TRY(cudaMallocAsync(&tmp, bytes, stream));
      // Pageable source: staged before the call returns, so `updates` may go.
      DHISPARSE_CUDA_TRY(cudaMemcpyAsync(tmp, updates.data(), bytes, cudaMemcpyHostToDevice, stream));
      DHISPARSE_CUDA_TRY(
          detail::launch_page_table_update(static_cast<const detail::page_table_update*>(tmp), updates.size(), stream));
      DHISPARSE_CUDA_TRY(cudaFreeAsync(tmp, stream));
    } catch (...) {
      for (auto it = done.rbegin(); it != done.rend(); ++it) src_[it->source].books.undo_reserve(it->slot, it->span);
      throw;
    }
  }
  /// As above, on the hierarchy's stream.
  void reserve_ahead(std::size_t rows_ahead) { reserve_ahead(rows_ahead, stream_); }
  /// Rows of a request/source that have host pages (stored or reserved): a batched write or commit
  /// may move its frontier up to here. Host books: reservations are made on the host only.
  [[nodiscard]] std::int64_t reserved_rows(request_id id, std::size_t source) const {
    check_source(source);
    return src_[source].books.reserved_rows(registry_.slot(id));
  }

  /// Writes one step's new rows of every entry of `batch` on one source: ONE launch (the
  /// step-wide kernel over this source: one CTA of 1-8 warps per entry) writes each entry's rows
  /// into the tail ring of every payload layer and through to the mapped host store (inline: no
  /// backup to join), then publishes the device frontier (which `sync_books` absorbs). Reads
  /// only device memory, allocates nothing, fixed launch shape: capturable.
  /// Entries are checked on the device (kv_write.cuh); a bad one is left untouched and thrown by
  /// `check_errors`. Rows must lie within the request's reservation (`reserve_rows`). On a
  /// speculative hierarchy a written entry supersedes its staged block, as the per-request append.
  void append(std::size_t source, const kv_write_view& batch, cudaStream_t stream) {
    const auto guard = on_device(stream);
    check_source(source);
    if (batch.capacity == 0) return;
    if (batch.slots == nullptr || batch.rows == nullptr || batch.layer_rows == nullptr)
      throw size_mismatch("kv_write_view needs device slots, rows and layer_rows");
    check_view_capacity(batch.capacity, "kv_write_view");
    const std::size_t rb = Layout::sources[source].row_bytes;
    if (batch.row_stride != 0 && (batch.row_stride < rb || batch.row_stride % 16 != 0))
      throw size_mismatch("kv_write_view row_stride " + std::to_string(batch.row_stride) +
                          " must be 0 or a multiple of 16 of at least the row's " + std::to_string(rb) + " bytes");
    join_backup_impl(stream);  // a later write joins the backup of the last one (its ring rows may be overwritten)
    const detail::write_args a{batch.slots,      batch.rows, batch.first,    batch.layer_rows, batch.row_stride,
                               0u,               batch.max_rows, batch.capacity, false};
    DHISPARSE_CUDA_TRY(detail::launch_step_write(step_table_, static_cast<unsigned>(source), 1u, a, true,
                                                 detail::write_warps(batch.max_rows, vectors_of(source)), stream));
    src_[source].device_writes = true;
    device_writes_ = true;
  }

  /// Writes one step's new rows of every request on EVERY source in ONE launch (one CTA of 1-8
  /// warps per (source, entry), sized by the row bytes), with the per-source append's checks and
  /// errors made per (source, entry) (kv_write.cuh; `check_errors` throws them as it throws the
  /// per-source append's). The critical launch on `stream` writes the tail rings, the rows that
  /// fall outside the tail window straight to the host store, and the device frontiers; the host
  /// copy of the window rows is made by a backup launch on `backup`, forked from
  /// `stream` after the critical launch and joined by `join_backup` (events: record and wait
  /// nodes under stream capture). Until it is joined, every row not ready on the GPU already has
  /// its host copy (the rows being backed up are in the tail window, which resolves read on the
  /// GPU), so a resolve need not wait for it. `backup == stream`: the critical launch writes
  /// through to the host store itself (inline, one launch). Any later write, and every call that
  /// reads or frees the host store (the eager calls that absorb the books: complete, imports,
  /// optional-history mapping, eager resolves and verifies, `host_row`), joins first on its own
  /// stream. Capturable: reads only device memory, allocates nothing, fixed launch shape; a
  /// capture must `join_backup` before it ends (CUDA refuses to end a capture with a forked
  /// stream unjoined). `backup` must not be the legacy default stream when `stream` is captured.
  void append_step(const kv_step_write_view& batch, cudaStream_t backup, cudaStream_t stream) {
    const auto guard = on_device(stream);
    check_stream(backup);
    if (batch.capacity == 0) return;
    if (batch.slots == nullptr || batch.rows == nullptr || batch.layer_rows == nullptr)
      throw size_mismatch("kv_step_write_view needs device slots, rows and layer_rows");
    check_view_capacity(batch.capacity, "kv_step_write_view");
    const std::size_t widest = widest_row_bytes<Layout>();
    if (batch.row_stride != 0 && (batch.row_stride < widest || batch.row_stride % 16 != 0))
      throw size_mismatch("kv_step_write_view row_stride " + std::to_string(batch.row_stride) +
                          " must be 0 or a multiple of 16 of at least the widest row's " + std::to_string(widest) +
                          " bytes");
    if (batch.rows_pitch != 0 && batch.rows_pitch < batch.capacity)
      throw size_mismatch("kv_step_write_view rows_pitch " + std::to_string(batch.rows_pitch) +
                          " must be 0 or at least the capacity " + std::to_string(batch.capacity));
    join_backup_impl(stream);
    const bool inline_host = backup == stream;
    unsigned warps = 1;
    for (std::size_t s = 0; s < sources; ++s) warps = std::max(warps, detail::write_warps(batch.max_rows, vectors_of(s)));
    const detail::write_args a{batch.slots,      batch.rows,       batch.first,    batch.layer_rows, batch.row_stride,
                               batch.rows_pitch, batch.max_rows, batch.capacity, true};
    DHISPARSE_CUDA_TRY(detail::launch_step_write(step_table_, 0u, static_cast<unsigned>(sources), a, inline_host,
                                                 warps, stream));
    for (auto& src : src_) src.device_writes = true;
    device_writes_ = true;
    if (!inline_host) fork_backup(batch.capacity, warps, backup, stream);
  }

  /// Makes `stream` wait for the pending host backup of the last step-wide write or commit (an
  /// event wait; a wait node under capture), so what `stream` runs next sees complete host
  /// copies. Nothing when none is pending. Eager: enqueues the wait and clears `backup_pending`.
  /// Captured in the capture that forked the backup: joins it there (what a captured step must do
  /// before its capture ends). A capture waiting for an eager backup waits on it as an external
  /// event (at each replay, for its latest record) and leaves it pending for eager work. Throws
  /// invalid_configuration when the backup was forked into another capture that is still open.
  void join_backup(cudaStream_t stream) {
    const auto guard = on_device(stream);
    join_backup_impl(stream);
  }
  /// True while a step-wide write or commit has a host backup that no stream has joined yet.
  [[nodiscard]] bool backup_pending() const { return backup_.pending; }

  /// Brings the host books up to what the device did: synchronises `stream` (only it) and absorbs
  /// the frontiers (and partial rows, closing those rounds) that batched appends and commits
  /// published. Throws device_error if a frontier went back or past its reservation. Eager calls
  /// that depend on the books call it themselves on their stream; an engine calls it before it
  /// reads the books between replays. Not capturable.
  void sync_books(cudaStream_t stream) {
    const auto guard = on_device(stream);
    const auto lock = binding_.lock();
    sync_books_impl(stream);
  }
  /// As above, on the hierarchy's stream.
  void sync_books() { sync_books(stream_); }

  // ------------------------------------------------------------------ resolve

  /// Eager resolve of a batch on one source (the FusedResolver call): validates on the host,
  /// uploads the batch descriptor from pinned staging and launches one fused kernel on `stream`.
  /// Asynchronous; `check_errors`, `last_stats` and `resolve_sync` report. Not capturable: use the
  /// `batch_view` overload inside a CUDA graph.
  void resolve(std::size_t source, std::span<const batch_item> batch) { resolve(source, batch, stream_); }
  /// As above, on `stream`; `mode` selects the payload layers copied.
  void resolve(std::size_t source, std::span<const batch_item> batch, cudaStream_t stream,
               copy_layers mode = copy_layers::all) {
    const auto guard = on_device(stream);
    check_source(source);
    check_not_capturing(stream, "resolve", "resolve(source, batch_view, stream)");
    join_backup_impl(stream);  // eager path: misses fetch from the host store (a captured resolve reads the window on the GPU)
    auto& src = src_[source];
    check_followers_copied(source, "resolved again");
    if (++stamp_epoch_ == 0) {
      std::fill(stamp_.begin(), stamp_.end(), 0u);
      stamp_epoch_ = 1;
    }
    for (const auto& item : batch) {
      const std::size_t slot = registry_.slot(item.request);
      if (stamp_[slot] == stamp_epoch_)
        throw duplicate_in_batch("request " + std::to_string(item.request) + " appears twice in one resolve batch");
      stamp_[slot] = stamp_epoch_;
      if (item.length < 0 || (item.length > 0 && (item.selection == nullptr || item.locations == nullptr)))
        throw size_mismatch("request " + std::to_string(item.request) + ": selection of length " +
                            std::to_string(item.length) + " needs device selection and location pointers");
      if (static_cast<std::size_t>(item.length) > top_k)
        throw selection_too_long("selection of request " + std::to_string(item.request) + " on source " +
                                 std::to_string(source) + " has " + std::to_string(item.length) +
                                 " entries, top_k is " + std::to_string(top_k));
    }
    const auto n = static_cast<std::uint32_t>(batch.size());  // <= max_requests: slots are distinct
    const eager_layout lay = eager_offsets(n);
    unsigned ring_slot = 0;
    std::byte* staged = ring_.acquire(ring_slot);
    std::memcpy(staged + lay.count, &n, sizeof(n));
    for (std::uint32_t e = 0; e < n; ++e) {
      const auto slot = static_cast<std::int32_t>(registry_.slot(batch[e].request));
      std::memcpy(staged + lay.slots + e * sizeof(std::int32_t), &slot, sizeof(slot));
      std::memcpy(staged + lay.lengths + e * sizeof(std::int32_t), &batch[e].length, sizeof(std::int32_t));
      std::memcpy(staged + lay.sel + e * sizeof(void*), &batch[e].selection, sizeof(void*));
      std::memcpy(staged + lay.loc + e * sizeof(void*), &batch[e].locations, sizeof(void*));
    }
    DHISPARSE_CUDA_TRY(cudaMemcpyAsync(src.eager, staged, lay.total, cudaMemcpyHostToDevice, stream));
    ring_.release(ring_slot, stream);
    batch_view v;
    v.count = reinterpret_cast<const std::uint32_t*>(src.eager + lay.count);
    v.slots = reinterpret_cast<const std::int32_t*>(src.eager + lay.slots);
    v.lengths = reinterpret_cast<const std::int32_t*>(src.eager + lay.lengths);
    v.selection_ptrs = reinterpret_cast<const row_index* const*>(src.eager + lay.sel);
    v.location_ptrs = reinterpret_cast<location* const*>(src.eager + lay.loc);
    v.capacity = n;
    launch(source, v, stream, mode);
  }

  /// Raw resolve over a device batch descriptor: no host synchronisation, no allocation, a fixed
  /// launch shape, so it can be captured in a CUDA graph and replayed with other batch contents
  /// and counts. Slots, lengths and duplicates are validated on the device.
  void resolve(std::size_t source, const batch_view& batch, cudaStream_t stream, copy_layers mode = copy_layers::all) {
    const auto guard = on_device(stream);
    check_source(source);
    check_followers_copied(source, "resolved again");
    if (batch.count == nullptr || batch.slots == nullptr)
      throw size_mismatch("batch_view needs device count and slots");
    const bool gathered = batch.gathered();
    const bool strided = batch.selections != nullptr && batch.locations != nullptr && batch.stride > 0;
    if (!gathered && !strided)
      throw size_mismatch("batch_view needs selections/locations with stride >= 1, or selection_ptrs/location_ptrs");
    if (batch.capacity > cfg_.max_requests)
      throw size_mismatch("batch_view capacity " + std::to_string(batch.capacity) + " exceeds max_requests " +
                          std::to_string(cfg_.max_requests));
    launch(source, batch, stream, mode);
  }

  /// Eager resolve, then `check_errors(stream)`; returns the batch's stats (synchronises `stream`
  /// and the hierarchy's stream, not the device).
  resolve_stats resolve_sync(std::size_t source, std::span<const batch_item> batch, cudaStream_t stream,
                             copy_layers mode = copy_layers::all) {
    const auto guard = on_device(stream);
    resolve(source, batch, stream, mode);
    check_errors(stream);
    resolve_stats total;
    for (const auto& s : last_stats(source)) total += s;
    return total;
  }

  /// Replays the last resolve's host copies of `source` into follower payload `layer` (layer-wise
  /// prefetch, after a `copy_layers::producer_only` resolve). Capturable.
  void copy_follower(std::size_t source, std::size_t layer, cudaStream_t stream) {
    const auto guard = on_device(stream);
    check_source(source);
    auto& src = src_[source];
    if (layer == 0 || layer >= src.layer_pending.size())
      throw invalid_source("payload layer " + std::to_string(layer) + " is not a follower of source " +
                           std::to_string(source));
    if (!src.layer_pending[layer]) return;  // nothing planned, or already copied
    if (src.follower_plan_from_verify) {
      DHISPARSE_CUDA_TRY(detail::launch_verify_follower_copy(src.view, src.vws, static_cast<unsigned>(layer),
                                                             sm_count_ * 4, stream, programmatic_launch_));
      src.layer_pending[layer] = false;
      if (std::none_of(src.layer_pending.begin(), src.layer_pending.end(), [](bool b) { return b; }))
        src.follower_plan_from_verify = false;
      return;
    }
    DHISPARSE_CUDA_TRY(detail::launch_follower_copy(src.view, src.ws, static_cast<unsigned>(layer),
                                                    static_cast<unsigned>(top_k), sm_count_, follower_shape_, stream,
                                                    programmatic_launch_));
    src.layer_pending[layer] = false;
  }
  /// As above, on the hierarchy's stream.
  void copy_follower(std::size_t source, std::size_t layer) { copy_follower(source, layer, stream_); }

  /// Releases the shared staging arenas held by `source` (`staging_arenas<chi>`): every attention
  /// consumer of its last verify was enqueued on `stream` before this call, so the next source's
  /// verify may overwrite the arenas once `stream` reaches this point (a verify on another stream
  /// waits for it on the device; no host synchronisation). Staging locations of `source` are
  /// invalid afterwards. Rows the round admitted to the hot cache were written at their stable
  /// hot-cache addresses by the verify itself, so no copy-back is needed (docs/speculative.md,
  /// "Shared staging arenas"). Throws staging_not_held if `source` does not hold the arenas,
  /// pending_follower_copies before its followers replayed the plan. With `dedicated_staging` it
  /// only checks `source`. Capturable.
  void release_staging(std::size_t source, cudaStream_t stream) {
    const auto guard = on_device(stream);
    check_source(source);
    if constexpr (Staging::shared) {
      staging_.check_release(source);
      check_followers_copied(source, "released its staging");
      if (arena_free_) DHISPARSE_CUDA_TRY(cudaEventRecord(arena_free_.get(), stream));
      release_stream_ = stream;
      release_captured_ = capturing(stream);
      staging_.release();
    }
  }
  /// As above, on the hierarchy's stream.
  void release_staging(std::size_t source) { release_staging(source, stream_); }
  /// Source holding the shared staging arenas, if any (always none with dedicated staging).
  [[nodiscard]] std::optional<std::size_t> staging_holder() const { return staging_.holder(); }
  /// Rows of each payload layer's pool (`pool(s, l)`): every location, less the staging rows when
  /// they live in shared arenas.
  [[nodiscard]] std::size_t pool_rows() const { return Staging::shared ? space_.pool_rows() : space_.rows(); }

  // ------------------------------------------------------------------ per-step results
  // Two ways out. The `_async` calls write caller memory in stream order and never synchronise:
  // they are capturable and belong on the step path (an engine copies a step's stats and errors
  // into pinned memory and looks at them later, off the step path). The others synchronise only
  // the stream they are given, or the hierarchy's stream, never the device; results of work on
  // another stream must be ordered before that stream first (an event, or a wait on the host).

  /// Synchronises `stream`, takes and clears every error record of every source (bad entries of
  /// resolves, verifies, batched writes, stages and commits, and over-capacity batch counts since
  /// the last check), and throws the typed error of the first: the first failing launch of the
  /// lowest source, naming request, batch entry and selection entry. Its message ends with the
  /// others (the first few in full, then a count), so one call per step leaves nothing for the
  /// next. Verify errors mark their rounds unverified. Also throws device_error for CUDA errors
  /// (then records may remain). Synchronises `stream` only (it reads and clears on `stream`).
  void check_errors(cudaStream_t stream) {
    const auto guard = on_device(stream);
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
    DHISPARSE_CUDA_TRY(cudaGetLastError());
    std::optional<errc> first;
    std::string message;
    std::vector<std::string> others;
    for (std::size_t s = 0; s < sources; ++s) {
      // Each throw below clears the record it reports, so this loop ends.
      for (;;) {
        try {
          check_source_errors(s, stream);
          break;
        } catch (const device_error&) {
          throw;
        } catch (const error& e) {
          std::string what = e.what();
          if (what.rfind("dhisparse: ", 0) == 0) what.erase(0, 11);
          if (!first) {
            first = e.code();
            message = std::move(what);
          } else {
            others.push_back(std::move(what));
          }
        }
      }
    }
    if (!first) return;
    constexpr std::size_t shown = 3;
    if (!others.empty()) {
      message += "; " + std::to_string(others.size()) + " more error record" + (others.size() > 1 ? "s" : "") +
                 " cleared by this check:";
      for (std::size_t i = 0; i < others.size() && i < shown; ++i) message += " [" + others[i] + "]";
      if (others.size() > shown) message += " and " + std::to_string(others.size() - shown) + " more";
    }
    throw_error(*first, message);
  }
  /// As above, for the hierarchy's stream.
  void check_errors() { check_errors(stream_); }

  /// Enqueues on `stream` a copy of the per-entry stats of the last resolve launch of `source`
  /// before this point in `stream` into `out` (device memory, or pinned mapped host memory, valid
  /// once `stream` has passed this call): entry t for t below the launch's entry count, zero past
  /// it, so summing `out` gives the launch's totals whatever its size (up to max_requests entries).
  /// `to_resolve_stats` converts an entry. No synchronisation and no allocation; capturable (a
  /// replay copies the stats of the replayed launch). Throws size_mismatch for more than
  /// max_requests entries, invalid_configuration when `out` is not device-accessible.
  void copy_stats_async(std::size_t source, std::span<entry_stats> out, cudaStream_t stream) const {
    const auto guard = on_device(stream);
    check_source(source);
    entry_stats* const to = readback_target(out.data(), out.size(), "copy_stats_async");
    DHISPARSE_CUDA_TRY(detail::launch_snapshot_stats(src_[source].ws.control, src_[source].ws.stats, to,
                                                     static_cast<unsigned>(out.size()), stream));
  }
  /// The verify twin of `copy_stats_async`: stats of the last verify of `source` (max_block >= 2).
  /// Convert entries with `to_verify_stats`. Same contract: no synchronisation, capturable.
  void copy_verify_stats_async(std::size_t source, std::span<verify_entry_stats> out, cudaStream_t stream) const {
    const auto guard = on_device(stream);
    check_speculative(source);
    verify_entry_stats* const to = readback_target(out.data(), out.size(), "copy_verify_stats_async");
    DHISPARSE_CUDA_TRY(detail::launch_snapshot_stats(src_[source].vws.control, src_[source].vws.stats, to,
                                                     static_cast<unsigned>(out.size()), stream));
  }
  /// Takes the resolver error state of `source` in stream order: writes into `*out` (device memory,
  /// or pinned mapped host memory) the first bad entry of the first failing resolve launch and any
  /// over-capacity batch count since the state was last taken or checked, then clears it, as
  /// `check_errors` does, so a later failure is recorded again. `throw_if_error` turns the record
  /// into the typed error later, off the step path. No synchronisation; capturable (each replay
  /// takes the state of its own launches). Resolve errors only: verify errors change the host
  /// books (the failed round is marked unverified) and stay with `check_errors`.
  void copy_errors_async(std::size_t source, error_record* out, cudaStream_t stream) {
    const auto guard = on_device(stream);
    check_source(source);
    if (out == nullptr) throw size_mismatch("copy_errors_async needs a record to write");
    error_record* const to = readback_target(out, 1, "copy_errors_async");
    auto& src = src_[source];
    DHISPARSE_CUDA_TRY(detail::launch_take_errors(src.ws.control, src.ws.sticky, static_cast<unsigned>(cfg_.max_requests),
                                                  static_cast<unsigned>(source), to, stream));
  }
  /// Throws the typed error a record of `copy_errors_async` holds (the one `check_errors` would have
  /// thrown: an over-capacity batch first, then the bad entry), or returns when it holds none.
  /// Host only, no CUDA call. Requests are named by their current id when the slot is still held
  /// by one, else by slot.
  void throw_if_error(const error_record& r) const {
    if (r.source >= sources || r.entry >= static_cast<std::int64_t>(cfg_.max_requests) ||
        (r.entry >= 0 && std::string_view(to_string(to_errc(r.error.code))) == "unknown"))
      throw invalid_configuration("not an error record of this hierarchy's copy_errors_async (source " +
                                  std::to_string(r.source) + ", entry " + std::to_string(r.entry) + ")");
    if (r.overflow != 0)
      throw size_mismatch("resolve on source " + std::to_string(r.source) + " was given a batch count of " +
                          std::to_string(r.overflow) + ", above the batch_view capacity; extra entries were ignored");
    if (r.entry >= 0 && r.error.code != status_ok)
      throw_error(to_errc(r.error.code), describe(r.source, static_cast<std::size_t>(r.entry), r.error));
  }
  /// A copied resolve entry as `resolve_stats` (bytes = rows x layers copied x the source's row bytes).
  [[nodiscard]] static resolve_stats to_resolve_stats(std::size_t source, const entry_stats& r) {
    check_source(source);
    return {r.selected, r.direct, r.hot, r.host, r.rows_copied,
            static_cast<std::size_t>(r.rows_copied) * r.layers_copied * Layout::sources[source].row_bytes};
  }
  /// A copied verify entry as `verify_stats`.
  [[nodiscard]] static verify_stats to_verify_stats(std::size_t source, const verify_entry_stats& r) {
    check_source(source);
    return {r.selected, r.direct, r.block, r.hot, r.host, r.staged, r.rows_copied,
            static_cast<std::size_t>(r.rows_copied) * r.layers_copied * Layout::sources[source].row_bytes,
            r.staging_rows};
  }

  /// Per-entry stats of the last resolve launch of a source (synchronises the hierarchy's stream).
  [[nodiscard]] std::vector<resolve_stats> last_stats(std::size_t source) const {
    const auto guard = on_device();
    check_source(source);
    const auto& src = src_[source];
    const control_block cb = read_control(source);
    const auto raw = read_on(stream_, src.ws.stats, cb.last_count);
    std::vector<resolve_stats> out;
    out.reserve(raw.size());
    for (const auto& r : raw) out.push_back(to_resolve_stats(source, r));
    return out;
  }
  /// Per-entry status of the last resolve launch of a source (synchronises the hierarchy's stream).
  [[nodiscard]] std::vector<entry_error> last_errors(std::size_t source) const {
    const auto guard = on_device();
    check_source(source);
    const control_block cb = read_control(source);
    return read_on(stream_, src_[source].ws.errors, cb.last_count);
  }
  /// Host copies made by the last resolve of a source, in batch order then ascending row (the
  /// host backend's `last_plan`; synchronises the hierarchy's stream).
  [[nodiscard]] std::vector<planned_copy> last_plan(std::size_t source) const {
    const auto guard = on_device();
    check_source(source);
    const auto& src = src_[source];
    const control_block cb = read_control(source);
    std::vector<entry_stats> stats(cb.last_count);
    std::vector<entry_error> errs(cb.last_count);
    std::vector<plan_entry> plan(static_cast<std::size_t>(cb.last_count) * top_k);
    enqueue_read(stream_, stats.data(), src.ws.stats, stats.size());
    enqueue_read(stream_, errs.data(), src.ws.errors, errs.size());
    enqueue_read(stream_, plan.data(), src.ws.plan, plan.size());
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream_));
    std::vector<planned_copy> out;
    for (std::size_t t = 0; t < stats.size(); ++t)
      for (std::size_t m = 0; m < stats[t].rows_copied; ++m) {
        const plan_entry& p = plan[t * top_k + m];
        out.push_back({static_cast<std::size_t>(errs[t].slot), p.row, p.dst});
      }
    return out;
  }

  // ------------------------------------------------------------------ optional history

  /// Makes page `page` of a request's history ready in the optional-history map: takes a free
  /// optional pool page, copies the page's rows (every layer) from the host store on `stream`,
  /// then publishes the map entry behind the copy. Returns false (a wait) when no page is free.
  /// A page whose host page another request maps (shared prefixes) is published at once on that
  /// request's pool page, with no copy: its first mapping must be ordered before `stream`. On a
  /// shared host store, throws host_copy_pending (nothing changed) while an owner rank has not
  /// recorded every row of the page; the copy itself must be ordered after the owners' writes
  /// (docs/multi-gpu.md, "Ordering on the CUDA backend").
  bool map_optional_page(request_id id, std::size_t source, std::size_t page, cudaStream_t stream) {
    const auto guard = on_device(stream);
    check_source(source);
    const auto lock = binding_.lock();
    absorb(stream);
    const std::size_t slot = registry_.slot(id);
    auto& src = src_[source];
    binding_.check_page_copied(src.books, slot, id, source, page);  // shared store: its owner has recorded every row
    const bool had = page < pages_per_request_ && src.books.slot(slot).optional_page[page] >= 0;
    const auto taken = src.books.take_optional(id, source, slot, page);
    if (!taken) return false;
    const auto [g, fresh] = *taken;
    if (!fresh) {
      if (!had)  // shared with a request admitted on the same prefix: publish, no copy
        DHISPARSE_CUDA_TRY(detail::launch_store_value<std::int32_t>(
            src.view.optional_page + slot * pages_per_request_ + page, g, stream));
      return true;
    }
    // Copy, then publish the map entry behind the copy in stream order.
    try {
      DHISPARSE_CUDA_TRY(detail::launch_optional_page(src.view, src.books.slot(slot).host_pages[page],
                                                      static_cast<unsigned>(page), g, stream));
      DHISPARSE_CUDA_TRY(detail::launch_store_value<std::int32_t>(
          src.view.optional_page + slot * pages_per_request_ + page, g, stream));
    } catch (...) {
      src.books.release_optional(id, slot, page);  // not published: the page goes back to the pool
      throw;
    }
    return true;
  }
  /// As above, on the hierarchy's stream.
  bool map_optional_page(request_id id, std::size_t source, std::size_t page) {
    return map_optional_page(id, source, page, stream_);
  }

  /// Retires an optional page (its rows keep their host copy); the pool page becomes free.
  void unmap_optional_page(request_id id, std::size_t source, std::size_t page, cudaStream_t stream) {
    const auto guard = on_device(stream);
    check_source(source);
    const std::size_t slot = registry_.slot(id);
    auto& src = src_[source];
    if (!src.books.release_optional(id, slot, page)) return;
    DHISPARSE_CUDA_TRY(detail::launch_store_value<std::int32_t>(
        src.view.optional_page + slot * pages_per_request_ + page, std::int32_t{-1}, stream));
  }
  /// As above, on the hierarchy's stream.
  void unmap_optional_page(request_id id, std::size_t source, std::size_t page) {
    unmap_optional_page(id, source, page, stream_);
  }

  // ------------------------------------------------------------------ residency primitives
  // Used by cuda::residency_manager (cuda/residency_manager.cuh), which orders them with events:
  // a pool page is reserved, filled, published, later unmapped in stream order, and returned to
  // the pool only once no reader can still use it. map/unmap_optional_page above do all of it in
  // one stream instead.

  /// Reserves an optional pool page for complete history page `page` of a request without copying
  /// or publishing anything (the page stays invisible to the resolver); -1 when no pool page is
  /// free. When another request already maps the page's host page (shared prefixes), the request
  /// joins that pool page instead: nothing is taken from the pool, `*shared` (when given) is set,
  /// and the caller publishes the entry without a copy, ordered after the first mapping's fill.
  /// Throws position_beyond_frontier for an incomplete page, position_out_of_range for a page
  /// outside the request, and invalid_configuration when the page already holds one (state unchanged).
  std::int32_t reserve_optional_page(request_id id, std::size_t source, std::size_t page, bool* shared = nullptr) {
    const auto guard = on_device();
    check_source(source);
    const auto lock = binding_.lock();
    absorb(stream_);
    const std::size_t slot = registry_.slot(id);
    auto& books = src_[source].books;
    if (page < pages_per_request_ && books.slot(slot).optional_page[page] >= 0)
      throw invalid_configuration("page " + std::to_string(page) + " of request " + std::to_string(id) + " on source " +
                                  std::to_string(source) + " already holds optional pool page " +
                                  std::to_string(books.slot(slot).optional_page[page]));
    const auto taken = books.take_optional(id, source, slot, page);
    if (!taken) return -1;
    if (shared != nullptr) *shared = !taken->second;
    return taken->first;
  }
  /// Takes a history page's pool page out of the books without returning it to the pool and
  /// without touching the device map (unmap it in stream order first); -1 when it had none, or
  /// when other requests still map it (shared prefixes: it stays in the pool for them).
  std::int32_t detach_optional_page(request_id id, std::size_t source, std::size_t page) {
    check_source(source);
    return src_[source].books.detach_optional(id, registry_.slot(id), page);
  }
  /// Returns a detached pool page to the free pool, once no reader or copy can still use it.
  void recycle_optional_page(std::size_t source, std::int32_t pool_page) {
    check_source(source);
    if (pool_page < 0 || static_cast<std::size_t>(pool_page) >= cfg_.optional_pages)
      throw position_out_of_range("optional pool page " + std::to_string(pool_page) + " outside the pool of " +
                                  std::to_string(cfg_.optional_pages));
    src_[source].books.recycle_optional(pool_page);
  }
  /// Host-store page of history page `page` of a request (-1 while none of its rows exist).
  [[nodiscard]] std::int32_t host_page_of(request_id id, std::size_t source, std::size_t page) const {
    check_source(source);
    const auto& pages = src_[source].books.slot(registry_.slot(id)).host_pages;
    if (page >= pages.size())
      throw position_out_of_range("page " + std::to_string(page) + " outside the request's " +
                                  std::to_string(pages.size()) + " history pages");
    return static_cast<std::int32_t>(pages[page]);
  }

  /// Imports `count` rows from device-accessible memory ([payload layer][count][row_bytes]), the
  /// prefilled history of a request (resident-first): the newest `device_pages` complete pages that
  /// lie wholly in the imported rows get fresh optional pool pages and are written there only
  /// (device-only: their host-store pages are allocated, their host copy is deferred); every other
  /// row goes to the host store; the newest T rows also to the tail. The pool pages are published in
  /// `stream` behind the rows. Returns (history page, pool page) of every device-only page, newest
  /// first; fewer than `device_pages` when fewer are eligible or free. Same errors as `append`.
  std::vector<std::pair<std::size_t, std::int32_t>> import_rows(request_id id, std::size_t source, const std::byte* rows,
                                                                std::size_t count, std::size_t device_pages,
                                                                cudaStream_t stream) {
    const auto guard = on_device(stream);
    check_source(source);
    binding_.refuse("import_rows", "imports (device-only pages defer host copies) are");
    absorb(stream);
    const std::size_t slot = registry_.slot(id);
    auto& src = src_[source];
    src.books.check_append(id, source, slot, count);
    std::vector<std::pair<std::size_t, std::int32_t>> taken;
    if (count == 0) return taken;
    const auto a = src.books.commit_append(slot, count);
    const std::size_t first_whole = pages_for(a.first_row);  // first page starting inside the import
    std::vector<std::int32_t> pool_of_page(pages_per_request_, -1);
    try {
      for (std::size_t page = static_cast<std::size_t>(a.last_row) / page_rows;
           page-- > first_whole && taken.size() < device_pages;) {
        const auto t = src.books.take_optional(id, source, slot, page);
        if (!t) break;
        pool_of_page[page] = t->first;
        taken.emplace_back(page, t->first);
      }
      const std::size_t lo = static_cast<std::size_t>(a.first_row) / page_rows, hi = pages_for(a.last_row);
      void* tmp = nullptr;
      DHISPARSE_CUDA_TRY(cudaMallocAsync(&tmp, pages_per_request_ * sizeof(std::int32_t), stream));
      auto* dev_pool_of_page = static_cast<std::int32_t*>(tmp);
      // Pageable sources: cudaMemcpyAsync stages them before returning, so the vectors may go.
      DHISPARSE_CUDA_TRY(cudaMemcpyAsync(dev_pool_of_page + lo, pool_of_page.data() + lo, (hi - lo) * sizeof(std::int32_t),
                                         cudaMemcpyHostToDevice, stream));
      if (a.last_page > a.first_page)
        DHISPARSE_CUDA_TRY(cudaMemcpyAsync(src.view.host_page + slot * pages_per_request_ + a.first_page,
                                           src.books.slot(slot).host_pages.data() + a.first_page,
                                           (a.last_page - a.first_page) * sizeof(std::int32_t), cudaMemcpyHostToDevice,
                                           stream));
      DHISPARSE_CUDA_TRY(detail::launch_import(src.view, static_cast<unsigned>(slot), rows, a.first_row,
                                               static_cast<unsigned>(count), a.last_row, dev_pool_of_page,
                                               sm_count_ * 8, stream));
      // Publish behind the rows (stream order), so a pending page is never visible. Pages of the
      // range without a pool page hold -1 in both: none of them was complete before the import.
      DHISPARSE_CUDA_TRY(cudaMemcpyAsync(src.view.optional_page + slot * pages_per_request_ + lo, dev_pool_of_page + lo,
                                         (hi - lo) * sizeof(std::int32_t), cudaMemcpyDeviceToDevice, stream));
      DHISPARSE_CUDA_TRY(cudaFreeAsync(tmp, stream));
    } catch (...) {
      for (const auto& [page, g] : taken) src.books.release_optional(id, slot, page);
      src.books.undo_append(slot, a);
      throw;
    }
    books_changed(stream);
    return taken;
  }

  /// Free optional pages of a source's pool.
  [[nodiscard]] std::size_t free_optional_pages(std::size_t source) const {
    check_source(source);
    return src_[source].books.free_optional_pages();
  }
  /// Free host-store pages of a source.
  [[nodiscard]] std::size_t free_host_pages(std::size_t source) const {
    check_source(source);
    const auto lock = binding_.lock();
    return src_[source].books.free_host_pages();
  }
  /// Bytes of host-store pages allocated now, every source: this hierarchy's requests' histories,
  /// or on a shared host store every rank's (`shared_host_store::host_bytes_in_use`).
  [[nodiscard]] std::size_t host_bytes_in_use() const {
    const auto lock = binding_.lock();
    std::size_t n = 0;
    for (const auto& src : src_)
      n += (src.books.store().total_pages() - src.books.free_host_pages()) * src.books.store().page_bytes();
    return n;
  }

  // ------------------------------------------------------------------ shared prefixes (docs/prefixes.md)
  // The host hierarchy's semantics and errors; the books (holder counts, registry) are shared code.

  /// Retains the first `rows[s]` stored rows of a request's history on each source as prefix
  /// `prefix` (`host_hierarchy::retain_prefix`): host books only, nothing is enqueued. Rows written
  /// by batched writes are absorbed first (a stream sync when there are any). Returns the evicted prefixes.
  std::vector<prefix_id> retain_prefix(prefix_id prefix, request_id id, std::span<const std::int64_t> rows) {
    const auto guard = on_device();
    binding_.refuse("retain_prefix", "shared prefixes are");
    absorb(stream_);
    return prefixes_.retain_rows(prefix, id, registry_.slot(id), rows, books_of_source());
  }
  /// Retains a request's whole stored history on every source.
  std::vector<prefix_id> retain_prefix(prefix_id prefix, request_id id) {
    const auto guard = on_device();
    binding_.refuse("retain_prefix", "shared prefixes are");
    absorb(stream_);
    return prefixes_.retain_stored(prefix, id, registry_.slot(id), books_of_source());
  }

  /// Admits a request on retained prefix `prefix` (`host_hierarchy::admit(id, prefix)`): the
  /// prefix's complete pages are shared (their page-table entries uploaded), and one kernel per
  /// source copies a partial last page into the request's own host page, fills its tail ring from
  /// the host store and publishes its frontier, all on `stream`. The prefix's rows must have been
  /// written before `stream` reaches this call (same stream, or ordered by an event). Waits (not
  /// admitted, nothing changed) when no slot or no host page for a boundary copy is free. Throws
  /// duplicate_admission, unknown_prefix.
  admission admit(request_id id, prefix_id prefix, cudaStream_t stream) {
    const auto guard = on_device(stream);
    binding_.refuse("admit on a prefix", "shared prefixes are");
    absorb(stream);
    if (registry_.contains(id)) throw duplicate_admission("request " + std::to_string(id) + " is already admitted");
    const auto& e = prefixes_.find(prefix);
    if (registry_.size() >= registry_.capacity()) return {};
    for (std::size_t s = 0; s < sources; ++s)
      if (src_[s].books.pages_to_share(e.rows[s]) > src_[s].books.free_host_pages()) return {};
    const admission a = admit(id, stream);
    const std::size_t slot = a.slot;
    for (std::size_t s = 0; s < sources; ++s) {
      auto& src = src_[s];
      const page_id boundary = src.books.share_history(slot, e.pages[s], e.rows[s]);
      const std::size_t pages = e.pages[s].size();
      if (pages > 0)
        DHISPARSE_CUDA_TRY(cudaMemcpyAsync(src.view.host_page + slot * pages_per_request_,
                                           src.books.slot(slot).host_pages.data(), pages * sizeof(std::int32_t),
                                           cudaMemcpyHostToDevice, stream));
      DHISPARSE_CUDA_TRY(detail::launch_prefix_admit(src.view, static_cast<unsigned>(slot),
                                                     boundary == no_page ? -1 : e.pages[s].back(), boundary,
                                                     e.rows[s], sm_count_ * 8, stream));
    }
    books_changed(stream);
    prefixes_.touch(prefix);
    return a;
  }
  /// As above, on the hierarchy's stream.
  admission admit(request_id id, prefix_id prefix) { return admit(id, prefix, stream_); }

  /// Drops a retained prefix (`host_hierarchy::release_prefix`); throws unknown_prefix.
  void release_prefix(prefix_id prefix) { prefixes_.release(prefix, books_of_source()); }
  /// True while `prefix` is retained.
  [[nodiscard]] bool contains_prefix(prefix_id prefix) const { return prefixes_.contains(prefix); }
  /// Rows prefix `prefix` retains on a source; throws unknown_prefix.
  [[nodiscard]] std::int64_t prefix_rows(prefix_id prefix, std::size_t source) const {
    check_source(source);
    return prefixes_.find(prefix).rows[source];
  }
  /// Host-store pages holding a prefix's rows on a source; throws unknown_prefix.
  [[nodiscard]] std::span<const page_id> prefix_host_pages(prefix_id prefix, std::size_t source) const {
    check_source(source);
    return prefixes_.find(prefix).pages[source];
  }
  /// Retained prefixes, least recently used first.
  [[nodiscard]] std::vector<prefix_id> retained_prefixes() const { return prefixes_.lru(); }
  /// Distinct host pages retained prefixes hold on a source.
  [[nodiscard]] std::size_t prefix_pages_held(std::size_t source) const {
    check_source(source);
    return prefixes_.held_pages(source);
  }
  /// Host-store page of each history page of a request/source (host books).
  [[nodiscard]] std::span<const page_id> host_pages_of(request_id id, std::size_t source) const {
    check_source(source);
    return src_[source].books.slot(registry_.slot(id)).host_pages;
  }
  /// Holders (requests and retained prefixes) of host page `page` of a source.
  [[nodiscard]] std::uint32_t host_page_refs(std::size_t source, page_id page) const {
    check_host_page(source, page);
    return src_[source].books.page_refs(page);
  }
  /// Retained prefixes holding host page `page` of a source.
  [[nodiscard]] std::uint32_t host_page_prefix_refs(std::size_t source, page_id page) const {
    check_host_page(source, page);
    return prefixes_.page_holders(source, page);
  }
  /// Optional pool page serving host page `page` of a source, -1 when none.
  [[nodiscard]] std::int32_t optional_page_of_host(std::size_t source, page_id page) const {
    check_host_page(source, page);
    return src_[source].books.optional_of_host(page);
  }
  /// Requests mapping optional pool page `page` of a source.
  [[nodiscard]] std::uint32_t optional_page_refs(std::size_t source, std::int32_t page) const {
    check_source(source);
    if (page < 0 || static_cast<std::size_t>(page) >= cfg_.optional_pages)
      throw position_out_of_range("optional page " + std::to_string(page) + " outside the pool's " +
                                  std::to_string(cfg_.optional_pages));
    return src_[source].books.optional_refs(page);
  }

  // ------------------------------------------------------------------ speculative verification
  // (hierarchy_config::max_block = K_max > 1; semantics of host_hierarchy, docs/speculative.md)

  /// Stages the target's KV of a speculative block: positions n .. n+count-1 (anchor and count-1
  /// proposals, n = `positions()`) from device-accessible memory laid out
  /// [payload layer][block_rows(id, source, count)][row_bytes] (for m = 1: one row per position;
  /// packed sources: the boundary row first), into the tail ring only (not the host store; the
  /// frontier stays). Replaces a previous block.
  void stage_block(request_id id, std::size_t source, const std::byte* rows, std::size_t count, cudaStream_t stream) {
    const auto guard = on_device(stream);
    const auto lock = binding_.lock();  // absorbing records host copies in the shared books
    absorb(stream);
    const std::size_t slot = check_stage(id, source, count);
    check_device_accessible(rows, "stage_block");
    stage_checked(source, slot, rows, count, stream);
  }
  /// Stages a block from any host memory (the host API's signature), through a stream-ordered
  /// device allocation.
  void stage_block(request_id id, std::size_t source, std::span<const std::byte> rows, std::size_t count,
                   cudaStream_t stream) {
    const auto guard = on_device(stream);
    const auto lock = binding_.lock();  // absorbing records host copies in the shared books
    absorb(stream);
    const std::size_t slot = check_stage(id, source, count);
    const auto& d = Layout::sources[source];
    const std::size_t nrows = rows_of_block(source, slot, count);
    if (rows.size() != nrows * d.payload_layers * d.row_bytes)
      throw size_mismatch("stage_block of request " + std::to_string(id) + " on source " + std::to_string(source) +
                          " got " + std::to_string(rows.size()) + " bytes for " + std::to_string(count) +
                          " positions in " + std::to_string(nrows) + " rows, expected " +
                          std::to_string(nrows * d.payload_layers * d.row_bytes));
    detail::with_device_copy(rows, stream, [&](const std::byte* copy) { stage_checked(source, slot, copy, count, stream); });
  }
  /// As above, on the hierarchy's stream.
  void stage_block(request_id id, std::size_t source, std::span<const std::byte> rows, std::size_t count) {
    stage_block(id, source, rows, count, stream_);
  }

  /// Stages the draft block of every entry of `batch` on one source, with slots, counts and row
  /// buffers read on the device (stage_view, kv_write.cuh): ONE launch (one CTA of 1-8 warps per
  /// entry) checks each entry as the per-request `stage_block` checks it (unknown_request,
  /// duplicate_in_batch, a block of 0 positions: size_mismatch, wider than the view's max_block:
  /// block_too_wide, positions past max_rows: capacity_exceeded; recorded for `check_errors`,
  /// entry untouched, the others proceed) and writes each good block into the tail ring, setting
  /// the device round books that `verify(source, verify_batch_view, stream)` and
  /// `commit(source, commit_view, stream)` check. Reads only device memory, allocates nothing,
  /// fixed launch shape: capturable, so stage, verify and commit of a round fit in one graph.
  ///
  /// The device leads the host books from here on (as after a batched commit): `staged_rows`,
  /// `verified_queries` and eager commits read the device round books; `sync_books` (which every
  /// eager call that depends on the books runs first) absorbs the staged counts. Staging touches
  /// neither the frontier nor the host store nor the staging arenas, so it needs no reservation,
  /// no backup join and no `release_staging`; a verify still needs the arenas free as usual.
  void stage_blocks(std::size_t source, const stage_view& batch, cudaStream_t stream) {
    const auto guard = on_device(stream);
    check_speculative(source);
    if (batch.capacity == 0) return;
    if (batch.slots == nullptr || batch.counts == nullptr || batch.layer_rows == nullptr)
      throw size_mismatch("stage_view needs device slots, counts and layer_rows");
    check_view_capacity(batch.capacity, "stage_view");
    const std::uint32_t km = checked_stage_block(batch.max_block, "stage_view");
    const std::size_t rb = Layout::sources[source].row_bytes;
    if (batch.row_stride != 0 && (batch.row_stride < rb || batch.row_stride % 16 != 0))
      throw size_mismatch("stage_view row_stride " + std::to_string(batch.row_stride) +
                          " must be 0 or a multiple of 16 of at least the row's " + std::to_string(rb) + " bytes");
    const detail::stage_args a{batch.slots, batch.counts, batch.first, batch.layer_rows, batch.row_stride,
                               km,          batch.capacity, false};
    DHISPARSE_CUDA_TRY(detail::launch_step_stage(step_table_, static_cast<unsigned>(source), 1u, a,
                                                 detail::write_warps(km, vectors_of(source)), stream));
    mark_device_stages(src_[source]);
  }

  /// Stages the draft block of every request on EVERY source in ONE launch (one CTA per (source,
  /// entry)), from the step-wide row buffers of `stage_step_view` (kv_write.cuh): the per-source
  /// `stage_blocks` made per (source, entry), with the same checks, errors and books. Capturable.
  void stage_step(const stage_step_view& batch, cudaStream_t stream) {
    const auto guard = on_device(stream);
    check_speculative(0);
    if (batch.capacity == 0) return;
    if (batch.slots == nullptr || batch.counts == nullptr || batch.layer_rows == nullptr)
      throw size_mismatch("stage_step_view needs device slots, counts and layer_rows");
    check_view_capacity(batch.capacity, "stage_step_view");
    const std::uint32_t km = checked_stage_block(batch.max_block, "stage_step_view");
    const std::size_t widest = widest_row_bytes<Layout>();
    if (batch.row_stride != 0 && (batch.row_stride < widest || batch.row_stride % 16 != 0))
      throw size_mismatch("stage_step_view row_stride " + std::to_string(batch.row_stride) +
                          " must be 0 or a multiple of 16 of at least the widest row's " + std::to_string(widest) +
                          " bytes");
    unsigned warps = 1;
    for (std::size_t s = 0; s < sources; ++s) warps = std::max(warps, detail::write_warps(km, vectors_of(s)));
    const detail::stage_args a{batch.slots, batch.counts, batch.first, batch.layer_rows, batch.row_stride,
                               km,          batch.capacity, true};
    DHISPARSE_CUDA_TRY(detail::launch_step_stage(step_table_, 0u, static_cast<unsigned>(sources), a, warps, stream));
    for (auto& src : src_) mark_device_stages(src);
  }

  /// Verifies one speculative round of a batch of requests on one source: two launches on
  /// `stream` (metadata, then host copies), no host synchronisation, no allocation. Validates on
  /// the host what it can (requests, duplicates, K_r against max_block and the staged block,
  /// lengths, pending follower copies) and throws with nothing queued; bad selection entries
  /// (out of range, not visible to their query) leave that entry untouched and are thrown by
  /// `check_errors`, which also marks that request's round unverified. Uploads its descriptor
  /// from pinned staging, so it cannot be captured in a CUDA graph: capture the
  /// `verify_batch_view` overload instead.
  void verify(std::size_t source, std::span<const verify_batch_item> batch, cudaStream_t stream,
              copy_layers mode = copy_layers::all) {
    const auto guard = on_device(stream);
    check_speculative(source);
    check_not_capturing(stream, "verify", "verify(source, verify_batch_view, stream)");
    const auto lock = binding_.lock();  // absorbing records host copies in the shared books
    absorb(stream);
    auto& src = src_[source];
    check_followers_copied(source, "verified");
    staging_.check_verify(source);
    if (++stamp_epoch_ == 0) {
      std::fill(stamp_.begin(), stamp_.end(), 0u);
      stamp_epoch_ = 1;
    }
    std::vector<std::size_t>& slots = verify_slots_;  // sized max_requests at construction: no allocation here
    for (std::size_t e = 0; e < batch.size(); ++e) {
      const auto& item = batch[e];
      const std::size_t slot = registry_.slot(item.request);
      if (stamp_[slot] == stamp_epoch_)
        throw duplicate_in_batch("request " + std::to_string(item.request) + " appears twice in one verify batch");
      stamp_[slot] = stamp_epoch_;
      validate_round(source, slot, item);
      slots[e] = slot;  // e < max_requests: the slots are distinct
    }
    const auto n = static_cast<std::uint32_t>(batch.size());  // <= max_requests: slots are distinct
    const std::size_t km = cfg_.max_block;
    const verify_eager_layout lay = verify_eager_offsets(n, km);
    unsigned ring_slot = 0;
    std::byte* staged = verify_ring_.acquire(ring_slot);
    std::memcpy(staged + lay.count, &n, sizeof(n));
    for (std::uint32_t e = 0; e < n; ++e) {
      const auto slot = static_cast<std::int32_t>(slots[e]);
      const auto kr = static_cast<std::int32_t>(batch[e].queries.size());
      std::memcpy(staged + lay.slots + e * sizeof(std::int32_t), &slot, sizeof(slot));
      std::memcpy(staged + lay.queries + e * sizeof(std::int32_t), &kr, sizeof(kr));
      for (std::size_t j = 0; j < batch[e].queries.size(); ++j) {
        const verify_query& q = batch[e].queries[j];
        const std::size_t at = e * km + j;
        std::memcpy(staged + lay.lengths + at * sizeof(std::int32_t), &q.length, sizeof(std::int32_t));
        std::memcpy(staged + lay.sel + at * sizeof(void*), &q.selection, sizeof(void*));
        std::memcpy(staged + lay.loc + at * sizeof(void*), &q.locations, sizeof(void*));
      }
    }
    DHISPARSE_CUDA_TRY(cudaMemcpyAsync(src.v_eager, staged, lay.total, cudaMemcpyHostToDevice, stream));
    verify_ring_.release(ring_slot, stream);
    verify_batch_view v;
    v.count = reinterpret_cast<const std::uint32_t*>(src.v_eager + lay.count);
    v.slots = reinterpret_cast<const std::int32_t*>(src.v_eager + lay.slots);
    v.queries = reinterpret_cast<const std::int32_t*>(src.v_eager + lay.queries);
    v.lengths = reinterpret_cast<const std::int32_t*>(src.v_eager + lay.lengths);
    v.selection_ptrs = reinterpret_cast<const row_index* const*>(src.v_eager + lay.sel);
    v.location_ptrs = reinterpret_cast<location* const*>(src.v_eager + lay.loc);
    v.max_block = static_cast<std::uint32_t>(km);
    v.capacity = n;
    const std::uint32_t layers =
        mode == copy_layers::all ? static_cast<std::uint32_t>(Layout::sources[source].payload_layers) : 1u;
    wait_for_staging_release(stream);
    DHISPARSE_CUDA_TRY((detail::launch_verify<static_cast<int>(hot_rows), order_index>(
        src.view, src.vws, v, layers, static_cast<std::uint32_t>(top_k),
        static_cast<int>(std::min<std::size_t>(cfg_.max_requests, static_cast<std::size_t>(sm_count_))), sm_count_ * 4,
        stream, programmatic_launch_)));
    staging_.acquire(source);
    for (std::uint32_t e = 0; e < n; ++e) src.verified[slots[e]] = batch[e].queries.size();
    if (mode == copy_layers::producer_only && src.layer_pending.size() > 1) {
      for (std::size_t l = 1; l < src.layer_pending.size(); ++l) src.layer_pending[l] = true;
      src.follower_plan_from_verify = true;
    }
  }
  /// As above, on the hierarchy's stream.
  void verify(std::size_t source, std::span<const verify_batch_item> batch) { verify(source, batch, stream_); }

  /// Verify over a device descriptor: no host synchronisation, no allocation, a fixed launch shape,
  /// so it can be captured in a CUDA graph and replayed with other batch contents and counts.
  /// Everything per entry (slot, K_r against max_block and the staged block, lengths, duplicates,
  /// entries) is checked on the device and reported by `check_errors`. The K_r of each good round
  /// is kept in device books, which `commit` (and `verified_queries`) then read for this source
  /// (a 4-byte read that synchronises the commit's stream).
  void verify(std::size_t source, const verify_batch_view& batch, cudaStream_t stream,
              copy_layers mode = copy_layers::all) {
    const auto guard = on_device(stream);
    check_speculative(source);
    auto& src = src_[source];
    check_followers_copied(source, "verified");
    staging_.check_verify(source);
    if (batch.count == nullptr || batch.slots == nullptr || batch.queries == nullptr || batch.lengths == nullptr ||
        batch.selection_ptrs == nullptr || batch.location_ptrs == nullptr)
      throw size_mismatch("verify_batch_view needs device count, slots, queries, lengths and pointer arrays");
    if (batch.max_block == 0)
      throw size_mismatch("verify_batch_view needs max_block >= 1 (the stride of its per-query arrays)");
    if (batch.capacity > cfg_.max_requests)
      throw size_mismatch("verify_batch_view capacity " + std::to_string(batch.capacity) + " exceeds max_requests " +
                          std::to_string(cfg_.max_requests));
    const std::uint32_t layers =
        mode == copy_layers::all ? static_cast<std::uint32_t>(Layout::sources[source].payload_layers) : 1u;
    wait_for_staging_release(stream);
    DHISPARSE_CUDA_TRY((detail::launch_verify<static_cast<int>(hot_rows), order_index>(
        src.view, src.vws, batch, layers, static_cast<std::uint32_t>(top_k),
        static_cast<int>(std::min<std::size_t>(cfg_.max_requests, static_cast<std::size_t>(sm_count_))), sm_count_ * 4,
        stream, programmatic_launch_)));
    staging_.acquire(source);
    src.device_rounds = true;
    if (mode == copy_layers::producer_only && src.layer_pending.size() > 1) {
      for (std::size_t l = 1; l < src.layer_pending.size(); ++l) src.layer_pending[l] = true;
      src.follower_plan_from_verify = true;
    }
  }

  /// Eager verify, then `check_errors(stream)`; returns the batch's stats (synchronises `stream`
  /// and the hierarchy's stream, not the device).
  verify_stats verify_sync(std::size_t source, std::span<const verify_batch_item> batch, cudaStream_t stream,
                           copy_layers mode = copy_layers::all) {
    const auto guard = on_device(stream);
    verify(source, batch, stream, mode);
    check_errors(stream);
    verify_stats total;
    for (const auto& s : last_verify_stats(source)) total += s;
    return total;
  }

  /// Commits a verified round: the anchor and `accepted` proposals (positions n .. n+accepted)
  /// become committed, n' = n + accepted + 1; the rows they complete (m = 1: one per position) are
  /// backed up from the tail ring into the host store (host pages from the books, so
  /// capacity_exceeded / host_pool_exhausted apply) and the frontier moves to n' / m in stream
  /// order; a partially filled boundary row stays in the tail; the rest of the block is discarded.
  /// 0 <= accepted <= K_r - 1 of the last verify. Not capturable (host pages are allocated here).
  void commit(request_id id, std::size_t source, std::size_t accepted, cudaStream_t stream) {
    const auto guard = on_device(stream);
    check_speculative(source);
    const auto lock = binding_.lock();
    absorb(stream);
    const std::size_t slot = registry_.slot(id);
    auto& src = src_[source];
    if (src.device_rounds) src.verified[slot] = read_device_verified(source, slot, stream);
    if (src.staged[slot] == 0 || src.verified[slot] == 0)
      throw commit_without_verify("commit of request " + std::to_string(id) + " on source " + std::to_string(source) +
                                  " without a verify since its last stage_block");
    if (accepted >= src.verified[slot])
      throw acceptance_beyond_block("commit of request " + std::to_string(id) + " on source " +
                                    std::to_string(source) + " accepts " + std::to_string(accepted) +
                                    " proposals, the verified round had " + std::to_string(src.verified[slot] - 1));
    const auto m = static_cast<std::int64_t>(Layout::sources[source].positions_per_row);
    const std::int64_t n_next = committed_positions(source, slot) + static_cast<std::int64_t>(accepted) + 1;
    const auto completed = static_cast<std::size_t>(n_next / m - src.books.slot(slot).frontier);
    src.books.check_append(id, source, slot, completed);
    const auto a = src.books.commit_append(slot, completed);
    try {
      if (a.last_page > a.first_page)
        DHISPARSE_CUDA_TRY(cudaMemcpyAsync(src.view.host_page + slot * pages_per_request_ + a.first_page,
                                           src.books.slot(slot).host_pages.data() + a.first_page,
                                           (a.last_page - a.first_page) * sizeof(std::int32_t),
                                           cudaMemcpyHostToDevice, stream));
      DHISPARSE_CUDA_TRY(detail::launch_verify_commit(src.view, static_cast<unsigned>(slot), a.first_row, a.last_row,
                                                      sm_count_ * 8, stream));
    } catch (...) {
      src.books.undo_append(slot, a);  // the books follow the device: nothing was committed
      throw;
    }
    src.books.wrote_host_copies(slot, a.first_row, a.last_row);  // shared store: enqueued in stream order
    src.partial[slot] = static_cast<std::size_t>(n_next % m);
    close_round(source, slot, stream);
    books_changed(stream);
  }
  /// As above, on the hierarchy's stream.
  void commit(request_id id, std::size_t source, std::size_t accepted) { commit(id, source, accepted, stream_); }

  /// Commits one speculative round of every entry of `batch` on one source, with the accepted
  /// counts read on the device (the engine's sampler writes them: no host round trip): ONE launch
  /// (the step-wide kernel over this source, inline host copy) checks each entry's round (commit_without_verify, acceptance_beyond_block,
  /// completed rows within the reservation: capacity_exceeded; recorded for `check_errors`, entry
  /// untouched), backs the completed rows up from the tail ring to the host store, and publishes
  /// the frontier and partial boundary row. The semantics of the per-request `commit`;
  /// capturable. Rows must lie within the reservation (`reserve_rows`).
  void commit(std::size_t source, const commit_view& batch, cudaStream_t stream) {
    const auto guard = on_device(stream);
    check_speculative(source);
    if (batch.capacity == 0) return;
    if (batch.slots == nullptr || batch.accepted == nullptr)
      throw size_mismatch("commit_view needs device slots and accepted counts");
    check_view_capacity(batch.capacity, "commit_view");
    join_backup_impl(stream);
    DHISPARSE_CUDA_TRY(detail::launch_step_commit(step_table_, static_cast<unsigned>(source), 1u, batch, true,
                                                  detail::write_warps(cfg_.max_block, vectors_of(source)), stream));
    src_[source].device_writes = true;
    device_writes_ = true;
  }

  /// Commits one speculative round of every request on EVERY source in ONE launch, with the
  /// accepted counts read on the device: the per-source `commit(source, commit_view, stream)` made
  /// per (source, entry), with the same checks and errors. Rows the commit completes are in the
  /// tail ring already; their host copy is made on `backup` as for `append_step` (rows outside the
  /// window by the critical launch), joined by `join_backup`; `backup == stream`: inline.
  /// Capturable; the same capture rules as `append_step`.
  void commit_step(const commit_step_view& batch, cudaStream_t backup, cudaStream_t stream) {
    const auto guard = on_device(stream);
    check_stream(backup);
    check_speculative(0);
    if (batch.capacity == 0) return;
    if (batch.slots == nullptr || batch.accepted == nullptr)
      throw size_mismatch("commit_step_view needs device slots and accepted counts");
    check_view_capacity(batch.capacity, "commit_step_view");
    join_backup_impl(stream);
    const bool inline_host = backup == stream;
    unsigned warps = 1;
    for (std::size_t s = 0; s < sources; ++s) warps = std::max(warps, detail::write_warps(cfg_.max_block, vectors_of(s)));
    DHISPARSE_CUDA_TRY(detail::launch_step_commit(step_table_, 0u, static_cast<unsigned>(sources), batch, inline_host,
                                                  warps, stream));
    for (auto& src : src_) src.device_writes = true;
    device_writes_ = true;
    if (!inline_host) fork_backup(batch.capacity, warps, backup, stream);
  }

  /// Stored rows a block of `count` positions covers on a request/source: what `stage_block`
  /// expects (m = 1: `count`).
  [[nodiscard]] std::size_t block_rows(request_id id, std::size_t source, std::size_t count) const {
    check_source(source);
    const std::size_t slot = registry_.slot(id);
    if (speculative() && src_[source].device_writes) {  // the device leads (see `frontier`)
      const auto b = static_cast<std::size_t>(device_partial(source, slot));
      return count == 0 ? 0 : (b + count - 1) / Layout::sources[source].positions_per_row + 1;
    }
    return rows_of_block(source, slot, count);
  }

  /// Positions of the request/source's staged block (0: none), and K_r of its last verify (0: none since staging).
  [[nodiscard]] std::size_t staged_rows(request_id id, std::size_t source) const {
    check_source(source);
    if (!speculative()) return 0;
    if (src_[source].device_writes)  // a batched commit may have closed the round on the device
      return static_cast<std::size_t>(read_slot_array(src_[source].vws.staged, registry_.slot(id), 1).front());
    return src_[source].staged[registry_.slot(id)];
  }
  /// K_r of the last verify since staging (0: none); after a `verify_batch_view` verify, read from the
  /// device (then it synchronises the hierarchy's stream; otherwise host books, no CUDA call).
  [[nodiscard]] std::size_t verified_queries(request_id id, std::size_t source) const {
    const auto guard = on_device();
    check_source(source);
    if (!speculative()) return 0;
    const std::size_t slot = registry_.slot(id);
    if (src_[source].device_rounds) return read_device_verified(source, slot, stream_);
    return src_[source].verified[slot];
  }

  /// Per-entry stats of the last verify of a source (synchronises the hierarchy's stream).
  [[nodiscard]] std::vector<verify_stats> last_verify_stats(std::size_t source) const {
    const auto guard = on_device();
    check_speculative(source);
    const auto& src = src_[source];
    const control_block cb = read_verify_control(source);
    const auto raw = read_on(stream_, src.vws.stats, std::min<std::size_t>(cb.last_count, cfg_.max_requests));
    std::vector<verify_stats> out;
    out.reserve(raw.size());
    for (const auto& r : raw) out.push_back(to_verify_stats(source, r));
    return out;
  }
  /// Host copies made by the last verify of a source, in batch order then ascending row (the host
  /// backend's `last_plan` after a verify; synchronises the hierarchy's stream).
  [[nodiscard]] std::vector<planned_copy> last_verify_plan(std::size_t source) const {
    const auto guard = on_device();
    check_speculative(source);
    const auto& src = src_[source];
    const control_block cb = read_verify_control(source);
    const std::size_t n = std::min<std::size_t>(cb.last_count, cfg_.max_requests);
    std::vector<verify_entry_stats> stats(n);
    std::vector<entry_error> errs(n);
    std::vector<plan_entry> plan(n * src.vws.plan_stride);
    enqueue_read(stream_, stats.data(), src.vws.stats, n);
    enqueue_read(stream_, errs.data(), src.vws.errors, n);
    enqueue_read(stream_, plan.data(), src.vws.plan, plan.size());
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream_));
    std::vector<planned_copy> out;
    for (std::size_t t = 0; t < n; ++t)
      for (std::size_t m = 0; m < stats[t].rows_copied; ++m) {
        const plan_entry& p = plan[t * src.vws.plan_stride + m];
        out.push_back({static_cast<std::size_t>(errs[t].slot), p.row, p.dst});
      }
    return out;
  }
  /// The device workspace of a source's verification kernels.
  [[nodiscard]] const verify_workspace_view& verify_workspace(std::size_t source) const {
    check_speculative(source);
    return src_[source].vws;
  }

  // ------------------------------------------------------------------ views and inspection

  /// Device base of a payload layer's pool: row `loc` is at `pool(s, l) + loc * row_bytes` for every
  /// location the hierarchy returns for the source, staging locations included (with shared arenas
  /// they lie past the pool, in the arena that shares the layer's block). What a stock attention
  /// kernel takes as its per-layer base.
  [[nodiscard]] std::byte* pool(std::size_t source, std::size_t layer) const {
    check_layer(source, layer);
    return src_[source].layer_ptrs[layer];
  }
  /// The device view of a source (for custom kernels).
  [[nodiscard]] const view_type& view(std::size_t source) const {
    check_source(source);
    return src_[source].view;
  }
  /// The device workspace of a source's resolver.
  [[nodiscard]] const workspace_view& workspace(std::size_t source) const {
    check_source(source);
    return src_[source].ws;
  }

  /// Bytes at `loc` of a payload layer (synchronises the hierarchy's stream; for tests and debugging).
  [[nodiscard]] std::vector<std::byte> payload_row(std::size_t source, std::size_t layer, location loc) const {
    const auto guard = on_device();
    check_layer(source, layer);
    const std::size_t rb = Layout::sources[source].row_bytes;
    const location_space& sp = src_[source].view.space;
    if (!sp.valid(loc)) throw position_out_of_range("location " + std::to_string(loc) + " outside the pool");
    const auto at = static_cast<std::size_t>(loc);
    if (at >= sp.staging_begin()) staging_.check_read(source);
    return read_on(stream_, pool(source, layer) + at * rb, rb);
  }
  /// Copies a whole payload layer's pool (pool_rows() * row_bytes bytes; synchronises the
  /// hierarchy's stream).
  void copy_pool(std::size_t source, std::size_t layer, std::span<std::byte> out) const {
    const auto guard = on_device();
    check_layer(source, layer);
    const std::size_t bytes = pool_rows() * Layout::sources[source].row_bytes;
    if (out.size() != bytes) throw size_mismatch("copy_pool needs " + std::to_string(bytes) + " bytes");
    enqueue_read(stream_, out.data(), pool(source, layer), bytes);
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream_));
  }
  /// Copies a payload layer's staging rows, the locations from space(source).staging_begin() on
  /// (slots * staging_rows rows; synchronises the hierarchy's stream). With shared arenas only
  /// while `source` holds them.
  void copy_staging(std::size_t source, std::size_t layer, std::span<std::byte> out) const {
    const auto guard = on_device();
    check_layer(source, layer);
    staging_.check_read(source);
    const std::size_t bytes = space_.slots * space_.staging_rows * Layout::sources[source].row_bytes;
    if (out.size() != bytes) throw size_mismatch("copy_staging needs " + std::to_string(bytes) + " bytes");
    enqueue_read(stream_, out.data(), src_[source].staging_ptrs[layer], bytes);
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream_));
  }
  /// The host copy of a row in the pinned store, looked up in the host books. Its bytes are valid
  /// once the appending stream has synchronised; its address also tells which host page holds the
  /// row. It may synchronise: it first waits for an outstanding step-wide backup (`append_step` /
  /// `commit_step` with a backup stream), and after batched writes it reads the device frontier
  /// back (the row must lie below it). Not for use while the hierarchy's stream is captured.
  /// On a shared host store, throws host_copy_pending while the row's owner rank has not recorded
  /// it (docs/multi-gpu.md: batched writes count once the owner absorbed them).
  [[nodiscard]] std::span<const std::byte> host_row(request_id id, std::size_t source, std::size_t layer,
                                                    row_index row) const {
    const auto guard = on_device();
    check_layer(source, layer);
    const std::size_t slot = registry_.slot(id);
    const auto& books = src_[source].books;
    const auto lock = binding_.lock();
    wait_backup_host();  // the row's bytes may still be on their way from the tail ring
    if (!src_[source].device_writes) {
      const auto bytes = books.host_row(slot, layer, row);  // position_beyond_frontier first
      binding_.check_host_row("host_row", id, source, row, page_rows);
      return bytes;
    }
    const std::int64_t f = device_frontier(id, source);  // the device leads; host pages are the books'
    if (row < 0 || row >= f)
      throw position_beyond_frontier("row " + std::to_string(row) + " does not exist (" + std::to_string(f) +
                                     " rows stored)");
    binding_.check_host_row("host_row", id, source, row, page_rows);
    return books.store().row(books.host_page_of(slot, row), layer, row);
  }
  /// Hot-cache contents of a request/source read back from the device (-1: empty way; synchronises
  /// the hierarchy's stream).
  [[nodiscard]] std::vector<row_index> hot_rows_of(request_id id, std::size_t source) const {
    return read_slot_array(src_.at(source).view.hot_row, registry_.slot(id), hot_rows);
  }
  /// LRU order of a request/source read back from the device, least recently used first
  /// (synchronises the hierarchy's stream).
  [[nodiscard]] std::vector<order_index> lru_order_of(request_id id, std::size_t source) const {
    return read_slot_array(src_.at(source).view.order, registry_.slot(id), hot_rows);
  }
  /// Optional-history map of a request/source read back from the device (-1: not ready;
  /// synchronises the hierarchy's stream).
  [[nodiscard]] std::vector<std::int32_t> optional_map_of(request_id id, std::size_t source) const {
    return read_slot_array(src_.at(source).view.optional_page, registry_.slot(id), pages_per_request_);
  }
  /// Frontier of a request/source read back from the device (synchronises the hierarchy's stream).
  [[nodiscard]] std::int64_t device_frontier(request_id id, std::size_t source) const {
    return read_slot_array(src_.at(source).view.frontier, registry_.slot(id), 1).front();
  }

 private:
  static constexpr unsigned staging_depth = 16;
  static constexpr std::size_t max_request_slots = 8192;

  struct source_state {
    device_buffer<std::byte> device;
    pinned_buffer pinned;
    dhisparse::detail::history_books books;  // frontier, host pages and optional pages of every slot
    view_type view{};
    workspace_view ws{};
    std::byte* eager = nullptr;            // device batch descriptor of eager resolves
    std::vector<std::byte*> layer_ptrs;    // host copy of the per-layer pool bases
    std::vector<std::byte*> staging_ptrs;  // per layer: its first staging row (layer base + staging_begin rows)
    std::vector<bool> layer_pending;
    // speculative verification (max_block > 1)
    verify_workspace_view vws{};
    std::byte* v_eager = nullptr;          // device descriptor of eager verifies
    std::vector<std::size_t> staged;       // per slot: positions of the staged block, 0 if none
    std::vector<std::size_t> partial;      // per slot: committed positions of the boundary row (< m)
    std::vector<std::size_t> verified;     // per slot: K_r of the last verify since staging, 0 if none
    bool follower_plan_from_verify = false;  // pending follower copies replay the verify plan
    bool device_rounds = false;  // a verify over a device descriptor ran: the device books hold K_r
    // batched writes and commits over device descriptors (kv_write.cuh)
    detail::write_workspace_view wws{};    // batched appends
    detail::write_workspace_view cws{};    // batched commits
    detail::write_workspace_view sws{};    // batched stages (speculative only)
    detail::backup_item* work = nullptr;      // backup work list of the last write or commit (write_state_)
    bool device_writes = false;            // a batched append or commit was enqueued: the device leads
    bool device_stages = false;            // a batched stage was enqueued: the device round books lead
  };
  struct offsets {
    std::size_t pool = 0, layer_stride = 0, layer_ptrs = 0, hot_row = 0, order = 0, frontier = 0, optional_page = 0,
                host_page = 0, way_of_row = 0, control = 0, ready = 0, claim = 0, plan = 0, early_plan = 0, errors = 0, sticky = 0, stats = 0, eager = 0,
                total = 0;
    std::size_t v_control = 0, v_plan = 0, v_stats = 0, v_errors = 0, v_sticky = 0, v_seen = 0, v_rank = 0, v_eager = 0,
                v_staged = 0, v_verified = 0, v_partial = 0;
  };
  struct eager_layout {
    std::size_t count = 0, slots = 0, lengths = 0, sel = 0, loc = 0, total = 0;
  };
  /// A caller-owned host store (empty span: the hierarchy allocates the store itself).
  struct adopted_store {
    std::span<std::byte> host;  // the store's pages, host address
    std::byte* device = nullptr;  // the same bytes' device address
  };
  using adopted_stores = std::array<adopted_store, sources>;

  /// Validates caller host stores for `c` (normalised); throws before anything is allocated.
  static adopted_stores checked_host_stores(const hierarchy_config& c, std::span<const std::span<std::byte>> stores,
                                            const char* what) {
    if (stores.size() != sources)
      throw size_mismatch(std::string(what) + "s: " + std::to_string(stores.size()) + " spans given, the layout has " +
                          std::to_string(sources) + " sources (one span per source)");
    adopted_stores out{};
    for (std::size_t s = 0; s < sources; ++s) {
      const auto& d = Layout::sources[s];
      const std::size_t need = host_store::bytes_required(page_rows, d.payload_layers, d.row_bytes, c.host_pages);
      const std::span<std::byte> span = stores[s];
      const std::string who = std::string(what) + " of source " + std::to_string(s);
      if (span.size() < need || span.data() == nullptr)
        throw size_mismatch(who + " holds " + std::to_string(span.size()) + " bytes, needs " + std::to_string(need) +
                            " (host_store_bytes: " + std::to_string(c.host_pages) + " pages)");
      if (reinterpret_cast<std::uintptr_t>(span.data()) % host_store_alignment != 0)
        throw invalid_configuration(who + " is not " + std::to_string(host_store_alignment) + "-byte aligned");
      std::byte* const first = mapped_address(span.data());
      std::byte* const last = mapped_address(span.data() + need - 1);
      if (first == nullptr || last != first + (need - 1))
        throw invalid_configuration(who + " is not device-accessible: it must be page-locked and mapped for this device "
                                    "over its whole length (cudaHostAlloc with cudaHostAllocMapped, or cudaHostRegister "
                                    "with cudaHostRegisterMapped; add the Portable flag when several devices read it, "
                                    "as cuda::pinned_shared_host_store does)");
      out[s] = {span.first(need), first};
    }
    return out;
  }
  /// The bytes of every source of a shared host store, for `checked_host_stores`.
  static std::array<std::span<std::byte>, sources> store_spans(shared_host_store<Layout>& store) {
    std::array<std::span<std::byte>, sources> out;
    for (std::size_t s = 0; s < sources; ++s) out[s] = store.books().store(s).storage();
    return out;
  }
  /// Device address of pinned, mapped host byte `p` on the current device; null when `p` is not.
  static std::byte* mapped_address(std::byte* p) {
    cudaPointerAttributes attr{};
    if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
      (void)cudaGetLastError();  // older runtimes report unregistered memory as an error: not sticky
      return nullptr;
    }
    if (attr.type != cudaMemoryTypeHost || attr.devicePointer == nullptr) return nullptr;
    return static_cast<std::byte*>(attr.devicePointer);
  }

  /// The constructors' common part: allocates everything but the adopted host stores; `shared`
  /// (with `rank`) makes the hierarchy a rank of a shared host store, whose bytes `adopted` holds.
  hierarchy(const hierarchy_config& cfg, cudaStream_t stream, const adopted_stores& adopted,
            dhisparse::detail::shared_store_books* shared = nullptr, std::size_t rank = 0)
      : cfg_(normalised(cfg)), stream_(stream), registry_(cfg_.max_requests), id_of_slot_(cfg_.max_requests) {
    if (shared) binding_ = dhisparse::detail::shared_rank(shared, rank, cfg_.max_requests);  // claim the rank first; given back on a throw
    space_ = make_space(cfg_);
    if (!space_.addressable())
      throw invalid_configuration("GPU pool of " + std::to_string(space_.rows()) + " rows exceeds int32 locations");
    pages_per_request_ = pages_for(static_cast<std::int64_t>(cfg_.max_rows));

    // Bound to the constructing thread's current device: everything below is created there.
    device_ = detail::current_device();
    detail::check_stream_device(stream_, device_);  // before anything is allocated
    int can_map = 0, unified = 0;
    DHISPARSE_CUDA_TRY(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, device_));
    DHISPARSE_CUDA_TRY(cudaDeviceGetAttribute(&can_map, cudaDevAttrCanMapHostMemory, device_));
    DHISPARSE_CUDA_TRY(cudaDeviceGetAttribute(&unified, cudaDevAttrUnifiedAddressing, device_));
    DHISPARSE_CUDA_TRY(cudaDeviceGetAttribute(&pageable_access_, cudaDevAttrPageableMemoryAccess, device_));
    if (!can_map || !unified)
      throw invalid_configuration("the CUDA backend needs a device that maps pinned host memory with unified addressing");
    const cudaError_t prep = detail::prepare_fused_resolve<resolve_traits, order_index>(grid_, cfg_.max_requests,
                                                                                        widest_row_bytes<Layout>());
    if (prep == cudaErrorInvalidConfiguration)
      throw invalid_configuration("the fused resolver needs " +
                                  std::to_string(resolver_shared_bytes()) +
                                  " bytes of shared memory per CTA, more than this device offers");
    DHISPARSE_CUDA_TRY(prep);
    DHISPARSE_CUDA_TRY(detail::preload_hierarchy_kernels<order_index>());
    {
      cudaFuncAttributes attributes{};  // loaded now, not at the first admission on a prefix (lazy loading may sync)
      DHISPARSE_CUDA_TRY(cudaFuncGetAttributes(&attributes, detail::prefix_admit_kernel<order_index>));
    }
    DHISPARSE_CUDA_TRY(detail::preload_write_kernels<order_index>());
    DHISPARSE_CUDA_TRY((detail::preload_readback_kernels<entry_stats, verify_entry_stats>()));

    live_buffer_ = device_buffer<std::uint32_t>(cfg_.max_requests);
    DHISPARSE_CUDA_TRY(cudaMemsetAsync(live_buffer_.data(), 0, live_buffer_.bytes(), stream_));
    ring_ = detail::staging_ring(eager_bytes(cfg_.max_requests), staging_depth);
    if (speculative()) {
      DHISPARSE_CUDA_TRY((detail::prepare_verify<static_cast<int>(hot_rows), order_index>()));
      verify_ring_ = detail::staging_ring(verify_eager_bytes(cfg_), staging_depth);
      verify_slots_.assign(cfg_.max_requests, 0);
    }
    stamp_.assign(cfg_.max_requests, 0);
    if constexpr (Staging::shared) {
      // one block per payload-layer index: its pools of every source, then its arena (staging_blocks.hpp)
      blocks_plan_ = blocks_for(cfg_);
      for (std::size_t s = 0; s < sources; ++s) {
        location_space sp = space_;
        sp.staging_gap = blocks_plan_.staging_gap[s];
        if (!sp.addressable())
          throw invalid_configuration("staging locations of source " + std::to_string(s) + " reach " +
                                      std::to_string(sp.rows()) +
                                      ", past int32 (staging_arenas<chi> places them past the pools of every source)");
      }
      blocks_ = device_buffer<std::byte>(blocks_plan_.total_bytes);
      DHISPARSE_CUDA_TRY(cudaMemsetAsync(blocks_.data(), 0, blocks_plan_.total_bytes, stream_));
      if (speculative()) arena_free_ = detail::unique_event(cudaEventDisableTiming);
    }

    write_state_ = device_buffer<std::byte>(write_state_bytes(cfg_.max_requests, speculative()));
    backup_written_ = detail::unique_event(cudaEventDisableTiming);
    backup_done_ = detail::unique_event(cudaEventDisableTiming);
    books_written_ = detail::unique_event(cudaEventDisableTiming);
    books_snapshot_ = pinned_buffer(books_snapshot_bytes(cfg_.max_requests));
    snapshot_view_.frontier = reinterpret_cast<std::int64_t*>(books_snapshot_.device_data());
    snapshot_view_.partial =
        reinterpret_cast<std::int32_t*>(books_snapshot_.device_data() + snapshot_partial_offset());
    for (std::size_t s = 0; s < sources; ++s) build_source(s, adopted[s]);
    build_step_table();
    prefixes_ = dhisparse::detail::prefix_registry<sources>(cfg_.host_pages, cfg_.prefix_pages);
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream_));
  }

  static hierarchy_config normalised(hierarchy_config c) {
    if (c.max_requests == 0) throw invalid_configuration("max_requests must be at least 1");
    if (c.max_rows == 0) throw invalid_configuration("max_rows must be at least 1");
    if (c.max_rows > static_cast<std::size_t>(INT32_MAX)) throw invalid_configuration("max_rows exceeds int32 rows");
    if (c.max_block == 0) throw invalid_configuration("max_block must be at least 1");
    if (c.max_block > c.max_rows) throw invalid_configuration("max_block exceeds max_rows");
    if (c.max_block > max_verify_block)
      throw invalid_configuration("the CUDA backend verifies blocks of at most " + std::to_string(max_verify_block) +
                                  " positions (max_block is " + std::to_string(c.max_block) + ")");
    if (c.max_requests > max_request_slots)
      throw invalid_configuration("the CUDA backend supports at most " + std::to_string(max_request_slots) +
                                  " request slots (the follower copy scans the batch in shared memory)");
    if (c.tail_rows == 0) c.tail_rows = page_rows;
    const std::size_t pages_per_request = (c.max_rows + page_rows - 1) / page_rows;
    if (c.host_pages == 0) c.host_pages = c.max_requests * pages_per_request;
    if (c.prefix_pages == 0 || c.prefix_pages > c.host_pages) c.prefix_pages = c.host_pages;
    return c;
  }
  static offsets source_offsets(const hierarchy_config& c, std::size_t s) {
    const auto& d = Layout::sources[s];
    const location_space sp = make_space(c);
    const std::size_t ppr = (c.max_rows + page_rows - 1) / page_rows;
    const std::size_t cap = c.max_requests;
    detail::carver k;
    offsets o;
    // shared arenas: the pools live in the blocks (blocks_for), not in the source's own allocation
    const std::size_t rows = Staging::shared ? 0 : sp.rows();
    o.layer_stride = (rows * d.row_bytes + detail::carver::alignment - 1) / detail::carver::alignment *
                     detail::carver::alignment;
    o.pool = k.take<std::byte>(o.layer_stride * d.payload_layers);
    o.layer_ptrs = k.take<std::byte*>(d.payload_layers);
    o.hot_row = k.take<row_index>(cap * hot_rows);
    o.order = k.take<order_index>(cap * hot_rows);
    o.frontier = k.take<std::int64_t>(cap);
    o.optional_page = k.take<std::int32_t>(cap * ppr);
    o.host_page = k.take<std::int32_t>(cap * ppr);
    o.way_of_row = k.take<order_index>(cap * c.max_rows);
    o.control = k.take<control_block>(1);
    o.ready = k.take<std::uint64_t>(cap);
    o.claim = k.take<std::uint32_t>(cap);
    o.plan = k.take<plan_entry>(cap * top_k);
    o.early_plan = k.take<plan_entry>(cap * top_k);
    o.errors = k.take<entry_error>(cap);
    o.sticky = k.take<entry_error>(cap);
    o.stats = k.take<entry_stats>(cap);
    o.eager = k.take<std::byte>(eager_bytes(cap));
    if (c.max_block > 1) {  // verification workspace; nothing without speculation
      const std::size_t words = (c.max_rows + 31) / 32;
      o.v_control = k.take<control_block>(1);
      o.v_plan = k.take<plan_entry>(cap * c.max_block * top_k);
      o.v_stats = k.take<verify_entry_stats>(cap);
      o.v_errors = k.take<entry_error>(cap);
      o.v_sticky = k.take<entry_error>(cap);
      o.v_seen = k.take<std::uint32_t>(cap * words);
      o.v_rank = k.take<std::uint32_t>(cap * words);
      o.v_eager = k.take<std::byte>(verify_eager_offsets(cap, c.max_block).total);
      o.v_staged = k.take<std::int32_t>(cap);
      o.v_verified = k.take<std::int32_t>(cap);
      o.v_partial = k.take<std::int32_t>(cap);
    }
    o.total = k.bytes();
    return o;
  }
  static eager_layout eager_offsets(std::size_t n) {
    const auto up16 = [](std::size_t x) { return (x + 15) / 16 * 16; };
    eager_layout l;
    l.count = 0;
    l.slots = 16;
    l.lengths = l.slots + up16(n * sizeof(std::int32_t));
    l.sel = l.lengths + up16(n * sizeof(std::int32_t));
    l.loc = l.sel + n * sizeof(void*);
    l.total = l.loc + n * sizeof(void*);
    return l;
  }
  static std::size_t eager_bytes(std::size_t cap) { return eager_offsets(cap).total; }

  // ---- speculative verification helpers
  struct verify_eager_layout {
    std::size_t count = 0, slots = 0, queries = 0, lengths = 0, sel = 0, loc = 0, total = 0;
  };
  /// Pool geometry: with K_max > 1 the tail ring holds T + K_max rows and every slot K_max * top_k
  /// staging rows (the host reference's layout, so locations agree).
  /// Bytes of one shared staging arena (aligned): N * K_max * k rows of the widest row.
  static std::size_t arena_stride(const hierarchy_config& c) {
    if (!Staging::shared || c.max_block < 2) return 0;
    const std::size_t bytes = c.max_requests * c.max_block * top_k * widest_row_bytes<Layout>();
    return (bytes + detail::carver::alignment - 1) / detail::carver::alignment * detail::carver::alignment;
  }
  /// The shared-arena layout of `c` (normalised): the host reference's arithmetic, so both
  /// backends return the same staging locations.
  static dhisparse::detail::staging_blocks blocks_for(const hierarchy_config& c) {
    static_assert(detail::carver::alignment == dhisparse::detail::staging_block_alignment,
                  "the shared-arena layout rounds to the carver's alignment (both backends' locations depend on it)");
    const location_space sp = make_space(c);
    return dhisparse::detail::plan_staging_blocks(std::span<const source_desc>(Layout::sources), sp.pool_rows(),
                                                  sp.slots * sp.staging_rows, Staging::arenas);
  }
  static location_space make_space(const hierarchy_config& c) {
    const bool spec = c.max_block > 1;
    return location_space{c.max_requests, hot_rows, c.tail_rows + (spec ? c.max_block : 0), c.optional_pages,
                          page_rows, spec ? c.max_block * top_k : 0};
  }
  static verify_eager_layout verify_eager_offsets(std::size_t n, std::size_t km) {
    const auto up16 = [](std::size_t x) { return (x + 15) / 16 * 16; };
    verify_eager_layout l;
    l.slots = 16;
    l.queries = l.slots + up16(n * sizeof(std::int32_t));
    l.lengths = l.queries + up16(n * sizeof(std::int32_t));
    l.sel = l.lengths + up16(n * km * sizeof(std::int32_t));
    l.loc = l.sel + n * km * sizeof(void*);
    l.total = l.loc + n * km * sizeof(void*);
    return l;
  }
  static std::size_t verify_eager_bytes(const hierarchy_config& c) {
    return verify_eager_offsets(c.max_requests, c.max_block).total;
  }
  [[nodiscard]] bool speculative() const { return cfg_.max_block > 1; }
  void close_round(std::size_t source, std::size_t slot, cudaStream_t stream) {
    src_[source].staged[slot] = 0;
    src_[source].verified[slot] = 0;
    DHISPARSE_CUDA_TRY(detail::launch_verify_set_round(src_[source].vws, static_cast<int>(slot), 0, 0,
                                                       static_cast<std::int32_t>(src_[source].partial[slot]), stream));
  }
  [[nodiscard]] std::int64_t committed_positions(std::size_t source, std::size_t slot) const {
    const auto m = static_cast<std::int64_t>(Layout::sources[source].positions_per_row);
    const std::int64_t f = src_[source].books.slot(slot).frontier;
    return speculative() ? f * m + static_cast<std::int64_t>(src_[source].partial[slot]) : f * m;
  }
  [[nodiscard]] std::size_t rows_of_block(std::size_t source, std::size_t slot, std::size_t count) const {
    const std::size_t m = Layout::sources[source].positions_per_row;
    const std::size_t b = speculative() ? src_[source].partial[slot] : 0;
    return count == 0 ? 0 : (b + count - 1) / m + 1;
  }
  void check_followers_copied(std::size_t source, const char* call) const {
    dhisparse::detail::check_followers_copied(src_[source].layer_pending, source, call);
  }
  /// Shared arenas: a verify on another stream than the last release waits for that release. A
  /// verify captured into a graph after a release that was not captured waits on the event as an
  /// external node (at each replay, for its latest record); a release in the same capture joins
  /// the streams as usual.
  void wait_for_staging_release(cudaStream_t stream) {
    if constexpr (Staging::shared)
      if (arena_free_ && release_stream_ != stream) {
        const bool external = capturing(stream) && !release_captured_;
        DHISPARSE_CUDA_TRY(
            cudaStreamWaitEvent(stream, arena_free_.get(), external ? cudaEventWaitExternal : cudaEventWaitDefault));
      }
  }
  static bool capturing(cudaStream_t stream) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    DHISPARSE_CUDA_TRY(cudaStreamIsCapturing(stream, &status));
    return status == cudaStreamCaptureStatusActive;
  }
  void check_speculative(std::size_t source) const {
    check_source(source);
    if (!speculative())
      throw invalid_configuration("speculative calls need hierarchy_config::max_block >= 2 (the tail ring has no "
                                  "room for a block); with max_block = 1 use append and resolve");
  }
  /// A stage view's max_block: 0 means K_max; more than K_max cannot be staged (size_mismatch).
  std::uint32_t checked_stage_block(std::uint32_t max_block, const char* view) const {
    if (max_block > cfg_.max_block)
      throw size_mismatch(std::string(view) + " max_block " + std::to_string(max_block) +
                          " exceeds the hierarchy's max_block " + std::to_string(cfg_.max_block));
    return max_block == 0 ? static_cast<std::uint32_t>(cfg_.max_block) : max_block;
  }
  /// After a batched stage on a source: its device round books (staged, verified) lead the host's.
  void mark_device_stages(source_state& src) {
    src.device_stages = true;
    src.device_rounds = true;  // K_r is read from the device books (commit, verified_queries)
    src.device_writes = true;  // sync_books visits the source
    device_writes_ = true;     // eager calls absorb first
  }
  /// Host checks of stage_block (the host reference's order); returns the slot.
  std::size_t check_stage(request_id id, std::size_t source, std::size_t count) const {
    check_speculative(source);
    const std::size_t slot = registry_.slot(id);
    const std::int64_t n = committed_positions(source, slot);
    const auto m = static_cast<std::int64_t>(Layout::sources[source].positions_per_row);
    dhisparse::detail::validate_block(count, cfg_.max_block, n, m, cfg_.max_rows, id, source);
    return slot;
  }
  void stage_checked(std::size_t source, std::size_t slot, const std::byte* rows, std::size_t count,
                     cudaStream_t stream) {
    auto& src = src_[source];
    // the block's rows: the boundary row (frontier) first; block_rows <= count <= K_max
    DHISPARSE_CUDA_TRY(detail::launch_verify_stage(src.view, static_cast<unsigned>(slot), rows,
                                                   src.books.slot(slot).frontier,
                                                   static_cast<unsigned>(rows_of_block(source, slot, count)),
                                                   sm_count_ * 8, stream));
    DHISPARSE_CUDA_TRY(detail::launch_verify_set_round(src.vws, static_cast<int>(slot), static_cast<std::int32_t>(count),
                                                       0, static_cast<std::int32_t>(src.partial[slot]), stream));
    src.staged[slot] = count;
    src.verified[slot] = 0;
  }
  /// Host checks of one request's verify round (the host reference's order, entries excepted:
  /// those are checked on the device).
  void validate_round(std::size_t source, std::size_t slot, const verify_batch_item& item) const {
    const auto& src = src_[source];
    // The message is built only on failure (no host allocation on the good path).
    const auto who = [&] {
      return "verify of request " + std::to_string(item.request) + " on source " + std::to_string(source);
    };
    const std::size_t kr = item.queries.size();
    if (kr == 0) throw size_mismatch(who() + " has no queries (K_r >= 1: the anchor)");
    if (kr > cfg_.max_block)
      throw block_too_wide(who() + " with K_r = " + std::to_string(kr) + ", max_block is " + std::to_string(cfg_.max_block));
    if (src.staged[slot] == 0) throw no_staged_block(who() + " without a staged block");
    if (kr > src.staged[slot])
      throw block_too_wide(who() + " with K_r = " + std::to_string(kr) + " queries, the staged block has " +
                           std::to_string(src.staged[slot]) + " positions");
    for (std::size_t j = 0; j < kr; ++j) {
      const verify_query& q = item.queries[j];
      if (q.length < 0 || (q.length > 0 && (q.selection == nullptr || q.locations == nullptr)))
        throw size_mismatch(who() + ": query " + std::to_string(j) + " of length " + std::to_string(q.length) +
                            " needs device selection and location pointers");
      if (static_cast<std::size_t>(q.length) > top_k)
        throw selection_too_long(who() + ": query " + std::to_string(j) + " has " + std::to_string(q.length) +
                                 " entries, top_k is " + std::to_string(top_k));
    }
  }
  /// K_r of a slot's last good verify from the device books (synchronises `stream`).
  std::size_t read_device_verified(std::size_t source, std::size_t slot, cudaStream_t stream) const {
    std::int32_t v = 0;
    DHISPARSE_CUDA_TRY(cudaMemcpyAsync(&v, src_[source].vws.verified + slot, sizeof(v), cudaMemcpyDeviceToHost, stream));
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
    return static_cast<std::size_t>(v);
  }
  control_block read_verify_control(std::size_t source) const {
    return read_on(stream_, src_[source].vws.control, 1).front();
  }
  /// The verify part of `check_errors`: throws the first bad entry of the first failing verify of
  /// a source; every request whose entry failed there has its round marked unverified (its device
  /// state did not change, so a commit must follow a successful verify).
  // Throws the first error record of source `s` (writes, then verifies, then resolves) and clears
  // that record; returns when the source has none.
  void check_source_errors(std::size_t s, cudaStream_t stream) {
    auto& src = src_[s];
    check_write_errors(s, stream);
    if (speculative()) check_verify_errors(s, stream);
    const control_block cb = read_on(stream, src.ws.control, 1).front();
    if (cb.overflow != 0) {
      clear_on(stream, &src.ws.control->overflow);  // cleared before any later launch, whatever its stream
      throw size_mismatch("resolve on source " + std::to_string(s) + " was given a batch count of " +
                          std::to_string(cb.overflow) + ", above the batch_view capacity; extra entries were ignored");
    }
    if (cb.sticky_epoch == 0) return;
    const auto recs = read_on(stream, src.ws.sticky, cfg_.max_requests);
    clear_on(stream, &src.ws.control->sticky_epoch);
    for (std::size_t t = 0; t < recs.size(); ++t)
      if (recs[t].epoch == cb.sticky_epoch && recs[t].code != status_ok)
        throw_error(to_errc(recs[t].code), describe(s, t, recs[t]));
  }
  void check_verify_errors(std::size_t s, cudaStream_t stream) {
    auto& src = src_[s];
    const control_block cb = read_on(stream, src.vws.control, 1).front();
    if (cb.overflow != 0) {
      clear_on(stream, &src.vws.control->overflow);
      throw size_mismatch("verify on source " + std::to_string(s) + " was given a batch count of " +
                          std::to_string(cb.overflow) + ", above the batch capacity; extra entries were ignored");
    }
    if (cb.sticky_epoch == 0) return;
    const auto recs = read_on(stream, src.vws.sticky, cfg_.max_requests);
    clear_on(stream, &src.vws.control->sticky_epoch);
    for (const auto& r : recs)
      if (r.epoch == cb.sticky_epoch && r.code != status_ok && r.slot >= 0 &&
          static_cast<std::size_t>(r.slot) < cfg_.max_requests)
        src.verified[static_cast<std::size_t>(r.slot)] = 0;
    for (std::size_t t = 0; t < recs.size(); ++t)
      if (recs[t].epoch == cb.sticky_epoch && recs[t].code != status_ok)
        throw_error(to_errc(recs[t].code), describe_verify(s, t, recs[t]));
  }
  std::string describe_verify(std::size_t source, std::size_t t, const entry_error& r) const {
    const std::string where = " (verify batch entry " + std::to_string(t) + ", source " + std::to_string(source) + ")";
    const std::string who = "verify of " + request_name(r.slot) + " on source " + std::to_string(source);
    const int j = r.index >= 0 ? r.index >> 24 : -1, i = r.index >= 0 ? r.index & 0xFFFFFF : -1;
    switch (to_errc(r.code)) {
      case errc::unknown_request:
        return "request slot " + std::to_string(r.value) + " holds no admitted request" + where;
      case errc::duplicate_in_batch:
        return request_name(r.slot) + " appears twice in one verify batch" + where;
      case errc::size_mismatch:
        return who + ": K_r or a query length of " + std::to_string(r.value) + " does not fit the batch" + where;
      case errc::block_too_wide:
        return who + " with K_r = " + std::to_string(r.value) + ", above max_block (" + std::to_string(cfg_.max_block) +
               ") or the staged block" + where;
      case errc::no_staged_block:
        return who + " without a staged block" + where;
      case errc::selection_too_long:
        return who + ": query " + std::to_string(j) + " has " + std::to_string(r.value) + " entries, top_k is " +
               std::to_string(top_k) + where;
      case errc::position_out_of_range:
        return who + ": query " + std::to_string(j) + " entry " + std::to_string(i) + " is row " +
               std::to_string(r.value) + ", outside [0, " + std::to_string(cfg_.max_rows) + ") and not -1" + where;
      case errc::position_not_visible:
        return who + ": query " + std::to_string(j) + " (position " + std::to_string(r.frontier + j) + ") entry " +
               std::to_string(i) + " selects row " + std::to_string(r.value) +
               (Layout::sources[source].positions_per_row > 1 ? ", which is not complete at that position"
                                                              : ", which it cannot see") +
               where;
      default:
        return std::string(to_string(to_errc(r.code))) + where;
    }
  }

  void build_source(std::size_t s, const adopted_store& adopted) {
    const auto& d = Layout::sources[s];
    auto& src = src_[s];
    const offsets o = source_offsets(cfg_, s);
    src.device = device_buffer<std::byte>(o.total);
    std::byte* base = src.device.data();
    DHISPARSE_CUDA_TRY(cudaMemsetAsync(base, 0, o.total, stream_));  // pools, counters, epochs; slots reset below
    DHISPARSE_CUDA_TRY(cudaMemsetAsync(base + o.way_of_row, 0xFF,  // every row: in no hot way
                                       sizeof(order_index) * cfg_.max_requests * cfg_.max_rows, stream_));

    // The host store: adopted caller bytes, or a pinned allocation of its own.
    std::span<std::byte> store_bytes = adopted.host;
    std::byte* store_device = adopted.device;
    if (store_device == nullptr) {
      src.pinned = pinned_buffer(host_store::bytes_required(page_rows, d.payload_layers, d.row_bytes, cfg_.host_pages));
      store_bytes = src.pinned.span();
      store_device = src.pinned.device_data();
    }
    src.books = dhisparse::detail::history_books(cfg_.max_requests, cfg_.max_rows, page_rows, cfg_.optional_pages,
                                      host_store(page_rows, d.payload_layers, d.row_bytes, cfg_.host_pages,
                                                 store_bytes));
    // Shared store: the bytes are the store's (adopted above); pages come from its books.
    if (binding_.books()) src.books.attach_shared(binding_.books(), s, binding_.rank());

    location_space sp = space_;
    if constexpr (Staging::shared) sp.staging_gap = blocks_plan_.staging_gap[s];
    src.layer_ptrs.resize(d.payload_layers);
    src.staging_ptrs.resize(d.payload_layers);
    for (std::size_t l = 0; l < d.payload_layers; ++l) {
      // Shared arenas: layer l's pool sits in block l, staging_gap rows before arena l.
      src.layer_ptrs[l] = Staging::shared ? blocks_.data() + blocks_plan_.pool_offset(s, l) : base + o.pool + l * o.layer_stride;
      src.staging_ptrs[l] = src.layer_ptrs[l] + sp.staging_begin() * d.row_bytes;
    }
    // Same stream as the memset above (pageable source: staged before the call returns).
    DHISPARSE_CUDA_TRY(cudaMemcpyAsync(base + o.layer_ptrs, src.layer_ptrs.data(), d.payload_layers * sizeof(std::byte*),
                                       cudaMemcpyHostToDevice, stream_));

    view_type& v = src.view;
    v.space = sp;
    v.hot_row = reinterpret_cast<row_index*>(base + o.hot_row);
    v.order = reinterpret_cast<order_index*>(base + o.order);
    v.frontier = reinterpret_cast<std::int64_t*>(base + o.frontier);
    v.optional_page = reinterpret_cast<std::int32_t*>(base + o.optional_page);
    v.host_page = reinterpret_cast<std::int32_t*>(base + o.host_page);
    v.way_of_row = reinterpret_cast<order_index*>(base + o.way_of_row);
    v.live = live_buffer_.data();
    v.host_store = store_device;
    v.layer_pool = reinterpret_cast<std::byte* const*>(base + o.layer_ptrs);
    v.page_bytes = src.books.store().page_bytes();
    v.max_rows = static_cast<std::int64_t>(cfg_.max_rows);
    v.row_bytes = static_cast<std::uint32_t>(d.row_bytes);
    v.layers = static_cast<std::uint32_t>(d.payload_layers);
    v.page_rows = static_cast<std::uint32_t>(page_rows);
    v.tail_rows = static_cast<std::uint32_t>(cfg_.tail_rows);
    v.pages_per_request = static_cast<std::uint32_t>(pages_per_request_);
    v.owner_ranks = binding_.books() ? static_cast<std::uint32_t>(binding_.books()->ranks()) : 0u;
    v.owner_rank = static_cast<std::uint32_t>(binding_.rank());

    workspace_view& w = src.ws;
    w.control = reinterpret_cast<control_block*>(base + o.control);
    w.ready = reinterpret_cast<std::uint64_t*>(base + o.ready);
    w.claim = reinterpret_cast<std::uint32_t*>(base + o.claim);
    w.plan = reinterpret_cast<plan_entry*>(base + o.plan);
    w.early_plan = reinterpret_cast<plan_entry*>(base + o.early_plan);
    w.errors = reinterpret_cast<entry_error*>(base + o.errors);
    w.sticky = reinterpret_cast<entry_error*>(base + o.sticky);
    w.stats = reinterpret_cast<entry_stats*>(base + o.stats);
    w.capacity = static_cast<std::uint32_t>(cfg_.max_requests);
    src.eager = base + o.eager;
    if (speculative()) {
      verify_workspace_view& vw = src.vws;
      vw.control = reinterpret_cast<control_block*>(base + o.v_control);
      vw.plan = reinterpret_cast<plan_entry*>(base + o.v_plan);
      vw.stats = reinterpret_cast<verify_entry_stats*>(base + o.v_stats);
      vw.errors = reinterpret_cast<entry_error*>(base + o.v_errors);
      vw.sticky = reinterpret_cast<entry_error*>(base + o.v_sticky);
      vw.seen = reinterpret_cast<std::uint32_t*>(base + o.v_seen);
      vw.word_rank = reinterpret_cast<std::uint32_t*>(base + o.v_rank);
      vw.staged = reinterpret_cast<std::int32_t*>(base + o.v_staged);  // zero: the memset above
      vw.verified = reinterpret_cast<std::int32_t*>(base + o.v_verified);
      vw.partial = reinterpret_cast<std::int32_t*>(base + o.v_partial);
      vw.positions_per_row = static_cast<std::uint32_t>(d.positions_per_row);
      vw.words = static_cast<std::uint32_t>((cfg_.max_rows + 31) / 32);
      vw.plan_stride = static_cast<std::uint32_t>(cfg_.max_block * top_k);
      vw.capacity = static_cast<std::uint32_t>(cfg_.max_requests);
      src.v_eager = base + o.v_eager;
      src.staged.assign(cfg_.max_requests, 0);
      src.verified.assign(cfg_.max_requests, 0);
      src.partial.assign(cfg_.max_requests, 0);
    }
#ifdef DHISPARSE_TEST_FIRST_EPOCH
    // Test hook, compiled out by default: resolves and verifies counted from just below the
    // 32-bit epoch wrap (tests/cuda/epoch_wrap.cu).
    {
      control_block c{};
      c.epoch = DHISPARSE_TEST_FIRST_EPOCH;
      DHISPARSE_CUDA_TRY(cudaMemcpyAsync(w.control, &c, sizeof c, cudaMemcpyHostToDevice, stream_));
      if (speculative()) DHISPARSE_CUDA_TRY(cudaMemcpyAsync(src.vws.control, &c, sizeof c, cudaMemcpyHostToDevice, stream_));
    }
#endif

    DHISPARSE_CUDA_TRY(detail::launch_reset_slots(v, 0u, static_cast<unsigned>(cfg_.max_requests), stream_));

    src.layer_pending.assign(d.payload_layers, false);
    build_write_state(s);
  }

  // ---- batched writes and commits
  static constexpr std::size_t write_control_bytes = 256;  // one write_control, carver-aligned
  static_assert(sizeof(detail::step_source<order_index>) <= detail::step_source_bytes,
                "dhisparse::cuda: a step-table entry outgrew detail::step_source_bytes (and the planner's count)");
  static constexpr std::size_t up256(std::size_t x) { return (x + 255) / 256 * 256; }
  /// Bytes of one source's part of the write state after the step table: the error books of
  /// writes, of commits and (speculative) of stages (a control block and N records each), then N
  /// backup work items.
  static std::size_t write_books_bytes(std::size_t slots, bool spec) {
    return (spec ? 3 : 2) * (write_control_bytes + up256(slots * sizeof(entry_error))) +
           up256(slots * sizeof(detail::backup_item));
  }
  /// Device bytes of the one write-state allocation: the step table (one 512-byte entry per
  /// source), then every source's error books and backup work list (planner: cuda_workspace_bytes).
  static std::size_t write_state_bytes(std::size_t slots, bool spec) {
    return sources * (detail::step_source_bytes + write_books_bytes(slots, spec));
  }
  /// Pinned bytes of the books snapshot `sync_books` reads: every source's N frontiers, then
  /// every source's N partial rows.
  static std::size_t books_snapshot_bytes(std::size_t slots) {
    return sources * slots * (sizeof(std::int64_t) + sizeof(std::int32_t));
  }
  [[nodiscard]] std::size_t snapshot_partial_offset() const {
    return sources * cfg_.max_requests * sizeof(std::int64_t);
  }
  /// 16-byte vectors of one row over every payload layer of a source (sizes the write CTAs).
  static constexpr std::uint64_t vectors_of(std::size_t s) {
    return Layout::sources[s].payload_layers * (Layout::sources[s].row_bytes / 16);
  }
  void build_write_state(std::size_t s) {
    auto& src = src_[s];
    const std::size_t n = cfg_.max_requests;
    std::byte* at = write_state_.data() + sources * detail::step_source_bytes + s * write_books_bytes(n, speculative());
    const detail::write_control fresh{};
    for (int k = 0; k < (speculative() ? 3 : 2); ++k) {
      detail::write_workspace_view& w = k == 0 ? src.wws : k == 1 ? src.cws : src.sws;
      w.control = reinterpret_cast<detail::write_control*>(at);
      w.sticky = reinterpret_cast<entry_error*>(at + write_control_bytes);
      w.capacity = static_cast<std::uint32_t>(n);
      DHISPARSE_CUDA_TRY(cudaMemcpyAsync(w.control, &fresh, sizeof(fresh), cudaMemcpyHostToDevice, stream_));
      at += write_control_bytes + up256(n * sizeof(entry_error));
    }
    src.work = reinterpret_cast<detail::backup_item*>(at);
    DHISPARSE_CUDA_TRY(cudaMemsetAsync(src.work, 0, n * sizeof(detail::backup_item), stream_));  // nothing to back up
  }
  /// Uploads the step table (every source's views, fixed from construction on) to the front of
  /// the write state; the constructor synchronises before the host copy goes.
  void build_step_table() {
    std::vector<detail::step_source<order_index>> table(sources);
    for (std::size_t s = 0; s < sources; ++s) {
      const auto& src = src_[s];
      table[s].view = src.view;
      table[s].wws = src.wws;
      table[s].cws = src.cws;
      table[s].sws = src.sws;
      table[s].vws = src.vws;
      table[s].work = src.work;
      table[s].first_layer = static_cast<std::uint32_t>(step_layer_index(s, 0));
    }
    // One contiguous array: the kernels index `table[s]` (stride sizeof), not step_source_bytes,
    // which only bounds the space reserved per source.
    step_table_ = reinterpret_cast<detail::step_source<order_index>*>(write_state_.data());
    DHISPARSE_CUDA_TRY(cudaMemcpy(step_table_, table.data(), table.size() * sizeof(table[0]), cudaMemcpyHostToDevice));
  }
  /// Forks the backup of the critical launch just enqueued on `stream` onto `backup` (record,
  /// wait, launch, record: event nodes under capture) and marks it pending.
  void fork_backup(std::uint32_t capacity, unsigned warps, cudaStream_t backup, cudaStream_t stream) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    unsigned long long id = 0;
    DHISPARSE_CUDA_TRY(cudaStreamGetCaptureInfo(stream, &status, &id));
    DHISPARSE_CUDA_TRY(cudaEventRecord(backup_written_.get(), stream));
    DHISPARSE_CUDA_TRY(cudaStreamWaitEvent(backup, backup_written_.get(), cudaEventWaitDefault));
    DHISPARSE_CUDA_TRY(
        detail::launch_backup_rows(step_table_, 0u, static_cast<unsigned>(sources), capacity, warps, backup));
    DHISPARSE_CUDA_TRY(cudaEventRecord(backup_done_.get(), backup));
    backup_ = {true, status == cudaStreamCaptureStatusActive, id, backup};
  }
  /// The host waits for an eager pending backup (readers of the host store without a stream).
  void wait_backup_host() const {
    if (!backup_.pending || backup_.captured) return;
    DHISPARSE_CUDA_TRY(cudaEventSynchronize(backup_done_.get()));
    backup_.pending = false;
  }
  /// `join_backup` on the hierarchy's device (callers hold the guard).
  void join_backup_impl(cudaStream_t stream) {
    if (!backup_.pending) return;
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    unsigned long long id = 0;
    DHISPARSE_CUDA_TRY(cudaStreamGetCaptureInfo(stream, &status, &id));
    const bool cap = status == cudaStreamCaptureStatusActive;
    if (!backup_.captured) {  // eager backup: real work in flight
      DHISPARSE_CUDA_TRY(
          cudaStreamWaitEvent(stream, backup_done_.get(), cap ? cudaEventWaitExternal : cudaEventWaitDefault));
      if (!cap) backup_.pending = false;
      return;
    }
    if (cap && id == backup_.capture_id) {
      DHISPARSE_CUDA_TRY(cudaStreamWaitEvent(stream, backup_done_.get(), cudaEventWaitDefault));
      backup_.pending = false;
      return;
    }
    if (capturing(backup_.stream))
      throw invalid_configuration("join_backup: the host backup was forked into a stream capture that is still open; "
                                  "join it on a stream of that capture before the capture ends");
    backup_.pending = false;  // that capture ended (joined there, or it failed): nothing of it is in flight
  }
  /// `sync_books` on the hierarchy's device (callers hold the guard).
  void sync_books_impl(cudaStream_t stream) {
    check_not_captured(stream, "sync_books");
    join_backup_impl(stream);  // the books then describe host copies that exist
    if (device_writes_) {
      // One copy of every source's device frontiers and partial rows, made after the device books
      // that the host paths last changed (on any stream: books_changed) and the launches on `stream`.
      DHISPARSE_CUDA_TRY(cudaStreamWaitEvent(stream, books_written_.get(), cudaEventWaitDefault));
      DHISPARSE_CUDA_TRY(detail::launch_books_snapshot(step_table_, static_cast<unsigned>(sources),
                                                       static_cast<unsigned>(cfg_.max_requests), snapshot_view_, stream));
    }
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
    const auto admitted = registry_.admitted();
    for (std::size_t s = 0; s < sources; ++s) {
      auto& src = src_[s];
      if (!src.device_writes) continue;
      const std::size_t at = s * cfg_.max_requests;
      const auto* f = reinterpret_cast<const volatile std::int64_t*>(books_snapshot_.span().data()) + at;
      const auto* p =
          reinterpret_cast<const volatile std::int32_t*>(books_snapshot_.span().data() + snapshot_partial_offset()) + at;
      for (const auto& [id, slot] : admitted) {
        const std::int64_t rows = f[slot];
        const auto part = static_cast<std::size_t>(p[slot]);
        const bool moved = rows != src.books.slot(slot).frontier || (speculative() && part != src.partial[slot]);
        if (!moved) continue;
        const std::int64_t before = src.books.slot(slot).frontier;
        src.books.absorb_frontier(id, s, slot, rows);
        src.books.wrote_host_copies(slot, before, rows);  // backups joined above: the owned rows are on the host
        if (speculative()) {  // the batched append or commit closed the round
          src.partial[slot] = part;
          src.staged[slot] = 0;
          src.verified[slot] = 0;
        }
      }
      if (src.device_stages) {
        // Batched stages leave the frontier alone, so the snapshot cannot show them: the device
        // round books are read instead (the stream is idle: a plain copy). K_r stays with the
        // device too (device_rounds), so a stale host `verified` can never pass a commit.
        const auto staged = read_on(stream, src.vws.staged, cfg_.max_requests);
        for (const auto& [id, slot] : admitted) {
          const auto b = static_cast<std::size_t>(staged[slot]);
          if (b != src.staged[slot]) src.verified[slot] = 0;
          src.staged[slot] = b;
        }
      }
    }
  }
  /// Absorbs what the device did when batched launches ran (sync_books); nothing otherwise.
  void absorb(cudaStream_t stream) {
    join_backup_impl(stream);  // what follows may read or free host rows that are still being backed up
    if (device_writes_) sync_books_impl(stream);
  }
  /// A host path changed device books on `stream` (the host books show it already): the next
  /// books snapshot, on whatever stream `sync_books` is given, waits for it. A captured host path
  /// is ordered by the graph's replay instead.
  void books_changed(cudaStream_t stream) {
    if (!capturing(stream)) DHISPARSE_CUDA_TRY(cudaEventRecord(books_written_.get(), stream));
  }
  [[nodiscard]] std::int64_t device_partial(std::size_t source, std::size_t slot) const {
    return read_slot_array(src_[source].vws.partial, slot, 1).front();
  }
  void check_view_capacity(std::uint32_t capacity, const char* view) const {
    if (capacity > cfg_.max_requests)
      throw size_mismatch(std::string(view) + " capacity " + std::to_string(capacity) + " exceeds max_requests " +
                          std::to_string(cfg_.max_requests));
  }
  static void check_not_captured(cudaStream_t stream, const char* call) {
    if (capturing(stream))
      throw invalid_configuration(std::string(call) +
                                  " works on the host books and cannot be captured: call it between graph replays");
  }
  /// The batched-launch part of `check_errors`: throws the first bad entry of the first failing
  /// batched append, then stage, then commit, of a source, and clears the record.
  void check_write_errors(std::size_t s, cudaStream_t stream) {
    static constexpr const char* calls[3] = {"append", "stage", "commit"};
    for (int k = 0; k < 3; ++k) {
      const detail::write_workspace_view& w = k == 0 ? src_[s].wws : k == 1 ? src_[s].sws : src_[s].cws;
      if (w.control == nullptr) continue;  // no stage books without speculation
      const detail::write_control ctl = read_on(stream, w.control, 1).front();
      if (ctl.first_error == ~0ull) continue;
      const auto e = static_cast<std::size_t>(ctl.first_error & 0xFFFFFFFFull);
      const entry_error r = read_on(stream, w.sticky + e, 1).front();
      // Cleared in `stream` order and waited for, so every later launch, on any stream, sees it cleared.
      DHISPARSE_CUDA_TRY(cudaMemsetAsync(&w.control->first_error, 0xFF, sizeof(ctl.first_error), stream));
      DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
      throw_error(to_errc(r.code), describe_write(s, e, r, calls[k]));
    }
  }
  std::string describe_write(std::size_t source, std::size_t e, const entry_error& r, const char* call) const {
    const std::string where =
        " (" + std::string(call) + " batch entry " + std::to_string(e) + ", source " + std::to_string(source) + ")";
    const std::string who = std::string(call) + " of " + request_name(r.slot) + " on source " + std::to_string(source);
    switch (to_errc(r.code)) {
      case errc::unknown_request:
        return "request slot " + std::to_string(r.value) + " holds no admitted request" + where;
      case errc::duplicate_in_batch:
        return request_name(r.slot) + " appears twice in one " + call + " batch" + where;
      case errc::size_mismatch:
        if (std::string_view(call) == "stage")
          return who + " with " + std::to_string(r.value) + " positions (a block holds at least the anchor)" + where;
        return who + ": " + std::to_string(r.value) + " rows, outside [0, the kv_write_view's max_rows]" + where;
      case errc::block_too_wide:
        return who + " with " + std::to_string(r.value) + " positions, the stage_view's max_block is " +
               std::to_string(r.index) + where;
      case errc::capacity_exceeded:
        if (std::string_view(call) == "stage")
          return who + ": positions up to " + std::to_string(r.value - 1) + " exceed the capacity of " +
                 std::to_string(cfg_.max_rows) + " rows of " +
                 std::to_string(Layout::sources[source].positions_per_row) + " positions" + where;
        return who + " would reach row " + std::to_string(r.value) + " (frontier " + std::to_string(r.frontier) +
               "), past its reserved rows or max_rows " + std::to_string(cfg_.max_rows) +
               " (reserve_rows / reserve_ahead first)" + where;
      case errc::commit_without_verify:
        return who + " without a verify since its last stage_block" + where;
      case errc::acceptance_beyond_block:
        return who + " accepts " + std::to_string(r.value) + " proposals, the verified round had " +
               std::to_string(r.index - 1) + where;
      default:
        return std::string(to_string(to_errc(r.code))) + where;
    }
  }

  [[nodiscard]] static std::size_t pages_for(std::int64_t rows) {
    return (static_cast<std::size_t>(rows) + page_rows - 1) / page_rows;
  }
  void check_host_page(std::size_t source, page_id page) const {
    check_source(source);
    if (page < 0 || static_cast<std::size_t>(page) >= cfg_.host_pages)
      throw position_out_of_range("host page " + std::to_string(page) + " outside the store's " +
                                  std::to_string(cfg_.host_pages));
  }
  /// Source s's books, for the prefix registry.
  auto books_of_source() {
    return [this](std::size_t s) -> dhisparse::detail::history_books& { return src_[s].books; };
  }
  /// Makes the hierarchy's device current for one call; the thread's device comes back when the
  /// guard goes (also on a throw).
  [[nodiscard]] detail::device_guard on_device() const { return detail::device_guard(device_); }
  /// As above, and throws wrong_device for a caller stream of another device (the constructor's
  /// stream was checked once).
  [[nodiscard]] detail::device_guard on_device(cudaStream_t stream) const {
    return {device_, stream == stream_ ? cudaStream_t{} : stream};
  }
  /// Throws wrong_device for a second caller stream of another device (a backup stream).
  void check_stream(cudaStream_t stream) const {
    if (stream != stream_) detail::check_stream_device(stream, device_);
  }
  static void check_source(std::size_t source) {
    if (source >= sources)
      throw invalid_source("source " + std::to_string(source) + " outside the layout's " + std::to_string(sources));
  }
  static void check_layer(std::size_t source, std::size_t layer) {
    check_source(source);
    if (layer >= Layout::sources[source].payload_layers)
      throw invalid_source("payload layer " + std::to_string(layer) + " outside source " + std::to_string(source));
  }
  /// Rows a kernel reads directly must be device memory or pinned host memory (or any memory on a
  /// device that reads pageable memory); the std::span overloads stage anything else.
  void check_device_accessible(const std::byte* rows, const char* call) const {
    cudaPointerAttributes attr{};
    DHISPARSE_CUDA_TRY(cudaPointerGetAttributes(&attr, rows));
    detail::check_memory_device(attr, device_, call, "the rows");
    if (attr.type == cudaMemoryTypeUnregistered && !pageable_access_)
      throw invalid_configuration(std::string(call) + ": rows must be device-accessible (device or pinned memory); "
                                  "use the std::span overload for pageable host memory");
  }
  /// The eager calls upload their batch from host staging: they cannot be captured.
  static void check_not_capturing(cudaStream_t stream, const char* call, const char* capture_instead) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    DHISPARSE_CUDA_TRY(cudaStreamIsCapturing(stream, &status));
    if (status != cudaStreamCaptureStatusNone)
      throw invalid_configuration(std::string("the eager ") + call +
                                  " uploads its batch from host staging and cannot be captured; capture " +
                                  capture_instead + " instead");
  }
  void append_checked(std::size_t source, std::size_t slot, const std::byte* rows, std::size_t count,
                      cudaStream_t stream) {
    auto& src = src_[source];
    const auto a = src.books.commit_append(slot, count);
    if (speculative()) {
      src.partial[slot] = 0;  // complete rows only: the first appended row covers a partial boundary row
      close_round(source, slot, stream);  // the history moved on: a staged block is superseded
    }
    try {
      if (a.last_page > a.first_page)
        // Pageable source: cudaMemcpyAsync stages it before returning, so the books may change later.
        DHISPARSE_CUDA_TRY(cudaMemcpyAsync(src.view.host_page + slot * pages_per_request_ + a.first_page,
                                           src.books.slot(slot).host_pages.data() + a.first_page,
                                           (a.last_page - a.first_page) * sizeof(std::int32_t),
                                           cudaMemcpyHostToDevice, stream));
      DHISPARSE_CUDA_TRY(detail::launch_append(src.view, static_cast<unsigned>(slot), rows, a.first_row,
                                               static_cast<unsigned>(count), a.last_row, sm_count_ * 8, stream));
    } catch (...) {
      src.books.undo_append(slot, a);  // the books follow the device: nothing was appended
      throw;
    }
    src.books.wrote_host_copies(slot, a.first_row, a.last_row);  // shared store: enqueued in stream order
    books_changed(stream);
  }
  void launch(std::size_t source, const batch_view& v, cudaStream_t stream, copy_layers mode) {
    auto& src = src_[source];
    resolve_params p = tuning_;
    p.layers_to_copy = mode == copy_layers::all ? static_cast<std::uint32_t>(Layout::sources[source].payload_layers) : 1u;
    p.self_copy_units = std::min(tuning_.self_copy_units, detail::self_copy_capacity<resolve_traits>(
                                                       widest_row_bytes<Layout>(), Layout::sources[source].row_bytes));
    DHISPARSE_CUDA_TRY(
        (detail::launch_fused_resolve<resolve_traits, order_index>(
            src.view, src.ws, v, p,
            resolver_ctas_ == 0 ? grid_ : std::min(grid_, static_cast<int>(resolver_ctas_)), resolver_shared_bytes(),
            stream, programmatic_launch_)));
    if (mode == copy_layers::producer_only)
      for (std::size_t l = 1; l < src.layer_pending.size(); ++l) src.layer_pending[l] = true;
  }
  control_block read_control(std::size_t source) const { return read_on(stream_, src_[source].ws.control, 1).front(); }
  /// Reads `n` device objects of a slot on the hierarchy's stream (synchronises it). Every
  /// per-slot readback goes through here, public or not, so the guard is taken here.
  template <class T>
  std::vector<T> read_slot_array(const T* base, std::size_t slot, std::size_t n) const {
    const auto guard = on_device();
    return read_on(stream_, base + slot * n, n);
  }
  /// Enqueues a copy of `n` device objects into host memory on `stream` (no wait).
  template <class T>
  static void enqueue_read(cudaStream_t stream, T* host, const T* device, std::size_t n) {
    if (n != 0) DHISPARSE_CUDA_TRY(cudaMemcpyAsync(host, device, n * sizeof(T), cudaMemcpyDeviceToHost, stream));
  }
  /// `n` device objects read in `stream` order; synchronises `stream` only.
  template <class T>
  static std::vector<T> read_on(cudaStream_t stream, const T* device, std::size_t n) {
    std::vector<T> out(n);
    enqueue_read(stream, out.data(), device, n);
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
    return out;
  }
  /// Zeroes a device word in `stream` order and waits for it, so every launch made after the
  /// call returns, on any stream, sees it cleared (synchronises `stream` only).
  static void clear_on(cudaStream_t stream, std::uint32_t* word) {
    DHISPARSE_CUDA_TRY(cudaMemsetAsync(word, 0, sizeof(std::uint32_t), stream));
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
  }
  /// The device address a kernel writes `n` readback entries at `p` through; throws unless they
  /// fit max_requests and `p` is device memory or pinned mapped host memory.
  template <class T>
  T* readback_target(T* p, std::size_t n, const char* call) const {
    if (n > cfg_.max_requests)
      throw size_mismatch(std::string(call) + ": " + std::to_string(n) + " entries, at most max_requests (" +
                          std::to_string(cfg_.max_requests) + ")");
    if (n == 0) return p;
    cudaPointerAttributes attr{};
    if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) (void)cudaGetLastError();
    detail::check_memory_device(attr, device_, call, "the destination");
    if (attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged) return p;
    if (attr.type == cudaMemoryTypeHost && attr.devicePointer != nullptr) return static_cast<T*>(attr.devicePointer);
    if (pageable_access_) return p;
    throw invalid_configuration(std::string(call) + ": the destination must be device memory or pinned mapped "
                                "host memory (a kernel writes it)");
  }
  std::string request_name(std::int32_t slot) const {
    if (slot >= 0 && static_cast<std::size_t>(slot) < id_of_slot_.size() && id_of_slot_[slot])
      return "request " + std::to_string(*id_of_slot_[slot]);
    return "request slot " + std::to_string(slot);
  }
  std::string describe(std::size_t source, std::size_t t, const entry_error& r) const {
    const std::string where = " (batch entry " + std::to_string(t) + ", source " + std::to_string(source) + ")";
    switch (to_errc(r.code)) {
      case errc::unknown_request:
        return "request slot " + std::to_string(r.value) + " holds no admitted request" + where;
      case errc::duplicate_in_batch:
        return request_name(r.slot) + " appears twice in one resolve batch" + where;
      case errc::size_mismatch:
        return request_name(r.slot) + ": selection length " + std::to_string(r.value) +
               " does not fit the batch buffers" + where;
      case errc::selection_too_long:
        return "selection of " + request_name(r.slot) + " on source " + std::to_string(source) + " has " +
               std::to_string(r.value) + " entries, top_k is " + std::to_string(top_k) + where;
      case errc::position_out_of_range:
        return "selection entry " + std::to_string(r.index) + " of " + request_name(r.slot) + " on source " +
               std::to_string(source) + " is row " + std::to_string(r.value) + ", outside [0, " +
               std::to_string(cfg_.max_rows) + ") and not -1" + where;
      case errc::position_beyond_frontier:
        return "selection entry " + std::to_string(r.index) + " of " + request_name(r.slot) + " on source " +
               std::to_string(source) + " is row " + std::to_string(r.value) + ", but only " +
               std::to_string(r.frontier) + " rows exist" + where;
      default:
        return std::string(to_string(to_errc(r.code))) + where;
    }
  }

  hierarchy_config cfg_;
  cudaStream_t stream_ = nullptr;
  int device_ = -1;  // the device the hierarchy was created on (device())
  dhisparse::detail::shared_rank binding_;  // rank on a shared host store (none: own stores); freed after the books
  dhisparse::detail::request_registry registry_;
  std::vector<std::optional<request_id>> id_of_slot_;
  location_space space_{};
  std::size_t pages_per_request_ = 0;
  int sm_count_ = 0;
  int grid_ = 0;
  int pageable_access_ = 0;
  resolve_params tuning_{};  ///< the tuning switches above; layers_to_copy is set per launch
  detail::follower_copy_shape follower_shape_{};  ///< set_follower_copy_shape
  unsigned resolver_ctas_ = 0;
  bool programmatic_launch_ = false;  // set_programmatic_launch
  bool device_writes_ = false;        // some source had a batched append or commit: eager calls absorb first
  device_buffer<std::uint32_t> live_buffer_;
  detail::staging_ring ring_;
  detail::staging_ring verify_ring_;  // pinned staging of eager verify descriptors (max_block > 1)
  // staging_arenas<chi>: block l holds payload layer l's pool of every source, then arena l
  dhisparse::detail::staging_blocks blocks_plan_;
  device_buffer<std::byte> blocks_;
  detail::unique_event arena_free_;   // recorded by release_staging: the arenas' last readers are done
  cudaStream_t release_stream_{};     // stream of the last release
  bool release_captured_ = false;     // the last release was recorded into a stream capture
  dhisparse::detail::staging_holder<Staging> staging_;
  std::vector<std::size_t> verify_slots_;  // slots of the verify batch being validated
  std::vector<std::uint32_t> stamp_;
  std::uint32_t stamp_epoch_ = 0;
  std::array<source_state, sources> src_;
  // step-wide writes: one allocation for the step table, error books and backup work lists
  device_buffer<std::byte> write_state_;
  detail::step_source<order_index>* step_table_ = nullptr;  // [sources] at the front of write_state_
  detail::unique_event backup_written_;  // recorded on the write stream after a critical launch
  detail::unique_event backup_done_;     // recorded on the backup stream after the backup launch
  detail::unique_event books_written_;   // recorded after the last host path that changed device books
  pinned_buffer books_snapshot_;         // what sync_books reads: every source's frontiers, then partial rows
  detail::books_snapshot_view snapshot_view_{};  // device addresses of books_snapshot_
  struct backup_state {
    bool pending = false;             // forked and not yet joined
    bool captured = false;            // forked inside a stream capture (not real work until replayed)
    unsigned long long capture_id = 0;
    cudaStream_t stream = nullptr;    // the backup stream
  };
  mutable backup_state backup_{};     // mutable: const host-store readers wait for an eager backup
  dhisparse::detail::prefix_registry<sources> prefixes_;  // retained prefixes (docs/prefixes.md)
};

}  // namespace dhisparse::cuda

namespace dhisparse {
static_assert(FusedResolver<cuda::hierarchy<layouts::tiny, lru_hot_cache<16>>>);
}  // namespace dhisparse
