#pragma once
/// \file
/// The copy kernels that replay a plan (follower copies of a resolve, verify copies) first need
/// where each batch entry's rows start in the flat list of rows: an exclusive scan of the rows
/// each entry copied, done by one warp from the entries' stats.
#include <cuda_runtime.h>

namespace dhisparse::cuda::detail {

/// Run by the CTA's first warp (other threads return at once): prefix[i] = rows copied by entries
/// 0 .. i-1 for i <= C, read from `stats[i].rows_copied`. Synchronise the CTA before reading it.
template <class Stats>
__device__ __forceinline__ void scan_rows_copied(const Stats* stats, unsigned C, unsigned* prefix) {
  if (threadIdx.x >= 32) return;
  const unsigned lane = threadIdx.x & 31u;
  unsigned running = 0;
  for (unsigned base = 0; base < C; base += 32) {
    const unsigned i = base + lane;
    const unsigned v = i < C ? stats[i].rows_copied : 0u;
    unsigned incl = v;
#pragma unroll
    for (unsigned o = 1; o < 32; o <<= 1) {
      const unsigned y = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += y;
    }
    if (i < C) prefix[i] = running + incl - v;
    running += __shfl_sync(0xffffffffu, incl, 31);
  }
  if (lane == 0) prefix[C] = running;
}

}  // namespace dhisparse::cuda::detail
