"""The local forge: a GitHub-compatible forge served over real HTTP (docs/internals.md)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .clock import Clock
    from .faults import Faults
    from .forge import LocalForge
    from .limits import Limits
    from .reqlog import RequestLog

__all__ = ["Clock", "Faults", "Limits", "LocalForge", "RequestLog"]

# (loaded when first named: `vaultmail forge`'s options are read without the forge itself)
_WHERE = {"Clock": ".clock", "Faults": ".faults", "LocalForge": ".forge", "Limits": ".limits",
          "RequestLog": ".reqlog"}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'localforge' has no attribute {name!r}")
    return getattr(importlib.import_module(module, __name__), name)
