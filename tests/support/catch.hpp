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
//   DHTEST_SKIP("why")  skips the test case (Catch2 3.3+), or warns and returns (older majors)

#if !defined(DHISPARSE_CATCH2_MAJOR)
#  if __has_include(<catch2/catch_test_macros.hpp>)
#    define DHISPARSE_CATCH2_MAJOR 3
#  else
#    define DHISPARSE_CATCH2_MAJOR 2
#  endif
#endif

#include <string>

#if DHISPARSE_CATCH2_MAJOR >= 3
// Only the parts the tests use, never <catch2/catch_all.hpp> (the benchmark, every matcher and
// every generator would be compiled into each test). Add a header here when a test needs more.
#  include <catch2/catch_approx.hpp>                      // Catch::Approx
#  include <catch2/catch_message.hpp>                     // INFO, CAPTURE
#  include <catch2/catch_template_test_macros.hpp>        // TEMPLATE_TEST_CASE
#  include <catch2/catch_test_macros.hpp>                 // TEST_CASE, SECTION, REQUIRE..., STATIC_REQUIRE
#  include <catch2/generators/catch_generators.hpp>       // GENERATE, values
#  include <catch2/generators/catch_generators_range.hpp> // range
#  include <catch2/matchers/catch_matchers_string.hpp>    // ContainsSubstring, REQUIRE_THROWS_WITH
// Under nvcc, Catch2 3 wraps every assertion in `_Pragma("nv_diagnostic push")` ... `pop`
// (catch_compiler_capabilities.hpp). In assertions inside templates that are instantiated (the
// test twins of tests/cuda), nvcc's front end (cudafe++) then ran for many minutes per file
// instead of seconds (Catch2 3.4 and 3.7, g++ 12 and 13, nvcc 13.0). The pragmas only silence
// warnings in Catch2's own expansions, so they are turned off for CUDA translation units.
// The macros are expanded where an assertion is written, so redefining them here takes effect.
#  if defined(__CUDACC__) && !defined(__clang__)
#    undef CATCH_INTERNAL_START_WARNINGS_SUPPRESSION
#    undef CATCH_INTERNAL_STOP_WARNINGS_SUPPRESSION
#    undef CATCH_INTERNAL_SUPPRESS_UNUSED_VARIABLE_WARNINGS
#    define CATCH_INTERNAL_START_WARNINGS_SUPPRESSION
#    define CATCH_INTERNAL_STOP_WARNINGS_SUPPRESSION
#    define CATCH_INTERNAL_SUPPRESS_UNUSED_VARIABLE_WARNINGS
#  endif
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

// Skipping a test case (e.g. a multi-GPU case on a machine with one GPU): Catch2 3.3 and newer
// have SKIP; older versions have no skipped state, so the case says why and passes.
#if defined(SKIP)
#  define DHTEST_SKIP(message) SKIP(message)
#else
#  define DHTEST_SKIP(message) \
    do {                       \
      WARN(message);           \
      return;                  \
    } while (0)
#endif
