"""An organisation renames itself (the same account, a new login), or a vault is renamed: the
office follows its org's new name, and mail its vault's. Before, the renamed org got a new,
empty office: its people's tokens, mail, ledger and keys stayed under the old name, and a
rebuild of the index read the old mail's headers (signed for `globex/scout-vault`) as copies.

Renamed while the app runs (GitHub's `installation_target.renamed`), or while it was down
(its start sees the same account under a new login); then another account takes the freed
name, and gets an empty office that verifies none of the old headers as its own."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from bot.app import listing
from bot.app.doctor import Doctor
from bot.app.embedded import Embedded, start_embedded
from bot.app.services import Services
from bot.forge import errors
from bot.forge.errors import NotFound
from bot.mail.header import verify_issue
from bot.mail.reindex import scan
from bot.mail.signing import Keyrings, PublicKeys
from bot.office.source import CONFIG_PATH
from bot.store import api_tokens, installations, ledger, mails
from bot.store.prune import MIN_KEEP, prune
from localforge import LocalForge
from tests.app.test_installations import _add_globex, _app_id, _tool, _while_down
from tests.support import app_key, free_port, until
from tests.test_exactly_once import _named, forge_delivery, replay_under_new_id
from tests.test_mcp import _refused, mcp_http

BEFORE, AFTER = "Before the rename", "After the rename"


async def _globex_with_amy(embedded: Embedded, tmp_path: Path) -> tuple[int, str]:
    """globex's office, the App installed on it: the App's id, and a token of amy's."""
    await _add_globex(embedded, tmp_path)
    app_id = _app_id(embedded)
    embedded.forge.install_app(app_id, "globex")
    await embedded.settle()
    return app_id, await api_tokens.create_token(embedded.services.store,
                                                 "human:amy@globex.test", "globex")


async def _amy_mails_scout(session: aiohttp.ClientSession, embedded: Embedded, amy: str,
                           body: str) -> None:
    """amy's mail to scout (subject BEFORE), delivered."""
    status, answer = await _tool(session, embedded, amy, "mail_send", to="scout",
                                 subject=BEFORE, body=body)
    assert status == 200, answer
    await embedded.settle()


async def _changes(session: aiohttp.ClientSession, embedded: Embedded,
                   token: str) -> list[dict[str, Any]]:
    status, body = await _tool(session, embedded, token, "list_changes", since=0)
    assert status == 200, body
    return list(body["events"] if "events" in body else body["changes"])


def _chain(entries: list[dict[str, Any]]) -> list[tuple[int, str, str, str]]:
    """What an entry is in its office's chain: its number, hashes, and the name hashed."""
    return [(e["seq"], e["hash"], e["prev_hash"], e["chain"]) for e in entries]


async def _follows(session: aiohttp.ClientSession, embedded: Embedded, amy: str, scout: str,
                   before: list[dict[str, Any]]) -> None:
    """What a person of the office renamed `initech` finds: their token acts there, the old
    mail is in its vault's new name, the ledger goes on, and every mail verifies."""
    services = embedded.services
    status, body = await _tool(session, embedded, scout, "mail_list")
    assert status == 200 and BEFORE in str(body), body
    assert "initech/scout-vault" in str(body) and "globex/" not in str(body), body
    # a ref given out before the rename still names the mail, as the forge's old URL does
    status, body = await _tool(session, embedded, scout, "mail_get", mail="globex/scout-vault#1")
    assert status == 200 and body["mail"]["ref"] == "initech/scout-vault#1", body
    assert _chain(await _changes(session, embedded, amy)) == _chain(before)  # the same ledger
    status, body = await _tool(session, embedded, amy, "mail_send", to="scout", subject=AFTER,
                               body="Signed under the new name.")
    assert status == 200, body
    await embedded.settle()
    after = await _changes(session, embedded, amy)
    assert _chain(after)[:len(before)] == _chain(before) and len(after) > len(before)
    assert {e["office"] for e in after} == {"initech"}
    for was, entry in zip(after, after[1:], strict=False):  # one chain, continued
        assert entry["prev_hash"] == was["hash"], (was, entry)
    assert await ledger.verify_chain(services.store, "initech") is None
    assert await ledger.verify_chain(services.store) is None
    # a rebuild from the forge finds both mails genuine where they are now
    forge = services.forge_for_org("initech")
    office = await services.offices.get(forge, "initech")
    assert office is not None and office.org == "initech"
    found, report = await scan(forge, office, services.keyring, app_login=services.bot_login)
    assert sorted(m.subject for m in found) == [AFTER, BEFORE], report
    assert not report.tampered and not report.copies, report


async def test_an_org_renamed_keeps_its_office_and_the_freed_name_is_a_new_one(
        embedded: Embedded, tmp_path: Path, session: aiohttp.ClientSession) -> None:
    forge, services = embedded.forge, embedded.services
    app_id, amy = await _globex_with_amy(embedded, tmp_path)
    scout = await api_tokens.create_token(services.store, "agent:scout", "globex")
    await _amy_mails_scout(session, embedded, amy, "Written while the org was globex.")
    before = await _changes(session, embedded, amy)
    old = services.keyring.for_office("globex").key_ids

    forge.rename_org("globex", "initech")
    await embedded.settle()
    await _follows(session, embedded, amy, scout, before)

    # another account makes an org called globex, copies the old mail into a vault of the
    # same name, and installs the App: an empty office, whose keys are none of the old ones
    forge.add_user("eve", "eve@evil.test")
    forge.add_org("globex", owner="eve")
    for repo in ("scout-vault", ".github"):
        forge.add_repo("globex", repo, sender="eve")
    forge.put_file("globex/.github", CONFIG_PATH, yaml.safe_dump({
        "org": "globex", "humans": [{"email": "eve@evil.test", "login": "eve",
                                     "permissions": ["mail.send", "editor"]}]}))
    original = forge.state.repo("initech", "scout-vault")
    assert original is not None
    first = original.issues[1]
    async with session.post(f"{forge.url}/repos/globex/scout-vault/issues",
                            json={"title": first.title, "body": first.body},
                            headers={"Authorization": f"token {forge.user_token('eve')}"}
                            ) as resp:
        assert resp.status == 201, await resp.text()
        copied = await resp.json()
    forge.install_app(app_id, "globex", sender="eve")
    await embedded.settle()
    eve = await api_tokens.create_token(services.store, "human:eve@evil.test", "globex")
    for name in ("mail_list", "list_changes"):
        status, body = await _tool(session, embedded, eve, name)
        assert status == 200 and BEFORE not in str(body) and AFTER not in str(body), body
    verdict = verify_issue(copied, "globex/scout-vault", services.keyring,
                           app_login=services.bot_login)
    assert not verdict.valid and verdict.office != "globex", verdict
    assert not set(services.keyring.for_office("globex").key_ids) & set(old)
    # and initech's office is as it was
    status, body = await _tool(session, embedded, scout, "mail_list")
    assert status == 200 and BEFORE in str(body) and AFTER in str(body), body


