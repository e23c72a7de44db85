#pragma once
// Binders of the CUDA backend over the facade of cuda_ops.hpp. Per-step arrays must be CUDA arrays
// (torch, CuPy, JAX through DLPack) and are passed by pointer; rows may be CUDA or CPU arrays.
// Every call takes `stream` (an int cudaStream_t handle, a torch.cuda.Stream or a CuPy stream:
// stream_arg); None means the package's provider: torch's current stream when torch is imported,
// else the legacy default stream.
#include "array_import.hpp"
#include "cuda_ops.hpp"
#include "host_bind.hpp"

namespace dhisparse::python {

/// Rows given as a CUDA array (device path) or a CPU array (staged by the library).
template <class Array>
bool rows_on_device(const Array& rows) {
  if (rows.device_type() == nb::device::cuda::value) {
    check_array<std::uint8_t>(rows, "rows", where::cuda);
    return true;
  }
  check_array<std::uint8_t>(rows, "rows", where::cpu);
  return false;
}

/// A rows argument ([payload layer][count][row_bytes] uint8, CUDA or CPU) of source `source` of
/// layout L: the array, where it lives, its bytes and its rows (`count` given, or from the size).
struct rows_arg {
  in_array rows;
  bool on_device = false;
  std::size_t bytes = 0;
  std::size_t count = 0;
};
template <class L>
rows_arg import_rows_arg(nb::handle obj, std::size_t source, std::optional<std::size_t> count) {
  rows_arg a{import_array<in_array>(obj, "rows")};
  a.on_device = rows_on_device(a.rows);
  a.bytes = elements(a.rows);
  a.count = source < std::size(L::sources) ? rows_count(a.bytes, count, L::sources[source]) : 0;
  return a;
}

/// The device arrays of a batched write: slots [capacity], rows and first [capacity * per_entry]
/// (first optional), layer_rows int64 [layers] of device pointers; checked, not copied.
struct write_arrays {
  in_array slots, rows, layers;
  std::optional<in_array> first;
  std::uint32_t capacity = 0;
  write_arrays(const char* call, nb::handle slots_obj, nb::handle rows_obj, nb::handle layers_obj,
               std::optional<nb::handle> first_obj, std::size_t layer_count, std::size_t per_entry,
               std::uint32_t pitch = 0, const char* counts_name = "rows")
      : slots(import_array<in_array>(slots_obj, "slots")),
        rows(import_array<in_array>(rows_obj, counts_name)),
        layers(import_array<in_array>(layers_obj, "layer_rows")) {
    check_array<std::int32_t>(slots, "slots", where::cuda);
    check_array<std::int32_t>(rows, counts_name, where::cuda);
    check_array<std::int64_t>(layers, "layer_rows", where::cuda);
    capacity = static_cast<std::uint32_t>(elements(slots));
    const std::size_t counts = pitch == 0 ? capacity : per_entry * pitch;
    if (pitch != 0 && pitch < capacity)
      throw size_mismatch(std::string(call) + ": rows_pitch " + std::to_string(pitch) + " is below the capacity " +
                          std::to_string(capacity));
    if (elements(rows) != counts)
      throw size_mismatch(std::string(call) + ": " + counts_name + " must hold " + std::to_string(counts) +
                          " counts, got " + shape_of(rows));
    if (elements(layers) != layer_count)
      throw size_mismatch(std::string(call) + ": layer_rows must hold " + std::to_string(layer_count) +
                          " device row-buffer pointers, got " + shape_of(layers));
    if (first_obj) {
      first = import_array<in_array>(*first_obj, "first");
      check_array<std::int32_t>(*first, "first", where::cuda);
      if (elements(*first) != counts)
        throw size_mismatch(std::string(call) + ": first must hold " + std::to_string(counts) + " rows, got " +
                            shape_of(*first));
    }
  }
  const std::int32_t* slots_ptr() const { return static_cast<const std::int32_t*>(slots.data()); }
  const std::int32_t* rows_ptr() const { return static_cast<const std::int32_t*>(rows.data()); }
  const std::int32_t* first_ptr() const { return first ? static_cast<const std::int32_t*>(first->data()) : nullptr; }
  const void* const* layers_ptr() const { return static_cast<const void* const*>(layers.data()); }
};

/// slots and accepted of a batched commit: int32 CUDA arrays of one count per slot.
inline std::pair<in_array, in_array> commit_arrays(const char* call, nb::handle slots_obj, nb::handle accepted_obj) {
  in_array slots = import_array<in_array>(slots_obj, "slots");
  in_array accepted = import_array<in_array>(accepted_obj, "accepted");
  check_array<std::int32_t>(slots, "slots", where::cuda);
  check_array<std::int32_t>(accepted, "accepted", where::cuda);
  if (elements(accepted) != elements(slots))
    throw size_mismatch(std::string(call) + ": accepted must hold one count per slot");
  return {std::move(slots), std::move(accepted)};
}

template <class Array>
void check_count_array(const Array& a) {
  if (a.dtype() != nb::dtype<std::int32_t>() && a.dtype() != nb::dtype<std::uint32_t>())
    throw nb::type_error("count: expected dtype int32 or uint32");
  if (a.device_type() != nb::device::cuda::value) throw nb::type_error("count: expected a CUDA array");
  if (elements(a) < 1) throw size_mismatch("count must hold one element");
}

using opt_stream = stream_arg;

template <class Ops>
void bind_cuda_hierarchy(nb::module_& m, const char* name, nb::dict layout) {
  using L = typename Ops::layout_type;
  nb::class_<Ops>(m, name, nb::is_weak_referenceable())
      .def(nb::init<const hierarchy_config&, stream_handle>(), nb::arg("config"), nb::arg("stream") = 0)
      // Rank `rank` of the CUDA hierarchies sharing a pinned store (docs/multi-gpu.md); keeps the store alive.
      .def(
          "__init__",
          [](Ops* h, const hierarchy_config& cfg, cuda_pinned_store_ops<L>& store, std::size_t rank,
             stream_handle stream) { new (h) Ops(cfg, store.store(), rank, stream); },
          nb::arg("config"), nb::arg("store"), nb::arg("rank"), nb::arg("stream") = 0, nb::keep_alive<1, 3>())
      .def(
          "__init__",
          [](Ops* h, const hierarchy_config& cfg, cuda_interprocess_store_ops<L>& store, std::size_t rank,
             stream_handle stream) { new (h) Ops(cfg, store.store(), rank, stream); },
          nb::arg("config"), nb::arg("store"), nb::arg("rank"), nb::arg("stream") = 0, nb::keep_alive<1, 3>())
      .def_prop_ro("shares_host_store", &Ops::shares_host_store)
      .def_prop_ro("rank", &Ops::rank, "Its rank on a shared host store (0 when it owns its stores).")
      .def_prop_ro("host_bytes_in_use", &Ops::host_bytes_in_use,
                   "Bytes of host pages allocated now (on a shared store: every rank's, one copy).")
      .def_prop_ro_static("layout", [layout](nb::handle) { return layout; })
      .def_prop_ro_static("hot_rows", [](nb::handle) { return Ops::hot_rows; })
      .def_prop_ro_static("top_k", [](nb::handle) { return L::top_k; })
      .def_prop_ro_static("backend", [](nb::handle) { return "cuda"; })
      .def_prop_ro("config", &Ops::config)
      .def_prop_ro("space", [](const Ops& h) { return space_dict(h.space()); })
      .def_prop_ro("device", &Ops::device)
      .def_prop_ro("stream", &Ops::stream)
      .def_prop_rw("programmatic_launch", &Ops::programmatic_launch, &Ops::set_programmatic_launch)
      .def("contains", &Ops::contains)
      .def("slot_of", &Ops::slot_of)
      .def_prop_ro("admitted_count", &Ops::admitted_count)
      .def(
          "admit",
          [](Ops& h, request_id id, std::optional<prefix_id> prefix, opt_stream s) {
            return prefix ? h.admit_on_prefix(id, *prefix, default_stream(s, h.device())) : h.admit(id, default_stream(s, h.device()));
          },
          nb::arg("request"), nb::arg("prefix") = nb::none(), nb::arg("stream") = nb::none(),
          "Admits a request with an empty history, or on retained prefix `prefix` (one kernel per source "
          "on `stream`, after the prefix's rows were written in its order; docs/prefixes.md).")
      .def(
          "retain_prefix",
          [](Ops& h, prefix_id prefix, request_id id, std::optional<std::vector<std::int64_t>> rows) {
            return h.retain_prefix(prefix, id, rows ? &*rows : nullptr);
          },
          nb::arg("prefix"), nb::arg("request"), nb::arg("rows") = nb::none())
      .def("release_prefix", &Ops::release_prefix, nb::arg("prefix"))
      .def("contains_prefix", &Ops::contains_prefix, nb::arg("prefix"))
      .def("prefix_rows", &Ops::prefix_rows, nb::arg("prefix"), nb::arg("source"))
      .def("retained_prefixes", &Ops::retained_prefixes)
      .def("prefix_pages_held", &Ops::prefix_pages_held, nb::arg("source"))
      .def(
          "complete", [](Ops& h, request_id id, opt_stream s) { h.complete(id, default_stream(s, h.device())); },
          nb::arg("request"), nb::arg("stream") = nb::none())
      .def("frontier", &Ops::frontier, nb::arg("request"), nb::arg("source"))
      .def("positions", &Ops::positions, nb::arg("request"), nb::arg("source"))
      .def(
          "append",
          [](Ops& h, request_id id, std::size_t source, nb::handle rows_obj, std::optional<std::size_t> count,
             opt_stream s) {
            const auto r = import_rows_arg<L>(rows_obj, source, count);
            h.append(id, source, r.rows.data(), r.bytes, r.count, r.on_device, default_stream(s, h.device()));
          },
          nb::arg("request"), nb::arg("source"), nb::arg("rows"), nb::arg("count") = nb::none(),
          nb::arg("stream") = nb::none(),
          "Appends one request's rows to one source: `rows` uint8 [payload layers, count, row_bytes], CPU "
          "or device (count from the size when None). Eager, not capturable: a graph's writes use "
          "append_step_view.")
      .def(
          "reserve_rows",
          [](Ops& h, request_id id, std::size_t source, std::size_t rows_ahead, opt_stream s) {
            h.reserve_rows(id, source, rows_ahead, default_stream(s, h.device()));
          },
          nb::arg("request"), nb::arg("source"), nb::arg("rows_ahead"), nb::arg("stream") = nb::none())
      .def(
          "reserve_ahead", [](Ops& h, std::size_t rows_ahead, opt_stream s) { h.reserve_ahead(rows_ahead, default_stream(s, h.device())); },
          nb::arg("rows_ahead"), nb::arg("stream") = nb::none(),
          "Host pages for the next rows_ahead rows of every request and source (outside a graph).")
      .def("reserved_rows", &Ops::reserved_rows, nb::arg("request"), nb::arg("source"))
      .def(
          "sync_books", [](Ops& h, opt_stream s) { h.sync_books(default_stream(s, h.device())); }, nb::arg("stream") = nb::none(),
          "Brings the host books up to the device's batched writes and commits (synchronises the stream; "
          "call between replays before reading the books; not capturable).")
      .def(
          "append_view",
          [](Ops& h, std::size_t source, nb::handle slots_obj, nb::handle rows_obj, nb::handle layers_obj,
             std::optional<nb::handle> first_obj, std::uint64_t row_stride, std::uint32_t max_rows, opt_stream s) {
            const std::size_t layers = source < std::size(L::sources) ? L::sources[source].payload_layers : 0;
            const write_arrays w("append_view", slots_obj, rows_obj, layers_obj, first_obj, layers, 1);
            h.append_view(source, w.slots_ptr(), w.rows_ptr(), w.first_ptr(), w.layers_ptr(), row_stride, max_rows,
                          w.capacity, default_stream(s, h.device()));
          },
          nb::arg("source"), nb::arg("slots"), nb::arg("rows"), nb::arg("layer_rows"), nb::arg("first") = nb::none(),
          nb::arg("row_stride") = 0, nb::arg("max_rows") = 1, nb::arg("stream") = nb::none(),
          "One step's KV writes on a source, read on the device (C++ cuda::kv_write_view): slots and rows "
          "int32 [capacity] (slot_of, -1 = padding; new rows per entry), layer_rows int64 [payload layers] "
          "of device row-buffer pointers (dhisparse.layer_pointers), first int32 [capacity] or None "
          "(entry e at row e * max_rows). Within reserve_rows; capturable. Errors: check_errors.")
      .def_prop_ro_static("step_layers", [](nb::handle) { return Ops::step_layers(); })
      .def_static("step_layer_index", &Ops::step_layer_index, nb::arg("source"), nb::arg("layer"))
      .def(
          "append_step_view",
          [](Ops& h, nb::handle slots_obj, nb::handle rows_obj, nb::handle layers_obj,
             std::optional<nb::handle> first_obj, std::uint64_t row_stride, std::uint32_t rows_pitch,
             std::uint32_t max_rows, opt_stream backup, opt_stream s) {
            const write_arrays w("append_step_view", slots_obj, rows_obj, layers_obj, first_obj, Ops::step_layers(),
                                 rows_pitch == 0 ? 1 : std::size(L::sources), rows_pitch);
            const auto stream = default_stream(s, h.device());
            h.append_step_view(w.slots_ptr(), w.rows_ptr(), w.first_ptr(), w.layers_ptr(), row_stride, rows_pitch,
                               max_rows, w.capacity, backup.handle ? *backup.handle : stream, stream);
          },
          nb::arg("slots"), nb::arg("rows"), nb::arg("layer_rows"), nb::arg("first") = nb::none(),
          nb::arg("row_stride") = 0, nb::arg("rows_pitch") = 0, nb::arg("max_rows") = 1,
          nb::arg("backup") = nb::none(), nb::arg("stream") = nb::none(),
          "One step's KV writes on EVERY source in one launch (C++ append_step over a kv_step_write_view): "
          "layer_rows int64 [step_layers], one device row buffer per (source, payload layer) at "
          "step_layer_index(s, l); rows (and first) int32 [capacity], or [sources * rows_pitch] with "
          "rows_pitch. The host backup runs on `backup` (default: `stream`, inline); join_backup(stream) "
          "joins it. Within reserve_ahead; capturable. Errors: check_errors.")
      .def(
          "commit_step_view",
          [](Ops& h, nb::handle slots_obj, nb::handle accepted_obj, opt_stream backup, opt_stream s) {
            const auto [slots, accepted] = commit_arrays("commit_step_view", slots_obj, accepted_obj);
            const auto stream = default_stream(s, h.device());
            h.commit_step_view(static_cast<const std::int32_t*>(slots.data()),
                               static_cast<const std::int32_t*>(accepted.data()),
                               static_cast<std::uint32_t>(elements(slots)), backup.handle ? *backup.handle : stream, stream);
          },
          nb::arg("slots"), nb::arg("accepted"), nb::arg("backup") = nb::none(), nb::arg("stream") = nb::none(),
          "Commits a speculative round on every source in one launch (C++ commit_step): slots and accepted "
          "int32 [capacity]; capturable. Errors: check_errors.")
      .def(
          "stage_blocks_view",
          [](Ops& h, std::size_t source, nb::handle slots_obj, nb::handle counts_obj, nb::handle layers_obj,
             std::optional<nb::handle> first_obj, std::uint64_t row_stride, std::uint32_t max_block, opt_stream s) {
            const std::size_t layers = source < std::size(L::sources) ? L::sources[source].payload_layers : 0;
            const write_arrays w("stage_blocks_view", slots_obj, counts_obj, layers_obj, first_obj, layers, 1, 0, "counts");
            h.stage_blocks_view(source, w.slots_ptr(), w.rows_ptr(), w.first_ptr(), w.layers_ptr(), row_stride,
                                max_block, w.capacity, default_stream(s, h.device()));
          },
          nb::arg("source"), nb::arg("slots"), nb::arg("counts"), nb::arg("layer_rows"), nb::arg("first") = nb::none(),
          nb::arg("row_stride") = 0, nb::arg("max_block") = 0, nb::arg("stream") = nb::none(),
          "A speculative round's draft blocks on one source, read on the device (C++ stage_blocks over a "
          "stage_view): slots and counts (K_r positions) int32 [capacity], layer_rows int64 [payload "
          "layers]; capturable. Errors: check_errors.")
      .def(
          "stage_step_view",
          [](Ops& h, nb::handle slots_obj, nb::handle counts_obj, nb::handle layers_obj,
             std::optional<nb::handle> first_obj, std::uint64_t row_stride, std::uint32_t max_block, opt_stream s) {
            const write_arrays w("stage_step_view", slots_obj, counts_obj, layers_obj, first_obj, Ops::step_layers(), 1, 0,
                                 "counts");
            h.stage_step_view(w.slots_ptr(), w.rows_ptr(), w.first_ptr(), w.layers_ptr(), row_stride, max_block,
                              w.capacity, default_stream(s, h.device()));
          },
          nb::arg("slots"), nb::arg("counts"), nb::arg("layer_rows"), nb::arg("first") = nb::none(),
          nb::arg("row_stride") = 0, nb::arg("max_block") = 0, nb::arg("stream") = nb::none(),
          "Draft blocks on every source in one launch (C++ stage_step over a stage_step_view): layer_rows "
          "int64 [step_layers] as append_step_view; capturable. Errors: check_errors.")
      .def(
          "join_backup", [](Ops& h, opt_stream s) { h.join_backup(default_stream(s, h.device())); }, nb::arg("stream") = nb::none(),
          "Makes `stream` wait for the host backup of the last step-wide write (capturable).")
      .def_prop_ro("backup_pending", &Ops::backup_pending)
      .def(
          "commit_view",
          [](Ops& h, std::size_t source, nb::handle slots_obj, nb::handle accepted_obj, opt_stream s) {
            const auto [slots, accepted] = commit_arrays("commit_view", slots_obj, accepted_obj);
            h.commit_view(source, static_cast<const std::int32_t*>(slots.data()),
                          static_cast<const std::int32_t*>(accepted.data()),
                          static_cast<std::uint32_t>(elements(slots)), default_stream(s, h.device()));
          },
          nb::arg("source"), nb::arg("slots"), nb::arg("accepted"), nb::arg("stream") = nb::none(),
          "Commits a speculative round's accepted counts, read on the device (C++ cuda::commit_view): "
          "slots and accepted int32 [capacity]; capturable. Errors: check_errors.")
      .def(
          "resolve",
          [](Ops& h, std::size_t source, nb::handle requests, nb::handle sel_obj, nb::handle loc_obj,
             copy_layers mode, opt_stream s) {
            const in_array sel = import_array<in_array>(sel_obj, "selections");
            const out_array loc = import_array<out_array>(loc_obj, "locations");
            const request_list ids = as_requests(requests);
            const auto [c, k] = batch_shape(sel, loc, ids.size(), where::cuda);
            h.resolve(source, ids.data(), c, static_cast<const std::int32_t*>(sel.data()),
                      static_cast<std::int32_t*>(loc.data()), k, default_stream(s, h.device()), mode);
          },
          nb::arg("source"), nb::arg("requests"), nb::arg("selections"), nb::arg("locations"),
          nb::arg("mode") = copy_layers::all, nb::arg("stream") = nb::none(),
          "Eager batched resolve on the device (asynchronous; not capturable: use resolve_view in a graph).")
      .def(
          "resolve_view",
          [](Ops& h, std::size_t source, nb::handle slots_obj, nb::handle sel_obj, nb::handle loc_obj,
             nb::handle count_obj, std::optional<nb::handle> lengths_obj, copy_layers mode, opt_stream s) {
            const in_array slots = import_array<in_array>(slots_obj, "slots");
            const in_array sel = import_array<in_array>(sel_obj, "selections");
            const out_array loc = import_array<out_array>(loc_obj, "locations");
            const in_array count = import_array<in_array>(count_obj, "count");
            std::optional<in_array> lengths;
            if (lengths_obj) lengths = import_array<in_array>(*lengths_obj, "lengths");
            check_array<std::int32_t>(slots, "slots", where::cuda);
            if (slots.ndim() != 1) throw size_mismatch("slots must be 1-D [capacity]");
            const auto [cap, stride] = batch_shape(sel, loc, slots.shape(0), where::cuda);
            check_count_array(count);
            const std::int32_t* len = nullptr;
            if (lengths) {
              check_array<std::int32_t>(*lengths, "lengths", where::cuda);
              if (elements(*lengths) != cap) throw size_mismatch("lengths must hold one entry per slot");
              len = static_cast<const std::int32_t*>(lengths->data());
            }
            h.resolve_view(source, static_cast<const std::int32_t*>(slots.data()),
                           static_cast<const std::int32_t*>(sel.data()), static_cast<std::int32_t*>(loc.data()), len,
                           static_cast<const std::uint32_t*>(count.data()), static_cast<std::uint32_t>(stride),
                           static_cast<std::uint32_t>(cap), default_stream(s, h.device()), mode);
          },
          nb::arg("source"), nb::arg("slots"), nb::arg("selections"), nb::arg("locations"), nb::arg("count"),
          nb::arg("lengths") = nb::none(), nb::arg("mode") = copy_layers::all, nb::arg("stream") = nb::none(),
          "Resolve over device buffers: slots [capacity] (slot_of), selections/locations [capacity, stride], "
          "count [1] (entries this launch). Everything is read when the kernel runs, so it can be captured "
          "in a CUDA graph once and replayed with new contents. Errors: check_errors.")
      .def(
          "resolve_view_ptr",
          [](Ops& h, std::size_t source, std::uintptr_t slots, std::uintptr_t sel, std::uintptr_t loc,
             std::uintptr_t count, std::uint32_t stride, std::uint32_t capacity, std::uintptr_t lengths,
             copy_layers mode, opt_stream s) {
            h.resolve_view(source, reinterpret_cast<const std::int32_t*>(slots),
                           reinterpret_cast<const std::int32_t*>(sel), reinterpret_cast<std::int32_t*>(loc),
                           reinterpret_cast<const std::int32_t*>(lengths), reinterpret_cast<const std::uint32_t*>(count),
                           stride, capacity, default_stream(s, h.device()), mode);
          },
          nb::arg("source"), nb::arg("slots"), nb::arg("selections"), nb::arg("locations"), nb::arg("count"),
          nb::arg("stride"), nb::arg("capacity"), nb::arg("lengths") = 0, nb::arg("mode") = copy_layers::all,
          nb::arg("stream") = nb::none(),
          "resolve_view over raw device addresses (e.g. tensor.data_ptr(), taken once): no array import, "
          "the lowest-overhead eager call. The buffers must match resolve_view's shapes; nothing is checked "
          "but what the library checks.")
      .def(
          "_time_resolve_view",
          [](Ops& h, std::size_t iterations, std::size_t source, nb::handle slots_obj, nb::handle sel_obj,
             nb::handle loc_obj, nb::handle count_obj, opt_stream s) {
            const in_array slots = import_array<in_array>(slots_obj, "slots");
            const in_array sel = import_array<in_array>(sel_obj, "selections");
            const out_array loc = import_array<out_array>(loc_obj, "locations");
            const in_array count = import_array<in_array>(count_obj, "count");
            check_array<std::int32_t>(slots, "slots", where::cuda);
            const auto [cap, stride] = batch_shape(sel, loc, slots.shape(0), where::cuda);
            check_count_array(count);
            return h.time_resolve_view(iterations, source, static_cast<const std::int32_t*>(slots.data()),
                                       static_cast<const std::int32_t*>(sel.data()),
                                       static_cast<std::int32_t*>(loc.data()),
                                       static_cast<const std::uint32_t*>(count.data()),
                                       static_cast<std::uint32_t>(stride), static_cast<std::uint32_t>(cap),
                                       default_stream(s, h.device()));
          },
          nb::arg("iterations"), nb::arg("source"), nb::arg("slots"), nb::arg("selections"), nb::arg("locations"),
          nb::arg("count"), nb::arg("stream") = nb::none(),
          "Benchmark helper: host seconds per resolve_view call issued from C++ (python/benchmarks).")
      .def(
          "check_errors", [](Ops& h, opt_stream s) { h.check_errors(default_stream(s, h.device())); }, nb::arg("stream") = nb::none(),
          "Synchronises the stream and raises the typed error of the first bad entry since the last check.")
      .def("last_stats", &Ops::last_stats, nb::arg("source"))
      .def("last_plan", &Ops::last_plan, nb::arg("source"))
      .def(
          "copy_follower",
          [](Ops& h, std::size_t source, std::size_t layer, opt_stream s) { h.copy_follower(source, layer, default_stream(s, h.device())); },
          nb::arg("source"), nb::arg("layer"), nb::arg("stream") = nb::none())
      .def(
          "release_staging", [](Ops& h, std::size_t source, opt_stream s) { h.release_staging(source, default_stream(s, h.device())); },
          nb::arg("source"), nb::arg("stream") = nb::none())
      .def("staging_holder", &Ops::staging_holder)
      .def(
          "stage_block",
          [](Ops& h, request_id id, std::size_t source, nb::handle rows_obj, std::size_t count, opt_stream s) {
            const in_array rows = import_array<in_array>(rows_obj, "rows");
            const bool dev = rows_on_device(rows);
            h.stage_block(id, source, rows.data(), elements(rows), count, dev, default_stream(s, h.device()));
          },
          nb::arg("request"), nb::arg("source"), nb::arg("rows"), nb::arg("count"), nb::arg("stream") = nb::none())
      .def(
          "verify",
          [](Ops& h, std::size_t source, nb::handle requests, nb::handle queries_obj, nb::handle loc_obj,
             std::optional<std::vector<std::size_t>> query_counts, copy_layers mode, opt_stream s) {
            const in_array queries = import_array<in_array>(queries_obj, "queries");
            const out_array loc = import_array<out_array>(loc_obj, "locations");
            const request_list ids = as_requests(requests);
            const auto [c, kmax, k] = verify_shape(queries, loc, ids.size(), where::cuda);
            const auto widths = round_widths(query_counts, c, kmax);
            h.verify(source, ids.data(), c, widths.data(), kmax, static_cast<const std::int32_t*>(queries.data()),
                     static_cast<std::int32_t*>(loc.data()), k, default_stream(s, h.device()), mode);
          },
          nb::arg("source"), nb::arg("requests"), nb::arg("queries"), nb::arg("locations"),
          nb::arg("query_counts") = nb::none(), nb::arg("mode") = copy_layers::all, nb::arg("stream") = nb::none())
      .def(
          "verify_view",
          [](Ops& h, std::size_t source, nb::handle count_obj, nb::handle slots_obj, nb::handle queries_obj,
             nb::handle lengths_obj, nb::handle sel_obj, nb::handle loc_obj, copy_layers mode, opt_stream s) {
            const in_array count = import_array<in_array>(count_obj, "count");
            const in_array slots = import_array<in_array>(slots_obj, "slots");
            const in_array queries = import_array<in_array>(queries_obj, "query_counts");
            const in_array lengths = import_array<in_array>(lengths_obj, "lengths");
            const in_array sel = import_array<in_array>(sel_obj, "selection_ptrs");
            const in_array loc = import_array<in_array>(loc_obj, "location_ptrs");
            check_count_array(count);
            check_array<std::int32_t>(slots, "slots", where::cuda);
            check_array<std::int32_t>(queries, "query_counts", where::cuda);
            check_array<std::int32_t>(lengths, "lengths", where::cuda);
            check_array<std::int64_t>(sel, "selection_ptrs", where::cuda);
            check_array<std::int64_t>(loc, "location_ptrs", where::cuda);
            const std::size_t cap = elements(slots), per = cap * h.config().max_block;
            if (elements(queries) != cap) throw size_mismatch("verify_view: query_counts must hold one K_r per slot");
            if (elements(lengths) != per || elements(sel) != per || elements(loc) != per)
              throw size_mismatch("verify_view: lengths, selection_ptrs and location_ptrs must hold capacity * "
                                  "max_block = " + std::to_string(per) + " entries");
            h.verify_view(source, static_cast<const std::uint32_t*>(count.data()),
                          static_cast<const std::int32_t*>(slots.data()), static_cast<const std::int32_t*>(queries.data()),
                          static_cast<const std::int32_t*>(lengths.data()), static_cast<const void* const*>(sel.data()),
                          static_cast<const void* const*>(loc.data()), static_cast<std::uint32_t>(cap),
                          default_stream(s, h.device()), mode);
          },
          nb::arg("source"), nb::arg("count"), nb::arg("slots"), nb::arg("query_counts"), nb::arg("lengths"),
          nb::arg("selection_ptrs"), nb::arg("location_ptrs"), nb::arg("mode") = copy_layers::all,
          nb::arg("stream") = nb::none(),
          "Verify over device buffers (C++ verify(source, verify_batch_view, stream)): count [1], slots and "
          "query_counts (K_r) int32 [capacity], lengths int32 and selection_ptrs/location_ptrs int64 "
          "[capacity * max_block] (query j of entry e at e * max_block + j; dhisparse.verify_pointers "
          "builds them from [capacity, max_block, k] tensors). Capturable. Errors: check_errors.")
      .def("last_verify_stats", &Ops::last_verify_stats, nb::arg("source"))
      .def(
          "commit",
          [](Ops& h, request_id id, std::size_t source, std::size_t accepted, opt_stream s) {
            h.commit(id, source, accepted, default_stream(s, h.device()));
          },
          nb::arg("request"), nb::arg("source"), nb::arg("accepted"), nb::arg("stream") = nb::none())
      .def("block_rows", &Ops::block_rows, nb::arg("request"), nb::arg("source"), nb::arg("count"))
      .def("staged_rows", &Ops::staged_rows, nb::arg("request"), nb::arg("source"))
      .def("verified_queries", &Ops::verified_queries, nb::arg("request"), nb::arg("source"))
      .def(
          "map_optional_page",
          [](Ops& h, request_id id, std::size_t source, std::size_t page, opt_stream s) {
            return h.map_optional_page(id, source, page, default_stream(s, h.device()));
          },
          nb::arg("request"), nb::arg("source"), nb::arg("page"), nb::arg("stream") = nb::none())
      .def(
          "unmap_optional_page",
          [](Ops& h, request_id id, std::size_t source, std::size_t page, opt_stream s) {
            h.unmap_optional_page(id, source, page, default_stream(s, h.device()));
          },
          nb::arg("request"), nb::arg("source"), nb::arg("page"), nb::arg("stream") = nb::none())
      .def("free_optional_pages", &Ops::free_optional_pages, nb::arg("source"))
      .def("free_host_pages", &Ops::free_host_pages, nb::arg("source"))
      .def("pool_rows", &Ops::pool_rows)
      .def(
          "pool",
          [](nb::handle self, std::size_t source, std::size_t layer, std::optional<std::string> like) {
            const Ops& h = nb::cast<const Ops&>(self);
            if (source >= std::size(L::sources)) h.pool(source, layer);  // invalid_source from the library
            return pool_view(h.pool(source, layer), h.pool_rows(), L::sources[source].row_bytes, self,
                             nb::device::cuda::value, h.device(), like.value_or(""), false);
          },
          nb::arg("source"), nb::arg("layer") = 0, nb::arg("like") = nb::none(),
          "Zero-copy [pool_rows, row_bytes] uint8 view of a payload layer's device pool (DLPack; like='torch' "
          "gives a torch tensor). Read it only; it keeps the hierarchy alive.")
      .def("payload", [](const Ops& h, std::size_t source, std::size_t layer, location loc) {
        const auto r = h.payload_row(source, layer, loc);
        return nb::bytes(reinterpret_cast<const char*>(r.data()), r.size());
      })
      .def("host_row", [](const Ops& h, request_id id, std::size_t source, std::size_t layer, row_index row) {
        const auto r = h.host_row(id, source, layer, row);
        return nb::bytes(reinterpret_cast<const char*>(r.data()), r.size());
      })
      .def("hot_rows_of", &Ops::hot_rows_of)
      .def("lru_order_of", &Ops::lru_order_of)
      .def("optional_map_of", &Ops::optional_map_of)
      .def(
          "synchronize", [](const Ops& h, opt_stream s) { h.synchronize(default_stream(s, h.device())); },
          nb::arg("stream") = nb::none());
}

template <class M>
void bind_cuda_manager(nb::module_& m, const char* name, const char* policy) {
  using L = typename M::layout_type;
  // Keeps the imported arrays alive for the call (their capsules own the data references).
  auto imports_of = [](nb::handle history, std::vector<in_array>& arrays, bool& dev) {
    std::vector<import_rows> out;
    dev = false;
    if (history.is_none()) return out;
    for (nb::handle item : history) arrays.push_back(import_array<in_array>(item, "history"));
    for (std::size_t s = 0; s < arrays.size(); ++s) {
      const auto& a = arrays[s];
      const bool d = rows_on_device(a);
      if (s > 0 && d != dev) throw nb::type_error("history: every source's rows must live on the same device");
      dev = d;
      const std::size_t bytes = elements(a);
      out.push_back({a.data(), bytes, s < std::size(L::sources) ? rows_count(bytes, std::nullopt, L::sources[s]) : 0});
    }
    return out;
  };
  const std::string pol = policy;
  nb::class_<M>(m, name, nb::is_weak_referenceable())
      .def(nb::init<const hierarchy_config&, const residency_config&, stream_handle>(), nb::arg("config"),
           nb::arg("residency"), nb::arg("stream") = 0)
      .def_prop_ro_static("policy", [pol](nb::handle) { return pol; })
      .def_prop_ro_static("backend", [](nb::handle) { return "cuda"; })
      // Wrapped by the package in ManagedHierarchy (read-only accessors and per-step operations).
      .def_prop_ro("_hierarchy", &M::hierarchy, nb::rv_policy::reference_internal)
      .def_prop_ro("step_stream", &M::step_stream)
      .def_prop_ro("copy_stream", &M::copy_stream)
      .def_prop_ro("residency_config", &M::config)
      .def_prop_ro("counters", &M::counters)
      .def_prop_ro("capacity_pages", &M::capacity_pages)
      .def_prop_ro("pinned_pages_per_request", &M::pinned_pages_per_request)
      .def("contains", &M::contains)
      .def_prop_ro("admitted_count", &M::admitted_count)
      .def_prop_ro("claims", &M::claims)
      .def("claimed", &M::claimed)
      .def("reclaiming", &M::reclaiming)
      .def("ledger", &M::ledger, nb::arg("source"))
      .def("invariant_holds", &M::invariant_holds)
      .def("retiring_pages", &M::retiring_pages, nb::arg("source"))
      .def("optional_pages_of", &M::optional_pages_of, nb::arg("request"), nb::arg("source"))
      .def("imported_rows", &M::imported_rows, nb::arg("request"), nb::arg("source"))
      .def("reclaim_sequence", &M::reclaim_sequence)
      .def(
          "admit",
          [imports_of](M& mgr, request_id id, nb::handle history, std::optional<prefix_id> prefix) {
            bool dev = false;
            std::vector<in_array> arrays;
            const auto imports = imports_of(history, arrays, dev);
            return mgr.admit(id, imports, dev, prefix);
          },
          nb::arg("request"), nb::arg("history") = nb::none(), nb::arg("prefix") = nb::none(),
          "Resident-first admission; `history`: one uint8 array per source (CUDA arrays import from the "
          "device; they must stay valid until the call that admits), or None. With `prefix`, the request "
          "shares that retained prefix and `history` is only the suffix.")
      .def(
          "retain_prefix",
          [](M& mgr, prefix_id prefix, request_id id, std::optional<std::vector<std::int64_t>> rows) {
            return mgr.retain_prefix(prefix, id, rows ? &*rows : nullptr);
          },
          nb::arg("prefix"), nb::arg("request"), nb::arg("rows") = nb::none())
      .def("release_prefix", &M::release_prefix, nb::arg("prefix"))
      .def("withdraw", &M::withdraw, nb::arg("request"))
      .def(
          "append",
          [](M& mgr, request_id id, std::size_t source, nb::handle rows_obj, std::optional<std::size_t> count) {
            const auto r = import_rows_arg<L>(rows_obj, source, count);
            mgr.append(id, source, r.rows.data(), r.bytes, r.count, r.on_device);
          },
          nb::arg("request"), nb::arg("source"), nb::arg("rows"), nb::arg("count") = nb::none())
      .def("reserve_ahead", &M::reserve_ahead, nb::arg("rows_ahead"))
      .def(
          "append_step_view",
          [](M& mgr, nb::handle slots_obj, nb::handle rows_obj, nb::handle layers_obj, std::optional<nb::handle> first_obj,
             std::uint64_t row_stride, std::uint32_t rows_pitch, std::uint32_t max_rows, opt_stream backup) {
            using Ops = std::remove_reference_t<decltype(mgr.hierarchy())>;
            const write_arrays w("append_step_view", slots_obj, rows_obj, layers_obj, first_obj, Ops::step_layers(),
                                 rows_pitch == 0 ? 1 : std::size(L::sources), rows_pitch);
            mgr.append_step_view(w.slots_ptr(), w.rows_ptr(), w.first_ptr(), w.layers_ptr(), row_stride, rows_pitch,
                                 max_rows, w.capacity, backup.handle ? *backup.handle : mgr.step_stream());
          },
          nb::arg("slots"), nb::arg("rows"), nb::arg("layer_rows"), nb::arg("first") = nb::none(),
          nb::arg("row_stride") = 0, nb::arg("rows_pitch") = 0, nb::arg("max_rows") = 1, nb::arg("backup") = nb::none(),
          "One step's decode rows on every source through the manager, on its step stream (C++ "
          "append_step; arrays as Hierarchy.append_step_view; backup default: inline).")
      .def(
          "import_history",
          [](M& mgr, request_id id, std::size_t source, nb::handle rows_obj, std::optional<std::size_t> count,
             opt_stream s) {
            const auto r = import_rows_arg<L>(rows_obj, source, count);
            return mgr.import_history(id, source, r.rows.data(), r.bytes, r.count, r.on_device, default_stream(s, mgr.hierarchy().device()));
          },
          nb::arg("request"), nb::arg("source"), nb::arg("rows"), nb::arg("count") = nb::none(),
          nb::arg("stream") = nb::none(),
          "Streamed admission: the next rows of an admitted request's history on one source "
          "([payload layer][rows][row_bytes] uint8; a CUDA array is read in `stream`'s order, by default "
          "torch's current stream, where its producer wrote it); returns the pages mapped.")
      .def("complete", &M::complete, nb::arg("request"))
      .def("repopulate", &M::repopulate)
      .def("back_up", &M::back_up, nb::arg("max_pages"))
      .def("poll", &M::poll)
      .def("drain", &M::drain)
      .def("audit", &M::audit);
}

/// Binds cuda_pinned_store_ops<L> as `name` and cuda_interprocess_store_ops<L> as `ipc_name`: the
/// pinned stores of the CUDA ranks, with the host stores' inspection calls (store_bind.hpp).
template <class Layout>
void bind_cuda_stores(nb::module_& m, const char* name, const char* ipc_name, const char* layout_name) {
  using P = cuda_pinned_store_ops<Layout>;
  using I = cuda_interprocess_store_ops<Layout>;
  nb::class_<P> pinned(m, name, nb::is_weak_referenceable());
  pinned.def(nb::init<std::size_t, std::size_t, std::size_t>(), nb::arg("ranks"), nb::arg("host_pages"),
             nb::arg("request_capacity") = 0);
  def_store_books<Layout>(pinned, [](P& p) -> shared_host_store<Layout>& { return p.store(); }, layout_name, "cuda");

  nb::class_<I> ipc(m, ipc_name, nb::is_weak_referenceable());
  ipc.def_static("create", &I::create, nb::arg("name"), nb::arg("ranks"), nb::arg("host_pages"),
                 nb::arg("request_capacity") = 0)
      .def_static(
          "open",
          [](const std::string& store_name, std::int64_t timeout_ms) {
            const auto timeout = open_timeout(timeout_ms);
            nb::gil_scoped_release unlocked;  // waits for the creator
            return I::open(store_name, timeout.count());
          },
          nb::arg("name"), nb::arg("timeout_ms") = interprocess_host_store<Layout>::default_open_timeout.count());
  def_store_books<Layout>(ipc, [](I& s) -> shared_host_store<Layout>& { return s.store(); }, layout_name, "cuda");
  def_interprocess_calls<Layout>(ipc, [](I& s) -> interprocess_host_store<Layout>& { return s.store(); });
}

/// Binds the CUDA hierarchy and its four residency managers of `Layout` with hot cache `B`.
template <class Layout, std::size_t B>
void bind_cuda_layout(nb::module_& m, const char* layout_name) {
  const std::string base = std::string("_") + layout_name;
  static const std::string hname = "CudaHierarchy" + base;
  static const std::string fixed = "CudaResidencyManager" + base + "_fixed_budget";
  static const std::string mra = "CudaResidencyManager" + base + "_adaptive_mra";
  static const std::string lra = "CudaResidencyManager" + base + "_adaptive_lra";
  static const std::string res = "CudaResidencyManager" + base + "_resident";
  static const std::string shared = "CudaSharedHostStore" + base;
  static const std::string ipc = "CudaInterprocessHostStore" + base;
  bind_cuda_stores<Layout>(m, shared.c_str(), ipc.c_str(), layout_name);
  bind_cuda_hierarchy<cuda_hierarchy_ops<Layout, B>>(m, hname.c_str(), layout_info<Layout>(layout_name));
  bind_cuda_manager<cuda_manager_ops<Layout, B, fixed_budget_policy>>(m, fixed.c_str(), fixed_budget_policy::name);
  bind_cuda_manager<cuda_manager_ops<Layout, B, adaptive_policy<>>>(m, mra.c_str(), adaptive_policy<>::name);
  using lra_policy = adaptive_policy<reclaim_order::least_recent_first>;
  bind_cuda_manager<cuda_manager_ops<Layout, B, lra_policy>>(m, lra.c_str(), lra_policy::name);
  bind_cuda_manager<cuda_manager_ops<Layout, B, resident_policy>>(m, res.c_str(), resident_policy::name);
}

}  // namespace dhisparse::python
