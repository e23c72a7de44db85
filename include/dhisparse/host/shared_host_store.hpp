#pragma once
/// \file
/// One host store shared by the N tensor-parallel ranks (GPUs) of a host. Under tensor parallelism
/// every rank holds the same latent KV history, so N hierarchies, one per rank, keep one host copy of
/// each request's history instead of N (docs/multi-gpu.md). Each rank keeps its own hot cache, tail
/// ring and optional history; the store keeps the pages.
///
/// ```cpp
/// dhisparse::shared_host_store<Layout> store(/*ranks=*/4, /*host_pages=*/cfg.host_pages);
/// H rank0(cfg, store, 0), rank1(cfg, store, 1), ...;   // one host_hierarchy per GPU, on its own thread
/// ```
///
/// Who owns what:
/// - the store owns page allocation of every source and a registry keyed by the engine's request id
///   (the same id on every rank): the host page of each history page, the ranks attached, and the
///   rows of each page whose host copy is complete;
/// - history page p of a request is written to the host store only by rank p mod N, its *owner*
///   (`owner(p)`): every row is written once, and a long history's backup traffic is spread over
///   every GPU's link;
/// - a host page lives while some rank holds it (from the first rank's append that needs it to the
///   last rank's `complete`); a request's entry lives from its first rank's `admit` to its last
///   rank's `complete`.
///
/// Thread safety: ranks call their hierarchies from their own threads. One mutex guards the store's
/// books; a hierarchy over the store holds it for each call that touches them (admission,
/// completion, writes, resolves, verifies, optional-page maps), which is per step, not per row.
/// The inspection calls below lock it too.
#include <array>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "../detail/shared_store_books.hpp"
#include "../errors.hpp"
#include "../layout.hpp"
#include "../types.hpp"
#include "host_store.hpp"

namespace dhisparse {

/// A paged host store of every source of `Layout`, shared by `ranks` hierarchies (see the file comment).
template <KvLayout Layout>
class shared_host_store {
  static_assert(check_layout<Layout>());

 public:
  /// The KV layout every rank's hierarchy must have.
  using layout = Layout;
  /// Number of payload sources in the layout.
  static constexpr std::size_t sources = source_count<Layout>;
  /// p: rows per history page.
  static constexpr std::size_t page_rows = Layout::page_rows;
  /// Most ranks one store serves.
  static constexpr std::size_t max_ranks = detail::shared_store_books::max_ranks;

  /// Bytes the store of `source` needs for `host_pages` pages (two-phase sizing, as `host_store`).
  static std::size_t store_bytes(std::size_t host_pages, std::size_t source) {
    check_source(source);
    const auto& d = Layout::sources[source];
    return host_store::bytes_required(page_rows, d.payload_layers, d.row_bytes, host_pages);
  }
  /// Alignment an adopted store needs (that of the hierarchies' adopted stores).
  static constexpr std::size_t alignment = 16;

  /// Requests per rank a store holds when no request capacity is given: `ranks * 256` in all.
  static constexpr std::size_t default_requests_per_rank = 256;

  /// A store of `host_pages` pages per source for `ranks` ranks (1..64), allocating its bytes.
  /// `request_capacity`: requests the store holds at once (0: `ranks * default_requests_per_rank`);
  /// a rank's hierarchy needs `ranks * cfg.max_requests <= request_capacity`. Throws
  /// invalid_configuration for a rank count out of range, no pages or a capacity out of range.
  shared_host_store(std::size_t ranks, std::size_t host_pages, std::size_t request_capacity = 0)
      : shared_host_store(ranks, host_pages, std::span<const std::span<std::byte>>{}, false, request_capacity) {}
  /// As above over caller memory: one span per source of at least `store_bytes(host_pages, s)`
  /// bytes, `alignment`-aligned (pinned and mapped for every GPU on a GPU machine), outliving the
  /// store. Throws size_mismatch or invalid_configuration before anything is built.
  shared_host_store(std::size_t ranks, std::size_t host_pages, std::span<const std::span<std::byte>> stores,
                    std::size_t request_capacity = 0)
      : shared_host_store(ranks, host_pages, stores, true, request_capacity) {}

  shared_host_store(const shared_host_store&) = delete;
  shared_host_store& operator=(const shared_host_store&) = delete;

