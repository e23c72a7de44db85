#pragma once
// Shared helpers of the CUDA tests (tests/cuda/*.cu): test layouts, deterministic row content,
// a host/CUDA twin that drives both backends with identical calls and compares them, and
// self-diagnosing comparisons that print the first mismatch with its context.
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "../support/catch.hpp"
#include "dhisparse/cuda/hierarchy.cuh"
#include "dhisparse/host/hierarchy.hpp"
#include "dhisparse/layouts/tiny.hpp"

namespace dhtest {

namespace dh = ::dhisparse;
namespace dhc = ::dhisparse::cuda;
using dh::location;
using dh::request_id;
using dh::row_index;

// ------------------------------------------------------------------ layouts

/// 576-byte rows (GLM-5.3 payload) with one follower layer, and a 656-byte source: k=256.
struct layout_576 {
  static constexpr std::size_t top_k = 256;
  static constexpr std::size_t page_rows = 64;
  static constexpr std::array<dh::source_desc, 2> sources{{
      {576, 1, 2, 132},
      {656, 1, 1, 132},
  }};
  static constexpr std::array<dh::consumer_desc, 3> consumers{{
      {0, dh::consumer_kind::reindex, 0},
      {0, dh::consumer_kind::follower, 1},
      {1, dh::consumer_kind::reindex, 0},
  }};
};
static_assert(dh::valid_layout<layout_576>);

/// GLM-5.3-like source: k=2048, 576-byte rows, producer plus one follower layer.
struct layout_glm_like {
  static constexpr std::size_t top_k = 2048;
  static constexpr std::size_t page_rows = 64;
  static constexpr std::array<dh::source_desc, 1> sources{{{576, 1, 2, 132}}};
  static constexpr std::array<dh::consumer_desc, 2> consumers{{
      {0, dh::consumer_kind::reindex, 0},
      {0, dh::consumer_kind::follower, 1},
  }};
};
static_assert(dh::valid_layout<layout_glm_like>);

// ------------------------------------------------------------------ environment

inline void require_device() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  INFO("cudaGetDeviceCount: " << cudaGetErrorString(e) << ", devices: " << n);
  REQUIRE(e == cudaSuccess);
  REQUIRE(n > 0);
}

/// GPUs visible to the test (0 when the runtime cannot tell); no Catch2 assertion, so worker
/// threads may call it.
inline int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

/// Fails the test with a message (INFO + REQUIRE, portable across Catch2 majors).
#define DHTEST_FAIL(message)  \
  do {                        \
    INFO(message);            \
    REQUIRE(false);           \
  } while (0)

