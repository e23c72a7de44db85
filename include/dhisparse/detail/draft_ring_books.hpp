#pragma once
/// \file
/// Shared by the host and CUDA draft ring stores: configuration, two-phase sizing, the byte layout
/// (a trivially copyable ref usable on host and device) and the per-slot book-keeping of committed
/// and written positions. Every operation validates before it changes anything and throws the typed
/// errors of errors.hpp; the stores only move bytes.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "../errors.hpp"
#include "../policies/draft_ring.hpp"
#include "config.hpp"

namespace dhisparse {

/// What a draft ring store holds: `slots` request slots, each with R_d rows of every one of
/// `layers` drafter layers, `row_bytes` per layer and position (the layer's K and V of one position,
/// as the drafter lays them out). One store per drafter; layers = 1 with the whole draft row in
/// `row_bytes` works too when the drafter keeps all its layers in one row.
struct draft_ring_config {
  std::size_t slots = 0;      ///< request slots N
  std::size_t row_bytes = 0;  ///< bytes of one position in one drafter layer
  std::size_t layers = 1;     ///< drafter layers
};

/// Memory a draft ring store of a configuration allocates (two-phase sizing: ask, then construct).
struct draft_ring_requirements {
  std::size_t rows_per_slot = 0;  ///< R_d
  std::size_t bytes = 0;          ///< layers * slots * R_d * row_bytes
  /// Bytes per request slot: R_d * layers * row_bytes, the planner's per-session draft ring.
  std::size_t bytes_per_slot = 0;
};

/// Book of one draft ring slot: positions [0, committed) are committed, [committed, written) the
/// current tentative block. The CUDA store keeps one per slot in device memory (what its batched
/// `write_step`/`commit_step` kernels read and update) and `copy_books_async` copies them out.
struct draft_slot_state {
  std::uint64_t committed = 0;  ///< next position to commit (n)
  std::uint64_t written = 0;    ///< one past the last written position
};
static_assert(sizeof(draft_slot_state) == 16 && std::is_trivially_copyable_v<draft_slot_state>);

/// One entry of a host `draft_ring_store::write_step`: positions committed + offset ..
/// committed + offset + count - 1 of `slot` (the position is taken from the books, as the CUDA
/// `write_step` reads it on the device), `rows` laid out as for `write` ([layer][count][row_bytes]).
struct draft_write_item {
  std::size_t slot = 0;
  std::size_t offset = 0;  ///< block index of the first position written (0: the anchor)
  std::span<const std::byte> rows;
  std::size_t count = 1;
};

/// One entry of a host `draft_ring_store::commit_step`: the anchor and `accepted` proposals of the
/// block of `slot` become committed.
struct draft_commit_item {
  std::size_t slot = 0;
  std::size_t accepted = 0;
};

/// The drafter's view of where its positions are: `first` is the oldest live position, the window
/// covers [first, first + count) in position order (last W committed positions, then the written
/// part of the current block).
struct draft_window {
  std::uint64_t first = 0;
  std::size_t count = 0;
};

/// Trivially copyable view of a draft ring's bytes, for kernels and host code alike. Layer l's ring
/// is one contiguous array of slots * R_d rows (a drafter layer's attention reads one array), row
/// phi(i, t) = i * R_d + t mod R_d. The ref knows nothing about which positions are live: the
/// owning store's books do.
template <DraftRingPolicy Ring>
struct draft_ring_ref {
  // The books keep W + K_max positions live at once; fewer rows would let two of them share one.
  static_assert(Ring::rows_per_slot >= Ring::window + Ring::max_block && Ring::max_block > 0,
                "dhisparse: a draft ring store needs rows_per_slot >= window + max_block and max_block >= 1");
  std::byte* base = nullptr;
  std::size_t slots = 0;
  std::size_t row_bytes = 0;
  std::size_t layers = 0;