  /// N: ranks the store serves.
  [[nodiscard]] std::size_t ranks() const { return books_.ranks(); }
  /// Host pages per source.
  [[nodiscard]] std::size_t host_pages() const { return host_pages_; }
  /// Requests the store holds at once (a request counts from its first rank's admit to its last
  /// rank's complete).
  [[nodiscard]] std::size_t request_capacity() const { return books_.request_capacity(); }
  /// The rank that writes history page `page`'s host copy: `page mod ranks()`.
  [[nodiscard]] std::size_t owner(std::size_t page) const { return books_.owner(page); }

  /// Bytes of every source's store (the whole allocation, used or not).
  [[nodiscard]] std::size_t host_store_bytes() const {
    std::size_t n = 0;
    for (std::size_t s = 0; s < sources; ++s) n += books_.store(s).total_pages() * books_.store(s).page_bytes();
    return n;
  }
  /// Bytes of host pages allocated now, every source: one copy of each attached request's history.
  [[nodiscard]] std::size_t host_bytes_in_use() const {
    std::scoped_lock lock(books_.mutex());
    std::size_t n = 0;
    for (std::size_t s = 0; s < sources; ++s) n += (host_pages_ - books_.free_pages(s)) * books_.store(s).page_bytes();
    return n;
  }
  /// Free host pages of a source.
  [[nodiscard]] std::size_t free_host_pages(std::size_t source) const {
    check_source(source);
    std::scoped_lock lock(books_.mutex());
    return books_.free_pages(source);
  }
  /// Host page of history page `page` of request `id` on a source; no_page when no rank has one.
  [[nodiscard]] page_id host_page(request_id id, std::size_t source, std::size_t page) const {
    check_source(source);
    std::scoped_lock lock(books_.mutex());
    return books_.page_of(source, id, page);
  }
  /// Ranks holding host page `page` of a source, as a mask (bit r: rank r).
  [[nodiscard]] std::uint64_t page_holders(std::size_t source, page_id page) const {
    check_source(source);
    if (page < 0 || static_cast<std::size_t>(page) >= host_pages_)
      throw position_out_of_range("host page " + std::to_string(page) + " outside the store's " +
                                  std::to_string(host_pages_));
    std::scoped_lock lock(books_.mutex());
    return books_.holders(source, page);
  }
  /// Ranks attached to request `id`, as a mask (0: none; its entry is gone).
  [[nodiscard]] std::uint64_t attached_ranks(request_id id) const {
    std::scoped_lock lock(books_.mutex());
    return books_.attached(id);
  }
  /// Requests at least one rank is attached to.
  [[nodiscard]] std::size_t requests() const {
    std::scoped_lock lock(books_.mutex());
    return books_.requests();
  }
  /// True when `row` of request `id` on a source has its host copy (its owner has written it).
  [[nodiscard]] bool has_host_copy(request_id id, std::size_t source, row_index row) const {
    check_source(source);
    std::scoped_lock lock(books_.mutex());
    return row >= 0 && books_.has_copy(source, id, row);
  }
  /// Stored rows (a row of every payload layer of its source counts once) rank `rank` wrote to the store.
  [[nodiscard]] std::uint64_t rows_written(std::size_t rank) const {
    books_.check_rank(rank);
    std::scoped_lock lock(books_.mutex());
    return books_.rows_written(rank);
  }
  /// Bytes rank `rank` wrote to the store.
  [[nodiscard]] std::uint64_t bytes_written(std::size_t rank) const {
    books_.check_rank(rank);
    std::scoped_lock lock(books_.mutex());
    return books_.bytes_written(rank);
  }
  /// The bytes of host page `page` of a source, row `row` of payload `layer` (the page-major layout
  /// of host_store.hpp).
  [[nodiscard]] std::span<const std::byte> row(std::size_t source, page_id page, std::size_t layer,
                                               row_index row) const {
    check_source(source);
    return books_.store(source).row(page, layer, row);
  }

  /// The books the ranks' hierarchies share (library internal).
  [[nodiscard]] detail::shared_store_books& books() { return books_; }

