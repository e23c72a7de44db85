#pragma once
// Shared by the decode demos (host and CUDA backend): the demo layout's synthetic row contents and
// the selection-generator settings, so both demos decode the same workload.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include <dhisparse/layouts/demo.hpp>
#include <dhisparse/workload/selection_generator.hpp>

namespace demo {

using layout = dhisparse::layouts::demo;
constexpr std::size_t row_bytes = layout::payload_row_bytes;  // every source of the demo layout

// ---------------------------------------------------------------------------------------------
// Synthetic row contents: every byte of row `row` of payload layer `layer` of source `source` of
// request number `r` is a function of those numbers and the seed, so any copy can be checked
// against the original without keeping one.
// ---------------------------------------------------------------------------------------------

inline void fill_row(std::byte* dst, std::uint64_t seed, std::size_t r, std::size_t source, std::size_t layer,
                     std::int64_t row) {
  using dhisparse::workload::mix64;
  const std::uint64_t key =
      mix64(seed ^ mix64((static_cast<std::uint64_t>(r) << 40) ^ (static_cast<std::uint64_t>(source) << 32) ^
                         (static_cast<std::uint64_t>(layer) << 24)) ^
            static_cast<std::uint64_t>(row));
  for (std::size_t w = 0; w < row_bytes / sizeof(std::uint64_t); ++w) {
    const std::uint64_t word = mix64(key + w);
    std::memcpy(dst + w * sizeof(word), &word, sizeof(word));
  }
}

/// `count` rows starting at `first` of every payload layer of a source, in append()'s layout.
inline void fill_rows(std::vector<std::byte>& buf, std::uint64_t seed, std::size_t r, std::size_t source, std::int64_t first,
                      std::size_t count) {
  const std::size_t layers = layout::sources[source].payload_layers;
  buf.resize(layers * count * row_bytes);
  for (std::size_t l = 0; l < layers; ++l)
    for (std::size_t i = 0; i < count; ++i)
      fill_row(buf.data() + (l * count + i) * row_bytes, seed, r, source, l, first + static_cast<std::int64_t>(i));
}

/// Selection-generator settings of the demo: recent window, drifting heavy hitters, random tail.
inline dhisparse::workload::selection_params demo_selection_params() {
  dhisparse::workload::selection_params p;
  p.top_k = layout::top_k;
  p.sink_rows = 4;
  p.recent_share = 0.25;
  p.recent_window = 512;
  p.random_share = 0.15;
  p.heavy_select_probability = 0.9;
  p.drift_rate = 0.01;
  p.drift_recent_bias = 0.5;
  p.drift_recent_rows = 2048;
  p.remembered_steps = 0;  // the demo does not use the miss-target mode
  return p;
}

}  // namespace demo
