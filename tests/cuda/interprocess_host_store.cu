// One host store shared by CUDA ranks in different processes (cuda::interprocess_pinned_host_store;
// docs/multi-gpu.md, "One store across processes"). One GPU is enough: two processes (fork() before
// any CUDA call, since a CUDA context does not survive fork) each take device 0, open the same
// named store (registered in each process with cudaHostRegister, portable and mapped) and build the
// cuda::hierarchy of their rank over it. They run the same admit / append / resolve / complete
// script, in lockstep through a process-shared barrier placed where an engine orders each owner's
// host writes before other ranks' reads: after the appends, each rank joins its backup, absorbs its
// books and synchronises its stream.
//
// Expected values come from the test's own model (support/row_content.hpp: row bytes are a function
// of (request tag, source, layer, row)). Checked in both processes: every resolved location holds
// the exact bytes in every payload layer; every stored row's host copy in the shared mapping is
// exact, whichever process's GPU wrote it; each rank wrote the rows of the pages it owns (page p:
// rank p mod 2) and the two sum to the rows appended once; host bytes in use are one copy; pages
// and requests return after both complete. The child reports failures through its exit status.
#include "cuda_test_support.cuh"

#include <sys/wait.h>
#include <unistd.h>

#include <memory>

#include "../support/process_barrier.hpp"
#include "../support/row_content.hpp"
#include "../support/shared_store_model.hpp"
#include "dhisparse/cuda/interprocess_host_store.cuh"

