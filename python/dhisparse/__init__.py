"""dhisparse: a hierarchical KV store for sparse-attention decoding, from Python.

The hierarchies and residency managers are the C++ classes of the library, bound with nanobind;
every per-step call takes arrays (numpy, torch, CuPy, JAX: anything with DLPack or the buffer
protocol) without copying them. Build and use: docs/python.md.
"""
from __future__ import annotations

import dataclasses
import sys
from typing import Any, Mapping, Optional, Union

from . import _core
from ._core import (  # noqa: F401  (re-exported)
    AdmitStatus,
    Admission,
    CopyLayers,
    DhisparseError,
    HierarchyConfig,
    HierarchyPlan,
    PlanBytes,
    PlannedCopy,
    ResidencyAdmission,
    ResidencyConfig,
    ResidencyCounters,
    ResidencyLedger,
    ResolveStats,
    VerifyStats,
)

__version__ = "0.2.0"

#: One exception class per C++ ``dhisparse::errc`` value, all deriving from DhisparseError.
ERRORS = {name: getattr(_core, name) for name in _core._error_classes}
globals().update(ERRORS)

#: Layouts with ready instantiations, and the hot-cache rows B each uses (2 x top_k).
LAYOUTS = {"tiny": 32, "glm53": 4096, "deepseek_v41_flash": 1024}
#: Residency policies of ResidencyManager, by their C++ ``name``.
POLICIES = {
    "fixed-budget": "fixed_budget",
    "adaptive-mra": "adaptive_mra",
    "adaptive-lra": "adaptive_lra",
    "resident": "resident",
}
#: True when this build has the CUDA backend.
CUDA_BUILT = bool(_core.cuda_built)


