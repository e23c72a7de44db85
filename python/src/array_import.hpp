#pragma once
// Turning a Python array into a pointer without copying, and without the cost of `__dlpack__`
// where the producer offers better.
//
// `tensor.__dlpack__()` is a Python-level call: about 3-4 µs per array for torch, so a resolve
// that takes four arrays spent about 15 µs importing them. DLPack 1.3's C exchange API lets a
// producer (torch from 2.10) publish C functions on its tensor *type*, as a PyCapsule named
// "dlpack_exchange_api" in `__dlpack_c_exchange_api__`: one of them fills a caller-owned DLTensor
// without touching the interpreter or the reference count, another reports the framework's
// current stream. The binding uses them when offered and falls back to `__dlpack__` otherwise.
#include <cstdint>
#include <string>

#include "common.hpp"

namespace dhisparse::python {

/// The DLPack C exchange API (DLPack 1.3), declared here so that the binding does not depend on a
/// particular dlpack.h. Only the members the binding calls are typed.
struct dlpack_exchange_api {
  struct version_t {
    std::uint32_t major;
    std::uint32_t minor;
  };
  struct header_t {
    version_t version;
    const header_t* prev_api;  ///< an older version of the table, or null
  };
  /// DLManagedTensorVersioned: an owned description with flags (bit 0: read-only).
  struct managed_tensor_t {
    version_t version;
    void* manager_ctx;
    void (*deleter)(managed_tensor_t* self);
    std::uint64_t flags;
    nb::dlpack::dltensor dl_tensor;
  };
  static constexpr std::uint64_t flag_read_only = 1;
  header_t header;
  void* managed_tensor_allocator;
  /// Describes `py_object` in a new owned tensor (the caller calls its deleter); 0 on success, -1
  /// with a Python exception set.
  int (*managed_tensor_from_py_object_no_sync)(void* py_object, managed_tensor_t** out);
  void* managed_tensor_to_py_object_no_sync;
  /// Describes `py_object` in `out` (non-owning: valid while the object lives, unchanged); 0 on
  /// success, -1 with a Python exception set. Optional (may be null).
  int (*dltensor_from_py_object_no_sync)(void* py_object, nb::dlpack::dltensor* out);
  /// The framework's current stream of a device; 0 on success, -1 with a Python exception set.
  int (*current_work_stream)(std::int32_t device_type, std::int32_t device_id, void** out_stream);
};

/// The exchange API of objects of `type` (major version 1, the one declared above), or null when
/// the type offers none. Looked up once per type (cached; the GIL serialises callers).
const dlpack_exchange_api* exchange_api_of(PyTypeObject* type);

/// The exchange API of `capsule` (a "dlpack_exchange_api" PyCapsule), or null when it is not one
/// or has no version-1 table.
const dlpack_exchange_api* exchange_api_from_capsule(PyObject* capsule);

/// Raises the producer's exception after an exchange-API call returned non-zero (or a TypeError
/// when it set none).
[[noreturn]] inline void raise_exchange_refusal() {
  if (PyErr_Occurred() != nullptr) throw nb::python_error();
  throw nb::type_error("the array's DLPack exchange API refused it without saying why");
}

/// `A` (an nb::ndarray) over the memory `t` describes, owned by `obj`; false for an ndim past 8.
template <class A>
bool ndarray_from_dltensor(const nb::dlpack::dltensor& t, nb::handle obj, A& out) {
  constexpr int max_ndim = 8;
  if (t.ndim < 0 || t.ndim > max_ndim) return false;  // unusual: leave it to __dlpack__
  std::size_t shape[max_ndim];
  for (int d = 0; d < t.ndim; ++d) shape[d] = static_cast<std::size_t>(t.shape[d]);
  // The byte offset is folded into the pointer: for CPU and CUDA memory it is an address offset.
  out = A(static_cast<char*>(t.data) + t.byte_offset, static_cast<std::size_t>(t.ndim), shape, obj, t.strides,
          t.dtype, t.device.device_type, t.device.device_id);
  return true;
}

/// Imports `obj` as `A` (an nb::ndarray) through the exchange API of its type. Returns false when
/// the type offers none, or when `A` is writable and the producer marks the array read-only (the
/// caller falls back to `__dlpack__`, whose import refuses it); raises the producer's exception
/// when it refuses the object. A read-only `A` takes the non-owning description; a writable one
/// the owned one, whose flags say whether the array may be written.
template <class A>
bool import_through_exchange_api(nb::handle obj, A& out) {
  const dlpack_exchange_api* api = exchange_api_of(Py_TYPE(obj.ptr()));
  if (api == nullptr) return false;
  if constexpr (A::ReadOnly) {
    if (api->dltensor_from_py_object_no_sync == nullptr) return false;
    nb::dlpack::dltensor t;
    if (api->dltensor_from_py_object_no_sync(obj.ptr(), &t) != 0) raise_exchange_refusal();
    return ndarray_from_dltensor(t, obj, out);
  } else {
    if (api->managed_tensor_from_py_object_no_sync == nullptr) return false;
    dlpack_exchange_api::managed_tensor_t* m = nullptr;
    if (api->managed_tensor_from_py_object_no_sync(obj.ptr(), &m) != 0) raise_exchange_refusal();
    struct release {
      dlpack_exchange_api::managed_tensor_t* m;
      ~release() {
        if (m != nullptr && m->deleter != nullptr) m->deleter(m);
      }
    } guard{m};
    if (m == nullptr || (m->flags & dlpack_exchange_api::flag_read_only) != 0) return false;
    return ndarray_from_dltensor(m->dl_tensor, obj, out);  // `obj` keeps the memory alive
  }
}

/// Imports an array without a copy and without a stream sync: through the exchange API of its
/// type when offered, else through `__dlpack__`. Called with no stream, `__dlpack__` (torch, the
/// array API) makes the legacy default stream wait for the current one: an event per array per
/// call, and an error inside a graph capture. `stream=-1` asks for no synchronisation; ordering is
/// the caller's, through the `stream` argument of each call. Other arrays are imported as given.
template <class A>
A import_array(nb::handle obj, const char* name, bool* through_exchange_api = nullptr) {
  A a;
  const bool fast = import_through_exchange_api(obj, a);
  if (through_exchange_api != nullptr) *through_exchange_api = fast;
  if (fast) return a;
  nb::object src = nb::borrow(obj);
  if (nb::hasattr(obj, "__dlpack_device__")) {
    const auto dev = nb::cast<nb::tuple>(obj.attr("__dlpack_device__")());
    const int type = nb::cast<int>(dev[0]);
    if (type == nb::device::cuda::value || type == nb::device::cuda_managed::value) {
      try {
        src = obj.attr("__dlpack__")(nb::arg("stream") = -1);
      } catch (const nb::python_error&) {
        src = nb::borrow(obj);  // a producer without stream=-1: its own default behaviour
      }
    }
  }
  if (!nb::try_cast(src, a))
    throw nb::type_error((std::string(name) + ": expected an array (DLPack or the buffer protocol)").c_str());
  return a;
}

/// The current stream of CUDA device `device` in the framework registered with `_set_stream_api`
/// (torch's, once the package has seen torch imported): true and `stream` set, or false when none
/// is registered. Raises the framework's exception when it fails.
bool framework_current_stream(int device, std::uintptr_t& stream);
/// Forgets the registered framework (calls given no stream go back to the stream provider).
void clear_framework_stream_api();

/// Registers `_set_stream_api` and `_array_import` (a test hook: how an object is imported and
/// what it describes).
void bind_array_import(nb::module_& m);

}  // namespace dhisparse::python
