#pragma once
/// \file
/// Synthetic sparse-attention selections for demos, tests and benchmarks (pure C++20, no CUDA).
///
/// `selection_generator` produces, step after step, the ordered top-k selection of one
/// (request, source) stream the way a DeepSeek-V3.2-style lightning indexer would: a mix of
///
///  - **sink rows**: the first few rows of the history (attention sinks), selected every step;
///  - **recent rows**: `recent_share * top_k` rows from the window of `recent_window` rows below
///    the frontier, denser towards the frontier (`recent_concentration`);
///  - **heavy hitters**: a persistent set of H rows, each selected with probability
///    `heavy_select_probability` every step. The set drifts slowly: each step every hitter is
///    replaced with probability `drift_rate` by another row, drawn with probability
///    `drift_recent_bias` from the newest `drift_recent_rows` rows and otherwise uniformly;
///  - **random tail**: the remaining entries (at least `random_share * top_k`) drawn uniformly
///    over the whole history: the rows that are cold in any cache.
///
/// Every chosen row gets a synthetic score (sinks > recent ≈ heavy hitters > random tail, with
/// noise) and the selection is emitted in descending score order, as a top-k emits it, not sorted
/// by row. Entries are distinct rows `< frontier`; when the history holds fewer than `top_k` rows,
/// every row is selected (still in score order) and the rest is `-1` (`no_row`) padding.
///
/// `generate_with_miss_target` is the control mode for benchmarks: it reshapes the selection so
/// that a chosen share of its entries are *fresh* rows (not selected by this stream in the last N
/// steps and not cheap by the caller's predicate), the rest being cheap rows. Benchmarks of the
/// GPU resolver must draw fresh misses every step, or they measure warm translation caches
/// (docs/h200-limits.md).
///
/// Determinism: the output depends only on the parameters, the seed and the sequence of calls
/// (frontiers, targets, predicate answers). The generator uses its own splitmix64 stream, integer
/// (fixed-point) scores and IEEE doubles only where no rounding choice exists (no
/// `std::*_distribution`, whose output differs between standard libraries), so the same seed gives
/// the same selections with every compiler and flag set.
///
/// Cost: about top_k + 2H random draws, a hash set of top_k rows and one radix sort of top_k 64-bit
/// keys per call: 70-140 us for top_k = 2048 on the machines measured (the hidden `[.perf]` test of
/// tests/host/selection_generator.cpp). Memory per stream: O(H + remembered_steps * top_k) words,
/// independent of the history length.
#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "../errors.hpp"
#include "../types.hpp"

