// shared_host_store_cuda: the tensor-parallel ranks of one host over ONE pinned host store
// (docs/multi-gpu.md), CUDA backend; the host twin is shared_host_store.cpp (the same script).
// Rank r runs on device r % device_count (all on device 0 with one GPU), on its own thread, with
// its own stream, backup stream and cuda::hierarchy over one cuda::pinned_shared_host_store.
//
//   every rank, in lockstep: admit, prefill (eager append, longer than the tail), publish;
//   per decode step: reserve_ahead every few steps, KV kernel -> append_step(view, backup, stream),
//                    publish, resolve per source, attention reads exactly the returned locations;
//   midway: complete one request on every rank, host barrier, admit the same id again.
//
// publish() is the ordering docs/multi-gpu.md ("Ordering on the CUDA backend") asks for: a rank
// writes to the store only the rows of the pages it owns, so its resolves read rows other ranks
// wrote on their own streams and devices. Each rank joins its backup into its stream and records
// an event; after a host barrier (every event recorded), every rank's stream waits for every other
// rank's event before it resolves. An engine's per-step collective (issued after join_backup)
// orders the same without the events; they stand in for it here, and cost no host sync.
//
// Checks: the bytes at every resolved location, read back through the rank's pools (copy_pool),
// equal the row the example computes from (request, source, layer, row); host bytes in use equal
// one hierarchy's worth; each rank wrote exactly the rows of the pages it owns. Exits 1 on any
// failure, 0 on success or when no GPU is present (it says so).
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <barrier>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <dhisparse/cuda/hierarchy.cuh>
#include <dhisparse/cuda/shared_host_store.cuh>

