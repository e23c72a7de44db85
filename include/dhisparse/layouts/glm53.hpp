#pragma once
/// \file
/// GLM-5.3-like layout: 21 index producers announce positions for 78 payload layers (each with
/// its own 576-byte rows); top-k 2048, pages of 64 rows. 15 producers lead groups of four payload
/// layers and 6 lead groups of three, so at most four payload layers are live together and a step
/// makes 21 resolver calls and 57 follower copies.
#include <array>

#include "../layout.hpp"

namespace dhisparse::layouts {

/// GLM-5.3-like layout: 21 index-producer sources of 4 or 3 payload layers (576-byte rows), top-k 2048.
struct glm53 {
  /// k: entries per selection.
  static constexpr std::size_t top_k = 2048;
  /// p: rows per history page.
  static constexpr std::size_t page_rows = 64;
  /// Index-producer sources.
  static constexpr std::size_t producers = 21;
  /// d_KV of every payload layer, in bytes.
  static constexpr std::size_t payload_row_bytes = 576;   // 512 latent + 64 rope, fp8
  /// Indexer key bytes per stored row.
  static constexpr std::size_t index_key_bytes = 132;     // 128 fp8 + fp32 scale per token

  /// Sources 0-14 have 4 payload layers, sources 15-20 have 3.
  static constexpr std::array<source_desc, producers> sources = [] {
    std::array<source_desc, producers> s{};
    for (std::size_t i = 0; i < producers; ++i)
      s[i] = source_desc{payload_row_bytes, 1, i < 15 ? 4u : 3u, index_key_bytes};
    return s;
  }();

  /// Per source: a reindex consumer on payload layer 0, then a follower for each further layer.
  static constexpr std::array<consumer_desc, 78> consumers = [] {
    std::array<consumer_desc, 78> c{};
    std::size_t n = 0;
    for (std::size_t i = 0; i < producers; ++i)
      for (std::size_t l = 0; l < sources[i].payload_layers; ++l)
        c[n++] = consumer_desc{i, l == 0 ? consumer_kind::reindex : consumer_kind::follower, l};
    return c;
  }();
};
static_assert(valid_layout<glm53> && check_layout<glm53>());
static_assert(payload_layer_count<glm53>() == 78 && resolver_calls_per_step<glm53>() == 21 &&
              follower_copies_per_step<glm53>() == 57);

}  // namespace dhisparse::layouts
