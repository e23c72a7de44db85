#pragma once
/// \file
/// Books of one host store shared by the N tensor-parallel ranks of a host (one hierarchy per GPU;
/// `shared_host_store`, docs/multi-gpu.md). Every rank holds the same request histories, so the
/// store keeps one copy: per request id (the engine's, the same on every rank) and source, the host
/// page of each history page, which ranks are attached, and how many rows of each page have their
/// host copy. Ranks are 0..N-1, N <= 64 (rank sets are 64-bit masks).
///
/// Ownership: history page p of a request is written to the host store by rank p mod N only (its
/// *owner*), so each row is written once and the backup traffic of a history is spread over every
/// GPU's link. A host page returns to its store when no rank holds it any more (each rank's
/// `history_books` counts its own holders of the page and tells the store when it drops its last).
/// A request's entry lives from the first rank's attach to the last rank's detach.
///
/// Not thread-safe by itself: every call is made with `mutex()` held (the hierarchies lock it for
/// each call that touches the shared books).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../errors.hpp"
#include "../host/host_store.hpp"
#include "../types.hpp"
#include "owner_rule.hpp"

namespace dhisparse::detail {

class shared_store_books {
 public:
  /// Most ranks one store serves (rank sets are 64-bit masks).
  static constexpr std::size_t max_ranks = 64;

  shared_store_books(std::size_t ranks, std::vector<host_store> stores)
      : ranks_(ranks), stores_(std::move(stores)), rows_written_(ranks, 0), bytes_written_(ranks, 0) {
    if (ranks == 0 || ranks > max_ranks)
      throw invalid_configuration("a shared host store serves 1.." + std::to_string(max_ranks) + " ranks, not " +
                                  std::to_string(ranks));
    holders_.resize(stores_.size());
    key_of_.resize(stores_.size());
    for (std::size_t s = 0; s < stores_.size(); ++s) {
      holders_[s].assign(stores_[s].total_pages(), 0);
      key_of_[s].assign(stores_[s].total_pages(), {0, 0});
    }
  }
  shared_store_books(const shared_store_books&) = delete;
  shared_store_books& operator=(const shared_store_books&) = delete;

  [[nodiscard]] std::mutex& mutex() const { return mutex_; }
  [[nodiscard]] std::size_t ranks() const { return ranks_; }
  [[nodiscard]] const host_store& store(std::size_t s) const { return stores_[s]; }
  /// The rank that writes history page `page`'s host copy.
  [[nodiscard]] std::size_t owner(std::size_t page) const { return static_cast<std::size_t>(page_owner(page, ranks_)); }

  // ---------------------------------------------------------------- ranks (one hierarchy each)

  /// Claims `rank` for a hierarchy; throws invalid_configuration when it is out of range or taken.
  void bind(std::size_t rank) {
    check_rank(rank);
    if (bound_ & bit(rank))
      throw invalid_configuration("rank " + std::to_string(rank) + " of the shared host store already has a hierarchy");
    bound_ |= bit(rank);
  }
  /// A rank's hierarchy is gone: every page hold and attachment of the rank ends with it.
  void unbind(std::size_t rank) noexcept {
    for (std::size_t s = 0; s < stores_.size(); ++s)
      for (std::size_t g = 0; g < holders_[s].size(); ++g)
        if (holders_[s][g] & bit(rank)) release(s, static_cast<page_id>(g), rank);
    for (auto it = requests_.begin(); it != requests_.end();) {
      it->second.attached &= ~bit(rank);
      it = it->second.attached == 0 ? requests_.erase(it) : std::next(it);
    }
    bound_ &= ~bit(rank);
  }

  // ---------------------------------------------------------------- requests

  /// True when `rank` may attach to request `id` now: false while an earlier incarnation of the id
  /// that this rank already completed is still held by other ranks (the caller waits).
  [[nodiscard]] bool can_attach(request_id id, std::size_t rank) const {
    const auto it = requests_.find(id);
    return it == requests_.end() || !(it->second.seen & bit(rank));
  }
  /// Attaches `rank` to request `id`'s shared history (created by the first rank). Check
  /// `can_attach` first.
  void attach(request_id id, std::size_t rank) {
    auto& e = requests_[id];
    if (e.sources.empty()) e.sources.resize(stores_.size());
    e.attached |= bit(rank);
    e.seen |= bit(rank);
  }
  /// Detaches `rank` (after it dropped its pages); the entry goes with the last rank.
  void detach(request_id id, std::size_t rank) {
    const auto it = requests_.find(id);
    if (it == requests_.end()) return;
    it->second.attached &= ~bit(rank);
    if (it->second.attached == 0) requests_.erase(it);
  }
  /// Ranks attached to request `id` (a mask; 0 when no rank is).
  [[nodiscard]] std::uint64_t attached(request_id id) const {
    const auto it = requests_.find(id);
    return it == requests_.end() ? 0 : it->second.attached;
  }
  /// Requests some rank is attached to.
  [[nodiscard]] std::size_t requests() const { return requests_.size(); }

  // ---------------------------------------------------------------- pages

