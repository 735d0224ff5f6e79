"""A console session ends with what it signed in with (a forge account the office still says
is the person's, an API token not revoked), and a page of one office counts that office's own
activity alone (found by review)."""

from __future__ import annotations

import hashlib
import re
import time
from pathlib import Path

import aiohttp
import yaml
from yarl import URL

from bot.app.embedded import Embedded
from bot.console import sessions
from bot.console.visitor import COOKIE, TOKEN_LOGIN
from bot.office.config import parse_office
from bot.office.seed import seed_office
from bot.office.source import CONFIG_PATH, CONFIG_REPO
from bot.store import api_tokens
from bot.store import sessions as console_db
from tests.support import ToolClient, forge_sign_in

MARCO = "human:marco@acme.com"
EXAMPLE = Path(__file__).parent.parent.parent / "bot" / "example_office.yml"
EVIL = {
    "org": "evil",
    "humans": [{"email": "mallory@evil.test", "login": "mallory", "permissions": ["mail.send"]}],
    "agents": [{"slug": "spy", "login": "evil-spy", "person": "mallory@evil.test",
                "run": {"triggers": ["mail"], "dispatch": "none"}}],
}


async def test_a_forge_session_ends_once_its_login_is_no_persons_of_the_office(
        embedded: Embedded) -> None:
    """lee signs in to the console with the forge account `lee`. The office then says that
    lee@acme.com is the forge account `lee-real` (a login corrected, an account handed
    over): the account `lee` is nobody of the office any more, and its session must not go on
    acting as human:lee@acme.com (with lee-real's forge access) for the rest of its 8 hours."""
    (app_id,) = embedded.forge.state.apps
    embedded.forge.state.web.authorizations.setdefault("lee", []).append(int(app_id))
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as browser:
        answer = await forge_sign_in(browser, embedded, "/console/sign-in/forge",
                                    embedded.forge_tokens["lee"])
        assert answer.status == 303, "signed in"
        async with browser.get(embedded.app_url + "/console/inbox",
                               allow_redirects=False) as resp:
            assert resp.status == 200
        config = yaml.safe_load(EXAMPLE.read_text())
        for human in config["humans"]:
            if human["email"] == "lee@acme.com":
                human["login"] = "lee-real"
        embedded.forge.put_file("acme/.github", "vaultmail.yml", yaml.safe_dump(config),
                                pusher="admin")
        await embedded.settle()
        office = await embedded.services.offices.get(
            embedded.services.forge_for_org("acme"), "acme")
        assert office is not None and office.by_login("lee") is None, "the new config is in force"
        async with browser.get(embedded.app_url + "/console/inbox",
                               allow_redirects=False) as resp:
            assert resp.status == 303 and "/console/sign-in" in resp.headers["Location"], (
                "the forge account lee is no person of acme any more: its session ended")
        async with browser.get(embedded.app_url + "/console/events",
                               allow_redirects=False) as resp:
            assert resp.status == 401, "nor does its live stream go on"


def _entries(page: str) -> int:
    found = re.search(r"Hash chain intact: (\d+) entries", page)
    assert found, page[:2000]
    return int(found[1])


async def test_the_ledger_page_counts_the_offices_own_entries_not_everyones(
        embedded: Embedded, session: aiohttp.ClientSession) -> None:
    """The chain line of evil's ledger page says how many entries evil's chain holds, not the
    deployment-wide sequence number, which counts every other office's activity too (acme's
    mail volume, read by evil at will)."""
    store = embedded.services.store
    marco = ToolClient(session, embedded, MARCO)
    for n in range(5):  # acme's business, none of evil's
        await marco("mail_send", to="scout", subject=f"acme {n}", body="x")
    await embedded.settle()
    seed_office(embedded.forge, parse_office(yaml.safe_dump(EVIL), "evil.yml", repository=False))
    (app_id,) = embedded.forge.state.apps
    embedded.forge.install_app(int(app_id), "evil")
    await embedded.settle()
    mallory = await api_tokens.create_token(store, "human:mallory@evil.test", "evil")
    headers = {"Authorization": f"Bearer {mallory}"}
    async with session.post(embedded.app_url + "/api/v1/tools/mail_send", headers=headers,
                            json={"to": "spy", "subject": "hello", "body": "x"}) as resp:
        assert resp.status == 200, await resp.text()
    await embedded.settle()
    async with session.get(embedded.app_url + "/console/ledger", headers=headers) as resp:
        assert resp.status == 200
        shown = _entries(await resp.text())
    own = await store.fetchone("SELECT COUNT(*) AS n FROM ledger WHERE chain='evil'")
    assert shown == int(own["n"]), (
        f"evil's page said {shown} entries; evil's chain holds {own['n']} (the rest are acme's)")


