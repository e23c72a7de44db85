// A residency manager hands out its hierarchy read-only: admitting (or completing, mapping,
// unmapping) behind its books does not compile.
// expect: discards qualifiers
#include <dhisparse/host/hierarchy.hpp>
#include <dhisparse/host/residency_manager.hpp>
#include <dhisparse/layouts/tiny.hpp>
using H = dhisparse::host_hierarchy<dhisparse::layouts::tiny, dhisparse::lru_hot_cache<16>>;
void misuse(dhisparse::residency_manager<H, dhisparse::adaptive_policy<>>& m) { m.hierarchy().admit(7); }
