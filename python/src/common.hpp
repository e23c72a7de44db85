#pragma once
// Shared by every binding translation unit: nanobind, the array checks that turn a DLPack /
// buffer-protocol array into a pointer without copying, and the binders each layout TU calls.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <dhisparse/errors.hpp>
#include <dhisparse/hierarchy_types.hpp>
#include <dhisparse/layout.hpp>
#include <dhisparse/types.hpp>

namespace dhisparse::python {

namespace nb = nanobind;

/// Any array that nanobind can import without a copy (DLPack or buffer protocol); read-only allowed.
using in_array = nb::ndarray<nb::ro>;
/// An array the call writes into (must be writable).
using out_array = nb::ndarray<>;

/// Where an array must live.
enum class where { cpu, cuda };

/// Checks dtype, device and C-contiguity of `a`; raises TypeError for the wrong dtype or device,
/// dhisparse size_mismatch for a non-contiguous array (nothing is copied, so a strided array
/// cannot be passed on).
template <class T, class Array>
void check_array(const Array& a, const char* name, where w) {
  if (a.dtype() != nb::dtype<T>())
    throw nb::type_error((std::string(name) + ": expected dtype " +
                          (std::is_same_v<T, std::int32_t>    ? "int32"
                           : std::is_same_v<T, std::uint8_t>  ? "uint8"
                           : std::is_same_v<T, std::uint32_t> ? "uint32"
                                                              : "int64"))
                             .c_str());
  const bool on_cuda = a.device_type() == nb::device::cuda::value;
  const bool on_cpu = a.device_type() == nb::device::cpu::value;
  if (w == where::cpu && !on_cpu)
    throw nb::type_error((std::string(name) + ": expected a CPU array (host backend)").c_str());
  if (w == where::cuda && !on_cuda)
    throw nb::type_error((std::string(name) + ": expected a CUDA array (CUDA backend)").c_str());
  std::int64_t expect = 1;
  for (std::size_t d = a.ndim(); d-- > 0;) {
    if (a.shape(d) != 1 && a.stride(d) != expect)
      throw size_mismatch(std::string(name) + " must be C-contiguous (no copy is made)");
    expect *= static_cast<std::int64_t>(a.shape(d));
  }
}

/// Number of elements of `a`.
template <class Array>
std::size_t elements(const Array& a) {
  std::size_t n = 1;
  for (std::size_t d = 0; d < a.ndim(); ++d) n *= a.shape(d);
  return n;
}

/// Shape of `a` as text, for messages.
template <class Array>
std::string shape_of(const Array& a) {
  std::string s = "[";
  for (std::size_t d = 0; d < a.ndim(); ++d) s += (d ? ", " : "") + std::to_string(a.shape(d));
  return s + "]";
}

/// Rows of a `[payload layer][count][row_bytes]` uint8 array: `count` given, or derived from the
/// byte size (size_mismatch when that is not a whole number of rows; a given count is checked by
/// the library).
inline std::size_t rows_count(std::size_t bytes, std::optional<std::size_t> count, const source_desc& d) {
  if (count) return *count;
  const std::size_t row = d.payload_layers * d.row_bytes;
  if (bytes % row != 0)  // else the library would see a wrong count and a confusing byte mismatch
    throw size_mismatch("rows: " + std::to_string(bytes) + " bytes is not a whole number of rows of " +
                        std::to_string(d.payload_layers) + " payload layers x " + std::to_string(d.row_bytes) +
                        " bytes (" + std::to_string(row) + " bytes a row)");
  return bytes / row;
}

/// The request ids of a batched call.
using request_list = std::vector<request_id>;

/// A `stream=` argument of a CUDA call: None (the call's default stream), an int cudaStream_t
/// handle, or a stream object: torch.cuda.Stream (its `cuda_stream`) or a CuPy stream (its `ptr`).
struct stream_arg {
  std::optional<std::uintptr_t> handle;
};

/// Registers the exception classes and the translator (module.cpp).
void bind_errors(nb::module_& m);
/// The shared value types: configs, stats, admissions, ledgers, enums (module.cpp).
void bind_types(nb::module_& m);
/// Stream used when a CUDA call on an object of `device` is given none: the provider installed by
/// the Python package (torch's current stream of that device when torch is imported), else 0
/// (module.cpp). Per device, because an object takes only streams of its own GPU (wrong_device).
std::uintptr_t default_stream(std::optional<std::uintptr_t> given, int device);
inline std::uintptr_t default_stream(const stream_arg& given, int device) { return default_stream(given.handle, device); }

/// Layout facts as a dict (top_k, page_rows, sources: [{row_bytes, positions_per_row, payload_layers}]).
template <KvLayout L>
nb::dict layout_info(const char* name) {
  nb::dict d;
  d["name"] = name;
  d["top_k"] = L::top_k;
  d["page_rows"] = L::page_rows;
  nb::list sources;
  for (const auto& s : L::sources) {
    nb::dict sd;
    sd["row_bytes"] = s.row_bytes;
    sd["positions_per_row"] = s.positions_per_row;
    sd["payload_layers"] = s.payload_layers;
    sd["index_key_bytes"] = s.index_key_bytes;
    sources.append(sd);
  }
  d["sources"] = sources;
  return d;
}

// One binder per layout and backend; each is defined in its own translation unit so that they
// compile in parallel (CMakeLists.txt instantiates layout_host.cpp / layout_cuda*.{cpp,cu} per layout).
void bind_host_tiny(nb::module_& m);
void bind_host_glm53(nb::module_& m);
void bind_host_deepseek_v41_flash(nb::module_& m);
#ifdef DHISPARSE_PY_CUDA
void bind_cuda_tiny(nb::module_& m);
void bind_cuda_glm53(nb::module_& m);
void bind_cuda_deepseek_v41_flash(nb::module_& m);
#endif

}  // namespace dhisparse::python

