// Probe: the floor of a one-request (C = 1) resolve step with ~0 misses on this machine, measured
// the way bench_cuda_resolver measures it (CUDA events around one launch, L2 flushed by a 256 MiB
// memset before every launch, median of 200). Each kernel is one 1024-thread CTA doing only the
// dependent work any exact resolver must do, and nothing else:
//   index      read the slot and the 2048-entry selection, write 2048 locations (resident serving)
//   lookups    + per entry, dependent loads of its page-table entry and reverse-map entry
//   lru        + load the slot's 4096-entry LRU order, one block scan, write it back
//   copies     + copy 2 fresh 576-byte rows from pinned host memory into the pool after the lookups
//   no-lru     lookups and the 2 host rows, without the LRU scan
//   overlap    all of it, the host loads issued before the LRU scan (their latency hidden by it)
//   async      as overlap, the host rows fetched with cp.async into shared memory instead
//   bulk       as overlap, the host rows fetched with one bulk copy (TMA) each into shared memory,
//              completing on an mbarrier
//   page only  index + the page-table load per entry alone (no reverse map)
//   resolver   index + what the resolver's round trip 2 loads: per entry its page-table,
//              optional-map and reverse-map entries, and the slot's 4096 hot rows and LRU order
//              staged into shared memory
//   no rmap    the resolver's round trip 2 without the reverse map (what hit detection from the
//              staged hot rows would load)
//   sorted     the resolver's round trip 2 with hit detection from a sorted index of the slot's
//              hot rows instead of the reverse map: the index (rows ascending, 16 KiB, and their
//              ways, 8 KiB) staged whole beside the LRU order, then a binary search in shared
//              memory per entry (what an index kept sorted by every writer of the hot state would
//              cost the resolver's lookups; keeping it sorted is not measured)
//   hash       the resolver's round trip 2 with hit detection from a shared-memory hash of the
//              selection instead of the reverse map: every entry inserts its row (linear probing,
//              atomicCAS), every hot way looks its row up and leaves its way there, every entry
//              reads its slot's way; with two of its parts alone (clear and barriers; + inserts)
//   full       the resolver's round trip 2, then 2 host rows by plain loads overlapping the LRU
//              scan: the floor of an exact step on the resolver's own data layout
//   cluster    the full stage's lookups, hit flags and LRU scan for one request split over a
//              thread-block cluster of N CTAs (N SMs), exchanging hit flags and scan counts through
//              distributed shared memory; beside it the same code on one CTA without a cluster,
//              empty kernels with and without clusters, and the cluster barriers three ways: as
//              cooperative groups issues them (arrive.release: a thread's arrive waits for its
//              loads in flight, the host rows included), relaxed (timing only, not exact), and
//              exact without that wait (the threads that stored to other CTAs fence before they
//              issue a host load, or have none in flight; every arrive relaxed)
// Every stage runs twice: with the device arrays packed into one 2 MiB page of one allocation, and
// spread 16 MiB apart (as a hierarchy's per-slot arrays are: selection, page table, reverse map,
// LRU order and pool each in its own region of a large allocation, so each dependent load after
// the flush may need its own address translation). The difference is what co-locating a slot's
// state would buy the resolver. Measured on the H200 (2026-11-30, three runs, µs, packed / spread):
// index 3.78 / 3.74-3.78; + lookups 5.41-5.54 / 5.41-5.54; + LRU scan 6.69-6.82 / 6.75-6.85;
// + 2 host rows 10.08-10.24 / 10.24-10.43; no LRU 9.57-9.70 / 9.76-9.89; overlap 7.36-7.49 /
// 7.52-7.62. At most 0.3 µs apart: co-location would not buy the resolver anything measurable.
// The last three stages (H200, 2026-11-30, two runs, packed / spread): page table only
// 4.51-4.58 / 4.54-4.58; the resolver's round trip 2 6.78-6.82 / 6.78-6.82; without the
// reverse map 5.54-5.60 / 5.57-5.60. The reverse map's load per entry costs its round trip
// 1.2 µs: hit detection from the staged hot rows pays if it costs less than that.
// With a batch size C as argument, C CTAs run every stage at once, CTA b on request b's own copy
// of every array (selection, page tables, reverse map, LRU order, hot rows, its two host rows in
// its own 57.6 MB of pinned history): what C entries' dependent work costs together, HBM and
// host reads shared. H200, 2026-11-30, one run each, packed / spread, µs: C = 1: overlap 7.33 /
// 7.52, async 9.09 / 9.12, round trip 2 7.07 / 7.07, without the reverse map 5.92 / 5.95;
// C = 128: index 5.02 / 5.09, + lookups 11.14 / 11.20, + LRU scan 13.06 / 13.22, overlap
// 14.88 / 14.88, async 22.27 / 22.37, round trip 2 13.60 / 13.73, without the reverse map
// 8.19 / 8.38. So at C = 128 even this floor is above 10 µs, the reverse map's lookups cost
// 5.4 µs of HBM time, and cp.async from mapped host memory is much slower than plain loads
// (7.4 µs for the step's 256 rows; 1.8 µs at C = 1). Bulk copies sit between the two (H200,
// 2026-11-30, one run, packed / spread, µs): C = 1 overlap 7.49 / 7.71, async 9.02 / 9.25, bulk
// 8.16 / 8.19; C = 128 overlap 14.98 / 15.01, async 22.18 / 22.14, bulk 20.67 / 20.58.
// It is cp.async's .cg form (what __pipeline_memcpy_async emits for 16 bytes) that is slow
// (H200, 2026-11-30, one run, packed / spread, µs): C = 1 .cg 8.99 / 9.18, .L2::128B hint 8.99 /
// 9.18, .L2::256B hint 9.02 / 9.18, .ca 8.70 / 8.86, bulk L2 prefetch then .cg 9.02 / 9.18;
// C = 128 .cg 22.59 / 22.62, .L2::128B 22.66 / 23.07, .L2::256B 22.94 / 23.55, .ca 16.70 /
// 16.86, bulk prefetch then .cg 22.91 / 23.49 (overlap, i.e. plain loads, 14.85 / 14.78).
// The sorted index loses at small batches (H200, 2026-11-30, two runs, packed / spread, µs): C = 1
// round trip 2 with the reverse map 7.04-7.07 / 7.04-7.07, without it 5.92 / 5.95, with the
// binary search instead 9.47-9.57 / 9.44-9.54; C = 128 13.47 / 13.63, 8.06-8.10 / 8.26-8.29,
// 12.54 / 12.70-12.77. Twelve dependent shared-memory loads per entry, at scattered banks, cost
// one CTA more than the reverse map's one HBM round trip; at C = 128 it saves 1 µs of the 5.4.
// The selection hash loses more (H200, 2026-11-30, three runs, packed / spread, µs): C = 1 round
// trip 2 with it 12.58-12.83 / 12.74-13.06 against the reverse map's 6.98-7.14 / 6.98-7.14;
// clearing the table with its barriers alone 5.60-5.79 / 5.76-5.79, with the inserts 9.73-9.76 /
// 9.92-9.98; C = 128 15.23-15.42 / 15.30-15.46 against 13.47-13.66 / 13.63-13.79. At half load
// a probe sequence averages 1.5 slots but a warp waits for its longest lane (up to 21 slots for
// these rows), each step a dependent shared-memory atomic or load.
// The resolver's layout bounds its ~0-miss step (full stage, seven runs, packed / spread, µs):
// C = 1 8.70-9.09 / 8.70-9.15, C = 128 17.54-17.79 / 17.54-17.82. At C = 1 a 10 µs step leaves
// about 1 µs beyond it for all this floor omits: classifying tail, ready optional and hot rows,
// validation, ranking the misses without repeats, statistics, keeping the hot rows and reverse
// map current, destinations. At C = 128 the floor alone is above 10 µs, and so is the minimal
// layout's (host loads overlapping the LRU: 14.7).
// Splitting one request over a cluster (C = 1; H200, 2026-11-30, one run of two invocations, µs,
// ranges over both and over the packed and spread layouts, which agree within 0.2): the split code
// on one CTA without a cluster 10.02-10.08 (its real hit flags cost 1.1 µs over the full stage's
// 8.8-9.0); empty kernels 2.78-2.85, in clusters of 8 2.78-2.88, so a cluster launch costs
// nothing. With exact barriers that do not wait for the host loads: 1 CTA 10.91-10.98, 4 CTAs
// 7.33-7.65, 8 CTAs 7.14-7.33. Relaxed (not exact): 1 CTA 10.05-10.08, 8 CTAs 6.46-6.66.
// Cooperative groups' cluster.sync: 1 CTA 12.13-12.32, 2 CTAs 9.38-9.41, 4 CTAs 8.48-8.67,
// 8 CTAs 8.26-8.29, and 8.03-8.22 with the host loads moved after the last barrier. So an exact
// split of one request's dependent work over 8 SMs takes 2.8 µs off this floor (10.0 -> 7.2), as
// long as no thread's arrive waits for a host load. At C = 128 the probe is no guide: 64
// registers x 1024 threads fill an SM, so 128 clusters of 4 or 8 CTAs run in waves.
// Built with the CUDA benchmarks as probe_small_step_floor (CI compiles it); by hand:
//   nvcc -O3 -arch=sm_90 -std=c++17 -o small_step_floor benchmarks/probes/small_step_floor.cu
//   ./small_step_floor [C, default 1]
#include <cuda_runtime.h>
#include <cooperative_groups.h>
#include <cub/block/block_scan.cuh>
#include <cuda_pipeline.h>
#include <cuda/ptx>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <utility>
#include <vector>

