#pragma once
/// \file
/// A deliberately naive, independent reference model of the host hierarchy's observable state,
/// written from the documentation (policies/hot_cache.hpp, host/hierarchy.hpp, location_space.hpp),
/// not from the implementation: it includes no library header but the vocabulary types, and does its
/// own location arithmetic (model_geometry). A disagreement with `host_hierarchy` exposes a bug in one of them.
///
/// ## The hot-cache rule, restated with timestamps
/// The documentation keeps an order list per (request, source), least recently used first, and
/// updates it after a call that finds H selected rows and recovers M rows as
///     new order = [untouched slots, old order] ++ [hit slots, old order] ++ [victim slots, old order]
/// with the victims being the first M slots of the old order that hold no selected row, and the
/// missing rows (ascending row index) going to the victims in order-list order. Empty slots sit at
/// the front, lowest slot first.
///
/// Here every slot instead carries a key (tick, rank), and the order list is "all slots sorted by
/// key". Empty slots have key (-1, slot), so they sort first, lowest slot first. A call that
/// reaches the hot cache gets a fresh tick t, larger than every earlier tick, and
///   * victims  = the M unprotected (non-hit) slots with the least keys, taken in key order;
///   * the i-th smallest missing row goes to the i-th victim;
///   * new keys: the hit slots, in increasing old key, get (t, 0..H-1); the victim slots, in
///     increasing old key, get (t, H..H+M-1); every other slot keeps its key.
/// This is the same rule: untouched slots keep keys < (t, 0) in their old relative order, and all
/// touched slots follow them, hits before victims, each group in its old relative order ("LRU with
/// ties among rows used by the same call broken by their previous recency").
///
/// ## Resolution (host/hierarchy.hpp)
///  1. -1 passes as -1. An entry e >= frontier - T (the tail ring) resolves to tail(slot, e); else an
///     entry whose page is mapped in the optional map resolves to optional(pool page, e). Both are
///     "direct" and never touch the hot cache (no lookup, no protection, no recency update).
///  2. The other distinct rows are looked up in the hot cache: hits are protected.
///  3. Misses take victims as above and are "copied from host" in ascending row order (the plan).
///  Calls in which every entry is direct (or -1) leave the hot cache untouched.
///
/// The model uses std::map/std::set and sorting on purpose: it shares no code with the library.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include <dhisparse/hierarchy_types.hpp>
#include <dhisparse/types.hpp>

namespace dhisparse_testing {

using dhisparse::location;
using dhisparse::row_index;

/// The pool geometry the model expects, with its own location arithmetic, restated from the
/// documented layout (location_space.hpp's file comment) rather than taken from the library:
///
///   [ hot: N x B | tail: N x (T + K_max when speculative) | optional: P x p | staging ]
///
/// Built from the configuration the test chose; the library's `space()` must agree with it.
struct model_geometry {
  std::size_t slots = 0;           ///< N
  std::size_t hot_rows = 0;        ///< B
  std::size_t tail_window = 0;     ///< T: committed rows that resolve to the tail
  std::size_t tail_ring = 0;       ///< ring rows per slot: T, plus K_max with speculation
  std::size_t optional_pages = 0;  ///< P
  std::size_t page_rows = 0;       ///< p

  /// Geometry for `cfg` (tail_rows 0 means one page, as documented), B hot rows and p rows a page.
  static model_geometry of(const dhisparse::hierarchy_config& cfg, std::size_t hot_rows, std::size_t page_rows) {
    model_geometry g;
    g.slots = cfg.max_requests;
    g.hot_rows = hot_rows;
    g.tail_window = cfg.tail_rows == 0 ? page_rows : cfg.tail_rows;
    g.tail_ring = g.tail_window + (cfg.max_block > 1 ? cfg.max_block : 0);
    g.optional_pages = cfg.optional_pages;
    g.page_rows = page_rows;
    return g;
  }

