"""The forge client: the Forge interface, its GitHub implementation, App auth."""

from .base import JSON, Forge
from .clock import Clock, SystemClock
from .errors import (
    ForgeError,
    NotFound,
    OutcomeUnknown,
    PermissionDenied,
    RateLimited,
    TransientError,
    Unauthorized,
    ValidationFailed,
)
from .github import AppForge, ForgeClient, ForgeConfig, GitHubForge, InstallationForge, RequestStats
from .pacing import WritePacer
from .tokens import AppAuth

__all__ = [
    "JSON",
    "AppAuth",
    "AppForge",
    "Clock",
    "Forge",
    "ForgeClient",
    "ForgeConfig",
    "ForgeError",
    "GitHubForge",
    "InstallationForge",
    "NotFound",
    "OutcomeUnknown",
    "PermissionDenied",
    "RateLimited",
    "RequestStats",
    "SystemClock",
    "TransientError",
    "Unauthorized",
    "ValidationFailed",
    "WritePacer",
]
