"""Any number of installations: two organisations on one forge, each with its own office, one
installed after the app started and one uninstalled while it runs; however many there are when
the app starts, each suspended one left out. Every tool call acts through the installation of
the caller's office; an office whose org has not installed the App hears a 503 naming the
org."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from bot.app.embedded import Embedded, start_embedded
from bot.office.config import load_office
from bot.office.seed import seed_office
from bot.office.source import CONFIG_PATH, CONFIG_REPO
from bot.store import api_tokens
from localforge import LocalForge
from tests.support import app_key

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


async def _tool(session: aiohttp.ClientSession, embedded: Embedded, token: str, name: str,
                **args: Any) -> tuple[int, Any]:
    async with session.post(f"{embedded.app_url}/api/v1/tools/{name}", json=args,
                            headers={"Authorization": f"Bearer {token}"}) as resp:
        return resp.status, await resp.json()


def _app_id(embedded: Embedded) -> int:
    (app_id,) = embedded.forge.state.apps
    return int(app_id)


async def _while_down(forge: LocalForge, meanwhile: Callable[[LocalForge], None], tmp: Path,
                      app_port: int, database_url: str) -> Embedded:
    """What `meanwhile` does on the forge while the app is down (its webhooks fail: no app is
    there), then the app started again on the same data, port and forge."""
    try:
        meanwhile(forge)
        await forge.webhooks_idle()
    finally:
        await forge.stop()
    return await start_embedded(data_dir=tmp, persist_forge=True, port=app_port, forge_port=0,
                                database_url=database_url, app_key=app_key())


async def _add_globex(embedded: Embedded, tmp: Any, org: str = "globex") -> None:
    """globex's office, or the same office for `org` (amy@ORG.test, ORG-scout)."""
    text = GLOBEX.replace("globex", org)
    path = tmp / f"{org}.yml"
    path.write_text(text)
    office = load_office(path)
    seed_office(embedded.forge, office)
    embedded.forge.put_file(f"{org}/{CONFIG_REPO}", CONFIG_PATH,
                            yaml.safe_dump(yaml.safe_load(text)))


async def test_two_orgs_installed_at_different_times_each_office_through_its_own_installation(
        embedded: Embedded, session: aiohttp.ClientSession, tmp_path: Any) -> None:
    await _add_globex(embedded, tmp_path)
    store = embedded.services.store
    amy = await api_tokens.create_token(store, "human:amy@globex.test", "globex")
    marco = embedded.api_tokens["human:marco@acme.com"]

    status, body = await _tool(session, embedded, amy, "mail_send", to="scout",
                               subject="Q3", body="Numbers please")
    assert status == 503, body
    assert body["error"]["code"] == "not_installed" and "globex" in body["error"]["message"]

    globex_inst = embedded.forge.install_app(_app_id(embedded), "globex")  # after start-up
    await embedded.settle()
    assert embedded.services.installation_of("globex") == globex_inst

    status, sent = await _tool(session, embedded, amy, "mail_send", to="scout",
                               subject="Q3", body="Numbers please")
    assert status == 200, sent
    status, acme_sent = await _tool(session, embedded, marco, "mail_send", to="scout",
                                    subject="EU prices", body="Check them")
    assert status == 200, acme_sent
    await embedded.settle()
    globex_issues = [i.title for i in embedded.forge.state.repo_by_full_name(
        "globex/scout-vault").issues.values()]
    acme_issues = [i.title for i in embedded.forge.state.repo_by_full_name(
        "acme/scout-vault").issues.values()]
    assert any("Q3" in t for t in globex_issues) and not any("Q3" in t for t in acme_issues)
    assert any("EU prices" in t for t in acme_issues)
    globex_creator = {i.user for i in embedded.forge.state.repo_by_full_name(
        "globex/scout-vault").issues.values()}
    assert globex_creator == {"vaultmail[bot]"}, "written through globex's installation"