#include "probe_timing.cuh"


constexpr int kBlock = 1024, kTopK = 2048, kHot = 4096, kRows = 100'000, kPageRows = 64, kRowBytes = 576;
constexpr int kPerThread = kTopK / kBlock, kWaysPerThread = kHot / kBlock;
constexpr int kPages = kRows / kPageRows + 1;  // page-table entries per request

struct state {
  const int* slot;             // [1] (request b of CTA b reads its arrays at slot + b)
  const int* selection;        // [kTopK]
  int* locations;              // [kTopK]
  const int* page_table;       // [kPages]
  const unsigned short* rmap;  // [kRows] hot way of each row, 0xFFFF if none
  unsigned short* order;       // [kHot]
  const int4* host;            // pinned, mapped: kRows rows per request
  int4* pool;                  // device rows
  const int* optional_map;     // [kPages]
  const int* hot_rows;         // [kHot]
  const int* sorted_rows;      // [kHot] the slot's hot rows ascending, INT_MAX past the last
  const unsigned short* sorted_ways;  // [kHot] the way of each sorted row
};

// One 16-byte cp.async of a host row into shared memory: stage 9 and 14 as the resolver issues it
// (__pipeline_memcpy_async), 11 and 12 with an L2 fetch-size hint of 128 or 256 bytes, 13
// allocating in L1 (.ca).
template <int Stage>
__device__ __forceinline__ void async_row_copy(int4* dst, const int4* src) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  if constexpr (Stage == 11)
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16;" ::"r"(d), "l"(src) : "memory");
  else if constexpr (Stage == 12)
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;" ::"r"(d), "l"(src) : "memory");
  else if constexpr (Stage == 13)
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src) : "memory");
  else
    __pipeline_memcpy_async(dst, src, 16);
}

