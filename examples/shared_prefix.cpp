// Shared prefixes with load-adaptive residency (docs/prefixes.md): the integration template of a
// chat engine with a common system prompt and multi-turn conversations.
//
//   turn 1 of the first chat: admit with the whole prompt, decode, retain the system prompt
//   (a partial last page: 100 rows, 16-row pages) and the whole conversation, complete
//   every other chat: admit on the system prompt, importing only its own question
//   turn 2 of the first chat: admit on the retained conversation, importing only the new turn
//
// Every request resolves its rows (shared and own) and every byte it reads is checked; the program
// prints the host and GPU pages sharing saved and exits non-zero on any wrong byte or broken book.
#include <dhisparse/host/hierarchy.hpp>
#include <dhisparse/host/residency_manager.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <vector>

namespace {

using namespace dhisparse;

/// One source of 2 payload layers (producer + follower), 64-byte rows, k = 32, 16-row pages.
struct chat_layout {
  static constexpr std::size_t top_k = 32;
  static constexpr std::size_t page_rows = 16;
  static constexpr std::array<source_desc, 1> sources{{{64, 1, 2, 32}}};
  static constexpr std::array<consumer_desc, 2> consumers{{{0, consumer_kind::reindex, 0}, {0, consumer_kind::follower, 1}}};
};
using H = host_hierarchy<chat_layout, lru_hot_cache<64>>;
using M = residency_manager<H, adaptive_policy<>>;
constexpr std::size_t kRowBytes = 64, kLayers = 2;

/// The bytes the model produced for row `row` of layer `layer`, written by request `writer`.
std::byte content(std::uint64_t writer, std::size_t layer, std::int64_t row, std::size_t i) {
  return static_cast<std::byte>((writer * 131 + layer * 31 + static_cast<std::uint64_t>(row) * 7 + i) & 0xFF);
}
std::vector<std::byte> rows_of(std::uint64_t writer, std::int64_t first, std::size_t count) {
  std::vector<std::byte> v(kLayers * count * kRowBytes);
  for (std::size_t l = 0; l < kLayers; ++l)
    for (std::size_t r = 0; r < count; ++r)
      for (std::size_t i = 0; i < kRowBytes; ++i)
        v[(l * count + r) * kRowBytes + i] = content(writer, l, first + static_cast<std::int64_t>(r), i);
  return v;
}

int failures = 0;
std::map<request_id, std::vector<std::uint64_t>> writer_of;    // the writer of every row of each request
std::map<prefix_id, std::vector<std::uint64_t>> prefix_writers;  // the same for each retained prefix

/// Resolves every row of a request (a top_k slice at a time) and checks both layers.
void check_request(M& m, request_id id) {
  const auto& w = writer_of.at(id);
  for (std::size_t first = 0; first < w.size(); first += chat_layout::top_k) {
    std::vector<row_index> sel;
    for (std::size_t r = first; r < w.size() && sel.size() < chat_layout::top_k; ++r) sel.push_back(static_cast<row_index>(r));
    std::vector<location> loc(sel.size());
    m.step().resolve(id, 0, sel, loc);
    for (std::size_t i = 0; i < sel.size(); ++i)
      for (std::size_t l = 0; l < kLayers; ++l) {
        const auto bytes = m.hierarchy().payload(0, l, loc[i]);
        for (std::size_t b = 0; b < kRowBytes; ++b)
          if (bytes[b] != content(w[static_cast<std::size_t>(sel[i])], l, sel[i], b)) {
            std::printf("request %llu row %d layer %zu: wrong byte\n", static_cast<unsigned long long>(id), sel[i], l);
            ++failures;
            return;
          }
      }
  }
}

void admit_plain(M& m, request_id id, std::size_t rows) {
  const auto prompt = rows_of(id, 0, rows);
  if (!m.admit(id, {history_import{prompt, rows}})) ++failures;
  writer_of[id].assign(rows, id);
}
void admit_on(M& m, request_id id, prefix_id prefix, std::size_t own_rows) {
  const std::int64_t start = m.hierarchy().prefix_rows(prefix, 0);
  const auto suffix = rows_of(id, start, own_rows);
  // first_row: the suffix starts where the prefix ends (suffix_misaligned otherwise).
  if (!m.admit(id, prefix, {history_import{suffix, own_rows, start}})) ++failures;
  writer_of[id] = prefix_writers.at(prefix);
  writer_of[id].resize(static_cast<std::size_t>(start) + own_rows, id);
}
void retain(M& m, prefix_id prefix, request_id id, std::size_t rows) {
  const std::array<std::int64_t, 1> r{static_cast<std::int64_t>(rows)};
  if (!m.retain_prefix(prefix, id, r).empty()) ++failures;  // nothing is evicted within the budget here
  prefix_writers[prefix].assign(writer_of[id].begin(), writer_of[id].begin() + static_cast<std::ptrdiff_t>(rows));
}
void decode(M& m, request_id id, std::size_t steps) {
  for (std::size_t t = 0; t < steps; ++t) {
    const auto f = static_cast<std::int64_t>(writer_of[id].size());
    m.append(id, 0, rows_of(id, f, 1), 1);
    writer_of[id].push_back(id);
  }
}

}  // namespace

int main() {
  M m({.max_requests = 12, .max_rows = 1024, .optional_pages = 160, .prefix_pages = 64},
      {.required_pages = 2, .reserve_pages = 4});
  constexpr std::size_t system_rows = 100;  // 6 full pages and 4 rows of a seventh
  const prefix_id system_prompt = 0x5157;  // the engine's ids: hashes of the prefixes' tokens, say
  const prefix_id conversation = 0xC0417;

  // Turn 1 of chat 1: the whole prompt, a few decode steps, then keep what later requests share.
  admit_plain(m, 1, system_rows + 40);
  decode(m, 1, 20);
  retain(m, system_prompt, 1, system_rows);
  retain(m, conversation, 1, writer_of[1].size());  // every stored row: 160
  check_request(m, 1);
  m.complete(1);

  // Ten other chats start with the system prompt: they import only their question.
  const std::size_t free_before = m.hierarchy().free_host_pages(0);
  for (request_id id = 2; id <= 11; ++id) {
    admit_on(m, id, system_prompt, 30);
    decode(m, id, 5);
  }
  const std::size_t used = free_before - m.hierarchy().free_host_pages(0);
  // Each chat holds 135 rows = 9 pages; 6 of them are shared: 3 of its own (boundary copy included).
  const std::size_t unshared = 10 * 9;
  for (request_id id = 2; id <= 11; ++id) check_request(m, id);

  // Turn 2 of chat 1 (a new request on the retained conversation): only the new turn is imported.
  m.complete(11);
  admit_on(m, 12, conversation, 24);
  check_request(m, 12);

  std::size_t mapped_refs = 0;
  for (request_id id = 2; id <= 10; ++id) mapped_refs += m.optional_pages_of(id, 0);
  mapped_refs += m.optional_pages_of(12, 0);
  std::printf("host pages for 10 chats on the system prompt: %zu (%zu without sharing)\n", used, unshared);
  std::printf("optional GPU pages: %zu mapped by the requests, %zu in the pool (M_opt)\n", mapped_refs,
              m.ledger(0).optional);
  if (used != 10 * 3) ++failures;
  if (mapped_refs <= m.ledger(0).optional) ++failures;  // shared pages are counted once
  if (const std::string a = m.audit(); !a.empty()) {
    std::printf("audit: %s\n", a.c_str());
    ++failures;
  }
  std::printf("%s\n", failures == 0 ? "ok" : "FAILED");
  return failures == 0 ? 0 : 1;
}
