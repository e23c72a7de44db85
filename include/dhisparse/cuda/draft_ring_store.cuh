#pragma once
/// \file
/// CUDA draft ring store: the drafter's KV of `slots` request slots in device memory, laid out by a
/// DraftRing policy (R_d rows per slot and drafter layer, position t of slot i at phi(i, t)), with
/// the same rules and typed errors as the host store (detail/draft_ring_books.hpp).
///
///   using ring = dhisparse::draft_ring<2048, 8, 64>;
///   dhisparse::draft_ring_config cfg{.slots = 35, .row_bytes = 2048, .layers = 6};
///   auto need = dhisparse::cuda::draft_ring_store<ring>::requirements(cfg);  // need.bytes of ring memory
///   dhisparse::cuda::draft_ring_store<ring> ring_kv(cfg, stream);
///   ring_kv.prefill(slot, prompt_len, last_kv, std::min(prompt_len, W), stream);  // a new request
///   // per round, capturable, no host round trip (draft_ring_step.cuh):
///   ring_kv.write_step(write_view, stream);          // each slot's block at its device-side position
///   my_draft_attention<<<...>>>(ring_kv.step_ref(), ...);  // block_row / window from device books
///   ring_kv.commit_step(commit_view, stream);        // accepted counts written by the sampler on the GPU
///   ring_kv.check_errors(stream);                    // later, off the step path
///   // or, per slot with host positions and counts:
///   ring_kv.write(slot, n, block_kv, K, stream);     // device or host source, stream-ordered
///   ring_kv.commit(slot, accepted, stream);
///
/// Books. The per-slot committed and written positions live in DEVICE memory, the one truth both
/// paths change: `write_step`/`commit_step` kernels read and update them, and every host call that
/// changes them (write, prefill, claim, commit, rollback, reset) also enqueues the new book of its
/// slot on its stream (the calls without a stream use the stream given at construction). The host
/// keeps a cache of them for checking host calls and answering `committed`, `window`, `row`, ...
/// A batched device call makes that cache stale for every slot (the host does not know the
/// accepted counts); until `sync_books(stream)` reads the books back (synchronises `stream`), every
/// host call on a stale slot throws invalid_configuration and changes nothing, except `reset`,
/// which needs no old state and makes its slot current again. So the two paths cannot disagree:
/// the host never checks a call against books the device has moved past, and never writes books
/// the device did not get. `copy_books_async` copies the device books out without synchronising.
///
/// Host calls throw their book-keeping errors before any device work, with the store unchanged,
/// and cannot be captured (their positions would be frozen into the graph): they throw
/// invalid_configuration on a capturing stream. Book pushes stay in host-call order across
/// streams (an event), and eager batched calls and `sync_books` wait for the last push. Copies return the CUDA status; the books stay
/// unchanged when nothing was enqueued (when the second piece of a wrapping block fails, positions
/// from the write's first one on are dropped). Nothing synchronises except the constructor,
/// `check_errors` and `sync_books`; a kernel reading rows must be ordered after the write on the
/// same stream (or an event), and a rewrite of a row after the kernels still reading it. Captured
/// batched calls, and batched calls on several streams, must be ordered by the caller (one stream,
/// or events), as any two writes to the same slot are.
#include "detail/minimum_arch.cuh"  // first: stops below sm_80 with a clear message
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "../detail/draft_ring_store_base.hpp"
#include "buffers.cuh"
#include "detail/device_guard.cuh"
#include "detail/draft_ring_kernels.cuh"
#include "draft_ring_step.cuh"
#include "error.cuh"

namespace dhisparse::cuda {

/// Device ref of a draft ring: pass by value to kernels; `location(slot, t)` and `row(slot, t, layer)`.
template <DraftRingPolicy Ring>
using draft_ring_ref = ::dhisparse::draft_ring_ref<Ring>;

/// CUDA draft ring store: the draft KV of N request slots in device memory, laid out by `Ring`,
/// with device books of committed and written positions and a host cache of them (see the file
/// comment).
template <DraftRingPolicy Ring>
class draft_ring_store : public ::dhisparse::detail::draft_ring_store_base<Ring> {
  using base = ::dhisparse::detail::draft_ring_store_base<Ring>;
  using base::books_;
  using base::cfg_;
  using base::req_;
  using base::stale_;

