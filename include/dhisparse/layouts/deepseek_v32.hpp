#pragma once
/// \file
/// DeepSeek-V3.2-like layout: 61 layers, each with its own lightning indexer, so 61 reindex
/// sources of one payload layer each (656-byte rows: 512 fp8 latent + 4 fp32 scales + 64 bf16
/// rope), top-k 2048, pages of 64 rows. A step makes 61 resolver calls and no follower copy; it is
/// the many-sources case of the write path (61 sources to append to every step).
#include <array>

#include "../layout.hpp"

namespace dhisparse::layouts {

/// DeepSeek-V3.2-like layout: 61 sources of one 656-byte payload layer each, one reindex consumer per
/// source, top-k 2048.
struct deepseek_v32 {
  /// k: entries per selection.
  static constexpr std::size_t top_k = 2048;
  /// p: rows per history page.
  static constexpr std::size_t page_rows = 64;
  /// Layers, each its own index producer and payload source.
  static constexpr std::size_t layers = 61;
  /// d_KV of every payload layer, in bytes.
  static constexpr std::size_t payload_row_bytes = 656;
  /// Indexer key bytes per stored row.
  static constexpr std::size_t index_key_bytes = 132;  // 128 fp8 + fp32 scale per token

  /// One source per layer, one payload layer each.
  static constexpr std::array<source_desc, layers> sources = [] {
    std::array<source_desc, layers> s{};
    for (auto& x : s) x = source_desc{payload_row_bytes, 1, 1, index_key_bytes};
    return s;
  }();

  /// One reindex consumer per source.
  static constexpr std::array<consumer_desc, layers> consumers = [] {
    std::array<consumer_desc, layers> c{};
    for (std::size_t i = 0; i < layers; ++i) c[i] = consumer_desc{i, consumer_kind::reindex, 0};
    return c;
  }();
};
static_assert(valid_layout<deepseek_v32> && check_layout<deepseek_v32>());
static_assert(payload_layer_count<deepseek_v32>() == 61 && resolver_calls_per_step<deepseek_v32>() == 61 &&
              follower_copies_per_step<deepseek_v32>() == 0);

}  // namespace dhisparse::layouts
