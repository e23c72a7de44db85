// resolve_device_selections: resolving selections that are already on the GPU (docs/integration.md).
//
// The engine owns every per-step array on the device: which request slot each batch entry is,
// the top-k rows its indexer selected, how many it selected, how many entries the step has, and
// where the locations go. A stand-in indexer kernel writes them here; the resolver reads them in
// stream order through a `batch_view` (no host copy of the selections, no host synchronisation),
// and a check kernel then reads every returned location's row through the source's device view
// and compares it byte for byte with the row the engine wrote at prefill. The step's stats and
// errors come back asynchronously into pinned memory; the host looks at them after the step.
//
// Exits non-zero on any wrong byte or error; 0 on success, and also when no GPU is present.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <span>
#include <vector>

#include "dhisparse/cuda/hierarchy.cuh"
#include "dhisparse/layouts/single_source.hpp"

namespace dh = dhisparse;
namespace dhc = dhisparse::cuda;

namespace {

// A DeepSeek-style source: 656-byte rows, top-k 512, pages of 64 rows.
using Layout = dh::layouts::single_source<656, 512>;
using Hierarchy = dhc::hierarchy<Layout, dh::lru_hot_cache<1024>>;
constexpr std::size_t K = Layout::top_k;
constexpr std::size_t row_bytes = Layout::sources[0].row_bytes;
constexpr std::uint32_t requests = 8;
constexpr int steps = 24;

__host__ __device__ std::uint64_t mix(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
/// Word w of row `row` of request `id`: what the engine's prefill wrote.
__host__ __device__ std::uint64_t kv_word(std::uint64_t id, std::int64_t row, std::size_t w) {
  return mix(mix(id * 0x100000001B3ull + static_cast<std::uint64_t>(row)) + w);
}

/// The engine's prefill output for one request: `rows` rows laid out [layer 0][row][row_bytes].
__global__ void prefill_kernel(std::uint64_t id, std::int64_t rows, std::uint64_t* out) {
  constexpr std::size_t words = row_bytes / 8;
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < static_cast<std::size_t>(rows) * words;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    out[i] = kv_word(id, static_cast<std::int64_t>(i / words), i % words);
}

/// Stand-in for the engine's indexer: entry e selects up to K rows of its request's history
/// (some repeated, some -1), and the kernel also writes the batch's slots, lengths and count.
__global__ void indexer_kernel(std::uint32_t entries, const std::int32_t* request_slot, const std::int64_t* history_rows,
                               std::uint64_t step, std::int32_t* slots, std::int32_t* lengths, dh::row_index* selections,
                               std::uint32_t* count) {
  const std::uint32_t e = blockIdx.x;
  if (e >= entries) return;
  const std::int64_t n = history_rows[e];
  const std::int32_t length = static_cast<std::int32_t>(K - (mix(step * 977 + e) % 64));  // not always full
  if (threadIdx.x == 0) {
    slots[e] = request_slot[e];
    lengths[e] = length;
    if (e == 0) *count = entries;
  }
  for (std::int32_t i = threadIdx.x; i < length; i += blockDim.x) {
    const std::uint64_t h = mix(step * 0x10001ull + e * 0x1000193ull + static_cast<std::uint64_t>(i));
    // mostly recent rows (hits in the tail and the hot cache), some anywhere (host misses), a few -1
    const std::int64_t recent = n < 2048 ? n : 2048;
    dh::row_index r = h % 16 == 0 ? static_cast<dh::row_index>(h % static_cast<std::uint64_t>(n))
                                  : static_cast<dh::row_index>(n - 1 - static_cast<std::int64_t>(h % recent));
    if (h % 97 == 0) r = dh::no_row;
    selections[e * K + i] = r;
  }
}

/// Checks every returned location: -1 for a -1 entry, otherwise the exact bytes of the selected
/// row, read through the source's device view (the resolver's own address arithmetic).
__global__ void check_kernel(dhc::source_view<Hierarchy::order_index> view, std::uint32_t entries,
                             const std::uint64_t* request_id, const std::int32_t* lengths,
                             const dh::row_index* selections, const dh::location* locations,
                             unsigned long long* wrong) {
  const std::uint32_t e = blockIdx.x;
  if (e >= entries) return;
  for (std::int32_t i = threadIdx.x; i < lengths[e]; i += blockDim.x) {
    const dh::row_index r = selections[e * K + i];
    const dh::location loc = locations[e * K + i];
    if (r == dh::no_row) {
      if (loc != dh::no_location) atomicAdd(wrong, 1ull);
      continue;
    }
    if (loc < 0 || static_cast<std::size_t>(loc) >= view.space.rows()) {
      atomicAdd(wrong, 1ull);
      continue;
    }
    const auto* row = reinterpret_cast<const std::uint64_t*>(view.row_address(0, loc));
    for (std::size_t w = 0; w < row_bytes / 8; ++w)
      if (row[w] != kv_word(request_id[e], r, w)) {
        atomicAdd(wrong, 1ull);
        break;
      }
  }
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("resolve_device_selections: no CUDA device, nothing to run\n");
    return 0;
  }
  try {
    dh::hierarchy_config cfg;
    cfg.max_requests = requests;
    cfg.max_rows = 16384;
    cfg.optional_pages = 0;  // resolve-only: no optional history
    cudaStream_t stream = nullptr;  // lives as long as the process (the hierarchy uses it until destroyed)
    DHISPARSE_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    Hierarchy h(cfg, stream);

    // Engine-owned device arrays (allocated once, reused every step, captured in graphs as-is).
    dhc::device_buffer<std::int32_t> slots(requests), lengths(requests), request_slot(requests);
    dhc::device_buffer<dh::row_index> selections(requests * K);
    dhc::device_buffer<dh::location> locations(requests * K);
    dhc::device_buffer<std::uint32_t> count(1);
    dhc::device_buffer<std::int64_t> history_rows(requests);
    dhc::device_buffer<std::uint64_t> request_id(requests);
    dhc::device_buffer<unsigned long long> wrong(1);
    // Pinned results of the step, read by the host after the step.
    dhc::pinned_buffer stats_bytes(requests * sizeof(dhc::entry_stats));
    dhc::pinned_buffer record_bytes(sizeof(dhc::error_record));
    const std::span<dhc::entry_stats> stats(reinterpret_cast<dhc::entry_stats*>(stats_bytes.data()), requests);
    auto* record = reinterpret_cast<dhc::error_record*>(record_bytes.data());

    // Admission and prefill: histories are appended from device memory the engine produced.
    std::vector<std::int32_t> slot_of_entry;
    std::vector<std::int64_t> rows_of_entry;
    std::vector<std::uint64_t> id_of_entry;
    dhc::device_buffer<std::uint64_t> prefill(cfg.max_rows * (row_bytes / 8));
    for (std::uint32_t r = 0; r < requests; ++r) {
      const dh::request_id id = 500 + r;
      const auto a = h.admit(id, stream);
      if (!a.admitted) throw dh::invalid_configuration("no free slot");
      const std::int64_t n = 3000 + 1100 * static_cast<std::int64_t>(r);
      prefill_kernel<<<256, 256, 0, stream>>>(id, n, prefill.data());
      DHISPARSE_CUDA_TRY(cudaGetLastError());
      h.append(id, 0, reinterpret_cast<const std::byte*>(prefill.data()), static_cast<std::size_t>(n), stream);
      slot_of_entry.push_back(static_cast<std::int32_t>(a.slot));
      rows_of_entry.push_back(n);
      id_of_entry.push_back(id);
    }
    DHISPARSE_CUDA_TRY(cudaMemcpyAsync(request_slot.data(), slot_of_entry.data(), requests * sizeof(std::int32_t),
                                       cudaMemcpyHostToDevice, stream));
    DHISPARSE_CUDA_TRY(cudaMemcpyAsync(history_rows.data(), rows_of_entry.data(), requests * sizeof(std::int64_t),
                                       cudaMemcpyHostToDevice, stream));
    DHISPARSE_CUDA_TRY(cudaMemcpyAsync(request_id.data(), id_of_entry.data(), requests * sizeof(std::uint64_t),
                                       cudaMemcpyHostToDevice, stream));
    DHISPARSE_CUDA_TRY(cudaMemsetAsync(wrong.data(), 0, sizeof(unsigned long long), stream));

    // The batch view over the engine's arrays: strided, capacity = the arrays' entries.
    dhc::batch_view batch;
    batch.slots = slots.data();
    batch.selections = selections.data();
    batch.locations = locations.data();
    batch.lengths = lengths.data();
    batch.count = count.data();
    batch.stride = static_cast<std::uint32_t>(K);
    batch.capacity = requests;

    dh::resolve_stats total;
    for (int step = 0; step < steps; ++step) {
      const std::uint32_t entries = 1 + static_cast<std::uint32_t>(step) % requests;
      // --- the step: indexer, resolve, the engine's reader, async results (all capturable)
      indexer_kernel<<<entries, 256, 0, stream>>>(entries, request_slot.data(), history_rows.data(),
                                                  static_cast<std::uint64_t>(step), slots.data(), lengths.data(),
                                                  selections.data(), count.data());
      DHISPARSE_CUDA_TRY(cudaGetLastError());
      h.resolve(0, batch, stream);
      check_kernel<<<entries, 256, 0, stream>>>(h.view(0), entries, request_id.data(), lengths.data(), selections.data(),
                                                locations.data(), wrong.data());
      DHISPARSE_CUDA_TRY(cudaGetLastError());
      h.copy_stats_async(0, stats, stream);
      h.copy_errors_async(0, record, stream);
      // --- after the step (here at once; an engine would look a step or more later)
      DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
      h.throw_if_error(*record);
      for (std::uint32_t e = 0; e < requests; ++e) total += Hierarchy::to_resolve_stats(0, stats[e]);
    }
    unsigned long long bad = 0;
    DHISPARSE_CUDA_TRY(cudaMemcpyAsync(&bad, wrong.data(), sizeof(bad), cudaMemcpyDeviceToHost, stream));
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
    std::printf("resolve_device_selections: %d steps, %zu entries selected: %zu direct, %zu hot, %zu from host "
                "(%zu rows, %zu bytes copied); %llu wrong\n",
                steps, total.selected, total.direct, total.hot, total.host, total.rows_copied, total.bytes_copied, bad);
    if (bad != 0 || total.host == 0 || total.hot == 0) {
      std::printf("FAILED: %s\n", bad != 0 ? "a returned location did not hold its row" : "a path was not exercised");
      return 1;
    }
    std::printf("OK: every returned location held the selected row's bytes\n");
    return 0;
  } catch (const std::exception& e) {
    std::printf("FAILED: %s\n", e.what());
    return 1;
  }
}
