#pragma once
/// \file
/// `dhisparse::interprocess_host_store`: one `shared_host_store` (docs/multi-gpu.md) for ranks that
/// run in different processes, as engines run tensor parallelism (one process per GPU). The books
/// and every source's row bytes live in one POSIX shared memory object (Linux), which each process
/// maps at its own address; the books hold offsets only.
///
/// ```cpp
/// // process of rank 0 (or a launcher), before the ranks open it:
/// auto store = dhisparse::interprocess_host_store<Layout>::create("/engine-kv", tp, host_pages);
/// // process of rank r:
/// auto store = dhisparse::interprocess_host_store<Layout>::open("/engine-kv");
/// dhisparse::host_hierarchy<Layout> h(cfg, store, r);   // or cuda::hierarchy over the pinned variant
/// ```
///
/// Who owns what, and for how long:
/// - the name: the creating object unlinks it when it is destroyed (`remove(name)` unlinks a name
///   left behind by a creator that died); a store cannot be opened by name after that, but every
///   process that mapped it keeps a valid mapping until its own object goes;
/// - the books and row bytes: the shared memory object, freed by the system once the name is
///   unlinked and the last process has unmapped it;
/// - a rank: the hierarchy bound to it, in whichever process (binding a rank another process holds
///   throws invalid_configuration); its page holds and attachments end with that hierarchy.
///
/// A rank process that dies: its rank stays bound and its holds stay (nothing in the books can
/// tell a dead process from a slow one). Once it is known dead, `reclaim_rank(r)` from any process
/// gives them back, as its hierarchy's destructor would have; a new hierarchy may then take the
/// rank. A process that dies while holding the store's lock (inside an update) leaves the books
/// untrustworthy: every later call on the store throws lock_owner_died, and the engine creates a
/// new store.
///
/// Thread safety as `shared_host_store`: one robust, process-shared mutex in the shared memory guards
/// the books, per call.
#include <chrono>
#include <cstddef>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "../detail/shared_store_books.hpp"
#include "../detail/shm_mapping.hpp"
#include "../errors.hpp"
#include "../layout.hpp"
#include "shared_host_store.hpp"

namespace dhisparse {

/// A `shared_host_store` in POSIX shared memory, opened by name from every rank's process (see the
/// file comment). Not copyable or movable: hold it where it is made (or use the tag constructors
/// with std::optional / std::unique_ptr).
template <KvLayout Layout>
class interprocess_host_store : private detail::shm_mapping, public shared_host_store<Layout> {
  using base = shared_host_store<Layout>;
  using books_type = detail::shared_store_books;

 public:
  /// Tags of the constructors behind `create` and `open`.
  struct create_t {};
  struct open_t {};
  /// How long `open` waits by default for the creator to finish initialising the store.
  static constexpr std::chrono::milliseconds default_open_timeout{10000};

  /// Creates the store `name` ("/name" or "name") of `host_pages` pages per source for `ranks`
  /// ranks (1..64), holding `request_capacity` requests (0: `ranks * default_requests_per_rank`).
  /// Throws shared_memory_error (the name exists, no memory or permission) or invalid_configuration
  /// (name, ranks, pages or capacity); nothing is left behind.
  [[nodiscard]] static interprocess_host_store create(const std::string& name, std::size_t ranks, std::size_t host_pages,
                                                      std::size_t request_capacity = 0) {
    return interprocess_host_store(create_t{}, name, ranks, host_pages, request_capacity);
  }
  /// Opens the store `name` another process (or this one) created, waiting up to `timeout` for its
  /// creator to finish. Throws shared_memory_error (no such name, not initialised in time) or
  /// invalid_configuration (not a dhisparse store, another format version, or created for another
  /// layout: a source's page_rows, payload_layers or row_bytes differ).
  [[nodiscard]] static interprocess_host_store open(const std::string& name,
                                                    std::chrono::milliseconds timeout = default_open_timeout) {
    return interprocess_host_store(open_t{}, name, timeout);
  }
  /// Unlinks the name of a store (one whose creator died, say); true when it existed. Mappings stay valid.
  static bool remove(const std::string& name) { return detail::shm_mapping::remove(name); }

