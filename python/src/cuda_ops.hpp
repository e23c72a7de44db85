#pragma once
// A facade over dhisparse::cuda::hierarchy and cuda::residency_manager with no CUDA type in its
// signatures: the facade is compiled by nvcc (layout_cuda_ops.cu), the nanobind binding by the host
// compiler (layout_cuda.cpp), so nanobind never meets device code. Pointers are device-accessible
// unless a name says host; streams are cudaStream_t handles as integers.
//
// Adding an operation of the C++ API: declare it here, define it in layout_cuda_ops.cu (one line
// forwarding to the hierarchy), bind it in cuda_bind.hpp.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <dhisparse/hierarchy_types.hpp>
#include <dhisparse/host/interprocess_host_store.hpp>
#include <dhisparse/host/shared_host_store.hpp>
#include <dhisparse/host/residency_manager.hpp>
#include <dhisparse/location_space.hpp>
#include <dhisparse/policies/residency.hpp>
#include <dhisparse/types.hpp>

namespace dhisparse::python {

/// A cudaStream_t as an integer (0: the legacy default stream).
using stream_handle = std::uintptr_t;

/// Rows of one source's prefilled history: `count` rows at `rows` (`bytes` long; host or device).
struct import_rows {
  const void* rows = nullptr;
  std::size_t bytes = 0;
  std::size_t count = 0;
};

/// cuda::hierarchy<Layout, lru_hot_cache<B>> behind a pimpl; owning, or a view of a manager's.
template <class Layout, std::size_t B>
class cuda_hierarchy_ops {
 public:
  using layout_type = Layout;
  static constexpr std::size_t hot_rows = B;
  cuda_hierarchy_ops(const hierarchy_config& cfg, stream_handle stream);
  /// Rank `rank` of the CUDA hierarchies sharing `store`, whose bytes are pinned and mapped (a
  /// cuda_pinned_store_ops' or cuda_interprocess_store_ops' store).
  cuda_hierarchy_ops(const hierarchy_config& cfg, shared_host_store<Layout>& store, std::size_t rank,
                     stream_handle stream);
  /// A non-owning view of the hierarchy at `hierarchy` (a residency manager's).
  static cuda_hierarchy_ops view_of(void* hierarchy);
  cuda_hierarchy_ops(cuda_hierarchy_ops&&) noexcept;
  cuda_hierarchy_ops& operator=(cuda_hierarchy_ops&&) noexcept;
  ~cuda_hierarchy_ops();

  const hierarchy_config& config() const;
  location_space space() const;
  int device() const;
  stream_handle stream() const;
  bool contains(request_id id) const;
  std::size_t slot_of(request_id id) const;
  std::size_t admitted_count() const;
  bool shares_host_store() const;
  std::size_t rank() const;
  std::size_t host_bytes_in_use() const;
  void set_programmatic_launch(bool on);
  bool programmatic_launch() const;

  admission admit(request_id id, stream_handle s);
  admission admit_on_prefix(request_id id, prefix_id prefix, stream_handle s);
  std::vector<prefix_id> retain_prefix(prefix_id prefix, request_id id, const std::vector<std::int64_t>* rows);
  void release_prefix(prefix_id prefix);
  bool contains_prefix(prefix_id prefix) const;
  std::int64_t prefix_rows(prefix_id prefix, std::size_t source) const;
  std::vector<prefix_id> retained_prefixes() const;
  std::size_t prefix_pages_held(std::size_t source) const;
  void complete(request_id id, stream_handle s);
  std::int64_t frontier(request_id id, std::size_t source) const;
  std::int64_t positions(request_id id, std::size_t source) const;
  /// `on_device`: rows are device-accessible; otherwise any host memory (staged by the library).
  void append(request_id id, std::size_t source, const void* rows, std::size_t bytes, std::size_t count, bool on_device,
              stream_handle s);

