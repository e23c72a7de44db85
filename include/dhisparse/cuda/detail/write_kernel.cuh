#pragma once
/// \file
/// Step-wide writes, speculative stages and commits over device descriptors (kv_write.cuh). One
/// launch covers every (source, entry) pair of a step (the per-source `append`/`commit` are the
/// same kernels over one source): one CTA of 1-8 warps per pair, sized by the pair's bytes,
/// validates its own pair on the device (nothing is read on the host, the launch shape is fixed),
/// writes the new rows into the tail ring and publishes the frontier to the device books, which the
/// host absorbs later (`hierarchy::sync_books` copies them with `books_snapshot_kernel`). The host
/// backup copy of the rows that stay in the tail window is either written in the same launch
/// (inline) or left in a work list that `backup_rows_kernel` copies on the engine's backup stream,
/// off the critical path; rows outside the window are written to the host store by the critical
/// launch, so every row that is not ready on the GPU has a host copy when the critical launch ends.
/// Bad pairs are left untouched and recorded per source; the first one of the first failing launch
/// is kept for `check_errors`. On a shared host store (docs/multi-gpu.md) every host write,
/// critical or backup, is made only for rows of the pages this hierarchy's rank owns
/// (`source_view::writes_host_copy`).
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "../../errors.hpp"
#include "../kv_write.cuh"
#include "../verify_views.cuh"
#include "../views.cuh"

