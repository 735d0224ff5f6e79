"""bot.jsontext reads JSON as `json.loads` does, value for value and type for type, though
orjson does the reading wherever it reads the text the same way."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from bot import jsontext

SAME = [
    b'{"a": 1, "b": [true, false, null], "c": "x\\u00e9\\ud83d\\ude00"}',
    b"18446744073709551616",  # past 64 bits: orjson would say 1.8446744073709552e+19
    b"-9223372036854775809",
    b'{"readBefore": 1000000000000000000000000000000}',
    b"9223372036854775807",
    b"3.14159265358979323846264338327950288",
    b"1e400", b"-0", b"-0.0", b"0.1", b'{"a": 1, "a": 2}', b'"\\u0000"',
    b"NaN", b"[Infinity, -Infinity]", b'"\\ud800"', b"\xef\xbb\xbf{}",
    '{"text": "12345678901234567890 in a string"}',
    '{"n": 18446744073709551616, "s": "\ud800"}',  # text, as a str holding a lone half
]


@pytest.mark.parametrize(("text", "long"), [
    (b"123456789012345678", False), (b"1234567890123456789", True),
    (b"[123456789,0123456789]", False), (b"x0000000000000000000x", True),
    ("9" * 18 + "\u0660", False), ("\ud800" + "7" * 19, True)])
def test_a_long_number_is_a_run_of_19_digits(text: bytes | str, long: bool) -> None:
    assert jsontext.has_long_number(text) is long


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b and str(a) == str(b)


@pytest.mark.parametrize("text", SAME)
def test_every_value_is_the_standard_librarys(text: bytes | str) -> None:
    assert _same(jsontext.loads(text), json.loads(text)), text
    # intake glances at a webhook first (is it the app's own echo?), and reads it with that
    assert _same(jsontext.loads(text, jsontext.glance(text)), json.loads(text)), text


@pytest.mark.parametrize("text", [b"", b"{", b"[1,]", b"\xff", b"{'a': 1}"])
def test_every_refusal_is_the_standard_librarys(text: bytes) -> None:
    with pytest.raises(ValueError) as ours:
        jsontext.loads(text)
    with pytest.raises(ValueError) as theirs:
        json.loads(text)
    assert type(ours.value) is type(theirs.value) and str(ours.value) == str(theirs.value)
