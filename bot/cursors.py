"""Paging cursors as an office is shown them. A cursor was a row's place in a table every
office writes (the inbox's deliveries, the item updates), so the gaps between an office's own
told it how busy the others were. Now a cursor is that place under a keyed permutation of 52
bits (a four-round Feistel network with HMAC-SHA256 rounds; below 2^53, so an exact JSON
number in every client): the same place reads the same while the key stands, and says nothing
of its neighbours'. The key is made from the deployment's webhook secret: a new secret makes
the cursors handed out before unknown (a client pages again from the start).

A place is below 2^36 (68 billion rows): a number the app never gave reads as a place past
that but once in 65,536, so it is refused (422 bad_cursor) rather than read as a place past
every row (the first page again, as though it were a cursor)."""

from __future__ import annotations

import hashlib
import hmac

BITS = 52
PLACES = 1 << 36  # the places a cursor stands for (the rest of its numbers stand for none)
_HALF = BITS // 2
_MASK = (1 << _HALF) - 1
_ROUNDS = 4
_KEPT = 4096  # cursors kept, by place (`Cursors.shown`)


class Cursors:
    def __init__(self, secret: str) -> None:
        key = hmac.new(secret.encode(), b"vaultmail cursors", hashlib.sha256).digest()
        # keyed once, each round a copy (hmac.new set the key up again: 2.1 us a round
        # against 1.4, and a page of list_inbox's updates rounds its cursors 120 times)
        self._mac = hmac.new(key, digestmod=hashlib.sha256)
        # the cursors shown lately, by place: an inbox shows the same page of updates on call
        # after call (its newest first), 30 cursors of four rounds each
        self._given: dict[int, int] = {}

    def _round(self, i: int, half: int) -> int:
        mac = self._mac.copy()
        mac.update(bytes([i]) + half.to_bytes(4, "big"))
        return int.from_bytes(mac.digest()[:4], "big") & _MASK

    def shown(self, place: int) -> int:
        """The cursor an office is shown for a row's `place`."""
        given = self._given.get(place)
        if given is not None:
            return given
        if not 0 <= place < PLACES:
            raise ValueError(f"{place} is past what a cursor holds")
        left, right = place >> _HALF, place & _MASK
        for i in range(_ROUNDS):
            left, right = right, left ^ self._round(i, right)
        given = left << _HALF | right
        if len(self._given) >= _KEPT:  # the oldest kept makes room
            del self._given[next(iter(self._given))]
        self._given[place] = given
        return given

    def place(self, shown: int) -> int:
        """The place a cursor this deployment gave stands for; ValueError for none it could
        have given."""
        if not 0 <= shown < 1 << BITS:
            raise ValueError(f"{shown} is no cursor this app gave")
        left, right = shown >> _HALF, shown & _MASK
        for i in reversed(range(_ROUNDS)):
            left, right = right ^ self._round(i, left), left
        place = left << _HALF | right
        if place >= PLACES:
            raise ValueError(f"{shown} is no cursor this app gave")
        return place
