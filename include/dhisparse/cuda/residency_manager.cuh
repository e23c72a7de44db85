#pragma once
/// \file
/// `dhisparse::cuda::residency_manager`: load-adaptive residency on the CUDA backend (paper
/// §3.1-3.2, docs/residency.md) with the semantics of the host reference
/// (host/residency_manager.hpp: same ledger, same resident-first admission, whole-request reclaim
/// choice (detail/residency_reclaim.hpp), completion and bounded round-robin repopulation), plus
/// what only a GPU has: page states, deferred host backup and stream/event ordering.
///
/// Streams. The *step stream* (the hierarchy's stream unless given) carries everything that
/// readers are ordered against: resolves, appends, imports, optional-map unmaps and completion
/// resets. The manager's own *copy stream* carries page fills from the host store and backups of
/// device-only pages, so they overlap decoding. A `stream_clock` on each stream turns "work enqueued
/// so far" into tickets that `poll()` retires with cudaEventQuery: no call of this class waits for
/// the device on the host (except `drain()`, a test and shutdown helper).
///
/// Page life (per request, source, history page):
///  - filling: a pool page is reserved (counted in M_opt), the fill and then the map publish are
///    enqueued on the copy stream after the step stream's work so far (the slot's admission and
///    reset precede it). The map entry is written only behind the copy, so a pending page is never
///    visible: the resolver keeps serving those rows from the hot cache and the host.
///  - ready: published. An imported page may be *device-only* (its host copy deferred): it was
///    written from the prefill straight into its pool page and published on the step stream
///    behind the write.
///  - reclaim (whole requests, under pressure): a device-only page is first backed up on the copy
///    stream (ordered after the import on the step stream); once the backup's ticket completes, or
///    at once for host-backed pages, the map entry is unmapped on the step stream, so every resolve
///    enqueued later misses to the host copy; the pool page is *retiring* until the step stream's
///    ticket behind that unmap completes, i.e. until every earlier reader (resolves and whatever the
///    engine enqueued on the step stream before the unmap) has finished; then it is free.
///    A page still filling is unmapped only after its fill's ticket completes.
///  - completion: the request's pages retire the same way (behind the slot reset); if copy-stream
///    work for the request is in flight, the step stream waits for it on the device first, so no
///    late publish or backup can touch a reused slot or host page.
///
/// Shared prefixes (docs/prefixes.md): `admit(id, prefix, suffix)`, `retain_prefix` and
/// `release_prefix` have the host manager's semantics. A pool page serves every request mapping
/// its host page: the first mapping fills it; later ones join it (no pool page, no copy; the entry
/// is published on the copy stream behind the fill). It counts once in M_opt, and retires (behind
/// the step-stream unmap of its last mapper) only when every request mapping it is reclaimed or
/// completed. Retaining a prefix backs up its device-only pages on the step stream first, so a
/// shared page is never device-only.
///
/// Admission that needs reclaim cannot finish at once (the pages retire later): `admit` starts the
/// reclaim, *claims* the request's required pages against the capacity being freed, and returns
/// `admit_status::wait_for_reclaim`; a later `admit` of the same id (after `poll()`, e.g. the next
/// step) admits it. Claimed capacity is kept out of repopulation and of other admissions, so
/// a claim is always satisfied once its pages retire. Invariant 3 counts retiring pages in M_opt,
/// so `M_req + M_opt + M_res <= M` holds after every call.
///
/// Streamed admission: `admit(id)` admits before the history exists; `import_history` then takes
/// it per source and in chunks (device, pinned or host buffers), placing the pages each chunk
/// completes as the host manager does. Pages lying wholly in a chunk are written into pool pages
/// on the step stream (device-only); the page an earlier chunk began is filled from the host store
/// on the copy stream. A chunk produced on another stream is ordered both ways with the step stream.
///
/// `hierarchy()` is read-only; `step()` hands out the per-step operations (step_handle.hpp).
///
/// Readers: locations returned by a resolve stay valid until the engine's later step-stream work;
/// an engine that reads them on another stream must order that stream before the step stream
/// (cudaStreamWaitEvent) so retirement waits for it too.
#include "detail/minimum_arch.cuh"  // first: stops below sm_80 with a clear message
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../detail/repopulation_walk.hpp"
#include "../detail/residency_checks.hpp"
#include "../detail/residency_reclaim.hpp"
#include "../errors.hpp"
#include "../hierarchy_types.hpp"
#include "../host/residency_manager.hpp"
#include "../policies/residency.hpp"
#include "../step_handle.hpp"
#include "../types.hpp"
#include "detail/device_guard.cuh"
#include "detail/residency_kernels.cuh"
#include "detail/stream_clock.cuh"
#include "error.cuh"
#include "hierarchy.cuh"

namespace dhisparse::cuda {

/// Prefilled history of one source in device-accessible memory (device memory of a prefill
/// engine, or pinned host memory): `count` rows laid out [payload layer][count][row_bytes].
struct device_history_import {
  /// Device-accessible rows, `[payload layer][count][row_bytes]`.
  const std::byte* rows = nullptr;
  /// Rows imported (stored rows, not token positions).
  std::size_t count = 0;
  /// Row the import starts at: 0 for a plain admission, the prefix's rows on that source for an
  /// admission on a retained prefix (as `history_import::first_row`; otherwise suffix_misaligned).
  std::int64_t first_row = 0;
};

/// Where one history page of a request is (for tests and inspection).
enum class page_state : std::uint8_t {
  absent,      ///< not on the GPU: served by the tail, the hot cache or the host copy
  filling,     ///< pool page reserved, fill and publish in flight (not visible to the resolver)
  ready,       ///< published in the optional map
  backing_up,  ///< ready, device-only, its host backup in flight (reclaim in progress)
};

/// One history page of a request as `residency_manager::page_of` reports it: its state, pool page (-1: none)
/// and whether only the device holds it.
struct page_status {
  /// Where the page is.
  page_state state = page_state::absent;
  /// Optional pool page holding it (-1: none).
  std::int32_t pool_page = -1;
  bool device_only = false;  ///< the host copy does not exist yet (imported resident-first)
};

/// Load-adaptive residency over an owned `cuda::hierarchy`: the host manager's ledger and admission semantics,
/// with page states, deferred host backup and step/copy stream ordering (see the file comment). Not copyable.
template <class Hierarchy, ResidencyPolicy Policy = typename Hierarchy::residency>
class residency_manager {
 public:
  /// The owned hierarchy type.
  using hierarchy_type = Hierarchy;
  /// The residency policy.
  using policy = Policy;
  /// The policy's optional members, with their defaults.
  using traits = residency_traits<Policy>;
  /// The hierarchy's KV layout.
  using layout = typename Hierarchy::layout;
  /// Number of payload sources.
  static constexpr std::size_t sources = Hierarchy::sources;
  /// p: rows per history page.
  static constexpr std::size_t page_rows = Hierarchy::page_rows;

  /// Builds the hierarchy on `step_stream` (the stream resolves, appends and imports are ordered
  /// on) and a non-blocking copy stream. Throws invalid_configuration as the host manager does.
  /// The step stream must outlive the manager: its destructor waits for both streams.
  residency_manager(const hierarchy_config& hcfg, const residency_config& rcfg, cudaStream_t step_stream = nullptr)
      : h_(hcfg, step_stream), cfg_(rcfg), step_(step_stream) {
    start();
  }
  /// As above, with the hierarchy's host stores adopted from memory the engine already owns (its
  /// pinned KV pool): one span per source of at least `Hierarchy::host_store_bytes(hcfg, s)` bytes,
  /// with the contract and errors of hierarchy's adopting constructor (layout in its doc).
  residency_manager(const hierarchy_config& hcfg, const residency_config& rcfg,
                    std::span<const std::span<std::byte>> host_stores, cudaStream_t step_stream)
      : h_(hcfg, host_stores, step_stream), cfg_(rcfg), step_(step_stream) {
    start();
  }
  residency_manager(const residency_manager&) = delete;
  residency_manager& operator=(const residency_manager&) = delete;
  /// Waits for both streams, then releases the copy stream (on the manager's device, from any thread).
  ~residency_manager() {
    const detail::device_guard on(h_.device(), std::nothrow);
    cudaStreamSynchronize(copy_stream_);
    cudaStreamSynchronize(step_);
    copy_ = detail::stream_clock();
    step_clock_ = detail::stream_clock();
    cudaStreamDestroy(copy_stream_);
    cudaEventDestroy(handoff_);
  }

