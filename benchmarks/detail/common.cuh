#pragma once
/// \file
/// Shared pieces of the CUDA resolver benchmark (benchmarks/bench_cuda_resolver.cu): error
/// checking, CUDA-event step timing with order statistics, the deterministic row content every
/// baseline and dhisparse are checked against, and the verification kernels.
///
/// Row content: 8-byte word w of row `row` of benchmark request q is `row_word(q, row, w)`, a
/// splitmix64 of the three coordinates. The history is generated once on the GPU (into the
/// `resident` baseline's HBM copy) and copied to pinned host memory, so every byte any method
/// returns can be checked on the device without moving rows back to the host.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

namespace dhisparse_bench {

/// A failed CUDA call: thrown by DHB_CHECK, turned into SkipWithError by the benchmark bodies.
struct cuda_failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline void check_cuda(cudaError_t e, const char* what, const char* file, int line) {
  if (e != cudaSuccess)
    throw cuda_failure(std::string(what) + " failed at " + file + ":" + std::to_string(line) + ": " +
                       cudaGetErrorString(e));
}
#define DHB_CHECK(x) ::dhisparse_bench::check_cuda((x), #x, __FILE__, __LINE__)

// --- row content ------------------------------------------------------------------------------

__host__ __device__ constexpr std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// Word `w` (8 bytes) of row `row` of benchmark request `q` (q < 2^20, row < 2^31, w < 2^12).
__host__ __device__ constexpr std::uint64_t row_word(std::uint32_t q, std::uint32_t row, std::uint32_t w) {
  return splitmix64((static_cast<std::uint64_t>(q) << 44) ^ (static_cast<std::uint64_t>(row) << 12) ^ w);
}

/// Fills `requests` histories of `hist` rows, `words` 8-byte words each: dst[(q*hist + row)*words + w].
__global__ void fill_history_kernel(std::uint64_t* __restrict__ dst, std::uint32_t requests, std::uint32_t hist,
                                    std::uint32_t words) {
  const std::size_t total = static_cast<std::size_t>(requests) * hist * words;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::size_t r = i / words;
    const auto w = static_cast<std::uint32_t>(i - r * words);
    const auto q = static_cast<std::uint32_t>(r / hist);
    const auto row = static_cast<std::uint32_t>(r - static_cast<std::size_t>(q) * hist);
    dst[i] = row_word(q, row, w);
  }
}

// --- verification (device side; counts mismatching rows) ---------------------------------------

/// The tag a row's content is made from (row_word's first word argument): by default the request
/// that owns the row; a benchmark whose requests share rows (a prefix) passes its own.
struct request_tag {
  __device__ std::uint32_t operator()(std::uint32_t request, std::uint32_t /*row*/) const { return request; }
};

/// Checks a resolver's output for a batch: entry j of batch item b selected row sel[b*stride + j]
/// of request req[b]; the method returned loc[b*stride + j]; the row must sit at pool + loc*row bytes
/// (pool rows of `words` 8-byte words) and hold row_word(tag(req[b], row), row, w). -1 entries must
/// map to -1. One warp per entry. bad[0]: mismatching entries; bad[1]: first bad entry index + 1 (0 if none).
template <class Tag = request_tag>
__global__ void verify_locations_kernel(const std::int32_t* __restrict__ sel, const std::int32_t* __restrict__ loc,
                                        const std::int32_t* __restrict__ req, int items, int stride, int entries,
                                        const std::uint64_t* __restrict__ pool, std::size_t pool_rows, int words,
                                        unsigned long long* bad, Tag tag = {}) {
  const int lane = threadIdx.x & 31;
  const long long warp = (blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x) >> 5;
  const long long warps = (static_cast<long long>(gridDim.x) * blockDim.x) >> 5;
  const long long n = static_cast<long long>(items) * entries;
  for (long long e = warp; e < n; e += warps) {
    const long long b = e / entries, j = e - b * entries;
    const long long at = b * stride + j;
    const std::int32_t row = sel[at], l = loc[at];
    bool ok = true;
    if (row < 0) {
      ok = l == -1;
    } else if (l < 0 || static_cast<std::size_t>(l) >= pool_rows) {
      ok = false;
    } else {
      const std::uint64_t* p = pool + static_cast<std::size_t>(l) * words;
      const auto r = static_cast<std::uint32_t>(row);
      const std::uint32_t t = tag(static_cast<std::uint32_t>(req[b]), r);
      for (int w = lane; w < words; w += 32)
        if (p[w] != row_word(t, r, static_cast<std::uint32_t>(w))) ok = false;
    }
    ok = __all_sync(0xffffffffu, ok);
    if (!ok && lane == 0) {
      atomicAdd(&bad[0], 1ull);
      atomicCAS(&bad[1], 0ull, static_cast<unsigned long long>(at) + 1);
    }
  }
}