async def test_an_org_uninstalled_mid_run_answers_503_naming_it_and_the_other_goes_on(
        embedded: Embedded, session: aiohttp.ClientSession, tmp_path: Any) -> None:
    await _add_globex(embedded, tmp_path)
    embedded.forge.install_app(_app_id(embedded), "globex")
    await embedded.settle()
    amy = await api_tokens.create_token(embedded.services.store, "human:amy@globex.test")
    marco = embedded.api_tokens["human:marco@acme.com"]

    acme_inst = embedded.services.installation_of("acme")
    assert acme_inst is not None
    embedded.forge.uninstall_app(acme_inst)
    await embedded.settle()
    status, body = await _tool(session, embedded, marco, "mail_list")
    assert status == 503 and body["error"]["code"] == "not_installed", body
    assert "acme" in body["error"]["message"]
    status, body = await _tool(session, embedded, amy, "mail_list")
    assert status == 200, "a token naming no org finds the one office that has its principal"
    status, body = await _tool(session, embedded, amy, "mail_send", to="scout",
                               subject="Still here", body="globex goes on")
    assert status == 200, body


async def test_a_principal_in_no_installed_office_is_told_how_to_name_one(
        embedded: Embedded, session: aiohttp.ClientSession, tmp_path: Any) -> None:
    await _add_globex(embedded, tmp_path)
    embedded.forge.install_app(_app_id(embedded), "globex")
    await embedded.settle()
    stray = await api_tokens.create_token(embedded.services.store, "agent:nobody")
    status, body = await _tool(session, embedded, stray, "mail_list")
    assert status == 403 and body["error"]["code"] == "no_office", body
    assert "--org" in body["error"]["message"]


async def test_reindex_of_one_office_keeps_the_other_offices_mails(
        embedded: Embedded, session: aiohttp.ClientSession, tmp_path: Any) -> None:
    from bot.email.keys import comment_key
    from bot.mail.reindex import reindex

    await _add_globex(embedded, tmp_path)
    embedded.forge.install_app(_app_id(embedded), "globex")
    await embedded.settle()
    amy = await api_tokens.create_token(embedded.services.store, "human:amy@globex.test")
    marco = embedded.api_tokens["human:marco@acme.com"]
    for token, subject in ((amy, "Globex mail"), (marco, "Acme mail")):
        status, body = await _tool(session, embedded, token, "mail_send", to="scout",
                                   subject=subject, body="hello")
        assert status == 200, body
    await embedded.settle()
    services = embedded.services
    forge = services.forge_for_org("globex")
    office = await services.offices.get(forge, "globex")
    assert office is not None
    await reindex(services.store, forge, office, services.keyring,
                  app_login=services.bot_login,
                  comment_key=comment_key(services.settings.data_dir, office.org))
    rows = await services.store.fetchall("SELECT vault, subject FROM mails ORDER BY vault")
    assert {(r["vault"].lower(), r["subject"]) for r in rows} >= {
        ("acme/scout-vault", "Acme mail"), ("globex/scout-vault", "Globex mail")}


async def test_every_installation_is_known_at_start_however_many(
        tmp_path: Path, session: aiohttp.ClientSession, database_url: str) -> None:
    """GitHub lists an App's installations 30 a page unless asked for more: an app that read
    one page knew, after a restart, only the first 30 orgs, and the newest were "not installed"
    until an installation event of theirs came. The listing also names suspended installations
    (no token is made for them), and what changed while the app was down: umbrella suspended,
    initech unsuspended (after the app heard it suspended, which the index kept)."""
    first = await start_embedded(data_dir=tmp_path, persist_forge=True, port=0, forge_port=0,
                                 database_url=database_url, app_key=app_key())
    app_port = int(first.app_url.rsplit(":", 1)[1])
    forge, app_id = first.forge, _app_id(first)
    try:
        for org in ("initech", "umbrella"):
            await _add_globex(first, tmp_path, org)
        initech = forge.install_app(app_id, "initech")
        umbrella = forge.install_app(app_id, "umbrella")
        await first.settle()  # (its vaults' labels made before the suspension)
        forge.suspend_app(initech)
        for i in range(30):
            forge.add_org(f"org{i}")
            forge.install_app(app_id, f"org{i}")
        await _add_globex(first, tmp_path)
        forge.install_app(app_id, "globex")  # the 34th: on the second page
        await first.settle()
        tokens = {org: await api_tokens.create_token(first.services.store,
                                                     f"human:amy@{org}.test", org)
                  for org in ("globex", "initech", "umbrella")}
    finally:
        await first.runner.cleanup()  # the app stops; meanwhile, on the forge:

    def meanwhile(forge: LocalForge) -> None:
        forge.unsuspend_app(initech)
        forge.suspend_app(umbrella)

    again = await _while_down(forge, meanwhile, tmp_path, app_port, database_url)
    try:
        status, body = await _tool(session, again, tokens["globex"], "mail_send", to="scout",
                                   subject="Q3", body="Numbers please")
        assert status == 200, body
        status, body = await _tool(session, again, tokens["initech"], "mail_list")
        assert status == 200, body
        status, body = await _tool(session, again, tokens["umbrella"], "mail_list")
        assert status == 503 and body["error"]["code"] == "not_installed", body
        assert "umbrella" in body["error"]["message"] and \
            "suspended" in body["error"]["message"], body
    finally:
        await again.stop()


