#pragma once
/// \file
/// The host-side model of the model-scale decode benchmark (benchmarks/bench_decode.cu): everything
/// that needs no GPU, so that host tests (tests/host/decode_model.cpp) check it and the one GPU
/// run only measures. Pure C++20; the content and selection functions are also `__host__
/// __device__` so the CUDA step computes exactly what this file defines.
///
///  - Content: every KV row byte and index key of (session tag, source, layer, row) is a function
///    of those coordinates, so the bytes any policy reads can be recomputed and compared.
///  - Locality: the indexer's query of (session, source) is an AR(1) random walk with a drift knob
///    rho (q_t = sqrt(1 - rho^2) q_{t-1} + rho n_t, n_t independent), quantised to int8; each
///    history row has a fixed random int8 index key; the selection is the top-k of
///    scale(row) * dot(q_t, key(row)), ties by ascending row. Small rho keeps consecutive
///    selections largely equal (temporal locality); rho = 1 draws a fresh query every step.
///  - Load: sessions of one context length arrive to keep C outstanding; each policy admits what
///    its per-session GPU state lets fit in the KV budget M (resident: the whole history; the
///    hierarchy: the planner's required state), the rest wait (`admit_closed_loop`), and
///    `simulate_queue` turns that into admission waits.
///  - Speculation: the paper's block schedule by load and a fixed accepted-length distribution.
///  - Statistics and output: p50/p90 of step times, tokens/s, a text table and JSON.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <dhisparse/planner.hpp>

#if defined(__CUDACC__)
#define DHD_HD __host__ __device__
#else
#define DHD_HD
#endif