  /// The owned hierarchy, read-only: there is no mutable access, so nothing can admit, complete,
  /// append, map or unmap behind the manager's books and page states.
  [[nodiscard]] const Hierarchy& hierarchy() const { return h_; }
  /// The per-step operations on the hierarchy (resolve, copy_follower, the speculative round,
  /// check_errors, views and pools; see step_handle.hpp). Enqueue them on the step stream.
  [[nodiscard]] step_handle<Hierarchy> step() { return step_handle<Hierarchy>(h_); }
  /// The step stream: resolves, appends, imports, unmaps and completion resets are ordered on it.
  [[nodiscard]] cudaStream_t step_stream() const { return step_; }
  /// The device the manager and its hierarchy were created on (`hierarchy().device()`): every
  /// call makes it current for its CUDA work and restores the calling thread's device, so the
  /// manager works from any thread; a stream given to a call must belong to it (wrong_device).
  [[nodiscard]] int device() const noexcept { return h_.device(); }
  /// The manager's own non-blocking stream for page fills and backups (owned; destroyed with the manager).
  [[nodiscard]] cudaStream_t copy_stream() const { return copy_stream_; }
  /// The ledger sizes given at construction.
  [[nodiscard]] const residency_config& config() const { return cfg_; }
  /// Running totals since construction.
  [[nodiscard]] const residency_counters& counters() const { return counters_; }
  /// M: optional-pool pages per source.
  [[nodiscard]] std::size_t capacity_pages() const { return h_.config().optional_pages; }
  /// Pages a pinning policy reserves per request and source (complete pages of a full history).
  [[nodiscard]] std::size_t pinned_pages_per_request() const {
    return traits::pins_history ? h_.config().max_rows / page_rows : 0;
  }
  /// True while `id` is admitted through this manager (not while its admission waits on a claim).
  [[nodiscard]] bool contains(request_id id) const { return seq_of_.contains(id); }
  /// Number of requests admitted now.
  [[nodiscard]] std::size_t admitted_count() const { return seq_of_.size(); }
  /// Requests whose admission waits for reclaimed pages to retire.
  [[nodiscard]] std::size_t claims() const { return claims_.size(); }
  /// True while `id`'s admission waits for reclaimed pages to retire (it returned `wait_for_reclaim`).
  [[nodiscard]] bool claimed(request_id id) const { return claims_.contains(id); }

  /// A source's ledger now (M_opt counts retiring pages); throws invalid_source for a source outside the layout.
  [[nodiscard]] residency_ledger ledger(std::size_t source) const {
    check_source(source);
    return {capacity_pages(), required_[source], held_[source], cfg_.reserve_pages};
  }
  /// Invariant 3 on every source.
  [[nodiscard]] bool invariant_holds() const {
    for (std::size_t s = 0; s < sources; ++s)
      if (!ledger(s).holds()) return false;
    return true;
  }
  /// Pool pages of a source that are retiring (unmapped, waiting for earlier readers).
  [[nodiscard]] std::size_t retiring_pages(std::size_t source) const {
    check_source(source);
    std::size_t n = 0;
    for (const auto& r : retiring_)
      if (r.source == source) ++n;
    return n;
  }
  /// Optional pages a request holds on a source (filling, ready or backing up).
  [[nodiscard]] std::size_t optional_pages_of(request_id id, std::size_t source) const {
    check_source(source);
    return books_of(id).mapped[source];
  }
  /// Rows of a request's history imported on a source (at admission and by `import_history`).
  [[nodiscard]] std::int64_t imported_rows(request_id id, std::size_t source) const {
    check_source(source);
    return books_of(id).imported[source];
  }
  /// State of one history page of a request (host books, as of the last `poll()`).
  [[nodiscard]] page_status page_of(request_id id, std::size_t source, std::size_t history_page) const {
    check_source(source);
    const auto& b = books_of(id);
    if (history_page >= b.pages[source].size()) throw position_out_of_range("history page outside the request");
    const auto& e = b.pages[source][history_page];
    return {e.state, e.pool, e.device_only};
  }
  /// True while a request's pages are being reclaimed.
  [[nodiscard]] bool reclaiming(request_id id) const { return books_of(id).reclaiming; }
  /// Admitted requests in the policy's reclaim order (the first is reclaimed first).
  [[nodiscard]] std::vector<request_id> reclaim_sequence() const {
    return dhisparse::detail::reclaim_sequence<traits::order>(by_seq_);
  }

  // ------------------------------------------------------------------ admission

  /// Resident-first admission of a prefill held in device-accessible memory (one import per
  /// source, or none); see the file comment and the host manager. Returns `wait_for_reclaim` when
  /// pages must retire first: call `admit` again with the same id and history later (the buffers
  /// must stay valid until the call that admits). Throws (state unchanged) on bad input.
  residency_admission admit(request_id id, std::span<const device_history_import> history = {}) {
    for (const auto& hi : history)
      if (hi.count > 0 && hi.rows == nullptr)
        throw size_mismatch("residency: request " + std::to_string(id) + " imports " + std::to_string(hi.count) +
                            " rows from a null device pointer");
    return admit_impl(id, std::nullopt, history.size(), [&](std::size_t s) { return history[s].count; },
                      [&](std::size_t s) { return history[s].first_row; },
                      [&](std::size_t s, std::size_t device_pages) {
                        return h_.import_rows(id, s, history[s].rows, history[s].count, device_pages, step_);
                      });
  }
  /// As above, with the imports given as a braced list.
  residency_admission admit(request_id id, std::initializer_list<device_history_import> history) {
    return admit(id, std::span<const device_history_import>(history.begin(), history.size()));
  }
  /// The same from host memory (any, pageable included; the host manager's signature): the rows are
  /// staged through a stream-ordered device allocation, then imported as above.
  residency_admission admit(request_id id, std::span<const history_import> history) {
    return admit_host(id, std::nullopt, history);
  }
  /// As above (host memory), with the imports given as a braced list.
  residency_admission admit(request_id id, std::initializer_list<history_import> history) {
    return admit(id, std::span<const history_import>(history.begin(), history.size()));
  }

  // ------------------------------------------------------------------ shared prefixes (docs/prefixes.md)

  /// Resident-first admission on retained prefix `prefix` (the host manager's `admit(id, prefix,
  /// suffix)`): the request shares the prefix's host pages (`hierarchy::admit(id, prefix)` on the
  /// step stream, behind the prefix's rows) and imports only `suffix` (empty, or one import per
  /// source from host memory whose `first_row` is the prefix's rows there). Pages other requests
  /// already map are joined at no cost (one pool page, counted once in M_opt; the entry is
  /// published on the copy stream behind the page's fill), then unmapped pages newest first while
  /// spare pages remain. A pool page every mapper of which is being reclaimed is not joined (it is
  /// about to retire; repopulation maps the page again later). Throws, state unchanged:
  /// duplicate_admission, unknown_prefix, size_mismatch, suffix_misaligned, capacity_exceeded.
  /// Waits as `admit`, `wait_for_reclaim` included (retry with the same prefix and suffix).
  residency_admission admit(request_id id, prefix_id prefix, std::span<const history_import> suffix = {}) {
    return admit_host(id, prefix, suffix);
  }
  /// As above, with the suffix imports given as a braced list.
  residency_admission admit(request_id id, prefix_id prefix, std::initializer_list<history_import> suffix) {
    return admit(id, prefix, std::span<const history_import>(suffix.begin(), suffix.size()));
  }
  /// As above, with the suffix in device-accessible memory (`device_history_import::first_row` the
  /// prefix's rows on each source); the buffers must stay valid until the call that admits.
  residency_admission admit(request_id id, prefix_id prefix, std::span<const device_history_import> suffix) {
    for (const auto& hi : suffix)
      if (hi.count > 0 && hi.rows == nullptr)
        throw size_mismatch("residency: request " + std::to_string(id) + " imports " + std::to_string(hi.count) +
                            " rows from a null device pointer");
    return admit_impl(id, prefix, suffix.size(), [&](std::size_t s) { return suffix[s].count; },
                      [&](std::size_t s) { return suffix[s].first_row; },
                      [&](std::size_t s, std::size_t device_pages) {
                        return h_.import_rows(id, s, suffix[s].rows, suffix[s].count, device_pages, step_);
                      });
  }