namespace dhisparse::workload {

/// Shape of the synthetic selections. The defaults are for top_k = 2048 (GLM-5.3); shares are
/// fractions of top_k, so they carry over to other k, while the row counts (windows) may need
/// scaling with the history length.
struct selection_params {
  std::size_t top_k = 2048;               ///< k: entries per selection
  std::size_t sink_rows = 4;              ///< rows 0..sink_rows-1, selected every step (0: none)
  double recent_share = 0.25;             ///< share of k taken from the recent window
  std::size_t recent_window = 2048;       ///< width of the recent window, in rows below the frontier
  double recent_concentration = 2.0;      ///< >= 1; distance d below the frontier is drawn as W * u^c:
                                          ///< 1 = uniform over the window, larger = closer to the frontier
  double random_share = 0.15;             ///< minimum share of k drawn uniformly over the whole history
  std::size_t heavy_hitters = 0;          ///< H: size of the heavy-hitter set; 0 = auto, the heavy
                                          ///< quota (k - sinks - recent - random) / select probability
  double heavy_select_probability = 0.9;  ///< chance that a heavy hitter is selected in a step
  double drift_rate = 0.01;               ///< chance per step that a heavy hitter is replaced
  double drift_recent_bias = 0.5;         ///< chance that a replacement comes from the newest rows
  std::size_t drift_recent_rows = 8192;   ///< "newest rows" for drift replacements
  std::size_t remembered_steps = 4;       ///< selections kept for generate_with_miss_target's lookback
};

/// Throws `invalid_configuration` naming the first parameter that cannot work.
inline void validate(const selection_params& p) {
  auto bad = [](const std::string& what) { throw invalid_configuration("selection_params: " + what); };
  auto fraction = [](double x) { return x >= 0.0 && x <= 1.0; };  // also rejects NaN
  if (p.top_k == 0) bad("top_k must be at least 1");
  if (p.top_k > static_cast<std::size_t>(std::numeric_limits<row_index>::max()))
    bad("top_k exceeds the row index range");
  if (!fraction(p.recent_share)) bad("recent_share must be in [0, 1]");
  if (!fraction(p.random_share)) bad("random_share must be in [0, 1]");
  if (p.recent_share + p.random_share > 1.0) bad("recent_share + random_share must not exceed 1");
  if (p.recent_share > 0.0 && p.recent_window == 0) bad("recent_window must be at least 1 row when recent_share > 0");
  if (!(p.recent_concentration >= 1.0 && p.recent_concentration <= 64.0))
    bad("recent_concentration must be in [1, 64]");
  if (!(p.heavy_select_probability > 0.0 && p.heavy_select_probability <= 1.0))
    bad("heavy_select_probability must be in (0, 1]");
  if (!fraction(p.drift_rate)) bad("drift_rate must be in [0, 1]");
  if (!fraction(p.drift_recent_bias)) bad("drift_recent_bias must be in [0, 1]");
  if (p.drift_recent_bias > 0.0 && p.drift_recent_rows == 0)
    bad("drift_recent_rows must be at least 1 row when drift_recent_bias > 0");
}

/// Target of `generate_with_miss_target`.
struct miss_target {
  double fresh_share = 0.2;        ///< share of the selection's entries that should be fresh rows
  std::size_t lookback_steps = 1;  ///< N: a row selected by this stream in the last N steps is never
                                   ///< fresh (0 <= N <= remembered_steps)
};

/// What a generation produced.
struct selection_summary {
  std::size_t entries = 0;  ///< entries other than -1: min(top_k, frontier)
  std::size_t fresh = 0;    ///< entries that were fresh rows when generated (miss-target mode only)
  /// Adds `o`'s counts.
  selection_summary& operator+=(const selection_summary& o) {
    entries += o.entries;
    fresh += o.fresh;
    return *this;
  }
};

/// The generator's random stream: splitmix64 (Steele, Lea, Flood 2014), tiny state, passes
/// BigCrush, fully specified, so every platform draws the same numbers.
struct splitmix64 {
  /// Generator state: the seed before the first draw.
  std::uint64_t state = 0;
  /// Next 64 random bits.
  constexpr std::uint64_t next() {
    std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  /// Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  /// Uniform integer in [0, n), n >= 1 (n < 2^53).
  std::uint64_t below(std::uint64_t n) {
    const auto v = static_cast<std::uint64_t>(uniform() * static_cast<double>(n));
    return v < n ? v : n - 1;
  }
  /// True with probability `p`.
  bool chance(double p) { return uniform() < p; }
};

/// The splitmix64 finaliser: a bijective 64-bit mix.
constexpr std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

namespace detail {

/// Open-addressing set of non-negative rows (linear probing, -1 = empty). `clear()` resets only
/// the slots it filled, so a set sized for k rows costs O(k) per use however often it is reused.
class row_set {
 public:
  void reserve_for(std::size_t rows) {
    std::size_t cap = 16;
    while (cap < 2 * rows) cap *= 2;
    if (cap > slots_.size()) {
      slots_.assign(cap, no_row);
      filled_.clear();
      shift_ = static_cast<unsigned>(64 - std::countr_zero(cap));
    }
    filled_.reserve(rows);
  }
  /// Inserts `r`; false when it was already present.
  bool insert(row_index r) {
    std::size_t i = index(r);
    const std::size_t mask = slots_.size() - 1;
    while (slots_[i] != no_row) {
      if (slots_[i] == r) return false;
      i = (i + 1) & mask;
    }
    slots_[i] = r;
    filled_.push_back(i);
    return true;
  }
  [[nodiscard]] bool contains(row_index r) const {
    std::size_t i = index(r);
    const std::size_t mask = slots_.size() - 1;
    while (slots_[i] != no_row) {
      if (slots_[i] == r) return true;
      i = (i + 1) & mask;
    }
    return false;
  }
  [[nodiscard]] std::size_t size() const { return filled_.size(); }
  void clear() {
    for (std::size_t i : filled_) slots_[i] = no_row;
    filled_.clear();
  }