async def test_an_org_renamed_while_the_app_was_down_is_followed_at_start(
        tmp_path: Path, session: aiohttp.ClientSession, database_url: str) -> None:
    first = await start_embedded(data_dir=tmp_path, persist_forge=True, port=0, forge_port=0,
                                 database_url=database_url, app_key=app_key())
    app_port = int(first.app_url.rsplit(":", 1)[1])
    forge = first.forge
    try:
        await _add_globex(first, tmp_path)
        forge.install_app(_app_id(first), "globex")
        await first.settle()
        store = first.services.store
        amy = await api_tokens.create_token(store, "human:amy@globex.test", "globex")
        scout = await api_tokens.create_token(store, "agent:scout", "globex")
        status, body = await _tool(session, first, amy, "mail_send", to="scout",
                                   subject=BEFORE, body="Written while the org was globex.")
        assert status == 200, body
        await first.settle()
        before = await _changes(session, first, amy)
    finally:
        await first.runner.cleanup()  # the app stops; meanwhile, on the forge:

    def meanwhile(forge: LocalForge) -> None:
        forge.rename_org("globex", "initech")

    again = await _while_down(forge, meanwhile, tmp_path, app_port, database_url)
    try:
        await _follows(session, again, amy, scout, before)
    finally:
        await again.stop()


async def test_a_vault_renamed_keeps_its_mail(
        embedded: Embedded, tmp_path: Path, session: aiohttp.ClientSession) -> None:
    """globex/scout-vault renamed scout-mail (`repository.renamed`): its mail rows name the
    new vault, new mail goes there though the config still names none (the default pattern
    says scout-vault), every mail verifies there, and the old URL leads to it (301)."""
    forge, services = embedded.forge, embedded.services
    _, amy = await _globex_with_amy(embedded, tmp_path)
    await _amy_mails_scout(session, embedded, amy, "Written to scout-vault.")

    # its admin renames it through the forge's API, as on GitHub
    forge.set_permission("globex/scout-vault", "gia", "admin")
    async with session.patch(f"{forge.url}/repos/globex/scout-vault", json={
            "name": "scout-mail"}, headers={"Authorization": f"token {forge.user_token('gia')}"}
            ) as resp:
        assert resp.status == 200, await resp.text()
    await embedded.settle()
    status, body = await _tool(session, embedded, amy, "mail_list")
    assert status == 200 and [m["vault"] for m in body["mails"]] == ["globex/scout-mail"], body
    # a ref given out before the rename still names the mail, as the forge's old URL does
    status, body = await _tool(session, embedded, amy, "mail_get", mail="globex/scout-vault#1")
    assert status == 200 and body["mail"]["ref"] == "globex/scout-mail#1", body
    status, body = await _tool(session, embedded, amy, "mail_send", to="scout", subject=AFTER,
                               body="Written to scout-mail.")
    assert status == 200 and body["mail"]["vault"] == "globex/scout-mail", body
    await embedded.settle()
    forge_of = services.forge_for_org("globex")
    office = await services.offices.get(forge_of, "globex")
    assert office is not None and office.vaults() == ["globex/scout-mail"]
    found, report = await scan(forge_of, office, services.keyring, app_login=services.bot_login)
    assert sorted(m.subject for m in found) == [AFTER, BEFORE], report
    assert not report.tampered and not report.copies, report
    async with session.get(f"{forge.url}/repos/globex/scout-vault/issues/1", headers={
            "Authorization": f"token {forge.user_token('amy')}"}) as resp:
        assert resp.status == 200 and [r.status for r in resp.history] == [301]
        assert (await resp.json())["title"] == BEFORE


async def test_a_rename_another_replica_heard_is_followed_here_at_the_next_call(
        embedded: Embedded, tmp_path: Path, session: aiohttp.ClientSession) -> None:
    """installation_target.renamed reaches one replica: the others knew the org's
    installation by its old name only, and answered its office's calls 503 not_installed
    under the new one until they restarted."""
    forge, services = embedded.forge, embedded.services
    app_id, amy = await _globex_with_amy(embedded, tmp_path)
    await _amy_mails_scout(session, embedded, amy, "Written while the org was globex.")
    hook = forge.state.apps[app_id].webhook_url
    forge.set_webhook(app_id, url="http://127.0.0.1:9/webhook")  # (to the other replica)
    forge.rename_org("globex", "initech")
    await forge.webhooks_idle()
    forge.set_webhook(app_id, url=hook)
    # what the replica that heard it did, in the data directory and the index they share
    Keyrings.in_data_dir(tmp_path).rename("globex", "initech")
    assert await installations.renamed(services.store, "globex", "initech",
                                       forge.state.accounts["initech"].id)
    status, body = await _tool(session, embedded, amy, "mail_list")
    assert status == 200 and [m["vault"] for m in body["mails"]] == ["initech/scout-vault"], body
    status, body = await _tool(session, embedded, amy, "mail_send", to="scout", subject=AFTER,
                               body="Signed under the new name.")
    assert status == 200 and body["mail"]["vault"] == "initech/scout-vault", body



async def _office_with_mail(embedded: Embedded, tmp_path: Path, session: aiohttp.ClientSession,
                            org: str = "globex") -> tuple[int, str, set[str]]:
    """`org`'s office installed and its first mail sent: its installation, amy's token, and
    the keys the office signed with."""
    await _add_globex(embedded, tmp_path, org)
    inst = embedded.forge.install_app(_app_id(embedded), org)
    await embedded.settle()
    amy = await api_tokens.create_token(embedded.services.store, f"human:amy@{org}.test", org)
    status, body = await _tool(session, embedded, amy, "mail_send", to="scout",
                               subject=f"{org.upper()} ONLY", body=f"{org}'s word")
    assert status == 200, body
    await embedded.settle()
    return inst, amy, set(embedded.services.keyring.for_office(org).key_ids)


def _verdict(embedded: Embedded, issue: Any, vault: str) -> Any:
    """What the keys here say of `issue` (the forge's) read in `vault`."""
    services = embedded.services
    return verify_issue({"title": issue.title, "body": issue.body, "number": issue.number,
                         "user": {"login": services.bot_login}}, vault, services.keyring,
                        app_login=services.bot_login)


async def test_a_rename_into_a_name_an_uninstalled_org_left_takes_none_of_its_keys(
        embedded: Embedded, tmp_path: Path, session: aiohttp.ClientSession) -> None:
    """globex uninstalls the App and leaves its name; initech renames itself globex. Before,
    Keyrings.rename took the key file left under globex as initech's own (or merged it), so
    what the old globex signed verified as the new globex's word."""
    forge, services = embedded.forge, embedded.services
    inst, _, old_keys = await _office_with_mail(embedded, tmp_path, session)
    signed = forge.state.repo("globex", "scout-vault").issues[1]
    forge.uninstall_app(inst)
    await embedded.settle()
    forge.rename_org("globex", "globex-old")  # (uninstalled: no office follows it)
    await embedded.settle()
    await _add_globex(embedded, tmp_path, "initech")
    forge.install_app(_app_id(embedded), "initech")
    await embedded.settle()
    forge.rename_org("initech", "globex")
    await embedded.settle()
    ring = services.keyring.existing("globex")
    assert ring is not None and not set(ring.key_ids) & old_keys, ring and ring.key_ids
    assert not _verdict(embedded, signed, "globex/scout-vault").valid