  static constexpr std::size_t rows_per_slot = Ring::rows_per_slot;
  /// Ring row (location) of position t of slot i: phi(i, t).
  DHISPARSE_HD static constexpr std::size_t location(std::size_t slot, std::uint64_t position) {
    return Ring::address(slot, position);
  }
  /// Bytes between two layers' rings.
  DHISPARSE_HD constexpr std::size_t layer_stride() const { return slots * rows_per_slot * row_bytes; }
  /// First byte of the row of position t of slot i in drafter layer `layer`.
  DHISPARSE_HD constexpr std::byte* row(std::size_t slot, std::uint64_t position, std::size_t layer = 0) const {
    return base + layer * layer_stride() + location(slot, position) * row_bytes;
  }
};

static_assert(std::is_trivially_copyable_v<draft_ring_ref<draft_ring<2048, 8, 64>>>,
              "dhisparse: draft_ring_ref is passed by value to kernels");

namespace detail {

/// Checked sizing of a draft ring; throws invalid_configuration on zero sizes or overflow.
template <DraftRingPolicy Ring>
draft_ring_requirements draft_ring_sizing(const draft_ring_config& cfg) {
  if (cfg.slots == 0 || cfg.row_bytes == 0 || cfg.layers == 0)
    throw invalid_configuration("draft ring needs slots, row_bytes and layers >= 1");
  constexpr std::size_t max = std::numeric_limits<std::size_t>::max();
  const std::size_t r = Ring::rows_per_slot;
  if (cfg.row_bytes > max / r || cfg.layers > max / (r * cfg.row_bytes) ||
      cfg.slots > max / (r * cfg.row_bytes * cfg.layers))
    throw invalid_configuration("draft ring size overflows size_t");
  draft_ring_requirements q;
  q.rows_per_slot = r;
  q.bytes_per_slot = r * cfg.row_bytes * cfg.layers;
  q.bytes = q.bytes_per_slot * cfg.slots;
  return q;
}

/// Committed and written positions of every slot. Per slot: positions [0, committed) are committed
/// and immutable; positions [committed, written) are the current tentative block, written by the
/// drafter and rewritable; committed <= written <= committed + K_max. Live (readable) positions are
/// [max(0, committed - W), written): the last W committed ones plus the written block, which spans at
/// most W + K_max <= R_d positions, so no two live positions share a ring row.
template <DraftRingPolicy Ring>
class draft_ring_books {
  static_assert(Ring::rows_per_slot >= Ring::window + Ring::max_block && Ring::max_block > 0,
                "dhisparse: a draft ring store needs rows_per_slot >= window + max_block and max_block >= 1");

 public:
  using slot_state = draft_slot_state;

  draft_ring_books() = default;
  explicit draft_ring_books(std::size_t slots) : slots_(slots) {}

  [[nodiscard]] std::size_t slots() const { return slots_.size(); }
  [[nodiscard]] const slot_state& state(std::size_t slot) const {
    check_slot(slot);
    return slots_[slot];
  }

  /// Throws unless positions [first, first + count) of `slot` may be written now: not committed
  /// (draft_write_out_of_order), no gap after the written ones (draft_write_out_of_order), inside
  /// the block of K_max after the committed prefix (block_too_wide).
  void check_write(std::size_t slot, std::uint64_t first, std::size_t count) const {
    check_slot(slot);
    const slot_state& s = slots_[slot];
    if (count == 0) throw size_mismatch("draft ring write of zero positions");
    if (first < s.committed)
      throw draft_write_out_of_order("draft ring write of position " + std::to_string(first) + " of slot " +
                                     std::to_string(slot) + ": committed positions (< " + std::to_string(s.committed) +
                                     ") are immutable");
    if (first > s.written)
      throw draft_write_out_of_order("draft ring write of position " + std::to_string(first) + " of slot " +
                                     std::to_string(slot) + " leaves a gap: next unwritten position is " +
                                     std::to_string(s.written));
    if (first - s.committed + count > Ring::max_block)
      throw block_too_wide("draft ring write of positions " + std::to_string(first) + ".." +
                           std::to_string(first + count - 1) + " of slot " + std::to_string(slot) +
                           " goes past the block of K_max = " + std::to_string(Ring::max_block) + " after position " +
                           std::to_string(s.committed));
  }
  /// Records a write checked by check_write: positions after it are dropped (the drafter rewrites
  /// the block from there on).
  void note_write(std::size_t slot, std::uint64_t first, std::size_t count) { slots_[slot].written = first + count; }

