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
/// Every book lives in one contiguous byte region of fixed capacities (`region_bytes`), holding
/// offsets only, never pointers, so that several processes can map the same bytes at different
/// addresses (`interprocess_host_store`); an in-process store keeps its region on the heap. The
/// region holds a header (magic, format version, layout fingerprint, capacities, a "ready" word
/// written last), a robust process-shared mutex, per source a free stack of host pages and, per
/// host page, its holders, its key (request, history page) and its rows with a host copy, plus an
/// open-addressing table key -> host page; a request table; per-rank counters; the bound ranks.
/// Each process's `shared_store_books` object is a view of the region plus that process's
/// addresses of the row bytes (`store(s)`).
///
/// Not thread-safe by itself: every call is made with `mutex()` held (the hierarchies lock it for
/// each call that touches the shared books).
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "../errors.hpp"
#include "../host/host_store.hpp"
#include "../types.hpp"
#include "owner_rule.hpp"

namespace dhisparse::detail {

/// A pthread mutex inside a shared region (process-shared, robust), usable with std::unique_lock.
/// A lock that finds its previous owner dead (EOWNERDEAD: a process died inside an update) throws
/// lock_owner_died instead of trusting the books; the mutex is left unrecoverable, so every later
/// lock throws too.
class region_mutex {
 public:
  region_mutex() = default;
  explicit region_mutex(pthread_mutex_t* m) : m_(m) {}
  /// Initialises the mutex at `m` (once, by the region's creator).
  static void init(pthread_mutex_t* m) {
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    const int rc = pthread_mutex_init(m, &a);
    pthread_mutexattr_destroy(&a);
    if (rc != 0) throw invalid_configuration("shared host store: pthread_mutex_init failed: " + std::string(std::strerror(rc)));
  }
  void lock() {
    const int rc = pthread_mutex_lock(m_);
    if (rc == 0) return;
    if (rc == EOWNERDEAD) {
      pthread_mutex_unlock(m_);  // not made consistent: later locks answer ENOTRECOVERABLE
      throw lock_owner_died("a process died while updating the shared host store's books; they cannot be trusted "
                            "(create the store again)");
    }
    if (rc == ENOTRECOVERABLE)
      throw lock_owner_died("the shared host store's books were abandoned by a process that died mid-update "
                            "(create the store again)");
    throw invalid_configuration("shared host store: pthread_mutex_lock failed: " + std::string(std::strerror(rc)));
  }
  void unlock() { pthread_mutex_unlock(m_); }

 private:
  pthread_mutex_t* m_ = nullptr;
};

class shared_store_books {
 public:
  /// Most ranks one store serves (rank sets are 64-bit masks).
  static constexpr std::size_t max_ranks = 64;
  /// First word of a region ("dhisparse shared host store") and the region format's version.
  static constexpr std::uint64_t region_magic = 0x64687370'73686873ull;
  static constexpr std::uint32_t format_version = 1;

  /// A source's page geometry: the layout fingerprint checked when a process opens a region.
  struct geometry {
    std::uint64_t page_rows = 0, layers = 0, row_bytes = 0;
    friend bool operator==(const geometry&, const geometry&) = default;
  };
  /// What a region is built for (its capacities and layout fingerprint).
  struct shape {
    std::size_t ranks = 0, host_pages = 0, request_capacity = 0;
    std::vector<geometry> sources;
  };

  /// Checks a shape; throws invalid_configuration when the store cannot be built.
  static void check_shape(const shape& sh) {
    if (sh.ranks == 0 || sh.ranks > max_ranks)
      throw invalid_configuration("a shared host store serves 1.." + std::to_string(max_ranks) + " ranks, not " +
                                  std::to_string(sh.ranks));
    if (sh.host_pages == 0) throw invalid_configuration("a shared host store needs at least one page per source");
    if (sh.host_pages > static_cast<std::size_t>(INT32_MAX))
      throw invalid_configuration("host_pages exceeds int32 page ids");
    if (sh.request_capacity == 0 || sh.request_capacity > (std::size_t{1} << 40))
      throw invalid_configuration("a shared host store's request capacity must be 1..2^40, not " +
                                  std::to_string(sh.request_capacity));
    if (sh.sources.empty()) throw invalid_configuration("a shared host store needs at least one source");
  }
  /// Bytes of the region the books of `sh` live in (two-phase sizing); a multiple of 64.
  static std::size_t region_bytes(const shape& sh) {
    check_shape(sh);
    return offsets(sh.sources.size(), sh.host_pages, sh.request_capacity).total;
  }
  /// Alignment the region needs.
  static constexpr std::size_t region_alignment = 64;