namespace {

using namespace dhtest;
namespace rc = dhisparse_testing;
using namespace shared_store_model;
constexpr std::size_t kRanks = 2;
using CH = dhc::hierarchy<L, dh::lru_hot_cache<kB>>;
using Store = dhc::interprocess_pinned_host_store<L>;
constexpr std::size_t kSources = CH::sources;
constexpr std::size_t K = L::top_k;
constexpr std::size_t kRequests = kSlots, kSteps = 24;


/// Counts failures instead of using Catch2 macros, which the forked child cannot report.
struct tally {
  std::size_t failures = 0;
  std::string first;
  void check(bool ok, const std::string& what) {
    if (ok) return;
    if (failures++ == 0) first = what;
  }
  void cuda(cudaError_t e, const char* what) { check(e == cudaSuccess, std::string(what) + ": " + cudaGetErrorString(e)); }
};

/// Rank `rank`'s process: its hierarchy on device 0 over `store`, the script, the checks.
tally run_rank(Store& store, std::size_t rank, rc::process_barrier& sync) {
  tally t;
  cudaStream_t stream = nullptr;
  t.cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  {
    CH h(config(), store, rank, stream);
    t.check(h.shares_host_store() && h.rank() == rank, "rank");
    dhc::device_buffer<dh::row_index> sel{kRequests * K};
    dhc::device_buffer<dh::location> loc{kRequests * K};
    std::mt19937_64 rng(5);  // the same selections in both processes
    for (std::size_t r = 0; r < kRequests; ++r) t.check(h.admit(r + 1, stream).admitted, "admit");
    std::int64_t rows = 0;
    for (std::size_t step = 0; step < kSteps; ++step) {
      const std::size_t count = step % 4 == 0 ? 3 : 1;
      if (rows + static_cast<std::int64_t>(count) <= static_cast<std::int64_t>(kRows)) {
        for (std::size_t r = 0; r < kRequests; ++r)
          for (std::size_t s = 0; s < kSources; ++s) {
            const auto buf = rc::make_append_buffer(rc::request_tag(r + 1), s, layers(s), row_bytes(s), rows, count);
            h.append(r + 1, s, std::span<const std::byte>(buf), count, stream);
          }
        rows += static_cast<std::int64_t>(count);
      }
      h.join_backup(stream);  // the engine's ordering: this rank's host writes done before others read
      h.sync_books(stream);
      t.cuda(cudaStreamSynchronize(stream), "append");
      sync.wait();
      for (std::size_t s = 0; s < kSources; ++s) {
        std::vector<dh::row_index> staged(kRequests * K);
        std::vector<CH::batch_item> items(kRequests);
        for (std::size_t r = 0; r < kRequests; ++r) {
          for (std::size_t i = 0; i < K; ++i) staged[r * K + i] = static_cast<dh::row_index>(rng() % static_cast<std::uint64_t>(rows));
          items[r] = {r + 1, sel.data() + r * K, static_cast<std::int32_t>(K), loc.data() + r * K};
        }
        t.cuda(cudaMemcpy(sel.data(), staged.data(), staged.size() * sizeof(dh::row_index), cudaMemcpyHostToDevice), "sel");
        h.resolve(s, std::span<const CH::batch_item>(items), stream);
        t.cuda(cudaStreamSynchronize(stream), "resolve");
        h.check_errors(stream);
        std::vector<dh::location> got(kRequests * K);
        t.cuda(cudaMemcpy(got.data(), loc.data(), got.size() * sizeof(dh::location), cudaMemcpyDeviceToHost), "loc");
        for (std::size_t l = 0; l < layers(s); ++l) {
          std::vector<std::byte> pool(h.pool_rows() * row_bytes(s));
          h.copy_pool(s, l, pool);
          for (std::size_t e = 0; e < got.size(); ++e)
            t.check(got[e] >= 0 && rc::row_matches({pool.data() + static_cast<std::size_t>(got[e]) * row_bytes(s), row_bytes(s)},
                                                   rc::request_tag(e / K + 1), s, l, staged[e]),
                    "rank " + std::to_string(rank) + " step " + std::to_string(step) + " source " + std::to_string(s) +
                        ": resolved row " + std::to_string(staged[e]) + " of request " + std::to_string(e / K + 1) +
                        " has wrong bytes");
        }
      }
      sync.wait();  // nobody appends the next step while the other rank still resolves
    }
    // Every stored row's host copy in the shared mapping, whichever process wrote it.
    for (std::size_t r = 0; r < kRequests; ++r)
      for (std::size_t s = 0; s < kSources; ++s)
        for (std::int64_t row = 0; row < rows; ++row) {
          const auto g = store.host_page(r + 1, s, static_cast<std::size_t>(row) / kP);
          for (std::size_t l = 0; l < layers(s); ++l)
            t.check(g != dh::no_page && rc::row_matches(store.row(s, g, l, row), rc::request_tag(r + 1), s, l, row),
                    "host copy of row " + std::to_string(row) + " of request " + std::to_string(r + 1));
        }
    std::size_t one_copy = 0;
    for (std::size_t s = 0; s < kSources; ++s)
      one_copy += kRequests * ((static_cast<std::size_t>(rows) + kP - 1) / kP) * page_bytes(s);
    t.check(store.host_bytes_in_use() == one_copy, "host bytes in use: one copy");
    std::uint64_t owned = 0;
    for (std::int64_t row = 0; row < rows; ++row) owned += (static_cast<std::size_t>(row) / kP) % kRanks == rank ? 1 : 0;
    t.check(store.rows_written(rank) == owned * kRequests * kSources, "rows written by the rank: its pages' rows");
    t.check(store.rows_written(0) + store.rows_written(1) == static_cast<std::uint64_t>(rows) * kRequests * kSources,
            "rows written: each row once");
    sync.wait();
    for (std::size_t r = 0; r < kRequests; ++r) h.complete(r + 1, stream);
    t.cuda(cudaStreamSynchronize(stream), "complete");
    sync.wait();
    for (std::size_t s = 0; s < kSources; ++s) t.check(store.free_host_pages(s) == kHostPages, "pages back");
    t.check(store.requests() == 0, "requests gone");
  }
  cudaStreamDestroy(stream);
  return t;
}

}  // namespace

TEST_CASE("CUDA ranks in two processes share one store in shared memory", "[gpu][shared_store][interprocess]") {
  // Fork first: neither process has touched CUDA yet.
  const std::string name = "/dhisparse-gpu-test-" + std::to_string(getpid());
  Store::remove(name);
  rc::process_barrier sync(kRanks);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    int rc = 3;
    try {
      DHISPARSE_CUDA_TRY(cudaSetDevice(0));
      sync.wait();  // the parent created the store
      auto store = Store::open(name);
      const tally t = run_rank(store, 1, sync);
      if (t.failures) std::fprintf(stderr, "child (rank 1): %zu failures, first: %s\n", t.failures, t.first.c_str());
      rc = t.failures == 0 ? 0 : 1;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child (rank 1): %s\n", e.what());
      rc = 2;
    }
    _exit(rc);
  }
  tally t;
  std::string error;
  try {
    DHISPARSE_CUDA_TRY(cudaSetDevice(0));
    auto store = Store::create(name, kRanks, kHostPages);
    sync.wait();
    t = run_rank(store, 0, sync);
  } catch (const std::exception& e) {  // the creator has unlinked the name; the child gives up at its next barrier
    error = e.what();
  }
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  INFO("parent (rank 0): " << t.failures << " failures, first: " << t.first << error);
  CHECK(error.empty());
  CHECK(t.failures == 0);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}