async def test_a_rename_into_a_name_whose_own_rename_is_not_heard_yet_retires_nothing(
        embedded: Embedded, tmp_path: Path, session: aiohttp.ClientSession) -> None:
    """globex renames itself globex2, its event lost; initech then takes the name globex, its
    event heard. Before, the office under globex (globex's, still installed) was taken as one
    whose org had left: moved aside, its tokens revoked and its keys given to initech. Now
    the forge's listing says where globex went: its office follows it first, then initech's."""
    forge, services = embedded.forge, embedded.services
    app_id = _app_id(embedded)
    _, amy, globex_keys = await _office_with_mail(embedded, tmp_path, session)
    _, ian, initech_keys = await _office_with_mail(embedded, tmp_path, session, "initech")
    hook = forge.state.apps[app_id].webhook_url
    forge.set_webhook(app_id, url=f"http://127.0.0.1:{free_port()}/webhook")  # (lost)
    forge.rename_org("globex", "globex2")
    await forge.webhooks_idle()
    forge.set_webhook(app_id, url=hook)
    forge.rename_org("initech", "globex")
    await embedded.settle()
    assert set(services.keyring.for_office("globex2").key_ids) >= globex_keys
    assert not set(services.keyring.for_office("globex").key_ids) & globex_keys
    assert set(services.keyring.for_office("globex").key_ids) >= initech_keys
    for token, vault, subject in ((amy, "globex2/scout-vault", "GLOBEX ONLY"),
                                  (ian, "globex/scout-vault", "INITECH ONLY")):
        status, body = await _tool(session, embedded, token, "mail_list")
        assert status == 200 and [(m["vault"], m["subject"]) for m in body["mails"]] == [
            (vault, subject)], body
    assert not await services.store.fetchall(
        "SELECT 1 FROM api_tokens WHERE revoked_at IS NOT NULL")
    assert sorted(services.installations) == ["acme", "globex", "globex2"]


async def test_an_org_renamed_before_its_office_signed_anything_keeps_its_config(
        embedded: Embedded, tmp_path: Path, session: aiohttp.ClientSession) -> None:
    """globex is renamed before its office signed anything (no key file): its config still
    says `org: globex`. Before, the rename was recorded only in a key file, none was made,
    and the config was refused (it names another org) until an admin wrote it again."""
    forge, services = embedded.forge, embedded.services
    _, amy = await _globex_with_amy(embedded, tmp_path)
    assert services.keyring.existing("globex") is None
    forge.rename_org("globex", "initech")
    await embedded.settle()
    status, body = await _tool(session, embedded, amy, "mail_send", to="scout", subject=AFTER,
                               body="The office's first mail, after the rename.")
    assert status == 200 and body["mail"]["vault"] == "initech/scout-vault", body


async def test_a_replica_that_did_not_hear_the_rename_serves_no_office_under_the_old_name(
        embedded: Embedded, tmp_path: Path, session: aiohttp.ClientSession) -> None:
    """Another replica heard globex renamed initech: this one, at its next round of the
    offices (or call), serves the office as initech and no longer as globex (before, it kept
    both names, and every round of the offices, sign-in and email among them, read globex's
    as a second office)."""
    forge, services = embedded.forge, embedded.services
    app_id = _app_id(embedded)
    _, amy, _ = await _office_with_mail(embedded, tmp_path, session)
    hook = forge.state.apps[app_id].webhook_url
    forge.set_webhook(app_id, url=f"http://127.0.0.1:{free_port()}/webhook")  # (elsewhere)
    forge.rename_org("globex", "initech")
    await forge.webhooks_idle()
    forge.set_webhook(app_id, url=hook)
    Keyrings.in_data_dir(tmp_path).rename("globex", "initech")  # (what that replica did)
    assert await installations.renamed(services.store, "globex", "initech",
                                       forge.state.accounts["initech"].id)
    offices, _ = await services.read_offices()  # (its next round: initech's, at once)
    assert [org for org, _ in offices] == ["acme", "initech"], "not globex's"
    assert sorted(services.installations) == ["acme", "initech"]
    status, body = await _tool(session, embedded, amy, "mail_list")
    assert status == 200, body


async def _rename_vault(session: aiohttp.ClientSession, forge: LocalForge, vault: str,
                        name: str) -> None:
    """`vault` renamed `name` by its admin (gia), through the forge's API, as on GitHub."""
    forge.set_permission(vault, "gia", "admin")
    async with session.patch(f"{forge.url}/repos/{vault}", json={"name": name}, headers={
            "Authorization": f"token {forge.user_token('gia')}"}) as resp:
        assert resp.status == 200, await resp.text()


async def test_a_new_repository_under_a_vaults_old_name_is_a_vault_of_its_own(
        embedded: Embedded, tmp_path: Path, session: aiohttp.ClientSession) -> None:
    """globex/scout-vault renamed scout-mail, then a new globex/scout-vault made (another
    repository), which the config's default pattern names for scout. Before, the rename was
    followed for the new one too: scout's new mail went to scout-mail, and its ref
    globex/scout-vault#1 read scout-mail's first mail."""
    forge, services = embedded.forge, embedded.services
    _, amy = await _globex_with_amy(embedded, tmp_path)
    await _amy_mails_scout(session, embedded, amy, "Written to the first scout-vault.")
    await _rename_vault(session, forge, "globex/scout-vault", "scout-mail")
    await embedded.settle()
    forge.add_repo("globex", "scout-vault")  # (the App, on all its repositories, hears it)
    await embedded.settle()

    status, body = await _tool(session, embedded, amy, "mail_send", to="scout", subject=AFTER,
                               body="Written to the new scout-vault.")
    assert status == 200 and body["mail"]["vault"] == "globex/scout-vault", body
    await embedded.settle()
    status, body = await _tool(session, embedded, amy, "mail_get", mail="globex/scout-vault#1")
    assert status == 200 and body["mail"]["subject"] == AFTER, body
    status, body = await _tool(session, embedded, amy, "mail_get", mail="globex/scout-mail#1")
    assert status == 200 and body["mail"]["subject"] == BEFORE, body
    # each header verifies where its mail is: the old one in scout-mail, the new one here
    old = forge.state.repo("globex", "scout-mail").issues[1]
    new = forge.state.repo("globex", "scout-vault").issues[1]
    assert _verdict(embedded, old, "globex/scout-mail").valid
    assert _verdict(embedded, new, "globex/scout-vault").valid
    assert not _verdict(embedded, old, "globex/scout-vault").valid  # (a copy there)
    published = PublicKeys.from_jwks(services.keyring.public_jwks("globex"))  # (a receiver's)
    for issue, vault in ((old, "globex/scout-mail"), (new, "globex/scout-vault")):
        assert verify_issue({"title": issue.title, "body": issue.body, "number": 1, "user": {
            "login": services.bot_login}}, vault, published, app_login=services.bot_login).valid
    office = await services.offices.get(services.forge_for_org("globex"), "globex")
    assert office is not None and office.vaults() == ["globex/scout-vault"]


