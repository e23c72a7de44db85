// The CUDA facade (cuda_ops.hpp) of every bound layout, compiled by nvcc as ONE translation unit.
// The library's kernels are templates, so several TUs could instantiate them, but each nvcc TU
// parses the CUDA headers again: one TU per layout took 220 s of CPU against 158 s for this one,
// and on 2 cores the extension built later. CMakeLists.txt passes the hot-cache rows of each
// layout as DHISPARSE_PY_HOT_<layout>.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <span>
#include <vector>

#include <dhisparse/cuda/hierarchy.cuh>
#include <dhisparse/cuda/interprocess_host_store.cuh>
#include <dhisparse/cuda/shared_host_store.cuh>
#include <dhisparse/cuda/residency_manager.cuh>
#include <dhisparse/layouts/deepseek_v41_flash.hpp>
#include <dhisparse/layouts/glm53.hpp>
#include <dhisparse/layouts/tiny.hpp>

#include "cuda_ops.hpp"

namespace dhisparse::python {

namespace {
cudaStream_t as_stream(stream_handle s) { return reinterpret_cast<cudaStream_t>(s); }
std::vector<std::uint8_t> as_u8(std::span<const std::byte> s) {
  std::vector<std::uint8_t> out(s.size());
  std::memcpy(out.data(), s.data(), s.size());
  return out;
}
/// A device-accessible rows buffer must hold exactly `count` rows of every payload layer (the
/// device overloads of the library take a pointer and cannot check its size).
void check_rows(const char* call, request_id id, std::size_t source, std::size_t bytes, std::size_t rows,
                std::size_t layers, std::size_t row_bytes) {
  if (bytes != rows * layers * row_bytes)
    throw size_mismatch(std::string(call) + " of request " + std::to_string(id) + " to source " +
                        std::to_string(source) + " got " + std::to_string(bytes) + " bytes for " +
                        std::to_string(rows) + " rows, expected " + std::to_string(rows * layers * row_bytes));
}
}  // namespace

template <class Layout, std::size_t B>
struct cuda_hierarchy_ops<Layout, B>::impl {
  using H = cuda::hierarchy<Layout, lru_hot_cache<B>>;
  std::unique_ptr<H> owned;
  H* h = nullptr;
};

#define DHISPARSE_PY_OPS template <class Layout, std::size_t B> auto cuda_hierarchy_ops<Layout, B>::

template <class Layout, std::size_t B>
cuda_hierarchy_ops<Layout, B>::cuda_hierarchy_ops(const hierarchy_config& cfg, stream_handle stream)
    : p_(std::make_unique<impl>()) {
  p_->owned = std::make_unique<typename impl::H>(cfg, as_stream(stream));
  p_->h = p_->owned.get();
}
template <class Layout, std::size_t B>
cuda_hierarchy_ops<Layout, B>::cuda_hierarchy_ops(const hierarchy_config& cfg, shared_host_store<Layout>& store,
                                                  std::size_t rank, stream_handle stream)
    : p_(std::make_unique<impl>()) {
  p_->owned = std::make_unique<typename impl::H>(cfg, store, rank, as_stream(stream));
  p_->h = p_->owned.get();
}
template <class Layout, std::size_t B>
cuda_hierarchy_ops<Layout, B>::cuda_hierarchy_ops(std::unique_ptr<impl> p) : p_(std::move(p)) {}
template <class Layout, std::size_t B>
cuda_hierarchy_ops<Layout, B> cuda_hierarchy_ops<Layout, B>::view_of(void* hierarchy) {
  auto p = std::make_unique<impl>();
  p->h = static_cast<typename impl::H*>(hierarchy);
  return cuda_hierarchy_ops(std::move(p));
}
template <class Layout, std::size_t B>
cuda_hierarchy_ops<Layout, B>::cuda_hierarchy_ops(cuda_hierarchy_ops&&) noexcept = default;
template <class Layout, std::size_t B>
cuda_hierarchy_ops<Layout, B>& cuda_hierarchy_ops<Layout, B>::operator=(cuda_hierarchy_ops&&) noexcept = default;
template <class Layout, std::size_t B>
cuda_hierarchy_ops<Layout, B>::~cuda_hierarchy_ops() = default;

DHISPARSE_PY_OPS config() const -> const hierarchy_config& { return p_->h->config(); }
DHISPARSE_PY_OPS space() const -> location_space { return p_->h->space(); }
DHISPARSE_PY_OPS device() const -> int { return p_->h->device(); }
DHISPARSE_PY_OPS stream() const -> stream_handle { return reinterpret_cast<stream_handle>(p_->h->stream()); }
DHISPARSE_PY_OPS contains(request_id id) const -> bool { return p_->h->contains(id); }
DHISPARSE_PY_OPS slot_of(request_id id) const -> std::size_t { return p_->h->slot_of(id); }
DHISPARSE_PY_OPS admitted_count() const -> std::size_t { return p_->h->admitted_count(); }
DHISPARSE_PY_OPS shares_host_store() const -> bool { return p_->h->shares_host_store(); }
DHISPARSE_PY_OPS rank() const -> std::size_t { return p_->h->rank(); }
DHISPARSE_PY_OPS host_bytes_in_use() const -> std::size_t { return p_->h->host_bytes_in_use(); }
DHISPARSE_PY_OPS set_programmatic_launch(bool on) -> void { p_->h->set_programmatic_launch(on); }
DHISPARSE_PY_OPS programmatic_launch() const -> bool { return p_->h->programmatic_launch(); }
DHISPARSE_PY_OPS admit(request_id id, stream_handle s) -> admission { return p_->h->admit(id, as_stream(s)); }
DHISPARSE_PY_OPS admit_on_prefix(request_id id, prefix_id prefix, stream_handle s) -> admission {
  return p_->h->admit(id, prefix, as_stream(s));
}
DHISPARSE_PY_OPS retain_prefix(prefix_id prefix, request_id id, const std::vector<std::int64_t>* rows)
    -> std::vector<prefix_id> {
  return rows ? p_->h->retain_prefix(prefix, id, std::span<const std::int64_t>(*rows)) : p_->h->retain_prefix(prefix, id);
}
DHISPARSE_PY_OPS release_prefix(prefix_id prefix) -> void { p_->h->release_prefix(prefix); }
DHISPARSE_PY_OPS contains_prefix(prefix_id prefix) const -> bool { return p_->h->contains_prefix(prefix); }
DHISPARSE_PY_OPS prefix_rows(prefix_id prefix, std::size_t source) const -> std::int64_t {
  return p_->h->prefix_rows(prefix, source);
}
DHISPARSE_PY_OPS retained_prefixes() const -> std::vector<prefix_id> { return p_->h->retained_prefixes(); }
DHISPARSE_PY_OPS prefix_pages_held(std::size_t source) const -> std::size_t {
  return p_->h->prefix_pages_held(source);
}
DHISPARSE_PY_OPS complete(request_id id, stream_handle s) -> void { p_->h->complete(id, as_stream(s)); }
DHISPARSE_PY_OPS frontier(request_id id, std::size_t source) const -> std::int64_t { return p_->h->frontier(id, source); }
DHISPARSE_PY_OPS positions(request_id id, std::size_t source) const -> std::int64_t {
  return p_->h->positions(id, source);
}
DHISPARSE_PY_OPS append(request_id id, std::size_t source, const void* rows, std::size_t bytes, std::size_t count,
                        bool on_device, stream_handle s) -> void {
  const auto* r = static_cast<const std::byte*>(rows);
  if (!on_device) return p_->h->append(id, source, std::span<const std::byte>(r, bytes), count, as_stream(s));
  if (source < source_count<Layout>) {
    const auto& d = Layout::sources[source];
    (void)p_->h->frontier(id, source);  // unknown_request first, as the host call reports it
    check_rows("append", id, source, bytes, count, d.payload_layers, d.row_bytes);
  }
  p_->h->append(id, source, r, count, as_stream(s));
}
DHISPARSE_PY_OPS reserve_rows(request_id id, std::size_t source, std::size_t rows_ahead, stream_handle s) -> void {
  p_->h->reserve_rows(id, source, rows_ahead, as_stream(s));
}
DHISPARSE_PY_OPS reserve_ahead(std::size_t rows_ahead, stream_handle s) -> void {
  p_->h->reserve_ahead(rows_ahead, as_stream(s));
}
DHISPARSE_PY_OPS reserved_rows(request_id id, std::size_t source) const -> std::int64_t {
  return p_->h->reserved_rows(id, source);
}
DHISPARSE_PY_OPS sync_books(stream_handle s) -> void { p_->h->sync_books(as_stream(s)); }
namespace {
/// The step-wide write descriptor; a per-source `kv_write_view` is its fields without `rows_pitch`.
cuda::kv_step_write_view step_view(const std::int32_t* slots, const std::int32_t* rows, const std::int32_t* first,
                                   const void* const* layer_rows, std::uint64_t row_stride, std::uint32_t rows_pitch,
                                   std::uint32_t max_rows, std::uint32_t capacity) {
  cuda::kv_step_write_view v;
  v.slots = slots;
  v.rows = rows;
  v.first = first;
  v.layer_rows = reinterpret_cast<const std::byte* const*>(layer_rows);
  v.row_stride = row_stride;
  v.rows_pitch = rows_pitch;
  v.max_rows = max_rows;
  v.capacity = capacity;
  return v;
}
}  // namespace
DHISPARSE_PY_OPS append_view(std::size_t source, const std::int32_t* slots, const std::int32_t* rows,
                             const std::int32_t* first, const void* const* layer_rows, std::uint64_t row_stride,
                             std::uint32_t max_rows, std::uint32_t capacity, stream_handle s) -> void {
  const auto v = step_view(slots, rows, first, layer_rows, row_stride, 0, max_rows, capacity);
  p_->h->append(source, cuda::kv_write_view{v.slots, v.rows, v.first, v.layer_rows, v.row_stride, v.max_rows, v.capacity},
                as_stream(s));
}
DHISPARSE_PY_OPS append_step_view(const std::int32_t* slots, const std::int32_t* rows, const std::int32_t* first,
                                  const void* const* layer_rows, std::uint64_t row_stride, std::uint32_t rows_pitch,
                                  std::uint32_t max_rows, std::uint32_t capacity, stream_handle backup,
                                  stream_handle s) -> void {
  p_->h->append_step(step_view(slots, rows, first, layer_rows, row_stride, rows_pitch, max_rows, capacity),
                     as_stream(backup), as_stream(s));
}
DHISPARSE_PY_OPS commit_step_view(const std::int32_t* slots, const std::int32_t* accepted, std::uint32_t capacity,
                                  stream_handle backup, stream_handle s) -> void {
  p_->h->commit_step(cuda::commit_step_view{slots, accepted, capacity}, as_stream(backup), as_stream(s));
}
DHISPARSE_PY_OPS verify_view(std::size_t source, const std::uint32_t* count, const std::int32_t* slots,
                             const std::int32_t* queries, const std::int32_t* lengths,
                             const void* const* selection_ptrs, const void* const* location_ptrs,
                             std::uint32_t capacity, stream_handle s, copy_layers mode) -> void {
  cuda::verify_batch_view v;
  v.count = count;
  v.slots = slots;
  v.queries = queries;
  v.lengths = lengths;
  v.selection_ptrs = reinterpret_cast<const row_index* const*>(selection_ptrs);
  // The pointer array is read-only; the locations it points to are written.
  v.location_ptrs = static_cast<location* const*>(static_cast<const void*>(location_ptrs));
  v.max_block = static_cast<std::uint32_t>(p_->h->config().max_block);
  v.capacity = capacity;
  p_->h->verify(source, v, as_stream(s), mode);
}
DHISPARSE_PY_OPS stage_blocks_view(std::size_t source, const std::int32_t* slots, const std::int32_t* counts,
                                   const std::int32_t* first, const void* const* layer_rows, std::uint64_t row_stride,
                                   std::uint32_t max_block, std::uint32_t capacity, stream_handle s) -> void {
  p_->h->stage_blocks(source,
                      cuda::stage_view{slots, counts, first, reinterpret_cast<const std::byte* const*>(layer_rows),
                                       row_stride, max_block, capacity},
                      as_stream(s));
}
DHISPARSE_PY_OPS stage_step_view(const std::int32_t* slots, const std::int32_t* counts, const std::int32_t* first,
                                 const void* const* layer_rows, std::uint64_t row_stride, std::uint32_t max_block,
                                 std::uint32_t capacity, stream_handle s) -> void {
  p_->h->stage_step(cuda::stage_step_view{slots, counts, first, reinterpret_cast<const std::byte* const*>(layer_rows),
                                          row_stride, max_block, capacity},
                    as_stream(s));
}
DHISPARSE_PY_OPS join_backup(stream_handle s) -> void { p_->h->join_backup(as_stream(s)); }
DHISPARSE_PY_OPS backup_pending() const -> bool { return p_->h->backup_pending(); }
template <class Layout, std::size_t B>
std::size_t cuda_hierarchy_ops<Layout, B>::step_layers() {
  return impl::H::step_layers;
}
template <class Layout, std::size_t B>
std::size_t cuda_hierarchy_ops<Layout, B>::step_layer_index(std::size_t source, std::size_t layer) {
  if (source >= impl::H::sources) throw invalid_source("step_layer_index: source " + std::to_string(source) + " of " +
                                                       std::to_string(impl::H::sources));
  if (layer >= Layout::sources[source].payload_layers)
    throw invalid_source("step_layer_index: layer " + std::to_string(layer) + " of source " + std::to_string(source) +
                         ", which has " + std::to_string(Layout::sources[source].payload_layers));
  return impl::H::step_layer_index(source, layer);
}
DHISPARSE_PY_OPS commit_view(std::size_t source, const std::int32_t* slots, const std::int32_t* accepted,
                             std::uint32_t capacity, stream_handle s) -> void {
  p_->h->commit(source, cuda::commit_view{slots, accepted, capacity}, as_stream(s));
}
DHISPARSE_PY_OPS resolve(std::size_t source, const request_id* ids, std::size_t c, const std::int32_t* sel,
                         std::int32_t* loc, std::size_t k, stream_handle s, copy_layers mode) -> void {
  std::vector<cuda::batch_item> items(c);
  for (std::size_t i = 0; i < c; ++i)
    items[i] = {ids[i], sel + i * k, static_cast<std::int32_t>(k), loc + i * k};
  p_->h->resolve(source, std::span<const cuda::batch_item>(items), as_stream(s), mode);
}
DHISPARSE_PY_OPS resolve_view(std::size_t source, const std::int32_t* slots, const std::int32_t* sel,
                              std::int32_t* loc, const std::int32_t* lengths, const std::uint32_t* count,
                              std::uint32_t stride, std::uint32_t capacity, stream_handle s, copy_layers mode) -> void {
  cuda::batch_view v;
  v.slots = slots;
  v.selections = sel;
  v.locations = loc;
  v.lengths = lengths;
  v.count = count;
  v.stride = stride;
  v.capacity = capacity;
  p_->h->resolve(source, v, as_stream(s), mode);
}
DHISPARSE_PY_OPS time_resolve_view(std::size_t iterations, std::size_t source, const std::int32_t* slots,
                                   const std::int32_t* sel, std::int32_t* loc, const std::uint32_t* count,
                                   std::uint32_t stride, std::uint32_t capacity, stream_handle s) -> double {
  cuda::batch_view v;
  v.slots = slots;
  v.selections = sel;
  v.locations = loc;
  v.count = count;
  v.stride = stride;
  v.capacity = capacity;
  DHISPARSE_CUDA_TRY(cudaStreamSynchronize(as_stream(s)));
  const auto t0 = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < iterations; ++i) p_->h->resolve(source, v, as_stream(s), copy_layers::all);
  const auto t1 = std::chrono::steady_clock::now();
  DHISPARSE_CUDA_TRY(cudaStreamSynchronize(as_stream(s)));
  return std::chrono::duration<double>(t1 - t0).count() / static_cast<double>(iterations ? iterations : 1);
}
DHISPARSE_PY_OPS check_errors(stream_handle s) -> void { p_->h->check_errors(as_stream(s)); }
DHISPARSE_PY_OPS last_stats(std::size_t source) const -> std::vector<resolve_stats> { return p_->h->last_stats(source); }
DHISPARSE_PY_OPS last_plan(std::size_t source) const -> std::vector<planned_copy> { return p_->h->last_plan(source); }
DHISPARSE_PY_OPS copy_follower(std::size_t source, std::size_t layer, stream_handle s) -> void {
  p_->h->copy_follower(source, layer, as_stream(s));
}
DHISPARSE_PY_OPS release_staging(std::size_t source, stream_handle s) -> void {
  p_->h->release_staging(source, as_stream(s));
}
DHISPARSE_PY_OPS staging_holder() const -> std::optional<std::size_t> { return p_->h->staging_holder(); }
DHISPARSE_PY_OPS stage_block(request_id id, std::size_t source, const void* rows, std::size_t bytes, std::size_t count,
                             bool on_device, stream_handle s) -> void {
  const auto* r = static_cast<const std::byte*>(rows);
  if (!on_device) return p_->h->stage_block(id, source, std::span<const std::byte>(r, bytes), count, as_stream(s));
  if (source < source_count<Layout> && p_->h->config().max_block > 1 && count >= 1 && count <= p_->h->config().max_block) {
    const auto& d = Layout::sources[source];
    check_rows("stage_block", id, source, bytes, p_->h->block_rows(id, source, count), d.payload_layers, d.row_bytes);
  }
  p_->h->stage_block(id, source, r, count, as_stream(s));
}
DHISPARSE_PY_OPS verify(std::size_t source, const request_id* ids, std::size_t c, const std::size_t* widths,
                        std::size_t kmax, const std::int32_t* q, std::int32_t* loc, std::size_t k, stream_handle s,
                        copy_layers mode) -> void {
  std::vector<cuda::verify_query> queries(c * kmax);
  std::vector<cuda::verify_batch_item> items(c);
  for (std::size_t i = 0; i < c; ++i) {
    for (std::size_t j = 0; j < kmax; ++j)
      queries[i * kmax + j] = {q + (i * kmax + j) * k, static_cast<std::int32_t>(k), loc + (i * kmax + j) * k};
    items[i] = {ids[i], std::span<const cuda::verify_query>(queries.data() + i * kmax, widths[i])};
  }
  p_->h->verify(source, std::span<const cuda::verify_batch_item>(items), as_stream(s), mode);
}
DHISPARSE_PY_OPS last_verify_stats(std::size_t source) const -> std::vector<verify_stats> {
  return p_->h->last_verify_stats(source);
}
DHISPARSE_PY_OPS commit(request_id id, std::size_t source, std::size_t accepted, stream_handle s) -> void {
  p_->h->commit(id, source, accepted, as_stream(s));
}
DHISPARSE_PY_OPS block_rows(request_id id, std::size_t source, std::size_t count) const -> std::size_t {
  return p_->h->block_rows(id, source, count);
}
DHISPARSE_PY_OPS staged_rows(request_id id, std::size_t source) const -> std::size_t {
  return p_->h->staged_rows(id, source);
}
DHISPARSE_PY_OPS verified_queries(request_id id, std::size_t source) const -> std::size_t {
  return p_->h->verified_queries(id, source);
}
DHISPARSE_PY_OPS map_optional_page(request_id id, std::size_t source, std::size_t page, stream_handle s) -> bool {
  return p_->h->map_optional_page(id, source, page, as_stream(s));
}
DHISPARSE_PY_OPS unmap_optional_page(request_id id, std::size_t source, std::size_t page, stream_handle s) -> void {
  p_->h->unmap_optional_page(id, source, page, as_stream(s));
}
DHISPARSE_PY_OPS free_optional_pages(std::size_t source) const -> std::size_t {
  return p_->h->free_optional_pages(source);
}
DHISPARSE_PY_OPS free_host_pages(std::size_t source) const -> std::size_t { return p_->h->free_host_pages(source); }
DHISPARSE_PY_OPS pool(std::size_t source, std::size_t layer) const -> void* { return p_->h->pool(source, layer); }
DHISPARSE_PY_OPS pool_rows() const -> std::size_t { return p_->h->pool_rows(); }
DHISPARSE_PY_OPS payload_row(std::size_t source, std::size_t layer, location loc) const -> std::vector<std::uint8_t> {
  const auto row = p_->h->payload_row(source, layer, loc);
  return as_u8(row);
}
DHISPARSE_PY_OPS host_row(request_id id, std::size_t source, std::size_t layer, row_index row) const
    -> std::vector<std::uint8_t> {
  return as_u8(p_->h->host_row(id, source, layer, row));
}
DHISPARSE_PY_OPS hot_rows_of(request_id id, std::size_t source) const -> std::vector<row_index> {
  return p_->h->hot_rows_of(id, source);
}
DHISPARSE_PY_OPS lru_order_of(request_id id, std::size_t source) const -> std::vector<std::size_t> {
  const auto o = p_->h->lru_order_of(id, source);
  return std::vector<std::size_t>(o.begin(), o.end());
}
DHISPARSE_PY_OPS optional_map_of(request_id id, std::size_t source) const -> std::vector<std::int32_t> {
  return p_->h->optional_map_of(id, source);
}
DHISPARSE_PY_OPS synchronize(stream_handle s) const -> void { DHISPARSE_CUDA_TRY(cudaStreamSynchronize(as_stream(s))); }
#undef DHISPARSE_PY_OPS

