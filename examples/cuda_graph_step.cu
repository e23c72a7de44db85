// cuda_graph_step: how an engine drives the CUDA resolver from a CUDA graph.
//
//   1. size and build a hierarchy for the model's layout (here: the tiny test layout);
//   2. admit requests and append their history (prefill);
//   3. capture one decode step's resolve over a device batch descriptor into a graph;
//   4. each step: write the indexer's selections (and the batch members/count) into the
//      descriptor's buffers, replay the graph, let attention read the returned locations;
//   5. check errors once per step (or less often), outside the hot path.
//
// Exits 0 on success, and also when no GPU is present (it says so).
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "dhisparse/cuda/hierarchy.cuh"
#include "dhisparse/layouts/tiny.hpp"

namespace dh = dhisparse;
namespace dhc = dhisparse::cuda;

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("cuda_graph_step: no CUDA device, nothing to run\n");
    return 0;
  }
  try {
    using Layout = dh::layouts::tiny;                                       // 2 sources, top_k 16
    using Hierarchy = dhc::hierarchy<Layout, dh::lru_hot_cache<32>>;
    constexpr std::size_t K = Layout::top_k;
    constexpr std::size_t requests = 4;

    // 1. two-phase sizing, then construction
    dh::hierarchy_config cfg;
    cfg.max_requests = requests;
    cfg.max_rows = 1024;
    cfg.optional_pages = 8;
    const auto need = Hierarchy::requirements(cfg);
    std::printf("hierarchy: %zu device bytes, %zu pinned bytes\n", need.device_bytes, need.pinned_bytes);
    cudaStream_t stream = nullptr;
    DHISPARSE_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    Hierarchy h(cfg, stream);
    std::printf("resolver: %d CTAs x %d threads, %zu bytes of shared memory each\n", h.resolver_grid(),
                Hierarchy::block_threads, h.resolver_shared_bytes());

    // 2. admit and prefill (rows are [layer][row][row_bytes]; here a recognisable pattern)
    std::vector<dh::request_id> ids;
    for (std::size_t r = 0; r < requests; ++r) {
      const dh::request_id id = 100 + r;
      if (!h.admit(id, stream)) throw std::runtime_error("no free slot for request " + std::to_string(id));
      ids.push_back(id);
      for (std::size_t s = 0; s < Hierarchy::sources; ++s) {
        const auto& d = Layout::sources[s];
        const std::size_t n = 300 + 50 * r;
        std::vector<std::byte> rows(n * d.payload_layers * d.row_bytes);
        for (std::size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<std::byte>((id * 31 + s * 7 + i) & 0xFF);
        h.append(id, s, std::span<const std::byte>(rows), n, stream);
      }
    }

    // 3. capture one step: a resolve per source, each over its own device batch. An engine whose
    //    indexer kernel runs right before the resolve can call h.set_programmatic_launch(true)
    //    first: the resolve (and the follower copy after it) then overlaps the kernel before it
    //    (it waits for its writes), and attention kernels launched with programmatic stream
    //    serialization, calling cudaGridDependencySynchronize() before they read, overlap the
    //    resolve's tail.
    dhc::device_batch batch0(requests, K), batch1(requests, K);
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t step = nullptr;
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
    DHISPARSE_CUDA_TRY(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    h.resolve(0, batch0.view(), stream, dh::copy_layers::producer_only);  // producer layer now...
    h.copy_follower(0, 1, stream);                                       // ...follower layer after
    h.resolve(1, batch1.view(), stream);
    DHISPARSE_CUDA_TRY(cudaStreamEndCapture(stream, &graph));
    DHISPARSE_CUDA_TRY(cudaGraphInstantiate(&step, graph, 0));

    // 4. decode steps with fresh selections (here random; an engine's indexer writes them on the GPU)
    std::mt19937 rng(1);
    std::size_t resolved = 0, recovered = 0;
    for (int t = 0; t < 8; ++t) {
      const std::size_t active = 1 + static_cast<std::size_t>(t) % requests;  // the batch may change size
      std::vector<std::int32_t> slots;
      std::vector<dh::row_index> sel(active * K);
      for (std::size_t e = 0; e < active; ++e) {
        slots.push_back(static_cast<std::int32_t>(h.slot_of(ids[e])));
        const auto f = static_cast<unsigned>(h.frontier(ids[e], 0));
        for (std::size_t i = 0; i < K; ++i) sel[e * K + i] = i % 5 == 4 ? dh::no_row : static_cast<dh::row_index>(rng() % f);
      }
      batch0.upload(slots, sel, {}, stream);
      batch1.upload(slots, sel, {}, stream);  // same positions on source 1 (its frontier is the same)
      DHISPARSE_CUDA_TRY(cudaGraphLaunch(step, stream));
      // ... attention kernels would read h.pool(s, layer) at the returned locations here ...

      // 5. errors are reported per batch entry on the device and thrown here
      h.check_errors(stream);
      for (std::size_t s = 0; s < Hierarchy::sources; ++s)
        for (const auto& st : h.last_stats(s)) {
          resolved += st.selected;
          recovered += st.rows_copied;
        }
    }

    // spot-check: the first location of request 0 on source 1 holds the row's bytes
    const auto locs = batch1.download_locations(1, stream);
    std::vector<dh::row_index> last_sel(K);
    DHISPARSE_CUDA_TRY(cudaMemcpy(last_sel.data(), batch1.selections(), K * sizeof(dh::row_index), cudaMemcpyDeviceToHost));
    bool exact = true;
    for (std::size_t i = 0; i < K; ++i) {
      if (last_sel[i] == dh::no_row) continue;
      const auto row = h.payload_row(1, 0, locs[i]);
      const auto want = h.host_row(ids[0], 1, 0, last_sel[i]);
      exact = exact && std::memcmp(row.data(), want.data(), row.size()) == 0;
    }
    std::printf("8 graph replays: %zu entries resolved, %zu rows recovered from host, spot check %s\n", resolved,
                recovered, exact ? "exact" : "MISMATCH");

    DHISPARSE_CUDA_TRY(cudaGraphExecDestroy(step));
    DHISPARSE_CUDA_TRY(cudaGraphDestroy(graph));
    for (auto id : ids) h.complete(id, stream);
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
    DHISPARSE_CUDA_TRY(cudaStreamDestroy(stream));
    return exact ? 0 : 1;
  } catch (const std::exception& e) {  // dh::error (typed) or the example's own
    std::fprintf(stderr, "cuda_graph_step: %s\n", e.what());
    return 1;
  }
}
