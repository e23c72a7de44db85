// A hot cache that cannot hold one selection must not compile.
// expect: HotCache<B> must hold at least top_k rows
#include <dhisparse/host/hierarchy.hpp>
#include <dhisparse/layouts/tiny.hpp>
dhisparse::host_hierarchy<dhisparse::layouts::tiny, dhisparse::lru_hot_cache<8>> h({});
