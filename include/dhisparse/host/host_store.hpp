#pragma once
/// \file
/// Paged store of complete request histories for one source (pinned host memory on a GPU
/// machine). A page holds `page_rows` rows of every payload layer of the source (page-major):
/// row r of layer l in page g lives at `g * page_bytes + (l * page_rows + r % page_rows) * row_bytes`,
/// page_bytes = page_rows * layers * row_bytes. The store owns page allocation; the caller
/// provides (and owns) the storage bytes, which the store never reads or clears. This is the
/// layout contract of adopted host stores (`cuda::hierarchy` and `host_hierarchy` constructors
/// that take one span per source; docs/integration.md).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "../errors.hpp"

namespace dhisparse {

/// Index of a page in a host store; -1 means none.
using page_id = std::int32_t;
inline constexpr page_id no_page = -1;

/// Paged host store of one source's complete histories: hands out pages of caller-owned storage bytes
/// (see the file comment for the row layout). Does not own the bytes.
class host_store {
 public:
  /// An empty store: no pages, no storage.
  host_store() = default;
  /// `storage` must hold `pages * page_bytes()` bytes and outlive the store.
  host_store(std::size_t page_rows, std::size_t layers, std::size_t row_bytes, std::size_t pages,
             std::span<std::byte> storage)
      : page_rows_(page_rows), layers_(layers), row_bytes_(row_bytes), pages_(pages), storage_(storage) {
    if (storage.size() < pages * page_bytes())
      throw size_mismatch("host store storage holds " + std::to_string(storage.size()) + " bytes, needs " +
                          std::to_string(pages * page_bytes()));
    free_.reserve(pages);
    for (std::size_t g = pages; g-- > 0;) free_.push_back(static_cast<page_id>(g));  // pop lowest first
  }

  /// Bytes one page occupies: rows of every payload layer.
  [[nodiscard]] std::size_t page_bytes() const { return page_rows_ * layers_ * row_bytes_; }
  /// Bytes a store of `pages` pages needs (two-phase sizing: ask, then allocate).
  [[nodiscard]] static std::size_t bytes_required(std::size_t page_rows, std::size_t layers, std::size_t row_bytes,
                                                  std::size_t pages) {
    return page_rows * layers * row_bytes * pages;
  }

  /// Pages not allocated now.
  [[nodiscard]] std::size_t free_pages() const { return free_.size(); }
  /// Pages the store manages.
  [[nodiscard]] std::size_t total_pages() const { return pages_; }
  /// Rows per page.
  [[nodiscard]] std::size_t page_rows() const { return page_rows_; }
  /// Payload layers each page holds.
  [[nodiscard]] std::size_t layers() const { return layers_; }
  /// Bytes of one row in one payload layer.
  [[nodiscard]] std::size_t row_bytes() const { return row_bytes_; }
  /// The caller-owned bytes the pages live in.
  [[nodiscard]] std::span<std::byte> storage() const { return storage_; }

  /// Takes a free page (lowest index first); throws host_pool_exhausted when none is left.
  page_id allocate() {
    if (free_.empty()) throw host_pool_exhausted("host store has no free page (" + std::to_string(pages_) + " pages)");
    page_id g = free_.back();
    free_.pop_back();
    return g;
  }
  /// Returns a page to the free list.
  void release(page_id g) { free_.push_back(g); }

  /// Byte offset of a row inside the storage.
  [[nodiscard]] std::size_t offset(page_id g, std::size_t layer, std::int64_t row) const {
    return static_cast<std::size_t>(g) * page_bytes() +
           (layer * page_rows_ + static_cast<std::size_t>(row) % page_rows_) * row_bytes_;
  }
  /// Bytes of a row of one payload layer in page `g` (`row_bytes()` long; a view into the storage).
  [[nodiscard]] std::span<std::byte> row(page_id g, std::size_t layer, std::int64_t row) const {
    return storage_.subspan(offset(g, layer, row), row_bytes_);
  }

 private:
  std::size_t page_rows_ = 0, layers_ = 0, row_bytes_ = 0, pages_ = 0;
  std::span<std::byte> storage_;
  std::vector<page_id> free_;
};

}  // namespace dhisparse