// 0 index, 1 lookups, 2 lru, 3 copies, 4 lookups + copies (no LRU), 5 copies overlapping the LRU
// scan, 6 page table only, 7 the resolver's round trip 2, 8 the same without the reverse map,
// 9 as 5 with the host rows by cp.async, 10 as 5 by bulk copy, 11-13 as 9 with cp.async's L2
// fetch-size hints (128 B, 256 B) or L1 allocation, 14 as 9 after a bulk L2 prefetch of each row,
// 15 as 7 with a binary search of a staged sorted hot-row index instead of the reverse map,
// 16 as 7 with a shared-memory hash of the selection (4096 slots) instead of it, 17 and 18 its
// parts (the table cleared and the barriers only; + the selection's inserts), 19 the resolver's
// round trip 2, then the host loads overlapping the LRU scan (stage 5 on the resolver's layout)
template <int Stage>
__global__ void __launch_bounds__(kBlock) step(state s) {
  using scan_t = cub::BlockScan<int, kBlock>;
  __shared__ typename scan_t::TempStorage scan;
  __shared__ int miss_rows[2];
  __shared__ alignas(16) int hot_stage[kHot];
  __shared__ alignas(16) unsigned short order_stage[kHot];
  const int tid = threadIdx.x;
  const int slot = __ldcg(s.slot) + static_cast<int>(blockIdx.x);
  const std::size_t pages_base = static_cast<std::size_t>(slot) * kPages;
  s.locations += static_cast<std::size_t>(slot) * kTopK;
  s.page_table += pages_base;
  s.optional_map += pages_base;
  s.rmap += static_cast<std::size_t>(slot) * kRows;
  s.order += static_cast<std::size_t>(slot) * kHot;
  s.hot_rows += static_cast<std::size_t>(slot) * kHot;
  s.sorted_rows += static_cast<std::size_t>(slot) * kHot;
  s.sorted_ways += static_cast<std::size_t>(slot) * kHot;
  s.pool += static_cast<std::size_t>(slot) * 2 * (kRowBytes / 16);
  int e[kPerThread], loc[kPerThread];
  for (int k = 0; k < kPerThread; ++k) e[k] = __ldcg(s.selection + slot * kTopK + tid + k * kBlock);
  for (int k = 0; k < kPerThread; ++k) loc[k] = e[k];
  if ((Stage >= 6 && Stage <= 8) || Stage == 19) {
    int page[kPerThread], opt[kPerThread];
    unsigned way[kPerThread];
    for (int k = 0; k < kPerThread; ++k) {
      page[k] = __ldcg(s.page_table + e[k] / kPageRows);
      opt[k] = Stage >= 7 ? __ldcg(s.optional_map + e[k] / kPageRows) : -1;
      way[k] = Stage == 7 || Stage == 19 ? __ldcg(s.rmap + e[k]) : 0xFFFFu;
    }
    if (Stage >= 7) {
      reinterpret_cast<int4*>(hot_stage)[tid] = __ldcg(reinterpret_cast<const int4*>(s.hot_rows) + tid);
      if (tid < kHot / 8) reinterpret_cast<int4*>(order_stage)[tid] = __ldcg(reinterpret_cast<const int4*>(s.order) + tid);
    }
    __syncthreads();
    for (int k = 0; k < kPerThread; ++k)
      loc[k] = Stage == 6 ? page[k] : way[k] != 0xFFFFu ? static_cast<int>(way[k]) : opt[k] >= 0 ? opt[k] : page[k] + hot_stage[(tid + k) % kHot] +
                                                                                     order_stage[(tid + 3 * k) % kHot];
  } else if (Stage == 15) {
    __shared__ alignas(16) unsigned short sorted_way_stage[kHot];
    int page[kPerThread], opt[kPerThread];
    for (int k = 0; k < kPerThread; ++k) {
      page[k] = __ldcg(s.page_table + e[k] / kPageRows);
      opt[k] = __ldcg(s.optional_map + e[k] / kPageRows);
    }
    reinterpret_cast<int4*>(hot_stage)[tid] = __ldcg(reinterpret_cast<const int4*>(s.sorted_rows) + tid);
    if (tid < kHot / 8) {
      reinterpret_cast<int4*>(order_stage)[tid] = __ldcg(reinterpret_cast<const int4*>(s.order) + tid);
      reinterpret_cast<int4*>(sorted_way_stage)[tid] = __ldcg(reinterpret_cast<const int4*>(s.sorted_ways) + tid);
    }
    __syncthreads();
    for (int k = 0; k < kPerThread; ++k) {
      int at = 0;  // lower bound of e[k] among the sorted rows (kHot a power of two)
#pragma unroll
      for (int half = kHot / 2; half > 0; half /= 2)
        if (hot_stage[at + half - 1] < e[k]) at += half;
      const bool hit = hot_stage[at] == e[k];
      loc[k] = hit ? static_cast<int>(sorted_way_stage[at]) : opt[k] >= 0 ? opt[k] : page[k] + order_stage[(tid + 3 * k) % kHot];
    }
  } else if (Stage >= 16) {
    // Hit detection without the reverse map: the selection's rows go into a shared-memory hash
    // (linear probing; each entry keeps the slot it took), every hot way looks its row up there
    // and leaves its way in the row's slot, and each entry reads its slot's way.
    constexpr int kSlotBits = 12, kSlots = 1 << kSlotBits;
    __shared__ int hash_key[kSlots];  // the hot rows stay in registers: no hot_stage here
    __shared__ unsigned short hash_way[kSlots];
    const auto home = [](int row) { return static_cast<int>((static_cast<unsigned>(row) * 2654435761u) >> (32 - kSlotBits)); };
    int page[kPerThread], opt[kPerThread];
    for (int k = 0; k < kPerThread; ++k) {
      page[k] = __ldcg(s.page_table + e[k] / kPageRows);
      opt[k] = __ldcg(s.optional_map + e[k] / kPageRows);
    }
    const int4 hot4 = __ldcg(reinterpret_cast<const int4*>(s.hot_rows) + tid);  // ways 4 tid .. 4 tid + 3
    if (tid < kHot / 8) reinterpret_cast<int4*>(order_stage)[tid] = __ldcg(reinterpret_cast<const int4*>(s.order) + tid);
    for (int j = tid; j < kSlots; j += kBlock) {
      hash_key[j] = -1;
      hash_way[j] = 0xFFFFu;
    }
    __syncthreads();
    int at[kPerThread] = {};
    if constexpr (Stage != 17) {  // 17: the clearing and barriers alone
      for (int k = 0; k < kPerThread; ++k) {
        int h = home(e[k]);
        for (;;) {
          const int prev = atomicCAS(&hash_key[h], -1, e[k]);
          if (prev == -1 || prev == e[k]) break;
          h = (h + 1) & (kSlots - 1);
        }
        at[k] = h;
      }
    }
    __syncthreads();
    if constexpr (Stage == 16) {  // 18: the inserts without the hot ways' lookups
      const int held[4] = {hot4.x, hot4.y, hot4.z, hot4.w};
      for (int j = 0; j < 4; ++j) {
        const int row = held[j];
        if (row < 0) continue;
        for (int h = home(row);; h = (h + 1) & (kSlots - 1)) {
          const int key = hash_key[h];
          if (key == row) hash_way[h] = static_cast<unsigned short>(4 * tid + j);
          if (key == row || key == -1) break;
        }
      }
    }
    __syncthreads();
    for (int k = 0; k < kPerThread; ++k) {
      const unsigned way = hash_way[at[k]];
      loc[k] = way != 0xFFFFu ? static_cast<int>(way) : opt[k] >= 0 ? opt[k] : page[k] + order_stage[(tid + 3 * k) % kHot];
    }
  } else if (Stage >= 1) {
    for (int k = 0; k < kPerThread; ++k) {
      const int page = __ldcg(s.page_table + e[k] / kPageRows);
      const unsigned way = __ldcg(s.rmap + e[k]);
      loc[k] = way != 0xFFFFu ? static_cast<int>(way) : page;
    }
  }
  const int warp = tid >> 5, lane = tid & 31;
  // The two rows the lookups found missing, in this request's history: one per warp 0 and 1.
  const auto pick_missing_rows = [&] {
    if (tid < 2) miss_rows[tid] = slot * kRows + loc[0] % kRows;
    __syncthreads();
  };
  int4 row_buf[2] = {};
  if (Stage == 5 || Stage == 19) {  // host loads first: their latency overlaps the LRU scan below
    pick_missing_rows();
    if (warp < 2)
      for (int v = lane, i = 0; v < kRowBytes / 16; v += 32, ++i)
        row_buf[i] = s.host[static_cast<size_t>(miss_rows[warp]) * (kRowBytes / 16) + v];
  }
  __shared__ alignas(16) int4 async_rows[2][kRowBytes / 16];
  __shared__ std::uint64_t bulk_done;  // stage 10: the bulk copies' mbarrier
  if (Stage == 10) {  // as stage 5, through bulk copies (TMA) into shared memory
    if (tid == 0) {
      cuda::ptx::mbarrier_init(&bulk_done, 1);
      cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);
    }
    pick_missing_rows();
    if (tid == 0) cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta, cuda::ptx::space_shared, &bulk_done, 2 * kRowBytes);
    if (tid < 2)
      cuda::ptx::cp_async_bulk(cuda::ptx::space_cluster, cuda::ptx::space_global, &async_rows[tid][0],
                               s.host + static_cast<size_t>(miss_rows[tid]) * (kRowBytes / 16), kRowBytes, &bulk_done);
  }
  if (Stage == 9 || (Stage >= 11 && Stage <= 14)) {  // as stage 5, through cp.async into shared memory
    pick_missing_rows();
    if (Stage == 14 && tid < 2)  // the resolver's way: a bulk L2 prefetch of each row first
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(s.host + static_cast<size_t>(miss_rows[tid]) * (kRowBytes / 16)),
                   "r"(kRowBytes) : "memory");
    if (warp < 2)
      for (int v = lane; v < kRowBytes / 16; v += 32)
        async_row_copy<Stage>(&async_rows[warp][v], s.host + static_cast<size_t>(miss_rows[warp]) * (kRowBytes / 16) + v);
    __pipeline_commit();
  }
  if ((Stage >= 2 && Stage != 4 && Stage < 6) || (Stage >= 9 && Stage <= 14) || Stage == 19) {
    unsigned short od[kWaysPerThread];
    int mine = 0;
    for (int k = 0; k < kWaysPerThread; ++k) {
      od[k] = __ldcg(s.order + tid * kWaysPerThread + k);
      mine += od[k] & 1;
    }
    int before = 0;
    scan_t(scan).ExclusiveSum(mine, before);
    for (int k = 0; k < kWaysPerThread; ++k) s.order[(tid * kWaysPerThread + k + before) % kHot] = od[k];
  }
  if (Stage >= 9 && Stage <= 14) {  // the rows fetched into shared memory, once landed, to the pool
    if (Stage == 10) {
      while (!cuda::ptx::mbarrier_try_wait_parity(&bulk_done, 0u)) {
      }
    } else {
      __pipeline_wait_prior(0);
    }
    if (warp < 2)
      for (int v = lane; v < kRowBytes / 16; v += 32) s.pool[static_cast<size_t>(warp) * (kRowBytes / 16) + v] = async_rows[warp][v];
  }
  if ((Stage == 5 || Stage == 19) && warp < 2)
    for (int v = lane, i = 0; v < kRowBytes / 16; v += 32, ++i) s.pool[static_cast<size_t>(warp) * (kRowBytes / 16) + v] = row_buf[i];
  if (Stage == 3 || Stage == 4) {
    pick_missing_rows();
    if (warp < 2) {
      const int4* src = s.host + static_cast<size_t>(miss_rows[warp]) * (kRowBytes / 16);
      int4* dst = s.pool + static_cast<size_t>(warp) * (kRowBytes / 16);
      for (int v = lane; v < kRowBytes / 16; v += 32) dst[v] = src[v];
    }
  }
  for (int k = 0; k < kPerThread; ++k) s.locations[tid + k * kBlock] = loc[k];
}

