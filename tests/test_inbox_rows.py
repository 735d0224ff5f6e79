"""What an inbox answer computes for each row, made cheaper (issue 22, `bench.inbox`), gives the
same text as before: its times (`views.iso`), the refs visibility splits (`split_ref`, kept)."""

from __future__ import annotations

import random
from datetime import UTC, datetime

from bot.items.views import iso
from bot.office.visibility import split_ref


def _as_before(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def test_times_read_as_strftime_wrote_them() -> None:
    chance = random.Random(22)
    times = [
        0.0,
        0.0005,
        0.9995,
        0.9999999,
        1e-7,
        1.7e9,
        1.7e9 + 0.0009999,
        -0.5,
        -1.0,
        253402300799.999,  # the last millisecond of 9999
        -30610224000.123,  # year 1000
        -30610224000.5 - 86400,  # year 999: strftime writes three digits
        -60000000000.5,
        -62135596800.0,
    ]  # year 68, and year 1
    times += [chance.uniform(-6.2e10, 2.5e11) for _ in range(20_000)]
    times += [chance.uniform(1.6e9, 1.8e9) for _ in range(20_000)]
    assert [iso(t) for t in times] == [_as_before(t) for t in times]
    assert iso(-60000000000.5) == "68-09-03T13:19:59.500Z"


def test_refs_split_the_same_kept_or_not() -> None:
    refs = [
        "acme/Product#12",
        " acme/product#12 ",
        "acme/product#0",
        "acme/product#012",
        "acme/product",
        "acme/product#12\n",
        "Acme/x.y-z_1#99999999999999999999",
        "a" * 150 + "/b#1",
        "a" * 300 + "/b#1",
        "",
        "#1",
        "acme/product#١٢",
    ]
    first = [split_ref(r) for r in refs]
    assert first == [split_ref(r) for r in refs]  # (the second time, those kept)
    assert first[:3] == [("acme/product", 12), ("acme/product", 12), None]
    assert first[3:6] == [None, None, ("acme/product", 12)]
    assert first[6] == ("acme/x.y-z_1", 99999999999999999999)
    assert first[7] == ("a" * 150 + "/b", 1) and first[8] == ("a" * 300 + "/b", 1)
    assert first[9:] == [None, None, None]