// ------------------------------------------------------------------ residency manager

template <class Layout, std::size_t B, class Policy>
struct cuda_manager_ops<Layout, B, Policy>::impl {
  using H = cuda::hierarchy<Layout, lru_hot_cache<B>>;
  cuda::residency_manager<H, Policy> m;
  impl(const hierarchy_config& c, const residency_config& r, stream_handle s) : m(c, r, as_stream(s)) {}
};

#define DHISPARSE_PY_MGR \
  template <class Layout, std::size_t B, class Policy> auto cuda_manager_ops<Layout, B, Policy>::

template <class Layout, std::size_t B, class Policy>
cuda_manager_ops<Layout, B, Policy>::cuda_manager_ops(const hierarchy_config& cfg, const residency_config& rcfg,
                                                      stream_handle step_stream)
    : p_(std::make_unique<impl>(cfg, rcfg, step_stream)),
      view_(std::make_unique<cuda_hierarchy_ops<Layout, B>>(cuda_hierarchy_ops<Layout, B>::view_of(
          // The manager hands out its hierarchy read-only; the Python package's ManagedHierarchy
          // exposes only the read-only accessors and per-step operations of step_handle.
          const_cast<void*>(static_cast<const void*>(&p_->m.hierarchy()))))) {}
template <class Layout, std::size_t B, class Policy>
cuda_manager_ops<Layout, B, Policy>::cuda_manager_ops(cuda_manager_ops&&) noexcept = default;
template <class Layout, std::size_t B, class Policy>
cuda_manager_ops<Layout, B, Policy>::~cuda_manager_ops() = default;