 private:
  [[nodiscard]] std::size_t index(row_index r) const {
    const auto key = static_cast<std::uint64_t>(static_cast<std::uint32_t>(r));
    return static_cast<std::size_t>((key * 0x9E3779B97F4A7C15ull) >> shift_);  // Fibonacci hashing
  }
  std::vector<row_index> slots_;
  std::vector<std::size_t> filled_;
  unsigned shift_ = 60;
};

/// Synthetic scores are fixed-point integers (1.0 = 2^28), so no floating-point contraction or
/// rounding mode can change a selection's order between compilers or flags.
using score_t = std::uint32_t;
inline constexpr score_t score_one = score_t{1} << 28;

/// Sort key: descending score, then ascending row.
inline std::uint64_t score_key(score_t score, row_index row) {
  return (static_cast<std::uint64_t>(0xFFFFFFFFu - score) << 32) | static_cast<std::uint32_t>(row);
}
inline row_index key_row(std::uint64_t key) { return static_cast<row_index>(static_cast<std::uint32_t>(key)); }
inline score_t key_score(std::uint64_t key) { return 0xFFFFFFFFu - static_cast<score_t>(key >> 32); }

/// Ascending LSD radix sort of 64-bit keys, 8 bits a pass; passes whose byte is the same in every
/// key are skipped. About 5x faster than std::sort for k = 2048 keys. `tmp` is scratch.
inline void radix_sort(std::vector<std::uint64_t>& keys, std::vector<std::uint64_t>& tmp) {
  const std::size_t n = keys.size();
  if (n < 2) return;
  tmp.resize(n);
  std::array<std::array<std::uint32_t, 256>, 8> count{};
  for (std::uint64_t x : keys)
    for (unsigned b = 0; b < 8; ++b) ++count[b][(x >> (8 * b)) & 0xFF];
  std::uint64_t* src = keys.data();
  std::uint64_t* dst = tmp.data();
  for (unsigned b = 0; b < 8; ++b) {
    auto& c = count[b];
    if (c[(src[0] >> (8 * b)) & 0xFF] == n) continue;  // every key has this byte
    std::uint32_t sum = 0;
    for (auto& x : c) {
      const std::uint32_t t = x;
      x = sum;
      sum += t;
    }
    for (std::size_t i = 0; i < n; ++i) dst[c[(src[i] >> (8 * b)) & 0xFF]++] = src[i];
    std::swap(src, dst);
  }
  if (src != keys.data()) std::copy(src, src + n, keys.data());
}

}  // namespace detail

/// The seed of stream `stream` derived from a base seed (used by `selection_batch`; use it to give
/// each (request, source) its own independent stream).
constexpr std::uint64_t stream_seed(std::uint64_t base, std::uint64_t stream) {
  return mix64(base ^ mix64(stream + 0x632BE59BD9B4E019ull));
}

/// Deterministic generator of one (request, source) stream's selections; see the file comment.
class selection_generator {
 public:
  /// A generator of `params` drawing from splitmix64 stream `seed`; throws invalid_configuration (see `validate`).
  selection_generator(const selection_params& params, std::uint64_t seed) : p_(params), rng_{seed} {
    validate(p_);
    const std::size_t k = p_.top_k;
    sinks_ = std::min(p_.sink_rows, k);
    auto share_of_k = [k](double share) {
      return static_cast<std::size_t>(std::llround(share * static_cast<double>(k)));
    };
    recent_quota_ = std::min(k - sinks_, share_of_k(p_.recent_share));
    const std::size_t random_min = share_of_k(p_.random_share);
    heavy_quota_ = k - sinks_ - recent_quota_ > random_min ? k - sinks_ - recent_quota_ - random_min : 0;
    heavy_target_ = p_.heavy_hitters != 0 ? p_.heavy_hitters
                                          : static_cast<std::size_t>(std::ceil(static_cast<double>(heavy_quota_) /
                                                                               p_.heavy_select_probability));
    chosen_.reserve_for(k);
    recent_set_.reserve_for(std::max<std::size_t>(1, p_.remembered_steps) * k);
    cand_rows_.reserve(k);
    cand_scores_.reserve(k);
    keys_.reserve(k);
    aux_keys_.reserve(k);
    ring_.resize(p_.remembered_steps);
  }

