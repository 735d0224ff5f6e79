"""Registering an App from a manifest, as GitHub describes it ("Registering a GitHub App from a
manifest"): the form posts `manifest` and `state`, the forge redirects to the manifest's
`redirect_url` with a one-hour, single-use `code`, and `POST /app-manifests/{code}/conversions`
creates the App and answers its credentials once. Then the install page installs it."""

from __future__ import annotations

import json
import time
from typing import Any
from urllib.parse import parse_qs, urlsplit

import aiohttp
import jwt

from .conftest import Hooks, World, verify_signature

MANIFEST: dict[str, Any] = {
    "name": "Mailbot",
    "url": "https://mailbot.example/",
    "hook_attributes": {"url": "http://127.0.0.1:9/webhook", "active": True},
    "redirect_url": "http://127.0.0.1:9/setup/callback",
    "callback_urls": ["http://127.0.0.1:9/setup/installed"],
    "setup_url": "http://127.0.0.1:9/setup/installed",
    "description": "mail between agents",
    "public": False,
    "default_events": ["issues", "issue_comment", "label", "push"],
    "default_permissions": {"issues": "write", "metadata": "read", "contents": "read"},
}


async def _submit(world: World, path: str, manifest: Any, who: str | None = "admin",
                  state: str = "s-1") -> tuple[int, dict[str, str], str]:
    headers = {"Authorization": f"token {world.tokens[who]}"} if who else {}
    form = {"manifest": manifest if isinstance(manifest, str) else json.dumps(manifest)}
    async with world.session.post(f"{world.url}{path}?state={state}", data=form,
                                  headers=headers, allow_redirects=False) as resp:
        return resp.status, dict(resp.headers), await resp.text()


def _code(location: str) -> tuple[str, str]:
    query = parse_qs(urlsplit(location).query)
    return query["code"][0], query["state"][0]


async def _convert(world: World, code: str) -> tuple[int, Any]:
    async with world.session.post(f"{world.url}/app-manifests/{code}/conversions") as resp:
        return resp.status, await resp.json()


async def test_the_form_redirects_with_a_code_and_the_conversion_creates_the_app_once(
        world: World, hooks: Hooks) -> None:
    manifest = {**MANIFEST, "hook_attributes": {"url": hooks.url}}
    status, headers, _ = await _submit(world, "/organizations/acme/settings/apps/new", manifest)
    assert status == 302
    location = headers["Location"]
    assert location.startswith("http://127.0.0.1:9/setup/callback?")
    code, state = _code(location)
    assert state == "s-1", "the state comes back as it was sent"
    assert not any(a.slug == "mailbot" for a in world.forge.state.apps.values()), \
        "the App is created by the conversion, not by the form"

    status, app = await _convert(world, code)
    assert status == 201, app
    assert (app["slug"], app["name"], app["owner"]["login"]) == ("mailbot", "Mailbot", "acme")
    assert app["external_url"] == "https://mailbot.example/"
    assert app["html_url"] == f"{world.url}/apps/mailbot"
    assert set(app["events"]) == {"issues", "issue_comment", "label", "push"}
    assert app["permissions"] == MANIFEST["default_permissions"]
    assert app["client_id"] and app["client_secret"] and app["webhook_secret"]
    assert "PRIVATE KEY-----" in app["pem"]
    stored = world.forge.state.apps[app["id"]]
    assert stored.setup_url == MANIFEST["setup_url"]
    assert stored.callback_urls == MANIFEST["callback_urls"]

    again, body = await _convert(world, code)
    assert again == 404 and body["message"] == "Not Found", "a code is used once"

    # The private key works as the App's: a JWT signed with it reads GET /app.
    now = int(time.time())
    token = jwt.encode({"iat": now - 30, "exp": now + 300, "iss": str(app["id"])}, app["pem"],
                       algorithm="RS256")
    s, _, me = await world.call("GET", "/app", auth=f"Bearer {token}")
    assert s == 200 and me["slug"] == "mailbot"

    # Installing it: the install page, then a redirect to setup_url; its webhooks are signed
    # with the webhook secret the conversion gave.
    page = await _page(world, "/apps/mailbot/installations/new")
    assert 'name="account" value="acme"' in page
    hooks.clear()
    status, headers = await _install(world, "mailbot", "acme")
    assert status == 302
    where = urlsplit(headers["Location"])
    assert f"{where.scheme}://{where.netloc}{where.path}" == MANIFEST["setup_url"]
    query = parse_qs(where.query)
    assert query["setup_action"] == ["install"]
    inst_id = int(query["installation_id"][0])
    assert world.forge.state.installations[inst_id].account == "acme"
    await world.idle()
    (created,) = [r for r in hooks.received if r.event == "installation"]
    assert created.action == "created"
    assert verify_signature(app["webhook_secret"], created.body,
                            created.headers["X-Hub-Signature-256"])


