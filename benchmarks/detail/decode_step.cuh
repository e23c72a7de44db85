#pragma once
/// \file
/// One configuration of the model-scale decode benchmark on the GPU: a slice of a layout's
/// sources, one policy, the closed loop's admitted sessions decoding in one captured CUDA graph.
/// Used by benchmarks/bench_decode.cu and tests/cuda/decode_exactness.cu.
///
/// The step, per source of the slice (the engine's order), then once per step:
///   writes     produce_kernel (the new token's KV rows and index key), hierarchy::append over a
///              kv_write_view (resident: the kernel writes the flat KV itself)
///   index      query_kernel (query walk, segment bounds), score_kernel (every stored index key
///              in HBM scored against the query)
///   top-k      cub::DeviceSegmentedRadixSort::SortPairsDescending of (score, row) per entry (a
///              stable LSD sort: ties by ascending row), gather_top_k_kernel (first k)
///   resolve    hierarchy::resolve(source, batch_view, producer_only) (resident: locations =
///              slot * max_rows + row); with --copy-layers=all, copy_layers::all
///   followers  hierarchy::copy_follower for payload layers 1.. (none with --copy-layers=all)
///   attention  attention<row_bytes, value_dims> (split kernel + combine) over every payload
///              layer of the source
///   stand-in   one cuBLAS GEMM of the batch (speculative: K rows a session) against --weight-gib
///              GiB of bf16 weights
///   (advance   token counters, a one-CTA kernel, counted in the step)
/// Phases are also captured as separate graphs (all sources' share of one phase each) and replayed
/// back to back between events for the breakdown: a phased step is a real step too.
///
/// Speculative runs (`run_options::spec_block` K > 1, sources of one position a row): one round a
/// step, in the same single graph: the drafter's ring traffic, the block's K rows staged for every
/// session (`stage_blocks`), K indexer queries per session, `verify` over a device view, follower
/// copies, attention for each of the K queries, `commit` of accepted counts drawn on the host from
/// the documented distribution and uploaded before the replay (decode_spec_kernels.cuh). The
/// commit's phase is reported under writes.
#include <cublas_v2.h>  // types and prototypes only: the library is loaded at run time
#include <dlfcn.h>
#include <cub/device/device_segmented_radix_sort.cuh>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <dhisparse/cuda/batch.cuh>
#include <dhisparse/cuda/draft_ring_store.cuh>
#include <dhisparse/cuda/hierarchy.cuh>
#include <dhisparse/cuda/verify_batch.cuh>
#include <dhisparse/planner.hpp>
#include <dhisparse/policies/draft_ring.hpp>

#include "decode_kernels.cuh"
#include "decode_model.hpp"
#include "decode_spec_kernels.cuh"

namespace dhisparse_bench::decode {

/// A CUDA call that failed: the message names the call and the place.
struct gpu_failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};
inline void gpu_check(cudaError_t e, const char* what, int line) {
  if (e != cudaSuccess) throw gpu_failure(std::string(what) + " (line " + std::to_string(line) + "): " + cudaGetErrorString(e));
}
#define DHD_CUDA(x) ::dhisparse_bench::decode::gpu_check((x), #x, __LINE__)
inline void blas_check(cublasStatus_t s, const char* what, int line) {
  if (s != CUBLAS_STATUS_SUCCESS) throw gpu_failure(std::string(what) + " (line " + std::to_string(line) + "): cuBLAS status " + std::to_string(static_cast<int>(s)));
}
#define DHD_BLAS(x) ::dhisparse_bench::decode::blas_check((x), #x, __LINE__)

/// The first `S` sources of layout `Full` and their consumers: the part of the model one run
/// executes (host memory bounds the rest; see docs/benchmarks.md).
template <class Full, std::size_t S>
struct layout_slice {
  static_assert(S >= 1 && S <= std::size(Full::sources));
  static constexpr std::size_t top_k = Full::top_k;
  static constexpr std::size_t page_rows = Full::page_rows;
  static constexpr std::array<dhisparse::source_desc, S> sources = [] {
    std::array<dhisparse::source_desc, S> s{};
    for (std::size_t i = 0; i < S; ++i) s[i] = Full::sources[i];
    return s;
  }();
  static constexpr std::size_t consumer_total = [] {
    std::size_t n = 0;
    for (const auto& c : Full::consumers) n += c.source < S ? 1 : 0;
    return n;
  }();
  static constexpr std::array<dhisparse::consumer_desc, consumer_total> consumers = [] {
    std::array<dhisparse::consumer_desc, consumer_total> c{};
    std::size_t n = 0;
    for (const auto& x : Full::consumers)
      if (x.source < S) c[n++] = x;
    return c;
  }();
};

/// Device memory owned by the step, freed on scope exit.
template <class T>
struct dev_array {
  T* p = nullptr;
  std::size_t n = 0;
  dev_array() = default;
  explicit dev_array(std::size_t count) : n(count) {
    if (count != 0) DHD_CUDA(cudaMalloc(reinterpret_cast<void**>(&p), count * sizeof(T)));
  }
  dev_array(const dev_array&) = delete;
  dev_array& operator=(const dev_array&) = delete;
  dev_array(dev_array&& o) noexcept : p(o.p), n(o.n) { o.p = nullptr; o.n = 0; }
  dev_array& operator=(dev_array&& o) noexcept {
    std::swap(p, o.p);
    std::swap(n, o.n);
    return *this;
  }
  ~dev_array() {
    if (p != nullptr) (void)cudaFree(p);
  }
  [[nodiscard]] std::size_t bytes() const { return n * sizeof(T); }
};

/// cuBLAS, loaded at run time (dlopen): the programs need no cuBLAS at link time, and a machine
/// without it runs everything but the stand-in (which then reports itself off).
class cublas_library {
 public:
  cublas_library() {
    for (const char* name : {"libcublas.so.13", "libcublas.so.12", "libcublas.so"}) {
      lib_ = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (lib_ != nullptr) break;
    }
    if (lib_ == nullptr) return;
    create = reinterpret_cast<decltype(create)>(dlsym(lib_, "cublasCreate_v2"));
    destroy = reinterpret_cast<decltype(destroy)>(dlsym(lib_, "cublasDestroy_v2"));
    set_stream = reinterpret_cast<decltype(set_stream)>(dlsym(lib_, "cublasSetStream_v2"));
    set_workspace = reinterpret_cast<decltype(set_workspace)>(dlsym(lib_, "cublasSetWorkspace_v2"));
    gemm_ex = reinterpret_cast<decltype(gemm_ex)>(dlsym(lib_, "cublasGemmEx"));
  }
  cublas_library(const cublas_library&) = delete;
  cublas_library& operator=(const cublas_library&) = delete;
  ~cublas_library() {
    if (lib_ != nullptr) (void)dlclose(lib_);
  }
  [[nodiscard]] bool loaded() const {
    return create != nullptr && destroy != nullptr && set_stream != nullptr && set_workspace != nullptr && gemm_ex != nullptr;
  }
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasDestroy_v2) destroy = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  decltype(&cublasSetWorkspace_v2) set_workspace = nullptr;
  /// The 32-bit-size `cublasGemmEx` (C++ also declares a 64-bit overload).
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*, const void*,
                            cudaDataType, int, const void*, cudaDataType, int, const void*, void*, cudaDataType, int,
                            cublasComputeType_t, cublasGemmAlgo_t) = nullptr;

 private:
  void* lib_ = nullptr;
};

