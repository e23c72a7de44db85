#pragma once
/// \file
/// The per-model entry points of bench_decode (one translation unit each, benchmarks/decode/).
#include <cuda_runtime.h>

#include <cstddef>
#include <vector>

#include "decode_model.hpp"

namespace dhisparse_bench::decode {

struct run_options;
class stand_in_gemm;

/// B of each model's hot cache: twice k, the paper's GLM-5.3 ratio (4096 for k = 2048).
inline constexpr std::size_t glm53_hot_rows = 4096;
inline constexpr std::size_t deepseek_v41_flash_hot_rows = 1024;

std::vector<result_row> run_glm53(const run_options& o, const std::vector<policy>& pols, stand_in_gemm& gemm,
                                  cudaStream_t stream);
std::vector<result_row> run_deepseek_v41_flash(const run_options& o, const std::vector<policy>& pols, stand_in_gemm& gemm,
                                               cudaStream_t stream);

}  // namespace dhisparse_bench::decode