async def test_a_vault_renamed_while_the_app_was_down_is_followed_at_start(
        tmp_path: Path, session: aiohttp.ClientSession, database_url: str) -> None:
    """globex/scout-vault renamed scout-mail while no app heard it (no repository.renamed).
    Before, the start did not notice: its mail rows named scout-vault, and new mail, sent
    there, landed in scout-mail through the forge's redirect, signed for scout-vault (a copy
    where it was)."""
    first = await start_embedded(data_dir=tmp_path, persist_forge=True, port=0, forge_port=0,
                                 database_url=database_url, app_key=app_key())
    app_port = int(first.app_url.rsplit(":", 1)[1])
    forge = first.forge
    try:
        _, amy = await _globex_with_amy(first, tmp_path)
        await _amy_mails_scout(session, first, amy, "Written to scout-vault.")
    finally:
        await first.runner.cleanup()  # the app stops; meanwhile, on the forge:
    await _rename_vault(session, forge, "globex/scout-vault", "scout-mail")

    again = await _while_down(forge, lambda forge: None, tmp_path, app_port, database_url)
    try:
        await again.vaults_caught_up()  # (beside the start, not in its way)
        status, body = await _tool(session, again, amy, "mail_list")
        assert status == 200 and [m["vault"] for m in body["mails"]] == [
            "globex/scout-mail"], body
        status, body = await _tool(session, again, amy, "mail_send", to="scout",
                                   subject=AFTER, body="Written to scout-mail.")
        assert status == 200 and body["mail"]["vault"] == "globex/scout-mail", body
        await again.settle()
        services = again.services
        forge_of = services.forge_for_org("globex")
        office = await services.offices.get(forge_of, "globex")
        assert office is not None and office.vaults() == ["globex/scout-mail"]
        found, report = await scan(forge_of, office, services.keyring,
                                   app_login=services.bot_login)
        assert sorted(m.subject for m in found) == [AFTER, BEFORE], report
        assert not report.tampered and not report.copies, report
    finally:
        await again.stop()


async def test_a_vault_transferred_out_of_its_org_while_the_app_was_down_stays_its_offices(
        tmp_path: Path, session: aiohttp.ClientSession, database_url: str,
        caplog: pytest.LogCaptureFixture) -> None:
    """globex/scout-vault transferred to eve's account while no app heard it (a repository's
    admin may), and made public: GitHub leads the old name to eve/scout-vault. Before, the
    start followed it as a rename: globex's mail rows named eve/scout-vault (amy's mail_list
    was empty), and a keyring was made for an office `eve` whose old name globex/scout-vault
    led there. Now a vault is followed within its office only: one transferred out is gone,
    and the log says so; its rows and keys stay globex's."""
    caplog.set_level(logging.WARNING, logger="vaultmail.listing")
    first = await start_embedded(data_dir=tmp_path, persist_forge=True, port=0, forge_port=0,
                                 database_url=database_url, app_key=app_key())
    app_port = int(first.app_url.rsplit(":", 1)[1])
    forge = first.forge
    try:
        _, amy = await _globex_with_amy(first, tmp_path)
        await _amy_mails_scout(session, first, amy, "globex's word")
    finally:
        await first.runner.cleanup()

    def meanwhile(forge: LocalForge) -> None:
        forge.add_user("eve", "eve@evil.test")
        forge.set_permission("globex/scout-vault", "eve", "admin")
        forge.transfer_repo("globex/scout-vault", "eve", sender="eve")
        forge.state.repo("eve", "scout-vault").private = False  # (what any token may read)
        forge.save()

    again = await _while_down(forge, meanwhile, tmp_path, app_port, database_url)
    try:
        await again.vaults_caught_up()
        services = again.services
        assert await mails.vaults_of(services.store, "globex") == {"globex/scout-vault"}
        assert services.keyring.existing("eve") is None
        assert services.keyring.renamed("globex") == {}
        status, body = await _tool(session, again, amy, "mail_list")
        assert status == 200 and [(m["vault"], m["subject"]) for m in body["mails"]] == [
            ("globex/scout-vault", BEFORE)], body
        gone = [r for r in caplog.records if "transferred" in r.getMessage()]
        assert [getattr(r, "gone", None) for r in gone] == [
            {"globex/scout-vault": "eve/scout-vault"}], caplog.text
    finally:
        await again.stop()


async def test_a_vault_transferred_into_another_office_is_its_own_there_and_gone_here(
        embedded: Embedded, tmp_path: Path, session: aiohttp.ClientSession,
        caplog: pytest.LogCaptureFixture) -> None:
    """initech renamed its scout-vault scout-mail; then globex/scout-vault is transferred to
    initech, both offices installed (GitHub sends `repository.transferred` to initech's
    installation only). Before, nothing heard it: initech's old name initech/scout-vault
    still led to scout-mail, so initech's new mail for scout went to scout-mail and its ref
    initech/scout-vault#1 read scout-mail's mail, not the repository there now; and globex's
    log said nothing of its vault gone. Now the repository transferred is one of its own,
    and the office it left is told (its rows stay)."""
    caplog.set_level(logging.WARNING, logger="vaultmail")
    forge, services = embedded.forge, embedded.services
    _, amy, _ = await _office_with_mail(embedded, tmp_path, session)
    _, ian, _ = await _office_with_mail(embedded, tmp_path, session, "initech")
    await _rename_vault(session, forge, "initech/scout-vault", "scout-mail")
    await embedded.settle()
    forge.set_permission("globex/scout-vault", "gia", "admin")
    forge.transfer_repo("globex/scout-vault", "initech", sender="gia")
    await embedded.settle()

    status, body = await _tool(session, embedded, ian, "mail_send", to="scout",
                               subject=AFTER, body="to the scout-vault initech has now")
    assert status == 200 and body["mail"]["vault"] == "initech/scout-vault", body
    await embedded.settle()
    status, body = await _tool(session, embedded, ian, "mail_get", mail="initech/scout-mail#1")
    assert status == 200 and body["mail"]["subject"] == "INITECH ONLY", body
    status, body = await _tool(session, embedded, amy, "mail_list")
    assert status == 200 and [(m["vault"], m["subject"]) for m in body["mails"]] == [
        ("globex/scout-vault", "GLOBEX ONLY")], body
    assert services.keyring.renamed("globex") == {}
    said = [getattr(r, "vault", None) for r in caplog.records
            if "transferred to another owner" in r.getMessage()]
    assert said == ["globex/scout-vault"], caplog.text


