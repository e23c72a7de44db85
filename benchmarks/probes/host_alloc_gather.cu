// Probe: zero-copy gathers of fresh 576-byte rows from pinned host memory allocated with
// cudaHostAlloc vs the VMM API (cuMemCreate at a host NUMA location, 2 MiB and 1 GiB granularity),
// 410 rows per request from 100K-row request windows, address-sorted, flat 132 x 512 grid, with
// and without an L2-flushing memset before every launch. Fresh rows: every launch draws its rows
// without replacement from a per-request permutation of its pool's window, so no row is read
// twice in a pool (checked: the probe exits 1 if a row repeats); rows share 4 KiB pages, so the
// probe prints how many of a launch's rows sit on a page an earlier launch touched. Built with the CUDA benchmarks as
// probe_host_alloc_gather (CI compiles it); by hand:
//   nvcc -O3 -arch=sm_90 -o host_alloc_gather benchmarks/probes/host_alloc_gather.cu -lcuda
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "probe_timing.cuh"

#define CU(x)                                                                         \
  do {                                                                                \
    CUresult e = (x);                                                                 \
    if (e != CUDA_SUCCESS) {                                                          \
      const char* m = nullptr;                                                        \
      cuGetErrorString(e, &m);                                                        \
      std::printf("CU %s at %d: %s\n", #x, __LINE__, m);                              \
      return nullptr;                                                                 \
    }                                                                                 \
  } while (0)

__global__ void gather(const int4* __restrict__ src, int4* __restrict__ dst, const long* __restrict__ off, int n,
                       int vecs) {
  const int lane = threadIdx.x & 31, warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int warps = (gridDim.x * blockDim.x) >> 5;
  for (int r = warp; r < n; r += warps) {
    const int4* s = src + off[r];
    int4* d = dst + static_cast<size_t>(r) * vecs;
    int4 b[2];
    for (int k = 0; k < 2; ++k)
      if (lane + 32 * k < vecs) b[k] = s[lane + 32 * k];
    for (int k = 0; k < 2; ++k)
      if (lane + 32 * k < vecs) d[lane + 32 * k] = b[k];
  }
}

__global__ void fill(int4* p, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    p[i] = make_int4(1, 2, 3, 4);
}

void* vmm_host(size_t bytes, size_t granularity) {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
  prop.location.id = 0;
  size_t gmin = 0;
  CU(cuMemGetAllocationGranularity(&gmin, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  const size_t g = std::max(gmin, granularity);
  bytes = (bytes + g - 1) / g * g;
  CUdeviceptr va;
  CU(cuMemAddressReserve(&va, bytes, g, 0, 0));
  const size_t chunk = std::max(g, (size_t{1} << 30) / g * g);
  for (size_t off = 0; off < bytes; off += chunk) {
    const size_t n = std::min(chunk, bytes - off);
    CUmemGenericAllocationHandle h;
    CU(cuMemCreate(&h, n, &prop, 0));
    CU(cuMemMap(va + off, n, 0, h, 0));
    CU(cuMemRelease(h));
  }
  CUmemAccessDesc acc = {};
  acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  acc.location.id = 0;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CU(cuMemSetAccess(va, bytes, &acc, 1));
  std::printf("vmm host pool: granularity %zu (minimum %zu)\n", g, gmin);
  return reinterpret_cast<void*>(va);
}

int main() {
  DHB_CHECK(cudaFree(nullptr));
  cudaStream_t s;
  DHB_CHECK(cudaStreamCreate(&s));
  cudaEvent_t a, b;
  DHB_CHECK(cudaEventCreate(&a));
  DHB_CHECK(cudaEventCreate(&b));
  const int row_bytes = 576, vecs = row_bytes / 16, per = 410;
  const size_t hist = 100000, requests = 128, pool = hist * row_bytes * requests;
  void* flush;
  DHB_CHECK(cudaMalloc(&flush, size_t{256} << 20));
  void* dst;
  DHB_CHECK(cudaMalloc(&dst, requests * per * row_bytes));
  struct host_pool {
    const char* name;
    void* p;
  };
  std::vector<host_pool> pools;
  void* h = nullptr;
  void* hd = nullptr;
  DHB_CHECK(cudaHostAlloc(&h, pool, cudaHostAllocMapped));
  DHB_CHECK(cudaHostGetDevicePointer(&hd, h, 0));
  pools.push_back({"cudaHostAlloc", hd});
  if (void* v = vmm_host(pool, size_t{2} << 20)) pools.push_back({"vmm-2MiB", v});
  if (void* v = vmm_host(pool, size_t{1} << 30)) pools.push_back({"vmm-1GiB", v});
  for (auto& p : pools) fill<<<1024, 256>>>(static_cast<int4*>(p.p), pool / 16);
  DHB_CHECK(cudaDeviceSynchronize());
  // Fresh rows: per pool and request, a random permutation of the request's window; launches
  // take the next `per` rows of each request's permutation. `used` asserts that no row of a pool
  // is drawn twice; `page_seen` counts rows on 4 KiB host pages an earlier launch touched.
  const size_t rows_total = hist * requests;
  struct draw_state {
    std::vector<std::vector<unsigned>> perm;
    std::vector<size_t> cursor;
    std::vector<unsigned char> used, page_seen;
    size_t rows = 0, repeats = 0, rows_on_seen_pages = 0, pages = 0;
  };
  std::vector<draw_state> draws(pools.size());
  std::mt19937_64 g(9);
  for (auto& d : draws) {
    d.perm.resize(requests);
    for (auto& p : d.perm) {
      p.resize(hist);
      for (size_t i = 0; i < hist; ++i) p[i] = static_cast<unsigned>(i);
      std::shuffle(p.begin(), p.end(), g);
    }
    d.cursor.assign(requests, 0);
    d.used.assign(rows_total, 0);
    d.page_seen.assign(rows_total * row_bytes / 4096 + 1, 0);
  }
  // The offsets of one launch of C requests from pool `pi`, address-sorted; false when a
  // request's window is used up or a row would repeat.
  auto draw_launch = [&](size_t pi, int C, std::vector<long>& off) {
    draw_state& d = draws[pi];
    off.clear();
    std::vector<size_t> pages_now;
    for (int r = 0; r < C; ++r) {
      if (d.cursor[r] + per > hist) return false;
      for (int i = 0; i < per; ++i) {
        const size_t row = static_cast<size_t>(r) * hist + d.perm[r][d.cursor[r]++];
        if (d.used[row]) ++d.repeats;
        d.used[row] = 1;
        ++d.rows;
        const size_t page = row * row_bytes / 4096;  // the page of the row's first byte
        if (d.page_seen[page]) ++d.rows_on_seen_pages;
        pages_now.push_back(page);
        off.push_back(static_cast<long>(row * vecs));
      }
    }
    for (size_t page : pages_now) {
      d.pages += d.page_seen[page] == 0;
      d.page_seen[page] = 1;
    }
    std::sort(off.begin(), off.end());
    return d.repeats == 0;
  };
  long* doff;
  DHB_CHECK(cudaMalloc(&doff, requests * per * sizeof(long)));
  std::vector<long> off;
  for (int C : {8, 128}) {
    const int n = C * per;
    for (size_t pi = 0; pi < pools.size(); ++pi) {
      auto& p = pools[pi];
      for (int flushed = 0; flushed < 2; ++flushed) {
        std::vector<float> t;
        for (int i = 0; i < 48; ++i) {
          if (!draw_launch(pi, C, off)) {
            std::printf("%s: fresh rows ran out or a row repeated (%zu repeats)\n", p.name, draws[pi].repeats);
            return 1;
          }
          DHB_CHECK(cudaMemcpy(doff, off.data(), off.size() * sizeof(long), cudaMemcpyHostToDevice));
          if (flushed) DHB_CHECK(cudaMemsetAsync(flush, i, size_t{256} << 20, s));
          DHB_CHECK(cudaEventRecord(a, s));
          gather<<<132, 512, 0, s>>>(static_cast<const int4*>(p.p), static_cast<int4*>(dst), doff, n, vecs);
          DHB_CHECK(cudaEventRecord(b, s));
          DHB_CHECK(cudaEventSynchronize(b));
          float ms = 0;
          DHB_CHECK(cudaEventElapsedTime(&ms, a, b));
          if (i >= 16) t.push_back(ms * 1e3f);
        }
        std::sort(t.begin(), t.end());
        const float med = t[t.size() / 2];
        std::printf("C=%3d %-14s L2 flush=%d: median %8.1f us  %5.1f GB/s\n", C, p.name, flushed, med,
                    static_cast<double>(n) * row_bytes / med / 1e3);
      }
    }
  }
  // The assertion, over everything drawn: as many distinct rows as draws.
  for (size_t pi = 0; pi < pools.size(); ++pi) {
    const draw_state& d = draws[pi];
    size_t distinct = 0;
    for (unsigned char u : d.used) distinct += u;
    std::printf("%-14s rows drawn %zu, distinct %zu; distinct 4 KiB pages %zu; rows on a page an earlier launch "
                "touched %.1f%%\n",
                pools[pi].name, d.rows, distinct, d.pages, 100.0 * d.rows_on_seen_pages / std::max<size_t>(1, d.rows));
    if (distinct != d.rows || d.repeats != 0) {
      std::printf("FAILED: a row was read twice\n");
      return 1;
    }
  }
  DHB_CHECK(cudaFree(doff));
  return 0;
}
