// The model-scale decode step of bench_decode (benchmarks/detail/decode_step.cuh) at small scale:
// resident, fixed-budget and adaptive serving run the same sessions for the same steps in one
// captured graph each, and every step's attention output must be bit-identical across the three
// (given the same selections: the indexer is computed for real on the stored keys of each run), and
// equal to the reference that recomputes every row's bytes instead of reading them. The selections
// must also reach the host (fixed-budget misses) so the copy path is part of what is compared.
// The speculative step (GLM-5.3, K = 8: stage_blocks, K queries per session, verify, attention for
// each query, commit of the accepted counts) is held to the same: every verified query's output
// bit-identical across policies, given the same selections and acceptances.
#include "../support/catch.hpp"

#include <algorithm>
#include <cstring>
#include <set>
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

std::size_t differing_floats(const std::vector<float>& got, const std::vector<float>& want) {
  std::size_t differ = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    std::uint32_t a = 0, b = 0;
    std::memcpy(&a, &got[i], 4);
    std::memcpy(&b, &want[i], 4);
    differ += a != b ? 1 : 0;
  }
  return differ;
}

TEST_CASE("decode step: GLM-5.3 slice, speculative rounds bit-identical across policies") {
  if (!have_gpu()) return;  // label gpu: run where a device is
  using Full = dhisparse::layouts::glm53;
  constexpr unsigned K = 8;
  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  dm::stand_in_gemm gemm(0.0, 1024, 8, stream);
  dm::run_options o;
  o.context = 6'000;  // rows > k = 2,048: misses, and the block's rows among the selections
  o.target_c = 3;
  o.heads = 4;
  o.rho = 0.3f;
  o.warmup = 1;
  o.timed = 4;
  o.phased = 2;
  o.stand_in_off_too = false;
  o.keep_outputs = true;
  o.spec_block = K;
  dm::decode_run<Full, dm::layout_slice<Full, 1>, 4096> run("glm-5.3", o, gemm, stream);
  REQUIRE(run.block() == K);
  REQUIRE(run.resident_load().admitted == 3);
  REQUIRE(run.hierarchy_load().admitted == 3);

  const auto resident = run.run(dm::policy::resident);
  const auto fixed = run.run(dm::policy::fixed_budget);
  const auto adaptive = run.run(dm::policy::adaptive);
  for (const auto* rec : {&resident, &fixed, &adaptive}) {
    REQUIRE(rec->rows.size() == 1);
    const auto& r = rec->rows[0];
    INFO(r.policy << ": " << r.note);
    CHECK(r.note.rfind("FAILED", 0) != 0);
    CHECK(r.spec_block == K);
    CHECK(r.mismatches == 0);  // every query of every step against the generated reference
    CHECK(r.bytes_checked > 0);
    REQUIRE(rec->outputs.size() == 7);
    REQUIRE(rec->accepted.size() == 7);
    // Tokens per step: the mean of 1 + accepted over the timed steps (steps 1..4), from the counts
    // the run committed.
    double tokens = 0.0;
    for (std::size_t t = 1; t <= 4; ++t)
      for (auto a : rec->accepted[t]) tokens += a + 1.0;
    CHECK(r.tokens_per_step == Approx(tokens / (4.0 * 3.0)));
  }
  // The same acceptances for every policy, all within the block, and not all alike.
  std::set<std::int32_t> seen;
  for (std::size_t t = 0; t < resident.accepted.size(); ++t) {
    REQUIRE(resident.accepted[t].size() == 3);
    CHECK(fixed.accepted[t] == resident.accepted[t]);
    CHECK(adaptive.accepted[t] == resident.accepted[t]);
    for (auto a : resident.accepted[t]) {
      CHECK(a >= 0);
      CHECK(a < static_cast<std::int32_t>(K));
      seen.insert(a);
    }
  }
  CHECK(seen.size() > 1);
  CHECK(fixed.rows[0].host_share > 0.0);  // the verify's copy path is exercised
  CHECK(resident.rows[0].direct_share == 1.0);
  for (std::size_t t = 0; t < resident.outputs.size(); ++t) {
    const auto& want = resident.outputs[t];
    REQUIRE(want.size() == 3 * K * run.floats_per_entry());  // K queries per session, every layer
    for (const auto* rec : {&fixed, &adaptive}) {
      REQUIRE(rec->outputs[t].size() == want.size());
      INFO("step " << t << " " << rec->rows[0].policy);
      CHECK(differing_floats(rec->outputs[t], want) == 0);
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
