// bench_decode: whole decode steps at model scale on one GPU, under a KV budget, for resident
// serving, the fixed-budget hierarchy and adaptive residency (docs/benchmarks.md, "Decode at model
// scale"). Each configuration: the closed loop admits sessions under --budget-gib (the planner's
// per-session state), the admitted sessions decode in one captured CUDA graph (writes, the indexer
// for real, top-k, resolve, follower copies, sparse MLA attention, a stand-in GEMM), and every step's
// attention output is compared bit for bit with the resident computation over the same selections.
//
//   bench_decode --smoke                    # <= 60 s on an H200: 2 models x 32K x C {4, 16} x 3 policies
//   bench_decode --json=out.json [flags]    # the full grid (see --help); plot with benchmarks/plot_decode.py
//   bench_decode --spec [flags]             # also a speculative run beside each plain one (GLM-5.3:
//                                           # K by load, one verify round a step, Equation 13's verdict)
//
// Not a Google Benchmark program: a configuration is a closed loop with its own setup (histories,
// graphs), timed with CUDA events over its replays; the JSON is written here.
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "detail/decode_model.hpp"
#include "detail/decode_runs.hpp"
#include "detail/decode_step.cuh"

namespace {

namespace dm = dhisparse_bench::decode;

struct cli {
  std::vector<std::string> models{"glm-5.3", "deepseek-v4.1-flash"};
  std::vector<std::uint64_t> contexts{32'000, 100'000};
  std::vector<std::uint64_t> concurrency{1, 4, 16, 32, 64, 128, 208, 256};
  std::vector<dm::policy> policies{dm::policy::resident, dm::policy::fixed_budget, dm::policy::adaptive};
  dm::run_options run;
  double weight_gib = 6.6;
  unsigned hidden = 7168;
  std::string json;
  bool smoke = false;
};

template <class T, class F>
std::vector<T> split(std::string_view s, F parse) {
  std::vector<T> out;
  std::size_t at = 0;
  while (at <= s.size()) {
    const std::size_t comma = s.find(',', at);
    const std::string_view part = s.substr(at, comma == std::string_view::npos ? s.size() - at : comma - at);
    if (!part.empty()) out.push_back(parse(std::string(part)));
    if (comma == std::string_view::npos) break;
    at = comma + 1;
  }
  return out;
}

void usage() {
  std::puts(
      "bench_decode [--smoke] [--json=PATH] [--models=glm-5.3,deepseek-v4.1-flash] [--contexts=32000,100000]\n"
      "             [--concurrency=1,4,16,32,64,128,208,256] [--policies=resident,fixed-budget,adaptive]\n"
      "             [--budget-gib=90] [--weight-gib=6.6 (0: no stand-in)] [--hidden=7168] [--heads=16]\n"
      "             [--drift=0.3] [--warmup=3] [--timed=20] [--phased=5] [--gen-tokens=1024]\n"
      "             [--no-stand-in-off] [--no-check] [--spec] [--spec-alpha=0.7] [--spec-fixed-gib=6.6]\n"
      "             [--copy-layers=producer|all (follower layers by copy_follower, or all in the resolve)]\n"
      "             [--follower-shape=WARPS_PER_SM,ROWS_PER_WARP (set_follower_copy_shape; default the library's)]");
}

cli parse(int argc, char** argv) {
  cli c;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto val = [&](std::string_view key) -> std::optional<std::string> {
      if (a.rfind(std::string(key) + "=", 0) == 0) return a.substr(key.size() + 1);
      return std::nullopt;
    };
    const auto u64 = [](const std::string& s) { return static_cast<std::uint64_t>(std::stoull(s)); };
    if (a == "--smoke") {
      c.smoke = true;
      c.contexts = {32'000};
      c.concurrency = {4, 16};  // low load, where the 1.05x target applies; pins about 2.4 GB of host memory
    } else if (a == "--help" || a == "-h") {
      usage();
      std::exit(0);
    } else if (a == "--no-stand-in-off") {
      c.run.stand_in_off_too = false;
    } else if (a == "--no-check") {
      c.run.check = false;
    } else if (a == "--spec") {
      c.run.spec_too = true;
    } else if (auto v = val("--spec-fixed-gib")) {
      c.run.spec_fixed_gib = std::stod(*v);
      if (!(c.run.spec_fixed_gib >= 0.0)) throw std::invalid_argument("--spec-fixed-gib must be at least 0");
    } else if (auto v = val("--spec-alpha")) {
      c.run.spec_alpha = std::stod(*v);
      if (!(c.run.spec_alpha >= 0.0 && c.run.spec_alpha <= 1.0)) throw std::invalid_argument("--spec-alpha must be in [0, 1]");
    } else if (auto v = val("--json")) {
      c.json = *v;
    } else if (auto v = val("--models")) {
      c.models = split<std::string>(*v, [](const std::string& s) { return s; });
    } else if (auto v = val("--contexts")) {
      c.contexts = split<std::uint64_t>(*v, u64);
    } else if (auto v = val("--concurrency")) {
      c.concurrency = split<std::uint64_t>(*v, u64);
    } else if (auto v = val("--policies")) {
      c.policies = split<dm::policy>(*v, [](const std::string& s) {
        const auto p = dm::policy_by_name(s);
        if (!p) throw std::invalid_argument("unknown policy " + s);
        return *p;
      });
    } else if (auto v = val("--budget-gib")) {
      c.run.budget_gib = std::stod(*v);
    } else if (auto v = val("--weight-gib")) {
      c.weight_gib = std::stod(*v);
    } else if (auto v = val("--hidden")) {
      c.hidden = static_cast<unsigned>(u64(*v));
    } else if (auto v = val("--heads")) {
      c.run.heads = static_cast<unsigned>(u64(*v));
    } else if (auto v = val("--drift")) {
      c.run.rho = std::stof(*v);
    } else if (auto v = val("--warmup")) {
      c.run.warmup = static_cast<unsigned>(u64(*v));
    } else if (auto v = val("--timed")) {
      c.run.timed = static_cast<unsigned>(u64(*v));
    } else if (auto v = val("--phased")) {
      c.run.phased = static_cast<unsigned>(u64(*v));
    } else if (auto v = val("--gen-tokens")) {
      c.run.gen_tokens = u64(*v);
    } else if (auto v = val("--follower-shape")) {
      const auto wr = split<unsigned>(*v, [](const std::string& x) { return static_cast<unsigned>(std::stoul(x)); });
      if (wr.size() != 2 || !dhisparse::cuda::detail::follower_copy_shape::valid(wr[0], wr[1]))
        throw std::invalid_argument("--follower-shape takes WARPS_PER_SM,ROWS_PER_WARP: 1-16 or 32, and 1 or 2");
      c.run.follower_warps_per_sm = wr[0];
      c.run.follower_rows_per_warp = wr[1];
    } else if (auto v = val("--copy-layers")) {
      if (*v == "producer") {
        c.run.resolve_copies = dhisparse::copy_layers::producer_only;
      } else if (*v == "all") {
        c.run.resolve_copies = dhisparse::copy_layers::all;
      } else {
        throw std::invalid_argument("--copy-layers must be producer or all");
      }
    } else {
      usage();
      throw std::invalid_argument("unknown argument " + a);
    }
  }
  for (const auto& m : c.models)
    if (m != "glm-5.3" && m != "deepseek-v4.1-flash") throw std::invalid_argument("unknown model " + m);
  if (c.run.timed == 0) throw std::invalid_argument("--timed must be at least 1");
  return c;
}

std::string settings_json(const cli& c, const std::string& device, const dm::stand_in_gemm& gemm) {
  std::ostringstream o;
  o << "{\"device\": \"" << dm::json_escape(device) << "\", \"budget_gib\": " << c.run.budget_gib
    << ", \"weight_gib\": " << c.weight_gib << ", \"stand_in_on\": " << (gemm.enabled() ? "true" : "false")
    << ", \"stand_in_note\": \"" << dm::json_escape(gemm.note()) << "\"" << ", \"hidden\": " << c.hidden << ", \"heads\": " << c.run.heads
    << ", \"drift\": " << c.run.rho << ", \"warmup\": " << c.run.warmup << ", \"timed\": " << c.run.timed
    << ", \"phased\": " << c.run.phased << ", \"gen_tokens\": " << c.run.gen_tokens
    << ", \"spec\": " << (c.run.spec_too ? "true" : "false") << ", \"spec_alpha\": " << c.run.spec_alpha
    << ", \"spec_fixed_gib\": " << c.run.spec_fixed_gib
    << ", \"spec_drafter\": \"dflash2\""
    << ", \"resolve_copies\": \""
    << (c.run.resolve_copies == dhisparse::copy_layers::all ? "all" : "producer_only") << "\""
    << ", \"follower_shape\": [" << c.run.follower_warps_per_sm << ", " << c.run.follower_rows_per_warp << "]"
    << ", \"slice_sources\": 1, \"model_sources\": {\"glm-5.3\": 21, \"deepseek-v4.1-flash\": 8}"
    << ", \"hot_rows\": {\"glm-5.3\": " << dm::glm53_hot_rows << ", \"deepseek-v4.1-flash\": "
    << dm::deepseek_v41_flash_hot_rows << "}, \"smoke\": " << (c.smoke ? "true" : "false") << "}";
  return o.str();
}

int run(int argc, char** argv) {
  const cli c = parse(argc, argv);
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::puts("bench_decode: no CUDA device, nothing to run");
    return 0;
  }
  cudaDeviceProp prop{};
  DHD_CUDA(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t stream = nullptr;
  DHD_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::uint64_t max_c = 1;
  for (auto x : c.concurrency) max_c = std::max(max_c, x);
  // Speculative steps run the stand-in over K rows a session (K <= 8).
  dm::stand_in_gemm gemm(c.weight_gib, c.hidden, static_cast<unsigned>(max_c) * (c.run.spec_too ? 8u : 1u), stream);
  std::fprintf(stderr, "bench_decode on %s: stand-in %.2f GiB of weights (hidden %u)%s%s, budget %.1f GiB, drift %.3f\n",
               prop.name, gemm.weight_bytes() / double(1ull << 30), c.hidden, gemm.note().empty() ? "" : "; ",
               gemm.note().c_str(), c.run.budget_gib, c.run.rho);

  std::vector<dm::result_row> rows;
  bool failed = false;
  // The JSON is rewritten whole after every configuration (written to a temporary name, then
  // renamed), so an invocation stopped part-way keeps what it measured, as a complete document.
  const auto write_json = [&] {
    if (c.json.empty()) return;
    const std::string part = c.json + ".part";
    {
      std::ofstream f(part);
      f << dm::to_json(rows, settings_json(c, prop.name, gemm));
      if (!f) throw std::runtime_error("cannot write " + part);
    }
    if (std::rename(part.c_str(), c.json.c_str()) != 0) throw std::runtime_error("cannot rename " + part + " to " + c.json);
  };
  write_json();  // a document from the start, then one per configuration measured
  for (const auto& model : c.models)
    for (auto ctx : c.contexts)
      for (auto target : c.concurrency) {
        dm::run_options o = c.run;
        o.context = ctx;
        o.target_c = target;
        const auto t0 = std::chrono::steady_clock::now();
        const auto got = model == "glm-5.3" ? dm::run_glm53(o, c.policies, gemm, stream)
                                            : dm::run_deepseek_v41_flash(o, c.policies, gemm, stream);
        std::fprintf(stderr, "[%s %lluK C%llu: %.1f s wall, setup included]\n", model.c_str(),
                     static_cast<unsigned long long>(ctx / 1000), static_cast<unsigned long long>(target),
                     std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        for (const auto& r : got) {
          std::fprintf(stderr, "%s", dm::to_table({r}).substr(dm::to_table({}).size()).c_str());
          failed = failed || r.mismatches != 0 || r.note.rfind("FAILED", 0) == 0;
        }
        rows.insert(rows.end(), got.begin(), got.end());
        write_json();
      }
  std::fputs(dm::to_table(rows).c_str(), stdout);
  std::puts("phase medians (ms; phases replayed as separate graphs):");
  for (const auto& r : rows) {
    if (!r.stand_in && gemm.enabled()) continue;
    std::printf("  %-20s %-12s %6llu C%-4llu", r.model.c_str(), r.policy.c_str(),
                static_cast<unsigned long long>(r.context), static_cast<unsigned long long>(r.target_c));
    for (std::size_t p = 0; p < dm::phase_names.size(); ++p)
      std::printf(" %s %.3f", std::string(dm::phase_names[p]).c_str(), r.phase_ms[p]);
    std::printf(" | checked %.1f MB\n", static_cast<double>(r.bytes_checked) / 1e6);
  }
  if (c.run.spec_too) {
    std::puts("Equation 13 (speculative rows against the plain run of the same configuration, same stand-in setting):");
    for (const auto& r : rows) {
      if (r.spec_block <= 1 || r.eq13 < 0) continue;
      std::printf("  %-20s %-12s %6llu C%-4llu K %u GEMM %-3s tokens/step %.3f  sessions kept %.3f  TPOT ratio %.3f  -> %s\n",
                  r.model.c_str(), r.policy.c_str(), static_cast<unsigned long long>(r.context),
                  static_cast<unsigned long long>(r.target_c), r.spec_block, r.stand_in ? "on" : "off", r.tokens_per_step,
                  r.sessions_kept_share, r.tpot_ratio, r.eq13 == 1 ? "pays" : "does not pay");
    }
  }
  if (!c.json.empty()) std::fprintf(stderr, "bench_decode: wrote %s\n", c.json.c_str());
  (void)cudaStreamDestroy(stream);
  if (failed) std::puts("bench_decode: FAILED (a mismatch or a failed configuration; see the table)");
  return failed ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_decode: %s\n", e.what());
    return 1;
  }
}