def _field(page: str, name: str) -> str:
    found = re.search(rf'name="{name}" value="([^"]*)"', page)
    assert found, f"no field {name}"
    return found[1]


async def _token_sign_in(browser: aiohttp.ClientSession, embedded: Embedded,
                         token: str) -> aiohttp.ClientResponse:
    url = embedded.app_url + "/console"
    async with browser.get(url + "/sign-in") as resp:
        page = await resp.text()
    form = {"csrf": _field(page, "csrf"), "token": token, "next": "/console/inbox"}
    async with browser.post(url + "/sign-in/token", data=form, allow_redirects=False) as resp:
        await resp.read()
        return resp


# evil, installed beside acme, declares a marco@acme.com of its own (its own person)
EVIL_MARCO = {**EVIL, "humans": [*EVIL["humans"], {
    "email": "marco@acme.com", "login": "eve", "permissions": ["mail.send", "editor"]}]}


async def test_a_console_sign_in_with_a_token_that_named_no_office_pins_it_to_its_office(
        embedded: Embedded) -> None:
    """A token made before offices (`vaultmail token create PRINCIPAL`, no --org) is pinned to
    the office it is found in at its first use. Signing in to the console with one kept a
    session of no office, looked up again at each page: once another office declared a
    principal of the same name, marco of acme was turned away from his own console ("in the
    offices of acme, evil") and signed out; once acme then took him out of its config, the
    session went on as evil's marco, reading evil's inbox."""
    store = embedded.services.store
    legacy = await api_tokens.create_token(store, MARCO)  # (no office: from before offices)
    jar = aiohttp.CookieJar
    async with aiohttp.ClientSession(cookie_jar=jar(unsafe=True)) as laptop, \
            aiohttp.ClientSession(cookie_jar=jar(unsafe=True)) as phone:
        for browser in (laptop, phone):
            assert (await _token_sign_in(browser, embedded, legacy)).status == 303, "signed in"
        seed_office(embedded.forge, parse_office(yaml.safe_dump(EVIL_MARCO), "evil.yml",
                                                 repository=False))
        (app_id,) = embedded.forge.state.apps
        embedded.forge.install_app(int(app_id), "evil")
        await embedded.settle()
        async with laptop.get(embedded.app_url + "/console/inbox",
                              allow_redirects=False) as resp:
            assert resp.status == 200, (
                f"marco's session is acme's, whatever evil declares: {resp.status} "
                f"{(await resp.text())[:600]}")
        async with laptop.post(embedded.app_url + "/api/v1/tools/mail_list", json={},
                               headers={"Authorization": f"Bearer {legacy}"}) as resp:
            assert resp.status == 200, "the sign-in pinned the token to acme, as a first use"
        # acme's marco is marcus@acme.com now: human:marco@acme.com is nobody of acme's
        config = EXAMPLE.read_text().replace("marco@acme.com", "marcus@acme.com")
        embedded.forge.put_file(f"acme/{CONFIG_REPO}", CONFIG_PATH, config, pusher="admin")
        await embedded.settle()
        office = await embedded.services.offices.get(
            embedded.services.forge_for_org("acme"), "acme")
        assert office is not None and office.human("marcus@acme.com") is not None
        async with phone.get(embedded.app_url + "/console/inbox",
                             allow_redirects=False) as resp:
            assert resp.status != 200, "acme took marco out: his session is not evil's marco's"