  /// The parameters given at construction.
  [[nodiscard]] const selection_params& params() const { return p_; }
  /// k: entries of every selection (-1 padded while the history is shorter).
  [[nodiscard]] std::size_t top_k() const { return p_.top_k; }
  /// Selections generated so far.
  [[nodiscard]] std::uint64_t steps() const { return steps_; }
  /// Heavy hitters per step: the set size H the generator maintains (fewer while the history is short).
  [[nodiscard]] std::size_t heavy_hitter_target() const { return heavy_target_; }
  /// The current heavy-hitter set (unordered).
  [[nodiscard]] std::span<const row_index> heavy_hitters() const { return heavy_rows_; }
  /// Entries per step reserved for each component when the history is longer than top_k.
  [[nodiscard]] std::size_t sink_quota() const { return sinks_; }
  [[nodiscard]] std::size_t recent_quota() const { return recent_quota_; }
  [[nodiscard]] std::size_t heavy_quota() const { return heavy_quota_; }

  /// True when `row` was selected by one of the last `steps` selections (steps <= remembered_steps).
  [[nodiscard]] bool selected_within(row_index row, std::size_t steps) const {
    const std::size_t n = std::min<std::uint64_t>({steps, steps_, ring_.size()});
    for (std::size_t j = 1; j <= n; ++j) {
      const auto& sel = ring_[(steps_ - j) % ring_.size()];
      if (std::find(sel.begin(), sel.end(), row) != sel.end()) return true;
    }
    return false;
  }

  /// The next selection for a history of `frontier` rows. `out` must hold exactly top_k entries.
  /// Returns the number of entries other than -1 (min(top_k, frontier)).
  std::size_t next(std::int64_t frontier, std::span<row_index> out) {
    check_call(frontier, out);
    natural(frontier);
    const std::size_t n = emit(out);
    remember(out);
    return n;
  }

  /// The next selection, reshaped so that about `target.fresh_share` of its entries are fresh:
  /// rows not selected by this stream in the last `target.lookback_steps` steps for which
  /// `is_cheap(row)` is false. The other entries are rows with `is_cheap(row)` true (for example:
  /// in the tail or the hot cache of the hierarchy). The natural selection is kept where it fits
  /// the target; missing cheap rows come from this stream's remembered selections, then from the
  /// newest rows downwards (at worst a scan of the whole history); missing fresh rows are drawn
  /// uniformly over the history. When the history cannot supply enough of one kind (first steps,
  /// short history, few cheap rows), the other fills in and the returned `fresh` count says what
  /// was achieved.
  template <class IsCheap>
  selection_summary generate_with_miss_target(std::int64_t frontier, std::span<row_index> out,
                                              const miss_target& target, IsCheap&& is_cheap) {
    check_call(frontier, out);
    check_target(target);
    build_recent(target.lookback_steps);
    return miss_impl(frontier, out, target, [&](row_index r) { return static_cast<bool>(is_cheap(r)); });
  }

  /// As above with cheap = "selected by this stream in the last `lookback_steps` steps" (the
  /// previous selections stand in for what the hot cache holds).
  selection_summary generate_with_miss_target(std::int64_t frontier, std::span<row_index> out,
                                              const miss_target& target) {
    check_call(frontier, out);
    check_target(target);
    build_recent(target.lookback_steps);
    return miss_impl(frontier, out, target, [this](row_index r) { return recent_set_.contains(r); });
  }

