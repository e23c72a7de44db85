#pragma once
/// \file
/// The host reference hierarchy: the executable specification of dhisparse. It keeps, for every
/// admitted request and source, the complete history in a paged host store, a ring tail of the
/// newest T rows, a HotCache<B> and an optional-history map, and simulates each source's GPU
/// payload pool in host memory so that every returned location can be read back and checked.
/// The CUDA backend returns the same locations and leaves the same cache state on the same inputs.
///
/// Resolution of one selection (paper §3.2, Figure 2):
///  1. entries in the tail (the newest T rows) or in a ready optional page resolve directly;
///  2. the remaining distinct rows are looked up in the hot cache; rows found there are protected;
///  3. missing rows (ascending row index) take the least recently used unprotected slots and are
///     copied from the host store; locations are written in the selection's own order, -1 passes.
/// Every public call validates first and throws a typed error with the state unchanged.
///
/// Speculative verification (hierarchy_config::max_block = K_max > 1; docs/speculative.md):
/// `stage_block` writes a tentative block (anchor + proposals) into the tail ring past the
/// committed window, `verify` resolves K_r queries of one round against one retrieval union (hot
/// cache first, overflow into staging: per payload layer with `dedicated_staging`, or the shared
/// arenas of `staging_arenas<chi>`, held by the verified source until `release_staging`), `commit` publishes the anchor and the accepted
/// proposals into the host store and moves the frontier. With K_max = 1 nothing changes.
/// Packed sources (m = positions_per_row > 1) count the block in token positions: a stored row
/// joins the history only once its m positions are committed, the partially filled boundary row
/// stays in the tail ring, and a query may select a row only once all of its positions are visible
/// to that query (docs/speculative.md, "Packed rows").
///
/// Several GPUs of one host (docs/multi-gpu.md): hierarchies built over one `shared_host_store`,
/// one per tensor-parallel rank, keep one host copy of each request's history. Each rank keeps its
/// own hot cache, tail ring and optional history; history page p's host copy is written only by
/// rank p mod N; a rank reading a row from the host store before its owner wrote it gets
/// host_copy_pending (ranks step in lockstep, appending a step's rows before any resolve reads them).
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "../detail/history_books.hpp"
#include "../detail/lru_order.hpp"
#include "../detail/prefix_registry.hpp"
#include "../detail/request_registry.hpp"
#include "../detail/staging_blocks.hpp"
#include "../detail/staging_holder.hpp"
#include "../detail/validate.hpp"
#include "../hierarchy_types.hpp"
#include "../errors.hpp"
#include "../layout.hpp"
#include "../location_space.hpp"
#include "../policies/hot_cache.hpp"
#include "../policies/residency.hpp"
#include "../policies/staging_arena.hpp"
#include "../types.hpp"
#include "../resolver.hpp"
#include "host_store.hpp"
#include "shared_host_store.hpp"
#include "../detail/shared_rank.hpp"
#include "../layouts/tiny.hpp"

namespace dhisparse {

/// One request's part of a batched `append` (host backend; the twin of a `cuda::kv_write_view`
/// entry): `count` new rows laid out [payload layer][count][row_bytes], as the per-request append.
/// An entry of 0 rows is skipped, like a padding entry of the device view.
struct write_item {
  /// The admitted request the rows belong to.
  request_id request = 0;
  std::span<const std::byte> rows;  ///< count * payload_layers * row_bytes bytes
  std::size_t count = 0;            ///< new rows (decode: 1; a prefill chunk: more)
};

/// One request's part of a batched speculative `commit` (the twin of a `cuda::commit_view` entry):
/// the anchor and `accepted` proposals of its last verified round are committed.
struct commit_item {
  /// The admitted request whose verified round is committed.
  request_id request = 0;
  std::size_t accepted = 0;  ///< 0 <= accepted <= K_r - 1 of the last verify
};

/// One request's part of a batched `stage_blocks` (the twin of a `cuda::stage_view` entry): its
/// draft block of `count` positions, laid out as the per-request `stage_block` expects.
struct stage_item {
  /// The admitted request whose block is staged.
  request_id request = 0;
  std::span<const std::byte> rows;  ///< block_rows(request, source, count) * payload_layers * row_bytes bytes
  std::size_t count = 0;            ///< K_r positions: the anchor and count - 1 proposals, 1 .. max_block
};

/// Bytes a host hierarchy allocates (two-phase sizing, like cuda::hierarchy::requirements).
struct host_memory_requirements {
  std::size_t pool_bytes = 0;           ///< the simulated GPU pools of every payload layer
  std::size_t staging_arena_bytes = 0;  ///< shared staging arenas (staging_arenas<chi>; 0 otherwise)
  /// Alignment padding of the `staging_arenas<chi>` layout, which carves every pool and arena of
  /// payload-layer index l from one block (0 with dedicated staging).
  std::size_t staging_padding_bytes = 0;
  std::size_t host_store_bytes = 0;     ///< the paged host stores of every source
};

/// The host reference hierarchy of `Layout`: per-request histories, tail rings, hot caches and optional
/// pages for every source, with each source's GPU payload pool simulated in host memory (see the file comment).
template <KvLayout Layout, HotCachePolicy Hot = lru_hot_cache<4096>, ResidencyPolicy Residency = fixed_budget_policy,
          StagingArenaPolicy Staging = dedicated_staging>
class host_hierarchy {
  static_assert(check_layout<Layout>());
  static_assert(Layout::top_k <= Hot::rows,
                "dhisparse: HotCache<B> must hold at least top_k rows (B >= top_k) so one selection always fits");
  static_assert(!Staging::shared || Staging::arenas >= max_payload_layers_per_source<Layout>(),
                "dhisparse: staging_arenas<chi> needs chi >= the most payload layers of one source (a verify "
                "stages every payload layer of its source at once, layer l in arena l)");

 public:
  /// The KV layout.
  using layout = Layout;
  /// Element of a batched `resolve` call (host spans).
  using batch_item = resolve_item;
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

  /// Bytes the hierarchy allocates for `cfg`.
  static host_memory_requirements requirements(const hierarchy_config& cfg) {
    const hierarchy_config c = normalised(cfg);
    const location_space sp = make_space(c);
    host_memory_requirements r;
    for (const auto& d : Layout::sources) {
      r.pool_bytes += d.payload_layers * pool_rows_of(sp) * d.row_bytes;
      r.host_store_bytes += host_store::bytes_required(page_rows, d.payload_layers, d.row_bytes, c.host_pages);
    }
    if constexpr (Staging::shared) {
      r.staging_arena_bytes = Staging::arenas * arena_bytes(c);
      r.staging_padding_bytes = blocks_for(c).total_bytes - r.pool_bytes - r.staging_arena_bytes;
    }
    return r;
  }

  /// Bytes of the host store of `source` for `cfg` (`host_store::bytes_required` for host_pages
  /// pages): what the adopting constructor needs per source.
  static std::size_t host_store_bytes(const hierarchy_config& cfg, std::size_t source) {
    check_source(source);
    const hierarchy_config c = normalised(cfg);
    const auto& d = Layout::sources[source];
    return host_store::bytes_required(page_rows, d.payload_layers, d.row_bytes, c.host_pages);
  }
  /// Alignment an adopted host store needs (the CUDA backend's rule, kept here so both accept the same stores).
  static constexpr std::size_t host_store_alignment = 16;

  /// Allocates the simulated pools and host stores for `cfg`; throws invalid_configuration when `cfg` cannot work
  /// (max_requests, max_rows or max_block zero, max_block > max_rows, rows or locations past int32).
  explicit host_hierarchy(const hierarchy_config& cfg) : host_hierarchy(cfg, std::span<const std::span<std::byte>>{}, false) {}

  /// As above, but the host stores are caller memory, one span per source of at least
  /// `host_store_bytes(cfg, s)` bytes, `host_store_alignment`-aligned, outliving the hierarchy (the
  /// CUDA backend's adopting constructor, whose doc gives the page layout). The bytes are not
  /// interpreted: every store starts empty and rows enter through the history calls, which write
  /// them there. Throws size_mismatch (span count, a span too small) or invalid_configuration
  /// (misaligned) before anything is allocated.
  host_hierarchy(const hierarchy_config& cfg, std::span<const std::span<std::byte>> host_stores)
      : host_hierarchy(cfg, host_stores, true) {}

  /// Rank `rank` of the tensor-parallel hierarchies sharing `store` (docs/multi-gpu.md): the
  /// hierarchy allocates its own simulated pools (hot caches, tails, optional pages, staging) and
  /// keeps no host store of its own; its requests' histories live in `store`, one copy for every
  /// rank, and it writes the host copies of the history pages it owns (`store.owner(p) == rank`).
  /// `store` must outlive the hierarchy; the hierarchy's page holds and attachments end with it.
  /// `cfg.host_pages` is 0 or the store's `host_pages()`. Throws invalid_configuration (rank outside
  /// the store's ranks, a rank that already has a hierarchy, host_pages not the store's, or what the
  /// other constructors reject). A hierarchy of another layout does not compile.
  host_hierarchy(const hierarchy_config& cfg, shared_host_store<Layout>& store, std::size_t rank)
      : host_hierarchy(detail::shared_config(cfg, store.host_pages()), std::span<const std::span<std::byte>>{}, false, &store.books(),
                       rank) {}

