"""Each office signs with its own key (issue 21): one deployment serving acme and evil
publishes each office's keys apart, and what evil's office signs never passes acme's check."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from cryptography.exceptions import InvalidSignature
from multidict import CIMultiDict

from bot.app.embedded import Embedded, start_embedded
from bot.office.config import load_office
from bot.office.seed import seed_office
from bot.office.source import CONFIG_PATH, CONFIG_REPO
from bot.store import api_tokens
from tests.support import served, until

EVIL = """
org: evil
humans:
  - {email: eve@evil.test, login: eve, permissions: [mail.send]}
agents:
  - slug: scout
    login: evil-scout
    person: eve@evil.test
    run: {triggers: [mail], dispatch: "RUNS"}
"""


@dataclass
class Runner:
    """An office's runner: takes run payloads and ledger entries, keeps what it was sent."""

    url: str = ""
    runs: list[tuple[bytes, dict[str, str]]] = field(default_factory=list)
    hooks: list[tuple[bytes, dict[str, str]]] = field(default_factory=list)

    async def run(self, request: web.Request) -> web.Response:
        self.runs.append((await request.read(), dict(request.headers)))
        return web.Response(status=204)

    async def hook(self, request: web.Request) -> web.Response:
        self.hooks.append((await request.read(), dict(request.headers)))
        return web.Response(status=204)


def documented_check() -> str:
    """The Python of docs/using.md, *Checking a signature*, less its fetch of the keys."""
    docs = (Path(__file__).parents[1] / "docs" / "using.md").read_text()
    section = docs[docs.index("Checking a signature, for runs and triggers alike."):]
    code = section[section.index("```python\n") + 10:section.index("```\n", 10)]
    fetch = next(line for line in code.splitlines() if "urlopen" in line)
    return code.replace(fetch + "\n", "")  # `jwks` is given: the app runs on this loop


def passes_the_documented_check(app_url: str, office: str, jwks: dict[str, Any],
                                headers: dict[str, str], raw_body: bytes, my_url: str,
                                seen: set[str] | None = None) -> bool:
    """The documented check, as a receiver of `office` at `my_url` runs it, on the keys it
    fetched from `{app_url}/.well-known/vaultmail-keys/{office}.json`."""
    where: dict[str, Any] = {"APP_URL": app_url, "OFFICE": office, "MY_URL": my_url,
                             "jwks": jwks}
    exec(documented_check(), where)  # noqa: S102 - our own docs' recipe
    try:
        where["check"](CIMultiDict(headers), raw_body, set() if seen is None else seen)
    except (PermissionError, InvalidSignature):
        return False
    return True


@pytest.fixture
async def runner() -> AsyncIterator[Runner]:
    rec = Runner()
    app = web.Application()
    app.router.add_post("/runs", rec.run)
    app.router.add_post("/hook", rec.hook)
    async with served(app) as rec.url:
        yield rec


@pytest.fixture
async def two_offices(tmp_path: Path, runner: Runner,
                      monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Embedded]:
    """acme (the example office; scout's runs and every ledger entry go to acme's runner) and
    evil, installed on the same deployment, whose scout's runs go to acme's runner too."""
    monkeypatch.setenv("VAULTMAIL_OUTBOUND_ALLOW", "127.0.0.1")  # the runner is on loopback
    emb = await start_embedded(data_dir=tmp_path / "d", port=0, forge_port=0)
    try:
        acme = resources.files("bot").joinpath("example_office.yml").read_text()
        acme = acme.replace("dispatch: none\n", f"dispatch: {runner.url}/runs\n", 1)  # scout's
        emb.forge.put_file(f"acme/{CONFIG_REPO}", CONFIG_PATH,
                           acme + f"webhooks:\n  - {runner.url}/hook\n", pusher="admin")
        evil = EVIL.replace("RUNS", f"{runner.url}/runs")
        (tmp_path / "evil.yml").write_text(evil)
        seed_office(emb.forge, load_office(tmp_path / "evil.yml"))
        emb.forge.put_file(f"evil/{CONFIG_REPO}", CONFIG_PATH, evil)
        (app_id,) = emb.forge.state.apps
        emb.forge.install_app(int(app_id), "evil")
        await emb.settle()
        yield emb
    finally:
        await emb.stop()


