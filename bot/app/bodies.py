"""Request bodies, read with the limit of where they are sent (a refusal names it).

Tool calls (HTTP and MCP) take at most 1 MiB: far more than any argument allows (a mail body
is at most 60,000 characters). Webhooks take what GitHub can send: it caps a payload at 25 MB,
so up to 25 MiB is read and anything larger is refused with 413. The body is counted as it
arrives, so neither a false Content-Length nor a chunked upload gets more through.
"""

from __future__ import annotations

import re
from typing import Any

from aiohttp import web

from bot.errors import PayloadTooLarge

MiB = 1024 * 1024
TOOL_BODY_LIMIT = 1 * MiB
WEBHOOK_BODY_LIMIT = 25 * MiB


def _size(n: int) -> str:
    return f"{n // MiB} MiB" if n % MiB == 0 else f"{n:,} bytes"


async def read_body(request: web.Request, limit: int, what: str) -> bytes:
    """The whole body, or PayloadTooLarge (413) naming `what` and `limit` once it passes it."""
    def too_large(size: str) -> PayloadTooLarge:
        return PayloadTooLarge(f"{what} is {size}: at most {_size(limit)} ({limit:,} bytes) "
                               "is taken here")

    declared = request.content_length
    if declared is not None and declared > limit:
        raise too_large(f"{declared:,} bytes")
    chunks: list[bytes] = []
    total = 0
    async for chunk in request.content.iter_any():
        total += len(chunk)
        if total > limit:
            raise too_large(f"more than {_size(limit)}")
        chunks.append(chunk)
    return b"".join(chunks)


# -- lone surrogates --------------------------------------------------------------------------
#
# JSON may carry "\ud800": valid JSON, but no character, and nothing that can be stored as
# UTF-8 (SQLite, the forge, a log line all refuse it). A tool call holding one is refused,
# naming where (`lone_surrogate_at`); a signed webhook, which the forge sent and must not be
# lost, has each one replaced by U+FFFD, the replacement character.

_LONE = re.compile("[\ud800-\udfff]")  # json.loads pairs valid halves into one character
_ESCAPED_HALF = re.compile(rb"\\u[dD][89a-fA-F]")


def may_hold_surrogates(data: bytes) -> bool:
    """False when the JSON text cannot decode to a lone surrogate (the usual case: cheap)."""
    return _ESCAPED_HALF.search(data) is not None


def lone_surrogate_at(value: Any, where: str = "") -> str | None:
    """The path (``to``, ``options[2].label``) of the first string holding a lone surrogate
    in a decoded JSON value, or None."""
    if isinstance(value, str):
        return (where or "the value") if _LONE.search(value) else None
    if isinstance(value, dict):
        for key, item in value.items():
            name = f"{where}.{key}" if where else str(key)
            if _LONE.search(str(key)):
                return name
            if (found := lone_surrogate_at(item, name)) is not None:
                return found
    if isinstance(value, list):
        for i, item in enumerate(value):
            if (found := lone_surrogate_at(item, f"{where}[{i}]")) is not None:
                return found
    return None


def replace_surrogates(value: Any) -> Any:
    """`value` with each lone surrogate in its strings (keys too) replaced by U+FFFD."""
    if isinstance(value, str):
        return _LONE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {replace_surrogates(k): replace_surrogates(v) for k, v in value.items()}
    if isinstance(value, list):
        return [replace_surrogates(v) for v in value]
    return value