namespace dhisparse_bench::decode {

// ------------------------------------------------------------------ content

/// splitmix64 finaliser.
DHD_HD constexpr std::uint64_t mix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// Session tag: the identity all content of session `id` derives from.
DHD_HD constexpr std::uint64_t session_tag(std::uint64_t id) { return mix64(id * 0x9E37ull + 11); }

/// fp8 e4m3 bytes whose exponent is at most 7 (|x| <= 1.875, never NaN): every KV byte is masked
/// with this, so attention stays finite whatever rows it reads.
inline constexpr std::uint64_t kv_byte_mask = 0xBFBFBFBFBFBFBFBFull;

/// 8-byte word `w` of the KV row of (session tag, source, payload layer, stored row).
DHD_HD constexpr std::uint64_t kv_word(std::uint64_t tag, unsigned source, unsigned layer, std::int64_t row,
                                       unsigned w) {
  const std::uint64_t where = (static_cast<std::uint64_t>(source) << 56) ^ (static_cast<std::uint64_t>(layer) << 48) ^
                              static_cast<std::uint64_t>(row);
  return mix64(mix64(tag ^ mix64(where)) + w) & kv_byte_mask;
}

/// fp8 e4m3 (no NaN/inf reached, see kv_byte_mask) to float, exactly.
DHD_HD inline float fp8_e4m3_to_float(std::uint8_t b) {
  const int e = (b >> 3) & 15, m = b & 7;
  const float mag = e == 0 ? static_cast<float>(m) * 0.001953125f  // m/8 * 2^-6
                           : (1.0f + static_cast<float>(m) * 0.125f) * ldexpf(1.0f, e - 7);
  return (b & 0x80) != 0 ? -mag : mag;
}

/// The sparse-attention query of (tag, source, payload layer, head, dim): fixed per session (the
/// selections carry the step's variation), uniform in [-1, 1) / sqrt(row dims). Every operation is
/// correctly rounded (the product and difference exact), so host and device compute the same float.
DHD_HD inline float attention_query(std::uint64_t tag, unsigned source, unsigned layer, unsigned head, unsigned dim,
                                    unsigned dims) {
  const std::uint64_t h = mix64(tag ^ 0xA77Eull ^ (static_cast<std::uint64_t>(source) << 48) ^
                                (static_cast<std::uint64_t>(layer) << 40) ^ (static_cast<std::uint64_t>(head) << 24) ^ dim);
  const float u = 2.0f * (static_cast<float>(h >> 40) * (1.0f / 16777216.0f)) - 1.0f;  // exact: 24-bit grid
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(u, __fsqrt_rn(static_cast<float>(dims)));
#else
  return u / std::sqrt(static_cast<float>(dims));
#endif
}

/// Indexer key dimensions (int8) per stored row; with the fp32 scale, 132 bytes as the layouts state.
inline constexpr unsigned index_dims = 128;

/// 8-byte word `w` (of 16) of the index key of (tag, source, row): 8 raw bytes, each read as the
/// int8 dimension `key_dim(byte)`.
DHD_HD constexpr std::uint64_t key_word(std::uint64_t tag, unsigned source, std::int64_t row, unsigned w) {
  return mix64(mix64(tag ^ 0x1DE5ull ^ (static_cast<std::uint64_t>(source) << 52) ^ static_cast<std::uint64_t>(row)) + w);
}

/// A key byte as its dimension: uniform in [-64, 63] (symmetric, so no row scale dominates).
DHD_HD constexpr int key_dim(std::uint64_t byte) { return static_cast<int>(byte & 0x7Fu) - 64; }

/// Scale of a row's index key: 1 or 1/2, so scale * dot is exact in float.
DHD_HD constexpr float key_scale(std::uint64_t tag, unsigned source, std::int64_t row) {
  const auto e = static_cast<unsigned>(mix64(tag ^ 0x5CA1Eull ^ (static_cast<std::uint64_t>(source) << 52) ^
                                             static_cast<std::uint64_t>(row)) & 1u);
  return e == 0 ? 1.0f : 0.5f;
}

/// Uniform in [0, 1) from a hash.
DHD_HD constexpr float unit_float(std::uint64_t h) { return static_cast<float>(h >> 40) * (1.0f / 16777216.0f); }

/// Approximately standard normal innovation n_t[d] of (tag, source, step): Irwin-Hall of 4 uniforms.
DHD_HD inline float innovation(std::uint64_t tag, unsigned source, std::uint64_t step, unsigned d) {
  const std::uint64_t h = mix64(tag ^ 0xD41F7ull ^ (static_cast<std::uint64_t>(source) << 56) ^ (step << 8) ^ d);
  float s = 0.0f;
  for (unsigned i = 0; i < 4; ++i) s += unit_float(mix64(h + i));
  return (s - 2.0f) * 1.7320508f;  // variance of the sum of 4 U(0,1) is 1/3
}

/// One step of the query walk: q <- sqrt(1 - rho^2) q + rho n (stationary unit variance).
DHD_HD inline float drift_query(float q, float rho, float n) { return sqrtf(1.0f - rho * rho) * q + rho * n; }

/// Quantised query dimension (int8 of the walk's value at 24 steps per unit).
DHD_HD inline int quantise_query(float q) {
  const float v = rintf(q * 24.0f);
  return static_cast<int>(v > 127.0f ? 127.0f : (v < -127.0f ? -127.0f : v));
}

/// Index score of a stored row: scale * dot(q, key) (exact: |dot| < 2^21 and the scale a power of two).
DHD_HD inline float index_score(const int* q, std::uint64_t tag, unsigned source, std::int64_t row) {
  int dot = 0;
  for (unsigned w = 0; w < index_dims / 8; ++w) {
    const std::uint64_t k = key_word(tag, source, row, w);
    for (unsigned b = 0; b < 8; ++b) dot += q[w * 8 + b] * key_dim(k >> (8 * b));
  }
  return static_cast<float>(dot) * key_scale(tag, source, row);
}

/// The query walk of one (session, source) on the host: state after `steps` steps (initial state
/// the innovation of step 0, i.e. the walk started at stationarity).
struct query_walk {
  std::uint64_t tag = 0;
  unsigned source = 0;
  float rho = 0.0f;
  std::uint64_t step = 0;
  std::array<float, index_dims> q{};

