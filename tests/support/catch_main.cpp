// main() for the tests when built against Catch2 2 (Catch2 3 provides Catch2::Catch2WithMain).
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
