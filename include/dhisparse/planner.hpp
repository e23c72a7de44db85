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
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include "errors.hpp"
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
template <KvLayout L>
consteval std::uint64_t index_key_bytes_per_row() {
  std::uint64_t n = 0;
  for (const auto& s : L::sources) n += s.index_key_bytes;
  return n;
}
}  // namespace detail

/// The planner's view of layout `L`. All sources must pack the same m positions per row.
template <KvLayout L>
constexpr model_shape shape_of() {
  static_assert(detail::sources_share_one_packing<L>(),
                "dhisparse planner: every source of the layout must pack the same number of token positions "
                "per stored row (positions_per_row, m); the planner assumes one m for the whole layout");
  return model_shape{
      .payload_bytes_per_row = payload_bytes_per_row<L>(),
      .index_key_bytes_per_row = detail::index_key_bytes_per_row<L>(),
      .positions_per_row = L::sources[0].positions_per_row,
      .page_rows = L::page_rows,
      .top_k = L::top_k,
      .payload_layers = payload_layer_count<L>(),
      .sources = source_count<L>,
      .max_live_payload_layers = max_payload_layers_per_source<L>(),
      .widest_row_bytes = widest_row_bytes<L>(),
  };
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