  /// Host pages per source for `cfg`: 0 means every slot at full capacity, as documented.
  static std::size_t host_pages_of(const dhisparse::hierarchy_config& cfg, std::size_t page_rows) {
    return cfg.host_pages != 0 ? cfg.host_pages : cfg.max_requests * ((cfg.max_rows + page_rows - 1) / page_rows);
  }

  [[nodiscard]] location hot(std::size_t slot, std::size_t way) const {
    return checked(slot * hot_rows + way);
  }
  [[nodiscard]] location tail(std::size_t slot, std::int64_t row) const {
    const std::size_t region = slots * hot_rows;
    return checked(region + slot * tail_ring + static_cast<std::size_t>(row % static_cast<std::int64_t>(tail_ring)));
  }
  [[nodiscard]] location optional(std::size_t pool_page, std::int64_t row) const {
    const std::size_t region = slots * hot_rows + slots * tail_ring;
    return checked(region + pool_page * page_rows + static_cast<std::size_t>(row % static_cast<std::int64_t>(page_rows)));
  }

 private:
  static location checked(std::size_t v) {
    if (v > 0x7fffffffu) throw std::logic_error("reference model: location past int32");
    return static_cast<location>(v);
  }
};

/// Where the model expects a selection entry to resolve.
enum class resolved_from : std::uint8_t { none, tail, optional, hot, host };

inline const char* to_string(resolved_from w) {
  switch (w) {
    case resolved_from::none: return "none(-1)";
    case resolved_from::tail: return "tail";
    case resolved_from::optional: return "optional";
    case resolved_from::hot: return "hot";
    case resolved_from::host: return "host";
  }
  return "?";
}

/// One predicted entry: its kind and its location.
struct predicted_entry {
  resolved_from from = resolved_from::none;
  location loc = dhisparse::no_location;
};

/// What the model predicts for one resolve of one request on one source.
struct predicted_resolve {
  std::vector<predicted_entry> entries;  ///< in selection order
  dhisparse::resolve_stats stats;        ///< bytes_copied is left 0: it depends on the copy mode
  std::vector<dhisparse::planned_copy> copies;  ///< host copies, ascending row
};

/// The hot cache, tail, optional map and frontier of one (request, source).
class reference_request_model {
 public:
  reference_request_model() = default;
  reference_request_model(const model_geometry& space, std::size_t slot)
      : space_(space), slot_(slot) {
    reset();
  }

  /// Empty history and empty hot cache (a new incarnation in the same slot).
  void reset() {
    frontier_ = 0;
    tick_ = 0;
    optional_.clear();
    slots_.assign(space_.hot_rows, slot_key{});
    for (std::size_t j = 0; j < slots_.size(); ++j)
      slots_[j] = slot_key{dhisparse::no_row, -1, static_cast<std::int64_t>(j)};
  }

  [[nodiscard]] std::int64_t frontier() const { return frontier_; }
  [[nodiscard]] std::size_t slot() const { return slot_; }
  [[nodiscard]] std::size_t page_rows() const { return space_.page_rows; }
  [[nodiscard]] std::size_t hot_capacity() const { return space_.hot_rows; }
  [[nodiscard]] std::int64_t tail_begin() const { return frontier_ - static_cast<std::int64_t>(space_.tail_window); }
  void append(std::size_t count) { frontier_ += static_cast<std::int64_t>(count); }

  /// Optional map: history page -> pool page.
  void map_page(std::size_t page, std::int32_t pool_page) { optional_[page] = pool_page; }
  void unmap_page(std::size_t page) { optional_.erase(page); }
  [[nodiscard]] const std::map<std::size_t, std::int32_t>& optional_pages() const { return optional_; }
  [[nodiscard]] bool page_mapped(std::size_t page) const { return optional_.count(page) != 0; }

