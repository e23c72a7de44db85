#pragma once
/// \file
/// Device descriptors of an engine step's KV writes and speculative commits (vLLM slot-mapping
/// style): POD views over the engine's own device buffers, read on the device when the kernel runs,
/// so one launch per source covers every request of a step, nothing is allocated, and a CUDA graph
/// captured once replays with new contents. `capacity` and the pointers are fixed at capture.
///
/// Entry e names request slot `slots[e]` (`hierarchy::slot_of`; -1 = padding, skipped). A bad
/// entry (a slot that holds no request, the same slot twice, a row count outside [0, max_rows],
/// rows past the request's reservation or capacity; for commits a round that was not verified or
/// an acceptance beyond it) is left untouched, the other entries proceed, and
/// `hierarchy::check_errors` throws the typed error of the first bad entry of the first failing
/// launch (errors.hpp: unknown_request, duplicate_in_batch, size_mismatch, capacity_exceeded,
/// commit_without_verify, acceptance_beyond_block).
#include <cstddef>
#include <cstdint>

#include "../detail/config.hpp"

namespace dhisparse::cuda {

/// New KV rows of one step on one source (`hierarchy::append(source, kv_write_view, stream)`).
///
/// Entry e writes `rows[e]` new rows (decode: 1; a prefill chunk: more; 0: nothing) after the
/// request's frontier. Row i of entry e in payload layer l is read at
/// `layer_rows[l] + (first[e] + i) * row_stride`, i.e. each payload layer has one buffer of rows
/// `[token][row_stride]`, as an engine's KV-producing kernel writes them for its attention layer
/// (token t of the step at row t). `first` null: entry e starts at `e * max_rows`. Row buffers
/// and `row_stride` must be 16-byte aligned.
struct kv_write_view {
  const std::int32_t* slots = nullptr;             ///< [capacity] request slot, -1 = padding
  const std::int32_t* rows = nullptr;              ///< [capacity] new rows of each entry, 0 .. max_rows
  const std::int32_t* first = nullptr;             ///< [capacity] first buffer row of each entry, or null
  const std::byte* const* layer_rows = nullptr;    ///< [payload layers of the source] device row buffers
  std::uint64_t row_stride = 0;                    ///< bytes between consecutive buffer rows (0: row_bytes)
  std::uint32_t max_rows = 1;                      ///< most rows one entry writes
  std::uint32_t capacity = 0;                      ///< entries (at most max_requests)
};

/// Accepted counts of one speculative round on one source (`hierarchy::commit(source,
/// commit_view, stream)`), written by the engine's sampler on the device: entry e commits the
/// anchor and `accepted[e]` proposals of the last verified round of `slots[e]`.
struct commit_view {
  const std::int32_t* slots = nullptr;     ///< [capacity] request slot, -1 = padding
  const std::int32_t* accepted = nullptr;  ///< [capacity] 0 <= accepted <= K_r - 1 of the last verify
  std::uint32_t capacity = 0;              ///< entries (at most max_requests)
};

}  // namespace dhisparse::cuda