 public:
  /// Trivially copyable device view of the ring's rows (`draft_ring_ref<Ring>`).
  using typename base::ref_type;
  /// Device ref of rows and device books, for the drafter's kernels (`draft_ring_step_ref<Ring>`).
  using step_ref_type = draft_ring_step_ref<Ring>;
  /// R_d: ring rows per request slot (`Ring::rows_per_slot`).
  using base::rows_per_slot;

  /// Allocates the ring and its device books and error books on the current device, which the
  /// store is bound to from then on (`device()`), zeroes them on `stream` and keeps `stream` for
  /// the host calls made without one (synchronises `stream` before returning, like every
  /// constructor of the CUDA backend; the step path never does). Throws wrong_device, before
  /// anything is allocated, when `stream` belongs to another device.
  explicit draft_ring_store(const draft_ring_config& cfg, cudaStream_t stream = nullptr)
      : base(cfg),
        device_(device_of(stream)),
        bytes_(req_.bytes),
        books_dev_(cfg.slots),
        controls_(2),
        sticky_(2 * cfg.slots),
        last_push_(cudaEventDisableTiming),
        stream_(stream) {
    stale_.assign(cfg.slots, 0);
    DHISPARSE_CUDA_TRY(cudaMemsetAsync(bytes_.data(), 0, bytes_.bytes(), stream));
    DHISPARSE_CUDA_TRY(cudaMemsetAsync(books_dev_.data(), 0, cfg.slots * sizeof(draft_slot_state), stream));
    DHISPARSE_CUDA_TRY(cudaMemsetAsync(sticky_.data(), 0, 2 * cfg.slots * sizeof(entry_error), stream));
    const detail::write_control fresh[2]{};
    DHISPARSE_CUDA_TRY(cudaMemcpyAsync(controls_.data(), fresh, sizeof(fresh), cudaMemcpyHostToDevice, stream));
    DHISPARSE_CUDA_TRY(detail::preload_draft_ring_kernels<Ring>());
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
  }

  /// The device the store was created on. Every call makes it current for its CUDA work and
  /// restores the calling thread's device, so the store works from any thread; streams given to
  /// calls must belong to it (wrong_device otherwise; the null stream is allowed).
  [[nodiscard]] int device() const noexcept { return device_; }
  /// Ring bytes actually allocated (equals requirements(cfg).bytes; the device books and error
  /// books add 16 + 64 bytes per slot and 32 bytes).
  [[nodiscard]] std::size_t allocated_bytes() const { return bytes_.bytes(); }
  /// Trivially copyable device view of all rows.
  [[nodiscard]] ref_type ref() const { return {bytes_.data(), cfg_.slots, cfg_.row_bytes, cfg_.layers}; }
  /// Trivially copyable device ref of the rows and the device books (draft_ring_step.cuh): where
  /// block position committed + j of a slot lives, and its window, read on the device.
  [[nodiscard]] step_ref_type step_ref() const { return {ref(), books_dev_.data()}; }

  // ------------------------------------------------------------------ per slot, host positions

  /// Writes positions [first, first + count) of `slot` from `rows` (device, pinned or pageable host
  /// memory; laid out layer-major: layer l of position first + j at rows + (l * count + j) *
  /// row_bytes), stream-ordered, then the slot's new book. Same rules as the host store: first in
  /// [committed, written], first + count <= committed + K_max; later written positions are
  /// dropped. At most two 2-D copies (the block may wrap the ring), each covering every layer.
  cudaError_t write(std::size_t slot, std::uint64_t first, const std::byte* rows, std::size_t count,
                    cudaStream_t stream) {
    const auto guard = on_device(stream);
    check_host_call(slot, stream, "write");
    books_.check_write(slot, first, count);
    if (rows == nullptr) throw size_mismatch("draft ring write from a null source");
    std::size_t done = 0;
    if (const cudaError_t e = enqueue_rows(slot, first, rows, count, stream, done); e != cudaSuccess) {
      // A first piece already enqueued replaces block rows from `first` on, so the books drop
      // those positions rather than claim rows they no longer describe (committed rows untouched).
      if (done > 0) {
        books_.note_write(slot, first, 0);
        (void)publish(slot, stream);
      }
      return e;
    }
    books_.note_write(slot, first, count);
    return publish(slot, stream);
  }

