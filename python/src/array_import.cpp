// The DLPack C exchange API on the consumer side: finding a producer's table, and the framework's
// current stream through it (array_import.hpp says why).
#include "array_import.hpp"

#include <array>

namespace dhisparse::python {

namespace {

constexpr const char* exchange_capsule_name = "dlpack_exchange_api";
/// DLPack's device type of CUDA memory (kDLCUDA).
constexpr std::int32_t dlpack_cuda = 2;

/// The framework whose current stream serves calls given none (set from Python once torch is
/// imported), and the capsule that keeps its table alive.
const dlpack_exchange_api* stream_api = nullptr;
nb::object stream_api_capsule;

}  // namespace

const dlpack_exchange_api* exchange_api_from_capsule(PyObject* capsule) {
  if (!PyCapsule_IsValid(capsule, exchange_capsule_name)) return nullptr;
  const auto* h = static_cast<const dlpack_exchange_api::header_t*>(PyCapsule_GetPointer(capsule, exchange_capsule_name));
  // A newer major version may chain the older tables it still offers.
  while (h != nullptr && h->version.major != 1) h = h->prev_api;
  return reinterpret_cast<const dlpack_exchange_api*>(h);
}

const dlpack_exchange_api* exchange_api_of(PyTypeObject* type) {
  struct entry {
    PyTypeObject* type;
    PyObject* capsule;  // kept alive: the table it points to must outlive the cache entry
    const dlpack_exchange_api* api;
  };
  // A handful of array types reach a binding (torch's, numpy's, CuPy's...): a short list suffices,
  // and a type past its end is looked up on every call, which is only slower.
  static std::array<entry, 16> cache{};
  static std::size_t used = 0;
  for (std::size_t i = 0; i < used; ++i)
    if (cache[i].type == type) return cache[i].api;
  PyObject* capsule = PyObject_GetAttrString(reinterpret_cast<PyObject*>(type), "__dlpack_c_exchange_api__");
  if (capsule == nullptr) {
    if (!PyErr_ExceptionMatches(PyExc_AttributeError)) throw nb::python_error();  // not "absent"
    PyErr_Clear();
  }
  const dlpack_exchange_api* api = capsule ? exchange_api_from_capsule(capsule) : nullptr;
  if (used < cache.size()) {
    Py_INCREF(type);  // the entry's key must not be freed and reused by another type
    cache[used++] = {type, capsule, api};
  } else {
    Py_XDECREF(capsule);
  }
  return api;
}

bool framework_current_stream(int device, std::uintptr_t& stream) {
  if (stream_api == nullptr) return false;
  void* s = nullptr;
  if (stream_api->current_work_stream(dlpack_cuda, device, &s) != 0) raise_exchange_refusal();
  stream = reinterpret_cast<std::uintptr_t>(s);
  return true;
}

void clear_framework_stream_api() {
  stream_api = nullptr;
  stream_api_capsule = nb::object();
}

void bind_array_import(nb::module_& m) {
  m.def(
      "_set_stream_api",
      [](nb::object capsule) {
        const dlpack_exchange_api* api = capsule.is_none() ? nullptr : exchange_api_from_capsule(capsule.ptr());
        if (api != nullptr && api->current_work_stream == nullptr) api = nullptr;
        stream_api = api;
        stream_api_capsule = api ? capsule : nb::object();
        return api != nullptr;
      },
      nb::arg("capsule").none(),
      "Uses the current_work_stream of a DLPack exchange-API capsule (torch.Tensor.__dlpack_c_exchange_api__) "
      "for calls given no stream; None goes back to the stream provider. Returns whether it was taken.");
  m.def(
      "_array_import",
      [](nb::handle obj, bool writable) {
        bool fast = false;
        const nb::ndarray<nb::ro> a = writable ? nb::ndarray<nb::ro>(import_array<nb::ndarray<>>(obj, "array", &fast))
                                               : import_array<nb::ndarray<nb::ro>>(obj, "array", &fast);
        nb::list shape, strides;
        for (std::size_t d = 0; d < a.ndim(); ++d) {
          shape.append(a.shape(d));
          strides.append(a.stride(d));
        }
        nb::dict d;
        d["path"] = fast ? "exchange" : "dlpack";
        d["data"] = reinterpret_cast<std::uintptr_t>(a.data());
        d["shape"] = nb::tuple(shape);
        d["strides"] = nb::tuple(strides);
        d["dtype"] = nb::make_tuple(a.dtype().code, a.dtype().bits, a.dtype().lanes);
        d["device"] = nb::make_tuple(a.device_type(), a.device_id());
        return d;
      },
      nb::arg("obj"), nb::arg("writable") = false,
      "Test hook: how the binding's import_array takes `obj` (as an input, or as an array it writes) and what it "
      "sees (path, data, shape, strides, dtype, device).");
  // Drop the capsule before the interpreter tears the module down.
  nb::module_::import_("atexit").attr("register")(nb::cpp_function([] { clear_framework_stream_api(); }));
}

}  // namespace dhisparse::python
