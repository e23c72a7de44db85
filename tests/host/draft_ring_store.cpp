// Host draft ring store against a tiny reference model: randomized writes, rounds with random
// acceptance, rollbacks, window reads and slot resets (>= 10^5 operations per policy), exact bytes;
// bad input throws the typed error and changes nothing; memory agrees with the planner.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <random>
#include <span>
#include <vector>

#include <dhisparse/host/draft_ring_store.hpp>
#include <dhisparse/layouts/glm53.hpp>
#include <dhisparse/planner.hpp>

#include "../support/catch.hpp"

namespace {

namespace dh = ::dhisparse;

/// The reference: per slot, committed count, written end and the bytes of every position ever
/// written, by position (no ring, so aliasing in the store would show as a byte mismatch).
struct model_slot {
  std::uint64_t committed = 0, written = 0;
  std::map<std::uint64_t, std::vector<std::byte>> bytes;  // position -> layers * row_bytes
};

template <class Ring>
void check_against_model(std::size_t slots, std::size_t row_bytes, std::size_t layers, std::size_t ops, std::uint64_t seed) {
  constexpr std::uint64_t W = Ring::window, K = Ring::max_block;
  INFO("W=" << W << " K_max=" << K << " p=" << Ring::page_rows << " seed=" << seed);
  const dh::draft_ring_config cfg{slots, row_bytes, layers};
  dh::draft_ring_store<Ring> store(cfg);
  REQUIRE(store.memory().bytes == slots * Ring::rows_per_slot * row_bytes * layers);
  REQUIRE(store.storage().size() == store.memory().bytes);
  std::vector<model_slot> model(slots);
  std::mt19937_64 rng(seed);
  auto pick = [&](std::uint64_t lo, std::uint64_t hi) { return std::uniform_int_distribution<std::uint64_t>(lo, hi)(rng); };
  const std::size_t pb = row_bytes * layers;

  auto live_first = [&](const model_slot& m) { return m.committed > W ? m.committed - W : 0; };
  auto check_read = [&](std::size_t s, std::uint64_t t) {
    const model_slot& m = model[s];
    const bool live = t >= live_first(m) && t < m.written;
    if (!live) {
      REQUIRE_THROWS_AS(store.row(s, t), dh::draft_position_not_live);
      REQUIRE_THROWS_AS(store.location(s, t), dh::draft_position_not_live);
      return;
    }
    REQUIRE(store.location(s, t) == Ring::address(s, t));
    const auto& want = m.bytes.at(t);
    for (std::size_t l = 0; l < layers; ++l) {
      auto got = store.row(s, t, l);
      REQUIRE(got.size() == row_bytes);
      REQUIRE(std::equal(got.begin(), got.end(), want.begin() + l * row_bytes));
    }
  };
  // A rejected call must leave books and bytes exactly as they were.
  auto expect_unchanged = [&](auto&& call) {
    const std::vector<std::byte> before(store.storage().begin(), store.storage().end());
    std::vector<std::pair<std::uint64_t, std::uint64_t>> books;
    for (std::size_t s = 0; s < slots; ++s) books.emplace_back(store.committed(s), store.written(s));
    call();
    REQUIRE(std::equal(before.begin(), before.end(), store.storage().begin()));
    for (std::size_t s = 0; s < slots; ++s) REQUIRE(books[s] == std::make_pair(store.committed(s), store.written(s)));
  };

  std::size_t writes = 0, commits = 0, reads = 0, errors = 0, prefills = 0;
  std::uint64_t far = 0;  // furthest committed position reached by any slot
  for (std::size_t op = 0; op < ops; ++op) {
    const std::size_t s = pick(0, slots - 1);
    model_slot& m = model[s];
    const std::uint64_t roll = pick(0, 99);
    if (roll < 40) {  // write a run of block positions starting at or before the written end
      const std::uint64_t first = pick(m.committed, m.written);
      if (first - m.committed >= K) continue;
      const std::size_t count = pick(1, K - (first - m.committed));
      std::vector<std::byte> src(count * pb);
      for (auto& b : src) b = std::byte(rng());
      store.write(s, first, src, count);
      for (std::size_t j = 0; j < count; ++j) {
        auto& row = m.bytes[first + j];
        row.resize(pb);
        for (std::size_t l = 0; l < layers; ++l)
          std::copy_n(src.begin() + (l * count + j) * row_bytes, row_bytes, row.begin() + l * row_bytes);
      }
      m.written = first + count;
      ++writes;
    } else if (roll < 60) {  // a verification round ends: random acceptance within what was written
      if (m.written == m.committed) continue;
      const std::size_t accepted = pick(0, m.written - m.committed - 1);
      store.commit(s, accepted);
      m.committed += accepted + 1;
      m.written = m.committed;
      far = std::max(far, m.committed);
      ++commits;
    } else if (roll < 62) {
      store.rollback(s);
      m.written = m.committed;
    } else if (roll < 63 && pick(0, 3) == 0) {  // requests end now and then; rings must wrap first
      store.reset(s);
      m = model_slot{};
      if (pick(0, 1) == 0) {  // the next request starts with a prompt: its last min(n, W) positions
        const std::uint64_t n = pick(0, 3 * W + 5);
        const std::size_t count = static_cast<std::size_t>(std::min(n, W));
        std::vector<std::byte> src(count * pb);
        for (auto& b : src) b = std::byte(rng());
        store.prefill(s, n, src);
        for (std::size_t j = 0; j < count; ++j) {
          auto& row = m.bytes[n - count + j];
          row.resize(pb);
          for (std::size_t l = 0; l < layers; ++l)
            std::copy_n(src.begin() + (l * count + j) * row_bytes, row_bytes, row.begin() + l * row_bytes);
        }
        m.committed = m.written = n;
        far = std::max(far, m.committed);
        ++prefills;
      }
    } else if (roll < 85) {  // reads around the live range, live or not
      const std::uint64_t lo = live_first(m) > 2 ? live_first(m) - 2 : 0;
      check_read(s, pick(lo, m.written + 2));
      ++reads;
    } else if (roll < 92) {  // the window: live locations in position order
      const auto w = store.window(s);
      REQUIRE(w.first == live_first(m));
      REQUIRE(w.count == m.written - live_first(m));
      const auto locs = store.window_locations(s);
      REQUIRE(locs.size() == w.count);
      for (std::size_t j = 0; j < locs.size(); ++j) REQUIRE(locs[j] == Ring::address(s, w.first + j));
      for (std::size_t j = 0; j < locs.size(); ++j) check_read(s, w.first + j);
      ++reads;
    } else {  // bad input: typed error, nothing changes
      ++errors;
      std::vector<std::byte> one(pb);
      switch (pick(0, 7)) {
        case 0:
          if (m.committed == 0) break;
          expect_unchanged([&] { REQUIRE_THROWS_AS(store.write(s, pick(0, m.committed - 1), one), dh::draft_write_out_of_order); });
          break;
        case 1:
          expect_unchanged([&] { REQUIRE_THROWS_AS(store.write(s, m.written + pick(1, 3), one), dh::draft_write_out_of_order); });
          break;
        case 2: {
          std::vector<std::byte> many((K + 1) * pb);
          expect_unchanged([&] { REQUIRE_THROWS_AS(store.write(s, m.committed, many, K + 1), dh::block_too_wide); });
          break;
        }
        case 3:
          expect_unchanged([&] {
            REQUIRE_THROWS_AS(store.commit(s, m.written - m.committed + pick(0, 2)), dh::acceptance_beyond_block);
          });
          break;
        case 4:
          expect_unchanged([&] { REQUIRE_THROWS_AS(store.write(s, m.committed, std::span(one).first(pb - 1)), dh::size_mismatch); });
          break;
        case 5:
          expect_unchanged([&] {
            REQUIRE_THROWS_AS(store.write(slots + pick(0, 3), 0, one), dh::invalid_slot);
            REQUIRE_THROWS_AS(store.commit(slots, 0), dh::invalid_slot);
            REQUIRE_THROWS_AS(store.reset(slots), dh::invalid_slot);
            REQUIRE_THROWS_AS((void)store.window(slots), dh::invalid_slot);
          });
          break;
        case 6:  // a prefill of a slot that holds positions, or with the wrong number of rows
          expect_unchanged([&] {
            const std::uint64_t n = W + 2;
            std::vector<std::byte> rows(W * pb);
            if (m.written != 0) REQUIRE_THROWS_AS(store.prefill(s, n, rows), dh::draft_write_out_of_order);
            if (m.written == 0 && W > 0) REQUIRE_THROWS_AS(store.prefill(s, n, std::span(rows).first((W - 1) * pb)), dh::size_mismatch);
            REQUIRE_THROWS_AS(store.prefill(slots, n, rows), dh::invalid_slot);
          });
          break;
        default:
          expect_unchanged([&] {
            std::vector<std::size_t> small(m.written - live_first(m));
            if (small.empty()) return;
            small.pop_back();
            REQUIRE_THROWS_AS(store.window_into(s, small), dh::size_mismatch);
          });
      }
    }
    // The model forgets positions that can never be read again (keeps it tiny).
    while (!m.bytes.empty() && m.bytes.begin()->first < live_first(m)) m.bytes.erase(m.bytes.begin());
  }
  INFO("writes=" << writes << " commits=" << commits << " reads=" << reads << " errors=" << errors
                   << " prefills=" << prefills);
  REQUIRE(prefills > 0);
  REQUIRE(writes > ops / 4);
  REQUIRE(commits > ops / 10);
  // Rings wrapped many times: memory stayed R_d rows per slot while positions ran far past it.
  REQUIRE(far > 3 * Ring::rows_per_slot);
}

}  // namespace

