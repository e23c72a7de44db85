#pragma once
/// \file
/// The fused resolver kernel: one launch resolves a whole batch of selections on one source.
///
/// A persistent grid of fixed size (independent of the batch, so a captured graph can replay any
/// batch size) works in two overlapping phases coordinated through device counters:
///
///  * metadata: when the batch fits the grid (C <= grid), CTA t claims entry t and issues the
///    reads of its slot, length and (strided layout) selection at kernel start, with the read of
///    the batch count; larger batches draw entries from `control->ticket`. For entry t a CTA
///    reads, in two round trips, the entry's slot and selection, then everything that depends
///    on the slot alone (frontier, liveness, the slot's hot rows and LRU order staged in shared
///    memory, and per selected row its optional page, host page and hot way from the per-slot
///    reverse map `way_of_row`). It validates (nothing is written for a bad entry), resolves
///    tail, ready optional and hot rows directly from those values and marks hit ways. The missing rows are then put in ascending
///    order without repeats by the cheapest exact method: shuffles within one warp (up to 32),
///    a rank bitmap over their row span (span below 64 x top_k rows), else a bitonic network. The
///    entry publishes the copies' host sources (`ready[t] = {epoch, units}`; release, or relaxed
///    for early copies, whose sources are checked again at `placed`), partitions
///    the LRU order with cub::BlockScan (the new order built in shared memory and written back
///    whole), writes hot_row/order/way_of_row/locations and the copies'
///    destinations, and publishes again with the `placed` bit. No hash table, no scan of the B
///    hot ways for hit detection: the reverse map answers "which way holds row r" in one load.
///  * copy: a CTA that finds no entry left waits (acquire loads with nanosleep backoff) until every
///    entry has published its sources and builds the exclusive prefix of the entries' copy units
///    in shared memory. Batches above `resolve_params::early_copy_max_batch` (by default none;
///    early copies below are the default path) then copy a static, strided share of the
///    flattened request-major list of
///    (miss, layer) units: warp w of CTA b takes the R units at (b * G + w) * R, then every
///    grid * G * R units after (G copy warps per CTA, R rows per warp in flight), so an SM reads
///    neighbouring rows of one request. A warp issues its rows' host loads first and only then waits
///    for their entries' `placed` bit, so PCIe reads overlap the LRU work of the entries. No
///    atomics on this copy path: at any moment the grid works on one contiguous window of the
///    list (ascending rows = host address order within a request).
///  * early copies (batches of at most `resolve_params::early_copy_max_batch` entries, by default
///    every batch: with fresh misses, starting sooner and keeping a few hundred host reads in
///    flight beat address order at every batch size measured on the H200, C = 128 at 20 %
///    included): an entry publishes its missing entries in selection order
///    (`early_plan`, repeats included) right after classifying them, before ranking (no fence: a
///    copy CTA checks each source again once it sees `placed` and fetches the row again if it
///    read a stale one), and its copy units are claimed in groups from `control->copy_cursor` (by
///    `resolve_params::early_copy_warps` warps per CTA, one row each by default, so a step's
///    rows spread over many SMs rather than the first CTAs to arrive); a
///    repeated row's copy is dropped when the destinations are placed (each distinct row is
///    written once). `plan` still receives the ascending plan of distinct rows that follower
///    layers replay. With at least as many spare CTAs as entries (2C <= grid), a CTA that took
///    an entry claims no copies and counts no departure on `control->done`: it ends right after
///    its entry, without waiting for the other entries' plans or for a round trip.
///  * self copies (an entry with at most `resolve_params::self_copy_units` copy units, every
///    entry with none): the entry's CTA publishes "nothing to copy" as soon as it has classified
///    the selection (the copy CTAs never wait for it), starts asynchronous copies of its missing
///    rows from host memory into shared memory through L1 (`cp.async.ca`; an L2 prefetch of each
///    row, issued as soon as the entry's threads with a miss are few enough, starts their host
///    reads a little sooner), ranks the misses and rewrites the LRU order while they are in
///    flight, then stores each distinct row at its hot way. No cross-CTA publication and no
///    fence: the small steps (C = 1 at ~0 misses) are bound by one CTA's dependent work.
///    A CTA that resolved every entry of the batch and left nothing to copy skips the copy phase.
///
/// Forward progress: the kernel completes whatever other streams occupy, down to one CTA of it
/// resident at a time; it never needs its CTAs to be co-resident, nor CTAs to be dispatched in
/// index order. Every wait of a CTA is on a CTA that is already running:
///  * metadata never waits (the CTA's own claim, the ticket counter and `done` are atomics whose
///    answers need no other CTA);
///  * with C <= grid, entry t is first offered to CTA t, which claims it at kernel start
///    (`ws.claim[t]` = the launch's epoch, an exchange issued beside the speculative reads of the
///    entry's head and first needed after round trip 2, before anything is written). Before a CTA
///    waits for the entries it claims every entry no CTA has claimed yet and resolves it itself
///    (`steal_entry`, after a grace of `steal_grace_ns` from its start that an unloaded launch
///    never exhausts); a CTA whose entry was taken over resolves nothing of it. So the copy
///    phase's waits (every entry's sources, then each copied unit's `placed` bit) are waits for
///    CTAs that claimed their entry, i.e. run, and finish its metadata without waiting;
///  * with C > grid every entry is drawn from `control->ticket` by a CTA that runs, and a CTA
///    waits only after it found the counter exhausted;
///  * copies never wait for other copies: the static strided share of large batches belongs to
///    its CTA and is copied whenever that CTA runs, and nothing in the launch waits for it; early
///    copy units are claimed from `control->copy_cursor`;
///  * every CTA of the grid counts its arrival on `control->done` with the same atomic that reads
///    the epoch, and every CTA but the entry-only ones its departure at its end; the count that
///    completes the total resets the counters and advances the epoch, so a CTA that starts late
///    still reads this launch's epoch, and no counter is reset while a CTA may still use it.
/// A launch that finds SMs busy therefore runs slower (CTAs run in waves, an entry whose CTA was
/// not dispatched is resolved by another after the grace) but ends. The other kernels of the
/// backend (verify_kernel.cuh, copy_kernel.cuh, write_kernel.cuh, residency and prefix kernels)
/// have no cross-CTA waits at all: their CTAs only count themselves on `done` or share work by
/// stride. docs/design.md, "Forward progress", states the guarantee.
#include <cuda/atomic>
#include <cuda_pipeline.h>
#include <nv/target>
#include <cub/block/block_scan.cuh>
#include <cub/warp/warp_scan.cuh>

#include <climits>
#include <cstddef>
#include <cstdint>

#include "../../detail/validate.hpp"
#include "../views.cuh"
#include "last_at_or_below.cuh"
#include "programmatic_launch.cuh"

/// Phase marks for profiling builds: a profiler defines DHISPARSE_RESOLVE_MARK(phase) (for example
/// to store %globaltimer per CTA, as benchmarks/probes/resolve_phases.cu does) before including
/// this header; by default marks compile to nothing. Phases: 0 batch count read, 1 entry taken,
/// 2 round trip 1, 3 round trip 2, 4 classified, 5 missing entries counted (early and self copies
/// start), 6 ranked, 12 LRU scan, 7 LRU state written, 13 destinations, 14 self-copied rows
/// landed, 8 entry done, 9 copy CTA saw every entry, 10 prefix of copy units, 11 CTA done.
#ifndef DHISPARSE_RESOLVE_MARK
#define DHISPARSE_RESOLVE_MARK(phase) ((void)0)
#endif
/// Test hooks, compiled out by default: defining DHISPARSE_RESOLVE_TEST_LATE_EARLY_SOURCES_NS
/// publishes an entry's early-copy count before its sources and holds the sources back until
/// DHISPARSE_RESOLVE_TEST_EARLY_READS() (a counter the test defines, bumped by
/// DHISPARSE_RESOLVE_TEST_EARLY_READ() in lane 0 of every warp that has loaded early sources)
/// moves, or that many nanoseconds pass, so copy CTAs read earlier launches' sources whatever
/// the timing (compute-sanitizer included); DHISPARSE_RESOLVE_TEST_REFETCH() runs in every lane
/// that fetches a row again because its source changed.
#ifndef DHISPARSE_RESOLVE_TEST_REFETCH
#define DHISPARSE_RESOLVE_TEST_REFETCH() ((void)0)
#endif
#ifndef DHISPARSE_RESOLVE_TEST_EARLY_READ
#define DHISPARSE_RESOLVE_TEST_EARLY_READ() ((void)0)
#endif
#ifndef DHISPARSE_RESOLVE_TEST_EARLY_READS
#define DHISPARSE_RESOLVE_TEST_EARLY_READS() 0ull  // no counter: the late sources wait out the bound
#endif