  query_walk(std::uint64_t t, unsigned s, float r) : tag(t), source(s), rho(r) {
    for (unsigned d = 0; d < index_dims; ++d) q[d] = innovation(tag, source, 0, d);
  }
  /// Advances one step.
  void advance() {
    ++step;
    for (unsigned d = 0; d < index_dims; ++d) q[d] = drift_query(q[d], rho, innovation(tag, source, step, d));
  }
  /// The quantised query.
  [[nodiscard]] std::array<int, index_dims> quantised() const {
    std::array<int, index_dims> out{};
    for (unsigned d = 0; d < index_dims; ++d) out[d] = quantise_query(q[d]);
    return out;
  }
};

/// Host reference indexer: the top-k rows of [0, visible) by (score descending, row ascending),
/// -1 padded to k. The GPU computes the same order with a stable descending radix sort of the
/// scores over ascending rows.
inline std::vector<std::int32_t> select_top_k(const std::array<int, index_dims>& q, std::uint64_t tag, unsigned source,
                                              std::int64_t visible, std::size_t k) {
  std::vector<std::pair<float, std::int32_t>> scored(static_cast<std::size_t>(visible));
  for (std::int64_t r = 0; r < visible; ++r)
    scored[static_cast<std::size_t>(r)] = {index_score(q.data(), tag, source, r), static_cast<std::int32_t>(r)};
  const std::size_t n = std::min<std::size_t>(k, scored.size());
  std::partial_sort(scored.begin(), scored.begin() + static_cast<std::ptrdiff_t>(n), scored.end(),
                    [](const auto& a, const auto& b) { return a.first != b.first ? a.first > b.first : a.second < b.second; });
  std::vector<std::int32_t> out(k, -1);
  for (std::size_t i = 0; i < n; ++i) out[i] = scored[i].second;
  return out;
}

// ------------------------------------------------------------------ speculation

/// DFlash2-like block K (anchor + proposals) by target concurrency: the paper's schedule, 8 up to
/// C32, 6 below C128 (C64 in the paper's grid), 4 from C128.
constexpr unsigned spec_block_for_load(std::uint64_t target_c) { return target_c <= 32 ? 8u : (target_c < 128 ? 6u : 4u); }

/// Fixed accepted-length distribution: each proposal is accepted with probability `alpha`
/// (default 0.7) independently until the first rejection, truncated at K - 1 proposals.
/// P(accepted = j) = alpha^j (1 - alpha) for j < K - 1, alpha^(K-1) for j = K - 1.
/// Tokens a round commits = accepted + 1 (the anchor's token). 0.7 is a documented assumption
/// (the paper does not publish DFlash2's per-position acceptance), not a measurement.
struct accepted_length_distribution {
  double alpha = 0.7;
  unsigned block = 8;