  /// True when the hierarchy is a rank of a shared host store.
  [[nodiscard]] bool shares_host_store() const { return binding_.books() != nullptr; }
  /// Its rank on the shared host store (0 when it owns its stores).
  [[nodiscard]] std::size_t rank() const { return binding_.rank(); }

  /// The configuration in use, with defaults filled in (tail_rows, host_pages).
  [[nodiscard]] const hierarchy_config& config() const { return cfg_; }
  /// Location geometry of the payload pools shared by every source: hot-cache, tail and optional
  /// locations. Staging locations differ by source with `staging_arenas<chi>`: use `space(source)`.
  [[nodiscard]] const location_space& space() const { return space_; }
  /// Location geometry of `source`, staging locations included (`space()` plus the source's
  /// `staging_gap`, 0 with dedicated staging).
  [[nodiscard]] const location_space& space(std::size_t source) const {
    check_source(source);
    return src_[source].space;
  }
  /// Base of payload layer `layer` of `source` in the simulated GPU memory: every location the
  /// hierarchy returns for the source, staging locations included, holds its row at
  /// `pool(source, layer) + loc * row_bytes` (what a stock attention kernel reads, with no branch).
  /// Staging rows are meaningful only while the source holds the shared arenas.
  [[nodiscard]] const std::byte* pool(std::size_t source, std::size_t layer) const {
    check_layer(source, layer);
    return layer_base(source, layer);
  }
  /// True while `id` is admitted.
  [[nodiscard]] bool contains(request_id id) const { return registry_.contains(id); }
  /// Request slot of an admitted request; throws unknown_request otherwise.
  [[nodiscard]] std::size_t slot_of(request_id id) const { return registry_.slot(id); }
  /// Number of requests admitted now.
  [[nodiscard]] std::size_t admitted_count() const { return registry_.size(); }

  /// Admits a request with an empty history. Waits (returns not admitted) when no slot is free;
  /// throws duplicate_admission for an id that is already admitted.
  admission admit(request_id id) {
    if (binding_.books()) {  // attach to the request's history on the shared store
      const auto lock = binding_.lock();
      if (binding_.admission_waits(registry_, id)) return {};
      const std::size_t slot = *registry_.admit(id);
      binding_.attach(id, slot, sources, [this](std::size_t s) -> detail::history_books& { return src_[s].books; });
      return {true, slot};
    }
    auto slot = registry_.admit(id);
    if (!slot) return {};
    return {true, *slot};
  }

  /// Completes a request: its slot and its references on host and optional pages are released
  /// (pages that retained prefixes or other requests still hold stay).
  void complete(request_id id) {
    const auto lock = shared_lock();
    std::size_t slot = registry_.slot(id);
    for (std::size_t s = 0; s < sources; ++s) {
      auto& src = src_[s];
      src.books.release_slot(slot);
      std::erase_if(src.plan, [slot](const planned_copy& c) { return c.slot == slot; });  // its host pages are gone
      reset_hot(src.state[slot]);
    }
    binding_.detach(id);  // its pages were dropped above
    registry_.release(id);
  }

  // ------------------------------------------------------------------ shared prefixes (docs/prefixes.md)

  /// Retains the first `rows[s]` stored rows of a request's history on each source as prefix
  /// `prefix`, which later requests can be admitted on (`admit(id, prefix)`). The prefix takes a
  /// reference on the host pages holding those rows (nothing is copied); they stay allocated while
  /// the prefix or any request holds them. A partially filled last page is referenced too: its
  /// first rows never change (histories are append-only), and an admission copies them into a page
  /// of its own. The prefix becomes the most recently used; least recently used prefixes are
  /// evicted while the distinct pages held by prefixes would exceed `hierarchy_config::prefix_pages`
  /// on some source. Returns the evicted prefixes, least recently used first. Throws, state
  /// unchanged: unknown_request, duplicate_prefix, size_mismatch (`rows` not one entry per source),
  /// position_out_of_range (negative), position_beyond_frontier (past the stored rows),
  /// prefix_budget_exceeded (does not fit even with every other prefix evicted).
  std::vector<prefix_id> retain_prefix(prefix_id prefix, request_id id, std::span<const std::int64_t> rows) {
    check_prefixes_supported("retain_prefix");
    return prefixes_.retain_rows(prefix, id, registry_.slot(id), rows, books_of_source());
  }
  /// Retains a request's whole stored history on every source (`frontier(id, s)` rows each).
  std::vector<prefix_id> retain_prefix(prefix_id prefix, request_id id) {
    check_prefixes_supported("retain_prefix");
    return prefixes_.retain_stored(prefix, id, registry_.slot(id), books_of_source());
  }

  /// Admits a request whose history starts with retained prefix `prefix`: on each source it shares
  /// the prefix's complete host pages (reference-counted, never copied), copies the prefix's rows
  /// of a partially filled last page into a host page of its own (the only copy; the request's rows
  /// follow them there), and fills its tail ring with the prefix's newest rows; its hot cache starts
  /// empty. Its frontier is then the prefix's rows and its own rows are appended after them. The
  /// prefix becomes the most recently used. Waits (returns not admitted, nothing changed) when no
  /// slot is free or a boundary copy finds no free host page. Throws duplicate_admission, unknown_prefix.
  admission admit(request_id id, prefix_id prefix) {
    check_prefixes_supported("admit on a prefix");
    if (registry_.contains(id)) throw duplicate_admission("request " + std::to_string(id) + " is already admitted");
    const auto& e = prefixes_.find(prefix);
    if (registry_.size() >= registry_.capacity()) return {};
    for (std::size_t s = 0; s < sources; ++s)
      if (src_[s].books.pages_to_share(e.rows[s]) > src_[s].books.free_host_pages()) return {};
    const std::size_t slot = *registry_.admit(id);
    for (std::size_t s = 0; s < sources; ++s) {
      const auto& d = Layout::sources[s];
      auto& books = src_[s].books;
      const std::int64_t rows = e.rows[s];
      const page_id boundary = books.share_history(slot, e.pages[s], rows);
      if (boundary != no_page) {  // copy the prefix's rows of its partial last page
        const page_id from = e.pages[s].back();
        for (std::size_t l = 0; l < d.payload_layers; ++l)
          for (std::int64_t r = rows / static_cast<std::int64_t>(page_rows) * static_cast<std::int64_t>(page_rows);
               r < rows; ++r)
            std::memcpy(books.store().row(boundary, l, r).data(), books.store().row(from, l, r).data(), d.row_bytes);
      }
      for (std::int64_t r = std::max<std::int64_t>(0, rows - static_cast<std::int64_t>(cfg_.tail_rows)); r < rows; ++r)
        for (std::size_t l = 0; l < d.payload_layers; ++l)
          std::memcpy(pool_row(s, l, space_.tail(slot, r)), books.store().row(books.host_page_of(slot, r), l, r).data(),
                      d.row_bytes);
    }
    prefixes_.touch(prefix);
    return {true, slot};
  }

  /// Drops a retained prefix: its references on host pages go (pages no request holds are freed);
  /// requests admitted on it keep theirs. Throws unknown_prefix (never retained, released or
  /// evicted), state unchanged.
  void release_prefix(prefix_id prefix) { prefixes_.release(prefix, books_of_source()); }
  /// True while `prefix` is retained.
  [[nodiscard]] bool contains_prefix(prefix_id prefix) const { return prefixes_.contains(prefix); }
  /// Rows prefix `prefix` retains on a source; throws unknown_prefix.
  [[nodiscard]] std::int64_t prefix_rows(prefix_id prefix, std::size_t source) const {
    check_source(source);
    return prefixes_.find(prefix).rows[source];
  }
  /// Host-store pages holding prefix `prefix`'s rows on a source, in history order (the last may be
  /// partially filled); throws unknown_prefix.
  [[nodiscard]] std::span<const page_id> prefix_host_pages(prefix_id prefix, std::size_t source) const {
    check_source(source);
    return prefixes_.find(prefix).pages[source];
  }
  /// Retained prefixes, least recently used (the next evicted) first.
  [[nodiscard]] std::vector<prefix_id> retained_prefixes() const { return prefixes_.lru(); }
  /// Distinct host pages retained prefixes hold on a source (at most `config().prefix_pages`).
  [[nodiscard]] std::size_t prefix_pages_held(std::size_t source) const {
    check_source(source);
    return prefixes_.held_pages(source);
  }
  /// Host-store page of each history page of a request/source (no_page where none is allocated).
  [[nodiscard]] std::span<const page_id> host_pages_of(request_id id, std::size_t source) const {
    check_source(source);
    return src_[source].books.slot(registry_.slot(id)).host_pages;
  }
  /// Holders (requests and retained prefixes) of host page `page` of a source; 0 when it is free.
  [[nodiscard]] std::uint32_t host_page_refs(std::size_t source, page_id page) const {
    check_host_page(source, page);
    return src_[source].books.page_refs(page);
  }
  /// Retained prefixes holding host page `page` of a source.
  [[nodiscard]] std::uint32_t host_page_prefix_refs(std::size_t source, page_id page) const {
    check_host_page(source, page);
    return prefixes_.page_holders(source, page);
  }
  /// Optional pool page serving host page `page` of a source (shared by every request that maps
  /// it), -1 when none.
  [[nodiscard]] std::int32_t optional_page_of_host(std::size_t source, page_id page) const {
    check_host_page(source, page);
    return src_[source].books.optional_of_host(page);
  }
  /// Requests mapping optional pool page `page` of a source; 0 when it is free.
  [[nodiscard]] std::uint32_t optional_page_refs(std::size_t source, std::int32_t page) const {
    check_source(source);
    if (page < 0 || static_cast<std::size_t>(page) >= cfg_.optional_pages)
      throw position_out_of_range("optional page " + std::to_string(page) + " outside the pool's " +
                                  std::to_string(cfg_.optional_pages));
    return src_[source].books.optional_refs(page);
  }

