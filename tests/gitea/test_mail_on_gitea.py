"""The mail flows of `vaultmail up --forge gitea`, end to end through start_embedded: people
act on the forge's Gitea API with their tokens, agents through the app's tools over HTTP."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp

from bot.app.embedded import Embedded, start_embedded

VAULT = "acme/scout-vault"


class Person:
    def __init__(self, session: aiohttp.ClientSession, office: Embedded, login: str) -> None:
        self.session, self.base = session, office.forge.url + "/api/v1"
        self.headers = {"Authorization": f"token {office.forge_tokens[login]}"}

    async def call(self, method: str, path: str, json: Any = None,
                   expect: int | None = None) -> Any:
        async with self.session.request(method, self.base + path, json=json,
                                        headers=self.headers) as resp:
            body = await resp.json(content_type=None) if resp.status != 204 else None
            if expect is not None:
                assert resp.status == expect, (method, path, resp.status, body)
            return body

    async def issue(self, number: int) -> Any:
        return await self.call("GET", f"/repos/{VAULT}/issues/{number}", expect=200)

    async def labels(self, number: int) -> list[str]:
        return sorted(lb["name"] for lb in (await self.issue(number))["labels"])

    async def comment(self, number: int, body: str) -> Any:
        return await self.call("POST", f"/repos/{VAULT}/issues/{number}/comments",
                               {"body": body}, expect=201)

    async def comments(self, number: int) -> list[Any]:
        return list(await self.call("GET", f"/repos/{VAULT}/issues/{number}/comments",
                                    expect=200))


async def tool(session: aiohttp.ClientSession, office: Embedded, principal: str, name: str,
               **args: Any) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {office.api_tokens[principal]}"}
    async with session.post(f"{office.app_url}/api/v1/tools/{name}", json=args,
                            headers=headers) as resp:
        return resp.status, await resp.json()


async def test_labels_are_provisioned_at_start(office: Embedded) -> None:
    async with aiohttp.ClientSession() as s:
        marco = Person(s, office, "marco")
        for vault in office.office.vaults():
            labels = await marco.call("GET", f"/repos/{vault}/labels", expect=200)
            assert {lb["name"] for lb in labels} >= {
                "mail/new", "mail/working", "mail/replied", "mail/closed"}
    assert office.services.bot_login == "vaultmail"


async def test_an_issue_opened_by_hand_is_adopted_then_worked_replied_and_closed(
        office: Embedded) -> None:
    async with aiohttp.ClientSession() as s:
        marco, scout = Person(s, office, "marco"), Person(s, office, "scout-bot")
        issue = await marco.call("POST", f"/repos/{VAULT}/issues",
                                 {"title": "Price check", "body": "Check the EU prices?"},
                                 expect=201)
        n = issue["number"]
        await office.settle()
        adopted = await marco.issue(n)
        assert await marco.labels(n) == ["mail/new"]
        assert adopted["body"].startswith("<!-- vaultmail:header")
        assert "Check the EU prices?" in adopted["body"]
        assert [e.subject for e in await office.ledger_events("mail.sent")] == [f"{VAULT}#{n}"]

        await scout.comment(n, "/working")
        await office.settle()
        assert await marco.labels(n) == ["mail/working"]

        await scout.comment(n, "EU prices are fine.")
        await office.settle()
        assert await marco.labels(n) == ["mail/replied"]

        await marco.comment(n, "/close")
        await office.settle()
        closed = await marco.issue(n)
        assert await marco.labels(n) == ["mail/closed"] and closed["state"] == "closed"
        events = [e.event for e in await office.ledger_events("mail.closed")]
        assert events == ["mail.closed"]
    assert not await office.services.store.dead_letters()


async def test_an_issue_opened_with_a_label_and_edited_by_hand_is_one_mail(
        office: Embedded) -> None:
    """Gitea sends `opened` then `label_updated` for labels given at creation, and one `edited`
    for the title and another for the body of one PATCH: still one mail, no dead letter."""
    async with aiohttp.ClientSession() as s:
        marco = Person(s, office, "marco")
        labels = await marco.call("GET", f"/repos/{VAULT}/labels", expect=200)
        new = next(lb["id"] for lb in labels if lb["name"] == "mail/new")
        issue = await marco.call("POST", f"/repos/{VAULT}/issues",
                                 {"title": "Stock", "body": "How many left?", "labels": [new]},
                                 expect=201)
        n = issue["number"]
        await office.settle()
        assert await marco.labels(n) == ["mail/new"]
        adopted = await marco.issue(n)
        await marco.call("PATCH", f"/repos/{VAULT}/issues/{n}",
                         {"title": "Stock count", "body": adopted["body"] + "\n\nBy Friday."},
                         expect=201)
        await office.settle()
        assert await marco.labels(n) == ["mail/new"]
        assert "By Friday." in (await marco.issue(n))["body"]
    rows = await office.services.store.fetchall(
        "SELECT payload FROM queue WHERE event='issues'")
    actions = [a for r in rows for a in ('"action":"opened"', '"action":"labeled"',
                                         '"action":"edited"') if a in r["payload"]
               and f'"number":{n}' in r["payload"]]
    assert '"action":"labeled"' in actions and actions.count('"action":"edited"') >= 2
    assert [e.subject for e in await office.ledger_events("mail.sent")] == [f"{VAULT}#{n}"]
    assert not await office.services.store.dead_letters()


async def test_the_mail_tools_over_http(office: Embedded) -> None:
    async with aiohttp.ClientSession() as s:
        status, sent = await tool(s, office, "agent:builder", "mail_send", to="scout",
                                  subject="Spec", body="Spec v1 attached")
        assert status == 200, sent
        ref = f"{sent['mail']['vault']}#{sent['mail']['number']}"
        await office.settle()
        marco = Person(s, office, "marco")
        n = sent["mail"]["number"]
        assert await marco.labels(n) == ["mail/new"]
        status, opened = await tool(s, office, "agent:scout", "mail_open", mail=ref)
        assert status == 200, opened
        assert await marco.labels(n) == ["mail/working"]
        status, replied = await tool(s, office, "agent:scout", "mail_reply", mail=ref,
                                     body="Looks good")
        assert status == 200, replied
        assert await marco.labels(n) == ["mail/replied"]
        assert any("Looks good" in c["body"] for c in await marco.comments(n))
        status, closed = await tool(s, office, "agent:scout", "mail_close", mail=ref)
        assert status == 200, closed
        assert await marco.labels(n) == ["mail/closed"]
        assert (await marco.issue(n))["state"] == "closed"
        await office.settle()
        # scout's reply went back to builder's vault as a new mail
        builder_mail = await marco.call("GET", "/repos/acme/builder-vault/issues?state=all",
                                        expect=200)
        assert [i["title"] for i in builder_mail] == ["Re: Spec"]
    assert not await office.services.store.dead_letters()


async def test_an_illegal_label_change_by_hand_is_undone(office: Embedded) -> None:
    """Gitea sends label_updated with the whole list; the adapter makes it `labeled` and the
    review handler reads the issue's labels again."""
    async with aiohttp.ClientSession() as s:
        marco, sara = Person(s, office, "marco"), Person(s, office, "sara")
        issue = await marco.call("POST", f"/repos/{VAULT}/issues",
                                 {"title": "Hand labels", "body": "x"}, expect=201)
        n = issue["number"]
        await office.settle()
        # sara (write on the vault, neither recipient nor its person) marks it replied
        await sara.call("PUT", f"/repos/{VAULT}/issues/{n}/labels",
                        {"labels": ["mail/replied"]}, expect=200)
        await office.settle()
        assert await marco.labels(n) == ["mail/new"]
        assert any("label change undone" in c["body"] for c in await marco.comments(n))
        assert await office.ledger_events("mail.replied") == []


