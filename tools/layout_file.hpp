#pragma once
/// \file
/// Reads a KV layout described in a JSON file for `dhisparse-plan --layout-file` (schema in
/// docs/memory-planner.md, "Layout files"):
///
///   {"name": "...", "top_k": 2048, "page_rows": 64,
///    "sources":   [{"row_bytes": 656, "positions_per_row": 1, "payload_layers": 1, "index_key_bytes": 132}, ...],
///    "consumers": [{"source": 0, "kind": "reindex", "payload_layer": 0}, ...]}
///
/// Fields of a source or consumer left out take `source_desc` / `consumer_desc`'s defaults; unknown
/// fields are errors (a misspelt field would otherwise be silently defaulted). Messages name the
/// source or consumer at fault. Uses nlohmann_json when the build found it
/// (DHISPARSE_PLAN_HAVE_JSON); without it, reading a layout file fails with a message saying so.
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <initializer_list>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <dhisparse/layout.hpp>
#include <dhisparse/planner.hpp>

#ifndef DHISPARSE_PLAN_HAVE_JSON
#define DHISPARSE_PLAN_HAVE_JSON 0
#endif
#if DHISPARSE_PLAN_HAVE_JSON
#include <nlohmann/json.hpp>
#endif

namespace dhisparse::plan_tool {

/// A layout read from a file: owns the sources and consumers that `desc()` spans.
struct layout_file {
  std::string name;  ///< "name" of the file, or empty
  std::size_t top_k = 0;
  std::size_t page_rows = 0;
  std::vector<source_desc> sources;
  std::vector<consumer_desc> consumers;

  /// The run-time description (valid while this object lives and is not modified).
  [[nodiscard]] layout_desc desc() const { return {top_k, page_rows, sources, consumers}; }
};

/// A parsed layout, or an error message (non-empty) naming what is wrong.
struct layout_file_result {
  layout_file layout;
  std::string error;
  [[nodiscard]] bool ok() const { return error.empty(); }
};

/// True when this build reads layout files.
inline constexpr bool layout_files_supported = DHISPARSE_PLAN_HAVE_JSON != 0;

#if DHISPARSE_PLAN_HAVE_JSON

/// Parses layout JSON text; checks it is well formed and that the layout keeps the rules of
/// `find_layout_issue`. `origin` (a file name) prefixes messages.
inline layout_file_result parse_layout_json(std::string_view text, std::string_view origin) {
  using nlohmann::json;
  layout_file_result r;
  const std::string where(origin);
  const auto fail = [&](const std::string& what) {
    r.error = where + ": " + what;
    return r;
  };
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    return fail(std::string("not valid JSON: ") + e.what());
  }
  if (!j.is_object()) return fail("the layout must be a JSON object");

  // A non-negative integer field of `object`; `name` for messages ("sources[3].row_bytes").
  std::string bad;
  const auto count = [&](const json& object, const char* key, const std::string& name, bool required,
                         std::size_t fallback) -> std::size_t {
    const auto it = object.find(key);
    if (it == object.end()) {
      if (required && bad.empty()) bad = name + ": missing";
      return fallback;
    }
    if (!it->is_number_unsigned()) {
      if (bad.empty()) bad = name + ": expected a non-negative integer, got " + it->dump();
      return fallback;
    }
    return it->get<std::size_t>();
  };
  const auto unknown_key = [](const json& object, std::initializer_list<std::string_view> known) -> std::string {
    for (const auto& [key, value] : object.items()) {
      bool listed = false;
      for (const auto k : known) listed = listed || key == k;
      if (!listed) return key;
    }
    return {};
  };