namespace dhisparse::cuda::detail {

constexpr int ceil_div_int(std::size_t a, std::size_t b) { return static_cast<int>((a + b - 1) / b); }
constexpr int log2_ceil(std::size_t n) {
  int b = 0;
  while ((std::size_t{1} << b) < n) ++b;
  return b;
}

/// Compile-time shape of the resolver for one (block size, top_k, B).
template <int Block, std::size_t TopK, std::size_t HotRows>
struct resolve_traits {
  static_assert(Block % 32 == 0 && Block >= 64, "dhisparse: resolver block must be whole warps");
  static_assert(TopK <= (std::size_t{1} << 24), "dhisparse: top_k too large for the resolver");
  static constexpr int block_threads = Block;
  static constexpr int min_blocks_per_sm = Block >= 1024 ? 1 : 2;  ///< 64 registers per thread either way
  static constexpr int warps = Block / 32;
  static constexpr int top_k = static_cast<int>(TopK);
  static constexpr int hot_rows = static_cast<int>(HotRows);
  static constexpr int entries_per_thread = ceil_div_int(TopK, Block);   ///< selection entries per thread
  static constexpr int ways_per_thread = ceil_div_int(HotRows, Block);   ///< hot ways per thread
  static constexpr int sort_capacity = 1 << log2_ceil(TopK);  ///< bitonic network width for up to top_k misses
  static constexpr unsigned max_rows_per_warp = 2;
  /// Most copy units (missing rows x layers) an entry copies with its own CTA (self copy).
  static constexpr unsigned self_copy_max_units = 32;
  static constexpr std::size_t self_copy_max_bytes = 24 * 1024;  ///< shared memory for self-copied rows
  static_assert(entries_per_thread <= 32,
                "dhisparse::cuda: the fused resolver supports top_k <= 32 * block threads (16384 at 512 threads)");
  static_assert(ways_per_thread <= 32,
                "dhisparse::cuda: the fused resolver supports hot caches of B <= 32 * block threads rows per slot "
                "(16384 at 512 threads)");

  using order_t = std::conditional_t<(HotRows <= 65536), std::uint16_t, std::uint32_t>;  ///< as lru_hot_cache
  using scan_t = cub::BlockScan<int, Block>;
  /// One scan of two counts packed in a word: an entry's missing entries (at most top_k) in the
  /// low miss_count_bits, its non-hit LRU positions (at most B) above them.
  using count_pair_scan_t = cub::BlockScan<unsigned, Block>;
  static constexpr int miss_count_bits = log2_ceil(TopK + 1);
  static_assert(miss_count_bits + log2_ceil(HotRows + 1) <= 32, "dhisparse: the two counts must share 32 bits");
  using warp_scan_t = cub::WarpScan<unsigned>;  ///< the copy phase's prefix of copy units, in warp 0
  /// Bits of the rank bitmap: the sort buffers' bytes, reused (misses spanning fewer rows are
  /// ranked without sorting).
  static constexpr int bitmap_bits = 2 * sort_capacity * 32;
  /// Bitmap words each thread scans when ranking (its words are consecutive).
  static constexpr int bitmap_words_per_thread = (2 * sort_capacity + Block - 1) / Block;