namespace dhisparse::cuda::detail {

inline constexpr int write_block_threads = 256;

/// Launch counters and the first error of one kind of batched launch on one source.
struct write_control {
  /// Launch clock: every launch adds exactly 2^32 over its CTAs (each CTA 1, the first of a
  /// source's CTAs 2^32 - (CTAs - 1) instead), so `ticks >> 32` is the number of launches
  /// completed before the running one, in every CTA of it, and no CTA waits for an atomic's result.
  unsigned long long ticks = 0;
  /// (epoch << 32 | entry) of the first bad entry since errors were last checked; all ones if none.
  unsigned long long first_error = ~0ull;
};

/// Error books of one kind of batched launch (writes or commits) on one source.
struct write_workspace_view {
  write_control* control = nullptr;
  entry_error* sticky = nullptr;  ///< [capacity] record of each entry that set first_error
  std::uint32_t capacity = 0;
};

/// Where `books_snapshot_kernel` copies the device books for the host to absorb (mapped pinned
/// host memory): a copy made when the host asks, not a store over PCIe by every written pair.
struct books_snapshot_view {
  std::int64_t* frontier = nullptr;  ///< [sources][slots] rows stored
  std::int32_t* partial = nullptr;   ///< [sources][slots] committed positions of the boundary row
};

/// What a critical write leaves for the backup kernel: rows [first, first + rows) of `slot`, in
/// the tail ring of every payload layer of the source, still to be copied to the host store.
struct backup_item {
  std::int32_t slot = -1;
  std::uint32_t rows = 0;  ///< 0: nothing (padding, a bad entry, no new rows, or inline write-through)
  std::int64_t first = 0;
};
static_assert(sizeof(backup_item) == 16);

/// One source's entry of the step table (device memory, written once at construction): what the
/// step-wide kernels need of every source. Fixed size, so the planner can count it.
template <class OrderIndex>
struct step_source {
  source_view<OrderIndex> view;
  write_workspace_view wws;   ///< error books of writes
  write_workspace_view cws;   ///< error books of commits
  write_workspace_view sws;   ///< error books of stages (null without speculation)
  verify_workspace_view vws;  ///< device round books (staged / verified / partial); null without speculation
  backup_item* work = nullptr;    ///< [capacity] the backup work list of the last write or commit
  std::uint32_t first_layer = 0;  ///< step_layer_index(s, 0)
};
inline constexpr std::size_t step_source_bytes = 512;  ///< bytes of one step-table entry (carved)

/// The row buffers and counts of a write, common to `kv_write_view` (one source) and
/// `kv_step_write_view` (every source).
struct write_args {
  const std::int32_t* slots = nullptr;
  const std::int32_t* rows = nullptr;
  const std::int32_t* first = nullptr;
  const std::byte* const* layer_rows = nullptr;
  std::uint64_t row_stride = 0;
  std::uint32_t rows_pitch = 0;
  std::uint32_t max_rows = 1;
  std::uint32_t capacity = 0;
  bool step_layers = false;  ///< layer_rows indexed by step_layer_index (true) or by the source's layer
};

/// The row buffers and counts of a stage, common to `stage_view` (one source) and
/// `stage_step_view` (every source).
struct stage_args {
  const std::int32_t* slots = nullptr;
  const std::int32_t* counts = nullptr;
  const std::int32_t* first = nullptr;
  const std::byte* const* layer_rows = nullptr;
  std::uint64_t row_stride = 0;
  std::uint32_t max_block = 1;  ///< the view's (0 resolved to K_max by the host)
  std::uint32_t capacity = 0;
  bool step_layers = false;     ///< layer_rows indexed by step_layer_index (true) or by the source's layer
};

/// Status of batch entry `e` naming `slot`: `bad_code` when the caller found the slot bad, else
/// duplicate_in_batch when an earlier entry names it too, else 0. Every thread of the CTA calls it
/// (the duplicate scan is spread over the CTA). Shared by every batched kernel of the backend.
__device__ inline status_code batch_entry_slot_status(bool bad_slot, errc bad_code, const std::int32_t* slots,
                                                      unsigned e, std::int32_t slot) {
  bool dup = false;  // scanned whatever bad_slot says, so the scan's loads need not wait for the caller's
  for (unsigned j = threadIdx.x; j < e; j += blockDim.x) dup |= slots[j] == slot;
  dup = __syncthreads_or(dup) != 0;
  if (bad_slot) return to_status(bad_code);
  return dup ? to_status(errc::duplicate_in_batch) : status_ok;
}

/// Slot check of the hierarchy's batched kernels: unknown_request for a slot out of range or not
/// live, then duplicate_in_batch.
template <class OrderIndex>
__device__ status_code check_entry_slot(const source_view<OrderIndex>& src, const std::int32_t* slots, unsigned e,
                                        std::int32_t slot) {
  const bool bad_slot = static_cast<std::size_t>(slot) >= src.space.slots || src.live[slot] == 0u;
  return batch_entry_slot_status(bad_slot, errc::unknown_request, slots, e, slot);
}

/// The error record of a batch entry naming `slot` with its slot check's status (value = the slot;
/// the kernel adds what its own checks find).
__device__ inline entry_error slot_entry_record(status_code code, std::int32_t slot, std::uint32_t epoch) {
  entry_error r;
  r.code = code;
  r.slot = slot;
  r.epoch = epoch;
  r.value = slot;
  return r;
}

/// Records entry e's error if it is the first since the last check (smallest epoch, then entry).
__device__ inline void record_entry_error(const write_workspace_view& ws, std::uint32_t epoch, unsigned e,
                                          const entry_error& r) {
  const unsigned long long key = (static_cast<unsigned long long>(epoch) << 32) | e;
  if (key < atomicMin(&ws.control->first_error, key)) ws.sticky[e] = r;
}

/// The epoch of the running launch on a write workspace (see write_control::ticks).
__device__ inline std::uint32_t write_epoch(const write_workspace_view& ws) {
  return static_cast<std::uint32_t>(*static_cast<volatile unsigned long long*>(&ws.control->ticks) >> 32);
}

/// Ends one CTA of a launch on a source (gridDim.x CTAs per source): counts it on the launch clock
/// without waiting for the result. Every thread of the CTA calls it: the barrier keeps the clock
/// from reaching the next epoch before each thread has read it. No fence: only later launches read
/// what the CTAs wrote (rows, books, errors, the clock), and the kernel boundary orders that.
__device__ inline void finish_write_cta(const write_workspace_view& ws) {
  __syncthreads();
  if (threadIdx.x == 0) atomicAdd(&ws.control->ticks, blockIdx.x == 0 ? (1ull << 32) - (gridDim.x - 1) : 1ull);
}

/// r / d and r % d for a history row r >= 0: 32-bit division while r fits (every realistic row),
/// which is a few instructions where the 64-bit one is a long subroutine, run per 16-byte vector.
struct row_split {
  std::uint64_t quotient, remainder;
};
__device__ inline row_split split_row(std::int64_t r, std::uint32_t d) {
  const auto u = static_cast<std::uint64_t>(r);
  if (u >> 32 == 0) {
    const auto u32 = static_cast<std::uint32_t>(u);
    return {u32 / d, u32 % d};
  }
  return {u / d, u % d};
}

/// Host-store address of row r of payload layer l of a slot (its page is reserved).
template <class OrderIndex>
__device__ int4* host_row_address(const source_view<OrderIndex>& src, unsigned slot, unsigned l, std::int64_t r) {
  const row_split p = split_row(r, src.page_rows);
  const std::int32_t hp = src.host_page[static_cast<std::size_t>(slot) * src.pages_per_request + p.quotient];
  return reinterpret_cast<int4*>(src.host_store + static_cast<std::uint64_t>(hp) * src.page_bytes +
                                 (static_cast<std::uint64_t>(l) * src.page_rows + p.remainder) * src.row_bytes);
}
/// Tail-ring address of row r of payload layer l of a slot (location_space::tail, the ring row
/// found by split_row).
template <class OrderIndex>
__device__ int4* tail_row_address(const source_view<OrderIndex>& src, unsigned slot, unsigned l, std::int64_t r) {
  const std::uint64_t ring_row = split_row(r, static_cast<std::uint32_t>(src.space.tail_rows)).remainder;
  return reinterpret_cast<int4*>(src.layer_pool[l] +
                                 static_cast<std::size_t>(src.space.tail_ring(slot, ring_row)) * src.row_bytes);
}

/// Calls `f(l, i, v)` for every 16-byte vector v of row i (< rows) of every payload layer l, spread
/// evenly over all threads of the CTA (1-8 warps sized by the bytes: see write_warps).
template <class OrderIndex, class F>
__device__ void for_each_vector(const source_view<OrderIndex>& src, unsigned rows, F&& f) {
  const unsigned vecs = src.row_bytes / 16u;
  const unsigned per_layer = rows * vecs;
  const unsigned total = per_layer * src.layers;
  for (unsigned x = threadIdx.x; x < total; x += blockDim.x) {
    const unsigned l = x / per_layer, rest = x - l * per_layer;
    const unsigned i = rest / vecs, v = rest - i * vecs;
    f(l, i, v);
  }
}

/// Rows [f, last) are reserved when `last` is within max_rows and its last page has a host page.
template <class OrderIndex>
__device__ bool rows_reserved(const source_view<OrderIndex>& src, unsigned slot, std::int64_t last) {
  if (last > src.max_rows) return false;
  if (last <= 0) return true;
  return src.host_page[static_cast<std::size_t>(slot) * src.pages_per_request +
                       static_cast<std::size_t>(last - 1) / src.page_rows] >= 0;
}

// --------------------------------------------------------------------------------------------
// writes: one CTA per (source, entry); blockIdx.x = entry, blockIdx.y = source - source_begin

/// The critical launch of a write. Each (source, entry) is checked as the per-source append
/// checks an entry; a good one writes its new rows into the tail ring (rows inside the tail window
/// [last - T, last)) and into the host store (rows outside the window; every row when `inline_host`),
/// then publishes the frontier (device books). Without `inline_host` it leaves
/// the window rows in the backup work list for `backup_rows_kernel`.
template <class OrderIndex>
__global__ void step_write_kernel(const step_source<OrderIndex>* table, unsigned source_begin, write_args w,
                                  bool inline_host) {
  const unsigned e = blockIdx.x;
  const step_source<OrderIndex>& t = table[source_begin + blockIdx.y];
  const source_view<OrderIndex>& src = t.view;
  const std::uint32_t epoch = write_epoch(t.wws);
  const std::int32_t slot = w.slots[e];
  backup_item work{};
  if (slot >= 0) {
    const std::size_t at = static_cast<std::size_t>(blockIdx.y + source_begin) * w.rows_pitch + e;
    const std::int32_t rows = w.rows[w.rows_pitch != 0 ? at : e];
    // Each pair is a chain of dependent loads and the step waits on the longest: the new rows are
    // loaded before the checks, so the input's loads overlap the books' (slot, frontier, page).
    // Only an entry whose row count is in range is read; a bad entry's rows are dropped unwritten.
    const bool rows_in_range = rows > 0 && static_cast<std::uint32_t>(rows) <= w.max_rows;
    const std::size_t base = !rows_in_range       ? 0
                             : w.first != nullptr ? static_cast<std::size_t>(w.first[w.rows_pitch != 0 ? at : e])
                                                  : static_cast<std::size_t>(e) * w.max_rows;
    const std::uint64_t stride = w.row_stride != 0 ? w.row_stride : src.row_bytes;
    const unsigned layer0 = w.step_layers ? t.first_layer : 0u;
    const unsigned vecs = src.row_bytes / 16u;
    const unsigned per_layer = rows_in_range ? static_cast<unsigned>(rows) * vecs : 0u;
    const unsigned total = per_layer * src.layers;
    const auto input = [&](unsigned x) {
      const unsigned l = x / per_layer, rest = x - l * per_layer;
      const unsigned i = rest / vecs, v = rest - i * vecs;
      return reinterpret_cast<const int4*>(w.layer_rows[layer0 + l] + (base + i) * stride) + v;
    };
    const unsigned x0 = threadIdx.x, x1 = threadIdx.x + blockDim.x;  // this thread's first two vectors
    int4 early0{}, early1{};
    if (x0 < total) early0 = *input(x0);
    if (x1 < total) early1 = *input(x1);
    // The frontier too is loaded before the slot's checks end (a slot in range has one).
    const std::int64_t frontier = static_cast<std::size_t>(slot) < src.space.slots ? src.frontier[slot] : 0;
    entry_error r = slot_entry_record(check_entry_slot(src, w.slots, e, slot), slot, epoch);
    std::int64_t f = 0;
    if (r.code == status_ok) {
      f = frontier;
      r.frontier = f;
      if (!rows_in_range && rows != 0) {
        r.code = to_status(errc::size_mismatch);
        r.value = rows;
      } else if (!rows_reserved(src, static_cast<unsigned>(slot), f + rows)) {
        r.code = to_status(errc::capacity_exceeded);
        r.value = f + rows;
      }
    }
    if (r.code != status_ok) {
      if (threadIdx.x == 0) record_entry_error(t.wws, epoch, e, r);
    } else if (rows > 0) {
      const auto s = static_cast<unsigned>(slot);
      const std::int64_t last = f + rows;
      const std::int64_t tail_begin = last - static_cast<std::int64_t>(src.tail_rows);
      const auto place = [&](unsigned x, const int4* from, const int4& value) {
        const unsigned l = x / per_layer, rest = x - l * per_layer;
        const unsigned i = rest / vecs, v = rest - i * vecs;
        const std::int64_t row = f + i;
        int4* tail = tail_row_address(src, s, l, row) + v;
        const bool in_window = row >= tail_begin;
        if (in_window && from != tail) *tail = value;  // an engine may have written the ring row in place
        if ((!in_window || inline_host) && src.writes_host_copy(row)) host_row_address(src, s, l, row)[v] = value;
      };
      if (x0 < total) place(x0, input(x0), early0);
      if (x1 < total) place(x1, input(x1), early1);
      for (unsigned x = x1 + blockDim.x; x < total; x += blockDim.x) {
        const int4* from = input(x);
        place(x, from, *from);
      }
      if (!inline_host) work = {slot, static_cast<std::uint32_t>(last - (f > tail_begin ? f : tail_begin)),
                                f > tail_begin ? f : tail_begin};
      __syncthreads();
      if (threadIdx.x == 0) {
        src.frontier[slot] = last;  // read by later launches (and a books snapshot) only
        if (t.vws.staged != nullptr) {  // complete rows: a staged block is superseded, no partial row
          t.vws.staged[slot] = 0;
          t.vws.verified[slot] = 0;
          t.vws.partial[slot] = 0;
        }
      }
    }
  }
  if (!inline_host && threadIdx.x == 0) t.work[e] = work;
  finish_write_cta(t.wws);
}

/// The critical launch of a commit: each (source, entry)'s verified round is checked as the
/// per-source commit checks it; the accepted prefix joins the history (its completed rows are in
/// the tail ring already: rows that fall outside the window go to the host store now, every row
/// when `inline_host`, the rest through the backup work list), and the frontier and partial
/// boundary row are published.
template <class OrderIndex>
__global__ void step_commit_kernel(const step_source<OrderIndex>* table, unsigned source_begin, commit_view c,
                                   bool inline_host) {
  const unsigned e = blockIdx.x;
  const step_source<OrderIndex>& t = table[source_begin + blockIdx.y];
  const source_view<OrderIndex>& src = t.view;
  const verify_workspace_view& vws = t.vws;
  const std::uint32_t epoch = write_epoch(t.cws);
  const std::int32_t slot = c.slots[e];
  backup_item work{};
  if (slot >= 0) {
    entry_error r = slot_entry_record(check_entry_slot(src, c.slots, e, slot), slot, epoch);
    std::int64_t f = 0, n_next = 0;
    const auto m = static_cast<std::int64_t>(vws.positions_per_row);
    if (r.code == status_ok) {
      f = src.frontier[slot];
      r.frontier = f;
      const std::int32_t accepted = c.accepted[e];
      const std::int32_t verified = vws.verified[slot];
      n_next = f * m + vws.partial[slot] + accepted + 1;
      if (vws.staged[slot] == 0 || verified == 0) {
        r.code = to_status(errc::commit_without_verify);
      } else if (accepted < 0 || accepted >= verified) {
        r.code = to_status(errc::acceptance_beyond_block);
        r.value = accepted;
        r.index = verified;
      } else if (!rows_reserved(src, static_cast<unsigned>(slot), n_next / m)) {
        r.code = to_status(errc::capacity_exceeded);
        r.value = n_next / m;
      }
    }
    if (r.code != status_ok) {
      if (threadIdx.x == 0) record_entry_error(t.cws, epoch, e, r);
    } else {
      const auto s = static_cast<unsigned>(slot);
      const std::int64_t last = n_next / m;
      const std::int64_t tail_begin = last - static_cast<std::int64_t>(src.tail_rows);
      const std::int64_t kept = inline_host ? last : (f > tail_begin ? f : tail_begin);  // host now: [f, kept)
      if (kept > f)
        for_each_vector(src, static_cast<unsigned>(kept - f), [&](unsigned l, unsigned i, unsigned v) {
          const std::int64_t row = f + i;
          if (src.writes_host_copy(row)) host_row_address(src, s, l, row)[v] = tail_row_address(src, s, l, row)[v];
        });
      if (!inline_host && last > kept) work = {slot, static_cast<std::uint32_t>(last - kept), kept};
      __syncthreads();
      if (threadIdx.x == 0) {
        src.frontier[slot] = last;
        vws.partial[slot] = static_cast<std::int32_t>(n_next % m);
        vws.staged[slot] = 0;  // the round is closed: the rest of the block is discarded
        vws.verified[slot] = 0;
      }
    }
  }
  if (!inline_host && threadIdx.x == 0) t.work[e] = work;
  finish_write_cta(t.cws);
}

/// A stage: each (source, entry)'s draft block is checked as the per-request `stage_block` checks
/// it (slot, duplicate, then the block: 0 positions, wider than max_block, past max_rows; the
/// committed positions n = frontier * m + partial are read here), and a good one writes its
/// block rows (the boundary row first) into the tail ring past the committed window and sets the
/// device round books (staged = count, verified = 0), which the verify kernels check. The
/// frontier, the host store and the backup work list are not touched: the block rows
/// [f, f + rows) never share a ring row with the committed window [f - T, f) (the ring holds
/// T + K_max rows), so a pending backup of the window need not be joined.
template <class OrderIndex>
__global__ void step_stage_kernel(const step_source<OrderIndex>* table, unsigned source_begin, stage_args w) {
  const unsigned e = blockIdx.x;
  const step_source<OrderIndex>& t = table[source_begin + blockIdx.y];
  const source_view<OrderIndex>& src = t.view;
  const verify_workspace_view& vws = t.vws;
  const std::uint32_t epoch = write_epoch(t.sws);
  const std::int32_t slot = w.slots[e];
  if (slot >= 0) {
    entry_error r = slot_entry_record(check_entry_slot(src, w.slots, e, slot), slot, epoch);
    const std::int32_t count = w.counts[e];
    std::int64_t f = 0, partial = 0;
    const auto m = static_cast<std::int64_t>(vws.positions_per_row);
    if (r.code == status_ok) {
      f = src.frontier[slot];
      partial = vws.partial[slot];
      r.frontier = f;
      r.value = count;
      const std::int64_t n = f * m + partial;
      if (count <= 0) {
        r.code = to_status(errc::size_mismatch);
      } else if (static_cast<std::uint32_t>(count) > w.max_block) {
        r.code = to_status(errc::block_too_wide);
        r.index = static_cast<std::int32_t>(w.max_block);
      } else if (count > src.max_rows * m - n) {
        r.code = to_status(errc::capacity_exceeded);
        r.value = n + count;  // one past the block's last position
      }
    }
    if (r.code != status_ok) {
      if (threadIdx.x == 0) record_entry_error(t.sws, epoch, e, r);
    } else {
      const auto s = static_cast<unsigned>(slot);
      const auto rows = static_cast<unsigned>((partial + count - 1) / m + 1);  // block_rows: rows <= count
      const std::size_t base = w.first != nullptr ? static_cast<std::size_t>(w.first[e])
                                                  : static_cast<std::size_t>(e) * w.max_block;
      const std::uint64_t stride = w.row_stride != 0 ? w.row_stride : src.row_bytes;
      const unsigned layer0 = w.step_layers ? t.first_layer : 0u;
      for_each_vector(src, rows, [&](unsigned l, unsigned i, unsigned v) {
        const int4* from = reinterpret_cast<const int4*>(w.layer_rows[layer0 + l] + (base + i) * stride);
        int4* tail = tail_row_address(src, s, l, f + i);
        if (from != tail) tail[v] = from[v];  // an engine may have written the ring row in place
      });
      __syncthreads();
      if (threadIdx.x == 0) {
        vws.staged[slot] = count;  // read by later launches only (verify, commit)
        vws.verified[slot] = 0;    // a new block: the last verify no longer applies
      }
    }
  }
  finish_write_cta(t.sws);
}

/// The backup launch (on the engine's backup stream, after the critical launch): copies the rows
/// of each (source, entry)'s work item from the tail ring to the host store. Nothing else reads
/// or writes those host rows, and the ring rows stay until the next write, which joins first.
template <class OrderIndex>
__global__ void backup_rows_kernel(const step_source<OrderIndex>* table, unsigned source_begin) {
  const step_source<OrderIndex>& t = table[source_begin + blockIdx.y];
  const backup_item work = t.work[blockIdx.x];
  if (work.rows == 0) return;
  const auto s = static_cast<unsigned>(work.slot);
  for_each_vector(t.view, work.rows, [&](unsigned l, unsigned i, unsigned v) {
    const std::int64_t row = work.first + i;
    if (t.view.writes_host_copy(row)) host_row_address(t.view, s, l, row)[v] = tail_row_address(t.view, s, l, row)[v];
  });
}

/// Copies every source's device frontier and partial boundary row of slots [0, slots) into
/// `out` (source-major): what `hierarchy::sync_books` absorbs, one launch however many sources.
template <class OrderIndex>
__global__ void books_snapshot_kernel(const step_source<OrderIndex>* table, unsigned sources, unsigned slots,
                                      books_snapshot_view out) {
  const std::size_t n = static_cast<std::size_t>(sources) * slots;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const step_source<OrderIndex>& t = table[i / slots];
    const std::size_t slot = i % slots;
    out.frontier[i] = t.view.frontier[slot];
    out.partial[i] = t.vws.partial != nullptr ? t.vws.partial[slot] : 0;
  }
}

