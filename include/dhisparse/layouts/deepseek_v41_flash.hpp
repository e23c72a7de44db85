#pragma once
/// \file
/// DeepSeek-V4.1-Flash-like layout: 8 compressed physical KV sources (288-byte rows, about half of
/// GLM-5.3's, each packing 4 token positions), top-k 512. Each source is read by one reindex
/// consumer (one resolver call) followed by four reuse consumers that inherit its location vector
/// and payload: 8 resolver calls a step and no follower copy. Row size, packing and consumer
/// counts are illustrative values consistent with the paper's ratios, not published constants.
#include <array>

#include "../layout.hpp"

namespace dhisparse::layouts {

/// DeepSeek-V4.1-Flash-like layout: 8 packed sources (288-byte rows, 4 positions each), one reindex and four
/// reuse consumers per source, top-k 512.
struct deepseek_v41_flash {
  /// k: entries per selection.
  static constexpr std::size_t top_k = 512;
  /// p: rows per history page.
  static constexpr std::size_t page_rows = 64;
  /// Physical KV sources, each resolved once a step.
  static constexpr std::size_t resolving_sources = 8;
  /// Reuse consumers after each source's reindex consumer.
  static constexpr std::size_t reuse_per_source = 4;
  /// d_KV: bytes of one packed row.
  static constexpr std::size_t payload_row_bytes = 288;
  /// m: token positions packed into one stored row.
  static constexpr std::size_t positions_per_row = 4;
  /// Indexer key bytes per stored row.
  static constexpr std::size_t index_key_bytes = 132;

  /// Identical packed sources of one payload layer each.
  static constexpr std::array<source_desc, resolving_sources> sources = [] {
    std::array<source_desc, resolving_sources> s{};
    for (auto& x : s) x = source_desc{payload_row_bytes, positions_per_row, 1, index_key_bytes};
    return s;
  }();

  /// Per source: one reindex consumer, then `reuse_per_source` reuse consumers.
  static constexpr std::array<consumer_desc, resolving_sources*(1 + reuse_per_source)> consumers = [] {
    std::array<consumer_desc, resolving_sources*(1 + reuse_per_source)> c{};
    std::size_t n = 0;
    for (std::size_t i = 0; i < resolving_sources; ++i) {
      c[n++] = consumer_desc{i, consumer_kind::reindex, 0};
      for (std::size_t r = 0; r < reuse_per_source; ++r) c[n++] = consumer_desc{i, consumer_kind::reuse, 0};
    }
    return c;
  }();
};
static_assert(valid_layout<deepseek_v41_flash> && check_layout<deepseek_v41_flash>());
static_assert(resolver_calls_per_step<deepseek_v41_flash>() == 8 &&
              follower_copies_per_step<deepseek_v41_flash>() == 0);

}  // namespace dhisparse::layouts
