// decode_demo: a synthetic sparse-attention decode of several long requests through the host
// reference hierarchy, as an engine would drive it, with an exactness check on every step.
//
//   decode_demo                                   # 4 requests x 16384 rows, 200 steps, B = 1024
//   decode_demo --requests 8 --history 32768 --steps 100 --hot 4096
//   decode_demo --optional-pages 32 --quiet       # keep 32 optional-history pages per request/source
//
// Per step and source (index producer): generate every request's top-k selection, resolve them as
// one batch with copy_layers::producer_only, replay the copy plan into the follower payload layers
// (layer-wise prefetch), check a sample of the returned locations byte for byte against the host
// copy and the original rows, then append one decoded row per request. See docs/demo.md.
//
// Exit status: 0 success, 1 an exactness check failed, 2 bad arguments, 3 a dhisparse error.
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include <dhisparse/host/hierarchy.hpp>
#include <dhisparse/layouts/demo.hpp>
#include <dhisparse/layouts/glm53.hpp>
#include <dhisparse/planner.hpp>
#include <dhisparse/workload/selection_generator.hpp>

#include "demo_workload.hpp"

namespace {

using namespace dhisparse;
using demo::layout;
using demo::fill_row;
using demo::fill_rows;
using demo::demo_selection_params;
using clock_type = std::chrono::steady_clock;

constexpr int exit_ok = 0, exit_mismatch = 1, exit_bad_arguments = 2, exit_library_error = 3;
constexpr std::size_t sources = source_count<layout>;
using demo::row_bytes;
constexpr std::size_t import_chunk_rows = 1024;               // rows per append call while importing
constexpr std::size_t bytes_per_mib = std::size_t{1} << 20;

constexpr std::string_view usage =
    "usage: decode_demo [options]\n"
    "\n"
    "Synthetic decode of long requests through host_hierarchy<layouts::demo, lru_hot_cache<B>>.\n"
    "\n"
    "options:\n"
    "  --requests N         concurrent requests                             default 4\n"
    "  --history N          imported history rows per request and source    default 16384\n"
    "  --steps N            decode steps                                    default 200\n"
    "  --hot B              hot-cache rows per request and source:\n"
    "                       256 | 512 | 1024 | 4096 (compile-time choices)  default 1024\n"
    "  --optional-pages P   newest history pages per request and source kept\n"
    "                       ready in the optional-history map               default 0\n"
    "  --verify N           entries checked per request, source and step;\n"
    "                       0 checks every entry                            default 32\n"
    "  --every N            print a progress line every N steps             default 20\n"
    "  --seed S             seed of the synthetic selections and rows       default 1\n"
    "  --quiet              print the summary only\n"
    "  --help               print this text\n"
    "\n"
    "Options take their value as the next argument or after '=' (--steps=50).\n";

struct options {
  std::size_t requests = 4;
  std::size_t history = 16384;
  std::size_t steps = 200;
  std::size_t hot = 1024;
  std::size_t optional_pages = 0;
  std::size_t verify = 32;
  std::size_t every = 20;
  std::uint64_t seed = 1;
  bool quiet = false;
  bool help = false;
};

// ---------------------------------------------------------------------------------------------
// Command line
// ---------------------------------------------------------------------------------------------

bool parse_number(std::string_view text, std::uint64_t& out) {
  if (text.empty() || text.size() > 19) return false;
  std::uint64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + static_cast<std::uint64_t>(c - '0');
  }
  out = v;
  return true;
}

