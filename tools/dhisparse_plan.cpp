// dhisparse-plan: prints the per-session GPU and host memory of resident serving vs the Adaptive
// DHiSparse hierarchy for a model layout, context length, hot-cache size and drafter, and the
// hierarchy_config / residency_config that fit the GPU and host budgets (plan_hierarchy).
//
//   dhisparse-plan                                   # GLM-5.3, 100K tokens, B = 4096, no drafter
//   dhisparse-plan --drafter dflash2                 # the paper's Table 1 with DFlash2
//   dhisparse-plan --drafter dflash2 --arenas 78     # one staging arena per payload layer
//   dhisparse-plan --layout deepseek-v4.1-flash --context 500K --drafter dspark --json
//   dhisparse-plan --layout-file examples/layouts/deepseek_v32.json --slots 4 --context 41800
//                  --live-context 91200 --pool-gib 8 --hot 2048
//
// See docs/memory-planner.md for every term. Exit status: 0 on success, 2 on bad arguments or a
// bad layout file, 3 when no configuration meets the budgets (the plan is still printed).
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <dhisparse/planner.hpp>

#include "layout_file.hpp"
#include "plan_cli.hpp"

namespace {

using dhisparse::session_plan;
using dhisparse::to_gib;
using dhisparse::hierarchy_plan;
using dhisparse::plan_tool::plan_cli_options;

constexpr int exit_bad_arguments = 2;
constexpr int exit_no_configuration = 3;

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

/// The configuration part of the output: the plan, or why there is none.
struct config_result {
  dhisparse::config_inputs inputs;
  std::optional<hierarchy_plan> plan;
  std::string error;
};

std::string staging_name(const hierarchy_plan& c) {
  return c.staging_arenas ? "staging_arenas<" + std::to_string(*c.staging_arenas) + ">" : "dedicated_staging";
}

std::string policy_name(dhisparse::residency_kind k) {
  switch (k) {
    case dhisparse::residency_kind::adaptive: return "adaptive_policy<>";
    case dhisparse::residency_kind::resident: return "resident_policy";
    case dhisparse::residency_kind::fixed_budget: return "fixed_budget_policy";
  }
  return "?";
}

void print_config_table(const config_result& r) {
  const auto& in = r.inputs;
  const std::string live =
      in.live_context_tokens ? grouped(*in.live_context_tokens) + " tokens" : std::string("every slot full");
  std::printf("\nconfiguration: %s residency, %s slots, max context %s tokens, live context %s\n",
              std::string(to_string(in.residency)).c_str(), grouped(in.slots).c_str(),
              grouped(in.max_context_tokens).c_str(), live.c_str());
  if (!r.plan) {
    std::printf("  none: %s\n", r.error.c_str());
    return;
  }
  const hierarchy_plan& c = *r.plan;
  const auto& h = c.config;
  std::printf("\n  %-40s %19s\n", "hierarchy_config", "value");
  print_count_row("max_requests", h.max_requests);
  print_count_row("max_rows", h.max_rows);
  print_count_row(("host_pages (all slots full: " + grouped(c.default_host_pages) + ")").c_str(), h.host_pages);
  print_count_row("tail_rows", h.tail_rows);
  print_count_row(("optional_pages (needed " + grouped(c.optional_pages_needed) + ")").c_str(), h.optional_pages);
  print_count_row("max_block", h.max_block);
  std::printf("  %-40s %19s\n", "residency_config", "value");
  print_count_row("required_pages", c.residency.required_pages);
  print_count_row("reserve_pages", c.residency.reserve_pages);
  std::printf("  hierarchy type: <layout, lru_hot_cache<%s>, %s, %s>\n", std::to_string(c.hot_rows).c_str(),
              policy_name(c.residency_mode).c_str(), staging_name(c).c_str());

  const auto& b = c.bytes;
  std::printf("\n  %-40s %19s %10s\n", "bytes per backend", "bytes", "GiB");
  print_bytes_row("host_hierarchy: simulated GPU pools", b.host_pool_bytes);
  print_bytes_row("host_hierarchy: staging arenas", b.host_staging_arena_bytes);
  print_bytes_row("host_hierarchy: host stores", b.host_store_bytes);
  print_bytes_row("cuda::hierarchy device, at most", b.cuda_device_bytes);
  print_bytes_row("  payload pools", b.cuda_pool_bytes);
  print_bytes_row("  staging arenas", b.cuda_staging_arena_bytes);
  print_bytes_row("  metadata (maps, page tables)", b.cuda_metadata_bytes);
  print_bytes_row("  workspace (copy plans, error books)", b.cuda_workspace_bytes);
  print_bytes_row("  allowance (padding, records)", b.cuda_device_allowance);
  print_bytes_row("cuda::hierarchy pinned (host stores)", b.cuda_pinned_bytes);
  print_bytes_row("  + descriptor rings, frontier snapshot", b.cuda_pinned_allowance);
  print_bytes_row("GPU budget left", c.gpu_bytes_left);
  print_bytes_row("engine's index keys (not charged)", c.index_key_bytes);
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

void print_json(const plan_cli_options& o, const session_plan& p, const config_result& r) {
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
  open("config");
  if (!r.plan) {
    text("error", r.error);
  } else {
    const hierarchy_plan& c = *r.plan;
    text("residency", to_string(c.residency_mode));
    number("hot_rows", c.hot_rows);
    text("staging", staging_name(c));
    open("hierarchy_config");
    number("max_requests", c.config.max_requests);
    number("max_rows", c.config.max_rows);
    number("host_pages", c.config.host_pages);
    number("tail_rows", c.config.tail_rows);
    number("optional_pages", c.config.optional_pages);
    number("max_block", c.config.max_block);
    close();
    open("residency_config");
    number("required_pages", c.residency.required_pages);
    number("reserve_pages", c.residency.reserve_pages);
    close();
    open("derived");
    number("pages_per_request", c.pages_per_request);
    number("live_context_tokens", c.live_context_tokens);
    number("default_host_pages", c.default_host_pages);
    number("optional_pages_needed", c.optional_pages_needed);
    number("optional_pages_budget", c.optional_pages_budget);
    number("optional_page_bytes", c.optional_page_bytes);
    number("host_page_bytes", c.host_page_bytes);
    bytes_and_gib("index_key_bytes", c.index_key_bytes);
    bytes_and_gib("gpu_bytes_left", c.gpu_bytes_left);
    close();
    const auto& b = c.bytes;
    open("host_hierarchy");
    bytes_and_gib("pool_bytes", b.host_pool_bytes);
    bytes_and_gib("staging_arena_bytes", b.host_staging_arena_bytes);
    bytes_and_gib("host_store_bytes", b.host_store_bytes);
    close();
    open("cuda_hierarchy");
    bytes_and_gib("device_bytes", b.cuda_device_bytes);
    number("pool_bytes", b.cuda_pool_bytes);
    number("staging_arena_bytes", b.cuda_staging_arena_bytes);
    number("metadata_bytes", b.cuda_metadata_bytes);
    number("workspace_bytes", b.cuda_workspace_bytes);
    number("device_allowance", b.cuda_device_allowance);
    bytes_and_gib("pinned_bytes", b.cuda_pinned_bytes);
    number("pinned_allowance", b.cuda_pinned_allowance);
    close();
  }
  close();
  j += "}";
  std::printf("%s\n", j.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  namespace tool = dhisparse::plan_tool;
  const std::vector<std::string_view> args(argv + (argc > 0 ? 1 : 0), argv + argc);
  auto parsed = tool::parse_plan_cli(args);
  if (!parsed.ok()) {
    std::fprintf(stderr, "dhisparse-plan: %s\n", parsed.error.c_str());
    return exit_bad_arguments;
  }
  plan_cli_options& o = parsed.options;
  if (o.help) {
    std::fputs(std::string(tool::plan_cli_usage).c_str(), stdout);
    return 0;
  }

  // The layout: built in, or read from a file and checked.
  tool::layout_file file;
  dhisparse::layout_desc layout{};
  if (o.layout_file.empty()) {
    layout = *tool::layout_by_name(o.layout);
  } else {
    auto read = tool::read_layout_file(std::string(o.layout_file));
    if (!read.ok()) {
      std::fprintf(stderr, "dhisparse-plan: %s\n", read.error.c_str());
      return exit_bad_arguments;
    }
    file = std::move(read.layout);
    layout = file.desc();
    if (!file.name.empty()) o.layout = file.name;
    o.model = dhisparse::shape_of(layout);  // checked by the reader: does not throw
    if (const auto problem = tool::input_problem(o); !problem.empty()) {
      std::fprintf(stderr, "dhisparse-plan: %s\n", problem.c_str());
      return exit_bad_arguments;
    }
  }

  session_plan p;
  try {
    p = dhisparse::plan(o.model, o.inputs);
  } catch (const dhisparse::planner_error& e) {
    std::fprintf(stderr, "dhisparse-plan: %s\n", e.what());
    return exit_bad_arguments;
  }
  config_result config;
  config.inputs = tool::config_inputs_of(o);
  try {
    config.plan = dhisparse::plan_hierarchy(layout, config.inputs);
  } catch (const dhisparse::planner_error& e) {
    config.error = e.what();
  }
  if (o.json) {
    print_json(o, p, config);
  } else {
    print_table(o, p);
    print_config_table(config);
  }
  if (!config.plan) {
    std::fprintf(stderr, "dhisparse-plan: no configuration: %s\n", config.error.c_str());
    return exit_no_configuration;
  }
  return 0;
}
