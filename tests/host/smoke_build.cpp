// Smoke test of the build itself: the test shim, Catch2 and the C++ standard in use.
#include "catch.hpp"

#include <dhisparse/version.hpp>

#include <string>

TEST_CASE("tests are compiled as C++20 or later", "[build]") {
  STATIC_REQUIRE(__cplusplus >= 202002L);
  REQUIRE(__cplusplus >= 202002L);
}

TEST_CASE("version header matches its parts", "[build]") {
  const std::string expected = std::to_string(dhisparse::version_major) + "." +
                               std::to_string(dhisparse::version_minor) + "." +
                               std::to_string(dhisparse::version_patch);
  REQUIRE(std::string(dhisparse::version_string) == expected);
  REQUIRE(Catch::Approx(0.1 + 0.2) == 0.3);
}