  /// Retains the first `rows[s]` stored rows of request `id` as prefix `prefix`
  /// (`hierarchy::retain_prefix`; the ledger is not affected: a retained prefix holds host pages
  /// only). Device-only pages among them (imported resident-first, host copy deferred) are backed
  /// up on the step stream now, so that admissions on the prefix, enqueued later on that stream,
  /// read their host copy. Returns the evicted prefixes. Throws as the hierarchy, and unknown_request.
  std::vector<prefix_id> retain_prefix(prefix_id prefix, request_id id, std::span<const std::int64_t> rows) {
    const auto guard = on_device();
    auto& b = books_of(id);
    auto evicted = h_.retain_prefix(prefix, id, rows);
    back_up_retained(b, prefix);
    return evicted;
  }
  /// Retains a request's whole stored history; as above.
  std::vector<prefix_id> retain_prefix(prefix_id prefix, request_id id) {
    const auto guard = on_device();
    auto& b = books_of(id);
    auto evicted = h_.retain_prefix(prefix, id);
    back_up_retained(b, prefix);
    return evicted;
  }
  /// Drops a retained prefix (`hierarchy::release_prefix`); throws unknown_prefix. Requests
  /// admitted on it keep their pages.
  void release_prefix(prefix_id prefix) { h_.release_prefix(prefix); }

 private:
  /// The host-memory admissions, plain (`prefix` empty) and on a prefix.
  residency_admission admit_host(request_id id, std::optional<prefix_id> prefix, std::span<const history_import> history) {
    for (std::size_t s = 0; s < history.size() && s < sources; ++s) {
      const auto& d = layout::sources[s];
      if (history[s].count <= h_.config().max_rows &&
          history[s].rows.size() != history[s].count * d.payload_layers * d.row_bytes)
        throw size_mismatch("residency: request " + std::to_string(id) + " imports " +
                            std::to_string(history[s].rows.size()) + " bytes for " + std::to_string(history[s].count) +
                            " rows on source " + std::to_string(s) + ", expected " +
                            std::to_string(history[s].count * d.payload_layers * d.row_bytes));
    }
    return admit_impl(id, prefix, history.size(), [&](std::size_t s) { return history[s].count; },
                      [&](std::size_t s) { return history[s].first_row; },
                      [&](std::size_t s, std::size_t device_pages) {
                        return detail::with_device_copy(history[s].rows, step_, [&](const std::byte* copy) {
                          return h_.import_rows(id, s, copy, history[s].count, device_pages, step_);
                        });
                      });
  }

 public:

  /// Streamed admission (the host manager's `import_history`): the next `count` rows of an admitted
  /// request's history on one source, from device-accessible memory (device or pinned host)
  /// laid out [payload layer][count][row_bytes], as a prefill or a P/D transfer delivers them. The
  /// rows are ready in `stream`'s order: when `stream` is not the step stream, the step stream
  /// waits for it (on the device) before the import, and `stream` then waits for the step stream,
  /// so whatever the engine enqueues on `stream` afterwards (reusing or freeing the buffer) follows
  /// the import. On the step stream the buffer must stay valid until the import has run. The pages
  /// the chunk completes are placed as on the host: those lying wholly in the chunk are written
  /// into pool pages (device-only, host backup deferred), newest first while spare pages remain;
  /// a page an earlier chunk began is filled from the host store. A page placed earlier is never
  /// displaced. Returns the pages mapped (filling counts). Throws, state unchanged:
  /// unknown_request, invalid_source, size_mismatch (null rows), capacity_exceeded (past
  /// max_rows), host_pool_exhausted, import_after_decode (the source has decode rows already),
  /// invalid_configuration (pageable host rows on a device that cannot read them).
  std::size_t import_history(request_id id, std::size_t source, const std::byte* rows, std::size_t count,
                             cudaStream_t stream) {
    const detail::device_guard guard(h_.device(), stream == step_ ? cudaStream_t{} : stream);
    auto& b = check_chunk(id, source, count);
    if (count > 0 && rows == nullptr)
      throw size_mismatch("residency: request " + std::to_string(id) + " imports " + std::to_string(count) +
                          " rows from a null device pointer");
    if (count > 0) check_device_accessible(rows);
    poll();
    const bool other = stream != step_;
    if (other) {
      DHISPARSE_CUDA_TRY(cudaEventRecord(handoff_, stream));
      DHISPARSE_CUDA_TRY(cudaStreamWaitEvent(step_, handoff_, 0));
    }
    const std::size_t mapped = import_chunk(b, source, count, [&](std::size_t device_pages) {
      return h_.import_rows(id, source, rows, count, device_pages, step_);
    });
    if (other) {
      DHISPARSE_CUDA_TRY(cudaEventRecord(handoff_, step_));
      DHISPARSE_CUDA_TRY(cudaStreamWaitEvent(stream, handoff_, 0));
    }
    return mapped;
  }
  /// As above, with the rows ready on the step stream.
  std::size_t import_history(request_id id, std::size_t source, const std::byte* rows, std::size_t count) {
    return import_history(id, source, rows, count, step_);
  }
  /// As above from any host memory (pageable included; the host manager's signature): the rows are
  /// staged through a stream-ordered device allocation on the step stream. Also throws size_mismatch
  /// for a byte count that is not `count` rows.
  std::size_t import_history(request_id id, std::size_t source, std::span<const std::byte> rows, std::size_t count) {
    const auto guard = on_device();
    auto& b = check_chunk(id, source, count);
    const auto& d = layout::sources[source];
    if (rows.size() != count * d.payload_layers * d.row_bytes)
      throw size_mismatch("residency: request " + std::to_string(id) + " imports " + std::to_string(rows.size()) +
                          " bytes for " + std::to_string(count) + " rows on source " + std::to_string(source) +
                          ", expected " + std::to_string(count * d.payload_layers * d.row_bytes));
    poll();
    if (count == 0) return 0;
    return detail::with_device_copy(rows, step_, [&](const std::byte* copy) {
      return import_chunk(b, source, count, [&](std::size_t device_pages) {
        return h_.import_rows(id, source, copy, count, device_pages, step_);
      });
    });
  }

  /// Gives up a waiting admission's claim (the engine will not retry it).
  void withdraw(request_id id) {
    const auto it = claims_.find(id);
    if (it == claims_.end()) return;
    for (std::size_t s = 0; s < sources; ++s) claimed_[s] -= it->second;
    claims_.erase(it);
  }

  /// Appends decode rows on the step stream (device-accessible rows; as hierarchy::append). Under
  /// a pinning policy the pages this append completes are filled from the host at once.
  void append(request_id id, std::size_t source, const std::byte* rows, std::size_t count) {
    const auto guard = on_device();
    auto& b = books_of(id);
    const std::int64_t before = h_.frontier(id, source);
    h_.append(id, source, rows, count, step_);
    after_append(b, source, before);
  }
  /// Appends decode rows from any host memory (staged; as hierarchy::append's span overload).
  void append(request_id id, std::size_t source, std::span<const std::byte> rows, std::size_t count) {
    const auto guard = on_device();
    auto& b = books_of(id);
    const std::int64_t before = h_.frontier(id, source);
    h_.append(id, source, rows, count, step_);
    after_append(b, source, before);
  }

  /// Reserves host-store pages ahead of step-wide writes for every admitted request and source
  /// (hierarchy::reserve_ahead on the step stream; all or nothing; not capturable).
  void reserve_ahead(std::size_t rows_ahead) { h_.reserve_ahead(rows_ahead, step_); }

  /// One step's new rows of every request on every source (`hierarchy::append_step` on the step
  /// stream, the host backup on `backup`; `backup == step_stream()`: inline). Capturable without
  /// a pinning policy. Under a pinning policy the pages the step completes are filled at once, as
  /// `append` fills them: the counts are on the device, so the call then absorbs the books
  /// (`sync_books`: synchronises the step stream) before and after the launch and cannot be captured.
  void append_step(const kv_step_write_view& batch, cudaStream_t backup) {
    const auto guard = on_device();
    if constexpr (traits::pins_history) {
      h_.sync_books(step_);
      std::vector<std::pair<request_books*, std::array<std::int64_t, sources>>> before;
      for (auto& [seq, b] : by_seq_) {
        std::array<std::int64_t, sources> f{};
        for (std::size_t s = 0; s < sources; ++s) f[s] = h_.frontier(b.id, s);
        before.emplace_back(&b, f);
      }
      h_.append_step(batch, backup, step_);
      h_.sync_books(step_);
      for (auto& [b, f] : before)
        for (std::size_t s = 0; s < sources; ++s) after_append(*b, s, f[s]);
    } else {
      h_.append_step(batch, backup, step_);
    }
  }