  /// P(accepted = j), j in [0, block - 1].
  [[nodiscard]] double pmf(unsigned j) const {
    if (block == 0 || j >= block) return 0.0;
    if (j == block - 1) return std::pow(alpha, static_cast<double>(j));
    return std::pow(alpha, static_cast<double>(j)) * (1.0 - alpha);
  }
  /// Mean tokens committed per round: sum_{j < K} alpha^j.
  [[nodiscard]] double mean_tokens() const {
    double s = 0.0;
    for (unsigned j = 0; j < block; ++j) s += std::pow(alpha, static_cast<double>(j));
    return s;
  }
  /// Accepted proposals for a uniform u in [0, 1): inverse of the CDF (deterministic given u).
  [[nodiscard]] unsigned sample(double u) const {
    double c = 0.0;
    for (unsigned j = 0; j + 1 < block; ++j) {
      c += pmf(j);
      if (u < c) return j;
    }
    return block == 0 ? 0 : block - 1;
  }
  /// Accepted proposals of (session tag, round): the fixed stream every run draws.
  [[nodiscard]] unsigned sample(std::uint64_t tag, std::uint64_t round) const {
    return sample(static_cast<double>(mix64(tag ^ 0xACCE97ull ^ (round * 0x9E3779B97F4A7C15ull)) >> 11) * 0x1.0p-53);
  }
};

/// Equation (13) of the paper: speculation pays while the share of sessions it keeps (sessions
/// admitted with the drafter / without) exceeds its TPOT ratio (time per output token with / without).
constexpr bool speculation_pays(double sessions_kept_share, double tpot_ratio) { return sessions_kept_share > tpot_ratio; }

/// The drafter a speculative run of block `block` charges: DFlash2 (W = 2048, 12,288 bytes per
/// draft row) with K_max = the block of the load, so the ring and staging shrink with K as the
/// schedule does.
inline dhisparse::drafter_shape spec_drafter(unsigned block) {
  auto d = dhisparse::drafters::dflash2;
  d.max_block = block;
  return d;
}

/// GiB of GPU memory speculation adds per GPU besides the per-session drafter state: the paper's
/// "6.6 GiB of fixed allocations per GPU for the drafter, the target model and metadata".
inline constexpr double spec_fixed_gib_default = 6.6;

/// The KV budget left for sessions when speculation runs: M less its fixed allocations (0 when
/// they take all of it).
constexpr std::uint64_t speculative_budget(std::uint64_t budget, std::uint64_t fixed_bytes) {
  return budget > fixed_bytes ? budget - fixed_bytes : 0;
}

/// Equation (13) for one measured configuration: a speculative run beside the plain run of the
/// same model, context, C, policy and stand-in setting.
struct spec_verdict {
  double sessions_kept_share = 0.0;  ///< sessions admitted with the drafter / without
  double tpot_ratio = 0.0;           ///< (step with / tokens per step) / step without
  bool pays = false;                 ///< speculation_pays(sessions_kept_share, tpot_ratio)
};

/// `admitted_*`: sessions the closed loop admitted; `*_step_ms`: step time (p50) of each run;
/// `tokens_per_step`: mean tokens one session commits per speculative step (1 + accepted). A
/// session's time per output token is the step time over its tokens per step (1 without).
inline spec_verdict speculation_verdict(std::uint64_t admitted_spec, std::uint64_t admitted_plain, double spec_step_ms,
                                        double tokens_per_step, double plain_step_ms) {
  spec_verdict v;
  if (admitted_plain == 0 || tokens_per_step <= 0.0 || plain_step_ms <= 0.0) return v;
  v.sessions_kept_share = static_cast<double>(admitted_spec) / static_cast<double>(admitted_plain);
  v.tpot_ratio = spec_step_ms / tokens_per_step / plain_step_ms;
  v.pays = speculation_pays(v.sessions_kept_share, v.tpot_ratio);
  return v;
}

// ------------------------------------------------------------------ load

/// How KV is held.
enum class policy : std::uint8_t { resident, fixed_budget, adaptive };

/// "resident", "fixed-budget", "adaptive".
constexpr std::string_view to_string(policy p) {
  switch (p) {
    case policy::resident: return "resident";
    case policy::fixed_budget: return "fixed-budget";
    case policy::adaptive: return "adaptive";
  }
  return "?";
}

/// Parses a policy name; nullopt for an unknown one.
constexpr std::optional<policy> policy_by_name(std::string_view s) {
  for (policy p : {policy::resident, policy::fixed_budget, policy::adaptive})
    if (to_string(p) == s) return p;
  return std::nullopt;
}

/// Result of the closed-loop admission of one configuration.
struct load_point {
  std::uint64_t target_c = 0;           ///< sessions kept outstanding
  std::uint64_t per_session_bytes = 0;  ///< GPU bytes one admitted session holds under the policy
  std::uint64_t admitted = 0;           ///< sessions holding a slot (<= target_c)
  std::uint64_t planner_count = 0;      ///< the planner's fit count for M (resident or hierarchical)
  std::uint64_t waiting = 0;            ///< target_c - admitted
};

/// Admission of `target_c` sessions of `context` tokens under KV budget `budget` (bytes) for
/// `model`: sessions are admitted one by one while the sum of their GPU state stays within the
/// budget (resident: the whole page-rounded history with index keys, `resident_total`; fixed-budget
/// and adaptive: the required state `hierarchical_total`, the optional pool taking only what is
/// left), the rest wait. The planner's own fit count is reported beside it (the targets ask for ±1).
inline load_point admit_closed_loop(policy p, const dhisparse::model_shape& model, std::uint64_t context,
                                    std::uint64_t target_c, std::uint64_t budget,
                                    dhisparse::drafter_shape drafter = dhisparse::drafters::none) {
  const auto sp = dhisparse::plan(model, {.context_tokens = context, .drafter = drafter, .pool_bytes = budget});
  load_point lp;
  lp.target_c = target_c;
  lp.per_session_bytes = p == policy::resident ? sp.resident_total : sp.hierarchical_total;
  lp.planner_count = p == policy::resident ? *sp.resident_sessions_in_pool : *sp.hierarchical_sessions_in_pool;
  std::uint64_t used = 0;
  while (lp.admitted < target_c && used + lp.per_session_bytes <= budget) {
    used += lp.per_session_bytes;
    ++lp.admitted;
  }
  lp.waiting = target_c - lp.admitted;
  return lp;
}

/// Admission waits of the closed loop: `target_c` sessions outstanding, `slots` of them decoding;
/// each session leaves after `gen_tokens` tokens and a new one arrives at once (closed loop), so a
/// waiting session is admitted when a slot frees. Sessions start with staggered progress (the
/// steady state of a loop that has run for a while). Simulated for `steps` steps of
/// `tokens_per_step` tokens per session.
struct queue_stats {
  double mean_wait_steps = 0.0;  ///< mean steps an admitted session waited for its slot
  double p90_wait_steps = 0.0;
  std::uint64_t admissions = 0;  ///< sessions admitted during the simulation
  /// Steps until every slot was filled after a load step (all target_c arriving at step 0 with
  /// `slots` free): 0 when target_c <= slots. Prefill is not modelled; this is queueing only.
  double fill_steps = 0.0;
};

inline queue_stats simulate_queue(std::uint64_t target_c, std::uint64_t slots, std::uint64_t gen_tokens,
                                  double tokens_per_step, std::uint64_t steps) {
  queue_stats q;
  if (slots == 0 || target_c == 0 || tokens_per_step <= 0.0) return q;
  const std::uint64_t live = std::min(slots, target_c);
  // Remaining tokens of each live session, staggered evenly.
  std::vector<double> remaining(live);
  for (std::uint64_t i = 0; i < live; ++i)
    remaining[i] = static_cast<double>(gen_tokens) * static_cast<double>(i + 1) / static_cast<double>(live);
  std::vector<std::uint64_t> queue_arrival;  // arrival step of each waiting session (FIFO)
  for (std::uint64_t i = live; i < target_c; ++i) queue_arrival.push_back(0);
  std::vector<double> waits;
  for (std::uint64_t t = 1; t <= steps; ++t) {
    for (auto& r : remaining) {
      r -= tokens_per_step;
      if (r <= 0.0) {
        queue_arrival.push_back(t);  // the finished session's user sends the next one
        const std::uint64_t arrived = queue_arrival.front();
        queue_arrival.erase(queue_arrival.begin());
        waits.push_back(static_cast<double>(t - arrived));
        r += static_cast<double>(gen_tokens);
        ++q.admissions;
      }
    }
  }
  if (!waits.empty()) {
    q.mean_wait_steps = std::accumulate(waits.begin(), waits.end(), 0.0) / static_cast<double>(waits.size());
    std::sort(waits.begin(), waits.end());
    q.p90_wait_steps = waits[std::min(waits.size() - 1, static_cast<std::size_t>(0.9 * static_cast<double>(waits.size())))];
  }
  if (target_c > slots) {
    // Fresh load step: slots full of new sessions, each needs gen_tokens; the last waiting one
    // gets a slot after ceil(waiting / slots) generations.
    const double rounds = std::ceil(static_cast<double>(target_c - slots) / static_cast<double>(slots));
    q.fill_steps = rounds * std::ceil(static_cast<double>(gen_tokens) / tokens_per_step);
  }
  return q;
}

// ------------------------------------------------------------------ statistics

/// Order statistic of `v` at quantile `p` (nearest rank, p in [0, 1]); 0 for an empty sample.
inline double quantile(std::vector<double> v, double p) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const double rank = std::ceil(p * static_cast<double>(v.size()));
  const std::size_t i = rank < 1.0 ? 0 : static_cast<std::size_t>(rank) - 1;
  return v[std::min(i, v.size() - 1)];
}

