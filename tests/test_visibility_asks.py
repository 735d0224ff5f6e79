"""Who may see a repository is a forge request for each repository (bot.office.visibility:
the collaborator permission of the person's login, kept 45 s). A read over many repositories
asks about them together: one after another, a person's inbox or ledger page over N
repositories waited for N answers in a row each time the kept ones ran out.

sara has questions from scout, and the ledger entries about them, on four repositories; the
forge holds every permission request until the test has seen them all arrive at once."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

import pytest

from bot.app.embedded import Embedded
from bot.office.visibility import ASKED_AT_ONCE, ENTRIES_AHEAD, viewer_of
from bot.store import comments, ledger
from bot.store import mails as mail_index
from tests.items_support import (
    BUILDER,
    CRITIC,
    LEE,
    MARCO,
    SARA,
    SCOUT,
    TOKEN_TTL,
    VAULT,
    make_item,
)
from tests.support import ToolClient
from tests.test_item_updates import SECRET, WORDS, _stage

PERMISSION = "GET /repos/{owner}/{repo}/collaborators/{username}/permission"
REPOS = [f"acme/team-{i}" for i in range(4)]


async def _questions_on_four_repositories(embedded: Embedded, person: Any,
                                          tools: Any) -> list[str]:
    """scout's question to sara on an outcome in each of REPOS; sara no longer reads the last
    (and is no org member: she sees only what she is a collaborator of). The comments' ids."""
    embedded.forge.remove_org_member("acme", "sara")
    asked = []
    for repo in REPOS:
        owner, name = repo.split("/")
        embedded.forge.add_repo(owner, name)
        embedded.forge.set_permission(repo, "marco", "admin")
        embedded.forge.set_permission(repo, "scout-bot", "write")
        embedded.forge.set_permission(repo, "sara", "read")
        outcome = await make_item(embedded, person("marco"), "outcome", f"Auth {repo}",
                                  assignees=["scout-bot"], repo=repo)
        q = await tools(SCOUT)("add_comment", target=outcome,
                               **{**TOKEN_TTL, "to": ["sara@acme.com"]})
        asked.append(q["comment"]["id"])
    embedded.forge.remove_permission(REPOS[-1], "sara")  # (access taken away since)
    embedded.services.visibility.forget()  # (what was learnt of sara while asking)
    return asked


async def _asked_at_once(embedded: Embedded, read: Awaitable[Any]) -> Any:
    """What `read` gives, once the forge has held a permission request for each of REPOS at
    the same time."""
    held = embedded.forge.faults.hold(PERMISSION, count=None)
    answer = asyncio.ensure_future(read)
    try:
        await asyncio.wait_for(held.caught_at_least(len(REPOS)), 10)
    except TimeoutError:
        pytest.fail(f"the forge was asked about {held.caught} of the {len(REPOS)} repositories "
                    "at once", pytrace=False)
    finally:
        held.release()
    return await answer


async def test_the_inbox_asks_about_the_repositories_of_its_questions_at_once(
        embedded: Embedded, person: Any, tools: Any) -> None:
    asked = await _questions_on_four_repositories(embedded, person, tools)
    box = await _asked_at_once(embedded, tools(SARA)("list_inbox"))
    assert sorted(t["thread"] for t in box["you"]["yourTurn"]) == sorted(asked[:-1])


async def test_the_ledger_page_asks_about_the_repositories_of_its_entries_at_once(
        embedded: Embedded, person: Any, tools: Any) -> None:
    await _questions_on_four_repositories(embedded, person, tools)
    events = (await _asked_at_once(embedded, tools(SARA)("list_changes", since=0,
                                                         limit=1000)))["events"]
    about = {e["subject"].partition("#")[0] for e in events}
    assert REPOS[0] in about and REPOS[-1] not in about, about