  /// Number of stored rows of a request's history for a source.
  [[nodiscard]] std::int64_t frontier(request_id id, std::size_t source) const {
    check_source(source);
    return src_[source].books.slot(registry_.slot(id)).frontier;
  }

  /// Committed token positions n of a request's history for a source: frontier · m plus the
  /// positions of the partially filled boundary row that speculative commits left in the tail
  /// (always frontier for m = 1).
  [[nodiscard]] std::int64_t positions(request_id id, std::size_t source) const {
    check_source(source);
    const std::size_t slot = registry_.slot(id);
    return committed_positions(source, slot);
  }

  /// Appends `count` complete rows to a request's history for one source. `rows` holds, for each
  /// payload layer of the source in order, `count` rows of `row_bytes` each. The rows enter the
  /// host store (their recovery copy) and the tail. On a packed source the first appended row is the
  /// boundary row, so positions a speculative commit left partially filled are covered by it.
  void append(request_id id, std::size_t source, std::span<const std::byte> rows, std::size_t count) {
    check_source(source);
    const auto lock = shared_lock();
    const std::size_t slot = registry_.slot(id);
    const auto& d = Layout::sources[source];
    auto& src = src_[source];
    src.books.check_append(id, source, slot, count);  // capacity and host pages, before any size math
    if (rows.size() != count * d.payload_layers * d.row_bytes)  // count <= max_rows: no overflow
      throw size_mismatch("append of request " + std::to_string(id) + " to source " + std::to_string(source) + " got " +
                          std::to_string(rows.size()) + " bytes for " + std::to_string(count) + " rows, expected " +
                          std::to_string(count * d.payload_layers * d.row_bytes));
    append_reserved(source, slot, rows, count);
  }

 private:
  /// The bytes and books of an append whose checks passed (host pages allocated beyond the
  /// reservation, if any).
  void append_reserved(std::size_t source, std::size_t slot, std::span<const std::byte> rows, std::size_t count) {
    const auto& d = Layout::sources[source];
    auto& src = src_[source];
    const auto a = src.books.commit_append(slot, count);
    close_round(src.state[slot]);  // the history moved on: a staged block is superseded
    src.state[slot].partial = 0;   // complete rows only: no boundary row is left partially filled
    for (std::int64_t r = a.first_row; r < a.last_row; ++r) {
      const bool host = src.books.writes_host_copy(r);  // on a shared store: owned pages only
      for (std::size_t l = 0; l < d.payload_layers; ++l) {
        const std::byte* in = rows.data() + (l * count + static_cast<std::size_t>(r - a.first_row)) * d.row_bytes;
        if (host) std::memcpy(src.books.store().row(src.books.host_page_of(slot, r), l, r).data(), in, d.row_bytes);
        if (r >= a.last_row - static_cast<std::int64_t>(cfg_.tail_rows))
          std::memcpy(pool_row(source, l, space_.tail(slot, r)), in, d.row_bytes);
      }
    }
    src.books.wrote_host_copies(slot, a.first_row, a.last_row);  // shared store: the owned rows
  }
  /// The shared store's lock for a call that touches its books (an empty lock without one).
  [[nodiscard]] std::unique_lock<detail::region_mutex> shared_lock() const { return binding_.lock(); }
  /// Shared host store: every selected row a call may read from the host store (outside the tail
  /// window, in no ready optional page) must have its host copy. A row without one is in no hot
  /// cache either (hot rows came from the host store), so this refuses exactly the reads that would
  /// find no copy.
  void check_host_copies(std::size_t source, std::size_t slot, request_id id, std::span<const row_index> rows,
                         std::int64_t tail_begin, const char* call) const {
    if (!binding_.books()) return;
    const auto& books = src_[source].books.slot(slot);
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const row_index e = rows[i];
      if (e == no_row || e >= tail_begin || books.optional_page[page_of(e)] >= 0) continue;
      if (!binding_.books()->has_copy(source, id, e))
        throw host_copy_pending(std::string(call) + " of request " + std::to_string(id) + " on source " +
                                std::to_string(source) + " by rank " + std::to_string(binding_.rank()) + ": entry " +
                                std::to_string(i) + " selects row " + std::to_string(e) +
                                ", outside the rank's tail, whose host copy rank " +
                                std::to_string(binding_.books()->owner(page_of(e))) +
                                " (its page's owner) has not written yet (ranks append a step's rows before "
                                "any rank reads them)");
    }
  }
  void check_prefixes_supported(const char* call) const {
    binding_.refuse(call, "shared prefixes are");
  }

 public:

  // ------------------------------------------------------------------ batched writes (engine step)

  /// Reserves host-store pages for a request/source ahead of its writes: afterwards pages cover
  /// rows [0, min(max_rows, frontier + rows_ahead)), so batched appends and commits of that many rows
  /// allocate nothing. All or nothing: throws host_pool_exhausted with nothing reserved. Pages
  /// already held count; reserving less than is held releases nothing.
  void reserve_rows(request_id id, std::size_t source, std::size_t rows_ahead) {
    check_source(source);
    const std::size_t slot = registry_.slot(id);
    const auto lock = shared_lock();
    auto& books = src_[source].books;
    books.check_reserve(id, source, books.fresh_pages_to_reserve(slot, rows_ahead));
    books.reserve(slot, rows_ahead);
  }
  /// `reserve_rows(id, s, rows_ahead)` for every admitted request and every source, all or nothing:
  /// throws host_pool_exhausted (naming the first source short of pages) with nothing reserved.
  /// What an engine calls outside its step graph every few steps.
  void reserve_ahead(std::size_t rows_ahead) {
    const auto lock = shared_lock();
    const auto slots = registry_.admitted();
    for (std::size_t s = 0; s < sources; ++s) {
      std::size_t pages = 0;
      for (const auto& [id, slot] : slots) pages += src_[s].books.fresh_pages_to_reserve(slot, rows_ahead);
      if (pages > src_[s].books.free_host_pages())
        throw host_pool_exhausted("reserve_ahead of " + std::to_string(rows_ahead) + " rows needs " +
                                  std::to_string(pages) + " host pages on source " + std::to_string(s) + ", " +
                                  std::to_string(src_[s].books.free_host_pages()) + " free");
    }
    for (std::size_t s = 0; s < sources; ++s)
      for (const auto& [id, slot] : slots) src_[s].books.reserve(slot, rows_ahead);
  }
  /// Rows of a request/source that have host pages (stored or reserved): a batched write or commit
  /// may move the frontier up to here.
  [[nodiscard]] std::int64_t reserved_rows(request_id id, std::size_t source) const {
    check_source(source);
    return src_[source].books.reserved_rows(registry_.slot(id));
  }

  /// Appends the new rows of a batch of requests to one source (one step's KV writes), within
  /// their reservations: the batch equals a per-request `append` of each item in order, but
  /// allocates nothing. The whole batch is validated first (unknown request, the same request
  /// twice, byte count, rows past max_rows or past the reserved rows: capacity_exceeded) and
  /// nothing changes on an error. Items of 0 rows are skipped.
  void append(std::size_t source, std::span<const write_item> batch) {
    check_source(source);
    const auto lock = shared_lock();
    const auto slots = batch_slots(batch, "append", [&](std::size_t slot, const write_item& item) {
      check_reserved_write("append", item.request, source, slot, item.count, item.rows.size());
    });
    for (std::size_t b = 0; b < batch.size(); ++b)
      if (batch[b].count > 0) append_reserved(source, slots[b], batch[b].rows, batch[b].count);
  }

  /// Commits the verified rounds of a batch of requests on one source: equals a per-request
  /// `commit` of each item in order, within the reservations (nothing is allocated). The whole batch
  /// is validated first (unknown request, the same request twice, commit_without_verify,
  /// acceptance_beyond_block, completed rows past the reserved rows: capacity_exceeded).
  void commit(std::size_t source, std::span<const commit_item> batch) {
    check_speculative(source);
    const auto lock = shared_lock();
    const auto slots = batch_slots(batch, "commit", [&](std::size_t slot, const commit_item& item) {
      check_reserved_commit("commit", item.request, source, slot, item.accepted);
    });
    for (std::size_t b = 0; b < batch.size(); ++b) commit_checked(source, slots[b], batch[b].accepted);
  }

  /// Appends the new rows of a whole step: every item is one (request, source), any sources in
  /// any order. Equals the per-source batched `append` of each source's items, within the
  /// reservations (nothing is allocated), and the executable spec of `cuda::hierarchy::append_step`.
  /// All or nothing: every item is validated first (invalid_source, unknown_request, the same
  /// (request, source) twice: duplicate_in_batch, rows past the reserved rows: capacity_exceeded,
  /// byte count: size_mismatch), and on an error nothing changes. The host store is written at
  /// once (the host backend has no backup to join).
  void append_step(std::span<const step_write_item> batch) {
    const auto lock = shared_lock();
    const auto slots = step_slots(batch, "append_step", [&](std::size_t slot, const step_write_item& item) {
      check_reserved_write("append_step", item.request, item.source, slot, item.count, item.rows.size());
    });
    for (std::size_t b = 0; b < batch.size(); ++b)
      if (batch[b].count > 0) append_reserved(batch[b].source, slots[b], batch[b].rows, batch[b].count);
  }

