#pragma once
/// \file
/// Fresh-miss decode streams for the CUDA resolver benchmark.
///
/// Every request q owns a random permutation of its history rows [0, hist - tail) (the newest
/// `tail` rows sit in the resolver's tail and are never drawn). A row handed out by the permutation
/// is never handed out again, across every stream of the run, so a timed miss is always a row that
/// no method has selected before for that request: its host page translations are cold, exactly as
/// in real decoding (docs/h200-limits.md: replaying a miss set measures a translation cache, not the copy).
///
/// A stream for a configuration (C requests, m misses per request and step) has 1 + W + T steps:
///  * step 0 (fill, untimed): k rows per request, the request's last selection of the previous
///    stream when it has one (no fresh rows spent), otherwise k fresh rows;
///  * steps 1.. (W warm-up, then T timed): k - m rows drawn at random from the previous step's
///    selection (guaranteed hot-cache hits: B >= k and the previous resolve left every non-direct
///    row of its selection in the cache) plus the next m fresh rows, the k entries shuffled as a
///    top-k would emit them (not sorted).
/// Selections are generated on the host and uploaded before any timing.
#include <algorithm>
#include <cstddef>
#include <cstdint>
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

/// Runs f(i) for i in [0, n) on the machine's cores (each i independent and deterministic).
template <class F>
void parallel_for(std::size_t n, F&& f) {
  const std::size_t threads = std::max<std::size_t>(1, std::min<std::size_t>(n, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  pool.reserve(threads);
  for (std::size_t t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      for (std::size_t i = t; i < n; i += threads) f(i);
    });
  for (auto& th : pool) th.join();
}

/// Per-request fresh-row permutations and last selections, shared by every stream of one run
/// phase (one row size: one set of histories).
class history_walk {
 public:
  history_walk(std::uint32_t requests, std::uint32_t hist, std::uint32_t tail, std::uint32_t k, std::uint64_t seed)
      : requests_(requests), hist_(hist), fresh_(hist - tail), k_(k), seed_(seed), perm_(requests),
        cursor_(requests, 0), last_(requests) {
    parallel_for(requests, [&](std::size_t q) {
      auto& p = perm_[q];
      p.resize(fresh_);
      std::iota(p.begin(), p.end(), 0);
      rng g{splitmix64(seed_ ^ (0xA11CE000ull + q))};
      g.shuffle(p.data(), p.size());
    });
  }
  std::uint32_t requests() const { return requests_; }
  std::uint32_t hist() const { return hist_; }
  std::uint32_t k() const { return k_; }
  /// Fresh rows left for request q.
  std::uint32_t fresh_left(std::uint32_t q) const { return fresh_ - cursor_[q]; }

  /// Fresh rows request q needs for a stream of `steps` steps with m misses.
  std::uint32_t fresh_needed(std::uint32_t q, std::uint32_t steps, std::uint32_t m) const {
    return (last_[q].empty() ? k_ : 0) + (steps - 1) * m;
  }

  friend struct stream_builder;

 private:
  std::uint32_t requests_, hist_, fresh_, k_;
  std::uint64_t seed_;
  std::vector<std::vector<std::int32_t>> perm_;
  std::vector<std::uint32_t> cursor_;
  std::vector<std::vector<std::int32_t>> last_;
  std::uint64_t streams_made_ = 0;
};

/// A generated stream, on the host and uploaded to the device.
struct stream {
  std::uint32_t C = 0, k = 0, m = 0, warmup = 0, timed = 0;
  std::uint32_t steps() const { return 1 + warmup + timed; }
  std::uint32_t first_timed() const { return 1 + warmup; }
  std::uint64_t serial = 0;                  ///< distinguishes regenerated streams of one configuration
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
  /// and step, `warmup` + `timed` steps after the fill step; uploads it. Throws when a request's
  /// fresh rows would run out (too many repetitions for a 100K-row history).
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
    if (m > k) throw std::invalid_argument("misses per request exceed top_k");
    for (std::int32_t q : requests) {
      const auto need = w.fresh_needed(static_cast<std::uint32_t>(q), steps, m);
      if (need > w.fresh_left(static_cast<std::uint32_t>(q)))
        throw std::runtime_error("request " + std::to_string(q) + " has " +
                                 std::to_string(w.fresh_left(static_cast<std::uint32_t>(q))) +
                                 " never-selected rows left, the stream needs " + std::to_string(need) +
                                 " (fewer steps or repetitions; see docs/benchmarks.md)");
    }
    st.sel.assign(static_cast<std::size_t>(steps) * C * k, -1);
    st.miss.assign(static_cast<std::size_t>(steps - 1) * C * m, 0);
    parallel_for(C, [&](std::size_t b) {
      const auto q = static_cast<std::uint32_t>(requests[b]);
      rng g{splitmix64(w.seed_ ^ (static_cast<std::uint64_t>(q) << 20) ^ (st.serial * 0x9E3779B97F4A7C15ull))};
      auto& perm = w.perm_[q];
      auto& cur = w.cursor_[q];
      std::vector<std::int32_t> prev(k), next(k);
      // step 0: fill
      if (w.last_[q].size() == k) {
        prev = w.last_[q];
      } else {
        for (std::uint32_t i = 0; i < k; ++i) prev[i] = perm[cur++];
      }
      g.shuffle(prev.data(), k);
      std::copy(prev.begin(), prev.end(), st.sel.begin() + static_cast<std::ptrdiff_t>(b) * k);
      constexpr std::int32_t fresh_mark = std::int32_t(1) << 30;  // rows < 2^30: marks this step's misses
      for (std::uint32_t s = 1; s < steps; ++s) {
        // k - m random rows of the previous selection (a random subset: the tail of a shuffle) ...
        next = prev;
        g.shuffle(next.data(), k);
        // ... plus m rows never selected before, then shuffled as a top-k would emit them.
        for (std::uint32_t i = 0; i < m; ++i) next[i] = perm[cur++] | fresh_mark;
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
        prev.swap(next);
      }
      w.last_[q] = prev;
    });
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
