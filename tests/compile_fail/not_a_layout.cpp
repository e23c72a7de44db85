// A type that does not describe a KV layout is rejected by the KvLayout concept.
// expect: KvLayout
#include <dhisparse/host/hierarchy.hpp>
struct not_a_layout { static constexpr int top_k = 4; };
dhisparse::host_hierarchy<not_a_layout> h({});
