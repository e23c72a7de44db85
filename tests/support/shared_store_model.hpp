#pragma once
// The model every shared-host-store test uses (host and CUDA backends, ranks in one process or in
// several): the tiny layout, hot caches of 16 rows, 4 request slots of up to 96 rows, an 8-row
// tail, 6 optional pages, and host pages for every slot's whole history.
#include <dhisparse/hierarchy_types.hpp>
#include <dhisparse/layouts/tiny.hpp>

#include <cstddef>

namespace shared_store_model {

using L = dhisparse::layouts::tiny;
inline constexpr std::size_t kB = 16, kRows = 96, kT = 8, kSlots = 4, kP = L::page_rows;
inline constexpr std::size_t kHostPages = kSlots * (kRows / kP);

inline dhisparse::hierarchy_config config(std::size_t max_block = 1) {
  dhisparse::hierarchy_config c;
  c.max_requests = kSlots;
  c.max_rows = kRows;
  c.tail_rows = kT;
  c.optional_pages = 6;
  c.max_block = max_block;
  return c;
}
inline std::size_t layers(std::size_t s) { return L::sources[s].payload_layers; }
inline std::size_t row_bytes(std::size_t s) { return L::sources[s].row_bytes; }
/// The test's own page size: p rows of every payload layer.
inline std::size_t page_bytes(std::size_t s) { return kP * layers(s) * row_bytes(s); }

}  // namespace shared_store_model
