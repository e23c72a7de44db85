// CUDA draft ring store against the host store: the randomized scenario of the host test, shorter,
// driving both with identical calls (writes from pageable host and from device memory, rounds with
// random acceptance, rollbacks, resets, bad input). Compared byte for byte: the whole ring after
// every few operations, and the live window as a kernel reads it through the device ref.
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

/// Gathers the rows of `count` window positions (ring locations given) of every layer, through the
/// ref, into out[(l * count + j) * row_bytes ...]: the access a drafter's attention makes.
template <class Ring>
__global__ void gather_window(dh::draft_ring_ref<Ring> ring, std::size_t slot, std::uint64_t first, std::size_t count,
                              const std::size_t* locations, std::byte* out, int* mismatched_location) {
  const std::size_t total = ring.layers * count * ring.row_bytes;
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
    const std::size_t b = i % ring.row_bytes, j = (i / ring.row_bytes) % count, l = i / (ring.row_bytes * count);
    if (b == 0 && l == 0 && dh::draft_ring_ref<Ring>::location(slot, first + j) != locations[j]) *mismatched_location = 1;
    out[i] = ring.row(slot, first + j, l)[b];
  }
}

void ok(cudaError_t e) { REQUIRE(e == cudaSuccess); }

template <class Ring>
void twin_scenario(std::size_t slots, std::size_t row_bytes, std::size_t layers, std::size_t ops, std::uint64_t seed) {
  constexpr std::size_t K = Ring::max_block;
  INFO("W=" << Ring::window << " K_max=" << K << " p=" << Ring::page_rows << " seed=" << seed);
  const dh::draft_ring_config cfg{slots, row_bytes, layers};
  cudaStream_t stream = nullptr;
  ok(cudaStreamCreate(&stream));
  {
    dh::draft_ring_store<Ring> host(cfg);
    dhc::draft_ring_store<Ring> dev(cfg, stream);
    REQUIRE(dev.allocated_bytes() == dhc::draft_ring_store<Ring>::requirements(cfg).bytes);
    REQUIRE(dev.allocated_bytes() == host.memory().bytes);
    const std::size_t pb = row_bytes * layers, window_cap = Ring::window + K;
    dhc::device_buffer<std::byte> src(K * pb), gathered(window_cap * pb);
    dhc::device_buffer<std::size_t> locations(window_cap);
    dhc::device_buffer<int> flag(1);
    ok(cudaMemsetAsync(flag.data(), 0, sizeof(int), stream));
    std::mt19937_64 rng(seed);
    auto pick = [&](std::uint64_t lo, std::uint64_t hi) { return std::uniform_int_distribution<std::uint64_t>(lo, hi)(rng); };

    auto same_books = [&] {
      for (std::size_t s = 0; s < slots; ++s) {
        REQUIRE(dev.committed(s) == host.committed(s));
        REQUIRE(dev.written(s) == host.written(s));
      }
    };
    auto same_bytes = [&] {
      std::vector<std::byte> got(dev.allocated_bytes());
      ok(cudaMemcpyAsync(got.data(), dev.ref().base, got.size(), cudaMemcpyDeviceToHost, stream));
      ok(cudaStreamSynchronize(stream));
      REQUIRE(std::equal(got.begin(), got.end(), host.storage().begin()));
    };
    auto same_window = [&](std::size_t s) {
      const auto w = host.window(s);
      const auto dw = dev.window(s);
      REQUIRE((dw.first == w.first && dw.count == w.count));
      const auto locs = dev.window_locations(s);
      REQUIRE(locs == host.window_locations(s));
      if (w.count == 0) return;
      ok(cudaMemcpyAsync(locations.data(), locs.data(), locs.size() * sizeof(std::size_t), cudaMemcpyHostToDevice, stream));
      gather_window<Ring><<<4, 128, 0, stream>>>(dev.ref(), s, w.first, w.count, locations.data(), gathered.data(), flag.data());
      ok(cudaGetLastError());
      std::vector<std::byte> got(w.count * pb);
      int mismatch = 0;
      ok(cudaMemcpyAsync(got.data(), gathered.data(), got.size(), cudaMemcpyDeviceToHost, stream));
      ok(cudaMemcpyAsync(&mismatch, flag.data(), sizeof(int), cudaMemcpyDeviceToHost, stream));
      ok(cudaStreamSynchronize(stream));
      REQUIRE(mismatch == 0);
      for (std::size_t l = 0; l < layers; ++l)
        for (std::size_t j = 0; j < w.count; ++j) {
          auto want = host.row(s, w.first + j, l);
          REQUIRE(std::equal(want.begin(), want.end(), got.begin() + (l * w.count + j) * row_bytes));
          REQUIRE(dev.row(s, w.first + j, l) == dev.ref().row(s, w.first + j, l));
        }
    };

    std::size_t writes = 0, commits = 0, prefills = 0;
    for (std::size_t op = 0; op < ops; ++op) {
      const std::size_t s = pick(0, slots - 1);
      const std::uint64_t c = host.committed(s), w = host.written(s);
      const std::uint64_t roll = pick(0, 99);
      if (roll < 45) {
        const std::uint64_t first = pick(c, w);
        if (first - c >= K) continue;
        const std::size_t count = pick(1, K - (first - c));
        std::vector<std::byte> rows(count * pb);
        for (auto& b : rows) b = std::byte(rng());
        host.write(s, first, rows, count);
        if (pick(0, 1) == 0) {
          ok(dev.write(s, first, rows.data(), count, stream));  // pageable host source
        } else {
          ok(cudaMemcpyAsync(src.data(), rows.data(), rows.size(), cudaMemcpyHostToDevice, stream));
          ok(dev.write(s, first, src.data(), count, stream));  // device source
          ok(cudaStreamSynchronize(stream));                   // `rows` dies before the next copy
        }
        ++writes;
      } else if (roll < 70) {
        if (w == c) continue;
        const std::size_t accepted = pick(0, w - c - 1);
        host.commit(s, accepted);
        dev.commit(s, accepted);
        ++commits;
      } else if (roll < 73) {
        host.rollback(s);
        dev.rollback(s);
      } else if (roll < 74 && pick(0, 3) == 0) {
        host.reset(s);
        dev.reset(s);
        {  // the next request's prompt: its last min(n, W) positions, committed at once
          const std::uint64_t n = pick(0, 3 * Ring::window + 5);
          const std::size_t count = static_cast<std::size_t>(std::min<std::uint64_t>(n, Ring::window));
          std::vector<std::byte> rows(count * pb);
          for (auto& b : rows) b = std::byte(rng());
          host.prefill(s, n, rows);
          ok(dev.prefill(s, n, rows.data(), count, stream));  // pageable host source
          ++prefills;
        }
      } else if (roll < 90) {
        same_window(s);
      } else {  // bad input: the same typed error on both, neither changes
        std::vector<std::byte> one(pb);
        switch (pick(0, 5)) {
          case 0:
            if (c > 0) REQUIRE_THROWS_AS(dev.write(s, pick(0, c - 1), one.data(), 1, stream), dh::draft_write_out_of_order);
            break;
          case 1: REQUIRE_THROWS_AS(dev.write(s, w + 1, one.data(), 1, stream), dh::draft_write_out_of_order); break;
          case 2: REQUIRE_THROWS_AS(dev.write(s, c, src.data(), K + 1, stream), dh::block_too_wide); break;
          case 3: REQUIRE_THROWS_AS(dev.commit(s, w - c), dh::acceptance_beyond_block); break;
          case 4:
            if (w != 0) REQUIRE_THROWS_AS(dev.prefill(s, 1, one.data(), 1, stream), dh::draft_write_out_of_order);
            else REQUIRE_THROWS_AS(dev.prefill(s, Ring::window + 3, one.data(), Ring::window + 1, stream), dh::size_mismatch);
            break;
          default:
            REQUIRE_THROWS_AS(dev.write(slots, 0, one.data(), 1, stream), dh::invalid_slot);
            REQUIRE_THROWS_AS((void)dev.row(s, w), dh::draft_position_not_live);
        }
      }
      same_books();
      if (op % 256 == 0) same_bytes();
    }
    same_bytes();
    for (std::size_t s = 0; s < slots; ++s) same_window(s);
    REQUIRE(writes > ops / 4);
    REQUIRE(commits > ops / 8);
    REQUIRE(prefills > 0);
  }
  ok(cudaStreamDestroy(stream));
}

}  // namespace