  /// Row held by each hot slot, -1 when empty (the form of `hot_rows_of`).
  [[nodiscard]] std::vector<row_index> hot_rows() const {
    std::vector<row_index> v;
    for (const auto& s : slots_) v.push_back(s.row);
    return v;
  }
  /// Slots sorted least recently used first (the form of `lru_order_of`).
  [[nodiscard]] std::vector<std::size_t> lru_order() const {
    std::vector<std::size_t> idx(slots_.size());
    for (std::size_t j = 0; j < idx.size(); ++j) idx[j] = j;
    std::sort(idx.begin(), idx.end(), [&](std::size_t a, std::size_t b) { return key(a) < key(b); });
    return idx;
  }
  /// Hot slot of a row, if cached.
  [[nodiscard]] std::optional<std::size_t> hot_slot_of(row_index row) const {
    for (std::size_t j = 0; j < slots_.size(); ++j)
      if (slots_[j].row == row) return j;
    return std::nullopt;
  }
  /// Rows currently in the hot cache.
  [[nodiscard]] std::vector<row_index> cached_rows() const {
    std::vector<row_index> v;
    for (const auto& s : slots_)
      if (s.row != dhisparse::no_row) v.push_back(s.row);
    return v;
  }

  /// Where an entry would resolve directly (tail or optional), without touching the hot cache.
  [[nodiscard]] std::optional<predicted_entry> direct(row_index e) const {
    if (e >= tail_begin()) return predicted_entry{resolved_from::tail, space_.tail(slot_, e)};
    const std::size_t page = static_cast<std::size_t>(e) / space_.page_rows;
    if (auto it = optional_.find(page); it != optional_.end())
      return predicted_entry{resolved_from::optional, space_.optional(static_cast<std::size_t>(it->second), e)};
    return std::nullopt;
  }

  /// Applies one (already valid) selection and predicts every entry.
  predicted_resolve resolve(std::span<const row_index> selection) {
    predicted_resolve out;
    out.entries.resize(selection.size());
    std::set<row_index> pending;
    for (std::size_t i = 0; i < selection.size(); ++i) {
      const row_index e = selection[i];
      if (e == dhisparse::no_row) continue;
      if (e < 0 || e >= frontier_)
        throw std::logic_error("reference model: invalid selection entry " + std::to_string(e));
      ++out.stats.selected;
      if (auto d = direct(e)) {
        out.entries[i] = *d;
        ++out.stats.direct;
      } else {
        pending.insert(e);
      }
    }
    if (pending.empty()) return out;

    const std::int64_t t = ++tick_;
    std::map<row_index, std::size_t> cached;  // row -> slot
    for (std::size_t j = 0; j < slots_.size(); ++j)
      if (slots_[j].row != dhisparse::no_row) {
        if (!cached.emplace(slots_[j].row, j).second)
          throw std::logic_error("reference model: row cached twice");
      }
    std::vector<std::size_t> hits, unprotected;
    std::set<row_index> misses;  // ascending
    std::set<std::size_t> hit_set;
    for (row_index r : pending) {
      if (auto it = cached.find(r); it != cached.end()) {
        hits.push_back(it->second);
        hit_set.insert(it->second);
      } else {
        misses.insert(r);
      }
    }
    for (std::size_t j = 0; j < slots_.size(); ++j)
      if (!hit_set.count(j)) unprotected.push_back(j);
    auto by_key = [&](std::size_t a, std::size_t b) { return key(a) < key(b); };
    std::sort(hits.begin(), hits.end(), by_key);
    std::sort(unprotected.begin(), unprotected.end(), by_key);
    if (misses.size() > unprotected.size()) throw std::logic_error("reference model: selection does not fit B");
    const std::vector<std::size_t> victims(unprotected.begin(),
                                           unprotected.begin() + static_cast<std::ptrdiff_t>(misses.size()));

    std::map<row_index, std::size_t> placed;  // pending row -> slot
    for (std::size_t j : hits) placed[slots_[j].row] = j;
    std::size_t v = 0;
    for (row_index r : misses) {
      const std::size_t j = victims[v++];
      slots_[j].row = r;
      placed[r] = j;
      out.copies.push_back(dhisparse::planned_copy{slot_, r, space_.hot(slot_, j)});
    }
    std::int64_t rank = 0;
    for (std::size_t j : hits) { slots_[j].tick = t; slots_[j].rank = rank++; }
    for (std::size_t j : victims) { slots_[j].tick = t; slots_[j].rank = rank++; }

    out.stats.rows_copied = misses.size();
    for (std::size_t i = 0; i < selection.size(); ++i) {
      const row_index e = selection[i];
      if (e == dhisparse::no_row || !pending.count(e)) continue;
      const bool missed = misses.count(e) != 0;
      out.entries[i] =
          predicted_entry{missed ? resolved_from::host : resolved_from::hot, space_.hot(slot_, placed.at(e))};
      ++(missed ? out.stats.host : out.stats.hot);
    }
    return out;
  }

