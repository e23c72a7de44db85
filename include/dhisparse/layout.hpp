#pragma once
/// \file
/// Compile-time description of a model's KV layout: payload sources, the payload layers each one
/// locates, and the consumers (layers) that read them.
///
/// A *source* is one selection stream with one cache state (hot cache, tail, optional history):
/// a GLM-5.3-style index producer together with the follower payload layers it announces
/// positions for (each layer keeps its own bytes, all share the source's locations), or a
/// DeepSeek-V4.1-Flash-style physical KV source read by `reindex` and `reuse` consumers.
/// A *location* is a row index that is valid in every payload layer of its source: layer l of
/// source s stores row `loc` at `layer_base(s, l) + loc * row_bytes(s)`.
#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>

namespace dhisparse {

/// How a consumer layer obtains the locations it attends over.
enum class consumer_kind : std::uint8_t {
  reindex,   ///< fresh top-k over its source: one resolver call, shares the source's cache state
  reuse,     ///< inherits the previous consumer's location vector and payload: no resolver call
  follower,  ///< follows its source's producer selection with its own payload bytes (layer-wise prefetch)
};

/// One payload source (see file comment). All of its payload layers have the same row size.
struct source_desc {
  std::size_t row_bytes = 0;          ///< d_KV: bytes of one stored row in one payload layer
  std::size_t positions_per_row = 1;  ///< m: token positions packed into one stored row
  std::size_t payload_layers = 1;     ///< layers with their own bytes located through this source
  std::size_t index_key_bytes = 0;    ///< indexer key bytes per stored row (stays on the GPU)
};

/// One model layer reading a source.
struct consumer_desc {
  std::size_t source = 0;        ///< index into the layout's sources
  /// How the consumer obtains its locations.
  consumer_kind kind = consumer_kind::reindex;
  std::size_t payload_layer = 0; ///< which payload layer of the source it reads
};

/// Requirements on a layout type: static constexpr `top_k`, `page_rows`, `sources` and `consumers`.
template <class L>
concept KvLayout = requires {
  { L::top_k } -> std::convertible_to<std::size_t>;
  { L::page_rows } -> std::convertible_to<std::size_t>;
  { L::sources[0] } -> std::convertible_to<source_desc>;
  { L::consumers[0] } -> std::convertible_to<consumer_desc>;
  { std::size(L::sources) } -> std::convertible_to<std::size_t>;
  { std::size(L::consumers) } -> std::convertible_to<std::size_t>;
};

/// Number of sources / consumers of a layout.
template <KvLayout L> inline constexpr std::size_t source_count = std::size(L::sources);
template <KvLayout L> inline constexpr std::size_t consumer_count = std::size(L::consumers);

/// Total payload layers of a layout (sum over sources).
template <KvLayout L>
consteval std::size_t payload_layer_count() {
  std::size_t n = 0;
  for (const auto& s : L::sources) n += s.payload_layers;
  return n;
}

/// Most payload layers of any one source: the payload layers a verification of one source keeps
/// live at once (the planner's default chi).
template <KvLayout L>
consteval std::size_t max_payload_layers_per_source() {
  std::size_t n = 0;
  for (const auto& s : L::sources) n = s.payload_layers > n ? s.payload_layers : n;
  return n;
}

/// Widest row of any source (d_KV of a shared staging arena).
template <KvLayout L>
consteval std::size_t widest_row_bytes() {
  std::size_t n = 0;
  for (const auto& s : L::sources) n = s.row_bytes > n ? s.row_bytes : n;
  return n;
}

/// Sum over all payload layers of their row bytes: bytes one stored position-row costs across the model.
template <KvLayout L>
consteval std::size_t payload_bytes_per_row() {
  std::size_t n = 0;
  for (const auto& s : L::sources) n += s.payload_layers * s.row_bytes;
  return n;
}

/// Consumers that call the resolver (reindex), counted per step.
template <KvLayout L>
consteval std::size_t resolver_calls_per_step() {
  std::size_t n = 0;
  for (const auto& c : L::consumers) n += c.kind == consumer_kind::reindex ? 1 : 0;
  return n;
}

/// Consumers that only replay a producer's copy plan with their own bytes.
template <KvLayout L>
consteval std::size_t follower_copies_per_step() {
  std::size_t n = 0;
  for (const auto& c : L::consumers) n += c.kind == consumer_kind::follower ? 1 : 0;
  return n;
}

namespace detail {
template <KvLayout L>
consteval bool sources_are_well_formed() {
  for (const auto& s : L::sources)
    if (s.row_bytes == 0 || s.row_bytes % 16 != 0 || s.positions_per_row == 0 || s.payload_layers == 0)
      return false;
  return true;
}
template <KvLayout L>
consteval bool consumers_are_well_formed() {
  // Every consumer names an existing source and payload layer; a source's first consumer resolves.
  std::array<bool, std::size(L::sources)> seen{};
  for (const auto& c : L::consumers) {
    if (c.source >= std::size(L::sources)) return false;
    if (c.payload_layer >= L::sources[c.source].payload_layers) return false;
    if (!seen[c.source] && c.kind != consumer_kind::reindex) return false;
    seen[c.source] = true;
  }
  return true;
}
}  // namespace detail

/// A layout that is internally consistent. Use `static_assert(valid_layout<MyLayout>)` beside a
/// layout; `check_layout<L>()` gives a message naming the broken rule.
template <class L>
concept valid_layout = KvLayout<L> && (L::top_k > 0) && (L::page_rows > 0) &&
                       detail::sources_are_well_formed<L>() && detail::consumers_are_well_formed<L>();

/// Fails to compile with a message naming the rule a layout breaks.
template <KvLayout L>
consteval bool check_layout() {
  static_assert(L::top_k > 0, "dhisparse layout: top_k must be positive");
  static_assert(L::page_rows > 0, "dhisparse layout: page_rows must be positive");
  static_assert(detail::sources_are_well_formed<L>(),
                "dhisparse layout: every source needs row_bytes > 0 and a multiple of 16 (rows are moved "
                "as 16-byte vectors), positions_per_row >= 1 and payload_layers >= 1");
  static_assert(detail::consumers_are_well_formed<L>(),
                "dhisparse layout: every consumer must name an existing source and payload layer, and the "
                "first consumer of each source must be a reindex consumer (it produces the selection)");
  return true;
}

}  // namespace dhisparse