  /// Completes a request: slot, host pages and required pages are released; its pool pages retire
  /// behind the slot reset on the step stream. Throws unknown_request for a request not admitted.
  void complete(request_id id) {
    const auto guard = on_device();
    const auto it = seq_of_.find(id);
    if (it == seq_of_.end()) throw unknown_request("residency: request " + std::to_string(id) + " is not admitted");
    poll();
    auto& b = by_seq_.at(it->second);
    bool copy_work = false;
    for (std::size_t s = 0; s < sources; ++s)
      for (const auto& e : b.pages[s]) copy_work = copy_work || e.state == page_state::filling || e.state == page_state::backing_up;
    // Late publishes and backups of this slot must land before the reset and before the slot or its
    // host pages are reused: order the step stream after the copy stream (on the device).
    if (copy_work) copy_.order_before(step_);
    std::vector<retiring_page> leaving;
    for (std::size_t s = 0; s < sources; ++s)
      for (std::size_t page = 0; page < b.pages[s].size(); ++page) {
        auto& e = b.pages[s][page];
        if (e.state == page_state::absent) continue;
        if (e.state == page_state::filling || e.state == page_state::backing_up) --copy_pending_;
        const std::int32_t pool = e.pool;
        const bool was_doomed = doomed_page(s, pool);
        const std::int32_t g = h_.detach_optional_page(id, s, page);
        if (b.reclaiming) drop_reclaimer(s, pool);
        if (g >= 0) {  // its last mapper: the page retires (counted in doomed_ until it is free)
          leaving.push_back({s, g, 0});
          if (!was_doomed) ++doomed_[s];
        } else if (!was_doomed && doomed_page(s, pool)) {
          ++doomed_[s];  // its other mappers are all being reclaimed
        }
        e = {};
      }
    h_.complete(id, step_);
    const std::uint64_t t = step_clock_.record();
    for (auto& r : leaving) {
      r.ticket = t;
      retiring_.push_back(r);
    }
    for (std::size_t s = 0; s < sources; ++s) required_[s] -= cfg_.required_pages + b.pinned_left[s];
    by_seq_.erase(it->second);
    seq_of_.erase(it);
    ++counters_.completions;
  }

  /// Bounded round-robin repopulation as on the host (at most `pages_per_attempt` pages, newest
  /// unmapped eligible page first, requests being reclaimed passed over); the fills run on the copy
  /// stream and are published behind them. Returns the pages reserved.
  std::size_t repopulate() {
    const auto guard = on_device();
    ++counters_.repopulate_calls;
    if constexpr (!traits::keeps_optional_history) return 0;
    poll();
    fill_batch batch;
    const std::size_t mapped = dhisparse::detail::repopulation_walk(
        by_seq_, cursor_, traits::pages_per_attempt, sources,
        [](const request_books& b, std::size_t s) { return b.mapped[s]; },
        [&](request_books& b, std::size_t s) {
          if (b.reclaiming) return false;  // requests being reclaimed are passed over
          const auto page = newest_unmapped(b, s);
          return page >= 0 && fill_one(b, s, static_cast<std::size_t>(page), batch);
        });
    counters_.pages_repopulated += mapped;
    flush_fills(batch);
    return mapped;
  }

  /// Backs up at most `max_pages` device-only pages ahead of any reclaim (newest admissions
  /// first, on the copy stream), so that a later reclaim of those requests retires their pages
  /// without waiting for a backup. An engine may call it when the PCIe link is idle. Returns the
  /// pages queued; they stay ready and mapped, and become host-backed once `poll()` sees the copy.
  std::size_t back_up(std::size_t max_pages) {
    const auto guard = on_device();
    poll();
    std::array<detail::page_batch, sources> batch{};
    std::size_t queued = 0;
    auto flush = [&] {
      bool any = false;
      for (const auto& bt : batch) any = any || bt.count > 0;
      if (!any) return;
      h_.join_backup(step_);  // host rows of a step-wide write still on their way come first
      step_clock_.order_before(copy_stream_);  // behind the imports that wrote the pages
      for (std::size_t s = 0; s < sources; ++s) {
        DHISPARSE_CUDA_TRY(detail::launch_backup_pages(h_.view(s), batch[s], copy_stream_));
        batch[s].count = 0;
      }
      const std::uint64_t t = copy_.record();
      for (auto& [seq, b] : by_seq_)
        for (std::size_t s = 0; s < sources; ++s)
          for (auto& e : b.pages[s])
            if (e.state == page_state::backing_up && e.ticket == unrecorded) e.ticket = t;
    };
    for (auto it = by_seq_.rbegin(); it != by_seq_.rend() && queued < max_pages; ++it) {
      auto& b = it->second;
      const auto slot = static_cast<std::int32_t>(h_.slot_of(b.id));
      for (std::size_t s = 0; s < sources && queued < max_pages; ++s)
        for (std::size_t page = b.pages[s].size(); page-- > 0 && queued < max_pages;) {
          auto& e = b.pages[s][page];
          if (e.state != page_state::ready || !e.device_only) continue;
          e.state = page_state::backing_up;
          e.ticket = unrecorded;
          ++copy_pending_;
          batch[s].push({slot, static_cast<std::int32_t>(page), e.pool, h_.host_page_of(b.id, s, page)});
          ++queued;
          if (batch[s].full()) flush();
        }
    }
    flush();
    return queued;
  }

  /// Advances page states without blocking: finished fills and backups become ready, reclaims
  /// proceed (backup, then unmap on the step stream), retired pages return to the pool. Call it
  /// once a step (admit, complete and repopulate call it too).
  void poll() {
    const auto guard = on_device();
    copy_.poll();
    step_clock_.poll();
    // Retirement: every earlier reader on the step stream has finished.
    std::size_t kept = 0;
    for (auto& r : retiring_) {
      if (step_clock_.done(r.ticket)) {
        h_.recycle_optional_page(r.source, r.pool);
        --held_[r.source];
        --doomed_[r.source];
      } else {
        retiring_[kept++] = r;
      }
    }
    retiring_.resize(kept);
    // Fills and backups that finished (the scan is skipped while none is in flight).
    if (copy_pending_ > 0)
      for (auto& [seq, b] : by_seq_)
        for (std::size_t s = 0; s < sources; ++s)
          for (auto& e : b.pages[s]) {
            if (e.state == page_state::filling && copy_.done(e.ticket)) {
              e.state = page_state::ready;
              --copy_pending_;
            }
            if (e.state == page_state::backing_up && copy_.done(e.ticket)) {
              e.state = page_state::ready;
              e.device_only = false;
              --copy_pending_;
            }
          }
    advance_reclaims();
  }

