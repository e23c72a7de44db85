#pragma once
/// \file
/// Host-side books of one source's request slots, shared by both backends: how many rows each
/// slot stores, which host-store page holds each history page, which optional pool page serves it,
/// and the free optional pool. Every operation validates before it changes anything and throws the
/// typed errors of errors.hpp; the backends only move bytes.
///
/// Shared prefixes (docs/prefixes.md): a host page may be held by several slots and retained
/// prefixes at once, so every host page has a holder count and returns to the store only when the
/// last holder drops it. Histories are append-only and a slot's shared pages are complete pages
/// below its own rows, so shared pages are never written (no copy on write). The optional pool is
/// keyed by host page: the slots that map the same host page share one pool page (counted once),
/// which returns to the pool when its last slot unmaps it.
///
/// Shared host store (docs/multi-gpu.md): the books of one rank of several that share one host
/// store (`attach_shared`) take a slot's pages from the shared books, keyed by the request in the
/// slot (`bind`), so every rank maps history page p of a request to the same host page; the page
/// counts below stay this rank's holders, and the shared books free a page once no rank holds it.
/// The caller holds the shared books' mutex around every call. Unattached books pay one null test
/// per page taken or dropped.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "../errors.hpp"
#include "../host/host_store.hpp"
#include "../types.hpp"
#include "shared_store_books.hpp"

namespace dhisparse::detail {

class history_books {
 public:
  /// What one request slot holds.
  struct slot_books {
    std::int64_t frontier = 0;               ///< rows stored
    std::size_t allocated_pages = 0;          ///< history pages [0, allocated_pages) hold host pages (stored or reserved)
    std::vector<page_id> host_pages;          ///< history page -> host-store page, no_page if none yet
    std::vector<std::int32_t> optional_page;  ///< history page -> optional pool page, -1 if none
  };
  /// Rows and new history pages of an append.
  struct append_span {
    std::int64_t first_row = 0, last_row = 0;  ///< rows [first_row, last_row) were appended
    std::size_t first_page = 0, last_page = 0;  ///< history pages [first_page, last_page) were allocated
  };
  /// History pages a reservation allocated: [first_page, last_page) (empty when none was needed).
  struct reserve_span {
    std::size_t first_page = 0, last_page = 0;
  };

  history_books() = default;
  history_books(std::size_t slots, std::size_t max_rows, std::size_t page_rows, std::size_t optional_pages,
                host_store store)
      : max_rows_(max_rows), page_rows_(page_rows), store_(std::move(store)), slots_(slots) {
    for (auto& s : slots_) reset(s);
    for (std::size_t g = optional_pages; g-- > 0;) free_optional_.push_back(static_cast<std::int32_t>(g));
    refs_.assign(store_.total_pages(), 0);
    optional_of_host_.assign(store_.total_pages(), -1);
    optional_refs_.assign(optional_pages, 0);
  }

  /// Holders of host page `g` (slots and retained prefixes); 0 when free.
  [[nodiscard]] std::uint32_t page_refs(page_id g) const { return refs_[static_cast<std::size_t>(g)]; }
  /// Slots mapping optional pool page `g`; 0 when free.
  [[nodiscard]] std::uint32_t optional_refs(std::int32_t g) const { return optional_refs_[static_cast<std::size_t>(g)]; }
  /// Optional pool page serving host page `g`, -1 when none.
  [[nodiscard]] std::int32_t optional_of_host(page_id g) const { return optional_of_host_[static_cast<std::size_t>(g)]; }
  /// One more holder of an allocated host page (a retained prefix or a slot sharing it).
  void share_page(page_id g) { ++refs_[static_cast<std::size_t>(g)]; }
  /// One holder fewer; the page returns to the store with its last holder (on a shared store:
  /// this rank's last holder; the shared books free it with the last rank's).
  void drop_page(page_id g) {
    if (--refs_[static_cast<std::size_t>(g)] != 0) return;
    if (shared_) shared_->release(source_, g, rank_);
    else store_.release(g);
  }

