#pragma once
/// \file
/// The owner rule of a shared host store (docs/multi-gpu.md), in one place for the host books and
/// the CUDA kernels: history page p of a request is written to the host store by rank p mod N only.
/// Needs no communication: each rank knows from a row's index alone whether it writes the row.
#include <cstddef>
#include <cstdint>

#include "config.hpp"

namespace dhisparse::detail {

/// The rank of `ranks` that writes history page `page`'s host copy.
DHISPARSE_HD constexpr std::uint64_t page_owner(std::uint64_t page, std::uint64_t ranks) { return page % ranks; }

/// True when rank `rank` of `ranks` writes the host copy of row `row` (pages of `page_rows` rows);
/// `ranks` 0: the hierarchy owns its store and writes every row.
DHISPARSE_HD constexpr bool writes_host_copy(std::int64_t row, std::uint64_t page_rows, std::uint64_t ranks,
                                             std::uint64_t rank) {
  return ranks == 0 || page_owner(static_cast<std::uint64_t>(row) / page_rows, ranks) == rank;
}

}  // namespace dhisparse::detail