  /// Commits the verified rounds of a whole step: every item is one (request, source). Equals the
  /// per-source batched `commit` of each source's items (the executable spec of
  /// `cuda::hierarchy::commit_step`). All or nothing: every item is validated first
  /// (invalid_configuration without speculation, invalid_source, unknown_request, the same
  /// (request, source) twice: duplicate_in_batch, commit_without_verify, acceptance_beyond_block,
  /// completed rows past the reserved rows: capacity_exceeded), and on an error nothing changes.
  void commit_step(std::span<const step_commit_item> batch) {
    if (cfg_.max_block < 2) check_speculative(0);
    const auto lock = shared_lock();
    const auto slots = step_slots(batch, "commit_step", [&](std::size_t slot, const step_commit_item& item) {
      check_reserved_commit("commit_step", item.request, item.source, slot, item.accepted);
    });
    for (std::size_t b = 0; b < batch.size(); ++b) commit_checked(batch[b].source, slots[b], batch[b].accepted);
  }

  /// The CUDA backend's `join_backup`: the host backend writes every host copy at once, so there is
  /// never a backup to join (nothing happens). Lets a `step_handle` drive either backend.
  void join_backup() const noexcept {}
  /// Always false on the host backend (see `join_backup`).
  [[nodiscard]] bool backup_pending() const noexcept { return false; }

  /// Resolves one request's selection on a source; see the file comment. Returns where entries came from.
  resolve_stats resolve(request_id id, std::size_t source, std::span<const row_index> selection,
                        std::span<location> locations, copy_layers mode = copy_layers::all) {
    resolve_item item{id, selection, locations};
    return resolve(source, std::span<const resolve_item>(&item, 1), mode);
  }

  /// Resolves a batch of requests on one source (one step of one resolving consumer). The whole
  /// batch is validated before any state changes.
  resolve_stats resolve(std::size_t source, std::span<const resolve_item> batch, copy_layers mode = copy_layers::all) {
    check_source(source);
    const auto lock = shared_lock();
    auto& src = src_[source];
    check_followers_copied(source, "resolved again");
    const auto slots = batch_slots(batch, "resolve", [&](std::size_t slot, const resolve_item& item) {
      if (item.locations.size() != item.selection.size())
        throw size_mismatch("request " + std::to_string(item.request) + ": " + std::to_string(item.locations.size()) +
                            " location entries for a selection of " + std::to_string(item.selection.size()));
      detail::validate_selection(item.selection, top_k, src.books.slot(slot).frontier,
                                 static_cast<std::int64_t>(cfg_.max_rows), item.request, source);
      check_host_copies(source, slot, item.request, item.selection,
                        src.books.slot(slot).frontier - static_cast<std::int64_t>(cfg_.tail_rows), "resolve");
    });
    src.plan.clear();
    resolve_stats total;
    for (std::size_t b = 0; b < batch.size(); ++b)
      total += resolve_one(source, slots[b], batch[b].selection, batch[b].locations, mode);
    if (mode == copy_layers::producer_only)
      for (std::size_t l = 1; l < src.layer_pending.size(); ++l) src.layer_pending[l] = true;
    return total;
  }

  /// Stages the target's KV of a speculative block: token positions n .. n+count-1 (the anchor and
  /// count-1 proposals, n = `positions()`). The block covers stored rows frontier ..
  /// frontier+block_rows(id, source, count)-1 (for m = 1: one row per position), laid out
  /// `[payload layer][rows][row_bytes]` like `append`; on a packed source the first row is the
  /// boundary row, re-supplied whole (its committed positions plus the block's). The rows enter the
  /// tail ring only (not the host store; the frontier stays). Replaces an unverified or uncommitted
  /// previous block of the request/source. 1 <= count <= max_block.
  void stage_block(request_id id, std::size_t source, std::span<const std::byte> rows, std::size_t count) {
    check_speculative(source);
    const std::size_t slot = registry_.slot(id);
    check_stage(id, source, slot, rows, count);
    stage_checked(source, slot, rows, count);
  }

  /// Stages the draft blocks of a batch of requests on one source (one speculative round): equals
  /// a per-request `stage_block` of each item in order (the executable spec of
  /// `cuda::hierarchy::stage_blocks`). All or nothing: every item is validated first (unknown
  /// request, the same request twice: duplicate_in_batch, then the per-request checks: size_mismatch,
  /// block_too_wide, capacity_exceeded) and on an error nothing changes.
  void stage_blocks(std::size_t source, std::span<const stage_item> batch) {
    check_speculative(source);
    const auto slots = batch_slots(batch, "stage_blocks", [&](std::size_t slot, const stage_item& item) {
      check_stage(item.request, source, slot, item.rows, item.count);
    });
    for (std::size_t b = 0; b < batch.size(); ++b) stage_checked(source, slots[b], batch[b].rows, batch[b].count);
  }

  /// Stages the draft blocks of a whole round: every item is one (request, source). Equals the
  /// per-source `stage_blocks` of each source's items (the executable spec of
  /// `cuda::hierarchy::stage_step`). All or nothing: every item is validated first
  /// (invalid_configuration without speculation, invalid_source, unknown_request, the same
  /// (request, source) twice: duplicate_in_batch, then the per-request checks) and on an error
  /// nothing changes.
  void stage_step(std::span<const step_stage_item> batch) {
    if (cfg_.max_block < 2) check_speculative(0);
    const auto slots = step_slots(batch, "stage_step", [&](std::size_t slot, const step_stage_item& item) {
      check_stage(item.request, item.source, slot, item.rows, item.count);
    });
    for (std::size_t b = 0; b < batch.size(); ++b)
      stage_checked(batch[b].source, slots[b], batch[b].rows, batch[b].count);
  }

 private:
  /// The checks of `stage_block` after the slot's (speculative source, known request).
  void check_stage(request_id id, std::size_t source, std::size_t slot, std::span<const std::byte> rows,
                   std::size_t count) const {
    const auto& d = Layout::sources[source];
    const std::int64_t n = committed_positions(source, slot);
    const auto m = static_cast<std::int64_t>(d.positions_per_row);
    detail::validate_block(count, cfg_.max_block, n, m, cfg_.max_rows, id, source);
    const std::size_t nrows = rows_of_block(source, slot, count);
    if (rows.size() != nrows * d.payload_layers * d.row_bytes)
      throw size_mismatch("stage_block of request " + std::to_string(id) + " on source " + std::to_string(source) +
                          " got " + std::to_string(rows.size()) + " bytes for " + std::to_string(count) +
                          " positions in " + std::to_string(nrows) + " rows, expected " +
                          std::to_string(nrows * d.payload_layers * d.row_bytes));
  }
  /// The bytes and books of a stage whose checks passed.
  void stage_checked(std::size_t source, std::size_t slot, std::span<const std::byte> rows, std::size_t count) {
    const auto& d = Layout::sources[source];
    auto& src = src_[source];
    const std::int64_t f = src.books.slot(slot).frontier;
    const std::size_t nrows = rows_of_block(source, slot, count);
    // The committed window (rows >= f - T) and the block rows f .. f+nrows-1 (nrows <= count <=
    // K_max) span at most T + K_max consecutive rows: they never share a ring row.
    for (std::size_t i = 0; i < nrows; ++i)
      for (std::size_t l = 0; l < d.payload_layers; ++l)
        std::memcpy(pool_row(source, l, space_.tail(slot, f + static_cast<std::int64_t>(i))),
                    rows.data() + (l * nrows + i) * d.row_bytes, d.row_bytes);
    auto& st = src.state[slot];
    st.staged = count;
    st.verified = 0;
  }

 public:

  /// Verifies one speculative round of a batch of requests on one source; see the file comment and
  /// docs/speculative.md. The whole batch is validated before any state changes.
  verify_stats verify(std::size_t source, std::span<const verify_item> batch, copy_layers mode = copy_layers::all) {
    check_speculative(source);
    const auto lock = shared_lock();
    auto& src = src_[source];
    check_followers_copied(source, "verified");
    staging_.check_verify(source);
    const auto slots = batch_slots(batch, "verify", [&](std::size_t slot, const verify_item& item) {
      validate_round(source, slot, item);
      const std::int64_t tail_begin = src.books.slot(slot).frontier - static_cast<std::int64_t>(cfg_.tail_rows);
      for (const auto q : item.queries) check_host_copies(source, slot, item.request, q, tail_begin, "verify");
    });
    staging_.acquire(source);
    src.plan.clear();
    verify_stats total;
    for (std::size_t b = 0; b < batch.size(); ++b) {
      total += verify_one(source, slots[b], batch[b], mode);
      src.state[slots[b]].verified = batch[b].queries.size();
    }
    if (mode == copy_layers::producer_only)
      for (std::size_t l = 1; l < src.layer_pending.size(); ++l) src.layer_pending[l] = true;
    return total;
  }

  /// Verifies one request's round; see the batched overload.
  verify_stats verify(request_id id, std::size_t source, std::span<const std::span<const row_index>> queries,
                      std::span<const std::span<location>> locations, copy_layers mode = copy_layers::all) {
    verify_item item{id, queries, locations};
    return verify(source, std::span<const verify_item>(&item, 1), mode);
  }

