"""Request bodies, read with the limit of where they are sent (a refusal names it).

Tool calls (HTTP and MCP) take at most 1 MiB: far more than any argument allows (a mail body
is at most 60,000 characters). Webhooks take what GitHub can send: it caps a payload at 25 MB,
so up to 25 MiB is read and anything larger is refused with 413. The body is counted as it
arrives, so neither a false Content-Length nor a chunked upload gets more through.

JSON bodies nest arrays and objects at most 64 deep (`loads_json`): deeper is 400 `bad_json`,
where the parser (and every recursive walk after it) would otherwise run out of stack.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from itertools import accumulate
from typing import Any

from aiohttp import web

from bot import jsontext
from bot.errors import PayloadTooLarge, VaultmailError

MiB = 1024 * 1024
TOOL_BODY_LIMIT = 1 * MiB
WEBHOOK_BODY_LIMIT = 25 * MiB
JSON_DEPTH_LIMIT = 64  # GitHub's payloads nest about 8 deep; tool arguments 4


def size_text(n: int) -> str:
    return f"{n // MiB} MiB" if n % MiB == 0 else f"{n:,} bytes"


def too_large(what: str, size: str, limit: int) -> PayloadTooLarge:
    """The 413 for `what`, `size` long ("12,345 bytes", "more than 1 MiB"), over `limit`."""
    return PayloadTooLarge(f"{what} is {size}: at most {size_text(limit)} ({limit:,} bytes) "
                           "is taken here")


def over_limit(what: str, limit: int) -> PayloadTooLarge:
    """The 413 for a body found longer than `limit` as it arrived."""
    return too_large(what, f"more than {size_text(limit)}", limit)


async def read_body(request: web.Request, limit: int, what: str) -> bytes:
    """The whole body, or PayloadTooLarge (413) naming `what` and `limit` once it passes it."""
    declared = request.content_length
    if declared is not None and declared > limit:
        raise too_large(what, f"{declared:,} bytes", limit)
    chunks: list[bytes] = []
    total = 0
    async for chunk in request.content.iter_any():
        total += len(chunk)
        if total > limit:
            raise over_limit(what, limit)
        chunks.append(chunk)
    return b"".join(chunks)


# -- nesting ----------------------------------------------------------------------------------
#
# json.loads recurses once per level (`[` * 100000 is a RecursionError, not a ValueError), and
# so do pydantic, json.dumps and the walks below: the depth is measured on the text first,
# with bytes methods only (C speed; no regex, which would backtrack on an unterminated string).

_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = [0] * 256
_STEP[ord("[")] = _STEP[ord("{")] = 1
_STEP[ord("]")] = _STEP[ord("}")] = -1


def nested_deeper(data: bytes, limit: int = JSON_DEPTH_LIMIT) -> int | None:
    """How deep arrays and objects nest in the JSON text `data` when that is deeper than
    `limit`, else None. Brackets in strings do not count; for text that is not JSON, the
    answer is some number (json.loads refuses that text anyway)."""
    if data.count(b"[") + data.count(b"{") <= limit:  # the usual case: nothing to measure
        return None
    # escaped backslashes first (pairs, left to right, as JSON reads them), then escaped
    # quotes: every `"` left opens or closes a string, so every other piece is outside one
    plain = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    outside = b"".join(plain.split(b'"')[::2]).translate(None, _NOT_BRACKETS)
    depth = max(accumulate(map(_STEP.__getitem__, outside)), default=0)
    return depth if depth > limit else None


def loads_json(data: bytes, what: str = "the body", glanced: Any = jsontext.UNREAD) -> Any:
    """json.loads, once the nesting is known to be at most JSON_DEPTH_LIMIT: deeper is a
    VaultmailError 400 `bad_json` naming the limit; text that is not JSON a ValueError
    (`glanced`: `jsontext.glance(data)`, taken before, not read again)."""
    encoding = json.detect_encoding(data)
    if encoding not in ("utf-8", "utf-8-sig"):  # UTF-16 and 32, which json.loads also reads:
        # measured as UTF-8, where a `"` or a bracket byte is that character and no other
        data = data.decode(encoding, "surrogatepass").encode("utf-8", "surrogatepass")
    depth = nested_deeper(data)
    if depth is not None:
        raise VaultmailError(
            f"{what} nests arrays and objects {depth} deep: at most {JSON_DEPTH_LIMIT} levels "
            "are taken; send flatter JSON", code="bad_json")
    return jsontext.loads(data, glanced if encoding == "utf-8" else jsontext.UNREAD)


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


def json_response(data: Any, *, status: int = 200,
                  headers: Mapping[str, str] | None = None) -> web.Response:
    """`aiohttp.web.json_response`, its text written by orjson (`jsontext.dumps`): aiohttp
    writes with `json.dumps`, which took about a twentieth of a `list_inbox` call over HTTP
    (an 80 KB answer: bench.inbox). The same value, the same headers."""
    return web.Response(body=jsontext.dumps(data), status=status, headers=headers,
                        content_type="application/json", charset="utf-8")