DHISPARSE_PY_MGR step_stream() const -> stream_handle { return reinterpret_cast<stream_handle>(p_->m.step_stream()); }
DHISPARSE_PY_MGR copy_stream() const -> stream_handle { return reinterpret_cast<stream_handle>(p_->m.copy_stream()); }
DHISPARSE_PY_MGR config() const -> const residency_config& { return p_->m.config(); }
DHISPARSE_PY_MGR counters() const -> const residency_counters& { return p_->m.counters(); }
DHISPARSE_PY_MGR capacity_pages() const -> std::size_t { return p_->m.capacity_pages(); }
DHISPARSE_PY_MGR pinned_pages_per_request() const -> std::size_t { return p_->m.pinned_pages_per_request(); }
DHISPARSE_PY_MGR contains(request_id id) const -> bool { return p_->m.contains(id); }
DHISPARSE_PY_MGR admitted_count() const -> std::size_t { return p_->m.admitted_count(); }
DHISPARSE_PY_MGR claims() const -> std::size_t { return p_->m.claims(); }
DHISPARSE_PY_MGR claimed(request_id id) const -> bool { return p_->m.claimed(id); }
DHISPARSE_PY_MGR reclaiming(request_id id) const -> bool { return p_->m.reclaiming(id); }
DHISPARSE_PY_MGR ledger(std::size_t source) const -> residency_ledger { return p_->m.ledger(source); }
DHISPARSE_PY_MGR invariant_holds() const -> bool { return p_->m.invariant_holds(); }
DHISPARSE_PY_MGR retiring_pages(std::size_t source) const -> std::size_t { return p_->m.retiring_pages(source); }
DHISPARSE_PY_MGR optional_pages_of(request_id id, std::size_t source) const -> std::size_t {
  return p_->m.optional_pages_of(id, source);
}
DHISPARSE_PY_MGR imported_rows(request_id id, std::size_t source) const -> std::int64_t {
  return p_->m.imported_rows(id, source);
}
DHISPARSE_PY_MGR reclaim_sequence() const -> std::vector<request_id> { return p_->m.reclaim_sequence(); }
DHISPARSE_PY_MGR admit(request_id id, const std::vector<import_rows>& history, bool on_device,
                       std::optional<prefix_id> prefix) -> residency_admission {
  // On a prefix, each source's suffix starts where the prefix ends (the library checks it).
  const auto& h = p_->m.hierarchy();
  const auto first_row = [&](std::size_t s) -> std::int64_t {
    return prefix && s < source_count<Layout> && h.contains_prefix(*prefix) ? h.prefix_rows(*prefix, s) : 0;
  };
  if (on_device) {
    std::vector<cuda::device_history_import> imports;
    for (std::size_t s = 0; s < history.size(); ++s) {
      const auto& hi = history[s];
      if (s < source_count<Layout> && hi.count <= h.config().max_rows) {
        const auto& d = Layout::sources[s];
        if (hi.bytes != hi.count * d.payload_layers * d.row_bytes)
          throw size_mismatch("residency: request " + std::to_string(id) + " imports " + std::to_string(hi.bytes) +
                              " bytes for " + std::to_string(hi.count) + " rows on source " + std::to_string(s) +
                              ", expected " + std::to_string(hi.count * d.payload_layers * d.row_bytes));
      }
      imports.push_back({static_cast<const std::byte*>(hi.rows), hi.count, first_row(s)});
    }
    const std::span<const cuda::device_history_import> span(imports);
    return prefix ? p_->m.admit(id, *prefix, span) : p_->m.admit(id, span);
  }
  std::vector<history_import> imports;
  for (std::size_t s = 0; s < history.size(); ++s) {
    const auto& hi = history[s];
    imports.push_back(
        {std::span<const std::byte>(static_cast<const std::byte*>(hi.rows), hi.bytes), hi.count, first_row(s)});
  }
  const std::span<const history_import> span(imports);
  return prefix ? p_->m.admit(id, *prefix, span) : p_->m.admit(id, span);
}
DHISPARSE_PY_MGR retain_prefix(prefix_id prefix, request_id id, const std::vector<std::int64_t>* rows)
    -> std::vector<prefix_id> {
  return rows ? p_->m.retain_prefix(prefix, id, std::span<const std::int64_t>(*rows)) : p_->m.retain_prefix(prefix, id);
}
DHISPARSE_PY_MGR release_prefix(prefix_id prefix) -> void { p_->m.release_prefix(prefix); }
DHISPARSE_PY_MGR withdraw(request_id id) -> void { p_->m.withdraw(id); }
DHISPARSE_PY_MGR check_device_rows(const char* call, request_id id, std::size_t source, std::size_t bytes,
                                   std::size_t count) const -> void {
  if (source >= source_count<Layout>) return;  // invalid_source from the library
  const auto& d = Layout::sources[source];
  (void)p_->m.imported_rows(id, source);  // unknown_request first
  check_rows(call, id, source, bytes, count, d.payload_layers, d.row_bytes);
}
DHISPARSE_PY_MGR append(request_id id, std::size_t source, const void* rows, std::size_t bytes, std::size_t count,
                        bool on_device) -> void {
  const auto* r = static_cast<const std::byte*>(rows);
  if (!on_device) return p_->m.append(id, source, std::span<const std::byte>(r, bytes), count);
  check_device_rows("append", id, source, bytes, count);
  p_->m.append(id, source, r, count);
}
DHISPARSE_PY_MGR reserve_ahead(std::size_t rows_ahead) -> void { p_->m.reserve_ahead(rows_ahead); }
DHISPARSE_PY_MGR append_step_view(const std::int32_t* slots, const std::int32_t* rows, const std::int32_t* first,
                                  const void* const* layer_rows, std::uint64_t row_stride, std::uint32_t rows_pitch,
                                  std::uint32_t max_rows, std::uint32_t capacity, stream_handle backup) -> void {
  p_->m.append_step(step_view(slots, rows, first, layer_rows, row_stride, rows_pitch, max_rows, capacity),
                    as_stream(backup));
}
DHISPARSE_PY_MGR import_history(request_id id, std::size_t source, const void* rows, std::size_t bytes,
                                std::size_t count, bool on_device, stream_handle s) -> std::size_t {
  const auto* r = static_cast<const std::byte*>(rows);
  if (!on_device) return p_->m.import_history(id, source, std::span<const std::byte>(r, bytes), count);
  check_device_rows("import_history", id, source, bytes, count);
  return p_->m.import_history(id, source, r, count, as_stream(s));
}
DHISPARSE_PY_MGR complete(request_id id) -> void { p_->m.complete(id); }
DHISPARSE_PY_MGR repopulate() -> std::size_t { return p_->m.repopulate(); }
DHISPARSE_PY_MGR back_up(std::size_t max_pages) -> std::size_t { return p_->m.back_up(max_pages); }
DHISPARSE_PY_MGR poll() -> void { p_->m.poll(); }
DHISPARSE_PY_MGR drain() -> void { p_->m.drain(); }
DHISPARSE_PY_MGR audit() const -> std::string { return p_->m.audit(); }
#undef DHISPARSE_PY_MGR

