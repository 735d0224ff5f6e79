"""Registration from app.yml, end to end over HTTP, as an operator does it: `vaultmail register`
serves the manifest form, the forge (a LocalForge started here) creates the App and redirects
back with a code, the code is exchanged for the App's credentials, which land in .env (mode
0600, other lines kept); the App is installed on two organisations, each with its own office,
and `vaultmail serve` with that .env carries mail in both. `vaultmail serve` without
credentials offers the same page, then carries on as a normal serve."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import stat
import sys
from collections.abc import AsyncIterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import aiohttp
import pytest
import yaml

from bot.app.setup import Forge, SetupPage, load_manifest, serve_page, shown_url
from bot.cli.process import listen
from bot.office.config import load_office
from bot.office.seed import seed_office
from localforge import LocalForge
from localforge.github.routes_manifest import check_manifest
from tests.support import free_port

ROOT = Path(__file__).resolve().parents[2]
GLOBEX = """
org: globex
vault_pattern: "{slug}-vault"
humans:
  - {email: amy@globex.test, login: amy, permissions: [mail.send, editor]}
agents:
  - slug: scout
    login: globex-scout
    person: amy@globex.test
    run: {triggers: [], dispatch: none}
    capabilities: {mail.send: ["*"]}
"""
# The parameters GitHub documents for a manifest ("Registering a GitHub App from a manifest").
DOCUMENTED = {"name", "url", "hook_attributes", "redirect_url", "callback_urls", "setup_url",
              "description", "public", "default_events", "default_permissions",
              "request_oauth_on_install", "setup_on_update"}


class _Form(HTMLParser):
    """The first form of a page: its action and its fields."""

    def __init__(self) -> None:
        super().__init__()
        self.action: str | None = None
        self.fields: dict[str, str] = {}
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "form" and self.action is None:
            self.action = a.get("action", "")
        elif tag == "input" and a.get("name"):
            self.fields.setdefault(a["name"], a.get("value", ""))
        elif tag == "a" and a.get("href"):
            self.links.append(a["href"])


def _parse(page: str) -> _Form:
    form = _Form()
    form.feed(page)
    return form


def _setup_link(line: str) -> str:
    """The registration page's address, its key included, as printed."""
    found = re.search(r"(http://\S+/setup\?key=[\w-]+)", line)
    assert found is not None, line
    return found[1]


async def _line(stream: asyncio.StreamReader | None, needle: str, timeout: float = 60) -> str:
    """The first line of a process's output that contains `needle`."""
    assert stream is not None
    seen = []
    async with asyncio.timeout(timeout):
        while True:
            raw = await stream.readline()
            if not raw:
                raise AssertionError(f"{needle!r} never printed; output: {seen}")
            line = raw.decode()
            seen.append(line)
            if needle in line:
                return line


async def _cli(*args: str, cwd: Path, env: dict[str, str] | None = None,
               ) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot.cli.main", *args, cwd=str(cwd),
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(cwd),
             "PYTHONPATH": str(ROOT), **(env or {})},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)


async def _run(*args: str, cwd: Path, env: dict[str, str] | None = None,
               ) -> tuple[int, str, str]:
    proc = await _cli(*args, cwd=cwd, env=env)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def _stop(proc: asyncio.subprocess.Process) -> int:
    if proc.returncode is None:
        proc.send_signal(signal.SIGTERM)
    return await asyncio.wait_for(proc.wait(), 30)


@pytest.fixture
async def forge() -> AsyncIterator[LocalForge]:
    """A forge set up as two organisations would be: acme (the example office) and globex,
    each with its office config in its `.github` repository; `admin` owns both."""
    forge = LocalForge()
    await forge.start()
    seed_office(forge, load_office())
    seed_office(forge, load_office_text(GLOBEX))
    try:
        yield forge
    finally:
        await forge.stop()


