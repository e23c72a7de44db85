#pragma once
// Binders of the host stores that tensor-parallel ranks share (docs/multi-gpu.md): the books'
// inspection calls common to every store class, and the interprocess store's name, rank and
// lifetime calls. Shared by both backends: a CUDA store class (cuda_ops.hpp) is bound with an
// accessor that hands out its shared_host_store / interprocess_host_store.
#include <chrono>
#include <cstdint>
#include <memory>

#include <nanobind/stl/unique_ptr.h>

#include <dhisparse/host/interprocess_host_store.hpp>
#include <dhisparse/host/shared_host_store.hpp>

#include "common.hpp"

namespace dhisparse::python {

/// The calls every shared host store answers; `get(obj)` is the object's shared_host_store<L>&.
/// The C++ store is not bound as a Python base class: an interprocess store's shared_host_store
/// part does not start at the object's address, which nanobind's single inheritance assumes.
template <KvLayout L, class C, class Get>
void def_store_books(nb::class_<C>& cls, Get get, const char* layout_name, const char* backend) {
  using S = shared_host_store<L>;
  cls.def_prop_ro_static("layout", [layout_name](nb::handle) { return layout_info<L>(layout_name); })
      .def_prop_ro_static("backend", [backend](nb::handle) { return backend; })
      .def_prop_ro_static("max_ranks", [](nb::handle) { return S::max_ranks; })
      .def_prop_ro("ranks", [get](C& c) { return get(c).ranks(); })
      .def_prop_ro("host_pages", [get](C& c) { return get(c).host_pages(); }, "Host pages per source.")
      .def_prop_ro("request_capacity", [get](C& c) { return get(c).request_capacity(); },
                   "Requests the store holds at once (first rank's admit to last rank's complete).")
      .def("owner", [get](C& c, std::size_t page) { return get(c).owner(page); }, nb::arg("page"),
           "The rank that writes history page `page`'s host copy: page mod ranks.")
      .def_prop_ro("host_store_bytes", [get](C& c) { return get(c).host_store_bytes(); },
                   "Bytes of every source's store, used or not.")
      .def_prop_ro("host_bytes_in_use", [get](C& c) { return get(c).host_bytes_in_use(); },
                   "Bytes of the host pages allocated now: one copy of each attached request's history.")
      .def("free_host_pages", [get](C& c, std::size_t source) { return get(c).free_host_pages(source); },
           nb::arg("source"))
      .def(
          "host_page", [get](C& c, request_id id, std::size_t source, std::size_t page) {
            return get(c).host_page(id, source, page);
          },
          nb::arg("request"), nb::arg("source"), nb::arg("page"),
          "Host page of history page `page` of a request on a source; -1 when no rank has one.")
      .def(
          "page_holders", [get](C& c, std::size_t source, page_id page) { return get(c).page_holders(source, page); },
          nb::arg("source"), nb::arg("page"), "Ranks holding a host page, as a mask (bit r: rank r).")
      .def("attached_ranks", [get](C& c, request_id id) { return get(c).attached_ranks(id); }, nb::arg("request"),
           "Ranks attached to a request, as a mask (0: none).")
      .def_prop_ro("requests", [get](C& c) { return get(c).requests(); },
                   "Requests at least one rank is attached to.")
      .def(
          "has_host_copy", [get](C& c, request_id id, std::size_t source, row_index row) {
            return get(c).has_host_copy(id, source, row);
          },
          nb::arg("request"), nb::arg("source"), nb::arg("row"),
          "True when a row's owner has written its host copy.")
      .def("rows_written", [get](C& c, std::size_t rank) { return get(c).rows_written(rank); }, nb::arg("rank"),
           "Rows (every payload layer of a source counts once) a rank wrote to the store.")
      .def("bytes_written", [get](C& c, std::size_t rank) { return get(c).bytes_written(rank); }, nb::arg("rank"));
}

/// The interprocess store's own calls; `get(obj)` is the object's interprocess_host_store<L>&.
template <KvLayout L, class C, class Get>
void def_interprocess_calls(nb::class_<C>& cls, Get get) {
  using S = interprocess_host_store<L>;
  cls.def_prop_ro("name", [get](C& c) { return get(c).name(); }, "The shared memory name (\"/name\").")
      .def_prop_ro("creator", [get](C& c) { return get(c).creator(); },
                   "True for the object that created the store; it unlinks the name when freed.")
      .def("rank_bound", [get](C& c, std::size_t rank) { return get(c).rank_bound(rank); }, nb::arg("rank"),
           "True when a rank has a hierarchy, in any process.")
      .def("reclaim_rank", [get](C& c, std::size_t rank) { get(c).reclaim_rank(rank); }, nb::arg("rank"),
           "Gives back the rank, page holds and attachments of a rank whose process died. Never for a "
           "rank a live hierarchy holds.")
      .def_static("remove", [](const std::string& name) { return S::remove(name); }, nb::arg("name"),
                  "Unlinks a store's name (one whose creator died); True when it existed.")
      .def_static(
          "mapping_bytes", [](std::size_t ranks, std::size_t host_pages, std::size_t request_capacity) {
            return S::mapping_bytes(ranks, host_pages, request_capacity);
          },
          nb::arg("ranks"), nb::arg("host_pages"), nb::arg("request_capacity") = 0,
          "Bytes of shared memory a store of this layout and shape takes.");
}

/// `open`'s wait as the library's duration; the GIL is released around the wait by the callers.
inline std::chrono::milliseconds open_timeout(std::int64_t ms) {
  if (ms < 0) throw invalid_configuration("open: timeout_ms must be >= 0, got " + std::to_string(ms));
  return std::chrono::milliseconds(ms);
}

/// Binds shared_host_store<L> as `name` and interprocess_host_store<L> as `ipc_name` (host backend).
template <KvLayout L>
void bind_host_stores(nb::module_& m, const char* name, const char* ipc_name, const char* layout_name) {
  using S = shared_host_store<L>;
  using I = interprocess_host_store<L>;
  nb::class_<S> shared(m, name, nb::is_weak_referenceable());
  shared.def(nb::init<std::size_t, std::size_t, std::size_t>(), nb::arg("ranks"), nb::arg("host_pages"),
             nb::arg("request_capacity") = 0);
  def_store_books<L>(shared, [](S& s) -> S& { return s; }, layout_name, "host");

  nb::class_<I> ipc(m, ipc_name, nb::is_weak_referenceable());
  ipc.def_static(
         "create",
         [](const std::string& store_name, std::size_t ranks, std::size_t host_pages, std::size_t request_capacity) {
           return std::make_unique<I>(typename I::create_t{}, store_name, ranks, host_pages, request_capacity);
         },
         nb::arg("name"), nb::arg("ranks"), nb::arg("host_pages"), nb::arg("request_capacity") = 0)
      .def_static(
          "open",
          [](const std::string& store_name, std::int64_t timeout_ms) {
            const auto timeout = open_timeout(timeout_ms);
            nb::gil_scoped_release unlocked;  // waits for the creator, maybe in this process's other thread
            return std::make_unique<I>(typename I::open_t{}, store_name, timeout);
          },
          nb::arg("name"), nb::arg("timeout_ms") = I::default_open_timeout.count());
  def_store_books<L>(ipc, [](I& s) -> S& { return s; }, layout_name, "host");
  def_interprocess_calls<L>(ipc, [](I& s) -> I& { return s; });
}

}  // namespace dhisparse::python
