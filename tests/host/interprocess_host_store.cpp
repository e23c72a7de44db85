// One host store shared by ranks in different processes (interprocess_host_store; docs/multi-gpu.md).
//
// fork() gives two processes; each opens the store by name (a name unique to this test run,
// removed at the end), builds the host_hierarchy of its rank and runs the same admit / append /
// resolve / complete script, the two kept in lockstep by a process-shared barrier (the engine's
// collectives). Expected values come from the test's own model: row bytes are a function of
// (request tag, source, layer, row) (support/row_content.hpp), and the owner of history page p is
// rank p mod 2. Checked: every resolved row's bytes in every layer; the rows each rank wrote to the
// store are the rows of the pages it owns and sum to the rows appended once; host bytes in use are
// one copy of every history; pages and requests return after both ranks complete. The child
// reports failures through its exit status. Bad input: missing, taken and malformed names, a store
// of another layout, one never initialised, a rank bound in another process, a request capacity too
// small; a rank process that dies (reclaim_rank) and one that dies holding the lock (lock_owner_died).
#include "../support/catch.hpp"

#include <dhisparse/host/hierarchy.hpp>
#include <dhisparse/host/interprocess_host_store.hpp>
#include <dhisparse/layouts/single_source.hpp>
#include <dhisparse/layouts/tiny.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <exception>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "../support/process_barrier.hpp"
#include "../support/row_content.hpp"
#include "../support/shared_store_model.hpp"

namespace {

using namespace dhisparse;
namespace rc = dhisparse_testing;
using namespace shared_store_model;
constexpr std::size_t kRanks = 2;
using H = host_hierarchy<L, lru_hot_cache<kB>>;
using Store = interprocess_host_store<L>;
constexpr std::size_t kSources = H::sources;


/// A name no other run uses at the same time; removed when the guard goes.
struct unique_name {
  std::string name;
  explicit unique_name(const char* what) {
    static std::atomic<int> n{0};
    name = "/dhisparse-test-" + std::to_string(getpid()) + "-" + what + "-" + std::to_string(n++);
    Store::remove(name);
  }
  ~unique_name() { Store::remove(name); }
};

/// Runs `child` in a forked process (its return value is the exit status, 99 for an exception) and
/// `parent` here; returns the child's exit status.
int fork_and_run(const std::function<int()>& child, const std::function<void()>& parent = [] {}) {
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    int rc = 99;
    try {
      rc = child();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child process: %s\n", e.what());
    } catch (...) {
    }
    _exit(rc);  // no Catch2 teardown or destructors of the parent's objects in the child
  }
  parent();
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

constexpr std::size_t kRequests = kSlots, kSteps = 40;
/// Rows per (request, source) after the script: 3 rows every 5th step, else 1, within kRows.
std::int64_t script_rows() {
  std::int64_t rows = 0;
  for (std::size_t t = 0; t < kSteps; ++t)
    if (const std::int64_t c = t % 5 == 0 ? 3 : 1; rows + c <= static_cast<std::int64_t>(kRows)) rows += c;
  return rows;
}

/// One rank's script; returns its count of failures (wrong bytes, a wrong count). Rank 0 also checks
/// the store's counters at the points where both ranks are past their writes.
std::size_t run_rank(Store& store, std::size_t rank, rc::process_barrier& sync) {
  std::size_t failures = 0;
  H h(config(), store, rank);
  std::mt19937_64 rng(99);  // the same selections on both ranks
  for (std::size_t r = 0; r < kRequests; ++r) failures += h.admit(static_cast<request_id>(r + 1)).admitted ? 0 : 1;
  for (std::size_t t = 0; t < kSteps; ++t) {
    for (std::size_t r = 0; r < kRequests; ++r)
      for (std::size_t s = 0; s < kSources; ++s) {
        const auto id = static_cast<request_id>(r + 1);
        const auto count = static_cast<std::size_t>(t % 5 == 0 ? 3 : 1);
        const auto rows = h.frontier(id, s);
        if (rows + static_cast<std::int64_t>(count) > static_cast<std::int64_t>(kRows)) continue;
        h.append(id, s, rc::make_append_buffer(rc::request_tag(r + 1), s, layers(s), row_bytes(s), rows, count), count);
      }
    sync.wait();  // both ranks' owned rows are in the store
    for (std::size_t r = 0; r < kRequests; ++r)
      for (std::size_t s = 0; s < kSources; ++s) {
        const auto id = static_cast<request_id>(r + 1);
        const auto rows = h.frontier(id, s);
        std::vector<row_index> sel(L::top_k);
        for (auto& e : sel) e = static_cast<row_index>(rng() % static_cast<std::uint64_t>(rows));
        std::vector<location> loc(sel.size());
        h.resolve(id, s, sel, loc);
        for (std::size_t i = 0; i < sel.size(); ++i)
          for (std::size_t l = 0; l < layers(s); ++l)
            if (!rc::row_matches({h.pool(s, l) + static_cast<std::size_t>(loc[i]) * row_bytes(s), row_bytes(s)},
                                 rc::request_tag(r + 1), s, l, sel[i]))
              ++failures;
      }
    sync.wait();  // nobody appends the next step while the other rank still resolves
  }
  // Every history stored once: the pages of kRequests histories of script_rows() rows per source.
  const std::int64_t rows = script_rows();
  std::size_t one_copy = 0;
  for (std::size_t s = 0; s < kSources; ++s)
    one_copy += kRequests * ((static_cast<std::size_t>(rows) + kP - 1) / kP) * page_bytes(s);
  if (store.host_bytes_in_use() != one_copy) ++failures;
  if (h.host_bytes_in_use() != one_copy) ++failures;
  // Rows written by each rank: those of the pages it owns, each once (page p: rank p mod 2).
  std::uint64_t owned = 0;
  for (std::int64_t r = 0; r < rows; ++r) owned += (static_cast<std::size_t>(r) / kP) % kRanks == rank ? 1 : 0;
  if (store.rows_written(rank) != owned * kRequests * kSources) ++failures;
  if (store.rows_written(0) + store.rows_written(1) != static_cast<std::uint64_t>(rows) * kRequests * kSources) ++failures;
  for (std::size_t s = 0; s < kSources; ++s)
    for (std::size_t p = 0; p * kP < static_cast<std::size_t>(rows); ++p)
      if (store.page_holders(s, store.host_page(1, s, p)) != 0b11) ++failures;
  sync.wait();
  for (std::size_t r = 0; r < kRequests; ++r) h.complete(static_cast<request_id>(r + 1));
  sync.wait();  // both completed: every page back
  for (std::size_t s = 0; s < kSources; ++s)
    if (store.free_host_pages(s) != kHostPages) ++failures;
  if (store.requests() != 0) ++failures;
  return failures;
}

}  // namespace

