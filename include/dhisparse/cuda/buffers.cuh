#pragma once
/// \file
/// RAII owners of raw CUDA memory: `device_buffer<T>` (cudaMalloc) and `pinned_buffer`
/// (cudaHostAlloc, mapped and portable, so kernels of every device read it through its device
/// address). Both are move-only; neither initialises its bytes. A `device_buffer` belongs to the
/// device that was current when it allocated (`device()`) and frees its memory there, whatever
/// the current device of the thread that destroys it.
#include "detail/minimum_arch.cuh"  // first: stops below sm_80 with a clear message
#include <cuda_runtime.h>

#include <cstddef>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "detail/device_guard.cuh"
#include "error.cuh"

namespace dhisparse::cuda {

/// `n` elements of `T` in device memory.
template <class T>
class device_buffer {
 public:
  /// An empty buffer (no allocation).
  device_buffer() = default;
  /// Allocates `n` uninitialised elements (none for 0) on the current device; throws
  /// device_error when cudaMalloc fails.
  explicit device_buffer(std::size_t n) : size_(n) {
    if (n == 0) return;
    device_ = detail::current_device();
    DHISPARSE_CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&data_), n * sizeof(T)));
  }
  /// Takes over `o`'s memory, leaving `o` empty.
  device_buffer(device_buffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)), device_(std::exchange(o.device_, -1)) {}
  /// Frees this buffer's memory (on its device), then takes over `o`'s, leaving `o` empty.
  device_buffer& operator=(device_buffer&& o) noexcept {
    if (this != &o) {
      reset();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
      device_ = std::exchange(o.device_, -1);
    }
    return *this;
  }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  /// Frees the memory on its device (a failing cudaFree is not reported).
  ~device_buffer() { reset(); }

  /// Device the memory was allocated on (-1 while the buffer owns none).
  [[nodiscard]] int device() const noexcept { return device_; }
  /// Device address of the elements (null when empty).
  [[nodiscard]] T* data() const noexcept { return data_; }
  /// Number of elements.
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  /// Size in bytes: size() * sizeof(T).
  [[nodiscard]] std::size_t bytes() const noexcept { return size_ * sizeof(T); }

 private:
  void reset() noexcept {
    if (data_ != nullptr) {
      const detail::device_guard on(device_, std::nothrow);
      cudaFree(data_);  // cannot throw from a destructor; errors surface on the next call
    }
    data_ = nullptr;
    size_ = 0;
    device_ = -1;
  }
  T* data_ = nullptr;
  std::size_t size_ = 0;
  int device_ = -1;
};