TEST_CASE("draft ring store matches the reference model", "[draft_ring_store]") {
  check_against_model<dh::draft_ring<5, 3, 2>>(4, 8, 2, 120000, 1);
  check_against_model<dh::draft_ring<0, 1, 1>>(3, 4, 1, 100000, 2);
  check_against_model<dh::draft_ring<7, 4, 4>>(5, 3, 3, 100000, 3);
  check_against_model<dh::draft_ring<16, 8, 8>>(2, 16, 1, 100000, 4);
}

TEST_CASE("draft ring store: prefill by write and commit, window after wrap", "[draft_ring_store]") {
  using ring = dh::draft_ring<6, 2, 2>;  // R_d = 8
  dh::draft_ring_store<ring> store({.slots = 2, .row_bytes = 1, .layers = 1});
  for (std::uint64_t t = 0; t < 20; ++t) {
    const std::byte b{static_cast<unsigned char>(t)};
    store.write(1, t, std::span(&b, 1));
    store.commit(1, 0);
  }
  const auto w = store.window(1);
  REQUIRE(w.first == 14);
  REQUIRE(w.count == 6);
  for (std::uint64_t t = 14; t < 20; ++t) REQUIRE(store.row(1, t)[0] == std::byte{static_cast<unsigned char>(t)});
  REQUIRE_THROWS_AS(store.row(1, 13), dh::draft_position_not_live);
  REQUIRE(store.window(0).count == 0);  // the other slot is untouched
  store.reset(1);
  REQUIRE(store.committed(1) == 0);
  REQUIRE_THROWS_AS(store.row(1, 19), dh::draft_position_not_live);
}

