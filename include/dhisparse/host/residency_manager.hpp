#pragma once
/// \file
/// Load-adaptive residency on the host reference hierarchy (paper §3.1-3.2, docs/residency.md):
/// optional history, resident-first admission and whole-request reclaim, as a component that owns a
/// `host_hierarchy` and the memory ledger of each source's optional pool.
///
/// Ledger, per source, in optional-pool pages (M = hierarchy_config::optional_pages):
///   M_req = sum over admitted requests of residency_config::required_pages (plus, under a policy
///           that pins history, the request's reserved history pages not yet mapped),
///   M_opt = optional pages mapped (the hierarchy's optional maps),
///   M_res = residency_config::reserve_pages,
/// and Invariant 3 is `M_req + M_opt + M_res <= M` after every public call (`invariant_holds`,
/// `audit`). Optional pages are only ever mapped into the spare `M - M_req - M_opt - M_res`.
///
/// - `admit(id, history)`: resident-first admission. If the admission's required pages leave a
///   deficit of Δ_s pages on some source, whole requests are walked in the policy's reclaim order
///   and the first q holding optional pages whose pages cover every Δ_s lose *all* their optional
///   pages (every source); the others keep theirs (requests holding none are passed over). If the optional pages cannot cover Δ (or no slot / host page
///   is free), the call returns a wait status and nothing changes. Otherwise the request is
///   admitted, its prefilled history imported through `append`, and complete pages of the imported
///   history are mapped as optional history, newest page first, while spare pages remain
///   (a pinning policy maps every complete page).
/// - Streamed admission: `admit(id)` admits before the history exists; `import_history(id, source,
///   rows, count)` then delivers it per source and in chunks. Each chunk's completed pages are placed
///   as it arrives, newest first while spare pages remain; a page placed earlier is never displaced
///   (so with spare pages short, the earliest chunks keep theirs and repopulation later fills the
///   newest gaps first). `admit(id, history)` is `admit(id)` plus one chunk per source.
/// - `admit(id, prefix, suffix)`: the same on a retained prefix (docs/prefixes.md): the request
///   shares the prefix's host pages and imports only the suffix; optional pages another request
///   already maps are shared (one pool page, counted once in M_opt) and reclaim frees a shared page
///   only with every request that maps it.
/// - `complete(id)`: releases the request's slot and its references on host and optional pages,
///   and its required pages.
/// - `repopulate()`: bounded round-robin refill (detail/repopulation_walk.hpp): at most
///   `pages_per_attempt` pages a call; a turn gives each request one page, on the source where it
///   holds the fewest, its newest unmapped eligible page; turns start after the last request served.
///
/// Invariant 1 holds trivially on the host backend: `append` writes every row's host copy
/// synchronously, so reclaim never has to wait for a backup. Deferred host backup (resident-first
/// on a GPU) is a CUDA-backend concern and is not modelled here.
///
/// `hierarchy()` is read-only; `step()` gives the per-step operations (resolve, copy_follower, the
/// speculative round), none of which can admit, complete, map or unmap, and this class's `append`
/// takes decode rows.
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
#include "../layout.hpp"
#include "../policies/residency.hpp"
#include "../step_handle.hpp"
#include "../types.hpp"
#include "host_store.hpp"

