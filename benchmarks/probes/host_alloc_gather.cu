// Probe: zero-copy gathers of fresh 576-byte rows from pinned host memory allocated with
// cudaHostAlloc vs the VMM API (cuMemCreate at a host NUMA location, 2 MiB and 1 GiB granularity),
// 410 rows per request from 100K-row request windows, address-sorted, flat 132 x 512 grid, with
// and without an L2-flushing memset before every launch. Built with the CUDA benchmarks as
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
  const int row_bytes = 576, vecs = row_bytes / 16, per = 410, sets = 16;
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
  std::mt19937_64 g(9);
  for (int C : {8, 128}) {
    const int n = C * per;
    std::vector<long> off(static_cast<size_t>(n) * sets);
    for (int l = 0; l < sets; ++l) {
      for (int r = 0; r < C; ++r)
        for (int i = 0; i < per; ++i)
          off[static_cast<size_t>(l) * n + r * per + i] = static_cast<long>((r * hist + g() % hist) * vecs);
      std::sort(off.begin() + static_cast<size_t>(l) * n, off.begin() + static_cast<size_t>(l + 1) * n);
    }
    long* doff;
    DHB_CHECK(cudaMalloc(&doff, off.size() * sizeof(long)));
    DHB_CHECK(cudaMemcpy(doff, off.data(), off.size() * sizeof(long), cudaMemcpyHostToDevice));
    for (auto& p : pools)
      for (int flushed = 0; flushed < 2; ++flushed) {
        std::vector<float> t;
        for (int i = 0; i < 48; ++i) {
          if (flushed) DHB_CHECK(cudaMemsetAsync(flush, i, size_t{256} << 20, s));
          DHB_CHECK(cudaEventRecord(a, s));
          gather<<<132, 512, 0, s>>>(static_cast<const int4*>(p.p), static_cast<int4*>(dst),
                                     doff + static_cast<size_t>(i % sets) * n, n, vecs);
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
    DHB_CHECK(cudaFree(doff));
  }
  return 0;
}
