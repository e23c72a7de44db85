// Consumer of dhisparse::dhisparse: prints the library version.
#include <dhisparse/version.hpp>

#include <cstdio>

int main() {
  static_assert(__cplusplus >= 202002L, "dhisparse::dhisparse must bring C++20");
  std::printf("dhisparse %s (host consumer)\n", dhisparse::version_string);
  return dhisparse::version_major == 0 && dhisparse::version_minor == 1 ? 0 : 1;
}