def load_office_text(text: str) -> Any:
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False) as f:
        f.write(text)
    try:
        return load_office(f.name)
    finally:
        os.unlink(f.name)


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    # keeps cookies for 127.0.0.1 as a browser does (aiohttp's jar, by default, does not)
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as s:
        yield s


async def _text(session: aiohttp.ClientSession, url: str, status: int = 200,
                **kw: Any) -> str:
    async with session.get(url, **kw) as resp:
        text = await resp.text()
        assert resp.status == status, (url, resp.status, text)
        return text


async def _submit_to_forge(session: aiohttp.ClientSession, form: _Form,
                           pat: str) -> str:
    """What the operator's browser does with the manifest form: POST it to the forge as the
    signed-in user; answers the redirect's target."""
    assert form.action
    async with session.post(form.action, data={"manifest": form.fields["manifest"]},
                            headers={"Authorization": f"token {pat}"},
                            allow_redirects=False) as resp:
        assert resp.status == 302, await resp.text()
        return resp.headers["Location"]


async def _install(session: aiohttp.ClientSession, install_url: str, account: str,
                   pat: str) -> str:
    page = await _text(session, install_url, headers={"Authorization": f"token {pat}"})
    assert f'value="{account}"' in page, page
    async with session.post(install_url, data={"account": account},
                            headers={"Authorization": f"token {pat}"},
                            allow_redirects=False) as resp:
        assert resp.status == 302, await resp.text()
        return resp.headers["Location"]


async def _until_serving(session: aiohttp.ClientSession, url: str,
                         proc: asyncio.subprocess.Process) -> dict[str, Any]:
    """Poll the app's liveness probe (bounded) until the normal app answers it."""
    for _ in range(300):
        assert proc.returncode is None, "the app exited"
        with contextlib.suppress(aiohttp.ClientError):
            async with session.get(url + "/healthz") as resp:
                body: dict[str, Any] = await resp.json(content_type=None)
                if resp.status == 200 and body.get("status") == "ok":
                    return body
        await asyncio.sleep(0.1)
    raise AssertionError("vaultmail serve never served")


async def _tool(session: aiohttp.ClientSession, app_url: str, token: str, name: str,
                **args: Any) -> tuple[int, Any]:
    async with session.post(f"{app_url}/api/v1/tools/{name}", json=args,
                            headers={"Authorization": f"Bearer {token}"}) as resp:
        return resp.status, await resp.json()


def _env_file(path: Path) -> dict[str, str]:
    from dotenv import dotenv_values

    return {k: v for k, v in dotenv_values(path).items() if v is not None}


