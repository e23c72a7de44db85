// staging_arenas<chi> with fewer arenas than the payload layers of one source cannot compile.
// expect: staging_arenas<chi> needs chi >= the most payload layers of one source
#include <dhisparse/host/hierarchy.hpp>
#include <dhisparse/layouts/tiny.hpp>
dhisparse::host_hierarchy<dhisparse::layouts::tiny, dhisparse::lru_hot_cache<16>, dhisparse::fixed_budget_policy,
                          dhisparse::staging_arenas<1>>
    h({});