async def test_an_office_whose_forge_does_not_answer_holds_up_no_other_offices_catch_up(
        embedded: Embedded, tmp_path: Path, session: aiohttp.ClientSession) -> None:
    """The start's catch-up of vaults renamed while no app heard (bot.app.listing) read every
    office's vaults in turn: globex's read not answered, initech's scout-vault renamed
    scout-mail was never followed (and, before the worker started, no event was handled).
    Now each office's runs beside the others', off the start's path."""
    forge, services = embedded.forge, embedded.services
    app_id = _app_id(embedded)
    await _office_with_mail(embedded, tmp_path, session)
    await _office_with_mail(embedded, tmp_path, session, "initech")
    hook = forge.state.apps[app_id].webhook_url
    forge.set_webhook(app_id, url=f"http://127.0.0.1:{free_port()}/webhook")  # (no app hears)
    forge.rename_repo("initech/scout-vault", "scout-mail")
    await forge.webhooks_idle()
    forge.set_webhook(app_id, url=hook)
    held = forge.faults.hold("GET /repos/{owner}/{repo}", count=None, repo="globex/scout-vault")
    catching_up = asyncio.create_task(listing.catch_up_offices(services))
    try:
        await held.arrived.wait()
        await until(lambda: _vaults_now(services, "initech", {"initech/scout-mail"}))
        assert not catching_up.done()
    finally:
        held.release()
        await catching_up
    assert await mails.vaults_of(services.store, "globex") == {"globex/scout-vault"}


async def _vaults_now(services: Services, org: str, vaults: set[str]) -> bool:
    return await mails.vaults_of(services.store, org) == vaults


async def _by_hand(session: aiohttp.ClientSession, forge: LocalForge, vault: str,
                   title: str) -> int:
    """amy opens an issue in `vault` by hand (the app adopts it as her mail to scout)."""
    forge.set_permission(vault, "amy", "write")
    async with session.post(f"{forge.url}/repos/{vault}/issues", json={
            "title": title, "body": f"{title}, written by hand."}, headers={
            "Authorization": f"token {forge.user_token('amy')}"}) as resp:
        assert resp.status == 201, await resp.text()
        return int((await resp.json())["number"])


async def test_a_hand_opened_issue_in_a_new_repository_under_a_vaults_old_name_is_its_own_mail(
        embedded: Embedded, tmp_path: Path, session: aiohttp.ClientSession) -> None:
    """globex/scout-vault#1, opened by hand, is adopted; the vault is renamed scout-mail and
    a new globex/scout-vault made, whose #1 amy opens by hand too. Before, an adopted mail's
    id was derived from `vault#number`: the new #1 had the old one's id, the index found that
    mail under it and indexed nothing (a signed header and mail:new on the forge, no mail row,
    no ledger entry, no run), and a rebuild read one of the two as a copy of the other."""
    forge, services = embedded.forge, embedded.services
    _, amy = await _globex_with_amy(embedded, tmp_path)
    first = await _by_hand(session, forge, "globex/scout-vault", BEFORE)
    await embedded.settle()
    await _rename_vault(session, forge, "globex/scout-vault", "scout-mail")
    await embedded.settle()
    forge.add_repo("globex", "scout-vault")
    await embedded.settle()
    second = await _by_hand(session, forge, "globex/scout-vault", AFTER)
    await embedded.settle()

    status, old = await _tool(session, embedded, amy, "mail_get",
                              mail=f"globex/scout-mail#{first}")
    assert status == 200 and old["mail"]["subject"] == BEFORE, old
    status, new = await _tool(session, embedded, amy, "mail_get",
                              mail=f"globex/scout-vault#{second}")
    assert status == 200 and new["mail"]["subject"] == AFTER, new
    assert new["mail"]["mail_id"] != old["mail"]["mail_id"]
    sent = [e.data["mail"] for e in await ledger.entries(services.store, event="mail.sent")]
    assert sent == [old["mail"]["mail_id"], new["mail"]["mail_id"]], sent
    office = await services.offices.get(services.forge_for_org("globex"), "globex")
    assert office is not None
    found, report = await scan(services.forge_for_org("globex"), office, services.keyring,
                               app_login=services.bot_login)
    assert sorted(m.subject for m in found) == [AFTER], report  # (its one vault now)
    assert not report.copies and not report.tampered, report
    for vault, number in (("globex/scout-mail", first), ("globex/scout-vault", second)):
        async with session.get(f"{forge.url}/repos/{vault}/issues/{number}", headers={
                "Authorization": f"token {forge.user_token('amy')}"}) as resp:
            issue = await resp.json()  # (as opened: by amy, bound to it by its mail id)
        assert verify_issue(issue, vault, services.keyring, app_login=services.bot_login).valid


async def test_an_idempotency_key_the_freed_names_old_office_used_reads_none_of_its_mail(
        embedded: Embedded, tmp_path: Path, session: aiohttp.ClientSession) -> None:
    """globex sends amy's mail with the key "q3", renames itself initech, and another account
    makes a new globex office, whose amy sends with the key "q3" too. A key's mail id was
    derived from the office's name: the new office's send answered with initech's mail (its
    subject and body) as if it were its own, and sent nothing; then it was refused. Now it
    is derived from the office's account id: the key is the new office's own, its mail sent,
    nothing of initech's read."""
    forge, services = embedded.forge, embedded.services
    app_id, amy = await _globex_with_amy(embedded, tmp_path)
    status, body = await _tool(session, embedded, amy, "mail_send", to="scout", subject=BEFORE,
                               body="initech's own words", idempotencyKey="q3")
    assert status == 200, body
    await embedded.settle()
    forge.rename_org("globex", "initech")
    await embedded.settle()

    await _add_globex(embedded, tmp_path)  # another account, its own office under the name
    forge.install_app(app_id, "globex")
    await embedded.settle()
    amy_again = await api_tokens.create_token(services.store, "human:amy@globex.test", "globex")
    status, body = await _tool(session, embedded, amy_again, "mail_send", to="scout",
                               subject=AFTER, body="the new globex", idempotencyKey="q3")
    assert status == 200 and body["mail"]["vault"] == "globex/scout-vault", body
    assert body["mail"]["subject"] == AFTER and "initech" not in str(body), body


async def test_an_old_name_the_forge_leads_to_another_owner_reads_nothing_of_theirs(
        embedded: Embedded, tmp_path: Path, session: aiohttp.ClientSession) -> None:
    """globex/scout-vault transferred to eve's account and made public (no App of globex's
    hears it: GitHub tells only the new owner's). Before, globex's reads of the old name
    followed the forge's redirect into eve's repository, readable without the installation's
    grant: amy's mail_get of globex/scout-vault#1 answered eve's comment on it as the
    thread, and the office's forge read eve's issues as globex's vault. Now a redirect
    reaching another owner's repository is the vault gone (NotFound, naming where it went)."""
    forge, services = embedded.forge, embedded.services
    _, amy, _ = await _office_with_mail(embedded, tmp_path, session)
    forge.add_user("eve", "eve@evil.test")
    forge.set_permission("globex/scout-vault", "eve", "admin")
    forge.transfer_repo("globex/scout-vault", "eve", sender="eve")
    forge.state.repo("eve", "scout-vault").private = False  # (what any token may read)
    async with session.post(f"{forge.url}/repos/eve/scout-vault/issues/1/comments",
                            json={"body": "EVE'S WORDS"}, headers={
                                "Authorization": f"token {forge.user_token('eve')}"}) as resp:
        assert resp.status == 201, await resp.text()
    async with session.patch(f"{forge.url}/repos/eve/scout-vault/issues/1",
                             json={"state": "closed"}, headers={
                                 "Authorization": f"token {forge.user_token('eve')}"}) as resp:
        assert resp.status == 200, await resp.text()
    await embedded.settle()

    report = await Doctor(services, dry_run=True).run(["globex"])  # (eve's issues unread)
    assert [(f.kind, "now belongs to another owner" in f.reason) for f in report.findings] == [
        ("office", True)], report.as_json()
    status, body = await _tool(session, embedded, amy, "mail_get", mail="globex/scout-vault#1")
    assert "EVE'S WORDS" not in str(body), body
    assert status == 410 and "was moved to another owner" in str(body), body
    globex = services.forge_for_org("globex")
    with pytest.raises(NotFound, match="another owner") as gone:
        await globex.get_issue("globex/scout-vault", 1)
    assert isinstance(gone.value, errors.MovedAway) and gone.value.now == "eve/scout-vault"
    with pytest.raises(NotFound, match="another owner"):
        [i async for i in globex.iter_issues("globex/scout-vault", state="all")]
    assert await globex.repo_name_now("globex/scout-vault") == "eve/scout-vault"


