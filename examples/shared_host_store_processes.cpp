// shared_host_store_processes: the tensor-parallel ranks of one host, ONE PROCESS PER RANK, over one
// host store in shared memory (docs/multi-gpu.md, "One store across processes"), host backend. The
// integration template of an engine that runs a process per GPU: one process creates the store by
// name, every rank's process opens it and builds its hierarchy over it, so every request's history
// is stored once on the host instead of once per process.
//
//   launcher (here the parent, before it forks):  interprocess_host_store<L>::create(name, 2, pages)
//   every rank's process:                         auto store = interprocess_host_store<L>::open(name);
//                                                 host_hierarchy<L> h(cfg, store, rank);
//     admit each request, append its prefill (longer than the tail: rows go to the store at once)
//     per decode step: append one row per request and source
//                      barrier                   <- every rank's writes before any rank's reads
//                      resolve per source, attention reads exactly the returned locations
//
// Each rank writes to the store only the rows of the history pages it owns (page p: rank p mod N)
// and reads the others' rows from it; the barrier (the engine's collective; here a process-shared
// pthread barrier) is what makes another process's row be there when it is read.
//
// Checks: every resolved location in both processes holds the exact bytes of the selected row
// (computed here from (request, source, layer, row)); host bytes in use equal one copy of the
// histories; the rows written per rank sum to the rows appended once. Exits non-zero on failure.
#include <dhisparse/host/hierarchy.hpp>
#include <dhisparse/host/interprocess_host_store.hpp>

#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <pthread.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using namespace dhisparse;

/// Source 0: 128-byte rows in 2 payload layers (producer + follower); source 1: 64-byte rows in 1.
struct model_layout {
  static constexpr std::size_t top_k = 32;
  static constexpr std::size_t page_rows = 16;
  static constexpr std::array<source_desc, 2> sources{{{128, 1, 2, 32}, {64, 1, 1, 32}}};
  static constexpr std::array<consumer_desc, 3> consumers{{
      {0, consumer_kind::reindex, 0}, {0, consumer_kind::follower, 1}, {1, consumer_kind::reindex, 0}}};
};
static_assert(check_layout<model_layout>());

using H = host_hierarchy<model_layout, lru_hot_cache<64>>;
using Store = interprocess_host_store<model_layout>;
constexpr std::size_t kRanks = 2, kSources = 2, kSlots = 4, kRequests = 3, kP = model_layout::page_rows;
constexpr std::size_t kTail = 16, kMaxRows = 256, kPrefill = 40, kSteps = 50;

std::size_t layers(std::size_t s) { return model_layout::sources[s].payload_layers; }
std::size_t row_bytes(std::size_t s) { return model_layout::sources[s].row_bytes; }

/// The content of a row: a function of (request, source, layer, row), so any process can check it.
std::byte row_byte(request_id id, std::size_t s, std::size_t l, std::int64_t row, std::size_t i) {
  std::uint64_t x = id * 0x9E3779B97F4A7C15ull ^ (s + 1) * 0xBF58476D1CE4E5B9ull ^ (l + 7) * 0x94D049BB133111EBull ^
                    static_cast<std::uint64_t>(row) * 0x2545F4914F6CDD1Dull ^ i;
  x ^= x >> 29;
  return static_cast<std::byte>(x * 0x5851F42D4C957F2Dull >> 56);
}
std::vector<std::byte> rows_of(request_id id, std::size_t s, std::int64_t first, std::size_t count) {
  std::vector<std::byte> out(layers(s) * count * row_bytes(s));  // [layer][row][bytes]
  for (std::size_t l = 0; l < layers(s); ++l)
    for (std::size_t r = 0; r < count; ++r)
      for (std::size_t i = 0; i < row_bytes(s); ++i)
        out[(l * count + r) * row_bytes(s) + i] = row_byte(id, s, l, first + static_cast<std::int64_t>(r), i);
  return out;
}

/// What both processes share besides the store: the barrier and each rank's results (anonymous
/// shared memory made before fork).
struct rendezvous {
  pthread_barrier_t barrier;
  std::uint64_t rows_read[kRanks], wrong_bytes[kRanks], host_bytes_in_use, failed[kRanks];
};

