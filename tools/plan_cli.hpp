#pragma once
/// \file
/// Argument parser of the `dhisparse-plan` tool (tools/dhisparse_plan.cpp), kept in a header so
/// that tests can check it. Part of the tool, not of the installed library. Pure C++20, no I/O: it
/// returns options or an error message; `--layout-file` is read by the tool (tools/layout_file.hpp).
#include <array>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include <dhisparse/layouts/deepseek_v41_flash.hpp>
#include <dhisparse/layouts/glm53.hpp>
#include <dhisparse/planner.hpp>

namespace dhisparse::plan_tool {

/// Defaults of the tool: the paper's GLM-5.3 configuration at 100K tokens, 100 GiB of pool.
inline constexpr std::string_view plan_cli_default_layout = "glm-5.3";
inline constexpr std::uint64_t plan_cli_default_context = 100'000;
inline constexpr std::uint64_t plan_cli_default_pool_gib = 100;

/// Usage text printed by `--help`.
inline constexpr std::string_view plan_cli_usage =
    "usage: dhisparse-plan [options]\n"
    "\n"
    "Per-session GPU and host memory of resident serving vs the Adaptive DHiSparse hierarchy.\n"
    "\n"
    "options:\n"
    "  --layout NAME    glm-5.3 | deepseek-v4.1-flash                   default glm-5.3\n"
    "  --layout-file F  a layout described in a JSON file (docs/memory-planner.md)\n"
    "  --context N      context tokens: 100000, 100K, 1M, 1.5M          default 100000\n"
    "                   (K = 10^3, M = 10^6, G = 10^9)\n"
    "  --hot B          hot-cache rows per source, at least top_k       default 4096\n"
    "  --tail ROWS      mutable tail rows per source                    default one page\n"
    "  --drafter NAME   none | dflash2 | dspark                         default none\n"
    "  --slots N        request slots per GPU (ring, staging totals)    default 35\n"
    "  --pool-gib X     GPU GiB available for sessions (90, 90.5)       default 100\n"
    "  --arenas X       staging arenas chi            default payload layers live together\n"
    "\n"
    "configuration (hierarchy_config, residency_config; the GPU budget is --pool-gib):\n"
    "  --max-context N  longest history of one request (max_rows)     default --context\n"
    "  --live-context N tokens all admitted requests hold together     default slots x max\n"
    "  --host-gib X     pinned host GiB the host stores may take        default unchecked\n"
    "  --residency R    adaptive | resident | fixed-budget              default adaptive\n"
    "  --required-pages N   residency_config::required_pages            default 0\n"
    "  --reserve-pages N    residency_config::reserve_pages (M_res)     default 0\n"
    "  --dedicated-staging  dedicated_staging instead of staging_arenas<chi>\n"
    "\n"
    "  --json           print one JSON object instead of a table\n"
    "  --help           print this text\n"
    "\n"
    "Options take their value as the next argument or after '=' (--context=1M).\n"
    "Bad arguments or layouts print a message on stderr and exit with status 2; when no\n"
    "configuration meets the budgets, the plan is printed and the tool exits with status 3.\n";

/// What the command line asked for.
struct plan_cli_options {
  std::string_view layout = plan_cli_default_layout;  ///< built-in layout name, or the file's name
  std::string_view layout_file;                       ///< --layout-file (empty: a built-in layout)
  model_shape model = *model_shape_by_name(plan_cli_default_layout);
  plan_inputs inputs{.context_tokens = plan_cli_default_context,
                     .pool_bytes = plan_cli_default_pool_gib * bytes_per_gib};
  std::optional<std::uint64_t> max_context{};   ///< --max-context (default: --context)
  std::optional<std::uint64_t> live_context{};  ///< --live-context
  std::optional<std::uint64_t> host_bytes{};    ///< --host-gib
  residency_kind residency = residency_kind::adaptive;
  std::uint64_t required_pages = 0;
  std::uint64_t reserve_pages = 0;
  bool dedicated_staging = false;
  bool json = false;
  bool help = false;
};

/// The built-in layouts by name, described at run time (what the configuration needs).
struct known_layout {
  std::string_view name;
  layout_desc layout;
};
inline constexpr std::array known_layouts{
    known_layout{"glm-5.3", describe_layout<layouts::glm53>()},
    known_layout{"deepseek-v4.1-flash", describe_layout<layouts::deepseek_v41_flash>()},
};

/// The built-in layout called `name`, or nullopt.
constexpr std::optional<layout_desc> layout_by_name(std::string_view name) {
  for (const auto& l : known_layouts)
    if (l.name == name) return l.layout;
  return std::nullopt;
}

/// What `plan_hierarchy` is asked for, from the options: the session plan's slots, hot rows, tail,
/// drafter block and arenas, with the pool as the GPU budget (0 when --pool-gib is not given).
constexpr config_inputs config_inputs_of(const plan_cli_options& o) {
  const auto& in = o.inputs;
  config_inputs c;
  c.slots = in.slots;
  c.max_context_tokens = o.max_context.value_or(in.context_tokens);
  c.live_context_tokens = o.live_context;
  c.gpu_bytes = in.pool_bytes.value_or(0);
  c.host_bytes = o.host_bytes;
  c.hot_rows = in.hot_rows;
  c.tail_rows = in.tail_rows;
  c.max_block = in.drafter.present() ? in.drafter.max_block : 1;
  if (!o.dedicated_staging) c.staging_arenas = in.staging_arenas.value_or(o.model.max_live_payload_layers);
  c.residency = o.residency;
  c.required_pages = o.required_pages;
  c.reserve_pages = o.reserve_pages;
  return c;
}

/// Parsed options, or an error message (non-empty) naming the bad argument.
struct plan_cli_result {
  plan_cli_options options;
  std::string error;
  bool ok() const { return error.empty(); }
};

/// A non-negative decimal number "123", "1.5", ".5": whole part and fraction digits.
struct decimal_text {
  std::uint64_t whole = 0;
  std::uint64_t fraction = 0;        ///< fraction digits as an integer ("1.05" -> 5)
  std::uint64_t fraction_scale = 1;  ///< 10^(fraction digit count) ("1.05" -> 100)
};

/// Fraction digits kept by `parse_decimal`: enough for any byte or token count the tool prints.
inline constexpr unsigned max_fraction_digits = 9;

/// Parses a non-negative decimal; nullopt on anything else or on overflow.
constexpr std::optional<decimal_text> parse_decimal(std::string_view text) {
  constexpr std::uint64_t max = std::numeric_limits<std::uint64_t>::max();
  decimal_text d;
  bool digits = false, in_fraction = false;
  unsigned fraction_digits = 0;
  for (const char ch : text) {
    if (ch == '.' && !in_fraction) {
      in_fraction = true;
      continue;
    }
    if (ch < '0' || ch > '9') return std::nullopt;
    const auto digit = static_cast<std::uint64_t>(ch - '0');
    digits = true;
    if (!in_fraction) {
      if (d.whole > (max - digit) / 10) return std::nullopt;
      d.whole = d.whole * 10 + digit;
    } else {
      if (++fraction_digits > max_fraction_digits) return std::nullopt;
      d.fraction = d.fraction * 10 + digit;
      d.fraction_scale *= 10;
    }
  }
  if (!digits) return std::nullopt;
  return d;
}

/// Parses a plain non-negative integer ("4096"); nullopt otherwise.
constexpr std::optional<std::uint64_t> parse_count(std::string_view text) {
  if (text.find('.') != std::string_view::npos) return std::nullopt;
  const auto d = parse_decimal(text);
  return d ? std::optional<std::uint64_t>(d->whole) : std::nullopt;
}

/// Parses a token count with an optional decimal suffix: "100000", "100K" (100,000), "1M",
/// "1.5M", "2G"; nullopt unless the result is a whole number that fits in 64 bits.
constexpr std::optional<std::uint64_t> parse_token_count(std::string_view text) {
  std::uint64_t multiplier = 1;
  if (!text.empty()) {
    switch (text.back()) {
      case 'k': case 'K': multiplier = 1'000; break;
      case 'm': case 'M': multiplier = 1'000'000; break;
      case 'g': case 'G': multiplier = 1'000'000'000; break;
      default: break;
    }
    if (multiplier != 1) text.remove_suffix(1);
  }
  const auto d = parse_decimal(text);
  if (!d) return std::nullopt;
  constexpr std::uint64_t max = std::numeric_limits<std::uint64_t>::max();
  if (d->whole > max / multiplier) return std::nullopt;
  // fraction < fraction_scale <= 10^9 and multiplier <= 10^9: the product fits.
  const std::uint64_t scaled_fraction = d->fraction * multiplier;
  if (scaled_fraction % d->fraction_scale != 0) return std::nullopt;  // not a whole token count
  const std::uint64_t whole = d->whole * multiplier;
  const std::uint64_t extra = scaled_fraction / d->fraction_scale;
  if (whole > max - extra) return std::nullopt;
  return whole + extra;
}

/// Parses a GiB amount ("100", "90.5") into bytes, rounding to the nearest byte.
constexpr std::optional<std::uint64_t> parse_gib_bytes(std::string_view text) {
  const auto d = parse_decimal(text);
  if (!d) return std::nullopt;
  if (d->whole > std::numeric_limits<std::uint64_t>::max() / bytes_per_gib - 1) return std::nullopt;
  // fraction < 10^9 < 2^30 and bytes_per_gib = 2^30: the product stays below 2^60.
  return d->whole * bytes_per_gib + (d->fraction * bytes_per_gib + d->fraction_scale / 2) / d->fraction_scale;
}

/// Why the plan inputs do not fit `o.model`, naming the layout's numbers; empty when they fit.
inline std::string input_problem(const plan_cli_options& o) {
  const auto problem = plan_input_problem(o.model, o.inputs);
  if (problem.empty()) return {};
  return std::string(problem) + " (layout " + std::string(o.layout) + ", top_k " + std::to_string(o.model.top_k) +
         ", payload layers " + std::to_string(o.model.payload_layers) + ", page " +
         std::to_string(o.model.page_rows) + " rows)";
}

/// Parses the tool's arguments (without the program name). Checks the resulting plan inputs too,
/// so a successful result never makes `plan()` reject its inputs.
inline plan_cli_result parse_plan_cli(std::span<const std::string_view> args) {
  plan_cli_result result;
  plan_cli_options& o = result.options;
  const auto fail = [&](std::string message) {
    result.error = std::move(message);
    return result;
  };

  bool layout_named = false;
  for (std::size_t i = 0; i < args.size(); ++i) {
    std::string_view name = args[i];
    std::optional<std::string_view> inline_value;
    if (const auto eq = name.find('='); name.starts_with("--") && eq != std::string_view::npos) {
      inline_value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }

    if (name == "--help" || name == "-h") {
      o.help = true;
      continue;
    }
    if (name == "--json" || name == "--dedicated-staging") {
      if (inline_value) return fail("option " + std::string(name) + " takes no value");
      (name == "--json" ? o.json : o.dedicated_staging) = true;
      continue;
    }

    const bool takes_value = name == "--layout" || name == "--context" || name == "--hot" || name == "--tail" ||
                             name == "--drafter" || name == "--slots" || name == "--pool-gib" ||
                             name == "--arenas" || name == "--layout-file" || name == "--max-context" ||
                             name == "--live-context" || name == "--host-gib" || name == "--residency" ||
                             name == "--required-pages" || name == "--reserve-pages";
    if (!takes_value) {
      if (name.starts_with("-")) return fail("unknown option '" + std::string(name) + "' (see --help)");
      return fail("unexpected argument '" + std::string(name) + "' (see --help)");
    }
    std::string_view value;
    if (inline_value) {
      value = *inline_value;
    } else {
      if (i + 1 >= args.size()) return fail("option " + std::string(name) + " needs a value");
      value = args[++i];
    }
    const auto bad_value = [&](std::string_view expected) {
      return fail("option " + std::string(name) + ": '" + std::string(value) + "' is not " + std::string(expected));
    };

    if (name == "--layout") {
      const auto model = model_shape_by_name(value);
      if (!model) return bad_value("a known layout (glm-5.3, deepseek-v4.1-flash)");
      if (!o.layout_file.empty()) return fail("options --layout and --layout-file exclude each other");
      o.layout = value;
      o.model = *model;
      layout_named = true;
    } else if (name == "--layout-file") {
      if (value.empty()) return bad_value("a file name");
      if (layout_named) return fail("options --layout and --layout-file exclude each other");
      o.layout_file = value;
      o.layout = value;
    } else if (name == "--residency") {
      const auto kind = residency_by_name(value);
      if (!kind) return bad_value("a residency (adaptive, resident, fixed-budget)");
      o.residency = *kind;
    } else if (name == "--max-context" || name == "--live-context") {
      const auto n = parse_token_count(value);
      if (!n) return bad_value("a token count (e.g. 100000, 100K, 1M)");
      (name == "--max-context" ? o.max_context : o.live_context) = *n;
    } else if (name == "--host-gib") {
      const auto bytes = parse_gib_bytes(value);
      if (!bytes) return bad_value("a non-negative number of GiB (e.g. 100, 90.5)");
      o.host_bytes = *bytes;
    } else if (name == "--drafter") {
      const auto drafter = drafter_by_name(value);
      if (!drafter) return bad_value("a known drafter (none, dflash2, dspark)");
      o.inputs.drafter = *drafter;
    } else if (name == "--context") {
      const auto n = parse_token_count(value);
      if (!n) return bad_value("a token count (e.g. 100000, 100K, 1M)");
      o.inputs.context_tokens = *n;
    } else if (name == "--pool-gib") {
      const auto bytes = parse_gib_bytes(value);
      if (!bytes) return bad_value("a non-negative number of GiB (e.g. 100, 90.5)");
      o.inputs.pool_bytes = *bytes;
    } else {
      const auto n = parse_count(value);
      if (!n) return bad_value("a non-negative integer");
      if (name == "--hot") o.inputs.hot_rows = *n;
      else if (name == "--tail") o.inputs.tail_rows = *n;
      else if (name == "--slots") o.inputs.slots = *n;
      else if (name == "--required-pages") o.required_pages = *n;
      else if (name == "--reserve-pages") o.reserve_pages = *n;
      else o.inputs.staging_arenas = *n;  // --arenas
    }
  }

  // A layout file is read and checked by the tool; its inputs are checked once its shape is known.
  if (!o.help && o.layout_file.empty()) {
    if (auto problem = input_problem(o); !problem.empty()) return fail(std::move(problem));
  }
  return result;
}

}  // namespace dhisparse::plan_tool