/// The stand-in for the rest of the model: Y[C x N] = X[C x hidden] W^T with W [N x hidden] bf16,
/// N = weight bytes / (2 hidden). One GEMM per step reads every weight once, as a decode step of
/// the absent layers would; batching amortises it the same way. Off with 0 GiB, or when cuBLAS
/// cannot be loaded (`note()` says so).
class stand_in_gemm {
 public:
  stand_in_gemm(double weight_gib, unsigned hidden, unsigned max_batch, cudaStream_t stream)
      : hidden_(hidden), max_batch_(max_batch) {
    const auto bytes = static_cast<std::uint64_t>(weight_gib * static_cast<double>(1ull << 30));
    n_ = static_cast<unsigned>(bytes / (2ull * hidden) / 256 * 256);
    if (n_ == 0) return;
    blas_ = std::make_unique<cublas_library>();
    if (!blas_->loaded()) {
      note_ = "cuBLAS not found: stand-in off";
      n_ = 0;
      return;
    }
    DHD_BLAS(blas_->create(&handle_));
    DHD_BLAS(blas_->set_stream(handle_, stream));
    workspace_ = dev_array<std::byte>(32u << 20);  // given to cuBLAS: nothing is allocated under capture
    DHD_BLAS(blas_->set_workspace(handle_, workspace_.p, workspace_.bytes()));
    w_ = dev_array<std::uint16_t>(static_cast<std::size_t>(n_) * hidden);
    x_ = dev_array<std::uint16_t>(static_cast<std::size_t>(max_batch) * hidden);
    y_ = dev_array<std::uint16_t>(static_cast<std::size_t>(max_batch) * n_);
    DHD_CUDA(cudaMemsetAsync(w_.p, 0x3c, w_.bytes(), stream));  // bf16 0x3c3c: ~0.0115, finite
    DHD_CUDA(cudaMemsetAsync(x_.p, 0x3c, x_.bytes(), stream));
  }
  stand_in_gemm(const stand_in_gemm&) = delete;
  stand_in_gemm& operator=(const stand_in_gemm&) = delete;
  ~stand_in_gemm() {
    if (handle_ != nullptr) (void)blas_->destroy(handle_);
  }
  [[nodiscard]] bool enabled() const { return n_ != 0; }
  [[nodiscard]] double weight_bytes() const { return 2.0 * n_ * hidden_; }
  /// Why the stand-in is off although weights were asked for (empty otherwise).
  [[nodiscard]] const std::string& note() const { return note_; }
  /// Enqueues the GEMM for `batch` rows on `stream` (capturable); at most the constructor's max_batch.
  void enqueue(unsigned batch, cudaStream_t stream) {
    if (n_ == 0 || batch == 0) return;
    if (batch > max_batch_)
      throw std::invalid_argument("stand-in GEMM of " + std::to_string(batch) + " rows, sized for " + std::to_string(max_batch_));
    DHD_BLAS(blas_->set_stream(handle_, stream));
    const float alpha = 1.0f, beta = 0.0f;
    DHD_BLAS(blas_->gemm_ex(handle_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n_), static_cast<int>(batch),
                            static_cast<int>(hidden_), &alpha, w_.p, CUDA_R_16BF, static_cast<int>(hidden_), x_.p,
                            CUDA_R_16BF, static_cast<int>(hidden_), &beta, y_.p, CUDA_R_16BF, static_cast<int>(n_),
                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }

 private:
  std::unique_ptr<cublas_library> blas_;
  cublasHandle_t handle_ = nullptr;
  unsigned hidden_ = 0, n_ = 0, max_batch_ = 0;
  std::string note_;
  dev_array<std::byte> workspace_;
  dev_array<std::uint16_t> w_, x_, y_;
};

/// What one configuration runs.
struct run_options {
  std::uint64_t context = 32'000;       ///< tokens of every session's history
  std::uint64_t target_c = 4;           ///< sessions kept outstanding
  double budget_gib = 90.0;             ///< M: GPU KV budget of the whole model
  unsigned heads = 16;                  ///< attention heads on this GPU
  float rho = 0.3f;                     ///< query drift (docs/benchmarks.md: why 0.3)
  unsigned warmup = 3, timed = 20, phased = 5;
  bool stand_in_off_too = true;         ///< also time the step without the stand-in
  bool check = true;                    ///< exactness check after every step
  std::uint64_t gen_tokens = 1024;      ///< tokens a session generates before it leaves (queue model)
  bool keep_outputs = false;            ///< record every step's attention output (tests)
  /// K of a speculative run (one round a step, every session's block K); 0 or 1: plain decode.
  /// Sessions are admitted with the drafter's state (`spec_drafter(K)`) charged, under M less
  /// `spec_fixed_gib`.
  unsigned spec_block = 0;
  /// GiB of fixed allocations speculation takes out of M before sessions are admitted
  /// (`speculative_budget`; the paper's 6.6).
  double spec_fixed_gib = spec_fixed_gib_default;
  double spec_alpha = 0.7;              ///< per-proposal acceptance of `accepted_length_distribution`
  bool spec_too = false;                ///< run_model: a speculative run beside the plain one (--spec)
  /// Which payload layers the resolve (verify) copies from the host: producer_only, then one
  /// `copy_follower` per further layer (layer-wise prefetch, the default), or all of them in the
  /// resolve itself (no follower copies).
  dhisparse::copy_layers resolve_copies = dhisparse::copy_layers::producer_only;
  /// `hierarchy::set_follower_copy_shape` (warps per SM, rows per warp); 0: the library's default.
  unsigned follower_warps_per_sm = 0, follower_rows_per_warp = 0;
};

/// What one policy's run produced (besides the result rows).
struct run_record {
  std::vector<result_row> rows;
  /// Per step, when keep_outputs (live entries first; speculative: each entry's K queries in order).
  std::vector<std::vector<float>> outputs;
  std::uint64_t live = 0;
  std::vector<std::vector<std::int32_t>> accepted;  ///< speculative: per step, each live entry's accepted count
};

/// Runs `p` for one configuration of slice `Slice` of model `Full` with hot cache B rows.
template <class Full, class Slice, std::size_t B>
class decode_run {
 public:
  static constexpr std::size_t S = std::size(Slice::sources);
  static constexpr unsigned K = Slice::top_k, P = Slice::page_rows;
  static constexpr unsigned row_bytes = Slice::sources[0].row_bytes;
  static constexpr unsigned m = Slice::sources[0].positions_per_row;
  static constexpr unsigned value_dims = row_bytes - row_bytes / 9;  // 576 -> 512 latent, 288 -> 256
  static_assert(row_bytes % 32 == 0 && row_bytes <= 576 && (value_dims == 256 || value_dims == 512));
  static constexpr unsigned layers_of(std::size_t s) { return static_cast<unsigned>(Slice::sources[s].payload_layers); }
  static constexpr unsigned max_l = static_cast<unsigned>(dhisparse::max_payload_layers_per_source<Slice>());
  static_assert(max_l <= max_layers);
  using hierarchy_t = dhisparse::cuda::hierarchy<Slice, dhisparse::lru_hot_cache<B>>;
  /// The drafter's ring: DFlash2's window and pages, blocks up to 8 (the schedule's widest).
  using ring_t = dhisparse::draft_ring<2048, 8, 64>;
  static constexpr unsigned ring_allocations = 12;  ///< six draft layers, K and V each
  static constexpr unsigned ring_row_bytes = 1024;  ///< one allocation's bytes per position