 private:
  struct slot_key {
    row_index row = dhisparse::no_row;
    std::int64_t tick = -1;
    std::int64_t rank = 0;
  };
  [[nodiscard]] std::tuple<std::int64_t, std::int64_t> key(std::size_t j) const {
    return {slots_[j].tick, slots_[j].rank};
  }

  model_geometry space_{};
  std::size_t slot_ = 0;
  std::int64_t frontier_ = 0;
  std::int64_t tick_ = 0;
  std::vector<slot_key> slots_;
  std::map<std::size_t, std::int32_t> optional_;
};

/// The whole hierarchy's bookkeeping, for driving differential tests: request slots (lowest free
/// first), per source a pool of optional pages (lowest free first) and host pages, and one
/// reference_request_model per (slot, source).
class reference_hierarchy {
 public:
  reference_hierarchy(const model_geometry& space, std::size_t sources, std::size_t max_rows,
                      std::size_t host_pages_per_source)
      : space_(space), sources_(sources), max_rows_(max_rows), host_pages_(host_pages_per_source) {
    for (std::size_t s = 0; s < space.slots; ++s) free_slots_.insert(s);
    free_optional_.resize(sources);
    used_host_pages_.assign(sources, 0);
    for (auto& f : free_optional_)
      for (std::size_t g = 0; g < space.optional_pages; ++g) f.insert(static_cast<std::int32_t>(g));
    plans_.resize(sources);
    models_.resize(space.slots);
    for (std::size_t s = 0; s < space.slots; ++s)
      for (std::size_t src = 0; src < sources; ++src) models_[s].emplace_back(space, s);
  }

  [[nodiscard]] const model_geometry& space() const { return space_; }
  [[nodiscard]] bool contains(std::uint64_t id) const { return slot_of_.count(id) != 0; }
  [[nodiscard]] std::size_t slot_of(std::uint64_t id) const { return slot_of_.at(id); }
  [[nodiscard]] std::size_t admitted_count() const { return slot_of_.size(); }
  [[nodiscard]] std::vector<std::uint64_t> admitted() const {
    std::vector<std::uint64_t> v;
    for (const auto& [id, s] : slot_of_) v.push_back(id);
    return v;
  }

  /// Lowest free slot, or nullopt (a wait).
  std::optional<std::size_t> admit(std::uint64_t id) {
    if (contains(id)) throw std::logic_error("reference model: double admission");
    if (free_slots_.empty()) return std::nullopt;
    const std::size_t s = *free_slots_.begin();
    free_slots_.erase(free_slots_.begin());
    slot_of_[id] = s;
    for (auto& m : models_[s]) m.reset();
    return s;
  }
  void complete(std::uint64_t id) {
    const std::size_t s = slot_of_.at(id);
    for (std::size_t src = 0; src < sources_; ++src) {
      auto& m = models_[s][src];
      for (const auto& [page, g] : m.optional_pages()) free_optional_[src].insert(g);
      used_host_pages_[src] -= pages_for(m.frontier());
      m.reset();
    }
    slot_of_.erase(id);
    free_slots_.insert(s);
  }

  reference_request_model& model(std::uint64_t id, std::size_t source) { return models_[slot_of_.at(id)][source]; }
  [[nodiscard]] const reference_request_model& model(std::uint64_t id, std::size_t source) const {
    return models_[slot_of_.at(id)][source];
  }

