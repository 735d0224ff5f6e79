"""Issue 23: a manifest posted by a browser that is not signed in to the forge is not lost. The
page says to sign in; signing in there brings the operator back to the App's creation with
the same manifest and state, and creating it redirects with a code, as when signed in first.
The browser here is a cookie jar that follows only what the pages offer: links and forms."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from urllib.parse import parse_qs, urljoin, urlsplit

import aiohttp

from .conftest import World
from .test_manifest import MANIFEST


class _Page(HTMLParser):
    """A page's links and its first form (action, method, fields)."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []
        self.action: str | None = None
        self.method = "get"
        self.fields: dict[str, str] = {}
        self._in_form = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "a" and a.get("href"):
            self.links.append(a["href"])
        elif tag == "form" and self.action is None:
            self.action, self.method, self._in_form = a.get("action", ""), a.get(
                "method", "get").lower(), True
        elif tag == "input" and self._in_form and a.get("name"):
            self.fields[a["name"]] = a.get("value", "")

    def handle_endtag(self, tag: str) -> None:
        if tag == "form":
            self._in_form = False


def _page(text: str) -> _Page:
    page = _Page()
    page.feed(text)
    return page


async def test_signing_in_keeps_the_manifest_and_its_state(world: World) -> None:
    base = world.url
    password = world.forge.user_password("admin")
    manifest = {**MANIFEST, "name": "Signed out bot"}
    jar = aiohttp.CookieJar(unsafe=True)  # cookies for 127.0.0.1, as a browser keeps them
    async with aiohttp.ClientSession(cookie_jar=jar) as browser:
        async with browser.post(f"{base}/organizations/acme/settings/apps/new?state=s-9",
                                data={"manifest": json.dumps(manifest)},
                                allow_redirects=False) as resp:
            assert resp.status == 401
            signed_out = _page(await resp.text())
        sign_in = [h for h in signed_out.links if urlsplit(h).path == "/login"]
        assert sign_in, f"the page links the sign-in: {signed_out.links}"

        async with browser.get(urljoin(base, sign_in[0])) as resp:  # follows redirects
            assert resp.status == 200
            login = _page(await resp.text())
        assert login.action is not None and login.method == "post"
        form = {**login.fields, "login": "admin", "password": password}
        async with browser.post(urljoin(base, login.action), data=form) as resp:
            assert resp.status == 200, await resp.text()
            confirm = _page(await resp.text())
            landed = str(resp.url)
        assert confirm.action is not None and confirm.method == "post", landed
        assert json.loads(confirm.fields["manifest"]) == manifest, "the same manifest"

        async with browser.post(urljoin(landed, confirm.action), data=confirm.fields,
                                allow_redirects=False) as resp:
            assert resp.status == 302, await resp.text()
            location = resp.headers["Location"]
    assert location.startswith(MANIFEST["redirect_url"] + "?"), location
    query = parse_qs(urlsplit(location).query)
    assert query["state"] == ["s-9"], "the state comes back as it was sent"
    status, _, app = await world.call("POST", f"/app-manifests/{query['code'][0]}/conversions")
    assert status == 201, app
    assert (app["name"], app["owner"]["login"]) == ("Signed out bot", "acme")


async def test_an_unknown_pending_manifest_says_to_post_it_again(world: World) -> None:
    async with aiohttp.ClientSession() as anon, anon.get(
            f"{world.url}/settings/apps/new?pending=nope",
            headers={"Authorization": f"token {world.tokens['admin']}"}) as resp:
        assert resp.status == 404
        assert "again" in await resp.text()