  /// A new request's prompt: positions [0, positions) become committed at once, given by the
  /// rows of the last `count` = min(positions, W) of them (what the window shows), laid out as for
  /// write, stream-ordered. The slot must be empty (new, or reset); on a CUDA error nothing is
  /// committed. The next write starts at position `positions`.
  cudaError_t prefill(std::size_t slot, std::uint64_t positions, const std::byte* rows, std::size_t count,
                      cudaStream_t stream) {
    const auto guard = on_device(stream);
    check_host_call(slot, stream, "prefill");
    books_.check_prefill(slot, positions, count);
    if (rows == nullptr && count > 0) throw size_mismatch("draft ring prefill from a null source");
    std::size_t done = 0;
    if (const cudaError_t e = enqueue_rows(slot, positions - count, rows, count, stream, done); e != cudaSuccess)
      return e;
    books_.note_prefill(slot, positions);
    return publish(slot, stream);
  }

  /// Records positions [first, first + count) as written in place by a kernel through ref() (same
  /// rules as write); the new book is enqueued on `stream`. Throws device_error when it cannot be.
  void claim(std::size_t slot, std::uint64_t first, std::size_t count, cudaStream_t stream) {
    const auto guard = on_device(stream);
    check_host_call(slot, stream, "claim");
    books_.check_write(slot, first, count);
    books_.note_write(slot, first, count);
    DHISPARSE_CUDA_TRY(publish(slot, stream));
  }
  /// As above, on the store's stream.
  void claim(std::size_t slot, std::uint64_t first, std::size_t count = 1) { claim(slot, first, count, stream_); }

  /// After verification with `accepted` proposals accepted (anchor not counted), with the count on
  /// the host: n' = n + accepted + 1, the rest of the block dropped; the new book is enqueued on
  /// `stream` (one tiny kernel; no copy of rows). acceptance_beyond_block unless all of them are
  /// written. For counts the sampler wrote on the device, use `commit_step`.
  void commit(std::size_t slot, std::size_t accepted, cudaStream_t stream) {
    const auto guard = on_device(stream);
    check_host_call(slot, stream, "commit");
    books_.check_commit(slot, accepted);
    books_.note_commit(slot, accepted);
    DHISPARSE_CUDA_TRY(publish(slot, stream));
  }
  /// As above, on the store's stream (the stream given at construction).
  void commit(std::size_t slot, std::size_t accepted) { commit(slot, accepted, stream_); }
  /// Drops the current block without committing anything (book enqueued on `stream`).
  void rollback(std::size_t slot, cudaStream_t stream) {
    const auto guard = on_device(stream);
    check_host_call(slot, stream, "rollback");
    books_.rollback(slot);
    DHISPARSE_CUDA_TRY(publish(slot, stream));
  }
  /// As above, on the store's stream.
  void rollback(std::size_t slot) { rollback(slot, stream_); }
  /// Frees the slot for a new request (positions restart at 0; bytes left as they are). Allowed
  /// while the slot's host books are stale: it needs no old state, and its slot is current again.
  void reset(std::size_t slot, cudaStream_t stream) {
    const auto guard = on_device(stream);
    check_not_captured(stream, "reset");
    books_.reset(slot);
    stale_[slot] = 0;
    DHISPARSE_CUDA_TRY(publish(slot, stream));
  }
  /// As above, on the store's stream.
  void reset(std::size_t slot) { reset(slot, stream_); }

  /// Device address of a live position's row in one drafter layer.
  [[nodiscard]] const std::byte* row(std::size_t slot, std::uint64_t position, std::size_t layer = 0) const {
    this->check_row(slot, position, layer);
    return ref().row(slot, position, layer);
  }

  // ------------------------------------------------------------------ batched, device positions