async def test_a_failed_sign_in_pins_no_token_to_an_office_that_does_not_have_it(
        embedded: Embedded) -> None:
    """Found by review: on a deployment of one installation, a token made before offices
    was pinned to that office before anything asked whether the office has its principal;
    the membership check after it then refused the sign-in and revoked the token there. A
    failed sign-in left the token pinned to an office it has no rights in, and dead for good
    (where, with several offices, the same try is refused and leaves it as it was). Now the
    office is asked first: refused, and the token is neither pinned nor revoked."""
    store = embedded.services.store
    ghost = "human:ghost@acme.com"  # in no office's config
    legacy = await api_tokens.create_token(store, ghost)  # (no office: from before offices)
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as browser:
        resp = await _token_sign_in(browser, embedded, legacy)
    assert resp.status == 403, resp.status
    row = await store.fetchone("SELECT org, revoked_at FROM api_tokens WHERE principal=?",
                               (ghost,))
    assert row is not None and (row["org"], row["revoked_at"]) == (None, None), dict(row or {})


async def test_a_session_of_no_office_from_before_sign_in_pinned_tokens_ends(
        embedded: Embedded) -> None:
    """A session signed in with such a token before this release kept no office: it ends, and
    the person signs in again (which pins the token)."""
    store = embedded.services.store
    legacy = await api_tokens.create_token(store, MARCO)
    value = "before-pinning"
    await console_db.add_session(store, hashlib.sha256(value.encode()).hexdigest(), MARCO,
                                 None, TOKEN_LOGIN + api_tokens.token_hash(legacy), "token",
                                 "csrf", time.time(), time.time() + 3600)
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as browser:
        browser.cookie_jar.update_cookies({COOKIE: value}, URL(embedded.app_url))
        async with browser.get(embedded.app_url + "/console/inbox",
                               allow_redirects=False) as resp:
            assert resp.status == 303 and "/console/sign-in" in resp.headers["Location"]
        assert (await _token_sign_in(browser, embedded, legacy)).status == 303
        async with browser.get(embedded.app_url + "/console/inbox",
                               allow_redirects=False) as resp:
            assert resp.status == 200


async def test_a_console_session_ends_with_the_api_token_it_signed_in_with(
        embedded: Embedded) -> None:
    """A token that leaked is revoked (`vaultmail token revoke`): whoever signed in to the
    console with it must not keep its session for the rest of the 8 hours."""
    store = embedded.services.store
    leaked = await api_tokens.create_token(store, MARCO, "acme")
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as browser:
        url = embedded.app_url + "/console"
        async with browser.get(url + "/sign-in") as resp:
            page = await resp.text()
        form = {"csrf": _field(page, "csrf"), "token": leaked, "next": "/console/inbox"}
        async with browser.post(url + "/sign-in/token", data=form,
                                allow_redirects=False) as resp:
            assert resp.status == 303, "signed in with the token"
        async with browser.get(url + "/inbox", allow_redirects=False) as resp:
            assert resp.status == 200
        assert await api_tokens.revoke_token_value(store, leaked)
        async with browser.get(url + "/inbox", allow_redirects=False) as resp:
            assert resp.status == 303, "the token is revoked: so is the session it made"
        async with browser.get(url + "/events", allow_redirects=False) as resp:
            assert resp.status == 401


async def test_a_token_session_made_before_sessions_kept_their_token_ends_too(
        embedded: Embedded) -> None:
    """A console session signed in with an API token before this release kept the principal
    as its login, not the token's hash: which token it was is not known, so it cannot be told
    whether that one was revoked. It went on for the rest of its 8 hours whatever was revoked
    (found by review); it ends, and the person signs in again."""
    store = embedded.services.store
    leaked = await api_tokens.create_token(store, MARCO, "acme")
    value, _ = await sessions.create(store, MARCO, "acme", MARCO, "token")  # (as made before)
    assert await api_tokens.revoke_token_value(store, leaked)
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as browser:
        browser.cookie_jar.update_cookies({COOKIE: value}, URL(embedded.app_url))
        async with browser.get(embedded.app_url + "/console/inbox",
                               allow_redirects=False) as resp:
            assert resp.status == 303, "the token it may have signed in with is revoked"
