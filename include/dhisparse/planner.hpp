#pragma once
/// \file
/// Memory planner: the GPU and host bytes one session (request) needs under resident serving and
/// under the Adaptive DHiSparse hierarchy, with or without a drafter, for a model layout.
///
/// Pure C++20, no CUDA and no I/O; every function is `constexpr`, so a plan can be checked in a
/// `static_assert`. The formulas follow the paper (Section 3 and Table 1); `docs/memory-planner.md`
/// explains each term, and the end of this file checks the paper's GLM-5.3 figures at compile time.
///
///   stored rows      = ceil(context / m)
///   history rows     = ceil(stored rows / p) * p                       (whole pages)
///   resident         = history rows * (payload B/row + index-key B/row)  [+ draft ring]
///   hierarchical     = history rows * index-key B/row + (B + tail rows) * payload B/row
///                                                                      [+ draft ring + staging]
///   R_d              = p_d * ceil((W + K_max + p_d - 1) / p_d);  draft ring = R_d * draft B/row
///   staging          = chi * K_max * k * d_KV                          (per session; N times per GPU)
#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <numeric>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include "detail/staging_blocks.hpp"
#include "errors.hpp"
#include "hierarchy_types.hpp"
#include "host/residency_manager.hpp"
#include "layout.hpp"
#include "policies/draft_ring.hpp"
#include "layouts/deepseek_v41_flash.hpp"
#include "layouts/glm53.hpp"

namespace dhisparse {

// ---------------------------------------------------------------------------------------------
// Units
// ---------------------------------------------------------------------------------------------

/// Bytes in one GiB (2^30); every GiB figure of the planner and the paper uses it.
inline constexpr std::uint64_t bytes_per_gib = std::uint64_t{1} << 30;

/// `bytes` in GiB rounded half-up to `decimals` places, as an integer count of 10^-decimals GiB:
/// `gib_rounded(bytes, 3) == 432` means "0.432 GiB". Exact integer arithmetic (no overflow for
/// any 64-bit byte count and decimals <= 6), so it can be compared in a `static_assert`.
constexpr std::uint64_t gib_rounded(std::uint64_t bytes, unsigned decimals) {
  std::uint64_t scale = 1;
  for (unsigned i = 0; i < decimals; ++i) scale *= 10;
  const std::uint64_t whole = bytes / bytes_per_gib;
  const std::uint64_t rest = bytes % bytes_per_gib;
  return whole * scale + (rest * scale + bytes_per_gib / 2) / bytes_per_gib;
}

/// `bytes` in GiB as a floating-point value (for printing).
constexpr double to_gib(std::uint64_t bytes) {
  return static_cast<double>(bytes) / static_cast<double>(bytes_per_gib);
}

/// Error thrown by `plan()` for inputs that describe no valid configuration: the library's typed
/// `invalid_configuration` error.
using planner_error = invalid_configuration;

// ---------------------------------------------------------------------------------------------
// Model shape
// ---------------------------------------------------------------------------------------------

/// The numbers of a KV layout that memory depends on (derive it with `shape_of<Layout>()`).
struct model_shape {
  std::uint64_t payload_bytes_per_row = 0;    ///< one stored row in every payload layer: sum of layers * d_KV
  std::uint64_t index_key_bytes_per_row = 0;  ///< indexer keys of one stored row, summed over sources
  std::uint64_t positions_per_row = 1;        ///< m: token positions packed into one stored row
  std::uint64_t page_rows = 0;                ///< p: rows per page of history
  std::uint64_t top_k = 0;                    ///< k: rows one query selects per source
  std::uint64_t payload_layers = 0;           ///< payload layers over all sources
  std::uint64_t sources = 0;                  ///< resolver sources (index producers / physical KV sources)
  std::uint64_t max_live_payload_layers = 0;  ///< payload layers live together: the largest source's layer count
  std::uint64_t widest_row_bytes = 0;         ///< d_KV of the widest source: bytes of one row of one payload layer

  /// True when every field is equal.
  friend constexpr bool operator==(const model_shape&, const model_shape&) = default;
};

namespace detail {
template <KvLayout L>
consteval bool sources_share_one_packing() {
  for (const auto& s : L::sources)
    if (s.positions_per_row != L::sources[0].positions_per_row) return false;
  return true;
}
}  // namespace detail

// ---------------------------------------------------------------------------------------------
// Run-time layout description
// ---------------------------------------------------------------------------------------------

/// A KV layout described at run time (what a `KvLayout` type states at compile time): the planner's
/// input for layouts read from a file. Non-owning: the spans must outlive the description.
struct layout_desc {
  std::size_t top_k = 0;                     ///< k: entries one selection holds at most
  std::size_t page_rows = 0;                 ///< p: rows per history page
  std::span<const source_desc> sources;      ///< payload sources, in order
  std::span<const consumer_desc> consumers;  ///< consumer layers, in order
};

/// The run-time description of compile-time layout `L` (spans over `L::sources` and `L::consumers`).
template <KvLayout L>
constexpr layout_desc describe_layout() {
  return {L::top_k, L::page_rows, std::span<const source_desc>(L::sources),
          std::span<const consumer_desc>(L::consumers)};
}

/// The first rule a run-time layout breaks: `what` is empty when it breaks none; `part` and
/// `index` name the source or consumer at fault, `value` the offending number.
struct layout_issue {
  /// Which part of the layout is at fault.
  enum class part_kind : std::uint8_t { layout, source, consumer };
  part_kind part = part_kind::layout;
  std::size_t index = 0;   ///< source or consumer index (unused for the layout as a whole)
  std::uint64_t value = 0;  ///< the offending value
  std::string_view what;   ///< the rule, in words; empty when the layout is valid