namespace {

namespace dh = dhisparse;
namespace dhc = dhisparse::cuda;

/// Source 0: 128-byte rows in 2 payload layers (producer + follower); source 1: 64-byte rows in 1.
struct model_layout {
  static constexpr std::size_t top_k = 32;
  static constexpr std::size_t page_rows = 16;
  static constexpr std::array<dh::source_desc, 2> sources{{{128, 1, 2, 32}, {64, 1, 1, 32}}};
  static constexpr std::array<dh::consumer_desc, 3> consumers{{{0, dh::consumer_kind::reindex, 0},
                                                               {0, dh::consumer_kind::follower, 1},
                                                               {1, dh::consumer_kind::reindex, 0}}};
};
static_assert(dh::check_layout<model_layout>());

using H = dhc::hierarchy<model_layout, dh::lru_hot_cache<64>>;
using Store = dhc::pinned_shared_host_store<model_layout>;
constexpr std::size_t kRanks = 4, kSources = 2, kSlots = 4, kRequests = 3, kP = model_layout::page_rows;
constexpr std::size_t K = model_layout::top_k, kStepLayers = H::step_layers;
constexpr std::size_t kTail = 16, kMaxRows = 256, kSteps = 50, kReserveEvery = 8, kReadmitStep = 25;
constexpr dh::request_id kReadmitted = 2;

std::size_t layers(std::size_t s) { return model_layout::sources[s].payload_layers; }
std::size_t row_bytes(std::size_t s) { return model_layout::sources[s].row_bytes; }

/// Word w of the KV row the model produces for (request tag, source, layer, row).
__host__ __device__ std::uint64_t kv_word(std::uint64_t tag, unsigned s, unsigned l, std::int64_t row, unsigned w) {
  std::uint64_t x = tag ^ (static_cast<std::uint64_t>(s) << 56) ^ (static_cast<std::uint64_t>(l) << 48) ^
                    (static_cast<std::uint64_t>(row) << 12) ^ w;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
/// Rows [first, first + count) of a request on a source, laid out [layer][count][row_bytes].
std::vector<std::byte> produce_rows(std::uint64_t tag, std::size_t s, std::int64_t first, std::size_t count) {
  std::vector<std::byte> out(layers(s) * count * row_bytes(s));
  for (std::size_t l = 0; l < layers(s); ++l)
    for (std::size_t r = 0; r < count; ++r)
      for (std::size_t w = 0; w < row_bytes(s) / 8; ++w) {
        const std::uint64_t v = kv_word(tag, s, l, first + static_cast<std::int64_t>(r), w);
        std::memcpy(out.data() + (l * count + r) * row_bytes(s) + w * 8, &v, 8);
      }
  return out;
}

/// A decode step's entries, passed by value to the KV kernel.
struct step_entries {
  std::uint32_t count = 0;
  std::int32_t slot[kSlots] = {};
  std::uint64_t tag[kSlots] = {};
  std::int64_t row[kSlots] = {};  // the position of the new row
};
/// The rank's step-wide write buffers: one per (source, layer), entry e at row e.
struct step_buffers {
  std::byte* rows_of[kStepLayers] = {};
  unsigned source[kStepLayers] = {}, layer[kStepLayers] = {}, bytes[kStepLayers] = {};
  std::int32_t* slots = nullptr;  // kv_step_write_view::slots (-1: padding)
  std::int32_t* rows = nullptr;   // kv_step_write_view::rows
};

/// Stand-in for the model's KV projections: the new row of every entry on every (source, layer),
/// and the view's slots and counts, all on the device (no upload in the step).
__global__ void produce_step_kernel(step_entries e, step_buffers b) {
  const unsigned entry = blockIdx.x, i = blockIdx.y;
  const bool live = entry < e.count;
  if (i == 0 && threadIdx.x == 0) {
    b.slots[entry] = live ? e.slot[entry] : -1;
    b.rows[entry] = live ? 1 : 0;
  }
  if (!live) return;
  auto* out = reinterpret_cast<std::uint64_t*>(b.rows_of[i] + entry * b.bytes[i]);
  for (unsigned w = threadIdx.x; w < b.bytes[i] / 8; w += blockDim.x)
    out[w] = kv_word(e.tag[entry], b.source[i], b.layer[i], e.row[entry], w);
}

/// One rank: its device, streams, event, hierarchy and buffers, all created with its device current
/// (`device` is initialised first and makes it current).
struct gpu_rank {
  int device;
  cudaStream_t stream = nullptr, backup = nullptr;
  cudaEvent_t written = nullptr;  // recorded after the rank's writes of a step (publish)
  std::unique_ptr<H> h;
  dhc::device_buffer<dh::row_index> sel{kSlots * K};
  dhc::device_buffer<dh::location> loc{kSlots * K};
  dhc::device_buffer<std::int32_t> step_slots{kSlots}, step_rows{kSlots};
  std::array<dhc::device_buffer<std::byte>, kStepLayers> step_bytes;
  dhc::device_buffer<const std::byte*> step_ptrs{kStepLayers};
  step_buffers bufs;

  static int use(int d) {
    DHISPARSE_CUDA_TRY(cudaSetDevice(d));  // this thread's launches and copies go to the rank's device
    return d;
  }
  gpu_rank(int d, Store& store, std::size_t rank, const dh::hierarchy_config& cfg) : device(use(d)) {
    DHISPARSE_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    DHISPARSE_CUDA_TRY(cudaStreamCreateWithFlags(&backup, cudaStreamNonBlocking));
    DHISPARSE_CUDA_TRY(cudaEventCreateWithFlags(&written, cudaEventDisableTiming));
    h = std::make_unique<H>(cfg, store, rank, stream);
    std::array<const std::byte*, kStepLayers> ptrs{};
    for (unsigned s = 0; s < kSources; ++s)
      for (unsigned l = 0; l < layers(s); ++l) {
        const std::size_t i = H::step_layer_index(s, l);
        step_bytes[i] = dhc::device_buffer<std::byte>(kSlots * row_bytes(s));
        ptrs[i] = bufs.rows_of[i] = step_bytes[i].data();
        bufs.source[i] = s;
        bufs.layer[i] = l;
        bufs.bytes[i] = static_cast<unsigned>(row_bytes(s));
      }
    bufs.slots = step_slots.data();
    bufs.rows = step_rows.data();
    DHISPARSE_CUDA_TRY(cudaMemcpy(step_ptrs.data(), ptrs.data(), step_ptrs.bytes(), cudaMemcpyHostToDevice));
  }
  gpu_rank(const gpu_rank&) = delete;
  gpu_rank& operator=(const gpu_rank&) = delete;
  ~gpu_rank() {
    h.reset();  // waits for its device before its memory goes
    cudaSetDevice(device);
    cudaEventDestroy(written);
    cudaStreamDestroy(backup);
    cudaStreamDestroy(stream);
  }
};

/// What a rank knows of a live request (the same on every rank: one scheduler, broadcast).
struct request_state {
  std::uint64_t tag = 0;
  std::array<std::int64_t, kSources> rows{}, covered{};  // stored rows; rows with host pages
};
struct rank_run {
  std::map<dh::request_id, request_state> live;
  std::array<std::uint64_t, kRanks> owned{};  // rows appended, by the rank that owns their page
  std::uint64_t appended = 0, rows_read = 0, wrong_bytes = 0;
  std::string error;
};

void run_rank(std::size_t k, std::vector<std::unique_ptr<gpu_rank>>& ranks, Store& store,
              const dh::hierarchy_config& cfg, std::barrier<>& sync, rank_run& out) {
  int devices = 0;
  DHISPARSE_CUDA_TRY(cudaGetDeviceCount(&devices));
  ranks[k] = std::make_unique<gpu_rank>(static_cast<int>(k) % devices, store, k, cfg);
  gpu_rank& g = *ranks[k];
  H& h = *g.h;
  sync.arrive_and_wait();  // every rank's event exists before any rank waits on it
  // The ordering rule: this rank's host writes (critical launches on `stream`, backups joined into
  // it) happen before every other rank's later launches, and theirs before this rank's resolves. A
  // rank that runs ahead may record its next step's event first: a later record orders more, not less.
  const auto publish = [&] {
    h.join_backup(g.stream);
    DHISPARSE_CUDA_TRY(cudaEventRecord(g.written, g.stream));
    sync.arrive_and_wait();
    for (std::size_t j = 0; j < kRanks; ++j)
      if (j != k && ranks[j]) DHISPARSE_CUDA_TRY(cudaStreamWaitEvent(g.stream, ranks[j]->written, 0));
  };
  auto& live = out.live;
  std::mt19937_64 rng(2026);  // the same draws on every rank: TP ranks resolve the same selections
  const auto wrote = [&](request_state& r, std::size_t s, std::size_t count) {
    for (std::size_t i = 0; i < count; ++i) ++out.owned[(static_cast<std::size_t>(r.rows[s]) + i) / kP % kRanks];
    out.appended += count;
    r.rows[s] += static_cast<std::int64_t>(count);
    r.covered[s] = std::max(r.covered[s], r.rows[s]);
  };
  const auto admit = [&](dh::request_id id, std::uint64_t generation, std::size_t prefill) {
    if (!h.admit(id, g.stream).admitted)
      throw std::runtime_error("admission of " + std::to_string(id) + " had to wait");
    auto& r = live[id] = request_state{};
    r.tag = id * 1000003 + generation;
    for (std::size_t s = 0; s < kSources; ++s) {  // eager: allocates the pages the prefill needs
      h.append(id, s, std::span<const std::byte>(produce_rows(r.tag, s, 0, prefill)), prefill, g.stream);
      wrote(r, s, prefill);
    }
  };
  const auto reserve = [&](std::size_t ahead) {  // host pages for the next steps, outside the step
    h.reserve_ahead(ahead, g.stream);
    for (auto& [id, r] : live)
      for (std::size_t s = 0; s < kSources; ++s)
        r.covered[s] = std::max(r.covered[s], std::min<std::int64_t>(kMaxRows, r.rows[s] + std::int64_t(ahead)));
  };

  for (std::size_t i = 0; i < kRequests; ++i) admit(static_cast<dh::request_id>(i + 1), 0, 40 + 13 * i);
  reserve(kReserveEvery);
  std::vector<dh::row_index> sel(kSlots * K);
  std::vector<dh::location> loc(kSlots * K);
  std::vector<std::vector<std::byte>> pool(2);
  for (std::size_t step = 0; step < kSteps; ++step) {
    if (step == kReadmitStep) {
      h.complete(kReadmitted, g.stream);  // this rank's reads of it finished: check_errors synced
      live.erase(kReadmitted);
      sync.arrive_and_wait();  // the old history's pages go with the last rank's complete; then admit
      admit(kReadmitted, 1, 45);
      reserve(kReserveEvery);
    } else if (step % kReserveEvery == 0) {
      reserve(kReserveEvery);
    }
    // The step's KV writes: a kernel makes one row per request and source, ONE append_step writes them.
    step_entries e;
    for (auto& [id, r] : live) {
      e.slot[e.count] = static_cast<std::int32_t>(h.slot_of(id));
      e.tag[e.count] = r.tag;
      e.row[e.count++] = r.rows[0];  // every source has the same rows here
    }
    produce_step_kernel<<<dim3(kSlots, kStepLayers), 32, 0, g.stream>>>(e, g.bufs);
    DHISPARSE_CUDA_TRY(cudaGetLastError());
    dhc::kv_step_write_view v;
    v.slots = g.step_slots.data();
    v.rows = g.step_rows.data();
    v.layer_rows = g.step_ptrs.data();
    v.max_rows = 1;
    v.capacity = kSlots;
    h.append_step(v, g.backup, g.stream);
    for (auto& [id, r] : live)
      for (std::size_t s = 0; s < kSources; ++s) wrote(r, s, 1);
    publish();  // every owner's rows (this step's and the prefills') before anyone's resolves
    for (std::size_t s = 0; s < kSources; ++s) {
      std::vector<dhc::batch_item> items;
      for (auto& [id, r] : live) {  // the indexer's top-k: old rows (other ranks' pages) and recent ones
        dh::row_index* x = sel.data() + items.size() * K;
        for (std::size_t i = 0; i < K; ++i)
          x[i] = rng() % 8 == 0 ? dh::no_row : static_cast<dh::row_index>(rng() % std::uint64_t(r.rows[s]));
        const std::size_t at = items.size() * K;
        items.push_back({id, g.sel.data() + at, static_cast<std::int32_t>(K), g.loc.data() + at});
      }
      // Pageable source: staged before the call returns; stream-ordered after the last resolve.
      DHISPARSE_CUDA_TRY(cudaMemcpyAsync(g.sel.data(), sel.data(), items.size() * K * sizeof(dh::row_index),
                                         cudaMemcpyHostToDevice, g.stream));
      h.resolve(s, std::span<const dhc::batch_item>(items), g.stream);
      DHISPARSE_CUDA_TRY(cudaMemcpyAsync(loc.data(), g.loc.data(), items.size() * K * sizeof(dh::location),
                                         cudaMemcpyDeviceToHost, g.stream));
      for (std::size_t l = 0; l < layers(s); ++l) {  // copy_pool synchronises the rank's stream
        pool[l].resize(h.pool_rows() * row_bytes(s));
        h.copy_pool(s, l, pool[l]);
      }
      std::size_t n = 0;
      for (auto& [id, r] : live) {  // attention's reads, checked: exactly the returned locations, every layer
        for (std::size_t i = n * K; i < (n + 1) * K; ++i) {
          if (sel[i] == dh::no_row) continue;
          ++out.rows_read;
          if (loc[i] < 0 || static_cast<std::size_t>(loc[i]) >= h.pool_rows()) {
            out.wrong_bytes += row_bytes(s);
            continue;
          }
          const auto want = produce_rows(r.tag, s, sel[i], 1);  // [layer][1][row_bytes]
          const std::size_t at = static_cast<std::size_t>(loc[i]) * row_bytes(s);
          for (std::size_t l = 0; l < layers(s); ++l)
            for (std::size_t b = 0; b < row_bytes(s); ++b)
              out.wrong_bytes += pool[l][at + b] != want[l * row_bytes(s) + b];
        }
        ++n;
      }
    }
    h.check_errors(g.stream);  // device-side errors of the step's writes and resolves, as exceptions
  }
}

int run() {
  dh::hierarchy_config cfg;
  cfg.max_requests = kSlots;
  cfg.max_rows = kMaxRows;
  cfg.tail_rows = kTail;
  Store store(kRanks, kSlots * kMaxRows / kP);  // pinned, portable, mapped: every GPU reads it
  std::vector<std::unique_ptr<gpu_rank>> ranks(kRanks);  // after the store: destroyed first
  std::barrier sync(static_cast<std::ptrdiff_t>(kRanks));
  std::vector<rank_run> runs(kRanks);
  std::vector<std::thread> threads;
  for (std::size_t k = 0; k < kRanks; ++k)
    threads.emplace_back([&, k] {
      try {
        run_rank(k, ranks, store, cfg, sync, runs[k]);
      } catch (const std::exception& e) {
        runs[k].error = e.what();
        sync.arrive_and_drop();  // the other ranks go on (and fail on their own) instead of waiting
      }
    });
  for (auto& t : threads) t.join();

  bool ok = true;
  std::uint64_t rows_read = 0, wrong = 0;
  for (std::size_t k = 0; k < kRanks; ++k) {
    if (!runs[k].error.empty()) {
      std::printf("rank %zu failed: %s\n", k, runs[k].error.c_str());
      ok = false;
    }
    rows_read += runs[k].rows_read;
    wrong += runs[k].wrong_bytes;
  }
  if (!ok) return 1;
  for (auto& g : ranks) g->h->sync_books(g->stream);  // absorb the batched writes: rows_written is exact
  const rank_run& model = runs[0];
  std::size_t one_copy = 0;
  for (const auto& [id, r] : model.live)
    for (std::size_t s = 0; s < kSources; ++s)
      one_copy += (static_cast<std::size_t>(r.covered[s]) + kP - 1) / kP * kP * layers(s) * row_bytes(s);
  const std::size_t in_use = store.host_bytes_in_use();
  ok = wrong == 0 && rows_read > 0 && in_use == one_copy;
  for (auto& g : ranks) ok = ok && g->h->host_bytes_in_use() == in_use;
  std::uint64_t total = 0;
  std::string per_rank;
  for (std::size_t k = 0; k < kRanks; ++k) {
    total += store.rows_written(k);
    if (k > 0) per_rank += ' ';
    per_rank += std::to_string(store.rows_written(k)) + "@dev" + std::to_string(ranks[k]->device);
    ok = ok && store.rows_written(k) == model.owned[k];
  }
  ok = ok && total == model.appended;
  for (auto& g : ranks)
    for (const auto& [id, r] : model.live) g->h->complete(id, g->stream);
  ok = ok && store.host_bytes_in_use() == 0 && store.requests() == 0;

  std::printf("shared_host_store_cuda: %zu ranks on %zu threads over one pinned host store, %zu requests, %zu decode "
              "steps\n", kRanks, kRanks, kRequests, kSteps);
  std::printf("  resolved rows read on all ranks: %llu, wrong bytes: %llu\n",
              static_cast<unsigned long long>(rows_read), static_cast<unsigned long long>(wrong));
  std::printf("  host bytes in use: %zu (expected %zu); %zu independent hierarchies would hold %zu\n", in_use,
              one_copy, kRanks, kRanks * in_use);
  std::printf("  rows written per rank: %s (sum %llu, rows appended %llu)\n", per_rank.c_str(),
              static_cast<unsigned long long>(total), static_cast<unsigned long long>(model.appended));
  std::printf("%s\n", ok ? "OK" : "FAILED");
  return ok ? 0 : 1;
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("shared_host_store_cuda: no CUDA device, nothing to run\n");
    return 0;
  }
  try {
    return run();
  } catch (const dh::error& e) {
    std::printf("FAILED: %s (%s)\n", e.what(), dh::to_string(e.code()));
    return 1;
  } catch (const std::exception& e) {
    std::printf("FAILED: %s\n", e.what());
    return 1;
  }
}
