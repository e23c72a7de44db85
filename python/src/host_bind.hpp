#pragma once
// Binders of the host backend: host_hierarchy and residency_manager of one layout. Every per-step
// call takes arrays without copying them (check_array refuses what would need a copy).
#include <nanobind/stl/pair.h>

#include <dhisparse/host/hierarchy.hpp>
#include <dhisparse/host/residency_manager.hpp>
#include <dhisparse/planner.hpp>

#include "common.hpp"
#include "store_bind.hpp"

namespace dhisparse::python {

/// A read-only or writable 2-D uint8 view [rows, row_bytes] of `base`, kept alive by `owner`,
/// as a numpy array, a torch tensor, or (`like` empty) a DLPack-capable nanobind array.
inline nb::object pool_view(void* base, std::size_t rows, std::size_t row_bytes, nb::handle owner, int device_type,
                            int device_id, const std::string& like, bool read_only) {
  const std::size_t shape[2] = {rows, row_bytes};
  auto* p = static_cast<std::uint8_t*>(base);
  if (like == "torch")  // torch has no read-only tensors
    return nb::cast(nb::ndarray<nb::pytorch, std::uint8_t, nb::ndim<2>>(p, 2, shape, owner, nullptr,
                                                                       nb::dtype<std::uint8_t>(), device_type, device_id));
  if (like == "numpy") {
    if (device_type != nb::device::cpu::value) throw nb::type_error("numpy views exist for CPU pools only");
    return nb::cast(nb::ndarray<nb::numpy, const std::uint8_t, nb::ndim<2>>(p, 2, shape, owner));
  }
  if (like == "cupy")
    return nb::cast(nb::ndarray<nb::cupy, std::uint8_t, nb::ndim<2>>(p, 2, shape, owner, nullptr,
                                                                    nb::dtype<std::uint8_t>(), device_type, device_id));
  if (like == "jax")
    return nb::cast(nb::ndarray<nb::jax, std::uint8_t, nb::ndim<2>>(p, 2, shape, owner, nullptr,
                                                                   nb::dtype<std::uint8_t>(), device_type, device_id));
  if (!like.empty()) throw nb::value_error("like must be 'numpy', 'torch', 'cupy', 'jax' or None");
#if NB_VERSION_MAJOR > 2 || (NB_VERSION_MAJOR == 2 && NB_VERSION_MINOR >= 2)
  // An object with __dlpack__ / __dlpack_device__ (and the buffer protocol on the CPU): any
  // framework's from_dlpack takes it.
  using neutral = nb::array_api;
#else
  using neutral = nb::no_framework;  // a DLPack capsule
#endif
  if (read_only)
    return nb::cast(nb::ndarray<neutral, const std::uint8_t, nb::ndim<2>>(p, 2, shape, owner, nullptr,
                                                                         nb::dtype<std::uint8_t>(), device_type,
                                                                         device_id));
  return nb::cast(nb::ndarray<neutral, std::uint8_t, nb::ndim<2>>(p, 2, shape, owner, nullptr,
                                                                 nb::dtype<std::uint8_t>(), device_type, device_id));
}

/// Checks selections/locations of a batched call: same shape, [C, k'] with C = requests (or [k']
/// for a single request), int32, C-contiguous, on `w`. Returns (C, k').
template <class Sel, class Loc>
std::pair<std::size_t, std::size_t> batch_shape(const Sel& sel, const Loc& loc, std::size_t requests, where w) {
  check_array<std::int32_t>(sel, "selections", w);
  check_array<std::int32_t>(loc, "locations", w);
  bool same = sel.ndim() == loc.ndim();
  for (std::size_t d = 0; same && d < sel.ndim(); ++d) same = sel.shape(d) == loc.shape(d);
  if (!same) throw size_mismatch("selections " + shape_of(sel) + " and locations " + shape_of(loc) + " differ in shape");
  if (sel.ndim() == 1) {
    if (requests != 1) throw size_mismatch("a 1-D selection needs exactly one request");
    return {1, sel.shape(0)};
  }
  if (sel.ndim() != 2 || sel.shape(0) != requests)
    throw size_mismatch("selections " + shape_of(sel) + " must be [C, k] with C = " + std::to_string(requests) +
                        " requests");
  return {requests, sel.shape(1)};
}

/// Checks verify queries/locations: [C, K, k'] (or [K, k'] for one request). Returns (C, K, k').
template <class Sel, class Loc>
std::array<std::size_t, 3> verify_shape(const Sel& q, const Loc& loc, std::size_t requests, where w) {
  check_array<std::int32_t>(q, "queries", w);
  check_array<std::int32_t>(loc, "locations", w);
  bool same = q.ndim() == loc.ndim();
  for (std::size_t d = 0; same && d < q.ndim(); ++d) same = q.shape(d) == loc.shape(d);
  if (!same) throw size_mismatch("queries " + shape_of(q) + " and locations " + shape_of(loc) + " differ in shape");
  if (q.ndim() == 2) {
    if (requests != 1) throw size_mismatch("2-D queries [K, k] need exactly one request");
    return {1, q.shape(0), q.shape(1)};
  }
  if (q.ndim() != 3 || q.shape(0) != requests)
    throw size_mismatch("queries " + shape_of(q) + " must be [C, K, k] with C = " + std::to_string(requests) +
                        " requests");
  return {requests, q.shape(1), q.shape(2)};
}

/// K_r of each request: `query_counts` (each <= K) or K for all.
inline std::vector<std::size_t> round_widths(const std::optional<std::vector<std::size_t>>& counts, std::size_t c,
                                             std::size_t k) {
  if (!counts) return std::vector<std::size_t>(c, k);
  if (counts->size() != c)
    throw size_mismatch("query_counts has " + std::to_string(counts->size()) + " entries for " + std::to_string(c) +
                        " requests");
  for (std::size_t v : *counts)
    if (v > k) throw size_mismatch("query_counts entry " + std::to_string(v) + " exceeds the queries' K = " + std::to_string(k));
  return *counts;
}

/// Requests given as one int or a sequence.
inline request_list as_requests(nb::handle h) {
  if (PyLong_Check(h.ptr())) return {nb::cast<request_id>(h)};
  return nb::cast<request_list>(h);
}

inline nb::dict space_dict(const location_space& s) {
  nb::dict d;
  d["slots"] = s.slots;
  d["hot_rows"] = s.hot_rows;
  d["tail_rows"] = s.tail_rows;
  d["optional_pages"] = s.optional_pages;
  d["page_rows"] = s.page_rows;
  d["staging_rows"] = s.staging_rows;
  d["staging_begin"] = s.staging_begin();
  d["rows"] = s.rows();
  return d;
}

inline nb::bytes to_bytes(std::span<const std::byte> s) { return nb::bytes(reinterpret_cast<const char*>(s.data()), s.size()); }

/// Binds host_hierarchy `H` as `name`.
/// Calls `f(request, rows, n)` for each request of a `[requests][payload layers][n][row_bytes]`
/// uint8 array of source `source` (one request's rows are contiguous: n rows of every layer).
template <KvLayout L, class F>
void for_each_request_rows(const char* call, std::size_t source, const request_list& ids, const in_array& rows, F&& f) {
  check_array<std::uint8_t>(rows, "rows", where::cpu);
  if (rows.ndim() != 4 || rows.shape(0) != ids.size())
    throw size_mismatch(std::string(call) + ": rows must be [requests=" + std::to_string(ids.size()) +
                        "][payload layers][rows][row_bytes], got " + shape_of(rows));
  if (source < std::size(L::sources) &&
      (rows.shape(1) != L::sources[source].payload_layers || rows.shape(3) != L::sources[source].row_bytes))
    throw size_mismatch(std::string(call) + ": rows of source " + std::to_string(source) + " must be [requests][" +
                        std::to_string(L::sources[source].payload_layers) + "][rows][" +
                        std::to_string(L::sources[source].row_bytes) + "], got " + shape_of(rows));
  const std::size_t per = ids.empty() ? 0 : elements(rows) / ids.size();
  const auto* base = static_cast<const std::byte*>(rows.data());
  for (std::size_t i = 0; i < ids.size(); ++i) f(ids[i], std::span<const std::byte>(base + i * per, per), rows.shape(2));
}

/// The (request, source) items of a step-wide write: `rows[s]` as for_each_request_rows, or None.
template <KvLayout L>
std::vector<step_write_item> step_items(const request_list& ids, const std::vector<std::optional<in_array>>& rows,
                                        const char* call = "append_step") {
  if (rows.size() != std::size(L::sources))
    throw size_mismatch(std::string(call) + ": rows must hold one array (or None) per source (" +
                        std::to_string(std::size(L::sources)) + "), got " + std::to_string(rows.size()));
  std::vector<step_write_item> items;
  for (std::size_t s = 0; s < rows.size(); ++s)
    if (rows[s])
      for_each_request_rows<L>(call, s, ids, *rows[s], [&](request_id id, auto bytes, std::size_t n) {
        items.push_back({id, s, bytes, n});
      });
  return items;
}

/// Accepted counts (int32, one per request) as sizes; a negative count is acceptance_beyond_block.
inline std::vector<std::size_t> accepted_counts(const char* call, const request_list& ids, const in_array& accepted) {
  check_array<std::int32_t>(accepted, "accepted", where::cpu);
  if (elements(accepted) != ids.size())
    throw size_mismatch(std::string(call) + ": accepted must hold one count per request (" +
                        std::to_string(ids.size()) + "), got " + shape_of(accepted));
  const auto* a = static_cast<const std::int32_t*>(accepted.data());
  std::vector<std::size_t> out(ids.size());
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (a[i] < 0)
      throw acceptance_beyond_block(std::string(call) + ": request " + std::to_string(ids[i]) + " accepted " +
                                    std::to_string(a[i]) + " proposals");
    out[i] = static_cast<std::size_t>(a[i]);
  }
  return out;
}