// The full stage's work with each request's entry split over a cluster of N CTAs (N SMs): CTA
// rank r looks up selection entries [r K/N, (r+1) K/N) and owns LRU positions [r B/N, (r+1) B/N).
// A hit marks its way in every CTA's shared flags (distributed shared memory), so each CTA counts
// the non-hit ways of its own positions from real hit flags (the full stage counts stand-in
// flags); the CTAs' counts are exchanged the same way for the cluster-wide prefix. Rank 0 loads
// and stores the two host rows, overlapping the scan. N = 0 (step_unclustered) is the same code
// on one CTA with block barriers and no cluster launch.

// Sets the byte at `local`'s offset in the shared memory of the cluster's CTA `rank` to 1.
__device__ __forceinline__ void mark_in_cta(unsigned char* local, int rank) {
  const unsigned at = static_cast<unsigned>(__cvta_generic_to_shared(local));
  unsigned remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(at), "r"(rank));
  asm volatile("st.shared::cluster.u8 [%0], %1;" ::"r"(remote), "h"(static_cast<unsigned short>(1)) : "memory");
}

// Variant 0: cluster barriers as cooperative groups issues them (arrive.release, wait.acquire);
// 1: relaxed arrive (timing only: it does not order the shared-memory stores of other CTAs);
// 2: as 0 with the host loads issued after the last cluster barrier instead of before the scan;
// 3: exact and without waiting for the host loads: the threads that stored to other CTAs fence
//    (fence.acq_rel.cluster) before any host load is issued or by threads that issued none, and
//    every barrier's arrive is relaxed.
template <int N, int Variant = 0>
struct cluster_sync_t {  // N = 0: one CTA without a cluster launch, block barriers only
  __device__ void sync() const {
    if constexpr (N == 0) {
      __syncthreads();
    } else if constexpr (Variant == 1 || Variant == 3) {
      asm volatile("barrier.cluster.arrive.relaxed.aligned;\n\tbarrier.cluster.wait.aligned;" ::: "memory");
    } else {
      cooperative_groups::this_cluster().sync();
    }
  }
  __device__ void fence() const {  // variant 3: orders this thread's stores before its next arrive
    if constexpr (N > 0 && Variant == 3) asm volatile("fence.acq_rel.cluster;" ::: "memory");
  }
  __device__ unsigned block_rank() const {
    if constexpr (N == 0) return 0;
    else return cooperative_groups::this_cluster().block_rank();
  }
  template <class T>
  __device__ T* map_shared_rank(T* p, int r) const {
    if constexpr (N == 0) return p;
    else return cooperative_groups::this_cluster().map_shared_rank(p, r);
  }
};