def _current_stream(device: Optional[int] = None) -> int:
    """torch's current CUDA stream of `device` (default: torch's current device) when torch is
    imported and has CUDA, else 0 (the legacy default). A call on an object of GPU d uses d's
    current stream, whatever device is current: objects take only streams of their own GPU."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        stream = torch.cuda.current_stream(device).cuda_stream
        _use_framework_stream_api(torch)  # after torch answered once (its lazy CUDA set-up done)
        return stream
    return 0


_stream_api_source = None  # the torch module last looked at for the exchange API


def _use_framework_stream_api(torch) -> None:
    """Once per torch module: when torch publishes the DLPack C exchange API (torch >= 2.10), calls
    given no stream ask torch for its current stream from C, without this Python function (about
    4 µs less per call)."""
    global _stream_api_source
    if torch is not _stream_api_source:
        _stream_api_source = torch
        capsule = getattr(getattr(torch, "Tensor", None), "__dlpack_c_exchange_api__", None)
        if capsule is not None:
            _core._set_stream_api(capsule)


_core._set_stream_provider(_current_stream)


def _config(cls, value, name):
    if value is None:
        return cls()
    if isinstance(value, cls):
        return value
    if dataclasses.is_dataclass(value):
        value = dataclasses.asdict(value)
    if isinstance(value, Mapping):
        return cls(**value)
    raise TypeError(f"{name}: expected {cls.__name__}, a dict or a dataclass, got {type(value).__name__}")


def _lookup(kind: str, layout: str, backend: str, suffix: str = ""):
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; ready instantiations: {sorted(LAYOUTS)}")
    if backend not in ("host", "cuda"):
        raise ValueError(f"backend must be 'host' or 'cuda', not {backend!r}")
    if backend == "cuda" and not CUDA_BUILT:
        raise RuntimeError("dhisparse was built without the CUDA backend (no nvcc at build time, "
                           "or DHISPARSE_PYTHON_CUDA=OFF)")
    prefix = "Host" if backend == "host" else "Cuda"
    return getattr(_core, f"{prefix}{kind}_{layout}{suffix}")


def _store_classes():
    return tuple(getattr(_core, n) for n in dir(_core)
                 if n.startswith(("HostSharedHostStore_", "HostInterprocessHostStore_",
                                  "CudaSharedHostStore_", "CudaInterprocessHostStore_")))


def _check_store(store, rank, layout: str, backend: str):
    """The store and rank a hierarchy is built over: both given, a store of `layout` and `backend`."""
    if store is None:
        raise ValueError("Hierarchy: rank= needs store= (a SharedHostStore or an InterprocessHostStore)")
    if rank is None:
        raise ValueError("Hierarchy: store= needs rank= (this hierarchy's rank on the store)")
    if not isinstance(store, _store_classes()):
        raise TypeError(f"Hierarchy: store= must be a SharedHostStore or an InterprocessHostStore, "
                        f"got {type(store).__name__}")
    if store.layout["name"] != layout:
        raise ValueError(f"Hierarchy: the store was made for layout {store.layout['name']!r}, "
                         f"not {layout!r}")
    if store.backend != backend:
        raise ValueError(f"Hierarchy: a backend={backend!r} hierarchy needs a store made with "
                         f"backend={backend!r}, got a {store.backend!r} store"
                         + (" (CUDA ranks need its pinned, mapped bytes)" if backend == "cuda" else ""))


def plan(layout: str, *, slots: int, max_context_tokens: int, gpu_bytes: int,
         live_context_tokens: Optional[int] = None, host_bytes: Optional[int] = None,
         tail_rows: Optional[int] = None, max_block: int = 1, residency: str = "adaptive",
         required_pages: int = 0, reserve_pages: int = 0) -> HierarchyPlan:
    """The memory planner (C++ ``plan_hierarchy``) for `layout`: `slots` requests of up to
    `max_context_tokens` positions within `gpu_bytes` of GPU memory (on the host backend, its
    simulated pools). Returns a HierarchyPlan: ``plan.config`` for Hierarchy or ResidencyManager,
    ``plan.residency`` for ResidencyManager, ``plan.bytes`` what each backend allocates.

    `live_context_tokens` sizes the host stores for that many positions over all requests (default:
    every slot full); `host_bytes` checks them against a pinned budget; `residency` is the policy the
    optional pool is sized for ("adaptive", also "adaptive-mra"/"adaptive-lra"; "resident";
    "fixed-budget": what a Hierarchy without a ResidencyManager runs). B is the layout's
    (LAYOUTS) and staging dedicated, as in every hierarchy of this package. An input that cannot work raises InvalidConfiguration naming it
    (docs/memory-planner.md).
    """
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; ready instantiations: {sorted(LAYOUTS)}")
    inputs = _core._ConfigInputs(
        slots=slots, max_context_tokens=max_context_tokens, gpu_bytes=gpu_bytes,
        live_context_tokens=live_context_tokens, host_bytes=host_bytes, tail_rows=tail_rows,
        max_block=max_block,
        # The manager's adaptive policies ("adaptive-mra", "adaptive-lra") size the same pool.
        residency={"adaptive-mra": "adaptive", "adaptive-lra": "adaptive"}.get(residency, residency),
        required_pages=required_pages,
        reserve_pages=reserve_pages)
    return getattr(_core, f"plan_{layout}")(inputs)


def Hierarchy(layout: str, config: Union[HierarchyConfig, Mapping[str, Any], None] = None, *,
              backend: str = "host", stream: Any = None, store=None, rank: Optional[int] = None):
    """A hierarchy of `layout` ('tiny', 'glm53', 'deepseek_v41_flash') with lru_hot_cache<B>
    (B = LAYOUTS[layout]), fixed-budget residency and dedicated staging.

    `config` mirrors C++ hierarchy_config: HierarchyConfig, a dict or a dataclass with the same
    fields. The CUDA backend's default stream is `stream` (an int cudaStream_t handle, a
    torch.cuda.Stream or a CuPy stream; default: torch's current stream).

    With `store` (a SharedHostStore or an InterprocessHostStore of the same layout and backend)
    and `rank`, the hierarchy is rank `rank` of the tensor-parallel ranks sharing that store
    (docs/multi-gpu.md): it keeps no host store of its own and writes the host copies of the
    history pages it owns. `config.host_pages` is 0 or the store's. The hierarchy keeps the store
    alive; the rank is bound until the hierarchy is freed.
    """
    cls = _lookup("Hierarchy", layout, backend)
    cfg = _config(HierarchyConfig, config, "config")
    args = (cfg,)
    if store is not None or rank is not None:
        _check_store(store, rank, layout, backend)
        args = (cfg, store, rank)
    if backend == "cuda":
        return cls(*args, _current_stream() if stream is None else _core._stream_handle(stream))
    return cls(*args)


def SharedHostStore(layout: str, ranks: int, host_pages: int, request_capacity: int = 0, *,
                    backend: str = "host"):
    """One host store for the `ranks` tensor-parallel hierarchies of one process (C++
    shared_host_store<L>; on backend='cuda' cuda::pinned_shared_host_store<L>, pinned, portable and
    mapped for every GPU): `host_pages` pages per source, `request_capacity` requests held at once
    (0: ranks x 256). Build each rank's hierarchy with Hierarchy(layout, config, store=, rank=)."""
    return _lookup("SharedHostStore", layout, backend)(ranks, host_pages, request_capacity)


