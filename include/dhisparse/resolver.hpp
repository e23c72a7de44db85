#pragma once
/// \file
/// FusedResolver: what a hierarchy backend offers an engine. The host reference
/// (`host_hierarchy`) and the CUDA backend (`cuda::hierarchy`) both model it; each defines the
/// `batch_item` its `resolve(source, batch)` takes (host spans or device pointers).
#include <concepts>
#include <cstddef>
#include <span>

#include "hierarchy_types.hpp"
#include "layout.hpp"
#include "location_space.hpp"
#include "policies/hot_cache.hpp"
#include "policies/residency.hpp"
#include "types.hpp"

namespace dhisparse {

/// Requirements on a hierarchy backend: layout and policy types, space(), contains, admit, complete and resolve.
template <class R>
concept FusedResolver = requires(R& r, const R& cr, request_id id, std::size_t source,
                                 std::span<const typename R::batch_item> batch) {
  requires KvLayout<typename R::layout>;
  requires HotCachePolicy<typename R::hot_cache>;
  requires ResidencyPolicy<typename R::residency>;
  { cr.space() } -> std::convertible_to<location_space>;
  { cr.contains(id) } -> std::convertible_to<bool>;
  { r.admit(id) } -> std::convertible_to<admission>;
  r.complete(id);
  r.resolve(source, batch);
};

}  // namespace dhisparse
