"""Web sign-in on the forge, as GitHub's: a sign-in form (login + password, or a personal access
token as the password), a session cookie, sign-out; `Authorization: token` for scripts."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from .conftest import World
from .webclient import Browser, accessible


@pytest.fixture
async def browser(world: World) -> AsyncIterator[Browser]:
    b = Browser.open(world.forge)
    yield b
    await b.close()


async def test_sign_in_form_is_labelled_and_protected(browser: Browser) -> None:
    reply = await browser.get("/login")
    assert reply.status == 200
    assert reply.headers["Content-Type"].startswith("text/html")
    page = reply.page
    accessible(page)
    form = page.forms[0]
    assert form.method == "post" and form.action == "/session"
    assert set(form.fields) >= {"login", "password", "authenticity_token", "return_to"}
    assert form.fields["authenticity_token"]
    for name in ("login", "password"):
        field_id = page.find("input", name=name)[0].attrs["id"]
        assert page.find("label", for_=field_id), f"{name} has no label"
    assert page.find("input", name="password")[0].attrs["type"] == "password"


async def test_sign_in_with_password_sets_an_http_only_lax_session(
        world: World, browser: Browser) -> None:
    reply = await browser.sign_in("marco", return_to="/acme/vault")
    assert reply.status == 302 and reply.location == "/acme/vault"
    cookie = next(v for k, v in reply.headers.items()
                  if k.lower() == "set-cookie" and v.startswith("user_session="))
    assert "HttpOnly" in cookie and "SameSite=Lax" in cookie and "Path=/" in cookie
    page = await browser.get("/acme/vault")
    assert page.status == 200
    assert "Signed in as marco" in page.page.text


async def test_wrong_password_is_refused_with_a_reason(world: World, browser: Browser) -> None:
    reply = await browser.sign_in("marco", password="not-it")
    assert reply.status == 401
    assert "Incorrect username or password." in reply.page.text
    accessible(reply.page)
    assert browser.cookie("user_session") is None
    reply = await browser.sign_in("nobody", password="x")
    assert reply.status == 401
    empty = await browser.submit(await browser.get("/login"), {"login": "", "password": ""})
    assert empty.status == 422 and "login" in empty.page.text.lower()


async def test_a_personal_access_token_signs_in_too(world: World, browser: Browser) -> None:
    reply = await browser.sign_in("rita", password=world.tokens["rita"])
    assert reply.status == 302
    assert (await browser.get("/acme/vault")).status == 200
    # Someone else's token is not rita's password.
    other = Browser.open(world.forge)
    try:
        assert (await other.sign_in("rita", password=world.tokens["marco"])).status == 401
    finally:
        await other.close()


async def test_the_form_needs_its_authenticity_token(world: World, browser: Browser) -> None:
    form = await browser.get("/login")
    reply = await browser.submit(form, {"login": "marco",
                                        "password": world.forge.user_password("marco"),
                                        "authenticity_token": "forged"})
    assert reply.status == 422
    assert "authenticity token" in reply.page.text.lower()
    fresh = Browser.open(world.forge)  # a form posted without the cookie the form page set
    try:
        r = await fresh.request("POST", "/session", data={
            "login": "marco", "password": world.forge.user_password("marco"),
            "authenticity_token": form.page.forms[0].fields["authenticity_token"]})
        assert r.status == 422
    finally:
        await fresh.close()


async def test_return_to_stays_on_the_forge(world: World, browser: Browser) -> None:
    for target in ("https://evil.example/", "//evil.example/x", "/\\evil.example"):
        reply = await browser.sign_in("marco", return_to=target)
        assert reply.status == 302 and reply.location == "/", target


async def test_scripts_sign_in_with_an_authorization_header(
        world: World, browser: Browser) -> None:
    assert (await browser.get("/acme/vault")).status == 404  # private, nobody signed in
    reply = await browser.get("/acme/vault",
                              headers={"Authorization": f"token {world.tokens['rita']}"})
    assert reply.status == 200 and "Signed in as rita" in reply.page.text
    bad = await browser.get("/acme/vault", headers={"Authorization": "token ghp_nope"})
    assert bad.status == 401 and "Bad credentials" in bad.body
    accessible(bad.page)


async def test_sign_out_asks_then_ends_the_session(world: World, browser: Browser) -> None:
    await browser.sign_in("marco")
    old = browser.cookie("user_session")
    assert old
    ask = await browser.get("/logout")
    assert ask.status == 200 and ask.page.forms[0].action == "/logout"
    accessible(ask.page)
    assert (await browser.get("/acme/vault")).status == 200  # GET /logout alone signs no one out
    done = await browser.submit(ask)
    assert done.status == 302 and done.location == "/"
    assert (await browser.get("/acme/vault")).status == 404
    replay = Browser.open(world.forge)  # the old cookie is dead on the forge, not just dropped
    try:
        replay.session.cookie_jar.update_cookies({"user_session": old})
        assert (await replay.get("/acme/vault")).status == 404
    finally:
        await replay.close()


async def test_sessions_expire_after_two_weeks_on_the_forge_clock(
        world: World, browser: Browser) -> None:
    await browser.sign_in("marco")
    world.forge.clock.advance(14 * 86400 - 60)
    assert (await browser.get("/acme/vault")).status == 200
    world.forge.clock.advance(120)
    reply = await browser.get("/acme/vault")
    assert reply.status == 404 and "Sign in" in reply.page.text


async def test_passwords_come_from_the_forge_api_and_controls(world: World) -> None:
    password = world.forge.user_password("marco")
    assert password and password == world.forge.user_password("MARCO")
    assert password != world.forge.user_password("rita")
    status, _, body = await world.call("GET", "/_forge/users/marco/password")
    assert status == 200 and body == {"login": "marco", "password": password}
    status, _, _ = await world.call("GET", "/_forge/users/nobody/password")
    assert status == 404
    status, _, body = await world.call("POST", "/_forge/users", json_body={"login": "nina"})
    assert status == 201 and body["password"] == world.forge.user_password("nina")
    b = Browser.open(world.forge)
    try:
        assert (await b.sign_in("nina", password=body["password"])).status == 302
    finally:
        await b.close()


async def test_a_session_survives_a_restart_with_a_data_dir(
        tmp_path: object, world: World) -> None:
    from localforge import LocalForge

    forge = LocalForge(data_dir=str(tmp_path))
    await forge.start()
    forge.add_user("pia")
    forge.add_repo("pia", "notes")
    b = Browser.open(forge)
    try:
        await b.sign_in("pia")
        cookie = b.cookie("user_session")
        await forge.stop()
        again = LocalForge(data_dir=str(tmp_path))
        await again.start()
        try:
            b.forge = again
            b.session.cookie_jar.clear()
            b.session.cookie_jar.update_cookies({"user_session": cookie or ""})
            reply = await b.get("/pia/notes")
            assert reply.status == 200 and "Signed in as pia" in reply.page.text
        finally:
            await again.stop()
    finally:
        await b.close()


async def test_the_app_install_page_knows_the_signed_in_user(
        world: World, browser: Browser) -> None:
    """Every web route asks the same question: the manifest flow's pages see the session."""
    assert (await browser.get("/apps/vaultmail/installations/new")).status == 401
    await browser.sign_in("admin")
    reply = await browser.get("/apps/vaultmail/installations/new")
    assert reply.status == 200 and "acme" in reply.body
