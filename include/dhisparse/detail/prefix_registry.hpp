#pragma once
/// \file
/// Retained prefixes of one hierarchy (docs/prefixes.md): for every prefix id, the rows retained on
/// each source and the host pages holding them, a least-recently-used order, and the budget of
/// distinct host pages the prefixes may hold per source. The registry holds one reference on every
/// page of every prefix (history_books::share_page); a page held by no request and no prefix is
/// free. Every operation validates (or plans) before it changes anything.
#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "../errors.hpp"
#include "../host/host_store.hpp"
#include "../types.hpp"

namespace dhisparse::detail {

template <std::size_t Sources>
class prefix_registry {
 public:
  /// One retained prefix.
  struct entry {
    std::array<std::int64_t, Sources> rows{};             ///< rows retained on each source
    std::array<std::vector<page_id>, Sources> pages{};    ///< host pages covering them (the last may be partial)
    std::uint64_t used = 0;                               ///< LRU stamp: retain or the last admission on it
  };

  prefix_registry() = default;
  /// A registry over host stores of `host_pages` pages per source, holding at most `budget` distinct pages per source.
  prefix_registry(std::size_t host_pages, std::size_t budget) : budget_(budget) {
    for (auto& r : refs_) r.assign(host_pages, 0);
  }

  [[nodiscard]] std::size_t budget() const { return budget_; }
  [[nodiscard]] std::size_t size() const { return entries_.size(); }
  [[nodiscard]] bool contains(prefix_id id) const { return entries_.contains(id); }
  /// Distinct host pages the prefixes hold on a source (what the budget limits).
  [[nodiscard]] std::size_t held_pages(std::size_t source) const { return held_[source]; }
  /// Retained prefixes that hold host page `g` of a source.
  [[nodiscard]] std::uint32_t page_holders(std::size_t source, page_id g) const {
    return refs_[source][static_cast<std::size_t>(g)];
  }

  /// The prefix; throws unknown_prefix when it is not retained.
  [[nodiscard]] const entry& find(prefix_id id) const {
    const auto it = entries_.find(id);
    if (it == entries_.end())
      throw unknown_prefix("prefix " + std::to_string(id) + " is not retained (never retained, released or evicted)");
    return it->second;
  }

  /// Retained prefixes, least recently used first (the eviction order).
  [[nodiscard]] std::vector<prefix_id> lru() const {
    std::vector<prefix_id> ids;
    ids.reserve(by_use_.size());
    for (const auto& [stamp, id] : by_use_) ids.push_back(id);
    return ids;
  }

  /// Prefixes to evict, least recently used first, so that a new prefix `id` holding `pages` fits the
  /// budget on every source (empty when it fits now). Throws duplicate_prefix, or
  /// prefix_budget_exceeded when it does not fit even with every other prefix evicted. Changes nothing.
  [[nodiscard]] std::vector<prefix_id> plan_retain(prefix_id id,
                                                   const std::array<std::vector<page_id>, Sources>& pages) const {
    if (contains(id)) throw duplicate_prefix("prefix " + std::to_string(id) + " is already retained");
    std::array<std::unordered_set<page_id>, Sources> fresh;  // the new prefix's pages (held after it either way)
    std::array<std::size_t, Sources> held{};                 // distinct pages held after retain and evictions
    for (std::size_t s = 0; s < Sources; ++s) {
      fresh[s].insert(pages[s].begin(), pages[s].end());
      held[s] = held_[s];
      for (page_id g : fresh[s])
        if (refs_[s][static_cast<std::size_t>(g)] == 0) ++held[s];
    }
    auto fits = [&] {
      for (std::size_t s = 0; s < Sources; ++s)
        if (held[s] > budget_) return false;
      return true;
    };
    std::vector<prefix_id> victims;
    std::array<std::unordered_map<page_id, std::uint32_t>, Sources> dropped;
    for (auto it = by_use_.begin(); it != by_use_.end() && !fits(); ++it) {
      victims.push_back(it->second);
      const entry& e = entries_.at(it->second);
      for (std::size_t s = 0; s < Sources; ++s)
        for (page_id g : e.pages[s])
          if (++dropped[s][g] == refs_[s][static_cast<std::size_t>(g)] && !fresh[s].contains(g)) --held[s];
    }
    if (!fits()) {
      std::string need;
      for (std::size_t s = 0; s < Sources; ++s)
        if (held[s] > budget_) {
          need = "source " + std::to_string(s) + " would hold " + std::to_string(held[s]);
          break;
        }
      throw prefix_budget_exceeded("prefix " + std::to_string(id) + " does not fit the prefix budget of " +
                                   std::to_string(budget_) + " host pages per source even with every other prefix " +
                                   "evicted: " + need + " pages");
    }
    return victims;
  }