namespace dhisparse {

/// Sizes of the residency ledger (per source, in optional-pool pages).
struct residency_config {
  std::size_t required_pages = 0;  ///< required allocation of each admitted request on each source
  std::size_t reserve_pages = 0;   ///< M_res: admission reserve, never lent to optional history
};

/// Outcome of `residency_manager::admit`. Every status but `admitted` is a wait: nothing changed,
/// the engine retries later (after a completion, for example).
enum class admit_status : std::uint8_t {
  /// the request holds a slot (`residency_admission::slot`) and its prefilled history is imported
  admitted,
  wait_for_slot,        ///< every request slot of the hierarchy is taken
  wait_for_memory,      ///< the optional pages of all admitted requests cannot cover the deficit
  wait_for_host_pages,  ///< the host store cannot hold the imported history now
  wait_for_reclaim,     ///< CUDA backend: pages are being reclaimed for this request; retry after `poll()`
};

/// Short name of an admission status, for messages and logs.
constexpr const char* to_string(admit_status s) noexcept {
  switch (s) {
    case admit_status::admitted: return "admitted";
    case admit_status::wait_for_slot: return "wait_for_slot";
    case admit_status::wait_for_memory: return "wait_for_memory";
    case admit_status::wait_for_host_pages: return "wait_for_host_pages";
    case admit_status::wait_for_reclaim: return "wait_for_reclaim";
  }
  return "unknown";
}

/// Prefilled history of one source: `count` rows laid out `[payload layer][count][row_bytes]` as
/// for `host_hierarchy::append`.
struct history_import {
  /// The rows of every payload layer, `[payload layer][count][row_bytes]`.
  std::span<const std::byte> rows;
  /// Rows imported (stored rows, not token positions).
  std::size_t count = 0;
  /// Row the import starts at: 0 for a plain admission, the prefix's rows on that source for an
  /// admission on a retained prefix (`residency_manager::admit(id, prefix, suffix)`); any other value
  /// throws suffix_misaligned, so a suffix cut at the wrong place never lands behind the prefix.
  std::int64_t first_row = 0;
};

/// Result of an admission ([[nodiscard]]: a wait is an answer, not an exception).
struct [[nodiscard]] residency_admission {
  /// Admitted, or why the admission waits.
  admit_status status = admit_status::wait_for_slot;
  std::size_t slot = 0;                ///< the request's slot when admitted
  std::size_t reclaimed_requests = 0;  ///< q: requests whose optional pages were reclaimed
  std::size_t reclaimed_pages = 0;     ///< pages reclaimed, over every source
  std::size_t mapped_pages = 0;        ///< optional pages mapped for the new request, over every source
  /// True when admitted.
  explicit operator bool() const { return status == admit_status::admitted; }
};

/// One source's ledger, in pages.
struct residency_ledger {
  std::size_t capacity = 0;  ///< M
  std::size_t required = 0;  ///< M_req
  std::size_t optional = 0;  ///< M_opt
  std::size_t reserve = 0;   ///< M_res
  /// Invariant 3: M_req + M_opt + M_res <= M.
  [[nodiscard]] bool holds() const { return required + optional + reserve <= capacity; }
  /// Pages that optional history may still take (0 when the invariant is broken).
  [[nodiscard]] std::size_t spare() const { return holds() ? capacity - required - optional - reserve : 0; }
  /// True when every field is equal.
  friend bool operator==(const residency_ledger&, const residency_ledger&) = default;
};

/// Running totals since construction.
struct residency_counters {
  std::size_t admissions = 0;          ///< admit calls that admitted
  std::size_t admissions_waited = 0;   ///< admit calls that returned a wait
  /// Admissions that waited for a request slot.
  std::size_t waits_for_slot = 0;
  /// Admissions that waited because optional pages could not cover the deficit.
  std::size_t waits_for_memory = 0;
  /// Admissions that waited for host-store pages.
  std::size_t waits_for_host_pages = 0;
  std::size_t waits_for_reclaim = 0;   ///< CUDA backend: admissions waiting for reclaimed pages to retire
  /// Requests completed.
  std::size_t completions = 0;
  std::size_t pages_mapped = 0;        ///< optional pages mapped (admission, append, repopulation)
  std::size_t pages_repopulated = 0;   ///< of pages_mapped: by repopulate()
  std::size_t pages_reclaimed = 0;     ///< optional pages taken back by whole-request reclaim
  std::size_t requests_reclaimed = 0;  ///< requests that lost their optional pages to reclaim
  /// `repopulate()` calls.
  std::size_t repopulate_calls = 0;
  /// True when every count is equal.
  friend bool operator==(const residency_counters&, const residency_counters&) = default;
};

/// Load-adaptive residency over an owned host `Hierarchy`: resident-first admission, whole-request reclaim and
/// repopulation of optional history, keeping each source's ledger within Invariant 3 (see the file comment).
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

  /// Constructs the hierarchy from `hcfg` with the ledger of `rcfg`; throws invalid_configuration when one request's
  /// required, reserve and pinned pages exceed the optional pool (nothing could be admitted), or `hcfg` cannot work.
  residency_manager(const hierarchy_config& hcfg, const residency_config& rcfg) : h_(hcfg), cfg_(rcfg) { start(); }
  /// As above, with the hierarchy's host stores adopted from caller memory (host_hierarchy's
  /// adopting constructor: one span per source of at least `Hierarchy::host_store_bytes(hcfg, s)`
  /// bytes, `host_store_alignment`-aligned, outliving the manager), as the CUDA manager adopts an
  /// engine's pinned KV pool.
  residency_manager(const hierarchy_config& hcfg, const residency_config& rcfg,
                    std::span<const std::span<std::byte>> host_stores)
      : h_(hcfg, host_stores), cfg_(rcfg) {
    start();
  }

