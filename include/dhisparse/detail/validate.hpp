#pragma once
/// \file
/// Selection validation shared by both backends: the host reference and the CUDA kernel reject
/// exactly the same inputs with the same error category.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "../errors.hpp"
#include "../types.hpp"
#include "config.hpp"

namespace dhisparse::detail {

/// A source's follower layers must have replayed the last plan before its cache state moves on:
/// throws pending_follower_copies naming the first layer still pending (`call` says what waited).
inline void check_followers_copied(const std::vector<bool>& pending, std::size_t source, const char* call) {
  for (std::size_t l = 0; l < pending.size(); ++l)
    if (pending[l])
      throw pending_follower_copies("source " + std::to_string(source) + " " + call + " before payload layer " +
                                    std::to_string(l) + " copied the previous plan");
}

/// Category of one selection entry against a request's state; `no_error` when acceptable.
enum class entry_check : std::uint8_t { ok, out_of_range, beyond_frontier };

DHISPARSE_HD constexpr entry_check check_entry(row_index e, std::int64_t frontier, std::int64_t max_rows) {
  if (e == no_row) return entry_check::ok;
  if (e < 0 || e >= max_rows) return entry_check::out_of_range;
  if (e >= frontier) return entry_check::beyond_frontier;
  return entry_check::ok;
}

/// Throws the typed error for the first bad entry of `selection`, naming request and position.
inline void validate_selection(std::span<const row_index> selection, std::size_t top_k, std::int64_t frontier,
                               std::int64_t max_rows, request_id id, std::size_t source) {
  if (selection.size() > top_k)
    throw selection_too_long("selection of request " + std::to_string(id) + " on source " + std::to_string(source) +
                             " has " + std::to_string(selection.size()) + " entries, top_k is " + std::to_string(top_k));
  for (std::size_t i = 0; i < selection.size(); ++i) {
    switch (check_entry(selection[i], frontier, max_rows)) {
      case entry_check::ok: break;
      case entry_check::out_of_range:
        throw position_out_of_range("selection entry " + std::to_string(i) + " of request " + std::to_string(id) +
                                    " on source " + std::to_string(source) + " is row " + std::to_string(selection[i]) +
                                    ", outside [0, " + std::to_string(max_rows) + ") and not -1");
      case entry_check::beyond_frontier:
        throw position_beyond_frontier("selection entry " + std::to_string(i) + " of request " + std::to_string(id) +
                                       " on source " + std::to_string(source) + " is row " +
                                       std::to_string(selection[i]) + ", but only " + std::to_string(frontier) +
                                       " rows exist");
    }
  }
}

/// Throws the typed error for a speculative block of `count` positions staged on a request/source
/// with n committed positions, m per stored row: at least the anchor, at most `max_block`, and the
/// last position inside `max_rows` rows (n + count <= max_rows * m).
inline void validate_block(std::size_t count, std::size_t max_block, std::int64_t n, std::int64_t m,
                           std::size_t max_rows, request_id id, std::size_t source) {
  const std::string who = "stage_block of request " + std::to_string(id) + " on source " + std::to_string(source);
  if (count == 0) throw size_mismatch(who + " with no rows (a block holds at least the anchor)");
  if (count > max_block)
    throw block_too_wide(who + " with " + std::to_string(count) + " rows, max_block is " + std::to_string(max_block));
  if (count > static_cast<std::size_t>(static_cast<std::int64_t>(max_rows) * m - n))
    throw capacity_exceeded(who + ": positions " + std::to_string(n) + " .. " +
                            std::to_string(n + static_cast<std::int64_t>(count) - 1) + " exceed the capacity of " +
                            std::to_string(max_rows) + " rows of " + std::to_string(m) + " positions");
}

}  // namespace dhisparse::detail
