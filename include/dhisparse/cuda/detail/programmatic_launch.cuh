#pragma once
/// \file
/// Programmatic dependent launch of the per-step kernels (`hierarchy::set_programmatic_launch`):
/// the kernel prologue that makes such a launch exact, and the launcher that sets the attribute.
#include <cuda_runtime.h>
#include <nv/target>

#include <cstddef>
#include <utility>

namespace dhisparse::cuda::detail {

/// The first statement of every kernel the hierarchy may launch programmatically. Such a grid may
/// start while the kernel before it in the stream still runs (an engine's indexer, or the previous
/// kernel of the same step), so it reads nothing global before that kernel has completed and its
/// writes are visible (`griddepcontrol.wait`). It then lets a kernel launched after it the same way
/// be scheduled as its CTAs retire; that kernel waits the same way before it reads this one's
/// output. Both do nothing for an ordinary launch, and nothing before compute capability 9.0.
__device__ __forceinline__ void programmatic_launch_prologue() {
  NV_IF_TARGET(NV_PROVIDES_SM_90, (cudaGridDependencySynchronize(); cudaTriggerProgrammaticLaunchCompletion();))
}

/// Launches `kernel` (whose first statement is programmatic_launch_prologue) on `stream`, with
/// programmatic stream serialization when `programmatic`. Returns the launch's error.
template <class... Params, class... Args>
cudaError_t launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t shared_bytes,
                          cudaStream_t stream, bool programmatic, Args&&... args) {
  if (!programmatic) {
    kernel<<<grid, block, shared_bytes, stream>>>(std::forward<Args>(args)...);
    return cudaGetLastError();
  }
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

}  // namespace dhisparse::cuda::detail
