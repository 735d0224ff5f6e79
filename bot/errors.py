"""Errors a person or agent sees: a code, a message saying what was wrong and what to do."""

from __future__ import annotations


class VaultmailError(Exception):
    status = 400
    code = "bad_request"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code:
            self.code = code

    def as_json(self) -> dict[str, dict[str, str]]:
        return {"error": {"code": self.code, "message": self.message}}


class InvalidArguments(VaultmailError):
    status = 422
    code = "invalid_arguments"


class Unauthenticated(VaultmailError):
    status = 401
    code = "unauthenticated"


class Denied(VaultmailError):
    """Outside the actor's permissions or capabilities; ledgered as run.denied."""

    status = 403
    code = "denied"


class NotFoundError(VaultmailError):
    status = 404
    code = "not_found"


class Conflict(VaultmailError):
    status = 409
    code = "conflict"
