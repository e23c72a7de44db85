// decode_dry_run: the host half of bench_decode, no GPU needed. Prints (1) the closed loop's
// admissions for every model, context, target C and policy under the KV budget, against the
// planner's count, with the queue's admission waits in steps; (2) the direct / hot / host census of
// the drifting-query model on the HOST hierarchy at small scale (k = 64, B = 128, 16-row pages,
// the GLM-5.3 ratios B = 2k and tail = one page) for a few drift values; (3) the sessions a
// speculative run keeps (bench_decode --spec: admitted with the drafter / without, Equation 13's
// left side) for GLM-5.3 by context and C. Same code as the GPU run
// (benchmarks/detail/decode_model.hpp, decode_census.hpp).
//
//   decode_dry_run [--budget-gib=90] [--gen-tokens=1024]
#include <cstdio>
#include <cstdlib>
#include <string>

#include <dhisparse/layouts/deepseek_v41_flash.hpp>
#include <dhisparse/layouts/glm53.hpp>
#include <dhisparse/layouts/single_source.hpp>

#include "detail/decode_census.hpp"
#include "detail/decode_model.hpp"

namespace dm = dhisparse_bench::decode;

int main(int argc, char** argv) {
  double budget_gib = 90.0;
  std::uint64_t gen_tokens = 1024;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--budget-gib=", 0) == 0) budget_gib = std::stod(a.substr(13));
    else if (a.rfind("--gen-tokens=", 0) == 0) gen_tokens = std::stoull(a.substr(13));
    else {
      std::fprintf(stderr, "usage: decode_dry_run [--budget-gib=90] [--gen-tokens=1024]\n");
      return 2;
    }
  }
  const auto budget = static_cast<std::uint64_t>(budget_gib * static_cast<double>(1ull << 30));
  std::printf("closed-loop admission under M = %.1f GiB (sessions of %llu generated tokens; wait in steps)\n", budget_gib,
              static_cast<unsigned long long>(gen_tokens));
  std::printf("%-20s %7s %5s | %-22s | %-22s\n", "model", "context", "C", "resident adm/plan wait", "hierarchy adm/plan wait");
  const struct {
    const char* name;
    dhisparse::model_shape shape;
  } models[] = {{"glm-5.3", dhisparse::shape_of<dhisparse::layouts::glm53>()},
                {"deepseek-v4.1-flash", dhisparse::shape_of<dhisparse::layouts::deepseek_v41_flash>()}};
  for (const auto& m : models)
    for (std::uint64_t ctx : {32'000ull, 100'000ull})
      for (std::uint64_t c : {1ull, 4ull, 16ull, 32ull, 64ull, 128ull, 208ull, 256ull}) {
        const auto r = dm::admit_closed_loop(dm::policy::resident, m.shape, ctx, c, budget);
        const auto h = dm::admit_closed_loop(dm::policy::adaptive, m.shape, ctx, c, budget);
        const auto qr = dm::simulate_queue(c, r.admitted, gen_tokens, 1.0, 20 * gen_tokens);
        const auto qh = dm::simulate_queue(c, h.admitted, gen_tokens, 1.0, 20 * gen_tokens);
        std::printf("%-20s %7llu %5llu | %5llu/%-5llu %10.0f | %5llu/%-5llu %10.0f\n", m.name,
                    static_cast<unsigned long long>(ctx), static_cast<unsigned long long>(c),
                    static_cast<unsigned long long>(r.admitted), static_cast<unsigned long long>(r.planner_count),
                    qr.mean_wait_steps, static_cast<unsigned long long>(h.admitted),
                    static_cast<unsigned long long>(h.planner_count), qh.mean_wait_steps);
      }

  // bench_decode --spec admits with the drafter's state charged, under M less speculation's fixed
  // allocations: the share of sessions it keeps is Equation 13's left side, known before any step
  // is timed.
  const std::uint64_t spec_budget = dm::speculative_budget(
      budget, static_cast<std::uint64_t>(dm::spec_fixed_gib_default * static_cast<double>(1ull << 30)));
  std::printf("\nspeculative admission, GLM-5.3 (DFlash2 with K by load, under M - %.1f GiB of fixed allocations; kept = "
              "admitted with / without the drafter)\n",
              dm::spec_fixed_gib_default);
  std::printf("%7s %5s %2s | %-19s | %-19s\n", "context", "C", "K", "resident adm kept", "hierarchy adm kept");
  const auto glm = dhisparse::shape_of<dhisparse::layouts::glm53>();
  for (std::uint64_t ctx : {32'000ull, 100'000ull})
    for (std::uint64_t c : {1ull, 4ull, 16ull, 32ull, 64ull, 128ull, 208ull, 256ull}) {
      const unsigned k = dm::spec_block_for_load(c);
      const auto kept = [&](dm::policy p, std::uint64_t& admitted) {
        const auto plain = dm::admit_closed_loop(p, glm, ctx, c, budget);
        admitted = dm::admit_closed_loop(p, glm, ctx, c, spec_budget, dm::spec_drafter(k)).admitted;
        return plain.admitted == 0 ? 0.0 : static_cast<double>(admitted) / static_cast<double>(plain.admitted);
      };
      std::uint64_t ar = 0, ah = 0;
      const double kr = kept(dm::policy::resident, ar), kh = kept(dm::policy::adaptive, ah);
      std::printf("%7llu %5llu %2u | %5llu %12.3f | %5llu %12.3f\n", static_cast<unsigned long long>(ctx),
                  static_cast<unsigned long long>(c), k, static_cast<unsigned long long>(ar), kr,
                  static_cast<unsigned long long>(ah), kh);
    }

  std::printf("\nhost census (k 64, B 128, 16-row pages, 4 sessions of 2,048 rows, 24 steps after 8 warm-up)\n");
  std::printf("%-6s %-12s %8s %8s %8s\n", "drift", "placement", "direct%", "hot%", "host%");
  using L = dhisparse::layouts::single_source<16, 64, 16>;
  for (float rho : {0.0f, 0.02f, 0.05f, 0.1f, 0.3f, 1.0f})
    for (auto p : {dm::policy::fixed_budget, dm::policy::adaptive}) {
      dm::census_inputs in;
      in.placement = p;
      in.rho = rho;
      in.sessions = 4;
      in.context_rows = 2048;
      in.steps = 32;
      in.warmup = 8;
      const auto c = dm::run_host_census<L, 128>(in);
      std::printf("%-6.2f %-12s %8.2f %8.2f %8.2f\n", rho, std::string(dm::to_string(p)).c_str(), 100 * c.share(c.direct),
                  100 * c.share(c.hot), 100 * c.share(c.host));
    }
  return 0;
}
