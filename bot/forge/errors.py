"""Errors raised by the forge client.

Every error carries the HTTP ``status`` (``None`` when no response came back), the ``method`` and
the ``url`` of the request, and a readable message, e.g.
``POST /repos/acme/vault/issues -> 422: Validation Failed``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit


class ForgeError(Exception):
    """A forge request failed."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        method: str = "",
        url: str = "",
        headers: Mapping[str, str] | None = None,
        details: Any = None,
    ) -> None:
        self.message = message
        self.status = status
        self.method = method
        self.url = url
        self.headers: Mapping[str, str] = dict(headers or {})
        self.details = details
        super().__init__(self._render())

    def _render(self) -> str:
        where = ""
        if self.method or self.url:
            path = urlsplit(self.url).path or self.url
            where = f"{self.method} {path}".strip()
            where += f" -> {self.status}" if self.status is not None else ""
            where += ": "
        elif self.status is not None:
            where = f"{self.status}: "
        return f"{where}{self.message}"


class UnreadableFile(ForgeError):
    """The forge answered with a file that is not text this app can read (not UTF-8, too large
    for the contents API): a fault of the file, not of the forge; asking again reads the same."""


class FileTooLarge(UnreadableFile):
    """An answer over the most its reader takes (`at_most` bytes): refused once that many
    were read, the rest never (a file's admins may commit hundreds of MB)."""

    def __init__(self, message: str, *, at_most: int, **kw: Any) -> None:
        self.at_most = at_most
        super().__init__(message, **kw)


class NotFound(ForgeError):
    """404: the repository, issue, comment, label or file does not exist (or is hidden)."""


class MovedAway(NotFound):
    """A repository's name that the forge leads to another owner's repository (GitHub
    redirects one transferred as it does one renamed): gone from the owner it was asked of,
    read as not found; ``was`` is the name asked of, ``now`` its full name there."""

    def __init__(self, message: str, *, was: str, now: str, **kw: Any) -> None:
        self.was = was
        self.now = now
        super().__init__(message, **kw)


class OwnerChanged(ForgeError):
    """A repository's login is not the account's the index holds for it (Gitea, which tells
    no hook of an org renamed: the org renamed itself, and the old name leads to its new
    one, or another account took the old login): nothing is written to it, nor read from it
    as the office's. The app has looked at the bot's orgs again by then (bot.app.gitea_orgs),
    so a retry acts for the office where its org is now."""

    def __init__(self, message: str, *, repo: str, held: int, now: int, **kw: Any) -> None:
        self.repo = repo
        self.held = held  # the account the index holds for the login
        self.now = now  # the repository's owner's, as the forge answers (renamed: `held`)
        super().__init__(message, **kw)


class Unauthorized(ForgeError):
    """401 even after a fresh token / JWT: the app's credentials are rejected."""


class PermissionDenied(ForgeError):
    """403 that is not a rate limit: the installation lacks a permission."""


class ValidationFailed(ForgeError):
    """422: the forge refused the request's content (``details`` holds GitHub's ``errors``)."""


class RateLimited(ForgeError):
    """A primary or secondary rate limit that the client would not (or could no longer) wait out.

    ``retry_after`` is the number of seconds after which a retry may succeed, when known; a worker
    can reschedule the job for then.
    """

    def __init__(self, message: str, *, retry_after: float | None = None, **kw: Any) -> None:
        self.retry_after = retry_after
        super().__init__(message, **kw)


class PutOff(RateLimited):
    """A write this context may not wait for (`pacing.wait_at_most`): the forge's budget, by
    this app's own count or a primary limit's reset, allows it in `retry_after` seconds. The
    worker puts its delivery off until then, no attempt counted."""


class TransientError(ForgeError):
    """5xx, timeouts or connection errors persisted through every retry."""


class OutcomeUnknown(TransientError):
    """A non-idempotent write (a create without a marker, a dispatch) failed in a way that leaves
    unknown whether it landed; it was not retried."""


__all__ = [
    "ForgeError",
    "MovedAway",
    "NotFound",
    "OutcomeUnknown",
    "OwnerChanged",
    "PermissionDenied",
    "PutOff",
    "RateLimited",
    "TransientError",
    "Unauthorized",
    "ValidationFailed",
]