  /// Blocks until both streams are idle and every in-flight page step has finished (tests,
  /// benchmarks and shutdown; never on the step path).
  void drain() {
    const auto guard = on_device();
    for (int round = 0; round < 8; ++round) {
      DHISPARSE_CUDA_TRY(cudaStreamSynchronize(copy_stream_));
      DHISPARSE_CUDA_TRY(cudaStreamSynchronize(step_));
      poll();  // may enqueue backups and unmaps: go round again
      if (copy_.idle() && step_clock_.idle() && retiring_.empty() && copy_pending_ == 0 && !any_reclaiming()) return;
    }
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(copy_stream_));
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(step_));
    poll();
  }

  /// Cross-checks the ledger and the books (host only; no device access). "" when consistent.
  /// Shared prefixes: every held page is the pool page serving its host page, each pool page's
  /// mapper count equals the requests holding it, a shared page is never device-only, M_opt counts
  /// each pool page once and the pages being reclaimed count once every mapper is reclaiming.
  [[nodiscard]] std::string audit() const {
    const std::size_t m = capacity_pages();
    if (h_.admitted_count() != by_seq_.size())
      return "hierarchy admits " + std::to_string(h_.admitted_count()) + " requests, the books " +
             std::to_string(by_seq_.size());
    std::size_t claim_total = 0;
    for (const auto& [id, take] : claims_) claim_total += take;
    for (std::size_t s = 0; s < sources; ++s) {
      const std::string src = "source " + std::to_string(s) + ": ";
      std::size_t req = 0, held = 0, doomed = 0;
      struct pool_use {
        std::uint32_t mappers = 0, reclaiming = 0;
        bool device_only = false;
      };
      std::map<std::int32_t, pool_use> uses;  // pool page -> its mappers (shared prefixes: several)
      for (const auto& [seq, b] : by_seq_) {
        const std::string who = src + "request " + std::to_string(b.id) + ": ";
        if (!h_.contains(b.id)) return who + "not admitted in the hierarchy";
        const std::size_t eligible = eligible_pages(b, s);
        std::size_t count = 0;
        for (std::size_t page = 0; page < b.pages[s].size(); ++page) {
          const auto& e = b.pages[s][page];
          if (e.state == page_state::absent) {
            if (e.device_only) return who + "page " + std::to_string(page) + " is device-only but not on the GPU";
            continue;
          }
          ++count;
          if (page >= eligible)
            return who + "page " + std::to_string(page) + " is mapped but only " + std::to_string(eligible) +
                   " pages are eligible";
          if (e.pool < 0) return who + "page " + std::to_string(page) + " is mapped without a pool page";
          const std::int32_t host = h_.host_page_of(b.id, s, page);
          const std::int32_t serving = host < 0 ? -1 : h_.optional_page_of_host(s, static_cast<page_id>(host));
          if (serving != e.pool)
            return who + "page " + std::to_string(page) + " holds pool page " + std::to_string(e.pool) +
                   " but its host page is served by " + std::to_string(serving);
          auto& u = uses[e.pool];
          ++u.mappers;
          if (b.reclaiming) ++u.reclaiming;
          u.device_only = u.device_only || e.device_only;
        }
        if (count != b.mapped[s])
          return who + std::to_string(count) + " pages held, the books say " + std::to_string(b.mapped[s]);
        if (traits::pins_history && b.pinned_left[s] + b.mapped[s] != pinned_pages_per_request())
          return who + "pinned reservation " + std::to_string(b.pinned_left[s]) + " + mapped " +
                 std::to_string(b.mapped[s]) + " != " + std::to_string(pinned_pages_per_request());
        req += cfg_.required_pages + b.pinned_left[s];
      }
      std::size_t reclaimed_pages = 0;  // pool pages with a reclaiming mapper
      for (const auto& [g, u] : uses) {
        const std::string pg = src + "pool page " + std::to_string(g) + ": ";
        if (h_.optional_page_refs(s, g) != u.mappers)
          return pg + "mapped by " + std::to_string(u.mappers) + " requests, its count says " +
                 std::to_string(h_.optional_page_refs(s, g));
        if (u.mappers > 1 && u.device_only) return pg + "shared by " + std::to_string(u.mappers) + " requests but device-only";
        if (u.reclaiming > 0) {
          ++reclaimed_pages;
          const auto r = reclaimers_[s].find(g);
          if (r == reclaimers_[s].end() || r->second != u.reclaiming)
            return pg + std::to_string(u.reclaiming) + " mappers are being reclaimed, the books say " +
                   std::to_string(r == reclaimers_[s].end() ? 0u : r->second);
        }
        if (u.reclaiming == u.mappers) ++doomed;  // every mapper is being reclaimed: it will retire
      }
      if (reclaimed_pages != reclaimers_[s].size())
        return src + std::to_string(reclaimers_[s].size()) + " pool pages have reclaiming mappers in the books, " +
               std::to_string(reclaimed_pages) + " in fact";
      held = uses.size();  // M_opt counts each pool page once, however many requests share it
      const std::size_t retiring = retiring_pages(s);
      held += retiring;
      doomed += retiring;
      if (req != required_[s]) return src + "M_req is " + std::to_string(required_[s]) + ", books sum to " + std::to_string(req);
      if (held != held_[s]) return src + "M_opt is " + std::to_string(held_[s]) + ", books sum to " + std::to_string(held);
      if (doomed != doomed_[s])
        return src + std::to_string(doomed_[s]) + " pages counted as being reclaimed, books sum to " + std::to_string(doomed);
      if (claim_total != claimed_[s])
        return src + std::to_string(claimed_[s]) + " pages claimed, claims sum to " + std::to_string(claim_total);
      if (!ledger(s).holds())
        return src + "M_req + M_opt + M_res = " + std::to_string(req) + " + " + std::to_string(held) + " + " +
               std::to_string(cfg_.reserve_pages) + " exceeds M = " + std::to_string(m);
      if (h_.free_optional_pages(s) + held != m)
        return src + std::to_string(h_.free_optional_pages(s)) + " free + " + std::to_string(held) +
               " held optional pages != " + std::to_string(m);
    }
    return {};
  }

 private:
  static constexpr std::uint64_t unrecorded = ~std::uint64_t{0};  // queued, ticket not yet recorded
  struct page_entry {
    page_state state = page_state::absent;
    bool device_only = false;
    std::int32_t pool = -1;
    std::uint64_t ticket = 0;  // copy-stream ticket of the fill or backup in flight
  };
  struct request_books {
    request_id id = 0;
    std::array<std::int64_t, sources> imported{};
    std::array<std::size_t, sources> mapped{};       // pool pages held: filling, ready, backing up
    std::array<std::size_t, sources> pinned_left{};  // pinning: reserved pages not yet mapped
    std::array<std::vector<page_entry>, sources> pages;
    bool reclaiming = false;
    std::size_t refill_source = 0;  // repopulation_walk's source cursor
  };
  struct retiring_page {
    std::size_t source = 0;
    std::int32_t pool = -1;
    std::uint64_t ticket = 0;  // step-stream ticket behind the unmap (or the completion reset)
  };

  static void check_source(std::size_t source) {
    if (source >= sources)
      throw invalid_source("source " + std::to_string(source) + " outside the layout's " + std::to_string(sources));
  }
  /// Makes the manager's device current for one call; the thread's device comes back when the
  /// guard goes (also on a throw).
  [[nodiscard]] detail::device_guard on_device() const { return detail::device_guard(h_.device()); }
  [[nodiscard]] const request_books& books_of(request_id id) const {
    const auto it = seq_of_.find(id);
    if (it == seq_of_.end()) throw unknown_request("residency: request " + std::to_string(id) + " is not admitted");
    return by_seq_.at(it->second);
  }
  [[nodiscard]] request_books& books_of(request_id id) {
    return const_cast<request_books&>(std::as_const(*this).books_of(id));
  }
  [[nodiscard]] bool any_reclaiming() const {
    for (const auto& [seq, b] : by_seq_)
      if (b.reclaiming) return true;
    return false;
  }
  /// Pages optional history may still take: the ledger's spare less the claims of waiting admissions.
  [[nodiscard]] std::size_t spare(std::size_t s) const {
    const std::size_t sp = ledger(s).spare();
    return sp > claimed_[s] ? sp - claimed_[s] : 0;
  }
  residency_admission& wait(residency_admission& r, admit_status why) {
    r.status = why;
    ++counters_.admissions_waited;
    if (why == admit_status::wait_for_slot) ++counters_.waits_for_slot;
    if (why == admit_status::wait_for_memory) ++counters_.waits_for_memory;
    if (why == admit_status::wait_for_host_pages) ++counters_.waits_for_host_pages;
    if (why == admit_status::wait_for_reclaim) ++counters_.waits_for_reclaim;
    return r;
  }

  /// Both admissions (`prefix` empty for a plain one): `count_of(s)` and `first_of(s)` describe
  /// the import of source s, `import(s, device_pages)` runs it.
  template <class CountOf, class FirstOf, class Import>
  residency_admission admit_impl(request_id id, std::optional<prefix_id> prefix, std::size_t imports, CountOf count_of,
                                 FirstOf first_of, Import import) {
    const auto guard = on_device();
    if (seq_of_.contains(id) || h_.contains(id))
      throw duplicate_admission("residency: request " + std::to_string(id) + " is already admitted");
    if (imports != 0 && imports != sources)
      throw size_mismatch("residency: admission of request " + std::to_string(id) + " imports history for " +
                          std::to_string(imports) + " sources, the layout has " + std::to_string(sources));
    std::array<std::size_t, sources> base{};  // prefix rows
    if (prefix)
      for (std::size_t s = 0; s < sources; ++s) base[s] = static_cast<std::size_t>(h_.prefix_rows(*prefix, s));
    std::array<std::size_t, sources> rows{};
    for (std::size_t s = 0; s < imports; ++s) {
      if (first_of(s) != static_cast<std::int64_t>(base[s]))
        throw suffix_misaligned("residency: request " + std::to_string(id) + " imports rows from row " +
                                std::to_string(first_of(s)) + " on source " + std::to_string(s) + ", " +
                                (prefix ? "prefix " + std::to_string(*prefix) + " ends at row "
                                        : std::string("a plain admission starts at row ")) +
                                std::to_string(base[s]));
      rows[s] = count_of(s);
      if (rows[s] > h_.config().max_rows - base[s])
        throw capacity_exceeded("residency: request " + std::to_string(id) + " imports " + std::to_string(rows[s]) +
                                " rows on source " + std::to_string(s) + " on top of " + std::to_string(base[s]) +
                                ", capacity is " + std::to_string(h_.config().max_rows));
    }
    poll();
    residency_admission result;
    if (h_.admitted_count() >= h_.config().max_requests) return wait(result, admit_status::wait_for_slot);
    for (std::size_t s = 0; s < sources; ++s)  // new pages: the boundary copy of a partial prefix page and the rest
      if ((base[s] + rows[s] + page_rows - 1) / page_rows - base[s] / page_rows > h_.free_host_pages(s))
        return wait(result, admit_status::wait_for_host_pages);

    const std::size_t take = cfg_.required_pages + pinned_pages_per_request();
    const auto claim = claims_.find(id);
    if (claim == claims_.end()) {
      // Pages already being reclaimed count as gone; claims of waiting admissions as taken.
      std::array<std::size_t, sources> used{};
      for (std::size_t s = 0; s < sources; ++s)
        used[s] = required_[s] + (held_[s] - doomed_[s]) + cfg_.reserve_pages + claimed_[s];
      const auto deficit = dhisparse::detail::residency_deficit<sources>(used, take, capacity_pages());
      std::array<std::size_t, sources> freed{};
      const auto picked = pick_victims(deficit, freed);
      if (!picked) return wait(result, admit_status::wait_for_memory);
      for (request_books* v : *picked) {
        v->reclaiming = true;
        for (std::size_t s = 0; s < sources; ++s)
          for (const auto& e : v->pages[s])
            if (e.state != page_state::absent) change_doom(s, e.pool, [&] { ++reclaimers_[s][e.pool]; });
        ++counters_.requests_reclaimed;  // pages_reclaimed counts pages as they return to the pool
      }
      for (std::size_t s = 0; s < sources; ++s) result.reclaimed_pages += freed[s];
      result.reclaimed_requests = picked->size();
      if (!fits_now(take)) {
        claims_.emplace(id, take);
        for (std::size_t s = 0; s < sources; ++s) claimed_[s] += take;
        advance_reclaims();
        return wait(result, admit_status::wait_for_reclaim);
      }
    } else {
      // A retry: admitted once the capacity claimed for it has retired.
      for (std::size_t s = 0; s < sources; ++s) claimed_[s] -= take;
      if (!fits_now(take)) {
        for (std::size_t s = 0; s < sources; ++s) claimed_[s] += take;
        return wait(result, admit_status::wait_for_reclaim);
      }
      claims_.erase(claim);
    }

    // Commit: admit, import resident-first, account.
    if (prefix) h_.join_backup(step_);  // the prefix's rows are read on the step stream: their host copies first
    const admission a = prefix ? h_.admit(id, *prefix, step_) : h_.admit(id, step_);  // slot and host pages: checked
    result.slot = a.slot;
    const std::uint64_t seq = next_seq_++;
    auto& b = by_seq_[seq];
    b.id = id;
    seq_of_.emplace(id, seq);
    const std::size_t ppr = (h_.config().max_rows + page_rows - 1) / page_rows;
    for (std::size_t s = 0; s < sources; ++s) {
      b.pages[s].assign(ppr, page_entry{});
      b.pinned_left[s] = pinned_pages_per_request();
      required_[s] += cfg_.required_pages + b.pinned_left[s];
      b.imported[s] = static_cast<std::int64_t>(base[s]);
    }
    try {
      for (std::size_t s = 0; s < imports; ++s)
        result.mapped_pages +=
            import_chunk(b, s, rows[s], [&](std::size_t device_pages) { return import(s, device_pages); });
    } catch (...) {
      // Bad input found by the hierarchy: undo the admission; pages imported for earlier sources
      // retire behind the reset like a completion's.
      std::vector<retiring_page> leaving;
      for (std::size_t s = 0; s < sources; ++s) {
        required_[s] -= cfg_.required_pages + b.pinned_left[s];
        for (std::size_t page = 0; page < b.pages[s].size(); ++page)
          if (b.pages[s][page].state != page_state::absent) {
            leaving.push_back({s, h_.detach_optional_page(id, s, page), 0});
            ++doomed_[s];
          }
      }
      h_.complete(id, step_);
      const std::uint64_t t = step_clock_.record();
      for (auto& r : leaving) {
        r.ticket = t;
        retiring_.push_back(r);
      }
      by_seq_.erase(seq);
      seq_of_.erase(id);
      throw;
    }
    if (prefix && traits::keeps_optional_history) {
      fill_batch batch;
      for (std::size_t s = 0; s < sources; ++s) result.mapped_pages += map_prefix(b, s, batch);
      flush_fills(batch);
    }
    result.status = admit_status::admitted;
    ++counters_.admissions;
    return result;
  }

  /// The constructors' common part: the ledger check, then the kernels and the copy stream.
  void start() {
    dhisparse::detail::check_one_request_fits(cfg_.required_pages, cfg_.reserve_pages, pinned_pages_per_request(),
                                              traits::pins_history, capacity_pages());
    // Load the fill, backup, map-store and import kernels now: under lazy module loading their
    // first launch (a repopulate, a reclaim) could otherwise synchronise the context, i.e. stall
    // the host and order the step stream behind copy-stream work.
    DHISPARSE_CUDA_TRY(detail::preload_residency_kernels(h_.view(0)));
    DHISPARSE_CUDA_TRY(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
    copy_ = detail::stream_clock(copy_stream_);
    DHISPARSE_CUDA_TRY(cudaEventCreateWithFlags(&handoff_, cudaEventDisableTiming));
  }
  /// Imported rows must be a prefix of the history: no decode row (appended, committed, or a staged
  /// block) may precede them.
  void check_not_decoding(const request_books& b, std::size_t s) const {
    dhisparse::detail::check_not_decoding(b.id, s, h_.positions(b.id, s), b.imported[s],
                                          layout::sources[s].positions_per_row, h_.staged_rows(b.id, s));
  }
  /// A kernel reads the rows: pageable host memory is refused unless the device can access it.
  void check_device_accessible(const std::byte* rows) const {
    cudaPointerAttributes attr{};
    DHISPARSE_CUDA_TRY(cudaPointerGetAttributes(&attr, rows));
    detail::check_memory_device(attr, h_.device(), "residency: import_history", "the rows");
    if (attr.type != cudaMemoryTypeUnregistered) return;
    int pageable = 0;
    DHISPARSE_CUDA_TRY(cudaDeviceGetAttribute(&pageable, cudaDevAttrPageableMemoryAccess, h_.device()));
    if (pageable == 0)
      throw invalid_configuration("residency: import_history rows must be device-accessible (device or pinned "
                                  "memory); use the std::span overload for pageable host memory");
  }
  /// Validates a streamed chunk: the request, the source, no decode rows yet, room in max_rows.
  request_books& check_chunk(request_id id, std::size_t s, std::size_t count) {
    auto& b = books_of(id);
    check_source(s);
    check_not_decoding(b, s);
    const std::size_t max_rows = h_.config().max_rows, frontier = static_cast<std::size_t>(h_.frontier(id, s));
    if (count > max_rows - frontier)
      throw capacity_exceeded("residency: request " + std::to_string(id) + " imports " + std::to_string(count) +
                              " rows on source " + std::to_string(s) + " on top of " + std::to_string(frontier) +
                              ", capacity is " + std::to_string(max_rows));
    return b;
  }
  /// Imports one validated chunk of `count` rows resident-first, as the host manager places it: the
  /// pages the chunk completes, newest first, while the ledger allows (a pinning policy: every one).
  /// `import(device_pages)` runs hierarchy::import_rows, which writes the newest `device_pages`
  /// pages lying wholly in the chunk straight into pool pages (device-only) and throws with nothing
  /// changed. The page the chunk completes that an earlier chunk began is host-backed already: it
  /// is filled from the host store on the copy stream, last (it is the oldest). A request being
  /// reclaimed takes no page. Returns the pages mapped.
  template <class Import>
  std::size_t import_chunk(request_books& b, std::size_t s, std::size_t count, Import import) {
    if (count == 0) return 0;
    const auto before = static_cast<std::size_t>(b.imported[s]);
    const std::size_t first = before / page_rows, last = (before + count) / page_rows;  // pages completed
    const std::size_t first_whole = (before + page_rows - 1) / page_rows;               // ... lying in the chunk
    const std::size_t whole = last > first_whole ? last - first_whole : 0;
    std::size_t device_pages = 0;
    if (!b.reclaiming) {
      if constexpr (traits::pins_history) device_pages = std::min(b.pinned_left[s], whole);
      else if constexpr (traits::keeps_optional_history) device_pages = std::min(spare(s), whole);
    }
    const auto taken = import(device_pages);
    b.imported[s] += static_cast<std::int64_t>(count);
    for (const auto& [page, g] : taken) {
      b.pages[s][page] = {page_state::ready, true, g, 0};
      account_mapped(b, s, true);
    }
    std::size_t mapped = taken.size();
    if (traits::keeps_optional_history && !b.reclaiming && first < first_whole && first < last &&
        taken.size() == whole) {
      fill_batch batch;
      if (fill_one(b, s, first, batch)) ++mapped;
      flush_fills(batch);
    }
    return mapped;
  }

  /// The new request's required pages fit the ledger now, other claims respected.
  [[nodiscard]] bool fits_now(std::size_t take) const {
    for (std::size_t s = 0; s < sources; ++s)
      if (required_[s] + held_[s] + cfg_.reserve_pages + claimed_[s] + take > capacity_pages()) return false;
    return true;
  }

  /// Books a page mapped for `b`; `fresh`: it took a pool page (a joined shared page is already in M_opt).
  void account_mapped(request_books& b, std::size_t s, bool fresh) {
    ++b.mapped[s];
    if (fresh) ++held_[s];
    if constexpr (traits::pins_history) {
      --b.pinned_left[s];
      --required_[s];
    }
    ++counters_.pages_mapped;
  }

  void after_append(request_books& b, std::size_t source, std::int64_t before) {
    if constexpr (traits::pins_history) {
      fill_batch batch;
      const auto after = static_cast<std::size_t>(h_.frontier(b.id, source));
      for (std::size_t page = static_cast<std::size_t>(before) / page_rows; page < after / page_rows; ++page)
        fill_one(b, source, page, batch);
      flush_fills(batch);
    }
  }

  /// Complete pages of a request/source that may be optional history: imported pages, or under a
  /// pinning policy every complete page; none without optional history.
  [[nodiscard]] std::size_t eligible_pages(const request_books& b, std::size_t s) const {
    if (!traits::keeps_optional_history) return 0;
    const std::int64_t rows = traits::pins_history ? h_.frontier(b.id, s) : b.imported[s];
    return static_cast<std::size_t>(rows) / page_rows;
  }
  [[nodiscard]] std::int64_t newest_unmapped(const request_books& b, std::size_t s) const {
    for (std::size_t page = eligible_pages(b, s); page-- > 0;)
      if (b.pages[s][page].state == page_state::absent) return static_cast<std::int64_t>(page);
    return -1;
  }

  /// Queued copy-stream work of one call: fills (copy, then publish) and publishes of joined
  /// shared pages (no copy), per source.
  struct fill_batch {
    std::array<detail::page_batch, sources> fill{}, publish{};
  };

  /// Pool page serving history page `page` of a request through another request mapping its host
  /// page (shared prefixes), -1 when none.
  [[nodiscard]] std::int32_t served_by(const request_books& b, std::size_t s, std::size_t page) const {
    const std::int32_t host = h_.host_page_of(b.id, s, page);
    return host < 0 ? -1 : h_.optional_page_of_host(s, static_cast<page_id>(host));
  }
  /// True when every request mapping pool page `g` is being reclaimed: it will retire, so it
  /// counts as gone (doomed_) and is not joined.
  [[nodiscard]] bool doomed_page(std::size_t s, std::int32_t g) const {
    const auto it = reclaimers_[s].find(g);
    return it != reclaimers_[s].end() && it->second == h_.optional_page_refs(s, g);
  }
  /// Applies `change` (to the reclaimers or the mappers of pool page `g`) and keeps doomed_ in step.
  template <class Change>
  void change_doom(std::size_t s, std::int32_t g, Change change) {
    const bool before = doomed_page(s, g);
    change();
    const bool after = doomed_page(s, g);
    if (after && !before) ++doomed_[s];
    if (before && !after) --doomed_[s];
  }
  /// One reclaiming mapper of pool page `g` fewer (it detached from the page).
  void drop_reclaimer(std::size_t s, std::int32_t g) {
    const auto it = reclaimers_[s].find(g);
    if (it != reclaimers_[s].end() && --it->second == 0) reclaimers_[s].erase(it);
  }

  /// Maps one page if the ledger allows it: a fresh pool page is reserved and filled from the host
  /// store; a page whose host page another request maps joins that pool page (no spare page
  /// needed, published without a copy behind the first mapping's fill). Queued in `batch` (flushed
  /// when full and by `flush_fills`).
  bool fill_one(request_books& b, std::size_t s, std::size_t page, fill_batch& batch) {
    const std::int32_t served = served_by(b, s, page);
    if (served >= 0 && doomed_page(s, served)) return false;  // retiring soon: mapped again afterwards
    if constexpr (traits::pins_history) {
      if (b.pinned_left[s] == 0) return false;
    } else {
      if (served < 0 && spare(s) == 0) return false;
    }
    bool shared = false;
    const std::int32_t g = h_.reserve_optional_page(b.id, s, page, &shared);
    if (g < 0) return false;  // cannot happen while the books agree
    auto& e = b.pages[s][page];
    e = {page_state::filling, false, g, unrecorded};
    ++copy_pending_;
    account_mapped(b, s, !shared);
    auto& q = shared ? batch.publish[s] : batch.fill[s];
    q.push({static_cast<std::int32_t>(h_.slot_of(b.id)), static_cast<std::int32_t>(page), g,
            h_.host_page_of(b.id, s, page)});
    pending_fills_.push_back({b.id, s, page});
    if (q.full()) flush_fills(batch);
    return true;
  }

  /// Enqueues the queued fills on the copy stream behind the step stream's work so far (the
  /// slots' admissions and the host rows' appends), publishes them behind the copies (joined
  /// shared pages behind every fill so far, their first mapping's included), and gives their
  /// pages the ticket behind the publish.
  void flush_fills(fill_batch& batch) {
    bool any = false;
    for (std::size_t s = 0; s < sources; ++s) any = any || batch.fill[s].count > 0 || batch.publish[s].count > 0;
    if (!any) return;
    h_.join_backup(step_);  // the fills read host rows: a pending step-wide backup comes first
    step_clock_.order_before(copy_stream_);
    for (std::size_t s = 0; s < sources; ++s) {
      if (batch.fill[s].count > 0) {
        DHISPARSE_CUDA_TRY(detail::launch_fill_pages(h_.view(s), batch.fill[s], copy_stream_));
        DHISPARSE_CUDA_TRY(detail::launch_store_map(h_.view(s), batch.fill[s], false, copy_stream_));
      }
      DHISPARSE_CUDA_TRY(detail::launch_store_map(h_.view(s), batch.publish[s], false, copy_stream_));
      batch.fill[s].count = 0;
      batch.publish[s].count = 0;
    }
    const std::uint64_t t = copy_.record();
    for (const auto& f : pending_fills_) {
      auto it = seq_of_.find(f.id);
      if (it == seq_of_.end()) continue;
      auto& e = by_seq_.at(it->second).pages[f.source][f.page];
      if (e.state == page_state::filling && e.ticket == unrecorded) e.ticket = t;
    }
    pending_fills_.clear();
  }

  /// Maps the pages of a request admitted on a prefix after its suffix import (which took the
  /// newest pages lying wholly in the suffix): first every page another request already maps (no
  /// pool page taken), then the others newest first while the ledger allows, as the host manager.
  std::size_t map_prefix(request_books& b, std::size_t s, fill_batch& batch) {
    const std::size_t eligible = eligible_pages(b, s);
    std::size_t mapped = 0;
    for (std::size_t page = 0; page < eligible; ++page)
      if (b.pages[s][page].state == page_state::absent && served_by(b, s, page) >= 0 && fill_one(b, s, page, batch))
        ++mapped;
    for (std::size_t page = eligible; page-- > 0;) {
      if (b.pages[s][page].state != page_state::absent) continue;
      if (const std::int32_t g = served_by(b, s, page); g >= 0 && doomed_page(s, g)) continue;
      if (!fill_one(b, s, page, batch)) break;
      ++mapped;
    }
    return mapped;
  }

  /// Whole requests to reclaim, in the policy's order, whose unmapping frees pool pages covering
  /// every source's deficit (detail/residency_reclaim.hpp's choice, with sharing): a request
  /// holding pages is one of the q; a pool page it shares is freed only once every request mapping
  /// it is a victim or already being reclaimed. `freed`: the pages they free. nullopt when all cannot.
  std::optional<std::vector<request_books*>> pick_victims(const std::array<std::size_t, sources>& deficit,
                                                          std::array<std::size_t, sources>& freed) {
    if constexpr (traits::pins_history) {  // pinned pages are never reclaimed
      for (std::size_t s = 0; s < sources; ++s)
        if (freed[s] < deficit[s]) return std::nullopt;
      return std::vector<request_books*>{};
    }
    return dhisparse::detail::pick_whole_requests<traits::order>(
        by_seq_, deficit, freed, [](const request_books& b) { return b.reclaiming; },
        [](const request_books& b, std::size_t s, auto&& f) {
          for (const auto& e : b.pages[s])
            if (e.state != page_state::absent) f(e.pool);
        },
        [&](std::size_t s, std::int32_t g) {  // requests mapping g that are not being reclaimed already
          const auto r = reclaimers_[s].find(g);
          return h_.optional_page_refs(s, g) - (r == reclaimers_[s].end() ? 0u : r->second);
        });
  }

  /// Backs up, on the step stream, the device-only pages a new prefix retains (admissions on it
  /// read their host copies on that stream); pages whose backup is already in flight on the copy
  /// stream are ordered before the step stream instead.
  void back_up_retained(request_books& b, prefix_id prefix) {
    std::array<detail::page_batch, sources> batch{};
    bool ordered = false, copying = false;
    const auto slot = static_cast<std::int32_t>(h_.slot_of(b.id));
    auto flush = [&] {
      bool any = false;
      for (const auto& bt : batch) any = any || bt.count > 0;
      if (!any) return;
      if (!ordered) {
        h_.join_backup(step_);
        ordered = true;
      }
      for (std::size_t s = 0; s < sources; ++s) {
        DHISPARSE_CUDA_TRY(detail::launch_backup_pages(h_.view(s), batch[s], step_));
        batch[s].count = 0;
      }
    };
    for (std::size_t s = 0; s < sources; ++s) {
      // Every page holding prefix rows, the partial last one included: its rows are read from the
      // host store by the boundary copy and the tail fill of admissions on the prefix, and the
      // request's page may be complete and device-only although the prefix ends inside it.
      const auto rows = static_cast<std::size_t>(h_.prefix_rows(prefix, s));
      const std::size_t pages = (rows + page_rows - 1) / page_rows;
      for (std::size_t page = 0; page < pages; ++page) {
        auto& e = b.pages[s][page];
        if (!e.device_only) continue;
        if (e.state == page_state::backing_up) {
          copying = true;  // poll() turns it ready once the copy stream's backup is seen
        } else {
          batch[s].push({slot, static_cast<std::int32_t>(page), e.pool, h_.host_page_of(b.id, s, page)});
          if (batch[s].full()) flush();
        }
        e.device_only = false;
      }
    }
    if (copying) copy_.order_before(step_);
    flush();
  }

  /// Moves every request being reclaimed forward: back up device-only ready pages (copy stream,
  /// after the step stream's work so far, which includes their import), unmap host-backed ready
  /// pages on the step stream and retire them behind a step-stream ticket.
  void advance_reclaims() {
    std::array<detail::page_batch, sources> backup{}, unmap{};
    std::vector<std::pair<request_books*, std::size_t>> backed;  // (request, source) of queued backups
    struct leaving {
      request_books* b;
      std::size_t s, page;
    };
    std::vector<leaving> unmapped;
    bool ordered = false;
    auto flush_backups = [&] {
      bool any = false;
      for (const auto& bt : backup) any = any || bt.count > 0;
      if (!any) return;
      if (!ordered) {
        h_.join_backup(step_);
        step_clock_.order_before(copy_stream_);
        ordered = true;
      }
      for (std::size_t s = 0; s < sources; ++s) {
        DHISPARSE_CUDA_TRY(detail::launch_backup_pages(h_.view(s), backup[s], copy_stream_));
        backup[s].count = 0;
      }
      const std::uint64_t t = copy_.record();
      for (auto& [b, s] : backed)
        for (auto& e : b->pages[s])
          if (e.state == page_state::backing_up && e.ticket == unrecorded) e.ticket = t;
      backed.clear();
    };
    auto flush_unmaps = [&] {
      bool any = false;
      for (const auto& bt : unmap) any = any || bt.count > 0;
      if (!any) return;
      for (std::size_t s = 0; s < sources; ++s) {
        DHISPARSE_CUDA_TRY(detail::launch_store_map(h_.view(s), unmap[s], true, step_));
        unmap[s].count = 0;
      }
      const std::uint64_t t = step_clock_.record();
      for (const auto& l : unmapped) {
        auto& e = l.b->pages[l.s][l.page];
        const std::int32_t pool = e.pool;
        const std::int32_t g = h_.detach_optional_page(l.b->id, l.s, l.page);
        drop_reclaimer(l.s, pool);  // doomed or not, the page stays so (one mapper and one reclaimer fewer)
        if (g >= 0) {               // its last mapper: it retires, and stays in held_ and doomed_ meanwhile
          retiring_.push_back({l.s, g, t});
          ++counters_.pages_reclaimed;
        }
        e = {};
        --l.b->mapped[l.s];
      }
      unmapped.clear();
    };
    for (auto& [seq, b] : by_seq_) {
      if (!b.reclaiming) continue;
      const auto slot = static_cast<std::int32_t>(h_.slot_of(b.id));
      for (std::size_t s = 0; s < sources; ++s)
        for (std::size_t page = 0; page < b.pages[s].size(); ++page) {
          auto& e = b.pages[s][page];
          if (e.state != page_state::ready) continue;  // absent, or a fill / backup still in flight
          const detail::page_task task{slot, static_cast<std::int32_t>(page), e.pool, h_.host_page_of(b.id, s, page)};
          if (e.device_only) {
            e.state = page_state::backing_up;
            e.ticket = unrecorded;
            ++copy_pending_;
            backup[s].push(task);
            backed.emplace_back(&b, s);
            if (backup[s].full()) flush_backups();
          } else {
            unmap[s].push(task);
            unmapped.push_back({&b, s, page});
            if (unmap[s].full()) flush_unmaps();
          }
        }
    }
    flush_backups();
    flush_unmaps();
    for (auto& [seq, b] : by_seq_) {
      if (!b.reclaiming) continue;
      bool empty = true;
      for (std::size_t s = 0; s < sources; ++s) empty = empty && b.mapped[s] == 0;
      if (empty) b.reclaiming = false;  // its pages are retiring (still doomed until free)
    }
  }

  struct fill_ref {
    request_id id;
    std::size_t source, page;
  };

  Hierarchy h_;
  residency_config cfg_;
  cudaStream_t step_ = nullptr;
  cudaStream_t copy_stream_ = nullptr;
  cudaEvent_t handoff_ = nullptr;  // orders an import's stream and the step stream (import_history)
  detail::stream_clock copy_;
  detail::stream_clock step_clock_{step_};
  std::array<std::size_t, sources> required_{};  // M_req
  std::array<std::size_t, sources> held_{};      // M_opt: pool pages held by requests or retiring
  std::array<std::size_t, sources> doomed_{};    // of held_: pages of requests being reclaimed, and retiring pages
  std::array<std::size_t, sources> claimed_{};   // required pages claimed by admissions waiting for reclaim
  // Per source: pool page -> requests being reclaimed that still map it (shared prefixes: a page
  // is doomed once every mapper is among them).
  std::array<std::unordered_map<std::int32_t, std::uint32_t>, sources> reclaimers_;
  std::map<std::uint64_t, request_books> by_seq_;
  std::unordered_map<request_id, std::uint64_t> seq_of_;
  std::unordered_map<request_id, std::size_t> claims_;
  std::vector<retiring_page> retiring_;
  std::vector<fill_ref> pending_fills_;
  std::size_t copy_pending_ = 0;  // pages filling or backing up
  std::uint64_t next_seq_ = 1;
  std::uint64_t cursor_ = 0;
  residency_counters counters_;
};

}  // namespace dhisparse::cuda
