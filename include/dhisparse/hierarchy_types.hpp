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
};

/// Which payload layers a resolver call materialises.
enum class copy_layers : std::uint8_t {
  all,            ///< every payload layer of the source, in this call
  producer_only,  ///< layer 0 only; followers replay the plan later with `copy_follower`
};

/// Result of an admission: admitted with a slot, or wait (no capacity now; try again later).
struct admission {
  bool admitted = false;
  std::size_t slot = 0;
  explicit operator bool() const { return admitted; }
};

/// One request's part of a batched host resolver call.
struct resolve_item {
  request_id request = 0;
  std::span<const row_index> selection;  ///< ordered top-k, -1 padded, at most top_k entries
  std::span<location> locations;         ///< same length as selection
};

/// A host row recovered into a hot-cache location by the last resolve of a source; follower
/// layers replay these copies with their own bytes.
struct planned_copy {
  std::size_t slot = 0;
  row_index row = 0;
  location dst = 0;
};

}  // namespace dhisparse
