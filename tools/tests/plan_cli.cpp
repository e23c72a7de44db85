// dhisparse-plan's argument parser (tools/plan_cli.hpp) and layout-file reader (tools/layout_file.hpp).
#include "../../tests/support/catch.hpp"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <dhisparse/layouts/deepseek_v41_flash.hpp>
#include <dhisparse/layouts/glm53.hpp>
#include <dhisparse/planner.hpp>

#include "layout_file.hpp"
#include "plan_cli.hpp"

using namespace dhisparse;

namespace {
plan_tool::plan_cli_result parse(std::vector<std::string_view> args) { return plan_tool::parse_plan_cli(args); }
}  // namespace

TEST_CASE("dhisparse-plan arguments", "[planner][cli]") {
  SECTION("defaults: glm-5.3, 100000 tokens, B 4096, no drafter, 35 slots, 100 GiB") {
    const auto r = parse({});
    REQUIRE(r.ok());
    REQUIRE(r.options.layout == "glm-5.3");
    REQUIRE(r.options.model == shape_of<layouts::glm53>());
    REQUIRE(r.options.inputs.context_tokens == 100'000);
    REQUIRE(r.options.inputs.hot_rows == 4096);
    REQUIRE(r.options.inputs.drafter == drafters::none);
    REQUIRE(r.options.inputs.slots == 35);
    REQUIRE(r.options.inputs.pool_bytes == 100 * bytes_per_gib);
    REQUIRE_FALSE(r.options.inputs.staging_arenas.has_value());
    REQUIRE_FALSE(r.options.json);
    REQUIRE_FALSE(r.options.help);
  }
  SECTION("every option, separate and '=' values") {
    const auto r = parse({"--layout", "deepseek-v4.1-flash", "--context=500K", "--hot", "1024", "--tail", "32",
                          "--drafter=dspark", "--slots", "128", "--pool-gib", "90.5", "--arenas=2", "--json"});
    REQUIRE(r.ok());
    REQUIRE(r.options.layout == "deepseek-v4.1-flash");
    REQUIRE(r.options.model == shape_of<layouts::deepseek_v41_flash>());
    REQUIRE(r.options.inputs.context_tokens == 500'000);
    REQUIRE(r.options.inputs.hot_rows == 1024);
    REQUIRE(r.options.inputs.tail_rows == 32u);
    REQUIRE(r.options.inputs.drafter == drafters::dspark);
    REQUIRE(r.options.inputs.slots == 128);
    REQUIRE(r.options.inputs.pool_bytes == 90 * bytes_per_gib + bytes_per_gib / 2);
    REQUIRE(r.options.inputs.staging_arenas == 2u);
    REQUIRE(r.options.json);
  }
  SECTION("token counts") {
    REQUIRE(plan_tool::parse_token_count("100000") == 100'000u);
    REQUIRE(plan_tool::parse_token_count("100K") == 100'000u);
    REQUIRE(plan_tool::parse_token_count("100k") == 100'000u);
    REQUIRE(plan_tool::parse_token_count("1M") == 1'000'000u);
    REQUIRE(plan_tool::parse_token_count("1.5M") == 1'500'000u);
    REQUIRE(plan_tool::parse_token_count("32K") == 32'000u);
    REQUIRE(plan_tool::parse_token_count("2G") == 2'000'000'000u);
    REQUIRE(plan_tool::parse_token_count("0") == 0u);
    REQUIRE_FALSE(plan_tool::parse_token_count("").has_value());
    REQUIRE_FALSE(plan_tool::parse_token_count("K").has_value());
    REQUIRE_FALSE(plan_tool::parse_token_count("1.5").has_value());  // not a whole token count
    REQUIRE_FALSE(plan_tool::parse_token_count("-5").has_value());
    REQUIRE_FALSE(plan_tool::parse_token_count("12x").has_value());
    REQUIRE_FALSE(plan_tool::parse_token_count("1.2.3K").has_value());
    REQUIRE_FALSE(plan_tool::parse_token_count("99999999999999999999").has_value());
    REQUIRE_FALSE(plan_tool::parse_token_count("99999999999999G").has_value());
  }
  SECTION("GiB amounts") {
    REQUIRE(plan_tool::parse_gib_bytes("100") == 100 * bytes_per_gib);
    REQUIRE(plan_tool::parse_gib_bytes("0.25") == bytes_per_gib / 4);
    REQUIRE(plan_tool::parse_gib_bytes(".5") == bytes_per_gib / 2);
    REQUIRE_FALSE(plan_tool::parse_gib_bytes("-1").has_value());
    REQUIRE_FALSE(plan_tool::parse_gib_bytes("1e3").has_value());
    REQUIRE_FALSE(plan_tool::parse_gib_bytes(".").has_value());
  }
  SECTION("bad arguments give a message naming them") {
    const auto expect_error = [](std::vector<std::string_view> args, std::string_view fragment) {
      const auto r = parse(std::move(args));
      INFO("error: " << r.error);
      REQUIRE_FALSE(r.ok());
      REQUIRE(r.error.find(fragment) != std::string::npos);
    };
    expect_error({"--layout", "llama"}, "llama");
    expect_error({"--drafter", "eagle"}, "eagle");
    expect_error({"--context", "lots"}, "--context");
    expect_error({"--context"}, "needs a value");
    expect_error({"--hot", "4K"}, "--hot");
    expect_error({"--slots", "-3"}, "--slots");
    expect_error({"--pool-gib", "many"}, "--pool-gib");
    expect_error({"--frobnicate"}, "unknown option");
    expect_error({"extra"}, "unexpected argument");
    expect_error({"--json=yes"}, "--json");
    expect_error({"--hot", "1000"}, "top_k");                       // B < k = 2048
    expect_error({"--arenas", "79"}, "staging arenas");             // GLM-5.3 has 78 payload layers
    expect_error({"--slots", "0"}, "slots");
  }
  SECTION("--help") {
    const auto r = parse({"--help"});
    REQUIRE(r.ok());
    REQUIRE(r.options.help);
    REQUIRE(plan_tool::plan_cli_usage.find("--pool-gib") != std::string_view::npos);
  }
}

TEST_CASE("dhisparse-plan configuration options", "[planner][cli]") {
  SECTION("defaults: the session plan's numbers, the pool as GPU budget, adaptive, shared arenas") {
    const auto r = parse({});
    REQUIRE(r.ok());
    const config_inputs c = plan_tool::config_inputs_of(r.options);
    REQUIRE(c.slots == 35);
    REQUIRE(c.max_context_tokens == 100'000);
    REQUIRE_FALSE(c.live_context_tokens.has_value());
    REQUIRE(c.gpu_bytes == 100 * bytes_per_gib);
    REQUIRE_FALSE(c.host_bytes.has_value());
    REQUIRE(c.hot_rows == 4096);
    REQUIRE(c.max_block == 1);
    REQUIRE(c.staging_arenas == 4u);  // GLM-5.3: four payload layers live together
    REQUIRE(c.residency == residency_kind::adaptive);
    REQUIRE(c.required_pages == 0);
    REQUIRE(c.reserve_pages == 0);
  }
  SECTION("every configuration option") {
    const auto r = parse({"--context", "32K", "--max-context=64K", "--live-context", "1M", "--host-gib", "2.5",
                          "--residency", "resident", "--required-pages", "3", "--reserve-pages=7",
                          "--dedicated-staging", "--drafter", "dflash2", "--slots", "16", "--pool-gib", "40"});
    REQUIRE(r.ok());
    const config_inputs c = plan_tool::config_inputs_of(r.options);
    REQUIRE(c.slots == 16);
    REQUIRE(c.max_context_tokens == 64'000);
    REQUIRE(c.live_context_tokens == 1'000'000u);
    REQUIRE(c.host_bytes == 2 * bytes_per_gib + bytes_per_gib / 2);
    REQUIRE(c.gpu_bytes == 40 * bytes_per_gib);
    REQUIRE(c.residency == residency_kind::resident);
    REQUIRE(c.required_pages == 3);
    REQUIRE(c.reserve_pages == 7);
    REQUIRE(c.max_block == 8);  // DFlash2's K_max
    REQUIRE_FALSE(c.staging_arenas.has_value());
  }
  SECTION("a layout file") {
    const auto r = parse({"--layout-file", "model.json", "--hot", "16"});  // checked once the file is read
    REQUIRE(r.ok());
    REQUIRE(r.options.layout_file == "model.json");
  }
  SECTION("bad configuration arguments") {
    const auto expect_error = [](std::vector<std::string_view> args, std::string_view fragment) {
      const auto r = parse(std::move(args));
      INFO("error: " << r.error);
      REQUIRE_FALSE(r.ok());
      REQUIRE(r.error.find(fragment) != std::string::npos);
    };
    expect_error({"--residency", "lazy"}, "lazy");
    expect_error({"--live-context", "lots"}, "--live-context");
    expect_error({"--host-gib", "x"}, "--host-gib");
    expect_error({"--reserve-pages", "-1"}, "--reserve-pages");
    expect_error({"--dedicated-staging=1"}, "--dedicated-staging");
    expect_error({"--layout", "glm-5.3", "--layout-file", "a.json"}, "exclude each other");
    expect_error({"--layout-file", "a.json", "--layout", "glm-5.3"}, "exclude each other");
  }
  SECTION("the built-in layouts by name") {
    REQUIRE(plan_tool::layout_by_name("glm-5.3").has_value());
    REQUIRE(shape_of(*plan_tool::layout_by_name("glm-5.3")) == shape_of<layouts::glm53>());
    REQUIRE(shape_of(*plan_tool::layout_by_name("deepseek-v4.1-flash")) == shape_of<layouts::deepseek_v41_flash>());
    REQUIRE_FALSE(plan_tool::layout_by_name("llama").has_value());
  }
}

#if DHISPARSE_PLAN_HAVE_JSON
namespace {
std::string layout_error(std::string_view text) {
  const auto r = plan_tool::parse_layout_json(text, "m.json");
  return r.error;
}
bool has(const std::string& text, std::string_view part) { return text.find(part) != std::string::npos; }
}  // namespace

TEST_CASE("dhisparse-plan layout files", "[planner][cli][json]") {
  SECTION("fields, defaults and the run-time description") {
    const auto r = plan_tool::parse_layout_json(R"({"name": "two", "top_k": 16, "page_rows": 8,
      "sources": [{"row_bytes": 64, "payload_layers": 2, "index_key_bytes": 32}, {"row_bytes": 32, "positions_per_row": 1}],
      "consumers": [{"source": 0, "kind": "reindex"}, {"source": 0, "kind": "follower", "payload_layer": 1},
                    {"source": 1}, {"source": 1, "kind": "reuse"}]})",
                                                "m.json");
    INFO(r.error);
    REQUIRE(r.ok());
    const auto& l = r.layout;
    REQUIRE(l.name == "two");
    REQUIRE(l.top_k == 16);
    REQUIRE(l.page_rows == 8);
    REQUIRE(l.sources.size() == 2);
    REQUIRE(l.sources[0].payload_layers == 2);
    REQUIRE(l.sources[1].payload_layers == 1);     // default
    REQUIRE(l.sources[1].index_key_bytes == 0);    // default
    REQUIRE(l.consumers.size() == 4);
    REQUIRE(l.consumers[2].kind == consumer_kind::reindex);  // default
    REQUIRE(l.consumers[3].kind == consumer_kind::reuse);
    const model_shape s = shape_of(l.desc());
    REQUIRE(s.payload_bytes_per_row == 2 * 64 + 32);
    REQUIRE(s.index_key_bytes_per_row == 32);
    REQUIRE(s.sources == 2);
  }
  SECTION("errors name the field, source or consumer at fault") {
    CHECK(has(layout_error("{"), "not valid JSON"));
    CHECK(has(layout_error("[]"), "JSON object"));
    CHECK(has(layout_error(R"({"top_k": 16, "page_rows": 8, "sources": [], "consumers": [], "pages": 3})"),
              "unknown field 'pages'"));
    CHECK(has(layout_error(R"({"page_rows": 8, "sources": [], "consumers": []})"), "top_k: missing"));
    CHECK(has(layout_error(R"({"top_k": -1, "page_rows": 8, "sources": [], "consumers": []})"),
              "top_k: expected a non-negative integer"));
    CHECK(has(layout_error(R"({"top_k": 16, "page_rows": 8.5, "sources": [], "consumers": []})"), "page_rows"));
    CHECK(has(layout_error(R"({"top_k": 16, "page_rows": 8, "consumers": []})"), "sources: expected an array"));
    CHECK(has(layout_error(R"({"top_k": 16, "page_rows": 8, "sources": [{"row_bytes": 64}, {"row_byte": 64}],
                               "consumers": []})"),
              "sources[1]: unknown field 'row_byte'"));
    CHECK(has(layout_error(R"({"top_k": 16, "page_rows": 8, "sources": [{"row_bytes": 64}, {}], "consumers": []})"),
              "sources[1].row_bytes: missing"));
    CHECK(has(layout_error(R"({"top_k": 16, "page_rows": 8, "sources": [{"row_bytes": 64}],
                               "consumers": [{"source": 0}, {"source": 0, "kind": "copy"}]})"),
              "consumers[1].kind: expected"));
    CHECK(has(layout_error(R"({"top_k": 16, "page_rows": 8, "sources": [{"row_bytes": 64}],
                               "consumers": [{"source": "0"}]})"),
              "consumers[0].source: expected a non-negative integer"));
    // Well-formed JSON, broken layout: the layout rules, naming the source or consumer.
    CHECK(has(layout_error(R"({"top_k": 16, "page_rows": 8, "sources": [{"row_bytes": 64}, {"row_bytes": 40}],
                               "consumers": [{"source": 0}, {"source": 1}]})"),
              "m.json: layout: source 1: row_bytes"));
    CHECK(has(layout_error(R"({"top_k": 16, "page_rows": 8, "sources": [{"row_bytes": 64}],
                               "consumers": [{"source": 0}, {"source": 3}]})"),
              "layout: consumer 1: names a source outside the layout"));
  }
  SECTION("a missing file") {
    const auto r = plan_tool::read_layout_file("/nonexistent/layout.json");
    REQUIRE_FALSE(r.ok());
    REQUIRE(has(r.error, "cannot open"));
  }
}
#else
TEST_CASE("dhisparse-plan layout files without nlohmann_json", "[planner][cli][json]") {
  const auto r = plan_tool::read_layout_file("any.json");
  REQUIRE_FALSE(r.ok());
  REQUIRE(r.error.find("without nlohmann_json") != std::string::npos);
}
#endif