 protected:
  /// The shape of a store of this layout (the books' layout fingerprint).
  static detail::shared_store_books::shape make_shape(std::size_t ranks, std::size_t host_pages,
                                                      std::size_t request_capacity) {
    detail::shared_store_books::shape sh{ranks, host_pages, request_capacity, {}};
    if (sh.request_capacity == 0 && ranks <= max_ranks) sh.request_capacity = ranks * default_requests_per_rank;
    for (std::size_t s = 0; s < sources; ++s)
      sh.sources.push_back({page_rows, Layout::sources[s].payload_layers, Layout::sources[s].row_bytes});
    return sh;
  }
  /// Over caller memory holding the books' region and every source's bytes (an interprocess store's
  /// mapping): `create` builds fresh books there, else opens the books another process built
  /// (checked against `sh`). Throws as the public constructors, and invalid_configuration when an
  /// opened region was built for another layout.
  shared_host_store(std::span<std::byte> region, std::span<const std::span<std::byte>> stores,
                    const detail::shared_store_books::shape& sh, bool create)
      : host_pages_(sh.host_pages), books_(make_books(sh, stores, true, create, region)) {}

 private:
  static std::vector<host_store> make_stores(std::size_t host_pages, std::span<const std::span<std::byte>> stores,
                                             bool adopt, std::array<std::vector<std::byte>, sources>& own) {
    if (adopt) {
      if (stores.size() != sources)
        throw size_mismatch("shared host store: " + std::to_string(stores.size()) + " spans given, the layout has " +
                            std::to_string(sources) + " sources (one span per source)");
      for (std::size_t s = 0; s < sources; ++s) {
        const std::size_t need = store_bytes(host_pages, s);
        if (stores[s].data() == nullptr || stores[s].size() < need)
          throw size_mismatch("shared host store of source " + std::to_string(s) + " holds " +
                              std::to_string(stores[s].size()) + " bytes, needs " + std::to_string(need));
        if (reinterpret_cast<std::uintptr_t>(stores[s].data()) % alignment != 0)
          throw invalid_configuration("shared host store of source " + std::to_string(s) + " is not " +
                                      std::to_string(alignment) + "-byte aligned");
      }
    }
    std::vector<host_store> out;
    for (std::size_t s = 0; s < sources; ++s) {
      const auto& d = Layout::sources[s];
      std::span<std::byte> bytes;
      if (adopt) {
        bytes = stores[s].first(store_bytes(host_pages, s));
      } else {
        own[s].resize(store_bytes(host_pages, s));
        bytes = own[s];
      }
      out.emplace_back(page_rows, d.payload_layers, d.row_bytes, host_pages, bytes);
    }
    return out;
  }
  /// The books over `region`, or over a region of their own on the heap (in-process stores).
  detail::shared_store_books make_books(const detail::shared_store_books::shape& sh,
                                        std::span<const std::span<std::byte>> stores, bool adopt, bool create,
                                        std::span<std::byte> region) {
    detail::shared_store_books::check_shape(sh);  // before any byte is allocated
    if (region.empty()) {
      const std::size_t n = detail::shared_store_books::region_bytes(sh) + detail::shared_store_books::region_alignment;
      region_.resize(n);
      const auto misaligned = reinterpret_cast<std::uintptr_t>(region_.data()) % detail::shared_store_books::region_alignment;
      region = std::span(region_).subspan(misaligned ? detail::shared_store_books::region_alignment - misaligned : 0,
                                          n - detail::shared_store_books::region_alignment);
    }
    auto st = make_stores(sh.host_pages, stores, adopt, own_);
    if (create) return detail::shared_store_books(region, sh, std::move(st));
    return detail::shared_store_books(region, sh, std::move(st), true);
  }
  shared_host_store(std::size_t ranks, std::size_t host_pages, std::span<const std::span<std::byte>> stores, bool adopt,
                    std::size_t request_capacity)
      : host_pages_(host_pages),
        books_(make_books(make_shape(ranks, host_pages, request_capacity), stores, adopt, true, {})) {}
  static void check_source(std::size_t source) {
    if (source >= sources)
      throw invalid_source("source " + std::to_string(source) + " outside the layout's " + std::to_string(sources));
  }

  std::size_t host_pages_ = 0;
  std::array<std::vector<std::byte>, sources> own_;  // the bytes, when not adopted (declared before books_)
  std::vector<std::byte> region_;                    // the books' region, when in this process's heap (ditto)
  detail::shared_store_books books_;
};

}  // namespace dhisparse