async def test_forged_and_unsigned_deliveries_are_refused(office: Embedded) -> None:
    body = b'{"action":"opened","number":1}'
    async with aiohttp.ClientSession() as s:
        for signature in ("", "sha256=" + "0" * 64, "0" * 64):
            headers = {"X-Gitea-Event": "issues", "X-Gitea-Delivery": "forged",
                       "X-Gitea-Signature": signature, "Content-Type": "application/json"}
            async with s.post(office.app_url + "/webhook", data=body, headers=headers) as r:
                assert r.status == 401
    assert await office.services.store.fetchone(
        "SELECT 1 FROM deliveries WHERE guid='forged'") is None


async def test_the_apps_own_events_are_ignored(office: Embedded) -> None:
    async with aiohttp.ClientSession() as s:
        status, _ = await tool(s, office, "human:marco@acme.com", "mail_send", to="scout",
                               subject="Hi", body="x")
        assert status == 200
    await office.settle()
    rows = await office.services.store.fetchall(
        "SELECT state, payload FROM queue WHERE event='issues'")
    own = [r for r in rows if '"login":"vaultmail"' in r["payload"]]
    assert own and all(r["state"] in ("ignored", "done") for r in own)
    assert len(await office.ledger_events("mail.sent")) == 1, "no second mail from its echo"
    assert await office.ledger_events("run.denied") == []


DOTTED = """
org: acme_corp.eu
humans:
  - {email: john@acme.test, login: john.doe, permissions: [mail.send, editor]}
agents:
  - slug: scout
    login: scout_bot
    person: john@acme.test
    run: {triggers: [], dispatch: none}
    capabilities: {mail.send: ["*"]}
  - slug: builder
    login: builder.bot
    person: john@acme.test
    run: {triggers: [], dispatch: none}
    capabilities: {mail.send: ["*"]}
"""


async def test_an_org_and_people_named_with_dots_and_underscores_send_mail_that_verifies(
        tmp_path: Path) -> None:
    """Gitea's and Forgejo's names may hold '.' and '_' (GitHub's never do): the header took
    neither, so every mail of org acme_corp.eu, or from john.doe, "cannot be signed"."""
    from tests.test_tamper import vaultmail

    path = tmp_path / "office.yml"
    path.write_text(DOTTED)
    office = await start_embedded(office_path=path, data_dir=tmp_path / "data", port=0,
                                  forge_port=0, dialect="gitea")
    vault = "acme_corp.eu/scout-vault"
    try:
        async with aiohttp.ClientSession() as s:
            john = Person(s, office, "john.doe")
            issue = await john.call("POST", f"/repos/{vault}/issues",
                                    {"title": "Price check", "body": "EU prices?"}, expect=201)
            status, sent = await tool(s, office, "human:john@acme.test", "mail_send",
                                      to="scout", subject="Stock", body="How many left?")
            assert status == 200, sent
            status, agents = await tool(s, office, "agent:builder", "mail_send", to="scout",
                                        subject="Spec", body="Spec v1")
            assert status == 200, agents
            await office.settle()
            adopted = await john.call("GET", f"/repos/{vault}/issues/{issue['number']}",
                                      expect=200)
            assert "| `john.doe` | `agent:scout` |" in adopted["body"]
            for ref in (f"{vault}#{issue['number']}", sent["mail"]["ref"],
                        agents["mail"]["ref"]):
                code, out = await vaultmail(office, "verify", ref)
                assert code == 0 and out.startswith("valid:"), (ref, out)
        assert not await office.services.store.dead_letters()
    finally:
        await office.stop()
