#pragma once
// Shared by the probes: CUDA error checks (DHB_CHECK, from the benchmarks' helpers) and the
// timing of one launch the way bench_cuda_resolver times a step.
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "../detail/common.cuh"

namespace probes {

/// Median, in µs, of `timed` event-timed calls of `launch(stream)` after `warmup` untimed ones;
/// `before(stream, i)` runs ahead of call i, outside the events (an L2 flush, or work that keeps
/// the GPU busy while the host enqueues the timed launch).
template <class Before, class Launch>
float median_launch_us(cudaStream_t stream, Before before, Launch launch, int timed = 200, int warmup = 20) {
  cudaEvent_t a, b;
  DHB_CHECK(cudaEventCreate(&a));
  DHB_CHECK(cudaEventCreate(&b));
  std::vector<float> t;
  for (int i = 0; i < warmup + timed; ++i) {
    before(stream, i);
    DHB_CHECK(cudaEventRecord(a, stream));
    launch(stream);
    DHB_CHECK(cudaEventRecord(b, stream));
    DHB_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    DHB_CHECK(cudaEventElapsedTime(&ms, a, b));
    if (i >= warmup) t.push_back(ms * 1000.f);
  }
  std::sort(t.begin(), t.end());
  DHB_CHECK(cudaEventDestroy(a));
  DHB_CHECK(cudaEventDestroy(b));
  return t[t.size() / 2];
}

}  // namespace probes