TEST_CASE("draft ring store: bad configuration", "[draft_ring_store]") {
  using ring = dh::draft_ring<4, 2, 2>;
  REQUIRE_THROWS_AS(dh::draft_ring_store<ring>::requirements({.slots = 0, .row_bytes = 8}), dh::invalid_configuration);
  REQUIRE_THROWS_AS(dh::draft_ring_store<ring>::requirements({.slots = 1, .row_bytes = 0}), dh::invalid_configuration);
  REQUIRE_THROWS_AS(dh::draft_ring_store<ring>::requirements({.slots = 1, .row_bytes = 8, .layers = 0}),
                    dh::invalid_configuration);
  REQUIRE_THROWS_AS(dh::draft_ring_store<ring>::requirements({.slots = SIZE_MAX / 2, .row_bytes = 8}),
                    dh::invalid_configuration);
}

TEST_CASE("draft ring store memory equals the planner's draft ring", "[draft_ring_store]") {
  // DFlash2 on GLM-5.3: six layers, K and V of 1024 bytes each per position.
  using ring = dh::draft_ring<2048, 8, 64>;
  const auto& d = dh::drafters::dflash2;
  static_assert(ring::window == 2048 && ring::max_block == 8 && ring::page_rows == 64);
  dh::plan_inputs in;
  in.context_tokens = 4096;
  in.drafter = d;
  in.slots = 35;
  const auto p = dh::plan<dh::layouts::glm53>(in);
  const auto req = dh::draft_ring_store<ring>::requirements(
      {.slots = 35,
       .row_bytes = dh::drafters::dflash2_allocations_per_layer * dh::drafters::dflash2_allocation_row_bytes,
       .layers = dh::drafters::dflash2_draft_layers});
  REQUIRE(req.rows_per_slot == p.ring_rows);
  REQUIRE(req.bytes_per_slot == p.draft_ring);
  REQUIRE(req.bytes == p.ring_bytes_for_slots);
}

