"""Paging cursors (bot.cursors): the numbers an office is shown stay the same numbers when how
they are computed changes (a client holding one pages on after an upgrade)."""

from __future__ import annotations

import hashlib
import hmac

import pytest

from bot.cursors import PLACES, Cursors

# cursors as the first release of the keyed permutation gave them (hmac.new for each round)
GIVEN = {
    "a webhook secret": {
        0: 4090049750513479,
        1: 1358019797345484,
        2: 1584650780816723,
        99551: 2801006238133646,
        PLACES - 1: 242003072690601,
    },
    "": {0: 1696185337326828, 1: 2724114375928472, 12345: 1861395650554791},
    "é" * 100: {0: 177068567251152, 1: 4367063637653282, 12345: 4044079088619514},
}


@pytest.mark.parametrize("secret", list(GIVEN))
def test_cursors_given_before_read_the_same(secret: str) -> None:
    cursors = Cursors(secret)
    for place, shown in GIVEN[secret].items():
        assert cursors.shown(place) == shown
        assert cursors.place(shown) == place


def test_each_round_is_hmac_sha256_of_the_key() -> None:
    """The keyed states copied per round give what `hmac.new` gives, round and half alike."""
    secret = "another secret"
    cursors = Cursors(secret)
    key = hmac.new(secret.encode(), b"vaultmail cursors", hashlib.sha256).digest()
    for i in range(4):
        for half in (0, 1, 255, 256, 65_535, 1 << 20, (1 << 26) - 1):
            mac = hmac.new(key, bytes([i]) + half.to_bytes(4, "big"), hashlib.sha256).digest()
            assert cursors._round(i, half) == int.from_bytes(mac[:4], "big") & ((1 << 26) - 1)


def test_cursors_round_trip_and_refuse_what_was_never_given() -> None:
    cursors = Cursors("s")
    shown = [cursors.shown(p) for p in range(6000)]  # (past the cursors it keeps)
    assert len(set(shown)) == 6000
    assert [cursors.place(s) for s in shown] == list(range(6000))
    assert [cursors.shown(p) for p in range(6000)] == shown  # kept or made again: the same
    assert [Cursors("s").shown(p) for p in range(0, 6000, 7)] == shown[::7]
    with pytest.raises(ValueError):
        cursors.shown(PLACES)
    with pytest.raises(ValueError):
        cursors.place(1 << 52)
    refused = 0
    for n in range(1, 5000):  # a number never given reads as a place past PLACES, mostly
        try:
            cursors.place(n * 7919)
        except ValueError:
            refused += 1
    assert refused > 4900
