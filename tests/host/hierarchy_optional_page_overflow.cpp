// Library bug repro, kept in its own test program because the unfixed library reads out of bounds
// here (AddressSanitizer aborts the whole program; a release build reads heap metadata and
// usually reports the page as already mapped).
//
// host_hierarchy::map_optional_page checks completeness with
//     if ((page + 1) * page_rows > frontier) throw position_beyond_frontier(...)
// in size_t. For page = SIZE_MAX the left side wraps to 0, the check passes and
// `st.optional_page[page]` is read far outside the vector (index -1); for page = SIZE_MAX / p + 1
// it wraps to p. Fix: test the page index first, e.g.
//     if (page >= st.optional_page.size()) throw position_out_of_range(...);
//     if (page >= static_cast<std::size_t>(st.frontier) / page_rows) throw position_beyond_frontier(...);
// (a page is complete iff page < frontier / page_rows), which cannot overflow.
#include "../support/catch.hpp"

#include <dhisparse/host/hierarchy.hpp>
#include <dhisparse/layouts/tiny.hpp>

#include <cstddef>
#include <limits>
#include <string>
#include <vector>

#include "../support/row_content.hpp"

using namespace dhisparse;

TEST_CASE("regression: map_optional_page with a page index near SIZE_MAX is rejected", "[hierarchy][bad_input][regression]") {
  hierarchy_config cfg;
  cfg.max_requests = 1;
  cfg.max_rows = 64;
  cfg.optional_pages = 2;
  host_hierarchy<layouts::tiny, lru_hot_cache<16>> h(cfg);
  REQUIRE(h.admit(1).admitted);
  const auto buf = dhisparse_testing::make_append_buffer(dhisparse_testing::request_tag(1), 0, 2, 64, 0, 40);
  h.append(1, 0, buf, 40);

  const std::size_t page = std::numeric_limits<std::size_t>::max();
  std::string outcome = "ok";
  try {
    (void)h.map_optional_page(1, 0, page);
  } catch (const dhisparse::error& e) {
    outcome = to_string(e.code());
  }
  INFO("map_optional_page(page = SIZE_MAX) gave: " << outcome);
  CHECK((outcome == "position_out_of_range" || outcome == "position_beyond_frontier"));
  CHECK(h.free_optional_pages(0) == 2);
  for (std::int32_t g : h.optional_map_of(1, 0)) CHECK(g == -1);
}