  /// As `create`.
  interprocess_host_store(create_t, const std::string& name, std::size_t ranks, std::size_t host_pages,
                          std::size_t request_capacity = 0)
      : interprocess_host_store(name, checked_shape(base::make_shape(ranks, host_pages, request_capacity))) {}
  /// As `open`.
  interprocess_host_store(open_t, const std::string& name, std::chrono::milliseconds timeout = default_open_timeout)
      : detail::shm_mapping(name, timeout),
        base(region(bytes()), store_spans(bytes(), opened_shape(bytes())), opened_shape(bytes()), false) {}

  /// The store's shared memory name ("/name").
  [[nodiscard]] const std::string& name() const { return detail::shm_mapping::name(); }
  /// True for the object that created the store (and unlinks its name when destroyed).
  [[nodiscard]] bool creator() const { return detail::shm_mapping::creator(); }
  /// Bytes this process maps: the books, then every source's pages (each page-aligned).
  [[nodiscard]] std::span<std::byte> mapping() const { return bytes(); }
  /// Bytes of shared memory a store of this layout and shape takes (`mapping().size()`).
  static std::size_t mapping_bytes(std::size_t ranks, std::size_t host_pages, std::size_t request_capacity = 0) {
    return total_bytes(checked_shape(base::make_shape(ranks, host_pages, request_capacity)));
  }

  /// True when rank `rank` has a hierarchy, in any process.
  [[nodiscard]] bool rank_bound(std::size_t rank) {
    this->books().check_rank(rank);
    const std::scoped_lock lock(this->books().mutex());
    return this->books().bound(rank);
  }
  /// Gives back the rank, page holds and attachments of a rank whose process died without
  /// destroying its hierarchy (as that destructor would have). Only for a rank no live hierarchy
  /// holds: the store cannot tell a dead process from a live one, and a live hierarchy on the rank
  /// would then share its pages with whoever binds it next. Throws invalid_configuration for a
  /// rank out of range or not bound (nothing changed).
  void reclaim_rank(std::size_t rank) {
    auto& b = this->books();
    b.check_rank(rank);
    const std::scoped_lock lock(b.mutex());
    if (!b.bound(rank)) throw invalid_configuration("rank " + std::to_string(rank) + " of the store has no hierarchy to reclaim");
    b.unbind(rank);
  }

 private:
  static constexpr std::size_t page_alignment = 4096;
  static std::size_t up(std::size_t n) { return (n + page_alignment - 1) / page_alignment * page_alignment; }
  static const books_type::shape& checked_shape(const books_type::shape& sh) {
    books_type::check_shape(sh);
    return sh;
  }
  /// Offsets in the mapping: the books' region first, then each source's pages, page-aligned.
  static std::size_t source_offset(const books_type::shape& sh, std::size_t s) {
    std::size_t at = up(books_type::region_bytes(sh));
    for (std::size_t i = 0; i < s; ++i) at += up(base::store_bytes(sh.host_pages, i));
    return at;
  }
  static std::size_t total_bytes(const books_type::shape& sh) { return source_offset(sh, base::sources); }
  static std::span<std::byte> region(std::span<std::byte> mapped) { return mapped; }
  /// The layout's shape with the capacities the creator recorded; invalid_configuration when the
  /// store was made for another layout, or its size does not match.
  static books_type::shape opened_shape(std::span<std::byte> mapped) {
    const books_type::shape got = books_type::read_shape(mapped);
    books_type::shape want = base::make_shape(got.ranks, got.host_pages, got.request_capacity);
    if (got.sources != want.sources)
      throw invalid_configuration("shared host store was created for another layout (source count or a source's "
                                  "page_rows / payload_layers / row_bytes differ)");
    if (mapped.size() < total_bytes(want))
      throw invalid_configuration("shared memory holds " + std::to_string(mapped.size()) + " bytes, its store needs " +
                                  std::to_string(total_bytes(want)));
    return want;
  }
  static std::vector<std::span<std::byte>> store_spans(std::span<std::byte> mapped, const books_type::shape& sh) {
    std::vector<std::span<std::byte>> out;
    for (std::size_t s = 0; s < base::sources; ++s)
      out.push_back(mapped.subspan(source_offset(sh, s), base::store_bytes(sh.host_pages, s)));
    return out;
  }
  interprocess_host_store(const std::string& name, const books_type::shape& sh)
      : detail::shm_mapping(name, total_bytes(sh)), base(region(bytes()), store_spans(bytes(), sh), sh, true) {}
};

}  // namespace dhisparse