  /// The owned hierarchy, read-only: there is no mutable access, so nothing can admit, complete,
  /// map or unmap behind the manager's books.
  [[nodiscard]] const Hierarchy& hierarchy() const { return h_; }
  /// The per-step operations on the hierarchy (resolve, copy_follower, stage_block, verify, commit,
  /// release_staging); see step_handle.hpp.
  [[nodiscard]] step_handle<Hierarchy> step() { return step_handle<Hierarchy>(h_); }
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
  /// True while `id` is admitted through this manager.
  [[nodiscard]] bool contains(request_id id) const { return seq_of_.contains(id); }
  /// Number of requests admitted now.
  [[nodiscard]] std::size_t admitted_count() const { return seq_of_.size(); }

  /// A source's ledger now (M, M_req, M_opt, M_res); throws invalid_source for a source outside the layout.
  [[nodiscard]] residency_ledger ledger(std::size_t source) const {
    check_source(source);
    return {capacity_pages(), required_[source], optional_[source], cfg_.reserve_pages};
  }
  /// Invariant 3 on every source.
  [[nodiscard]] bool invariant_holds() const {
    for (std::size_t s = 0; s < sources; ++s)
      if (!ledger(s).holds()) return false;
    return true;
  }
  /// Optional pages a request holds on a source.
  [[nodiscard]] std::size_t optional_pages_of(request_id id, std::size_t source) const {
    check_source(source);
    return books_of(id).mapped[source];
  }
  /// Rows of a request's history imported on a source (at admission and by `import_history`).
  [[nodiscard]] std::int64_t imported_rows(request_id id, std::size_t source) const {
    check_source(source);
    return books_of(id).imported[source];
  }
  /// Admitted requests in the policy's reclaim order (the first is reclaimed first).
  [[nodiscard]] std::vector<request_id> reclaim_sequence() const {
    return detail::reclaim_sequence<traits::order>(by_seq_);
  }

  /// Resident-first admission; see the file comment. `history` is empty (streamed admission: the
  /// history arrives later through `import_history`) or one import per source, imported as one
  /// chunk per source exactly as `import_history` would. Throws (state unchanged) on bad input:
  /// duplicate_admission, size_mismatch (history not one entry per source, or wrong byte count),
  /// capacity_exceeded (history longer than max_rows). Returns a wait status when capacity is short.
  residency_admission admit(request_id id, std::span<const history_import> history = {}) {
    return admit_on(id, std::nullopt, history);
  }
  /// Resident-first admission on retained prefix `prefix` (docs/prefixes.md): the request shares the
  /// prefix's host pages (`host_hierarchy::admit(id, prefix)`) and imports only `suffix` (empty, or
  /// one import per source whose `first_row` is the prefix's rows there). The prefix and the suffix
  /// are its imported history: their complete pages already mapped by requests sharing them are
  /// mapped for it at no cost (one pool page serves them all, counted once in M_opt), then unmapped
  /// pages newest first while spare pages remain. Throws, state unchanged: duplicate_admission,
  /// unknown_prefix, size_mismatch, suffix_misaligned, capacity_exceeded. Waits as `admit`.
  residency_admission admit(request_id id, prefix_id prefix, std::span<const history_import> suffix = {}) {
    return admit_on(id, prefix, suffix);
  }
  /// As above, with the suffix imports given as a braced list.
  residency_admission admit(request_id id, prefix_id prefix, std::initializer_list<history_import> suffix) {
    return admit_on(id, prefix, std::span<const history_import>(suffix.begin(), suffix.size()));
  }

  /// Retains a request's history as a prefix; `host_hierarchy::retain_prefix` (the ledger is not
  /// affected: a retained prefix holds host pages only, and no optional page).
  std::vector<prefix_id> retain_prefix(prefix_id prefix, request_id id, std::span<const std::int64_t> rows) {
    (void)books_of(id);  // unknown_request first, as every manager call
    return h_.retain_prefix(prefix, id, rows);
  }
  /// Retains a request's whole stored history; `host_hierarchy::retain_prefix`.
  std::vector<prefix_id> retain_prefix(prefix_id prefix, request_id id) {
    (void)books_of(id);  // unknown_request first, as every manager call
    return h_.retain_prefix(prefix, id);
  }
  /// Drops a retained prefix; `host_hierarchy::release_prefix`.
  void release_prefix(prefix_id prefix) { h_.release_prefix(prefix); }