async def test_a_key_retried_after_the_org_renamed_itself_sends_no_second_mail(
        embedded: Embedded, tmp_path: Path, session: aiohttp.ClientSession) -> None:
    """amy sends with the key "q3"; globex renames itself initech; a week on (the tool's
    stored result pruned, as the index prunes it) her client retries "q3". The key's mail id
    was derived from the office's name: before, the retry derived another id under the new
    name and opened a second issue. Now it is derived from the org's account id, which a
    rename keeps: the retry answers with the first mail."""
    forge, services = embedded.forge, embedded.services
    _, amy = await _globex_with_amy(embedded, tmp_path)
    args = {"to": "scout", "subject": BEFORE, "body": "Once only.", "idempotencyKey": "q3"}
    status, first = await _tool(session, embedded, amy, "mail_send", **args)
    assert status == 200, first
    await embedded.settle()
    forge.rename_org("globex", "initech")
    await embedded.settle()
    week = time.time() + MIN_KEEP + 1
    await prune(services.store, now=week, keep=MIN_KEEP)

    status, again = await _tool(session, embedded, amy, "mail_send", **args)
    assert status == 200, again
    await embedded.settle()
    assert again["mail"]["mail_id"] == first["mail"]["mail_id"], again
    repo = forge.state.repo("initech", "scout-vault")
    assert repo is not None and len(repo.issues) == 1, [i.title for i in repo.issues.values()]


async def test_a_key_sent_before_ids_came_from_the_account_is_found_after_a_rename(
        embedded: Embedded, tmp_path: Path, session: aiohttp.ClientSession) -> None:
    """globex's installation is known without its account (as a release before account ids
    wrote it: its event not heard), and amy sends with the key "q3": the id is derived from
    the name globex, as every key's was before. Its account is learnt, and globex renames
    itself initech (the office follows it); a week on, amy's client retries "q3": it answers
    with the mail the key sent under the name the office had then, and sends no other."""
    forge, services = embedded.forge, embedded.services
    await _add_globex(embedded, tmp_path)
    forge.faults.drop_webhooks(count=1)  # installation.created: not heard
    installation = forge.install_app(_app_id(embedded), "globex")
    await installations.installed(services.store, "globex", installation)  # (no account)
    services.installations["globex"] = installation
    assert await installations.account_of(services.store, "globex") is None
    amy = await api_tokens.create_token(services.store, "human:amy@globex.test", "globex")
    args = {"to": "scout", "subject": BEFORE, "body": "Once only.", "idempotencyKey": "q3"}
    status, first = await _tool(session, embedded, amy, "mail_send", **args)
    assert status == 200, first
    await embedded.settle()
    account = forge.state.account("globex")
    assert account is not None  # its installation heard at last (a start's listing): its account
    await installations.installed(services.store, "globex", installation, account.id)
    forge.rename_org("globex", "initech")
    await embedded.settle()
    assert await installations.account_of(services.store, "initech") == account.id
    await prune(services.store, now=time.time() + MIN_KEEP + 1, keep=MIN_KEEP)

    status, again = await _tool(session, embedded, amy, "mail_send", **args)
    assert status == 200, again
    await embedded.settle()
    assert again["mail"]["mail_id"] == first["mail"]["mail_id"], again
    repo = forge.state.repo("initech", "scout-vault")
    assert repo is not None and len(repo.issues) == 1, [i.title for i in repo.issues.values()]


async def test_a_reply_delivered_under_the_old_names_after_the_rename_is_taken(
        embedded: Embedded, tmp_path: Path, session: aiohttp.ClientSession) -> None:
    """scout replies by a comment on amy's mail, its delivery lost; globex renames itself
    initech; the reconciler has the forge deliver the comment again, as it was sent: naming
    globex/scout-vault. The reply is taken as the mail's, under its new name."""
    forge, services = embedded.forge, embedded.services
    _, amy = await _globex_with_amy(embedded, tmp_path)
    await _amy_mails_scout(session, embedded, amy, "Which prices?")
    forge.faults.drop_webhooks(count=1)
    async with session.post(f"{forge.url}/repos/globex/scout-vault/issues/1/comments",
                            json={"body": "EU prices, up 4%."},
                            headers={"Authorization": f"token {forge.user_token('globex-scout')}"}
                            ) as resp:
        assert resp.status == 201, await resp.text()
    await embedded.settle()
    assert forge.faults.drop.count == 0, "the comment's delivery was dropped"
    forge.rename_org("globex", "initech")
    await embedded.settle()

    assert await embedded.reconciler.run_once() == 1
    await embedded.settle()
    mail = await mails.mail_at(services.store, "initech/scout-vault", 1)
    assert mail is not None and mail.state == "mail:replied", mail


async def test_a_vault_moved_to_another_owner_is_410_saying_what_happened_not_try_again(
        embedded: Embedded, tmp_path: Path, session: aiohttp.ClientSession,
        caplog: pytest.LogCaptureFixture) -> None:
    """globex/scout-vault transferred to eve's account (the forge leads its old name there:
    MovedAway). Before, amy's mail_get, over the API and over MCP, was a 502 forge_error
    saying to try again later, which never helps, and the log had a warning without the
    installation. Now it is 410 vault_moved naming where it went and what to do (move it
    back, or name a new vault in the office's config), and an error in the log with the
    installation's id."""
    caplog.set_level(logging.WARNING, logger="vaultmail")
    forge = embedded.forge
    inst, amy, _ = await _office_with_mail(embedded, tmp_path, session)
    forge.add_user("eve", "eve@evil.test")
    forge.set_permission("globex/scout-vault", "eve", "admin")
    forge.transfer_repo("globex/scout-vault", "eve", sender="eve")
    forge.state.repo("eve", "scout-vault").private = False
    await embedded.settle()

    status, body = await _tool(session, embedded, amy, "mail_get", mail="globex/scout-vault#1")
    assert status == 410 and body["error"]["code"] == "vault_moved", body
    said = body["error"]["message"]
    assert "try again" not in said, said
    for words in ("globex/scout-vault", "eve/scout-vault", "moved back", CONFIG_PATH):
        assert words in said, said
    async with mcp_http(embedded, amy) as client:
        assert _refused(await client.call_tool(
            "mail_get", {"mail": "globex/scout-vault#1"})) == (410, "vault_moved", said)
    loud = [r for r in caplog.records if r.levelno >= logging.ERROR
            and "eve/scout-vault" in r.getMessage()]
    assert loud and {getattr(r, "installation_id", None) for r in loud} == {inst}, caplog.text