  /// Writes the drafted blocks of one round (draft_write_view, draft_ring_step.cuh): ONE launch of
  /// one CTA per entry reads each entry's slot, count and offset on the device, checks them against
  /// the slot's device book, copies the rows to positions committed + offset .. and sets written.
  /// Bad entries are left untouched and reported by `check_errors`. No allocation, no
  /// synchronisation; capturable (a replay reads the descriptor's and the books' contents then).
  /// Makes the host cache of every slot stale (`sync_books`). Throws size_mismatch before any work
  /// for a view without slots or counts, a capacity above the slot count, max_count above K_max,
  /// or a row_stride below row_bytes.
  void write_step(const draft_write_view& batch, cudaStream_t stream) {
    const auto guard = on_device(stream);
    if (batch.capacity == 0) return;
    if (batch.slots == nullptr || batch.counts == nullptr)
      throw size_mismatch("draft_write_view needs device slots and counts");
    check_capacity(batch.capacity, "draft_write_view");
    draft_write_view v = batch;
    if (v.max_count == 0) v.max_count = static_cast<std::uint32_t>(Ring::max_block);
    if (v.max_count > Ring::max_block)
      throw size_mismatch("draft_write_view max_count " + std::to_string(v.max_count) + " exceeds K_max " +
                          std::to_string(Ring::max_block));
    if (v.row_stride == 0) v.row_stride = cfg_.row_bytes;
    if (v.row_stride < cfg_.row_bytes)
      throw size_mismatch("draft_write_view row_stride " + std::to_string(v.row_stride) + " is below row_bytes " +
                          std::to_string(cfg_.row_bytes));
    after_pushes(stream);
    DHISPARSE_CUDA_TRY(detail::launch_draft_write_step(ref(), books_dev_.data(), v, books_of(0), stream));
    mark_all_stale();
  }

  /// Commits the accepted prefix of one round (draft_commit_view = the hierarchy's commit_view):
  /// ONE launch reads each entry's slot and accepted count on the device and, when the anchor and
  /// the accepted proposals are written, sets committed += accepted + 1, written = committed.
  /// Bad entries are left untouched and reported by `check_errors`. No allocation, no
  /// synchronisation; capturable. Makes the host cache of every slot stale (`sync_books`).
  void commit_step(const draft_commit_view& batch, cudaStream_t stream) {
    const auto guard = on_device(stream);
    if (batch.capacity == 0) return;
    if (batch.slots == nullptr || batch.accepted == nullptr)
      throw size_mismatch("draft_commit_view needs device slots and accepted counts");
    check_capacity(batch.capacity, "draft_commit_view");
    after_pushes(stream);
    DHISPARSE_CUDA_TRY(detail::launch_draft_commit_step(cfg_.slots, books_dev_.data(), batch, books_of(1), stream));
    mark_all_stale();
  }

  /// Synchronises `stream` and throws the typed error of the first bad entry of the first failing
  /// `write_step`, then `commit_step`, launch since the last check (invalid_slot,
  /// duplicate_in_batch, size_mismatch, draft_write_out_of_order, block_too_wide,
  /// acceptance_beyond_block), naming slot and batch entry; the record is cleared. device_error for
  /// CUDA errors. Launches on other streams must be ordered before `stream` first.
  void check_errors(cudaStream_t stream) {
    const auto guard = on_device(stream);
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
    DHISPARSE_CUDA_TRY(cudaGetLastError());
    static constexpr const char* calls[2] = {"write_step", "commit_step"};
    for (int k = 0; k < 2; ++k) {
      const detail::write_workspace_view w = books_of(k);
      detail::write_control ctl{};
      DHISPARSE_CUDA_TRY(cudaMemcpyAsync(&ctl, w.control, sizeof(ctl), cudaMemcpyDeviceToHost, stream));
      DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
      if (ctl.first_error == ~0ull) continue;
      const auto e = static_cast<std::size_t>(ctl.first_error & 0xFFFFFFFFull);
      entry_error r{};
      DHISPARSE_CUDA_TRY(cudaMemcpyAsync(&r, w.sticky + e, sizeof(r), cudaMemcpyDeviceToHost, stream));
      // Cleared in `stream` order and waited for, so every later launch, on any stream, sees it cleared.
      DHISPARSE_CUDA_TRY(cudaMemsetAsync(&w.control->first_error, 0xFF, sizeof(ctl.first_error), stream));
      DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
      throw_error(to_errc(r.code), describe(e, r, calls[k]));
    }
  }
  /// As above, on the store's stream.
  void check_errors() { check_errors(stream_); }

  /// Enqueues on `stream` a copy of the device books of slots [0, out.size()) into `out` (device
  /// memory, or pinned mapped host memory, valid once `stream` has passed this call). One small
  /// kernel; no synchronisation, no allocation; capturable (a replay copies the books as they are
  /// then). Does not refresh the host cache (`sync_books` does). Throws size_mismatch for more
  /// entries than slots, invalid_configuration when `out` is not device-accessible.
  void copy_books_async(std::span<draft_slot_state> out, cudaStream_t stream) const {
    const auto guard = on_device(stream);
    if (out.size() > cfg_.slots)
      throw size_mismatch("copy_books_async of " + std::to_string(out.size()) + " slots, the store has " +
                          std::to_string(cfg_.slots));
    if (out.empty()) return;
    DHISPARSE_CUDA_TRY(detail::launch_copy_draft_books(books_dev_.data(), device_target(out.data()), out.size(), stream));
  }

