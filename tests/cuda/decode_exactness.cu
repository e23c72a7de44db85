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
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <set>
#include <string>
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
void check_model(const char* name, std::uint64_t context, unsigned heads,
                 dhisparse::copy_layers copies = dhisparse::copy_layers::producer_only) {
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
  o.resolve_copies = copies;
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

// The split attention kernel against the test's own model in double precision: scores over all
// row_bytes fp8 dims of the rows the selections name (read from a pool at their locations), a
// softmax over the non-padding rows, the weighted sum of the latent dims. Different arithmetic,
// so a tolerance: relative 1e-4 of the value plus 1e-5 of the softmax-weighted mean |x| (the sum
// cancels, so the value alone can be far smaller than the terms' rounding). Also: the generated
// reference equals the pool path bit for bit, with the bench's split and with one split; padding
// entries (slot -1, past the count) get no output.
template <unsigned D, unsigned V>
void check_attention_model(unsigned k, unsigned heads, unsigned source) {
  constexpr unsigned cap = 5, layers = 2, count = 4;
  const unsigned hist = k + 300;  // rows of each entry's history
  const std::int32_t slots[cap] = {0, 1, -1, 3, 4};  // entry 2 padding, entry 4 past the count
  std::vector<std::uint64_t> tags(cap);
  for (unsigned e = 0; e < cap; ++e) tags[e] = dm::session_tag(100 + e);
  // Selections: entry 0 k distinct rows; entry 1 a fifth of them -1 anywhere; entry 3 three rows.
  std::mt19937 rng(1234 + D);
  std::vector<dhisparse::row_index> sel(static_cast<std::size_t>(cap) * k, dhisparse::no_row);
  std::vector<dhisparse::location> loc(sel.size(), dhisparse::no_location);
  for (unsigned e = 0; e < cap; ++e) {
    std::vector<dhisparse::row_index> rows(hist);
    std::iota(rows.begin(), rows.end(), 0);
    std::shuffle(rows.begin(), rows.end(), rng);
    const unsigned n = e == 3 ? 3 : k;
    for (unsigned i = 0; i < n; ++i) {
      if (e == 1 && rng() % 5 == 0) continue;
      const unsigned at = e == 3 ? i * (k / 3) + 7 : i;  // entry 3: spread over the splits
      sel[e * k + at] = rows[i];
      loc[e * k + at] = static_cast<dhisparse::location>(e * hist + (hist - 1 - rows[i]));  // reversed
    }
  }
  // Pools: row r of entry e at e * hist + (hist - 1 - r) of each layer.
  const std::size_t pool_bytes = static_cast<std::size_t>(cap) * hist * D;
  std::vector<std::vector<std::uint64_t>> pools(layers, std::vector<std::uint64_t>(pool_bytes / 8));
  for (unsigned l = 0; l < layers; ++l)
    for (unsigned e = 0; e < cap; ++e)
      for (unsigned r = 0; r < hist; ++r)
        for (unsigned w = 0; w < D / 8; ++w)
          pools[l][(static_cast<std::size_t>(e) * hist + (hist - 1 - r)) * (D / 8) + w] = dm::kv_word(tags[e], source, l, r, w);

  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  dm::dev_array<std::int32_t> d_slots(cap);
  dm::dev_array<std::uint32_t> d_count(1);
  dm::dev_array<std::uint64_t> d_tags(cap);
  dm::dev_array<dhisparse::row_index> d_sel(sel.size());
  dm::dev_array<dhisparse::location> d_loc(loc.size());
  std::vector<dm::dev_array<std::uint64_t>> d_pools;
  for (unsigned l = 0; l < layers; ++l) {
    d_pools.emplace_back(pool_bytes / 8);
    REQUIRE(cudaMemcpy(d_pools[l].p, pools[l].data(), pool_bytes, cudaMemcpyHostToDevice) == cudaSuccess);
  }
  REQUIRE(cudaMemcpy(d_slots.p, slots, sizeof slots, cudaMemcpyHostToDevice) == cudaSuccess);
  REQUIRE(cudaMemcpy(d_count.p, &count, sizeof count, cudaMemcpyHostToDevice) == cudaSuccess);
  REQUIRE(cudaMemcpy(d_tags.p, tags.data(), d_tags.bytes(), cudaMemcpyHostToDevice) == cudaSuccess);
  REQUIRE(cudaMemcpy(d_sel.p, sel.data(), d_sel.bytes(), cudaMemcpyHostToDevice) == cudaSuccess);
  REQUIRE(cudaMemcpy(d_loc.p, loc.data(), d_loc.bytes(), cudaMemcpyHostToDevice) == cudaSuccess);
  REQUIRE((dm::attention_prepare<D, V>()) == cudaSuccess);
  const std::size_t out_floats = static_cast<std::size_t>(layers) * cap * heads * V;

  const auto run = [&](dm::attention_split_shape split, bool generate) {
    dm::dev_array<float> d_out(out_floats);
    dm::dev_array<float> d_scratch(dm::attention_scratch_floats(split, cap, layers, heads, V));
    REQUIRE(cudaMemset(d_out.p, 0xFF, d_out.bytes()) == cudaSuccess);  // NaN: what no entry may keep
    dm::attention_args a;
    a.slots = d_slots.p;
    a.count = d_count.p;
    a.tag = d_tags.p;
    a.selections = d_sel.p;
    a.locations = d_loc.p;
    for (unsigned l = 0; l < layers; ++l) a.base[l] = reinterpret_cast<const std::byte*>(d_pools[l].p);
    a.out = d_out.p;
    a.scratch = d_scratch.p;
    a.cap = cap;
    a.k = k;
    a.row_bytes = D;
    a.value_dims = V;
    a.heads = heads;
    a.source = source;
    a.splits = split.splits;
    a.split_rows = split.rows;
    a.generate = generate;
    REQUIRE((dm::attention<D, V>(a, layers, stream)) == cudaSuccess);
    std::vector<float> out(out_floats);
    REQUIRE(cudaMemcpyAsync(out.data(), d_out.p, d_out.bytes(), cudaMemcpyDeviceToHost, stream) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
    return out;
  };
  const auto bench_split = dm::attention_split<D>(cap, layers, k);
  REQUIRE(bench_split.splits > 1);
  const dm::attention_split_shape one{1, (k + dm::attention_tile - 1) / dm::attention_tile * dm::attention_tile};
  const auto pooled = run(bench_split, false);
  CHECK(differing_floats(run(bench_split, true), pooled) == 0);
  const auto pooled_one = run(one, false);
  CHECK(differing_floats(run(one, true), pooled_one) == 0);

  // The model, per live entry, layer and head.
  std::size_t checked = 0, bad = 0, untouched = 0;
  std::string first_bad;
  for (unsigned l = 0; l < layers; ++l)
    for (unsigned e = 0; e < cap; ++e) {
      const std::size_t at = (static_cast<std::size_t>(l) * cap + e) * heads * V;
      if (e >= count || slots[e] < 0) {
        for (std::size_t i = 0; i < static_cast<std::size_t>(heads) * V; ++i)
          untouched += std::isnan(pooled[at + i]) && std::isnan(pooled_one[at + i]) ? 1 : 0;
        continue;
      }
      std::vector<std::vector<double>> x;  // the selected rows' dims
      for (unsigned i = 0; i < k; ++i) {
        const auto r = sel[e * k + i];
        if (r < 0) continue;
        std::vector<double> row(D);
        for (unsigned d = 0; d < D; ++d)
          row[d] = dm::fp8_e4m3_to_float(static_cast<std::uint8_t>(dm::kv_word(tags[e], source, l, r, d / 8) >> (8 * (d % 8))));
        x.push_back(std::move(row));
      }
      REQUIRE(!x.empty());
      for (unsigned h = 0; h < heads; ++h) {
        std::vector<double> q(D), sc(x.size());
        for (unsigned d = 0; d < D; ++d) q[d] = dm::attention_query(tags[e], source, l, h, d, D);
        double mx = -HUGE_VAL, sum = 0.0;
        for (std::size_t i = 0; i < x.size(); ++i) {
          sc[i] = 0.0;
          for (unsigned d = 0; d < D; ++d) sc[i] += q[d] * x[i][d];
          mx = std::max(mx, sc[i]);
        }
        for (auto& v : sc) sum += (v = std::exp(v - mx));
        for (unsigned v = 0; v < V; ++v) {
          double want = 0.0, scale = 0.0;
          for (std::size_t i = 0; i < x.size(); ++i) {
            want += sc[i] * x[i][v];
            scale += sc[i] * std::fabs(x[i][v]);
          }
          want /= sum;
          scale /= sum;
          const double tol = 1e-4 * std::fabs(want) + 1e-5 * scale;
          for (const auto* got : {&pooled, &pooled_one}) {
            const double g = (*got)[at + static_cast<std::size_t>(h) * V + v];
            ++checked;
            if (!(std::fabs(g - want) <= tol)) {
              if (bad++ == 0)
                first_bad = "entry " + std::to_string(e) + " layer " + std::to_string(l) + " head " + std::to_string(h) +
                            " dim " + std::to_string(v) + ": got " + std::to_string(g) + ", model " + std::to_string(want);
            }
          }
        }
      }
    }
  CHECK(checked == 2ull * layers * 3 * heads * V);  // entries 0, 1, 3
  INFO(D << "-byte rows, first outside the tolerance: " << first_bad);
  CHECK(bad == 0);
  CHECK(untouched == 2ull * layers * heads * V);  // entries 2 and 4: every output float of both runs untouched
  (void)cudaStreamDestroy(stream);
}

TEST_CASE("decode attention: split kernel against a double-precision model (GLM-5.3 rows, DeepSeek rows)") {
  if (!have_gpu()) return;  // label gpu: run where a device is
  check_attention_model<576, 512>(2048, 16, 0);  // GLM-5.3: 576-byte rows, k 2048, 16 heads
  check_attention_model<288, 256>(512, 5, 1);    // DeepSeek: 288-byte rows, k 512; 5 heads of 16
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

TEST_CASE("decode step: GLM-5.3 slice, every payload layer copied by the resolve (no follower copies)") {
  if (!have_gpu()) return;  // label gpu: run where a device is
  check_model<dhisparse::layouts::glm53, 4096>("glm-5.3", 6'000, 4, dhisparse::copy_layers::all);
}

TEST_CASE("decode step: DeepSeek-V4.1-Flash slice (4 positions a row), outputs bit-identical across policies") {
  if (!have_gpu()) return;  // label gpu: run where a device is
  check_model<dhisparse::layouts::deepseek_v41_flash, 1024>("deepseek-v4.1-flash", 12'000, 4);  // 3,000 rows
}

}  // namespace
