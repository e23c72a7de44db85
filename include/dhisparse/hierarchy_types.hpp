#pragma once
/// \file
/// Configuration and call types shared by the host and CUDA hierarchies.
#include <cstddef>
#include <cstdint>
#include <span>

#include "types.hpp"

namespace dhisparse {

/// Sizes of a hierarchy instance (both backends).
struct hierarchy_config {
  std::size_t max_requests = 8;    ///< N: request slots
  std::size_t max_rows = 0;        ///< history capacity per request and source, in stored rows
  std::size_t host_pages = 0;      ///< host-store pages per source; 0 = every slot at full capacity
  std::size_t tail_rows = 0;       ///< T: tail ring rows per slot and source; 0 = one page
  std::size_t optional_pages = 0;  ///< P: optional-history pages per source in the GPU pool
  std::size_t max_block = 1;       ///< K_max: widest speculative block (anchor + proposals); 1 = no speculation
  /// Budget of retained prefixes per source, in host-store pages: distinct pages referenced by
  /// retained prefixes (shared with requests or not); 0 = host_pages. See docs/prefixes.md.
  std::size_t prefix_pages = 0;
};

/// Which payload layers a resolver call materialises.
enum class copy_layers : std::uint8_t {
  all,            ///< every payload layer of the source, in this call
  producer_only,  ///< layer 0 only; followers replay the plan later with `copy_follower`
};

/// Result of an admission: admitted with a slot, or wait (no capacity now; try again later).
/// [[nodiscard]]: a full hierarchy answers with a wait, not an exception, so the result must be read.
struct [[nodiscard]] admission {
  /// True when the request now holds a slot.
  bool admitted = false;
  /// The request's slot (meaningful only when admitted).
  std::size_t slot = 0;
  /// Same as `admitted`.
  explicit operator bool() const { return admitted; }
};

/// One request's part of a batched host resolver call.
struct resolve_item {
  /// The admitted request this part belongs to.
  request_id request = 0;
  std::span<const row_index> selection;  ///< ordered top-k, -1 padded, at most top_k entries
  std::span<location> locations;         ///< same length as selection
};

/// One request's part of a speculative verify call (host backend): K_r = queries.size() target
/// queries, query j at position n + j, n = `positions()` (frontier for m = 1; j = 0 is the anchor).
struct verify_item {
  /// The admitted request whose staged block is verified.
  request_id request = 0;
  std::span<const std::span<const row_index>> queries;  ///< K_r ordered selections, -1 padded, <= top_k each
  std::span<const std::span<location>> locations;       ///< K_r outputs, each as long as its query
};

/// Where the entries of a verify call were found. Entry counts are per selection entry over every
/// query; `rows_copied`, `bytes_copied` and `staging_rows` count distinct rows of the union.
struct verify_stats {
  std::size_t selected = 0;      ///< entries other than -1
  std::size_t direct = 0;        ///< entries in the committed tail, a ready optional page or the block
  std::size_t block = 0;         ///< of `direct`: entries naming a (tentative) block position
  std::size_t hot = 0;           ///< entries whose row was already in the hot cache
  std::size_t host = 0;          ///< entries whose row was recovered from host memory by this call
  std::size_t staged = 0;        ///< of `host`: entries served from verification staging
  std::size_t rows_copied = 0;   ///< distinct rows copied from host (each exactly once)
  std::size_t bytes_copied = 0;  ///< bytes copied from host over every payload layer materialised
  std::size_t staging_rows = 0;  ///< distinct rows placed in staging (overflow past the hot cache)

  /// Adds `o`'s counts field by field.
  constexpr verify_stats& operator+=(const verify_stats& o) {
    selected += o.selected; direct += o.direct; block += o.block; hot += o.hot; host += o.host;
    staged += o.staged; rows_copied += o.rows_copied; bytes_copied += o.bytes_copied;
    staging_rows += o.staging_rows;
    return *this;
  }
  /// True when every count is equal.
  friend constexpr bool operator==(const verify_stats&, const verify_stats&) = default;
};

/// A host row recovered into a hot-cache location by the last resolve of a source; follower
/// layers replay these copies with their own bytes.
struct planned_copy {
  /// Request slot the row belongs to.
  std::size_t slot = 0;
  /// History row copied from the host store.
  row_index row = 0;
  /// Hot-cache (or staging) location it was copied to.
  location dst = 0;
};

/// One (request, source) part of a step-wide `append_step` (host backend; the twin of a
/// `cuda::kv_step_write_view` entry on one source): `count` new rows of `source` laid out
/// [payload layer][count][row_bytes], as the per-request append. An item of 0 rows is skipped.
struct step_write_item {
  /// The admitted request the rows belong to.
  request_id request = 0;
  std::size_t source = 0;           ///< the payload source written
  std::span<const std::byte> rows;  ///< count * payload_layers * row_bytes bytes of `source`
  std::size_t count = 0;            ///< new rows (decode: 1; a prefill chunk: more)
};

/// One (request, source) part of a step-wide `stage_step` (the twin of a `cuda::stage_step_view`
/// entry on one source): the draft block of `count` positions on `source`, laid out as
/// `stage_block` expects ([payload layer][block_rows][row_bytes]).
struct step_stage_item {
  /// The admitted request whose block is staged.
  request_id request = 0;
  std::size_t source = 0;           ///< the payload source staged
  std::span<const std::byte> rows;  ///< block_rows(request, source, count) * payload_layers * row_bytes bytes
  std::size_t count = 0;            ///< K_r positions: the anchor and count - 1 proposals, 1 .. max_block
};

/// One (request, source) part of a step-wide `commit_step` (the twin of a `cuda::commit_step_view`
/// entry on one source): the anchor and `accepted` proposals of its last verified round on `source`.
struct step_commit_item {
  /// The admitted request whose verified round is committed.
  request_id request = 0;
  std::size_t source = 0;    ///< the payload source committed
  std::size_t accepted = 0;  ///< 0 <= accepted <= K_r - 1 of the last verify on `source`
};

}  // namespace dhisparse