/// Step-time summary of one configuration.
struct step_summary {
  double p50_ms = 0.0, p90_ms = 0.0, mean_ms = 0.0;
  double tokens_per_s = 0.0;  ///< live sessions * tokens per step / p50
};

inline step_summary summarize_steps(const std::vector<double>& ms, double live_sessions, double tokens_per_step) {
  step_summary s;
  if (ms.empty()) return s;
  s.p50_ms = quantile(ms, 0.5);
  s.p90_ms = quantile(ms, 0.9);
  s.mean_ms = std::accumulate(ms.begin(), ms.end(), 0.0) / static_cast<double>(ms.size());
  s.tokens_per_s = s.p50_ms > 0.0 ? live_sessions * tokens_per_step * 1000.0 / s.p50_ms : 0.0;
  return s;
}

// ------------------------------------------------------------------ results

/// Phases of a step, in the order the breakdown reports them.
inline constexpr std::array<std::string_view, 7> phase_names = {"index", "top_k", "resolve", "follower_copies",
                                                                 "attention", "writes", "stand_in"};

/// One measured configuration.
struct result_row {
  std::string model;
  std::string policy;
  std::uint64_t context = 0;
  std::uint64_t target_c = 0;
  bool stand_in = true;
  unsigned spec_block = 1;  ///< 1: plain decode
  double tokens_per_step = 1.0;  ///< mean tokens a session commits per step (1 + accepted; 1 plain)
  /// Speculative rows: Equation (13) against the plain row of the same configuration (-1: not
  /// evaluated, 0: does not pay, 1: pays), with its two sides.
  int eq13 = -1;
  double sessions_kept_share = 0.0, tpot_ratio = 0.0;
  std::uint64_t admitted = 0, planner_count = 0, live = 0;
  double p50_ms = 0.0, p90_ms = 0.0, tokens_per_s = 0.0;
  double direct_share = 0.0, hot_share = 0.0, host_share = 0.0;
  double wait_steps = 0.0, wait_s = 0.0, fill_s = 0.0;
  std::array<double, phase_names.size()> phase_ms{};  ///< medians of each phase timed alone
  std::uint64_t mismatches = 0, bytes_checked = 0, steps = 0;
  std::string note;  ///< why a configuration did not run, if it did not
};

