"""GitHub App authentication: RS256 JWTs, installation tokens that expire on the forge clock."""

from __future__ import annotations

import time

import aiohttp
import jwt
from gidgethub import apps
from gidgethub.aiohttp import GitHubAPI

from .conftest import World


async def test_installation_token_flow_and_expiry(world: World) -> None:
    status, _, body = await world.call(
        "POST", f"/app/installations/{world.installation_id}/access_tokens",
        auth=f"Bearer {world.jwt()}")
    assert status == 201
    assert body["token"].startswith("ghs_")
    assert body["repository_selection"] == "all"
    assert body["permissions"]["issues"] == "write"
    auth = f"token {body['token']}"
    status, _, _ = await world.call("GET", "/repos/acme/vault/issues", auth=auth)
    assert status == 200
    world.forge.clock.advance(3599)
    status, _, _ = await world.call("GET", "/repos/acme/vault/issues", auth=auth)
    assert status == 200
    world.forge.clock.advance(1)
    status, _, body = await world.call("GET", "/repos/acme/vault/issues", auth=auth)
    assert status == 401 and body["message"] == "Bad credentials"
    fresh = await world.installation_token()  # a JWT minted on the wall clock still works
    status, _, _ = await world.call("GET", "/repos/acme/vault/issues", auth=f"token {fresh}")
    assert status == 200


async def test_tokens_vary_in_length(world: World) -> None:
    lengths = {len(await world.installation_token()) for _ in range(8)}
    assert len(lengths) > 1


async def test_iss_as_number_or_string(world: World) -> None:
    for iss in (world.app_id, str(world.app_id)):
        status, _, body = await world.call("GET", "/app", auth=f"Bearer {world.jwt(iss=iss)}")
        assert status == 200
        assert body["slug"] == "vaultmail" and body["id"] == world.app_id


async def test_bad_jwts_are_401(world: World) -> None:
    now = int(time.time())
    bad = {
        "exp 11 minutes ahead": world.jwt(iat=now, exp=now + 660),
        "expired": world.jwt(iat=now - 700, exp=now - 100),
        "iat in the future": world.jwt(iat=now + 300, exp=now + 500),
        "unknown app": world.jwt(iss="999"),
    }
    for why, token in bad.items():
        status, _, body = await world.call("GET", "/app", auth=f"Bearer {token}")
        assert status == 401, why
        assert body["message"], why
    other = jwt.encode({"iat": now - 60, "exp": now + 500, "iss": str(world.app_id)},
                       _other_key(), algorithm="RS256")
    status, _, _ = await world.call("GET", "/app", auth=f"Bearer {other}")
    assert status == 401


def _other_key() -> str:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


async def test_app_endpoints_need_the_jwt(world: World) -> None:
    token = await world.installation_token()
    status, _, _ = await world.call("GET", "/app", auth=f"token {token}")
    assert status == 401
    status, _, _ = await world.call("GET", "/app/hook/deliveries", "marco")
    assert status == 401
    status, _, _ = await world.call("GET", "/repos/acme/vault/issues",
                                    auth=f"Bearer {world.jwt()}")
    assert status == 403


async def test_installation_lookups(world: World) -> None:
    auth = f"Bearer {world.jwt()}"
    status, _, body = await world.call("GET", "/app/installations", auth=auth)
    assert status == 200 and [i["id"] for i in body] == [world.installation_id]
    assert body[0]["account"]["login"] == "acme"
    status, _, body = await world.call("GET", "/repos/acme/vault/installation", auth=auth)
    assert status == 200 and body["id"] == world.installation_id
    world.forge.add_org("solo", owner="olga")
    world.forge.add_repo("solo", "r")
    status, _, _ = await world.call("GET", "/repos/solo/r/installation", auth=auth)
    assert status == 404