 private:
  // ---- score model (fixed point, 1.0 = score_one): sinks 3 + [0, 0.1); recent 1 + closeness in
  // (0, 1] + [0, 0.25); heavy hitters a persistent base in [0.75, 1.75) + [0, 0.25); random [0, 0.75).
  using score_t = detail::score_t;
  static constexpr score_t one = detail::score_one;
  /// Uniform noise in [0, max) from 32 random bits (integer arithmetic only).
  score_t noise(score_t max) { return static_cast<score_t>(((rng_.next() >> 32) * max) >> 32); }
  score_t sink_score() { return 3 * one + noise(one / 10); }
  score_t recent_score(std::int64_t distance, std::size_t window) {  // 1 <= distance <= window
    const std::uint64_t w = std::max<std::size_t>(window, 1);
    const auto closeness = static_cast<score_t>((w - static_cast<std::uint64_t>(distance - 1)) * one / w);
    return one + closeness + noise(one / 4);
  }
  score_t heavy_score(score_t base) { return base + noise(one / 4); }
  score_t new_heavy_base() { return one * 3 / 4 + noise(one); }
  score_t random_score() { return noise(one * 3 / 4); }
  score_t recalled_score() { return one * 3 / 4 + noise(one * 5 / 4); }

  /// u^c, by repeated multiplication for whole c (bit-identical everywhere), else std::pow.
  double concentrate(double u) const {
    const double c = p_.recent_concentration;
    if (c != std::floor(c)) return std::pow(u, c);
    double v = 1.0;
    for (int i = 0; i < static_cast<int>(c); ++i) v *= u;
    return v;
  }

  void check_call(std::int64_t frontier, std::span<row_index> out) const {
    if (out.size() != p_.top_k)
      throw size_mismatch("selection_generator: output holds " + std::to_string(out.size()) + " entries, top_k is " +
                          std::to_string(p_.top_k));
    if (frontier < 0 || frontier > static_cast<std::int64_t>(std::numeric_limits<row_index>::max()))
      throw position_out_of_range("selection_generator: frontier " + std::to_string(frontier) +
                                  " outside [0, 2^31)");
  }
  void check_target(const miss_target& t) const {
    if (!(t.fresh_share >= 0.0 && t.fresh_share <= 1.0))
      throw invalid_configuration("miss_target: fresh_share must be in [0, 1]");
    if (t.lookback_steps > p_.remembered_steps)
      throw invalid_configuration("miss_target: lookback_steps " + std::to_string(t.lookback_steps) +
                                  " exceeds selection_params::remembered_steps " + std::to_string(p_.remembered_steps));
  }

  void add(row_index r, score_t score) {
    cand_rows_.push_back(r);
    cand_scores_.push_back(score);
  }

  /// A drift replacement: newest rows with probability drift_recent_bias, else uniform.
  row_index drift_row(std::int64_t n) {
    if (rng_.chance(p_.drift_recent_bias)) {
      const auto w = std::min<std::int64_t>(n, static_cast<std::int64_t>(p_.drift_recent_rows));
      return static_cast<row_index>(n - 1 - static_cast<std::int64_t>(rng_.below(static_cast<std::uint64_t>(w))));
    }
    return static_cast<row_index>(rng_.below(static_cast<std::uint64_t>(n)));
  }

  /// Tops the heavy-hitter set up to H (at most half the history) and applies this step's drift.
  void maintain_heavy(std::int64_t n) {
    if (n <= 0) return;
    const std::size_t limit = std::min<std::size_t>(heavy_target_, static_cast<std::size_t>(n) / 2);
    const bool initial = heavy_rows_.empty();
    for (std::size_t attempts = 0; heavy_rows_.size() < limit && attempts < 8 * limit + 64; ++attempts) {
      // The first fill spreads over the whole (imported) history; later top-ups follow the drift law.
      const row_index r = initial ? static_cast<row_index>(rng_.below(static_cast<std::uint64_t>(n))) : drift_row(n);
      if (heavy_member_.insert(r).second) {
        heavy_rows_.push_back(r);
        heavy_base_.push_back(new_heavy_base());
      }
    }
    if (initial) return;
    for (std::size_t i = 0; i < heavy_rows_.size(); ++i) {
      if (!rng_.chance(p_.drift_rate)) continue;
      for (int attempt = 0; attempt < 8; ++attempt) {
        const row_index r = drift_row(n);
        if (heavy_member_.insert(r).second) {
          heavy_member_.erase(heavy_rows_[i]);
          heavy_rows_[i] = r;
          heavy_base_[i] = new_heavy_base();
          break;
        }
      }
    }
  }

