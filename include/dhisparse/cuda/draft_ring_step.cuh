#pragma once
/// \file
/// The draft ring's graph-capturable step path: device descriptors of a round's drafted blocks and
/// accepted counts (vLLM slot-mapping style, the conventions of kv_write.cuh), and the device ref a
/// drafter's own kernels use to find the rows of its block and window from the DEVICE books.
///
/// `cuda::draft_ring_store::write_step(draft_write_view, stream)` and `commit_step(commit_view,
/// stream)` read the slots, counts and accepted counts on the device when the kernel runs, and read
/// and update the per-slot books (`draft_slot_state`) there too, so an engine's sampler writes the
/// accepted counts on the GPU and one CUDA graph replays the whole round with no host round trip.
/// Entry e names ring slot `slots[e]` (-1 = padding, skipped). A bad entry is left untouched (its
/// slot's books and rows unchanged), the other entries proceed, and
/// `draft_ring_store::check_errors` throws the typed error of the first bad entry of the first
/// failing launch (errors.hpp): invalid_slot (slot past the store's slots), duplicate_in_batch (a
/// slot named twice; the later entry is the bad one), size_mismatch (a write of a count outside
/// [1, max_count]), draft_write_out_of_order (offset < 0, or past the written block: a gap),
/// block_too_wide (offset + count > K_max), acceptance_beyond_block (accepted < 0, or accepted >=
/// written - committed: the anchor and the accepted proposals were not all written).
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "../detail/draft_ring_books.hpp"
#include "kv_write.cuh"

namespace dhisparse::cuda {

/// Drafted blocks of one round (`draft_ring_store::write_step`). Entry e writes `counts[e]`
/// positions of slot `slots[e]` starting at block index `offsets[e]`, i.e. positions
/// committed + offsets[e] + j for j < counts[e], with `committed` read from the device books when
/// the kernel runs; positions after the write are dropped (written = committed + offset + count),
/// as the host `write` does. A block drafter writes its whole block at offset 0 (`offsets` null);
/// a chain drafter writes one position a draft step at offset j.
///
/// Position j of entry e in drafter layer l is read at `layer_rows[l] + (first[e] + j) *
/// row_stride` (`first` null: entry e starts at buffer row e * max_count): one buffer per drafter
/// layer, rows [token][row_stride], as the drafter's KV-producing kernel writes them. `layer_rows`
/// null: nothing is copied, the books only record the write (the drafter stored its rows in place
/// through `draft_ring_step_ref::block_row`, like the host `claim`).
struct draft_write_view {
  const std::int32_t* slots = nullptr;           ///< [capacity] ring slot, -1 = padding
  const std::int32_t* counts = nullptr;          ///< [capacity] positions written, 1 .. max_count
  const std::int32_t* offsets = nullptr;         ///< [capacity] block index of the first one, or null (0)
  const std::int32_t* first = nullptr;           ///< [capacity] first buffer row of each entry, or null
  const std::byte* const* layer_rows = nullptr;  ///< [drafter layers] device row buffers, or null (claim)
  std::uint64_t row_stride = 0;                  ///< bytes between consecutive buffer rows (0: row_bytes)
  std::uint32_t max_count = 0;                   ///< most positions one entry writes (0: K_max)
  std::uint32_t capacity = 0;                    ///< entries (at most the store's slots)
};

/// Accepted counts of one round for the ring (`draft_ring_store::commit_step`): the hierarchy's
/// `commit_view`, so one buffer of slots and accepted counts written by the engine's sampler serves
/// both `hierarchy::commit_step` and the ring when ring slots are the hierarchy's request slots.
/// Entry e commits the anchor and `accepted[e]` proposals: committed += accepted + 1, written =
/// committed.
using draft_commit_view = commit_view;

/// Trivially copyable device ref of a draft ring with its device books, for the drafter's own
/// kernels (vLLM-style slot mapping): where position committed + j of a slot lives, and which ring
/// rows its window covers, without the host. Read-only on the books: only the store's
/// `write_step`/`commit_step` (or its host calls) change them. Valid in kernels ordered after the
/// store calls that produced the books they should see (same stream or an event).
template <DraftRingPolicy Ring>
struct draft_ring_step_ref {
  ::dhisparse::draft_ring_ref<Ring> ring;     ///< the rows (`ring.row(slot, t, layer)`)
  const draft_slot_state* books = nullptr;    ///< [ring.slots] device books

  static constexpr std::uint64_t window_rows = Ring::window;
  static constexpr std::uint64_t max_block = Ring::max_block;

  /// The slot's book as the device holds it now.
  __device__ draft_slot_state state(std::size_t slot) const { return books[slot]; }
  /// Next position to commit (n): the anchor of the slot's current block.
  __device__ std::uint64_t committed(std::size_t slot) const { return books[slot].committed; }
  /// One past the last written position.
  __device__ std::uint64_t written(std::size_t slot) const { return books[slot].written; }
  /// Ring location (row in [0, slots * R_d)) of block position committed + j: where the drafter
  /// stores (or `write_step` copies) its j-th block row. j < K_max for a position the books accept.
  __device__ std::size_t block_location(std::size_t slot, std::uint32_t j) const {
    return Ring::address(slot, books[slot].committed + j);
  }
  /// First byte of block position committed + j of the slot in drafter layer `layer`.
  __device__ std::byte* block_row(std::size_t slot, std::uint32_t j, std::size_t layer = 0) const {
    return ring.row(slot, books[slot].committed + j, layer);
  }
  /// Live positions of the slot: the last W committed, then the written block (the host `window`).
  __device__ draft_window window(std::size_t slot) const {
    const draft_slot_state s = books[slot];
    const std::uint64_t first = s.committed > Ring::window ? s.committed - Ring::window : 0;
    return {first, static_cast<std::size_t>(s.written - first)};
  }
  /// Ring location of the i-th live position (i < window(slot).count) of a window read before.
  __device__ static std::size_t window_location(std::size_t slot, const draft_window& w, std::size_t i) {
    return Ring::address(slot, w.first + i);
  }
};

static_assert(std::is_trivially_copyable_v<draft_write_view>);
static_assert(std::is_trivially_copyable_v<draft_ring_step_ref<draft_ring<2048, 8, 64>>>,
              "dhisparse: draft_ring_step_ref is passed by value to kernels");

}  // namespace dhisparse::cuda