  /// True when the layout breaks a rule.
  constexpr explicit operator bool() const { return !what.empty(); }
};

/// Checks a run-time layout against the rules `check_layout` states for compile-time layouts, plus
/// the planner's (one positions_per_row for every source) and two that catch layouts that cannot
/// be meant (a payload layer no consumer reads; a follower on payload layer 0, which its source's
/// resolving consumer already reads).
constexpr layout_issue find_layout_issue(const layout_desc& l) {
  using pk = layout_issue::part_kind;
  if (l.top_k == 0) return {pk::layout, 0, 0, "top_k must be at least 1"};
  if (l.page_rows == 0) return {pk::layout, 0, 0, "page_rows must be at least 1"};
  if (l.sources.empty()) return {pk::layout, 0, 0, "needs at least one source"};
  for (std::size_t s = 0; s < l.sources.size(); ++s) {
    const source_desc& d = l.sources[s];
    if (d.row_bytes == 0 || d.row_bytes % 16 != 0)
      return {pk::source, s, d.row_bytes,
              "row_bytes must be positive and a multiple of 16 (rows are moved as 16-byte vectors)"};
    if (d.positions_per_row == 0) return {pk::source, s, 0, "positions_per_row must be at least 1"};
    if (d.payload_layers == 0) return {pk::source, s, 0, "payload_layers must be at least 1"};
    if (d.positions_per_row != l.sources[0].positions_per_row)
      return {pk::source, s, d.positions_per_row,
              "positions_per_row differs from source 0's (the planner assumes one m for the whole layout)"};
  }
  for (std::size_t c = 0; c < l.consumers.size(); ++c) {
    const consumer_desc& d = l.consumers[c];
    if (d.source >= l.sources.size()) return {pk::consumer, c, d.source, "names a source outside the layout"};
    if (d.payload_layer >= l.sources[d.source].payload_layers)
      return {pk::consumer, c, d.payload_layer, "names a payload layer outside its source"};
    if (d.kind == consumer_kind::follower && d.payload_layer == 0)
      return {pk::consumer, c, 0,
              "is a follower on payload layer 0 (its source's resolving consumer reads layer 0; a follower "
              "copies the producer's rows into a further layer)"};
    bool first_of_source = true;
    for (std::size_t e = 0; e < c; ++e) first_of_source = first_of_source && l.consumers[e].source != d.source;
    if (first_of_source && d.kind != consumer_kind::reindex)
      return {pk::consumer, c, d.source, "is the first consumer of its source and must be reindex (it produces the selection)"};
  }
  for (std::size_t s = 0; s < l.sources.size(); ++s)
    for (std::size_t layer = 0; layer < l.sources[s].payload_layers; ++layer) {
      bool read = false;
      for (const consumer_desc& d : l.consumers) read = read || (d.source == s && d.payload_layer == layer);
      if (!read) return {pk::source, s, layer, "has a payload layer that no consumer reads"};
    }
  return {};
}

/// `issue` as one line naming the source or consumer at fault ("layout: source 3: row_bytes ... (got 650)").
inline std::string describe(const layout_issue& issue) {
  std::string where = "layout";
  if (issue.part == layout_issue::part_kind::source) where += ": source " + std::to_string(issue.index);
  if (issue.part == layout_issue::part_kind::consumer) where += ": consumer " + std::to_string(issue.index);
  std::string line = where + ": " + std::string(issue.what);
  if (issue.part != layout_issue::part_kind::layout) line += " (value " + std::to_string(issue.value) + ")";
  return line;
}

/// Error thrown by the planner for an input that cannot work; `field()` names the input at fault
/// ("gpu_bytes", "layout", ...), `what()` says why.
class planner_input_error : public planner_error {
 public:
  /// An error about input `field`.
  planner_input_error(std::string field, const std::string& what)
      : planner_error("planner: " + field + ": " + what), field_(std::move(field)) {}
  /// The input at fault.
  [[nodiscard]] const std::string& field() const noexcept { return field_; }

 private:
  std::string field_;
};

/// The planner's view of a run-time layout; throws `planner_input_error` (field "layout") naming the
/// source or consumer at fault when the layout breaks a rule of `find_layout_issue`.
constexpr model_shape shape_of(const layout_desc& l) {
  if (const layout_issue issue = find_layout_issue(l)) throw planner_input_error("layout", describe(issue));
  model_shape m;
  m.positions_per_row = l.sources[0].positions_per_row;
  m.page_rows = l.page_rows;
  m.top_k = l.top_k;
  m.sources = l.sources.size();
  for (const source_desc& d : l.sources) {
    m.payload_bytes_per_row += d.payload_layers * d.row_bytes;
    m.index_key_bytes_per_row += d.index_key_bytes;
    m.payload_layers += d.payload_layers;
    m.max_live_payload_layers = std::max<std::uint64_t>(m.max_live_payload_layers, d.payload_layers);
    m.widest_row_bytes = std::max<std::uint64_t>(m.widest_row_bytes, d.row_bytes);
  }
  return m;
}

/// The planner's view of layout `L`. All sources must pack the same m positions per row.
template <KvLayout L>
constexpr model_shape shape_of() {
  static_assert(detail::sources_share_one_packing<L>(),
                "dhisparse planner: every source of the layout must pack the same number of token positions "
                "per stored row (positions_per_row, m); the planner assumes one m for the whole layout");
  return shape_of(describe_layout<L>());
}

/// A model shape with the name the command line and documents use for it.
struct named_model {
  /// Name used on the command line and in documents ("glm-5.3", ...).
  std::string_view name;
  /// The model's memory-relevant numbers.
  model_shape shape;
};

/// Models known by name: the ready-made layouts in `dhisparse::layouts`.
inline constexpr std::array known_models{
    named_model{"glm-5.3", shape_of<layouts::glm53>()},
    named_model{"deepseek-v4.1-flash", shape_of<layouts::deepseek_v41_flash>()},
};

/// The shape of a known model ("glm-5.3", "deepseek-v4.1-flash"), or nullopt.
constexpr std::optional<model_shape> model_shape_by_name(std::string_view name) {
  for (const auto& m : known_models)
    if (m.name == name) return m.shape;
  return std::nullopt;
}

// ---------------------------------------------------------------------------------------------
// Drafter shape
// ---------------------------------------------------------------------------------------------

/// A draft model's KV footprint: it reads at most `window` prior positions and proposes blocks of at
/// most `max_block` target queries (anchor included); its KV lives in a ring of pages of `page_rows`.
struct drafter_shape {
  std::uint64_t window = 0;           ///< W: prior positions the drafter reads
  std::uint64_t max_block = 0;        ///< K_max: widest verification block (target queries per round)
  std::uint64_t page_rows = 0;        ///< p of the draft ring
  std::uint64_t draft_row_bytes = 0;  ///< bytes of one draft position over all draft layers' K and V
  /// Preset name ("none", "dflash2", "dspark"); what `drafter_by_name` matches.
  std::string_view name = "none";

  /// False for `drafters::none` (no speculation: no ring, no staging).
  constexpr bool present() const { return max_block > 0; }