async def test_a_ledger_page_reads_the_mails_and_items_of_its_entries_together(
        embedded: Embedded, person: Any, tools: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each ledger entry about a mail was one or two reads of its own (by the mail's id, then
    by its issue), and each an agent wrote about an item a read of the item: a page a person
    scans of thousands of entries was thousands of reads. Now a read of each for every
    ENTRIES_AHEAD entries; who sees which entry is unchanged."""
    store = embedded.services.store
    sent = [(await tools(MARCO)("mail_send", to="scout", subject=f"Plan {i}",
                                body="Details follow."))["mail"] for i in range(3)]
    for i in range(120):  # mail entries the index holds no mail of (one gone since)
        await ledger.record(store, "mail.opened", BUILDER, f"acme/builder-vault#{500 + i}",
                            {"mail": f"gone-{i}"}, org="acme")
    # an agent's entries about an item (each asks whether they name a claim hidden from you)
    outcome = await make_item(embedded, person("marco"), "outcome", "Auth")
    for i in range(60):
        await ledger.record(store, "comment.added", "agent:scout", outcome, {"n": i}, org="acme")
    reads = 0

    def counted(read: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def read_counted(*args: Any, **kwargs: Any) -> Any:
            nonlocal reads
            reads += 1
            return await read(*args, **kwargs)
        return read_counted

    monkeypatch.setattr(store, "fetchone", counted(store.fetchone))
    monkeypatch.setattr(store, "fetchall", counted(store.fetchall))
    mine = (await tools(MARCO)("list_changes", since=0, limit=1000))["events"]
    assert reads < 30, f"{reads} reads of the index for a page of {len(mine)} entries"
    embedded.services.visibility.forget()
    start = len(embedded.forge.requests)
    theirs = (await tools(LEE)("list_changes", since=0, limit=1000))["events"]
    # about mails (who sees one is its parties): no question to the forge about the vault
    asked = {r.path.split("/")[3] for r in list(embedded.forge.requests)[start:]
             if r.route == PERMISSION and "/collaborators/lee/" in r.path}
    assert asked == {outcome.partition("#")[0].split("/")[1]}, asked
    mail_sent = [(e["subject"], e["data"].get("mail")) for e in mine if e["event"] == "mail.sent"]
    assert [m for _, m in mail_sent] == [m["mail_id"] for m in sent], mail_sent
    assert not [e for e in theirs if e["event"].startswith("mail.")], theirs
    # an entry whose mail is gone: whoever acted (and editors) still see it
    assert len([e for e in await _entries(tools(BUILDER))
                if e["data"].get("mail", "").startswith("gone-")]) == 120
    assert len([e for e in theirs if e["subject"] == outcome]) >= 60


async def _entries(client: ToolClient) -> list[dict[str, Any]]:
    return list((await client("list_changes", since=0, limit=1000))["events"])


async def test_a_ledger_page_shows_each_reader_what_each_entry_alone_shows(
        embedded: Embedded, person: Any, tools: Any) -> None:
    """Read a page at a time (entries_seen: the mails, items and repositories of
    ENTRIES_AHEAD entries together), list_changes shows each reader exactly the entries
    sees_entry shows reading each entry's mail and item by itself: over mails between
    different parties, a renamed vault, a plan whose claim is hidden from some, chats,
    entries about a repository, refusals, and entries whose `mail` names a mail elsewhere."""
    store = embedded.services.store
    s = await _stage(embedded, person, tools)
    hidden = await make_item(embedded, s.marco, "outcome", f"{WORDS}: outcome", repo=SECRET,
                             assignees=["builder-bot"])
    plan = await make_item(embedded, s.marco, "plan", "Price list: plan",
                           body=f"Part of {hidden}")
    asked = await tools(MARCO)("add_comment", targetType="plan", target=plan, to=["agent"],
                               needsReply=True, body="Who runs this?")
    await tools(BUILDER)("add_comment", targetType="plan", target=plan,
                         parent=asked["comment"]["id"], body="I do")
    await tools(LEE)("add_comment", targetType="plan", target=plan, body="Looks right")
    sent = [(await tools(who)("mail_send", to=to, subject=f"{who} to {to}",
                              body="Details follow."))["mail"]
            for who, to in ((MARCO, "scout"), (BUILDER, "scout"), (SARA, "builder"),
                            (SCOUT, "builder"))]
    await embedded.settle()
    # another office's mail, and entries whose `mail` names a mail elsewhere than their subject
    other = replace(await mail_index.get_mail(store, sent[1]["mail_id"]) or pytest.fail("?"),
                    mail_id="globex-1", vault="globex/vault", number=1,
                    from_principal=LEE, to_principal=LEE)
    async with store.transaction() as db:
        await mail_index.put_mail(db, other)
    for mail_id, subject in (("globex-1", sent[0]["ref"]), (sent[1]["mail_id"], plan),
                             (sent[2]["mail_id"], s.outcome), ("gone", s.outcome),
                             (sent[3]["mail_id"], "acme/scout-vault")):
        for event in ("mail.opened", "run.queued", "comment.added"):
            await ledger.record(store, event, SCOUT, subject, {"mail": mail_id}, org="acme")
    for subject in (sent[1]["ref"].upper(), plan, hidden, "acme/secret", "ACME/Scout-Vault",
                    "chat:1", "mail to agent:critic", "tool:list_inbox"):
        for actor in (BUILDER, LEE, MARCO):
            await ledger.record(store, "run.denied", actor, subject,
                                {"reason": "no", "asked": ["agent:builder"]}, org="acme")
    await tools(MARCO)("agent_chat", agent="scout", message="EU or US first?")
    embedded.forge.set_permission("acme/scout-vault", "admin", "admin")
    await person("admin").call("PATCH", "/repos/acme/scout-vault", {"name": "scout-mail"},
                               expect=200)
    await embedded.settle()
    for subject in (sent[0]["ref"], plan, "acme/scout-vault", "acme/scout-mail"):
        await ledger.record(store, "comment.added", BUILDER, subject, {"n": 1}, org="acme")
    entries = await ledger.entries(store, org="acme", shown=True, limit=10_000)
    assert len(entries) > ENTRIES_AHEAD
    office = next(o for org, o in await embedded.services.installed_offices() if org == "acme")
    forge = embedded.services.forge_for_org("acme")
    for who in (MARCO, SARA, LEE, SCOUT, BUILDER, CRITIC):
        viewer = viewer_of(embedded.services, forge, office, who)
        each = [e.number for e in entries if await viewer.sees_entry(e, store)]
        paged = [e["seq"] for e in (await tools(who)("list_changes", since=0,
                                                     limit=1000))["events"]]
        assert paged == each, who


async def test_a_read_that_failed_asks_the_forge_nothing_more(
        embedded: Embedded, tools: Any) -> None:
    """A read over many repositories asks about them ASKED_AT_ONCE at a time; one of the
    answers failing fails the read. The asks not yet made were made anyway, for nobody,
    after the caller had its error: on a forge failing them all, one read was as many
    failures (each with its retries) as it had repositories. Now none is asked once the
    read has failed (those on their way finish, and their answers are kept)."""
    store = embedded.services.store
    embedded.forge.remove_org_member("acme", "sara")
    repos = [f"acme/many-{i:02d}" for i in range(20)]
    for repo in [*repos[2:], *repos[:2]]:  # (the entry about repos[1] the newest)
        owner, name = repo.split("/")
        embedded.forge.add_repo(owner, name)
        embedded.forge.set_permission(repo, "sara", "read")
        await ledger.record(store, "comment.added", MARCO, f"{repo}#1", {"n": 1}, org="acme")
    newest = (await ledger.entries(store, org="acme", shown=True, limit=10_000))[-1]
    embedded.services.visibility.forget()
    embedded.forge.faults.add(PERMISSION, status=403, repo=repos[0])  # (no retry mends it)
    holds = {repo: embedded.forge.faults.hold(PERMISSION, count=None, repo=repo)
             for repo in repos[1:]}
    try:
        status, _ = await tools(SARA).raw("list_changes", {"since": 0, "limit": 1000})
        assert status != 200
        # the asks on their way when it failed (those after the first, in order), held at
        # the forge: one let go, and sara's page of its entry alone, which has its answer
        on_their_way = repos[1:ASKED_AT_ONCE]
        for repo in on_their_way:
            await asyncio.wait_for(holds[repo].caught_at_least(1), 10)
        holds[repos[1]].release()
        alone = await tools(SARA)("list_changes", since=newest.number - 1)
        assert [e["subject"] for e in alone["events"]] == [f"{repos[1]}#1"], alone
        asked_after = [repo for repo, held in holds.items()
                       if held.caught and repo not in on_their_way]
    finally:
        for held in holds.values():
            held.release()
    assert not asked_after, f"{len(asked_after)} more asked after the read had failed"


async def test_a_ledger_pages_reads_are_a_few_statements_whatever_its_mix(
        embedded: Embedded, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a page of entries is about is read by statements whose lists vary in length (ids,
    places, refs): said as they came, one connection prepared thousands of shapes, past the
    STATEMENTS_KEPT it keeps, and every statement of that connection was prepared again."""
    store = embedded.services.store
    said: set[str] = set()
    fetchall = store.fetchall

    async def noted(sql: Any, params: Any = ()) -> Any:
        said.add(sql if isinstance(sql, str) else sql.sqlite)
        return await fetchall(sql, params)

    monkeypatch.setattr(store, "fetchall", noted)
    for ids in range(51):
        for places in range(0, 51, 7):
            await mail_index.mails_known(store, [f"m{i}" for i in range(ids)],
                                    [(VAULT, n + 1) for n in range(places)])
    for refs in range(51):
        await comments.items_at(store, [f"{VAULT}#{n + 1}" for n in range(refs)])
    assert len(said) <= 7 * 8 + 7, len(said)  # (1-64 of each list: 7 lengths a list)
