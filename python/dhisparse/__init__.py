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


def _current_stream() -> int:
    """torch's current CUDA stream when torch is imported and has CUDA, else 0 (the legacy default)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        return torch.cuda.current_stream().cuda_stream
    return 0


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


def Hierarchy(layout: str, config: Union[HierarchyConfig, Mapping[str, Any], None] = None, *,
              backend: str = "host", stream: Optional[int] = None):
    """A hierarchy of `layout` ('tiny', 'glm53', 'deepseek_v41_flash') with lru_hot_cache<B>
    (B = LAYOUTS[layout]), fixed-budget residency and dedicated staging.

    `config` mirrors C++ hierarchy_config: HierarchyConfig, a dict or a dataclass with the same
    fields. The CUDA backend's default stream is `stream` (default: torch's current stream).
    """
    cls = _lookup("Hierarchy", layout, backend)
    cfg = _config(HierarchyConfig, config, "config")
    if backend == "cuda":
        return cls(cfg, _current_stream() if stream is None else stream)
    return cls(cfg)


def ResidencyManager(layout: str, config: Union[HierarchyConfig, Mapping[str, Any], None] = None,
                     residency: Union[ResidencyConfig, Mapping[str, Any], None] = None, *,
                     policy: str = "adaptive-mra", backend: str = "host", stream: Optional[int] = None):
    """A residency manager owning a hierarchy of `layout` (see Hierarchy); `policy` is one of
    POLICIES ('fixed-budget', 'adaptive-mra', 'adaptive-lra', 'resident'). `residency` mirrors
    C++ residency_config. On CUDA the step stream is `stream` (default: torch's current stream)."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; one of {sorted(POLICIES)}")
    cls = _lookup("ResidencyManager", layout, backend, "_" + POLICIES[policy])
    cfg = _config(HierarchyConfig, config, "config")
    rcfg = _config(ResidencyConfig, residency, "residency")
    if backend == "cuda":
        return cls(cfg, rcfg, _current_stream() if stream is None else stream)
    return cls(cfg, rcfg)


__all__ = [
    "Hierarchy", "ResidencyManager", "HierarchyConfig", "ResidencyConfig", "CopyLayers", "AdmitStatus",
    "Admission", "ResidencyAdmission", "ResidencyLedger", "ResidencyCounters", "ResolveStats",
    "VerifyStats", "PlannedCopy", "DhisparseError", "ERRORS", "LAYOUTS", "POLICIES", "CUDA_BUILT",
    *ERRORS,
]