/// JSON string escape (quotes, backslashes, control characters).
inline std::string json_escape(std::string_view s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') {
      o += '\\';
      o += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char b[8];
      std::snprintf(b, sizeof b, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
      o += b;
    } else {
      o += c;
    }
  }
  return o;
}

inline std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  char b[64];
  std::snprintf(b, sizeof b, "%.6g", v);
  return b;
}

/// The results as one JSON document: {"schema": "dhisparse.bench_decode.v1", "settings": {...},
/// "results": [...]} (what benchmarks/plot_decode.py reads). `settings` is a pre-rendered JSON object.
inline std::string to_json(const std::vector<result_row>& rows, std::string_view settings_json) {
  std::string o = "{\n  \"schema\": \"dhisparse.bench_decode.v1\",\n  \"settings\": ";
  o += settings_json.empty() ? "{}" : std::string(settings_json);
  o += ",\n  \"results\": [";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    o += i == 0 ? "\n    {" : ",\n    {";
    o += "\"model\": \"" + json_escape(r.model) + "\", \"policy\": \"" + json_escape(r.policy) + "\"";
    o += ", \"context\": " + std::to_string(r.context) + ", \"target_c\": " + std::to_string(r.target_c);
    o += std::string(", \"stand_in\": ") + (r.stand_in ? "true" : "false");
    o += ", \"spec_block\": " + std::to_string(r.spec_block);
    o += ", \"tokens_per_step\": " + json_number(r.tokens_per_step);
    o += ", \"eq13\": " + std::string(r.eq13 < 0 ? "null" : r.eq13 == 1 ? "true" : "false");
    o += ", \"sessions_kept_share\": " + json_number(r.sessions_kept_share) +
         ", \"tpot_ratio\": " + json_number(r.tpot_ratio);
    o += ", \"admitted\": " + std::to_string(r.admitted) + ", \"planner_count\": " + std::to_string(r.planner_count);
    o += ", \"live\": " + std::to_string(r.live);
    o += ", \"p50_ms\": " + json_number(r.p50_ms) + ", \"p90_ms\": " + json_number(r.p90_ms);
    o += ", \"tokens_per_s\": " + json_number(r.tokens_per_s);
    o += ", \"direct_share\": " + json_number(r.direct_share) + ", \"hot_share\": " + json_number(r.hot_share);
    o += ", \"host_share\": " + json_number(r.host_share);
    o += ", \"wait_steps\": " + json_number(r.wait_steps) + ", \"wait_s\": " + json_number(r.wait_s);
    o += ", \"fill_s\": " + json_number(r.fill_s);
    o += ", \"phase_ms\": {";
    for (std::size_t p = 0; p < phase_names.size(); ++p)
      o += (p == 0 ? "\"" : ", \"") + std::string(phase_names[p]) + "\": " + json_number(r.phase_ms[p]);
    o += "}, \"mismatches\": " + std::to_string(r.mismatches) + ", \"bytes_checked\": " + std::to_string(r.bytes_checked);
    o += ", \"steps\": " + std::to_string(r.steps) + ", \"note\": \"" + json_escape(r.note) + "\"}";
  }
  o += rows.empty() ? "]\n}\n" : "\n  ]\n}\n";
  return o;
}

