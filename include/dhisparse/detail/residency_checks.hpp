#pragma once
/// \file
/// Checks both residency managers (host/residency_manager.hpp, cuda/residency_manager.cuh) make
/// with the same rule and the same message, written once.
#include <cstddef>
#include <cstdint>
#include <string>

#include "../errors.hpp"
#include "../types.hpp"

namespace dhisparse::detail {

/// At construction: one request's required, reserve and (under a pinning policy) pinned pages per
/// source must fit the optional pool, else nothing could ever be admitted (invalid_configuration).
inline void check_one_request_fits(std::size_t required, std::size_t reserve, std::size_t pinned, bool pins_history,
                                   std::size_t capacity) {
  const std::size_t need = required + reserve + pinned;
  if (need > capacity)
    throw invalid_configuration("residency: one request needs " + std::to_string(need) +
                                " pages per source (required + reserve" +
                                (pins_history ? std::string(" + pinned history") : std::string()) +
                                ") but the optional pool has " + std::to_string(capacity) +
                                ": nothing could be admitted");
}

/// Before an import: imported rows must be a prefix of the history, so source `s` of `id` may hold
/// only imported rows (`positions == imported * positions_per_row`) and no staged block; otherwise
/// import_after_decode.
inline void check_not_decoding(request_id id, std::size_t s, std::int64_t positions, std::int64_t imported,
                               std::size_t positions_per_row, std::size_t staged_rows) {
  if (positions != imported * static_cast<std::int64_t>(positions_per_row) || staged_rows != 0)
    throw import_after_decode("residency: request " + std::to_string(id) + " has decode rows on source " +
                              std::to_string(s) + " (" + std::to_string(positions) + " positions, " +
                              std::to_string(imported) + " rows imported): history must be imported before decoding starts");
}

}  // namespace dhisparse::detail