  decode_run(std::string model, const run_options& o, stand_in_gemm& gemm, cudaStream_t stream)
      : model_(std::move(model)), o_(o), gemm_(gemm), stream_(stream) {
    const auto shape = dhisparse::shape_of<Full>();
    const auto gib = static_cast<double>(1ull << 30);
    kb_ = o.spec_block > 1 ? o.spec_block : 1;
    const auto m_bytes = static_cast<std::uint64_t>(o.budget_gib * gib);
    const std::uint64_t budget =
        kb_ > 1 ? speculative_budget(m_bytes, static_cast<std::uint64_t>(o.spec_fixed_gib * gib)) : m_bytes;
    if (kb_ > 1 && (m != 1 || kb_ > ring_t::max_block))
      throw std::invalid_argument("speculative runs need one position a row and K <= " + std::to_string(ring_t::max_block));
    const auto drafter = kb_ > 1 ? spec_drafter(kb_) : dhisparse::drafters::none;
    lp_res_ = admit_closed_loop(policy::resident, shape, o.context, o.target_c, budget, drafter);
    lp_hier_ = admit_closed_loop(policy::adaptive, shape, o.context, o.target_c, budget, drafter);
    // The slice's share of M: its share of the per-session required state (index keys, hot cache,
    // tail), so the admitted sessions' slice state fits it as their whole state fits M.
    const auto whole = dhisparse::plan(shape, {.context_tokens = o.context, .drafter = drafter});
    const auto part = dhisparse::plan(dhisparse::shape_of<Slice>(), {.context_tokens = o.context, .drafter = drafter});
    slice_budget_ = static_cast<std::uint64_t>(static_cast<double>(budget) * static_cast<double>(part.hierarchical_total) /
                                               static_cast<double>(whole.hierarchical_total));
    ctx_rows_ = static_cast<unsigned>(o.context / m);
    steps_ = o.warmup + o.timed * (o.stand_in_off_too ? 2 : 1) + o.phased;
    max_rows_ = ctx_rows_ + steps_ * kb_ / m + kb_ + 2;
    cap_ = static_cast<unsigned>(std::max<std::uint64_t>({lp_res_.admitted, lp_hier_.admitted, 1}));
  }