/// Parses argv into `o`; returns an error message, empty on success.
std::string parse(int argc, char** argv, options& o) {
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i], value;
    bool has_value = false;
    if (const auto eq = arg.find('='); eq != std::string_view::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      has_value = true;
    }
    if (arg == "--help" || arg == "-h") { o.help = true; continue; }
    if (arg == "--quiet") { o.quiet = true; continue; }
    struct numeric { std::string_view name; std::uint64_t min, max; };
    constexpr std::array<numeric, 8> numerics{{{"--requests", 1, 4096},
                                               {"--history", 1, 1u << 30},
                                               {"--steps", 0, 1u << 30},
                                               {"--hot", 0, 1u << 20},
                                               {"--optional-pages", 0, 1u << 24},
                                               {"--verify", 0, layout::top_k},
                                               {"--every", 1, 1u << 30},
                                               {"--seed", 0, ~std::uint64_t{0}}}};
    const numeric* spec = nullptr;
    for (const auto& n : numerics)
      if (n.name == arg) spec = &n;
    if (!spec) return "unknown option '" + std::string(arg) + "'";
    if (!has_value) {
      if (i + 1 >= argc) return std::string(arg) + " needs a value";
      value = argv[++i];
    }
    std::uint64_t v = 0;
    if (!parse_number(value, v) || v < spec->min || v > spec->max)
      return std::string(arg) + ": '" + std::string(value) + "' is not a whole number in [" +
             std::to_string(spec->min) + ", " + std::to_string(spec->max) + "]";
    if (arg == "--requests") o.requests = v;
    else if (arg == "--history") o.history = v;
    else if (arg == "--steps") o.steps = v;
    else if (arg == "--hot") o.hot = v;
    else if (arg == "--optional-pages") o.optional_pages = v;
    else if (arg == "--verify") o.verify = v;
    else if (arg == "--every") o.every = v;
    else o.seed = v;
  }
  if (o.hot != 256 && o.hot != 512 && o.hot != 1024 && o.hot != 4096)
    return "--hot must be one of the compiled hot-cache sizes 256, 512, 1024, 4096 (got " + std::to_string(o.hot) + ")";
  if (o.optional_pages > o.history / layout::page_rows)
    return "--optional-pages " + std::to_string(o.optional_pages) + " exceeds the " +
           std::to_string(o.history / layout::page_rows) + " complete pages of the imported history";
  return {};
}

// ---------------------------------------------------------------------------------------------
// Statistics and printing
// ---------------------------------------------------------------------------------------------

struct step_totals {
  resolve_stats resolved;           // producer calls (bytes: layer 0 only)
  std::size_t follower_bytes = 0;   // bytes replayed into follower layers
  std::size_t checked = 0;          // (entry, payload layer) pairs compared
  std::size_t mismatches = 0;
  step_totals& operator+=(const step_totals& o) {
    resolved += o.resolved;
    follower_bytes += o.follower_bytes;
    checked += o.checked;
    mismatches += o.mismatches;
    return *this;
  }
  [[nodiscard]] std::size_t recovered_bytes() const { return resolved.bytes_copied + follower_bytes; }
};

struct timers {
  double setup = 0, import = 0, generate = 0, resolve = 0, follower = 0, verify = 0, append = 0;
};

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

