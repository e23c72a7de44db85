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
//   INFO, CAPTURE, STATIC_REQUIRE                                           (same in both)

#if !defined(DHISPARSE_CATCH2_MAJOR)
#  if __has_include(<catch2/catch_test_macros.hpp>)
#    define DHISPARSE_CATCH2_MAJOR 3
#  else
#    define DHISPARSE_CATCH2_MAJOR 2
#  endif
#endif

#include <string>

#if DHISPARSE_CATCH2_MAJOR >= 3
// Only the parts the tests use, never <catch2/catch_all.hpp>: that one also pulls in the
// benchmark, matcher-template and every generator header, and nvcc's front end spent minutes on
// each CUDA test that included it (g++ 13, Catch2 3.4). Add a header here when a test needs more.
#  include <catch2/catch_approx.hpp>                      // Catch::Approx
#  include <catch2/catch_message.hpp>                     // INFO, CAPTURE
#  include <catch2/catch_template_test_macros.hpp>        // TEMPLATE_TEST_CASE
#  include <catch2/catch_test_macros.hpp>                 // TEST_CASE, SECTION, REQUIRE..., STATIC_REQUIRE
#  include <catch2/generators/catch_generators.hpp>       // GENERATE, values
#  include <catch2/generators/catch_generators_range.hpp> // range
#  include <catch2/matchers/catch_matchers_string.hpp>    // ContainsSubstring, REQUIRE_THROWS_WITH
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
