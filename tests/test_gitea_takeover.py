"""Gitea tells no hook of an org renamed: the app learns it at its next look at the bot's orgs
(bot.app.gitea_orgs, every ORGS_EVERY seconds). Until then the index holds the office's
vaults under the org's old login, which another user may take at once, making an org of
that name with a repository of the vault's name and adding the bot. Nothing the office
writes may land there: a write into a repository is made only while its owner is the
account the index holds for its login (bot.forge.gitea), and one found otherwise has the
app look at the bot's orgs first, so the office follows its org."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml

from bot.app.gitea_orgs import look
from bot.forge.errors import OwnerChanged
from bot.store import installations, mails
from tests.test_email_support import (
    DOMAIN,
    Mailroom,
    delivered,
    message,
    open_mailroom,
    send,
    wire,
)


@pytest.fixture
async def gitea_room(tmp_path: Path, database_url: str) -> AsyncIterator[Mailroom]:
    """The mailroom (tests/test_email_support.py) with the local forge speaking Gitea."""
    async with open_mailroom(tmp_path, database_url, dialect="gitea") as room:
        yield room


def _taken_over(room: Mailroom) -> int:
    """acme renames itself acme2 (its office's index not told: Gitea sends no hook, and the
    app's next look is minutes away); eve makes an org called acme with a scout-vault of
    her own and adds the bot to it. Her org's id."""
    forge = room.embedded.forge
    forge.rename_org("acme", "acme2")
    forge.add_user("eve", "eve@evil.test")
    forge.add_org("acme", owner="eve")
    forge.add_repo("acme", "scout-vault")
    forge.add_org_member("acme", room.embedded.services.app_slug, role="admin")
    eves = forge.state.account("acme")
    assert eves is not None
    return eves.id


def _issues_of(room: Mailroom, owner: str, name: str) -> list[str]:
    repo = room.embedded.forge.state.repo(owner, name)
    assert repo is not None
    return [issue.title for issue in repo.issues.values()]


async def test_email_to_an_agent_after_its_org_renamed_never_lands_in_the_new_orgs_vault(
        gitea_room: Mailroom) -> None:
    """Acted out (review): within the look's window, bob's email to scout was written as an
    issue in eve's acme/scout-vault (the office's config still named it so), and eve read it.
    Now the write finds acme/scout-vault is not the office's org's (another id): nothing is
    written, the app looks at the bot's orgs (acme's office follows it to acme2, eve's acme is
    a new office), and the email is answered 451; sent again, it is delivered to
    acme2/scout-vault."""
    room = gitea_room
    store = room.embedded.services.store
    acme_id = await installations.account_of(store, "acme")
    eve_id = _taken_over(room)
    raw = wire(message("Bob <bob@example.org>", f"scout@{DOMAIN}", "Prices", "The secret.",
                       Message_ID="<takeover@example.org>"))
    first = await send(room.port, raw, rcpts=[f"scout@{DOMAIN}"])
    assert _issues_of(room, "acme", "scout-vault") == [], "written into eve's vault"
    assert first.code == 451, first
    assert await installations.account_of(store, "acme2") == acme_id
    assert await installations.account_of(store, "acme") == eve_id
    again = await send(room.port, raw, rcpts=[f"scout@{DOMAIN}"])
    assert await delivered(room, again) == ["acme2/scout-vault#1"]
    assert _issues_of(room, "acme2", "scout-vault") == ["Prices"]
    assert _issues_of(room, "acme", "scout-vault") == []
    [mail] = await mails.all_mails(store)
    assert mail.vault == "acme2/scout-vault"


async def test_an_agents_mail_after_its_org_renamed_never_lands_in_the_new_orgs_vault(
        gitea_room: Mailroom) -> None:
    """The same for mail an agent sends with mail_send (to itself: scout's own vault): the
    call is refused saying to try again, nothing in eve's vault; again, it is acme2's."""
    room = gitea_room
    tools = room.tools("agent:scout")
    _taken_over(room)
    args = {"to": "scout", "subject": "Plans", "body": "The secret plans.",
            "idempotencyKey": "plans-1"}
    status, refused = await tools.raw("mail_send", args)
    assert _issues_of(room, "acme", "scout-vault") == [], "written into eve's vault"
    assert status == 502 and "try again" in str(refused), (status, refused)
    sent = await tools("mail_send", **args)
    assert sent["mail"]["vault"] == "acme2/scout-vault", sent
    assert _issues_of(room, "acme2", "scout-vault") == ["Plans"]
    assert _issues_of(room, "acme", "scout-vault") == []


async def test_the_config_of_the_org_that_took_the_login_is_never_read_as_the_offices(
        gitea_room: Mailroom) -> None:
    """The same window: eve's acme has a .github/vaultmail.yml naming her and her own scout.
    Before, the office's next read of its config (every minute) read hers as acme's office's,
    whose mail and tokens are the first org's. Now the read finds acme/.github is another
    account's: nothing of it is read, the app looks at the bot's orgs, and the first org's
    office, acme2 now, reads its own; eve's is the config of her own new office."""
    room = gitea_room
    services, forge = room.embedded.services, room.embedded.forge
    eve_id = _taken_over(room)
    forge.add_repo("acme", ".github")
    forge.put_file("acme/.github", "vaultmail.yml", yaml.safe_dump({
        "org": "acme",
        "humans": [{"email": "eve@evil.test", "login": "eve", "permissions": ["editor"]}],
        "agents": [{"slug": "scout", "login": "eve-scout", "person": "eve@evil.test"}]}))
    with pytest.raises(OwnerChanged):
        await services.offices.get(services.forge_for_org("acme"), "acme", fresh=True)
    assert await installations.account_of(services.store, "acme") == eve_id
    first = await services.offices.get(services.forge_for_org("acme2"), "acme2")
    assert first is not None and first.human("eve@evil.test") is None
    hers = await services.offices.get(services.forge_for_org("acme"), "acme")
    assert hers is not None and hers.human("eve@evil.test") is not None


async def test_email_to_an_agent_after_its_org_renamed_is_not_bounced_as_moved_away(
        gitea_room: Mailroom) -> None:
    """acme renames itself acme2 and nobody takes its old login: within the look's window,
    Gitea leads acme/scout-vault to acme2/scout-vault, which the request loop follows to no
    other owner (`MovedAway`). Before, bob's email was refused for good (550: the vault
    "gone", a bounce ledgered) though its vault is where its org went. Now the same account's
    repository under the org's new login is that org renamed: the app looks at the bot's
    orgs, the email is answered 451, and sent again it is acme2's."""
    room = gitea_room
    room.embedded.forge.rename_org("acme", "acme2")
    raw = wire(message("Bob <bob@example.org>", f"scout@{DOMAIN}", "Prices", "x",
                       Message_ID="<renamed@example.org>"))
    first = await send(room.port, raw, rcpts=[f"scout@{DOMAIN}"])
    assert first.code == 451, first
    again = await send(room.port, raw, rcpts=[f"scout@{DOMAIN}"])
    assert await delivered(room, again) == ["acme2/scout-vault#1"]


async def test_mail_sends_at_once_after_its_org_renamed_never_land_in_the_new_orgs_vault(
        gitea_room: Mailroom) -> None:
    """Review: four of scout's mail_sends at once in the window. The first write found
    acme/scout-vault eve's and had the app look at the bot's orgs (the index then holds eve's
    account under acme); the others, their vault worked out before, came to their turn after
    the look, and were checked against the account the index held for acme THEN, eve's: they
    passed, and 'Plans 1..3' were written into eve's vault, indexed as her office's mail. Now
    each write is checked against the account of the office it was made for: every one is
    refused, nothing is written there, and sent again they are acme2's."""
    room = gitea_room
    tools = room.tools("agent:scout")
    _taken_over(room)
    sends = [{"to": "scout", "subject": f"Plans {i}", "body": "The secret plans.",
              "idempotencyKey": f"plans-{i}"} for i in range(4)]
    answers = await asyncio.gather(*(tools.raw("mail_send", args) for args in sends))
    assert _issues_of(room, "acme", "scout-vault") == [], "written into eve's vault"
    assert [status for status, _ in answers] == [502] * 4, answers
    assert [m.org for m in await mails.all_mails(room.embedded.services.store)] == []
    for args in sends:
        sent = await tools("mail_send", **args)
        assert sent["mail"]["vault"] == "acme2/scout-vault", sent
    assert sorted(_issues_of(room, "acme2", "scout-vault")) == [f"Plans {i}" for i in range(4)]
    assert _issues_of(room, "acme", "scout-vault") == []


async def test_a_write_made_for_the_office_before_a_look_is_not_made_for_the_newcomer(
        gitea_room: Mailroom) -> None:
    """Review: a look at the bot's orgs (the 5-minute round, or one a delivery asked for) lands
    while a write of acme's office waits for its turn. The index then holds eve's account
    under acme, and the write was checked against that: written into eve's vault. Now the
    forge the office's work was given is the forge of the account the office was made for:
    after the look its write into eve's acme/scout-vault is refused (OwnerChanged), and the
    forge for acme now is eve's office's, another one (its own turn, its own label ids)."""
    room = gitea_room
    services = room.embedded.services
    acme_id = await installations.account_of(services.store, "acme")
    _taken_over(room)
    forge = services.forge_for_org("acme")  # (the office's work under way, before the look)
    await look(services)
    with pytest.raises(OwnerChanged):
        await forge.create_issue("acme/scout-vault", "Plans", "The secret plans.")
    assert _issues_of(room, "acme", "scout-vault") == [], "written into eve's vault"
    assert services.forge_for_org("acme") is not forge
    assert services.forge_for_org("acme2") is services.forge_for_org("acme2")
    assert await installations.account_of(services.store, "acme2") == acme_id


async def test_a_mail_read_after_its_org_renamed_is_not_flagged_tampered_from_the_new_orgs_vault(
        gitea_room: Mailroom) -> None:
    """Review: bob's email was delivered to acme/scout-vault#1 before acme renamed itself;
    eve took the login, her acme/scout-vault has an issue #1 of her own. In the window scout
    read the mail (mail_get: a read, not checked), eve's #1 was read as its issue, did not
    verify, and the office's genuine mail was flagged tampered, a `mail.tampered` ledgered
    for good. Now a failed verification is acted on only once the vault is found the
    office's account's: eve's is not, so the app looks at the bot's orgs, the call says to
    try again, and nothing is flagged; read again, the mail is acme2's, and verifies."""
    room = gitea_room
    services, forge = room.embedded.services, room.embedded.forge
    raw = wire(message("Bob <bob@example.org>", f"scout@{DOMAIN}", "Prices", "x",
                       Message_ID="<before@example.org>"))
    got = await send(room.port, raw, rcpts=[f"scout@{DOMAIN}"])
    assert await delivered(room, got) == ["acme/scout-vault#1"]
    [mail] = await mails.all_mails(services.store)
    _taken_over(room)
    async with room.session.post(
            forge.url + "/api/v1/repos/acme/scout-vault/issues",
            json={"title": "hello", "body": "anything"},
            headers={"Authorization": f"token {forge.user_token('eve')}"}) as resp:
        assert resp.status == 201, await resp.text()
    tools = room.tools("agent:scout")
    status, answer = await tools.raw("mail_get", {"mail": mail.mail_id})
    assert status == 502 and "try again" in str(answer), (status, answer)
    assert await mails.tamper_flag(services.store, mail.mail_id) == 0
    assert await services.store.fetchall("SELECT event FROM ledger WHERE event=?",
                                         ("mail.tampered",)) == []
    again = await tools("mail_get", mail=mail.mail_id)
    assert again["mail"]["vault"] == "acme2/scout-vault", again
    assert not again["mail"]["tampered"] and again["verified"], again