async def test_an_org_name_another_account_took_while_the_app_was_down_starts_a_new_office(
        tmp_path: Path, session: aiohttp.ClientSession, database_url: str) -> None:
    """The forge's listing at start names each installation's account: globex's name went
    to another account while the app was down (its webhooks never came), and its office is
    that account's from the start, empty, while globex's old office is kept aside."""
    secret = "GLOBEX-CONFIDENTIAL merger memo"
    first = await start_embedded(data_dir=tmp_path, persist_forge=True, port=0, forge_port=0,
                                 database_url=database_url, app_key=app_key())
    app_port = int(first.app_url.rsplit(":", 1)[1])
    forge, app_id = first.forge, _app_id(first)
    try:
        await _add_globex(first, tmp_path)
        installed = forge.install_app(app_id, "globex")
        await first.settle()
        amy = await api_tokens.create_token(first.services.store, "human:amy@globex.test",
                                            "globex")
        status, body = await _tool(session, first, amy, "mail_send", to="scout",
                                   subject=secret, body="Do not forward.")
        assert status == 200, body
        await first.settle()
        old_kid = first.services.keyring.for_office("globex").active_kid
    finally:
        await first.runner.cleanup()  # the app stops; meanwhile, on the forge:

    def meanwhile(forge: LocalForge) -> None:
        forge.uninstall_app(installed)
        forge.state.accounts["globex"].id = forge.state.next_id("account")
        forge.add_user("eve", "eve@evil.test")
        forge.put_file("globex/.github", CONFIG_PATH, yaml.safe_dump({
            "org": "globex", "humans": [{"email": "eve@evil.test", "login": "eve",
                                         "permissions": ["mail.send", "editor"]}]}))
        forge.install_app(app_id, "globex", sender="eve")

    again = await _while_down(forge, meanwhile, tmp_path, app_port, database_url)
    try:
        eve = await api_tokens.create_token(again.services.store, "human:eve@evil.test",
                                            "globex")
        for name in ("mail_list", "list_changes"):
            status, body = await _tool(session, again, eve, name)
            assert status == 200 and secret not in str(body), (name, body)
        status, body = await _tool(session, again, amy, "mail_list")
        assert status == 401, body
        assert again.services.keyring.for_office("globex").active_kid != old_kid
        kept = await again.services.store.fetchall(
            "SELECT subject FROM mails WHERE org LIKE 'globex~%'")
        assert [r["subject"] for r in kept] == [secret]
    finally:
        await again.stop()