  /// Runs policy `p` from a fresh start (the same sessions, steps and selections for every policy).
  run_record run(policy p) {
    run_record rec;
    const std::uint64_t live = p == policy::resident ? lp_res_.admitted : lp_hier_.admitted;
    rec.live = live;
    if (live == 0) {
      rec.rows.push_back(base_row(p, true));
      rec.rows.back().note = "nothing fits the budget";
      return rec;
    }
    allocate_common();
    std::unique_ptr<hierarchy_t> h;
    std::vector<dev_array<std::byte>> resident;
    std::vector<std::int32_t> slot_of(live);
    std::vector<std::uint64_t> tag_of_slot(cap_, 0);
    if (p == policy::resident) {
      for (std::size_t s = 0; s < S; ++s)
        for (unsigned l = 0; l < layers_of(s); ++l)
          resident.emplace_back(static_cast<std::size_t>(cap_) * max_rows_ * row_bytes);
      for (std::uint64_t i = 0; i < live; ++i) slot_of[i] = static_cast<std::int32_t>(i);
    } else {
      dhisparse::config_inputs ci;
      ci.slots = cap_;
      ci.max_context_tokens = static_cast<std::uint64_t>(max_rows_) * m;
      ci.live_context_tokens = static_cast<std::uint64_t>(max_rows_) * m * live;
      // The keys are the engine's (not charged by the planner); the hierarchy's metadata and
      // workspace are not in the per-session figure admission uses: an allowance of 1 % + 64 MiB.
      const std::uint64_t keys = static_cast<std::uint64_t>(S) * cap_ * max_rows_ * (index_dims + 4);
      ci.gpu_bytes = (slice_budget_ > keys ? slice_budget_ - keys : 0) + slice_budget_ / 100 + (64ull << 20);
      ci.hot_rows = B;
      ci.max_block = kb_;
      ci.residency = p == policy::adaptive ? dhisparse::residency_kind::adaptive : dhisparse::residency_kind::fixed_budget;
      const auto plan = dhisparse::plan_hierarchy<Slice>(ci);
      optional_pages_ = plan.config.optional_pages;
      h = std::make_unique<hierarchy_t>(plan.config, stream_);
      if (o_.follower_warps_per_sm != 0) h->set_follower_copy_shape(o_.follower_warps_per_sm, o_.follower_rows_per_warp);
      for (std::uint64_t i = 0; i < live; ++i) {
        const auto a = h->admit(i + 1, stream_);
        if (!a) throw gpu_failure("hierarchy refused admission " + std::to_string(i + 1));
        slot_of[i] = static_cast<std::int32_t>(a.slot);
      }
    }
    // Per-slot state: tags, token counts, index keys, query walks; histories.
    std::vector<std::int64_t> tokens(cap_, 0);
    for (std::uint64_t i = 0; i < live; ++i) {
      tag_of_slot[slot_of[i]] = session_tag(i + 1);
      tokens[slot_of[i]] = static_cast<std::int64_t>(ctx_rows_) * m;
    }
    DHD_CUDA(cudaMemcpyAsync(tag_.p, tag_of_slot.data(), tag_.bytes(), cudaMemcpyHostToDevice, stream_));
    DHD_CUDA(cudaMemcpyAsync(tokens_.p, tokens.data(), tokens_.bytes(), cudaMemcpyHostToDevice, stream_));
    const step_state st = state();
    dev_array<std::uint64_t> staging(static_cast<std::size_t>(max_l) * ctx_rows_ * (row_bytes / 8));
    std::size_t r_at = 0;
    for (std::size_t s = 0; s < S; ++s) {
      for (std::uint64_t i = 0; i < live; ++i) {
        const std::int32_t slot = slot_of[i];
        history_keys_kernel<><<<256, 256, 0, stream_>>>(st, static_cast<unsigned>(s), slot, ctx_rows_);
        DHD_CUDA(cudaGetLastError());
        if (p == policy::resident) {
          for (unsigned l = 0; l < layers_of(s); ++l)
            history_rows_kernel<><<<512, 256, 0, stream_>>>(
                session_tag(i + 1), static_cast<unsigned>(s), l, 1, 0, ctx_rows_, row_bytes / 8,
                reinterpret_cast<std::uint64_t*>(resident[r_at + l].p + static_cast<std::size_t>(slot) * max_rows_ * row_bytes), 0);
        } else {
          history_rows_kernel<><<<512, 256, 0, stream_>>>(session_tag(i + 1), static_cast<unsigned>(s), 0, layers_of(s), 0,
                                                        ctx_rows_, row_bytes / 8, staging.p,
                                                        static_cast<std::size_t>(ctx_rows_) * (row_bytes / 8));
          DHD_CUDA(cudaGetLastError());
          h->append(i + 1, s, reinterpret_cast<const std::byte*>(staging.p), ctx_rows_, stream_);
        }
        DHD_CUDA(cudaGetLastError());
      }
      r_at += layers_of(s);
    }
    if (h) {
      h->reserve_ahead(static_cast<std::size_t>(steps_) * kb_ + kb_ + 2, stream_);
      // Adaptive placement, resident-first: newest complete pages first, every session, until the
      // pool (the planner's optional_pages) is full.
      bool room = p == policy::adaptive && optional_pages_ != 0;
      for (std::size_t pg = ctx_rows_ / P; room && pg-- > 0;)
        for (std::size_t s = 0; room && s < S; ++s)
          for (std::uint64_t i = 0; room && i < live; ++i) room = h->map_optional_page(i + 1, s, pg, stream_);
    }
    // Entries: the live sessions first, padding after.
    std::vector<std::int32_t> slots(cap_, -1);
    for (std::uint64_t i = 0; i < live; ++i) slots[i] = slot_of[i];
    const auto count = static_cast<std::uint32_t>(live);
    DHD_CUDA(cudaMemcpyAsync(slots_.p, slots.data(), slots_.bytes(), cudaMemcpyHostToDevice, stream_));
    DHD_CUDA(cudaMemcpyAsync(count_.p, &count, sizeof count, cudaMemcpyHostToDevice, stream_));
    DHD_CUDA(cudaMemsetAsync(counters_.p, 0, counters_.bytes(), stream_));
    // Speculative entries: K positions each; query j of entry e is virtual entry e * K + j.
    std::vector<std::int32_t> blocks(cap_, 0), qslots(static_cast<std::size_t>(cap_) * kb_, -1);
    const auto qcount = count * kb_;
    if (kb_ > 1) {
      for (std::uint64_t i = 0; i < live; ++i) {
        blocks[i] = static_cast<std::int32_t>(kb_);
        for (unsigned j = 0; j < kb_; ++j) qslots[i * kb_ + j] = slot_of[i];
      }
      DHD_CUDA(cudaMemcpyAsync(blocks_.p, blocks.data(), blocks_.bytes(), cudaMemcpyHostToDevice, stream_));
      DHD_CUDA(cudaMemcpyAsync(qslots_.p, qslots.data(), qslots_.bytes(), cudaMemcpyHostToDevice, stream_));
      DHD_CUDA(cudaMemcpyAsync(qcount_.p, &qcount, sizeof qcount, cudaMemcpyHostToDevice, stream_));
    }
    // Write views and pool bases.
    std::vector<const std::byte*> layer_rows_host(S * max_l, nullptr);
    std::array<std::array<const std::byte*, max_layers>, S> bases{};
    r_at = 0;
    for (std::size_t s = 0; s < S; ++s) {
      for (unsigned l = 0; l < layers_of(s); ++l) {
        layer_rows_host[s * max_l + l] = new_rows_.p + ((s * max_l + l) * static_cast<std::size_t>(capv())) * row_bytes;
        bases[s][l] = p == policy::resident ? resident[r_at + l].p : h->pool(s, l);
      }
      r_at += layers_of(s);
    }
    DHD_CUDA(cudaMemcpyAsync(layer_rows_.p, layer_rows_host.data(), layer_rows_.bytes(), cudaMemcpyHostToDevice, stream_));
    DHD_CUDA(cudaStreamSynchronize(stream_));  // pageable sources above

    // One eager GEMM of this batch size first: cuBLAS picks and loads its kernel outside the capture.
    // Speculative: the target's forward covers K positions of every session, so K rows each.
    const unsigned gemm_rows = count * kb_;
    gemm_.enqueue(gemm_rows, stream_);
    DHD_CUDA(cudaStreamSynchronize(stream_));
    // Capture: the whole step (with and without the stand-in) and each phase alone.
    std::vector<cudaGraphExec_t> graphs;
    const auto capture = [&](auto&& enqueue) {
      cudaGraph_t g = nullptr;
      cudaGraphExec_t x = nullptr;
      DHD_CUDA(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
      try {
        enqueue();
      } catch (...) {
        (void)cudaStreamEndCapture(stream_, &g);
        if (g != nullptr) (void)cudaGraphDestroy(g);
        throw;
      }
      DHD_CUDA(cudaStreamEndCapture(stream_, &g));
      DHD_CUDA(cudaGraphInstantiate(&x, g, 0));
      DHD_CUDA(cudaGraphDestroy(g));
      graphs.push_back(x);
      return x;
    };
    struct graph_guard {
      std::vector<cudaGraphExec_t>& g;
      ~graph_guard() {
        for (auto x : g) (void)cudaGraphExecDestroy(x);
      }
    } guard{graphs};
    const bool spec = kb_ > 1;
    // Speculative phases: 0..5 per source, then 6 the commit of every source; plain: 0..5.
    const auto commit_all = [&] {
      if (!spec) return;
      for (unsigned s = 0; s < S; ++s) enqueue_phase(6, s, p, h.get(), bases[s], st);
    };
    const auto advance = [&] {
      if (spec)
        spec_advance_kernel<><<<cap_, 128, 0, stream_>>>(st, spec_of());
      else
        advance_kernel<><<<1, 256, 0, stream_>>>(st);
      DHD_CUDA(cudaGetLastError());
    };
    const auto all_phases = [&](bool stand_in) {
      for (unsigned s = 0; s < S; ++s)
        for (unsigned ph = 0; ph < 6; ++ph) enqueue_phase(ph, s, p, h.get(), bases[s], st);
      commit_all();
      if (stand_in) gemm_.enqueue(gemm_rows, stream_);
      advance();
    };
    const cudaGraphExec_t step_on = capture([&] { all_phases(true); });
    const cudaGraphExec_t step_off = o_.stand_in_off_too && gemm_.enabled() ? capture([&] { all_phases(false); }) : nullptr;
    // Phase graphs in the step's dependency order: writes, index, top-k, resolve, followers,
    // attention, (speculative: commit,) stand-in (+ advance); report_index maps that order onto
    // phase_names (the commit is reported under writes).
    const unsigned nph = spec ? 8 : 7;
    static constexpr unsigned plain_report[7] = {5, 0, 1, 2, 3, 4, 6};
    static constexpr unsigned spec_report[8] = {5, 0, 1, 2, 3, 4, 5, 6};
    const unsigned* report_index = spec ? spec_report : plain_report;
    std::array<cudaGraphExec_t, 8> phase_graph{};
    for (unsigned ph = 0; ph < 6; ++ph)
      phase_graph[ph] = capture([&] {
        for (unsigned s = 0; s < S; ++s) enqueue_phase(ph, s, p, h.get(), bases[s], st);
      });
    if (spec) phase_graph[6] = capture(commit_all);
    phase_graph[nph - 1] = capture([&] {
      gemm_.enqueue(gemm_rows, stream_);
      advance();
    });

    // Replays. Speculative: each step's accepted counts (the fixed stream of the distribution,
    // by session and step) are uploaded before its replay, outside the timed events.
    const accepted_length_distribution dist{o_.spec_alpha, kb_};
    std::vector<std::int32_t> acc_host(cap_, 0);
    std::vector<double> step_tokens;  // per step: mean tokens a session committed
    std::uint64_t round = 0;
    const auto prepare = [&] {
      double tokens = 0.0;
      if (spec) {
        for (std::uint64_t i = 0; i < live; ++i) {
          acc_host[i] = static_cast<std::int32_t>(dist.sample(session_tag(i + 1), round));
          tokens += acc_host[i] + 1.0;
        }
        DHD_CUDA(cudaMemcpyAsync(accepted_.p, acc_host.data(), accepted_.bytes(), cudaMemcpyHostToDevice, stream_));
        if (o_.keep_outputs) rec.accepted.emplace_back(acc_host.begin(), acc_host.begin() + static_cast<std::ptrdiff_t>(live));
      }
      step_tokens.push_back(spec ? tokens / static_cast<double>(live) : 1.0);
      ++round;
    };
    cudaEvent_t ev[9] = {};
    struct event_guard {
      cudaEvent_t* e;
      ~event_guard() {
        for (int i = 0; i < 9; ++i)
          if (e[i] != nullptr) (void)cudaEventDestroy(e[i]);
      }
    } eguard{ev};
    for (auto& e : ev) DHD_CUDA(cudaEventCreate(&e));
    std::vector<double> on_ms, off_ms, on_tokens, off_tokens;
    std::vector<std::vector<double>> phase_ms(7);
    std::array<unsigned long long, 8> before{};
    const auto checked_step = [&](auto&& launch) {
      prepare();
      launch();
      DHD_CUDA(cudaEventSynchronize(ev[1]));
      if (o_.check) check_step(st, p, h.get(), bases);
      if (o_.keep_outputs) rec.outputs.push_back(download_outputs(count));
    };
    const auto one = [&](cudaGraphExec_t g, std::vector<double>* into, std::vector<double>* tokens) {
      checked_step([&] {
        DHD_CUDA(cudaEventRecord(ev[0], stream_));
        DHD_CUDA(cudaGraphLaunch(g, stream_));
        DHD_CUDA(cudaEventRecord(ev[1], stream_));
      });
      float ms = 0.0f;
      DHD_CUDA(cudaEventElapsedTime(&ms, ev[0], ev[1]));
      if (into != nullptr) into->push_back(ms);
      if (tokens != nullptr) tokens->push_back(step_tokens.back());
    };
    for (unsigned i = 0; i < o_.warmup; ++i) one(step_on, nullptr, nullptr);
    before = read_counters();
    for (unsigned i = 0; i < o_.timed; ++i) one(step_on, &on_ms, &on_tokens);
    if (step_off != nullptr)
      for (unsigned i = 0; i < o_.timed; ++i) one(step_off, &off_ms, &off_tokens);
    for (unsigned i = 0; i < o_.phased; ++i) {
      checked_step([&] {
        // ev[1] must end the step for checked_step: phases between ev[0], ev[2..], ev[1].
        DHD_CUDA(cudaEventRecord(ev[0], stream_));
        for (unsigned ph = 0; ph < nph; ++ph) {
          DHD_CUDA(cudaGraphLaunch(phase_graph[ph], stream_));
          DHD_CUDA(cudaEventRecord(ph == nph - 1 ? ev[1] : ev[2 + ph], stream_));
        }
      });
      const cudaEvent_t* marks[9] = {&ev[0], &ev[2], &ev[3], &ev[4], &ev[5], &ev[6], &ev[7], &ev[8], &ev[1]};
      marks[nph] = &ev[1];
      std::array<double, 7> sum{};
      for (unsigned ph = 0; ph < nph; ++ph) {
        float ms = 0.0f;
        DHD_CUDA(cudaEventElapsedTime(&ms, *marks[ph], *marks[ph + 1]));
        sum[report_index[ph]] += ms;
      }
      for (unsigned ph = 0; ph < 7; ++ph) phase_ms[ph].push_back(sum[ph]);
    }
    if (h) h->check_errors(stream_);
    const auto after = read_counters();

    // Results.
    std::array<double, 7> phase_med{};
    for (unsigned ph = 0; ph < 7; ++ph) phase_med[ph] = quantile(phase_ms[ph], 0.5);
    const auto census_of = [&](result_row& r) {
      const double sel = static_cast<double>(after[0] - before[0]);
      if (sel > 0) {
        r.direct_share = static_cast<double>(after[1] - before[1]) / sel;
        r.hot_share = static_cast<double>(after[2] - before[2]) / sel;
        r.host_share = static_cast<double>(after[3] - before[3]) / sel;
      }
      r.mismatches = after[5];
      r.bytes_checked = after[6];
      r.steps = steps_;
      r.phase_ms = phase_med;
    };
    const auto add = [&](bool stand_in, const std::vector<double>& ms, const std::vector<double>& tokens) {
      result_row r = base_row(p, stand_in);
      r.live = live;
      r.spec_block = kb_;
      r.tokens_per_step = tokens.empty() ? 1.0 : std::accumulate(tokens.begin(), tokens.end(), 0.0) / static_cast<double>(tokens.size());
      const auto sum = summarize_steps(ms, static_cast<double>(live), r.tokens_per_step);
      r.p50_ms = sum.p50_ms;
      r.p90_ms = sum.p90_ms;
      r.tokens_per_s = sum.tokens_per_s;
      census_of(r);
      if (!r.stand_in) r.phase_ms[6] = 0.0;  // the phased steps ran the stand-in; this row's steps did not
      const auto q = simulate_queue(o_.target_c, live, o_.gen_tokens, r.tokens_per_step, 20 * o_.gen_tokens);
      r.wait_steps = q.mean_wait_steps;
      r.wait_s = q.mean_wait_steps * sum.p50_ms / 1000.0;
      r.fill_s = q.fill_steps * sum.p50_ms / 1000.0;
      if (p == policy::adaptive) r.note = "optional pages " + std::to_string(optional_pages_);
      rec.rows.push_back(std::move(r));
    };
    add(true, on_ms, on_tokens);
    if (step_off != nullptr) add(false, off_ms, off_tokens);
    return rec;
  }

  [[nodiscard]] const load_point& resident_load() const { return lp_res_; }
  [[nodiscard]] const load_point& hierarchy_load() const { return lp_hier_; }
  [[nodiscard]] unsigned capacity() const { return cap_; }
  /// Floats of one step's attention output per entry, over every source and layer.
  [[nodiscard]] std::size_t floats_per_entry() const { return std::size_t{max_l} * S * o_.heads * value_dims; }
  /// K of the run (1: plain decode).
  [[nodiscard]] unsigned block() const { return kb_; }

 private:
  /// Attention entries of a step: one per session, or K per session (one per query) when speculative.
  [[nodiscard]] unsigned capv() const { return cap_ * kb_; }

  spec_state spec_of() const {
    spec_state sp;
    sp.accepted = accepted_.p;
    sp.qint = spec_qint_.p;
    sp.block = kb_;
    sp.sources = static_cast<unsigned>(S);
    return sp;
  }

  verify_out verify_of(std::size_t s) const {
    const auto& v = vbatches_[s];
    return {v.count(), v.slots(), v.queries(), v.lengths(), v.selections(), v.locations()};
  }
  result_row base_row(policy p, bool stand_in) const {
    result_row r;
    r.model = model_;
    r.policy = std::string(to_string(p));
    r.context = o_.context;
    r.target_c = o_.target_c;
    r.stand_in = stand_in && gemm_.enabled();
    r.admitted = p == policy::resident ? lp_res_.admitted : lp_hier_.admitted;
    r.planner_count = p == policy::resident ? lp_res_.planner_count : lp_hier_.planner_count;
    return r;
  }

  step_state state() const {
    step_state st;
    st.slots = slots_.p;
    st.count = count_.p;
    st.rows = rows_.p;
    st.tag = tag_.p;
    st.tokens = tokens_.p;
    st.qstate = qstate_.p;
    st.qint = qint_.p;
    st.keys = keys_.p;
    st.scales = scales_.p;
    st.cap = cap_;
    st.max_rows = max_rows_;
    st.positions_per_row = m;
    st.rho = o_.rho;
    return st;
  }

  void allocate_common() {
    if (slots_.p != nullptr) return;
    if (o_.heads == 0 || o_.heads > max_heads) throw std::invalid_argument("heads must be 1.." + std::to_string(max_heads));
    const std::size_t seg = static_cast<std::size_t>(capv()) * max_rows_;
    slots_ = dev_array<std::int32_t>(cap_);
    count_ = dev_array<std::uint32_t>(1);
    rows_ = dev_array<std::int32_t>(cap_);
    tag_ = dev_array<std::uint64_t>(cap_);
    tokens_ = dev_array<std::int64_t>(cap_);
    qstate_ = dev_array<float>(S * cap_ * index_dims);
    qint_ = dev_array<int>(S * cap_ * index_dims);
    keys_ = dev_array<std::int8_t>(S * seg * index_dims);
    scales_ = dev_array<float>(S * seg);
    new_rows_ = dev_array<std::byte>(S * max_l * static_cast<std::size_t>(capv()) * row_bytes);
    layer_rows_ = dev_array<const std::byte*>(S * max_l);
    scores_ = dev_array<float>(seg);
    scores_out_ = dev_array<float>(seg);
    rows_in_ = dev_array<int>(seg);
    rows_out_ = dev_array<int>(seg);
    seg_begin_ = dev_array<int>(capv());
    seg_end_ = dev_array<int>(capv());
    out_ = dev_array<float>(S * max_l * static_cast<std::size_t>(capv()) * o_.heads * value_dims);
    ref_ = dev_array<float>(out_.n);
    // One split for the whole run (every source, policy and the reference), chosen for the slice's
    // layers: the outputs the checks compare are computed in the same order.
    split_ = attention_split<row_bytes>(capv(), max_l, K);
    scratch_ = dev_array<float>(attention_scratch_floats(split_, capv(), max_l, o_.heads, value_dims));
    stats_ = dev_array<dhisparse::cuda::entry_stats>(S * cap_);
    counters_ = dev_array<unsigned long long>(8);
    for (std::size_t s = 0; s < S; ++s) batches_.emplace_back(cap_, K);
    resident_locs_ = dev_array<dhisparse::location>(S * static_cast<std::size_t>(cap_) * K);
    if (kb_ > 1) {
      for (std::size_t s = 0; s < S; ++s) vbatches_.emplace_back(cap_, kb_, K);
      blocks_ = dev_array<std::int32_t>(cap_);
      accepted_ = dev_array<std::int32_t>(cap_);
      qslots_ = dev_array<std::int32_t>(capv());
      qcount_ = dev_array<std::uint32_t>(1);
      spec_qint_ = dev_array<int>(static_cast<std::size_t>(capv()) * index_dims);
      vstats_ = dev_array<dhisparse::cuda::verify_entry_stats>(S * cap_);
      DHD_CUDA(cudaMemsetAsync(accepted_.p, 0, accepted_.bytes(), stream_));
      DHD_CUDA(cudaMemsetAsync(vstats_.p, 0, vstats_.bytes(), stream_));
      ring_ = std::make_unique<dhisparse::cuda::draft_ring_store<ring_t>>(
          dhisparse::draft_ring_config{.slots = cap_, .row_bytes = ring_row_bytes, .layers = ring_allocations}, stream_);
      ring_sink_ = dev_array<unsigned long long>(1);
    }
    iota_rows_kernel<><<<1024, 256, 0, stream_>>>(rows_in_.p, capv(), max_rows_);
    DHD_CUDA(cudaGetLastError());
    DHD_CUDA(cudaMemsetAsync(rows_.p, 0, rows_.bytes(), stream_));
    DHD_CUDA(cudaMemsetAsync(stats_.p, 0, stats_.bytes(), stream_));
    DHD_CUDA(cub::DeviceSegmentedRadixSort::SortPairsDescending(nullptr, sort_temp_bytes_, scores_.p, scores_out_.p,
                                                                 rows_in_.p, rows_out_.p, static_cast<int>(seg),
                                                                 static_cast<int>(capv()), seg_begin_.p, seg_end_.p, 0,
                                                                 32, stream_));
    sort_temp_ = dev_array<std::byte>(sort_temp_bytes_);
    DHD_CUDA((attention_prepare<row_bytes, value_dims>()));
  }

  batch_out batch_of(std::size_t s, policy p) const {
    const auto& b = batches_[s];
    batch_out o{b.slots(), b.lengths(), b.selections(), b.locations(), b.count()};
    if (p == policy::resident) o.locations = resident_locs_.p + s * static_cast<std::size_t>(cap_) * K;
    return o;
  }

  attention_args attention_of(std::size_t s, policy p, const std::array<const std::byte*, max_layers>& base, float* out,
                              bool generate) const {
    attention_args a;
    if (kb_ > 1) {  // K virtual entries per session: query j of entry e at e * K + j
      a.slots = qslots_.p;
      a.count = qcount_.p;
      a.selections = vbatches_[s].selections();
      a.locations = vbatches_[s].locations();
    } else {
      const batch_out b = batch_of(s, p);
      a.slots = slots_.p;
      a.count = count_.p;
      a.selections = b.selections;
      a.locations = b.locations;
    }
    a.tag = tag_.p;
    for (unsigned l = 0; l < max_layers; ++l) a.base[l] = base[l];
    a.out = out + s * max_l * static_cast<std::size_t>(capv()) * o_.heads * value_dims;
    a.scratch = scratch_.p;
    a.cap = capv();
    a.k = K;
    a.row_bytes = row_bytes;
    a.value_dims = value_dims;
    a.heads = o_.heads;
    a.source = static_cast<unsigned>(s);
    a.splits = split_.splits;
    a.split_rows = split_.rows;
    a.generate = generate;
    return a;
  }

  /// Enqueues phase `ph` of source `s`: 0 writes, 1 index, 2 top-k, 3 resolve, 4 followers, 5 attention.
  void enqueue_phase(unsigned ph, unsigned s, policy p, hierarchy_t* h, const std::array<const std::byte*, max_layers>& base,
                     const step_state& st) {
    if (kb_ > 1) {
      if constexpr (m == 1) enqueue_spec_phase(ph, s, p, h, base, st);  // packed sources: refused in the constructor
      return;
    }
    if (ph == 6) return;  // plain decode has no commit
    const batch_out b = batch_of(s, p);
    switch (ph) {
      case 0: {
        write_target wt;
        wt.layers = layers_of(s);
        wt.row_bytes = row_bytes;
        wt.source = s;
        for (unsigned l = 0; l < layers_of(s); ++l) {
          wt.new_rows[l] = new_rows_.p + ((s * max_l + l) * static_cast<std::size_t>(cap_)) * row_bytes;
          if (p == policy::resident) wt.resident[l] = const_cast<std::byte*>(base[l]);
        }
        produce_kernel<><<<cap_, 128, 0, stream_>>>(st, wt);
        DHD_CUDA(cudaGetLastError());
        if (h != nullptr) {
          const dhisparse::cuda::kv_write_view w{slots_.p, rows_.p, nullptr, layer_rows_.p + s * max_l, 0, 1, cap_};
          h->append(s, w, stream_);
        }
        break;
      }
      case 1:
        query_kernel<><<<cap_, 128, 0, stream_>>>(st, s, seg_begin_.p, seg_end_.p);
        score_kernel<><<<dim3((max_rows_ + 255) / 256, cap_), 256, 0, stream_>>>(st, s, scores_.p);
        DHD_CUDA(cudaGetLastError());
        break;
      case 2: {
        std::size_t temp = sort_temp_bytes_;
        DHD_CUDA(cub::DeviceSegmentedRadixSort::SortPairsDescending(
            sort_temp_.p, temp, scores_.p, scores_out_.p, rows_in_.p, rows_out_.p,
            static_cast<int>(static_cast<std::size_t>(cap_) * max_rows_), static_cast<int>(cap_), seg_begin_.p,
            seg_end_.p, 0, 32, stream_));
        gather_top_k_kernel<><<<cap_, 256, 0, stream_>>>(st, rows_out_.p, K, b);
        DHD_CUDA(cudaGetLastError());
        break;
      }
      case 3:
        if (h != nullptr) {
          h->resolve(s, batches_[s].view(), stream_, o_.resolve_copies);
          h->copy_stats_async(s, std::span<dhisparse::cuda::entry_stats>(stats_.p + s * cap_, cap_), stream_);
          add_entry_stats_kernel<><<<1, 256, 0, stream_>>>(reinterpret_cast<const std::uint32_t*>(stats_.p + s * cap_), cap_,
                                                         counters_.p);
        } else {
          resident_locations_kernel<><<<cap_, 256, 0, stream_>>>(st, K, b, counters_.p);
        }
        DHD_CUDA(cudaGetLastError());
        break;
      case 4:
        if (h != nullptr && o_.resolve_copies == dhisparse::copy_layers::producer_only)
          for (unsigned l = 1; l < layers_of(s); ++l) h->copy_follower(s, l, stream_);
        break;
      case 5:
        DHD_CUDA((attention<row_bytes, value_dims>(attention_of(s, p, base, out_.p, false), layers_of(s), stream_)));
        break;
      default: break;
    }
  }

  /// Enqueues phase `ph` of source `s` of a speculative round (decode_spec_kernels.cuh): 0 ring
  /// traffic (source 0: the drafter is one per model), the block's rows and stage_blocks, 1 index,
  /// 2 top-k, 3 verify, 4 followers, 5 attention of the K queries, 6 commit.
  void enqueue_spec_phase(unsigned ph, unsigned s, policy p, hierarchy_t* h,
                          const std::array<const std::byte*, max_layers>& base, const step_state& st) {
    const spec_state sp = spec_of();
    const verify_out v = verify_of(s);
    switch (ph) {
      case 0: {
        if (s == 0) {
          spec_ring_kernel<<<dim3(cap_, ring_allocations), 128, 0, stream_>>>(st, ring_->ref(), kb_,
                                                                              static_cast<unsigned>(ring_t::window),
                                                                              ring_sink_.p);
          DHD_CUDA(cudaGetLastError());
        }
        write_target wt;
        wt.layers = layers_of(s);
        wt.row_bytes = row_bytes;
        wt.source = s;
        for (unsigned l = 0; l < layers_of(s); ++l) {
          wt.new_rows[l] = new_rows_.p + ((s * max_l + l) * static_cast<std::size_t>(capv())) * row_bytes;
          if (p == policy::resident) wt.resident[l] = const_cast<std::byte*>(base[l]);
        }
        spec_produce_kernel<><<<cap_, 256, 0, stream_>>>(st, wt, kb_);
        DHD_CUDA(cudaGetLastError());
        if (h != nullptr) {
          dhisparse::cuda::stage_view sv;
          sv.slots = slots_.p;
          sv.counts = blocks_.p;
          sv.layer_rows = layer_rows_.p + s * max_l;
          sv.max_block = kb_;
          sv.capacity = cap_;
          h->stage_blocks(s, sv, stream_);
        }
        break;
      }
      case 1:
        spec_query_kernel<><<<dim3(cap_, kb_), 128, 0, stream_>>>(st, sp, s, seg_begin_.p, seg_end_.p);
        spec_score_kernel<><<<dim3((max_rows_ + 255) / 256, capv()), 256, 0, stream_>>>(st, sp, s, scores_.p);
        DHD_CUDA(cudaGetLastError());
        break;
      case 2: {
        std::size_t temp = sort_temp_bytes_;
        DHD_CUDA(cub::DeviceSegmentedRadixSort::SortPairsDescending(
            sort_temp_.p, temp, scores_.p, scores_out_.p, rows_in_.p, rows_out_.p,
            static_cast<int>(static_cast<std::size_t>(capv()) * max_rows_), static_cast<int>(capv()), seg_begin_.p,
            seg_end_.p, 0, 32, stream_));
        spec_gather_kernel<><<<dim3(cap_, kb_), 256, 0, stream_>>>(st, sp, rows_out_.p, K, v);
        DHD_CUDA(cudaGetLastError());
        break;
      }
      case 3:
        if (h != nullptr) {
          h->verify(s, vbatches_[s].view(), stream_, o_.resolve_copies);
          h->copy_verify_stats_async(s, std::span<dhisparse::cuda::verify_entry_stats>(vstats_.p + s * cap_, cap_), stream_);
          add_verify_stats_kernel<><<<1, 256, 0, stream_>>>(reinterpret_cast<const std::uint32_t*>(vstats_.p + s * cap_),
                                                          cap_, counters_.p);
        } else {
          spec_resident_locations_kernel<><<<dim3(cap_, kb_), 256, 0, stream_>>>(st, sp, K, v, counters_.p);
        }
        DHD_CUDA(cudaGetLastError());
        break;
      case 4:
        if (h != nullptr && o_.resolve_copies == dhisparse::copy_layers::producer_only)
          for (unsigned l = 1; l < layers_of(s); ++l) h->copy_follower(s, l, stream_);
        break;
      case 5:
        DHD_CUDA((attention<row_bytes, value_dims>(attention_of(s, p, base, out_.p, false), layers_of(s), stream_)));
        break;
      case 6:
        if (h != nullptr) h->commit(s, dhisparse::cuda::commit_view{slots_.p, accepted_.p, cap_}, stream_);
        break;
      default: break;
    }
  }

  /// After a step: the reference attention over the same selections with generated rows, compared
  /// bit for bit (the resident computation without its memory: equal outputs mean equal to resident).
  void check_step(const step_state&, policy p, hierarchy_t*, const std::array<std::array<const std::byte*, max_layers>, S>& bases) {
    for (std::size_t s = 0; s < S; ++s) {
      DHD_CUDA((attention<row_bytes, value_dims>(attention_of(s, p, bases[s], ref_.p, true), layers_of(s), stream_)));
      const std::size_t off = s * max_l * static_cast<std::size_t>(capv()) * o_.heads * value_dims;
      compare_outputs_kernel<><<<256, 256, 0, stream_>>>(out_.p + off, ref_.p + off, kb_ > 1 ? qcount_.p : count_.p,
                                                       kb_ > 1 ? qslots_.p : slots_.p, layers_of(s), capv(),
                                                       o_.heads * value_dims, counters_.p);
      DHD_CUDA(cudaGetLastError());
    }
    DHD_CUDA(cudaStreamSynchronize(stream_));
  }

  std::vector<float> download_outputs(std::uint32_t live) {
    // Per source and layer, the live entries' rows ([layer][cap][heads][V] -> entries first).
    std::vector<float> all(out_.n);
    DHD_CUDA(cudaMemcpyAsync(all.data(), out_.p, out_.bytes(), cudaMemcpyDeviceToHost, stream_));
    DHD_CUDA(cudaStreamSynchronize(stream_));
    std::vector<float> live_only;
    const std::size_t per = static_cast<std::size_t>(o_.heads) * value_dims;
    for (std::size_t s = 0; s < S; ++s)
      for (unsigned l = 0; l < layers_of(s); ++l)
        for (std::uint32_t e = 0; e < live * kb_; ++e) {
          const float* at = all.data() + ((s * max_l + l) * static_cast<std::size_t>(capv()) + e) * per;
          live_only.insert(live_only.end(), at, at + per);
        }
    return live_only;
  }

  std::array<unsigned long long, 8> read_counters() {
    std::array<unsigned long long, 8> c{};
    DHD_CUDA(cudaMemcpyAsync(c.data(), counters_.p, sizeof c, cudaMemcpyDeviceToHost, stream_));
    DHD_CUDA(cudaStreamSynchronize(stream_));
    return c;
  }

  std::string model_;
  run_options o_;
  stand_in_gemm& gemm_;
  cudaStream_t stream_;
  load_point lp_res_, lp_hier_;
  std::uint64_t slice_budget_ = 0, optional_pages_ = 0;
  unsigned ctx_rows_ = 0, steps_ = 0, max_rows_ = 0, cap_ = 0, kb_ = 1;

  dev_array<std::int32_t> slots_, rows_;
  dev_array<std::uint32_t> count_;
  dev_array<std::uint64_t> tag_;
  dev_array<std::int64_t> tokens_;
  dev_array<float> qstate_;
  dev_array<int> qint_;
  dev_array<std::int8_t> keys_;
  dev_array<float> scales_, scores_, scores_out_;
  dev_array<int> rows_in_, rows_out_, seg_begin_, seg_end_;
  dev_array<std::byte> new_rows_, sort_temp_;
  dev_array<const std::byte*> layer_rows_;
  dev_array<float> out_, ref_, scratch_;
  attention_split_shape split_;
  dev_array<dhisparse::cuda::entry_stats> stats_;
  dev_array<unsigned long long> counters_;
  dev_array<dhisparse::location> resident_locs_;
  std::vector<dhisparse::cuda::device_batch> batches_;
  // Speculative runs only.
  std::vector<dhisparse::cuda::device_verify_batch> vbatches_;
  dev_array<std::int32_t> blocks_, accepted_, qslots_;
  dev_array<std::uint32_t> qcount_;
  dev_array<int> spec_qint_;
  dev_array<dhisparse::cuda::verify_entry_stats> vstats_;
  std::unique_ptr<dhisparse::cuda::draft_ring_store<ring_t>> ring_;
  dev_array<unsigned long long> ring_sink_;
  std::size_t sort_temp_bytes_ = 0;
};

}  // namespace dhisparse_bench::decode

namespace dhisparse_bench::decode {

/// Runs every policy of `pols` for one configuration of model `Full` (a one-source slice, hot
/// cache B rows); a policy that fails gives a row whose note says why. With `o.spec_too`, a
/// speculative run of K = spec_block_for_load(target C) follows for every policy (its own
/// admission with the drafter charged), and each of its rows carries Equation 13's verdict
/// against the plain row of the same policy and stand-in setting measured just before.
template <class Full, std::size_t B>
std::vector<result_row> run_model(const std::string& name, const run_options& o, const std::vector<policy>& pols,
                                  stand_in_gemm& gemm, cudaStream_t stream) {
  std::vector<result_row> rows;
  const auto failed = [&](policy p, const std::string& why, unsigned block) {
    result_row r;
    r.model = name;
    r.policy = std::string(to_string(p));
    r.context = o.context;
    r.target_c = o.target_c;
    r.spec_block = block;
    r.note = why;
    rows.push_back(std::move(r));
  };
  run_options plain = o;
  plain.spec_block = 0;
  {
    decode_run<Full, layout_slice<Full, 1>, B> run(name, plain, gemm, stream);
    for (policy p : pols) {
      try {
        auto rec = run.run(p);
        rows.insert(rows.end(), rec.rows.begin(), rec.rows.end());
      } catch (const std::exception& e) {
        failed(p, std::string("FAILED: ") + e.what(), 1);
      }
    }
  }  // the plain run's device memory is freed before the speculative one allocates
  if (!o.spec_too) return rows;
  const unsigned block = spec_block_for_load(o.target_c);
  if constexpr (Full::sources[0].positions_per_row != 1) {
    for (policy p : pols) failed(p, "speculation not modelled: packed rows (several positions a row)", block);
    return rows;
  } else {
    run_options spec = o;
    spec.spec_block = block;
    const std::size_t plain_rows = rows.size();
    std::optional<decode_run<Full, layout_slice<Full, 1>, B>> run;
    try {
      run.emplace(name, spec, gemm, stream);
    } catch (const std::exception& e) {
      for (policy p : pols) failed(p, std::string("FAILED: ") + e.what(), block);
      return rows;
    }
    for (policy p : pols) {
      try {
        auto rec = run->run(p);
        for (auto& r : rec.rows) {
          for (std::size_t i = 0; i < plain_rows; ++i) {
            const auto& q = rows[i];
            if (q.policy != r.policy || q.stand_in != r.stand_in || q.p50_ms <= 0.0 || r.p50_ms <= 0.0) continue;
            const auto v = speculation_verdict(r.admitted, q.admitted, r.p50_ms, r.tokens_per_step, q.p50_ms);
            r.sessions_kept_share = v.sessions_kept_share;
            r.tpot_ratio = v.tpot_ratio;
            r.eq13 = v.pays ? 1 : 0;
          }
          rows.push_back(std::move(r));
        }
      } catch (const std::exception& e) {
        failed(p, std::string("FAILED: ") + e.what(), block);
      }
    }
    return rows;
  }
}

}  // namespace dhisparse_bench::decode