template <int N, int Variant = 0>
__device__ __forceinline__ void step_split(state s) {
  const cluster_sync_t<N, Variant> cluster;
  constexpr int kN = N > 0 ? N : 1;
  constexpr int kEntries = kTopK / kN, kPositions = kHot / kN;
  constexpr int kEPT = (kEntries + kBlock - 1) / kBlock, kPPT = (kPositions + kBlock - 1) / kBlock;
  using scan_t = cub::BlockScan<int, kBlock>;
  __shared__ typename scan_t::TempStorage scan;
  __shared__ alignas(16) unsigned char is_hit[kHot];
  __shared__ int totals[kN];
  __shared__ int miss_rows[2];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int rank = static_cast<int>(cluster.block_rank());
  const int slot = __ldcg(s.slot) + static_cast<int>(blockIdx.x) / kN;
  const std::size_t pages_base = static_cast<std::size_t>(slot) * kPages;
  const int first = rank * kEntries;
  int e[kEPT], loc[kEPT], page[kEPT], opt[kEPT];
  unsigned way[kEPT];
  if constexpr (Variant == 3) {  // cleared and fenced before any load is in flight
    for (int j = tid; j < kHot; j += kBlock) is_hit[j] = 0;
    cluster.fence();
  }
  for (int k = 0; k < kEPT; ++k) {
    const int i = tid + k * kBlock;
    e[k] = i < kEntries ? __ldcg(s.selection + slot * kTopK + first + i) : -1;
  }
  for (int k = 0; k < kEPT; ++k) {
    page[k] = opt[k] = -1;
    way[k] = 0xFFFFu;
    if (e[k] >= 0) {
      page[k] = __ldcg(s.page_table + pages_base + e[k] / kPageRows);
      opt[k] = __ldcg(s.optional_map + pages_base + e[k] / kPageRows);
      way[k] = __ldcg(s.rmap + static_cast<std::size_t>(slot) * kRows + e[k]);
    }
  }
  unsigned short od[kPPT];
  for (int j = 0; j < kPPT; ++j) {
    const int q = tid * kPPT + j;
    od[j] = q < kPositions ? __ldcg(s.order + static_cast<std::size_t>(slot) * kHot + rank * kPositions + q) : 0;
  }
  if constexpr (Variant != 3)
    for (int j = tid; j < kHot; j += kBlock) is_hit[j] = 0;
  cluster.sync();  // every CTA's flags cleared before any is marked
  for (int k = 0; k < kEPT; ++k) {
    loc[k] = e[k];
    if (e[k] < 0) continue;
    if (way[k] != 0xFFFFu) {
      loc[k] = static_cast<int>(way[k]);
      is_hit[way[k]] = 1;
      for (int r = 0; r < kN; ++r)
        if (r != rank) mark_in_cta(&is_hit[way[k]], r);
    } else {
      loc[k] = opt[k] >= 0 ? opt[k] : page[k];
    }
  }
  cluster.fence();  // the marks, before this thread issues a host load
  int4 row_buf[2] = {};
  const auto load_host_rows = [&] {
    if (tid < 2) miss_rows[tid] = slot * kRows + loc[0] % kRows;
    __syncthreads();
    if (warp < 2)
      for (int v = lane, i = 0; v < kRowBytes / 16; v += 32, ++i)
        row_buf[i] = s.host[static_cast<size_t>(miss_rows[warp]) * (kRowBytes / 16) + v];
  };
  if (Variant != 2 && rank == 0) load_host_rows();  // loaded before the scan, stored after it
  cluster.sync();  // every hit marked everywhere
  int mine = 0;
  for (int j = 0; j < kPPT; ++j) mine += tid * kPPT + j < kPositions && !is_hit[od[j]];
  int before = 0, total = 0;
  scan_t(scan).ExclusiveSum(mine, before, total);
  if (tid >= 64 && tid < 64 + kN) {  // warp 2: no host loads in flight to wait for at its fence
    *cluster.map_shared_rank(&totals[rank], tid - 64) = total;
    cluster.fence();
  }
  cluster.sync();  // every CTA's count everywhere; no shared memory of another CTA is touched after this
  if (Variant == 2 && rank == 0) load_host_rows();
  int offset = 0;
  for (int r = 0; r < rank; ++r) offset += totals[r];
  for (int j = 0; j < kPPT; ++j) {
    const int q = tid * kPPT + j;
    if (q < kPositions)
      s.order[static_cast<std::size_t>(slot) * kHot + (rank * kPositions + q + offset + before) % kHot] = od[j];
  }
  if (rank == 0 && warp < 2)
    for (int v = lane, i = 0; v < kRowBytes / 16; v += 32, ++i)
      s.pool[static_cast<size_t>(slot) * 2 * (kRowBytes / 16) + static_cast<size_t>(warp) * (kRowBytes / 16) + v] = row_buf[i];
  for (int k = 0; k < kEPT; ++k)
    if (tid + k * kBlock < kEntries) s.locations[static_cast<std::size_t>(slot) * kTopK + first + tid + k * kBlock] = loc[k];
}

