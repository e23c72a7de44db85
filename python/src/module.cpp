// The `dhisparse._core` extension: typed errors, shared value types, and one binder per layout
// and backend (host always; CUDA when the package was built with it).
#include <array>
#include <cctype>
#include <exception>

#include <dhisparse/host/residency_manager.hpp>
#include <dhisparse/planner.hpp>

#include "array_import.hpp"
#include "common.hpp"

namespace dhisparse::python {

namespace {

/// Python exception class of each errc value, indexed by the value; [0] of `base` is DhisparseError.
std::vector<PyObject*> error_classes;
PyObject* base_error = nullptr;
nb::object stream_provider;

std::string camel_case(const char* snake) {
  std::string out;
  bool up = true;
  for (const char* c = snake; *c; ++c) {
    if (*c == '_') { up = true; continue; }
    out += up ? static_cast<char>(std::toupper(static_cast<unsigned char>(*c))) : *c;
    up = false;
  }
  return out;
}

/// errc values are contiguous from 0; to_string answers "unknown" past the last one, so codes
/// appended to errors.hpp get their class without an edit here.
std::size_t errc_count() {
  std::size_t n = 0;
  while (std::string(to_string(static_cast<errc>(n))) != "unknown") ++n;
  return n;
}

}  // namespace

void bind_errors(nb::module_& m) {
  base_error = PyErr_NewExceptionWithDoc("dhisparse.DhisparseError",
                                         "Base of every dhisparse error; `code` names the rule broken.",
                                         PyExc_RuntimeError, nullptr);
  m.attr("DhisparseError") = nb::handle(base_error);
  nb::list names;
  for (std::size_t i = 0, n = errc_count(); i < n; ++i) {
    const char* code = to_string(static_cast<errc>(i));
    const std::string cls = camel_case(code);
    PyObject* type = PyErr_NewException(("dhisparse." + cls).c_str(), base_error, nullptr);
    nb::handle(type).attr("code") = code;
    m.attr(cls.c_str()) = nb::handle(type);
    error_classes.push_back(type);
    names.append(cls);
  }
  m.attr("_error_classes") = names;
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const dhisparse::error& e) {
      const auto i = static_cast<std::size_t>(e.code());
      PyErr_SetString(i < error_classes.size() ? error_classes[i] : base_error, e.what());
    }
  });
}

std::uintptr_t default_stream(std::optional<std::uintptr_t> given, int device) {
  if (given) return *given;
  if (std::uintptr_t s = 0; framework_current_stream(device, s)) return s;  // no Python call
  if (!stream_provider.is_valid() || stream_provider.is_none()) return 0;
  return nb::cast<std::uintptr_t>(stream_provider(device));
}