  /// Commits a verified round: the anchor and `accepted` proposals (positions n .. n+accepted)
  /// become committed, n' = n + accepted + 1. The rows they complete (for m = 1: one per position)
  /// enter the host store from the tail ring and the frontier moves to n' / m; a partially filled
  /// boundary row stays in the tail ring only; the rest of the block is discarded.
  /// 0 <= accepted <= K_r - 1 of the last verify.
  void commit(request_id id, std::size_t source, std::size_t accepted) {
    check_speculative(source);
    const auto lock = shared_lock();
    const std::size_t slot = registry_.slot(id);
    check_commit(id, source, slot, accepted);
    const std::int64_t f = src_[source].books.slot(slot).frontier;
    src_[source].books.check_append(id, source, slot, static_cast<std::size_t>(committed_rows_after(source, slot, accepted) - f));
    commit_checked(source, slot, accepted);
  }

 private:
  /// Throws commit_without_verify / acceptance_beyond_block for a commit of `accepted` proposals.
  void check_commit(request_id id, std::size_t source, std::size_t slot, std::size_t accepted) const {
    const auto& st = src_[source].state[slot];
    if (st.staged == 0 || st.verified == 0)
      throw commit_without_verify("commit of request " + std::to_string(id) + " on source " + std::to_string(source) +
                                  " without a verify since its last stage_block");
    if (accepted >= st.verified)
      throw acceptance_beyond_block("commit of request " + std::to_string(id) + " on source " +
                                    std::to_string(source) + " accepts " + std::to_string(accepted) +
                                    " proposals, the verified round had " + std::to_string(st.verified - 1));
  }
  /// Frontier after committing `accepted` proposals of a checked round: n' / m.
  [[nodiscard]] std::int64_t committed_rows_after(std::size_t source, std::size_t slot, std::size_t accepted) const {
    const auto m = static_cast<std::int64_t>(Layout::sources[source].positions_per_row);
    return (committed_positions(source, slot) + static_cast<std::int64_t>(accepted) + 1) / m;
  }
  /// The bytes and books of a commit whose checks passed.
  void commit_checked(std::size_t source, std::size_t slot, std::size_t accepted) {
    const auto& d = Layout::sources[source];
    auto& src = src_[source];
    auto& st = src.state[slot];
    const auto m = static_cast<std::int64_t>(d.positions_per_row);
    const std::int64_t n_next = committed_positions(source, slot) + static_cast<std::int64_t>(accepted) + 1;
    const std::int64_t f = src.books.slot(slot).frontier;
    const auto completed = static_cast<std::size_t>(n_next / m - f);  // 0 while the boundary row stays partial
    const auto a = src.books.commit_append(slot, completed);
    for (std::int64_t r = a.first_row; r < a.last_row; ++r) {
      if (!src.books.writes_host_copy(r)) continue;  // another rank owns the row's page
      for (std::size_t l = 0; l < d.payload_layers; ++l)
        std::memcpy(src.books.store().row(src.books.host_page_of(slot, r), l, r).data(),
                    pool_row(source, l, space_.tail(slot, r)), d.row_bytes);
    }
    src.books.wrote_host_copies(slot, a.first_row, a.last_row);  // shared store: the owned rows
    st.partial = static_cast<std::size_t>(n_next % m);
    close_round(st);
  }

 public:

  /// Stored rows a block of `count` positions covers on a request/source (the boundary row and the
  /// rows it starts): what `stage_block` expects. For m = 1 this is `count`.
  [[nodiscard]] std::size_t block_rows(request_id id, std::size_t source, std::size_t count) const {
    check_source(source);
    return rows_of_block(source, registry_.slot(id), count);
  }

  /// Positions of the request/source's staged block (0: none), and K_r of its last verify (0: none since staging).
  [[nodiscard]] std::size_t staged_rows(request_id id, std::size_t source) const {
    check_source(source);
    return src_[source].state[registry_.slot(id)].staged;
  }
  /// K_r of the request/source's last verify since its block was staged (0: none).
  [[nodiscard]] std::size_t verified_queries(request_id id, std::size_t source) const {
    check_source(source);
    return src_[source].state[registry_.slot(id)].verified;
  }

  /// Replays the last resolve's host copies of `source` into follower payload `layer` (layer-wise
  /// prefetch: the follower keeps its own bytes at the producer's locations). Returns bytes copied.
  std::size_t copy_follower(std::size_t source, std::size_t layer) {
    check_source(source);
    auto& src = src_[source];
    if (layer == 0 || layer >= src.layer_pending.size())
      throw invalid_source("payload layer " + std::to_string(layer) + " is not a follower of source " +
                           std::to_string(source));
    if (!src.layer_pending[layer]) return 0;  // nothing planned, or already copied
    const auto& d = Layout::sources[source];
    for (const auto& c : src.plan)
      std::memcpy(pool_row(source, layer, c.dst), src.books.store().row(src.books.host_page_of(c.slot, c.row), layer, c.row).data(),
                  d.row_bytes);
    src.layer_pending[layer] = false;
    return src.plan.size() * d.row_bytes;
  }

  /// Releases the shared staging arenas held by `source` (`staging_arenas<chi>`): the engine says
  /// that every attention consumer of its last verify has finished, so the next source's verify may
  /// overwrite the arenas. Its staging locations are invalid afterwards; rows the round admitted to
  /// the hot cache were written at their stable hot-cache addresses by the verify itself, so no
  /// copy-back is needed (docs/speculative.md, "Shared staging arenas"). Throws staging_not_held if
  /// `source` does not hold them, pending_follower_copies before its followers replayed the plan.
  /// With `dedicated_staging` it only checks `source`.
  void release_staging(std::size_t source) {
    check_source(source);
    if constexpr (Staging::shared) {
      staging_.check_release(source);
      check_followers_copied(source, "released its staging");
      staging_.release();
    }
  }
  /// Source holding the shared staging arenas, if any (always none with dedicated staging).
  [[nodiscard]] std::optional<std::size_t> staging_holder() const { return staging_.holder(); }
  /// Bytes of every payload layer's pool (dedicated staging rows included; shared arenas: `staging_arena_bytes`).
  [[nodiscard]] std::size_t pool_bytes() const {
    std::size_t n = 0;
    for (const auto& d : Layout::sources) n += d.payload_layers * pool_rows_of(space_) * d.row_bytes;
    return n;
  }
  /// Bytes of the shared staging arenas (0 with dedicated staging or without speculation).
  [[nodiscard]] std::size_t staging_arena_bytes() const { return Staging::shared ? Staging::arenas * arena_bytes(cfg_) : 0; }
  /// Alignment padding of the shared-arena layout (`requirements().staging_padding_bytes`; 0 with dedicated staging).
  [[nodiscard]] std::size_t staging_padding_bytes() const {
    return Staging::shared ? blocks_.size() - pool_bytes() - staging_arena_bytes() : 0;
  }
  /// Bytes of the paged host stores of every source (what `requirements().host_store_bytes` announced).
  /// On a shared host store: 0 (the store holds them).
  [[nodiscard]] std::size_t host_store_bytes() const {
    std::size_t n = 0;
    for (const auto& src : src_) n += src.host_bytes.size();
    return n;
  }
  /// Bytes of host-store pages allocated now, every source: this hierarchy's requests' histories,
  /// or on a shared host store every rank's (`shared_host_store::host_bytes_in_use`).
  [[nodiscard]] std::size_t host_bytes_in_use() const {
    const auto lock = shared_lock();
    std::size_t n = 0;
    for (std::size_t s = 0; s < sources; ++s) {
      const auto& st = src_[s].books.store();
      n += (st.total_pages() - src_[s].books.free_host_pages()) * st.page_bytes();
    }
    return n;
  }

  /// Copies of the last resolve on a source, in the order they were made.
  [[nodiscard]] std::span<const planned_copy> last_plan(std::size_t source) const {
    check_source(source);
    return src_[source].plan;
  }

  /// Makes page `page` of a request's history ready in the optional-history map: takes a free
  /// optional page of the pool, copies the page's rows from the host store, then publishes it.
  /// Only complete pages qualify. Returns false (a wait) when no optional page is free.
  bool map_optional_page(request_id id, std::size_t source, std::size_t page) {
    check_source(source);
    const auto lock = shared_lock();
    const std::size_t slot = registry_.slot(id);
    auto& src = src_[source];
    binding_.check_page_copied(src.books, slot, id, source, page);
    const auto taken = src.books.take_optional(id, source, slot, page);
    if (!taken) return false;
    const auto [g, fresh] = *taken;
    if (!fresh) return true;
    const auto& d = Layout::sources[source];
    for (std::size_t l = 0; l < d.payload_layers; ++l)
      for (std::size_t i = 0; i < page_rows; ++i) {
        const auto r = static_cast<std::int64_t>(page * page_rows + i);
        std::memcpy(pool_row(source, l, space_.optional(static_cast<std::size_t>(g), r)),
                    src.books.store().row(src.books.host_page_of(slot, r), l, r).data(), d.row_bytes);
      }
    return true;  // the host backend copies synchronously: published once the call returns
  }

  /// Retires an optional page (its rows keep their host copy); the pool page becomes free.
  void unmap_optional_page(request_id id, std::size_t source, std::size_t page) {
    check_source(source);
    auto& src = src_[source];
    src.books.release_optional(id, registry_.slot(id), page);
  }