async def test_the_api_base_of_enterprise_server_takes_the_conversion_too(world: World) -> None:
    status, headers, _ = await _submit(world, "/settings/apps/new", MANIFEST, who="marco")
    assert status == 302
    code, _ = _code(headers["Location"])
    async with world.session.post(f"{world.url}/api/v3/app-manifests/{code}/conversions") as r:
        assert r.status == 201
        app = await r.json()
    assert app["owner"]["login"] == "marco", "registered on the user's own account"


async def test_a_code_expires_an_hour_after_on_the_forge_clock(world: World) -> None:
    _, headers, _ = await _submit(world, "/settings/apps/new", MANIFEST)
    code, _ = _code(headers["Location"])
    world.forge.clock.advance(3601)
    status, body = await _convert(world, code)
    assert status == 404 and body["message"] == "Not Found"
    status, _ = await _convert(world, "no-such-code")
    assert status == 404


async def test_who_may_register_for_an_org(world: World) -> None:
    status, _, page = await _submit(world, "/organizations/acme/settings/apps/new", MANIFEST,
                                    who=None)
    assert status == 401 and "Authorization: token" in page, "not signed in: says how"
    status, _, _ = await _submit(world, "/organizations/acme/settings/apps/new", MANIFEST,
                                 who="marco")
    assert status == 404, "a member who does not own the org cannot register Apps for it"
    status, _, _ = await _submit(world, "/organizations/nope/settings/apps/new", MANIFEST)
    assert status == 404


async def test_a_bad_manifest_is_refused_naming_what_is_wrong(world: World) -> None:
    cases: list[tuple[Any, str]] = [
        ("{not json", "not JSON"),
        ({k: v for k, v in MANIFEST.items() if k != "url"}, "url"),
        ({**MANIFEST, "colour": "blue"}, "colour"),
        ({**MANIFEST, "default_events": ["installation"]}, "installation"),
        ({**MANIFEST, "default_permissions": {"issues": "write"}}, "push"),
        ({**MANIFEST, "callback_urls": [f"https://x.example/{i}" for i in range(11)]},
         "callback_urls"),
        ({**MANIFEST, "default_permissions": {"issues": "admin"}}, "issues"),
        ({**MANIFEST, "hook_attributes": {"active": True}}, "hook_attributes.url"),
    ]
    for manifest, named in cases:
        status, _, page = await _submit(world, "/settings/apps/new", manifest)
        assert status == 422, (manifest, page)
        assert named in page, (named, page)


async def test_the_name_must_be_free(world: World) -> None:
    manifest = {**MANIFEST, "name": "vaultmail"}  # the App of the fixture
    status, _, page = await _submit(world, "/settings/apps/new", manifest)
    assert status == 422 and "already" in page


async def test_a_private_app_installs_only_on_its_owner_a_public_one_anywhere(
        world: World) -> None:
    world.forge.add_org("globex", owner="admin")
    for name, public in (("Private one", False), ("Public one", True)):
        _, headers, _ = await _submit(world, "/organizations/acme/settings/apps/new",
                                      {**MANIFEST, "name": name, "public": public})
        status, app = await _convert(world, _code(headers["Location"])[0])
        assert status == 201
        page = await _page(world, f"/apps/{app['slug']}/installations/new")
        offered = 'name="account" value="globex"' in page
        status, _ = await _install(world, app["slug"], "globex")
        if public:
            assert offered and status == 302
        else:
            assert not offered and status == 422
    status, _ = await _install(world, "no-such-app", "acme")
    assert status == 404


async def _page(world: World, path: str, who: str = "admin") -> str:
    async with world.session.get(world.url + path, headers={
            "Authorization": f"token {world.tokens[who]}"}) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.text()


async def _install(world: World, slug: str, account: str,
                   who: str = "admin") -> tuple[int, dict[str, str]]:
    async with world.session.post(
            f"{world.url}/apps/{slug}/installations/new", data={"account": account},
            headers={"Authorization": f"token {world.tokens[who]}"},
            allow_redirects=False) as resp:
        return resp.status, dict(resp.headers)


async def test_without_a_setup_url_the_install_ends_on_a_page(world: World) -> None:
    manifest = {k: v for k, v in MANIFEST.items() if k != "setup_url"}
    _, headers, _ = await _submit(world, "/organizations/acme/settings/apps/new", manifest)
    _, app = await _convert(world, _code(headers["Location"])[0])
    async with aiohttp.ClientSession() as s, s.post(
            f"{world.url}/apps/{app['slug']}/installations/new", data={"account": "acme"},
            headers={"Authorization": f"token {world.tokens['admin']}"}) as resp:
        assert resp.status == 200
        assert "Installed" in await resp.text()