#define DHTEST_CUDA(x)                                                                             \
  do {                                                                                             \
    const cudaError_t dhtest_e = (x);                                                              \
    INFO(#x << " -> " << cudaGetErrorName(dhtest_e) << ": " << cudaGetErrorString(dhtest_e));     \
    REQUIRE(dhtest_e == cudaSuccess);                                                              \
  } while (0)

/// Waits for `stream` with a deadline: a resolver that never finishes (a hang) ends the test
/// program with a message instead of blocking until the CTest timeout.
inline void wait_or_die(cudaStream_t stream, const std::string& context, double seconds = 60.0) {
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    const cudaError_t e = cudaStreamQuery(stream);
    if (e == cudaSuccess) return;
    if (e != cudaErrorNotReady) {
      INFO(context << ": cudaStreamQuery -> " << cudaGetErrorName(e) << ": " << cudaGetErrorString(e));
      REQUIRE(e == cudaSuccess);
    }
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > seconds) {
      std::fprintf(stderr, "TIMEOUT: GPU work did not finish within %.0f s (a hang in the resolver?) at: %s\n", seconds,
                   context.c_str());
      std::fflush(stderr);
      std::_Exit(3);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

// ------------------------------------------------------------------ row content

inline std::uint64_t mix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// Bytes of row `row` of (request, source, layer): a function of all four, so a row returned for
/// the wrong request, source, layer or row never matches.
inline void fill_row(std::byte* out, std::size_t bytes, request_id id, std::size_t source, std::size_t layer,
                     row_index row) {
  std::uint64_t seed = mix64(id * 0x100000001B3ull ^ mix64(source * 131 + layer * 7919 + static_cast<std::uint64_t>(row) * 2654435761ull));
  for (std::size_t i = 0; i < bytes; i += 8) {
    seed = mix64(seed + i);
    std::memcpy(out + i, &seed, std::min<std::size_t>(8, bytes - i));
  }
}

/// `count` rows [layer][count][row_bytes] starting at `first`.
template <class Layout>
std::vector<std::byte> make_rows(request_id id, std::size_t source, std::int64_t first, std::size_t count) {
  const auto& d = Layout::sources[source];
  std::vector<std::byte> v(count * d.payload_layers * d.row_bytes);
  for (std::size_t l = 0; l < d.payload_layers; ++l)
    for (std::size_t i = 0; i < count; ++i)
      fill_row(v.data() + (l * count + i) * d.row_bytes, d.row_bytes, id, source, l,
               static_cast<row_index>(first + static_cast<std::int64_t>(i)));
  return v;
}

inline std::string hex_prefix(const std::byte* p, std::size_t n) {
  std::ostringstream o;
  for (std::size_t i = 0; i < std::min<std::size_t>(n, 16); ++i) {
    char b[4];
    std::snprintf(b, sizeof b, "%02x", static_cast<unsigned>(p[i]));
    o << b;
  }
  return o.str();
}

template <class T>
std::string show(std::span<const T> v, std::size_t around, std::size_t radius = 6) {
  std::ostringstream o;
  const std::size_t lo = around > radius ? around - radius : 0, hi = std::min(v.size(), around + radius + 1);
  o << "[" << lo << ".." << hi << "): ";
  for (std::size_t i = lo; i < hi; ++i) o << (i == around ? "*" : "") << +v[i] << " ";
  return o.str();
}

/// Index of the first difference, or -1.
template <class A, class B>
long first_mismatch(const A& a, const B& b) {
  if (a.size() != b.size()) return static_cast<long>(std::min(a.size(), b.size()));
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!(a[i] == b[i])) return static_cast<long>(i);
  return -1;
}

/// Empty when the sequences are equal; otherwise the first difference with its neighbourhood.
template <class T, class U>
std::string diff_sequence(const std::string& what, std::span<const T> expected, std::span<const U> actual) {
  const long m = first_mismatch(expected, actual);
  if (m < 0) return {};
  std::ostringstream o;
  o << what << ": first mismatch at index " << m << " (sizes " << expected.size() << " vs " << actual.size() << ")\n"
    << "  expected " << (static_cast<std::size_t>(m) < expected.size() ? show(expected, static_cast<std::size_t>(m)) : "<end>") << "\n"
    << "  actual   " << (static_cast<std::size_t>(m) < actual.size() ? show(actual, static_cast<std::size_t>(m)) : "<end>");
  return o.str();
}

/// REQUIRE that two sequences are equal, printing the first difference otherwise.
#define DHTEST_REQUIRE_SAME(T, what, expected, actual)                                              \
  do {                                                                                              \
    const std::string dhtest_diff = ::dhtest::diff_sequence<T, T>((what), (expected), (actual));    \
    INFO(dhtest_diff);                                                                              \
    REQUIRE(dhtest_diff.empty());                                                                   \
  } while (0)

inline std::string stats_text(const dh::resolve_stats& s) {
  std::ostringstream o;
  o << "{selected " << s.selected << ", direct " << s.direct << ", hot " << s.hot << ", host " << s.host
    << ", rows " << s.rows_copied << ", bytes " << s.bytes_copied << "}";
  return o.str();
}

// ------------------------------------------------------------------ gate

__global__ void spin_until_open(const volatile int* flag, long long max_cycles) {
  const long long start = clock64();
  while (*flag == 0 && clock64() - start < max_cycles) {
  }
}

/// Holds a stream back until `open()`: the stream waits for a spinning kernel on a side stream.
class gate {
 public:
  gate() {
    cudaFuncAttributes attr{};  // loaded now: a lazily loaded kernel may synchronise the context at launch
    DHTEST_CUDA(cudaFuncGetAttributes(&attr, spin_until_open));
    DHTEST_CUDA(cudaHostAlloc(&flag_, sizeof(int), cudaHostAllocMapped));
    *flag_ = 0;
    DHTEST_CUDA(cudaHostGetDevicePointer(reinterpret_cast<void**>(&dflag_), flag_, 0));
    DHTEST_CUDA(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
    DHTEST_CUDA(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
  }
  ~gate() {
    *flag_ = 1;
    cudaStreamSynchronize(side_);
    cudaEventDestroy(done_);
    cudaStreamDestroy(side_);
    cudaFreeHost(flag_);
  }
  void close(cudaStream_t held) {
    *reinterpret_cast<volatile int*>(flag_) = 0;
    spin_until_open<<<1, 1, 0, side_>>>(dflag_, 20'000'000'000LL);  // ~10 s at H200 clocks
    DHTEST_CUDA(cudaGetLastError());
    DHTEST_CUDA(cudaEventRecord(done_, side_));
    DHTEST_CUDA(cudaStreamWaitEvent(held, done_, 0));
  }
  void open() {
    *reinterpret_cast<volatile int*>(flag_) = 1;
    wait_or_die(side_, "gate");
  }
  /// The spinning kernel has not finished: the held stream is still held.
  [[nodiscard]] bool closed() const { return cudaStreamQuery(side_) == cudaErrorNotReady; }

 private:
  int* flag_ = nullptr;
  int* dflag_ = nullptr;
  cudaStream_t side_ = nullptr;
  cudaEvent_t done_ = nullptr;
};

/// Every byte of every pool row of every payload layer: the CUDA hierarchy's against the host
/// twin's (which simulates the GPU pool). Dedicated staging (pool rows only).
template <class Layout, class A, class B>
void compare_pool_images(A& cuda_h, const B& host_h, const std::string& ctx) {
  for (std::size_t s = 0; s < Layout::sources.size(); ++s)
    for (std::size_t l = 0; l < Layout::sources[s].payload_layers; ++l) {
      const std::size_t rb = Layout::sources[s].row_bytes;
      std::vector<std::byte> got(cuda_h.pool_rows() * rb), want(got.size());
      cuda_h.copy_pool(s, l, got);
      for (std::size_t loc = 0; loc < cuda_h.pool_rows(); ++loc) {
        const auto row = host_h.payload(s, l, static_cast<location>(loc));
        std::memcpy(want.data() + loc * rb, row.data(), rb);
      }
      const long m = first_mismatch(want, got);
      INFO(ctx << ": pool of source " << s << " layer " << l << " first differs at byte " << m << " (location "
               << (m < 0 ? -1 : m / static_cast<long>(rb)) << ")");
      REQUIRE(m < 0);
    }
}

// ------------------------------------------------------------------ twin driver

/// Drives a host_hierarchy and a cuda::hierarchy with identical calls and compares them.
template <class Layout, class Hot, class Staging = dh::dedicated_staging>
class twin {
 public:
  using host_type = dh::host_hierarchy<Layout, Hot, dh::fixed_budget_policy, Staging>;
  using device_type = dhc::hierarchy<Layout, Hot, dh::fixed_budget_policy, Staging>;
  static constexpr std::size_t K = Layout::top_k;
  static constexpr std::size_t sources = dh::source_count<Layout>;

  twin(const dh::hierarchy_config& cfg, std::uint64_t seed)
      : cfg(cfg), host(cfg), dev(cfg), rng(seed), dsel(cfg.max_requests * K), dloc(cfg.max_requests * K) {}

  dh::hierarchy_config cfg;
  host_type host;
  device_type dev;
  std::mt19937_64 rng;
  dhc::device_buffer<row_index> dsel;
  dhc::device_buffer<location> dloc;
  std::vector<request_id> live;
  request_id next_id = 1000;
  std::size_t checks = 0;

  // The test's own books, kept from the calls it made (never read back from either backend):
  // rows each live request stores per source, and the optional pages it has mapped.
  std::map<request_id, std::array<std::int64_t, sources>> own_rows;
  std::set<std::tuple<request_id, std::size_t, std::size_t>> own_mapped;  // (request, source, page)

  std::size_t uniform(std::size_t n) { return n == 0 ? 0 : static_cast<std::size_t>(rng() % n); }
  bool chance(double p) { return std::uniform_real_distribution<double>(0, 1)(rng) < p; }

  bool admit(request_id id) {
    const auto a = host.admit(id);
    const auto b = dev.admit(id);
    REQUIRE(a.admitted == b.admitted);
    if (a.admitted) {
      REQUIRE(a.slot == b.slot);
      live.push_back(id);
      own_rows[id] = {};
    }
    return a.admitted;
  }
  void complete(request_id id) {
    host.complete(id);
    dev.complete(id);
    live.erase(std::find(live.begin(), live.end(), id));
    own_rows.erase(id);
    std::erase_if(own_mapped, [id](const auto& m) { return std::get<0>(m) == id; });
  }
  void append(request_id id, std::size_t source, std::size_t count) {
    const std::int64_t first = host.frontier(id, source);
    const auto rows = make_rows<Layout>(id, source, first, count);
    host.append(id, source, rows, count);
    dev.append(id, source, std::span<const std::byte>(rows), count);
    own_rows.at(id)[source] += static_cast<std::int64_t>(count);
    REQUIRE(host.frontier(id, source) == own_rows.at(id)[source]);
    REQUIRE(dev.frontier(id, source) == own_rows.at(id)[source]);
  }
  bool map_page(request_id id, std::size_t source, std::size_t page) {
    const bool a = host.map_optional_page(id, source, page);
    const bool b = dev.map_optional_page(id, source, page);
    REQUIRE(a == b);
    if (a) own_mapped.emplace(id, source, page);
    return a;
  }
  void unmap_page(request_id id, std::size_t source, std::size_t page) {
    host.unmap_optional_page(id, source, page);
    dev.unmap_optional_page(id, source, page);
    own_mapped.erase({id, source, page});
  }
  /// Commits `accepted` proposals on both backends; `completed_rows` is the number of stored rows the
  /// test expects the commit to complete (its own arithmetic: for m = 1, accepted + 1).
  void commit(request_id id, std::size_t source, std::size_t accepted, std::int64_t completed_rows) {
    host.commit(id, source, accepted);
    dev.commit(id, source, accepted);
    own_rows.at(id)[source] += completed_rows;
  }

  /// Host pages per source the test expects to be free: the configured pool (0 = every slot at full
  /// capacity) less one page per started history page of every live request, from its own row counts.
  [[nodiscard]] std::size_t expected_free_host_pages(std::size_t source) const {
    const std::size_t p = Layout::page_rows;
    const std::size_t total = cfg.host_pages != 0 ? cfg.host_pages : cfg.max_requests * ((cfg.max_rows + p - 1) / p);
    std::size_t used = 0;
    for (const auto& [id, rows] : own_rows) used += (static_cast<std::size_t>(rows[source]) + p - 1) / p;
    return total - used;
  }
  /// Optional pool pages per source the test expects to be free: the pool less the pages it mapped.
  [[nodiscard]] std::size_t expected_free_optional_pages(std::size_t source) const {
    std::size_t used = 0;
    for (const auto& m : own_mapped) used += std::get<1>(m) == source ? 1 : 0;
    return cfg.optional_pages - used;
  }

  /// A selection mixing tail rows, hot rows, optional rows, fresh rows, duplicates and -1.
  std::vector<row_index> make_selection(request_id id, std::size_t source, std::size_t length) {
    const std::int64_t f = host.frontier(id, source);
    std::vector<row_index> sel(length, dh::no_row);
    if (f == 0) return sel;
    const auto hot = host.hot_rows_of(id, source);
    const auto opt = host.optional_map_of(id, source);
    const std::int64_t t0 = std::max<std::int64_t>(0, f - static_cast<std::int64_t>(cfg.tail_rows == 0 ? Layout::page_rows : cfg.tail_rows));
    for (std::size_t i = 0; i < length; ++i) {
      const double u = std::uniform_real_distribution<double>(0, 1)(rng);
      row_index r;
      if (u < 0.05) r = dh::no_row;
      else if (u < 0.20) r = static_cast<row_index>(t0 + static_cast<std::int64_t>(uniform(static_cast<std::size_t>(f - t0))));
      else if (u < 0.50) {
        const row_index h = hot[uniform(hot.size())];
        r = h != dh::no_row ? h : static_cast<row_index>(uniform(static_cast<std::size_t>(f)));
      } else if (u < 0.60 && i > 0) r = sel[uniform(i)];
      else if (u < 0.68) {
        const std::size_t pg = uniform(opt.size());
        r = opt[pg] >= 0 ? static_cast<row_index>(pg * Layout::page_rows + uniform(Layout::page_rows))
                         : static_cast<row_index>(uniform(static_cast<std::size_t>(f)));
      } else r = static_cast<row_index>(uniform(static_cast<std::size_t>(f)));
      sel[i] = r;
    }
    return sel;
  }

  struct request_selection {
    request_id id;
    std::vector<row_index> selection;
  };

  /// Resolves the same batch on both backends and compares locations, per-entry stats, the copy
  /// plan and (when `copy_followers`) follower copies. Returns the locations.
  std::vector<std::vector<location>> resolve(std::size_t source, const std::vector<request_selection>& batch,
                                             dh::copy_layers mode, bool copy_followers, const std::string& ctx) {
    const std::size_t n = batch.size();
    // host: per item in `all` mode (per-entry stats), one batch call in producer_only
    std::vector<std::vector<location>> expect(n);
    std::vector<dh::resolve_stats> expect_stats(n);
    std::vector<dh::planned_copy> expect_plan;
    for (std::size_t e = 0; e < n; ++e) expect[e].assign(batch[e].selection.size(), 0x7A7A7A7A);
    dh::resolve_stats expect_total;
    if (mode == dh::copy_layers::all) {
      for (std::size_t e = 0; e < n; ++e) {
        expect_stats[e] = host.resolve(batch[e].id, source, batch[e].selection, expect[e], mode);
        expect_total += expect_stats[e];
        const auto p = host.last_plan(source);
        expect_plan.insert(expect_plan.end(), p.begin(), p.end());
      }
    } else {
      std::vector<dh::resolve_item> items(n);
      for (std::size_t e = 0; e < n; ++e) items[e] = {batch[e].id, batch[e].selection, expect[e]};
      expect_total = host.resolve(source, items, mode);
      const auto p = host.last_plan(source);
      expect_plan.assign(p.begin(), p.end());
    }

    // device
    std::vector<typename device_type::batch_item> items(n);
    std::vector<row_index> staged(n * K, dh::no_row);
    for (std::size_t e = 0; e < n; ++e)
      std::copy(batch[e].selection.begin(), batch[e].selection.end(), staged.begin() + static_cast<long>(e * K));
    DHTEST_CUDA(cudaMemcpy(dsel.data(), staged.data(), staged.size() * sizeof(row_index), cudaMemcpyHostToDevice));
    DHTEST_CUDA(cudaMemset(dloc.data(), 0x7A, dloc.bytes()));
    for (std::size_t e = 0; e < n; ++e)
      items[e] = {batch[e].id, dsel.data() + e * K, static_cast<std::int32_t>(batch[e].selection.size()),
                  dloc.data() + e * K};
    dev.resolve(source, std::span<const typename device_type::batch_item>(items), dev.stream(), mode);
    wait_or_die(dev.stream(), ctx + ": resolve");
    dev.check_errors(dev.stream());
    std::vector<location> got(n * K);
    DHTEST_CUDA(cudaMemcpy(got.data(), dloc.data(), got.size() * sizeof(location), cudaMemcpyDeviceToHost));
    const auto stats = dev.last_stats(source);
    const auto plan = dev.last_plan(source);

    INFO(ctx << " source " << source << " batch " << n << " mode " << (mode == dh::copy_layers::all ? "all" : "producer_only"));
    REQUIRE(stats.size() == n);
    dh::resolve_stats total;
    for (std::size_t e = 0; e < n; ++e) {
      INFO("batch entry " << e << " request " << batch[e].id << " (slot " << host.slot_of(batch[e].id) << ") length "
                          << batch[e].selection.size() << " frontier " << host.frontier(batch[e].id, source));
      const std::span<const location> g(got.data() + e * K, batch[e].selection.size());
      const std::string diff = diff_sequence<location, location>("locations", expect[e], g);
      if (!diff.empty()) {
        const long m = first_mismatch(std::span<const location>(expect[e]), g);
        DHTEST_FAIL(diff << "\nlocation mismatch at selection entry " << m << " (row "
                  << batch[e].selection[static_cast<std::size_t>(m)] << ")");
      }
      if (mode == dh::copy_layers::all) {
        INFO("host stats " << stats_text(expect_stats[e]) << " device " << stats_text(stats[e]));
        REQUIRE(stats[e] == expect_stats[e]);
      }
      total += stats[e];
    }
    INFO("host total " << stats_text(expect_total) << " device " << stats_text(total));
    REQUIRE(total == expect_total);
    {
      INFO("copy plan: " << expect_plan.size() << " host copies vs " << plan.size() << " device");
      REQUIRE(plan.size() == expect_plan.size());
      for (std::size_t i = 0; i < plan.size(); ++i) {
        INFO("plan entry " << i << ": host {slot " << expect_plan[i].slot << ", row " << expect_plan[i].row << ", dst "
                           << expect_plan[i].dst << "} device {slot " << plan[i].slot << ", row " << plan[i].row
                           << ", dst " << plan[i].dst << "}");
        REQUIRE((plan[i].slot == expect_plan[i].slot && plan[i].row == expect_plan[i].row &&
                 plan[i].dst == expect_plan[i].dst));
      }
    }
    if (mode == dh::copy_layers::producer_only && copy_followers)
      for (std::size_t l = 1; l < Layout::sources[source].payload_layers; ++l) {
        host.copy_follower(source, l);
        dev.copy_follower(source, l);
      }
    std::vector<std::vector<location>> out(n);
    for (std::size_t e = 0; e < n; ++e) out[e].assign(got.begin() + static_cast<long>(e * K),
                                                      got.begin() + static_cast<long>(e * K + batch[e].selection.size()));
    return out;
  }

  /// Every returned location holds the row's bytes (all `layers` first payload layers).
  void check_contents(std::size_t source, const std::vector<request_selection>& batch,
                      const std::vector<std::vector<location>>& locs, std::size_t layers, const std::string& ctx) {
    const auto& d = Layout::sources[source];
    std::vector<std::byte> want(d.row_bytes);
    for (std::size_t l = 0; l < layers; ++l) {
      std::vector<std::byte> pool(dev.space().rows() * d.row_bytes);
      dev.copy_pool(source, l, pool);
      for (std::size_t e = 0; e < batch.size(); ++e)
        for (std::size_t i = 0; i < batch[e].selection.size(); ++i) {
          const row_index r = batch[e].selection[i];
          if (r == dh::no_row) continue;
          fill_row(want.data(), d.row_bytes, batch[e].id, source, l, r);
          const std::byte* have = pool.data() + static_cast<std::size_t>(locs[e][i]) * d.row_bytes;
          if (std::memcmp(have, want.data(), d.row_bytes) != 0) {
            DHTEST_FAIL(ctx << ": source " << source << " layer " << l << " request " << batch[e].id << " selection entry " << i
                     << " row " << r << " at location " << locs[e][i] << " holds " << hex_prefix(have, d.row_bytes)
                     << "..., expected " << hex_prefix(want.data(), d.row_bytes) << "...");
          }
        }
    }
    ++checks;
  }

  /// Hot rows, LRU order, optional map and frontier of every admitted request and source.
  void compare_state(const std::string& ctx) {
    for (request_id id : live)
      for (std::size_t s = 0; s < sources; ++s) {
        INFO(ctx << ": request " << id << " (slot " << host.slot_of(id) << ") source " << s);
        const auto hr = host.hot_rows_of(id, s);
        const auto dr = dev.hot_rows_of(id, s);
        DHTEST_REQUIRE_SAME(row_index, "hot rows", hr, dr);
        const auto ho = host.lru_order_of(id, s);
        const auto dor = dev.lru_order_of(id, s);
        DHTEST_REQUIRE_SAME(typename Hot::order_index, "LRU order", ho, dor);
        const auto hm = host.optional_map_of(id, s);
        const auto dm = dev.optional_map_of(id, s);
        DHTEST_REQUIRE_SAME(std::int32_t, "optional map", hm, dm);
        REQUIRE(host.frontier(id, s) == own_rows.at(id)[s]);
        REQUIRE(dev.device_frontier(id, s) == own_rows.at(id)[s]);
      }
    // Both backends keep their page books in detail/history_books.hpp, so comparing them with each
    // other proves nothing: compare each with the test's own count.
    for (std::size_t s = 0; s < sources; ++s) {
      INFO(ctx << ": source " << s << " free pages");
      REQUIRE(host.free_optional_pages(s) == expected_free_optional_pages(s));
      REQUIRE(dev.free_optional_pages(s) == expected_free_optional_pages(s));
      REQUIRE(host.free_host_pages(s) == expected_free_host_pages(s));
      REQUIRE(dev.free_host_pages(s) == expected_free_host_pages(s));
    }
  }

  /// Every byte of every payload layer's pool (the host simulates the GPU pool).
  void compare_pools(const std::string& ctx) {
    for (std::size_t s = 0; s < sources; ++s) {
      const auto& d = Layout::sources[s];
      for (std::size_t l = 0; l < d.payload_layers; ++l) {
        const std::size_t pool_rows = dev.pool_rows();
        // shared arenas: a source's staging rows are readable only while it holds the arenas, and
        // lie space(s).staging_gap rows past its pool (the image is indexed by location)
        const auto& sp = dev.space(s);
        REQUIRE(sp.staging_begin() == host.space(s).staging_begin());
        const bool staging_rows = !Staging::shared || host.staging_holder() == s;
        std::vector<std::byte> pool(sp.rows() * d.row_bytes);
        dev.copy_pool(s, l, std::span<std::byte>(pool).first(pool_rows * d.row_bytes));
        if (Staging::shared && staging_rows)
          dev.copy_staging(s, l, std::span<std::byte>(pool).subspan(sp.staging_begin() * d.row_bytes));
        for (std::size_t r = 0; r < sp.rows(); ++r) {
          if (!sp.valid(static_cast<location>(r)) || (!staging_rows && r >= sp.staging_begin())) continue;
          const auto want = host.payload(s, l, static_cast<location>(r));
          if (std::memcmp(want.data(), pool.data() + r * d.row_bytes, d.row_bytes) != 0)
            DHTEST_FAIL(ctx << ": pool of source " << s << " layer " << l << " differs at location " << r << ": host "
                     << hex_prefix(want.data(), d.row_bytes) << "..., device "
                     << hex_prefix(pool.data() + r * d.row_bytes, d.row_bytes) << "...");
        }
      }
    }
  }
};

}  // namespace dhtest