namespace nanobind::detail {

/// stream_arg from None, an integer (Python's or one with __index__, e.g. numpy's), an object with
/// the CUDA stream protocol (`__cuda_stream__()` -> (version, handle)), torch's `cuda_stream`, or
/// the `ptr` of a CuPy stream (a type named ...Stream).
template <>
struct type_caster<dhisparse::python::stream_arg> {
  NB_TYPE_CASTER(dhisparse::python::stream_arg, const_name("int | Stream | None"))

  /// `o` as a handle: an integer in [0, 2^64), not a bool.
  static bool handle_of(PyObject* o, std::uintptr_t& out) noexcept {
    if (PyBool_Check(o) || !PyIndex_Check(o)) return false;
    PyObject* i = PyNumber_Index(o);
    if (i == nullptr) {
      PyErr_Clear();
      return false;
    }
    const unsigned long long v = PyLong_AsUnsignedLongLong(i);
    Py_DECREF(i);
    if (v == static_cast<unsigned long long>(-1) && PyErr_Occurred() != nullptr) {
      PyErr_Clear();  // negative or too large: not a handle
      return false;
    }
    out = static_cast<std::uintptr_t>(v);
    return true;
  }

  /// The handle in attribute `attr` of `o` (called first when `call`).
  static bool handle_in(PyObject* o, const char* attr, bool call, std::uintptr_t& out) noexcept {
    PyObject* a = PyObject_GetAttrString(o, attr);
    if (a == nullptr) {
      PyErr_Clear();
      return false;
    }
    if (call) {
      PyObject* r = PyObject_CallNoArgs(a);
      Py_DECREF(a);
      if (r == nullptr) {
        PyErr_Clear();
        return false;
      }
      a = r;
      if (PyTuple_Check(a) && PyTuple_Size(a) == 2) {  // (version, handle)
        PyObject* h = PyTuple_GetItem(a, 1);
        const bool ok = handle_of(h, out);
        Py_DECREF(a);
        return ok;
      }
    }
    const bool ok = handle_of(a, out);
    Py_DECREF(a);
    return ok;
  }

  bool from_python(handle src, uint32_t, cleanup_list*) noexcept {
    if (src.is_none()) {
      value.handle.reset();
      return true;
    }
    std::uintptr_t h = 0;
    PyObject* o = src.ptr();
    const bool ok = handle_of(o, h) || handle_in(o, "__cuda_stream__", true, h) || handle_in(o, "cuda_stream", false, h) ||
                    (std::strstr(Py_TYPE(o)->tp_name, "Stream") != nullptr && handle_in(o, "ptr", false, h));
    if (ok) value.handle = h;
    return ok;
  }

  static handle from_cpp(const dhisparse::python::stream_arg& s, rv_policy, cleanup_list*) noexcept {
    if (!s.handle) return none().release();
    return PyLong_FromUnsignedLongLong(static_cast<unsigned long long>(*s.handle));
  }
};

}  // namespace nanobind::detail