class InterprocessHostStore:
    """A shared host store in POSIX shared memory, for ranks in different processes (one process per
    GPU; C++ interprocess_host_store<L>, on backend='cuda' cuda::interprocess_pinned_host_store<L>,
    registered with CUDA in each process). Made by its factories, not by calling the class:

    - ``InterprocessHostStore.create(layout, name, ranks, host_pages, request_capacity=0, backend=)``:
      once (launcher or rank 0), a name that must be new; the creating object unlinks the name
      when it is freed.
    - ``InterprocessHostStore.open(layout, name, timeout_ms=10000, backend=)``: in each rank's
      process; waits up to `timeout_ms` for the creator to finish, checks the layout.
    - ``InterprocessHostStore.remove(name)``: unlinks a name left by a creator that died.

    Names are "/name" or "name". The store's object must outlive the process's hierarchies over it
    (each Hierarchy built on it keeps it alive). Errors: SharedMemoryError (name taken or missing,
    not initialised in time), InvalidConfiguration (malformed name, another layout), LockOwnerDied
    (a process died inside an update: make a new store)."""

    #: How long open() waits by default for the creator, in milliseconds.
    DEFAULT_OPEN_TIMEOUT_MS = 10000

    def __new__(cls, *args, **kwargs):
        raise TypeError("InterprocessHostStore is made by InterprocessHostStore.create(...) or .open(...)")

    @staticmethod
    def create(layout: str, name: str, ranks: int, host_pages: int, request_capacity: int = 0, *,
               backend: str = "host"):
        return _lookup("InterprocessHostStore", layout, backend).create(name, ranks, host_pages, request_capacity)

    @staticmethod
    def open(layout: str, name: str, *, timeout_ms: int = DEFAULT_OPEN_TIMEOUT_MS, backend: str = "host"):
        return _lookup("InterprocessHostStore", layout, backend).open(name, timeout_ms)

    @staticmethod
    def remove(name: str) -> bool:
        """Unlinks `name`; True when it existed. Processes that mapped the store keep their mapping."""
        return _core.HostInterprocessHostStore_tiny.remove(name)

    @staticmethod
    def mapping_bytes(layout: str, ranks: int, host_pages: int, request_capacity: int = 0) -> int:
        """Bytes of shared memory a store of `layout` and this shape takes."""
        return _lookup("InterprocessHostStore", layout, "host").mapping_bytes(ranks, host_pages, request_capacity)


class ManagedHierarchy:
    """The hierarchy a ResidencyManager owns (``manager.hierarchy``), as C++ hands it out: its
    read-only accessors and the per-step operations of ``dhisparse::step_handle`` (resolve,
    follower copies, the speculative round, error checks, pool views). Admission, history
    import, decode-row appends, page mapping and completion change the manager's books and are
    the manager's own; asking the hierarchy for one raises AttributeError naming the way to go.
    Keeps its manager alive."""

    #: Per-step operations (C++ step_handle) and read-only accessors; everything else is refused.
    ALLOWED = frozenset({
        # per-step operations
        "resolve", "resolve_view", "resolve_view_ptr", "_time_resolve_view", "copy_follower",
        "stage_block", "stage_blocks", "stage_step", "stage_blocks_view", "stage_step_view", "verify", "verify_view",
        "commit", "commit_view", "commit_step", "commit_step_view", "join_backup",
        "release_staging", "check_errors", "pool",
        # read-only accessors
        "layout", "hot_rows", "top_k", "backend", "requirements", "config", "space", "contains",
        "slot_of", "admitted_count", "frontier", "positions", "last_plan", "last_stats",
        "last_verify_stats", "block_rows", "staged_rows", "verified_queries", "staging_holder",
        "free_optional_pages", "free_host_pages", "pool_bytes", "pool_rows", "payload", "host_row",
        "hot_rows_of", "lru_order_of", "optional_map_of", "device", "stream", "programmatic_launch",
        "contains_prefix", "prefix_rows", "retained_prefixes", "prefix_pages_held",
        "synchronize", "backup_pending", "step_layers", "step_layer_index",
        "shares_host_store", "rank", "host_store_bytes", "host_bytes_in_use",
    })

    __slots__ = ("_inner", "__weakref__")

    def __init__(self, inner):
        object.__setattr__(self, "_inner", inner)

    def __getattr__(self, name):
        if name in ManagedHierarchy.ALLOWED:
            return getattr(self._inner, name)
        if hasattr(self._inner, name):
            raise AttributeError(
                f"ResidencyManager.hierarchy.{name}: the manager's hierarchy is read-only apart from the "
                f"per-step operations; call the manager's own member instead (admit, append, complete, "
                f"repopulate), so that its books stay in step")
        raise AttributeError(name)

    def __setattr__(self, name, value):
        raise AttributeError("ResidencyManager.hierarchy is read-only")

    def __dir__(self):
        return sorted(n for n in ManagedHierarchy.ALLOWED if hasattr(self._inner, n))

    def __repr__(self):
        return f"ManagedHierarchy({self._inner!r})"


