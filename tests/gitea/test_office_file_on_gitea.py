"""The operator's office file (VAULTMAIL_OFFICE) on Gitea: one org's office, named in the file
by its login. A login is not an identity: an org deleted and made again under its name by
another user (who adds the bot to it, as Gitea lets any org owner add any user) is another
org, and the file is not its office; the org renamed is the same org, and keeps it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from importlib import resources
from pathlib import Path

import aiohttp
import pytest

from bot.app.embedded import Embedded, start_embedded
from bot.app.gitea_orgs import refresh
from bot.office.source import OfficeSource
from bot.store import api_tokens
from tests.support import ToolClient


@pytest.fixture
async def filed(tmp_path: Path, database_url: str) -> AsyncIterator[Embedded]:
    """`vaultmail serve --forge gitea` with VAULTMAIL_OFFICE naming the operator's file for
    acme (the example office), on each engine: its config comes from the file, as
    bot.app.build makes the source."""
    path = tmp_path / "office.yml"
    path.write_text(resources.files("bot").joinpath("example_office.yml").read_text())
    emb = await start_embedded(data_dir=tmp_path / "d", port=0, forge_port=0, dialect="gitea",
                               database_url=database_url)
    services = emb.services
    # (its URLs checked for the org served, as the services ask: `url_refused_for`)
    services.take_offices(OfficeSource(path, renamed=services.keyring.renamed))
    try:
        yield emb
    finally:
        await emb.stop()


async def _marco(office: Embedded, session: aiohttp.ClientSession) -> ToolClient:
    token = await api_tokens.create_token(office.services.store, "human:marco@acme.com", "acme")
    return ToolClient(session, office, "human:marco@acme.com", token=token)


async def test_an_org_made_again_under_the_files_name_is_not_served_the_operators_office(
        filed: Embedded) -> None:
    """acme is deleted and another user makes an org called acme, with a scout-vault of its
    own, and adds the bot: at the app's next look it is another org (its id). The operator's
    file named acme's people and agents: served to the newcomer, marco's mail to scout would
    be written into the newcomer's repository (found by review: the file was matched by
    name)."""
    forge, services = filed.forge, filed.services
    async with aiohttp.ClientSession() as session:
        sent = await (await _marco(filed, session))("mail_send", to="scout", subject="Before",
                                                   body="x")
        assert sent["mail"]["vault"] == "acme/scout-vault"
        await filed.settle()
        vault = forge.state.repo_by_full_name("acme/scout-vault")
        before = len(vault.issues)
        forge.state.accounts["acme"].id = forge.state.next_id("account")  # made again
        assert await refresh(services) == []
        assert await services.offices.get(services.forge_for_org("acme"), "acme") is None
        status, body = await (await _marco(filed, session)).raw(
            "mail_send", {"to": "scout", "subject": "ACME-CONFIDENTIAL", "body": "x"})
        await filed.settle()
    assert status != 200 and body["error"]["code"] == "no_office", body
    assert "not the org the operator's office file" in body["error"]["message"], body
    assert len(vault.issues) == before, "nothing written to the newcomer's repository"
    assert "ACME-CONFIDENTIAL" not in json.dumps(
        [i.title for i in vault.issues.values()])


async def test_the_files_org_renamed_keeps_the_operators_office(filed: Embedded) -> None:
    """The same org (its id) under a new login is the file's office still, as the App path
    follows an org renamed."""
    forge, services = filed.forge, filed.services
    forge.rename_org("acme", "acme-corp")
    await refresh(services)
    office = await services.offices.get(services.forge_for_org("acme-corp"), "acme-corp")
    assert office is not None and office.org == "acme-corp"


async def test_an_org_made_again_before_the_file_was_first_served_is_not_served_it(
        filed: Embedded) -> None:
    """acme is deleted and made again by another user before anyone asked for its office:
    the file is the office of the account the index first knew as acme (bound as the index
    recorded it), not of whoever holds the name at its first use. Before, the newcomer was
    served it, as the file's first holder."""
    forge, services = filed.forge, filed.services
    old = forge.state.accounts["acme"].id
    forge.state.accounts["acme"].id = forge.state.next_id("account")  # made again
    assert await refresh(services) == []
    vault = forge.state.repo_by_full_name("acme/scout-vault")
    assert vault is not None
    before = len(vault.issues)
    async with aiohttp.ClientSession() as session:
        status, body = await (await _marco(filed, session)).raw(
            "mail_send", {"to": "scout", "subject": "ACME-CONFIDENTIAL", "body": "x"})
        await filed.settle()
    assert status != 200 and body["error"]["code"] == "no_office", body
    assert f"forge account {old}, the first this app knew as acme" in \
        body["error"]["message"], body
    assert len(vault.issues) == before, "nothing written to the newcomer's repository"
    assert await services.offices.get(services.forge_for_org("acme"), "acme") is None
