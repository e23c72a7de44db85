#pragma once
/// \file
/// Device affinity of the CUDA backend's owning types. Each records the calling thread's current
/// device when it is created and makes that device current for every member that calls CUDA
/// (`device_guard`), so an object can be used from any thread whatever that thread's current
/// device; the thread's device is restored when the member returns, also when it throws.
/// Streams given by the caller must belong to the object's device (`check_stream_device`).
#include <cuda_runtime.h>

#include <new>
#include <string>

#include "../error.cuh"

namespace dhisparse::cuda::detail {

/// The calling thread's current device; throws device_error when the runtime cannot tell.
inline int current_device() {
  int device = 0;
  DHISPARSE_CUDA_TRY(cudaGetDevice(&device));
  return device;
}

/// Throws wrong_device when `stream` belongs to another device than `device`. The legacy and
/// per-thread default streams (0, cudaStreamLegacy, cudaStreamPerThread) name the current
/// device's, so they always pass once `device` is current. Needs CUDA 12.8 (cudaStreamGetDevice);
/// with an older runtime nothing is checked. A stream being captured is not checked either: some
/// drivers refuse cudaStreamGetDevice during capture and invalidate the capture, so there a stream
/// of another device fails later, at its first launch or copy, with device_error.
inline void check_stream_device(cudaStream_t stream, int device) {
#if CUDART_VERSION >= 12080
  if (stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread) return;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  DHISPARSE_CUDA_TRY(cudaStreamIsCapturing(stream, &status));
  if (status != cudaStreamCaptureStatusNone) return;
  int of_stream = device;
  DHISPARSE_CUDA_TRY(cudaStreamGetDevice(stream, &of_stream));
  if (of_stream != device)
    throw wrong_device("a stream of device " + std::to_string(of_stream) + " was given to an object of device " +
                       std::to_string(device) +
                       " (every CUDA object works on the device it was created on, and on streams of that device)");
#else
  (void)stream;
  (void)device;
#endif
}

/// Throws wrong_device when memory a kernel of `device` reads or writes (`attr`, from
/// cudaPointerGetAttributes) is device memory of a GPU that `device` cannot access at all: the
/// launch would fault on an illegal address and leave the context unusable. Peer memory of a GPU
/// it can reach passes (the engine enables peer access; the runtime cannot tell whether it did),
/// as do managed and host memory. The message names `call` and its argument `what`.
inline void check_memory_device(const cudaPointerAttributes& attr, int device, const char* call, const char* what) {
  if (attr.type != cudaMemoryTypeDevice || attr.device == device) return;
  int peer = 0;
  if (cudaDeviceCanAccessPeer(&peer, device, attr.device) != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky; treat as unreachable
    peer = 0;
  }
  if (peer == 0)
    throw wrong_device(std::string(call) + ": " + what + " is device memory of device " + std::to_string(attr.device) +
                       ", which device " + std::to_string(device) +
                       " (the object's) cannot access; copy it to that device first");
}

/// Makes `device` the calling thread's current device for the guard's scope and restores the
/// previous one at its end. cudaSetDevice is called only when the devices differ, so a guard on
/// a thread already on the right device costs one cudaGetDevice. Not copyable, not movable: a
/// guard lives in the scope of one call.
class device_guard {
 public:
  /// Switches to `device`; throws device_error when cudaGetDevice or cudaSetDevice fails (nothing
  /// switched then).
  explicit device_guard(int device) {
    DHISPARSE_CUDA_TRY(cudaGetDevice(&previous_));
    if (previous_ != device) {
      DHISPARSE_CUDA_TRY(cudaSetDevice(device));
      switched_ = true;
    }
  }
  /// Switches to `device`, then checks that `stream` belongs to it (`check_stream_device`); on
  /// wrong_device the previous device is restored (the object counts as constructed once the
  /// delegated constructor has returned, so its destructor runs).
  device_guard(int device, cudaStream_t stream) : device_guard(device) { check_stream_device(stream, device); }
  /// For destructors and other noexcept paths: switches when it can, and otherwise leaves the
  /// current device as it is (the CUDA calls that follow then report the failure, or are ignored).
  device_guard(int device, std::nothrow_t) noexcept {
    if (cudaGetDevice(&previous_) != cudaSuccess) return;
    if (previous_ != device) switched_ = cudaSetDevice(device) == cudaSuccess;
  }
  device_guard(const device_guard&) = delete;
  device_guard& operator=(const device_guard&) = delete;
  /// Restores the thread's previous device (a failure cannot be reported from a destructor).
  ~device_guard() {
    if (switched_) (void)cudaSetDevice(previous_);
  }

 private:
  int previous_ = 0;
  bool switched_ = false;
};

}  // namespace dhisparse::cuda::detail
