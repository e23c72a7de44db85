// A residency argument that is not a ResidencyPolicy is rejected by name.
// expect: ResidencyPolicy
#include <dhisparse/host/hierarchy.hpp>
#include <dhisparse/layouts/tiny.hpp>
struct keeps_everything {};
dhisparse::host_hierarchy<dhisparse::layouts::tiny, dhisparse::lru_hot_cache<16>, keeps_everything> h({});
