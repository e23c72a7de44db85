#pragma once
/// \file
/// `dhisparse::cuda::pinned_shared_host_store`: a `shared_host_store` (docs/multi-gpu.md) whose
/// bytes are page-locked host memory, portable and mapped (cudaHostAllocPortable |
/// cudaHostAllocMapped), so the CUDA hierarchies of every GPU of the process read and write it at
/// the same address. It is a `shared_host_store<Layout>`: give it to each rank's
/// `cuda::hierarchy(cfg, store, rank, stream)` (or to `host_hierarchy`).
///
/// ```cpp
/// dhisparse::cuda::pinned_shared_host_store<Layout> store(/*ranks=*/tp, /*host_pages=*/pages);
/// // on rank r's thread, with device r current:
/// dhisparse::cuda::hierarchy<Layout> h(cfg, store, r, stream_r);
/// ```
///
/// An engine that pins its own memory uses `shared_host_store(ranks, pages, spans)` instead, with
/// spans allocated by cudaHostAlloc(cudaHostAllocPortable | cudaHostAllocMapped) (or registered
/// with the Portable and Mapped flags); each hierarchy checks that they are mapped for its device.
#include <array>
#include <cstddef>
#include <span>

#include "../host/shared_host_store.hpp"
#include "../layout.hpp"
#include "buffers.cuh"

namespace dhisparse::cuda {

namespace detail {
/// The pinned bytes of every source, built before the store that lies over them (a base class
/// initialised first: the base-from-member idiom).
template <KvLayout Layout>
struct pinned_store_bytes {
  explicit pinned_store_bytes(std::size_t host_pages) {
    if (host_pages == 0) return;  // the store rejects it with its own message
    for (std::size_t s = 0; s < source_count<Layout>; ++s) {
      pinned[s] = pinned_buffer(shared_host_store<Layout>::store_bytes(host_pages, s));
      spans[s] = pinned[s].span();
    }
  }
  std::array<pinned_buffer, source_count<Layout>> pinned;
  std::array<std::span<std::byte>, source_count<Layout>> spans{};
};
}  // namespace detail

/// A shared host store over pinned, portable, mapped memory it allocates and frees (see the file
/// comment). Not copyable or movable, as `shared_host_store`.
template <KvLayout Layout>
class pinned_shared_host_store : private detail::pinned_store_bytes<Layout>, public shared_host_store<Layout> {
 public:
  /// A store of `host_pages` pages per source for `ranks` ranks (1..64), pinned with cudaHostAlloc
  /// (portable, mapped; page-aligned), holding `request_capacity` requests at once (0: `ranks *
  /// default_requests_per_rank`; see `shared_host_store`). Throws invalid_configuration (rank
  /// count, no pages, capacity) or device_error (allocation).
  pinned_shared_host_store(std::size_t ranks, std::size_t host_pages, std::size_t request_capacity = 0)
      : detail::pinned_store_bytes<Layout>(host_pages),
        shared_host_store<Layout>(ranks, host_pages,
                                  host_pages == 0 ? std::span<const std::span<std::byte>>{}
                                                  : std::span<const std::span<std::byte>>(this->spans),
                                  request_capacity) {}
};

}  // namespace dhisparse::cuda