  /// Both hierarchies' `retain_prefix`: validates the first `rows[s]` stored rows of the request in
  /// `slot` on each source against its books (size_mismatch: not one entry per source,
  /// position_out_of_range: negative, position_beyond_frontier: past the stored rows), plans the
  /// evictions (duplicate_prefix, prefix_budget_exceeded) and retains; nothing changes on an error.
  /// `books(s)` is source s's history_books. Returns the evicted prefixes, least recently used first.
  template <class Books>
  std::vector<prefix_id> retain_rows(prefix_id id, request_id request, std::size_t slot,
                                     std::span<const std::int64_t> rows, Books&& books) {
    if (contains(id)) throw duplicate_prefix("prefix " + std::to_string(id) + " is already retained");
    if (rows.size() != Sources)
      throw size_mismatch("retain_prefix " + std::to_string(id) + " gives rows for " + std::to_string(rows.size()) +
                          " sources, the layout has " + std::to_string(Sources));
    std::array<std::int64_t, Sources> r{};
    std::array<std::vector<page_id>, Sources> pages;
    for (std::size_t s = 0; s < Sources; ++s) {
      const std::int64_t f = books(s).slot(slot).frontier;
      if (rows[s] < 0)
        throw position_out_of_range("retain_prefix " + std::to_string(id) + " of " + std::to_string(rows[s]) +
                                    " rows on source " + std::to_string(s));
      if (rows[s] > f)
        throw position_beyond_frontier("retain_prefix " + std::to_string(id) + " of " + std::to_string(rows[s]) +
                                       " rows on source " + std::to_string(s) + ", request " +
                                       std::to_string(request) + " stores " + std::to_string(f));
      r[s] = rows[s];
      pages[s] = books(s).history_pages(slot, rows[s]);
    }
    auto victims = plan_retain(id, pages);
    retain(id, r, std::move(pages), victims, books);
    return victims;
  }
  /// `retain_rows` of the request's whole stored history on every source.
  template <class Books>
  std::vector<prefix_id> retain_stored(prefix_id id, request_id request, std::size_t slot, Books&& books) {
    std::array<std::int64_t, Sources> rows{};
    for (std::size_t s = 0; s < Sources; ++s) rows[s] = books(s).slot(slot).frontier;
    return retain_rows(id, request, slot, rows, books);
  }

  /// Evicts `victims` (from `plan_retain`), then records prefix `id` and takes a reference on each
  /// of its pages. `books(s)` is source s's history_books.
  template <class Books>
  void retain(prefix_id id, const std::array<std::int64_t, Sources>& rows,
              std::array<std::vector<page_id>, Sources> pages, const std::vector<prefix_id>& victims, Books&& books) {
    for (prefix_id v : victims) release(v, books);
    entry e;
    e.rows = rows;
    e.pages = std::move(pages);
    e.used = ++clock_;
    for (std::size_t s = 0; s < Sources; ++s)
      for (page_id g : e.pages[s]) {
        if (refs_[s][static_cast<std::size_t>(g)]++ == 0) ++held_[s];
        books(s).share_page(g);
      }
    by_use_.emplace(e.used, id);
    entries_.emplace(id, std::move(e));
  }

  /// Drops prefix `id` and its page references; throws unknown_prefix (nothing changed).
  template <class Books>
  void release(prefix_id id, Books&& books) {
    const entry& e = find(id);
    for (std::size_t s = 0; s < Sources; ++s)
      for (page_id g : e.pages[s]) {
        if (--refs_[s][static_cast<std::size_t>(g)] == 0) --held_[s];
        books(s).drop_page(g);
      }
    by_use_.erase(e.used);
    entries_.erase(id);
  }

  /// Marks prefix `id` as the most recently used (an admission on it).
  void touch(prefix_id id) {
    auto& e = entries_.at(id);
    by_use_.erase(e.used);
    e.used = ++clock_;
    by_use_.emplace(e.used, id);
  }

 private:
  std::size_t budget_ = 0;
  std::uint64_t clock_ = 0;
  std::unordered_map<prefix_id, entry> entries_;
  std::map<std::uint64_t, prefix_id> by_use_;                // LRU stamp -> prefix, least recent first
  std::array<std::vector<std::uint32_t>, Sources> refs_{};   // host page -> prefixes holding it
  std::array<std::size_t, Sources> held_{};                  // pages with refs_ > 0
};

}  // namespace dhisparse::detail
