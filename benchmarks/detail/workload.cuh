#pragma once
/// \file
/// Fresh-miss decode streams for the CUDA resolver benchmark.
///
/// Every request q owns a random permutation of its history rows [0, hist - tail) (the newest
/// `tail` rows sit in the resolver's tail and are never drawn). Misses are drawn from it in order,
/// under two rules that hold by construction:
///  * within one *configuration* (history_walk::begin_configuration: one batch size, miss rate
///    and translation state of the benchmark) no row is drawn twice, so every method of the
///    configuration that reads its own stream reads rows no other method of it touched;
///  * a row selected within the last `guard` draws of its request is never drawn (it may still
///    sit in a cache of B rows: a row that leaves the selection is evicted after at most B
///    insertions; the guard is B + k).
/// While a request's permutation lasts, a drawn row was never selected before in the run: its
/// host page translations are as cold as in real decoding (docs/h200-limits.md: replaying a miss
/// set measures a translation cache, not the copy). When it runs out the walk starts over from
/// the permutation's beginning (the rows drawn longest ago); each stream counts the rows it drew
/// that an earlier configuration had drawn (`stream::reused`), and the benchmark reports them.
///
/// A stream for a configuration (C requests, m misses per request and step) has 1 + W + T steps:
///  * step 0 (fill, untimed): k rows per request, the request's last selection of the previous
///    stream when it has one (no rows drawn), otherwise k drawn rows;
///  * steps 1.. (W warm-up, then T timed): k - m rows drawn at random from the previous step's
///    selection (guaranteed hot-cache hits: B >= k and the previous resolve left every non-direct
///    row of its selection in the cache) plus the next m drawn rows, the k entries shuffled as a
///    top-k would emit them (not sorted).
/// Selections are generated on the host and uploaded before any timing.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <numeric>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common.cuh"