TEST_CASE("two processes share one store by name", "[host][shared_store][interprocess]") {
  unique_name n("two");
  const auto creator = Store::create(n.name, kRanks, kHostPages);
  CHECK(creator.creator());
  CHECK(creator.ranks() == kRanks);
  CHECK(creator.request_capacity() == kRanks * Store::default_requests_per_rank);
  rc::process_barrier sync(2);
  std::size_t parent_failures = 0;
  const int child = fork_and_run(
      [&] {
        auto store = Store::open(n.name);
        return run_rank(store, 1, sync) == 0 ? 0 : 1;
      },
      [&] {
        auto store = Store::open(n.name);
        CHECK_FALSE(store.creator());
        parent_failures = run_rank(store, 0, sync);
      });
  CHECK(child == 0);
  CHECK(parent_failures == 0);
  // After both processes: the creator's view sees what they did.
  const std::uint64_t rows = static_cast<std::uint64_t>(script_rows()) * kRequests * kSources;
  CHECK(creator.rows_written(0) + creator.rows_written(1) == rows);
  CHECK(creator.host_bytes_in_use() == 0);
  CHECK(creator.requests() == 0);
  Store again = Store::open(n.name);  // both ranks are free again
  H r0(config(), again, 0), r1(config(), again, 1);
  CHECK(r0.rank() == 0);
}