template <int N, int Variant = 0>
__global__ void __cluster_dims__(N, 1, 1) __launch_bounds__(kBlock) step_cluster(state s) {
  step_split<N, Variant>(s);
}

__global__ void __launch_bounds__(kBlock) step_unclustered(state s) { step_split<0>(s); }

// Launch and teardown alone: an empty kernel of the probe's block size, plain or in clusters of N.
template <int N>
__global__ void __cluster_dims__(N, 1, 1) __launch_bounds__(kBlock) empty_cluster() {}
__global__ void __launch_bounds__(kBlock) empty_plain() {}

// A cluster launch of one CTA running the unclustered code (block barriers only).
__global__ void __cluster_dims__(1, 1, 1) __launch_bounds__(kBlock) step_cluster_launch_only(state s) { step_split<0>(s); }

int g_ctas = 1;  // CTAs (requests) per launch
constexpr int kStages = 20;

// Median event time of `launch(stream)`, the L2 flushed before every launch.
template <class Launch>
float median_flushed_us(void* flush, size_t flush_bytes, cudaStream_t st, Launch launch) {
  return probes::median_launch_us(
      st, [&](cudaStream_t q, int i) { DHB_CHECK(cudaMemsetAsync(flush, i & 0xFF, flush_bytes, q)); }, launch);
}

