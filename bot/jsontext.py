"""JSON text read and written in C where it can be (orjson), with the standard library's kept.

orjson refuses a few things `json.loads` takes (NaN and Infinity, a byte-order mark, escaped
lone surrogates) and says something else about text that is not JSON; each of those is read
again by `json.loads`. And it reads an integer past 64 bits as a float, without a word: text
with a run of 19 digits or more (a long integer, or a long fraction) goes to `json.loads`
first. So every answer and every error is the standard library's. Webhook payloads are most
of what the app parses, and orjson reads them about four times as fast.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import orjson

# int64 ends at 9223372036854775807 (19 digits). Every digit made a 0, a run of 19 is a
# substring search: about a tenth of the time a regex `[0-9]{19}` took, which tried a match at
# every digit (measured: 9% of the app's CPU in bench.probot_compare, more than orjson's own)
_DIGITS_AS_ZERO = bytes.maketrans(b"123456789", b"000000000")
_LONG_RUN = b"0" * 19


def has_long_number(text: bytes | str) -> bool:
    """Whether `text` holds a run of 19 digits or more."""
    data = text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass")
    return _LONG_RUN in data.translate(_DIGITS_AS_ZERO)


class _Unread:
    """No `glance` at the text was taken."""


UNREAD: Any = _Unread()


def glance(text: bytes | str) -> Any:
    """orjson's reading of `text`, unchecked (a long number may be read as a float), or UNREAD
    when orjson refuses it: enough to decide what is not kept at all (the app's own echoes);
    what is kept is read by `loads`, which takes this reading where it is `json.loads`'s."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return UNREAD


def loads(text: bytes | str, glanced: Any = UNREAD) -> Any:
    """`json.loads(text)`, computed by orjson whenever orjson reads the text the same way
    (`glanced`: `glance(text)`, taken before, not read again)."""
    if has_long_number(text):
        return json.loads(text)
    if glanced is not UNREAD:
        return glanced
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)


def dumps(value: Any, *, default: Callable[[Any], Any] | None = None, option: int = 0) -> bytes:
    """`value` as JSON text, written by orjson; what orjson refuses (a lone surrogate, an
    integer past 64 bits) by `json.dumps`. The same value either way."""
    try:
        return orjson.dumps(value, default=default, option=option)
    except TypeError:
        return json.dumps(value, default=default).encode()
