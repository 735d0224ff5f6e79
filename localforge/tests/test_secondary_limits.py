"""GitHub's secondary limits beyond content creation: at most 100 requests in flight per user or
installation, at most 900 points a minute per endpoint (reads 1, writes 5), each refused as
GitHub refuses them (403, the secondary-limit message) and each switchable off in Limits."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from .conftest import World

ISSUES = "/repos/acme/vault/issues"


async def _get(session: aiohttp.ClientSession, url: str, token: str) -> tuple[int, Any, Any]:
    async with session.get(url, headers={"Authorization": f"token {token}"}) as resp:
        return resp.status, resp.headers, await resp.json()


async def test_the_101st_request_in_flight_is_refused_and_others_go_on(world: World) -> None:
    held = world.forge.faults.hold(f"GET {ISSUES.replace('acme/vault', '{owner}/{repo}')}",
                                   count=None)
    token = world.tokens["marco"]
    # one connection per request: aiohttp's default pool would queue past 100
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        calls = [asyncio.create_task(_get(session, world.url + ISSUES, token))
                 for _ in range(101)]
        # all but one wait at the forge; the one refused comes back (30 s: a bound, not a pace)
        done, _ = await asyncio.wait(calls, timeout=30, return_when=asyncio.FIRST_COMPLETED)
        assert done, "no request was refused with 101 in flight"
        status, headers, body = next(iter(done)).result()
        assert status == 403
        assert "secondary rate limit" in body["message"]
        assert "Retry-After" not in headers  # GitHub gives none for this one: wait a minute
        # another account is not held back by marco's hundred
        status, _, _ = await world.call("GET", "/repos/acme/vault", "rita")
        assert status == 200
        held.release()
        results = await asyncio.gather(*calls)
    assert sorted(r[0] for r in results) == [200] * 100 + [403]
    assert world.forge.rates.refused["concurrent_requests"] == 1
    assert world.forge.rates.in_flight == {}


async def test_requests_in_flight_are_unlimited_when_switched_off(world: World) -> None:
    world.forge.limits.concurrent_requests = 0
    held = world.forge.faults.hold("GET /repos/{owner}/{repo}/issues", count=None)
    token = world.tokens["marco"]
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        calls = [asyncio.create_task(_get(session, world.url + ISSUES, token))
                 for _ in range(110)]
        await held.caught_at_least(110)  # every one of them is in flight at the forge
        held.release()
        results = await asyncio.gather(*calls)
    assert [r[0] for r in results] == [200] * 110


async def test_an_endpoint_takes_900_points_a_minute_writes_costing_5(world: World) -> None:
    status, _, _ = await world.call("POST", ISSUES, "marco", {"title": "one"})
    assert status == 201
    missing = "/repos/acme/vault/issues/1/labels/nope"  # a cheap write: 404, 5 points all the same
    for _ in range(180):
        status, _, _ = await world.call("DELETE", missing, "marco")
        assert status == 404
    status, headers, body = await world.call("DELETE", missing, "marco")
    assert status == 403 and "secondary rate limit" in body["message"]
    assert 1 <= int(headers["Retry-After"]) <= 60
    # reads of another endpoint, and another user, are not affected
    assert (await world.call("GET", "/repos/acme/vault/issues/1", "marco"))[0] == 200
    assert (await world.call("DELETE", missing, "tina"))[0] == 404
    world.forge.clock.advance(int(headers["Retry-After"]))
    assert (await world.call("DELETE", missing, "marco"))[0] == 404
    assert world.forge.rates.refused["endpoint_points_per_minute"] == 1


async def test_reads_cost_one_point(world: World) -> None:
    world.forge.limits.endpoint_points_per_minute = 12
    for _ in range(12):
        assert (await world.call("GET", ISSUES, "marco"))[0] == 200
    status, headers, _ = await world.call("GET", ISSUES, "marco")
    assert status == 403 and "Retry-After" in headers
    world.forge.limits.endpoint_points_per_minute = 0  # off
    assert (await world.call("GET", ISSUES, "marco"))[0] == 200


async def test_the_limits_are_served_and_set_over_http(world: World) -> None:
    status, _, limits = await world.call("GET", "/_forge/limits")
    assert status == 200
    assert limits["concurrent_requests"] == 100 and limits["endpoint_points_per_minute"] == 900
    status, _, limits = await world.call("POST", "/_forge/limits",
                                         json_body={"concurrent_requests": 0})
    assert status == 200 and limits["concurrent_requests"] == 0
