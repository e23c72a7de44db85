#pragma once
/// \file
/// Deterministic content of stored KV rows for the tests (host and CUDA).
///
/// Every byte of a row is a function of (request tag, source, payload layer, row index): 8-byte
/// words from splitmix64 over a seed mixed from the four coordinates. Two different rows, layers,
/// sources or requests therefore hold different bytes (with overwhelming probability), so a
/// location that points at the wrong row, the wrong layer or a stale copy is caught bit for bit.
///
/// The *request tag* is chosen by the test. Use a different tag for every incarnation of a request
/// (e.g. `request_tag(id, generation)` when an id is completed and admitted again), so that bytes
/// left behind by an earlier incarnation cannot pass for the current one.
///
/// `append` buffers are laid out as the hierarchy expects: `[payload layer][count][row_bytes]`.
///
/// The word-level functions are constexpr and usable in device code (raw pointers, no std::span);
/// the span/vector helpers are host conveniences.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#if defined(__CUDACC__)
#define DHISPARSE_TEST_HD __host__ __device__
#else
#define DHISPARSE_TEST_HD
#endif

namespace dhisparse_testing {

/// splitmix64 finaliser (Steele, Lea, Flood): a cheap, well-mixing bijection on 64-bit words.
DHISPARSE_TEST_HD constexpr std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// Tag of one incarnation of a request: distinct (id, generation) pairs give distinct tags.
DHISPARSE_TEST_HD constexpr std::uint64_t request_tag(std::uint64_t id, std::uint64_t generation = 0) {
  return splitmix64(id ^ splitmix64(generation + 0x5EEDull));
}

/// Seed of one row: mixes every coordinate through splitmix64 so no two coordinates alias.
DHISPARSE_TEST_HD constexpr std::uint64_t row_seed(std::uint64_t tag, std::size_t source, std::size_t layer,
                                                   std::int64_t row) {
  std::uint64_t h = splitmix64(tag);
  h = splitmix64(h ^ (static_cast<std::uint64_t>(source) + 0x100000001B3ull));
  h = splitmix64(h ^ (static_cast<std::uint64_t>(layer) * 0x9E3779B97F4A7C15ull + 0x1234567ull));
  h = splitmix64(h ^ static_cast<std::uint64_t>(row));
  return h;
}

/// The w-th 8-byte word of a row with the given seed.
DHISPARSE_TEST_HD constexpr std::uint64_t row_word(std::uint64_t seed, std::size_t w) {
  return splitmix64(seed + 0x9E3779B97F4A7C15ull * (static_cast<std::uint64_t>(w) + 1));
}

/// The i-th byte of a row with the given seed (little-endian within each word).
DHISPARSE_TEST_HD constexpr std::byte row_byte(std::uint64_t seed, std::size_t i) {
  return static_cast<std::byte>((row_word(seed, i / 8) >> (8 * (i % 8))) & 0xFFu);
}

/// Writes `row_bytes` bytes of row content to `out` (any alignment).
DHISPARSE_TEST_HD inline void fill_row(std::byte* out, std::size_t row_bytes, std::uint64_t tag, std::size_t source,
                                       std::size_t layer, std::int64_t row) {
  const std::uint64_t seed = row_seed(tag, source, layer, row);
  std::size_t i = 0;
  for (std::size_t w = 0; i + 8 <= row_bytes; ++w, i += 8) {
    const std::uint64_t v = row_word(seed, w);
    for (std::size_t b = 0; b < 8; ++b) out[i + b] = static_cast<std::byte>((v >> (8 * b)) & 0xFFu);
  }
  for (; i < row_bytes; ++i) out[i] = row_byte(seed, i);
}

/// Index of the first byte of `in` that differs from the row's content, or `row_bytes` if none.
DHISPARSE_TEST_HD inline std::size_t first_mismatch(const std::byte* in, std::size_t row_bytes, std::uint64_t tag,
                                                    std::size_t source, std::size_t layer, std::int64_t row) {
  const std::uint64_t seed = row_seed(tag, source, layer, row);
  for (std::size_t i = 0; i < row_bytes; i += 8) {
    const std::uint64_t v = row_word(seed, i / 8);
    for (std::size_t b = 0; b < 8 && i + b < row_bytes; ++b)
      if (in[i + b] != static_cast<std::byte>((v >> (8 * b)) & 0xFFu)) return i + b;
  }
  return row_bytes;
}

// --- host conveniences ---------------------------------------------------------------------------

/// Writes row content into a span (its size is the row size).
inline void fill_row(std::span<std::byte> out, std::uint64_t tag, std::size_t source, std::size_t layer,
                     std::int64_t row) {
  fill_row(out.data(), out.size(), tag, source, layer, row);
}

/// True when `in` holds exactly the content of (tag, source, layer, row).
inline bool row_matches(std::span<const std::byte> in, std::uint64_t tag, std::size_t source, std::size_t layer,
                        std::int64_t row) {
  return first_mismatch(in.data(), in.size(), tag, source, layer, row) == in.size();
}

/// Human-readable description of a mismatch (empty when the bytes match), for INFO/CAPTURE.
inline std::string describe_row_mismatch(std::span<const std::byte> in, std::uint64_t tag, std::size_t source,
                                         std::size_t layer, std::int64_t row) {
  const std::size_t at = first_mismatch(in.data(), in.size(), tag, source, layer, row);
  if (at == in.size()) return {};
  std::vector<std::byte> want(in.size());
  fill_row(std::span<std::byte>(want), tag, source, layer, row);
  return "row " + std::to_string(row) + " of source " + std::to_string(source) + " layer " + std::to_string(layer) +
         ": first differing byte " + std::to_string(at) + " (got " +
         std::to_string(std::to_integer<unsigned>(in[at])) + ", want " +
         std::to_string(std::to_integer<unsigned>(want[at])) + ")";
}

/// Fills an append buffer for rows [first_row, first_row + count) of one source:
/// `[layer][count][row_bytes]`, `layers * count * row_bytes` bytes.
inline void fill_append_buffer(std::span<std::byte> out, std::uint64_t tag, std::size_t source, std::size_t layers,
                               std::size_t row_bytes, std::int64_t first_row, std::size_t count) {
  for (std::size_t l = 0; l < layers; ++l)
    for (std::size_t i = 0; i < count; ++i)
      fill_row(out.data() + (l * count + i) * row_bytes, row_bytes, tag, source, l,
               first_row + static_cast<std::int64_t>(i));
}

/// A fresh append buffer for rows [first_row, first_row + count) of one source.
inline std::vector<std::byte> make_append_buffer(std::uint64_t tag, std::size_t source, std::size_t layers,
                                                 std::size_t row_bytes, std::int64_t first_row, std::size_t count) {
  std::vector<std::byte> buf(layers * count * row_bytes);
  fill_append_buffer(buf, tag, source, layers, row_bytes, first_row, count);
  return buf;
}

}  // namespace dhisparse_testing
