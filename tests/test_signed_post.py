"""A signed POST is bound to where it was sent, when, and as which delivery, not only to its
body: a receiver of one cannot replay it to another receiver of the same office (or to itself
later), nor relabel it. What a real receiver on loopback got is checked with the product's
own sans-I/O check (`check_signed_post`, what docs/using.md's recipe mirrors)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp
import pytest
from aiohttp import web

from bot.app.egress import OutboundPolicy
from bot.app.signed_post import SignatureRefused, check_signed_post, post_signed
from bot.mail.signing import Keyrings
from bot.names import Behalf
from tests.support import served

LOOPBACK = OutboundPolicy.parse("127.0.0.1")


@dataclass
class Receivers:
    """Two receivers of office acme (its run runner and its trigger URL), on one server."""

    base: str = ""
    got: dict[str, list[tuple[bytes, dict[str, str]]]] = field(default_factory=dict)

    async def take(self, request: web.Request) -> web.Response:
        self.got.setdefault(request.path, []).append((await request.read(),
                                                      dict(request.headers)))
        return web.Response(status=204)

    def last(self, path: str) -> tuple[bytes, dict[str, str]]:
        return self.got[path][-1]


@pytest.fixture
async def receivers() -> AsyncIterator[Receivers]:
    rec = Receivers()
    app = web.Application()
    app.router.add_post("/runs", rec.take)
    app.router.add_post("/hook", rec.take)
    async with served(app) as rec.base:
        yield rec


def _refused(reason: str, *args: object, **kwargs: object) -> None:
    with pytest.raises(SignatureRefused) as caught:
        check_signed_post(*args, **kwargs)  # type: ignore[arg-type]
    assert reason in str(caught.value), str(caught.value)


async def test_a_signed_post_verifies_only_where_when_and_as_what_it_was_sent(
        receivers: Receivers) -> None:
    rings = Keyrings.ephemeral()
    acme = rings.for_office("acme")
    keys = rings.public_keys("acme")  # what acme's receivers fetch from the well-known URL
    runs, hook = f"{receivers.base}/runs", f"{receivers.base}/hook"
    await post_signed(acme, hook, {"seq": 7, "event": "mail.sent"}, outbound=LOOPBACK,
                      office=Behalf("acme"), event="mail.sent", delivery="7")
    body, headers = receivers.last("/hook")
    now = time.time()
    assert check_signed_post(keys, "acme", hook, headers, body, now=now) == "7"
    assert headers["X-Vaultmail-Signature"].startswith("v2=vm-acme-"), headers
    assert abs(int(headers["X-Vaultmail-Timestamp"]) - now) < 300

    # the receiver at /hook replays what it got, headers and all, to acme's runner
    replayed = {k: v for k, v in headers.items()
                if k.lower().startswith("x-vaultmail-") or k == "Content-Type"}
    async with aiohttp.ClientSession() as s, s.post(runs, data=body, headers=replayed) as resp:
        assert resp.status == 204
    got_body, got_headers = receivers.last("/runs")
    assert got_body == body
    _refused("signature does not verify", keys, "acme", runs, got_headers, got_body, now=now)

    # relabelled: another delivery number, or another event, on the same signature
    _refused("signature does not verify", keys, "acme", hook,
             {**headers, "X-Vaultmail-Delivery": "8"}, body, now=now)
    _refused("signature does not verify", keys, "acme", hook,
             {**headers, "X-Vaultmail-Event": "run.finished"}, body, now=now)
    _refused("signature does not verify", keys, "acme", hook, headers, body + b" ", now=now)
    # replayed to the same URL later, or once more within the window (counted from the
    # timestamp itself: `now` is up to a second past it, the whole seconds it keeps)
    sent = int(headers["X-Vaultmail-Timestamp"])
    _refused("timestamp", keys, "acme", hook, headers, body, now=sent + 301)
    _refused("timestamp", keys, "acme", hook, headers, body, now=sent - 301)
    _refused("delivery 7 was seen", keys, "acme", hook, headers, body, now=now, seen={"7"})
    # another office's receiver trusts only its own office's keys
    _refused("not a key of office evil", rings.public_keys("evil"), "evil", hook, headers,
             body, now=now)
    # the form signed before (Ed25519 over the body alone) is not sent, and not accepted
    kid, sig = acme.sign(body)
    _refused("v2=", keys, "acme", hook, {**headers, "X-Vaultmail-Signature": f"{kid}.{sig}"},
             body, now=now)


async def test_a_run_dispatch_carries_its_run_as_the_delivery(receivers: Receivers) -> None:
    """A run's POST has no ledger entry, but a delivery all the same (`run-<n>`), signed: a
    replay to the same runner inside the 5 minutes is seen, as a trigger's is."""
    rings = Keyrings.ephemeral()
    runs = f"{receivers.base}/runs"
    await post_signed(rings.for_office("acme"), runs, {"run": 3, "kind": "mail"},
                      outbound=LOOPBACK, office=Behalf("acme"), event="run", delivery="run-3")
    body, headers = receivers.last("/runs")
    keys = rings.public_keys("acme")
    assert check_signed_post(keys, "acme", runs, headers, body, now=time.time()) == "run-3"
    _refused("delivery run-3 was seen", keys, "acme", runs, headers, body, now=time.time(),
             seen={"run-3"})
