// A hot-cache argument that is not a HotCache<B> policy is rejected by name.
// expect: HotCachePolicy
#include <dhisparse/host/hierarchy.hpp>
#include <dhisparse/layouts/tiny.hpp>
dhisparse::host_hierarchy<dhisparse::layouts::tiny, int> h({});