  /// Makes these books rank `rank`'s part of a shared host store for source `source`: pages come
  /// from `shared` (the store in `store_` is then only the shared bytes' geometry and address).
  void attach_shared(shared_store_books* shared, std::size_t source, std::size_t rank) {
    shared_ = shared;
    source_ = source;
    rank_ = rank;
    keys_.assign(slots_.size(), 0);
  }
  /// Names the request in slot `s` (shared store: its pages are keyed by the request id).
  void bind(std::size_t s, request_id id) {
    if (shared_) keys_[s] = id;
  }
  /// The shared books, or null when the books own their store.
  [[nodiscard]] shared_store_books* shared() const { return shared_; }
  /// Request id of slot `s` on a shared store.
  [[nodiscard]] request_id key(std::size_t s) const { return keys_[s]; }
  /// True when these books' rank writes `row`'s host copy: every row when the books own their
  /// store; on a shared store only the rows of the history pages the rank owns (owner_rule.hpp).
  [[nodiscard]] bool writes_host_copy(std::int64_t row) const {
    return !shared_ || shared_->owner(page_of(row)) == rank_;
  }
  /// Records that this rank wrote the host copies of rows [first, last) of slot `s` that it owns,
  /// in row order (shared store; nothing when the books own their store). The host backend calls
  /// it once the bytes are there; the CUDA backend once the launch that writes them is enqueued
  /// (eager calls) or absorbed (`sync_books`, which joined the backup first).
  void wrote_host_copies(std::size_t s, std::int64_t first, std::int64_t last) {
    if (shared_) shared_->wrote(source_, keys_[s], first, last, rank_);
  }
  /// Free host pages: the store's own, or the shared store's.
  [[nodiscard]] std::size_t free_host_pages() const { return shared_ ? shared_->free_pages(source_) : store_.free_pages(); }
  /// Host pages that taking history pages [first, last) of slot `s` would allocate: all of them, or
  /// on a shared store those that no rank has yet.
  [[nodiscard]] std::size_t pages_to_take(std::size_t s, std::size_t first, std::size_t last) const {
    if (last <= first) return 0;
    return shared_ ? shared_->pages_missing(source_, keys_[s], first, last) : last - first;
  }

  /// Fills an empty slot with the first `rows` rows of a retained history held in `pages` (the
  /// history pages covering them, in order): complete pages are shared, a partially filled last
  /// page (rows % page_rows != 0) is replaced by a fresh page of the slot's own, returned so the
  /// caller copies its first rows (the prefix's rows of the boundary page: a copy at admission,
  /// because the slot's own rows will follow them in that page). Check first with
  /// `pages_to_share`: a boundary copy needs one free host page.
  page_id share_history(std::size_t s, std::span<const page_id> pages, std::int64_t rows) {
    auto& st = slots_[s];
    const std::size_t full = static_cast<std::size_t>(rows) / page_rows_;
    for (std::size_t g = 0; g < full; ++g) {
      st.host_pages[g] = pages[g];
      share_page(pages[g]);
    }
    page_id boundary = no_page;
    if (full < pages.size()) {
      boundary = take_page(s, full);
      st.host_pages[full] = boundary;
    }
    st.allocated_pages = pages.size();
    st.frontier = rows;
    return boundary;
  }
  /// Host pages `share_history` allocates for a history of `rows` rows (the boundary copy).
  [[nodiscard]] std::size_t pages_to_share(std::int64_t rows) const {
    return static_cast<std::size_t>(rows) % page_rows_ != 0 ? 1 : 0;
  }
  /// The host pages holding rows [0, rows) of a slot (rows <= frontier).
  [[nodiscard]] std::vector<page_id> history_pages(std::size_t s, std::int64_t rows) const {
    const auto& st = slots_[s];
    return std::vector<page_id>(st.host_pages.begin(), st.host_pages.begin() + static_cast<std::ptrdiff_t>(pages_for(rows)));
  }

  [[nodiscard]] const slot_books& slot(std::size_t s) const { return slots_[s]; }
  [[nodiscard]] const host_store& store() const { return store_; }
  [[nodiscard]] std::size_t pages_per_request() const { return pages_for(static_cast<std::int64_t>(max_rows_)); }
  [[nodiscard]] std::size_t free_optional_pages() const { return free_optional_.size(); }
  [[nodiscard]] std::size_t page_of(std::int64_t row) const { return static_cast<std::size_t>(row) / page_rows_; }
  [[nodiscard]] std::size_t pages_for(std::int64_t rows) const {
    return (static_cast<std::size_t>(rows) + page_rows_ - 1) / page_rows_;
  }
  /// Host-store page holding `row` of a slot (the row must exist).
  [[nodiscard]] page_id host_page_of(std::size_t s, std::int64_t row) const { return slots_[s].host_pages[page_of(row)]; }

