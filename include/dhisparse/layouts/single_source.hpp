#pragma once
/// \file
/// A ready layout for resolve-only use: one source of `RowBytes`-byte rows in one payload layer,
/// read by one reindex consumer. For an engine that already has its selections on the GPU (its
/// own indexer writes top-k row indices per request) and only wants each selected row's location
/// in a GPU pool (docs/integration.md; examples/resolve_device_selections.cu):
///
///     using L = dhisparse::layouts::single_source<656, 2048>;
///     dhisparse::cuda::hierarchy<L, dhisparse::lru_hot_cache<4096>> h(cfg, stream);
///     h.resolve(0, batch_view_over_engine_buffers, stream);
#include <array>
#include <cstddef>

#include "../layout.hpp"

namespace dhisparse::layouts {

/// One source (`RowBytes` bytes per row, a multiple of 16; `PositionsPerRow` token positions per
/// stored row; one payload layer; no index keys kept) and one reindex consumer on it; selections
/// of at most `TopK` rows; history pages of `PageRows` rows.
template <std::size_t RowBytes, std::size_t TopK, std::size_t PageRows = 64, std::size_t PositionsPerRow = 1>
struct single_source {
  /// k: entries per selection.
  static constexpr std::size_t top_k = TopK;
  /// p: rows per history page.
  static constexpr std::size_t page_rows = PageRows;
  /// The one source.
  static constexpr std::array<source_desc, 1> sources{{{RowBytes, PositionsPerRow, 1, 0}}};
  /// The one consumer: a reindex on payload layer 0 (each resolve call serves it).
  static constexpr std::array<consumer_desc, 1> consumers{{{0, consumer_kind::reindex, 0}}};
};

}  // namespace dhisparse::layouts
