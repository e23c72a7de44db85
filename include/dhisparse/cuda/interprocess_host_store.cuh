#pragma once
/// \file
/// `dhisparse::cuda::interprocess_pinned_host_store`: an `interprocess_host_store` (one shared
/// host store for ranks in different processes, docs/multi-gpu.md) whose mapping is page-locked in
/// each process that opens it: cudaHostRegister with cudaHostRegisterPortable |
/// cudaHostRegisterMapped, so the CUDA hierarchies of every GPU of the process read and write it.
/// It is a `shared_host_store<Layout>`: give it to the rank's `cuda::hierarchy(cfg, store, rank,
/// stream)`.
///
/// ```cpp
/// // rank 0's process (or a launcher): create, then every rank's process opens it
/// auto store = dhisparse::cuda::interprocess_pinned_host_store<Layout>::open("/engine-kv");
/// dhisparse::cuda::hierarchy<Layout> h(cfg, store, rank, stream);   // device `rank` current
/// ```
///
/// Ownership and lifetime as `interprocess_host_store`; in addition each process's registration
/// lives with its object and ends (cudaHostUnregister) before the bytes are unmapped, so the
/// object must outlive the process's work on the store (its hierarchies, their streams).
/// Processes fork before their first CUDA call: a CUDA context does not survive fork().
#include <chrono>
#include <cstddef>
#include <string>

#include "../host/interprocess_host_store.hpp"
#include "../layout.hpp"
#include "error.cuh"

namespace dhisparse::cuda {

/// An interprocess host store, registered (pinned, portable, mapped) in this process (see the file
/// comment). Not copyable or movable.
template <KvLayout Layout>
class interprocess_pinned_host_store : public interprocess_host_store<Layout> {
  using base = interprocess_host_store<Layout>;

 public:
  using typename base::create_t;
  using typename base::open_t;

  /// As `interprocess_host_store::create`, then registers the mapping; device_error when that fails
  /// (nothing is left behind).
  [[nodiscard]] static interprocess_pinned_host_store create(const std::string& name, std::size_t ranks,
                                                             std::size_t host_pages, std::size_t request_capacity = 0) {
    return interprocess_pinned_host_store(create_t{}, name, ranks, host_pages, request_capacity);
  }
  /// As `interprocess_host_store::open`, then registers the mapping; device_error when that fails.
  [[nodiscard]] static interprocess_pinned_host_store open(
      const std::string& name, std::chrono::milliseconds timeout = base::default_open_timeout) {
    return interprocess_pinned_host_store(open_t{}, name, timeout);
  }

  /// As `create`.
  interprocess_pinned_host_store(create_t, const std::string& name, std::size_t ranks, std::size_t host_pages,
                                 std::size_t request_capacity = 0)
      : base(create_t{}, name, ranks, host_pages, request_capacity) {
    pin();
  }
  /// As `open`.
  interprocess_pinned_host_store(open_t, const std::string& name,
                                 std::chrono::milliseconds timeout = base::default_open_timeout)
      : base(open_t{}, name, timeout) {
    pin();
  }
  interprocess_pinned_host_store(const interprocess_pinned_host_store&) = delete;
  interprocess_pinned_host_store& operator=(const interprocess_pinned_host_store&) = delete;
  /// Unregisters the mapping (before the base unmaps it).
  ~interprocess_pinned_host_store() { (void)cudaHostUnregister(this->mapping().data()); }

 private:
  void pin() {
    const auto m = this->mapping();
    DHISPARSE_CUDA_TRY(cudaHostRegister(m.data(), m.size(), cudaHostRegisterPortable | cudaHostRegisterMapped));
  }
};

}  // namespace dhisparse::cuda