namespace {

/// Batched rounds (write_step, then commit_step) against the test's own model of ring positions:
/// per slot the committed count, the written end and the bytes of every position by position. Each
/// round names a random subset of slots in random order; a write item picks a random offset in the
/// written block and a count up to K_max; acceptance is random within what was written. Every few
/// rounds one item of a batch is made bad: the typed error, and nothing of the batch happens.
template <class Ring>
void batched_rounds(std::size_t slots, std::size_t row_bytes, std::size_t layers, std::size_t rounds,
                    std::uint64_t seed) {
  constexpr std::uint64_t W = Ring::window, K = Ring::max_block;
  INFO("W=" << W << " K_max=" << K << " seed=" << seed);
  dh::draft_ring_store<Ring> store({slots, row_bytes, layers});
  std::vector<model_slot> model(slots);
  std::mt19937_64 rng(seed);
  auto pick = [&](std::uint64_t lo, std::uint64_t hi) { return std::uniform_int_distribution<std::uint64_t>(lo, hi)(rng); };
  const std::size_t pb = row_bytes * layers;
  auto live_first = [&](const model_slot& m) { return m.committed > W ? m.committed - W : 0; };
  auto same_as_model = [&] {
    for (std::size_t s = 0; s < slots; ++s) {
      const model_slot& m = model[s];
      REQUIRE(store.committed(s) == m.committed);
      REQUIRE(store.written(s) == m.written);
      for (std::uint64_t t = live_first(m); t < m.written; ++t)
        for (std::size_t l = 0; l < layers; ++l) {
          const auto got = store.row(s, t, l);
          const auto& want = m.bytes.at(t);
          REQUIRE(std::equal(got.begin(), got.end(), want.begin() + l * row_bytes));
        }
    }
  };
  auto snapshot = [&] {
    std::vector<std::uint64_t> b;
    for (std::size_t s = 0; s < slots; ++s) b.insert(b.end(), {store.committed(s), store.written(s)});
    return std::make_pair(b, std::vector<std::byte>(store.storage().begin(), store.storage().end()));
  };

  std::size_t written_items = 0, committed_items = 0, bad_batches = 0;
  for (std::size_t round = 0; round < rounds; ++round) {
    std::vector<std::size_t> order(slots);
    for (std::size_t s = 0; s < slots; ++s) order[s] = s;
    std::shuffle(order.begin(), order.end(), rng);
    order.resize(pick(1, slots));

    // The drafter's blocks: positions committed + offset .. as the model says.
    std::vector<std::vector<std::byte>> bytes(order.size());
    std::vector<dh::draft_write_item> writes;
    for (std::size_t i = 0; i < order.size(); ++i) {
      const model_slot& m = model[order[i]];
      const std::uint64_t offset = pick(0, std::min<std::uint64_t>(m.written - m.committed, K - 1));
      const std::size_t count = pick(1, K - offset);
      bytes[i].resize(count * pb);
      for (auto& b : bytes[i]) b = std::byte(rng());
      writes.push_back({order[i], offset, bytes[i], count});
    }
    if (round % 7 == 3) {  // one bad item: the whole batch is refused, nothing changes
      ++bad_batches;
      auto bad = writes;
      const std::size_t i = pick(0, bad.size() - 1);
      const model_slot& m = model[bad[i].slot];
      const auto before = snapshot();
      std::vector<std::byte> wide((K + 1) * pb);
      switch (pick(0, 5)) {
        case 0:
          bad[i].slot = slots + pick(0, 2);
          REQUIRE_THROWS_AS(store.write_step(bad), dh::invalid_slot);
          break;
        case 1:
          bad.push_back(bad[i]);
          REQUIRE_THROWS_AS(store.write_step(bad), dh::duplicate_in_batch);
          break;
        case 2:
          bad[i].offset = m.written - m.committed + pick(1, 2);
          REQUIRE_THROWS_AS(store.write_step(bad), dh::draft_write_out_of_order);
          break;
        case 3:
          bad[i] = {bad[i].slot, 0, wide, K + 1};
          REQUIRE_THROWS_AS(store.write_step(bad), dh::block_too_wide);
          break;
        case 4:
          bad[i].rows = bad[i].rows.first(bad[i].rows.size() - 1);
          REQUIRE_THROWS_AS(store.write_step(bad), dh::size_mismatch);
          break;
        default:
          bad[i].count = 0;
          bad[i].rows = {};
          REQUIRE_THROWS_AS(store.write_step(bad), dh::size_mismatch);
      }
      REQUIRE(snapshot() == before);
    }
    store.write_step(writes);
    for (const auto& it : writes) {
      model_slot& m = model[it.slot];
      const std::uint64_t first = m.committed + it.offset;
      for (std::size_t j = 0; j < it.count; ++j) {
        auto& row = m.bytes[first + j];
        row.resize(pb);
        for (std::size_t l = 0; l < layers; ++l)
          std::copy_n(it.rows.begin() + (l * it.count + j) * row_bytes, row_bytes, row.begin() + l * row_bytes);
      }
      m.written = first + it.count;
      ++written_items;
    }
    same_as_model();

    // The sampler's accepted counts, for the slots with a written block (in yet another order).
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<dh::draft_commit_item> commits;
    for (std::size_t s : order)
      if (model[s].written > model[s].committed && pick(0, 5) != 0)
        commits.push_back({s, static_cast<std::size_t>(pick(0, model[s].written - model[s].committed - 1))});
    if (round % 5 == 2 && !commits.empty()) {
      ++bad_batches;
      auto bad = commits;
      const std::size_t i = pick(0, bad.size() - 1);
      const model_slot& m = model[bad[i].slot];
      const auto before = snapshot();
      switch (pick(0, 2)) {
        case 0:
          bad[i].accepted = m.written - m.committed + pick(0, 2);
          REQUIRE_THROWS_AS(store.commit_step(bad), dh::acceptance_beyond_block);
          break;
        case 1:
          bad.push_back(bad[i]);
          REQUIRE_THROWS_AS(store.commit_step(bad), dh::duplicate_in_batch);
          break;
        default:
          bad[i].slot = slots;
          REQUIRE_THROWS_AS(store.commit_step(bad), dh::invalid_slot);
      }
      REQUIRE(snapshot() == before);
    }
    store.commit_step(commits);
    for (const auto& it : commits) {
      model_slot& m = model[it.slot];
      m.committed += it.accepted + 1;
      m.written = m.committed;
      while (!m.bytes.empty() && m.bytes.begin()->first < live_first(m)) m.bytes.erase(m.bytes.begin());
      ++committed_items;
    }
    same_as_model();
  }
  INFO("written=" << written_items << " committed=" << committed_items << " bad=" << bad_batches);
  REQUIRE(written_items > rounds);
  REQUIRE(committed_items > rounds / 2);
  REQUIRE(bad_batches > rounds / 10);
  // A slot that never moves has nothing to wrap; the busiest one ran past its ring several times.
  std::uint64_t far = 0;
  for (const auto& m : model) far = std::max(far, m.committed);
  REQUIRE(far > 2 * Ring::rows_per_slot);
}

}  // namespace

TEST_CASE("draft ring store: batched write_step and commit_step match the model", "[draft_ring_store]") {
  batched_rounds<dh::draft_ring<5, 3, 2>>(4, 8, 2, 3000, 21);
  batched_rounds<dh::draft_ring<0, 1, 1>>(3, 4, 1, 2000, 22);
  batched_rounds<dh::draft_ring<16, 8, 8>>(6, 16, 3, 2000, 23);
}

TEST_CASE("draft ring store: empty batches change nothing", "[draft_ring_store]") {
  using ring = dh::draft_ring<4, 2, 2>;
  dh::draft_ring_store<ring> store({.slots = 2, .row_bytes = 4});
  store.write_step({});
  store.commit_step({});
  REQUIRE(store.written(0) == 0);
  // A commit of a slot with nothing written is a commit beyond the block, batched or not.
  const dh::draft_commit_item c{1, 0};
  REQUIRE_THROWS_AS(store.commit_step(std::span(&c, 1)), dh::acceptance_beyond_block);
}
