// The draft ring's batched step path (write_step / commit_step over device descriptors, device
// books, draft_ring_step_ref) against the host store's batched calls, which the test drives with
// the good entries only (its own reading of each entry). Compared after every launch: the device
// books (read back by sync_books and by copy_books_async) and every ring byte.
//   1. Eager random rounds with padding, strided and unaligned rows, chain-drafter offsets, claims
//      of rows written in place through the ref, one bad entry now and then (the typed error from
//      check_errors, that entry's books and rows unchanged, the rest applied), host-path calls
//      mixed in, and the stale-cache rules (host calls refused until sync_books; reset allowed).
//   2. One CUDA graph of sampler kernel + write_step + a drafter kernel reading its window through
//      the step ref + accepted counts written by a kernel + commit_step + copy_books_async,
//      captured once and replayed >= 200 rounds with the counts changing every round.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "../support/catch.hpp"
#include "dhisparse/cuda/draft_ring_store.cuh"
#include "dhisparse/host/draft_ring_store.hpp"

namespace {

namespace dh = ::dhisparse;
namespace dhc = ::dhisparse::cuda;

void ok(cudaError_t e) { REQUIRE(e == cudaSuccess); }

template <class T>
void upload(T* device, const std::vector<T>& host, cudaStream_t stream) {
  if (host.empty()) return;
  ok(cudaMemcpyAsync(device, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice, stream));
  ok(cudaStreamSynchronize(stream));  // `host` may change right after
}

/// Both stores hold the same books and bytes (device books read back through sync_books and,
/// independently, copy_books_async into mapped pinned memory).
template <class Ring>
void same_stores(dh::draft_ring_store<Ring>& host, dhc::draft_ring_store<Ring>& dev, dhc::pinned_buffer& books_out,
                 cudaStream_t stream) {
  const std::size_t slots = host.config().slots;
  auto* out = reinterpret_cast<dh::draft_slot_state*>(books_out.data());
  dev.copy_books_async(std::span(out, slots), stream);
  dev.sync_books(stream);  // synchronises: `out` is complete too
  for (std::size_t s = 0; s < slots; ++s) {
    INFO("slot " << s);
    REQUIRE(dev.books_current(s));
    REQUIRE(dev.committed(s) == host.committed(s));
    REQUIRE(dev.written(s) == host.written(s));
    REQUIRE(out[s].committed == host.committed(s));
    REQUIRE(out[s].written == host.written(s));
  }
  std::vector<std::byte> got(dev.allocated_bytes());
  ok(cudaMemcpyAsync(got.data(), dev.ref().base, got.size(), cudaMemcpyDeviceToHost, stream));
  ok(cudaStreamSynchronize(stream));
  REQUIRE(std::equal(got.begin(), got.end(), host.storage().begin()));
}

/// A drafter that stores its KV itself: block position committed + j of every entry's slot, every
/// layer, byte b = seed + 7 j + 13 l + b, at the address the step ref gives (device books).
template <class Ring>
__global__ void store_in_place(dhc::draft_ring_step_ref<Ring> ref, const std::int32_t* slots, const std::int32_t* counts,
                               unsigned char seed) {
  const std::int32_t slot = slots[blockIdx.x];
  if (slot < 0) return;
  const std::size_t n = static_cast<std::size_t>(counts[blockIdx.x]) * ref.ring.layers * ref.ring.row_bytes;
  for (std::size_t i = threadIdx.x; i < n; i += blockDim.x) {
    const std::size_t b = i % ref.ring.row_bytes, l = (i / ref.ring.row_bytes) % ref.ring.layers,
                      j = i / (ref.ring.row_bytes * ref.ring.layers);
    ref.block_row(slot, static_cast<std::uint32_t>(j), l)[b] = std::byte(static_cast<unsigned char>(seed + 7 * j + 13 * l + b));
  }
}

enum class bad_write { none, slot, duplicate, zero_count, wide_count, gap, negative_offset, too_wide };
enum class bad_commit { none, slot, duplicate, beyond, negative };

template <class Ring>
void eager_rounds(std::size_t slots, std::size_t row_bytes, std::size_t layers, std::size_t rounds, std::uint64_t seed) {
  constexpr std::uint64_t K = Ring::max_block;
  INFO("W=" << Ring::window << " K_max=" << K << " row_bytes=" << row_bytes << " seed=" << seed);
  const dh::draft_ring_config cfg{slots, row_bytes, layers};
  cudaStream_t stream = nullptr;
  ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    dh::draft_ring_store<Ring> host(cfg);
    dhc::draft_ring_store<Ring> dev(cfg, stream);
    std::mt19937_64 rng(seed);
    auto pick = [&](std::uint64_t lo, std::uint64_t hi) { return std::uniform_int_distribution<std::uint64_t>(lo, hi)(rng); };
    const std::size_t cap = slots + 2;  // room for padding and a duplicate
    const std::size_t stride = row_bytes + (seed % 2 == 0 ? 16 : 0);  // strided buffers on some runs
    dhc::device_buffer<std::int32_t> d_slots(cap), d_counts(cap), d_offsets(cap), d_first(cap), d_accepted(cap);
    std::vector<dhc::device_buffer<std::byte>> d_layer;
    std::vector<std::byte*> layer_at;  // where each layer's buffer rows start
    for (std::size_t l = 0; l < layers; ++l) {
      d_layer.emplace_back(cap * K * stride + 1);
      layer_at.push_back(d_layer.back().data() + (seed % 3 == 0 ? 1 : 0));  // unaligned on some runs
    }
    const std::vector<const std::byte*> layer_ptrs(layer_at.begin(), layer_at.end());
    dhc::device_buffer<const std::byte*> d_layer_ptrs(layers);
    upload(d_layer_ptrs.data(), layer_ptrs, stream);
    dhc::pinned_buffer books_out(slots * sizeof(dh::draft_slot_state));

    std::size_t good_writes = 0, good_commits = 0, claims = 0, errors = 0, host_calls = 0;
    for (std::size_t round = 0; round < rounds; ++round) {
      // ---- write_step: a random subset of slots in random order, padding between them.
      std::vector<std::size_t> order(slots);
      for (std::size_t s = 0; s < slots; ++s) order[s] = s;
      std::shuffle(order.begin(), order.end(), rng);
      order.resize(pick(1, slots));
      std::vector<std::int32_t> e_slot, e_count, e_offset, e_first;
      std::vector<std::vector<std::byte>> e_rows;  // [layer][count][row_bytes] as the host store takes it
      const bool claim = pick(0, 5) == 0;            // the drafter stored its rows in place
      const bool use_first = pick(0, 1) == 0;
      const unsigned char claim_seed = static_cast<unsigned char>(rng());
      // A view holds at most `slots` entries: padding and a duplicate only where there is room.
      std::size_t room = slots - order.size();
      for (std::size_t s : order) {
        if (room > 1 && pick(0, 4) == 0) {  // padding
          --room;
          e_slot.push_back(-1);
          e_count.push_back(static_cast<std::int32_t>(pick(0, 1000)));
          e_offset.push_back(-5);
          e_rows.emplace_back();
        }
        const std::uint64_t block = host.written(s) - host.committed(s);
        const std::uint64_t offset = claim ? 0 : pick(0, std::min<std::uint64_t>(block, K - 1));
        const std::size_t count = pick(1, K - offset);
        e_slot.push_back(static_cast<std::int32_t>(s));
        e_count.push_back(static_cast<std::int32_t>(count));
        e_offset.push_back(static_cast<std::int32_t>(offset));
        std::vector<std::byte> rows(count * layers * row_bytes);
        if (claim) {
          for (std::size_t l = 0; l < layers; ++l)
            for (std::size_t j = 0; j < count; ++j)
              for (std::size_t b = 0; b < row_bytes; ++b)
                rows[(l * count + j) * row_bytes + b] = std::byte(static_cast<unsigned char>(claim_seed + 7 * j + 13 * l + b));
        } else {
          for (auto& b : rows) b = std::byte(rng());
        }
        e_rows.push_back(std::move(rows));
      }
      // Maybe one bad entry (its expected error), never in a claim round (its rows are stored anyway).
      bad_write bw = claim || pick(0, 3) != 0 ? bad_write::none : static_cast<bad_write>(pick(1, 7));
      std::size_t bad_at = 0;
      if (bw != bad_write::none) {
        bad_at = pick(0, e_slot.size() - 1);
        while (e_slot[bad_at] < 0) bad_at = (bad_at + 1) % e_slot.size();
        const auto s = static_cast<std::size_t>(e_slot[bad_at]);
        const std::uint64_t block = host.written(s) - host.committed(s);
        switch (bw) {
          case bad_write::slot: e_slot[bad_at] = static_cast<std::int32_t>(slots + pick(0, 3)); break;
          case bad_write::duplicate:  // a later entry naming the same slot: that one is bad
            if (room == 0) {
              bw = bad_write::none;
              break;
            }
            e_slot.push_back(e_slot[bad_at]);
            e_count.push_back(1);
            e_offset.push_back(0);
            e_rows.emplace_back(layers * row_bytes);
            bad_at = e_slot.size() - 1;
            break;
          case bad_write::zero_count: e_count[bad_at] = 0; break;
          case bad_write::wide_count: e_count[bad_at] = static_cast<std::int32_t>(K + 1); break;
          case bad_write::gap: e_offset[bad_at] = static_cast<std::int32_t>(block + pick(1, 2)); break;
          case bad_write::negative_offset: e_offset[bad_at] = -1; break;
          case bad_write::too_wide:
            if (block == 0 || K == 1) {
              bw = bad_write::none;
              break;
            }
            e_offset[bad_at] = static_cast<std::int32_t>(std::min<std::uint64_t>(block, K - 1));
            e_count[bad_at] = static_cast<std::int32_t>(K - static_cast<std::uint64_t>(e_offset[bad_at]) + 1);
            if (static_cast<std::uint64_t>(e_count[bad_at]) > K) bw = bad_write::none, e_count[bad_at] = 1;
            break;
          default: break;
        }
        // The bad entry's source rows: sized for whatever count it claims, within the buffer.
        e_rows[bad_at].resize(std::min<std::uint64_t>(std::max(e_count[bad_at], 0), K) * layers * row_bytes);
      }
      // Device descriptor: buffer rows of entry e at first[e] (reversed order) or e * K.
      const std::size_t n = e_slot.size();
      REQUIRE(n <= slots);
      e_first.resize(n);
      std::vector<std::vector<std::byte>> layer_bufs(layers, std::vector<std::byte>(cap * K * stride));
      for (std::size_t e = 0; e < n; ++e) {
        e_first[e] = static_cast<std::int32_t>(use_first ? (n - 1 - e) * K : e * K);
        const std::size_t count = e_rows[e].size() / (layers * row_bytes == 0 ? 1 : layers * row_bytes);
        for (std::size_t l = 0; l < layers; ++l)
          for (std::size_t j = 0; j < count; ++j)
            std::copy_n(e_rows[e].begin() + (l * count + j) * row_bytes, row_bytes,
                        layer_bufs[l].begin() + (e_first[e] + j) * stride);
      }
      upload(d_slots.data(), e_slot, stream);
      upload(d_counts.data(), e_count, stream);
      upload(d_offsets.data(), e_offset, stream);
      upload(d_first.data(), e_first, stream);
      for (std::size_t l = 0; l < layers; ++l) upload(layer_at[l], layer_bufs[l], stream);
      if (claim) {
        store_in_place<Ring><<<static_cast<unsigned>(n), 128, 0, stream>>>(dev.step_ref(), d_slots.data(), d_counts.data(), claim_seed);
        ok(cudaGetLastError());
      }
      dhc::draft_write_view wv;
      wv.slots = d_slots.data();
      wv.counts = d_counts.data();
      wv.offsets = pick(0, 1) == 0 || std::any_of(e_offset.begin(), e_offset.end(), [](std::int32_t o) { return o > 0; })
                       ? d_offsets.data()
                       : nullptr;  // null: every offset 0, as they are here
      if (wv.offsets == nullptr && bw == bad_write::negative_offset) wv.offsets = d_offsets.data();
      wv.first = use_first ? d_first.data() : nullptr;
      wv.layer_rows = claim ? nullptr : d_layer_ptrs.data();
      wv.row_stride = stride == row_bytes && pick(0, 1) == 0 ? 0 : stride;
      wv.max_count = pick(0, 1) == 0 ? 0 : static_cast<std::uint32_t>(K);
      wv.capacity = static_cast<std::uint32_t>(n);
      dev.write_step(wv, stream);
      // The host twin: the good entries only.
      std::vector<dh::draft_write_item> items;
      for (std::size_t e = 0; e < n; ++e)
        if (e_slot[e] >= 0 && !(bw != bad_write::none && e == bad_at))
          items.push_back({static_cast<std::size_t>(e_slot[e]), static_cast<std::size_t>(e_offset[e]), e_rows[e],
                           static_cast<std::size_t>(e_count[e])});
      host.write_step(items);
      good_writes += items.size();
      claims += claim ? 1 : 0;
      // Stale host cache: refused (and nothing changes) until sync_books or reset.
      REQUIRE_FALSE(dev.books_current(order[0]));
      REQUIRE_THROWS_AS((void)dev.committed(order[0]), dh::invalid_configuration);
      REQUIRE_THROWS_AS(dev.commit(order[0], 0, stream), dh::invalid_configuration);
      REQUIRE_THROWS_AS((void)dev.window(order[0]), dh::invalid_configuration);
      switch (bw) {
        case bad_write::none: dev.check_errors(stream); break;
        case bad_write::slot: REQUIRE_THROWS_AS(dev.check_errors(stream), dh::invalid_slot); break;
        case bad_write::duplicate: REQUIRE_THROWS_AS(dev.check_errors(stream), dh::duplicate_in_batch); break;
        case bad_write::zero_count:
        case bad_write::wide_count: REQUIRE_THROWS_AS(dev.check_errors(stream), dh::size_mismatch); break;
        case bad_write::gap:
        case bad_write::negative_offset: REQUIRE_THROWS_AS(dev.check_errors(stream), dh::draft_write_out_of_order); break;
        case bad_write::too_wide: REQUIRE_THROWS_AS(dev.check_errors(stream), dh::block_too_wide); break;
      }
      if (bw != bad_write::none) {
        ++errors;
        dev.check_errors(stream);  // the record was cleared
      }
      same_stores(host, dev, books_out, stream);

      // ---- host-path calls in between now and then: they and the batched path share the books.
      if (pick(0, 3) == 0) {
        ++host_calls;
        const std::size_t s = pick(0, slots - 1);
        const std::uint64_t c = host.committed(s), w = host.written(s);
        switch (pick(0, 3)) {
          case 0:
            if (w > c) {
              const std::size_t a = pick(0, w - c - 1);
              host.commit(s, a);
              dev.commit(s, a, stream);
            }
            break;
          case 1:
            host.rollback(s);
            dev.rollback(s, stream);
            break;
          case 2: {
            if (w - c >= K) break;
            std::vector<std::byte> rows(layers * row_bytes);
            for (auto& b : rows) b = std::byte(rng());
            host.write(s, w, rows, 1);
            ok(dev.write(s, w, rows.data(), 1, stream));
            ok(cudaStreamSynchronize(stream));
            break;
          }
          default: {  // a new request in the slot
            host.reset(s);
            dev.reset(s, stream);
            const std::uint64_t p = pick(0, 2 * Ring::window + 3);
            const std::size_t count = static_cast<std::size_t>(std::min<std::uint64_t>(p, Ring::window));
            std::vector<std::byte> rows(count * layers * row_bytes);
            for (auto& b : rows) b = std::byte(rng());
            host.prefill(s, p, rows);
            ok(dev.prefill(s, p, rows.data(), count, stream));
            ok(cudaStreamSynchronize(stream));
          }
        }
      }

      // ---- commit_step: accepted counts for a random subset (device-side), maybe one bad.
      std::shuffle(order.begin(), order.end(), rng);
      std::vector<std::int32_t> c_slot, c_acc;
      room = slots - order.size();
      for (std::size_t s : order) {
        if (room > 1 && pick(0, 5) == 0) {
          --room;
          c_slot.push_back(-1);
          c_acc.push_back(1000);
        }
        const std::uint64_t block = host.written(s) - host.committed(s);
        if (block == 0) continue;
        c_slot.push_back(static_cast<std::int32_t>(s));
        c_acc.push_back(static_cast<std::int32_t>(pick(0, block - 1)));
      }
      bad_commit bc = c_slot.empty() || pick(0, 3) != 0 ? bad_commit::none : static_cast<bad_commit>(pick(1, 4));
      std::size_t cbad = 0;
      if (bc != bad_commit::none) {
        cbad = pick(0, c_slot.size() - 1);
        if (c_slot[cbad] < 0) {
          bc = bad_commit::none;
        } else {
          const auto s = static_cast<std::size_t>(c_slot[cbad]);
          switch (bc) {
            case bad_commit::slot: c_slot[cbad] = static_cast<std::int32_t>(slots); break;
            case bad_commit::duplicate:
              if (c_slot.size() >= slots) {
                bc = bad_commit::none;
                break;
              }
              c_slot.push_back(c_slot[cbad]);
              c_acc.push_back(0);
              cbad = c_slot.size() - 1;
              break;
            case bad_commit::beyond:
              c_acc[cbad] = static_cast<std::int32_t>(host.written(s) - host.committed(s) + pick(0, 2));
              break;
            default: c_acc[cbad] = -1;
          }
        }
      }
      if (!c_slot.empty()) {
        REQUIRE(c_slot.size() <= slots);
        upload(d_slots.data(), c_slot, stream);
        upload(d_accepted.data(), c_acc, stream);
        dev.commit_step(dhc::draft_commit_view{d_slots.data(), d_accepted.data(), static_cast<std::uint32_t>(c_slot.size())},
                        stream);
        std::vector<dh::draft_commit_item> citems;
        for (std::size_t e = 0; e < c_slot.size(); ++e)
          if (c_slot[e] >= 0 && !(bc != bad_commit::none && e == cbad))
            citems.push_back({static_cast<std::size_t>(c_slot[e]), static_cast<std::size_t>(c_acc[e])});
        host.commit_step(citems);
        good_commits += citems.size();
        switch (bc) {
          case bad_commit::none: dev.check_errors(stream); break;
          case bad_commit::slot: REQUIRE_THROWS_AS(dev.check_errors(stream), dh::invalid_slot); break;
          case bad_commit::duplicate: REQUIRE_THROWS_AS(dev.check_errors(stream), dh::duplicate_in_batch); break;
          default: REQUIRE_THROWS_AS(dev.check_errors(stream), dh::acceptance_beyond_block);
        }
        if (bc != bad_commit::none) ++errors;
        // A reset needs no readback: the slot is current again while the others stay stale.
        if (pick(0, 9) == 0) {
          const std::size_t s = pick(0, slots - 1);
          host.reset(s);
          dev.reset(s, stream);
          REQUIRE(dev.books_current(s));
          REQUIRE(dev.committed(s) == 0);
        }
        same_stores(host, dev, books_out, stream);
      }
    }
    INFO("writes=" << good_writes << " commits=" << good_commits << " claims=" << claims << " errors=" << errors
                   << " host calls=" << host_calls);
    REQUIRE(good_writes > rounds);
    REQUIRE(good_commits > rounds / 2);
    REQUIRE(claims > 0);
    REQUIRE(errors > rounds / 10);
  }
  ok(cudaStreamDestroy(stream));
}

