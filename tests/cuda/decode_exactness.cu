// The model-scale decode step of bench_decode (benchmarks/detail/decode_step.cuh) at small scale:
// resident, fixed-budget and adaptive serving run the same sessions for the same steps in one
// captured graph each, and every step's attention output must be bit-identical across the three
// (given the same selections: the indexer is computed for real on the stored keys of each run), and
// equal to the reference that recomputes every row's bytes instead of reading them. The selections
// must also reach the host (fixed-budget misses) so the copy path is part of what is compared.
#include "../support/catch.hpp"

#include <cstring>
#include <vector>

#include <dhisparse/layouts/deepseek_v41_flash.hpp>
#include <dhisparse/layouts/glm53.hpp>

#include "../../benchmarks/detail/decode_step.cuh"

namespace {

namespace dm = dhisparse_bench::decode;

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

template <class Full, std::size_t B>
void check_model(const char* name, std::uint64_t context, unsigned heads) {
  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  dm::stand_in_gemm gemm(0.0, 1024, 8, stream);  // stand-in off: attention path only
  dm::run_options o;
  o.context = context;
  o.target_c = 3;
  o.heads = heads;
  o.rho = 0.3f;  // fast drift: many fresh selections a step
  o.warmup = 1;
  o.timed = 4;
  o.phased = 2;
  o.stand_in_off_too = false;
  o.keep_outputs = true;
  dm::decode_run<Full, dm::layout_slice<Full, 1>, B> run(name, o, gemm, stream);
  REQUIRE(run.resident_load().admitted == 3);
  REQUIRE(run.hierarchy_load().admitted == 3);

  const auto resident = run.run(dm::policy::resident);
  const auto fixed = run.run(dm::policy::fixed_budget);
  const auto adaptive = run.run(dm::policy::adaptive);
  for (const auto* rec : {&resident, &fixed, &adaptive}) {
    REQUIRE(rec->rows.size() == 1);
    const auto& r = rec->rows[0];
    INFO(name << " " << r.policy << ": " << r.note);
    CHECK(r.note.rfind("FAILED", 0) != 0);
    CHECK(r.mismatches == 0);  // against the generated reference, every step
    CHECK(r.bytes_checked > 0);
    CHECK(r.p50_ms > 0.0);
    REQUIRE(rec->outputs.size() == 7);  // warm-up + timed + phased steps
  }
  CHECK(fixed.rows[0].host_share > 0.0);  // the copy path is exercised
  CHECK(resident.rows[0].direct_share == 1.0);
  CHECK(adaptive.rows[0].direct_share > fixed.rows[0].direct_share);
  for (std::size_t t = 0; t < resident.outputs.size(); ++t) {
    const auto& want = resident.outputs[t];
    for (const auto* rec : {&fixed, &adaptive}) {
      const auto& got = rec->outputs[t];
      REQUIRE(got.size() == want.size());
      std::size_t differ = 0;
      for (std::size_t i = 0; i < want.size(); ++i) {
        std::uint32_t a = 0, b = 0;
        std::memcpy(&a, &got[i], 4);
        std::memcpy(&b, &want[i], 4);
        differ += a != b ? 1 : 0;
      }
      INFO(name << " step " << t << " " << rec->rows[0].policy);
      CHECK(differ == 0);
    }
  }
  (void)cudaStreamDestroy(stream);
}

TEST_CASE("decode step: GLM-5.3 slice, outputs bit-identical across policies") {
  if (!have_gpu()) return;  // label gpu: run where a device is
  check_model<dhisparse::layouts::glm53, 4096>("glm-5.3", 6'000, 4);  // 6,000 rows > k = 2,048: misses
}

TEST_CASE("decode step: DeepSeek-V4.1-Flash slice (4 positions a row), outputs bit-identical across policies") {
  if (!have_gpu()) return;  // label gpu: run where a device is
  check_model<dhisparse::layouts::deepseek_v41_flash, 1024>("deepseek-v4.1-flash", 12'000, 4);  // 3,000 rows
}

}  // namespace
