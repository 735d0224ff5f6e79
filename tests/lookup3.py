"""PostgreSQL's `hashtextextended` (Jenkins' lookup3, `hash_bytes_extended`) in Python, and
run backwards: a text with a chosen prefix whose hash is any number one likes. What an office
could do to a lock numbered by it (bot.store.locks says why none is now); checked against the
server in tests/test_store_lock_numbers.py."""

from __future__ import annotations

M = 0xFFFFFFFF
PRINTABLE = frozenset(range(0x21, 0x7F))


def _rot(x: int, k: int) -> int:
    return ((x << k) | (x >> (32 - k))) & M


def _mix(a: int, b: int, c: int) -> tuple[int, int, int]:
    a = (a - c) & M
    a ^= _rot(c, 4)
    c = (c + b) & M
    b = (b - a) & M
    b ^= _rot(a, 6)
    a = (a + c) & M
    c = (c - b) & M
    c ^= _rot(b, 8)
    b = (b + a) & M
    a = (a - c) & M
    a ^= _rot(c, 16)
    c = (c + b) & M
    b = (b - a) & M
    b ^= _rot(a, 19)
    a = (a + c) & M
    c = (c - b) & M
    c ^= _rot(b, 4)
    b = (b + a) & M
    return a, b, c


def _unmix(a: int, b: int, c: int) -> tuple[int, int, int]:
    b = (b - a) & M
    c ^= _rot(b, 4)
    c = (c + b) & M
    a = (a - c) & M
    b ^= _rot(a, 19)
    b = (b + a) & M
    c = (c - b) & M
    a ^= _rot(c, 16)
    a = (a + c) & M
    b = (b - a) & M
    c ^= _rot(b, 8)
    c = (c + b) & M
    a = (a - c) & M
    b ^= _rot(a, 6)
    b = (b + a) & M
    c = (c - b) & M
    a ^= _rot(c, 4)
    a = (a + c) & M
    return a, b, c


# final(): (word changed, word it takes from, rotation), in order
_FINAL = ((2, 1, 14), (0, 2, 11), (1, 0, 25), (2, 1, 16), (0, 2, 4), (1, 0, 14), (2, 1, 24))


def _final(a: int, b: int, c: int) -> tuple[int, int, int]:
    for x, y, k in _FINAL:
        v = [a, b, c]
        v[x] ^= v[y]
        v[x] = (v[x] - _rot(v[y], k)) & M
        a, b, c = v
    return a, b, c


def _unfinal(a: int, b: int, c: int) -> tuple[int, int, int]:
    for x, y, k in reversed(_FINAL):
        v = [a, b, c]
        v[x] = (v[x] + _rot(v[y], k)) & M
        v[x] ^= v[y]
        a, b, c = v
    return a, b, c


def _word(data: bytes, i: int) -> int:
    return int.from_bytes(data[i:i + 4].ljust(4, b"\0"), "little")


def _start(length: int, seed: int) -> tuple[int, int, int]:
    a = b = c = (0x9E3779B9 + length + 3923095) & M
    if seed:
        a = (a + (seed >> 32)) & M
        b = (b + (seed & M)) & M
        a, b, c = _mix(a, b, c)
    return a, b, c


def hashtextextended(text: str, seed: int = 0) -> int:
    """What PostgreSQL's hashtextextended(text, seed) answers (a signed 64-bit number)."""
    data = text.encode()
    a, b, c = _start(len(data), seed)
    n = len(data)
    while n >= 12:
        a, b, c = _mix((a + _word(data, 0)) & M, (b + _word(data, 4)) & M,
                       (c + _word(data, 8)) & M)
        data, n = data[12:], n - 12
    if n >= 9:
        c = (c + (int.from_bytes(data[8:n], "little") << 8)) & M
    if n >= 5:
        b = (b + _word(data[:min(n, 8)], 4)) & M
    if n >= 1:
        a = (a + _word(data[:min(n, 4)], 0)) & M
    a, b, c = _final(a, b, c)
    v = (b << 32) | c
    return v - (1 << 64) if v >= 1 << 63 else v


def chosen(prefix: str, target: int, seed: int = 0) -> str:
    """A text `prefix` + a printable tail whose hashtextextended under `seed` is `target`."""
    head = prefix.encode() + b"x" * (-len(prefix.encode()) % 12)
    a, b, c = _start(len(head) + 12, seed)
    for i in range(0, len(head), 12):
        a, b, c = _mix((a + _word(head, i)) & M, (b + _word(head, i + 4)) & M,
                       (c + _word(head, i + 8)) & M)
    t = target & ((1 << 64) - 1)
    for free in range(1 << 32):
        a0, b0, c0 = _unmix(*_unfinal(free, t >> 32, t & M))
        tail = b"".join(((x - y) & M).to_bytes(4, "little")
                        for x, y in ((a0, a), (b0, b), (c0, c)))
        if all(ch in PRINTABLE for ch in tail):
            return (head + tail).decode()
    raise ValueError("no printable text has that hash")