  /// Builds fresh books for `sh` in `region` (at least `region_bytes(sh)` bytes, aligned,
  /// zero-filled or not) over the row bytes of `stores` (one per source, this process's address),
  /// and marks the region ready last.
  shared_store_books(std::span<std::byte> region, const shape& sh, std::vector<host_store> stores)
      : base_(region.data()), stores_(std::move(stores)) {
    check_shape(sh);
    check_region(region, region_bytes(sh));
    std::memset(base_, 0, region_bytes(sh));
    auto& h = head();
    h.magic = region_magic;
    h.version = format_version;
    h.ranks = static_cast<std::uint32_t>(sh.ranks);
    h.sources = static_cast<std::uint32_t>(sh.sources.size());
    h.host_pages = sh.host_pages;
    h.request_capacity = sh.request_capacity;
    h.region_bytes = region_bytes(sh);
    init_view();
    for (std::size_t s = 0; s < sources_; ++s) {
      fingerprint()[s] = sh.sources[s];
      auto& src = source(s);
      src.free_count = host_pages_;
      for (std::size_t i = 0; i < host_pages_; ++i)
        free_stack(s)[i] = static_cast<page_id>(host_pages_ - 1 - i);  // pop lowest first
      for (std::size_t i = 0; i < page_slots_; ++i) page_table(s)[i].host = no_page;
    }
    region_mutex::init(&h.mutex);
    std::atomic_ref<std::uint32_t>(h.ready).store(1, std::memory_order_release);  // written last
  }
  /// Opens books another process (or this one) built in `region`: checks the header and that the
  /// region was built for `sh` (throws invalid_configuration on a mismatch, nothing changed).
  /// `stores` as above. The caller has waited for `ready(region)`.
  shared_store_books(std::span<std::byte> region, const shape& sh, std::vector<host_store> stores, bool /*open*/)
      : base_(region.data()), stores_(std::move(stores)) {
    if (region.size() < sizeof(header)) throw invalid_configuration("shared host store region too small for its header");
    check_header(region, sh);
    init_view();
  }
  shared_store_books(const shared_store_books&) = delete;
  shared_store_books& operator=(const shared_store_books&) = delete;

  /// True once the region's creator has finished initialising it.
  static bool ready(std::span<const std::byte> region) {
    if (region.size() < sizeof(header)) return false;
    auto* h = reinterpret_cast<header*>(const_cast<std::byte*>(region.data()));
    return std::atomic_ref<std::uint32_t>(h->ready).load(std::memory_order_acquire) == 1;
  }
  /// The shape recorded in a ready region's header (magic and version checked; throws
  /// invalid_configuration otherwise).
  static shape read_shape(std::span<const std::byte> region) {
    if (region.size() < sizeof(header)) throw invalid_configuration("shared host store region too small for its header");
    const auto& h = *reinterpret_cast<const header*>(region.data());
    if (h.magic != region_magic)
      throw invalid_configuration("not a dhisparse shared host store (bad magic number)");
    if (h.version != format_version)
      throw invalid_configuration("shared host store format version " + std::to_string(h.version) + ", this build reads " +
                                  std::to_string(format_version));
    shape sh{h.ranks, static_cast<std::size_t>(h.host_pages), static_cast<std::size_t>(h.request_capacity), {}};
    const auto o = offsets(h.sources, sh.host_pages, sh.request_capacity);
    if (h.region_bytes != o.total || region.size() < o.total)
      throw invalid_configuration("shared host store region holds " + std::to_string(region.size()) + " bytes, its header says " +
                                  std::to_string(h.region_bytes));
    const auto* fp = reinterpret_cast<const geometry*>(region.data() + o.fingerprint);
    sh.sources.assign(fp, fp + h.sources);
    return sh;
  }