  /// The natural selection of this step into cand_rows_/cand_scores_ (unordered), chosen_ = its rows.
  void natural(std::int64_t n) {
    cand_rows_.clear();
    cand_scores_.clear();
    chosen_.clear();
    maintain_heavy(n);
    const std::size_t k = p_.top_k;
    if (n <= static_cast<std::int64_t>(k)) {  // every row is selected; only the order is synthetic
      std::unordered_map<row_index, score_t> heavy;
      for (std::size_t i = 0; i < heavy_rows_.size(); ++i) heavy.emplace(heavy_rows_[i], heavy_base_[i]);
      const std::size_t window = std::min<std::size_t>(p_.recent_window, static_cast<std::size_t>(n));
      for (row_index r = 0; r < n; ++r) {
        const std::int64_t d = n - r;
        score_t s = 0;
        if (static_cast<std::size_t>(r) < sinks_) s = sink_score();
        else if (d <= static_cast<std::int64_t>(window)) s = recent_score(d, window);
        else if (auto it = heavy.find(r); it != heavy.end()) s = heavy_score(it->second);
        else s = random_score();
        chosen_.insert(r);
        add(r, s);
      }
      return;
    }
    // sinks
    for (std::size_t r = 0; r < sinks_; ++r)
      if (chosen_.insert(static_cast<row_index>(r))) add(static_cast<row_index>(r), sink_score());
    // recent window, denser near the frontier
    {
      const std::size_t window = std::min<std::size_t>(p_.recent_window, static_cast<std::size_t>(n));
      const std::size_t goal = cand_rows_.size() + std::min(recent_quota_, window);
      for (std::size_t attempts = 0; cand_rows_.size() < goal && attempts < 8 * recent_quota_ + 64; ++attempts) {
        const double u = concentrate(rng_.uniform());
        const auto d = 1 + std::min<std::int64_t>(static_cast<std::int64_t>(u * static_cast<double>(window)),
                                                  static_cast<std::int64_t>(window) - 1);
        const auto r = static_cast<row_index>(n - d);
        if (chosen_.insert(r)) add(r, recent_score(d, window));
      }
      for (std::int64_t d = 1; cand_rows_.size() < goal && d <= static_cast<std::int64_t>(window); ++d)
        if (chosen_.insert(static_cast<row_index>(n - d))) add(static_cast<row_index>(n - d), recent_score(d, window));
    }
    // heavy hitters, from a random starting point of the set so that a full quota drops no fixed hitter
    if (!heavy_rows_.empty()) {
      const std::size_t goal = cand_rows_.size() + heavy_quota_;
      const std::size_t h = heavy_rows_.size(), start = rng_.below(h);
      for (std::size_t j = 0; j < h && cand_rows_.size() < goal; ++j) {
        const std::size_t i = (start + j) % h;
        if (!rng_.chance(p_.heavy_select_probability)) continue;
        const row_index r = heavy_rows_[i];
        if (r < n && chosen_.insert(r)) add(r, heavy_score(heavy_base_[i]));
      }
    }
    // random tail: uniform over the history up to k entries
    fill_uniform(n, k, [](row_index) { return true; });
  }

  /// Adds uniformly drawn rows accepted by `ok` until cand_rows_ holds `goal` rows; falls back to a
  /// scan from a random start when rejection sampling stalls (history barely longer than k).
  template <class Ok>
  void fill_uniform(std::int64_t n, std::size_t goal, Ok ok) {
    if (cand_rows_.size() >= goal) return;
    const std::size_t need = goal - cand_rows_.size();
    for (std::size_t attempts = 0; cand_rows_.size() < goal && attempts < 8 * need + 64; ++attempts) {
      const auto r = static_cast<row_index>(rng_.below(static_cast<std::uint64_t>(n)));
      if (ok(r) && chosen_.insert(r)) add(r, random_score());
    }
    if (cand_rows_.size() >= goal) return;
    const auto start = static_cast<std::int64_t>(rng_.below(static_cast<std::uint64_t>(n)));
    for (std::int64_t j = 0; j < n && cand_rows_.size() < goal; ++j) {
      const auto r = static_cast<row_index>((start + j) % n);
      if (ok(r) && chosen_.insert(r)) add(r, random_score());
    }
  }

  /// Sorts cand_* by score into keys_.
  void sort_candidates() {
    keys_.clear();
    for (std::size_t i = 0; i < cand_rows_.size(); ++i)
      keys_.push_back(detail::score_key(cand_scores_[i], cand_rows_[i]));
    detail::radix_sort(keys_, sort_tmp_);
  }