  /// True when every field is equal.
  friend constexpr bool operator==(const drafter_shape&, const drafter_shape&) = default;
};

namespace drafters {
/// No speculative decoding.
inline constexpr drafter_shape none{};

/// DFlash2 on GLM-5.3 as evaluated in the paper: W = 2048, K_max = 8, p = 64, six draft layers with
/// a K and a V allocation of 1024 bytes each (twelve allocations, 12,288 bytes per draft row).
inline constexpr std::uint64_t dflash2_draft_layers = 6;
/// Allocations per DFlash2 draft layer: K and V.
inline constexpr std::uint64_t dflash2_allocations_per_layer = 2;  // K and V
/// Bytes of one draft position in one DFlash2 allocation.
inline constexpr std::uint64_t dflash2_allocation_row_bytes = 1024;
/// The DFlash2 preset: W = 2048, K_max = 8, p = 64, 12,288 bytes per draft row.
inline constexpr drafter_shape dflash2{
    .window = 2048,
    .max_block = 8,
    .page_rows = 64,
    .draft_row_bytes = dflash2_draft_layers * dflash2_allocations_per_layer * dflash2_allocation_row_bytes,
    .name = "dflash2",
};

/// DSpark (variable K_r per request and round; K_max bounds it). ILLUSTRATIVE values: the paper
/// does not publish DSpark's window or draft row size; W = 1024, K_max = 8, p = 64 and 4096 bytes
/// per draft row only show the planner's arithmetic for a smaller drafter.
inline constexpr drafter_shape dspark{
    .window = 1024,
    .max_block = 8,
    .page_rows = 64,
    .draft_row_bytes = 4096,
    .name = "dspark",
};

/// Drafters known by name.
inline constexpr std::array all{none, dflash2, dspark};
}  // namespace drafters

/// The drafter preset called `name` ("none", "dflash2", "dspark"), or nullopt.
constexpr std::optional<drafter_shape> drafter_by_name(std::string_view name) {
  for (const auto& d : drafters::all)
    if (d.name == name) return d;
  return std::nullopt;
}

// ---------------------------------------------------------------------------------------------
// Plan inputs and result
// ---------------------------------------------------------------------------------------------

/// Hot-cache rows B per source that the paper evaluates.
inline constexpr std::uint64_t default_hot_rows = 4096;
/// Request slots N per GPU that the paper's ring and staging totals use.
inline constexpr std::uint64_t default_slots = 35;

/// What to plan for. Unset optionals take the defaults documented on each member.
struct plan_inputs {
  std::uint64_t context_tokens = 0;               ///< token positions of the session's history
  std::uint64_t hot_rows = default_hot_rows;      ///< B: hot-cache rows per source (>= top_k)
  std::optional<std::uint64_t> tail_rows{};       ///< mutable tail rows per source; default one page (p)
  drafter_shape drafter = drafters::none;         ///< draft model, or drafters::none
  std::uint64_t slots = default_slots;            ///< N: request slots per GPU (ring and staging totals)
  std::optional<std::uint64_t> pool_bytes{};      ///< GPU bytes available for sessions; unset: no fit count
  std::optional<std::uint64_t> staging_arenas{};  ///< chi: default max payload layers live together
};

/// Every memory term of one session, in bytes, plus the per-GPU totals for `slots` request slots.
struct session_plan {
  // Rows and counts the terms are built from.
  std::uint64_t stored_rows = 0;     ///< ceil(context / m)
  std::uint64_t history_rows = 0;    ///< stored rows rounded up to whole pages
  std::uint64_t history_pages = 0;   ///< history_rows / p
  std::uint64_t hot_rows = 0;        ///< B
  std::uint64_t tail_rows = 0;       ///< rows of the mutable tail
  std::uint64_t staging_arenas = 0;  ///< chi
  std::uint64_t slots = 0;           ///< N
  std::uint64_t ring_rows = 0;       ///< R_d (0 without a drafter)

  // Per-session GPU terms of the hierarchy.
  std::uint64_t index_keys = 0;  ///< indexer keys of the whole history (stay on the GPU)
  std::uint64_t hot_cache = 0;   ///< B rows in every payload layer
  std::uint64_t tail = 0;        ///< tail rows in every payload layer
  std::uint64_t draft_ring = 0;  ///< R_d * draft row bytes
  std::uint64_t staging = 0;     ///< chi * K_max * k * d_KV (0 without a drafter)

  // Metadata: reported separately, not part of the paper's per-session figures or the totals.
  std::uint64_t metadata_hot_cache_map = 0;  ///< per source and hot row: slot row (int32) + LRU order (uint16)
  std::uint64_t metadata_page_table = 0;     ///< per source and history page: optional-history and host page (2 x int32)
  std::uint64_t metadata_reverse_map = 0;    ///< per source and history row: hot way holding it (uint16, CUDA backend)
  std::uint64_t metadata = 0;                ///< sum of the three above

  // Totals per session.
  std::uint64_t hierarchical_total = 0;  ///< index_keys + hot_cache + tail + draft_ring + staging
  std::uint64_t resident_total = 0;      ///< whole page-rounded history (payload + index keys) + draft_ring
  std::uint64_t host_per_session = 0;    ///< pinned host copy of the history: history rows * payload B/row

  // Per-GPU totals for `slots` request slots.
  std::uint64_t ring_bytes_for_slots = 0;     ///< N * draft_ring
  std::uint64_t staging_bytes_for_slots = 0;  ///< M_stage = N * staging

  // Sessions that fit in `pool_bytes` (unset when no pool was given).
  /// Whole sessions of resident_total bytes that fit in `pool_bytes` (unset without one).
  std::optional<std::uint64_t> resident_sessions_in_pool{};
  /// Whole sessions of hierarchical_total bytes that fit in `pool_bytes` (unset without one).
  std::optional<std::uint64_t> hierarchical_sessions_in_pool{};

