// dhisparse-plan: prints the per-session GPU and host memory of resident serving vs the Adaptive
// DHiSparse hierarchy for a model layout, context length, hot-cache size and drafter.
//
//   dhisparse-plan                                   # GLM-5.3, 100K tokens, B = 4096, no drafter
//   dhisparse-plan --drafter dflash2                 # the paper's Table 1 with DFlash2
//   dhisparse-plan --drafter dflash2 --arenas 78     # one staging arena per payload layer
//   dhisparse-plan --layout deepseek-v4.1-flash --context 500K --drafter dspark --json
//
// See docs/memory-planner.md for every term. Exit status: 0 on success, 2 on bad arguments.
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include <dhisparse/detail/plan_cli.hpp>
#include <dhisparse/planner.hpp>

namespace {

using dhisparse::session_plan;
using dhisparse::to_gib;
using dhisparse::detail::plan_cli_options;

constexpr int exit_bad_arguments = 2;

/// 1234567 -> "1,234,567".
std::string grouped(std::uint64_t n) {
  std::string digits = std::to_string(n);
  std::string out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i != 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

void print_bytes_row(const char* label, std::uint64_t bytes) {
  std::printf("  %-40s %19s %10.3f\n", label, grouped(bytes).c_str(), to_gib(bytes));
}

void print_count_row(const char* label, std::uint64_t count) {
  std::printf("  %-40s %19s\n", label, grouped(count).c_str());
}

void print_table(const plan_cli_options& o, const session_plan& p) {
  const auto& m = o.model;
  const auto& d = o.inputs.drafter;
  std::printf("dhisparse-plan: %s, %s context tokens, drafter %s\n", std::string(o.layout).c_str(),
              grouped(o.inputs.context_tokens).c_str(), std::string(d.name).c_str());
  std::printf("model:   payload layers %s over %s sources; positions per row m = %s; page p = %s rows; "
              "top_k k = %s\n",
              grouped(m.payload_layers).c_str(), grouped(m.sources).c_str(), grouped(m.positions_per_row).c_str(),
              grouped(m.page_rows).c_str(), grouped(m.top_k).c_str());
  std::printf("         payload %s B/row; widest layer row d_KV = %s B; index keys %s B/row; "
              "payload layers live together %s\n",
              grouped(m.payload_bytes_per_row).c_str(), grouped(m.widest_row_bytes).c_str(),
              grouped(m.index_key_bytes_per_row).c_str(), grouped(m.max_live_payload_layers).c_str());
  std::printf("rows:    stored %s -> history %s (%s pages); hot B = %s; tail = %s; staging arenas chi = %s\n",
              grouped(p.stored_rows).c_str(), grouped(p.history_rows).c_str(), grouped(p.history_pages).c_str(),
              grouped(p.hot_rows).c_str(), grouped(p.tail_rows).c_str(), grouped(p.staging_arenas).c_str());
  if (d.present())
    std::printf("drafter: W = %s; K_max = %s; p = %s; %s B per draft row; ring R_d = %s rows\n",
                grouped(d.window).c_str(), grouped(d.max_block).c_str(), grouped(d.page_rows).c_str(),
                grouped(d.draft_row_bytes).c_str(), grouped(p.ring_rows).c_str());

  std::printf("\n  %-40s %19s %10s\n", "per-session GPU memory", "bytes", "GiB");
  print_bytes_row("index keys (whole history)", p.index_keys);
  print_bytes_row("hot cache (B rows, every payload layer)", p.hot_cache);
  print_bytes_row("tail", p.tail);
  print_bytes_row("draft ring (R_d rows)", p.draft_ring);
  print_bytes_row("staging (chi * K_max * k * d_KV)", p.staging);
  print_bytes_row("hierarchical total", p.hierarchical_total);
  print_bytes_row("resident total", p.resident_total);
  std::printf("  %-40s %30.3fx\n", "resident / hierarchical", p.resident_per_hierarchical);
  print_bytes_row("metadata (separate, not in the totals)", p.metadata);
  print_bytes_row("  hot-cache map (int32 row + uint16 LRU)", p.metadata_hot_cache_map);
  print_bytes_row("  page tables (2 x int32 per page)", p.metadata_page_table);
  print_bytes_row("  reverse map (uint16 per row, CUDA)", p.metadata_reverse_map);

  std::printf("\n  %-40s %19s %10s\n", "host (pinned) memory", "bytes", "GiB");
  print_bytes_row("complete history per session", p.host_per_session);

  std::printf("\n  %-40s %19s %10s\n", ("per GPU for " + grouped(p.slots) + " slots").c_str(), "bytes", "GiB");
  print_bytes_row("draft ring", p.ring_bytes_for_slots);
  print_bytes_row("staging (M_stage)", p.staging_bytes_for_slots);

  if (o.inputs.pool_bytes) {
    char heading[96];
    std::snprintf(heading, sizeof heading, "sessions in a %.3f GiB pool", to_gib(*o.inputs.pool_bytes));
    std::printf("\n  %-40s %19s\n", heading, "sessions");
    print_count_row("resident", *p.resident_sessions_in_pool);
    print_count_row("hierarchical", *p.hierarchical_sessions_in_pool);
  }
}

/// JSON string literal for names we control (no characters that need escaping beyond quotes).
std::string quoted(std::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

std::string gib_number(std::uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", to_gib(bytes));
  return buf;
}

void print_json(const plan_cli_options& o, const session_plan& p) {
  const auto& m = o.model;
  const auto& d = o.inputs.drafter;
  std::string j = "{";
  bool first_in_object = true;
  const auto key = [&](std::string_view k) {
    if (!first_in_object) j += ",";
    first_in_object = false;
    j += quoted(k) + ":";
  };
  const auto open = [&](std::string_view k) {
    key(k);
    j += "{";
    first_in_object = true;
  };
  const auto close = [&] {
    j += "}";
    first_in_object = false;
  };
  const auto number = [&](std::string_view k, std::uint64_t v) { key(k), j += std::to_string(v); };
  const auto text = [&](std::string_view k, std::string_view v) { key(k), j += quoted(v); };
  const auto bytes_and_gib = [&](std::string_view k, std::uint64_t v) {
    number(k, v);
    key(std::string(k) + "_gib"), j += gib_number(v);
  };

  text("layout", o.layout);
  text("drafter", d.name);
  open("inputs");
  number("context_tokens", o.inputs.context_tokens);
  number("hot_rows", p.hot_rows);
  number("tail_rows", p.tail_rows);
  number("slots", p.slots);
  number("staging_arenas", p.staging_arenas);
  if (o.inputs.pool_bytes) bytes_and_gib("pool_bytes", *o.inputs.pool_bytes);
  close();
  open("model");
  number("payload_bytes_per_row", m.payload_bytes_per_row);
  number("index_key_bytes_per_row", m.index_key_bytes_per_row);
  number("positions_per_row", m.positions_per_row);
  number("page_rows", m.page_rows);
  number("top_k", m.top_k);
  number("payload_layers", m.payload_layers);
  number("sources", m.sources);
  number("max_live_payload_layers", m.max_live_payload_layers);
  number("widest_row_bytes", m.widest_row_bytes);
  close();
  open("drafter_shape");
  number("window", d.window);
  number("max_block", d.max_block);
  number("page_rows", d.page_rows);
  number("draft_row_bytes", d.draft_row_bytes);
  close();
  open("rows");
  number("stored_rows", p.stored_rows);
  number("history_rows", p.history_rows);
  number("history_pages", p.history_pages);
  number("ring_rows", p.ring_rows);
  close();
  open("per_session");
  bytes_and_gib("index_keys", p.index_keys);
  bytes_and_gib("hot_cache", p.hot_cache);
  bytes_and_gib("tail", p.tail);
  bytes_and_gib("draft_ring", p.draft_ring);
  bytes_and_gib("staging", p.staging);
  bytes_and_gib("hierarchical_total", p.hierarchical_total);
  bytes_and_gib("resident_total", p.resident_total);
  bytes_and_gib("metadata", p.metadata);
  bytes_and_gib("metadata_hot_cache_map", p.metadata_hot_cache_map);
  bytes_and_gib("metadata_page_table", p.metadata_page_table);
  bytes_and_gib("metadata_reverse_map", p.metadata_reverse_map);
  bytes_and_gib("host", p.host_per_session);
  close();
  char ratio[32];
  std::snprintf(ratio, sizeof ratio, "%.3f", p.resident_per_hierarchical);
  key("resident_per_hierarchical"), j += ratio;
  open("per_gpu_for_slots");
  bytes_and_gib("draft_ring", p.ring_bytes_for_slots);
  bytes_and_gib("staging", p.staging_bytes_for_slots);
  close();
  if (p.resident_sessions_in_pool) {
    open("sessions_in_pool");
    number("resident", *p.resident_sessions_in_pool);
    number("hierarchical", *p.hierarchical_sessions_in_pool);
    close();
  }
  j += "}";
  std::printf("%s\n", j.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string_view> args(argv + (argc > 0 ? 1 : 0), argv + argc);
  const auto parsed = dhisparse::detail::parse_plan_cli(args);
  if (!parsed.ok()) {
    std::fprintf(stderr, "dhisparse-plan: %s\n", parsed.error.c_str());
    return exit_bad_arguments;
  }
  const plan_cli_options& o = parsed.options;
  if (o.help) {
    std::fputs(std::string(dhisparse::detail::plan_cli_usage).c_str(), stdout);
    return 0;
  }
  session_plan p;
  try {
    p = dhisparse::plan(o.model, o.inputs);
  } catch (const dhisparse::planner_error& e) {
    std::fprintf(stderr, "dhisparse-plan: %s\n", e.what());
    return exit_bad_arguments;
  }
  if (o.json)
    print_json(o, p);
  else
    print_table(o, p);
  return 0;
}