def _install_managed_hierarchy():
    for name in dir(_core):
        if "ResidencyManager_" in name:
            cls = getattr(_core, name)
            cls.hierarchy = property(lambda self: ManagedHierarchy(self._hierarchy),
                                     doc=ManagedHierarchy.__doc__.split("\n")[0])


_install_managed_hierarchy()


def layer_pointers(buffers, device=None):
    """The int64 device array of row-buffer pointers that ``append_view`` takes (``layer_rows``):
    one torch CUDA tensor per payload layer of the source, in layer order. Build it once, outside
    a CUDA graph, and keep the buffers alive while a graph that uses it may replay."""
    import torch

    buffers = list(buffers)
    for b in buffers:
        if not (isinstance(b, torch.Tensor) and b.is_cuda and b.is_contiguous()):
            raise TypeError("layer_pointers: expected contiguous torch CUDA tensors")
    return torch.tensor([b.data_ptr() for b in buffers], dtype=torch.int64,
                        device=device if device is not None else buffers[0].device)


def verify_pointers(selections, locations):
    """The int64 device arrays of per-query pointers that ``verify_view`` takes, for int32 CUDA
    tensors ``selections`` and ``locations`` of shape [capacity, max_block, k] (query j of entry e
    reads ``selections[e, j]`` and writes ``locations[e, j]``). Build them once, outside a graph,
    and keep the tensors alive while a graph that uses them may replay."""
    import torch

    for name, t in (("selections", selections), ("locations", locations)):
        if not (isinstance(t, torch.Tensor) and t.is_cuda and t.is_contiguous() and t.dtype == torch.int32
                and t.dim() == 3):
            raise TypeError(f"verify_pointers: {name} must be a contiguous int32 CUDA tensor [capacity, max_block, k]")
    if selections.shape != locations.shape:
        raise ValueError("verify_pointers: selections and locations must have the same shape")
    cap, kmax, k = selections.shape
    step = torch.arange(cap * kmax, dtype=torch.int64, device=selections.device) * (k * 4)
    return selections.data_ptr() + step, locations.data_ptr() + step


def ResidencyManager(layout: str, config: Union[HierarchyConfig, Mapping[str, Any], None] = None,
                     residency: Union[ResidencyConfig, Mapping[str, Any], None] = None, *,
                     policy: str = "adaptive-mra", backend: str = "host", stream: Any = None):
    """A residency manager owning a hierarchy of `layout` (see Hierarchy); `policy` is one of
    POLICIES ('fixed-budget', 'adaptive-mra', 'adaptive-lra', 'resident'). `residency` mirrors
    C++ residency_config. On CUDA the step stream is `stream` (as for Hierarchy; default: torch's
    current stream)."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; one of {sorted(POLICIES)}")
    cls = _lookup("ResidencyManager", layout, backend, "_" + POLICIES[policy])
    cfg = _config(HierarchyConfig, config, "config")
    rcfg = _config(ResidencyConfig, residency, "residency")
    if backend == "cuda":
        return cls(cfg, rcfg, _current_stream() if stream is None else _core._stream_handle(stream))
    return cls(cfg, rcfg)


__all__ = [
    "Hierarchy", "ResidencyManager", "SharedHostStore", "InterprocessHostStore", "ManagedHierarchy", "layer_pointers", "verify_pointers", "HierarchyConfig", "ResidencyConfig", "CopyLayers", "AdmitStatus",
    "Admission", "ResidencyAdmission", "ResidencyLedger", "ResidencyCounters", "ResolveStats",
    "VerifyStats", "PlannedCopy", "DhisparseError", "ERRORS", "LAYOUTS", "POLICIES", "CUDA_BUILT",
    *ERRORS,
]
