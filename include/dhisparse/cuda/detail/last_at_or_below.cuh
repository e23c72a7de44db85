#pragma once
/// \file
/// The one search the CUDA kernels share: in an ascending array, the last position whose value is
/// at or below a key. Entries are found from a unit index through an exclusive prefix of per-entry
/// counts (entries with no units are skipped), a missing row's rank from the ascending list of
/// distinct misses.
#include <cub/thread/thread_search.cuh>

namespace dhisparse::cuda::detail {

/// Last i in [0, count) with sorted[i] <= key. Precondition: count > 0 and sorted[0] <= key.
/// (cub::UpperBound until the CCCL in use makes cuda::std::upper_bound public.)
template <class Index, class T, class Key>
__device__ __forceinline__ Index last_at_or_below(const T* sorted, Index count, Key key) {
  return cub::UpperBound(sorted, count, key) - Index{1};
}

}  // namespace dhisparse::cuda::detail