  /// Writes the candidates in descending score order, then -1 padding; returns the entry count.
  std::size_t emit(std::span<row_index> out) {
    sort_candidates();
    std::size_t i = 0;
    for (; i < keys_.size(); ++i) out[i] = detail::key_row(keys_[i]);
    for (std::size_t j = i; j < out.size(); ++j) out[j] = no_row;
    return i;
  }

  void remember(std::span<const row_index> out) {
    if (!ring_.empty()) {
      auto& slot = ring_[steps_ % ring_.size()];
      slot.clear();
      for (row_index r : out)
        if (r != no_row) slot.push_back(r);
    }
    ++steps_;
  }

  /// recent_set_ = union of the last `lookback` selections.
  void build_recent(std::size_t lookback) {
    recent_set_.clear();
    const std::size_t n = std::min<std::uint64_t>({lookback, steps_, ring_.size()});
    for (std::size_t j = 1; j <= n; ++j)
      for (row_index r : ring_[(steps_ - j) % ring_.size()]) recent_set_.insert(r);
  }

  template <class Cheap>
  selection_summary miss_impl(std::int64_t n, std::span<row_index> out, const miss_target& target, Cheap cheap) {
    auto fresh = [&](row_index r) { return !recent_set_.contains(r) && !cheap(r); };
    natural(n);
    sort_candidates();  // consider the natural candidates best first
    const std::size_t entries = std::min<std::size_t>(p_.top_k, static_cast<std::size_t>(n));
    const auto want_fresh = std::min<std::size_t>(
        entries, static_cast<std::size_t>(std::llround(target.fresh_share * static_cast<double>(entries))));
    const std::size_t want_cheap = entries - want_fresh;

    // Rebuild the selection in cand_* / chosen_ from the sorted natural candidates.
    std::vector<std::uint64_t>& natural_keys = aux_keys_;
    natural_keys.swap(keys_);
    cand_rows_.clear();
    cand_scores_.clear();
    chosen_.clear();
    std::size_t got_fresh = 0, got_cheap = 0;
    auto take = [&](row_index r, score_t s) {
      if (!chosen_.insert(r)) return false;
      add(r, s);
      return true;
    };
    for (std::uint64_t key : natural_keys) {
      const row_index r = detail::key_row(key);
      const score_t s = detail::key_score(key);
      if (fresh(r)) {
        if (got_fresh < want_fresh && take(r, s)) ++got_fresh;
      } else if (cheap(r)) {
        if (got_cheap < want_cheap && take(r, s)) ++got_cheap;
      }
    }
    // Cheap top-up: remembered selections, newest first, then the newest rows of the history.
    for (std::size_t j = 1; got_cheap < want_cheap && j <= std::min<std::uint64_t>(steps_, ring_.size()); ++j)
      for (row_index r : ring_[(steps_ - j) % ring_.size()]) {
        if (got_cheap >= want_cheap) break;
        if (r < n && cheap(r) && take(r, recalled_score())) ++got_cheap;
      }
    {
      // Newest rows first, down to the oldest if the caller's cheap rows are that scattered.
      const auto window = std::min<std::int64_t>(static_cast<std::int64_t>(p_.recent_window), n);
      for (std::int64_t d = 1; got_cheap < want_cheap && d <= n; ++d) {
        const auto r = static_cast<row_index>(n - d);
        if (cheap(r) && take(r, d <= window ? recent_score(d, static_cast<std::size_t>(window)) : random_score()))
          ++got_cheap;
      }
    }
    // Fresh top-up: uniform over the history; then fill whatever is still missing with any row.
    const std::size_t before = cand_rows_.size();
    fill_uniform(n, before + (want_fresh - got_fresh), fresh);
    got_fresh += cand_rows_.size() - before;
    fill_uniform(n, entries, [](row_index) { return true; });

    selection_summary summary;
    summary.entries = cand_rows_.size();
    for (row_index r : cand_rows_) summary.fresh += fresh(r) ? 1 : 0;
    emit(out);
    remember(out);
    return summary;
  }