async def _reply_lost(session: aiohttp.ClientSession, embedded: Embedded, vault: str) -> None:
    """scout replies by a comment on `vault#1`, amy's mail to it; the delivery is lost."""
    forge = embedded.forge
    forge.faults.drop_webhooks(count=1)
    async with session.post(f"{forge.url}/repos/{vault}/issues/1/comments",
                            json={"body": "EU prices, up 4%."}, headers={
                                "Authorization": f"token {forge.user_token('globex-scout')}"}
                            ) as resp:
        assert resp.status == 201, await resp.text()
    await embedded.settle()
    assert forge.faults.drop.count == 0, "the comment's delivery was dropped"


async def test_a_reply_delivered_under_the_vaults_old_name_after_its_rename_is_taken(
        embedded: Embedded, tmp_path: Path, session: aiohttp.ClientSession) -> None:
    """scout replies by a comment on amy's mail, its delivery lost; globex/scout-vault is
    renamed scout-mail; the reconciler has the forge deliver the comment again, as it was
    sent: naming globex/scout-vault. Before, no mail was known there: the reply was parked,
    then pruned, and the mail never replied. Now the delivery's repository (its id) is
    taken under its name now, the vault's new one."""
    _, amy = await _globex_with_amy(embedded, tmp_path)
    await _amy_mails_scout(session, embedded, amy, "Which prices?")
    await _reply_lost(session, embedded, "globex/scout-vault")
    await _rename_vault(session, embedded.forge, "globex/scout-vault", "scout-mail")
    await embedded.settle()

    assert await embedded.reconciler.run_once() == 1
    await embedded.settle()
    mail = await mails.mail_at(embedded.services.store, "globex/scout-mail", 1)
    assert mail is not None and mail.state == "mail:replied", mail


async def test_a_reply_under_a_vaults_old_name_another_repository_took_is_the_vaults(
        embedded: Embedded, tmp_path: Path, session: aiohttp.ClientSession) -> None:
    """The same, and a new globex/scout-vault made (a repository of its own) before the
    comment is delivered again: the reply is the renamed vault's mail's (its repository's
    id says so), not the new repository's #1, amy's new mail there, which stays unreplied."""
    forge, services = embedded.forge, embedded.services
    _, amy = await _globex_with_amy(embedded, tmp_path)
    await _amy_mails_scout(session, embedded, amy, "Which prices?")
    await _reply_lost(session, embedded, "globex/scout-vault")
    await _rename_vault(session, forge, "globex/scout-vault", "scout-mail")
    await embedded.settle()
    forge.add_repo("globex", "scout-vault")
    await embedded.settle()
    status, body = await _tool(session, embedded, amy, "mail_send", to="scout", subject=AFTER,
                               body="Written to the new scout-vault.")
    assert status == 200 and body["mail"]["vault"] == "globex/scout-vault", body
    await embedded.settle()

    assert await embedded.reconciler.run_once() == 1
    await embedded.settle()
    old = await mails.mail_at(services.store, "globex/scout-mail", 1)
    assert old is not None and old.state == "mail:replied", old
    new = await mails.mail_at(services.store, "globex/scout-vault", 1)
    assert new is not None and new.subject == AFTER and new.state != "mail:replied", new


async def test_an_opening_delivered_under_the_vaults_old_name_after_its_rename_is_adopted(
        embedded: Embedded, tmp_path: Path, session: aiohttp.ClientSession) -> None:
    """amy opens an issue by hand in globex/scout-vault, its `issues.opened` delivery lost;
    the vault is renamed scout-mail; the reconciler has the opening delivered again, naming
    globex/scout-vault. Before, the old name was no vault of the office's (its config's names
    follow the rename): the issue was never mail. Now it is adopted where it is."""
    forge, services = embedded.forge, embedded.services
    _, amy = await _globex_with_amy(embedded, tmp_path)
    forge.faults.drop_webhooks(count=1)
    number = await _by_hand(session, forge, "globex/scout-vault", BEFORE)
    await embedded.settle()
    assert forge.faults.drop.count == 0, "the opening's delivery was dropped"
    await _rename_vault(session, forge, "globex/scout-vault", "scout-mail")
    await embedded.settle()

    assert await embedded.reconciler.run_once() == 1
    await embedded.settle()
    mail = await mails.mail_at(services.store, "globex/scout-mail", number)
    assert mail is not None and mail.subject == BEFORE, mail


async def test_a_reply_waiting_for_its_mail_is_taken_when_the_opening_comes_after_a_rename(
        embedded: Embedded, tmp_path: Path, session: aiohttp.ClientSession) -> None:
    """amy opens an issue by hand in globex/scout-vault, its `issues.opened` delivery lost;
    scout replies on it (the reply waits, parked, for the issue to become mail); the vault is
    renamed scout-mail (the parked reply's queue row with it); the reconciler has the opening
    delivered again, naming globex/scout-vault. Before, the adoption let out what waited
    under the old name only: the reply stayed parked until pruned, the mail never replied."""
    forge, services = embedded.forge, embedded.services
    await _globex_with_amy(embedded, tmp_path)
    forge.faults.drop_webhooks(count=1)
    number = await _by_hand(session, forge, "globex/scout-vault", BEFORE)
    await embedded.settle()
    assert forge.faults.drop.count == 0, "the opening's delivery was dropped"
    async with session.post(f"{forge.url}/repos/globex/scout-vault/issues/{number}/comments",
                            json={"body": "EU prices, up 4%."}, headers={
                                "Authorization": f"token {forge.user_token('globex-scout')}"}
                            ) as resp:
        assert resp.status == 201, await resp.text()
    await embedded.settle()
    await _rename_vault(session, forge, "globex/scout-vault", "scout-mail")
    await embedded.settle()

    assert await embedded.reconciler.run_once() == 1
    await embedded.settle()
    mail = await mails.mail_at(services.store, "globex/scout-mail", number)
    assert mail is not None and mail.state == "mail:replied", mail


async def _finished_at(services: Services, guids: list[str]) -> list[float]:
    """When each of the queued deliveries `guids` (the forge's ids) was recorded finished
    (a worker records what finished together with its next claim: those of one claim's
    lane, in order, may share a time; a later claim's come later)."""
    rows = await services.store.fetchall("SELECT guid, finished_at FROM queue")
    at = {str(r["guid"]): r["finished_at"] for r in rows}
    assert all(at.get(guid) is not None for guid in guids), at
    return [float(at[guid]) for guid in guids]


