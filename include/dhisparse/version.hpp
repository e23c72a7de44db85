#pragma once

/// @file dhisparse/version.hpp
/// The version of the dhisparse headers. It must match `project(dhisparse VERSION ...)` in the
/// top-level CMakeLists.txt, which checks this at configure time.

namespace dhisparse {

inline constexpr int version_major = 0;  ///< incompatible API changes
inline constexpr int version_minor = 2;  ///< added functionality
inline constexpr int version_patch = 0;  ///< fixes
inline constexpr const char* version_string = "0.2.0";  ///< "major.minor.patch"

}  // namespace dhisparse