  /// Free optional pages of a source's pool.
  [[nodiscard]] std::size_t free_optional_pages(std::size_t source) const {
    check_source(source);
    return src_[source].books.free_optional_pages();
  }
  /// Free host-store pages of a source.
  [[nodiscard]] std::size_t free_host_pages(std::size_t source) const {
    check_source(source);
    const auto lock = shared_lock();
    return src_[source].books.free_host_pages();
  }

  /// Bytes attention reads at `loc` of a source's payload layer (the simulated GPU pool).
  [[nodiscard]] std::span<const std::byte> payload(std::size_t source, std::size_t layer, location loc) const {
    check_layer(source, layer);
    const location_space& sp = src_[source].space;
    if (!sp.valid(loc))
      throw position_out_of_range("location " + std::to_string(loc) + " outside the pool's " +
                                  std::to_string(sp.pool_rows()) + " rows and staging locations [" +
                                  std::to_string(sp.staging_begin()) + ", " + std::to_string(sp.rows()) + ")");
    const auto& d = Layout::sources[source];
    if (Staging::shared && static_cast<std::size_t>(loc) >= sp.staging_begin()) staging_.check_read(source);
    return {layer_base(source, layer) + static_cast<std::size_t>(loc) * d.row_bytes, d.row_bytes};
  }
  /// The host copy of a row (what recovery reads).
  [[nodiscard]] std::span<const std::byte> host_row(request_id id, std::size_t source, std::size_t layer,
                                                    row_index row) const {
    check_layer(source, layer);
    const auto lock = shared_lock();
    const std::size_t slot = registry_.slot(id);
    const auto bytes = src_[source].books.host_row(slot, layer, row);  // position_beyond_frontier first
    binding_.check_host_row("host_row", id, source, row, page_rows);
    return bytes;
  }

  /// Hot-cache contents of a request/source: row held by each slot, -1 when empty.
  [[nodiscard]] std::span<const row_index> hot_rows_of(request_id id, std::size_t source) const {
    check_source(source);
    return src_[source].state[registry_.slot(id)].hot_row;
  }
  /// LRU order of a request/source's hot-cache slots, least recently used first.
  [[nodiscard]] std::span<const order_index> lru_order_of(request_id id, std::size_t source) const {
    check_source(source);
    return src_[source].state[registry_.slot(id)].order;
  }
  /// Optional-history map of a request/source: pool page of each history page, -1 when not ready.
  [[nodiscard]] std::span<const std::int32_t> optional_map_of(request_id id, std::size_t source) const {
    check_source(source);
    return src_[source].books.slot(registry_.slot(id)).optional_page;
  }

 private:
  struct slot_state {
    std::vector<row_index> hot_row;          // B: row held by each hot slot, -1 if empty
    std::vector<order_index> order;          // B: slots, least recently used first
    std::size_t staged = 0;                  // positions of the staged speculative block, 0 if none
    std::size_t partial = 0;                 // committed positions of the boundary row (< m; 0 for m = 1)
    std::size_t verified = 0;                // K_r of the last verify since staging, 0 if none
  };
  struct source_data {
    std::vector<std::byte> host_bytes;
    detail::history_books books;                // frontier, host pages and optional pages of every slot
    std::vector<std::vector<std::byte>> pool;  // dedicated staging: per payload layer, the simulated GPU pool
    std::vector<std::size_t> block_offset;     // staging_arenas<chi>: per payload layer, its pool's offset in blocks_
    location_space space{};                    // the hierarchy's space with this source's staging gap
    std::vector<bool> layer_pending;
    std::vector<slot_state> state;             // per request slot
    std::vector<planned_copy> plan;            // host copies of the last resolve
  };

  static hierarchy_config normalised(hierarchy_config c) {
    if (c.max_requests == 0) throw invalid_configuration("max_requests must be at least 1");
    if (c.max_rows == 0) throw invalid_configuration("max_rows must be at least 1");
    if (c.max_rows > static_cast<std::size_t>(INT32_MAX)) throw invalid_configuration("max_rows exceeds int32 rows");
    if (c.tail_rows == 0) c.tail_rows = page_rows;
    if (c.max_block == 0) throw invalid_configuration("max_block must be at least 1");
    if (c.max_block > c.max_rows) throw invalid_configuration("max_block exceeds max_rows");
    const std::size_t pages_per_request = (c.max_rows + page_rows - 1) / page_rows;
    if (c.host_pages == 0) c.host_pages = c.max_requests * pages_per_request;
    if (c.prefix_pages == 0 || c.prefix_pages > c.host_pages) c.prefix_pages = c.host_pages;
    return c;
  }
  [[nodiscard]] static std::size_t page_of(std::int64_t row) { return static_cast<std::size_t>(row) / page_rows; }
  static void reset_hot(slot_state& st) {
    st.hot_row.assign(hot_rows, no_row);
    st.order.resize(hot_rows);
    for (std::size_t i = 0; i < hot_rows; ++i) st.order[i] = static_cast<order_index>(i);
    st.partial = 0;
    close_round(st);
  }
  [[nodiscard]] std::int64_t committed_positions(std::size_t source, std::size_t slot) const {
    return src_[source].books.slot(slot).frontier * static_cast<std::int64_t>(Layout::sources[source].positions_per_row) +
           static_cast<std::int64_t>(src_[source].state[slot].partial);
  }
  /// Rows touched by positions n .. n+count-1 when n = frontier·m + partial: rows frontier ..
  /// (n+count-1)/m. count >= 1.
  [[nodiscard]] std::size_t rows_of_block(std::size_t source, std::size_t slot, std::size_t count) const {
    const std::size_t m = Layout::sources[source].positions_per_row;
    return count == 0 ? 0 : (src_[source].state[slot].partial + count - 1) / m + 1;
  }
  static void close_round(slot_state& st) {
    st.staged = 0;
    st.verified = 0;
  }
  void check_speculative(std::size_t source) const {
    check_source(source);
    if (cfg_.max_block < 2)
      throw invalid_configuration("speculative calls need hierarchy_config::max_block >= 2 (the tail ring has no "
                                  "room for a block); with max_block = 1 use append and resolve");
  }