  selection_params p_;
  splitmix64 rng_;
  std::size_t sinks_ = 0, recent_quota_ = 0, heavy_quota_ = 0, heavy_target_ = 0;
  std::uint64_t steps_ = 0;

  std::vector<row_index> heavy_rows_;
  std::vector<detail::score_t> heavy_base_;
  std::unordered_set<row_index> heavy_member_;

  detail::row_set chosen_, recent_set_;
  std::vector<row_index> cand_rows_;
  std::vector<detail::score_t> cand_scores_;
  std::vector<std::uint64_t> keys_, aux_keys_, sort_tmp_;
  std::vector<std::vector<row_index>> ring_;  // the last remembered_steps selections (no padding)
};

/// One generator per stream (request) with seeds `stream_seed(seed, i)`, generating a step for
/// all of them into one row-major buffer: stream i's selection is `out[i*top_k, (i+1)*top_k)`.
class selection_batch {
 public:
  /// `streams` generators of `params`, stream i seeded `stream_seed(seed, i)`; throws invalid_configuration on bad
  /// params when streams > 0 (see `validate`).
  selection_batch(const selection_params& params, std::uint64_t seed, std::size_t streams) {
    gens_.reserve(streams);
    for (std::size_t i = 0; i < streams; ++i) gens_.emplace_back(params, stream_seed(seed, i));
  }

  /// Number of streams.
  [[nodiscard]] std::size_t size() const { return gens_.size(); }
  /// k of every stream's selection (0 without streams).
  [[nodiscard]] std::size_t top_k() const { return gens_.empty() ? 0 : gens_.front().top_k(); }
  /// Stream i's generator; throws std::out_of_range when i >= size().
  [[nodiscard]] selection_generator& operator[](std::size_t i) { return gens_.at(i); }
  /// Stream i's generator, read-only; throws std::out_of_range when i >= size().
  [[nodiscard]] const selection_generator& operator[](std::size_t i) const { return gens_.at(i); }
  /// Stream i's part of a batch buffer.
  [[nodiscard]] std::span<row_index> selection(std::span<row_index> out, std::size_t i) const {
    return out.subspan(i * top_k(), top_k());
  }

  /// One step for every stream: `frontiers[i]` is stream i's history length. Returns the total
  /// number of entries other than -1.
  std::size_t next(std::span<const std::int64_t> frontiers, std::span<row_index> out) {
    check(frontiers, out);
    std::size_t entries = 0;
    for (std::size_t i = 0; i < gens_.size(); ++i) entries += gens_[i].next(frontiers[i], selection(out, i));
    return entries;
  }

  /// Miss-target mode for every stream; `is_cheap(stream, row)` says whether a row of stream i is
  /// cheap to resolve. Returns the totals.
  template <class IsCheap>
  selection_summary generate_with_miss_target(std::span<const std::int64_t> frontiers, std::span<row_index> out,
                                              const miss_target& target, IsCheap&& is_cheap) {
    check(frontiers, out);
    selection_summary total;
    for (std::size_t i = 0; i < gens_.size(); ++i)
      total += gens_[i].generate_with_miss_target(frontiers[i], selection(out, i), target,
                                                  [&](row_index r) { return is_cheap(i, r); });
    return total;
  }

  /// Miss-target mode with cheap = "selected by the stream in the last lookback steps".
  selection_summary generate_with_miss_target(std::span<const std::int64_t> frontiers, std::span<row_index> out,
                                              const miss_target& target) {
    check(frontiers, out);
    selection_summary total;
    for (std::size_t i = 0; i < gens_.size(); ++i)
      total += gens_[i].generate_with_miss_target(frontiers[i], selection(out, i), target);
    return total;
  }

 private:
  void check(std::span<const std::int64_t> frontiers, std::span<row_index> out) const {
    if (frontiers.size() != gens_.size() || out.size() != gens_.size() * top_k())
      throw size_mismatch("selection_batch: " + std::to_string(gens_.size()) + " streams of top_k " +
                          std::to_string(top_k()) + " need as many frontiers and " +
                          std::to_string(gens_.size() * top_k()) + " output entries, got " +
                          std::to_string(frontiers.size()) + " and " + std::to_string(out.size()));
  }
  std::vector<selection_generator> gens_;
};

}  // namespace dhisparse::workload
