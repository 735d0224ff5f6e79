"""Fault injection and the /_forge/ controls."""

from __future__ import annotations

import time

from .conftest import World

ISSUES = "/repos/acme/vault/issues"
CREATE = "POST /repos/{owner}/{repo}/issues"


async def test_5xx_fault_fires_count_times_then_clears(world: World) -> None:
    status, _, _ = await world.call("POST", "/_forge/faults", json_body={
        "route": CREATE, "status": 502, "rate": 1.0, "count": 1})
    assert status == 200
    status, _, _ = await world.call("POST", ISSUES, "marco", {"title": "a"})
    assert status == 502
    status, _, _ = await world.call("GET", ISSUES, "marco")
    assert status == 200  # another route is untouched
    status, _, body = await world.call("POST", ISSUES, "marco", {"title": "a"})
    assert status == 201 and body["number"] == 1  # the refused create did not land
    _, _, faults = await world.call("GET", "/_forge/faults")
    assert faults["routes"] == []


async def test_write_then_fail_lands_the_write_but_answers_502(world: World) -> None:
    world.forge.faults.add(route=CREATE, status=502, count=1, mode="after")
    status, _, _ = await world.call("POST", ISSUES, "marco", {"title": "maybe"})
    assert status == 502
    _, _, issues = await world.call("GET", ISSUES, "marco")
    assert [i["title"] for i in issues] == ["maybe"]  # a blind retry would duplicate it
    await world.idle()
    assert world.hooks.events() == [("issues", "opened")]


async def test_a_lost_write_is_answered_then_undone(world: World) -> None:
    """`lost`: the write is made and answered as usual (its webhooks go), then the repository
    is as it was before it, its timeline events too: an acknowledged write the forge lost."""
    _, _, issue = await world.call("POST", ISSUES, "marco", {"title": "t", "labels": ["a"]})
    n = issue["number"]
    await world.idle()
    world.hooks.clear()
    status, _, _ = await world.call("POST", "/_forge/faults", json_body={
        "route": "PATCH /repos/{owner}/{repo}/issues/{issue_number}", "mode": "lost",
        "count": 1})
    assert status == 200
    status, _, body = await world.call("PATCH", f"{ISSUES}/{n}", "marco",
                                       {"labels": ["b"], "state": "closed"})
    assert status == 200 and body["state"] == "closed"
    assert [lb["name"] for lb in body["labels"]] == ["b"]  # answered as made
    await world.idle()
    assert ("issues", "closed") in world.hooks.events()  # its webhooks went
    _, _, now = await world.call("GET", f"{ISSUES}/{n}", "marco")
    assert now["state"] == "open" and [lb["name"] for lb in now["labels"]] == ["a"]
    assert now["updated_at"] == issue["updated_at"]
    _, _, timeline = await world.call("GET", f"{ISSUES}/{n}/timeline", "marco")
    assert [e["event"] for e in timeline] == ["labeled"]  # only the create's
    world.forge.faults.add(route="POST /repos/{owner}/{repo}/issues/{issue_number}/comments",
                           mode="lost", count=1)
    status, _, comment = await world.call("POST", f"{ISSUES}/{n}/comments", "marco",
                                          {"body": "hi"})
    assert status == 201 and comment["id"]
    _, _, comments = await world.call("GET", f"{ISSUES}/{n}/comments", "marco")
    assert comments == []
    status, _, again = await world.call("POST", f"{ISSUES}/{n}/comments", "marco",
                                        {"body": "hi"})
    assert status == 201 and again["id"] != comment["id"]  # ids stay used


async def test_rate_fault_is_probabilistic_and_seedable(world: World) -> None:
    await world.call("POST", "/_forge/faults", json_body={
        "seed": 7, "route": "GET /repos/{owner}/{repo}", "status": 503, "rate": 0.5})
    statuses = [(await world.call("GET", "/repos/acme/vault", "marco"))[0] for _ in range(40)]
    assert set(statuses) == {200, 503}
    await world.call("DELETE", "/_forge/faults")
    status, _, _ = await world.call("GET", "/repos/acme/vault", "marco")
    assert status == 200


