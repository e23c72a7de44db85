// DraftRing<W, K_max, p>: positions live at once (the drafter's last W positions plus a block of up
// to K_max) never share a row, slots never overlap, and the ring is page-rounded and bounded.
#include <cstddef>
#include <cstdint>
#include <set>
#include <tuple>

#include <dhisparse/policies/draft_ring.hpp>

#include "../support/catch.hpp"

namespace {

template <class Ring>
void check_ring() {
  constexpr std::size_t W = Ring::window, K = Ring::max_block, P = Ring::page_rows, R = Ring::rows_per_slot;
  INFO("W=" << W << " K_max=" << K << " p=" << P << " R_d=" << R);
  // Page-rounded, large enough for the window plus a block plus alignment, and no larger.
  REQUIRE(R % P == 0);
  REQUIRE(R >= W + K);
  REQUIRE(R < W + K + P + P);
  // Every live window [t - W, t + K) maps to distinct rows inside its slot's range, for every
  // frontier t (including far past the ring size: memory is independent of context length).
  for (std::size_t slot = 0; slot < 3; ++slot) {
    for (std::uint64_t t : {std::uint64_t{0}, std::uint64_t{1}, std::uint64_t{W}, std::uint64_t{R - 1}, std::uint64_t{R},
                            std::uint64_t{3 * R + 7}, std::uint64_t{1} << 40}) {
      std::set<std::size_t> rows;
      const std::uint64_t first = t >= W ? t - W : 0;
      for (std::uint64_t pos = first; pos < t + K; ++pos) {
        const std::size_t a = Ring::address(slot, pos);
        REQUIRE(a >= slot * R);
        REQUIRE(a < (slot + 1) * R);
        REQUIRE(rows.insert(a).second);  // no two live positions share a row
      }
    }
  }
}

}  // namespace

TEST_CASE("draft ring: live positions never share a row, slots are disjoint", "[draft_ring]") {
  check_ring<dhisparse::draft_ring<2048, 8, 64>>();  // GLM-5.3 / DFlash2: R_d = 2176
  check_ring<dhisparse::draft_ring<2048, 6, 64>>();
  check_ring<dhisparse::draft_ring<2048, 4, 64>>();
  check_ring<dhisparse::draft_ring<1024, 8, 64>>();
  check_ring<dhisparse::draft_ring<1000, 7, 16>>();  // nothing a multiple of anything
  check_ring<dhisparse::draft_ring<63, 1, 64>>();
  check_ring<dhisparse::draft_ring<0, 8, 1>>();
  check_ring<dhisparse::draft_ring<5, 3, 2>>();
  STATIC_REQUIRE(dhisparse::draft_ring<2048, 8, 64>::rows_per_slot == 2176);
  STATIC_REQUIRE(dhisparse::draft_ring<2048, 6, 64>::rows_per_slot == 2176);  // also covers six- and
  STATIC_REQUIRE(dhisparse::draft_ring<2048, 4, 64>::rows_per_slot == 2176);  // four-query blocks
}