template <class H>
void bind_host_hierarchy(nb::module_& m, const char* name, const char* layout_name) {
  using L = typename H::layout;
  auto rows_span = [](const in_array& rows) {
    check_array<std::uint8_t>(rows, "rows", where::cpu);
    return std::span<const std::byte>(static_cast<const std::byte*>(rows.data()), elements(rows));
  };
  nb::class_<H>(m, name, nb::is_weak_referenceable())
      .def(nb::init<const hierarchy_config&>(), nb::arg("config"))
      // Rank `rank` of the hierarchies sharing a store (docs/multi-gpu.md); keeps the store alive.
      .def(nb::init<const hierarchy_config&, shared_host_store<L>&, std::size_t>(), nb::arg("config"),
           nb::arg("store"), nb::arg("rank"), nb::keep_alive<1, 3>())
      .def(nb::init<const hierarchy_config&, interprocess_host_store<L>&, std::size_t>(), nb::arg("config"),
           nb::arg("store"), nb::arg("rank"), nb::keep_alive<1, 3>())
      .def_prop_ro("shares_host_store", &H::shares_host_store)
      .def_prop_ro("rank", &H::rank, "Its rank on a shared host store (0 when it owns its stores).")
      .def_prop_ro("host_store_bytes", [](const H& h) { return h.host_store_bytes(); },
                   "Bytes of its own host stores (0 on a shared store).")
      .def_prop_ro("host_bytes_in_use", &H::host_bytes_in_use,
                   "Bytes of host pages allocated now (on a shared store: every rank's, one copy).")
      .def_prop_ro_static("layout", [layout_name](nb::handle) { return layout_info<L>(layout_name); })
      .def_prop_ro_static("hot_rows", [](nb::handle) { return H::hot_rows; })
      .def_prop_ro_static("top_k", [](nb::handle) { return H::top_k; })
      .def_prop_ro_static("backend", [](nb::handle) { return "host"; })
      .def_static("requirements", [](const hierarchy_config& c) {
        const auto r = H::requirements(c);
        nb::dict d;
        d["pool_bytes"] = r.pool_bytes;
        d["staging_arena_bytes"] = r.staging_arena_bytes;
        d["host_store_bytes"] = r.host_store_bytes;
        return d;
      })
      .def_prop_ro("config", &H::config)
      .def_prop_ro("space", [](const H& h) { return space_dict(h.space()); })
      .def("contains", &H::contains)
      .def("slot_of", &H::slot_of)
      .def_prop_ro("admitted_count", &H::admitted_count)
      .def(
          "admit",
          [](H& h, request_id id, std::optional<prefix_id> prefix) { return prefix ? h.admit(id, *prefix) : h.admit(id); },
          nb::arg("request"), nb::arg("prefix") = nb::none(),
          "Admits a request with an empty history, or on retained prefix `prefix` (sharing its pages; "
          "docs/prefixes.md).")
      .def(
          "retain_prefix",
          [](H& h, prefix_id prefix, request_id id, std::optional<std::vector<std::int64_t>> rows) {
            return rows ? h.retain_prefix(prefix, id, std::span<const std::int64_t>(*rows)) : h.retain_prefix(prefix, id);
          },
          nb::arg("prefix"), nb::arg("request"), nb::arg("rows") = nb::none(),
          "Retains the first rows[s] rows of a request's history on each source (default: all of it) as "
          "prefix `prefix`; returns the prefixes evicted to stay within prefix_pages.")
      .def("release_prefix", &H::release_prefix, nb::arg("prefix"))
      .def("contains_prefix", &H::contains_prefix, nb::arg("prefix"))
      .def("prefix_rows", &H::prefix_rows, nb::arg("prefix"), nb::arg("source"))
      .def("retained_prefixes", &H::retained_prefixes, "Retained prefixes, least recently used first.")
      .def("prefix_pages_held", &H::prefix_pages_held, nb::arg("source"))
      .def("complete", &H::complete, nb::arg("request"))
      .def("frontier", &H::frontier, nb::arg("request"), nb::arg("source"))
      .def("positions", &H::positions, nb::arg("request"), nb::arg("source"))
      .def(
          "append",
          [rows_span](H& h, request_id id, std::size_t source, const in_array& rows, std::optional<std::size_t> count) {
            const auto bytes = rows_span(rows);
            if (source >= H::sources) return h.append(id, source, bytes, 0);  // invalid_source from the library
            h.append(id, source, bytes, rows_count(bytes.size(), count, L::sources[source]));
          },
          nb::arg("request"), nb::arg("source"), nb::arg("rows"), nb::arg("count") = nb::none(),
          "Appends one request's rows to one source: `rows` uint8 [payload layers, count, row_bytes] "
          "(count from the size when None). Eager: takes the host pages it needs. "
          "A step's writes for a batch: append_step (within reserve_ahead's pages).")
      .def("reserve_rows", &H::reserve_rows, nb::arg("request"), nb::arg("source"), nb::arg("rows_ahead"))
      .def("reserve_ahead", &H::reserve_ahead, nb::arg("rows_ahead"))
      .def("reserved_rows", &H::reserved_rows, nb::arg("request"), nb::arg("source"))
      .def(
          "append_batch",
          [](H& h, std::size_t source, nb::handle requests, const in_array& rows) {
            const request_list ids = as_requests(requests);
            std::vector<write_item> items;
            for_each_request_rows<L>("append_batch", source, ids, rows, [&](request_id id, auto bytes, std::size_t n) {
              items.push_back({id, bytes, n});
            });
            h.append(source, std::span<const write_item>(items));
          },
          nb::arg("source"), nb::arg("requests"), nb::arg("rows"),
          "One step's KV writes on a source (C++ append(source, span<write_item>)): rows is uint8 "
          "[requests][payload layers][n][row_bytes], n new rows each, within reserve_rows; all or nothing.")
      .def(
          "append_step",
          [](H& h, nb::handle requests, const std::vector<std::optional<in_array>>& rows) {
            h.append_step(std::span<const step_write_item>(step_items<L>(as_requests(requests), rows)));
          },
          nb::arg("requests"), nb::arg("rows"),
          "One step's KV writes on every source (C++ append_step): rows[s] is uint8 "
          "[requests][payload layers of s][n_s][row_bytes of s] or None (no rows on s); all or nothing.")
      .def(
          "commit_step",
          [](H& h, nb::handle requests, const in_array& accepted) {
            const request_list ids = as_requests(requests);
            const auto counts = accepted_counts("commit_step", ids, accepted);
            std::vector<step_commit_item> items;
            for (std::size_t s = 0; s < H::sources; ++s)
              for (std::size_t i = 0; i < ids.size(); ++i) items.push_back({ids[i], s, counts[i]});
            h.commit_step(std::span<const step_commit_item>(items));
          },
          nb::arg("requests"), nb::arg("accepted"),
          "Commits a speculative round on every source (C++ commit_step): accepted is int32 [requests], "
          "the sampler's count for each request; all or nothing.")
      .def(
          "stage_blocks",
          [](H& h, std::size_t source, nb::handle requests, const in_array& rows, std::size_t count) {
            const request_list ids = as_requests(requests);
            std::vector<stage_item> items;
            for_each_request_rows<L>("stage_blocks", source, ids, rows, [&](request_id id, auto bytes, std::size_t) {
              items.push_back({id, bytes, count});
            });
            h.stage_blocks(source, std::span<const stage_item>(items));
          },
          nb::arg("source"), nb::arg("requests"), nb::arg("rows"), nb::arg("count"),
          "A speculative round's draft blocks of a batch on one source (C++ stage_blocks): rows is uint8 "
          "[requests][payload layers][block rows][row_bytes], `count` = K_r positions each; all or nothing.")
      .def(
          "stage_step",
          [](H& h, nb::handle requests, const std::vector<std::optional<in_array>>& rows, std::size_t count) {
            std::vector<step_stage_item> items;
            for (const auto& w : step_items<L>(as_requests(requests), rows, "stage_step"))
              items.push_back({w.request, w.source, w.rows, count});
            h.stage_step(std::span<const step_stage_item>(items));
          },
          nb::arg("requests"), nb::arg("rows"), nb::arg("count"),
          "Draft blocks of every source in one call (C++ stage_step): rows[s] as in stage_blocks, or None.")
      .def("join_backup", &H::join_backup, "Nothing to join on the host backend (the CUDA call's twin).")
      .def_prop_ro("backup_pending", &H::backup_pending)
      .def(
          "resolve",
          [](H& h, std::size_t source, nb::handle requests, const in_array& sel, const out_array& loc, copy_layers mode) {
            const request_list ids = as_requests(requests);
            const auto [c, k] = batch_shape(sel, loc, ids.size(), where::cpu);
            std::vector<resolve_item> items(c);
            const auto* s = static_cast<const row_index*>(sel.data());
            auto* l = static_cast<location*>(loc.data());
            for (std::size_t i = 0; i < c; ++i)
              items[i] = {ids[i], std::span<const row_index>(s + i * k, k), std::span<location>(l + i * k, k)};
            return h.resolve(source, std::span<const resolve_item>(items), mode);
          },
          nb::arg("source"), nb::arg("requests"), nb::arg("selections"), nb::arg("locations"),
          nb::arg("mode") = copy_layers::all,
          "Resolves a batch on one source: `selections` int32 [C, k] (history rows, -1 padded) in, "
          "`locations` int32 [C, k] (writable) filled with pool rows that hold the selected rows' bytes "
          "(pool(source, layer)[loc]); returns the call's ResolveStats.")
      .def("copy_follower", &H::copy_follower, nb::arg("source"), nb::arg("layer"),
           "After a CopyLayers.producer_only resolve: copies follower payload layer `layer` by the same plan.")
      .def("last_plan", [](const H& h, std::size_t source) {
        const auto p = h.last_plan(source);
        return std::vector<planned_copy>(p.begin(), p.end());
      })
      .def(
          "stage_block",
          [rows_span](H& h, request_id id, std::size_t source, const in_array& rows, std::size_t count) {
            h.stage_block(id, source, rows_span(rows), count);
          },
          nb::arg("request"), nb::arg("source"), nb::arg("rows"), nb::arg("count"))
      .def(
          "verify",
          [](H& h, std::size_t source, nb::handle requests, const in_array& queries, const out_array& loc,
             std::optional<std::vector<std::size_t>> query_counts, copy_layers mode) {
            const request_list ids = as_requests(requests);
            const auto [c, kmax, k] = verify_shape(queries, loc, ids.size(), where::cpu);
            const auto widths = round_widths(query_counts, c, kmax);
            std::vector<std::span<const row_index>> qs(c * kmax);
            std::vector<std::span<location>> ls(c * kmax);
            std::vector<verify_item> items(c);
            const auto* q = static_cast<const row_index*>(queries.data());
            auto* l = static_cast<location*>(loc.data());
            for (std::size_t i = 0; i < c; ++i) {
              for (std::size_t j = 0; j < kmax; ++j) {
                qs[i * kmax + j] = {q + (i * kmax + j) * k, k};
                ls[i * kmax + j] = {l + (i * kmax + j) * k, k};
              }
              items[i] = {ids[i], std::span<const std::span<const row_index>>(qs.data() + i * kmax, widths[i]),
                          std::span<const std::span<location>>(ls.data() + i * kmax, widths[i])};
            }
            return h.verify(source, std::span<const verify_item>(items), mode);
          },
          nb::arg("source"), nb::arg("requests"), nb::arg("queries"), nb::arg("locations"),
          nb::arg("query_counts") = nb::none(), nb::arg("mode") = copy_layers::all)
      .def("commit", nb::overload_cast<request_id, std::size_t, std::size_t>(&H::commit), nb::arg("request"),
           nb::arg("source"), nb::arg("accepted"))
      .def(
          "commit_batch",
          [](H& h, std::size_t source, nb::handle requests, const in_array& accepted) {
            const request_list ids = as_requests(requests);
            const auto counts = accepted_counts("commit_batch", ids, accepted);
            std::vector<commit_item> items(ids.size());
            for (std::size_t i = 0; i < ids.size(); ++i) items[i] = {ids[i], counts[i]};
            h.commit(source, std::span<const commit_item>(items));
          },
          nb::arg("source"), nb::arg("requests"), nb::arg("accepted"),
          "Commits the verified rounds of a batch (C++ commit(source, span<commit_item>)): accepted is "
          "int32 [requests]; all or nothing.")
      .def("block_rows", &H::block_rows, nb::arg("request"), nb::arg("source"), nb::arg("count"))
      .def("staged_rows", &H::staged_rows, nb::arg("request"), nb::arg("source"))
      .def("verified_queries", &H::verified_queries, nb::arg("request"), nb::arg("source"))
      .def("release_staging", &H::release_staging, nb::arg("source"))
      .def("staging_holder", &H::staging_holder)
      .def("map_optional_page", &H::map_optional_page, nb::arg("request"), nb::arg("source"), nb::arg("page"))
      .def("unmap_optional_page", &H::unmap_optional_page, nb::arg("request"), nb::arg("source"), nb::arg("page"))
      .def("free_optional_pages", &H::free_optional_pages, nb::arg("source"))
      .def("free_host_pages", &H::free_host_pages, nb::arg("source"))
      .def_prop_ro("pool_bytes", &H::pool_bytes)
      .def("pool_rows", [](const H& h) { return h.space().rows(); })
      .def(
          "pool",
          [](nb::handle self, std::size_t source, std::size_t layer, std::optional<std::string> like) {
            const H& h = nb::cast<const H&>(self);
            const auto first = h.payload(source, layer, 0);  // checks source and layer
            return pool_view(const_cast<std::byte*>(first.data()), h.space().rows(), L::sources[source].row_bytes, self,
                             nb::device::cpu::value, 0, like.value_or(""), true);
          },
          nb::arg("source"), nb::arg("layer") = 0, nb::arg("like") = nb::none(),
          "Zero-copy [pool_rows, row_bytes] uint8 view of a payload layer's (simulated) pool; row `loc` "
          "holds the row a resolve returned at `loc`. Keeps the hierarchy alive.")
      .def("payload", [](const H& h, std::size_t source, std::size_t layer, location loc) {
        return to_bytes(h.payload(source, layer, loc));
      })
      .def("host_row", [](const H& h, request_id id, std::size_t source, std::size_t layer, row_index row) {
        return to_bytes(h.host_row(id, source, layer, row));
      })
      .def("hot_rows_of", [](const H& h, request_id id, std::size_t source) {
        const auto s = h.hot_rows_of(id, source);
        return std::vector<row_index>(s.begin(), s.end());
      })
      .def("lru_order_of", [](const H& h, request_id id, std::size_t source) {
        const auto s = h.lru_order_of(id, source);
        return std::vector<std::size_t>(s.begin(), s.end());
      })
      .def("optional_map_of", [](const H& h, request_id id, std::size_t source) {
        const auto s = h.optional_map_of(id, source);
        return std::vector<std::int32_t>(s.begin(), s.end());
      });
}