async def test_register_install_on_two_orgs_serve_and_mail_in_both(
        forge: LocalForge, session: aiohttp.ClientSession, tmp_path: Path) -> None:
    admin = forge.user_token("admin")
    reg_port, app_port = free_port(), free_port()
    app_url = f"http://127.0.0.1:{app_port}"
    data = tmp_path / "data"
    env_path = tmp_path / ".env"
    env_path.write_text(f"# the operator's own lines\nHOST=127.0.0.1\nPORT={app_port}\n"
                        f"VAULTMAIL_DATA={data}\nVAULTMAIL_RECONCILE_SECONDS=0.5\n")
    env_path.chmod(0o644)

    register = await _cli("register", "--org", "acme", "--forge", forge.url, "--url", app_url,
                          "--port", str(reg_port), "--env-file", str(env_path), "--public",
                          cwd=tmp_path)
    try:
        line = await _line(register.stdout, "/setup")
        setup_url = f"http://127.0.0.1:{reg_port}/setup?key="
        assert setup_url in line, line
        form = _parse(await _text(session, _setup_link(line)))
        assert form.action is not None
        action = urlsplit(form.action)
        assert f"{action.scheme}://{action.netloc}{action.path}" == \
            f"{forge.url}/organizations/acme/settings/apps/new"
        state = parse_qs(action.query)["state"][0]
        manifest = json.loads(form.fields["manifest"])
        app_yml = yaml.safe_load((ROOT / "app.yml").read_text())
        assert manifest["hook_attributes"] == {"url": f"{app_url}/webhook", "active": True}
        assert manifest["redirect_url"] == f"http://127.0.0.1:{reg_port}/setup/callback"
        assert manifest["setup_url"] == f"{app_url}/setup/installed"
        assert manifest["default_events"] == app_yml["default_events"]
        assert manifest["default_permissions"] == app_yml["default_permissions"]
        assert manifest["public"] is True, "--public"

        callback = await _submit_to_forge(session, form, admin)
        assert callback.startswith(f"http://127.0.0.1:{reg_port}/setup/callback?")
        assert parse_qs(urlsplit(callback).query)["state"] == [state]
        done = _parse(await _text(session, callback))
        install_url = f"{forge.url}/apps/vaultmail/installations/new"
        assert install_url in done.links, done.links
        printed = await _line(register.stdout, "installations/new")
        assert install_url in printed
        assert await asyncio.wait_for(register.wait(), 30) == 0, "register exits once done"
    finally:
        await _stop(register)

    # .env: the App's credentials, mode 0600, the operator's lines kept
    assert stat.S_IMODE(env_path.stat().st_mode) == 0o600
    text = env_path.read_text()
    assert text.startswith(f"# the operator's own lines\nHOST=127.0.0.1\nPORT={app_port}\n")
    values = _env_file(env_path)
    (app,) = [a for a in forge.state.apps.values() if a.slug == "vaultmail"]
    assert values["APP_ID"] == str(app.id)
    assert values["WEBHOOK_SECRET"] == app.webhook_secret
    assert values["GITHUB_CLIENT_ID"] == app.client_id
    assert values["GITHUB_CLIENT_SECRET"] == app.client_secret
    assert "PRIVATE KEY-----" in values["PRIVATE_KEY"] and "\n" in values["PRIVATE_KEY"]
    host = urlsplit(forge.url).netloc
    assert (values["GHE_HOST"], values["GHE_PROTOCOL"]) == (host, "http")
    assert app.owner == "acme" and app.webhook_url == f"{app_url}/webhook"

    # Installed on both organisations, from the link; the forge then sends the browser to
    # the App's setup URL
    installed: dict[str, str] = {}
    for org in ("acme", "globex"):
        installed[org] = await _install(session, install_url, org, admin)
        where = urlsplit(installed[org])
        assert f"{where.scheme}://{where.netloc}{where.path}" == f"{app_url}/setup/installed"
        assert parse_qs(where.query)["setup_action"] == ["install"]

    serve = await _cli("serve", cwd=tmp_path)  # everything from .env
    try:
        health = await _until_serving(session, app_url, serve)
        assert health["app"] == "vaultmail"
        tokens = {}
        for principal, org in (("human:marco@acme.com", "acme"),
                               ("human:amy@globex.test", "globex")):
            code, out, err = await _run("token", "create", principal, "--org", org,
                                        "--data", str(data), cwd=tmp_path)
            assert code == 0, err
            tokens[org] = out.split()[-1]
        page = await _text(session, installed["globex"])  # the setup URL, on the app itself
        assert "installed" in page.lower()
        registered = _parse(await _text(session, app_url + "/setup"))
        assert install_url in registered.links, "once registered, /setup links the install page"

        status, sent = await _tool(session, app_url, tokens["acme"], "mail_send", to="scout",
                                   subject="EU prices", body="Check them")
        assert status == 200, sent
        status, sent = await _tool(session, app_url, tokens["globex"], "mail_send", to="scout",
                                   subject="Q3 numbers", body="Numbers please")
        assert status == 200, sent
    finally:
        assert await _stop(serve) == 0

    def titles(repo: str) -> list[str]:
        vault = forge.state.repo_by_full_name(repo)
        assert vault is not None
        return [i.title for i in vault.issues.values() if i.user == "vaultmail[bot]"]

    assert any("EU prices" in t for t in titles("acme/scout-vault"))
    assert any("Q3 numbers" in t for t in titles("globex/scout-vault"))
    assert not any("Q3" in t for t in titles("acme/scout-vault")), "each org its own vault"