  /// Host page of history page `page` of request `id` on source `s`, no_page when no rank has one.
  [[nodiscard]] page_id page_of(std::size_t s, request_id id, std::size_t page) const {
    const auto* p = find(s, id);
    return p && page < p->pages.size() ? p->pages[page] : no_page;
  }
  /// History pages [first, last) of request `id` on source `s` that no rank has a host page for yet:
  /// what taking them would allocate.
  [[nodiscard]] std::size_t pages_missing(std::size_t s, request_id id, std::size_t first, std::size_t last) const {
    std::size_t n = 0;
    for (std::size_t g = first; g < last; ++g) n += page_of(s, id, g) == no_page ? 1 : 0;
    return n;
  }
  /// History page `page` of request `id` for `rank`: the page another rank already has, else a fresh
  /// one (host_pool_exhausted when none is free; check with `pages_missing` first).
  page_id acquire(std::size_t s, request_id id, std::size_t page, std::size_t rank) {
    auto& p = requests_.at(id).sources[s];
    if (p.pages.size() <= page) {
      p.pages.resize(page + 1, no_page);
      p.written.resize(page + 1, 0);
    }
    page_id g = p.pages[page];
    if (g == no_page) {
      g = stores_[s].allocate();
      p.pages[page] = g;
      p.written[page] = 0;
      key_of_[s][static_cast<std::size_t>(g)] = {id, page};
    }
    holders_[s][static_cast<std::size_t>(g)] |= bit(rank);
    return g;
  }
  /// `rank` holds host page `g` of source `s` no more; the page returns to the store with its last holder.
  void release(std::size_t s, page_id g, std::size_t rank) noexcept {
    auto& h = holders_[s][static_cast<std::size_t>(g)];
    h &= ~bit(rank);
    if (h != 0) return;
    const auto [id, page] = key_of_[s][static_cast<std::size_t>(g)];
    if (auto* p = find_mut(s, id); p && page < p->pages.size() && p->pages[page] == g) {
      p->pages[page] = no_page;
      p->written[page] = 0;
    }
    stores_[s].release(g);
  }
  /// Ranks holding host page `g` of source `s` (a mask).
  [[nodiscard]] std::uint64_t holders(std::size_t s, page_id g) const { return holders_[s][static_cast<std::size_t>(g)]; }
  [[nodiscard]] std::size_t free_pages(std::size_t s) const { return stores_[s].free_pages(); }

  // ---------------------------------------------------------------- host copies

  /// True when `row` of request `id` on source `s` has its host copy (its owner wrote it).
  [[nodiscard]] bool has_copy(std::size_t s, request_id id, std::int64_t row) const {
    const auto* p = find(s, id);
    const std::size_t rows = stores_[s].page_rows();
    const auto page = static_cast<std::size_t>(row) / rows;
    return p && page < p->written.size() && p->written[page] > static_cast<std::size_t>(row) % rows;
  }
  /// Rows of history page `page` of request `id` on source `s` that have their host copy.
  [[nodiscard]] std::size_t rows_copied(std::size_t s, request_id id, std::size_t page) const {
    const auto* p = find(s, id);
    return p && page < p->written.size() ? p->written[page] : 0;
  }
  /// Records that `rank` wrote the host copies of the rows of [first, last) of request `id` on
  /// source `s` that lie in pages it owns (the others are their owners' to write): each page's rows
  /// are written in order, each once.
  void wrote(std::size_t s, request_id id, std::int64_t first, std::int64_t last, std::size_t rank) {
    if (last <= first) return;
    auto& p = requests_.at(id).sources[s];
    const auto rows = static_cast<std::int64_t>(stores_[s].page_rows());
    for (std::int64_t r = first; r < last;) {
      const auto page = static_cast<std::size_t>(r / rows);
      const std::int64_t end = std::min(last, static_cast<std::int64_t>(page + 1) * rows);
      if (owner(page) == rank) {
        auto& w = p.written[page];
        if (w != static_cast<std::size_t>(r % rows))  // an internal rule broken: never let it pass silently
          throw device_error("shared host store: row " + std::to_string(r) + " of request " + std::to_string(id) +
                             " on source " + std::to_string(s) + " written out of order (" + std::to_string(w) +
                             " rows of its page written)");
        const auto n = static_cast<std::size_t>(end - r);
        w += n;
        rows_written_[rank] += n;
        bytes_written_[rank] += n * stores_[s].layers() * stores_[s].row_bytes();
      }
      r = end;
    }
  }
  [[nodiscard]] std::uint64_t rows_written(std::size_t rank) const { return rows_written_[rank]; }
  [[nodiscard]] std::uint64_t bytes_written(std::size_t rank) const { return bytes_written_[rank]; }

  void check_rank(std::size_t rank) const {
    if (rank >= ranks_)
      throw invalid_configuration("rank " + std::to_string(rank) + " outside the shared host store's " +
                                  std::to_string(ranks_) + " ranks");
  }

 private:
  struct source_pages {
    std::vector<page_id> pages;       // history page -> host page, no_page when none
    std::vector<std::size_t> written;  // history page -> rows whose host copy its owner wrote
  };
  struct entry {
    std::uint64_t attached = 0;  // ranks attached now
    std::uint64_t seen = 0;      // ranks that attached to this incarnation (a completed rank waits to re-admit)
    std::vector<source_pages> sources;
  };
  static constexpr std::uint64_t bit(std::size_t rank) { return std::uint64_t{1} << rank; }
  const source_pages* find(std::size_t s, request_id id) const {
    const auto it = requests_.find(id);
    return it == requests_.end() ? nullptr : &it->second.sources[s];
  }
  source_pages* find_mut(std::size_t s, request_id id) {
    const auto it = requests_.find(id);
    return it == requests_.end() ? nullptr : &it->second.sources[s];
  }

  mutable std::mutex mutex_;
  std::size_t ranks_ = 0;
  std::uint64_t bound_ = 0;
  std::vector<host_store> stores_;
  std::vector<std::vector<std::uint64_t>> holders_;                            // source -> host page -> ranks holding it
  std::vector<std::vector<std::pair<request_id, std::size_t>>> key_of_;         // source -> host page -> (request, history page)
  std::unordered_map<request_id, entry> requests_;
  std::vector<std::uint64_t> rows_written_, bytes_written_;                     // per rank
};

}  // namespace dhisparse::detail