void run_rank(Store& store, std::size_t rank, rendezvous& rv) {
  hierarchy_config cfg;
  cfg.max_requests = kSlots;
  cfg.max_rows = kMaxRows;
  cfg.tail_rows = kTail;
  H h(cfg, store, rank);
  std::mt19937_64 rng(7);  // the same selections in both processes
  for (request_id id = 1; id <= kRequests; ++id) {
    if (!h.admit(id)) throw std::runtime_error("no free slot for request " + std::to_string(id));
    for (std::size_t s = 0; s < kSources; ++s) h.append(id, s, rows_of(id, s, 0, kPrefill), kPrefill);
  }
  for (std::size_t t = 0; t < kSteps; ++t) {
    for (request_id id = 1; id <= kRequests; ++id)
      for (std::size_t s = 0; s < kSources; ++s) h.append(id, s, rows_of(id, s, h.frontier(id, s), 1), 1);
    pthread_barrier_wait(&rv.barrier);  // every rank's owned rows are in the store
    for (request_id id = 1; id <= kRequests; ++id)
      for (std::size_t s = 0; s < kSources; ++s) {
        std::vector<row_index> sel(model_layout::top_k);
        for (auto& e : sel) e = static_cast<row_index>(rng() % static_cast<std::uint64_t>(h.frontier(id, s)));
        std::vector<location> loc(sel.size());
        h.resolve(id, s, sel, loc);
        for (std::size_t i = 0; i < sel.size(); ++i)
          for (std::size_t l = 0; l < layers(s); ++l) {
            const std::byte* row = h.pool(s, l) + static_cast<std::size_t>(loc[i]) * row_bytes(s);
            for (std::size_t b = 0; b < row_bytes(s); ++b)
              rv.wrong_bytes[rank] += row[b] != row_byte(id, s, l, sel[i], b) ? 1 : 0;
            ++rv.rows_read[rank];
          }
      }
    pthread_barrier_wait(&rv.barrier);  // nobody appends the next step while another rank still resolves
  }
  if (rank == 0) rv.host_bytes_in_use = store.host_bytes_in_use();
  pthread_barrier_wait(&rv.barrier);
  for (request_id id = 1; id <= kRequests; ++id) h.complete(id);
}

}  // namespace

int main() {
  const std::string name = "/dhisparse-example-" + std::to_string(getpid());
  auto* rv = static_cast<rendezvous*>(
      mmap(nullptr, sizeof(rendezvous), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  if (rv == MAP_FAILED) return 1;
  std::memset(rv, 0, sizeof(rendezvous));
  pthread_barrierattr_t attr;
  pthread_barrierattr_init(&attr);
  pthread_barrierattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
  pthread_barrier_init(&rv->barrier, &attr, kRanks);

  // The launcher creates the store (the name must be new); its object unlinks the name when it goes.
  auto creator = Store::create(name, kRanks, kSlots * kMaxRows / kP);
  const pid_t child = fork();
  if (child == 0) {  // rank 1's process
    int rc = 0;
    try {
      auto store = Store::open(name);
      run_rank(store, 1, *rv);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rank 1 failed: %s\n", e.what());
      rc = 1;
    }
    _exit(rc);  // not the parent's objects' destructors (the creator's unlink is the parent's)
  }
  bool ok = child > 0;
  try {
    auto store = Store::open(name);  // rank 0's process opens it as any rank would
    run_rank(store, 0, *rv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank 0 failed: %s\n", e.what());
    ok = false;
  }
  int status = 0;
  ok = ok && waitpid(child, &status, 0) == child && WIFEXITED(status) && WEXITSTATUS(status) == 0;

  const std::size_t rows = kPrefill + kSteps;
  std::size_t one_copy = 0;
  for (std::size_t s = 0; s < kSources; ++s) one_copy += kRequests * ((rows + kP - 1) / kP) * kP * layers(s) * row_bytes(s);
  const std::uint64_t appended = kRequests * kSources * rows;
  const std::uint64_t total = creator.rows_written(0) + creator.rows_written(1);
  const std::uint64_t read = rv->rows_read[0] + rv->rows_read[1], wrong = rv->wrong_bytes[0] + rv->wrong_bytes[1];
  ok = ok && read > 0 && wrong == 0 && rv->host_bytes_in_use == one_copy && total == appended &&
       creator.host_bytes_in_use() == 0 && creator.requests() == 0;

  std::printf("shared_host_store_processes: %zu rank processes over one host store in shared memory (%s), "
              "%zu requests, %zu decode steps\n", kRanks, name.c_str(), kRequests, kSteps);
  std::printf("  resolved rows checked in both processes: %llu, wrong bytes: %llu\n",
              static_cast<unsigned long long>(read), static_cast<unsigned long long>(wrong));
  std::printf("  host bytes in use: %llu (expected %zu); one store per process would hold %zu\n",
              static_cast<unsigned long long>(rv->host_bytes_in_use), one_copy, kRanks * one_copy);
  std::printf("  rows written per rank: %llu %llu (sum %llu, rows appended %llu; page p written by rank p mod %zu)\n",
              static_cast<unsigned long long>(creator.rows_written(0)),
              static_cast<unsigned long long>(creator.rows_written(1)), static_cast<unsigned long long>(total),
              static_cast<unsigned long long>(appended), kRanks);
  std::printf("%s\n", ok ? "OK" : "FAILED");
  pthread_barrier_destroy(&rv->barrier);
  munmap(rv, sizeof(rendezvous));
  return ok ? 0 : 1;
}