  layout_file& l = r.layout;
  if (const auto k = unknown_key(j, {"name", "top_k", "page_rows", "sources", "consumers"}); !k.empty())
    return fail("unknown field '" + k + "' (fields: name, top_k, page_rows, sources, consumers)");
  if (const auto it = j.find("name"); it != j.end()) {
    if (!it->is_string()) return fail("name: expected a string");
    l.name = it->get<std::string>();
  }
  l.top_k = count(j, "top_k", "top_k", true, 0);
  if (!bad.empty()) return fail(bad);
  l.page_rows = count(j, "page_rows", "page_rows", true, 0);
  if (!bad.empty()) return fail(bad);

  const auto sources = j.find("sources");
  if (sources == j.end() || !sources->is_array()) return fail("sources: expected an array of sources");
  for (std::size_t i = 0; i < sources->size(); ++i) {
    const json& s = (*sources)[i];
    const std::string name = "sources[" + std::to_string(i) + "]";
    if (!s.is_object()) return fail(name + ": expected an object");
    if (const auto k = unknown_key(s, {"row_bytes", "positions_per_row", "payload_layers", "index_key_bytes"});
        !k.empty())
      return fail(name + ": unknown field '" + k +
                  "' (fields: row_bytes, positions_per_row, payload_layers, index_key_bytes)");
    const source_desc defaults{};
    source_desc d;
    d.row_bytes = count(s, "row_bytes", name + ".row_bytes", true, 0);
    d.positions_per_row = count(s, "positions_per_row", name + ".positions_per_row", false, defaults.positions_per_row);
    d.payload_layers = count(s, "payload_layers", name + ".payload_layers", false, defaults.payload_layers);
    d.index_key_bytes = count(s, "index_key_bytes", name + ".index_key_bytes", false, defaults.index_key_bytes);
    if (!bad.empty()) return fail(bad);
    l.sources.push_back(d);
  }

  const auto consumers = j.find("consumers");
  if (consumers == j.end() || !consumers->is_array()) return fail("consumers: expected an array of consumers");
  for (std::size_t i = 0; i < consumers->size(); ++i) {
    const json& c = (*consumers)[i];
    const std::string name = "consumers[" + std::to_string(i) + "]";
    if (!c.is_object()) return fail(name + ": expected an object");
    if (const auto k = unknown_key(c, {"source", "kind", "payload_layer"}); !k.empty())
      return fail(name + ": unknown field '" + k + "' (fields: source, kind, payload_layer)");
    consumer_desc d;
    d.source = count(c, "source", name + ".source", true, 0);
    d.payload_layer = count(c, "payload_layer", name + ".payload_layer", false, 0);
    if (!bad.empty()) return fail(bad);
    if (const auto kind = c.find("kind"); kind != c.end()) {
      const std::string k = kind->is_string() ? kind->get<std::string>() : std::string();
      if (k == "reindex") d.kind = consumer_kind::reindex;
      else if (k == "reuse") d.kind = consumer_kind::reuse;
      else if (k == "follower") d.kind = consumer_kind::follower;
      else return fail(name + ".kind: expected \"reindex\", \"reuse\" or \"follower\", got " + kind->dump());
    }
    l.consumers.push_back(d);
  }

  if (const layout_issue issue = find_layout_issue(l.desc())) return fail(describe(issue));
  return r;
}

#else

/// Without nlohmann_json: every layout fails with a message saying how to get file support.
inline layout_file_result parse_layout_json(std::string_view, std::string_view origin) {
  return {{}, std::string(origin) + ": this dhisparse-plan was built without nlohmann_json, so it cannot read "
                                    "layout files (install nlohmann-json3-dev, or another nlohmann_json CMake "
                                    "package, and rebuild); use --layout NAME"};
}

#endif

/// Reads and parses the layout file at `path`.
inline layout_file_result read_layout_file(const std::string& path) {
  if (!layout_files_supported) return parse_layout_json({}, path);
  std::ifstream in(path, std::ios::binary);
  if (!in) return {{}, path + ": cannot open the layout file"};
  std::ostringstream text;
  text << in.rdbuf();
  return parse_layout_json(text.str(), path);
}

}  // namespace dhisparse::plan_tool
