#pragma once
// Shared by the speculative round examples (host and CUDA backend): the synthetic KV of the
// target's sources and of the drafter, the request state and the verification queries, so both
// examples run the same rounds and check them the same way.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <vector>

#include <dhisparse/layout.hpp>
#include <dhisparse/layouts/tiny.hpp>
#include <dhisparse/types.hpp>

namespace spec_workload {

namespace dh = dhisparse;

using Layout = dh::layouts::tiny;  // source 0: 2 payload layers of 64 B; source 1: 1 layer of 32 B
constexpr std::size_t sources = dh::source_count<Layout>;
constexpr std::size_t top_k = Layout::top_k;
constexpr std::size_t draft_layers = 2;
constexpr std::size_t draft_row_bytes = 32;
constexpr std::size_t drafter = sources;  // the drafter's KV gets its own content, as if it were one more source

// ---------------------------------------------------------------------------------------------
// Synthetic KV: the bytes of a position are a function of (request, source, layer, position,
// token), as a model's K/V at a position depend on the tokens up to it. A rejected proposal and
// the token that later takes its position therefore have different bytes.
// ---------------------------------------------------------------------------------------------

inline constexpr std::uint64_t mix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

inline void kv_row(std::byte* out, std::size_t bytes, dh::request_id id, std::size_t source, std::size_t layer,
            std::int64_t position, std::uint64_t token) {
  const std::uint64_t key =
      mix64(mix64(id * 1000003 + source * 101 + layer) ^ mix64(static_cast<std::uint64_t>(position)) ^ token);
  for (std::size_t w = 0; w < bytes / 8; ++w) {
    const std::uint64_t word = mix64(key + w);
    std::memcpy(out + w * 8, &word, 8);
  }
}

/// Rows of `tokens` at positions first, first+1, ... laid out [layer][count][row_bytes] (what
/// append, stage_block and the draft ring's write take).
inline std::vector<std::byte> kv_rows(dh::request_id id, std::size_t source, std::size_t layers, std::size_t row_bytes,
                               std::int64_t first, std::span<const std::uint64_t> tokens) {
  std::vector<std::byte> rows(layers * tokens.size() * row_bytes);
  for (std::size_t l = 0; l < layers; ++l)
    for (std::size_t i = 0; i < tokens.size(); ++i)
      kv_row(rows.data() + (l * tokens.size() + i) * row_bytes, row_bytes, id, source, l,
             first + static_cast<std::int64_t>(i), tokens[i]);
  return rows;
}
inline std::vector<std::byte> target_rows(dh::request_id id, std::size_t s, std::int64_t first,
                                   std::span<const std::uint64_t> tokens) {
  return kv_rows(id, s, Layout::sources[s].payload_layers, Layout::sources[s].row_bytes, first, tokens);
}
inline std::vector<std::byte> draft_rows(dh::request_id id, std::int64_t first, std::span<const std::uint64_t> tokens) {
  return kv_rows(id, drafter, draft_layers, draft_row_bytes, first, tokens);
}

inline bool same_bytes(std::span<const std::byte> got, dh::request_id id, std::size_t source, std::size_t layer,
                std::int64_t position, std::uint64_t token) {
  std::vector<std::byte> want(got.size());
  kv_row(want.data(), want.size(), id, source, layer, position, token);
  return std::memcmp(got.data(), want.data(), want.size()) == 0;
}

struct request_state {
  dh::request_id id = 0;
  std::size_t slot = 0;                // the hierarchy's slot; the draft ring uses the same one
  std::vector<std::uint64_t> tokens;   // committed tokens, by position
  std::vector<std::uint64_t> block;    // this round's block: anchor, then proposals
};

/// Query j of a round sits at position n + j: it may select committed rows (< n) and block rows
/// n .. n + j (itself included), never a later proposal. Distinct rows, -1 padded at the end.
inline std::vector<dh::row_index> make_query(std::mt19937_64& rng, std::int64_t n, std::size_t j) {
  std::vector<dh::row_index> q;
  for (std::size_t i = 0; i <= j; ++i) q.push_back(static_cast<dh::row_index>(n + static_cast<std::int64_t>(i)));
  q.push_back(0);  // an attention sink
  const std::size_t wanted = top_k - 1 - rng() % 3;  // leave 1..3 entries as -1
  while (q.size() < wanted) {
    const auto r = static_cast<dh::row_index>(rng() % static_cast<std::uint64_t>(n));
    if (std::find(q.begin(), q.end(), r) == q.end()) q.push_back(r);
  }
  q.resize(top_k, dh::no_row);
  return q;
}

/// The token at position e as query-visible this round: committed, or this round's block.
inline std::uint64_t token_at(const request_state& rq, dh::row_index e) {
  const auto n = static_cast<dh::row_index>(rq.tokens.size());
  return e < n ? rq.tokens[static_cast<std::size_t>(e)] : rq.block[static_cast<std::size_t>(e - n)];
}

}  // namespace spec_workload