TEST_CASE("CUDA draft ring store matches the host store", "[gpu][draft_ring_store]") {
  twin_scenario<dh::draft_ring<5, 3, 2>>(4, 8, 2, 6000, 11);
  twin_scenario<dh::draft_ring<64, 8, 16>>(3, 48, 3, 6000, 12);
  twin_scenario<dh::draft_ring<0, 1, 1>>(2, 4, 1, 3000, 13);
}

TEST_CASE("CUDA draft ring store: DFlash2-sized ring allocates what the host sizing says", "[gpu][draft_ring_store]") {
  using ring = dh::draft_ring<2048, 8, 64>;
  const dh::draft_ring_config cfg{.slots = 4, .row_bytes = 2048, .layers = 6};
  dhc::draft_ring_store<ring> dev(cfg);
  REQUIRE(dev.allocated_bytes() == std::size_t{4} * 2176 * 2048 * 6);
  std::vector<std::byte> block(8 * dev.position_bytes(), std::byte{7});
  REQUIRE(dev.write(2, 0, block.data(), 8, nullptr) == cudaSuccess);
  dev.commit(2, 7);
  REQUIRE(cudaStreamSynchronize(nullptr) == cudaSuccess);
  std::byte b{};
  REQUIRE(cudaMemcpy(&b, dev.row(2, 7, 5), 1, cudaMemcpyDeviceToHost) == cudaSuccess);
  REQUIRE(b == std::byte{7});
}