async def test_narrowed_token_sees_only_named_repositories(world: World) -> None:
    world.forge.add_repo("acme", "other")
    status, _, body = await world.call(
        "POST", f"/app/installations/{world.installation_id}/access_tokens",
        auth=f"Bearer {world.jwt()}", json_body={"repositories": ["other"]})
    assert status == 201 and body["repository_selection"] == "selected"
    auth = f"token {body['token']}"
    status, _, _ = await world.call("GET", "/repos/acme/vault", auth=auth)
    assert status == 404
    status, _, _ = await world.call("GET", "/repos/acme/other", auth=auth)
    assert status == 200


async def test_gidgethub_client_end_to_end(world: World) -> None:
    async with aiohttp.ClientSession() as session:
        app_gh = GitHubAPI(session, "vaultmail-tests", base_url=world.url)
        got = await apps.get_installation_access_token(
            app_gh, installation_id=str(world.installation_id), app_id=str(world.app_id),
            private_key=world.keys.private_pem)
        gh = GitHubAPI(session, "vaultmail-tests", oauth_token=got["token"],
                       base_url=world.url)
        issue = await gh.post("/repos/acme/vault/issues",
                              data={"title": "from gidgethub", "labels": ["mail:new"]})
        assert issue["user"]["login"] == "vaultmail[bot]"
        assert issue["user"]["type"] == "Bot"
        assert issue["performed_via_github_app"]["slug"] == "vaultmail"
        for i in range(4):
            await gh.post("/repos/acme/vault/issues", data={"title": f"more {i}"})
        titles = [i["title"] async for i in gh.getiter("/repos/acme/vault/issues?per_page=2")]
        assert len(titles) == 5
        assert gh.rate_limit is not None and gh.rate_limit.remaining < 5000


async def test_a_suspended_installation_is_listed_but_gets_no_token_and_no_webhook(
        world: World) -> None:
    """GitHub's "Suspend an app installation": the App's access to the API and to webhook
    events is blocked for that account; it stays in the App's installations."""
    old = await world.installation_token()
    world.hooks.clear()
    world.forge.suspend_app(world.installation_id)
    app = f"Bearer {world.jwt()}"
    status, _, listed = await world.call("GET", "/app/installations", auth=app)
    assert status == 200 and listed[0]["suspended_by"]["login"] == "admin"
    assert listed[0]["suspended_at"]
    status, _, body = await world.call(
        "POST", f"/app/installations/{world.installation_id}/access_tokens", auth=app)
    assert (status, body["message"]) == (403, "This installation has been suspended")
    status, _, _ = await world.call("GET", "/repos/acme/vault/issues", auth=f"token {old}")
    assert status == 401
    await world.call("POST", "/repos/acme/vault/issues", "marco", {"title": "unseen"})
    await world.idle()
    assert world.hooks.events() == [("installation", "suspend")]

    world.hooks.clear()
    world.forge.unsuspend_app(world.installation_id)
    status, _, listed = await world.call("GET", "/app/installations", auth=app)
    assert (listed[0]["suspended_by"], listed[0]["suspended_at"]) == (None, None)
    token = await world.installation_token()
    status, _, _ = await world.call("GET", "/repos/acme/vault/issues", auth=f"token {token}")
    assert status == 200
    await world.call("POST", "/repos/acme/vault/issues", "marco", {"title": "seen"})
    await world.idle()
    assert world.hooks.events() == [("installation", "unsuspend"), ("issues", "opened")]


async def test_installations_are_listed_30_a_page_unless_asked_and_100_at_most(
        world: World) -> None:
    for i in range(150):
        world.forge.add_org(f"org{i}", owner="admin")
        world.forge.install_app(world.app_id, f"org{i}")
    app = f"Bearer {world.jwt()}"
    status, headers, first = await world.call("GET", "/app/installations", auth=app)
    assert status == 200 and len(first) == 30 and 'rel="next"' in headers["Link"]
    status, headers, big = await world.call("GET", "/app/installations?per_page=500", auth=app)
    assert len(big) == 100
    nxt = headers["Link"].split(">;")[0].lstrip("<")
    status, headers, rest = await world.call("GET", nxt, auth=app)
    assert len(rest) == 51 and 'rel="next"' not in headers["Link"]
    assert len({i["id"] for i in big + rest}) == 151