  /// resident_total / hierarchical_total.
  double resident_per_hierarchical = 0.0;
};

/// Ring rows per request slot: R_d = p * ceil((W + K_max + p - 1) / p). Two live draft positions of
/// one request differ by less than R_d, so they never share a row; 0 for `drafters::none`.
constexpr std::uint64_t draft_ring_rows(const drafter_shape& d) {
  if (!d.present() || d.page_rows == 0) return 0;
  return dhisparse::draft_ring_rows(d.window, d.max_block, d.page_rows);
}

/// Whole sessions of `per_session` bytes that fit in `pool` bytes.
constexpr std::uint64_t sessions_that_fit(std::uint64_t pool, std::uint64_t per_session) {
  return per_session == 0 ? 0 : pool / per_session;
}

/// Why `inputs` describe no valid configuration for `model`, or an empty view when they are valid.
constexpr std::string_view plan_input_problem(const model_shape& model, const plan_inputs& inputs) {
  if (model.page_rows == 0 || model.positions_per_row == 0 || model.top_k == 0 || model.payload_layers == 0)
    return "planner: model shape needs page_rows, positions_per_row, top_k and payload_layers >= 1";
  if (inputs.hot_rows < model.top_k)
    return "planner: hot rows B must be at least the layout's top_k (the hot cache must hold one "
           "whole selection)";
  if (inputs.tail_rows && *inputs.tail_rows == 0)
    return "planner: the tail needs at least one row";
  if (inputs.slots == 0) return "planner: slots N must be at least 1";
  if (inputs.staging_arenas &&
      (*inputs.staging_arenas == 0 || *inputs.staging_arenas > model.payload_layers))
    return "planner: staging arenas chi must be between 1 and the layout's payload layer count";
  if (inputs.drafter.present()) {
    if (inputs.drafter.page_rows == 0 || inputs.drafter.draft_row_bytes == 0)
      return "planner: a drafter needs page_rows >= 1 and draft_row_bytes >= 1";
    const std::uint64_t tail_positions =
        inputs.tail_rows.value_or(model.page_rows) * model.positions_per_row;
    if (tail_positions < inputs.drafter.max_block)
      return "planner: the tail must hold the drafter's widest block (tail rows * m >= K_max)";
  }
  return {};
}

namespace detail {
/// Unsigned 64-bit arithmetic that records overflow instead of wrapping.
struct checked_bytes {
  bool overflowed = false;
  constexpr std::uint64_t mul(std::uint64_t a, std::uint64_t b) {
    if (b != 0 && a > std::numeric_limits<std::uint64_t>::max() / b) {
      overflowed = true;
      return 0;
    }
    return a * b;
  }
  constexpr std::uint64_t add(std::uint64_t a, std::uint64_t b) {
    if (a > std::numeric_limits<std::uint64_t>::max() - b) {
      overflowed = true;
      return 0;
    }
    return a + b;
  }
};
constexpr std::uint64_t ceil_div(std::uint64_t a, std::uint64_t b) { return a / b + (a % b != 0 ? 1 : 0); }
}  // namespace detail

/// Bytes of a hot-cache slot row entry and of its LRU order entry, per source and hot row.
inline constexpr std::uint64_t hot_slot_entry_bytes = sizeof(std::int32_t);
inline constexpr std::uint64_t lru_order_entry_bytes = sizeof(std::uint16_t);
/// Bytes of one page-table entry (optional-history page, host page), per source and page.
inline constexpr std::uint64_t page_table_entry_bytes = sizeof(std::int32_t);
/// Bytes of one reverse-map entry (hot way of a row, CUDA backend), per source and history row.
inline constexpr std::uint64_t reverse_map_entry_bytes = sizeof(std::uint16_t);

/// Plans one session of `model` under `inputs`. Throws `planner_error` for invalid inputs or when a
/// byte count would not fit in 64 bits.
constexpr session_plan plan(const model_shape& model, const plan_inputs& inputs) {
  if (const auto problem = plan_input_problem(model, inputs); !problem.empty())
    throw planner_error(std::string(problem));

  detail::checked_bytes c;
  const drafter_shape& drafter = inputs.drafter;
  session_plan r;
  r.hot_rows = inputs.hot_rows;
  r.tail_rows = inputs.tail_rows.value_or(model.page_rows);
  r.staging_arenas = inputs.staging_arenas.value_or(model.max_live_payload_layers);
  r.slots = inputs.slots;

  r.stored_rows = detail::ceil_div(inputs.context_tokens, model.positions_per_row);
  r.history_pages = detail::ceil_div(r.stored_rows, model.page_rows);
  r.history_rows = c.mul(r.history_pages, model.page_rows);

  r.index_keys = c.mul(r.history_rows, model.index_key_bytes_per_row);
  r.hot_cache = c.mul(r.hot_rows, model.payload_bytes_per_row);
  r.tail = c.mul(r.tail_rows, model.payload_bytes_per_row);
  r.ring_rows = draft_ring_rows(drafter);
  r.draft_ring = c.mul(r.ring_rows, drafter.draft_row_bytes);
  r.staging = drafter.present()
                  ? c.mul(c.mul(c.mul(r.staging_arenas, drafter.max_block), model.top_k), model.widest_row_bytes)
                  : 0;

  r.metadata_hot_cache_map =
      c.mul(c.mul(model.sources, r.hot_rows), hot_slot_entry_bytes + lru_order_entry_bytes);
  r.metadata_page_table = c.mul(c.mul(model.sources, r.history_pages), 2 * page_table_entry_bytes);
  r.metadata_reverse_map = c.mul(c.mul(model.sources, r.history_rows), reverse_map_entry_bytes);
  r.metadata = c.add(c.add(r.metadata_hot_cache_map, r.metadata_page_table), r.metadata_reverse_map);

  r.hierarchical_total = c.add(c.add(c.add(c.add(r.index_keys, r.hot_cache), r.tail), r.draft_ring), r.staging);
  r.resident_total =
      c.add(c.mul(r.history_rows, c.add(model.payload_bytes_per_row, model.index_key_bytes_per_row)), r.draft_ring);
  r.host_per_session = c.mul(r.history_rows, model.payload_bytes_per_row);

  r.ring_bytes_for_slots = c.mul(r.slots, r.draft_ring);
  r.staging_bytes_for_slots = c.mul(r.slots, r.staging);

  if (inputs.pool_bytes) {
    r.resident_sessions_in_pool = sessions_that_fit(*inputs.pool_bytes, r.resident_total);
    r.hierarchical_sessions_in_pool = sessions_that_fit(*inputs.pool_bytes, r.hierarchical_total);
  }
  r.resident_per_hierarchical =
      static_cast<double>(r.resident_total) / static_cast<double>(r.hierarchical_total);

  if (c.overflowed)
    throw planner_error("planner: a byte count does not fit in 64 bits (context too large?)");
  return r;
}

/// Plans one session of layout `L` under `inputs` (see the non-template overload).
template <KvLayout L>
constexpr session_plan plan(const plan_inputs& inputs) {
  return plan(shape_of<L>(), inputs);
}

// ---------------------------------------------------------------------------------------------
// Configuration: from budgets to a constructed hierarchy (docs/memory-planner.md, "From plan to hierarchy")
// ---------------------------------------------------------------------------------------------

/// How the optional-history pool of the planned hierarchy is used (the `ResidencyPolicy` the engine
/// constructs its `residency_manager` with).
enum class residency_kind : std::uint8_t {
  adaptive,      ///< `adaptive_policy`: the pool takes what the GPU budget leaves, up to what can be mapped
  resident,      ///< `resident_policy`: the pool holds every slot's whole history, pinned
  fixed_budget,  ///< `fixed_budget_policy`: no optional history, no pool
};

/// Short name of a residency kind ("adaptive", "resident", "fixed-budget").
constexpr std::string_view to_string(residency_kind k) {
  switch (k) {
    case residency_kind::adaptive: return "adaptive";
    case residency_kind::resident: return "resident";
    case residency_kind::fixed_budget: return "fixed-budget";
  }
  return "unknown";
}

/// Residency kind by its short name (`to_string`'s), or nullopt.
constexpr std::optional<residency_kind> residency_by_name(std::string_view name) {
  for (const auto k : {residency_kind::adaptive, residency_kind::resident, residency_kind::fixed_budget})
    if (to_string(k) == name) return k;
  return std::nullopt;
}

/// What to configure a hierarchy for. Members without a default must be set.
struct config_inputs {
  std::uint64_t slots = 0;               ///< N: request slots (hierarchy_config::max_requests)
  std::uint64_t max_context_tokens = 0;  ///< longest history one request reaches, prompt + generated positions
  /// Most token positions all admitted requests hold together (sizes the host stores); unset: every
  /// slot at max_context_tokens (the hierarchy's own default).
  std::optional<std::uint64_t> live_context_tokens{};
  std::uint64_t gpu_bytes = 0;                ///< device bytes the CUDA hierarchy may take (checked; sizes the optional pool)
  std::optional<std::uint64_t> host_bytes{};  ///< pinned host bytes the host stores may take; unset: not checked
  std::uint64_t hot_rows = default_hot_rows;  ///< B: rows of the hierarchy's HotCache<B> (>= top_k)
  std::optional<std::uint64_t> tail_rows{};   ///< T: tail ring rows per slot and source; default one page
  std::uint64_t max_block = 1;                ///< K_max: widest speculative block; 1 = no speculation
  /// chi of `staging_arenas<chi>`; unset: `dedicated_staging` (staging rows in every layer's pool).
  std::optional<std::uint64_t> staging_arenas{};
  residency_kind residency = residency_kind::adaptive;  ///< how the optional pool is used
  std::uint64_t required_pages = 0;  ///< residency_config::required_pages (see docs: 0 unless the engine draws from the pool)
  std::uint64_t reserve_pages = 0;   ///< residency_config::reserve_pages, M_res
};

/// Alignment of every range the CUDA hierarchy carves from its device buffers (cuda::detail::carver).
inline constexpr std::uint64_t cuda_carve_alignment = 256;
/// Depth of the CUDA hierarchy's pinned launch-descriptor rings.
inline constexpr std::uint64_t cuda_descriptor_ring_depth = 16;

/// Bytes each backend allocates for a planned configuration.
struct backend_bytes {
  // host_hierarchy: exactly what `host_hierarchy::requirements(config)` reports.
  std::uint64_t host_pool_bytes = 0;           ///< simulated GPU payload pools of every payload layer
  std::uint64_t host_staging_arena_bytes = 0;  ///< shared staging arenas (0 with dedicated staging)
  std::uint64_t host_store_bytes = 0;          ///< paged host stores of every source
  // cuda::hierarchy: the terms the planner models, and a bound on the rest.
  /// Payload pools, each layer's range rounded to the carve alignment; with shared arenas, the
  /// pools of the one-block-per-layer-index layout, its padding included (detail/staging_blocks.hpp).
  std::uint64_t cuda_pool_bytes = 0;
  std::uint64_t cuda_staging_arena_bytes = 0;  ///< shared staging arenas, each rounded to the carve alignment
  std::uint64_t cuda_metadata_bytes = 0;       ///< hot-cache map, LRU order, page tables, reverse map, live flags
  std::uint64_t cuda_workspace_bytes = 0;      ///< copy plans of resolve (and verify: plan, seen and rank bitmaps)
  /// Bound on what the planner does not itemise: alignment padding, control blocks, per-slot error
  /// and statistics records, batch descriptors, pointer tables (16 KiB + 16 B per payload layer +
  /// N * (512 + 32 K_max) bytes per source).
  std::uint64_t cuda_device_allowance = 0;
  /// Device bytes `cuda::hierarchy::requirements(config).device_bytes` stays within: the sum of the
  /// four terms above plus the allowance. This is what is charged against `gpu_bytes`.
  std::uint64_t cuda_device_bytes = 0;
  std::uint64_t cuda_pinned_bytes = 0;  ///< pinned: the host stores (exactly host_store_bytes)
  /// Bound on the pinned launch-descriptor rings the CUDA hierarchy adds (16 deep: resolve, and verify with K_max > 1).
  std::uint64_t cuda_pinned_allowance = 0;
};

/// A configuration ready to construct `host_hierarchy` / `cuda::hierarchy` (with `HotCache<hot_rows>`
/// and the staging policy the inputs name) and a `residency_manager`, with the bytes it costs.
struct hierarchy_plan {
  hierarchy_config config;      ///< every field set (no 0 = default left)
  residency_config residency;   ///< the manager's ledger sizes
  backend_bytes bytes;          ///< what each backend allocates
  std::uint64_t hot_rows = 0;   ///< B the hierarchy type must use (lru_hot_cache<B>)
  std::optional<std::uint64_t> staging_arenas{};  ///< chi of staging_arenas<chi>, or unset: dedicated_staging
  residency_kind residency_mode = residency_kind::adaptive;  ///< the policy the plan sized the pool for

