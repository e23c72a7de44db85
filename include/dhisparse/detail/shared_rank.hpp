#pragma once
/// \file
/// One hierarchy's rank on a shared host store (docs/multi-gpu.md), the part both backends have in
/// common: claiming the rank, the store's lock, attaching and detaching requests, and the host-side
/// checks of reads that need an owner's host copy. Default-constructed (null books), the hierarchy
/// owns its stores and every call here is free.
#include <cstddef>
#include <mutex>
#include <string>
#include <utility>

#include "../errors.hpp"
#include "../hierarchy_types.hpp"
#include "../types.hpp"
#include "history_books.hpp"
#include "request_registry.hpp"
#include "shared_store_books.hpp"

namespace dhisparse::detail {

/// A shared store's configuration for a rank's hierarchy: `cfg.host_pages` must be 0 or the store's.
inline hierarchy_config shared_config(hierarchy_config cfg, std::size_t store_pages) {
  if (cfg.host_pages != 0 && cfg.host_pages != store_pages)
    throw invalid_configuration("host_pages is " + std::to_string(cfg.host_pages) + ", the shared host store has " +
                                std::to_string(store_pages) + " (give 0 or the store's)");
  cfg.host_pages = store_pages;
  return cfg;
}

/// The rank a hierarchy holds on a shared host store. A copy would put two hierarchies on one
/// rank, so copying a bound rank throws; moving moves it; destruction gives it back, ending every
/// page hold and attachment the rank had.
class shared_rank {
 public:
  shared_rank() = default;
  /// Claims `rank` of `books` for a hierarchy of `max_requests` requests; throws
  /// invalid_configuration when it is out of range or taken, or the store holds too few requests.
  shared_rank(shared_store_books* books, std::size_t rank, std::size_t max_requests) : rank_(rank) {
    const std::scoped_lock lock(books->mutex());
    books->bind(rank, max_requests);
    books_ = books;
  }
  shared_rank(const shared_rank& o) : rank_(o.rank_) { refuse_copy(o); }
  shared_rank(shared_rank&& o) noexcept : books_(std::exchange(o.books_, nullptr)), rank_(o.rank_) {}
  shared_rank& operator=(const shared_rank& o) {
    refuse_copy(o);
    if (books_) throw invalid_configuration("a hierarchy on a shared host store cannot be assigned to");
    rank_ = o.rank_;
    return *this;
  }
  shared_rank& operator=(shared_rank&& o) noexcept {
    if (this != &o) {
      leave();
      books_ = std::exchange(o.books_, nullptr);
      rank_ = o.rank_;
    }
    return *this;
  }
  ~shared_rank() { leave(); }

  /// The shared books, null when the hierarchy owns its stores.
  [[nodiscard]] shared_store_books* books() const { return books_; }
  [[nodiscard]] std::size_t rank() const { return rank_; }
  /// The store's lock for a call that touches its books (an empty lock without one).
  [[nodiscard]] std::unique_lock<region_mutex> lock() const {
    return books_ ? std::unique_lock<region_mutex>(books_->mutex()) : std::unique_lock<region_mutex>();
  }

  /// On a shared store, whether admitting `id` into `registry` waits (lock held): a full registry
  /// waits, and so does an id this rank completed while other ranks still hold that earlier history
  /// (attaching now would join the old one). Throws duplicate_admission for an admitted id. Never
  /// waits without a shared store (the registry decides alone).
  [[nodiscard]] bool admission_waits(const request_registry& registry, request_id id) const {
    if (!books_) return false;
    if (registry.contains(id)) throw duplicate_admission("request " + std::to_string(id) + " is already admitted");
    return registry.size() >= registry.capacity() || !books_->can_attach(id, rank_);
  }
  /// Names `id` in `slot` of each source's books (`books_of(s)`, s < `sources`) and attaches the
  /// rank to the id's shared history (lock held, `admission_waits` checked).
  template <class BooksOf>
  void attach(request_id id, std::size_t slot, std::size_t sources, BooksOf&& books_of) {
    if (!books_) return;
    for (std::size_t s = 0; s < sources; ++s) books_of(s).bind(slot, id);
    books_->attach(id, rank_);
  }
  /// Detaches the rank from request `id` once its pages were dropped (lock held).
  void detach(request_id id) {
    if (books_) books_->detach(id, rank_);
  }

  /// Throws host_copy_pending when `row` of request `id` has no host copy yet (lock held): its
  /// owner has not written it.
  void check_host_row(const char* call, request_id id, std::size_t source, row_index row, std::size_t page_rows) const {
    if (!books_ || books_->has_copy(source, id, row)) return;
    throw host_copy_pending(std::string(call) + " " + std::to_string(row) + " of request " + std::to_string(id) +
                            " on source " + std::to_string(source) + ": its owner, rank " +
                            std::to_string(books_->owner(static_cast<std::size_t>(row) / page_rows)) +
                            ", has not written it yet");
  }
  /// Throws host_copy_pending when mapping complete history page `page` of a slot would copy rows
  /// whose owner has not written them all (lock held). Pages the slot maps already, incomplete
  /// pages and pages out of range are left to the books' own checks.
  void check_page_copied(const history_books& books, std::size_t slot, request_id id, std::size_t source,
                         std::size_t page) const {
    if (!books_) return;
    const auto& st = books.slot(slot);
    const std::size_t p = books.store().page_rows();
    if (page >= books.pages_per_request() || page >= static_cast<std::size_t>(st.frontier) / p ||
        st.optional_page[page] >= 0 || books_->rows_copied(source, id, page) >= p)
      return;
    throw host_copy_pending("map_optional_page of page " + std::to_string(page) + " of request " + std::to_string(id) +
                            " on source " + std::to_string(source) + " by rank " + std::to_string(rank_) +
                            ": its owner, rank " + std::to_string(books_->owner(page)) +
                            ", has not written all its rows yet");
  }
  /// Throws invalid_configuration for a call not supported on a shared store yet.
  void refuse(const char* call, const char* what) const {
    if (books_)
      throw invalid_configuration(std::string(call) + ": " + what + " not supported on a shared host store yet "
                                  "(docs/multi-gpu.md)");
  }

 private:
  static void refuse_copy(const shared_rank& o) {
    if (o.books_)
      throw invalid_configuration("a hierarchy on a shared host store cannot be copied (rank " +
                                  std::to_string(o.rank_) + " would have two)");
  }
  void leave() noexcept {
    if (!books_) return;
    try {
      const std::scoped_lock lock(books_->mutex());
      books_->unbind(rank_);
    } catch (const error&) {  // lock_owner_died: the books are not to be trusted, nothing to give back
    }
    books_ = nullptr;
  }

  shared_store_books* books_ = nullptr;
  std::size_t rank_ = 0;
};

}  // namespace dhisparse::detail
