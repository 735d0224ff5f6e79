"""A ref given out before its org or repository was renamed (`acme/scout-vault#1`) still names
its item for the office's own callers, as the forge's old URL leads to the issue; and a step
done under the old name, retried after the rename, is recognised as done (one forge write, one
ledger entry), though the ledger keeps the names it hashed.

Everything runs against the embedded app and its local forge over real HTTP; the renames are
the forge's own (its admin's PATCH of the repository, the org's rename in its settings)."""

from __future__ import annotations

from typing import Any

import aiohttp

from bot.app.embedded import Embedded
from tests.items_support import MARCO, SCOUT, make_item
from tests.support import Actor
from tests.test_exactly_once import short_forge_retries

VAULT = "acme/scout-vault"


async def _rename_repo(embedded: Embedded, admin: Actor, repo: str, name: str) -> None:
    """`repo` renamed `name` by its admin through the forge's API, as on GitHub."""
    embedded.forge.set_permission(repo, admin.login, "admin")
    await admin.call("PATCH", f"/repos/{repo}", {"name": name}, expect=200)
    await embedded.settle()


async def _rename_org(embedded: Embedded, new: str) -> None:
    embedded.forge.rename_org("acme", new)
    await embedded.settle()


async def test_an_items_old_ref_names_it_after_its_repository_and_org_are_renamed(
        embedded: Embedded, tools: Any, person: Any) -> None:
    """Before, get_outcome and add_comment of `acme/scout-vault#1` answered 404 after the
    rename (the office's names were followed for mail only)."""
    outcome = await make_item(embedded, person("marco"), "outcome", "Auth migration")
    scout = tools(SCOUT)
    await _rename_repo(embedded, person("admin"), VAULT, "scout-mail")
    got = await scout("get_outcome", outcome=outcome)
    assert got["outcome"]["ref"] == "acme/scout-mail#1", got
    said = await scout("add_comment", targetType="outcome", target=outcome, body="Still on?")
    assert said["comment"]["item"] == "acme/scout-mail#1", said

    await _rename_org(embedded, "initech")
    got = await scout("get_outcome", outcome=outcome)  # the name it had two renames ago
    assert got["outcome"]["ref"] == "initech/scout-mail#1", got
    said = await scout("add_comment", targetType="outcome", target="acme/scout-mail#1",
                       body="And now?")
    assert said["comment"]["item"] == "initech/scout-mail#1", said


async def _reply_whose_copy_failed(embedded: Embedded, tools: Any) -> str:
    """builder's mail to scout, and scout's reply (key r1) that landed, its copy to builder
    failed: the client will retry it. The mail's ref."""
    sent = await tools("agent:builder")("mail_send", to="scout", subject="Q", body="EU?")
    await embedded.settle()
    short_forge_retries(embedded, attempts=1)
    embedded.forge.faults.add("POST /repos/{owner}/{repo}/issues", status=502, count=1)
    status, body = await tools(SCOUT).raw("mail_reply", {"mail": sent["mail"]["ref"],
                                                         "body": "Up 4%",
                                                         "idempotencyKey": "r1"})
    assert status != 200, body
    return str(sent["mail"]["ref"])


async def _retried_once(embedded: Embedded, tools: Any, admin: Actor, ref: str,
                        now: str) -> None:
    """scout retries the reply as it sent it: it lands once, and is ledgered once."""
    got = await tools(SCOUT)("mail_reply", mail=ref, body="Up 4%", idempotencyKey="r1")
    assert got["mail"]["ref"] == now, got
    await embedded.settle()
    comments = await admin.comments(*now.split("#"))
    assert [c["body"].count("Up 4%") for c in comments] == [1], "one reply comment"
    replied = await embedded.ledger_events("mail.replied")
    assert len(replied) == 1, [(e.subject, e.data) for e in replied]


async def test_a_reply_retried_after_its_vault_was_renamed_is_ledgered_once(
        embedded: Embedded, tools: Any, person: Any) -> None:
    """Before, the retry looked for its `mail.replied` under the mail's new name, found none
    (the ledger keeps `acme/scout-vault#1`), and moved the mail and ledgered it again."""
    ref = await _reply_whose_copy_failed(embedded, tools)
    await _rename_repo(embedded, person("admin"), VAULT, "scout-mail")
    await _retried_once(embedded, tools, person("admin"), ref, "acme/scout-mail#1")


async def test_a_reply_retried_after_its_org_was_renamed_is_posted_and_ledgered_once(
        embedded: Embedded, tools: Any, person: Any) -> None:
    """Before, the tool's idempotency key was kept under the office's old name: the retry
    under the new one ran afresh, and posted the reply a second time."""
    ref = await _reply_whose_copy_failed(embedded, tools)
    await _rename_org(embedded, "initech")
    await _retried_once(embedded, tools, person("admin"), ref, "initech/scout-vault#1")


async def test_the_consoles_reply_link_of_an_old_ref_names_the_mail(
        embedded: Embedded, tools: Any, person: Any, session: aiohttp.ClientSession) -> None:
    """Before, the console's mail page read `?reply=acme/scout-vault#1` by the old name alone
    (a parser of its own), and offered no reply after the rename."""
    await tools("agent:builder")("mail_send", to="scout", subject="Q", body="EU?")
    await embedded.settle()
    await _rename_repo(embedded, person("admin"), VAULT, "scout-mail")
    async with session.get(embedded.app_url + "/console/mail",
                           params={"reply": "acme/scout-vault#1"},
                           headers={"Authorization": f"Bearer {embedded.api_tokens[MARCO]}"},
                           allow_redirects=False) as resp:
        assert resp.status == 200
        assert "In reply to acme/scout-mail#1" in await resp.text()