TEST_CASE("interprocess store misuse throws typed errors with the state unchanged",
          "[host][shared_store][interprocess]") {
  SECTION("names") {
    unique_name n("names");
    CHECK_THROWS_AS(Store::open(n.name), shared_memory_error);  // missing
    CHECK_THROWS_AS(Store::create("a/b", 2, 4), invalid_configuration);
    CHECK_THROWS_AS(Store::create("", 2, 4), invalid_configuration);
    CHECK_THROWS_AS(Store::create(n.name, 0, 4), invalid_configuration);
    CHECK_THROWS_AS(Store::open(n.name), shared_memory_error);  // a refused create left nothing behind
    const auto store = Store::create(n.name, 2, 4);
    CHECK_THROWS_AS(Store::create(n.name, 2, 4), shared_memory_error);  // taken
    CHECK(Store::open(n.name).host_pages() == 4);
    CHECK(Store::open(n.name.substr(1)).host_pages() == 4);  // "name" and "/name" are one store
  }
  SECTION("the creator unlinks the name; mappings stay valid") {
    unique_name n("unlink");
    auto creator = std::make_unique<Store>(Store::create_t{}, n.name, 2, kHostPages);
    Store opened = Store::open(n.name);
    creator.reset();
    CHECK_THROWS_AS(Store::open(n.name), shared_memory_error);
    H r0(config(), opened, 0);
    CHECK(r0.admit(1).admitted);
    r0.append(1, 1, rc::make_append_buffer(rc::request_tag(1), 1, 1, 32, 0, 8), 8);
    CHECK(opened.rows_written(0) == 8);
  }
  SECTION("another layout, another format, never initialised") {
    unique_name n("layout");
    const auto store = Store::create(n.name, 2, 4);
    using Other = interprocess_host_store<layouts::single_source<64, 16, 8>>;
    CHECK_THROWS_AS(Other::open(n.name), invalid_configuration);
    // A shared memory object of the right size whose creator never finished: open gives up.
    unique_name raw("raw");
    const int fd = shm_open(raw.name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    REQUIRE(fd >= 0);
    REQUIRE(ftruncate(fd, static_cast<off_t>(Store::mapping_bytes(2, 4))) == 0);
    close(fd);
    CHECK_THROWS_AS(Store::open(raw.name, std::chrono::milliseconds(20)), shared_memory_error);
    // Marked ready but not a dhisparse store (bad magic number).
    {
      const int fd2 = shm_open(raw.name.c_str(), O_RDWR, 0);
      REQUIRE(fd2 >= 0);
      void* p = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd2, 0);
      close(fd2);
      REQUIRE(p != MAP_FAILED);
      static_cast<std::uint32_t*>(p)[3] = 1;  // the header's ready word (after magic and version)
      munmap(p, 4096);
    }
    CHECK_THROWS_AS(Store::open(raw.name, std::chrono::milliseconds(20)), invalid_configuration);
  }
  SECTION("a rank bound in another process; a request capacity too small") {
    unique_name n("bound");
    const auto creator = Store::create(n.name, 2, kHostPages, /*request_capacity=*/2 * kSlots);
    rc::process_barrier sync(2);
    const int child = fork_and_run(
        [&] {
          auto store = Store::open(n.name);
          sync.wait();  // the parent holds rank 0
          int rc = 0;
          try {
            H h(config(), store, 0);
            rc = 1;
          } catch (const invalid_configuration&) {
          }
          if (!store.rank_bound(0) || store.rank_bound(1)) rc = 2;
          H h1(config(), store, 1);  // the other rank is free
          sync.wait();
          return rc;
        },
        [&] {
          auto store = Store::open(n.name);
          H h(config(), store, 0);
          sync.wait();
          sync.wait();
        });
    CHECK(child == 0);
    auto store = Store::open(n.name);
    auto big = config();
    big.max_requests = kSlots + 1;  // 2 ranks x 5 > 8 requests
    CHECK_THROWS_AS(H(big, store, 0), invalid_configuration);
    CHECK_FALSE(store.rank_bound(0));
  }
  SECTION("a rank process that dies: reclaim_rank gives its holds back") {
    unique_name n("dies");
    auto store = Store::create(n.name, 2, kHostPages);
    H r0(config(), store, 0);
    CHECK(r0.admit(5).admitted);
    const auto buf = rc::make_append_buffer(rc::request_tag(5), 1, 1, 32, 0, 16);
    r0.append(5, 1, buf, 16);
    const int child = fork_and_run([&] {
      auto mine = Store::open(n.name);
      auto* h = new H(config(), mine, 1);  // never destroyed: the process dies with it
      if (!h->admit(5)) return 1;
      h->append(5, 1, buf, 16);
      if (!h->admit(6)) return 1;
      h->append(6, 1, rc::make_append_buffer(rc::request_tag(6), 1, 1, 32, 0, 8), 8);
      return 0;
    });
    REQUIRE(child == 0);
    CHECK(store.rank_bound(1));
    CHECK(store.attached_ranks(5) == 0b11);
    CHECK(store.free_host_pages(1) == kHostPages - 3);
    CHECK_THROWS_AS(H(config(), store, 1), invalid_configuration);
    store.reclaim_rank(1);
    CHECK_FALSE(store.rank_bound(1));
    CHECK(store.attached_ranks(5) == 0b01);
    CHECK(store.attached_ranks(6) == 0);
    CHECK(store.free_host_pages(1) == kHostPages - 2);
    CHECK_THROWS_AS(store.reclaim_rank(1), invalid_configuration);  // nothing to reclaim, nothing changed
    CHECK_THROWS_AS(store.reclaim_rank(2), invalid_configuration);
    H r1(config(), store, 1);  // the rank can be taken again
    r0.complete(5);
    CHECK(store.free_host_pages(1) == kHostPages);
  }
  SECTION("a process that dies holding the lock: lock_owner_died, every call after") {
    unique_name n("lock");
    auto store = Store::create(n.name, 2, kHostPages);
    const int child = fork_and_run([&] {
      auto mine = Store::open(n.name);
      mine.books().mutex().lock();  // dies inside an update (its mapping still in place, as a crash leaves it)
      _exit(0);
      return 0;
    });
    REQUIRE(child == 0);
    CHECK_THROWS_AS(store.requests(), lock_owner_died);
    CHECK_THROWS_AS(store.requests(), lock_owner_died);
    CHECK_THROWS_AS(H(config(), store, 0), lock_owner_died);
  }
}
