#pragma once
/// \file
/// Trivially copyable views of speculative verification on the CUDA backend (docs/speculative.md):
/// the device descriptor of one verify launch, the per-entry stats it writes and the per-source
/// verification workspace. The owning `cuda::hierarchy` builds them.
#include "detail/minimum_arch.cuh"  // first: stops below sm_80 with a clear message
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "../types.hpp"
#include "views.cuh"

namespace dhisparse::cuda {

/// Widest speculative block (anchor + proposals) the CUDA backend verifies: the per-query
/// bookkeeping of one request lives in shared memory.
inline constexpr std::size_t max_verify_block = 32;

/// One target query of a verify call: a device selection and its device locations.
struct verify_query {
  const row_index* selection = nullptr;  ///< `length` entries, -1 padded
  std::int32_t length = 0;               ///< at most top_k
  location* locations = nullptr;         ///< `length` entries, written in selection order
};

/// A batch of speculative rounds on the device, for one verify launch on one source (build one
/// over your own device buffers to capture `hierarchy::verify(source, view, stream)` in a CUDA
/// graph; everything is read when the kernels run).
///
/// Entry e (0 <= e < *count) names request slot `slots[e]` with K_r = `queries[e]` queries; query
/// j of entry e reads `lengths[e * max_block + j]` entries from `selection_ptrs[e * max_block + j]`
/// and writes as many locations to `location_ptrs[e * max_block + j]`.
struct verify_batch_view {
  const std::uint32_t* count = nullptr;              ///< device scalar: entries in this launch
  const std::int32_t* slots = nullptr;               ///< [capacity]
  const std::int32_t* queries = nullptr;             ///< [capacity] K_r of each entry
  const std::int32_t* lengths = nullptr;             ///< [capacity * max_block]
  const row_index* const* selection_ptrs = nullptr;  ///< [capacity * max_block]
  location* const* location_ptrs = nullptr;          ///< [capacity * max_block]
  std::uint32_t max_block = 0;                       ///< K_max of the hierarchy
  std::uint32_t capacity = 0;                        ///< entries the buffers hold (<= max_requests)
};

/// Where one batch entry's queries were found (see `verify_stats`); bytes = rows_copied *
/// layers_copied * row_bytes.
struct verify_entry_stats {
  /// Entry counts as in `verify_stats`.
  std::uint32_t selected = 0, direct = 0, block = 0, hot = 0, host = 0, staged = 0;
  /// Distinct-row counts as in `verify_stats`, and the payload layers the rows were copied into.
  std::uint32_t rows_copied = 0, staging_rows = 0, layers_copied = 0;
  /// Padding to 48 bytes.
  std::uint32_t reserved[3] = {0, 0, 0};
};
static_assert(sizeof(verify_entry_stats) == 48);

/// Per-source workspace of the verification kernels (capacity = max_requests batch entries).
struct verify_workspace_view {
  control_block* control = nullptr;     ///< epoch, last_count, last_layers, sticky_epoch (ticket/done unused)
  plan_entry* plan = nullptr;           ///< [capacity * plan_stride] distinct missing rows of each entry, ascending
  verify_entry_stats* stats = nullptr;  ///< [capacity] stats of each entry of the last verify
  entry_error* errors = nullptr;        ///< [capacity] status of each entry of the last verify
  entry_error* sticky = nullptr;        ///< [capacity] records of the first failing verify (check_errors)
  std::uint32_t* seen = nullptr;        ///< [slots * words] per-slot bitmap of the union's missing rows (kept zero)
  std::uint32_t* word_rank = nullptr;   ///< [slots * words] missing rows before each bitmap word
  std::int32_t* staged = nullptr;       ///< [slots] rows of the staged block, 0 if none (device books)
  std::int32_t* verified = nullptr;     ///< [slots] K_r of the last good verify since staging, 0 if none
  std::int32_t* partial = nullptr;      ///< [slots] committed positions of the boundary row (< m; 0 for m = 1)
  std::uint32_t positions_per_row = 1;  ///< m of the source: query j sees rows < (frontier·m + partial + j + 1) / m
  std::uint32_t words = 0;              ///< bitmap words per slot: ceil(max_rows / 32)
  std::uint32_t plan_stride = 0;        ///< K_max * top_k
  /// Batch entries each per-entry array holds (max_requests).
  std::uint32_t capacity = 0;
};

static_assert(std::is_trivially_copyable_v<verify_batch_view>);
static_assert(std::is_trivially_copyable_v<verify_workspace_view>);

}  // namespace dhisparse::cuda

#include <span>

namespace dhisparse::cuda {

/// One request's round in an eager `hierarchy::verify` call: K_r = `queries.size()` target
/// queries, query j at position n + j, n = `positions()` (frontier for m = 1; j = 0 is the
/// anchor). The span is read on the host during the call; selections and locations are
/// device-accessible and used in stream order.
struct verify_batch_item {
  /// The admitted request whose staged block is verified.
  request_id request = 0;
  /// K_r device queries (a selection and its locations each), anchor first.
  std::span<const verify_query> queries;
};

}  // namespace dhisparse::cuda