async def _send(session: aiohttp.ClientSession, emb: Embedded, token: str,
                subject: str) -> dict[str, Any]:
    async with session.post(f"{emb.app_url}/api/v1/tools/mail_send",
                            headers={"Authorization": f"Bearer {token}"},
                            json={"to": "scout", "subject": subject, "body": "go"}) as resp:
        body = await resp.json()
        assert resp.status == 200, body
        return dict(body["mail"])


async def _get(session: aiohttp.ClientSession, url: str) -> tuple[int, Any]:
    async with session.get(url) as resp:
        return resp.status, await resp.json()


OPERATOR = "operator-token-of-the-tests"


async def test_each_office_keyset_is_served_apart_and_the_old_url_serves_them_all(
        two_offices: Embedded, session: aiohttp.ClientSession) -> None:
    emb = two_offices
    eve = await api_tokens.create_token(emb.services.store, "human:eve@evil.test", "evil")
    await _send(session, emb, emb.api_tokens["human:marco@acme.com"], "From acme")
    await _send(session, emb, eve, "From evil")
    await emb.settle()
    base = f"{emb.app_url}/.well-known"
    for url in (f"{base}/vaultmail-keys/acme.json", f"{base}/vaultmail-keys.json?org=acme",
                f"{base}/vaultmail-keys/Acme.json"):
        status, jwks = await _get(session, url)
        assert status == 200, jwks
        assert {k["office"] for k in jwks["keys"]} == {"acme"}, url
        assert all(k["kid"].startswith("vm-acme-") for k in jwks["keys"]), url
    status, evil = await _get(session, f"{base}/vaultmail-keys/evil.json")
    assert status == 200 and {k["office"] for k in evil["keys"]} == {"evil"}
    status, union = await _get(session, f"{base}/vaultmail-keys.json")
    assert status == 200 and {k["office"] for k in union["keys"]} == {"acme", "evil"}, (
        "no operator's token set: everything every office shares is anyone's, as /metrics")
    # with an operator's token set, the list of every office (every tenant here) is the
    # operator's, as /metrics and /healthz are; each office's own URL stays anyone's
    emb.services.settings = dataclasses.replace(emb.services.settings, operator_token=OPERATOR)
    status, body = await _get(session, f"{base}/vaultmail-keys.json")
    assert status == 401 and body["error"]["code"] == "operator_only", body
    assert "/.well-known/vaultmail-keys/<org>.json" in body["error"]["message"]
    async with session.get(f"{base}/vaultmail-keys.json",
                           headers={"Authorization": f"Bearer {OPERATOR}"}) as resp:
        union = await resp.json()
        assert resp.status == 200 and {k["office"] for k in union["keys"]} == {"acme", "evil"}
    status, jwks = await _get(session, f"{base}/vaultmail-keys/acme.json")
    assert status == 200 and {k["office"] for k in jwks["keys"]} == {"acme"}
    status, body = await _get(session, f"{base}/vaultmail-keys/nobody.json")
    assert status == 404 and body["error"]["code"] == "no_office", body
    assert "nobody" in body["error"]["message"]
    assert not (emb.data_dir / "signing-keys" / "nobody.json").exists()
    status, body = await _get(session, f"{base}/vaultmail-keys.json?org=../acme")
    assert status == 400 and body["error"]["code"] == "bad_office", body


async def test_a_run_payload_evil_signs_fails_the_documented_check_at_acmes_runner(
        two_offices: Embedded, session: aiohttp.ClientSession, runner: Runner) -> None:
    emb = two_offices
    eve = await api_tokens.create_token(emb.services.store, "human:eve@evil.test", "evil")
    await _send(session, emb, eve, "Run this at acme")
    await _send(session, emb, emb.api_tokens["human:marco@acme.com"], "Acme's own run")
    await emb.settle()  # the runs' dispatches included
    assert len(runner.runs) == 2, runner.runs
    _, acme_keys = await _get(session, f"{emb.app_url}/.well-known/vaultmail-keys/acme.json")
    _, evil_keys = await _get(session, f"{emb.app_url}/.well-known/vaultmail-keys/evil.json")
    by_vault = {json.loads(body)["content"]["vault"]: (body, headers)
                for body, headers in runner.runs}
    runs = f"{runner.url}/runs"
    body, headers = by_vault["evil/scout-vault"]
    assert headers["X-Vaultmail-Signature"].startswith("v2=vm-evil-"), "the key id names evil"
    assert not passes_the_documented_check(emb.app_url, "acme", acme_keys, headers, body, runs)
    assert passes_the_documented_check(emb.app_url, "evil", evil_keys, headers, body, runs), \
        "it is genuinely evil's"
    body, headers = by_vault["acme/scout-vault"]
    assert headers["X-Vaultmail-Signature"].startswith("v2=vm-acme-")
    run = json.loads(body)["run"]
    assert (headers["X-Vaultmail-Event"], headers["X-Vaultmail-Delivery"]) == ("run", f"run-{run}")
    seen: set[str] = set()
    assert passes_the_documented_check(emb.app_url, "acme", acme_keys, headers, body, runs, seen)
    assert not passes_the_documented_check(emb.app_url, "acme", acme_keys, headers, body, runs,
                                           seen), "replayed to the runner: seen"
    assert not passes_the_documented_check(emb.app_url, "acme", acme_keys, headers, body,
                                           f"{runner.url}/hook"), "replayed to the hook"