@pytest.mark.parametrize("index", ["this release", "the release before"])
@pytest.mark.parametrize("meanwhile", ["deleted", "renamed"])
async def test_an_office_file_set_after_its_org_was_taken_while_the_app_was_down_is_not_theirs(
        tmp_path: Path, session: aiohttp.ClientSession, database_url: str, meanwhile: str,
        index: str) -> None:
    """globex's office ran from its repository. While the app is down, globex is deleted (or
    renamed initech) and another account makes an org called globex, with a scout-vault of
    its own, and installs the App; the operator starts the app with VAULTMAIL_OFFICE naming
    globex. The file is the office of the account the index first knew as globex, bound as
    the index recorded it: the newcomer is not served it (amy's mail to scout would be
    written into its scout-vault, its people would act as the file's), and globex renamed
    initech is. Before, the file was bound to the account it was first served to, the
    newcomer's when it asked first. An index the release before left (no login bound until
    used) is bound by the start's listing to the account it knew, before it records the
    newcomer's."""
    from bot.office.source import OfficeSource
    from bot.store import installations

    first = await start_embedded(data_dir=tmp_path, persist_forge=True, port=0, forge_port=0,
                                 database_url=database_url, app_key=app_key())
    app_port = int(first.app_url.rsplit(":", 1)[1])
    forge, app_id = first.forge, _app_id(first)
    try:
        await _add_globex(first, tmp_path)
        installed = forge.install_app(app_id, "globex")
        await first.settle()
        old = forge.state.accounts["globex"].id
        store = first.services.store
        assert await installations.account_of(store, "globex") == old
        if index == "the release before":
            async with store.transaction() as db:
                await db.execute("DELETE FROM outbound_allow_accounts")
                await db.execute("DELETE FROM office_file_accounts")
    finally:
        await first.runner.cleanup()  # the app stops; meanwhile, on the forge:

    def taken(forge: LocalForge) -> None:
        if meanwhile == "renamed":
            forge.rename_org("globex", "initech")
        else:
            forge.uninstall_app(installed)
            forge.state.accounts["globex"].id = forge.state.next_id("account")
        forge.add_user("eve", "eve@evil.test")
        seed_office(forge, load_office(tmp_path / "globex.yml"))  # (its own scout-vault)
        forge.install_app(app_id, "globex", sender="eve")

    again = await _while_down(forge, taken, tmp_path, app_port, database_url)
    try:
        new = forge.state.accounts["globex"].id
        assert new != old
        services = again.services
        # the operator's file, VAULTMAIL_OFFICE, as bot.app.build makes the source
        services.take_offices(OfficeSource(tmp_path / "globex.yml",
                                           renamed=services.keyring.renamed))
        amy = await api_tokens.create_token(services.store, "human:amy@globex.test", "globex")
        vault = forge.state.repo_by_full_name("globex/scout-vault")
        assert vault is not None
        before = len(vault.issues)
        status, body = await _tool(session, again, amy, "mail_send", to="scout",
                                   subject="GLOBEX-CONFIDENTIAL", body="x")
        await again.settle()
        assert status != 200 and body["error"]["code"] == "no_office", body
        assert "not the org the operator's office file" in body["error"]["message"], body
        assert f"forge account {old}, the first this app knew as globex" in \
            body["error"]["message"], body
        assert len(vault.issues) == before, "nothing written to the newcomer's repository"
        if meanwhile == "renamed":
            office = await services.offices.get(services.forge_for_org("initech"), "initech")
            assert office is not None and office.org == "initech"
    finally:
        await again.stop()


async def test_an_office_file_for_an_org_installed_later_is_its_office(
        embedded: Embedded, session: aiohttp.ClientSession, tmp_path: Any) -> None:
    """VAULTMAIL_OFFICE names globex, which installs the App after the app started: the
    file is bound to the account the index records for it then, and serves it."""
    from bot.office.source import OfficeSource
    from bot.store import installations

    await _add_globex(embedded, tmp_path)
    services = embedded.services
    services.take_offices(OfficeSource(tmp_path / "globex.yml",
                                       renamed=services.keyring.renamed))
    embedded.forge.install_app(_app_id(embedded), "globex")
    await embedded.settle()
    amy = await api_tokens.create_token(services.store, "human:amy@globex.test", "globex")
    status, body = await _tool(session, embedded, amy, "mail_send", to="scout", subject="Q3",
                               body="Numbers please")
    assert status == 200 and body["mail"]["vault"] == "globex/scout-vault", body
    assert await installations.file_office_holder(services.store, "globex", "globex") is None
