"""Array import through the DLPack C exchange API (what torch >= 2.10 publishes on its tensor type).

A producer written here with ctypes publishes the API over numpy arrays; the tests check that the
binding takes the fast path when it is offered, describes the same memory as the `__dlpack__`
path, passes the producer's refusal on, falls back when the table is absent or of another major
version, and asks the producer for its current stream when registered for it.
"""
import ctypes

import numpy as np
import pytest

import dhisparse
from conftest import History, check_rows
from dhisparse import _core


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class Header(ctypes.Structure):
    pass


Header._fields_ = [("version", Version), ("prev_api", ctypes.POINTER(Header))]

FROM_PY = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(DLTensor))
CURRENT_STREAM = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int32, ctypes.c_int32, ctypes.POINTER(ctypes.c_void_p))


class ManagedTensor(ctypes.Structure):
    pass


DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(ManagedTensor))
ManagedTensor._fields_ = [
    ("version", Version),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", DELETER),
    ("flags", ctypes.c_uint64),
    ("dl_tensor", DLTensor),
]
MANAGED_FROM_PY = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.POINTER(ManagedTensor)))


class ExchangeApi(ctypes.Structure):
    _fields_ = [
        ("header", Header),
        ("managed_tensor_allocator", ctypes.c_void_p),
        ("managed_tensor_from_py_object_no_sync", MANAGED_FROM_PY),
        ("managed_tensor_to_py_object_no_sync", ctypes.c_void_p),
        ("dltensor_from_py_object_no_sync", FROM_PY),
        ("current_work_stream", CURRENT_STREAM),
    ]


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)
_CODES = {"i": 0, "u": 1, "f": 2}
_KEEP = []  # names, tables and callbacks the capsules point to
_LIVE = {}  # managed tensors handed out and not yet deleted, by address