  /// As above, with the imports given as a braced list.
  residency_admission admit(request_id id, std::initializer_list<history_import> history) {
    return admit(id, std::span<const history_import>(history.begin(), history.size()));
  }

  /// Streamed admission: the next `count` rows of an admitted request's history on one source, laid
  /// out `[payload layer][count][row_bytes]` as for `append`, as a prefill or a P/D transfer
  /// delivers them (any chunk size, sources in any order). The rows are imported history (eligible
  /// optional history) and are appended behind the rows imported before. Placement is decided now:
  /// the pages this chunk completes are mapped as optional history newest first while spare pages
  /// remain (a pinning policy maps every one); a page mapped earlier is never displaced. Returns
  /// the pages mapped. Throws, state unchanged: unknown_request, invalid_source, size_mismatch
  /// (byte count), capacity_exceeded (past max_rows), host_pool_exhausted (the host store cannot
  /// hold the chunk), import_after_decode (the source already has decode rows: appended, staged or
  /// committed; a source's history is imported before its decode rows).
  std::size_t import_history(request_id id, std::size_t source, std::span<const std::byte> rows, std::size_t count) {
    auto& b = books_of(id);
    check_source(source);
    check_not_decoding(b, source);
    check_chunk(id, source, static_cast<std::size_t>(h_.frontier(id, source)), rows.size(), count);
    return import_chunk(b, source, rows, count);
  }

  /// Appends decode rows through the hierarchy (same contract and errors as host_hierarchy::append).
  /// Under a pinning policy the pages this append completes are mapped at once (their pages are
  /// reserved); otherwise decode rows stay under the tail and hot-cache rules.
  void append(request_id id, std::size_t source, std::span<const std::byte> rows, std::size_t count) {
    auto& b = books_of(id);
    const std::int64_t before = h_.frontier(id, source);
    h_.append(id, source, rows, count);
    if constexpr (traits::pins_history) {
      const auto after = static_cast<std::size_t>(h_.frontier(id, source));
      for (std::size_t page = static_cast<std::size_t>(before) / page_rows; page < after / page_rows; ++page)
        map_one(b, source, page);
    }
  }

  /// Reserves host-store pages ahead of step-wide writes for every admitted request and source
  /// (host_hierarchy::reserve_ahead: all or nothing). The manager's books are not involved.
  void reserve_ahead(std::size_t rows_ahead) { h_.reserve_ahead(rows_ahead); }

  /// Appends a whole step's decode rows through the hierarchy (same contract and errors as
  /// host_hierarchy::append_step: all or nothing). Under a pinning policy the pages the step
  /// completes are mapped at once, as `append` maps them.
  void append_step(std::span<const step_write_item> batch) {
    std::vector<std::int64_t> before;
    before.reserve(batch.size());
    for (const auto& item : batch) {
      (void)books_of(item.request);  // unknown_request before anything changes
      before.push_back(h_.frontier(item.request, item.source));
    }
    h_.append_step(batch);
    if constexpr (traits::pins_history)
      for (std::size_t i = 0; i < batch.size(); ++i) {
        auto& b = books_of(batch[i].request);
        const auto after = static_cast<std::size_t>(h_.frontier(batch[i].request, batch[i].source));
        for (std::size_t page = static_cast<std::size_t>(before[i]) / page_rows; page < after / page_rows; ++page)
          map_one(b, batch[i].source, page);
      }
  }

  /// Completes a request: its slot, host pages, optional pages and required pages are released.
  /// Throws unknown_request (state unchanged) for a request that is not admitted.
  void complete(request_id id) {
    const auto it = seq_of_.find(id);
    if (it == seq_of_.end()) throw unknown_request("residency: request " + std::to_string(id) + " is not admitted");
    auto& b = by_seq_.at(it->second);
    std::array<std::size_t, sources> free_before{};
    for (std::size_t s = 0; s < sources; ++s) free_before[s] = h_.free_optional_pages(s);
    h_.complete(id);
    for (std::size_t s = 0; s < sources; ++s) {
      required_[s] -= cfg_.required_pages + b.pinned_left[s];
      optional_[s] -= h_.free_optional_pages(s) - free_before[s];  // pages other requests share stay mapped
    }
    by_seq_.erase(it->second);
    seq_of_.erase(it);
    ++counters_.completions;
  }