/// 1234567 -> "1,234,567".
std::string grouped(std::uint64_t n) {
  const std::string digits = std::to_string(n);
  std::string out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i != 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

double percent(std::size_t part, std::size_t whole) {
  return whole == 0 ? 0.0 : 100.0 * static_cast<double>(part) / static_cast<double>(whole);
}
double mib(std::uint64_t bytes) { return static_cast<double>(bytes) / static_cast<double>(bytes_per_mib); }

void print_progress_header() {
  std::printf("\n%-11s %9s %9s %8s %8s %8s %10s %11s %12s\n", "steps", "history", "entries", "direct", "hot",
              "host", "GPU hit", "host rows", "recovered");
  std::printf("%-11s %9s %9s %8s %8s %8s %10s %11s %12s\n", "", "rows", "", "%", "%", "%", "%", "copied", "MiB");
}

void print_progress(std::size_t first, std::size_t last, std::int64_t history, const step_totals& t) {
  const auto& s = t.resolved;
  const std::string range = std::to_string(first) + "-" + std::to_string(last);
  std::printf("%-11s %9s %9s %8.1f %8.1f %8.1f %10.1f %11s %12.2f\n", range.c_str(),
              grouped(static_cast<std::uint64_t>(history)).c_str(), grouped(s.selected).c_str(),
              percent(s.direct, s.selected), percent(s.hot, s.selected), percent(s.host, s.selected),
              percent(s.direct + s.hot, s.selected), grouped(s.rows_copied).c_str(), mib(t.recovered_bytes()));
}

void print_memory_row(const char* label, const session_plan& p, bool in_gib) {
  char hier[32], res[32];
  if (in_gib) {
    std::snprintf(hier, sizeof hier, "%.3f GiB", to_gib(p.hierarchical_total));
    std::snprintf(res, sizeof res, "%.3f GiB", to_gib(p.resident_total));
  } else {
    std::snprintf(hier, sizeof hier, "%.1f MiB", mib(p.hierarchical_total));
    std::snprintf(res, sizeof res, "%.1f MiB", mib(p.resident_total));
  }
  std::printf("  %-44s %14s %14s %9.1fx\n", label, hier, res, p.resident_per_hierarchical);
}

// ---------------------------------------------------------------------------------------------
// The decode
// ---------------------------------------------------------------------------------------------

/// Selection shape for top-k 256 over a 16K-row history: 4 sink rows, a quarter of k from the 512
/// newest rows, at least 15% uniform over the history, the rest from a slowly drifting set of
/// heavy hitters (about 1.7 of 167 replaced per step).

template <std::size_t B>
int run(const options& o) {
  using hierarchy = host_hierarchy<layout, lru_hot_cache<B>>;
  const auto wall0 = clock_type::now();
  timers time;

  hierarchy_config cfg;
  cfg.max_requests = o.requests;
  cfg.max_rows = o.history + o.steps;
  cfg.optional_pages = o.requests * o.optional_pages;
  auto t_setup = clock_type::now();
  hierarchy h(cfg);  // allocates every slot's host store at full capacity and the simulated GPU pools
  time.setup = seconds_since(t_setup);

  std::printf("decode_demo: %zu requests x %s imported rows, %zu decode steps, seed %llu\n", o.requests,
              grouped(o.history).c_str(), o.steps, static_cast<unsigned long long>(o.seed));
  std::printf("  layout demo: %zu index producers, %zu payload layers of %zu-byte rows, top_k %zu, page %zu rows\n",
              sources, payload_layer_count<layout>(), row_bytes, layout::top_k, layout::page_rows);
  std::printf("  host_hierarchy<layouts::demo, lru_hot_cache<%zu>>: tail %zu rows, optional history %zu pages "
              "per request and source\n",
              B, h.config().tail_rows, o.optional_pages);

  // Admission and import of the prefilled history through append().
  std::vector<request_id> ids(o.requests);
  for (std::size_t r = 0; r < o.requests; ++r) {
    ids[r] = 1000 + r;  // the engine's ids; the hierarchy maps them to slots
    if (!h.admit(ids[r])) throw invalid_configuration("no free request slot for request " + std::to_string(ids[r]));
  }
  {
    const auto t0 = clock_type::now();
    std::vector<std::byte> buf;
    std::size_t bytes = 0;
    for (std::size_t r = 0; r < o.requests; ++r)
      for (std::size_t s = 0; s < sources; ++s)
        for (std::size_t first = 0; first < o.history; first += import_chunk_rows) {
          const std::size_t count = std::min(import_chunk_rows, o.history - first);
          fill_rows(buf, o.seed, r, s, static_cast<std::int64_t>(first), count);
          h.append(ids[r], s, buf, count);
          bytes += buf.size();
        }
    // Optional history: the newest complete pages of the imported history, where the
    // selections' recent share is densest.
    const std::size_t pages = o.history / layout::page_rows;
    for (std::size_t r = 0; r < o.requests; ++r)
      for (std::size_t s = 0; s < sources; ++s)
        for (std::size_t g = pages - o.optional_pages; g < pages; ++g)
          if (!h.map_optional_page(ids[r], s, g)) throw invalid_configuration("optional-history pool is full");
    time.import = seconds_since(t0);
    std::printf("  import: %s rows per request and source, %.1f MiB of payload appended to the host store in %.2f s\n",
                grouped(o.history).c_str(), mib(bytes), time.import);
  }

  // One generator stream per (request, source).
  std::array<workload::selection_batch, sources> gens{
      workload::selection_batch(demo_selection_params(), workload::stream_seed(o.seed, 0), o.requests),
      workload::selection_batch(demo_selection_params(), workload::stream_seed(o.seed, 1), o.requests),
      workload::selection_batch(demo_selection_params(), workload::stream_seed(o.seed, 2), o.requests)};
  static_assert(sources == 3, "one selection_batch per source of the demo layout");
  constexpr std::size_t k = layout::top_k;
  std::vector<row_index> selections(o.requests * k);
  std::vector<location> locations(o.requests * k);
  std::vector<resolve_item> batch(o.requests);
  std::vector<std::int64_t> frontiers(o.requests);
  std::vector<std::byte> expected(row_bytes), row_buf;
  workload::splitmix64 sample_rng{workload::stream_seed(o.seed, 0xC0FFEE)};

  step_totals total, interval;
  if (!o.quiet) print_progress_header();
  std::size_t interval_first = 1;
  for (std::size_t step = 1; step <= o.steps; ++step) {
    step_totals st;
    for (std::size_t s = 0; s < sources; ++s) {
      const std::size_t layers = layout::sources[s].payload_layers;
      // 1. the indexer's top-k for every request (here: synthetic)
      auto t0 = clock_type::now();
      for (std::size_t r = 0; r < o.requests; ++r) frontiers[r] = h.frontier(ids[r], s);
      gens[s].next(frontiers, selections);
      time.generate += seconds_since(t0);

      // 2. one batched resolver call for the producer layer
      t0 = clock_type::now();
      for (std::size_t r = 0; r < o.requests; ++r)
        batch[r] = resolve_item{ids[r], std::span<const row_index>(selections).subspan(r * k, k),
                                std::span<location>(locations).subspan(r * k, k)};
      st.resolved += h.resolve(s, batch, copy_layers::producer_only);
      time.resolve += seconds_since(t0);

      // 3. layer-wise prefetch: each follower layer replays the copy plan with its own bytes
      t0 = clock_type::now();
      for (std::size_t l = 1; l < layers; ++l) st.follower_bytes += h.copy_follower(s, l);
      time.follower += seconds_since(t0);

      // 4. exactness: what attention would read at the returned location is the original row
      t0 = clock_type::now();
      for (std::size_t r = 0; r < o.requests; ++r) {
        const auto sel = batch[r].selection;
        const auto loc = batch[r].locations;
        const std::size_t checks = o.verify == 0 ? k : o.verify;
        for (std::size_t c = 0; c < checks; ++c) {
          const std::size_t i = o.verify == 0 ? c : static_cast<std::size_t>(sample_rng.below(k));
          if (sel[i] == no_row) {
            ++st.checked;
            st.mismatches += loc[i] == no_location ? 0 : 1;
            continue;
          }
          for (std::size_t l = 0; l < layers; ++l) {
            fill_row(expected.data(), o.seed, r, s, l, sel[i]);
            const auto gpu = h.payload(s, l, loc[i]);
            const auto host = h.host_row(ids[r], s, l, sel[i]);
            ++st.checked;
            if (std::memcmp(gpu.data(), host.data(), row_bytes) != 0 ||
                std::memcmp(host.data(), expected.data(), row_bytes) != 0) {
              if (st.mismatches < 5)
                std::fprintf(stderr,
                             "MISMATCH step %zu source %zu request %llu entry %zu row %d layer %zu location %d\n",
                             step, s, static_cast<unsigned long long>(ids[r]), i, sel[i], l, loc[i]);
              ++st.mismatches;
            }
          }
        }
      }
      time.verify += seconds_since(t0);
    }

    // 5. decode: one new row per request and source (every payload layer) joins the history
    const auto t0 = clock_type::now();
    for (std::size_t r = 0; r < o.requests; ++r)
      for (std::size_t s = 0; s < sources; ++s) {
        const std::int64_t row = h.frontier(ids[r], s);
        fill_rows(row_buf, o.seed, r, s, row, 1);
        h.append(ids[r], s, row_buf, 1);
      }
    time.append += seconds_since(t0);

    total += st;
    interval += st;
    if (!o.quiet && (step % o.every == 0 || step == o.steps)) {
      print_progress(interval_first, step, h.frontier(ids[0], 0), interval);
      interval = {};
      interval_first = step + 1;
    }
  }
  for (request_id id : ids) h.complete(id);
  const double wall = seconds_since(wall0);

  // Summary.
  const auto& s = total.resolved;
  const std::size_t calls = o.steps * sources;
  std::printf("\nSummary: %zu decode steps x %zu requests; %s batched resolver calls (one per source and step), "
              "%s follower copies\n",
              o.steps, o.requests, grouped(calls).c_str(),
              grouped(o.steps * follower_copies_per_step<layout>()).c_str());
  std::printf("  %-40s %14s %8s\n", "selection entries resolved", grouped(s.selected).c_str(), "100.0 %");
  std::printf("  %-40s %14s %6.1f %%\n", "  directly (tail, optional history)", grouped(s.direct).c_str(),
              percent(s.direct, s.selected));
  std::printf("  %-40s %14s %6.1f %%\n", "  from the hot cache", grouped(s.hot).c_str(), percent(s.hot, s.selected));
  std::printf("  %-40s %14s %6.1f %%\n", "  recovered from host memory", grouped(s.host).c_str(),
              percent(s.host, s.selected));
  const double per_call = calls == 0 || o.requests == 0 ? 0.0
                                                        : static_cast<double>(s.rows_copied) /
                                                              static_cast<double>(calls * o.requests);
  std::printf("  %-40s %14s   (%.1f per request and source per step)\n", "distinct rows copied from host",
              grouped(s.rows_copied).c_str(), per_call);
  std::printf("  %-40s %14.1f MiB (producer layers %.1f + follower layers %.1f)\n", "bytes recovered from host",
              mib(total.recovered_bytes()), mib(s.bytes_copied), mib(total.follower_bytes));
  if (o.steps > 0 && o.requests > 0)
    std::printf("  %-40s %14.1f KiB\n", "  per request per decoded token",
                static_cast<double>(total.recovered_bytes()) / 1024.0 / static_cast<double>(o.steps * o.requests));
  std::printf("  %-40s %14s   (entry x payload layer pairs; %s mismatches)\n", "exactness checks",
              grouped(total.checked).c_str(), grouped(total.mismatches).c_str());

  // Per-session GPU memory from the planner.
  const std::uint64_t context = o.history + o.steps;
  const session_plan demo_plan = plan<layout>({.context_tokens = context, .hot_rows = B});
  const session_plan glm_plan = plan<layouts::glm53>({.context_tokens = 100'000, .hot_rows = 4096});
  std::printf("\nPer-session GPU memory (planner, no drafter)   %14s %14s %10s\n", "hierarchical", "resident",
              "ratio");
  const std::string demo_label = "demo layout, " + grouped(context) + " rows, B = " + grouped(B);
  print_memory_row(demo_label.c_str(), demo_plan, false);
  print_memory_row("GLM-5.3, 100,000 tokens, B = 4,096 (Table 1)", glm_plan, true);
  std::printf("  host copy of the history per session: demo %.1f MiB, GLM-5.3 %.3f GiB\n",
              mib(demo_plan.host_per_session), to_gib(glm_plan.host_per_session));
  if (o.optional_pages > 0)
    std::printf("  (plus %zu optional-history pages per source: %.1f MiB per session, reclaimable)\n", o.optional_pages,
                mib(o.optional_pages * layout::page_rows * payload_bytes_per_row<layout>()));

  std::printf("\nWall time %.2f s: setup %.2f s, import %.2f s; decode: generate %.2f, resolve %.2f, "
              "follower copies %.2f, verify %.2f, append %.2f s\n",
              wall, time.setup, time.import, time.generate, time.resolve, time.follower, time.verify, time.append);
  std::printf("(host reference backend: the times show this program's cost, not GPU kernel timings)\n");

  if (total.mismatches != 0) {
    std::printf("\nFAILED: %s of %s exactness checks did not match\n", grouped(total.mismatches).c_str(),
                grouped(total.checked).c_str());
    return exit_mismatch;
  }
  std::printf("\nOK: every checked location held the original row, bit for bit\n");
  return exit_ok;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  if (const std::string error = parse(argc, argv, o); !error.empty()) {
    std::fprintf(stderr, "decode_demo: %s\n\n%.*s", error.c_str(), static_cast<int>(usage.size()), usage.data());
    return exit_bad_arguments;
  }
  if (o.help) {
    std::printf("%.*s", static_cast<int>(usage.size()), usage.data());
    return exit_ok;
  }
  try {
    switch (o.hot) {
      case 256: return run<256>(o);
      case 512: return run<512>(o);
      case 1024: return run<1024>(o);
      default: return run<4096>(o);
    }
  } catch (const dhisparse::error& e) {
    std::fprintf(stderr, "decode_demo: %s (%s)\n", e.what(), dhisparse::to_string(e.code()));
    return exit_library_error;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "decode_demo: %s\n", e.what());
    return exit_library_error;
  }
}