/// Binds residency_manager<H, P> as `name`.
template <class M>
void bind_host_manager(nb::module_& m, const char* name) {
  using H = typename M::hierarchy_type;
  using L = typename H::layout;
  nb::class_<M>(m, name, nb::is_weak_referenceable())
      .def(nb::init<const hierarchy_config&, const residency_config&>(), nb::arg("config"), nb::arg("residency"))
      .def_prop_ro_static("policy", [](nb::handle) { return std::string(M::policy::name); })
      .def_prop_ro_static("backend", [](nb::handle) { return "host"; })
      // The owned hierarchy; Python has no const, so the package wraps it (ManagedHierarchy in
      // dhisparse/__init__.py) in the read-only accessors and per-step operations of step_handle.
      .def_prop_ro(
          "_hierarchy", [](M& mgr) -> H& { return const_cast<H&>(mgr.hierarchy()); },
          nb::rv_policy::reference_internal)
      .def_prop_ro("residency_config", &M::config)
      .def_prop_ro("counters", &M::counters)
      .def_prop_ro("capacity_pages", &M::capacity_pages)
      .def_prop_ro("pinned_pages_per_request", &M::pinned_pages_per_request)
      .def("contains", &M::contains)
      .def_prop_ro("admitted_count", &M::admitted_count)
      .def("ledger", &M::ledger, nb::arg("source"))
      .def("invariant_holds", &M::invariant_holds)
      .def("optional_pages_of", &M::optional_pages_of, nb::arg("request"), nb::arg("source"))
      .def("imported_rows", &M::imported_rows, nb::arg("request"), nb::arg("source"))
      .def("reclaim_sequence", &M::reclaim_sequence)
      .def(
          "admit",
          [](M& mgr, request_id id, std::optional<std::vector<in_array>> history, std::optional<prefix_id> prefix) {
            std::vector<history_import> imports;
            if (history) {
              for (std::size_t s = 0; s < history->size(); ++s) {
                const auto& a = (*history)[s];
                check_array<std::uint8_t>(a, "history", where::cpu);
                const std::span<const std::byte> bytes(static_cast<const std::byte*>(a.data()), elements(a));
                // On a prefix the suffix starts where the prefix ends (the library checks it).
                const std::int64_t first =
                    prefix && s < H::sources && mgr.hierarchy().contains_prefix(*prefix)
                        ? mgr.hierarchy().prefix_rows(*prefix, s)
                        : 0;
                imports.push_back(
                    {bytes, s < H::sources ? rows_count(bytes.size(), std::nullopt, L::sources[s]) : 0, first});
              }
            }
            const std::span<const history_import> span(imports);
            return prefix ? mgr.admit(id, *prefix, span) : mgr.admit(id, span);
          },
          nb::arg("request"), nb::arg("history") = nb::none(), nb::arg("prefix") = nb::none(),
          "Resident-first admission; `history` is one uint8 array per source laid out "
          "[payload layer][rows][row_bytes] (its row count follows from its size), or None. With "
          "`prefix`, the request shares retained prefix `prefix` and `history` is only the suffix.")
      .def(
          "retain_prefix",
          [](M& mgr, prefix_id prefix, request_id id, std::optional<std::vector<std::int64_t>> rows) {
            return rows ? mgr.retain_prefix(prefix, id, std::span<const std::int64_t>(*rows))
                        : mgr.retain_prefix(prefix, id);
          },
          nb::arg("prefix"), nb::arg("request"), nb::arg("rows") = nb::none())
      .def("release_prefix", &M::release_prefix, nb::arg("prefix"))
      .def(
          "append",
          [](M& mgr, request_id id, std::size_t source, const in_array& rows, std::optional<std::size_t> count) {
            check_array<std::uint8_t>(rows, "rows", where::cpu);
            const std::span<const std::byte> bytes(static_cast<const std::byte*>(rows.data()), elements(rows));
            mgr.append(id, source, bytes, source < H::sources ? rows_count(bytes.size(), count, L::sources[source]) : 0);
          },
          nb::arg("request"), nb::arg("source"), nb::arg("rows"), nb::arg("count") = nb::none())
      .def("reserve_ahead", &M::reserve_ahead, nb::arg("rows_ahead"))
      .def(
          "append_step",
          [](M& mgr, nb::handle requests, const std::vector<std::optional<in_array>>& rows) {
            mgr.append_step(std::span<const step_write_item>(step_items<L>(as_requests(requests), rows)));
          },
          nb::arg("requests"), nb::arg("rows"),
          "One step's decode rows on every source through the manager (C++ append_step; a pinning "
          "policy maps the pages the step completes): rows[s] as Hierarchy.append_step.")
      .def(
          "import_history",
          [](M& mgr, request_id id, std::size_t source, const in_array& rows, std::optional<std::size_t> count) {
            check_array<std::uint8_t>(rows, "rows", where::cpu);
            const std::span<const std::byte> bytes(static_cast<const std::byte*>(rows.data()), elements(rows));
            return mgr.import_history(id, source, bytes,
                                      source < H::sources ? rows_count(bytes.size(), count, L::sources[source]) : 0);
          },
          nb::arg("request"), nb::arg("source"), nb::arg("rows"), nb::arg("count") = nb::none(),
          "Streamed admission: the next rows of an admitted request's history on one source, uint8 "
          "[payload layer][rows][row_bytes] as a prefill chunk delivers them; returns the pages mapped.")
      .def("complete", &M::complete, nb::arg("request"))
      .def("repopulate", &M::repopulate)
      .def("audit", &M::audit);
}

