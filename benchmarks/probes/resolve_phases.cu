// Probe: where the time of a small resolve step goes. Defines DHISPARSE_RESOLVE_MARK to store
// %globaltimer per CTA and phase, then times resolve steps of dhisparse::cuda::hierarchy the way
// bench_cuda_resolver does (fresh misses every step, L2 flushed before each step, CUDA events) and
// prints, per configuration, the median over the timed steps of every phase's time in µs from the
// first CTA's start: for the metadata phases (1-8, 12-14) the latest entry, for phases 9-11 the
// median and the last CTA (phase 11, "CTA done", counts entry CTAs too: in small early-copy
// batches they end there without taking part in the done count), the SM clock the entry ran at,
// and how many early-copy rows
// per step were fetched again because their source was read before it landed. First it times an empty
// kernel of the resolver's launch shape after the same flush (launch and teardown alone).
// Phase numbers: include/dhisparse/cuda/detail/resolve_kernel.cuh.
// Built with the CUDA benchmarks as probe_resolve_phases (CI compiles it); by hand, with the
// library include directory pointing at the variant to compare:
//   nvcc -O3 -arch=sm_90 -std=c++20 --expt-relaxed-constexpr -Iinclude -Ibenchmarks
//        -o resolve_phases benchmarks/probes/resolve_phases.cu
//   ./resolve_phases [timed steps, default 50] [batch sizes, default 1,8] [self-copy units]
// (one request per batch entry, 100K rows of history each: C = 128 pins 7.4 GB of host memory)
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <vector>

namespace phase_marks {
constexpr int kPhases = 16, kMaxCtas = 1024;
__device__ unsigned long long stamps[kMaxCtas * kPhases];
__device__ long long clocks[kMaxCtas * kPhases];  // SM clock at the same marks (effective clock rate)
__device__ __forceinline__ void mark(int phase) {
  if (threadIdx.x == 0) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    stamps[blockIdx.x * kPhases + phase] = t;
    clocks[blockIdx.x * kPhases + phase] = clock64();
  }
}
__device__ unsigned long long refetch_lanes;  // lanes that fetched an early-copy row again
}  // namespace phase_marks
#define DHISPARSE_RESOLVE_MARK(phase) ::phase_marks::mark(phase)
#define DHISPARSE_RESOLVE_TEST_REFETCH() atomicAdd(&::phase_marks::refetch_lanes, 1ull)

#include <dhisparse/cuda/hierarchy.cuh>
#include <dhisparse/layout.hpp>
#include <dhisparse/policies/hot_cache.hpp>
#include <dhisparse/policies/residency.hpp>

#include "detail/common.cuh"
#include "detail/workload.cuh"