  void reserve_rows(request_id id, std::size_t source, std::size_t rows_ahead, stream_handle s);
  void reserve_ahead(std::size_t rows_ahead, stream_handle s);
  std::int64_t reserved_rows(request_id id, std::size_t source) const;
  void sync_books(stream_handle s);
  /// One step's KV writes on a source over device buffers (cuda::kv_write_view): capturable.
  void append_view(std::size_t source, const std::int32_t* slots, const std::int32_t* rows, const std::int32_t* first,
                   const void* const* layer_rows, std::uint64_t row_stride, std::uint32_t max_rows,
                   std::uint32_t capacity, stream_handle s);
  /// One step's KV writes on every source over device buffers (cuda::kv_step_write_view), the host
  /// backup on `backup` (== s: inline): capturable.
  void append_step_view(const std::int32_t* slots, const std::int32_t* rows, const std::int32_t* first,
                        const void* const* layer_rows, std::uint64_t row_stride, std::uint32_t rows_pitch,
                        std::uint32_t max_rows, std::uint32_t capacity, stream_handle backup, stream_handle s);
  /// A speculative round's accepted counts on every source (cuda::commit_step_view): capturable.
  void commit_step_view(const std::int32_t* slots, const std::int32_t* accepted, std::uint32_t capacity,
                        stream_handle backup, stream_handle s);
  /// Draft blocks of a batch on one source (cuda::stage_view) / on every source (stage_step_view): capturable.
  void stage_blocks_view(std::size_t source, const std::int32_t* slots, const std::int32_t* counts,
                         const std::int32_t* first, const void* const* layer_rows, std::uint64_t row_stride,
                         std::uint32_t max_block, std::uint32_t capacity, stream_handle s);
  void stage_step_view(const std::int32_t* slots, const std::int32_t* counts, const std::int32_t* first,
                       const void* const* layer_rows, std::uint64_t row_stride, std::uint32_t max_block,
                       std::uint32_t capacity, stream_handle s);
  void join_backup(stream_handle s);
  bool backup_pending() const;
  static std::size_t step_layers();
  static std::size_t step_layer_index(std::size_t source, std::size_t layer);
  /// A speculative round's accepted counts on a source over device buffers (cuda::commit_view): capturable.
  void commit_view(std::size_t source, const std::int32_t* slots, const std::int32_t* accepted, std::uint32_t capacity,
                   stream_handle s);

  /// Eager batched resolve (not capturable): entry i reads sel + i*k and writes loc + i*k.
  void resolve(std::size_t source, const request_id* ids, std::size_t c, const std::int32_t* sel, std::int32_t* loc,
               std::size_t k, stream_handle s, copy_layers mode);
  /// Resolve over a device batch descriptor (strided): capturable in a CUDA graph.
  void resolve_view(std::size_t source, const std::int32_t* slots, const std::int32_t* sel, std::int32_t* loc,
                    const std::int32_t* lengths, const std::uint32_t* count, std::uint32_t stride,
                    std::uint32_t capacity, stream_handle s, copy_layers mode);
  /// Host seconds per call of `iterations` back-to-back resolve_view calls made from C++ (the
  /// baseline of the binding-overhead benchmark; synchronises before and after, not between).
  double time_resolve_view(std::size_t iterations, std::size_t source, const std::int32_t* slots,
                           const std::int32_t* sel, std::int32_t* loc, const std::uint32_t* count,
                           std::uint32_t stride, std::uint32_t capacity, stream_handle s);
  void check_errors(stream_handle s);
  std::vector<resolve_stats> last_stats(std::size_t source) const;
  std::vector<planned_copy> last_plan(std::size_t source) const;
  void copy_follower(std::size_t source, std::size_t layer, stream_handle s);
  void release_staging(std::size_t source, stream_handle s);
  std::optional<std::size_t> staging_holder() const;

  void stage_block(request_id id, std::size_t source, const void* rows, std::size_t bytes, std::size_t count,
                   bool on_device, stream_handle s);
  /// Eager verify: request i has widths[i] queries; query j reads q + (i*kmax + j)*k.
  void verify(std::size_t source, const request_id* ids, std::size_t c, const std::size_t* widths, std::size_t kmax,
              const std::int32_t* q, std::int32_t* loc, std::size_t k, stream_handle s, copy_layers mode);
  /// Verify over a device batch descriptor (cuda::verify_batch_view): capturable.
  void verify_view(std::size_t source, const std::uint32_t* count, const std::int32_t* slots,
                   const std::int32_t* queries, const std::int32_t* lengths, const void* const* selection_ptrs,
                   const void* const* location_ptrs, std::uint32_t capacity, stream_handle s, copy_layers mode);
  std::vector<verify_stats> last_verify_stats(std::size_t source) const;
  void commit(request_id id, std::size_t source, std::size_t accepted, stream_handle s);
  std::size_t block_rows(request_id id, std::size_t source, std::size_t count) const;
  std::size_t staged_rows(request_id id, std::size_t source) const;
  std::size_t verified_queries(request_id id, std::size_t source) const;

  bool map_optional_page(request_id id, std::size_t source, std::size_t page, stream_handle s);
  void unmap_optional_page(request_id id, std::size_t source, std::size_t page, stream_handle s);
  std::size_t free_optional_pages(std::size_t source) const;
  std::size_t free_host_pages(std::size_t source) const;

  /// Device base of a payload layer's pool ([pool_rows, row_bytes]).
  void* pool(std::size_t source, std::size_t layer) const;
  std::size_t pool_rows() const;
  std::vector<std::uint8_t> payload_row(std::size_t source, std::size_t layer, location loc) const;
  std::vector<std::uint8_t> host_row(request_id id, std::size_t source, std::size_t layer, row_index row) const;
  std::vector<row_index> hot_rows_of(request_id id, std::size_t source) const;
  std::vector<std::size_t> lru_order_of(request_id id, std::size_t source) const;
  std::vector<std::int32_t> optional_map_of(request_id id, std::size_t source) const;
  void synchronize(stream_handle s) const;