/// The results as a fixed-width text table (one line per configuration).
inline std::string to_table(const std::vector<result_row>& rows) {
  std::string o;
  char line[512];
  std::snprintf(line, sizeof line, "%-20s %-12s %7s %5s %3s %4s %9s %6s %8s %8s %11s %6s %6s %6s %9s %5s %s\n", "model",
                "policy", "context", "C", "K", "GEMM", "admit/pl", "tok/st", "p50 ms", "p90 ms", "tokens/s", "dir%", "hot%",
                "host%", "mismatch", "eq13", "note");
  o += line;
  for (const auto& r : rows) {
    char adm[32];
    std::snprintf(adm, sizeof adm, "%llu/%llu", static_cast<unsigned long long>(r.admitted),
                  static_cast<unsigned long long>(r.planner_count));
    std::snprintf(line, sizeof line,
                  "%-20s %-12s %7llu %5llu %3u %4s %9s %6.3f %8.3f %8.3f %11.1f %6.2f %6.2f %6.2f %9llu %5s %s\n",
                  r.model.c_str(), r.policy.c_str(), static_cast<unsigned long long>(r.context),
                  static_cast<unsigned long long>(r.target_c), r.spec_block, r.stand_in ? "on" : "off", adm,
                  r.tokens_per_step, r.p50_ms, r.p90_ms, r.tokens_per_s, 100.0 * r.direct_share, 100.0 * r.hot_share,
                  100.0 * r.host_share, static_cast<unsigned long long>(r.mismatches),
                  r.eq13 < 0 ? "-" : r.eq13 == 1 ? "pays" : "no", r.note.c_str());
    o += line;
  }
  return o;
}

}  // namespace dhisparse_bench::decode
