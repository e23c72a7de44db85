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

/// Payload layers of a whole step: one row buffer per (source, payload layer) in a step-wide write
/// (`cuda::kv_step_write_view::layer_rows`, `host_hierarchy::append_step`), i.e. `payload_layer_count`.
template <KvLayout L>
inline constexpr std::size_t step_layers = payload_layer_count<L>();

/// Index of payload layer `l` of source `s` among a step's `step_layers<L>` row buffers: sources in
/// layout order, each source's payload layers in order (the prefix sum of payload layers). Out of
/// range arguments give `step_layers<L>` (one past the end), so a constant expression that misuses
/// it fails where it indexes.
template <KvLayout L>
constexpr std::size_t step_layer_index(std::size_t s, std::size_t l) {
  std::size_t base = 0;
  for (std::size_t i = 0; i < std::size(L::sources); ++i) {
    if (i == s) return l < L::sources[i].payload_layers ? base + l : step_layers<L>;
    base += L::sources[i].payload_layers;
  }
  return step_layers<L>;
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
/// "No source / consumer breaks a rule" for the first_faulty_* searches below.
inline constexpr std::size_t no_fault = ~std::size_t{0};

/// Whether every payload layer of source `s` is read by some consumer.
template <KvLayout L>
consteval bool every_payload_layer_read(std::size_t s) {
  for (std::size_t layer = 0; layer < L::sources[s].payload_layers; ++layer) {
    bool read = false;
    for (const auto& c : L::consumers) read = read || (c.source == s && c.payload_layer == layer);
    if (!read) return false;
  }
  return true;
}

/// Index of the first source that breaks a source rule (see source_at_fault), or no_fault.
template <KvLayout L>
consteval std::size_t first_faulty_source() {
  for (std::size_t s = 0; s < std::size(L::sources); ++s) {
    const source_desc d = L::sources[s];
    if (d.row_bytes == 0 || d.row_bytes % 16 != 0 || d.positions_per_row == 0 || d.payload_layers == 0)
      return s;
    if (!every_payload_layer_read<L>(s)) return s;
  }
  return no_fault;
}

/// Index of the first consumer that breaks a consumer rule (see consumer_at_fault), or no_fault.
template <KvLayout L>
consteval std::size_t first_faulty_consumer() {
  std::array<bool, std::size(L::sources)> seen{};
  for (std::size_t i = 0; i < std::size(L::consumers); ++i) {
    const consumer_desc c = L::consumers[i];
    if (c.source >= std::size(L::sources)) return i;
    if (c.payload_layer >= L::sources[c.source].payload_layers) return i;
    if (!seen[c.source] && c.kind != consumer_kind::reindex) return i;
    if (c.kind == consumer_kind::follower && c.payload_layer == 0) return i;
    seen[c.source] = true;
  }
  return no_fault;
}

/// Whether consumer `i` is the first consumer of its source.
template <KvLayout L>
consteval bool first_consumer_of_its_source(std::size_t i) {
  for (std::size_t j = 0; j < i; ++j)
    if (L::consumers[j].source == L::consumers[i].source) return false;
  return true;
}

template <KvLayout L>
consteval bool sources_are_well_formed() { return first_faulty_source<L>() == no_fault; }
template <KvLayout L>
consteval bool consumers_are_well_formed() { return first_faulty_consumer<L>() == no_fault; }

// Instantiated by check_layout<L>() only for the first source (consumer) that breaks a rule, so the
// compiler's "in instantiation of source_at_fault<3, L>" names the index that its static_assert
// message (a literal, so without the index) is about.

/// Source `Source` of layout `L` breaks the rule its failing static_assert states.
template <std::size_t Source, class L>
struct source_at_fault {
  static constexpr source_desc desc = L::sources[Source];
  static_assert(desc.row_bytes != 0 && desc.row_bytes % 16 == 0,
                "dhisparse layout: this source's row_bytes must be > 0 and a multiple of 16 (rows are moved as "
                "16-byte vectors)");
  static_assert(desc.positions_per_row != 0, "dhisparse layout: this source needs positions_per_row >= 1");
  static_assert(desc.payload_layers != 0, "dhisparse layout: this source needs payload_layers >= 1");
  static_assert(every_payload_layer_read<L>(Source),
                "dhisparse layout: a payload layer of this source is read by no consumer (every payload layer "
                "needs a consumer; drop unread layers from payload_layers)");
  static constexpr bool reported = false;
};

/// Consumer `Consumer` of layout `L` breaks the rule its failing static_assert states.
template <std::size_t Consumer, class L>
struct consumer_at_fault {
  static constexpr consumer_desc desc = L::consumers[Consumer];
  static constexpr bool source_exists = desc.source < std::size(L::sources);
  static constexpr bool first_of_source = first_consumer_of_its_source<L>(Consumer);
  static_assert(source_exists, "dhisparse layout: this consumer names a source the layout does not have");
  static_assert(!source_exists || desc.payload_layer < L::sources[desc.source].payload_layers,
                "dhisparse layout: this consumer names a payload layer its source does not have");
  static_assert(!first_of_source || desc.kind == consumer_kind::reindex,
                "dhisparse layout: the first consumer of each source must be a reindex consumer (it produces "
                "the selection)");
  static_assert(desc.kind != consumer_kind::follower || desc.payload_layer != 0,
                "dhisparse layout: a follower consumer cannot read payload layer 0 (layer 0 is the "
                "producer's; a follower reads its own layer >= 1)");
  static constexpr bool reported = false;
};
}  // namespace detail

/// A layout that is internally consistent. Use `static_assert(valid_layout<MyLayout>)` beside a
/// layout; `check_layout<L>()` gives a message naming the broken rule and the source or consumer.
template <class L>
concept valid_layout = KvLayout<L> && (L::top_k > 0) && (L::page_rows > 0) &&
                       detail::sources_are_well_formed<L>() && detail::consumers_are_well_formed<L>();

/// Fails to compile with a message naming the rule a layout breaks; the diagnostic's
/// `source_at_fault<i, L>` or `consumer_at_fault<i, L>` names the index of the source or consumer.
///
/// Rules: top_k and page_rows positive. Every source: row_bytes a positive multiple of 16,
/// positions_per_row >= 1, payload_layers >= 1, and each of its payload layers read by some
/// consumer. Every consumer: names an existing source and payload layer; the first consumer of a
/// source is a reindex consumer; a follower reads a payload layer >= 1 (layer 0 is the producer's).
template <KvLayout L>
consteval bool check_layout() {
  static_assert(L::top_k > 0, "dhisparse layout: top_k must be positive");
  static_assert(L::page_rows > 0, "dhisparse layout: page_rows must be positive");
  constexpr std::size_t source = detail::first_faulty_source<L>();
  if constexpr (source != detail::no_fault)
    static_assert(detail::source_at_fault<source, L>::reported,
                  "dhisparse layout: a source breaks a rule (source_at_fault<index, layout> above names it)");
  constexpr std::size_t consumer = detail::first_faulty_consumer<L>();
  if constexpr (consumer != detail::no_fault)
    static_assert(detail::consumer_at_fault<consumer, L>::reported,
                  "dhisparse layout: a consumer breaks a rule (consumer_at_fault<index, layout> above names it)");
  return true;
}

}  // namespace dhisparse
