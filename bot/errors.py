"""Errors a person or agent sees: a code, a message saying what was wrong and what to do."""

from __future__ import annotations

import math
from typing import Any

from bot.forge.errors import ForgeError, MovedAway

# Seconds a client waits before it tries again after a 429 or 503 that knows no better: what
# the app's other "try again shortly" answers (intake, start-up) have always said.
RETRY_SHORTLY = 5.0


class VaultmailError(Exception):
    status = 400
    code = "bad_request"
    retry_after: float | None = None  # seconds after which the same call may do (Retry-After)

    def __init__(self, message: str, *, code: str | None = None,
                 on_forge: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        # the same said to a forge command (handlers.common.Scene.refuse), where the message
        # names a tool's arguments (`confirmedWithPerson`, `body`) the forge has no way to write
        self.on_forge = on_forge or message
        if code:
            self.code = code
        # what the error result carries besides `error`: for an agent, its `inbox`
        self.extra: dict[str, Any] = {}

    def as_json(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message}, **self.extra}


def retry_headers(status: int, wait: float | None = None) -> dict[str, str]:
    """The Retry-After an HTTP answer of `status` carries (RFC 9110 §10.2.3: whole seconds):
    a 429 or 503 says when to come back (`wait`, else RETRY_SHORTLY), so that a client (an
    MCP client, curl --retry, octokit's retry plugin) neither hammers nor gives up; another
    status only with a `wait` (a forge's failure: try again shortly)."""
    if wait is None and status not in (429, 503):
        return {}
    return {"Retry-After": str(max(1, math.ceil(RETRY_SHORTLY if wait is None else wait)))}


def refusal_headers(exc: VaultmailError) -> dict[str, str]:
    """`retry_headers` for a refusal: its status and its `retry_after`."""
    return retry_headers(exc.status, exc.retry_after)


class InvalidArguments(VaultmailError):
    status = 422
    code = "invalid_arguments"


class Unauthenticated(VaultmailError):
    status = 401
    code = "unauthenticated"


class Denied(VaultmailError):
    """Outside the actor's permissions or capabilities; ledgered as run.denied.

    Every Denied is ledgered once: where it is raised when the subject is known there (the
    `deny` helpers, which set `ledgered`), else by the surface that reports it (the tool
    layer), with the `subject` given here when there is one."""

    status = 403
    code = "denied"

    def __init__(self, message: str, *, code: str | None = None, subject: str | None = None,
                 ledgered: bool = False, on_forge: str | None = None) -> None:
        super().__init__(message, code=code, on_forge=on_forge)
        self.subject = subject
        self.ledgered = ledgered


class NotFoundError(VaultmailError):
    status = 404
    code = "not_found"


class Conflict(VaultmailError):
    status = 409
    code = "conflict"


class ForgeUnavailable(VaultmailError):
    """The forge refused or failed a request a tool needed (never a stack trace)."""

    status = 502
    code = "forge_error"
    retry_after = RETRY_SHORTLY


class VaultMoved(VaultmailError):
    """A vault (or the office's config repository) that the forge leads to another owner's
    repository (a transfer): gone from the office until a person acts; asking again answers
    the same. 410 Gone, as GitHub answers of an issue deleted: the thing was here and is no
    longer, for good as far as a retry knows (a 5xx invites retries; 404 says it never was)."""

    status = 410
    code = "vault_moved"


def forge_refusal(exc: ForgeError, what: str = "", done: str = "") -> VaultmailError:
    """What a caller (of `what`) sees of a forge request that failed: a repository moved to
    another owner said as such, with what to do; else the forge's answer, to try again later
    (`done`: what became of the call, e.g. "nothing was recorded")."""
    said = f"{what}: " if what else ""
    if isinstance(exc, MovedAway):
        return VaultMoved(
            f"{said}{exc.was} was moved to another owner ({exc.now}), so nothing of it is "
            f"read as this office's: an admin of {exc.now.partition('/')[0]} has it moved "
            f"back to {exc.was.partition('/')[0]}, or the office's config "
            "(.github/vaultmail.yml) names a new vault (an agent's `vault:`)")
    return ForgeUnavailable(f"{said}the forge answered {exc}; "
                            f"{done + ', ' if done else ''}try again later")


class IndexUnavailable(VaultmailError):
    """The app's database is away for now (a restart, a failover, a full disk): nothing was
    recorded; the client tries again shortly (503 with Retry-After, as intake answers)."""

    status = 503
    code = "unavailable"


class TooManyRequests(VaultmailError):
    """Over a limit (long polls held at once, chats waiting); nothing was done.
    `retry_after`: the seconds after which the same call is let through, where known (the
    tool endpoint's Retry-After)."""

    status = 429
    code = "too_many_long_polls"

    def __init__(self, message: str, *, code: str | None = None,
                 retry_after: float | None = None) -> None:
        super().__init__(message, code=code)
        self.retry_after = retry_after


class CatchingUp(VaultmailError):
    """The office's index is being caught up with the forge at start (restored from a
    backup?): a keyed send waits for it, so a retry finds the mail its first try sent."""

    status = 503
    code = "catching_up"
    retry_after = 5.0


class NotInstalled(VaultmailError):
    """The caller's office is in an organisation where the App is not installed (now)."""

    status = 503
    code = "not_installed"


class PayloadTooLarge(VaultmailError):
    """A request body over the limit of where it was sent (the message names the limit)."""

    status = 413
    code = "too_large"