def _describe(t, o):
    """Fills DLTensor `o` from the producer tensor `t` (its numpy array); False to refuse."""
    if t.refuse:  # (ctypes cannot leave a Python exception set on return: a silent refusal)
        return False
    a = t.array
    t._shape = (ctypes.c_int64 * max(1, a.ndim))(*a.shape)
    t._strides = (ctypes.c_int64 * max(1, a.ndim))(*(s // a.itemsize for s in a.strides))
    o.data = a.ctypes.data - t.byte_offset
    o.device = DLDevice(1, 0)  # kDLCPU
    o.ndim = a.ndim
    o.dtype = DLDataType(_CODES[a.dtype.kind], a.dtype.itemsize * 8, 1)
    o.shape = t._shape
    o.strides = None if t.null_strides else t._strides  # NULL: compact row-major
    o.byte_offset = t.byte_offset
    return True


def _from_py(obj_ptr, out):
    return 0 if _describe(ctypes.cast(obj_ptr, ctypes.py_object).value, out.contents) else -1


def _delete(m):
    _LIVE.pop(ctypes.addressof(m.contents))


def _managed_from_py(obj_ptr, out):
    t = ctypes.cast(obj_ptr, ctypes.py_object).value
    m = ManagedTensor()
    if not _describe(t, m.dl_tensor):
        return -1
    m.version = Version(1, 3)
    m.deleter = _DELETE
    m.flags = 1 if t.read_only else 0  # DLPACK_FLAG_BITMASK_READ_ONLY
    _LIVE[ctypes.addressof(m)] = (m, t)
    out[0] = ctypes.pointer(m)
    return 0


def _current_stream(device_type, device_id, out):
    out[0] = 0x1000 + 16 * device_id + device_type
    return 0


_DELETE = DELETER(_delete)


def make_capsule(major=1, prev=None, name=b"dlpack_exchange_api", from_py=True):
    api = ExchangeApi()
    api.header.version = Version(major, 3)
    if prev is not None:
        api.header.prev_api = ctypes.pointer(prev.header)
    from_cb = FROM_PY(_from_py) if from_py else FROM_PY()
    managed_cb = MANAGED_FROM_PY(_managed_from_py) if from_py else MANAGED_FROM_PY()
    stream_cb = CURRENT_STREAM(_current_stream)
    api.dltensor_from_py_object_no_sync = from_cb
    api.managed_tensor_from_py_object_no_sync = managed_cb
    api.current_work_stream = stream_cb
    cname = ctypes.create_string_buffer(name)
    _KEEP.extend([api, from_cb, managed_cb, stream_cb, cname, prev])
    return _capsule_new(ctypes.addressof(api), cname, None), api


def producer(capsule):
    """A tensor type over a numpy array that publishes `capsule` and also speaks `__dlpack__`."""

    class Tensor:
        __dlpack_c_exchange_api__ = capsule

        def __init__(self, array, byte_offset=0, read_only=False, null_strides=False):
            self.array = array
            self.byte_offset = byte_offset
            self.read_only = read_only
            self.null_strides = null_strides
            self.refuse = False

        def __dlpack__(self, **kwargs):
            return self.array.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return self.array.__dlpack_device__()

    return Tensor


V1, V1_TABLE = make_capsule()


def test_fast_path_describes_the_same_memory_as_dlpack():
    Tensor = producer(V1)
    base = np.arange(4 * 6, dtype=np.int32).reshape(4, 6)
    for a in (base, base[1:3], base[:, ::2], np.zeros((0, 5), np.uint8), np.arange(7, dtype=np.uint32)):
        fast = _core._array_import(Tensor(a))
        slow = _core._array_import(a)
        assert fast["path"] == "exchange" and slow["path"] == "dlpack"
        for key in ("data", "shape", "strides", "dtype", "device"):
            assert fast[key] == slow[key], key
        assert fast["data"] == a.ctypes.data
        assert fast["shape"] == a.shape
        assert fast["strides"] == tuple(s // a.itemsize for s in a.strides)


def test_byte_offset_is_folded_into_the_pointer():
    Tensor = producer(V1)
    a = np.arange(16, dtype=np.int32)
    got = _core._array_import(Tensor(a[4:], byte_offset=16))
    assert got["path"] == "exchange" and got["data"] == a[4:].ctypes.data


def test_the_producers_refusal_is_raised():
    Tensor = producer(V1)
    t = Tensor(np.zeros(3, np.int32))
    t.refuse = True
    with pytest.raises(TypeError, match="exchange API refused it"):
        _core._array_import(t)


def test_tables_that_do_not_fit_fall_back_to_dlpack():
    a = np.arange(6, dtype=np.int32)
    wrong_name, _ = make_capsule(name=b"not_the_api")
    newer, _ = make_capsule(major=2)
    no_tensor_fn, _ = make_capsule(from_py=False)
    for capsule in (wrong_name, newer, no_tensor_fn, 7, None):
        got = _core._array_import(producer(capsule)(a))
        assert got["path"] == "dlpack" and got["data"] == a.ctypes.data


def test_a_newer_table_chaining_version_1_is_used():
    newer, _ = make_capsule(major=2, prev=V1_TABLE)
    a = np.arange(6, dtype=np.int32)
    got = _core._array_import(producer(newer)(a))
    assert got["path"] == "exchange" and got["data"] == a.ctypes.data


def test_writable_arrays_take_the_owned_description_and_respect_read_only():
    Tensor = producer(V1)
    a = np.arange(12, dtype=np.int32).reshape(3, 4)
    got = _core._array_import(Tensor(a), writable=True)
    assert got["path"] == "exchange" and got["data"] == a.ctypes.data and got["shape"] == (3, 4)
    assert not _LIVE  # the owned description was deleted once
    # A producer that marks the array read-only: not written through the fast path (the fallback's
    # import decides; numpy's own array here is writable).
    got = _core._array_import(Tensor(a, read_only=True), writable=True)
    assert got["path"] == "dlpack" and got["data"] == a.ctypes.data
    assert not _LIVE
    # Inputs take the non-owning description whatever the flag.
    assert _core._array_import(Tensor(a, read_only=True))["path"] == "exchange"


def test_unusual_shapes():
    Tensor = producer(V1)
    a = np.arange(12, dtype=np.int32).reshape(3, 4)
    got = _core._array_import(Tensor(a, null_strides=True))  # NULL strides: compact row-major
    assert got["path"] == "exchange" and got["strides"] == (4, 1)
    scalar = np.array(7, dtype=np.int32)
    got = _core._array_import(Tensor(scalar))
    assert got["path"] == "exchange" and got["shape"] == () and got["data"] == scalar.ctypes.data
    deep = np.zeros((1,) * 9, dtype=np.int32)  # past the 8 dimensions the fast path takes
    got = _core._array_import(Tensor(deep))
    assert got["path"] == "dlpack" and got["shape"] == (1,) * 9


def test_calls_given_no_stream_ask_the_registered_framework():
    try:
        _core._set_stream_api(None)  # torch's, where torch is imported
        _core._set_stream_provider(lambda device: 0)  # what the package's provider answers without torch
        assert _core._default_stream(3) == 0
        assert _core._set_stream_api(V1)
        assert _core._default_stream(3) == 0x1000 + 16 * 3 + 2  # kDLCUDA, device 3
        assert _core._default_stream(0) == 0x1000 + 2
        assert not _core._set_stream_api(make_capsule(name=b"other")[0])  # not taken: back to the provider
        assert _core._default_stream(3) == 0
        assert _core._set_stream_api(V1)
        _core._set_stream_provider(lambda device: 9)  # a provider set later is the one asked
        assert _core._default_stream(3) == 9
        assert _core._set_stream_api(V1)
        assert not _core._set_stream_api(None)
        assert _core._default_stream(3) == 9
    finally:
        _core._set_stream_api(None)
        _core._set_stream_provider(dhisparse._current_stream)
        dhisparse._stream_api_source = None  # torch's API is registered again on next use


def test_host_calls_take_tensors_of_producers_with_the_exchange_api():
    # The host backend imports through nanobind's own caster (`__dlpack__`): such tensors work there too.
    Tensor = producer(V1)
    h = dhisparse.Hierarchy("tiny", {"max_requests": 1, "max_rows": 64})
    hist = History(h.layout)
    h.admit(5)
    rows = hist.new_rows(1, 40)
    h.append(5, 1, Tensor(rows))
    hist.add(5, 1, rows)
    assert h.frontier(5, 1) == 40
    sel = np.array([[0, 3, -1, 5, 39]], dtype=np.int32)
    loc = np.zeros_like(sel)
    h.resolve(1, [5], Tensor(sel), Tensor(loc))
    check_rows(h, hist, 1, [5], sel, loc)


def test_the_package_registers_torchs_stream_api_when_it_sees_torch(monkeypatch):
    import sys
    import types

    class Stream:
        cuda_stream = 0x777

    fake = types.SimpleNamespace(
        Tensor=producer(V1),
        cuda=types.SimpleNamespace(is_available=lambda: True, current_stream=lambda device=None: Stream()))
    monkeypatch.setitem(sys.modules, "torch", fake)
    try:
        assert dhisparse._current_stream(1) == 0x777  # the Python provider, which registers the API
        assert _core._default_stream(1) == 0x1000 + 16 + 2  # from C, through the registered API
    finally:
        _core._set_stream_api(None)
        dhisparse._stream_api_source = None


def test_stream_arguments_take_ints_and_stream_objects():
    class TorchLike:  # torch.cuda.Stream
        cuda_stream = 0x5000

    class CupyStream:  # a CuPy stream: its type is named ...Stream
        ptr = 0x6000

    class MemoryPointer:  # a `ptr` that is not a stream's
        ptr = 0x6100

    class ProtocolStream:  # the CUDA stream protocol
        def __cuda_stream__(self):
            return (0, 0x7000)

    assert _core._stream_handle(None) is None
    assert _core._stream_handle(0) == 0 and _core._stream_handle(0x7F00) == 0x7F00
    assert _core._stream_handle(np.uint64(0x7F08)) == 0x7F08  # integers with __index__
    assert _core._stream_handle(TorchLike()) == 0x5000
    assert _core._stream_handle(CupyStream()) == 0x6000
    assert _core._stream_handle(ProtocolStream()) == 0x7000
    for bad in (-1, True, "0x1", 1.5, object(), MemoryPointer()):
        with pytest.raises(TypeError):
            _core._stream_handle(bad)