// --------------------------------------------------------------------------------------------
// page-table upload of a reservation: scattered (entry, host page) pairs

/// One page-table entry to set: `table[index] = value`.
struct page_table_update {
  std::int32_t* table = nullptr;
  std::uint64_t index = 0;
  std::int32_t value = -1;
};

// A template so that programs of several translation units link (one definition per program).
template <int = 0>
__global__ void __launch_bounds__(write_block_threads)
    page_table_update_kernel(const page_table_update* updates, std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    updates[i].table[updates[i].index] = updates[i].value;
}

// --------------------------------------------------------------------------------------------
// launchers (stream last, cudaError_t; no allocation, no host synchronisation: capturable)

/// Warps of a write CTA for a (source, entry) of `rows` rows of `vectors` 16-byte vectors over all
/// payload layers: one warp per two vectors a lane, 1 to 8 (a decode row of GLM-5.3's 576 B
/// on ~4 layers: 3 warps), instead of a 256-thread CTA for a few hundred bytes.
constexpr unsigned write_warps(std::uint64_t rows, std::uint64_t vectors) {
  const std::uint64_t w = (rows * vectors + 63) / 64;
  return w < 1 ? 1u : w > 8 ? 8u : static_cast<unsigned>(w);
}

/// The critical write over sources [source_begin, source_begin + sources): one CTA per
/// (source, entry), `warps` warps each (capacity x sources CTAs, a fixed shape for a graph).
template <class OrderIndex>
cudaError_t launch_step_write(const step_source<OrderIndex>* table, unsigned source_begin, unsigned sources,
                              const write_args& w, bool inline_host, unsigned warps, cudaStream_t stream) {
  if (w.capacity == 0 || sources == 0) return cudaSuccess;
  step_write_kernel<OrderIndex><<<dim3(w.capacity, sources), 32 * warps, 0, stream>>>(table, source_begin, w,
                                                                                      inline_host);
  return cudaGetLastError();
}