template <int Stage>
float median_us(const state& s, void* flush, size_t flush_bytes, cudaStream_t st) {
  return median_flushed_us(flush, flush_bytes, st, [&](cudaStream_t q) { step<Stage><<<g_ctas, kBlock, 0, q>>>(s); });
}

// The cluster stages: each a table row's name and a launch for g_ctas requests.
struct cluster_stage {
  const char* name;
  void (*launch)(const state&, cudaStream_t);
};
template <int N, int Variant = 0>
void launch_split(const state& s, cudaStream_t q) {
  step_cluster<N, Variant><<<g_ctas * N, kBlock, 0, q>>>(s);
}
constexpr cluster_stage kClusterStages[] = {
    {"full, cluster of 1 CTA", launch_split<1>},
    {"full, cluster of 2 CTAs", launch_split<2>},
    {"full, cluster of 4 CTAs", launch_split<4>},
    {"full, cluster of 8 CTAs", launch_split<8>},
    {"full, split code, no cluster",
     [](const state& s, cudaStream_t q) { step_unclustered<<<g_ctas, kBlock, 0, q>>>(s); }},
    {"full, cluster launch, no cluster sync",
     [](const state& s, cudaStream_t q) { step_cluster_launch_only<<<g_ctas, kBlock, 0, q>>>(s); }},
    {"empty kernel", [](const state&, cudaStream_t q) { empty_plain<<<g_ctas, kBlock, 0, q>>>(); }},
    {"empty kernel, clusters of 8", [](const state&, cudaStream_t q) { empty_cluster<8><<<g_ctas * 8, kBlock, 0, q>>>(); }},
    {"cluster of 1, relaxed barriers", launch_split<1, 1>},
    {"cluster of 8, relaxed barriers", launch_split<8, 1>},
    {"cluster of 1, host loads last", launch_split<1, 2>},
    {"cluster of 8, host loads last", launch_split<8, 2>},
    {"cluster of 1, fenced writers", launch_split<1, 3>},
    {"cluster of 4, fenced writers", launch_split<4, 3>},
    {"cluster of 8, fenced writers", launch_split<8, 3>},
};
constexpr int kClusterStageCount = sizeof(kClusterStages) / sizeof(kClusterStages[0]);

template <int... Stage>
void median_all(float* t, const state& s, void* flush, size_t flush_bytes, cudaStream_t st, std::integer_sequence<int, Stage...>) {
  ((t[Stage] = median_us<Stage>(s, flush, flush_bytes, st)), ...);  // in stage order
}

