"""One scenario and the refusals, run over each face of the tools (MCP stdio, MCP HTTP, plain
HTTP, the shell): each face supplies `call(principal, tool, args) -> result` and
`refusal(principal_or_token, tool, args) -> (status, code, message)`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from bot.app.embedded import Embedded
from bot.store import api_tokens, ledger, mails
from bot.tools import TOOLS
from tests.support import label_names

SCOUT_VAULT = "acme/scout-vault"
BUILDER_VAULT = "acme/builder-vault"

CallFn = Callable[[str, str, dict[str, Any]], Awaitable[dict[str, Any]]]
RefusalFn = Callable[[str | None, str, dict[str, Any]], Awaitable[tuple[int, str, str]]]


async def forge_issues(embedded: Embedded, repo: str) -> list[dict[str, Any]]:
    token = embedded.forge_tokens["admin"]
    import aiohttp

    async with aiohttp.ClientSession() as s, s.get(
            f"{embedded.forge.url}/repos/{repo}/issues?state=all",
            headers={"Authorization": f"token {token}"}) as resp:
        assert resp.status == 200
        found: list[dict[str, Any]] = await resp.json()
        return found


async def run_scenario(embedded: Embedded, call: CallFn) -> None:
    """builder sends to scout; scout opens and replies; builder reads its inbox and closes."""
    sent = (await call("agent:builder", "mail_send",
                       {"to": "scout", "subject": "Spec", "body": "Spec v1 attached"}))["mail"]
    assert sent["state"] == "mail:new" and sent["vault"] == SCOUT_VAULT

    opened = await call("agent:scout", "mail_open", {"mail": sent["ref"]})
    assert opened["mail"]["state"] == "mail:working"
    assert "inbox" in opened, "every result for an agent carries its inbox"
    replied = await call("agent:scout", "mail_reply",
                         {"mail": sent["mail_id"], "body": "Looks good, ship it"})
    assert replied["mail"]["state"] == "mail:replied"
    await embedded.settle()

    reader = "list_inbox" if "list_inbox" in TOOLS else "mail_list"
    inbox = (await call("agent:builder", reader, {}))["inbox"]
    [waiting] = inbox["mail"]
    assert waiting["from"] == "agent:scout" and waiting["subject"] == "Re: Spec"
    assert waiting["ref"].startswith(BUILDER_VAULT + "#")

    closed = await call("agent:builder", "mail_close", {"mail": waiting["ref"]})
    assert closed["mail"]["state"] == "mail:closed"
    assert closed["inbox"]["mail"] == [], "the closed reply left the inbox"
    thread = await call("agent:builder", "mail_close", {"mail": sent["ref"]})
    assert thread["mail"]["state"] == "mail:closed"
    await embedded.settle()

    [original] = await forge_issues(embedded, SCOUT_VAULT)
    [copy] = await forge_issues(embedded, BUILDER_VAULT)
    for issue in (original, copy):
        assert issue["state"] == "closed" and label_names(issue) == ["mail:closed"]
    names = [e.event for e in await ledger.entries(embedded.services.store)]
    assert names.count("mail.sent") == 2 and names.count("mail.closed") == 2
    assert "mail.opened" in names and "mail.replied" in names


async def revoked_token(embedded: Embedded, principal: str) -> str:
    store = embedded.services.store
    token = await api_tokens.create_token(store, principal)
    newest = (await api_tokens.list_tokens(store))[-1]
    assert newest.principal == principal
    assert await api_tokens.revoke_token(store, newest.id)
    return token


async def run_refusals(embedded: Embedded, refusal: RefusalFn, *, no_token: bool = True) -> None:
    """No token, a revoked token, a missing capability and permission, bad arguments."""
    send = {"to": "critic", "subject": "Hi", "body": "x"}
    if no_token:
        status, code, message = await refusal(None, "mail_send", send)
        assert (status, code) == (401, "unauthenticated") and "Bearer" in message

    gone = await revoked_token(embedded, "agent:scout")
    status, code, message = await refusal(gone, "mail_send", send)
    assert (status, code) == (401, "unauthenticated") and "revoked" in message

    status, code, message = await refusal("agent:builder", "mail_send", send)
    assert (status, code) == (403, "denied") and "capabilities.mail.send" in message
    status, code, message = await refusal("human:lee@acme.com", "mail_send", send)
    assert (status, code) == (403, "denied") and "mail.send permission" in message

    status, code, message = await refusal("agent:scout", "mail_send",
                                          {"to": "critic", "subject": 7})
    assert (status, code) == (422, "invalid_arguments")
    assert "subject" in message and "body" in message and "string" in message

    denied = await ledger.entries(embedded.services.store, event="run.denied")
    assert [d.actor for d in denied] == ["agent:builder", "human:lee@acme.com"]
    for vault in embedded.office.vaults():
        assert await forge_issues(embedded, vault) == [], f"{vault}: nothing left behind"
    assert await mails.all_mails(embedded.services.store) == []