  struct shared_storage {
    union alignas(16) {
      struct {
        int key[sort_capacity];   ///< missing rows of the selection (with repeats), sorted in place
        int page[sort_capacity];  ///< host-store page of each
      } sort;
      unsigned bits[2 * sort_capacity];  ///< rank bitmap over [lo, lo + bitmap_bits) of the missing rows
    } scratch;
    unsigned thread_rank[Block];  ///< bitmap ranking: distinct misses before each thread's words
    unsigned claimed[(TopK + 31) / 32];  ///< early copies: distinct misses already given a copy
    int miss_key[TopK];   ///< distinct missing rows, ascending (address order)
    int miss_page[TopK];  ///< host-store page of each
    int victim[TopK];     ///< hot way taken by the r-th distinct missing row
    std::uint64_t self_src[self_copy_max_units];  ///< self copy: host offset of missing entry j
    location self_dst[self_copy_max_units];       ///< self copy: its destination, no_location for a repeat
    union {
      typename scan_t::TempStorage scan;
      typename count_pair_scan_t::TempStorage count_pair_scan;
    };
    typename warp_scan_t::TempStorage warp_scan;
    alignas(16) row_index hot[HotRows];                          ///< the slot's hot_row, staged in round trip 2
    alignas(16) order_t ord[HotRows];                            ///< the slot's LRU order, staged likewise
    alignas(16) unsigned char is_hit[(HotRows + 15) / 16 * 16];  ///< per hot way: holds a selected row
    const row_index* sel;
    location* out;
    long long frontier;
    long long err_value;
    int ticket, slot, length, err_code, len_code, bad_key, dup;
    int unclaimed;  ///< steal_entry: lowest entry seen unclaimed
    int stolen;     ///< the CTA's own entry was claimed by another CTA first
    unsigned arrived;  ///< entry-only CTAs: CTAs counted on `done` before this one
    unsigned long long start;  ///< %globaltimer at the CTA's start (steal_entry's grace)
    unsigned live;
    unsigned count[4];  ///< selected, direct, hot, host
    int misses;
    int miss_lo, miss_hi;  ///< smallest and largest missing row of the entry
    unsigned batch_count, epoch;
  };
};

// --------------------------------------------------------------------------------------------
// small device helpers



__device__ __forceinline__ unsigned warp_sum(unsigned v) { return __reduce_add_sync(0xffffffffu, v); }

__device__ __forceinline__ plan_entry load_plan(const plan_entry* p) {
  const int4 v = __ldcg(reinterpret_cast<const int4*>(p));  // written by another CTA in this launch: skip L1
  plan_entry e;
  *reinterpret_cast<int4*>(&e) = v;
  return e;
}

/// Vector `v` of `R` consecutive rows of `vecs` 16-byte vectors each, the rows at `base[0..R)`.
template <unsigned R, class P>
__device__ __forceinline__ P row_vector(P const (&base)[R], unsigned v, unsigned vecs) {
  P ptr = base[0];
#pragma unroll
  for (unsigned k = 1; k < R; ++k)
    if (v >= vecs) {
      v -= vecs;
      ptr = base[k];
    }
  return ptr + v;
}

/// 16-byte vectors each lane keeps in flight while a warp copies rows.
constexpr unsigned copy_vectors_per_lane = 4;
constexpr unsigned copy_chunk_vectors = 32 * copy_vectors_per_lane;

/// Issues one warp's loads of vectors [v0, v0 + copy_chunk_vectors) of `total` (R rows).
template <unsigned R>
__device__ __forceinline__ void warp_load_chunk(const int4* const (&src)[R], unsigned total, unsigned vecs, unsigned lane,
                                                unsigned v0, int4 (&buf)[copy_vectors_per_lane]) {
#pragma unroll
  for (unsigned j = 0; j < copy_vectors_per_lane; ++j) {
    const unsigned v = v0 + lane + 32 * j;
    if (v < total) buf[j] = __ldg(row_vector<R>(src, v, vecs));
  }
}

/// Stores what warp_load_chunk loaded; rows whose destination is null are skipped.
template <unsigned R>
__device__ __forceinline__ void warp_store_chunk(int4* const (&dst)[R], unsigned total, unsigned vecs, unsigned lane,
                                                 unsigned v0, const int4 (&buf)[copy_vectors_per_lane]) {
#pragma unroll
  for (unsigned j = 0; j < copy_vectors_per_lane; ++j) {
    unsigned v = v0 + lane + 32 * j;
    if (v < total) {
      int4* row = dst[0];
#pragma unroll
      for (unsigned k = 1; k < R; ++k)
        if (v >= vecs) {
          v -= vecs;
          row = dst[k];
        }
      if (row != nullptr) row[v] = buf[j];
    }
  }
}

/// Copies `cnt` (<= R) rows of `vecs` 16-byte vectors with one warp: every load of a chunk is
/// issued before its stores.
template <unsigned R>
__device__ __forceinline__ void warp_copy_rows(const int4* const (&src)[R], int4* const (&dst)[R], unsigned cnt,
                                               unsigned vecs, unsigned lane) {
  const unsigned total = cnt * vecs;
  for (unsigned v0 = 0; v0 < total; v0 += copy_chunk_vectors) {
    int4 buf[copy_vectors_per_lane];
    warp_load_chunk<R>(src, total, vecs, lane, v0, buf);
    warp_store_chunk<R>(dst, total, vecs, lane, v0, buf);
  }
}

/// A published entry: the launch's epoch in the low word, its copy units in bits 32-62, so a
/// waiting CTA learns both from one load. Bit 63 (`placed`) says the copies' destinations are
/// written too; without it only their host sources are (the rows may already be fetched).
constexpr std::uint64_t placed_bit = std::uint64_t{1} << 63;
__device__ __forceinline__ std::uint64_t ready_word(unsigned epoch, unsigned units, bool placed) {
  return static_cast<std::uint64_t>(epoch) | (static_cast<std::uint64_t>(units) << 32) | (placed ? placed_bit : 0);
}
__device__ __forceinline__ unsigned ready_units(std::uint64_t w) {
  return static_cast<unsigned>((w & ~placed_bit) >> 32);
}
/// Publishes an entry's ready word (relaxed or release; a release after a fence publishes the
/// CTA's writes ordered before it by a barrier).
__device__ __forceinline__ void publish_ready(std::uint64_t& slot, std::uint64_t word, ::cuda::memory_order order) {
  ::cuda::atomic_ref<std::uint64_t, ::cuda::thread_scope_device>(slot).store(word, order);
}

/// Waits (acquire loads, nanosleep backoff) until entry `e` of this launch has published its copy
/// sources and count, and with `placed` also its destinations; returns the published word.
__device__ __forceinline__ std::uint64_t wait_ready(std::uint64_t* ready, unsigned e, unsigned epoch, bool placed) {
  ::cuda::atomic_ref<std::uint64_t, ::cuda::thread_scope_device> flag(ready[e]);
  unsigned ns = 32;
  for (;;) {
    const std::uint64_t w = flag.load(::cuda::memory_order_acquire);
    if (static_cast<unsigned>(w) == epoch && (!placed || (w & placed_bit) != 0)) return w;
    __nanosleep(ns);
    if (ns < 64) ns *= 2;  // short sleeps: a waiting copy warp sees a small step's publication sooner
  }
}

__device__ __forceinline__ void record_error(const workspace_view& ws, unsigned t, const entry_error& rec) {
  ws.errors[t] = rec;
  ::cuda::atomic_ref<std::uint32_t, ::cuda::thread_scope_device> sticky(ws.control->sticky_epoch);
  std::uint32_t expected = 0;
  if (sticky.compare_exchange_strong(expected, rec.epoch, ::cuda::memory_order_relaxed) || expected == rec.epoch)
    ws.sticky[t] = rec;
}

// --------------------------------------------------------------------------------------------
// metadata of one batch entry (whole CTA)

/// How an entry's missing rows are put in ascending order without repeats.
enum class miss_ranking { warp, bitmap, sort };

/// Up to 32 missing rows (with repeats) in sort.key/page: one warp ranks them with shuffles.
/// Returns the number of distinct rows (uniform; ends with a barrier).
template <class Traits>
__device__ __forceinline__ int rank_misses_in_warp(typename Traits::shared_storage& sh, int raw) {
  if (threadIdx.x < 32) {
    const int lane = static_cast<int>(threadIdx.x);
    const int key = lane < raw ? sh.scratch.sort.key[lane] : INT_MAX;
    const int page = lane < raw ? sh.scratch.sort.page[lane] : 0;
    // First occurrence of its row: the lowest lane holding the same key.
    const unsigned same = __match_any_sync(0xffffffffu, key);
    const bool head = lane < raw && (same & ((1u << lane) - 1u)) == 0u;
    const unsigned heads = __ballot_sync(0xffffffffu, head);
    int rank = 0;
    for (int j = 0; j < raw; ++j) {  // raw is uniform: one shuffle per missing entry
      const int other = __shfl_sync(0xffffffffu, key, j);
      if (((heads >> j) & 1u) && other < key) ++rank;
    }
    if (head) {
      sh.miss_key[rank] = key;
      sh.miss_page[rank] = page;
    }
    if (lane == 0) sh.misses = __popc(heads);
  }
  __syncthreads();
  return sh.misses;
}

/// More than 32 missing entries (`raw`) whose rows span fewer than bitmap_bits rows: ranked by
/// the bitmap (reads the entry's row span from shared memory, so the decision holds no register).
template <class Traits>
__device__ __forceinline__ bool ranks_by_bitmap(const typename Traits::shared_storage& sh, int raw) {
  return raw > 32 && static_cast<long long>(sh.miss_hi) - sh.miss_lo < Traits::bitmap_bits;
}

/// Rank of marked row `row` among the distinct misses, after rank_misses_by_bitmap: the misses
/// before the words of the thread that scanned its word, plus the marked bits of that thread's
/// words below it (at most bitmap_words_per_thread popcounts; one prefix per thread rather than
/// per word keeps the prefix at 4 bytes x block threads of shared memory at any top_k).
template <class Traits>
__device__ __forceinline__ int bitmap_rank(const typename Traits::shared_storage& sh, int miss_lo, int row) {
  constexpr int W = Traits::bitmap_words_per_thread;
  const unsigned bit = static_cast<unsigned>(row - miss_lo);
  const int word = static_cast<int>(bit >> 5), first = word / W * W;
  unsigned rank = sh.thread_rank[word / W] + __popc(sh.scratch.bits[word] & ((1u << (bit & 31u)) - 1u));
#pragma unroll
  for (int j = 0; j < W - 1; ++j)
    if (first + j < word) rank += __popc(sh.scratch.bits[first + j]);
  return static_cast<int>(rank);
}

/// Missing rows marked in the bitmap over [miss_lo, miss_lo + bitmap_bits): a scan of the words'
/// population counts places every distinct row; repeats fall on the same bit. Returns the number
/// of distinct rows (uniform; ends with a barrier).
template <class Traits, int KPT>
__device__ __forceinline__ int rank_misses_by_bitmap(typename Traits::shared_storage& sh, int miss_lo, unsigned missing,
                                     const row_index (&e)[KPT], const int (&hp)[KPT]) {
  constexpr int words_per_thread = Traits::bitmap_words_per_thread;
  const int tid = static_cast<int>(threadIdx.x);
  const int words = ((sh.miss_hi - miss_lo) >> 5) + 1;
  unsigned w[words_per_thread];
  int mine = 0;
#pragma unroll
  for (int j = 0; j < words_per_thread; ++j) {
    const int idx = tid * words_per_thread + j;
    w[j] = idx < words ? sh.scratch.bits[idx] : 0u;
    mine += __popc(w[j]);
  }
  int at = 0, M = 0;
  typename Traits::scan_t(sh.scan).ExclusiveSum(mine, at, M);
  sh.thread_rank[tid] = static_cast<unsigned>(at);  // the rank of any marked row in a few popcounts
#pragma unroll
  for (int j = 0; j < words_per_thread; ++j) {
    const int idx = tid * words_per_thread + j;
    const int first = miss_lo + idx * 32;
    for (unsigned x = w[j]; x != 0u; x &= x - 1u) sh.miss_key[at++] = first + __ffs(static_cast<int>(x)) - 1;
  }
  __syncthreads();
  // The host page of each distinct row, from any entry that selected it (repeats agree).
#pragma unroll
  for (int k = 0; k < KPT; ++k)
    if ((missing >> k) & 1u) sh.miss_page[bitmap_rank<Traits>(sh, miss_lo, e[k])] = hp[k];
  __syncthreads();
  return M;
}

/// Any number of missing rows (with repeats) in sort.key/page: a bitonic network over the next
/// power of two (padding sorts last), then the first row of each run of equal rows. Returns the
/// number of distinct rows (uniform; ends with a barrier).
template <class Traits>
__device__ __forceinline__ int rank_misses_by_sorting(typename Traits::shared_storage& sh, int raw) {
  constexpr int Block = Traits::block_threads;
  const int tid = static_cast<int>(threadIdx.x);
  int* const key = sh.scratch.sort.key;
  int* const page = sh.scratch.sort.page;
  if (raw > 1) {
    int width = 2;
    while (width < raw) width <<= 1;
    for (int r = raw + tid; r < width; r += Block) key[r] = INT_MAX;
    __syncthreads();
    for (int size = 2; size <= width; size <<= 1)
      for (int stride = size >> 1; stride > 0; stride >>= 1) {
        for (int i = tid; i < width / 2; i += Block) {
          const int lo = 2 * i - (i & (stride - 1)), hi = lo + stride;
          const int a = key[lo], b = key[hi];
          if ((a > b) == ((lo & size) == 0)) {
            key[lo] = b;
            key[hi] = a;
            const int pa = page[lo];
            page[lo] = page[hi];
            page[hi] = pa;
          }
        }
        __syncthreads();
      }
  }
  int distinct = 0;
  for (int c0 = 0; c0 < raw; c0 += Block) {
    const int r = c0 + tid;
    const int head = r < raw && (r == 0 || key[r] != key[r - 1]) ? 1 : 0;
    int at = 0, chunk = 0;
    typename Traits::scan_t(sh.scan).ExclusiveSum(head, at, chunk);
    if (head) {
      sh.miss_key[distinct + at] = key[r];
      sh.miss_page[distinct + at] = page[r];
    }
    distinct += chunk;
    __syncthreads();
  }
  return distinct;
}

/// Copies `n` elements between global and shared memory with the whole CTA, in 16-byte vectors
/// when both sides allow.
template <int Block, class T, class U>
__device__ __forceinline__ void block_copy_array(T* __restrict__ dst, const U* __restrict__ src, int n) {
  const int tid = static_cast<int>(threadIdx.x);
  if constexpr (sizeof(T) == sizeof(U)) {
    constexpr int per_vec = 16 / sizeof(T);
    if (n % per_vec == 0 && ((reinterpret_cast<std::uintptr_t>(src) | reinterpret_cast<std::uintptr_t>(dst)) & 15u) == 0) {
      const int4* s = reinterpret_cast<const int4*>(src);
      int4* d = reinterpret_cast<int4*>(dst);
      for (int j = tid; j < n / per_vec; j += Block) d[j] = s[j];
      return;
    }
  }
  for (int j = tid; j < n; j += Block) dst[j] = static_cast<T>(src[j]);
}

/// Round trip 2's share of the hot state: the slot's hot rows and LRU order into shared memory,
/// hit marks cleared.
template <class Traits, class OrderIndex>
__device__ __forceinline__ void stage_hot_state(typename Traits::shared_storage& sh, const row_index* hot_row,
                                                const OrderIndex* order) {
  constexpr int Block = Traits::block_threads;
  block_copy_array<Block>(sh.hot, hot_row, Traits::hot_rows);
  block_copy_array<Block>(sh.ord, order, Traits::hot_rows);
  unsigned* hit_words = reinterpret_cast<unsigned*>(sh.is_hit);
  for (int j = static_cast<int>(threadIdx.x); j < static_cast<int>(sizeof(sh.is_hit) / 4); j += Block) hit_words[j] = 0u;
}

/// Byte offset in the host store of history row `row` (layer 0), whose page is host page `page`.
template <class OrderIndex>
__device__ __forceinline__ std::uint64_t host_row_offset(const source_view<OrderIndex>& src, int page, row_index row) {
  return static_cast<std::uint64_t>(page) * src.page_bytes +
         static_cast<std::uint64_t>(static_cast<unsigned>(row) % src.page_rows) * src.row_bytes;
}

/// Starts a read of a host row (16-byte aligned, `bytes` a multiple of 16) into L2 without waiting
/// for it: one bulk prefetch on SM 90, nothing before.
__device__ __forceinline__ void prefetch_host_row([[maybe_unused]] const std::byte* at, [[maybe_unused]] unsigned bytes) {
  NV_IF_TARGET(NV_PROVIDES_SM_90,
               (asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(at), "r"(bytes) : "memory");))
}

