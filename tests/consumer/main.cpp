// Consumer of dhisparse::dhisparse: prints the library version and checks that the headers it
// compiled against are the version CMake found (find_package) or added (add_subdirectory).
#include <dhisparse/version.hpp>

#include <cstdio>
#include <string_view>

int main() {
  static_assert(__cplusplus >= 202002L, "dhisparse::dhisparse must bring C++20");
  std::printf("dhisparse %s (host consumer)\n", dhisparse::version_string);
  if (std::string_view{dhisparse::version_string} != CONSUMER_EXPECTED_VERSION) {
    std::printf("error: headers say %s, CMake said %s\n", dhisparse::version_string,
                CONSUMER_EXPECTED_VERSION);
    return 1;
  }
  return 0;
}