  [[nodiscard]] region_mutex& mutex() const { return mutex_; }
  [[nodiscard]] std::size_t ranks() const { return ranks_; }
  [[nodiscard]] std::size_t host_pages() const { return host_pages_; }
  /// Requests the store can hold at once (entries live while any rank is attached).
  [[nodiscard]] std::size_t request_capacity() const { return request_capacity_; }
  [[nodiscard]] const host_store& store(std::size_t s) const { return stores_[s]; }
  /// The rank that writes history page `page`'s host copy.
  [[nodiscard]] std::size_t owner(std::size_t page) const { return static_cast<std::size_t>(page_owner(page, ranks_)); }

  // ---------------------------------------------------------------- ranks (one hierarchy each)

  /// Claims `rank` for a hierarchy of `max_requests` requests; throws invalid_configuration when the
  /// rank is out of range or taken, or when ranks x max_requests exceeds the request capacity.
  void bind(std::size_t rank, std::size_t max_requests) {
    check_rank(rank);
    if (max_requests > request_capacity_ / ranks_)
      throw invalid_configuration("max_requests " + std::to_string(max_requests) + " on each of " + std::to_string(ranks_) +
                                  " ranks exceeds the shared host store's request capacity " +
                                  std::to_string(request_capacity_) + " (give the store a larger one)");
    if (head().bound & bit(rank))
      throw invalid_configuration("rank " + std::to_string(rank) + " of the shared host store already has a hierarchy");
    head().bound |= bit(rank);
  }
  /// True when `rank` has a hierarchy (in any process).
  [[nodiscard]] bool bound(std::size_t rank) const { return (head().bound & bit(rank)) != 0; }
  /// A rank's hierarchy is gone: every page hold and attachment of the rank ends with it.
  void unbind(std::size_t rank) noexcept {
    for (std::size_t s = 0; s < sources_; ++s)
      for (std::size_t g = 0; g < host_pages_; ++g)
        if (holders(s)[g] & bit(rank)) release(s, static_cast<page_id>(g), rank);
    for (std::size_t i = 0; i < request_slots_;) {  // a removal shifts a later entry into i: look again
      auto& e = request_table()[i];
      if (e.used && (e.attached & bit(rank))) {
        e.attached &= ~bit(rank);
        if (e.attached == 0) {
          erase_request(i);
          continue;
        }
      }
      ++i;
    }
    head().bound &= ~bit(rank);
  }

  // ---------------------------------------------------------------- requests

  /// True when `rank` may attach to request `id` now: false while an earlier incarnation of the id
  /// that this rank already completed is still held by other ranks (the caller waits).
  [[nodiscard]] bool can_attach(request_id id, std::size_t rank) const {
    const auto* e = find_request(id);
    return e == nullptr || !(e->seen & bit(rank));
  }
  /// Attaches `rank` to request `id`'s shared history (created by the first rank). Check
  /// `can_attach` first. The binding check keeps the table from filling (capacity_exceeded if not).
  void attach(request_id id, std::size_t rank) {
    auto* e = find_request(id);
    if (e == nullptr) {
      if (head().requests >= request_capacity_)
        throw capacity_exceeded("shared host store holds " + std::to_string(request_capacity_) + " requests already");
      std::size_t i = home(mix(id), request_slots_);
      while (request_table()[i].used) i = (i + 1) & (request_slots_ - 1);
      e = &request_table()[i];
      *e = request_entry{id, 0, 0, 1};
      ++head().requests;
    }
    e->attached |= bit(rank);
    e->seen |= bit(rank);
  }
  /// Detaches `rank` (after it dropped its pages); the entry goes with the last rank.
  void detach(request_id id, std::size_t rank) {
    const std::size_t i = request_index(id);
    if (i == npos) return;
    auto& e = request_table()[i];
    e.attached &= ~bit(rank);
    if (e.attached == 0) erase_request(i);
  }
  /// Ranks attached to request `id` (a mask; 0 when no rank is).
  [[nodiscard]] std::uint64_t attached(request_id id) const {
    const auto* e = find_request(id);
    return e == nullptr ? 0 : e->attached;
  }
  /// Requests some rank is attached to.
  [[nodiscard]] std::size_t requests() const { return static_cast<std::size_t>(head().requests); }

  // ---------------------------------------------------------------- pages