/// Binds the hierarchy and its three residency managers of `Layout` with hot cache `B`.
template <class Layout, std::size_t B>
void bind_host_layout(nb::module_& m, const char* layout_name) {
  using H = host_hierarchy<Layout, lru_hot_cache<B>>;
  const std::string base = std::string("_") + layout_name;
  static const std::string hname = "HostHierarchy" + base;
  static const std::string fixed = "HostResidencyManager" + base + "_fixed_budget";
  static const std::string mra = "HostResidencyManager" + base + "_adaptive_mra";
  static const std::string lra = "HostResidencyManager" + base + "_adaptive_lra";
  static const std::string res = "HostResidencyManager" + base + "_resident";
  bind_host_hierarchy<H>(m, hname.c_str(), layout_name);
  bind_host_manager<residency_manager<H, fixed_budget_policy>>(m, fixed.c_str());
  bind_host_manager<residency_manager<H, adaptive_policy<>>>(m, mra.c_str());
  bind_host_manager<residency_manager<H, adaptive_policy<reclaim_order::least_recent_first>>>(m, lra.c_str());
  bind_host_manager<residency_manager<H, resident_policy>>(m, res.c_str());
  static const std::string shared = "HostSharedHostStore" + base;
  static const std::string ipc = "HostInterprocessHostStore" + base;
  bind_host_stores<Layout>(m, shared.c_str(), ipc.c_str(), layout_name);
  // The planner for this layout, with the binding's own choices fixed: B and dedicated staging.
  static const std::string plan = "plan" + base;
  m.def(plan.c_str(), [](const config_inputs& in) {
    config_inputs x = in;
    x.hot_rows = B;
    x.staging_arenas.reset();
    return plan_hierarchy<Layout>(x);
  });
}

}  // namespace dhisparse::python
