"""Whole numbers read from text others send: URLs, cursors, comments, tool arguments."""

from __future__ import annotations

# The index's integers are 64-bit (SQLite's INTEGER, PostgreSQL's BIGINT)
MOST = 2**63 - 1


def whole(text: str, *, most: int = MOST) -> int | None:
    """`text` as a whole number from 0 to `most`, written in ASCII digits only; else None.

    Not `str.isdigit()`: it takes "²" and other digits `int()` refuses (a 500 where a person
    gets a clear answer), and "１" that `int()` reads; nor a number past the index's integers,
    which overflows a query."""
    if not (text.isascii() and text.isdigit()) or len(text) > len(str(most)):
        return None
    number = int(text)
    return number if number <= most else None
