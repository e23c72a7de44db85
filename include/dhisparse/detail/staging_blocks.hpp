#pragma once
/// \file
/// Payload memory of `staging_arenas<chi>`, shared by both backends and the planner: the host
/// reference and the CUDA hierarchy place pools and arenas with the same arithmetic, so they
/// return the same locations.
///
/// A stock attention kernel reads location `loc` of payload layer l at `base(l) + loc * row_bytes`
/// with no branch, so every location of layer l must index one buffer, staged rows included. The
/// shared arenas cannot sit inside every source's pool, so payload-layer index l gets one block
/// holding the pools of layer l of every source that has one, and arena l last:
///
///   block l: [ pool(o_{m-1}, l) pad | ... | pool(o_1, l) pad | pool(o_0, l) pad | arena l ]
///
/// Sources are ordered by descending payload-layer count (ties by index): the sources with a layer
/// l are a prefix o_0 .. o_{m-1} of that order, so packing backwards from the arena puts source s's
/// pool the same distance D_s before its arena in every block. D_s is a multiple of s's row bytes
/// and of the alignment, so staging row i of source s is location D_s / row_bytes(s) + i in every
/// payload layer, and every pool start stays aligned. The padding is below lcm(row_bytes, 256)
/// bytes per source and block. Blocks l >= the most payload layers of one source hold only their
/// arena (chi may exceed that count; such arenas are never written).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <span>
#include <vector>

#include "../layout.hpp"

namespace dhisparse::detail {

/// Alignment of every pool and arena start (the CUDA carver's; part of the location encoding,
/// since D_s is rounded to it).
inline constexpr std::uint64_t staging_block_alignment = 256;

/// Where `staging_arenas<chi>` puts every pool and arena (see the file comment).
struct staging_blocks {
  std::vector<std::uint64_t> arena_distance;  ///< [source] D_s: bytes from a pool of s to the arena of its block
  std::vector<std::uint64_t> staging_gap;     ///< [source] rows between the end of s's pool and its first staging location
  std::vector<std::uint64_t> block_offset;    ///< [block] start of block l in the one allocation
  std::vector<std::uint64_t> arena_offset;    ///< [block] start of arena l in the allocation
  std::uint64_t arena_bytes = 0;              ///< one arena, aligned
  std::uint64_t pool_bytes = 0;               ///< pool rows of every payload layer, unpadded
  std::uint64_t total_bytes = 0;              ///< the whole allocation

  /// Start of the pool of payload layer `l` of source `s` in the allocation.
  constexpr std::uint64_t pool_offset(std::size_t s, std::size_t l) const { return arena_offset[l] - arena_distance[s]; }
  /// Bytes beyond the pools' rows and chi arenas of `arena_rows` rows of the widest row: the price of the layout.
  constexpr std::uint64_t padding_bytes(std::uint64_t arena_rows, std::uint64_t widest) const {
    return total_bytes - pool_bytes - arena_offset.size() * arena_rows * widest;
  }
};

/// Sources by descending payload-layer count, ties by index (see the file comment).
constexpr std::vector<std::size_t> staging_block_order(std::span<const source_desc> sources) {
  std::vector<std::size_t> order(sources.size());
  for (std::size_t s = 0; s < order.size(); ++s) order[s] = s;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return sources[a].payload_layers != sources[b].payload_layers ? sources[a].payload_layers > sources[b].payload_layers
                                                                  : a < b;
  });
  return order;
}

/// The layout for pools of `pool_rows` rows (hot caches, tails, optional pages) and `arenas`
/// arenas of `arena_rows` rows of the widest row (N * K_max * k; 0 without speculation).
/// `arenas` is at least the most payload layers of one source (the policies' static check).
constexpr staging_blocks plan_staging_blocks(std::span<const source_desc> sources, std::uint64_t pool_rows,
                                             std::uint64_t arena_rows, std::uint64_t arenas) {
  constexpr std::uint64_t a = staging_block_alignment;
  const auto up = [](std::uint64_t x, std::uint64_t m) { return (x + m - 1) / m * m; };
  staging_blocks b;
  std::uint64_t widest = 0;
  for (const auto& d : sources) widest = std::max<std::uint64_t>(widest, d.row_bytes);
  b.arena_bytes = up(arena_rows * widest, a);
  b.arena_distance.assign(sources.size(), 0);
  b.staging_gap.assign(sources.size(), 0);
  const std::vector<std::size_t> order = staging_block_order(sources);
  std::uint64_t distance = 0;
  for (std::size_t s : order) {
    const std::uint64_t rb = sources[s].row_bytes;
    distance = up(distance + pool_rows * rb, std::lcm(rb, a));
    b.arena_distance[s] = distance;
    b.staging_gap[s] = distance / rb - pool_rows;
    b.pool_bytes += sources[s].payload_layers * pool_rows * rb;
  }
  b.block_offset.assign(arenas, 0);
  b.arena_offset.assign(arenas, 0);
  std::uint64_t at = 0;
  for (std::size_t l = 0; l < arenas; ++l) {
    std::uint64_t span = 0;  // D of the last source with a layer l: the block's pools
    for (std::size_t s : order)
      if (sources[s].payload_layers > l) span = b.arena_distance[s];
    b.block_offset[l] = at;
    b.arena_offset[l] = at + span;
    at += span + b.arena_bytes;
  }
  b.total_bytes = at;
  return b;
}

/// One past the last location of source `s` (its last staging row) under `b`, with `staging_rows`
/// = N * K_max * k staging rows per source; the hierarchies reject a layout where it passes int32.
constexpr std::uint64_t staging_location_end(const staging_blocks& b, std::span<const source_desc> sources,
                                             std::size_t s, std::uint64_t staging_rows) {
  return b.arena_distance[s] / sources[s].row_bytes + staging_rows;
}

}  // namespace dhisparse::detail