  /// Host page of history page `page` of request `id` on source `s`, no_page when no rank has one.
  [[nodiscard]] page_id page_of(std::size_t s, request_id id, std::size_t page) const {
    const std::size_t i = page_index(s, id, page);
    return i == npos ? no_page : page_table(s)[i].host;
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
    page_id g = page_of(s, id, page);
    if (g == no_page) {
      auto& src = source(s);
      if (src.free_count == 0)
        throw host_pool_exhausted("shared host store has no free page on source " + std::to_string(s) + " (" +
                                  std::to_string(host_pages_) + " pages)");
      g = free_stack(s)[--src.free_count];
      const auto gi = static_cast<std::size_t>(g);
      keys(s)[gi] = page_key{id, page};
      written(s)[gi] = 0;
      std::size_t i = home(mix(id, page), page_slots_);  // live keys <= host_pages <= half the slots: a free slot exists
      while (page_table(s)[i].host != no_page) i = (i + 1) & (page_slots_ - 1);
      page_table(s)[i] = page_slot{id, page, g, 0};
    }
    holders(s)[static_cast<std::size_t>(g)] |= bit(rank);
    return g;
  }
  /// `rank` holds host page `g` of source `s` no more; the page returns to the store with its last holder.
  void release(std::size_t s, page_id g, std::size_t rank) noexcept {
    const auto gi = static_cast<std::size_t>(g);
    auto& h = holders(s)[gi];
    h &= ~bit(rank);
    if (h != 0) return;
    const page_key k = keys(s)[gi];
    if (const std::size_t i = page_index(s, k.id, k.page); i != npos && page_table(s)[i].host == g) erase_page(s, i);
    written(s)[gi] = 0;
    free_stack(s)[source(s).free_count++] = g;
  }
  /// Ranks holding host page `g` of source `s` (a mask).
  [[nodiscard]] std::uint64_t holders(std::size_t s, page_id g) const { return holders(s)[static_cast<std::size_t>(g)]; }
  [[nodiscard]] std::size_t free_pages(std::size_t s) const { return static_cast<std::size_t>(source(s).free_count); }

  // ---------------------------------------------------------------- host copies

  /// True when `row` of request `id` on source `s` has its host copy (its owner wrote it).
  [[nodiscard]] bool has_copy(std::size_t s, request_id id, std::int64_t row) const {
    const std::size_t rows = stores_[s].page_rows();
    return rows_copied(s, id, static_cast<std::size_t>(row) / rows) > static_cast<std::size_t>(row) % rows;
  }
  /// Rows of history page `page` of request `id` on source `s` that have their host copy.
  [[nodiscard]] std::size_t rows_copied(std::size_t s, request_id id, std::size_t page) const {
    const page_id g = page_of(s, id, page);
    return g == no_page ? 0 : static_cast<std::size_t>(written(s)[static_cast<std::size_t>(g)]);
  }
  /// Records that `rank` wrote the host copies of the rows of [first, last) of request `id` on
  /// source `s` that lie in pages it owns (the others are their owners' to write): each page's rows
  /// are written in order, each once.
  void wrote(std::size_t s, request_id id, std::int64_t first, std::int64_t last, std::size_t rank) {
    if (last <= first) return;
    const auto rows = static_cast<std::int64_t>(stores_[s].page_rows());
    for (std::int64_t r = first; r < last;) {
      const auto page = static_cast<std::size_t>(r / rows);
      const std::int64_t end = std::min(last, static_cast<std::int64_t>(page + 1) * rows);
      if (owner(page) == rank) {
        const page_id g = page_of(s, id, page);
        auto* w = g == no_page ? nullptr : &written(s)[static_cast<std::size_t>(g)];
        if (w == nullptr || *w != static_cast<std::uint64_t>(r % rows))  // an internal rule broken: never let it pass
          throw device_error("shared host store: row " + std::to_string(r) + " of request " + std::to_string(id) +
                             " on source " + std::to_string(s) + " written out of order (" +
                             (w ? std::to_string(*w) + " rows of its page written)" : "no host page)"));
        const auto n = static_cast<std::uint64_t>(end - r);
        *w += n;
        counters()[rank].rows += n;
        counters()[rank].bytes += n * stores_[s].layers() * stores_[s].row_bytes();
      }
      r = end;
    }
  }
  [[nodiscard]] std::uint64_t rows_written(std::size_t rank) const { return counters()[rank].rows; }
  [[nodiscard]] std::uint64_t bytes_written(std::size_t rank) const { return counters()[rank].bytes; }

