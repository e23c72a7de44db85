#pragma once
/// \file
/// Host draft ring store: owns the draft KV of `slots` request slots in a DraftRing policy's ring
/// (R_d rows per slot and drafter layer, position t of slot i at phi(i, t)), and keeps the books of
/// which positions are committed, written and live. Memory does not depend on context length.
///
///   using ring = dhisparse::draft_ring<2048, 8, 64>;
///   dhisparse::draft_ring_config cfg{.slots = 35, .row_bytes = 2048, .layers = 6};
///   auto need = dhisparse::draft_ring_store<ring>::requirements(cfg);  // bytes before allocating
///   dhisparse::draft_ring_store<ring> ring_kv(cfg);
///   ring_kv.write(slot, n, anchor_kv);           // block positions n, n+1, ... in order
///   auto w = ring_kv.window(slot);               // ring rows the drafter attends over
///   ring_kv.commit(slot, accepted);              // after verification: n' = n + accepted + 1
///   ring_kv.reset(slot);                         // request completed
///
/// Batched (the executable spec of the CUDA store's `write_step`/`commit_step`): a round's blocks
/// of many slots at the positions the books hold, then the accepted counts of all of them:
///
///   ring_kv.write_step(std::span<const dhisparse::draft_write_item>(writes));  // {slot, offset, rows, count}
///   ring_kv.commit_step(std::span<const dhisparse::draft_commit_item>(commits));  // {slot, accepted}
///
/// Every call validates first and throws a typed error with the store unchanged.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "../detail/draft_ring_store_base.hpp"

namespace dhisparse {

/// Host draft ring store: the draft KV of N request slots in host memory, laid out by `Ring`, and
/// the books of committed, written and live positions (see the file comment).
template <DraftRingPolicy Ring>
class draft_ring_store : public detail::draft_ring_store_base<Ring> {
  using base = detail::draft_ring_store_base<Ring>;
  using base::books_;
  using base::cfg_;
  using base::req_;

 public:
  /// Trivially copyable view of the ring's rows (`draft_ring_ref<Ring>`).
  using typename base::ref_type;
  /// R_d: ring rows per request slot (`Ring::rows_per_slot`).
  using base::rows_per_slot;

  /// Allocates the ring, zeroed; throws invalid_configuration on zero sizes or a size that overflows.
  explicit draft_ring_store(const draft_ring_config& cfg) : base(cfg), bytes_(req_.bytes) {}

  /// Raw view of all rows (no liveness checks): what a kernel-style reader uses.
  [[nodiscard]] ref_type ref() { return {bytes_.data(), cfg_.slots, cfg_.row_bytes, cfg_.layers}; }
  /// All ring bytes (no liveness checks), laid out [drafter layer][slots * R_d rows][row_bytes].
  [[nodiscard]] std::span<const std::byte> storage() const { return bytes_; }

  /// Writes positions [first, first + count) of `slot` from `rows`, laid out layer-major as a
  /// drafter produces them: rows[(l * count + j) * row_bytes ...] is layer l of position first + j.
  /// first must be in the current block (>= the committed prefix) and at most the next unwritten
  /// position; the block ends K_max after the committed prefix. Later written positions are dropped.
  void write(std::size_t slot, std::uint64_t first, std::span<const std::byte> rows, std::size_t count = 1) {
    books_.check_write(slot, first, count);
    check_bytes("write", rows, count);
    copy_rows(slot, first, rows, count);
    books_.note_write(slot, first, count);
  }

  /// Writes the drafted blocks of a batch of slots (one round): item i writes positions
  /// committed + offset .. committed + offset + count - 1 of its slot, the position taken from the
  /// books (what the CUDA `write_step` reads on the device). Equals a `write(slot, committed +
  /// offset, rows, count)` per item. All or nothing: every item is checked first (invalid_slot,
  /// the same slot twice: duplicate_in_batch, then write's checks: size_mismatch for 0 positions
  /// or a wrong byte count, draft_write_out_of_order for an offset past the written block,
  /// block_too_wide past K_max) and on an error nothing changes.
  void write_step(std::span<const draft_write_item> batch) {
    books_.check_batch(batch, "write_step", [](const draft_write_item& it) { return it.slot; },
                       [&](const draft_write_item& it) {
                         books_.check_write(it.slot, books_.state(it.slot).committed + it.offset, it.count);
                         check_bytes("write_step", it.rows, it.count);
                       });
    for (const draft_write_item& it : batch) {
      const std::uint64_t first = books_.state(it.slot).committed + it.offset;
      copy_rows(it.slot, first, it.rows, it.count);
      books_.note_write(it.slot, first, it.count);
    }
  }
  /// Commits the accepted prefix of a batch of slots (one round): a `commit(slot, accepted)` per
  /// item. All or nothing: invalid_slot, duplicate_in_batch, acceptance_beyond_block (accepted >=
  /// written - committed) are checked for every item first, and on an error nothing changes.
  void commit_step(std::span<const draft_commit_item> batch) {
    books_.check_batch(batch, "commit_step", [](const draft_commit_item& it) { return it.slot; },
                       [&](const draft_commit_item& it) { books_.check_commit(it.slot, it.accepted); });
    for (const draft_commit_item& it : batch) books_.note_commit(it.slot, it.accepted);
  }

  /// A new request's prompt: positions [0, positions) become committed at once, given by the
  /// rows of the last min(positions, W) of them (what the window shows), laid out as for write.
  /// The slot must be empty (new, or reset). The next write starts at position `positions`.
  void prefill(std::size_t slot, std::uint64_t positions, std::span<const std::byte> rows) {
    const std::size_t count = rows.size() / (this->position_bytes() == 0 ? 1 : this->position_bytes());
    books_.check_prefill(slot, positions, count);
    check_bytes("prefill", rows, count);
    copy_rows(slot, positions - count, rows, count);
    books_.note_prefill(slot, positions);
  }

  /// Bytes of a live position in one drafter layer.
  [[nodiscard]] std::span<const std::byte> row(std::size_t slot, std::uint64_t position, std::size_t layer = 0) const {
    this->check_row(slot, position, layer);
    return {bytes_.data() + layer * cfg_.slots * rows_per_slot * cfg_.row_bytes +
                Ring::address(slot, position) * cfg_.row_bytes,
            cfg_.row_bytes};
  }

 private:
  void check_bytes(const char* call, std::span<const std::byte> rows, std::size_t count) const {
    if (rows.size() != count * this->position_bytes())
      throw size_mismatch(std::string("draft ring ") + call + " of " + std::to_string(count) + " position(s) needs " +
                          std::to_string(count * this->position_bytes()) + " bytes, got " + std::to_string(rows.size()));
  }
  void copy_rows(std::size_t slot, std::uint64_t first, std::span<const std::byte> rows, std::size_t count) {
    const ref_type r = ref();
    for (std::size_t l = 0; l < cfg_.layers; ++l)
      for (std::size_t j = 0; j < count; ++j)
        std::memcpy(r.row(slot, first + j, l), rows.data() + (l * count + j) * cfg_.row_bytes, cfg_.row_bytes);
  }
  std::vector<std::byte> bytes_;  // zeroed: rows never written read as zeros through ref()
};

}  // namespace dhisparse