  /// Pages the host store needs to grow a history from `frontier` by `count` rows.
  [[nodiscard]] std::size_t pages_needed(std::uint64_t id, std::size_t source, std::size_t count) const {
    const auto f = model(id, source).frontier();
    return pages_for(f + static_cast<std::int64_t>(count)) - pages_for(f);
  }
  [[nodiscard]] std::size_t free_host_pages(std::size_t source) const { return host_pages_ - used_host_pages_[source]; }
  [[nodiscard]] std::size_t free_optional_pages(std::size_t source) const { return free_optional_[source].size(); }
  [[nodiscard]] std::size_t max_rows() const { return max_rows_; }

  void append(std::uint64_t id, std::size_t source, std::size_t count) {
    used_host_pages_[source] += pages_needed(id, source, count);
    model(id, source).append(count);
  }

  /// Predicts map_optional_page: true and the pool page taken (lowest free), or false (a wait).
  bool map_optional_page(std::uint64_t id, std::size_t source, std::size_t page) {
    auto& m = model(id, source);
    if (m.page_mapped(page)) return true;
    if (free_optional_[source].empty()) return false;
    const std::int32_t g = *free_optional_[source].begin();
    free_optional_[source].erase(free_optional_[source].begin());
    m.map_page(page, g);
    return true;
  }
  void unmap_optional_page(std::uint64_t id, std::size_t source, std::size_t page) {
    auto& m = model(id, source);
    if (auto it = m.optional_pages().find(page); it != m.optional_pages().end()) {
      free_optional_[source].insert(it->second);
      m.unmap_page(page);
    }
  }

  /// Applies a batch (already valid) in order; the predicted plan of the source is the
  /// concatenation of the items' copies.
  using batch_selections = std::vector<std::pair<std::uint64_t, std::vector<row_index>>>;
  std::vector<predicted_resolve> resolve(std::size_t source, const batch_selections& batch) {
    std::vector<predicted_resolve> out;
    auto& plan = plans_.at(source);
    plan.clear();
    for (const auto& [id, sel] : batch) {
      out.push_back(model(id, source).resolve(sel));
      plan.insert(plan.end(), out.back().copies.begin(), out.back().copies.end());
    }
    return out;
  }
  /// Predicted `last_plan(source)`.
  [[nodiscard]] const std::vector<dhisparse::planned_copy>& last_plan(std::size_t source) const {
    return plans_.at(source);
  }

 private:
  [[nodiscard]] std::size_t pages_for(std::int64_t rows) const {
    return (static_cast<std::size_t>(rows) + space_.page_rows - 1) / space_.page_rows;
  }