  /// Throws the typed error for the first problem of one request's verify round.
  void validate_round(std::size_t source, std::size_t slot, const verify_item& item) const {
    const auto& st = src_[source].state[slot];
    const std::int64_t n = committed_positions(source, slot);
    const auto m = static_cast<std::int64_t>(Layout::sources[source].positions_per_row);
    const std::string who = "verify of request " + std::to_string(item.request) + " on source " + std::to_string(source);
    const std::size_t kr = item.queries.size();
    if (kr == 0) throw size_mismatch(who + " has no queries (K_r >= 1: the anchor)");
    if (item.locations.size() != kr)
      throw size_mismatch(who + ": " + std::to_string(item.locations.size()) + " location lists for " +
                          std::to_string(kr) + " queries");
    if (kr > cfg_.max_block)
      throw block_too_wide(who + " with K_r = " + std::to_string(kr) + ", max_block is " + std::to_string(cfg_.max_block));
    if (st.staged == 0) throw no_staged_block(who + " without a staged block");
    if (kr > st.staged)
      throw block_too_wide(who + " with K_r = " + std::to_string(kr) + " queries, the staged block has " +
                           std::to_string(st.staged) + " positions");
    const auto max_rows = static_cast<std::int64_t>(cfg_.max_rows);
    for (std::size_t j = 0; j < kr; ++j) {
      const auto q = item.queries[j];
      if (item.locations[j].size() != q.size())
        throw size_mismatch(who + ": query " + std::to_string(j) + " has " + std::to_string(q.size()) +
                            " entries and " + std::to_string(item.locations[j].size()) + " location entries");
      if (q.size() > top_k)
        throw selection_too_long(who + ": query " + std::to_string(j) + " has " + std::to_string(q.size()) +
                                 " entries, top_k is " + std::to_string(top_k));
      // Query j (position n + j) sees a stored row only once every position it packs is <= n + j,
      // i.e. rows < (n + j + 1) / m; for m = 1 that is every row through its own position.
      const std::int64_t visible_end = (n + static_cast<std::int64_t>(j) + 1) / m;
      for (std::size_t i = 0; i < q.size(); ++i) {
        const row_index e = q[i];
        if (e == no_row) continue;
        if (e < 0 || e >= max_rows)
          throw position_out_of_range(who + ": query " + std::to_string(j) + " entry " + std::to_string(i) +
                                      " is row " + std::to_string(e) + ", outside [0, " + std::to_string(max_rows) +
                                      ") and not -1");
        if (e >= visible_end)
          throw position_not_visible(who + ": query " + std::to_string(j) + " (position " +
                                     std::to_string(n + static_cast<std::int64_t>(j)) + ") entry " +
                                     std::to_string(i) + " selects row " + std::to_string(e) +
                                     (m > 1 ? ", which is not complete at that position" : ", which it cannot see"));
      }
    }
  }
  void check_followers_copied(std::size_t source, const char* call) const {
    dhisparse::detail::check_followers_copied(src_[source].layer_pending, source, call);
  }
  /// Slots of a batch's requests, validating each item (unknown request, the same request twice,
  /// then `validate(slot, item)`) before anything changes.
  template <class Item, class Validate>
  std::vector<std::size_t> batch_slots(std::span<const Item> batch, const char* call, Validate&& validate) const {
    std::vector<std::size_t> slots;
    slots.reserve(batch.size());
    for (const auto& item : batch) {
      const std::size_t slot = registry_.slot(item.request);
      if (std::find(slots.begin(), slots.end(), slot) != slots.end())
        throw duplicate_in_batch("request " + std::to_string(item.request) + " appears twice in one " + call +
                                 " batch");
      validate(slot, item);
      slots.push_back(slot);
    }
    return slots;
  }
  /// Slots of a step-wide batch's items, validating each (invalid_source, unknown request, the
  /// same (request, source) twice, then `validate(slot, item)`) before anything changes.
  template <class Item, class Validate>
  std::vector<std::size_t> step_slots(std::span<const Item> batch, const char* call, Validate&& validate) const {
    std::vector<std::size_t> slots;
    slots.reserve(batch.size());
    std::vector<std::pair<std::size_t, std::size_t>> seen;  // (source, slot), sorted
    seen.reserve(batch.size());
    for (const auto& item : batch) {
      check_source(item.source);
      const std::size_t slot = registry_.slot(item.request);
      const std::pair<std::size_t, std::size_t> key{item.source, slot};
      const auto at = std::lower_bound(seen.begin(), seen.end(), key);
      if (at != seen.end() && *at == key)
        throw duplicate_in_batch("request " + std::to_string(item.request) + " appears twice on source " +
                                 std::to_string(item.source) + " in one " + call + " batch");
      validate(slot, item);
      seen.insert(at, key);
      slots.push_back(slot);
    }
    return slots;
  }
  /// The constructors' common part: `adopt` takes the host stores from `host_stores`; `shared`
  /// (with `rank`) makes the hierarchy a rank of a shared host store.
  host_hierarchy(const hierarchy_config& cfg, std::span<const std::span<std::byte>> host_stores, bool adopt,
                 detail::shared_store_books* shared = nullptr, std::size_t rank = 0)
      : cfg_(normalised(cfg)), registry_(cfg_.max_requests) {
    if (shared) binding_ = detail::shared_rank(shared, rank, cfg_.max_requests);  // claim the rank first; given back if anything below throws
    space_ = make_space(cfg_);
    if (!space_.addressable())
      throw invalid_configuration("GPU pool of " + std::to_string(space_.rows()) + " rows exceeds int32 locations");
    const detail::staging_blocks blocks = Staging::shared ? blocks_for(cfg_) : detail::staging_blocks{};
    for (std::size_t s = 0; s < sources; ++s) {
      src_[s].space = space_;
      if constexpr (Staging::shared) {
        src_[s].space.staging_gap = blocks.staging_gap[s];
        if (!src_[s].space.addressable())
          throw invalid_configuration("staging locations of source " + std::to_string(s) + " reach " +
                                      std::to_string(src_[s].space.rows()) +
                                      ", past int32 (staging_arenas<chi> places them past the pools of every source)");
      }
    }
    if (adopt) check_host_stores(host_stores);
    if constexpr (Staging::shared) blocks_.assign(blocks.total_bytes, std::byte{0});
    for (std::size_t s = 0; s < sources; ++s) {
      const auto& d = Layout::sources[s];
      auto& src = src_[s];
      const std::size_t store_bytes = host_store::bytes_required(page_rows, d.payload_layers, d.row_bytes, cfg_.host_pages);
      std::span<std::byte> store;
      if (shared) {
        store = shared->store(s).storage();  // the shared bytes; allocation goes through the shared books
      } else if (adopt) {
        store = host_stores[s].first(store_bytes);
      } else {
        src.host_bytes.resize(store_bytes);
        store = src.host_bytes;
      }
      src.books = detail::history_books(cfg_.max_requests, cfg_.max_rows, page_rows, cfg_.optional_pages,
                                        host_store(page_rows, d.payload_layers, d.row_bytes, cfg_.host_pages, store));
      if (shared) src.books.attach_shared(shared, s, rank);
      if constexpr (Staging::shared) {
        for (std::size_t l = 0; l < d.payload_layers; ++l) src.block_offset.push_back(blocks.pool_offset(s, l));
      } else {
        src.pool.assign(d.payload_layers, std::vector<std::byte>(pool_rows_of(space_) * d.row_bytes));
      }
      src.layer_pending.assign(d.payload_layers, false);
      src.state.resize(cfg_.max_requests);
      for (auto& st : src.state) reset_hot(st);
    }
    prefixes_ = detail::prefix_registry<sources>(cfg_.host_pages, cfg_.prefix_pages);
  }
  /// The adopting constructor's checks (count, size, alignment), in the CUDA backend's order.
  void check_host_stores(std::span<const std::span<std::byte>> stores) const {
    if (stores.size() != sources)
      throw size_mismatch("adopted host stores: " + std::to_string(stores.size()) + " spans given, the layout has " +
                          std::to_string(sources) + " sources (one span per source)");
    for (std::size_t s = 0; s < sources; ++s) {
      const auto& d = Layout::sources[s];
      const std::size_t need = host_store::bytes_required(page_rows, d.payload_layers, d.row_bytes, cfg_.host_pages);
      const std::string who = "adopted host store of source " + std::to_string(s);
      if (stores[s].size() < need || stores[s].data() == nullptr)
        throw size_mismatch(who + " holds " + std::to_string(stores[s].size()) + " bytes, needs " + std::to_string(need) +
                            " (host_store_bytes: " + std::to_string(cfg_.host_pages) + " pages)");
      if (reinterpret_cast<std::uintptr_t>(stores[s].data()) % host_store_alignment != 0)
        throw invalid_configuration(who + " is not " + std::to_string(host_store_alignment) + "-byte aligned");
    }
  }
  /// A batched write's checks of one (request, source): the rows fit its reservation (which never
  /// passes max_rows, so the size math cannot overflow) and the byte count is `count` rows.
  void check_reserved_write(const char* call, request_id request, std::size_t source, std::size_t slot,
                            std::size_t count, std::size_t bytes) const {
    const auto& d = Layout::sources[source];
    const auto& books = src_[source].books;
    const std::string who =
        std::string(call) + " of request " + std::to_string(request) + " to source " + std::to_string(source);
    const auto room = static_cast<std::size_t>(books.reserved_rows(slot) - books.slot(slot).frontier);
    if (count > room)
      throw capacity_exceeded(who + " of " + std::to_string(count) + " rows would pass its " +
                              std::to_string(books.reserved_rows(slot)) + " reserved rows (" + std::to_string(room) +
                              " left; reserve_ahead or reserve_rows first, at most max_rows)");
    if (bytes != count * d.payload_layers * d.row_bytes)
      throw size_mismatch(who + " got " + std::to_string(bytes) + " bytes for " + std::to_string(count) +
                          " rows, expected " + std::to_string(count * d.payload_layers * d.row_bytes));
  }
  /// A batched commit's checks of one (request, source): a verified round, the acceptance within
  /// it, and the completed rows within the reservation.
  void check_reserved_commit(const char* call, request_id request, std::size_t source, std::size_t slot,
                             std::size_t accepted) const {
    check_commit(request, source, slot, accepted);
    const std::int64_t last = committed_rows_after(source, slot, accepted);
    const auto reserved = src_[source].books.reserved_rows(slot);
    if (last > reserved)
      throw capacity_exceeded(std::string(call) + " of request " + std::to_string(request) + " on source " +
                              std::to_string(source) + " would reach row " + std::to_string(last) + ", past its " +
                              std::to_string(reserved) + " reserved rows (reserve_ahead or reserve_rows first)");
  }
  void check_host_page(std::size_t source, page_id page) const {
    check_source(source);
    if (page < 0 || static_cast<std::size_t>(page) >= cfg_.host_pages)
      throw position_out_of_range("host page " + std::to_string(page) + " outside the store's " +
                                  std::to_string(cfg_.host_pages));
  }
  /// Source s's books, for the prefix registry.
  auto books_of_source() {
    return [this](std::size_t s) -> detail::history_books& { return src_[s].books; };
  }
  // The throw lives out of line so that check_source inlines and the compiler knows source <
  // sources after it (GCC's -Warray-bounds otherwise follows a constant bad source past the check).
  [[noreturn]] static void throw_invalid_source(std::size_t source) {
    throw invalid_source("source " + std::to_string(source) + " outside the layout's " + std::to_string(sources));
  }
  static void check_source(std::size_t source) {
    if (source >= sources) throw_invalid_source(source);
  }
  static void check_layer(std::size_t source, std::size_t layer) {
    check_source(source);
    if (layer >= Layout::sources[source].payload_layers)
      throw invalid_source("payload layer " + std::to_string(layer) + " outside source " + std::to_string(source) +
                           "'s " + std::to_string(Layout::sources[source].payload_layers));
  }
  /// Base of a payload layer (offsets, not pointers, are kept so that copies stay self-contained).
  std::byte* layer_base(std::size_t source, std::size_t layer) {
    if constexpr (Staging::shared) return blocks_.data() + src_[source].block_offset[layer];
    else return src_[source].pool[layer].data();
  }
  const std::byte* layer_base(std::size_t source, std::size_t layer) const {
    return const_cast<host_hierarchy*>(this)->layer_base(source, layer);
  }
  std::byte* pool_row(std::size_t source, std::size_t layer, location loc) {
    // one formula for every location: shared arenas sit at the source's staging gap (staging_blocks.hpp)
    return layer_base(source, layer) + static_cast<std::size_t>(loc) * Layout::sources[source].row_bytes;
  }
  /// Rows each payload layer's pool holds: the whole location range, less the staging rows when
  /// they live in shared arenas.
  static std::size_t pool_rows_of(const location_space& sp) { return Staging::shared ? sp.pool_rows() : sp.rows(); }
  /// The shared-arena layout of `c` (normalised): one block per payload-layer index, the CUDA
  /// backend's arithmetic, so both return the same staging locations.
  static detail::staging_blocks blocks_for(const hierarchy_config& c) {
    const location_space sp = make_space(c);
    return detail::plan_staging_blocks(std::span<const source_desc>(Layout::sources), sp.pool_rows(),
                                       sp.slots * sp.staging_rows, Staging::arenas);
  }
  /// Pool geometry: with K_max > 1 the tail ring holds the committed window (T rows) plus one
  /// tentative block, and every slot has K_max * top_k staging rows.
  static location_space make_space(const hierarchy_config& c) {
    const bool spec = c.max_block > 1;
    return location_space{c.max_requests, hot_rows, c.tail_rows + (spec ? c.max_block : 0), c.optional_pages,
                          page_rows, spec ? c.max_block * top_k : 0};
  }
  /// Bytes of one shared staging arena: N * K_max * k rows of the widest row (0 without speculation).
  static std::size_t arena_bytes(const hierarchy_config& c) {
    return c.max_block > 1 ? c.max_requests * c.max_block * top_k * widest_row_bytes<Layout>() : 0;
  }