async def test_ledger_entries_reach_the_office_webhook_signed_with_the_office_key(
        two_offices: Embedded, session: aiohttp.ClientSession, runner: Runner) -> None:
    emb = two_offices
    await _send(session, emb, emb.api_tokens["human:marco@acme.com"], "Hooked")
    await until(lambda: len(runner.hooks) >= 1)
    _, acme_keys = await _get(session, f"{emb.app_url}/.well-known/vaultmail-keys/acme.json")
    for body, headers in runner.hooks:
        assert headers["X-Vaultmail-Signature"].startswith("v2=vm-acme-")
        assert headers["X-Vaultmail-Delivery"] == str(json.loads(body)["seq"])
        assert passes_the_documented_check(emb.app_url, "acme", acme_keys, headers, body,
                                           f"{runner.url}/hook")
        assert not passes_the_documented_check(emb.app_url, "acme", acme_keys, headers, body,
                                               f"{runner.url}/runs"), "replayed to the runner"
        assert not passes_the_documented_check(
            emb.app_url, "acme", acme_keys, {**headers, "X-Vaultmail-Delivery": "999"}, body,
            f"{runner.url}/hook"), "relabelled"



def test_a_renamed_offices_headers_verify_where_its_names_went_and_nowhere_else(
        tmp_path: Path) -> None:
    """globex renames itself initech, then renames its vault: what it signed as
    globex/scout-vault verifies in initech/scout-mail (with the app's keys, another process's,
    and the published ones), and is a copy anywhere else; the name globex, taken by someone
    else, signs with keys of its own and verifies none of it."""
    from bot.mail.header import render_mail_body, sign_header, verify_mail
    from bot.mail.signing import Keyrings

    app = Keyrings.in_data_dir(tmp_path)
    header = sign_header(keyring=app.for_office("globex"), from_principal="agent:scout",
                         to_principal="agent:scout", vault="globex/scout-vault",
                         subject="signed as globex", body="kept")
    issue = render_mail_body(header, "kept")
    app.rename("globex", "initech")
    app.rename("globex", "initech")  # (a retry after a crash moves nothing twice)
    app.rename_vault("initech/scout-vault", "initech/scout-mail")
    squatter = Keyrings.in_data_dir(tmp_path).for_office("globex")  # another process
    assert not set(squatter.key_ids) & set(app.for_office("initech").key_ids)
    for keys in (app, Keyrings.in_data_dir(tmp_path), app.public_keys("initech")):
        found = verify_mail("signed as globex", issue, "initech/scout-mail", keys)
        assert found.valid and found.office == "initech", found
        for elsewhere in ("globex/scout-vault", "initech/scout-vault", "globex/scout-mail"):
            copy = verify_mail("signed as globex", issue, elsewhere, keys)
            assert not copy.valid and copy.copy and copy.office != "globex", (elsewhere, copy)
    assert not app.public_keys("globex").has_key(header.key_id)


def test_a_vault_gone_to_another_owner_is_no_rename_of_it(tmp_path: Path) -> None:
    """globex/scout-vault transferred to eve (GitHub leads the old name there too). Before,
    rename_vault took it as a rename: it made a keyring for an office `eve`, whose old name
    globex/scout-vault led to eve/scout-vault. A vault is renamed within its office only."""
    from bot.mail.signing import Keyrings

    app = Keyrings.in_data_dir(tmp_path)
    app.for_office("globex")
    with pytest.raises(ValueError, match="another owner"):
        app.rename_vault("globex/scout-vault", "eve/scout-vault")
    assert app.existing("eve") is None and Keyrings.in_data_dir(tmp_path).offices() == [
        "globex"]
    assert app.renamed("globex") == {}