int main(int argc, char** argv) {
  g_ctas = argc > 1 ? std::max(1, std::atoi(argv[1])) : 1;
  const size_t C = static_cast<size_t>(g_ctas);
  std::mt19937 rng(7);
  // Request b's arrays follow request b - 1's: every request has its own selection and state.
  std::vector<int> sel(C * kTopK);
  for (auto& x : sel) x = static_cast<int>(rng() % kRows);
  std::vector<int> pages(C * kPages);
  for (auto& p : pages) p = static_cast<int>(rng() % 100000);
  std::vector<unsigned short> rmap(C * kRows, 0xFFFF), order(C * kHot);
  for (size_t i = 0; i < C * kHot; ++i) order[i] = static_cast<unsigned short>(i % kHot);
  for (size_t b = 0; b < C; ++b)
    for (int i = 0; i < kTopK; ++i)
      if (i % 1000 != 0) rmap[b * kRows + sel[b * kTopK + i]] = static_cast<unsigned short>(i % kHot);  // ~0.1 % misses
  std::vector<int> hot(C * kHot);
  for (size_t b = 0; b < C; ++b)
    for (int i = 0; i < kHot; ++i) hot[b * kHot + i] = i < kHot / 2 ? sel[b * kTopK + i % kTopK] : -1;  // some rows
  // The sorted index of what the reverse map holds: every row with a way, ascending.
  std::vector<int> sorted_rows(C * kHot, INT_MAX);
  std::vector<unsigned short> sorted_ways(C * kHot, 0xFFFF);
  for (size_t b = 0; b < C; ++b) {
    std::vector<std::pair<int, unsigned short>> held;
    for (int r = 0; r < kRows; ++r)
      if (rmap[b * kRows + r] != 0xFFFF) held.emplace_back(r, rmap[b * kRows + r]);
    for (size_t i = 0; i < held.size() && i < static_cast<size_t>(kHot); ++i) {
      sorted_rows[b * kHot + i] = held[i].first;
      sorted_ways[b * kHot + i] = held[i].second;
    }
  }

  // Device arrays in one allocation: `gap` bytes between consecutive arrays (each rounded up to 256).
  const size_t sizes[] = {sizeof(int), C * kTopK * sizeof(int), C * kTopK * sizeof(int), pages.size() * sizeof(int),
                          rmap.size() * sizeof(unsigned short), order.size() * sizeof(unsigned short), C * 2 * kRowBytes,
                          pages.size() * sizeof(int), hot.size() * sizeof(int), sorted_rows.size() * sizeof(int),
                          sorted_ways.size() * sizeof(unsigned short)};
  constexpr int kArrays = sizeof(sizes) / sizeof(sizes[0]);
  size_t spread_gap = size_t{16} << 20;  // at least 16 MiB between arrays, and more than the largest
  for (size_t b : sizes) spread_gap = std::max(spread_gap, (b + (size_t{2} << 20) - 1) / (size_t{2} << 20) * (size_t{2} << 20));
  char* arena = nullptr;
  size_t packed_bytes = 0;
  for (size_t b : sizes) packed_bytes += (b + 255) / 256 * 256;
  const size_t arena_bytes = std::max(kArrays * spread_gap, packed_bytes) + (size_t{2} << 20);
  DHB_CHECK(cudaMalloc(&arena, arena_bytes));
  char* const base = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(arena) + (size_t{2} << 20) - 1) &
                                             ~((uintptr_t{2} << 20) - 1));  // a 2 MiB boundary
  int4* h_host = nullptr;
  DHB_CHECK(cudaHostAlloc(&h_host, C * kRows * kRowBytes, cudaHostAllocMapped));
  int4* h_dev = nullptr;
  DHB_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&h_dev), h_host, 0));
  const size_t flush_bytes = 256u << 20;
  void* flush = nullptr;
  DHB_CHECK(cudaMalloc(&flush, flush_bytes));
  cudaStream_t st;
  DHB_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const int zero = 0;

  float t[2][kStages] = {}, tc[2][kClusterStageCount] = {};
  for (int spread = 0; spread < 2; ++spread) {
    // Packed: consecutive, all within the first 2 MiB page; spread: 16 MiB apart.
    char* at[kArrays];
    size_t off = 0;
    for (int i = 0; i < kArrays; ++i) {
      at[i] = base + (spread ? i * spread_gap : off);
      off += (sizes[i] + 255) / 256 * 256;
    }
    DHB_CHECK(cudaMemcpy(at[0], &zero, sizeof(int), cudaMemcpyHostToDevice));
    DHB_CHECK(cudaMemcpy(at[1], sel.data(), sel.size() * sizeof(int), cudaMemcpyHostToDevice));
    DHB_CHECK(cudaMemcpy(at[3], pages.data(), pages.size() * sizeof(int), cudaMemcpyHostToDevice));
    DHB_CHECK(cudaMemcpy(at[4], rmap.data(), rmap.size() * sizeof(unsigned short), cudaMemcpyHostToDevice));
    DHB_CHECK(cudaMemcpy(at[5], order.data(), order.size() * sizeof(unsigned short), cudaMemcpyHostToDevice));
    DHB_CHECK(cudaMemset(at[7], 0xFF, pages.size() * sizeof(int)));  // no optional page ready
    DHB_CHECK(cudaMemcpy(at[8], hot.data(), hot.size() * sizeof(int), cudaMemcpyHostToDevice));
    DHB_CHECK(cudaMemcpy(at[9], sorted_rows.data(), sorted_rows.size() * sizeof(int), cudaMemcpyHostToDevice));
    DHB_CHECK(cudaMemcpy(at[10], sorted_ways.data(), sorted_ways.size() * sizeof(unsigned short), cudaMemcpyHostToDevice));
    const state s{reinterpret_cast<const int*>(at[0]), reinterpret_cast<const int*>(at[1]), reinterpret_cast<int*>(at[2]),
                  reinterpret_cast<const int*>(at[3]), reinterpret_cast<const unsigned short*>(at[4]),
                  reinterpret_cast<unsigned short*>(at[5]), h_dev, reinterpret_cast<int4*>(at[6]),
                  reinterpret_cast<const int*>(at[7]), reinterpret_cast<const int*>(at[8]),
                  reinterpret_cast<const int*>(at[9]), reinterpret_cast<const unsigned short*>(at[10])};
    median_all(t[spread], s, flush, flush_bytes, st, std::make_integer_sequence<int, kStages>{});
    for (int i = 0; i < kClusterStageCount; ++i)
      tc[spread][i] = median_flushed_us(flush, flush_bytes, st, [&](cudaStream_t q) { kClusterStages[i].launch(s, q); });
  }
  const char* names[kStages] = {"index (resident)", "+ page table, reverse map", "+ LRU order scan", "+ 2 host rows",
                         "lookups + 2 host rows, no LRU", "host loads overlapping the LRU", "page table only",
                         "resolver round trip 2", "round trip 2 without reverse map", "host rows by cp.async, overlapping",
                         "host rows by bulk copy, overlapping",
                         "cp.async .L2::128B, overlapping", "cp.async .L2::256B, overlapping", "cp.async .ca, overlapping",
                         "bulk L2 prefetch + cp.async", "round trip 2, sorted hot index",
                         "round trip 2, selection hash", "hash: clear only", "hash: insert only",
                         "round trip 2 + LRU + host rows"};
  std::printf("C = %d step floor, L2 flushed, median of 200 (us)\n", g_ctas);
  std::printf("  %-32s %8s %8s\n", "", "packed", "spread");
  for (int i = 0; i < kStages; ++i) std::printf("  %-32s %8.2f %8.2f\n", names[i], t[0][i], t[1][i]);
  for (int i = 0; i < kClusterStageCount; ++i)
    std::printf("  %-32s %8.2f %8.2f\n", kClusterStages[i].name, tc[0][i], tc[1][i]);
  return 0;
}
