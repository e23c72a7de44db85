// Every public CUDA header, with every kernel instantiated, compiled with plain C++20 flags only:
//   nvcc -O3 -arch=sm_90 -std=c++20 -c plain_flags.cu
// (no --expt-relaxed-constexpr, no --extended-lambda). Builds that do not use dhisparse's CMake
// target (JIT-built extensions, Bazel) pass no more than this. tests/CMakeLists.txt runs it as the
// test plain_cuda_flags; it is never linked.
#include <dhisparse/cuda/batch.cuh>
#include <dhisparse/cuda/buffers.cuh>
#include <dhisparse/cuda/draft_ring_step.cuh>
#include <dhisparse/cuda/draft_ring_store.cuh>
#include <dhisparse/cuda/error.cuh>
#include <dhisparse/cuda/hierarchy.cuh>
#include <dhisparse/cuda/interprocess_host_store.cuh>
#include <dhisparse/cuda/residency_manager.cuh>
#include <dhisparse/cuda/verify_batch.cuh>
#include <dhisparse/cuda/verify_views.cuh>
#include <dhisparse/cuda/views.cuh>
#include <dhisparse/dhisparse.hpp>
#include <dhisparse/layouts/tiny.hpp>
#include <dhisparse/policies/draft_ring.hpp>
#include <dhisparse/policies/staging_arena.hpp>

// Explicit instantiation compiles every non-template member, so every kernel a hierarchy, a
// residency manager or a draft ring store can launch is instantiated for the device.
namespace dh = dhisparse;
using dedicated = dh::cuda::hierarchy<dh::layouts::tiny, dh::lru_hot_cache<32>, dh::fixed_budget_policy,
                                      dh::dedicated_staging>;
using shared = dh::cuda::hierarchy<dh::layouts::tiny, dh::lru_hot_cache<32>, dh::adaptive_policy<>,
                                   dh::staging_arenas<2>>;
template class dh::cuda::hierarchy<dh::layouts::tiny, dh::lru_hot_cache<32>, dh::fixed_budget_policy,
                                   dh::dedicated_staging>;
template class dh::cuda::hierarchy<dh::layouts::tiny, dh::lru_hot_cache<32>, dh::adaptive_policy<>,
                                   dh::staging_arenas<2>>;
template class dh::cuda::residency_manager<dedicated>;
template class dh::cuda::residency_manager<shared>;
template class dh::cuda::draft_ring_store<dh::draft_ring<16, 4, 8>>;
template class dh::cuda::interprocess_pinned_host_store<dh::layouts::tiny>;
template struct dh::cuda::draft_ring_step_ref<dh::draft_ring<16, 4, 8>>;  // its device members