template <class Layout>
struct cuda_pinned_store_ops<Layout>::impl {
  impl(std::size_t ranks, std::size_t host_pages, std::size_t request_capacity)
      : store(ranks, host_pages, request_capacity) {}
  cuda::pinned_shared_host_store<Layout> store;
};
template <class Layout>
cuda_pinned_store_ops<Layout>::cuda_pinned_store_ops(std::size_t ranks, std::size_t host_pages,
                                                     std::size_t request_capacity)
    : p_(std::make_unique<impl>(ranks, host_pages, request_capacity)) {}
template <class Layout>
cuda_pinned_store_ops<Layout>::~cuda_pinned_store_ops() = default;
template <class Layout>
shared_host_store<Layout>& cuda_pinned_store_ops<Layout>::store() {
  return p_->store;
}

template <class Layout>
struct cuda_interprocess_store_ops<Layout>::impl {
  using S = cuda::interprocess_pinned_host_store<Layout>;
  impl(typename S::create_t t, const std::string& name, std::size_t ranks, std::size_t host_pages,
       std::size_t request_capacity)
      : store(t, name, ranks, host_pages, request_capacity) {}
  impl(typename S::open_t t, const std::string& name, std::chrono::milliseconds timeout) : store(t, name, timeout) {}
  S store;
};
template <class Layout>
cuda_interprocess_store_ops<Layout>::cuda_interprocess_store_ops(std::unique_ptr<impl> p) : p_(std::move(p)) {}
template <class Layout>
cuda_interprocess_store_ops<Layout>::~cuda_interprocess_store_ops() = default;
template <class Layout>
auto cuda_interprocess_store_ops<Layout>::create(const std::string& name, std::size_t ranks, std::size_t host_pages,
                                                 std::size_t request_capacity)
    -> std::unique_ptr<cuda_interprocess_store_ops> {
  return std::unique_ptr<cuda_interprocess_store_ops>(new cuda_interprocess_store_ops(
      std::make_unique<impl>(typename impl::S::create_t{}, name, ranks, host_pages, request_capacity)));
}
template <class Layout>
auto cuda_interprocess_store_ops<Layout>::open(const std::string& name, std::int64_t timeout_ms)
    -> std::unique_ptr<cuda_interprocess_store_ops> {
  return std::unique_ptr<cuda_interprocess_store_ops>(new cuda_interprocess_store_ops(
      std::make_unique<impl>(typename impl::S::open_t{}, name, std::chrono::milliseconds(timeout_ms))));
}
template <class Layout>
interprocess_host_store<Layout>& cuda_interprocess_store_ops<Layout>::store() {
  return p_->store;
}

#define DHISPARSE_PY_INSTANTIATE(L, B)                                                                     \
  template class cuda_pinned_store_ops<layouts::L>;                                                        \
  template class cuda_interprocess_store_ops<layouts::L>;                                                  \
  template class cuda_hierarchy_ops<layouts::L, B>;                                                        \
  template class cuda_manager_ops<layouts::L, B, fixed_budget_policy>;                                     \
  template class cuda_manager_ops<layouts::L, B, adaptive_policy<>>;                                       \
  template class cuda_manager_ops<layouts::L, B, adaptive_policy<reclaim_order::least_recent_first>>;     \
  template class cuda_manager_ops<layouts::L, B, resident_policy>;
DHISPARSE_PY_INSTANTIATE(tiny, DHISPARSE_PY_HOT_tiny)
DHISPARSE_PY_INSTANTIATE(glm53, DHISPARSE_PY_HOT_glm53)
DHISPARSE_PY_INSTANTIATE(deepseek_v41_flash, DHISPARSE_PY_HOT_deepseek_v41_flash)
#undef DHISPARSE_PY_INSTANTIATE

}  // namespace dhisparse::python