  /// Throws unless `accepted` proposals can be committed: the anchor and the accepted prefix,
  /// positions committed .. committed + accepted, must all be written (acceptance_beyond_block).
  void check_commit(std::size_t slot, std::size_t accepted) const {
    check_slot(slot);
    const slot_state& s = slots_[slot];
    if (accepted >= s.written - s.committed)
      throw acceptance_beyond_block("draft ring commit of " + std::to_string(accepted) + " accepted proposal(s) in slot " +
                                    std::to_string(slot) + ": only " + std::to_string(s.written - s.committed) +
                                    " block position(s) written (anchor included)");
  }
  /// n' = n + A + 1; the rest of the block is dropped.
  void note_commit(std::size_t slot, std::size_t accepted) {
    slot_state& s = slots_[slot];
    s.committed += accepted + 1;
    s.written = s.committed;
  }
  /// Throws unless `slot` may take a prompt of `positions` committed positions given by its last
  /// `count` rows: the slot holds nothing (draft_write_out_of_order) and count is min(positions, W),
  /// the positions the window will show (size_mismatch).
  void check_prefill(std::size_t slot, std::uint64_t positions, std::size_t count) const {
    check_slot(slot);
    const slot_state& s = slots_[slot];
    if (s.written != 0)
      throw draft_write_out_of_order("draft ring prefill of slot " + std::to_string(slot) + ", which already holds " +
                                     std::to_string(s.written) + " position(s) (reset it first)");
    const std::uint64_t live = std::min<std::uint64_t>(positions, Ring::window);
    if (count != live)
      throw size_mismatch("draft ring prefill of " + std::to_string(positions) + " position(s) needs the last " +
                          std::to_string(live) + ", got " + std::to_string(count));
  }
  /// Records a prefill checked by check_prefill: positions [0, positions) committed.
  void note_prefill(std::size_t slot, std::uint64_t positions) { slots_[slot] = {positions, positions}; }

  /// Throws invalid_slot or duplicate_in_batch unless every slot of a batch (`slot_of(item)`) is in
  /// range and named once, then `check(item)` on each: the common part of the batched calls.
  template <class Item, class SlotOf, class Check>
  void check_batch(std::span<const Item> batch, const char* call, SlotOf&& slot_of, Check&& check) const {
    std::vector<std::size_t> seen;
    seen.reserve(batch.size());
    for (const Item& item : batch) {
      const std::size_t slot = slot_of(item);
      check_slot(slot);
      const auto at = std::lower_bound(seen.begin(), seen.end(), slot);
      if (at != seen.end() && *at == slot)
        throw duplicate_in_batch("draft ring slot " + std::to_string(slot) + " appears twice in one " + call + " batch");
      seen.insert(at, slot);
      check(item);
    }
  }
  /// Overwrites a slot's book with one read from elsewhere (the CUDA store absorbing its device
  /// books); the caller guarantees the state came from books that obey the rules above.
  void assign(std::size_t slot, const slot_state& s) {
    check_slot(slot);
    slots_[slot] = s;
  }

  /// Drops the tentative block (a round abandoned before verification).
  void rollback(std::size_t slot) {
    check_slot(slot);
    slots_[slot].written = slots_[slot].committed;
  }
  /// Slot free for a new request: nothing committed or written.
  void reset(std::size_t slot) {
    check_slot(slot);
    slots_[slot] = {};
  }

  /// Live positions of a slot: last W committed, then the written block.
  [[nodiscard]] draft_window window(std::size_t slot) const {
    check_slot(slot);
    const slot_state& s = slots_[slot];
    const std::uint64_t first = s.committed > Ring::window ? s.committed - Ring::window : 0;
    return {first, static_cast<std::size_t>(s.written - first)};
  }
  /// Throws draft_position_not_live unless position t of `slot` is live.
  void check_live(std::size_t slot, std::uint64_t position) const {
    const draft_window w = window(slot);
    if (position < w.first || position - w.first >= w.count)
      throw draft_position_not_live("draft ring position " + std::to_string(position) + " of slot " +
                                    std::to_string(slot) + " is not live (live: " + std::to_string(w.first) + ".." +
                                    std::to_string(w.first + w.count) + ", end excluded)");
  }
  /// Ring locations of the live positions, in position order, into `out` (at least W + K_max
  /// entries, else size_mismatch); returns the window.
  draft_window window_into(std::size_t slot, std::span<std::size_t> out) const {
    const draft_window w = window(slot);
    if (out.size() < w.count)
      throw size_mismatch("draft ring window of slot " + std::to_string(slot) + " has " + std::to_string(w.count) +
                          " positions, output holds " + std::to_string(out.size()));
    for (std::size_t j = 0; j < w.count; ++j) out[j] = Ring::address(slot, w.first + j);
    return w;
  }

 private:
  void check_slot(std::size_t slot) const {
    if (slot >= slots_.size())
      throw invalid_slot("draft ring slot " + std::to_string(slot) + " out of range (" + std::to_string(slots_.size()) +
                         " slots)");
  }
  std::vector<slot_state> slots_;
};

}  // namespace detail
}  // namespace dhisparse