namespace dhisparse_bench {

/// Small deterministic generator (splitmix64 sequence; plenty for shuffles).
struct rng {
  std::uint64_t s;
  std::uint64_t next() { return splitmix64(s++); }
  /// Uniform in [0, n) (multiply-shift; bias < 2^-32 for the sizes used here).
  std::uint32_t below(std::uint32_t n) { return static_cast<std::uint32_t>(((next() >> 32) * n) >> 32); }
  template <class T>
  void shuffle(T* a, std::size_t n) {
    for (std::size_t i = n; i > 1; --i) std::swap(a[i - 1], a[below(static_cast<std::uint32_t>(i))]);
  }
};

/// Runs f(i) for i in [0, n) on the machine's cores (each i independent and deterministic); the
/// first exception thrown by any f(i) is rethrown here once every thread has finished.
template <class F>
void parallel_for(std::size_t n, F&& f) {
  const std::size_t threads = std::max<std::size_t>(1, std::min<std::size_t>(n, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  pool.reserve(threads);
  std::exception_ptr first;
  std::mutex m;
  for (std::size_t t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      try {
        for (std::size_t i = t; i < n; i += threads) f(i);
      } catch (...) {
        const std::lock_guard<std::mutex> lock(m);
        if (!first) first = std::current_exception();
      }
    });
  for (auto& th : pool) th.join();
  if (first) std::rethrow_exception(first);
}

/// Per-request row permutations, draw state and last selections, shared by every stream of one
/// run phase (one row size: one set of histories) that reads the same memory.
class history_walk {
 public:
  /// `cache_rows`: the largest cache of any method the streams feed (B); 0 means 2k.
  history_walk(std::uint32_t requests, std::uint32_t hist, std::uint32_t tail, std::uint32_t k, std::uint64_t seed,
               std::uint32_t cache_rows = 0)
      : requests_(requests), hist_(hist), fresh_(hist - tail), k_(k),
        guard_((cache_rows != 0 ? cache_rows : 2 * k) + k), seed_(seed), perm_(requests), cursor_(requests, 0),
        draws_(requests, 0), stamp_(requests), drawn_in_(requests), last_(requests) {
    if (fresh_ <= guard_ + k_) throw std::invalid_argument("history_walk: histories too short for the cache guard");
    parallel_for(requests, [&](std::size_t q) {
      auto& p = perm_[q];
      p.resize(fresh_);
      std::iota(p.begin(), p.end(), 0);
      rng g{splitmix64(seed_ ^ (0xA11CE000ull + q))};
      g.shuffle(p.data(), p.size());
      stamp_[q].assign(fresh_, 0);
      drawn_in_[q].assign(fresh_, 0);
    });
  }
  std::uint32_t requests() const { return requests_; }
  std::uint32_t hist() const { return hist_; }
  std::uint32_t k() const { return k_; }
  /// Rows a request can always draw in one configuration (its permutation less the rows the
  /// guard may hold back: those selected in the last `guard` draws and the current selection).
  std::uint32_t rows_per_configuration() const { return fresh_ - guard_ - k_; }

  /// Starts a new configuration: rows drawn from now on may repeat rows drawn before it (once a
  /// request's permutation runs out), never each other.
  void begin_configuration() { ++config_; }
  std::uint32_t configuration() const { return config_; }

  friend struct stream_builder;

 private:
  std::uint32_t requests_, hist_, fresh_, k_, guard_;
  std::uint64_t seed_;
  std::vector<std::vector<std::int32_t>> perm_;
  std::vector<std::uint32_t> cursor_;                 ///< next position in perm_[q]
  std::vector<std::uint32_t> draws_;                  ///< rows drawn for q so far
  std::vector<std::vector<std::uint32_t>> stamp_;     ///< [q][row]: draws_ at its last selection + 1 (0: never)
  std::vector<std::vector<std::uint32_t>> drawn_in_;  ///< [q][row]: configuration that last drew it (0: none)
  std::vector<std::vector<std::int32_t>> last_;
  std::uint32_t config_ = 1;
  std::uint64_t streams_made_ = 0;
};

/// A generated stream, on the host and uploaded to the device.
struct stream {
  std::uint32_t C = 0, k = 0, m = 0, warmup = 0, timed = 0;
  std::uint32_t steps() const { return 1 + warmup + timed; }
  std::uint32_t first_timed() const { return 1 + warmup; }
  std::uint64_t serial = 0;                  ///< distinguishes regenerated streams of one configuration
  std::uint32_t config = 0;                  ///< the walk's configuration it was drawn in
  std::uint64_t drawn = 0;                   ///< rows drawn for the stream (fill and misses)
  std::uint64_t reused = 0;                  ///< of those, rows an earlier configuration had drawn
  std::vector<std::int32_t> requests;        ///< benchmark request id (history index) of batch item b
  std::vector<std::int32_t> sel;             ///< [steps][C][k]
  std::vector<std::int32_t> miss;            ///< [steps-1][C*m]: global row q*hist+row of step s>=1's misses,
                                             ///< request-major, each request's in selection order
  device_buffer<std::int32_t> sel_d, miss_d, requests_d;

  const std::int32_t* sel_step_d(std::uint32_t s) const { return sel_d.get() + static_cast<std::size_t>(s) * C * k; }
  const std::int32_t* sel_step_h(std::uint32_t s) const { return sel.data() + static_cast<std::size_t>(s) * C * k; }
  /// Misses of step s >= 1.
  const std::int32_t* miss_step_d(std::uint32_t s) const {
    return miss_d.get() + static_cast<std::size_t>(s - 1) * C * m;
  }
  std::uint32_t misses_per_step() const { return C * m; }
};

struct stream_builder {
  /// Builds the next stream for the batch `requests` (benchmark request ids), m misses per request
  /// and step, `warmup` + `timed` steps after the fill step; uploads it. Throws when a request
  /// has no row left that the current configuration has not drawn.
  static stream build(history_walk& w, const std::vector<std::int32_t>& requests, std::uint32_t m,
                      std::uint32_t warmup, std::uint32_t timed) {
    stream st = generate(w, requests, m, warmup, timed);
    upload(st);
    return st;
  }

  /// Host part of build(): the selections and miss lists, not uploaded.
  static stream generate(history_walk& w, const std::vector<std::int32_t>& requests, std::uint32_t m,
                         std::uint32_t warmup, std::uint32_t timed) {
    stream st;
    st.C = static_cast<std::uint32_t>(requests.size());
    st.k = w.k_;
    st.m = m;
    st.warmup = warmup;
    st.timed = timed;
    st.serial = w.streams_made_++;
    st.requests = requests;
    const std::uint32_t steps = st.steps(), C = st.C, k = st.k;
    st.config = w.config_;
    if (m > k) throw std::invalid_argument("misses per request exceed top_k");
    st.sel.assign(static_cast<std::size_t>(steps) * C * k, -1);
    st.miss.assign(static_cast<std::size_t>(steps - 1) * C * m, 0);
    std::vector<std::uint64_t> drawn(C, 0), reused(C, 0);
    parallel_for(C, [&](std::size_t b) {
      const auto q = static_cast<std::uint32_t>(requests[b]);
      rng g{splitmix64(w.seed_ ^ (static_cast<std::uint64_t>(q) << 20) ^ (st.serial * 0x9E3779B97F4A7C15ull))};
      auto& perm = w.perm_[q];
      auto& cur = w.cursor_[q];
      auto& draws = w.draws_[q];
      auto& stamp = w.stamp_[q];
      auto& drawn_in = w.drawn_in_[q];
      const std::uint32_t cfg = w.config_;
      // The next row of the permutation that this configuration has not drawn and that no cache
      // can still hold; a row is drawn at most once per configuration (asserted by construction:
      // drawn_in marks it, and a marked row is skipped).
      auto draw = [&]() -> std::int32_t {
        for (std::uint32_t looked = 0; looked < w.fresh_; ++looked) {
          const std::int32_t r = perm[cur];
          if (++cur == w.fresh_) cur = 0;
          if (drawn_in[r] == cfg) continue;
          if (stamp[r] != 0 && draws - (stamp[r] - 1) <= w.guard_) continue;
          reused[b] += drawn_in[r] != 0;
          drawn_in[r] = cfg;
          ++draws;
          ++drawn[b];
          stamp[r] = draws + 1;
          return r;
        }
        throw std::runtime_error("request " + std::to_string(q) + " has no row left that this configuration has "
                                 "not drawn (" + std::to_string(w.rows_per_configuration()) +
                                 " a configuration at most: fewer steps or methods; see docs/benchmarks.md)");
      };
      auto stamp_selection = [&](const std::vector<std::int32_t>& sel) {
        for (std::int32_t r : sel) stamp[r] = draws + 1;
      };
      std::vector<std::int32_t> prev(k), next(k);
      // step 0: fill
      if (w.last_[q].size() == k) {
        prev = w.last_[q];
      } else {
        for (std::uint32_t i = 0; i < k; ++i) prev[i] = draw();
      }
      stamp_selection(prev);
      g.shuffle(prev.data(), k);
      std::copy(prev.begin(), prev.end(), st.sel.begin() + static_cast<std::ptrdiff_t>(b) * k);
      constexpr std::int32_t fresh_mark = std::int32_t(1) << 30;  // rows < 2^30: marks this step's misses
      for (std::uint32_t s = 1; s < steps; ++s) {
        // k - m random rows of the previous selection (a random subset: the tail of a shuffle) ...
        next = prev;
        g.shuffle(next.data(), k);
        // ... plus m drawn rows (never in the previous selection: the guard), shuffled as a top-k
        // would emit them.
        for (std::uint32_t i = 0; i < m; ++i) next[i] = draw() | fresh_mark;
        g.shuffle(next.data(), k);
        std::int32_t* out = st.sel.data() + (static_cast<std::size_t>(s) * C + b) * k;
        std::int32_t* mo = st.miss.data() + (static_cast<std::size_t>(s - 1) * C + b) * m;
        for (std::uint32_t i = 0, n = 0; i < k; ++i) {
          std::int32_t r = next[i];
          if (r & fresh_mark) {  // the misses, in selection order
            r &= ~fresh_mark;
            next[i] = r;
            mo[n++] = static_cast<std::int32_t>(q * w.hist_ + static_cast<std::uint32_t>(r));
          }
          out[i] = r;
        }
        stamp_selection(next);
        prev.swap(next);
      }
      w.last_[q] = prev;
    });
    for (std::uint32_t b = 0; b < C; ++b) {
      st.drawn += drawn[b];
      st.reused += reused[b];
    }
    return st;
  }

  static void upload(stream& st) {
    const std::uint32_t C = st.C;
    st.sel_d = device_buffer<std::int32_t>(st.sel.size());
    st.miss_d = device_buffer<std::int32_t>(std::max<std::size_t>(st.miss.size(), 1));
    st.requests_d = device_buffer<std::int32_t>(C);
    DHB_CHECK(cudaMemcpy(st.sel_d.get(), st.sel.data(), st.sel.size() * 4, cudaMemcpyHostToDevice));
    if (!st.miss.empty())
      DHB_CHECK(cudaMemcpy(st.miss_d.get(), st.miss.data(), st.miss.size() * 4, cudaMemcpyHostToDevice));
    DHB_CHECK(cudaMemcpy(st.requests_d.get(), st.requests.data(), C * 4, cudaMemcpyHostToDevice));
  }
};

/// Request sets of the C sweep inside N = max(C) histories, chosen so that no request serves more
/// than two batch sizes (fresh rows are finite): the largest C takes [0, N); the others are
/// stacked downwards from N, smallest first (C=1 -> {N-1}, C=8 -> [N-9, N-1), ...).
inline std::vector<std::int32_t> requests_for(std::uint32_t C, const std::vector<std::uint32_t>& sweep) {
  const std::uint32_t N = *std::max_element(sweep.begin(), sweep.end());
  std::vector<std::uint32_t> others;
  for (auto c : sweep)
    if (c != N) others.push_back(c);
  std::sort(others.begin(), others.end());
  std::uint32_t start = 0;
  if (C != N) {
    std::uint32_t top = N;
    for (auto c : others) {
      start = top >= c ? top - c : 0;
      if (c == C) break;
      top = start;
    }
  }
  std::vector<std::int32_t> r(C);
  std::iota(r.begin(), r.end(), static_cast<std::int32_t>(start));
  return r;
}

}  // namespace dhisparse_bench