void bind_types(nb::module_& m) {
  m.def("_set_stream_provider",
        [](nb::object f) {
          stream_provider = std::move(f);
          clear_framework_stream_api();  // the provider set last is the one asked
        },
        "Callable taking a CUDA device ordinal and returning the stream handle that a call on an object "
        "of that device uses when it is given none; forgets a framework registered with _set_stream_api.");
  // Drop the provider before the interpreter tears the module down.
  nb::module_::import_("atexit").attr("register")(nb::cpp_function([] { stream_provider = nb::object(); }));

  nb::enum_<copy_layers>(m, "CopyLayers", "Which payload layers a resolver call materialises.")
      .value("all", copy_layers::all)
      .value("producer_only", copy_layers::producer_only);

  nb::enum_<admit_status>(m, "AdmitStatus", "Outcome of a residency admission (every value but admitted is a wait).")
      .value("admitted", admit_status::admitted)
      .value("wait_for_slot", admit_status::wait_for_slot)
      .value("wait_for_memory", admit_status::wait_for_memory)
      .value("wait_for_host_pages", admit_status::wait_for_host_pages)
      .value("wait_for_reclaim", admit_status::wait_for_reclaim);

  nb::class_<hierarchy_config>(m, "HierarchyConfig", "Sizes of a hierarchy (C++ dhisparse::hierarchy_config).")
      .def(
          "__init__",
          [](hierarchy_config* c, std::size_t max_requests, std::size_t max_rows, std::size_t host_pages,
             std::size_t tail_rows, std::size_t optional_pages, std::size_t max_block, std::size_t prefix_pages) {
            new (c) hierarchy_config{.max_requests = max_requests,
                                     .max_rows = max_rows,
                                     .host_pages = host_pages,
                                     .tail_rows = tail_rows,
                                     .optional_pages = optional_pages,
                                     .max_block = max_block,
                                     .prefix_pages = prefix_pages};
          },
          nb::kw_only(), nb::arg("max_requests") = 8, nb::arg("max_rows") = 0, nb::arg("host_pages") = 0,
          nb::arg("tail_rows") = 0, nb::arg("optional_pages") = 0, nb::arg("max_block") = 1,
          nb::arg("prefix_pages") = 0)
      .def_rw("max_requests", &hierarchy_config::max_requests)
      .def_rw("max_rows", &hierarchy_config::max_rows)
      .def_rw("host_pages", &hierarchy_config::host_pages)
      .def_rw("tail_rows", &hierarchy_config::tail_rows)
      .def_rw("optional_pages", &hierarchy_config::optional_pages)
      .def_rw("max_block", &hierarchy_config::max_block)
      .def_rw("prefix_pages", &hierarchy_config::prefix_pages)
      .def("__repr__", [](const hierarchy_config& c) {
        return "HierarchyConfig(max_requests=" + std::to_string(c.max_requests) +
               ", max_rows=" + std::to_string(c.max_rows) + ", host_pages=" + std::to_string(c.host_pages) +
               ", tail_rows=" + std::to_string(c.tail_rows) + ", optional_pages=" + std::to_string(c.optional_pages) +
               ", max_block=" + std::to_string(c.max_block) + ", prefix_pages=" + std::to_string(c.prefix_pages) + ")";
      });

  // The planner (C++ plan_hierarchy): inputs in, a configuration and its bytes out.
  nb::class_<config_inputs>(m, "_ConfigInputs")
      .def(
          "__init__",
          [](config_inputs* c, std::uint64_t slots, std::uint64_t max_context_tokens, std::uint64_t gpu_bytes,
             std::optional<std::uint64_t> live_context_tokens, std::optional<std::uint64_t> host_bytes,
             std::optional<std::uint64_t> tail_rows, std::uint64_t max_block, const std::string& residency,
             std::uint64_t required_pages, std::uint64_t reserve_pages) {
            const auto kind = residency_by_name(residency);
            if (!kind)
              throw planner_input_error("residency", "'" + residency + "' is not one of adaptive, resident, fixed-budget");
            new (c) config_inputs{};
            c->slots = slots;
            c->max_context_tokens = max_context_tokens;
            c->live_context_tokens = live_context_tokens;
            c->gpu_bytes = gpu_bytes;
            c->host_bytes = host_bytes;
            c->tail_rows = tail_rows;
            c->max_block = max_block;
            c->residency = *kind;
            c->required_pages = required_pages;
            c->reserve_pages = reserve_pages;
          },
          nb::kw_only(), nb::arg("slots"), nb::arg("max_context_tokens"), nb::arg("gpu_bytes"),
          nb::arg("live_context_tokens") = nb::none(), nb::arg("host_bytes") = nb::none(),
          nb::arg("tail_rows") = nb::none(), nb::arg("max_block") = 1, nb::arg("residency") = "adaptive",
          nb::arg("required_pages") = 0, nb::arg("reserve_pages") = 0);

  nb::class_<backend_bytes>(m, "PlanBytes", "Bytes each backend allocates for a plan (C++ dhisparse::backend_bytes).")
      .def_ro("host_pool_bytes", &backend_bytes::host_pool_bytes)
      .def_ro("host_staging_arena_bytes", &backend_bytes::host_staging_arena_bytes)
      .def_ro("host_store_bytes", &backend_bytes::host_store_bytes)
      .def_ro("cuda_pool_bytes", &backend_bytes::cuda_pool_bytes)
      .def_ro("cuda_staging_arena_bytes", &backend_bytes::cuda_staging_arena_bytes)
      .def_ro("cuda_metadata_bytes", &backend_bytes::cuda_metadata_bytes)
      .def_ro("cuda_workspace_bytes", &backend_bytes::cuda_workspace_bytes)
      .def_ro("cuda_device_allowance", &backend_bytes::cuda_device_allowance)
      .def_ro("cuda_device_bytes", &backend_bytes::cuda_device_bytes)
      .def_ro("cuda_pinned_bytes", &backend_bytes::cuda_pinned_bytes)
      .def_ro("cuda_pinned_allowance", &backend_bytes::cuda_pinned_allowance);

  nb::class_<hierarchy_plan>(m, "HierarchyPlan",
                             "A planned configuration (C++ dhisparse::hierarchy_plan): `config` for Hierarchy, "
                             "`residency` for ResidencyManager, `bytes` what each backend allocates.")
      .def_ro("config", &hierarchy_plan::config)
      .def_ro("residency", &hierarchy_plan::residency)
      .def_ro("bytes", &hierarchy_plan::bytes)
      .def_ro("hot_rows", &hierarchy_plan::hot_rows)
      .def_prop_ro("residency_mode", [](const hierarchy_plan& p) { return std::string(to_string(p.residency_mode)); })
      .def_ro("pages_per_request", &hierarchy_plan::pages_per_request)
      .def_ro("live_context_tokens", &hierarchy_plan::live_context_tokens)
      .def_ro("default_host_pages", &hierarchy_plan::default_host_pages)
      .def_ro("optional_pages_needed", &hierarchy_plan::optional_pages_needed)
      .def_ro("optional_pages_budget", &hierarchy_plan::optional_pages_budget)
      .def_ro("optional_page_bytes", &hierarchy_plan::optional_page_bytes)
      .def_ro("host_page_bytes", &hierarchy_plan::host_page_bytes)
      .def_ro("index_key_bytes", &hierarchy_plan::index_key_bytes)
      .def_ro("gpu_bytes_left", &hierarchy_plan::gpu_bytes_left);

  nb::class_<residency_config>(m, "ResidencyConfig", "Residency ledger sizes (C++ dhisparse::residency_config).")
      .def(
          "__init__",
          [](residency_config* c, std::size_t required_pages, std::size_t reserve_pages) {
            new (c) residency_config{required_pages, reserve_pages};
          },
          nb::kw_only(), nb::arg("required_pages") = 0, nb::arg("reserve_pages") = 0)
      .def_rw("required_pages", &residency_config::required_pages)
      .def_rw("reserve_pages", &residency_config::reserve_pages);

  nb::class_<resolve_stats>(m, "ResolveStats", "Where a resolve's entries were found.")
      .def_ro("selected", &resolve_stats::selected)
      .def_ro("direct", &resolve_stats::direct)
      .def_ro("hot", &resolve_stats::hot)
      .def_ro("host", &resolve_stats::host)
      .def_ro("rows_copied", &resolve_stats::rows_copied)
      .def_ro("bytes_copied", &resolve_stats::bytes_copied)
      .def("__eq__", [](const resolve_stats& a, const resolve_stats& b) { return a == b; })
      .def("__repr__", [](const resolve_stats& s) {
        return "ResolveStats(selected=" + std::to_string(s.selected) + ", direct=" + std::to_string(s.direct) +
               ", hot=" + std::to_string(s.hot) + ", host=" + std::to_string(s.host) +
               ", rows_copied=" + std::to_string(s.rows_copied) + ", bytes_copied=" + std::to_string(s.bytes_copied) + ")";
      });

  nb::class_<verify_stats>(m, "VerifyStats", "Where a verify round's entries were found.")
      .def_ro("selected", &verify_stats::selected)
      .def_ro("direct", &verify_stats::direct)
      .def_ro("block", &verify_stats::block)
      .def_ro("hot", &verify_stats::hot)
      .def_ro("host", &verify_stats::host)
      .def_ro("staged", &verify_stats::staged)
      .def_ro("rows_copied", &verify_stats::rows_copied)
      .def_ro("bytes_copied", &verify_stats::bytes_copied)
      .def_ro("staging_rows", &verify_stats::staging_rows)
      .def("__eq__", [](const verify_stats& a, const verify_stats& b) { return a == b; });

  nb::class_<admission>(m, "Admission", "Result of Hierarchy.admit: admitted with a slot, or a wait.")
      .def_ro("admitted", &admission::admitted)
      .def_ro("slot", &admission::slot)
      .def("__bool__", [](const admission& a) { return a.admitted; })
      .def("__repr__", [](const admission& a) {
        return a.admitted ? "Admission(admitted=True, slot=" + std::to_string(a.slot) + ")"
                          : std::string("Admission(admitted=False)");
      });

  nb::class_<residency_admission>(m, "ResidencyAdmission", "Result of ResidencyManager.admit.")
      .def_ro("status", &residency_admission::status)
      .def_ro("slot", &residency_admission::slot)
      .def_ro("reclaimed_requests", &residency_admission::reclaimed_requests)
      .def_ro("reclaimed_pages", &residency_admission::reclaimed_pages)
      .def_ro("mapped_pages", &residency_admission::mapped_pages)
      .def("__bool__", [](const residency_admission& a) { return a.status == admit_status::admitted; })
      .def("__repr__", [](const residency_admission& a) {
        return "ResidencyAdmission(status=" + std::string(nb::str(nb::cast(a.status)).c_str()) +
               (a.status == admit_status::admitted ? ", slot=" + std::to_string(a.slot) : std::string()) +
               ", reclaimed_requests=" + std::to_string(a.reclaimed_requests) +
               ", reclaimed_pages=" + std::to_string(a.reclaimed_pages) +
               ", mapped_pages=" + std::to_string(a.mapped_pages) + ")";
      });

  nb::class_<residency_ledger>(m, "ResidencyLedger", "One source's ledger in pages: M, M_req, M_opt, M_res.")
      .def_ro("capacity", &residency_ledger::capacity)
      .def_ro("required", &residency_ledger::required)
      .def_ro("optional", &residency_ledger::optional)
      .def_ro("reserve", &residency_ledger::reserve)
      .def("holds", &residency_ledger::holds)
      .def("spare", &residency_ledger::spare);

  nb::class_<residency_counters>(m, "ResidencyCounters", "Running totals of a residency manager.")
      .def_ro("admissions", &residency_counters::admissions)
      .def_ro("admissions_waited", &residency_counters::admissions_waited)
      .def_ro("waits_for_slot", &residency_counters::waits_for_slot)
      .def_ro("waits_for_memory", &residency_counters::waits_for_memory)
      .def_ro("waits_for_host_pages", &residency_counters::waits_for_host_pages)
      .def_ro("waits_for_reclaim", &residency_counters::waits_for_reclaim)
      .def_ro("completions", &residency_counters::completions)
      .def_ro("pages_mapped", &residency_counters::pages_mapped)
      .def_ro("pages_repopulated", &residency_counters::pages_repopulated)
      .def_ro("pages_reclaimed", &residency_counters::pages_reclaimed)
      .def_ro("requests_reclaimed", &residency_counters::requests_reclaimed)
      .def_ro("repopulate_calls", &residency_counters::repopulate_calls);

  nb::class_<planned_copy>(m, "PlannedCopy", "A host row the last resolve copied into a location.")
      .def_ro("slot", &planned_copy::slot)
      .def_ro("row", &planned_copy::row)
      .def_ro("dst", &planned_copy::dst);
}

}  // namespace dhisparse::python

NB_MODULE(_core, m) {
  using namespace dhisparse::python;
  m.doc() = "dhisparse C++ bindings (use the `dhisparse` package, not this module)";
#ifdef DHISPARSE_PY_CUDA
  m.attr("cuda_built") = true;
#else
  m.attr("cuda_built") = false;
#endif
  bind_errors(m);
  bind_types(m);
  bind_array_import(m);
  m.def("_default_stream", [](int device) { return default_stream(std::nullopt, device); }, nb::arg("device"),
        "Test hook: the stream a call on an object of `device` uses when given none.");
  m.def("_stream_handle", [](stream_arg s) { return s.handle; }, nb::arg("stream").none(),
        "The int handle a `stream=` argument names (an int, torch.cuda.Stream, a CuPy stream), or None.");
  bind_host_tiny(m);
  bind_host_glm53(m);
  bind_host_deepseek_v41_flash(m);
#ifdef DHISPARSE_PY_CUDA
  bind_cuda_tiny(m);
  bind_cuda_glm53(m);
  bind_cuda_deepseek_v41_flash(m);
#endif
}
