// bench_decode's GLM-5.3 configurations, in their own translation unit (compile-time budget).
#include <dhisparse/layouts/glm53.hpp>

#include "../detail/decode_runs.hpp"
#include "../detail/decode_step.cuh"

namespace dhisparse_bench::decode {

std::vector<result_row> run_glm53(const run_options& o, const std::vector<policy>& pols, stand_in_gemm& gemm,
                                  cudaStream_t stream) {
  return run_model<dhisparse::layouts::glm53, glm53_hot_rows>("glm-5.3", o, pols, gemm, stream);
}

}  // namespace dhisparse_bench::decode