namespace {
using namespace dhisparse_bench;
constexpr std::uint32_t kTopK = 2048, kHot = 4096, kPageRows = 64, kTail = 64, kHist = 100000;
constexpr int kRowBytes = 576;

struct layout {
  static constexpr std::size_t top_k = kTopK;
  static constexpr std::size_t page_rows = kPageRows;
  static constexpr std::array<dhisparse::source_desc, 1> sources{{{kRowBytes, 1, 1, 0}}};
  static constexpr std::array<dhisparse::consumer_desc, 1> consumers{{{0, dhisparse::consumer_kind::reindex, 0}}};
};
using hierarchy = dhisparse::cuda::hierarchy<layout, dhisparse::lru_hot_cache<kHot>, dhisparse::fixed_budget_policy>;

__global__ void empty_kernel(int* sink, int shared_bytes) {
  extern __shared__ int dyn[];
  if (threadIdx.x == 0) sink[blockIdx.x] = shared_bytes > 0 ? dyn[0] : 0;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
}  // namespace

int main(int argc, char** argv) {
  const std::uint32_t timed = argc > 1 ? static_cast<std::uint32_t>(std::atoi(argv[1])) : 50;
  std::vector<std::uint32_t> batches;
  for (const char* c = argc > 2 ? argv[2] : "1,8"; *c != '\0';) {
    char* end = nullptr;
    const unsigned long v = std::strtoul(c, &end, 10);
    if (end == c || v == 0) {
      std::fprintf(stderr, "resolve_phases: batch sizes are positive integers separated by commas\n");
      return 2;
    }
    batches.push_back(static_cast<std::uint32_t>(v));
    c = *end == ',' ? end + 1 : end;
  }
  const std::uint32_t requests = *std::max_element(batches.begin(), batches.end());
  cudaStream_t s;
  DHB_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  pinned_buffer history(std::size_t(requests) * kHist * kRowBytes);
  std::memset(history.get(), 0x5A, history.bytes());
  dhisparse::hierarchy_config cfg;
  cfg.max_requests = requests;
  cfg.max_rows = kHist;
  cfg.tail_rows = kTail;
  hierarchy h(cfg, s);
  if (argc > 3) h.set_self_copy_units(static_cast<unsigned>(std::atoi(argv[3])));
  std::vector<std::int32_t> slot_of(requests);
  for (std::uint32_t q = 0; q < requests; ++q) {
    slot_of[q] = static_cast<std::int32_t>(h.admit(q, s).slot);
    for (std::uint32_t r = 0; r < kHist; r += 25000)
      h.append(q, 0, history.get() + (std::size_t(q) * kHist + r) * kRowBytes, std::min(25000u, kHist - r), s);
  }
  h.check_errors(s);
  int dev = 0, l2 = 0;
  DHB_CHECK(cudaGetDevice(&dev));
  DHB_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
  device_buffer<std::byte> flush(4 * std::size_t(l2));
  device_buffer<std::int32_t> slots(requests), locations(std::size_t(requests) * kTopK);
  device_buffer<std::uint32_t> count(1);
  history_walk walk(requests, kHist, kTail, kTopK, 0xFA5E5ull);
  step_timer timer;
  std::vector<unsigned long long> st(phase_marks::kMaxCtas * phase_marks::kPhases);
  std::vector<long long> clk(st.size());

  // Launch and teardown alone: an empty kernel of the resolver's shape after the same L2 flush.
  {
    int* sink = nullptr;
    DHB_CHECK(cudaMalloc(&sink, 4096 * sizeof(int)));
    const int smem = static_cast<int>(h.resolver_shared_bytes());
    DHB_CHECK(cudaFuncSetAttribute(empty_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    struct shape {
      int grid, threads, smem;
    };
    for (shape sh : {shape{1, 1024, 0}, shape{h.resolver_grid(), 1024, 0}, shape{1, 1024, smem},
                     shape{h.resolver_grid(), 1024, smem}}) {
      std::vector<double> t;
      for (int i = 0; i < 60; ++i) {
        DHB_CHECK(cudaMemsetAsync(flush.get(), i & 0xff, flush.bytes(), s));
        const float ms = timer.time(s, [&] { empty_kernel<<<sh.grid, sh.threads, sh.smem, s>>>(sink, sh.smem); });
        if (i >= 10) t.push_back(ms * 1000.0);
      }
      std::printf("empty kernel %4d x %4d threads, %6d B shared: %.2f us\n", sh.grid, sh.threads, sh.smem, median(t));
    }
    DHB_CHECK(cudaFree(sink));
  }
  std::printf("%-4s %-5s %7s | %s\n", "C", "miss", "event", "phase: latest entry (1-8) / copy CTAs median..last (9-11), us");
  for (std::uint32_t C : batches)
    for (std::uint32_t m : {2u, 410u}) {
      std::vector<std::int32_t> req(C);
      std::iota(req.begin(), req.end(), 0);
      stream str = stream_builder::build(walk, req, m, 3, timed);
      std::vector<std::int32_t> sl(C);
      for (std::uint32_t b = 0; b < C; ++b) sl[b] = slot_of[b];
      DHB_CHECK(cudaMemcpy(slots.get(), sl.data(), C * 4, cudaMemcpyHostToDevice));
      DHB_CHECK(cudaMemcpy(count.get(), &C, 4, cudaMemcpyHostToDevice));
      std::vector<double> ev, mhz;
      unsigned long long refetch_before = 0, refetch_after = 0;
      std::vector<std::vector<double>> ph(32);
      for (std::uint32_t step = 0; step < str.steps(); ++step) {
        void* sym = nullptr;
        DHB_CHECK(cudaGetSymbolAddress(&sym, phase_marks::stamps));
        DHB_CHECK(cudaMemsetAsync(sym, 0, st.size() * 8, s));
        DHB_CHECK(cudaMemsetAsync(flush.get(), static_cast<int>(step & 0xff), flush.bytes(), s));
        dhisparse::cuda::batch_view v;
        v.slots = slots.get();
        v.selections = str.sel_step_d(step);
        v.locations = locations.get();
        v.count = count.get();
        v.stride = kTopK;
        v.capacity = C;
        if (step == str.first_timed())
          DHB_CHECK(cudaMemcpyFromSymbol(&refetch_before, phase_marks::refetch_lanes, sizeof refetch_before));
        const float ms = timer.time(s, [&] { h.resolve(0, v, s, dhisparse::copy_layers::all); });
        h.check_errors(s);
        if (step < str.first_timed()) continue;
        ev.push_back(ms * 1000.0);
        DHB_CHECK(cudaMemcpyFromSymbol(st.data(), phase_marks::stamps, st.size() * 8));
        DHB_CHECK(cudaMemcpyFromSymbol(clk.data(), phase_marks::clocks, clk.size() * 8));
        for (int b = 0; b < phase_marks::kMaxCtas; ++b)  // clock rate of an entry's CTA, marks 1 to 8
          if (st[b * 16 + 8] > st[b * 16 + 1] && st[b * 16 + 1] != 0) {
            mhz.push_back(double(clk[b * 16 + 8] - clk[b * 16 + 1]) * 1000.0 / double(st[b * 16 + 8] - st[b * 16 + 1]));
            break;
          }
        unsigned long long t0 = ~0ull;
        for (int b = 0; b < phase_marks::kMaxCtas; ++b)
          if (st[b * 16] != 0) t0 = std::min(t0, st[b * 16]);
        for (int p = 1; p < phase_marks::kPhases; ++p) {
          std::vector<double> at;
          for (int b = 0; b < phase_marks::kMaxCtas; ++b)
            if (st[b * 16 + p] != 0) at.push_back((st[b * 16 + p] - t0) / 1000.0);
          if (at.empty()) continue;
          std::sort(at.begin(), at.end());
          if (p >= 9 && p < 12) ph[p + 16].push_back(at[at.size() / 2]);  // median copy CTA
          ph[p].push_back(at.back());
        }
      }
      DHB_CHECK(cudaMemcpyFromSymbol(&refetch_after, phase_marks::refetch_lanes, sizeof refetch_after));
      // Every lane of the copying warp counts a re-fetched row once.
      const double refetched_rows = double(refetch_after - refetch_before) / 32.0 / double(ev.size());
      std::printf("%-4u %-5u %7.2f %5.0fMHz %6.1f refetched rows/step |", C, m, median(ev), median(mhz), refetched_rows);
      for (int p = 1; p < 9; ++p) std::printf(" %d:%.2f", p, median(ph[p]));
      for (int p = 9; p < 12; ++p) std::printf(" %d:%.2f..%.2f", p, median(ph[p + 16]), median(ph[p]));
      for (int p = 12; p < phase_marks::kPhases; ++p)
        if (!ph[p].empty()) std::printf(" %d:%.2f", p, median(ph[p]));
      std::printf("\n");
    }
  DHB_CHECK(cudaStreamDestroy(s));
  return 0;
}