 private:
  struct impl;
  explicit cuda_hierarchy_ops(std::unique_ptr<impl> p);
  std::unique_ptr<impl> p_;
};

/// cuda::pinned_shared_host_store<Layout> behind a pimpl: one host store for the CUDA ranks of a
/// process, in pinned, portable, mapped memory. `store()` is its shared_host_store (a host type).
template <class Layout>
class cuda_pinned_store_ops {
 public:
  using layout_type = Layout;
  cuda_pinned_store_ops(std::size_t ranks, std::size_t host_pages, std::size_t request_capacity);
  ~cuda_pinned_store_ops();
  shared_host_store<Layout>& store();

 private:
  struct impl;
  std::unique_ptr<impl> p_;
};

/// cuda::interprocess_pinned_host_store<Layout> behind a pimpl: the interprocess store, registered
/// with CUDA in this process. `store()` is its interprocess_host_store (a host type).
template <class Layout>
class cuda_interprocess_store_ops {
 public:
  using layout_type = Layout;
  static std::unique_ptr<cuda_interprocess_store_ops> create(const std::string& name, std::size_t ranks,
                                                             std::size_t host_pages, std::size_t request_capacity);
  static std::unique_ptr<cuda_interprocess_store_ops> open(const std::string& name, std::int64_t timeout_ms);
  ~cuda_interprocess_store_ops();
  interprocess_host_store<Layout>& store();

 private:
  struct impl;
  explicit cuda_interprocess_store_ops(std::unique_ptr<impl> p);
  std::unique_ptr<impl> p_;
};

/// cuda::residency_manager<cuda::hierarchy<Layout, lru_hot_cache<B>>, Policy> behind a pimpl.
template <class Layout, std::size_t B, class Policy>
class cuda_manager_ops {
 public:
  using layout_type = Layout;
  cuda_manager_ops(const hierarchy_config& cfg, const residency_config& rcfg, stream_handle step_stream);
  cuda_manager_ops(cuda_manager_ops&&) noexcept;
  ~cuda_manager_ops();

  /// A non-owning view of the owned hierarchy (valid while this manager lives).
  cuda_hierarchy_ops<Layout, B>& hierarchy() { return *view_; }
  stream_handle step_stream() const;
  stream_handle copy_stream() const;
  const residency_config& config() const;
  const residency_counters& counters() const;
  std::size_t capacity_pages() const;
  std::size_t pinned_pages_per_request() const;
  bool contains(request_id id) const;
  std::size_t admitted_count() const;
  std::size_t claims() const;
  bool claimed(request_id id) const;
  bool reclaiming(request_id id) const;
  residency_ledger ledger(std::size_t source) const;
  bool invariant_holds() const;
  std::size_t retiring_pages(std::size_t source) const;
  std::size_t optional_pages_of(request_id id, std::size_t source) const;
  std::int64_t imported_rows(request_id id, std::size_t source) const;
  std::vector<request_id> reclaim_sequence() const;

  /// With `prefix`, the request is admitted on that retained prefix and `history` is the suffix
  /// (each source's import starts where the prefix ends there).
  residency_admission admit(request_id id, const std::vector<import_rows>& history, bool on_device,
                            std::optional<prefix_id> prefix = std::nullopt);
  std::vector<prefix_id> retain_prefix(prefix_id prefix, request_id id, const std::vector<std::int64_t>* rows);
  void release_prefix(prefix_id prefix);
  void withdraw(request_id id);
  void append(request_id id, std::size_t source, const void* rows, std::size_t bytes, std::size_t count, bool on_device);
  void reserve_ahead(std::size_t rows_ahead);
  /// One step's decode rows on every source (cuda::residency_manager::append_step).
  void append_step_view(const std::int32_t* slots, const std::int32_t* rows, const std::int32_t* first,
                        const void* const* layer_rows, std::uint64_t row_stride, std::uint32_t rows_pitch,
                        std::uint32_t max_rows, std::uint32_t capacity, stream_handle backup);
  /// Streamed admission; device rows are ready in `s`'s order (host rows are staged by the library).
  std::size_t import_history(request_id id, std::size_t source, const void* rows, std::size_t bytes,
                             std::size_t count, bool on_device, stream_handle s);
  void complete(request_id id);
  std::size_t repopulate();
  std::size_t back_up(std::size_t max_pages);
  void poll();
  void drain();
  std::string audit() const;

 private:
  /// Device rows of append/import_history: the request exists and the buffer holds `count` rows.
  void check_device_rows(const char* call, request_id id, std::size_t source, std::size_t bytes,
                         std::size_t count) const;
  struct impl;
  std::unique_ptr<impl> p_;
  std::unique_ptr<cuda_hierarchy_ops<Layout, B>> view_;
};

}  // namespace dhisparse::python