/// Checks a plain gather: output row i (at dst + i*words) must hold history row gidx[i]
/// (global index q*hist + row).
__global__ void verify_gather_kernel(const std::int32_t* __restrict__ gidx, int n, const std::uint64_t* __restrict__ dst,
                                     int words, std::uint32_t hist, unsigned long long* bad) {
  const int lane = threadIdx.x & 31;
  const long long warp = (blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x) >> 5;
  const long long warps = (static_cast<long long>(gridDim.x) * blockDim.x) >> 5;
  for (long long i = warp; i < n; i += warps) {
    const auto g = static_cast<std::uint32_t>(gidx[i]);
    const std::uint32_t q = g / hist, row = g - q * hist;
    bool ok = true;
    for (int w = lane; w < words; w += 32)
      if (dst[static_cast<std::size_t>(i) * words + w] != row_word(q, row, static_cast<std::uint32_t>(w))) ok = false;
    ok = __all_sync(0xffffffffu, ok);
    if (!ok && lane == 0) {
      atomicAdd(&bad[0], 1ull);
      atomicCAS(&bad[1], 0ull, static_cast<unsigned long long>(i) + 1);
    }
  }
}

/// Checks two int32 arrays for equality: bad[0] counts differing entries, bad[1] = first + 1.
__global__ void verify_equal_kernel(const std::int32_t* __restrict__ a, const std::int32_t* __restrict__ b, long long n,
                                    unsigned long long* bad) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x)
    if (a[i] != b[i]) {
      atomicAdd(&bad[0], 1ull);
      atomicCAS(&bad[1], 0ull, static_cast<unsigned long long>(i) + 1);
    }
}

/// Device scratch for the verification kernels (two counters).
class verifier {
 public:
  verifier() { DHB_CHECK(cudaMalloc(&bad_, 2 * sizeof(unsigned long long))); }
  ~verifier() { cudaFree(bad_); }
  verifier(const verifier&) = delete;
  verifier& operator=(const verifier&) = delete;

  struct result {
    unsigned long long bad = 0;
    long long first = -1;  ///< flat index of the first bad entry, -1 if none
  };

  result locations(const std::int32_t* sel, const std::int32_t* loc, const std::int32_t* req, int items, int stride,
                   int entries, const void* pool, std::size_t pool_rows, int row_bytes, cudaStream_t s) {
    DHB_CHECK(cudaMemsetAsync(bad_, 0, 2 * sizeof(unsigned long long), s));
    verify_locations_kernel<<<1024, 256, 0, s>>>(sel, loc, req, items, stride, entries,
                                                  static_cast<const std::uint64_t*>(pool), pool_rows, row_bytes / 8,
                                                  bad_);
    return fetch(s);
  }
  result equal(const std::int32_t* a, const std::int32_t* b, long long n, cudaStream_t s) {
    DHB_CHECK(cudaMemsetAsync(bad_, 0, 2 * sizeof(unsigned long long), s));
    if (n > 0) verify_equal_kernel<<<256, 256, 0, s>>>(a, b, n, bad_);
    return fetch(s);
  }
  result gather(const std::int32_t* gidx, int n, const void* dst, int row_bytes, std::uint32_t hist, cudaStream_t s) {
    DHB_CHECK(cudaMemsetAsync(bad_, 0, 2 * sizeof(unsigned long long), s));
    if (n > 0)
      verify_gather_kernel<<<1024, 256, 0, s>>>(gidx, n, static_cast<const std::uint64_t*>(dst), row_bytes / 8, hist,
                                                bad_);
    return fetch(s);
  }