  /// Bounded round-robin repopulation; see the file comment. Returns the pages mapped (at most
  /// `traits::pages_per_attempt`).
  std::size_t repopulate() {
    ++counters_.repopulate_calls;
    if constexpr (!traits::keeps_optional_history) return 0;
    const std::size_t mapped = detail::repopulation_walk(
        by_seq_, cursor_, traits::pages_per_attempt, sources,
        [](const request_books& b, std::size_t s) { return b.mapped[s]; },
        [&](request_books& b, std::size_t s) {
          const auto page = newest_unmapped(b, s);
          return page >= 0 && map_one(b, s, static_cast<std::size_t>(page));
        });
    counters_.pages_repopulated += mapped;
    return mapped;
  }

  /// Cross-checks the ledger, the books and the hierarchy. Returns "" when consistent, otherwise a
  /// description of the first problem: Invariant 3, page conservation of every optional pool
  /// (free + mapped == M), every request's optional map against its books (count, eligible pages).
  [[nodiscard]] std::string audit() const {
    const std::size_t m = capacity_pages();
    if (h_.admitted_count() != by_seq_.size())
      return "hierarchy admits " + std::to_string(h_.admitted_count()) + " requests, the books " +
             std::to_string(by_seq_.size());
    for (std::size_t s = 0; s < sources; ++s) {
      const std::string src = "source " + std::to_string(s) + ": ";
      std::size_t req = 0, opt = 0;
      std::map<std::int32_t, std::uint32_t> mappers;  // pool page -> requests mapping it
      for (const auto& [seq, b] : by_seq_) {
        const std::string who = src + "request " + std::to_string(b.id) + ": ";
        if (!h_.contains(b.id)) return who + "not admitted in the hierarchy";
        const auto map = h_.optional_map_of(b.id, s);
        const auto frontier = static_cast<std::size_t>(h_.frontier(b.id, s));
        const std::size_t eligible = traits::pins_history ? frontier / page_rows
                                     : traits::keeps_optional_history
                                         ? static_cast<std::size_t>(b.imported[s]) / page_rows
                                         : 0;
        std::size_t count = 0;
        for (std::size_t page = 0; page < map.size(); ++page) {
          if (map[page] < 0) continue;
          ++count;
          if (page >= eligible)
            return who + "page " + std::to_string(page) + " is mapped but only " + std::to_string(eligible) +
                   " pages are eligible";
        }
        if (count != b.mapped[s])
          return who + std::to_string(count) + " pages mapped, the books say " + std::to_string(b.mapped[s]);
        if (traits::pins_history && b.pinned_left[s] + b.mapped[s] != pinned_pages_per_request())
          return who + "pinned reservation " + std::to_string(b.pinned_left[s]) + " + mapped " +
                 std::to_string(b.mapped[s]) + " != " + std::to_string(pinned_pages_per_request());
        if (!traits::pins_history && b.pinned_left[s] != 0) return who + "a pinned reservation without pinning";
        req += cfg_.required_pages + b.pinned_left[s];
        const auto host = h_.host_pages_of(b.id, s);
        for (std::size_t page = 0; page < map.size(); ++page) {
          if (map[page] < 0) continue;
          if (h_.optional_page_of_host(s, host[page]) != map[page])
            return who + "page " + std::to_string(page) + " maps pool page " + std::to_string(map[page]) +
                   " but its host page is served by " + std::to_string(h_.optional_page_of_host(s, host[page]));
          ++mappers[map[page]];
        }
      }
      for (const auto& [g, n] : mappers)
        if (h_.optional_page_refs(s, g) != n)
          return src + "pool page " + std::to_string(g) + " is mapped by " + std::to_string(n) +
                 " requests, its count says " + std::to_string(h_.optional_page_refs(s, g));
      opt = mappers.size();  // M_opt counts each pool page once, however many requests share it
      if (req != required_[s]) return src + "M_req is " + std::to_string(required_[s]) + ", books sum to " + std::to_string(req);
      if (opt != optional_[s]) return src + "M_opt is " + std::to_string(optional_[s]) + ", books sum to " + std::to_string(opt);
      if (!ledger(s).holds())
        return src + "M_req + M_opt + M_res = " + std::to_string(req) + " + " + std::to_string(opt) + " + " +
               std::to_string(cfg_.reserve_pages) + " exceeds M = " + std::to_string(m);
      if (h_.free_optional_pages(s) + opt != m)
        return src + std::to_string(h_.free_optional_pages(s)) + " free + " + std::to_string(opt) +
               " mapped optional pages != " + std::to_string(m);
    }
    return {};
  }

