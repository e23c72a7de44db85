#pragma once
/// \file
/// ResidencyPolicy: how much history a request keeps on the GPU beyond its tail and hot cache.
///
/// The concept asks only for `keeps_optional_history` and `name`. Policies may add the members
/// read by `residency_traits` (all optional, with defaults), which `residency_manager`
/// (host/residency_manager.hpp, docs/residency.md) uses to run load-adaptive residency:
///  - `pins_history` (default false): every complete page of a request is optional history that is
///    never reclaimed; admission reserves the request's whole history capacity (resident serving);
///  - `order` (default `reclaim_order::most_recent_first`): the order in which whole requests give
///    up their optional pages under pressure;
///  - `pages_per_attempt` (default 16): optional pages one `repopulate()` call maps at most.
#include <concepts>
#include <cstddef>

namespace dhisparse {

/// Requirements on a residency policy type.
template <class P>
concept ResidencyPolicy = requires {
  { P::keeps_optional_history } -> std::convertible_to<bool>;
  { P::name } -> std::convertible_to<const char*>;
};

/// Order in which admitted requests are walked when whole requests' optional pages are reclaimed.
enum class reclaim_order {
  most_recent_first,   ///< the most recently admitted request gives up its pages first (LIFO)
  least_recent_first,  ///< the longest-admitted request gives up its pages first (FIFO)
};

/// No optional history: a request's GPU footprint is its hot cache and tail (HiSparse behaviour).
struct fixed_budget_policy {
  /// Requests keep no optional history on the GPU.
  static constexpr bool keeps_optional_history = false;
  /// Policy name for messages and logs.
  static constexpr const char* name = "fixed-budget";
};
static_assert(ResidencyPolicy<fixed_budget_policy>);

/// Load-adaptive residency (Adaptive DHiSparse): a request keeps complete pages of its imported
/// history as optional history while memory is spare; under pressure whole requests give up
/// their optional pages in `Order`; `repopulate()` refills at most `PagesPerAttempt` pages a call.
template <reclaim_order Order = reclaim_order::most_recent_first, std::size_t PagesPerAttempt = 16>
struct adaptive_policy {
  static_assert(PagesPerAttempt >= 1, "dhisparse: adaptive_policy needs PagesPerAttempt >= 1");
  /// Complete imported pages may stay on the GPU as optional history.
  static constexpr bool keeps_optional_history = true;
  /// Optional pages may be reclaimed under pressure.
  static constexpr bool pins_history = false;
  /// Order in which whole requests give up their optional pages.
  static constexpr reclaim_order order = Order;
  /// Most optional pages one `repopulate()` call maps.
  static constexpr std::size_t pages_per_attempt = PagesPerAttempt;
  /// Policy name: "adaptive-mra" (most recent first) or "adaptive-lra".
  static constexpr const char* name = Order == reclaim_order::most_recent_first ? "adaptive-mra" : "adaptive-lra";
};
static_assert(ResidencyPolicy<adaptive_policy<>>);
static_assert(ResidencyPolicy<adaptive_policy<reclaim_order::least_recent_first, 1>>);

/// Resident serving: every complete page of every request stays on the GPU, never reclaimed;
/// an admission waits until the request's whole history capacity fits.
struct resident_policy {
  /// Every complete page is kept on the GPU as optional history.
  static constexpr bool keeps_optional_history = true;
  /// Optional pages are never reclaimed; admission reserves the whole history.
  static constexpr bool pins_history = true;
  /// Policy name for messages and logs.
  static constexpr const char* name = "resident";
};
static_assert(ResidencyPolicy<resident_policy>);

/// The optional members of a residency policy, with their defaults.
template <ResidencyPolicy P>
struct residency_traits {
  /// `P::keeps_optional_history`.
  static constexpr bool keeps_optional_history = static_cast<bool>(P::keeps_optional_history);
  /// `P::pins_history`, or false when `P` has none.
  static constexpr bool pins_history = [] {
    if constexpr (requires { P::pins_history; }) return static_cast<bool>(P::pins_history);
    else return false;
  }();
  /// `P::order`, or `reclaim_order::most_recent_first` when `P` has none.
  static constexpr reclaim_order order = [] {
    if constexpr (requires { P::order; }) return static_cast<reclaim_order>(P::order);
    else return reclaim_order::most_recent_first;
  }();
  /// `P::pages_per_attempt`, or 16 when `P` has none.
  static constexpr std::size_t pages_per_attempt = [] {
    if constexpr (requires { P::pages_per_attempt; }) return static_cast<std::size_t>(P::pages_per_attempt);
    else return std::size_t{16};
  }();
  static_assert(!pins_history || keeps_optional_history,
                "dhisparse: a residency policy that pins history must keep optional history");
  static_assert(pages_per_attempt >= 1, "dhisparse: pages_per_attempt must be at least 1");
};

}  // namespace dhisparse