/// The critical commit over sources [source_begin, source_begin + sources).
template <class OrderIndex>
cudaError_t launch_step_commit(const step_source<OrderIndex>* table, unsigned source_begin, unsigned sources,
                               const commit_view& c, bool inline_host, unsigned warps, cudaStream_t stream) {
  if (c.capacity == 0 || sources == 0) return cudaSuccess;
  step_commit_kernel<OrderIndex><<<dim3(c.capacity, sources), 32 * warps, 0, stream>>>(table, source_begin, c,
                                                                                       inline_host);
  return cudaGetLastError();
}

/// The stage over sources [source_begin, source_begin + sources): one CTA per (source, entry).
template <class OrderIndex>
cudaError_t launch_step_stage(const step_source<OrderIndex>* table, unsigned source_begin, unsigned sources,
                              const stage_args& w, unsigned warps, cudaStream_t stream) {
  if (w.capacity == 0 || sources == 0) return cudaSuccess;
  step_stage_kernel<OrderIndex><<<dim3(w.capacity, sources), 32 * warps, 0, stream>>>(table, source_begin, w);
  return cudaGetLastError();
}

/// The backup of the last critical launch over the same sources and capacity.
template <class OrderIndex>
cudaError_t launch_backup_rows(const step_source<OrderIndex>* table, unsigned source_begin, unsigned sources,
                               unsigned capacity, unsigned warps, cudaStream_t stream) {
  if (capacity == 0 || sources == 0) return cudaSuccess;
  backup_rows_kernel<OrderIndex><<<dim3(capacity, sources), 32 * warps, 0, stream>>>(table, source_begin);
  return cudaGetLastError();
}

