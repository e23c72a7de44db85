// bench_decode's DeepSeek-V4.1-Flash configurations, in their own translation unit (compile-time budget).
#include <dhisparse/layouts/deepseek_v41_flash.hpp>

#include "../detail/decode_runs.hpp"
#include "../detail/decode_step.cuh"

namespace dhisparse_bench::decode {

std::vector<result_row> run_deepseek_v41_flash(const run_options& o, const std::vector<policy>& pols, stand_in_gemm& gemm,
                                               cudaStream_t stream) {
  return run_model<dhisparse::layouts::deepseek_v41_flash, deepseek_v41_flash_hot_rows>("deepseek-v4.1-flash", o, pols,
                                                                                      gemm, stream);
}

}  // namespace dhisparse_bench::decode