  // How the fields were derived (docs/memory-planner.md).
  std::uint64_t pages_per_request = 0;     ///< ceil(max_rows / p)
  std::uint64_t live_context_tokens = 0;   ///< the live context the host stores are sized for
  std::uint64_t default_host_pages = 0;    ///< N * pages_per_request: the hierarchy's all-slots-full default
  std::uint64_t optional_pages_needed = 0;  ///< most pages the policy can use (adaptive: complete live pages + ledger)
  std::uint64_t optional_pages_budget = 0;  ///< most pages the GPU budget leaves room for
  std::uint64_t optional_page_bytes = 0;    ///< device bytes of one optional page over every payload layer (p * payload B/row)
  std::uint64_t host_page_bytes = 0;        ///< pinned bytes of one host page over every source (same value)
  std::uint64_t index_key_bytes = 0;        ///< engine-owned indexer keys for N slots at max_rows (not charged)
  std::uint64_t gpu_bytes_left = 0;         ///< gpu_bytes - cuda_device_bytes
};

namespace detail {
constexpr std::uint64_t align_up(std::uint64_t x, std::uint64_t a) { return (x + a - 1) / a * a; }

/// Device bytes of the CUDA hierarchy's itemised terms for `optional_pages` pages, and the allowance.
struct cuda_device_terms {
  std::uint64_t pools = 0, arenas = 0, metadata = 0, workspace = 0, allowance = 0;
  constexpr std::uint64_t total() const { return pools + arenas + metadata + workspace + allowance; }
};

constexpr cuda_device_terms cuda_device_for(const layout_desc& l, const hierarchy_config& c, std::uint64_t hot_rows,
                                            bool shared_staging, std::uint64_t chi, checked_bytes& k) {
  const bool spec = c.max_block > 1;
  const std::uint64_t n = c.max_requests, kmax = c.max_block, top_k = l.top_k;
  const std::uint64_t tail = c.tail_rows + (spec ? kmax : 0);
  const std::uint64_t staging_rows = spec ? k.mul(kmax, top_k) : 0;
  const std::uint64_t ppr = ceil_div(c.max_rows, l.page_rows);
  std::uint64_t pool_rows = k.add(k.mul(n, k.add(hot_rows, tail)), k.mul(c.optional_pages, l.page_rows));
  if (!shared_staging) pool_rows = k.add(pool_rows, k.mul(n, staging_rows));
  cuda_device_terms t;
  std::uint64_t widest = 0;
  for (const source_desc& d : l.sources) {
    widest = std::max<std::uint64_t>(widest, d.row_bytes);
    t.pools = k.add(t.pools, k.mul(d.payload_layers, align_up(k.mul(pool_rows, d.row_bytes), cuda_carve_alignment)));
    // hot row (int32) + LRU order (uint16) per hot way; optional and host page (int32 each) per
    // history page; reverse map (uint16) per history row.
    std::uint64_t meta = k.mul(k.mul(n, hot_rows), hot_slot_entry_bytes + lru_order_entry_bytes);
    meta = k.add(meta, k.mul(k.mul(n, ppr), 2 * page_table_entry_bytes));
    meta = k.add(meta, k.mul(k.mul(n, c.max_rows), reverse_map_entry_bytes));
    t.metadata = k.add(t.metadata, meta);
    // Two copy plans of N * k 16-byte entries; verify: N * K_max * k entries and two bitmaps of max_rows bits.
    std::uint64_t ws = k.mul(k.mul(2 * n, top_k), 16);
    if (spec) {
      ws = k.add(ws, k.mul(k.mul(n, kmax), k.mul(top_k, 16)));
      ws = k.add(ws, k.mul(k.mul(2 * n, ceil_div(c.max_rows, 32)), 4));
    }
    // The write state (cuda::hierarchy::write_state_bytes, one allocation for all sources): per
    // source a 512-byte step-table entry, the error books of writes, of commits and (K_max > 1)
    // of stages (a 256-byte control block and N 32-byte entry records each) and the backup work
    // list (N 16-byte items), each carved at 256 bytes.
    ws = k.add(ws, k.add(k.mul(spec ? 3 : 2, 256 + align_up(k.mul(n, 32), 256)), 512 + align_up(k.mul(n, 16), 256)));
    t.workspace = k.add(t.workspace, ws);
    t.allowance = k.add(t.allowance, k.add(16 * 1024 + 16 * d.payload_layers, k.mul(n, 512 + 32 * kmax)));
  }
  t.metadata = k.add(t.metadata, k.mul(n, 4));  // live flag per slot
  if (shared_staging && spec) t.arenas = k.mul(chi, align_up(k.mul(k.mul(n, staging_rows), widest), cuda_carve_alignment));
  if (shared_staging && !k.overflowed) {  // block l: layer l's pool of every source, then arena l
    const staging_blocks b = plan_staging_blocks(l.sources, pool_rows, k.mul(n, staging_rows), chi);
    t.pools = b.total_bytes - t.arenas;
  }
  return t;
}
}  // namespace detail

/// Plans a hierarchy of layout `l` for `in`: the `hierarchy_config`, the `residency_config` and the
/// bytes each backend allocates. Throws `planner_input_error` naming the input at fault when no
/// configuration meets the inputs (the layout, a budget too small, a bad count).
/// Derivation (docs/memory-planner.md): max_rows = ceil(max_context / m); tail_rows = T (default p);
/// host_pages = min(N * ceil(max_rows / p), floor((live + N (m p - 1)) / (m p))); optional_pages =
/// 0 (fixed budget), N * (floor(max_rows / p) + required) + reserve (resident), or the smaller of
/// what the GPU budget leaves and what can be mapped, floor((live + N (m - 1)) / (m p)) + N * required
/// + reserve (adaptive).
constexpr hierarchy_plan plan_hierarchy(const layout_desc& l, const config_inputs& in) {
  const model_shape shape = shape_of(l);  // validates the layout
  const auto fail = [](const char* field, const std::string& why) { throw planner_input_error(field, why); };
  const auto num = [](std::uint64_t v) { return std::to_string(v); };
  const std::uint64_t m = shape.positions_per_row, p = shape.page_rows;
  constexpr std::uint64_t int32_max = static_cast<std::uint64_t>(std::numeric_limits<std::int32_t>::max());

  if (in.slots == 0) fail("slots", "at least one request slot is needed");
  if (in.max_context_tokens == 0) fail("max_context_tokens", "must be at least 1");
  if (in.hot_rows < shape.top_k)
    fail("hot_rows", "B = " + num(in.hot_rows) + " is below top_k = " + num(shape.top_k) +
                         " (the hot cache must hold one whole selection)");
  if (in.tail_rows && *in.tail_rows == 0) fail("tail_rows", "the tail needs at least one row");
  if (in.max_block == 0) fail("max_block", "must be at least 1 (1 = no speculation)");
  if (in.staging_arenas && (*in.staging_arenas < shape.max_live_payload_layers || *in.staging_arenas == 0))
    fail("staging_arenas", "chi = " + num(*in.staging_arenas) + " is below the most payload layers of one source (" +
                               num(shape.max_live_payload_layers) + "): a verify stages every layer of its source at once");

  detail::checked_bytes k;
  hierarchy_plan r;
  r.hot_rows = in.hot_rows;
  r.staging_arenas = in.staging_arenas;
  r.residency_mode = in.residency;

  hierarchy_config& c = r.config;
  c.max_requests = in.slots;
  c.max_rows = detail::ceil_div(in.max_context_tokens, m);
  if (c.max_rows > int32_max)
    fail("max_context_tokens", num(in.max_context_tokens) + " tokens make " + num(c.max_rows) +
                                   " rows, past int32 row indices");
  c.tail_rows = in.tail_rows.value_or(p);
  c.max_block = in.max_block;
  if (c.max_block > c.max_rows) fail("max_block", "K_max = " + num(c.max_block) + " exceeds max_rows = " + num(c.max_rows));

  // Host stores: the pages the live context can occupy, every request wasting at most one partial page.
  r.pages_per_request = detail::ceil_div(c.max_rows, p);
  r.default_host_pages = k.mul(in.slots, r.pages_per_request);
  r.live_context_tokens = in.live_context_tokens.value_or(k.mul(in.slots, in.max_context_tokens));
  if (r.live_context_tokens < in.max_context_tokens)
    fail("live_context_tokens", num(r.live_context_tokens) + " is below max_context_tokens = " +
                                    num(in.max_context_tokens) + " (one request alone may reach it)");
  if (r.live_context_tokens > k.mul(in.slots, in.max_context_tokens))
    fail("live_context_tokens", num(r.live_context_tokens) + " exceeds slots * max_context_tokens = " +
                                    num(in.slots * in.max_context_tokens));
  const std::uint64_t mp = m * p;
  c.host_pages = std::min(r.default_host_pages, k.add(r.live_context_tokens, k.mul(in.slots, mp - 1)) / mp);
  r.host_page_bytes = k.mul(p, shape.payload_bytes_per_row);
  r.optional_page_bytes = r.host_page_bytes;
  const std::uint64_t host_store = k.mul(c.host_pages, r.host_page_bytes);
  if (in.host_bytes && host_store > *in.host_bytes)
    fail("host_bytes", num(*in.host_bytes) + " bytes cannot hold " + num(c.host_pages) +
                           " host pages per source (" + num(host_store) + " bytes) for " +
                           num(r.live_context_tokens) + " live context tokens; " +
                           num(*in.host_bytes / r.host_page_bytes) + " pages fit");

  // Residency ledger (validated like residency_manager's constructor).
  r.residency.required_pages = in.required_pages;
  r.residency.reserve_pages = in.reserve_pages;
  if (in.residency == residency_kind::fixed_budget && (in.required_pages != 0 || in.reserve_pages != 0))
    fail(in.required_pages != 0 ? "required_pages" : "reserve_pages",
         "the fixed-budget policy keeps no optional pool, so the ledger has no pages to require or reserve");
  const std::uint64_t pinned = in.residency == residency_kind::resident ? c.max_rows / p : 0;
  const std::uint64_t ledger = k.add(k.mul(in.slots, k.add(in.required_pages, pinned)), in.reserve_pages);
  switch (in.residency) {
    case residency_kind::fixed_budget: r.optional_pages_needed = 0; break;
    case residency_kind::resident: r.optional_pages_needed = ledger; break;
    case residency_kind::adaptive: {
      // Complete pages of the live histories: sum floor(rows_i / p) <= (live + N (m - 1)) / (m p).
      const std::uint64_t mappable = std::min(k.mul(in.slots, c.max_rows / p),
                                              k.add(r.live_context_tokens, k.mul(in.slots, m - 1)) / mp);
      r.optional_pages_needed = k.add(mappable, ledger);
      break;
    }
  }

  // The GPU budget: the CUDA hierarchy's device bytes with no optional page, then pages while they fit.
  const bool shared = in.staging_arenas.has_value();
  const std::uint64_t chi = in.staging_arenas.value_or(0);
  c.optional_pages = 0;
  const detail::cuda_device_terms fixed = detail::cuda_device_for(l, c, in.hot_rows, shared, chi, k);
  if (k.overflowed) fail("max_context_tokens", "a byte count does not fit in 64 bits");
  if (fixed.total() > in.gpu_bytes)
    fail("gpu_bytes", num(in.gpu_bytes) + " bytes cannot hold the fixed state of " + num(in.slots) +
                          " slots (hot caches, tails, staging, metadata): " + num(fixed.total()) + " bytes");
  // Each page adds p rows to every layer's range; each range's rounding grows by less than the alignment.
  // Shared arenas round each pool's distance to its arena to lcm(row bytes, alignment) instead.
  std::uint64_t slack = k.mul(shape.payload_layers, cuda_carve_alignment);
  if (shared) {
    slack = 0;
    for (const source_desc& d : l.sources)
      slack = k.add(slack, k.mul(d.payload_layers, std::lcm<std::uint64_t>(d.row_bytes, cuda_carve_alignment)));
  }
  const std::uint64_t left = in.gpu_bytes - fixed.total();
  r.optional_pages_budget = left > slack ? (left - slack) / r.optional_page_bytes : 0;
  const std::uint64_t tail_ring = c.tail_rows + (c.max_block > 1 ? c.max_block : 0);
  const std::uint64_t slot_rows = k.mul(in.slots, k.add(k.add(in.hot_rows, tail_ring),
                                                        c.max_block > 1 ? c.max_block * shape.top_k : 0));
  if (slot_rows > int32_max) fail("slots", "the slots' hot caches, tails and staging exceed int32 locations");
  std::uint64_t addressable_pages = (int32_max - slot_rows) / p;
  if (shared) {
    // staging_arenas<chi>: a source's staging locations lie past the pools packed before its arena
    const std::uint64_t base_rows = k.mul(in.slots, k.add(in.hot_rows, tail_ring));
    const std::uint64_t staged = c.max_block > 1 ? k.mul(in.slots, c.max_block * shape.top_k) : 0;
    const auto fits = [&](std::uint64_t pages) {
      const auto b = detail::plan_staging_blocks(l.sources, base_rows + pages * p, staged, chi);
      for (std::size_t s = 0; s < l.sources.size(); ++s)
        if (detail::staging_location_end(b, l.sources, s, staged) > int32_max) return false;
      return true;
    };
    if (!fits(0)) fail("slots", "with staging_arenas the staging locations of the slots exceed int32 locations");
    std::uint64_t lo = 0, hi = addressable_pages;  // the most pages that fit: fits(lo), and hi or fewer
    while (lo < hi) {
      const std::uint64_t mid = lo + (hi - lo + 1) / 2;
      if (fits(mid)) lo = mid;
      else hi = mid - 1;
    }
    addressable_pages = lo;
  }
  const std::uint64_t affordable = std::min(r.optional_pages_budget, addressable_pages);
  if (in.residency == residency_kind::adaptive) {
    c.optional_pages = std::min(affordable, r.optional_pages_needed);
    if (c.optional_pages < ledger)
      fail("gpu_bytes", "the optional pool left by the budget (" + num(c.optional_pages) +
                            " pages) cannot hold one request's required and reserve pages (" + num(ledger) + ")");
  } else {
    c.optional_pages = r.optional_pages_needed;
    if (c.optional_pages > affordable)
      fail("gpu_bytes", "resident serving of " + num(in.slots) + " slots at " + num(c.max_rows) + " rows needs " +
                            num(c.optional_pages) + " optional pages per source; the budget leaves room for " +
                            num(affordable));
  }

  const detail::cuda_device_terms t = detail::cuda_device_for(l, c, in.hot_rows, shared, chi, k);
  backend_bytes& b = r.bytes;
  b.cuda_pool_bytes = t.pools;
  b.cuda_staging_arena_bytes = t.arenas;
  b.cuda_metadata_bytes = t.metadata;
  b.cuda_workspace_bytes = t.workspace;
  b.cuda_device_allowance = t.allowance;
  b.cuda_device_bytes = t.total();
  b.host_store_bytes = host_store;
  const std::uint64_t n = in.slots, kmax = c.max_block;
  b.cuda_pinned_bytes = host_store;
  // Beside the host stores: the descriptor staging rings, and per source the snapshot of the device
  // frontiers the host absorbs after batched writes (an int64 frontier and an int32 partial row per slot).
  b.cuda_pinned_allowance = k.add(cuda_descriptor_ring_depth *
                                      k.add(64 + 32 * n, kmax > 1 ? k.add(64 + 16 * n, k.mul(24 * n, kmax)) : 0),
                                  k.mul(l.sources.size(), k.mul(n, 12)));
  // The host backend keeps the same rows unpadded, its staging arenas inside the location range.
  const bool spec = c.max_block > 1;
  std::uint64_t host_rows = k.add(k.mul(n, k.add(in.hot_rows, tail_ring)), k.mul(c.optional_pages, p));
  const std::uint64_t staging_rows = spec ? k.mul(kmax, shape.top_k) : 0;
  if (!shared) host_rows = k.add(host_rows, k.mul(n, staging_rows));
  b.host_pool_bytes = k.mul(host_rows, shape.payload_bytes_per_row);
  b.host_staging_arena_bytes = shared && spec ? k.mul(chi, k.mul(k.mul(n, staging_rows), shape.widest_row_bytes)) : 0;

  r.index_key_bytes = k.mul(k.mul(n, c.max_rows), shape.index_key_bytes_per_row);
  if (k.overflowed) fail("max_context_tokens", "a byte count does not fit in 64 bits");
  if (b.cuda_device_bytes > in.gpu_bytes)  // the page count above leaves room for rounding; a check, not a loop
    fail("gpu_bytes", "internal: planned " + num(b.cuda_device_bytes) + " device bytes exceed the budget");
  r.gpu_bytes_left = in.gpu_bytes - b.cuda_device_bytes;
  return r;
}

/// Plans a hierarchy of compile-time layout `L` (forwards to the run-time overload).
template <KvLayout L>
constexpr hierarchy_plan plan_hierarchy(const config_inputs& in) {
  return plan_hierarchy(describe_layout<L>(), in);
}

// ---------------------------------------------------------------------------------------------
// The paper's figures (GLM-5.3 at 100K, B = 4096, tail one 64-row page), checked at compile time.
// ---------------------------------------------------------------------------------------------
namespace detail::paper_figures {
inline constexpr std::uint64_t paper_context = 100'000;
inline constexpr std::uint64_t paper_chi_one_arena_per_layer = 78;
inline constexpr session_plan without_drafter = plan<layouts::glm53>({.context_tokens = paper_context});
inline constexpr session_plan with_dflash2 =
    plan<layouts::glm53>({.context_tokens = paper_context, .drafter = drafters::dflash2});
inline constexpr session_plan with_dflash2_arena_per_layer = plan<layouts::glm53>(
    {.context_tokens = paper_context, .drafter = drafters::dflash2, .staging_arenas = paper_chi_one_arena_per_layer});

inline constexpr std::uint64_t paper_history_rows = 100'032;  // 100,000 rounded up to whole 64-row pages
static_assert(without_drafter.history_rows == paper_history_rows);
static_assert(without_drafter.resident_total == (78 * 576 + 21 * 132) * paper_history_rows);
static_assert(without_drafter.hierarchical_total ==
              21 * 132 * paper_history_rows + 4096 * 78 * 576 + 64 * 78 * 576);
static_assert(gib_rounded(without_drafter.hierarchical_total, 3) == 432, "paper: 0.432 GiB hierarchical");
static_assert(gib_rounded(without_drafter.resident_total, 3) == 4444, "paper: 4.444 GiB resident");
static_assert(gib_rounded(with_dflash2.hierarchical_total, 3) == 492, "paper: 0.492 GiB hierarchical + DFlash2");
static_assert(gib_rounded(with_dflash2.resident_total, 3) == 4469, "paper: 4.469 GiB resident + DFlash2");
static_assert(with_dflash2.ring_rows == 2176, "paper: R_d = 2176");
static_assert(gib_rounded(with_dflash2.ring_bytes_for_slots, 2) == 87, "paper: ring 0.87 GiB at 35 slots");
static_assert(gib_rounded(with_dflash2.staging_bytes_for_slots, 2) == 123, "paper: staging 1.23 GiB, 4 arenas");
static_assert(gib_rounded(with_dflash2_arena_per_layer.staging_bytes_for_slots, 1) == 240,
              "paper: staging 24.0 GiB with one arena per payload layer");
static_assert(gib_rounded(with_dflash2.hierarchical_total - without_drafter.hierarchical_total, 3) == 60,
              "paper: DFlash2 adds 0.060 GiB per session");
static_assert(gib_rounded(with_dflash2.draft_ring, 3) == 25, "paper: ring 0.025 GiB per session");
}  // namespace detail::paper_figures

}  // namespace dhisparse