  /// The host copy of `row` of payload `layer` in a slot; throws unless the row exists.
  [[nodiscard]] std::span<std::byte> host_row(std::size_t s, std::size_t layer, std::int64_t row) const {
    if (row < 0 || row >= slots_[s].frontier)
      throw position_beyond_frontier("row " + std::to_string(row) + " does not exist (" +
                                     std::to_string(slots_[s].frontier) + " rows stored)");
    return store_.row(host_page_of(s, row), layer, row);
  }

  /// Rows of a slot that have host pages now (stored or reserved): what a write that allocates
  /// nothing may reach.
  [[nodiscard]] std::int64_t reserved_rows(std::size_t s) const {
    return static_cast<std::int64_t>(std::min(max_rows_, slots_[s].allocated_pages * page_rows_));
  }
  /// Host pages a reservation of `rows_ahead` rows past the frontier needs for a slot: pages
  /// covering rows [0, min(max_rows, frontier + rows_ahead)) that it does not hold yet.
  [[nodiscard]] std::size_t pages_to_reserve(std::size_t s, std::size_t rows_ahead) const {
    const auto& st = slots_[s];
    const auto room = static_cast<std::size_t>(static_cast<std::int64_t>(max_rows_) - st.frontier);
    const std::size_t end = static_cast<std::size_t>(st.frontier) + std::min(rows_ahead, room);  // no overflow
    const std::size_t want = pages_for(static_cast<std::int64_t>(end));
    return want > st.allocated_pages ? want - st.allocated_pages : 0;
  }
  /// Throws host_pool_exhausted unless `pages` host pages are free (a reservation's check).
  void check_reserve(request_id id, std::size_t source, std::size_t pages) const {
    if (pages > free_host_pages())
      throw host_pool_exhausted("reservation for request " + std::to_string(id) + " needs " + std::to_string(pages) +
                                " host pages on source " + std::to_string(source) + ", " +
                                std::to_string(free_host_pages()) + " free");
  }
  /// Host pages a reservation of `rows_ahead` rows would allocate for slot `s` (`pages_to_reserve`,
  /// less those another rank of a shared store already has).
  [[nodiscard]] std::size_t fresh_pages_to_reserve(std::size_t s, std::size_t rows_ahead) const {
    const std::size_t first = slots_[s].allocated_pages;
    return pages_to_take(s, first, first + pages_to_reserve(s, rows_ahead));
  }
  /// Allocates the host pages `pages_to_reserve(s, rows_ahead)` names (check first: all or nothing
  /// is the caller's check_reserve). The frontier does not move.
  reserve_span reserve(std::size_t s, std::size_t rows_ahead) {
    auto& st = slots_[s];
    reserve_span r{st.allocated_pages, st.allocated_pages + pages_to_reserve(s, rows_ahead)};
    for (std::size_t g = r.first_page; g < r.last_page; ++g) st.host_pages[g] = take_page(s, g);
    st.allocated_pages = r.last_page;
    return r;
  }
  /// Returns the pages of a reservation (when uploading its page table failed).
  void undo_reserve(std::size_t s, const reserve_span& r) {
    auto& st = slots_[s];
    for (std::size_t g = r.last_page; g-- > r.first_page;) {
      drop_page(st.host_pages[g]);
      st.host_pages[g] = no_page;
    }
    st.allocated_pages = r.first_page;
  }
  /// Moves a slot's frontier to `rows` written on the device (batched writes and commits, whose
  /// rows lie in reserved pages). Frontiers only grow, and never past the reservation.
  void absorb_frontier(request_id id, std::size_t source, std::size_t s, std::int64_t rows) {
    auto& st = slots_[s];
    if (rows < st.frontier || rows > reserved_rows(s))
      throw device_error("the device frontier of request " + std::to_string(id) + " on source " +
                         std::to_string(source) + " is " + std::to_string(rows) + ", outside [" +
                         std::to_string(st.frontier) + ", " + std::to_string(reserved_rows(s)) +
                         "] (books frontier, reserved rows)");
    st.frontier = rows;
  }

