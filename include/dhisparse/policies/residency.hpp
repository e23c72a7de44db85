#pragma once
/// \file
/// ResidencyPolicy: how much history a request keeps on the GPU beyond its tail and hot cache.
#include <concepts>

namespace dhisparse {

/// Requirements on a residency policy type.
template <class P>
concept ResidencyPolicy = requires {
  { P::keeps_optional_history } -> std::convertible_to<bool>;
  { P::name } -> std::convertible_to<const char*>;
};

/// No optional history: a request's GPU footprint is its hot cache and tail (HiSparse behaviour).
struct fixed_budget_policy {
  static constexpr bool keeps_optional_history = false;
  static constexpr const char* name = "fixed-budget";
};
static_assert(ResidencyPolicy<fixed_budget_policy>);

}  // namespace dhisparse