/// Copies 16 bytes from global to shared memory asynchronously (completed by the thread's next
/// cp.async wait), through L1: `cp.async.ca`. The library's pipeline copies take `.cg` for 16 bytes,
/// which reads mapped host memory much more slowly (small_step_floor: 128 CTAs' two host rows each,
/// 16.7 against 22.6 us on the H200). L1 is safe for the host store: no launch writes it, as for
/// the copy warps' __ldg. Before SM 80: a plain copy.
__device__ __forceinline__ void copy_16_async_through_l1(void* shared_dst, const void* global_src) {
  NV_IF_ELSE_TARGET(
      NV_PROVIDES_SM_80,
      (const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(shared_dst));
       asm volatile("cp.async.ca.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(global_src) : "memory");),
      (*static_cast<int4*>(shared_dst) = *static_cast<const int4*>(global_src);))
}

/// Self copy, first half: issues the asynchronous copies of the entry's `units` (missing entry j,
/// layer l) = j * layers + l from the host store into shared memory (`self_rows`, unit u at
/// u * row_bytes); sh.self_src holds each missing entry's host offset.
template <class Traits, class OrderIndex>
__device__ __forceinline__ void self_copy_fetch(typename Traits::shared_storage& sh, unsigned char* self_rows,
                                                const source_view<OrderIndex>& src, unsigned units, unsigned layers) {
  const unsigned vecs = src.row_bytes / 16u;
  const std::uint64_t layer_host_stride = static_cast<std::uint64_t>(src.page_rows) * src.row_bytes;
  for (unsigned i = threadIdx.x; i < units * vecs; i += Traits::block_threads) {
    const unsigned u = i / vecs, v = i - u * vecs, j = u / layers, l = u - j * layers;
    copy_16_async_through_l1(self_rows + static_cast<std::size_t>(u) * src.row_bytes + v * 16u,
                             src.host_store + sh.self_src[j] + l * layer_host_stride + v * 16u);
  }
  __pipeline_commit();
}

/// Self copy, second half (after a barrier that follows the destinations): waits for the fetched
/// rows and stores each distinct row into every copied layer's pool.
template <class Traits, class OrderIndex>
__device__ __forceinline__ void self_copy_store(typename Traits::shared_storage& sh, const unsigned char* self_rows,
                                                const source_view<OrderIndex>& src, unsigned units, unsigned layers) {
  __pipeline_wait_prior(0);
  __syncthreads();  // every thread's fetches landed
  DHISPARSE_RESOLVE_MARK(14);
  const unsigned vecs = src.row_bytes / 16u;
  for (unsigned i = threadIdx.x; i < units * vecs; i += Traits::block_threads) {
    const unsigned u = i / vecs, v = i - u * vecs, j = u / layers, l = u - j * layers;
    const location dst = sh.self_dst[j];
    if (dst != no_location)
      reinterpret_cast<int4*>(src.layer_pool[l] + static_cast<std::size_t>(dst) * src.row_bytes)[v] =
          reinterpret_cast<const int4*>(self_rows + static_cast<std::size_t>(u) * src.row_bytes)[v];
  }
}

/// Round trip 1 of entry t: its slot and length (checked by thread 0 into shared memory) and, in
/// the strided layout, the selection itself (read up to the stride, which is in bounds; entries
/// past the length are ignored). Needs only t < the batch buffers' capacity, not the batch
/// count, so the kernel issues it for the entry of a CTA's own index at kernel start, beside the
/// read of the count. Visible to the CTA after the next barrier.
template <class Traits, class OrderIndex>
__device__ __forceinline__ void read_entry_head(typename Traits::shared_storage& sh, const source_view<OrderIndex>& src,
                                                const batch_view& batch, unsigned t,
                                                row_index (&e)[Traits::entries_per_thread]) {
  constexpr int Block = Traits::block_threads;
  constexpr int KPT = Traits::entries_per_thread;
  constexpr int K = Traits::top_k;
  const int tid = static_cast<int>(threadIdx.x);
  const location_space space = src.space;
  const bool gathered = batch.gathered();
#pragma unroll
  for (int k = 0; k < KPT; ++k) e[k] = no_row;
  if (!gathered) {
    const row_index* strided = batch.selections + static_cast<std::size_t>(t) * batch.stride;
    const int readable = static_cast<int>(batch.stride) < K ? static_cast<int>(batch.stride) : K;
#pragma unroll
    for (int k = 0; k < KPT; ++k) {
      const int i = tid + k * Block;
      if (i < readable) e[k] = strided[i];
    }
  }
  if (tid == 0) {
    const int slot = batch.slots[t];
    const int len = batch.lengths != nullptr ? batch.lengths[t] : static_cast<int>(batch.stride);
    sh.sel = gathered ? batch.selection_ptrs[t] : batch.selections + static_cast<std::size_t>(t) * batch.stride;
    sh.out = gathered ? batch.location_ptrs[t] : batch.locations + static_cast<std::size_t>(t) * batch.stride;
    int code = status_ok, len_code = status_ok;
    long long value = 0;
    if (slot < 0 || static_cast<std::size_t>(slot) >= space.slots) {
      code = to_status(errc::unknown_request);
      value = slot;
    } else if (len < 0) {
      len_code = to_status(errc::size_mismatch);
      value = len;
    } else if (len > K) {
      len_code = to_status(errc::selection_too_long);
      value = len;
    } else if ((!gathered && static_cast<unsigned>(len) > batch.stride) ||
               (len > 0 && (sh.sel == nullptr || sh.out == nullptr))) {
      len_code = to_status(errc::size_mismatch);
      value = len;
    }
    sh.slot = slot;
    sh.length = code == status_ok && len_code == status_ok ? len : 0;
    sh.err_code = code;
    sh.len_code = len_code;
    sh.err_value = value;
    sh.bad_key = INT_MAX;
    sh.dup = 0;
    sh.miss_lo = INT_MAX;
    sh.miss_hi = INT_MIN;
    sh.live = 0;
    sh.frontier = 0;
    sh.count[0] = sh.count[1] = sh.count[2] = sh.count[3] = 0;
  }
}

/// resolve_metadata's answer when another CTA claimed the entry first (nothing was written).
constexpr unsigned entry_lost = ~0u;

template <class Traits, class OrderIndex>
__device__ unsigned resolve_metadata(typename Traits::shared_storage& sh, unsigned char* self_rows,
                                 const source_view<OrderIndex>& src, const workspace_view& ws, const batch_view& batch,
                                 unsigned t, unsigned C, unsigned epoch, const resolve_params& p,
                                 row_index (&e)[Traits::entries_per_thread], bool head_read, bool check_claim,
                                 std::uint32_t claim_old, std::uint32_t arrived) {
  constexpr int Block = Traits::block_threads;
  constexpr int KPT = Traits::entries_per_thread;
  constexpr int WPT = Traits::ways_per_thread;
  constexpr int B = Traits::hot_rows;
  constexpr int K = Traits::top_k;
  const int tid = static_cast<int>(threadIdx.x);
  const location_space space = src.space;

  // Round trip 1, unless the kernel read this entry's head with the batch count.
  const bool gathered = batch.gathered();
  if (!head_read) {
    read_entry_head<Traits>(sh, src, batch, t, e);
    __syncthreads();
  }
  DHISPARSE_RESOLVE_MARK(2);

  const bool in_range = sh.err_code == status_ok;  // the slot exists (liveness is read below)
  const int slot = in_range ? sh.slot : 0;
  const int len = sh.length;
  const row_index* const sel = sh.sel;
  location* const out = sh.out;
  const std::size_t hot_base = static_cast<std::size_t>(slot) * B;
  const std::size_t page_base = static_cast<std::size_t>(slot) * src.pages_per_request;

  // Round trip 2: everything that needs only the slot, issued together: liveness and frontier,
  // the duplicate check, the slot's hot rows and LRU order (staged in shared memory), the optional
  // map and host page table of every selected row (and, gathered, the selection).
  if (gathered) {
#pragma unroll
    for (int k = 0; k < KPT; ++k) {
      const int i = tid + k * Block;
      if (i < len) e[k] = sel[i];
    }
  }
  int g_opt[KPT], hp[KPT];
  OrderIndex way[KPT];
  if (in_range) {
    if (tid == 0) {
      sh.live = src.live[slot];
      sh.frontier = src.frontier[slot];
    }
    for (unsigned j = static_cast<unsigned>(tid); j < C; j += Block)  // the same request twice: both fail
      if (j != t && batch.slots[j] == sh.slot) sh.dup = 1;
    stage_hot_state<Traits>(sh, src.hot_row + hot_base, src.order + hot_base);
    // The rank bitmap starts empty (the sort buffers it shares are written only after this).
    for (int j = tid; j < 2 * Traits::sort_capacity; j += Block) sh.scratch.bits[j] = 0u;
    for (int j = tid; j < (K + 31) / 32; j += Block) sh.claimed[j] = 0u;
  }
  const std::size_t rev_base = static_cast<std::size_t>(slot) * static_cast<std::size_t>(src.max_rows);
#pragma unroll
  for (int k = 0; k < KPT; ++k) {
    const int i = tid + k * Block;
    g_opt[k] = -1;
    hp[k] = -1;
    way[k] = no_way<OrderIndex>;
    if (in_range && i < len && e[k] >= 0 && e[k] < src.max_rows) {
      const std::size_t pg = page_base + static_cast<std::size_t>(e[k]) / src.page_rows;
      g_opt[k] = src.optional_page[pg];
      hp[k] = src.host_page[pg];
      way[k] = src.way_of_row[rev_base + static_cast<std::size_t>(e[k])];
    }
  }
  // The CTA's claim of its own entry, issued at kernel start, is first needed here: nothing global
  // was written yet, so an entry another CTA claimed first is simply left to it. The count on
  // `done` issued before the claim has returned too: kept in shared memory, not in a register.
  if (check_claim && tid == 32) {
    sh.stolen = claim_old == epoch;
    sh.arrived = arrived;
  }
  __syncthreads();
  DHISPARSE_RESOLVE_MARK(3);
  if (check_claim && sh.stolen) return entry_lost;
  const bool slot_ok = in_range && sh.live != 0;
  const std::int64_t frontier = sh.frontier;

  // Validate and classify the selection (strided: entry i = tid + k * Block) with no memory
  // access: tail, ready optional page, hot way (reverse map), or missing.
  location loc[KPT];
  unsigned missing = 0, hit = 0;
  const std::int64_t tail_begin = frontier - static_cast<std::int64_t>(src.tail_rows);
#pragma unroll
  for (int k = 0; k < KPT; ++k) {
    const int i = tid + k * Block;
    const row_index x = e[k];
    loc[k] = no_location;
    if (slot_ok && i < len) {
      const auto chk = dhisparse::detail::check_entry(x, frontier, src.max_rows);
      if (chk != dhisparse::detail::entry_check::ok) {
        atomicMin(&sh.bad_key, (i << 2) | (chk == dhisparse::detail::entry_check::out_of_range ? 1 : 2));
      } else if (x != no_row) {
        if (x >= tail_begin) loc[k] = space.tail(static_cast<std::size_t>(slot), x);
        else if (g_opt[k] >= 0) loc[k] = space.optional(static_cast<std::size_t>(g_opt[k]), x);
        else if (way[k] != no_way<OrderIndex>) {
          loc[k] = space.hot(static_cast<std::size_t>(slot), way[k]);
          hit |= 1u << k;
          sh.is_hit[way[k]] = 1;  // read after the next barrier: the LRU order's non-hit positions
        } else {
          missing |= 1u << k;
        }
      }
    }
  }
  // A step with few misses is likely copied by this CTA (self copy), a block scan and two
  // barriers from now: start its rows' host reads into L2 here, so the copy's cp.async finds them
  // on their way (C = 128 at ~0 misses on the H200: the rows land 1.4 us sooner). The threads
  // with a miss bound the missing entries from below, so this never prefetches more than
  // self_copy_units rows x layers. The count is also the barrier that makes classification's
  // shared flags (bad_key, err_code, ...) visible to the status check below: never skip it.
  const int missing_threads = __syncthreads_count(missing != 0u);
  if (missing != 0u && static_cast<unsigned>(missing_threads) * p.layers_to_copy <= p.self_copy_units) {
    const std::uint64_t layer_host_stride = static_cast<std::uint64_t>(src.page_rows) * src.row_bytes;
#pragma unroll
    for (int k = 0; k < KPT; ++k)
      if ((missing >> k) & 1u) {
        const std::byte* row = src.host_store + host_row_offset(src, hp[k], e[k]);
        for (unsigned l = 0; l < p.layers_to_copy; ++l) prefetch_host_row(row + l * layer_host_stride, src.row_bytes);
      }
  }
  DHISPARSE_RESOLVE_MARK(4);

  // Status, identical in every thread. Priority as the host: slot, duplicate, length, entries.
  {
    int code = sh.err_code;
    if (code == status_ok && !slot_ok) {
      code = to_status(errc::unknown_request);
      if (tid == 0) sh.err_value = sh.slot;
    }
    const bool entry_fault = code == status_ok && !sh.dup && sh.len_code == status_ok && sh.bad_key != INT_MAX;
    if (code == status_ok && sh.dup) code = to_status(errc::duplicate_in_batch);
    if (code == status_ok) code = sh.len_code;
    if (entry_fault)
      code = to_status((sh.bad_key & 3) == 1 ? errc::position_out_of_range : errc::position_beyond_frontier);
    if (code != status_ok) {
      if (tid == 0) {
        entry_error rec;
        rec.code = code;
        rec.epoch = epoch;
        rec.slot = sh.slot;
        rec.frontier = sh.frontier;
        rec.value = sh.err_value;
        if (code == to_status(errc::duplicate_in_batch)) rec.value = sh.slot;
        if (entry_fault) {
          rec.index = sh.bad_key >> 2;
          rec.value = sel[rec.index];
        }
        record_error(ws, t, rec);
        ws.stats[t] = entry_stats{};
        publish_ready(ws.ready[t], ready_word(epoch, 0, true), ::cuda::memory_order_release);
      }
      return 0;  // uniform across the CTA
    }
  }

  // Locations of direct entries, hits and padding; hits protect their ways. The counts go to
  // shared memory at once (barriers below order them before the stats are read), so no registers
  // are held through ranking and the LRU work.
  unsigned n_miss = 0;
  {
    unsigned n_sel = 0, n_dir = 0, n_hot = 0, n_host = 0;
#pragma unroll
    for (int k = 0; k < KPT; ++k) {
      const int i = tid + k * Block;
      if (i < len) {
        if (e[k] != no_row) ++n_sel;
        if ((hit >> k) & 1u) ++n_hot;
        if (!((missing >> k) & 1u)) {
          out[i] = loc[k];
          if (e[k] != no_row && !((hit >> k) & 1u)) ++n_dir;
        } else {
          ++n_host;
        }
      }
    }
    n_sel = warp_sum(n_sel);
    n_dir = warp_sum(n_dir);
    n_hot = warp_sum(n_hot);
    n_host = warp_sum(n_host);
    if ((tid & 31) == 0) {
      atomicAdd(&sh.count[0], n_sel);
      atomicAdd(&sh.count[1], n_dir);
      atomicAdd(&sh.count[2], n_hot);
      atomicAdd(&sh.count[3], n_host);
    }
  }

  // Missing entries (with repeats): their ordinals (scan), count and row span.
  int ordinal = 0, raw = 0;  // raw is uniform: the aggregate reaches every thread
  unsigned non_hit = 0;            // bit k: order position tid * WPT + k holds no selected row
  int non_hit_before = 0, non_hits = 0;  // non-hit positions before this thread's first; in all
  {
    int lo = INT_MAX, hi = INT_MIN;
#pragma unroll
    for (int k = 0; k < KPT; ++k)
      if ((missing >> k) & 1u) {
        lo = e[k] < lo ? e[k] : lo;
        hi = e[k] > hi ? e[k] : hi;
      }
    lo = __reduce_min_sync(0xffffffffu, lo);
    hi = __reduce_max_sync(0xffffffffu, hi);
    if ((tid & 31) == 0 && lo <= hi) {
      atomicMin(&sh.miss_lo, lo);
      atomicMax(&sh.miss_hi, hi);
    }
    // Scanned with them: the non-hit positions among this thread's part of the slot's LRU order
    // (every hit's flag was set before the count's barrier), for the LRU partition below.
#pragma unroll
    for (int k = 0; k < WPT; ++k) {
      const int q = tid * WPT + k;
      if (q < B && !sh.is_hit[sh.ord[q]]) non_hit |= 1u << k;
    }
    // Both counts in one word, the non-hit positions above the missing entries' bits: neither
    // field's total can carry into the other.
    constexpr int shift = Traits::miss_count_bits;
    constexpr unsigned low = (1u << shift) - 1u;
    const unsigned counts = (static_cast<unsigned>(__popc(non_hit)) << shift) | static_cast<unsigned>(__popc(missing));
    unsigned before = 0, total = 0;
    typename Traits::count_pair_scan_t(sh.count_pair_scan).ExclusiveSum(counts, before, total);
    ordinal = static_cast<int>(before & low);
    raw = static_cast<int>(total & low);
    non_hit_before = static_cast<int>(before >> shift);
    non_hits = static_cast<int>(total >> shift);
  }
  plan_entry* const plan = ws.plan + static_cast<std::size_t>(t) * K;
  plan_entry* const early_plan = ws.early_plan + static_cast<std::size_t>(t) * K;
  const unsigned units = static_cast<unsigned>(raw) * p.layers_to_copy;  // early and self; ranked: set below
  // Few copies: this CTA makes them itself (no publication for other CTAs to wait on), their host
  // reads in flight while the misses are ranked and the LRU order is rewritten.
  const bool self_copy = units <= p.self_copy_units && units <= Traits::self_copy_max_units;
  const bool early = !self_copy && C <= p.early_copy_max_batch;
#ifdef DHISPARSE_RESOLVE_TEST_LATE_EARLY_SOURCES_NS
  if (early) {
    if (tid == 0 && raw > 0) {
      const unsigned long long reads = DHISPARSE_RESOLVE_TEST_EARLY_READS();
      publish_ready(ws.ready[t], ready_word(epoch, units, false), ::cuda::memory_order_relaxed);
      unsigned long long start, now;
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
      do {
        __nanosleep(256);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
      } while (DHISPARSE_RESOLVE_TEST_EARLY_READS() == reads &&
               now - start < DHISPARSE_RESOLVE_TEST_LATE_EARLY_SOURCES_NS);
    }
    __syncthreads();
  }
#endif
  if (early || self_copy) {  // copy sources in selection order, repeats included (their copies are dropped later)
    int pos = ordinal;
#pragma unroll
    for (int k = 0; k < KPT; ++k)
      if ((missing >> k) & 1u) {
        const std::uint64_t host_offset = host_row_offset(src, hp[k], e[k]);
        if (self_copy) {
          sh.self_src[pos] = host_offset;
        } else {
          // Read by copy CTAs before this entry publishes `placed`: an atomic store, so a reader
          // sees this launch's offset or an earlier one (every one a valid offset), never a torn one.
          ::cuda::atomic_ref<std::uint64_t, ::cuda::thread_scope_device>(early_plan[pos].host_offset)
              .store(host_offset, ::cuda::memory_order_relaxed);
          early_plan[pos].row = e[k];
        }
        ++pos;
      }
  }
  __syncthreads();
  DHISPARSE_RESOLVE_MARK(5);
  if (self_copy) {
    // Nothing for the copy CTAs: they may go as soon as they see it (a relaxed store suffices, they
    // read nothing else of this entry).
    if (tid == 0)
      publish_ready(ws.ready[t], ready_word(epoch, 0, true), ::cuda::memory_order_relaxed);
    self_copy_fetch<Traits>(sh, self_rows, src, units, p.layers_to_copy);
  }
  // Early copies: the count alone, with no fence (the fence stalled the whole CTA at its next
  // barrier). A copy CTA may read a source before it lands; it checks every source again once
  // `placed` (published with a fence) is seen, and fetches the row again if it changed.
  if (early && tid == 0 && raw > 0)
    publish_ready(ws.ready[t], ready_word(epoch, units, false), ::cuda::memory_order_relaxed);
  const int miss_lo = sh.miss_lo;
  const miss_ranking ranking =
      raw <= 32 ? miss_ranking::warp : ranks_by_bitmap<Traits>(sh, raw) ? miss_ranking::bitmap : miss_ranking::sort;
  if (raw > 0) {
    int pos = ordinal;
#pragma unroll
    for (int k = 0; k < KPT; ++k)
      if ((missing >> k) & 1u) {
        if (ranking == miss_ranking::bitmap) {
          const unsigned bit = static_cast<unsigned>(e[k] - miss_lo);
          atomicOr(&sh.scratch.bits[bit >> 5], 1u << (bit & 31u));
        } else {
          sh.scratch.sort.key[pos] = e[k];
          sh.scratch.sort.page[pos] = hp[k];
        }
        ++pos;
      }
    __syncthreads();
  }

  unsigned published_units = early ? units : 0u;  // self copy: 0, published above
  if (__syncthreads_or(hit != 0 || raw != 0)) {  // otherwise every entry was direct: no hot-cache work
    // Distinct missing rows, ascending (address order), into miss_key/miss_page.
    int M = 0;
    if (ranking == miss_ranking::warp) M = rank_misses_in_warp<Traits>(sh, raw);
    else if (ranking == miss_ranking::bitmap) M = rank_misses_by_bitmap<Traits, KPT>(sh, miss_lo, missing, e, hp);
    else M = rank_misses_by_sorting<Traits>(sh, raw);
    DHISPARSE_RESOLVE_MARK(6);

    // The plan of distinct rows, ascending (follower layers replay it). Without early copies it is
    // published before the LRU work: idle CTAs start reading the rows over PCIe while this CTA
    // chooses their destinations.
    for (int r = tid; r < M; r += Block) {
      const int row = sh.miss_key[r];
      plan[r].host_offset = host_row_offset(src, sh.miss_page[r], row);
      plan[r].row = row;
    }
    if (!early && !self_copy) {
      published_units = static_cast<unsigned>(M) * p.layers_to_copy;
      __syncthreads();
      if (tid == 0) {
        __threadfence();
        publish_ready(ws.ready[t], ready_word(epoch, published_units, false), ::cuda::memory_order_release);
      }
    }

    // LRU partition: [untouched] ++ [hits] ++ [victims], each in old order; the r-th distinct
    // missing row takes the r-th non-hit way of the old order.
    OrderIndex od[WPT];
#pragma unroll
    for (int k = 0; k < WPT; ++k) {
      const int q = tid * WPT + k;
      od[k] = q < B ? static_cast<OrderIndex>(sh.ord[q]) : OrderIndex(0);
    }
    const unsigned nh = non_hit;
    int rank = non_hit_before;
    const int NH = non_hits;
    __syncthreads();  // every thread read its old positions before any is rewritten
    DHISPARSE_RESOLVE_MARK(12);
    const int H = B - NH;
    const int kept = NH - M;
#pragma unroll
    for (int k = 0; k < WPT; ++k) {
      const int q = tid * WPT + k;
      if (q < B) {
        const int w = static_cast<int>(od[k]);
        int at;
        if ((nh >> k) & 1u) {
          const int r = rank++;
          if (r < M) {
            at = kept + H + r;
            const int row = sh.miss_key[r];
            const int old = sh.hot[w];
            if (old >= 0) src.way_of_row[rev_base + static_cast<std::size_t>(old)] = no_way<OrderIndex>;
            src.way_of_row[rev_base + static_cast<std::size_t>(row)] = static_cast<OrderIndex>(w);
            src.hot_row[hot_base + w] = row;
            sh.victim[r] = w;
            plan[r].dst = space.hot(static_cast<std::size_t>(slot), static_cast<std::size_t>(w));
          } else {
            at = r - M;
          }
        } else {
          at = kept + (q - rank);  // hits before q = q - (non-hits before q)
        }
        // The new order is built in shared memory (every thread read its old positions before the
        // barrier above) and written back whole: scattered 2-byte stores to HBM crawl while host
        // reads are in flight.
        sh.ord[at] = static_cast<typename Traits::order_t>(w);
      }
    }
    __syncthreads();
    block_copy_array<Block>(src.order + hot_base, sh.ord, B);
    DHISPARSE_RESOLVE_MARK(7);

    // Missing entries: find their row among the distinct misses (bitmap rank, else binary search)
    // for its way. An early copy takes the destination too, once per distinct row (a repeat's copy
    // is dropped).
    int pos = ordinal;
#pragma unroll
    for (int k = 0; k < KPT; ++k) {
      if ((missing >> k) & 1u) {
        const int lo = ranks_by_bitmap<Traits>(sh, raw) ? bitmap_rank<Traits>(sh, sh.miss_lo, e[k])
                                                        : last_at_or_below(sh.miss_key, M, e[k]);
        const location at = space.hot(static_cast<std::size_t>(slot), static_cast<std::size_t>(sh.victim[lo]));
        out[tid + k * Block] = at;
        if (early || self_copy) {
          const unsigned bit = 1u << (lo & 31);
          const location dst = (atomicOr(&sh.claimed[lo >> 5], bit) & bit) == 0 ? at : no_location;
          if (self_copy) sh.self_dst[pos] = dst;
          else early_plan[pos].dst = dst;
        }
        ++pos;
      }
    }
    n_miss = static_cast<unsigned>(M);
  }
  DHISPARSE_RESOLVE_MARK(13);

  // Stats and publication.
  __syncthreads();
  if (tid == 0) {
    entry_stats st;
    st.selected = sh.count[0];
    st.direct = sh.count[1];
    st.hot = sh.count[2];
    st.host = sh.count[3];
    st.rows_copied = n_miss;
    st.layers_copied = p.layers_to_copy;
    ws.stats[t] = st;
    entry_error rec;
    rec.epoch = epoch;
    rec.slot = slot;
    rec.frontier = frontier;
    ws.errors[t] = rec;
  }
  // The barrier orders every thread's plan writes before thread 0's device-scope release, which
  // is cumulative: one fence publishes the whole CTA's writes.
  __syncthreads();
  if (self_copy) {
    if (units > 0) self_copy_store<Traits>(sh, self_rows, src, units, p.layers_to_copy);
    DHISPARSE_RESOLVE_MARK(8);
    return 0;  // published when classified
  }
  if (tid == 0) {
    __threadfence();
    publish_ready(ws.ready[t], ready_word(epoch, published_units, true), ::cuda::memory_order_release);
  }
  DHISPARSE_RESOLVE_MARK(8);
  return published_units;
}

// --------------------------------------------------------------------------------------------
// copy phase (whole CTA)

template <class Traits, class OrderIndex>
__device__ void resolve_copies(typename Traits::shared_storage& sh, unsigned* prefix, const source_view<OrderIndex>& src,
                               const workspace_view& ws, unsigned C, unsigned epoch, const resolve_params& p) {
  constexpr int Block = Traits::block_threads;
  constexpr unsigned warps = Block / 32;
  constexpr unsigned RM = Traits::max_rows_per_warp;
  const unsigned tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
  const bool early = C <= p.early_copy_max_batch;
  const unsigned want_warps = early ? p.early_copy_warps : p.copy_warps;
  const unsigned want_rows = early ? p.early_rows_per_warp : p.rows_per_warp;
  const unsigned copy_warps = want_warps == 0 || want_warps > warps ? warps : want_warps;
  const unsigned R = want_rows == 0 || want_rows > RM ? RM : want_rows;
  // An early-copy warp claims its first group before it waits for the entries' counts, so the
  // claim's round trip overlaps the wait instead of following it. A claim past the total is
  // dropped like any other; the cursor is reset with the launch's other counters.
  unsigned first_claim = 0;
  if (early && warp < copy_warps && lane == 0) first_claim = atomicAdd(&ws.control->copy_cursor, R);

  // Wait until every entry of this launch has published its copies' sources and count (every
  // entry was claimed by a CTA that is running, and metadata never waits, so this terminates
  // whatever other streams occupy), and build the
  // exclusive prefix of their copy units in the same warp as the counts arrive: the other warps
  // wait at one barrier instead of taking part in a block-wide scan.
  if (warp == 0) {
    unsigned running = 0;
    for (unsigned c0 = 0; c0 < C; c0 += 32) {
      const unsigned e = c0 + lane;
      const unsigned units = e < C ? ready_units(wait_ready(ws.ready, e, epoch, false)) : 0u;
      unsigned before = 0, chunk = 0;
      typename Traits::warp_scan_t(sh.warp_scan).ExclusiveSum(units, before, chunk);
      if (e < C) prefix[e] = running + before;
      running += chunk;
    }
    if (lane == 0) prefix[C] = running;
  }
  __syncthreads();
  DHISPARSE_RESOLVE_MARK(9);
  const unsigned total = prefix[C];
  DHISPARSE_RESOLVE_MARK(10);
  if (total == 0) return;

  if (warp >= copy_warps) return;
  const unsigned vecs = src.row_bytes / 16u;
  const std::uint64_t layer_host_stride = static_cast<std::uint64_t>(src.page_rows) * src.row_bytes;
  const unsigned layers = p.layers_to_copy;
  const unsigned stride = gridDim.x * copy_warps * R;
  const plan_entry* const copy_plan = early ? ws.early_plan : ws.plan;
  // One group of R units: the first chunk of every row is fetched before the destinations are
  // known, then the warp waits for its entries' `placed` bit. Early copies return the claim
  // cursor as read once `placed` was seen (0 otherwise): at or past `total`, every group has been
  // claimed and the warp can leave without another claim's round trip at the end of the step.
  const auto copy_group = [&](unsigned u0) -> unsigned {
    const int4* s[RM];
    unsigned ent[RM], idx[RM], lay[RM];
    unsigned cnt = 0;
#pragma unroll
    for (unsigned k = 0; k < RM; ++k) {
      const unsigned u = u0 + k;
      s[k] = nullptr;
      ent[k] = idx[k] = lay[k] = 0;
      if (k < R && u < total) {
        const unsigned e = last_at_or_below(prefix, C, u);  // the entry holding unit u
        const unsigned local = u - prefix[e];
        const unsigned m = local / layers, l = local - m * layers;
        const plan_entry* at = copy_plan + static_cast<std::size_t>(e) * Traits::top_k + m;
        // Early plans are published without a fence: read the source atomically (validated below).
        const std::uint64_t offset =
            early ? ::cuda::atomic_ref<const std::uint64_t, ::cuda::thread_scope_device>(at->host_offset)
                        .load(::cuda::memory_order_relaxed)
                  : load_plan(at).host_offset;
        s[k] = reinterpret_cast<const int4*>(src.host_store + offset + l * layer_host_stride);
        ent[k] = e;
        idx[k] = m;
        lay[k] = l;
        ++cnt;
      }
    }
    const unsigned total_v = cnt * vecs;
    int4 buf[copy_vectors_per_lane];
    warp_load_chunk<RM>(s, total_v, vecs, lane, 0, buf);
    if (early && lane == 0 && cnt > 0) DHISPARSE_RESOLVE_TEST_EARLY_READ();
    int4* d[RM];
    bool refetch = false;
    unsigned cursor_seen = 0;
#pragma unroll
    for (unsigned k = 0; k < RM; ++k) {
      d[k] = nullptr;
      if (k < cnt) {
        wait_ready(ws.ready, ent[k], epoch, true);
        // In flight with the plan load below, used only after the stores.
        if (early && k == 0)
          cursor_seen = ::cuda::atomic_ref<std::uint32_t, ::cuda::thread_scope_device>(ws.control->copy_cursor)
                            .load(::cuda::memory_order_relaxed);
        const plan_entry pe = load_plan(copy_plan + static_cast<std::size_t>(ent[k]) * Traits::top_k + idx[k]);
        if (pe.dst != no_location)  // a repeated row of an early copy: another unit writes it
          d[k] = reinterpret_cast<int4*>(src.layer_pool[lay[k]] + static_cast<std::size_t>(pe.dst) * src.row_bytes);
        const int4* placed_src =
            reinterpret_cast<const int4*>(src.host_store + pe.host_offset + lay[k] * layer_host_stride);
        // Read before this launch's source landed. Each lane loaded the source itself, so lanes
        // may disagree; each reloads only its own vectors (no collective below depends on it).
        if (placed_src != s[k]) {
          s[k] = placed_src;
          refetch = true;
          DHISPARSE_RESOLVE_TEST_REFETCH();
        }
      }
    }
    if (refetch) warp_load_chunk<RM>(s, total_v, vecs, lane, 0, buf);
    warp_store_chunk<RM>(d, total_v, vecs, lane, 0, buf);
    for (unsigned v0 = copy_chunk_vectors; v0 < total_v; v0 += copy_chunk_vectors) {
      warp_load_chunk<RM>(s, total_v, vecs, lane, v0, buf);
      warp_store_chunk<RM>(d, total_v, vecs, lane, v0, buf);
    }
    return __shfl_sync(0xffffffffu, cursor_seen, 0);  // one answer for the whole warp
  };
  if (early) {
    // Small batches: warps claim groups from a counter, so the CTAs still busy with an entry's
    // metadata (they arrive last) do not hold back a share of the copies.
    unsigned u0 = __shfl_sync(0xffffffffu, first_claim, 0);
    for (;;) {
      if (u0 >= total) break;
      // The cursor only grows during a launch: once it reached `total`, a claim would fail.
      if (copy_group(u0) >= total) break;
      if (lane == 0) u0 = atomicAdd(&ws.control->copy_cursor, R);
      u0 = __shfl_sync(0xffffffffu, u0, 0);
    }
  } else {
    // Large batches: a CTA's warps take consecutive groups, so each SM reads neighbouring rows of
    // one request (host pages close together: friendlier to its translation caches); the grid
    // sweeps the address-ordered list one window at a time.
    for (unsigned u0 = (blockIdx.x * copy_warps + warp) * R; u0 < total; u0 += stride) copy_group(u0);
  }
}

// --------------------------------------------------------------------------------------------

/// Bytes of the metadata part of the resolver's shared memory (16-byte aligned).
template <class Traits>
__host__ __device__ constexpr std::size_t resolve_storage_bytes() {
  return (sizeof(typename Traits::shared_storage) + 15) / 16 * 16;
}

/// Offset of the self-copy rows in the resolver's shared memory: after the metadata storage and
/// the prefix of copy units (capacity + 1 entries).
template <class Traits>
__host__ __device__ constexpr std::size_t resolve_self_rows_offset(std::size_t capacity) {
  return resolve_storage_bytes<Traits>() + ((capacity + 1) * sizeof(unsigned) + 15) / 16 * 16;
}

/// `control_block::done` (low word) and `::epoch` (high word) as one 64-bit word (views.cuh).
__device__ __forceinline__ std::uint64_t& done_epoch_word(control_block* c) {
  return *reinterpret_cast<std::uint64_t*>(&c->done);
}

/// Device time in nanoseconds (%globaltimer).
__device__ __forceinline__ unsigned long long global_time_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

/// How long a CTA lets the CTA of an entry's own index claim it before taking it itself. Every
/// CTA of a grid that is resident at once starts within a few microseconds and its claim lands
/// two round trips later, so in an unloaded launch nothing is taken over; when other streams
/// hold SMs, an entry whose CTA is not running is resolved this much later instead of never.
constexpr unsigned long long steal_grace_ns = 8000;

/// Batches that fit the grid (C <= grid): claims, for the calling CTA, an entry that no CTA has
/// claimed yet in this launch, so that a CTA about to wait for every entry waits only for entries
/// claimed by CTAs that are running. Returns the entry, or C once every entry is claimed (a claim
/// is never given back in a launch). Unclaimed entries are left to their own CTAs until
/// `steal_grace_ns` after this CTA's start (`sh.start`), then taken. Uniform across the CTA.
template <class Traits>
__device__ unsigned steal_entry(typename Traits::shared_storage& sh, const workspace_view& ws, unsigned C,
                                unsigned epoch) {
  constexpr int Block = Traits::block_threads;
  for (;;) {
    if (threadIdx.x == 0) sh.unclaimed = INT_MAX;
    __syncthreads();
    for (unsigned j = threadIdx.x; j < C; j += Block)
      if (::cuda::atomic_ref<std::uint32_t, ::cuda::thread_scope_device>(ws.claim[j]).load(::cuda::memory_order_relaxed) !=
          epoch)
        atomicMin(&sh.unclaimed, static_cast<int>(j));
    __syncthreads();
    if (threadIdx.x == 0) {
      const int j = sh.unclaimed;
      int got = -1;  // look again
      if (j == INT_MAX) {
        got = static_cast<int>(C);
      } else if (global_time_ns() - sh.start < steal_grace_ns) {
        __nanosleep(256);
      } else if (atomicExch(&ws.claim[j], epoch) != epoch) {
        got = j;
      }
      sh.ticket = got;
    }
    __syncthreads();
    const int got = sh.ticket;
    if (got >= 0) return static_cast<unsigned>(got);
  }
}

template <class Traits, class OrderIndex>
__global__ void __launch_bounds__(Traits::block_threads, Traits::min_blocks_per_sm)
    fused_resolve_kernel(source_view<OrderIndex> src, workspace_view ws, batch_view batch, resolve_params p) {
  extern __shared__ __align__(16) unsigned char dhisparse_resolve_smem[];
  auto& sh = *reinterpret_cast<typename Traits::shared_storage*>(dhisparse_resolve_smem);
  programmatic_launch_prologue();  // before any global read: the indexer may still be writing
  if (threadIdx.x == 0) sh.start = global_time_ns();  // nothing else writes it
  // When the batch fits the grid (C <= grid), entry t is first offered to CTA t (see "Forward
  // progress"): every CTA issues the reads of its entry's head (round trip 1) before it knows the
  // batch count, and uses them only if the batch turns out to fit the grid and its claim holds.
  const unsigned cap = batch.capacity < ws.capacity ? batch.capacity : ws.capacity;
  row_index e[Traits::entries_per_thread];
  const bool head_read = blockIdx.x < cap;
  if (head_read) read_entry_head<Traits>(sh, src, batch, blockIdx.x, e);
  // Thread 32 (another warp than the head's thread 0, so its loads are not issued behind them)
  // counts the CTA's arrival and reads the epoch in one atomic, beside the read of the count,
  // then claims the CTA's own entry; the claim's answer is first needed after round trip 2.
  std::uint32_t claim_old = 0, arrived = 0;
  if (threadIdx.x == 32) {
    // Relaxed: the epoch comes from the same read-modify-write that counts the arrival, so it
    // precedes the reset in that word's order (see the end of the kernel); no fence.
    const std::uint64_t word = ::cuda::atomic_ref<std::uint64_t, ::cuda::thread_scope_device>(done_epoch_word(ws.control))
                                   .fetch_add(1u, ::cuda::memory_order_relaxed);
    const unsigned requested = __ldcg(batch.count);
    const unsigned C = requested < cap ? requested : cap;
    const unsigned epoch = next_epoch(static_cast<unsigned>(word >> 32));
    arrived = static_cast<unsigned>(word);
    sh.batch_count = C;
    sh.epoch = epoch;
    if (blockIdx.x == 0 && requested > cap) {
      ::cuda::atomic_ref<std::uint32_t, ::cuda::thread_scope_device> ov(ws.control->overflow);
      std::uint32_t expected = 0;
      ov.compare_exchange_strong(expected, requested, ::cuda::memory_order_relaxed);
    }
    if (C <= gridDim.x && blockIdx.x < C) claim_old = atomicExch(&ws.claim[blockIdx.x], epoch);
  }
  __syncthreads();
  DHISPARSE_RESOLVE_MARK(0);
  const unsigned C = sh.batch_count, epoch = sh.epoch;
  // Self-copy rows live after the prefix of copy units.
  unsigned char* const self_rows = dhisparse_resolve_smem + resolve_self_rows_offset<Traits>(ws.capacity);

  // Early-copy batches with at least as many spare CTAs as entries: a CTA that took an entry
  // leaves every copy to the CTAs that took none (they claim until the cursor passes the total),
  // so it does not wait for the other entries' plans (C = 8 at ~0 misses: 15.1 -> 14.2 us on the
  // H200), and counts no departure: no round trip on `done` at its end.
  const bool entries_copy_nothing = C <= p.early_copy_max_batch && 2u * C <= gridDim.x;
  const bool by_index = C <= gridDim.x;
  const bool entry_cta = by_index && blockIdx.x < C;
  unsigned own_entries = 0, own_units = 0;  // entries this CTA resolved and the copy units they published
  // One call site for every way of taking an entry: the metadata code is inlined once (twice
  // doubled the kernel's code).
  //  * C <= grid: first the CTA's own index, if its claim held; then, unless this CTA copies
  //    nothing, entries no CTA has claimed (steal_entry), so no CTA waits for an entry whose CTA
  //    was never dispatched;
  //  * C > grid: entries drawn from the ticket counter by CTAs that run.
  bool own = entry_cta;
  for (;;) {
    unsigned t;
    if (own) {
      t = blockIdx.x;
    } else if (by_index) {
      if (entry_cta && entries_copy_nothing) break;
      t = steal_entry<Traits>(sh, ws, C, epoch);
    } else {
      __syncthreads();  // the previous entry is done with the shared ticket
      if (threadIdx.x == 0) sh.ticket = static_cast<int>(atomicAdd(&ws.control->ticket, 1u));
      __syncthreads();
      t = static_cast<unsigned>(sh.ticket);
    }
    if (t >= C) break;
    DHISPARSE_RESOLVE_MARK(1);
    const unsigned units = resolve_metadata<Traits, OrderIndex>(sh, self_rows, src, ws, batch, t, C, epoch, p, e,
                                                                own, own, claim_old, arrived);
    if (units != entry_lost) {
      own_units += units;
      ++own_entries;
    }
    own = false;
    __syncthreads();  // the entry's shared state is reused by the next claim
  }

  // The prefix of copy units lives after the metadata storage (capacity + 1 entries).
  unsigned* prefix = reinterpret_cast<unsigned*>(dhisparse_resolve_smem + resolve_storage_bytes<Traits>());
  // A CTA that resolved the whole batch knows it left nothing to copy without reading it back.
  const bool entry_only = entry_cta && entries_copy_nothing;
  if (!entry_only && (own_entries != C || own_units != 0))
    resolve_copies<Traits, OrderIndex>(sh, prefix, src, ws, C, epoch, p);

  __syncthreads();
  DHISPARSE_RESOLVE_MARK(11);
  // `done` counts every CTA's arrival (at its start, with the read of the epoch) and the departure
  // of every CTA but the entry-only ones (here, after its last use of a counter): 2 * grid - E
  // in all, E the entry-only CTAs. The CTA whose count completes that total resets the counters
  // and advances the epoch. So no CTA can start after the reset and read the next launch's epoch
  // (a CTA whose entry was taken over may start after everything else finished), and no counter
  // is reset while a CTA may still use it. An entry-only CTA whose arrival completed the total
  // (it started last) resets here: the others are done with the counters, and its own entry
  // touches none of them. Entry-only CTAs may still rewrite LRU state and store rows after the
  // reset: none of that touches the control block, and all of it is read in stream order.
  const unsigned total = 2u * gridDim.x - (entries_copy_nothing ? C : 0u);
  bool last = false;
  if (threadIdx.x == 32 && entry_only) {
    last = sh.arrived + 1u == total;  // its own write (resolve_metadata)
    // The departures it read (acq_rel, continued by relaxed arrivals) happen before the reset.
    if (last) ::cuda::atomic_thread_fence(::cuda::memory_order_acquire, ::cuda::thread_scope_device);
  } else if (threadIdx.x == 0 && !entry_only) {
    // The same 64-bit word as the arrivals (atomics of one size on one location); the count never
    // carries into the epoch (at most 2 * grid).
    ::cuda::atomic_ref<std::uint64_t, ::cuda::thread_scope_device> done(done_epoch_word(ws.control));
    last = static_cast<unsigned>(done.fetch_add(1u, ::cuda::memory_order_acq_rel)) + 1u == total;
  }
  if (last) {
    control_block* c = ws.control;
    c->ticket = 0;
    c->copy_cursor = 0;
    c->last_count = C;
    c->last_layers = p.layers_to_copy;
    // done = 0 and the next epoch, in one store of the word the arrivals read.
    ::cuda::atomic_ref<std::uint64_t, ::cuda::thread_scope_device>(done_epoch_word(c))
        .store(static_cast<std::uint64_t>(epoch) << 32, ::cuda::memory_order_relaxed);
  }
}

/// Bytes of the self-copy rows: self_copy_max_units rows of `row_bytes`, at most self_copy_max_bytes.
template <class Traits>
constexpr std::size_t self_copy_buffer_bytes(std::size_t row_bytes) {
  const std::size_t rows = Traits::self_copy_max_units * row_bytes;
  return rows < Traits::self_copy_max_bytes ? rows : Traits::self_copy_max_bytes;
}

/// Dynamic shared memory of the resolver for a workspace of `capacity` batch entries: the
/// metadata storage, the prefix of copy units and room for self_copy_max_units rows of
/// `row_bytes` (the widest row of any source).
template <class Traits>
constexpr std::size_t resolve_shared_bytes(std::size_t capacity, std::size_t row_bytes) {
  return resolve_self_rows_offset<Traits>(capacity) + self_copy_buffer_bytes<Traits>(row_bytes);
}

/// Copy units of `row_bytes` an entry may copy itself when the widest row is `widest_row_bytes`
/// (what the self-copy rows of resolve_shared_bytes hold).
template <class Traits>
constexpr unsigned self_copy_capacity(std::size_t widest_row_bytes, std::size_t row_bytes) {
  const std::size_t fit = self_copy_buffer_bytes<Traits>(widest_row_bytes) / row_bytes;
  return static_cast<unsigned>(fit < Traits::self_copy_max_units ? fit : Traits::self_copy_max_units);
}

/// One-time setup: opt in to the shared memory and compute the persistent grid
/// (SMs x resident CTAs per SM). Returns cudaErrorInvalidConfiguration when no CTA fits.
template <class Traits, class OrderIndex>
cudaError_t prepare_fused_resolve(int& grid, std::size_t capacity, std::size_t row_bytes) {
  grid = 0;
  int device = 0, sms = 0, optin = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (err != cudaSuccess) return err;
  const std::size_t smem = resolve_shared_bytes<Traits>(capacity, row_bytes);
  if (smem > static_cast<std::size_t>(optin)) return cudaErrorInvalidConfiguration;
  auto kernel = fused_resolve_kernel<Traits, OrderIndex>;
  // The attribute belongs to the kernel, not to one hierarchy: allow the device maximum, so a
  // later hierarchy of the same type with a smaller workspace cannot shrink this one's limit.
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, optin);
  if (err != cudaSuccess) return err;
  int per_sm = 0;
  err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, Traits::block_threads, smem);
  if (err != cudaSuccess) return err;
  if (per_sm <= 0) return cudaErrorInvalidConfiguration;
  grid = per_sm * sms;
  return cudaSuccess;
}

/// Launches one fused resolve over `batch` on `stream` (no allocation, no host synchronisation:
/// safe inside CUDA graph capture), with programmatic stream serialization when `programmatic`
/// (programmatic_launch.cuh).
template <class Traits, class OrderIndex>
cudaError_t launch_fused_resolve(const source_view<OrderIndex>& src, const workspace_view& ws, const batch_view& batch,
                                 const resolve_params& p, int grid, std::size_t shared_bytes, cudaStream_t stream,
                                 bool programmatic = false) {
  return launch_kernel(fused_resolve_kernel<Traits, OrderIndex>, dim3(static_cast<unsigned>(grid)),
                       dim3(Traits::block_threads), shared_bytes, stream, programmatic, src, ws, batch, p);
}

}  // namespace dhisparse::cuda::detail