  void check_rank(std::size_t rank) const {
    if (rank >= ranks_)
      throw invalid_configuration("rank " + std::to_string(rank) + " outside the shared host store's " +
                                  std::to_string(ranks_) + " ranks");
  }

 private:
  static constexpr std::size_t npos = ~std::size_t{0};
  // Region records: fixed-size, trivially copyable, no pointers.
  struct header {
    std::uint64_t magic;
    std::uint32_t version;
    std::uint32_t ready;  // 1 once the creator finished (atomic_ref, release/acquire)
    std::uint32_t ranks, sources;
    std::uint64_t host_pages, request_capacity, region_bytes;
    std::uint64_t bound;     // ranks that have a hierarchy
    std::uint64_t requests;  // entries of the request table in use
    pthread_mutex_t mutex;
  };
  struct source_head {
    std::uint64_t free_count;
  };
  struct page_key {
    std::uint64_t id, page;
  };
  struct page_slot {  // key (id, page) -> host page; host == no_page: empty
    std::uint64_t id, page;
    std::int32_t host, pad;
  };
  struct request_entry {
    std::uint64_t id, attached, seen, used;  // seen: ranks that attached to this incarnation
  };
  struct rank_counters {
    std::uint64_t rows, bytes;
  };
  // Offsets of every array, a function of (sources, host_pages, request capacity) alone, so each
  // process computes them from the header.
  struct layout_offsets {
    std::size_t fingerprint = 0, counters = 0, request_table = 0, request_slots = 0, page_slots = 0, total = 0;
    std::size_t source_base = 0, source_stride = 0, free_stack = 0, holders = 0, keys = 0, written = 0, page_table = 0;
  };
  static std::size_t pow2_at_least(std::size_t n) {
    std::size_t p = 1;
    while (p < n) p <<= 1;
    return p;
  }
  static std::size_t up64(std::size_t n) { return (n + 63) / 64 * 64; }
  static layout_offsets offsets(std::size_t sources, std::size_t host_pages, std::size_t request_capacity) {
    layout_offsets o;
    o.page_slots = pow2_at_least(2 * host_pages);        // load <= 1/2: short probes
    o.request_slots = pow2_at_least(2 * request_capacity);
    std::size_t at = up64(sizeof(header));
    o.fingerprint = at;
    at = up64(at + sources * sizeof(geometry));
    o.counters = at;
    at = up64(at + max_ranks * sizeof(rank_counters));
    o.request_table = at;
    at = up64(at + o.request_slots * sizeof(request_entry));
    // per source, relative to its base: head, free stack, holders, keys, written, page table
    std::size_t r = up64(sizeof(source_head));
    o.free_stack = r;
    r = up64(r + host_pages * sizeof(page_id));
    o.holders = r;
    r = up64(r + host_pages * sizeof(std::uint64_t));
    o.keys = r;
    r = up64(r + host_pages * sizeof(page_key));
    o.written = r;
    r = up64(r + host_pages * sizeof(std::uint64_t));
    o.page_table = r;
    r = up64(r + o.page_slots * sizeof(page_slot));
    o.source_base = at;
    o.source_stride = r;
    o.total = at + sources * r;
    return o;
  }
  static void check_region(std::span<std::byte> region, std::size_t need) {
    if (region.data() == nullptr || region.size() < need)
      throw size_mismatch("shared host store region holds " + std::to_string(region.size()) + " bytes, needs " +
                          std::to_string(need));
    if (reinterpret_cast<std::uintptr_t>(region.data()) % region_alignment != 0)
      throw invalid_configuration("shared host store region is not " + std::to_string(region_alignment) +
                                  "-byte aligned");
  }
  void check_header(std::span<std::byte> region, const shape& want) const {
    const shape got = read_shape(region);
    if (got.sources != want.sources)
      throw invalid_configuration("shared host store was created for another layout (source count or a source's "
                                  "page_rows / payload_layers / row_bytes differ)");
    if ((want.ranks != 0 && got.ranks != want.ranks) || (want.host_pages != 0 && got.host_pages != want.host_pages))
      throw invalid_configuration("shared host store has " + std::to_string(got.ranks) + " ranks and " +
                                  std::to_string(got.host_pages) + " host pages, not the expected " +
                                  std::to_string(want.ranks) + " and " + std::to_string(want.host_pages));
  }
  void init_view() {
    const auto& h = head();
    ranks_ = h.ranks;
    sources_ = h.sources;
    host_pages_ = static_cast<std::size_t>(h.host_pages);
    request_capacity_ = static_cast<std::size_t>(h.request_capacity);
    o_ = offsets(sources_, host_pages_, request_capacity_);
    page_slots_ = o_.page_slots;
    request_slots_ = o_.request_slots;
    mutex_ = region_mutex(&head().mutex);
  }