  model_geometry space_;
  std::size_t sources_ = 0, max_rows_ = 0, host_pages_ = 0;
  std::set<std::size_t> free_slots_;
  std::map<std::uint64_t, std::size_t> slot_of_;
  std::vector<std::set<std::int32_t>> free_optional_;
  std::vector<std::size_t> used_host_pages_;
  std::vector<std::vector<reference_request_model>> models_;  // [slot][source]
  std::vector<std::vector<dhisparse::planned_copy>> plans_;  // per source: copies of its last resolve
};


// --- workload helpers ------------------------------------------------------------------------------

/// A small deterministic generator (splitmix64 stream): the same sequence with every standard
/// library, so a failing seed reproduces anywhere.
class test_rng {
 public:
  explicit test_rng(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() {
    state_ += 0x9E3779B97F4A7C15ull;
    std::uint64_t z = state_;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  /// Uniform in [0, n); n > 0.
  std::size_t below(std::size_t n) { return static_cast<std::size_t>(next() % n); }
  /// Uniform in [lo, hi].
  std::int64_t between(std::int64_t lo, std::int64_t hi) {
    return lo + static_cast<std::int64_t>(below(static_cast<std::size_t>(hi - lo + 1)));
  }
  /// True with probability num/den.
  bool chance(std::size_t num, std::size_t den) { return below(den) < num; }

 private:
  std::uint64_t state_;
};

/// Weights (out of their sum) of the kinds of entries a random selection draws.
struct selection_mix {
  std::size_t padding = 6;     ///< -1 anywhere
  std::size_t tail = 14;       ///< a row of the tail ring
  std::size_t cached = 25;     ///< a row now in the hot cache (a likely hit)
  std::size_t oldest_cached = 5;  ///< one of the least recently used cached rows (protected just in time)
  std::size_t duplicate = 8;   ///< repeats an earlier entry of the same selection
  std::size_t optional = 7;    ///< a row of a mapped optional page
  std::size_t window = 15;     ///< a row of the recent window [frontier - window_rows, frontier)
  std::size_t old = 20;        ///< any existing row
  std::size_t window_rows = 256;
  std::size_t pad_end_one_in = 4;  ///< one selection in this many ends with a run of -1 (FlashMLA style)
};

/// A random selection of `len` entries for the model's request: tail rows, cached rows, random old
/// rows, duplicates and -1 padding, as a sparse-attention indexer might emit them. All entries are
/// valid for the current frontier (or -1). The hierarchy never reorders a selection, so neither
/// does this: entries are emitted in random order.
inline std::vector<row_index> make_selection(test_rng& rng, const reference_request_model& m, std::size_t len,
                                             const selection_mix& mix = {}) {
  std::vector<row_index> sel;
  sel.reserve(len);
  const std::int64_t f = m.frontier();
  if (f == 0) return std::vector<row_index>(len, dhisparse::no_row);
  const std::vector<row_index> cached = m.cached_rows();
  const std::vector<std::size_t> order = m.lru_order();
  std::vector<row_index> oldest;  // cached rows, least recently used first
  const std::vector<row_index> rows = m.hot_rows();
  for (std::size_t j : order) {
    if (rows[j] != dhisparse::no_row) oldest.push_back(rows[j]);
    if (oldest.size() >= 8) break;
  }
  std::vector<std::size_t> pages;
  for (const auto& [page, g] : m.optional_pages()) pages.push_back(page);
  const std::size_t total = mix.padding + mix.tail + mix.cached + mix.oldest_cached + mix.duplicate + mix.optional +
                            mix.window + mix.old;
  std::size_t body = len;
  if (mix.pad_end_one_in != 0 && len > 1 && rng.below(mix.pad_end_one_in) == 0) body = len - 1 - rng.below(len / 2 + 1);
  auto any_row = [&] { return static_cast<row_index>(rng.below(static_cast<std::size_t>(f))); };
  while (sel.size() < body) {
    std::size_t r = rng.below(total);
    row_index e = dhisparse::no_row;
    if (r < mix.padding) { sel.push_back(dhisparse::no_row); continue; }
    r -= mix.padding;
    if (r < mix.tail) {
      const std::int64_t t = std::min<std::int64_t>(f, f - m.tail_begin());
      e = static_cast<row_index>(f - 1 - static_cast<std::int64_t>(rng.below(static_cast<std::size_t>(t))));
    } else if ((r -= mix.tail) < mix.cached) {
      e = cached.empty() ? any_row() : cached[rng.below(cached.size())];
    } else if ((r -= mix.cached) < mix.oldest_cached) {
      e = oldest.empty() ? any_row() : oldest[rng.below(oldest.size())];
    } else if ((r -= mix.oldest_cached) < mix.duplicate) {
      e = sel.empty() ? any_row() : sel[rng.below(sel.size())];
    } else if ((r -= mix.duplicate) < mix.optional) {
      if (pages.empty()) {
        e = any_row();
      } else {
        const std::size_t page = pages[rng.below(pages.size())];
        const std::size_t p = m.page_rows();
        e = static_cast<row_index>(page * p + rng.below(p));
      }
    } else if ((r -= mix.optional) < mix.window) {
      const std::int64_t w = std::min<std::int64_t>(f, static_cast<std::int64_t>(mix.window_rows));
      e = static_cast<row_index>(f - 1 - static_cast<std::int64_t>(rng.below(static_cast<std::size_t>(w))));
    } else {
      e = any_row();
    }
    sel.push_back(e);
  }
  sel.resize(len, dhisparse::no_row);
  return sel;
}

}  // namespace dhisparse_testing