// ------------------------------------------------------------------ graph replay

__host__ __device__ inline std::uint64_t mix(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
/// Block positions of entry e in round r, 1 .. K.
__host__ __device__ inline std::int32_t round_count(std::uint64_t r, unsigned e, unsigned k) {
  return 1 + static_cast<std::int32_t>(mix(r * 131 + e) % k);
}
/// Accepted proposals of entry e in round r: 0 .. count - 1, except every 37th round entry 1's,
/// which is one too many (a bad entry inside the graph).
__host__ __device__ inline std::int32_t round_accepted(std::uint64_t r, unsigned e, std::int32_t count) {
  if (e == 1 && r % 37 == 36) return count;
  return static_cast<std::int32_t>(mix(r * 977 + e + 5) % static_cast<std::uint64_t>(count));
}
__host__ __device__ inline unsigned char round_byte(std::uint64_t r, unsigned e, unsigned j, unsigned l, unsigned b) {
  return static_cast<unsigned char>(mix((((r * 64 + e) * 16 + j) * 8 + l) * 4096 + b));
}

/// The drafter's forward pass of round *round: each entry's block into the layer buffers (entry e
/// at rows e * K), its K_r into counts.
__global__ void draft_block(const std::uint64_t* round, const std::int32_t* slots, std::int32_t* counts,
                            std::byte* const* layer_rows, unsigned layers, unsigned row_bytes, unsigned k) {
  const unsigned e = blockIdx.x;
  const std::uint64_t r = *round;
  const std::int32_t count = round_count(r, e, k);
  if (threadIdx.x == 0) counts[e] = slots[e] < 0 ? 0 : count;  // padding carries anything
  for (unsigned i = threadIdx.x; i < static_cast<unsigned>(count) * layers * row_bytes; i += blockDim.x) {
    const unsigned b = i % row_bytes, l = (i / row_bytes) % layers, j = i / (row_bytes * layers);
    layer_rows[l][(static_cast<std::size_t>(e) * k + j) * row_bytes + b] = std::byte(round_byte(r, e, j, l, b));
  }
}

/// The drafter reading what it attends over, through the step ref (device books only): per entry,
/// the books and a position-weighted checksum of its window, logged at [round][entry].
template <class Ring>
__global__ void read_window(dhc::draft_ring_step_ref<Ring> ref, const std::uint64_t* round, const std::int32_t* slots,
                            unsigned long long* log) {
  const unsigned e = blockIdx.x;
  const std::int32_t slot = slots[e];
  const std::uint64_t r = *round;
  __shared__ unsigned long long sum;
  if (threadIdx.x == 0) sum = 0;
  __syncthreads();
  if (slot >= 0) {
    const dh::draft_window w = ref.window(slot);
    const std::size_t n = w.count * ref.ring.layers * ref.ring.row_bytes;
    unsigned long long mine = 0;
    for (std::size_t i = threadIdx.x; i < n; i += blockDim.x) {
      const std::size_t b = i % ref.ring.row_bytes, l = (i / ref.ring.row_bytes) % ref.ring.layers,
                        t = i / (ref.ring.row_bytes * ref.ring.layers);
      const std::size_t at = ref.window_location(slot, w, t);
      const std::byte* row = ref.ring.base + l * ref.ring.layer_stride() + at * ref.ring.row_bytes;
      mine += static_cast<unsigned long long>(row[b]) * (w.first + t + 1) * (l + 1);
    }
    atomicAdd(&sum, mine);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned long long* out = log + (r * gridDim.x + e) * 3;
    out[0] = slot < 0 ? 0 : ref.committed(slot);
    out[1] = slot < 0 ? 0 : ref.written(slot);
    out[2] = sum;
  }
}

/// The sampler: accepted counts of round *round on the device, then the next round.
__global__ void sample_accepted(std::uint64_t* round, const std::int32_t* counts, std::int32_t* accepted,
                                unsigned entries, unsigned k) {
  const std::uint64_t r = *round;
  for (unsigned e = threadIdx.x; e < entries; e += blockDim.x) accepted[e] = round_accepted(r, e, round_count(r, e, k));
  __syncthreads();
  if (threadIdx.x == 0) *round = r + 1;
  (void)counts;
}

template <class Ring>
void graph_replay(std::size_t slots, std::size_t row_bytes, std::size_t layers, std::size_t rounds) {
  constexpr unsigned K = Ring::max_block;
  INFO("W=" << Ring::window << " K_max=" << K << " row_bytes=" << row_bytes << " rounds=" << rounds);
  const dh::draft_ring_config cfg{slots, row_bytes, layers};
  cudaStream_t stream = nullptr;
  ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    dh::draft_ring_store<Ring> host(cfg);
    dhc::draft_ring_store<Ring> dev(cfg, stream);
    // Prompts, through the host path, on both.
    std::mt19937_64 rng(99);
    for (std::size_t s = 0; s < slots; ++s) {
      const std::uint64_t p = 3 + 5 * s;
      const std::size_t count = static_cast<std::size_t>(std::min<std::uint64_t>(p, Ring::window));
      std::vector<std::byte> rows(count * layers * row_bytes);
      for (auto& b : rows) b = std::byte(rng());
      host.prefill(s, p, rows);
      ok(dev.prefill(s, p, rows.data(), count, stream));
    }
    ok(cudaStreamSynchronize(stream));
    // Entries: every slot but 0 (which keeps its prompt) in reverse order, and one padding entry.
    std::vector<std::int32_t> e_slot;
    for (std::size_t s = slots; s-- > 1;) {
      e_slot.push_back(static_cast<std::int32_t>(s));
      if (e_slot.size() == 2) e_slot.push_back(-1);
    }
    const auto n = static_cast<unsigned>(e_slot.size());
    REQUIRE(n == slots);
    dhc::device_buffer<std::int32_t> d_slots(n), d_counts(n), d_accepted(n);
    upload(d_slots.data(), e_slot, stream);
    dhc::device_buffer<std::uint64_t> d_round(1);
    ok(cudaMemsetAsync(d_round.data(), 0, sizeof(std::uint64_t), stream));
    std::vector<dhc::device_buffer<std::byte>> d_layer;
    std::vector<std::byte*> layer_ptrs;
    for (std::size_t l = 0; l < layers; ++l) {
      d_layer.emplace_back(n * K * row_bytes);
      layer_ptrs.push_back(d_layer.back().data());
    }
    dhc::device_buffer<std::byte*> d_layer_ptrs(layers);
    upload(d_layer_ptrs.data(), layer_ptrs, stream);
    dhc::device_buffer<unsigned long long> d_log(rounds * n * 3);
    dhc::pinned_buffer books_out(slots * sizeof(dh::draft_slot_state));
    auto* out = reinterpret_cast<dh::draft_slot_state*>(books_out.data());

    dhc::draft_write_view wv;
    wv.slots = d_slots.data();
    wv.counts = d_counts.data();
    wv.layer_rows = d_layer_ptrs.data();
    wv.max_count = K;
    wv.capacity = n;
    const dhc::draft_commit_view cv{d_slots.data(), d_accepted.data(), n};

    cudaFuncAttributes attr{};  // load the test's kernels before the capture
    ok(cudaFuncGetAttributes(&attr, draft_block));
    ok(cudaFuncGetAttributes(&attr, read_window<Ring>));
    ok(cudaFuncGetAttributes(&attr, sample_accepted));
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    // A host call inside the capture is refused before it enqueues anything.
    REQUIRE_THROWS_AS(dev.commit(0, 0, stream), dh::invalid_configuration);
    draft_block<<<n, 128, 0, stream>>>(d_round.data(), d_slots.data(), d_counts.data(), d_layer_ptrs.data(),
                                       static_cast<unsigned>(layers), static_cast<unsigned>(row_bytes), K);
    dev.write_step(wv, stream);
    read_window<Ring><<<n, 128, 0, stream>>>(dev.step_ref(), d_round.data(), d_slots.data(), d_log.data());
    sample_accepted<<<1, 64, 0, stream>>>(d_round.data(), d_counts.data(), d_accepted.data(), n, K);
    dev.commit_step(cv, stream);
    dev.copy_books_async(std::span(out, slots), stream);
    ok(cudaStreamEndCapture(stream, &graph));
    ok(cudaGraphInstantiate(&exec, graph, 0));
    for (std::size_t r = 0; r < rounds; ++r) ok(cudaGraphLaunch(exec, stream));
    ok(cudaStreamSynchronize(stream));

    // The model: the same rounds through the host store's batched calls.
    std::vector<unsigned long long> want_log(rounds * n * 3, 0);
    std::size_t bad_commits = 0;
    for (std::uint64_t r = 0; r < rounds; ++r) {
      std::vector<std::vector<std::byte>> rows(n);
      std::vector<dh::draft_write_item> items;
      for (unsigned e = 0; e < n; ++e) {
        if (e_slot[e] < 0) continue;
        const auto count = static_cast<std::size_t>(round_count(r, e, K));
        rows[e].resize(count * layers * row_bytes);
        for (unsigned l = 0; l < layers; ++l)
          for (unsigned j = 0; j < count; ++j)
            for (unsigned b = 0; b < row_bytes; ++b)
              rows[e][(l * count + j) * row_bytes + b] = std::byte(round_byte(r, e, j, l, b));
        items.push_back({static_cast<std::size_t>(e_slot[e]), 0, rows[e], count});
      }
      host.write_step(items);
      for (unsigned e = 0; e < n; ++e) {
        if (e_slot[e] < 0) continue;
        const auto s = static_cast<std::size_t>(e_slot[e]);
        const dh::draft_window w = host.window(s);
        unsigned long long sum = 0;
        for (std::size_t t = 0; t < w.count; ++t)
          for (std::size_t l = 0; l < layers; ++l) {
            const auto row = host.row(s, w.first + t, l);
            for (std::size_t b = 0; b < row_bytes; ++b)
              sum += static_cast<unsigned long long>(row[b]) * (w.first + t + 1) * (l + 1);
          }
        unsigned long long* at = want_log.data() + (r * n + e) * 3;
        at[0] = host.committed(s);
        at[1] = host.written(s);
        at[2] = sum;
      }
      std::vector<dh::draft_commit_item> commits;
      for (unsigned e = 0; e < n; ++e) {
        if (e_slot[e] < 0) continue;
        const std::int32_t count = round_count(r, e, K);
        const std::int32_t a = round_accepted(r, e, count);
        if (a >= count) {
          ++bad_commits;  // refused on the device, untouched: the model skips it
          continue;
        }
        commits.push_back({static_cast<std::size_t>(e_slot[e]), static_cast<std::size_t>(a)});
      }
      host.commit_step(commits);
    }
    REQUIRE(bad_commits == rounds / 37);
    // The first bad entry of the first failing launch (round 36, entry 1), then nothing.
    if (bad_commits > 0) REQUIRE_THROWS_AS(dev.check_errors(stream), dh::acceptance_beyond_block);
    dev.check_errors(stream);

    std::vector<unsigned long long> got_log(want_log.size());
    ok(cudaMemcpy(got_log.data(), d_log.data(), got_log.size() * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
    for (std::size_t r = 0; r < rounds; ++r)
      for (unsigned e = 0; e < n; ++e) {
        INFO("round " << r << " entry " << e);
        for (int k = 0; k < 3; ++k) REQUIRE(got_log[(r * n + e) * 3 + k] == want_log[(r * n + e) * 3 + k]);
      }
    for (std::size_t s = 0; s < slots; ++s) {  // the copy captured in the graph, after the last round
      REQUIRE(out[s].committed == host.committed(s));
      REQUIRE(out[s].written == host.written(s));
    }
    std::uint64_t far = 0;
    for (std::size_t s = 0; s < slots; ++s) far = std::max(far, host.committed(s));
    REQUIRE(far > 2 * Ring::rows_per_slot);  // the rings wrapped
    same_stores(host, dev, books_out, stream);
    // After the readback the host path works again and keeps the device books in step.
    host.rollback(0);
    dev.rollback(0, stream);
    same_stores(host, dev, books_out, stream);

    ok(cudaGraphExecDestroy(exec));
    ok(cudaGraphDestroy(graph));
  }
  ok(cudaStreamDestroy(stream));
}

}  // namespace

TEST_CASE("draft ring write_step/commit_step match the host store's batched calls", "[gpu][draft_ring_step]") {
  // Even seeds: strided buffers; seeds divisible by 3: unaligned buffers (byte copies).
  eager_rounds<dh::draft_ring<5, 3, 2>>(4, 8, 2, 400, 30);      // byte rows, strided, unaligned
  eager_rounds<dh::draft_ring<64, 8, 16>>(5, 48, 3, 300, 31);   // 16-byte vectors
  eager_rounds<dh::draft_ring<0, 1, 1>>(3, 4, 1, 200, 33);      // no window, K_max 1; unaligned
  eager_rounds<dh::draft_ring<16, 4, 8>>(6, 32, 2, 300, 34);    // 16-byte vectors with a stride
}

TEST_CASE("draft ring step path replays in one CUDA graph with device accepted counts", "[gpu][draft_ring_step]") {
  graph_replay<dh::draft_ring<5, 3, 2>>(4, 8, 2, 240);
  graph_replay<dh::draft_ring<64, 8, 16>>(3, 48, 3, 260);
}

TEST_CASE("draft ring step path: bad views throw before any work", "[gpu][draft_ring_step]") {
  using ring = dh::draft_ring<8, 4, 4>;
  dhc::draft_ring_store<ring> dev({.slots = 2, .row_bytes = 16, .layers = 1});
  dhc::device_buffer<std::int32_t> a(4), b(4);
  dhc::draft_write_view wv{a.data(), b.data(), nullptr, nullptr, nullptr, 0, 0, 2};
  dev.write_step({}, nullptr);  // capacity 0: nothing
  REQUIRE(dev.books_current(0));
  auto bad = wv;
  bad.counts = nullptr;
  REQUIRE_THROWS_AS(dev.write_step(bad, nullptr), dh::size_mismatch);
  bad = wv;
  bad.capacity = 3;
  REQUIRE_THROWS_AS(dev.write_step(bad, nullptr), dh::size_mismatch);
  bad = wv;
  bad.max_count = 5;
  REQUIRE_THROWS_AS(dev.write_step(bad, nullptr), dh::size_mismatch);
  bad = wv;
  bad.row_stride = 8;
  REQUIRE_THROWS_AS(dev.write_step(bad, nullptr), dh::size_mismatch);
  REQUIRE_THROWS_AS(dev.commit_step({a.data(), nullptr, 1}, nullptr), dh::size_mismatch);
  REQUIRE_THROWS_AS(dev.commit_step({a.data(), b.data(), 3}, nullptr), dh::size_mismatch);
  REQUIRE(dev.books_current(0));  // nothing was launched: the host cache is still current
  std::vector<dh::draft_slot_state> pageable(2);
  REQUIRE_THROWS_AS(dev.copy_books_async(pageable, nullptr), dh::invalid_configuration);
  dhc::device_buffer<dh::draft_slot_state> three(3);
  REQUIRE_THROWS_AS(dev.copy_books_async(std::span(three.data(), 3), nullptr), dh::size_mismatch);
  REQUIRE_THROWS_AS((void)dev.books_current(2), dh::invalid_slot);
}

namespace {
/// Holds its stream for `ns` nanoseconds (global timer).
__global__ void hold_stream(unsigned long long ns) {
  unsigned long long t0 = 0, t = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}
}  // namespace

TEST_CASE("draft ring: host book pushes keep host-call order across streams", "[gpu][draft_ring_step]") {
  using ring = dh::draft_ring<8, 4, 4>;
  const dh::draft_ring_config cfg{.slots = 2, .row_bytes = 16, .layers = 2};
  cudaStream_t a = nullptr, b = nullptr;
  ok(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  ok(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  {
    dh::draft_ring_store<ring> host(cfg);
    dhc::draft_ring_store<ring> dev(cfg, a);  // the calls without a stream go to `a`
    std::vector<std::byte> rows(2 * 2 * 16, std::byte{3});
    host.write(0, 0, rows, 2);
    ok(dev.write(0, 0, rows.data(), 2, a));
    ok(cudaStreamSynchronize(a));
    // `a` is held 50 ms, so its book push lands late unless the push on `b` waits for it.
    hold_stream<<<1, 1, 0, a>>>(50'000'000ull);
    ok(cudaGetLastError());
    host.commit(0, 1);
    dev.commit(0, 1);  // on `a`: committed 2
    host.write(0, 2, std::span(rows).first(2 * 16), 1);
    ok(dev.write(0, 2, rows.data(), 1, b));  // on `b`: written 3
    ok(cudaStreamSynchronize(a));
    ok(cudaStreamSynchronize(b));
    dhc::pinned_buffer out(2 * sizeof(dh::draft_slot_state));
    auto* books = reinterpret_cast<dh::draft_slot_state*>(out.data());
    dev.copy_books_async(std::span(books, 2), b);
    ok(cudaStreamSynchronize(b));
    REQUIRE(books[0].committed == host.committed(0));  // 2
    REQUIRE(books[0].written == host.written(0));      // 3, not 2 (the late push of `a`)
    REQUIRE(books[1].written == 0);
  }
  ok(cudaStreamDestroy(a));
  ok(cudaStreamDestroy(b));
}