async def test_a_comment_under_a_vaults_old_name_and_one_under_its_new_run_in_arrival_order(
        embedded: Embedded, tmp_path: Path, session: aiohttp.ClientSession) -> None:
    """scout's reply on amy's mail, its delivery lost; the vault is renamed scout-mail; the
    reconciler has the reply delivered again, naming globex/scout-vault, and its first try
    fails (the forge, asked where the repository is now, answers 502 to every try): it
    waits for a retry.
    scout then comments again, a delivery naming globex/scout-mail. Both are about one issue:
    the second waits behind the first's retry, as deliveries about one issue do. Before,
    each was queued under the name its payload gave (`owner/repo#N`): two issues to the
    queue, and the second ran first."""
    forge, services = embedded.forge, embedded.services
    _, amy = await _globex_with_amy(embedded, tmp_path)
    await _amy_mails_scout(session, embedded, amy, "Which prices?")
    await _reply_lost(session, embedded, "globex/scout-vault")
    await _rename_vault(session, forge, "globex/scout-vault", "scout-mail")
    await embedded.settle()
    known = {str(r["guid"]) for r in await services.store.fetchall("SELECT guid FROM queue")}

    tries = 4  # (bot.forge.caller's for a 5xx)
    # globex's client tries them at once (not 1, 2, 4 s apart): the first try's delivery still
    # fails, and its retry is the worker's, 1-3 s on, which the later comment must wait for
    globex = services.forge_for(services.installations["globex"])
    globex.config = dataclasses.replace(  # type: ignore[attr-defined]
        globex.config, backoff_base=0.01, backoff_max=0.05)  # type: ignore[attr-defined]
    where_now = forge.faults.add("GET /repos/{owner}/{repo}", count=tries)  # (repo_name_of)
    assert await embedded.reconciler.run_once() == 1
    await forge.webhooks_idle()
    async with session.post(f"{forge.url}/repos/globex/scout-mail/issues/1/comments",
                            json={"body": "And US prices are flat."}, headers={
                                "Authorization": f"token {forge.user_token('globex-scout')}"}
                            ) as resp:
        assert resp.status == 201, await resp.text()
    await embedded.settle()
    assert where_now.fired == tries
    rows = await services.store.fetchall("SELECT guid, payload FROM queue ORDER BY id")
    late = [str(r["guid"]) for r in rows if str(r["guid"]) not in known
            and "prices" in str(r["payload"])]
    assert len(late) == 2, late  # the redelivered reply, then the new comment
    first, second = await _finished_at(services, late)
    assert first <= second, "the later comment ran before the reply's retry"


async def _reply_answered_then_renamed(embedded: Embedded, tmp_path: Path,
                                       session: aiohttp.ClientSession) -> dict[str, Any]:
    """scout's reply on amy's mail in globex/scout-vault, handled, amy's answer after it, then
    globex renamed initech: the reply's delivery, as it was sent."""
    forge = embedded.forge
    _, amy = await _globex_with_amy(embedded, tmp_path)
    await _amy_mails_scout(session, embedded, amy, "Which prices?")
    await _comment(session, forge, "globex-scout", "globex/scout-vault", 1, "EU, up 4%.")
    await embedded.settle()
    reply = forge_delivery(embedded, "issue_comment", "created",
                           lambda p: p["comment"]["user"]["login"] == "globex-scout")
    await _comment(session, forge, "amy", "globex/scout-vault", 1, "And the US?")
    await embedded.settle()
    forge.rename_org("globex", "initech")
    await embedded.settle()
    return reply


@pytest.mark.parametrize("named", ["globex", "initech"], ids=["as-sent", "new-login"])
async def test_a_reply_delivered_again_after_the_rename_is_taken_once(
        embedded: Embedded, tmp_path: Path, session: aiohttp.ClientSession, named: str) -> None:
    """scout replies on amy's mail in globex/scout-vault, and amy answers it (the turn is
    scout's again); globex renames itself initech; the reply comes again under a new
    delivery id, naming globex as it was sent (GitHub's "Redeliver") or initech (a capture
    taken since). One change: it takes the turn back from amy's answer no more, and is
    ledgered once. Before, the change was keyed under the login its payload named: named
    initech, it was a new key, and the reply ran again (mail:replied, two mail.replied)."""
    services = embedded.services
    reply = await _reply_answered_then_renamed(embedded, tmp_path, session)

    await replay_under_new_id(embedded, session, "issue_comment",
                              _named(reply, f"{named}/scout-vault"))
    mail = await mails.mail_at(services.store, "initech/scout-vault", 1)
    assert mail is not None and mail.state == "mail:new", mail
    assert len(await embedded.ledger_events("mail.replied")) == 1


async def test_a_reply_handled_before_a_rename_that_left_its_key_is_found_when_redelivered(
        embedded: Embedded, tmp_path: Path, session: aiohttp.ClientSession) -> None:
    """The same, where the rename was followed by a release that left the change's key under
    the old login (renames moved no forge keys then): the reply redelivered as it was sent
    is found there, and not taken again."""
    services = embedded.services
    reply = await _reply_answered_then_renamed(embedded, tmp_path, session)
    now = "issue_comment.created:initech:"
    async with services.store.transaction() as db:  # as that release left it
        moved = await db.execute(
            "UPDATE idempotency SET key=? || substr(key, ?) WHERE scope='forge'"
            " AND substr(key, 1, ?)=?", ("issue_comment.created:globex:", len(now) + 1,
                                         len(now), now))
    assert moved == 2, "scout's reply and amy's answer"

    await replay_under_new_id(embedded, session, "issue_comment", reply)
    mail = await mails.mail_at(services.store, "initech/scout-vault", 1)
    assert mail is not None and mail.state == "mail:new", mail
    assert len(await embedded.ledger_events("mail.replied")) == 1


async def _comment(session: aiohttp.ClientSession, forge: LocalForge, login: str, repo: str,
                   number: int, body: str) -> None:
    async with session.post(f"{forge.url}/repos/{repo}/issues/{number}/comments",
                            json={"body": body},
                            headers={"Authorization": f"token {forge.user_token(login)}"}
                            ) as resp:
        assert resp.status == 201, await resp.text()


async def test_another_offices_key_that_begins_with_the_renamed_orgs_login_is_kept(
        embedded: Embedded, tmp_path: Path, session: aiohttp.ClientSession) -> None:
    """scout, in acme, replies on builder's mail with the key "globex/r1" (a key is the
    client's to choose); globex, another office, renames itself initech; scout's client
    retries "globex/r1". The key is acme's: the retry answers with the first reply, and
    replies no more."""
    forge, services = embedded.forge, embedded.services
    await _globex_with_amy(embedded, tmp_path)
    builder = await api_tokens.create_token(services.store, "agent:builder", "acme")
    scout = await api_tokens.create_token(services.store, "agent:scout", "acme")
    status, sent = await _tool(session, embedded, builder, "mail_send", to="scout",
                               subject="Prices", body="EU prices?")
    assert status == 200, sent
    await embedded.settle()
    args = {"mail": sent["mail"]["ref"], "body": "Up 4%.", "idempotencyKey": "globex/r1"}
    status, first = await _tool(session, embedded, scout, "mail_reply", **args)
    assert status == 200, first
    await embedded.settle()
    forge.rename_org("globex", "initech")
    await embedded.settle()

    status, again = await _tool(session, embedded, scout, "mail_reply", **args)
    assert status == 200, again
    await embedded.settle()
    assert again["mail"] == first["mail"], (again, first)
    assert len(await embedded.ledger_events("mail.replied")) == 1
