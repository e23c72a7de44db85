#pragma once
/// \file
/// Device descriptors of an engine step's KV writes, speculative stages and commits (vLLM slot-mapping
/// style): POD views over the engine's own device buffers, read on the device when the kernel runs,
/// so one launch per source covers every request of a step, nothing is allocated, and a CUDA graph
/// captured once replays with new contents. `capacity` and the pointers are fixed at capture.
///
/// Entry e names request slot `slots[e]` (`hierarchy::slot_of`; -1 = padding, skipped). A bad
/// entry (a slot that holds no request, the same slot twice, a row count outside [0, max_rows],
/// rows past the request's reservation or capacity; for stages a block of 0 positions, one wider
/// than max_block or past max_rows; for commits a round that was not verified or an acceptance
/// beyond it) is left untouched, the other entries proceed, and `hierarchy::check_errors` throws
/// the typed error of the first bad entry of the first failing launch (errors.hpp:
/// unknown_request, duplicate_in_batch, size_mismatch, block_too_wide, capacity_exceeded,
/// commit_without_verify, acceptance_beyond_block). A write loads each entry's new rows while the
/// entry's slot is being checked: the rows an entry with a slot >= 0 and a row count in
/// [1, max_rows] names must be readable even where the slot turns out bad (they are not written).
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

/// Draft blocks of one speculative round on one source (`hierarchy::stage_blocks(source,
/// stage_view, stream)`): the target's KV of each request's anchor and proposals, staged into the
/// tail ring past the committed window (not the host store; the frontier stays), as the
/// per-request `stage_block` does. Entry e stages `counts[e]` token positions n .. n+counts[e]-1
/// (n = the request's committed positions, read on the device), 1 <= counts[e] <= max_block;
/// they cover `hierarchy::block_rows` stored rows (m = 1: counts[e]; packed sources: the
/// boundary row first, re-supplied whole). Row i of entry e in payload layer l is read at
/// `layer_rows[l] + (first[e] + i) * row_stride` (`first` null: entry e starts at
/// `e * max_block`), laid out as `kv_write_view`'s buffers. Row buffers and `row_stride` must be
/// 16-byte aligned.
struct stage_view {
  const std::int32_t* slots = nullptr;           ///< [capacity] request slot, -1 = padding
  const std::int32_t* counts = nullptr;          ///< [capacity] K_r positions of each entry's block, 1 .. max_block
  const std::int32_t* first = nullptr;           ///< [capacity] first buffer row of each entry, or null
  const std::byte* const* layer_rows = nullptr;  ///< [payload layers of the source] device row buffers
  std::uint64_t row_stride = 0;                  ///< bytes between consecutive buffer rows (0: row_bytes)
  std::uint32_t max_block = 0;                   ///< widest block one entry stages (0: the hierarchy's K_max)
  std::uint32_t capacity = 0;                    ///< entries (at most max_requests)
};

/// Draft blocks of one speculative round on EVERY source (`hierarchy::stage_step`): one launch
/// stages them all. Entry e is one request (`slots[e]`, -1 = padding) whose block of `counts[e]`
/// positions is staged on each source (the draft is the same K_r tokens for every layer), checked
/// per (source, entry) as `stage_view` is per entry. Row i of entry e in payload layer l of
/// source s is read at `layer_rows[step_layer_index<Layout>(s, l)] + (first[e] + i) * stride`,
/// the buffers of `kv_step_write_view`; a packed source reads `block_rows` rows of its own there.
/// `row_stride` 0: each buffer's own row_bytes; otherwise one stride, a multiple of 16 of at least
/// the widest row, for every buffer.
struct stage_step_view {
  const std::int32_t* slots = nullptr;           ///< [capacity] request slot, -1 = padding
  const std::int32_t* counts = nullptr;          ///< [capacity] K_r positions of each entry's block, 1 .. max_block
  const std::int32_t* first = nullptr;           ///< [capacity] first buffer row of each entry, or null
  const std::byte* const* layer_rows = nullptr;  ///< [step_layers] device row buffers per (source, payload layer)
  std::uint64_t row_stride = 0;                  ///< bytes between consecutive buffer rows (0: each row_bytes)
  std::uint32_t max_block = 0;                   ///< widest block one entry stages (0: the hierarchy's K_max)
  std::uint32_t capacity = 0;                    ///< entries (at most max_requests)
};

/// Accepted counts of one speculative round on one source (`hierarchy::commit(source,
/// commit_view, stream)`), written by the engine's sampler on the device: entry e commits the
/// anchor and `accepted[e]` proposals of the last verified round of `slots[e]`.
struct commit_view {
  const std::int32_t* slots = nullptr;     ///< [capacity] request slot, -1 = padding
  const std::int32_t* accepted = nullptr;  ///< [capacity] 0 <= accepted <= K_r - 1 of the last verify
  std::uint32_t capacity = 0;              ///< entries (at most max_requests)
};

/// New KV rows of one step on EVERY source of the layout (`hierarchy::append_step`): one launch
/// writes them all. Entry e is one request (`slots[e]`, -1 = padding) and writes its new rows to
/// each source; the checks and errors are those of `kv_write_view`, made per (source, entry): a
/// bad (source, entry) is left untouched and recorded in that source's error books (what
/// `check_errors` reads), the other pairs proceed.
///
/// Row i of entry e in payload layer l of source s is read at
/// `layer_rows[step_layer_index<Layout>(s, l)] + (first + i) * stride`: one row buffer per
/// (source, payload layer), `hierarchy::step_layers` of them, indexed by the constexpr
/// `hierarchy::step_layer_index(s, l)`. `rows_pitch` 0: `rows[e]` (and `first[e]`) hold for every
/// source; otherwise `rows[s * rows_pitch + e]` (and `first[...]` alike) give each source its own
/// count, e.g. 0 on a packed source whose boundary row is not complete yet. `first` null: entry e
/// starts at buffer row `e * max_rows`. `row_stride` 0: each buffer's own row_bytes; otherwise one
/// stride, a multiple of 16 of at least the widest row, for every buffer.
struct kv_step_write_view {
  const std::int32_t* slots = nullptr;           ///< [capacity] request slot, -1 = padding
  const std::int32_t* rows = nullptr;            ///< [capacity], or [sources][rows_pitch]: new rows, 0 .. max_rows
  const std::int32_t* first = nullptr;           ///< as `rows`: first buffer row of each entry, or null
  const std::byte* const* layer_rows = nullptr;  ///< [step_layers] device row buffers per (source, payload layer)
  std::uint64_t row_stride = 0;                  ///< bytes between consecutive buffer rows (0: each row_bytes)
  std::uint32_t rows_pitch = 0;                  ///< 0: one count per entry for all sources; else >= capacity
  std::uint32_t max_rows = 1;                    ///< most rows one entry writes to one source
  std::uint32_t capacity = 0;                    ///< entries (at most max_requests)
};

/// Accepted counts of one speculative round on EVERY source (`hierarchy::commit_step`): entry e
/// commits the anchor and `accepted[e]` proposals of the last verified round of `slots[e]` on each
/// source, checked per (source, entry) as `commit_view` is per entry. The same fields as
/// `commit_view`: the sampler's accepted count of a request is the same for all its sources.
using commit_step_view = commit_view;

}  // namespace dhisparse::cuda