  /// Throws unless `count` more rows fit the slot's capacity and the host store. No overflow for
  /// any `count`.
  void check_append(request_id id, std::size_t source, std::size_t s, std::size_t count) const {
    const auto& st = slots_[s];
    const auto room = static_cast<std::size_t>(static_cast<std::int64_t>(max_rows_) - st.frontier);
    if (count > room)
      throw capacity_exceeded("request " + std::to_string(id) + " would hold " +
                              (count <= SIZE_MAX / 2 ? std::to_string(static_cast<std::size_t>(st.frontier) + count)
                                                     : std::to_string(count) + " more") +
                              " rows on source " + std::to_string(source) + ", capacity is " +
                              std::to_string(max_rows_) + " (" + std::to_string(room) + " left)");
    const std::int64_t last = st.frontier + static_cast<std::int64_t>(count);
    const std::size_t want = pages_for(last);
    const std::size_t pages_needed = pages_to_take(s, st.allocated_pages, want);  // reserved pages serve
    if (pages_needed > free_host_pages())
      throw host_pool_exhausted("append of request " + std::to_string(id) + " needs " + std::to_string(pages_needed) +
                                " host pages on source " + std::to_string(source) + ", " +
                                std::to_string(free_host_pages()) + " free");
  }

  /// Records an append that `check_append` accepted: allocates the host pages it needs beyond the
  /// slot's reservation and moves the frontier.
  append_span commit_append(std::size_t s, std::size_t count) {
    auto& st = slots_[s];
    append_span a;
    a.first_row = st.frontier;
    a.last_row = st.frontier + static_cast<std::int64_t>(count);
    a.first_page = st.allocated_pages;
    a.last_page = std::max(st.allocated_pages, pages_for(a.last_row));
    for (std::size_t g = a.first_page; g < a.last_page; ++g) st.host_pages[g] = take_page(s, g);
    st.allocated_pages = a.last_page;
    st.frontier = a.last_row;
    return a;
  }

  /// Undoes the most recent `commit_append` of a slot (when moving its bytes failed): its host pages
  /// return to the store and the frontier moves back.
  void undo_append(std::size_t s, const append_span& a) {
    auto& st = slots_[s];
    for (std::size_t g = a.last_page; g-- > a.first_page;) {
      drop_page(st.host_pages[g]);
      st.host_pages[g] = no_page;
    }
    st.allocated_pages = a.first_page;
    st.frontier = a.first_row;
  }

  /// Reserves an optional pool page for history page `page` of a slot. Only complete pages qualify.
  /// Returns the pool page and whether it is new (the caller copies the rows, then publishes the map
  /// entry), or nullopt when no pool page is free (a wait).
  std::optional<std::pair<std::int32_t, bool>> take_optional(request_id id, std::size_t source, std::size_t s,
                                                             std::size_t page) {
    auto& st = slots_[s];
    check_page(id, page);
    if (page >= static_cast<std::size_t>(st.frontier) / page_rows_)
      throw position_beyond_frontier("page " + std::to_string(page) + " of request " + std::to_string(id) +
                                     " on source " + std::to_string(source) + " is not complete (" +
                                     std::to_string(st.frontier) + " rows)");
    if (st.optional_page[page] >= 0) return std::pair{st.optional_page[page], false};
    const auto host = static_cast<std::size_t>(st.host_pages[page]);
    if (const std::int32_t shared = optional_of_host_[host]; shared >= 0) {  // another slot mapped it: share
      ++optional_refs_[static_cast<std::size_t>(shared)];
      st.optional_page[page] = shared;
      return std::pair{shared, false};
    }
    if (free_optional_.empty()) return std::nullopt;
    const std::int32_t g = free_optional_.back();
    free_optional_.pop_back();
    st.optional_page[page] = g;
    optional_of_host_[host] = g;
    optional_refs_[static_cast<std::size_t>(g)] = 1;
    return std::pair{g, true};
  }
  /// True when mapping history page `page` of a slot would take a page from the pool (it is not
  /// mapped by the slot, nor by another slot sharing its host page).
  [[nodiscard]] bool mapping_takes_pool_page(std::size_t s, std::size_t page) const {
    const auto& st = slots_[s];
    return st.optional_page[page] < 0 && optional_of_host_[static_cast<std::size_t>(st.host_pages[page])] < 0;
  }