 private:
  struct request_books {
    request_id id = 0;
    std::array<std::int64_t, sources> imported{};    // rows imported (admission and import_history)
    std::array<std::size_t, sources> mapped{};       // optional pages held (M_opt share)
    std::array<std::size_t, sources> pinned_left{};  // pinning: reserved pages not yet mapped (M_req share)
    std::size_t refill_source = 0;                   // repopulation_walk's source cursor
  };

  /// Both admissions: `prefix` empty for a plain one.
  residency_admission admit_on(request_id id, std::optional<prefix_id> prefix, std::span<const history_import> history) {
    if (seq_of_.contains(id) || h_.contains(id))
      throw duplicate_admission("residency: request " + std::to_string(id) + " is already admitted");
    if (!history.empty() && history.size() != sources)
      throw size_mismatch("residency: admission of request " + std::to_string(id) + " imports history for " +
                          std::to_string(history.size()) + " sources, the layout has " + std::to_string(sources));
    std::array<std::size_t, sources> base{};  // prefix rows
    if (prefix)
      for (std::size_t s = 0; s < sources; ++s) base[s] = static_cast<std::size_t>(h_.prefix_rows(*prefix, s));
    std::array<std::size_t, sources> rows{};
    for (std::size_t s = 0; s < history.size(); ++s) {
      if (history[s].first_row != static_cast<std::int64_t>(base[s]))
        throw suffix_misaligned("residency: request " + std::to_string(id) + " imports rows from row " +
                                std::to_string(history[s].first_row) + " on source " + std::to_string(s) + ", " +
                                (prefix ? "prefix " + std::to_string(*prefix) + " ends at row "
                                        : std::string("a plain admission starts at row ")) +
                                std::to_string(base[s]));
      check_chunk(id, s, base[s], history[s].rows.size(), history[s].count);
      rows[s] = history[s].count;
    }
    residency_admission result;
    if (h_.admitted_count() >= h_.config().max_requests) return wait(result, admit_status::wait_for_slot);
    for (std::size_t s = 0; s < sources; ++s)  // new pages: the boundary copy of a partial prefix page and the rest
      if ((base[s] + rows[s] + page_rows - 1) / page_rows - base[s] / page_rows > h_.free_host_pages(s))
        return wait(result, admit_status::wait_for_host_pages);

    // Deficit and the whole requests that cover it, before anything changes.
    const std::size_t take = cfg_.required_pages + pinned_pages_per_request();
    std::array<std::size_t, sources> used{};
    for (std::size_t s = 0; s < sources; ++s) used[s] = required_[s] + optional_[s] + cfg_.reserve_pages;
    const auto deficit = detail::residency_deficit<sources>(used, take, capacity_pages());
    const auto picked = pick_victims(deficit);
    if (!picked) return wait(result, admit_status::wait_for_memory);
    const std::vector<request_books*>& victims = *picked;

    // Commit: reclaim, admit, import each source as one chunk.
    for (request_books* v : victims) {
      std::size_t pages = 0;
      for (std::size_t s = 0; s < sources; ++s) pages += unmap_all(*v, s);
      ++counters_.requests_reclaimed;
      result.reclaimed_pages += pages;
    }
    result.reclaimed_requests = victims.size();
    const admission a = prefix ? h_.admit(id, *prefix) : h_.admit(id);  // a slot and host pages are free: checked above
    result.slot = a.slot;
    const std::uint64_t seq = next_seq_++;
    auto& b = by_seq_[seq];
    b.id = id;
    seq_of_.emplace(id, seq);
    for (std::size_t s = 0; s < sources; ++s) {
      b.pinned_left[s] = pinned_pages_per_request();
      required_[s] += cfg_.required_pages + b.pinned_left[s];
    }
    if (prefix) {
      for (std::size_t s = 0; s < sources; ++s) {
        b.imported[s] = static_cast<std::int64_t>(base[s]);
        if (!history.empty() && history[s].count > 0) {
          h_.append(id, s, history[s].rows, history[s].count);  // validated above
          b.imported[s] += static_cast<std::int64_t>(history[s].count);
        }
        result.mapped_pages += map_imported(b, s);
      }
    } else {
      for (std::size_t s = 0; s < history.size(); ++s)
        result.mapped_pages += import_chunk(b, s, history[s].rows, history[s].count);  // validated above
    }
    result.status = admit_status::admitted;
    ++counters_.admissions;
    return result;
  }
  static void check_source(std::size_t source) {
    if (source >= sources)
      throw invalid_source("source " + std::to_string(source) + " outside the layout's " + std::to_string(sources));
  }
  [[nodiscard]] const request_books& books_of(request_id id) const {
    const auto it = seq_of_.find(id);
    if (it == seq_of_.end()) throw unknown_request("residency: request " + std::to_string(id) + " is not admitted");
    return by_seq_.at(it->second);
  }
  [[nodiscard]] request_books& books_of(request_id id) {
    return const_cast<request_books&>(std::as_const(*this).books_of(id));
  }
  /// Validates a chunk of `count` rows (`bytes` bytes) on top of `frontier` stored rows.
  void check_chunk(request_id id, std::size_t s, std::size_t frontier, std::size_t bytes, std::size_t count) const {
    const auto& d = layout::sources[s];
    const std::size_t max_rows = h_.config().max_rows;
    if (count > max_rows - frontier)
      throw capacity_exceeded("residency: request " + std::to_string(id) + " imports " + std::to_string(count) +
                              " rows on source " + std::to_string(s) + " on top of " + std::to_string(frontier) +
                              ", capacity is " + std::to_string(max_rows));
    if (bytes != count * d.payload_layers * d.row_bytes)
      throw size_mismatch("residency: request " + std::to_string(id) + " imports " + std::to_string(bytes) +
                          " bytes for " + std::to_string(count) + " rows on source " + std::to_string(s) +
                          ", expected " + std::to_string(count * d.payload_layers * d.row_bytes));
  }
  /// The constructors' common part.
  void start() {
    detail::check_one_request_fits(cfg_.required_pages, cfg_.reserve_pages, pinned_pages_per_request(),
                                   traits::pins_history, capacity_pages());
    required_.fill(0);
    optional_.fill(0);
  }
  /// Imported rows must be a prefix of the history: no decode row (appended, committed, or a staged
  /// block) may precede them.
  void check_not_decoding(const request_books& b, std::size_t s) const {
    detail::check_not_decoding(b.id, s, h_.positions(b.id, s), b.imported[s], layout::sources[s].positions_per_row,
                               h_.staged_rows(b.id, s));
  }
  /// Appends a validated chunk of imported history and maps the pages it completes, newest first,
  /// while the ledger allows (a pinning policy: every one). Returns the pages mapped.
  std::size_t import_chunk(request_books& b, std::size_t s, std::span<const std::byte> rows, std::size_t count) {
    if (count == 0) return 0;
    const auto before = static_cast<std::size_t>(b.imported[s]);
    h_.append(b.id, s, rows, count);  // throws host_pool_exhausted with nothing changed
    b.imported[s] += static_cast<std::int64_t>(count);
    std::size_t mapped = 0;
    if constexpr (traits::keeps_optional_history) {
      const std::size_t first = before / page_rows, last = (before + count) / page_rows;  // pages completed
      for (std::size_t page = last; page-- > first;) {
        if (!map_one(b, s, page)) break;
        ++mapped;
      }
    }
    return mapped;
  }
  residency_admission& wait(residency_admission& r, admit_status why) {
    r.status = why;
    ++counters_.admissions_waited;
    if (why == admit_status::wait_for_slot) ++counters_.waits_for_slot;
    if (why == admit_status::wait_for_memory) ++counters_.waits_for_memory;
    if (why == admit_status::wait_for_host_pages) ++counters_.waits_for_host_pages;
    return r;
  }
  /// Newest eligible page of a request/source not yet mapped, -1 if none.
  [[nodiscard]] std::int64_t newest_unmapped(const request_books& b, std::size_t s) const {
    const std::size_t eligible = traits::pins_history
                                     ? static_cast<std::size_t>(h_.frontier(b.id, s)) / page_rows
                                     : static_cast<std::size_t>(b.imported[s]) / page_rows;
    const auto map = h_.optional_map_of(b.id, s);
    for (std::size_t page = eligible; page-- > 0;)
      if (map[page] < 0) return static_cast<std::int64_t>(page);
    return -1;
  }
  /// True when page `page` of a request/source can be mapped without a pool page: another request
  /// sharing its host page has it mapped (shared prefixes).
  [[nodiscard]] bool maps_for_free(const request_books& b, std::size_t s, std::size_t page) const {
    const page_id host = h_.host_pages_of(b.id, s)[page];
    return host != no_page && h_.optional_page_of_host(s, host) >= 0;
  }
  /// Maps the imported pages of a request admitted on a prefix: first every page another request
  /// already maps (no pool page taken), then the others newest first while the ledger allows.
  std::size_t map_imported(request_books& b, std::size_t s) {
    if constexpr (!traits::keeps_optional_history) return 0;
    const std::size_t eligible = static_cast<std::size_t>(b.imported[s]) / page_rows;
    const auto map = h_.optional_map_of(b.id, s);
    std::size_t mapped = 0;
    for (std::size_t page = 0; page < eligible; ++page)
      if (map[page] < 0 && maps_for_free(b, s, page) && map_one(b, s, page)) ++mapped;
    for (std::size_t page = eligible; page-- > 0;) {
      if (map[page] >= 0) continue;
      if (!map_one(b, s, page)) break;
      ++mapped;
    }
    return mapped;
  }
  /// Whole requests to reclaim, in the policy's order, whose unmapping frees pool pages covering
  /// every source's deficit: a request holding optional pages is one of the q; a pool page it
  /// shares is freed only once every request mapping it is among them. nullopt when all cannot.
  std::optional<std::vector<request_books*>> pick_victims(const std::array<std::size_t, sources>& deficit) {
    if constexpr (traits::pins_history) {  // pinned pages are never reclaimed
      for (std::size_t s = 0; s < sources; ++s)
        if (deficit[s] > 0) return std::nullopt;
      return std::vector<request_books*>{};
    }
    std::array<std::size_t, sources> freed{};
    return detail::pick_whole_requests<traits::order>(
        by_seq_, deficit, freed, [](const request_books&) { return false; },
        [&](const request_books& b, std::size_t s, auto&& f) {
          for (const std::int32_t g : h_.optional_map_of(b.id, s))
            if (g >= 0) f(g);
        },
        [&](std::size_t s, std::int32_t g) { return h_.optional_page_refs(s, g); });
  }
  /// Maps one complete page if the ledger allows it (spare pages, or the pinned reservation; a page
  /// another request already maps takes no pool page, so it needs no spare one).
  bool map_one(request_books& b, std::size_t s, std::size_t page) {
    if constexpr (traits::pins_history) {
      if (b.pinned_left[s] == 0) return false;
    } else {
      if (ledger(s).spare() == 0 && !maps_for_free(b, s, page)) return false;
    }
    const std::size_t free_before = h_.free_optional_pages(s);
    if (!h_.map_optional_page(b.id, s, page)) return false;  // cannot happen while the books agree
    ++b.mapped[s];
    optional_[s] += free_before - h_.free_optional_pages(s);  // 0 when shared
    if constexpr (traits::pins_history) {
      --b.pinned_left[s];
      --required_[s];
    }
    ++counters_.pages_mapped;
    return true;
  }
  /// Unmaps every optional page of a request/source; returns how many.
  std::size_t unmap_all(request_books& b, std::size_t s) {
    const auto map = h_.optional_map_of(b.id, s);
    std::vector<std::size_t> pages;
    for (std::size_t page = 0; page < map.size(); ++page)
      if (map[page] >= 0) pages.push_back(page);
    const std::size_t free_before = h_.free_optional_pages(s);
    for (std::size_t page : pages) h_.unmap_optional_page(b.id, s, page);
    const std::size_t freed = h_.free_optional_pages(s) - free_before;  // shared pages stay for the others
    optional_[s] -= freed;
    b.mapped[s] = 0;
    counters_.pages_reclaimed += freed;
    return freed;
  }

  Hierarchy h_;
  residency_config cfg_;
  std::array<std::size_t, sources> required_{};
  std::array<std::size_t, sources> optional_{};
  std::map<std::uint64_t, request_books> by_seq_;  // admission order
  std::unordered_map<request_id, std::uint64_t> seq_of_;
  std::uint64_t next_seq_ = 1;
  std::uint64_t cursor_ = 0;  // admission number of the last request repopulation served
  residency_counters counters_;
};

}  // namespace dhisparse
