#pragma once
/// \file
/// Vocabulary types shared by both backends.
#include <cstddef>
#include <cstdint>

namespace dhisparse {

/// The engine's identifier of a request.
using request_id = std::uint64_t;
/// The engine's identifier of a retained prefix (a hash of its tokens, say); see docs/prefixes.md.
using prefix_id = std::uint64_t;
/// A stored-row index in a request's history for one source (the indexer's selection entries).
using row_index = std::int32_t;
/// A row index into a source's GPU payload pool; valid in every payload layer of that source.
using location = std::int32_t;

/// Selection padding and "no row" location (FlashMLA's convention).
inline constexpr row_index no_row = -1;
inline constexpr location no_location = -1;

/// Where the entries of one resolver call were found. Counts are per selection entry except
/// `rows_copied` and `bytes_copied`, which count distinct rows recovered from host.
struct resolve_stats {
  std::size_t selected = 0;     ///< entries other than -1
  std::size_t direct = 0;       ///< entries located in the tail or the ready optional-history map
  std::size_t hot = 0;          ///< entries whose row was already in the hot cache
  std::size_t host = 0;         ///< entries whose row was recovered from host memory by this call
  std::size_t rows_copied = 0;  ///< distinct rows copied from host
  std::size_t bytes_copied = 0; ///< bytes copied from host over every payload layer materialised

  /// Adds `o`'s counts field by field.
  constexpr resolve_stats& operator+=(const resolve_stats& o) {
    selected += o.selected; direct += o.direct; hot += o.hot; host += o.host;
    rows_copied += o.rows_copied; bytes_copied += o.bytes_copied;
    return *this;
  }
  /// True when every count is equal.
  friend constexpr bool operator==(const resolve_stats&, const resolve_stats&) = default;
};

}  // namespace dhisparse