  /// Returns the optional pool page of a history page to the pool; false when it had none.
  bool release_optional(request_id id, std::size_t s, std::size_t page) {
    auto& st = slots_[s];
    check_page(id, page);
    if (st.optional_page[page] < 0) return false;
    unref_optional(st.host_pages[page], st.optional_page[page]);
    st.optional_page[page] = -1;
    return true;
  }

  /// Takes the optional pool page of a history page out of the slot's map without returning it to
  /// the pool (a GPU reader may still use it: the caller recycles it later); -1 when it had none,
  /// or when other slots still map it (shared: it stays in the pool for them).
  std::int32_t detach_optional(request_id id, std::size_t s, std::size_t page) {
    auto& st = slots_[s];
    check_page(id, page);
    const std::int32_t g = st.optional_page[page];
    st.optional_page[page] = -1;
    if (g < 0) return g;
    if (--optional_refs_[static_cast<std::size_t>(g)] > 0) return -1;
    optional_of_host_[static_cast<std::size_t>(st.host_pages[page])] = -1;
    return g;
  }

  /// Returns a pool page detached by `detach_optional` to the pool.
  void recycle_optional(std::int32_t g) { give_back_optional(g); }

  /// Returns every host and optional page of a slot and empties it (request completion).
  /// Host pages shared with other holders stay allocated, and so do optional pages other slots map.
  void release_slot(std::size_t s) {
    auto& st = slots_[s];
    for (std::size_t page = 0; page < st.optional_page.size(); ++page)
      if (st.optional_page[page] >= 0) unref_optional(st.host_pages[page], st.optional_page[page]);
    for (page_id g : st.host_pages)
      if (g != no_page) drop_page(g);
    reset(st);
  }

 private:
  void reset(slot_books& st) const {
    st.frontier = 0;
    st.allocated_pages = 0;
    st.host_pages.assign(pages_per_request(), no_page);
    st.optional_page.assign(pages_per_request(), -1);
  }
  void check_page(request_id id, std::size_t page) const {
    if (page >= pages_per_request())
      throw position_out_of_range("optional page " + std::to_string(page) + " of request " + std::to_string(id) +
                                  " is outside its " + std::to_string(pages_per_request()) + " history pages");
  }
  page_id take_page(std::size_t s, std::size_t page) {
    const page_id g = shared_ ? shared_->acquire(source_, keys_[s], page, rank_) : store_.allocate();
    refs_[static_cast<std::size_t>(g)] = 1;
    return g;
  }
  void unref_optional(page_id host, std::int32_t g) {
    if (--optional_refs_[static_cast<std::size_t>(g)] > 0) return;  // other slots still map it
    optional_of_host_[static_cast<std::size_t>(host)] = -1;
    give_back_optional(g);
  }
  void give_back_optional(std::int32_t g) {  // keep "lowest free page first"
    free_optional_.insert(std::upper_bound(free_optional_.begin(), free_optional_.end(), g, std::greater<>()), g);
  }

  std::size_t max_rows_ = 0, page_rows_ = 1;
  host_store store_;
  std::vector<slot_books> slots_;
  std::vector<std::int32_t> free_optional_;  // descending: back() is the lowest free page
  std::vector<std::uint32_t> refs_;              // host page -> holders (slots, retained prefixes)
  std::vector<std::int32_t> optional_of_host_;   // host page -> optional pool page serving it, -1 if none
  std::vector<std::uint32_t> optional_refs_;     // optional pool page -> slots mapping it
  shared_store_books* shared_ = nullptr;         // the shared store's books, null when store_ is ours
  std::size_t source_ = 0, rank_ = 0;            // this books' source and rank on the shared store
  std::vector<request_id> keys_;                 // shared store: slot -> request id
};

}  // namespace dhisparse::detail
