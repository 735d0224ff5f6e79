"""The local forge: a GitHub-compatible forge served over real HTTP (docs/internals.md)."""

from __future__ import annotations

from .clock import Clock
from .faults import Faults
from .forge import LocalForge
from .limits import Limits
from .reqlog import RequestLog

__all__ = ["Clock", "Faults", "Limits", "LocalForge", "RequestLog"]
