#pragma once

// One include for the tests, whichever Catch2 major is installed:
//   #include "catch.hpp"
// Catch2 3 (GPU machine) and Catch2 2.13 (Debian 12) are both supported. tests/CMakeLists.txt
// passes DHISPARSE_CATCH2_MAJOR; without it the major is detected from the headers present.
//
// Portable spellings provided here:
//   TEST_CASE, SECTION, REQUIRE/CHECK, REQUIRE_THROWS_AS, TEMPLATE_TEST_CASE  (same in both)
//   Approx(x) and Catch::Approx(x)                                         (both majors)
//   GENERATE(1, 2, 3), GENERATE(values({...})), GENERATE(range(a, b))       (both majors)
//   REQUIRE_THROWS_WITH(expr, dhisparse_testing::contains_substring("..."))

#if !defined(DHISPARSE_CATCH2_MAJOR)
#  if __has_include(<catch2/catch_all.hpp>)
#    define DHISPARSE_CATCH2_MAJOR 3
#  else
#    define DHISPARSE_CATCH2_MAJOR 2
#  endif
#endif

#include <string>

#if DHISPARSE_CATCH2_MAJOR >= 3
#  include <catch2/catch_all.hpp>
using Catch::Approx;  // v2 spelling `Approx(...)` keeps working

namespace dhisparse_testing {
inline auto contains_substring(const std::string& s) { return Catch::Matchers::ContainsSubstring(s); }
}  // namespace dhisparse_testing
#else
#  include <catch2/catch.hpp>
namespace Catch {
using Detail::Approx;  // v3 spelling `Catch::Approx(...)` works with v2 too
}  // namespace Catch

namespace dhisparse_testing {
inline auto contains_substring(const std::string& s) { return Catch::Matchers::Contains(s); }
}  // namespace dhisparse_testing
#endif