  resolve_stats resolve_one(std::size_t source, std::size_t slot, std::span<const row_index> selection,
                            std::span<location> out, copy_layers mode) {
    auto& src = src_[source];
    auto& st = src.state[slot];
    const auto& d = Layout::sources[source];
    resolve_stats stats;
    const auto& books = src.books.slot(slot);
    const std::int64_t tail_begin = books.frontier - static_cast<std::int64_t>(cfg_.tail_rows);

    // 1. tail and ready optional history
    std::vector<std::size_t> pending;
    std::unordered_map<row_index, std::int64_t> hot_slot;  // distinct unresolved row -> hot slot (-1: missing)
    for (std::size_t i = 0; i < selection.size(); ++i) {
      const row_index e = selection[i];
      if (e == no_row) { out[i] = no_location; continue; }
      ++stats.selected;
      if (e >= tail_begin) { out[i] = space_.tail(slot, e); ++stats.direct; continue; }
      if (const std::int32_t g = books.optional_page[page_of(e)]; g >= 0) {
        out[i] = space_.optional(static_cast<std::size_t>(g), e);
        ++stats.direct;
        continue;
      }
      pending.push_back(i);
      hot_slot.emplace(e, -1);
    }
    if (pending.empty()) return stats;  // every entry direct: no hot-cache scan

    // 2. hot-cache scan: protect selected rows
    std::vector<unsigned char> is_hit(hot_rows, 0);
    for (std::size_t j = 0; j < hot_rows; ++j)
      if (auto it = hot_slot.find(st.hot_row[j]); st.hot_row[j] != no_row && it != hot_slot.end()) {
        it->second = static_cast<std::int64_t>(j);
        is_hit[j] = 1;
      }

    // 3. misses in ascending row order take the LRU unprotected slots, then are recovered from host
    std::vector<row_index> misses;
    for (const auto& [row, j] : hot_slot)
      if (j < 0) misses.push_back(row);
    std::sort(misses.begin(), misses.end());
    const auto victims = detail::lru_take_victims<order_index>(st.order, is_hit, misses.size());
    const std::size_t layers = mode == copy_layers::all ? d.payload_layers : 1;
    for (std::size_t t = 0; t < misses.size(); ++t) {
      const row_index row = misses[t];
      const std::size_t way = victims[t];
      st.hot_row[way] = row;
      hot_slot[row] = static_cast<std::int64_t>(way);
      const location dst = space_.hot(slot, way);
      const page_id hp = src.books.host_page_of(slot, row);
      for (std::size_t l = 0; l < layers; ++l)
        std::memcpy(pool_row(source, l, dst), src.books.store().row(hp, l, row).data(), d.row_bytes);
      src.plan.push_back({slot, row, dst});
    }
    stats.rows_copied = misses.size();
    stats.bytes_copied = misses.size() * layers * d.row_bytes;

    const std::unordered_set<row_index> missed(misses.begin(), misses.end());
    for (std::size_t i : pending) {
      const row_index e = selection[i];
      out[i] = space_.hot(slot, static_cast<std::size_t>(hot_slot[e]));
      ++(missed.contains(e) ? stats.host : stats.hot);
    }
    return stats;
  }

  verify_stats verify_one(std::size_t source, std::size_t slot, const verify_item& item, copy_layers mode) {
    auto& src = src_[source];
    auto& st = src.state[slot];
    const auto& d = Layout::sources[source];
    verify_stats stats;
    const auto& books = src.books.slot(slot);
    const std::int64_t f = books.frontier;
    const std::int64_t tail_begin = f - static_cast<std::int64_t>(cfg_.tail_rows);

    // 1. block rows, committed tail rows and ready optional history resolve directly
    std::vector<std::pair<std::size_t, std::size_t>> pending;  // (query, entry)
    std::unordered_map<row_index, std::int64_t> hot_slot;      // distinct union row -> hot way (-1: missing)
    for (std::size_t j = 0; j < item.queries.size(); ++j) {
      const auto q = item.queries[j];
      const auto out = item.locations[j];
      for (std::size_t i = 0; i < q.size(); ++i) {
        const row_index e = q[i];
        if (e == no_row) { out[i] = no_location; continue; }
        ++stats.selected;
        if (e >= tail_begin) {  // committed tail (< f) or a block row (f .. f+j): both in the ring
          out[i] = space_.tail(slot, e);
          ++stats.direct;
          if (e >= f) ++stats.block;
          continue;
        }
        if (const std::int32_t g = books.optional_page[page_of(e)]; g >= 0) {
          out[i] = space_.optional(static_cast<std::size_t>(g), e);
          ++stats.direct;
          continue;
        }
        pending.emplace_back(j, i);
        hot_slot.emplace(e, -1);
      }
    }
    if (pending.empty()) return stats;  // every entry direct: no hot-cache scan

    // 2. hot-cache scan over the union: protect selected rows
    std::vector<unsigned char> is_hit(hot_rows, 0);
    std::size_t hits = 0;
    for (std::size_t w = 0; w < hot_rows; ++w)
      if (auto it = hot_slot.find(st.hot_row[w]); st.hot_row[w] != no_row && it != hot_slot.end()) {
        it->second = static_cast<std::int64_t>(w);
        is_hit[w] = 1;
        ++hits;
      }

    // 3. misses (ascending) take the LRU unprotected ways; the rest overflow into staging
    std::vector<row_index> misses;
    for (const auto& [row, w] : hot_slot)
      if (w < 0) misses.push_back(row);
    std::sort(misses.begin(), misses.end());
    const std::size_t to_hot = std::min(misses.size(), hot_rows - hits);
    const auto victims = detail::lru_take_victims<order_index>(st.order, is_hit, to_hot);
    const std::size_t layers = mode == copy_layers::all ? d.payload_layers : 1;
    std::unordered_map<row_index, location> placed;  // missing row -> its location this round
    for (std::size_t t = 0; t < misses.size(); ++t) {
      const row_index row = misses[t];
      location dst;
      if (t < to_hot) {
        const std::size_t way = victims[t];
        st.hot_row[way] = row;
        hot_slot[row] = static_cast<std::int64_t>(way);
        dst = space_.hot(slot, way);
      } else {
        dst = src.space.staging(slot, t - to_hot);  // |U| <= K_r * top_k: within the slot's staging
      }
      const page_id hp = src.books.host_page_of(slot, row);
      for (std::size_t l = 0; l < layers; ++l)
        std::memcpy(pool_row(source, l, dst), src.books.store().row(hp, l, row).data(), d.row_bytes);
      src.plan.push_back({slot, row, dst});
      placed.emplace(row, dst);
    }
    stats.rows_copied = misses.size();
    stats.bytes_copied = misses.size() * layers * d.row_bytes;
    stats.staging_rows = misses.size() - to_hot;

    for (const auto& [j, i] : pending) {
      const row_index e = item.queries[j][i];
      if (auto it = placed.find(e); it != placed.end()) {
        item.locations[j][i] = it->second;
        ++stats.host;
        if (hot_slot[e] < 0) ++stats.staged;
      } else {
        item.locations[j][i] = space_.hot(slot, static_cast<std::size_t>(hot_slot[e]));
        ++stats.hot;
      }
    }
    return stats;
  }

  hierarchy_config cfg_;
  detail::shared_rank binding_;  // before the books that point into its store: its leave() needs none of them
  detail::request_registry registry_;
  location_space space_{};
  std::array<source_data, sources> src_;
  // staging_arenas<chi>: block l holds payload layer l of every source, then arena l (staging_blocks.hpp)
  std::vector<std::byte> blocks_;
  detail::staging_holder<Staging> staging_;
  detail::prefix_registry<sources> prefixes_;
};

static_assert(FusedResolver<host_hierarchy<layouts::tiny, lru_hot_cache<16>>>);

}  // namespace dhisparse