  /// Synchronises `stream`, reads every slot's device book back into the host cache and makes all
  /// slots current, so host calls work again after batched ones. Batched launches on other streams
  /// must be ordered before `stream` first. Not capturable (invalid_configuration).
  void sync_books(cudaStream_t stream) {
    const auto guard = on_device(stream);
    check_not_captured(stream, "sync_books");
    after_pushes(stream);
    std::vector<draft_slot_state> got(cfg_.slots);
    DHISPARSE_CUDA_TRY(cudaMemcpyAsync(got.data(), books_dev_.data(), got.size() * sizeof(draft_slot_state),
                                       cudaMemcpyDeviceToHost, stream));
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
    for (std::size_t s = 0; s < got.size(); ++s) books_.assign(s, got[s]);
    std::fill(stale_.begin(), stale_.end(), 0);
  }
  /// As above, on the store's stream.
  void sync_books() { sync_books(stream_); }
  /// True when the host cache of `slot` is current (no batched call since the last `sync_books`
  /// or `reset` of it): the host calls on it work.
  [[nodiscard]] bool books_current(std::size_t slot) const {
    (void)books_.state(slot);  // invalid_slot
    return stale_[slot] == 0;
  }

 private:
  /// The current device, which the store is created on, once `stream` is known to belong to it.
  static int device_of(cudaStream_t stream) {
    const int device = detail::current_device();
    detail::check_stream_device(stream, device);
    return device;
  }
  /// Makes the store's device current for one call (the thread's device comes back when the
  /// guard goes) and throws wrong_device for a stream of another device.
  [[nodiscard]] detail::device_guard on_device(cudaStream_t stream) const {
    return {device_, stream == stream_ ? cudaStream_t{} : stream};
  }
  void check_host_call(std::size_t slot, cudaStream_t stream, const char* call) const {
    this->check_known(slot);
    check_not_captured(stream, call);
  }
  static void check_not_captured(cudaStream_t stream, const char* call) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    DHISPARSE_CUDA_TRY(cudaStreamIsCapturing(stream, &status));
    if (status == cudaStreamCaptureStatusActive)
      throw invalid_configuration(std::string("draft ring ") + call +
                                  " takes its positions from the host and cannot be captured: use write_step / "
                                  "commit_step in a graph");
  }
  void check_capacity(std::uint32_t capacity, const char* view) const {
    if (capacity > cfg_.slots)
      throw size_mismatch(std::string(view) + " capacity " + std::to_string(capacity) + " exceeds the store's " +
                          std::to_string(cfg_.slots) + " slots");
  }
  /// Enqueues the host book of `slot` into the device books on `stream`. Book pushes are kept in
  /// host-call order whatever their streams: a push on another stream than the last one waits
  /// for it (an event), so `commit(slot, a)` on the store's stream followed by `write(slot, ...,
  /// other)` cannot land in the opposite order. If anything fails, the slot is marked stale, so no
  /// host call trusts a book the device may not have.
  cudaError_t publish(std::size_t slot, cudaStream_t stream) {
    cudaError_t e = cudaSuccess;
    if (pushed_ && stream != last_push_stream_) e = cudaStreamWaitEvent(stream, last_push_.get(), 0);
    if (e == cudaSuccess) e = detail::launch_set_draft_books(books_dev_.data(), slot, books_.state(slot), stream);
    if (e == cudaSuccess) e = cudaEventRecord(last_push_.get(), stream);
    if (e != cudaSuccess) {
      stale_[slot] = 1;
      return e;
    }
    last_push_stream_ = stream;
    pushed_ = true;
    return cudaSuccess;
  }
  /// Orders work on `stream` after the last book push when that went to another stream (eager
  /// calls only: a capture cannot wait for an event recorded outside it, so a captured batched
  /// call relies on the caller's ordering, as its replays do).
  void after_pushes(cudaStream_t stream) {
    if (!pushed_ || stream == last_push_stream_) return;
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    DHISPARSE_CUDA_TRY(cudaStreamIsCapturing(stream, &status));
    if (status == cudaStreamCaptureStatusNone) DHISPARSE_CUDA_TRY(cudaStreamWaitEvent(stream, last_push_.get(), 0));
  }
  void mark_all_stale() { std::fill(stale_.begin(), stale_.end(), 1); }
  /// Error books of write_step (0) or commit_step (1).
  [[nodiscard]] detail::write_workspace_view books_of(int k) const {
    return {controls_.data() + k, sticky_.data() + static_cast<std::size_t>(k) * cfg_.slots,
            static_cast<std::uint32_t>(cfg_.slots)};
  }
  template <class T>
  T* device_target(T* p) const {
    cudaPointerAttributes attr{};
    if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) (void)cudaGetLastError();
    detail::check_memory_device(attr, device_, "copy_books_async", "the destination");
    if (attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged) return p;
    if (attr.type == cudaMemoryTypeHost && attr.devicePointer != nullptr) return static_cast<T*>(attr.devicePointer);
    throw invalid_configuration("copy_books_async: the destination must be device memory or pinned mapped host "
                                "memory (a kernel writes it)");
  }
  std::string describe(std::size_t e, const entry_error& r, const char* call) const {
    const std::string where = " (" + std::string(call) + " batch entry " + std::to_string(e) + ")";
    const std::string who = "draft ring " + std::string(call) + " of slot " + std::to_string(r.slot);
    switch (to_errc(r.code)) {
      case errc::invalid_slot:
        return "draft ring slot " + std::to_string(r.value) + " out of range (" + std::to_string(cfg_.slots) +
               " slots)" + where;
      case errc::duplicate_in_batch:
        return "draft ring slot " + std::to_string(r.slot) + " appears twice in one " + call + " batch" + where;
      case errc::size_mismatch:
        if (r.value < 0)
          return who + ": count or first buffer row " + std::to_string(r.value) + " is negative" + where;
        return who + " of " + std::to_string(r.value) + " positions, outside [1, max_count " +
               std::to_string(r.index) + "]" + where;
      case errc::draft_write_out_of_order:
        return who + " at block offset " + std::to_string(r.value) + " (committed " + std::to_string(r.frontier) +
               "): only " + std::to_string(r.index) + " block position(s) are written, so it would leave a gap" +
               where;
      case errc::block_too_wide:
        return who + " reaches block offset " + std::to_string(r.value) + ", past the block of K_max = " +
               std::to_string(r.index) + " after position " + std::to_string(r.frontier) + where;
      case errc::acceptance_beyond_block:
        return who + " of " + std::to_string(r.value) + " accepted proposal(s): only " + std::to_string(r.index) +
               " block position(s) written (anchor included) after position " + std::to_string(r.frontier) + where;
      default:
        return std::string(to_string(to_errc(r.code))) + where;
    }
  }

  /// Enqueues the copy of positions [first, first + count) from layer-major `rows`: at most two
  /// 2-D copies (the positions may wrap the ring), each covering every layer. `done` counts the
  /// positions already enqueued when a copy fails.
  cudaError_t enqueue_rows(std::size_t slot, std::uint64_t first, const std::byte* rows, std::size_t count,
                           cudaStream_t stream, std::size_t& done) const {
    const ref_type r = ref();
    const std::size_t rb = cfg_.row_bytes;
    done = 0;
    while (done < count) {
      // Positions first + done .. up to the ring's end are contiguous rows of the slot.
      const std::size_t at = static_cast<std::size_t>((first + done) % rows_per_slot);
      const std::size_t run = std::min(count - done, rows_per_slot - at);
      const cudaError_t e = cudaMemcpy2DAsync(r.row(slot, first + done), r.layer_stride(), rows + done * rb, count * rb,
                                              run * rb, cfg_.layers, cudaMemcpyDefault, stream);
      if (e != cudaSuccess) return e;
      done += run;
    }
    return cudaSuccess;
  }
  int device_ = -1;                                ///< the device the store was created on
  device_buffer<std::byte> bytes_;
  device_buffer<draft_slot_state> books_dev_;      ///< [slots] the true books
  device_buffer<detail::write_control> controls_;  ///< [2] error books of write_step, commit_step
  device_buffer<entry_error> sticky_;              ///< [2][slots]
  detail::unique_event last_push_;                 ///< recorded after the last book push
  cudaStream_t last_push_stream_ = nullptr;        ///< the stream of that push
  bool pushed_ = false;                            ///< a book was pushed since construction
  cudaStream_t stream_ = nullptr;                  ///< for the host calls made without a stream
};

}  // namespace dhisparse::cuda