async def test_serve_without_credentials_offers_the_setup_page_then_serves(
        forge: LocalForge, session: aiohttp.ClientSession, tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    serve = await _cli("serve", cwd=tmp_path, env={
        "HOST": "127.0.0.1", "PORT": str(port), "VAULTMAIL_DATA": str(tmp_path / "data"),
        "GHE_HOST": urlsplit(forge.url).netloc, "GHE_PROTOCOL": "http", "GH_ORG": "globex"})
    try:
        line = await _line(serve.stderr, "not registered yet")
        assert f"open {url}/setup?key=" in line and "GITHUB_APP_ID" in line, line
        async with session.get(url + "/healthz") as resp:
            assert resp.status == 200, "alive while it waits to be registered"
            assert (await resp.json())["status"] == "not registered"
        async with session.get(url + "/readyz") as resp:
            assert resp.status == 503 and "registered" in (await resp.json())["failed"]
            assert resp.headers.get("Retry-After") == "5", dict(resp.headers)  # as every 503

        form = _parse(await _text(session, _setup_link(line)))
        assert form.action is not None
        assert form.action.startswith(f"{forge.url}/organizations/globex/settings/apps/new?")
        manifest = json.loads(form.fields["manifest"])
        assert manifest["hook_attributes"]["url"] == f"{url}/webhook", "the app's own URL"
        assert manifest["redirect_url"] == f"{url}/setup/callback"
        callback = await _submit_to_forge(session, form, forge.user_token("admin"))
        done = _parse(await _text(session, callback))
        assert f"{forge.url}/apps/vaultmail/installations/new" in done.links

        health = await _until_serving(session, url, serve)  # carries on as a normal serve
        assert health["app"] == "vaultmail"
        assert stat.S_IMODE((tmp_path / ".env").stat().st_mode) == 0o600
        assert _env_file(tmp_path / ".env")["APP_ID"] == str(
            next(a.id for a in forge.state.apps.values() if a.slug == "vaultmail"))
    finally:
        assert await _stop(serve) == 0


async def test_a_stranger_cannot_register_the_deployment_as_their_own_app(
        forge: LocalForge, session: aiohttp.ClientSession, tmp_path: Path) -> None:
    """`serve` without credentials listens where the world may reach it: /setup gives out a
    form only with the key it printed, and a return from the forge counts only in the browser
    that opened it. Before, anyone who reached /setup first registered their own App (their
    webhook URL, their private keys), and the deployment carried on as it."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    serve = await _cli("serve", cwd=tmp_path, env={
        "HOST": "127.0.0.1", "PORT": str(port), "VAULTMAIL_DATA": str(tmp_path / "data"),
        "GHE_HOST": urlsplit(forge.url).netloc, "GHE_PROTOCOL": "http"})
    forge.add_user("mallory")
    try:
        line = await _line(serve.stderr, "not registered yet")
        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as stranger:
            page = await _text(stranger, url + "/setup", status=403)
            assert "key" in page and "state=" not in page, "no form, no state for a stranger"
            await _text(stranger, url + "/setup?key=guess", status=403)
            # (a key not in ASCII was a 500: the compare refused to compare it)
            await _text(stranger, url + "/setup?key=%C3%A9%C3%A9", status=403)
            # the operator's own page, its state seen by the stranger (a referrer, a log)
            form = _parse(await _text(session, _setup_link(line)))
            manifest = json.loads(form.fields["manifest"])
            manifest["hook_attributes"]["url"] = "https://attacker.example/hook"
            assert form.action is not None
            async with stranger.post(form.action, data={"manifest": json.dumps(manifest)},
                                     headers={"Authorization":
                                              f"token {forge.user_token('mallory')}"},
                                     allow_redirects=False) as resp:
                assert resp.status == 302, await resp.text()
                callback = resp.headers["Location"]
            page = await _text(stranger, callback, status=400)
            assert "browser" in page, page
        assert not (tmp_path / ".env").exists(), "nothing written for the stranger's App"
        assert serve.returncode is None, "still waiting for the operator"
    finally:
        assert await _stop(serve) == 0


async def test_the_callback_checks_state_and_says_what_to_do_with_a_bad_code(
        forge: LocalForge, session: aiohttp.ClientSession, tmp_path: Path) -> None:
    port = free_port()
    register = await _cli("register", "--forge", forge.url, "--url", "http://127.0.0.1:9",
                          "--port", str(port), "--env-file", str(tmp_path / ".env"),
                          cwd=tmp_path)
    base = f"http://127.0.0.1:{port}"
    try:
        form = _parse(await _text(session, _setup_link(await _line(register.stdout,
                                                                   "/setup"))))
        assert form.action is not None and form.action.startswith(
            f"{forge.url}/settings/apps/new?"), "no --org: the user's own account"
        state = parse_qs(urlsplit(form.action).query)["state"][0]
        page = await _text(session, f"{base}/setup/callback?code=abc&state=forged", status=400)
        assert "/setup" in page and "state" in page
        page = await _text(session, f"{base}/setup/callback?code=nope&state={state}",
                           status=502)
        assert "404" in page and "/setup" in page, page
        page = await _text(session, f"{base}/setup/callback?code=nope&state={state}",
                           status=400)
        assert "state" in page, "a state is good for one return"
        assert register.returncode is None, "still waiting for a registration"
        assert not (tmp_path / ".env").exists()
    finally:
        assert await _stop(register) == 1, "stopped before registering: exit 1"


async def test_register_refuses_bad_input_before_serving_anything(tmp_path: Path) -> None:
    code, _, err = await _run("register", "--url", "ftp://x", cwd=tmp_path)
    assert code == 2 and "--url" in err and "http" in err, err
    code, _, err = await _run("register", "--url", "https://app.example",
                              "--forge", "https://api.github.com", cwd=tmp_path)
    assert code == 2 and "https://github.com" in err, err
    bad = tmp_path / "bad.yml"
    bad.write_text(yaml.safe_dump({**yaml.safe_load((ROOT / "app.yml").read_text()),
                                   "colour": "blue"}))
    code, _, err = await _run("register", "--url", "https://app.example", "--manifest",
                              str(bad), cwd=tmp_path)
    assert code == 2 and "colour" in err and str(bad) in err, err
    (tmp_path / ".env").write_text("APP_ID=12\n")
    code, _, err = await _run("register", "--url", "https://app.example", cwd=tmp_path)
    assert code == 2 and "APP_ID" in err and "--force" in err, err
    code, _, err = await _run("register", cwd=tmp_path)
    assert code == 2 and "--url" in err, "where webhooks go must be said"


def test_app_yml_holds_only_githubs_manifest_parameters() -> None:
    app_yml = yaml.safe_load((ROOT / "app.yml").read_text())
    assert set(app_yml) <= DOCUMENTED, set(app_yml) - DOCUMENTED
    assert set(app_yml["hook_attributes"]) <= {"url", "active"}
    assert len(app_yml.get("callback_urls", [])) <= 10
    for key in ("redirect_url", "setup_url"):
        assert key in app_yml, f"registration needs {key}"
    events = app_yml["default_events"]
    assert "installation" not in events and "installation_repositories" not in events, \
        "GitHub sends them to every App; they cannot be subscribed to"
    # the forge's check of a submitted manifest: every event one an App can subscribe to and
    # covered by the permissions, every permission with a level GitHub has
    check_manifest(json.dumps(app_yml))
    from bot.app.setup import load_manifest

    assert load_manifest(ROOT / "app.yml").name == app_yml["name"]


def test_env_merge_keeps_other_lines_and_takes_out_older_names(tmp_path: Path) -> None:
    from bot.app.setup import registered_in, write_env

    path = tmp_path / ".env"
    path.write_text('# mine\nGITHUB_APP_ID=5\nPRIVATE_KEY="-----BEGIN KEY-----\nold\n'
                    '-----END KEY-----\n"\nLOG_LEVEL=debug\nexport OTHER=\'a b\'')
    assert registered_in(path) == ["GITHUB_APP_ID", "PRIVATE_KEY"]
    pem = "-----BEGIN RSA PRIVATE KEY-----\nMIIB\n-----END RSA PRIVATE KEY-----\n"
    done = write_env(path, {"APP_ID": "7", "PRIVATE_KEY": pem, "WEBHOOK_SECRET": "s $x #y"})
    assert done.removed == ["GITHUB_APP_ID"] and done.kept == 3
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    lines = path.read_text().splitlines()
    assert lines[0] == "# mine" and "LOG_LEVEL=debug" in lines and "export OTHER='a b'" in lines
    assert not any("old" in line or "GITHUB_APP_ID" in line for line in lines)
    values = _env_file(path)
    assert (values["APP_ID"], values["PRIVATE_KEY"], values["WEBHOOK_SECRET"]) == \
        ("7", pem, "s $x #y"), "read back as written, no expansion"
    assert values["OTHER"] == "a b"


def test_forge_addresses() -> None:
    from bot.app.setup import Forge, SetupError

    gh = Forge.from_web("https://github.com/")
    assert (gh.api, gh.env()) == ("https://api.github.com", {})
    assert gh.new_app_url("acme") == "https://github.com/organizations/acme/settings/apps/new"
    ghe = Forge.from_web("https://ghe.example.com")
    assert (ghe.api, ghe.env()) == ("https://ghe.example.com/api/v3",
                                    {"GHE_HOST": "ghe.example.com"})
    assert Forge.from_api("https://ghe.example.com/api/v3") == ghe
    assert Forge.from_api("https://api.github.com") == gh
    local = Forge.from_web("http://127.0.0.1:8081")
    assert local.env() == {"GHE_HOST": "127.0.0.1:8081", "GHE_PROTOCOL": "http"}
    assert local.install_url("vaultmail") == "http://127.0.0.1:8081/apps/vaultmail/installations/new"
    with pytest.raises(SetupError, match="API address"):
        Forge.from_web("https://api.github.com")


async def test_the_code_is_exchanged_with_the_forge_alone() -> None:
    """The exchange's answer holds the App's key and webhook secret: a redirect is not
    followed (before, aiohttp followed it, and credentials from wherever it pointed were
    written to .env); it is reported as the forge's answer."""
    from aiohttp import web

    from bot.app.setup import Forge, SetupError, convert
    from tests.support import served

    elsewhere_asked: list[str] = []

    async def elsewhere(request: web.Request) -> web.Response:
        elsewhere_asked.append(request.path)
        return web.json_response({"id": 1, "slug": "evil", "pem": "x", "webhook_secret": "s",
                                  "client_id": "c", "client_secret": "d"}, status=201)

    async def forge(request: web.Request) -> web.Response:
        return web.Response(status=307, headers={"Location": f"{away}/conversions"})

    evil, real = web.Application(), web.Application()
    evil.router.add_route("*", "/{tail:.*}", elsewhere)
    real.router.add_route("*", "/{tail:.*}", forge)
    async with served(evil) as away, served(real) as url:
        with pytest.raises(SetupError, match="answered 307"):
            await convert(Forge.from_api(f"{url}/api/v3"), "abc123")
    assert elsewhere_asked == []


def test_registers_default_forge_is_the_setup_flows() -> None:
    """`vaultmail register --help` names the default forge without loading the setup flow
    (every command starts faster): it is the flow's own."""
    from bot.app.setup import GITHUB
    from bot.cli.register import GITHUB as SHOWN

    assert SHOWN == GITHUB


def _set_cookie(headers: list[str], name: str) -> str:
    found = [c for c in headers if c.startswith(name + "=")]
    assert len(found) == 1, (name, headers)
    return found[0]


async def test_over_https_no_other_site_can_plant_the_setup_pages_cookie(
        forge: LocalForge, tmp_path: Path) -> None:
    """`serve` without credentials, its public URL https (an ingress ends TLS): the setup
    page's cookie, which a return from the forge must come back with, is `__Host-` (Secure,
    Path=/, no Domain), as the console's are. Before, it was the plain `vaultmail_setup`: a
    page of a sibling subdomain or a man in the middle of a plain-http request to the host
    could plant one in the operator's browser, and a cookie by the plain name was read."""
    public = "https://vault.acme.example"
    page = SetupPage(forge=Forge.from_web(forge.url), manifest=load_manifest(),
                     env_file=tmp_path / ".env", public_url=public, redirect_via_public=True)
    sock = listen("127.0.0.1", 0)
    stop: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    serving = asyncio.create_task(serve_page(sock, page, stop, announce="setup page"))
    base = shown_url(sock, "127.0.0.1")
    try:
        # (no jar: the app is spoken to in http, as the ingress does)
        async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http:
            async with http.get(page.link(base) + "&moved=1") as resp:  # (at the public host)
                form = _parse(await resp.text())
                assert resp.status == 200
                given = _set_cookie(resp.headers.getall("Set-Cookie"), "__Host-vaultmail_setup")
            attributes = [a.strip().lower() for a in given.split(";")[1:]]
            assert "secure" in attributes and "path=/" in attributes, given
            assert not any(a.startswith("domain") for a in attributes), given
            value = given.split(";")[0].partition("=")[2]
            back = urlsplit(await _submit_to_forge(http, form, forge.user_token("admin")))
            assert f"{back.scheme}://{back.netloc}" == public, back
            callback = f"{base}{back.path}?{back.query}"
            page_text = await _text(http, callback, status=400,
                                    headers={"Cookie": f"vaultmail_setup={value}"})
            assert "not started here" in page_text.lower(), "a planted plain cookie: nothing"
            assert not (tmp_path / ".env").exists()
            done = _parse(await _text(http, callback,
                                      headers={"Cookie": f"__Host-vaultmail_setup={value}"}))
            assert f"{forge.url}/apps/vaultmail/installations/new" in done.links
    finally:
        if not stop.done():  # (registered, the page stops by itself: it ends `stop`)
            stop.set_result(None)
        registered = await serving
        sock.close()
    assert registered and (tmp_path / ".env").exists()


async def test_the_setup_page_keeps_its_key_from_the_forge(forge: LocalForge,
                                                           tmp_path: Path) -> None:
    """The set-up page's address holds the key that gives out the form (whoever has it
    registers the deployment's App), and its form posts to the forge, another site: the page
    says to send no referrer, so that no browser's default (older ones send the whole
    address to another https site) hands the key to the forge, or to its logs. The page
    after the return holds the forge's code and the state in its address, and links to the
    forge's install page: the same."""
    page = SetupPage(forge=Forge.from_web(forge.url), manifest=load_manifest(),
                     env_file=tmp_path / ".env")
    sock = listen("127.0.0.1", 0)
    stop: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    serving = asyncio.create_task(serve_page(sock, page, stop, announce="setup page"))
    base = shown_url(sock, "127.0.0.1")
    try:
        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as browser:
            async with browser.get(page.link(base)) as resp:
                assert resp.status == 200
                form = _parse(await resp.text())
                assert resp.headers.get("Referrer-Policy") == "no-referrer", dict(resp.headers)
            callback = await _submit_to_forge(browser, form, forge.user_token("admin"))
            async with browser.get(callback) as resp:
                assert resp.status == 200, await resp.text()
                assert resp.headers.get("Referrer-Policy") == "no-referrer", dict(resp.headers)
    finally:
        if not stop.done():
            stop.set_result(None)
        assert await serving
        sock.close()