 private:
  result fetch(cudaStream_t s) {
    DHB_CHECK(cudaGetLastError());
    unsigned long long h[2];
    DHB_CHECK(cudaMemcpyAsync(h, bad_, sizeof h, cudaMemcpyDeviceToHost, s));
    DHB_CHECK(cudaStreamSynchronize(s));
    return {h[0], static_cast<long long>(h[1]) - 1};
  }
  unsigned long long* bad_ = nullptr;
};

// --- timing -----------------------------------------------------------------------------------

/// One event pair, reused for every timed step: record start, enqueue the step, record stop, wait.
class step_timer {
 public:
  step_timer() {
    DHB_CHECK(cudaEventCreate(&start_));
    DHB_CHECK(cudaEventCreate(&stop_));
  }
  ~step_timer() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  step_timer(const step_timer&) = delete;
  step_timer& operator=(const step_timer&) = delete;

  /// Times `enqueue()` on stream `s`; returns milliseconds between the two events.
  template <class F>
  float time(cudaStream_t s, F&& enqueue) {
    DHB_CHECK(cudaEventRecord(start_, s));
    enqueue();
    DHB_CHECK(cudaEventRecord(stop_, s));
    DHB_CHECK(cudaEventSynchronize(stop_));
    DHB_CHECK(cudaGetLastError());
    float ms = 0.f;
    DHB_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
    return ms;
  }

 private:
  cudaEvent_t start_{}, stop_{};
};

/// Order statistics of per-step times (microseconds).
struct step_stats {
  double median_us = 0, p10_us = 0, p90_us = 0, min_us = 0, max_us = 0, mean_us = 0;
};

/// Percentile by linear interpolation between closest ranks (numpy's default).
inline double percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  const double pos = p * static_cast<double>(sorted.size() - 1);
  const auto lo = static_cast<std::size_t>(pos);
  const std::size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - static_cast<double>(lo));
}

inline step_stats summarize(std::vector<double> us) {
  step_stats s;
  if (us.empty()) return s;
  std::sort(us.begin(), us.end());
  s.median_us = percentile(us, 0.5);
  s.p10_us = percentile(us, 0.1);
  s.p90_us = percentile(us, 0.9);
  s.min_us = us.front();
  s.max_us = us.back();
  double sum = 0;
  for (double v : us) sum += v;
  s.mean_us = sum / static_cast<double>(us.size());
  return s;
}

// --- small RAII buffers -----------------------------------------------------------------------

template <class T>
class device_buffer {
 public:
  device_buffer() = default;
  explicit device_buffer(std::size_t n) : n_(n) {
    if (n) DHB_CHECK(cudaMalloc(&p_, n * sizeof(T)));
  }
  ~device_buffer() { cudaFree(p_); }
  device_buffer(device_buffer&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr, o.n_ = 0; }
  device_buffer& operator=(device_buffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  T* get() const { return p_; }
  std::size_t size() const { return n_; }
  std::size_t bytes() const { return n_ * sizeof(T); }

 private:
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

/// Mapped pinned host memory (cudaHostAlloc), readable by kernels through UVA.
class pinned_buffer {
 public:
  pinned_buffer() = default;
  explicit pinned_buffer(std::size_t bytes) : n_(bytes) {
    if (bytes) DHB_CHECK(cudaHostAlloc(&p_, bytes, cudaHostAllocMapped | cudaHostAllocPortable));
  }
  ~pinned_buffer() { cudaFreeHost(p_); }
  pinned_buffer(const pinned_buffer&) = delete;
  pinned_buffer& operator=(const pinned_buffer&) = delete;
  std::byte* get() const { return static_cast<std::byte*>(p_); }
  std::size_t bytes() const { return n_; }

 private:
  void* p_ = nullptr;
  std::size_t n_ = 0;
};

}  // namespace dhisparse_bench