  template <class T>
  T* at(std::size_t off) const {
    return reinterpret_cast<T*>(base_ + off);
  }
  header& head() const { return *at<header>(0); }
  geometry* fingerprint() const { return at<geometry>(o_.fingerprint); }
  rank_counters* counters() const { return at<rank_counters>(o_.counters); }
  request_entry* request_table() const { return at<request_entry>(o_.request_table); }
  std::size_t source_at(std::size_t s) const { return o_.source_base + s * o_.source_stride; }
  source_head& source(std::size_t s) const { return *at<source_head>(source_at(s)); }
  page_id* free_stack(std::size_t s) const { return at<page_id>(source_at(s) + o_.free_stack); }
  std::uint64_t* holders(std::size_t s) const { return at<std::uint64_t>(source_at(s) + o_.holders); }
  page_key* keys(std::size_t s) const { return at<page_key>(source_at(s) + o_.keys); }
  std::uint64_t* written(std::size_t s) const { return at<std::uint64_t>(source_at(s) + o_.written); }
  page_slot* page_table(std::size_t s) const { return at<page_slot>(source_at(s) + o_.page_table); }

  static constexpr std::uint64_t bit(std::size_t rank) { return std::uint64_t{1} << rank; }
  static std::uint64_t mix(std::uint64_t x, std::uint64_t y = 0) {  // splitmix64 over both words
    x ^= y * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
  }
  static std::size_t home(std::uint64_t h, std::size_t slots) { return static_cast<std::size_t>(h) & (slots - 1); }

  // Linear probing with backward-shift deletion: no tombstones, every probe ends at an empty slot.
  std::size_t page_index(std::size_t s, request_id id, std::size_t page) const {
    const auto* t = page_table(s);
    for (std::size_t i = home(mix(id, page), page_slots_);; i = (i + 1) & (page_slots_ - 1)) {
      if (t[i].host == no_page) return npos;
      if (t[i].id == id && t[i].page == page) return i;
    }
  }
  void erase_page(std::size_t s, std::size_t hole) {
    auto* t = page_table(s);
    const std::size_t mask = page_slots_ - 1;
    for (std::size_t j = (hole + 1) & mask; t[j].host != no_page; j = (j + 1) & mask) {
      const std::size_t want = home(mix(t[j].id, t[j].page), page_slots_);
      if (((j - want) & mask) >= ((j - hole) & mask)) {  // the hole lies on j's probe path: shift j back
        t[hole] = t[j];
        hole = j;
      }
    }
    t[hole].host = no_page;
  }
  std::size_t request_index(request_id id) const {
    const auto* t = request_table();
    for (std::size_t i = home(mix(id), request_slots_);; i = (i + 1) & (request_slots_ - 1)) {
      if (!t[i].used) return npos;
      if (t[i].id == id) return i;
    }
  }
  request_entry* find_request(request_id id) const {
    const std::size_t i = request_index(id);
    return i == npos ? nullptr : &request_table()[i];
  }
  void erase_request(std::size_t hole) {
    auto* t = request_table();
    const std::size_t mask = request_slots_ - 1;
    for (std::size_t j = (hole + 1) & mask; t[j].used; j = (j + 1) & mask) {
      const std::size_t want = home(mix(t[j].id), request_slots_);
      if (((j - want) & mask) >= ((j - hole) & mask)) {
        t[hole] = t[j];
        hole = j;
      }
    }
    t[hole] = request_entry{};
    --head().requests;
  }

  std::byte* base_ = nullptr;
  std::vector<host_store> stores_;  // this process's view of each source's row bytes (allocation is the region's)
  layout_offsets o_{};
  std::size_t ranks_ = 0, sources_ = 0, host_pages_ = 0, request_capacity_ = 0, page_slots_ = 0, request_slots_ = 0;
  mutable region_mutex mutex_;
};

}  // namespace dhisparse::detail