/// `bytes` of page-locked host memory, mapped into the device address space (zero-copy reads).
/// Portable: every device of the process reads it, at the same address under unified addressing
/// (which the CUDA backend requires), so it belongs to no one device.
class pinned_buffer {
 public:
  /// An empty buffer (no allocation).
  pinned_buffer() = default;
  /// Allocates `bytes` uninitialised mapped, portable pinned bytes (none for 0); throws device_error on failure.
  explicit pinned_buffer(std::size_t bytes) : bytes_(bytes) {
    if (bytes == 0) return;
    DHISPARSE_CUDA_TRY(cudaHostAlloc(reinterpret_cast<void**>(&host_), bytes, cudaHostAllocMapped | cudaHostAllocPortable));
    DHISPARSE_CUDA_TRY(cudaHostGetDevicePointer(reinterpret_cast<void**>(&device_), host_, 0));
  }
  /// Takes over `o`'s memory, leaving `o` empty.
  pinned_buffer(pinned_buffer&& o) noexcept
      : host_(std::exchange(o.host_, nullptr)), device_(std::exchange(o.device_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  /// Frees this buffer's memory, then takes over `o`'s, leaving `o` empty.
  pinned_buffer& operator=(pinned_buffer&& o) noexcept {
    if (this != &o) {
      reset();
      host_ = std::exchange(o.host_, nullptr);
      device_ = std::exchange(o.device_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  pinned_buffer(const pinned_buffer&) = delete;
  pinned_buffer& operator=(const pinned_buffer&) = delete;
  /// Frees the memory (a failing cudaFreeHost is not reported).
  ~pinned_buffer() { reset(); }

  /// Host address of the bytes.
  [[nodiscard]] std::byte* data() const noexcept { return host_; }
  /// Device address of the same bytes (equal to `data()` under unified addressing).
  [[nodiscard]] std::byte* device_data() const noexcept { return device_; }
  /// Size in bytes.
  [[nodiscard]] std::size_t bytes() const noexcept { return bytes_; }
  /// The bytes as a host span.
  [[nodiscard]] std::span<std::byte> span() const noexcept { return {host_, bytes_}; }

 private:
  void reset() noexcept {
    if (host_ != nullptr) cudaFreeHost(host_);
    host_ = device_ = nullptr;
    bytes_ = 0;
  }
  std::byte* host_ = nullptr;
  std::byte* device_ = nullptr;
  std::size_t bytes_ = 0;
};

namespace detail {
/// An owned CUDA event (created with `flags` on the current device, and destroyed there; empty
/// when default-constructed).
class unique_event {
 public:
  unique_event() = default;
  explicit unique_event(unsigned flags) : device_(current_device()) {
    DHISPARSE_CUDA_TRY(cudaEventCreateWithFlags(&event_, flags));
  }
  unique_event(const unique_event&) = delete;
  unique_event& operator=(const unique_event&) = delete;
  unique_event(unique_event&& o) noexcept : event_(std::exchange(o.event_, nullptr)), device_(o.device_) {}
  unique_event& operator=(unique_event&& o) noexcept {
    if (this != &o) {
      destroy();
      event_ = std::exchange(o.event_, nullptr);
      device_ = o.device_;
    }
    return *this;
  }
  ~unique_event() { destroy(); }
  [[nodiscard]] cudaEvent_t get() const { return event_; }
  explicit operator bool() const { return event_ != nullptr; }

 private:
  void destroy() noexcept {
    if (event_ == nullptr) return;
    const device_guard on(device_, std::nothrow);
    cudaEventDestroy(event_);
  }
  cudaEvent_t event_ = nullptr;
  int device_ = -1;
};

/// Calls `use(device_bytes)` with a stream-ordered device copy of `bytes` (any host memory:
/// cudaMemcpyAsync has staged a pageable source before it returns) and frees the copy in stream
/// order afterwards, also when `use` throws. Returns what `use` returns.
template <class Use>
decltype(auto) with_device_copy(std::span<const std::byte> bytes, cudaStream_t stream, Use&& use) {
  void* copy = nullptr;
  DHISPARSE_CUDA_TRY(cudaMallocAsync(&copy, bytes.size(), stream));
  struct free_on_unwind {
    void* p;
    cudaStream_t s;
    ~free_on_unwind() {
      if (p != nullptr) cudaFreeAsync(p, s);  // unwinding: the error in flight is the one to report
    }
  } guard{copy, stream};
  DHISPARSE_CUDA_TRY(cudaMemcpyAsync(copy, bytes.data(), bytes.size(), cudaMemcpyHostToDevice, stream));
  const auto* device_bytes = static_cast<const std::byte*>(copy);
  const auto release = [&] {
    guard.p = nullptr;
    DHISPARSE_CUDA_TRY(cudaFreeAsync(copy, stream));
  };
  if constexpr (std::is_void_v<std::invoke_result_t<Use&, const std::byte*>>) {
    use(device_bytes);
    release();
  } else {
    auto result = use(device_bytes);
    release();
    return result;
  }
}

/// Copies `n` objects from device memory into a new vector in `stream` order and waits for them.
template <class T>
std::vector<T> download_sync(const T* device, std::size_t n, cudaStream_t stream) {
  std::vector<T> out(n);
  if (n != 0) DHISPARSE_CUDA_TRY(cudaMemcpyAsync(out.data(), device, n * sizeof(T), cudaMemcpyDeviceToHost, stream));
  DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
  return out;
}

/// Carves aligned sub-ranges out of one allocation (two-phase sizing: run once with no base to
/// learn the size, then again over the allocation).
class carver {
 public:
  static constexpr std::size_t alignment = 256;
  /// Offset of a new range of `n` objects of `T`.
  template <class T>
  std::size_t take(std::size_t n) {
    offset_ = (offset_ + alignment - 1) / alignment * alignment;
    const std::size_t at = offset_;
    offset_ += n * sizeof(T);
    return at;
  }
  [[nodiscard]] std::size_t bytes() const { return (offset_ + alignment - 1) / alignment * alignment; }

 private:
  std::size_t offset_ = 0;
};
}  // namespace detail

}  // namespace dhisparse::cuda