async def test_delay_and_rate_limit_refusal_faults(world: World) -> None:
    world.forge.faults.delay("GET /repos/{owner}/{repo}", 0.2)
    started = time.monotonic()
    status, _, _ = await world.call("GET", "/repos/acme/vault", "marco")
    assert status == 200 and time.monotonic() - started >= 0.2
    world.forge.faults.clear()
    world.forge.faults.add(route=CREATE, status=403, kind="secondary_limit", count=1)
    status, headers, body = await world.call("POST", ISSUES, "marco", {"title": "x"})
    assert status == 403 and "secondary rate limit" in body["message"]
    assert headers["Retry-After"] == "60"


async def test_request_log_records_route_auth_and_login(world: World) -> None:
    world.forge.requests.clear()
    token = await world.installation_token()
    await world.call("GET", "/repos/acme/vault/issues/1", auth=f"token {token}")
    await world.call("GET", "/repos/acme/vault", "marco")
    await world.call("GET", "/rate_limit")
    status, _, log = await world.call("GET", "/_forge/requests")
    assert status == 200
    assert [(r["method"], r["route"], r["status"], r["auth"], r["login"]) for r in log] == [
        ("POST", "POST /app/installations/{installation_id}/access_tokens", 201, "app",
         "vaultmail"),
        ("GET", "GET /repos/{owner}/{repo}/issues/{issue_number}", 404, "installation",
         "vaultmail[bot]"),
        ("GET", "GET /repos/{owner}/{repo}", 200, "user", "marco"),
        ("GET", "GET /rate_limit", 200, "none", None),
    ]
    assert world.forge.requests.count(route="GET /repos/{owner}/{repo}") == 1


async def test_clock_limits_and_deliveries_over_http(world: World) -> None:
    before = world.forge.clock.now()
    status, _, body = await world.call("POST", "/_forge/clock", json_body={"advance": 3600})
    assert status == 200 and body["now"] >= before + 3600
    status, _, limits = await world.call("POST", "/_forge/limits", json_body={"primary": 10})
    assert limits["primary"] == 10
    _, headers, _ = await world.call("GET", "/repos/acme/vault", "marco")
    assert headers["X-RateLimit-Limit"] == "10"
    status, _, _ = await world.call("POST", "/_forge/limits", json_body={"bogus": 1})
    assert status == 422
    await world.call("POST", ISSUES, "marco", {"title": "t"})
    status, _, _ = await world.call("POST", "/_forge/webhooks/idle")
    assert status == 200
    status, _, deliveries = await world.call("GET", "/_forge/deliveries?event=issues")
    assert [(d["event"], d["action"], d["status_code"]) for d in deliveries] == [
        ("issues", "opened", 200)]
    assert deliveries[0]["request"]["payload"]["issue"]["title"] == "t"


async def test_unknown_routes_are_github_404s(world: World) -> None:
    status, headers, body = await world.call("GET", "/repos/acme/vault/pulls", "marco")
    assert status == 404 and body["message"] == "Not Found"
    assert "X-RateLimit-Remaining" in headers


async def test_seeding_over_http(world: World) -> None:
    status, _, user = await world.call("POST", "/_forge/users", json_body={"login": "zed"})
    assert status == 201 and user["token"].startswith("ghp_")
    await world.call("POST", "/_forge/repos", json_body={"owner": "acme", "name": "zed-vault"})
    await world.call("POST", "/_forge/permissions", json_body={
        "repo": "acme/zed-vault", "login": "zed", "permission": "write"})
    status, _, body = await world.call("GET", "/repos/acme/zed-vault",
                                       auth=f"token {user['token']}")
    assert status == 200 and body["permissions"]["push"] is True
    status, _, app = await world.call("POST", "/_forge/apps", json_body={
        "slug": "probot", "public_key_pem": world.keys.private_pem,  # public half is kept
        "webhook_url": world.hooks.url, "webhook_secret": "s", "events": ["issues"]})
    assert status == 201
    status, _, inst = await world.call("POST", "/_forge/installations", json_body={
        "app_id": app["id"], "account": "acme"})
    assert status == 201 and inst["id"]
    status, _, _ = await world.call("POST", "/_forge/permissions", json_body={"repo": "x"})
    assert status == 422
