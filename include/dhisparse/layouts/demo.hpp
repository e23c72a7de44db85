#pragma once
/// \file
/// A GLM-5.3-shaped layout scaled down for a quick run (examples/decode_demo.cpp): 3 index
/// producers announce positions for 10 payload layers (4 + 3 + 3, each with its own 576-byte rows,
/// 512 latent + 64 rope as in GLM-5.3), top-k 256, pages of 64 rows, 132-byte index keys. A step
/// makes 3 resolver calls and 7 follower copies (layer-wise prefetch), as GLM-5.3 makes 21 and 57.
#include <array>

#include "../layout.hpp"

namespace dhisparse::layouts {

/// Scaled-down GLM-5.3 shape for the decode demo: 3 sources with 4 + 3 + 3 payload layers, top-k 256.
struct demo {
  /// k: entries per selection.
  static constexpr std::size_t top_k = 256;
  /// p: rows per history page.
  static constexpr std::size_t page_rows = 64;
  /// Index-producer sources.
  static constexpr std::size_t producers = 3;
  /// d_KV of every payload layer, in bytes.
  static constexpr std::size_t payload_row_bytes = 576;  // as GLM-5.3: 512 latent + 64 rope, fp8
  /// Indexer key bytes per stored row.
  static constexpr std::size_t index_key_bytes = 132;    // as GLM-5.3: 128 fp8 + fp32 scale

  /// Three sources of 4, 3 and 3 payload layers.
  static constexpr std::array<source_desc, producers> sources{{
      {payload_row_bytes, 1, 4, index_key_bytes},
      {payload_row_bytes, 1, 3, index_key_bytes},
      {payload_row_bytes, 1, 3, index_key_bytes},
  }};

  /// Per source: a reindex consumer on payload layer 0, then a follower for each further layer.
  static constexpr std::array<consumer_desc, 10> consumers = [] {
    std::array<consumer_desc, 10> c{};
    std::size_t n = 0;
    for (std::size_t i = 0; i < producers; ++i)
      for (std::size_t l = 0; l < sources[i].payload_layers; ++l)
        c[n++] = consumer_desc{i, l == 0 ? consumer_kind::reindex : consumer_kind::follower, l};
    return c;
  }();
};
static_assert(valid_layout<demo> && check_layout<demo>());
static_assert(payload_layer_count<demo>() == 10 && resolver_calls_per_step<demo>() == 3 &&
              follower_copies_per_step<demo>() == 7);

}  // namespace dhisparse::layouts