/// Blocks of write_block_threads for a grid-stride loop over n items (at most 1024).
constexpr unsigned grid_stride_blocks(std::size_t n) {
  return static_cast<unsigned>(n / write_block_threads + 1 < 1024 ? n / write_block_threads + 1 : 1024);
}

template <class OrderIndex>
cudaError_t launch_books_snapshot(const step_source<OrderIndex>* table, unsigned sources, unsigned slots,
                                  const books_snapshot_view& out, cudaStream_t stream) {
  const std::size_t n = static_cast<std::size_t>(sources) * slots;
  if (n == 0) return cudaSuccess;
  books_snapshot_kernel<OrderIndex><<<grid_stride_blocks(n), write_block_threads, 0, stream>>>(table, sources, slots,
                                                                                                out);
  return cudaGetLastError();
}

inline cudaError_t launch_page_table_update(const page_table_update* updates, std::size_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  page_table_update_kernel<><<<grid_stride_blocks(n), write_block_threads, 0, stream>>>(updates, n);
  return cudaGetLastError();
}

/// Loads the batched kernels up front (see preload_hierarchy_kernels: no lazy load in a step).
template <class OrderIndex>
cudaError_t preload_write_kernels() {
  cudaFuncAttributes a{};
  cudaError_t err = cudaFuncGetAttributes(&a, step_write_kernel<OrderIndex>);
  if (err == cudaSuccess) err = cudaFuncGetAttributes(&a, step_commit_kernel<OrderIndex>);
  if (err == cudaSuccess) err = cudaFuncGetAttributes(&a, step_stage_kernel<OrderIndex>);
  if (err == cudaSuccess) err = cudaFuncGetAttributes(&a, backup_rows_kernel<OrderIndex>);
  if (err == cudaSuccess) err = cudaFuncGetAttributes(&a, books_snapshot_kernel<OrderIndex>);
  if (err == cudaSuccess) err = cudaFuncGetAttributes(&a, page_table_update_kernel<>);
  return err;
}

}  // namespace dhisparse::cuda::detail
