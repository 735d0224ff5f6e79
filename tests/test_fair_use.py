"""Fair use (issue 9, item 14): one principal cannot starve the others of the installation's
write budget, long polls are capped per token, and a stranger's repeated attempts are refused
quietly after the first reply.

Everything is counted (forge writes in the local forge's request log, ledger entries, comments),
never timed.
"""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from typing import Any

from bot.app.embedded import Embedded
from bot.forge.pacing import WritePacer
from bot.store import api_tokens, strangers
from bot.tools.polls import PER_TOKEN, token_key
from tests.support import Actor, ToolClient
from tests.test_mcp import _refused, mcp_http

CREATE_ISSUE = "POST /repos/{owner}/{repo}/issues"


class ManualTime:
    """A clock that moves only when told: a write waiting for budget waits until then."""

    def __init__(self) -> None:
        self.t = 1000.0
        self._sleepers: list[tuple[float, asyncio.Future[None]]] = []

    def monotonic(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._sleepers.append((self.t + seconds, future))
        await future

    def advance(self, seconds: float) -> None:
        self.t += seconds
        for at, future in list(self._sleepers):
            if at <= self.t and not future.done():
                future.set_result(None)


# -- the write budget --------------------------------------------------------------------------


async def test_one_agent_cannot_starve_the_others_of_the_write_budget(
        embedded: Embedded, tools: Any) -> None:
    """One agent sending many mails at once must not make a person's single send wait behind
    all of them: the person's write goes after at most a couple of the flooder's."""
    forge = embedded.forge
    pacer = embedded.services.forge_for(None).pacer  # type: ignore[attr-defined]
    scout: ToolClient = tools("agent:scout")
    sara: ToolClient = tools("human:sara@acme.com")
    flood_size = 30
    held = forge.faults.hold(CREATE_ISSUE)  # the flood's first write waits at the forge
    before = len(forge.requests)
    flood = [asyncio.create_task(scout("mail_send", to="builder", subject=f"Flood {i}",
                                       body="one of many"))
             for i in range(flood_size)]
    await held.arrived.wait()
    await pacer.until_waiting(flood_size - 1)  # the rest of the flood queues behind it
    single = asyncio.create_task(sara("mail_send", to="scout", subject="Just one",
                                      body="from a person"))
    await pacer.until_waiting(flood_size)  # ... and the person's one write with them
    held.release()
    sent = await single
    await asyncio.gather(*flood)

    creations = [r.path for r in list(forge.requests)[before:]
                 if r.route == CREATE_ISSUE and r.status == 201]
    assert len(creations) == flood_size + 1
    mine = creations.index(f"/repos/{sent['mail']['vault']}/issues")
    assert sent["mail"]["vault"] == "acme/scout-vault"
    assert all(path == "/repos/acme/builder-vault/issues" for path in creations[:mine])
    assert mine <= 2, f"the person's send went after {mine} of the flood's writes"


async def test_no_principal_takes_more_than_its_share_of_the_creation_budget() -> None:
    """A burst from one principal leaves room in the minute's budget for everybody else: the
    person's write goes at once, while the flooder waits for its share to free up."""
    clock = ManualTime()
    pacer = WritePacer(min_interval=0.0, content_per_minute=8, content_per_hour=500,
                       principal_share=0.75, slack=0.0, monotonic=clock.monotonic,
                       sleep=clock.sleep)
    order: list[str] = []

    async def write(who: str) -> None:
        async with pacer.turn(content=True, principal=who):
            order.append(who)

    flood = [asyncio.create_task(write("agent:scout")) for _ in range(20)]
    await asyncio.gather(*flood[:6])  # its share of 8 a minute: 6
    assert pacer.delay(True, "agent:scout") == 60.0, "the flooder's share is used up"
    assert pacer.delay(True, "human:sara@acme.com") == 0.0, "the person's write may go now"
    person = asyncio.create_task(write("human:sara@acme.com"))
    await asyncio.wait_for(person, 5)  # a guard only: on a share-less pacer it never comes
    assert clock.t == 1000.0, "the person did not wait for the clock"
    assert order == ["agent:scout"] * 6 + ["human:sara@acme.com"]
    assert pacer.waiting() == 14  # the rest of the flood waits for its budget
    clock.advance(60.0)
    await asyncio.gather(*flood[6:12])
    assert order.count("agent:scout") == 12
    for task in flood:
        task.cancel()
    await asyncio.gather(*flood, return_exceptions=True)
    assert pacer.waiting() == 0


async def test_writes_for_no_one_have_no_share_cap() -> None:
    """The app's own housekeeping (no principal) is paced by the budget alone."""
    clock = ManualTime()
    pacer = WritePacer(min_interval=0.0, content_per_minute=8, content_per_hour=500,
                       slack=0.0, monotonic=clock.monotonic, sleep=clock.sleep)
    for _ in range(8):
        async with pacer.turn(content=True):
            pass
    assert pacer.delay(True) == 60.0 and clock.t == 1000.0


# -- long polls ----------------------------------------------------------------------------------


async def test_long_polls_are_capped_per_token(embedded: Embedded, tools: Any) -> None:
    """One token may hold PER_TOKEN long polls at once; one more is answered at once with a
    429 naming the cap, over HTTP and over MCP; another token of the same principal is not
    counted against it, and a poll that returns frees its place."""
    polls = embedded.services.long_polls
    token = embedded.api_tokens["agent:builder"]
    key = token_key(token)
    builder: ToolClient = tools("agent:builder")
    held = [asyncio.create_task(builder.raw("list_inbox", {"wait": 40}))
            for _ in range(PER_TOKEN)]
    await polls.until_held(key, PER_TOKEN)

    status, body = await builder.raw("list_inbox", {"wait": 40})
    assert status == 429, body
    assert body["error"]["code"] == "too_many_long_polls"
    assert f"at once is {PER_TOKEN}" in body["error"]["message"]
    status, body = await builder.raw("agent_chat", {"agent": "scout", "message": "hi",
                                                    "wait": 10})
    assert status == 429, body  # chat waits count too, and nothing was written
    assert await embedded.services.store.fetchone("SELECT 1 FROM chats") is None
    async with mcp_http(embedded, token) as client:
        refused = _refused(await client.call_tool("list_inbox", {"wait": 40}))
    assert refused[:2] == (429, "too_many_long_polls")

    status, _ = await builder.raw("list_inbox", {})  # without `wait`: not a long poll
    assert status == 200
    other = await api_tokens.create_token(embedded.services.store, "agent:builder")
    second = asyncio.create_task(builder.raw("list_inbox", {"wait": 40}, token=other))
    await polls.until_held(token_key(other), 1)

    await tools("agent:scout")("mail_send", to="builder", subject="Wake up", body="all of you")
    answers = await asyncio.gather(*held, second)
    assert [status for status, _ in answers] == [200] * (PER_TOKEN + 1)
    assert polls.held(key) == 0
    again = asyncio.create_task(builder.raw("list_inbox", {"wait": 40}))
    await polls.until_held(key, 1)  # its place is free again
    await tools("agent:scout")("mail_send", to="builder", subject="Again", body="one more")
    assert (await again)[0] == 200


async def test_long_polls_are_capped_per_principal_and_per_office_too(
        embedded: Embedded, tools: Any) -> None:
    """A person gets a token at each OAuth consent, and an office's config may name any
    number of principals: a cap per token alone let one principal, or one office, hold as
    many long polls as it liked in the process every office shares."""
    polls = embedded.services.long_polls
    polls.per_principal, polls.per_office = 2, 3
    store, builder = embedded.services.store, tools("agent:builder")
    tokens = [await api_tokens.create_token(store, "agent:builder", org="acme")
              for _ in range(3)]
    held = [asyncio.create_task(builder.raw("list_inbox", {"wait": 40}, token=t))
            for t in tokens[:2]]
    await polls.until_held("principal:acme/agent:builder", 2)
    status, body = await builder.raw("list_inbox", {"wait": 40}, token=tokens[2])
    assert status == 429 and body["error"]["code"] == "too_many_long_polls", body
    assert "agent:builder, all its tokens together, already holds 2" in \
        body["error"]["message"]
    scout = tools("agent:scout")
    held.append(asyncio.create_task(scout.raw("list_inbox", {"wait": 40})))
    await polls.until_held("office:acme", 3)
    status, body = await tools("agent:echo").raw("list_inbox", {"wait": 40})
    assert status == 429 and "the acme office already holds 3" in body["error"]["message"]
    for to in ("builder", "scout"):
        await scout("mail_send", to=to, subject="Wake up", body="all of you")
    assert [status for status, _ in await asyncio.gather(*held)] == [200] * 3
    assert polls.held("office:acme") == 0


# -- strangers -----------------------------------------------------------------------------------


async def _stranger_on_a_public_repository(embedded: Embedded,
                                           session: Any) -> tuple[Actor, dict[str, Any]]:
    """`troll`, no one of the office's, and the issue they opened on acme's public website."""
    forge = embedded.forge
    forge.add_repo("acme", "website", private=False)
    embedded.forge_tokens["troll"] = forge.add_user("troll")
    troll = Actor(session, embedded, "troll")
    issue = await troll.open_issue("acme/website", "Let me in", "please")
    await embedded.settle()
    return troll, issue


async def test_a_stranger_is_answered_once_then_refused_quietly(
        embedded: Embedded, session: Any) -> None:
    """A stranger's ten `/mail` comments on a public repository: one refusal comment, and every
    attempt ledgered as run.denied."""
    troll, issue = await _stranger_on_a_public_repository(embedded, session)
    for i in range(10):
        await troll.comment("acme/website", issue["number"], f"/mail scout attempt {i}\nhello")
    await embedded.settle()

    comments = await troll.comments("acme/website", issue["number"])
    replies = [c for c in comments if c["user"]["login"] != "troll"]
    assert len(replies) == 1, [c["body"] for c in replies]
    assert replies[0]["body"].startswith("@troll ")
    denied = [e for e in await embedded.ledger_events("run.denied") if e.actor == "forge:troll"]
    assert len(denied) == 10


async def test_a_strangers_refusal_names_none_of_the_offices_agents_teams_or_people(
        embedded: Embedded, session: Any) -> None:
    """A stranger's `/mail nosuch` on a public repository was answered "no agent 'nosuch';
    known agents: scout, builder, ...", and a comment on a public item addressed to a team
    or to guessed addresses named the office's teams and its people: read before the
    stranger's own right to write was asked (found by review). Comments on items ask the
    writer's access before their `to` and `cc` too."""
    troll, issue = await _stranger_on_a_public_repository(embedded, session)
    await troll.comment("acme/website", issue["number"], "/mail nosuch Hi\nhello")
    await embedded.settle()
    said = [c["body"] for c in await troll.comments("acme/website", issue["number"])
            if c["user"]["login"] != "troll"]
    assert len(said) == 1 and "not a member of this office" in said[0], said
    office = embedded.services.offices
    known = await office.get(embedded.services.forge_for_org("acme"), "acme")
    assert known is not None
    for name in [a.slug for a in known.agents] + [t for t in known.teams]:
        assert name not in said[0], (name, said[0])
    denied = [e for e in await embedded.ledger_events("run.denied") if e.actor == "forge:troll"]
    assert denied and all("scout" not in str(e.data) for e in denied), denied


async def test_a_person_of_the_office_hears_every_refusal(embedded: Embedded,
                                                          person: Any) -> None:
    """The quiet is for strangers: someone in the office is told why each time."""
    lee: Actor = person("lee")  # in the office, without mail.send
    issue = await lee.open_issue("acme/scout-vault", "Hello", "not mail", labels=["goal"])
    await embedded.settle()
    for i in range(3):
        await lee.comment("acme/scout-vault", issue["number"], f"/mail scout try {i}\nhi")
    await embedded.settle()
    replies = [c for c in await lee.comments("acme/scout-vault", issue["number"])
               if c["body"].startswith("@lee ") and "mail.send" in c["body"]]
    assert len(replies) == 3


async def test_a_strangers_quiet_lasts_a_while_then_they_are_told_again(
        embedded: Embedded) -> None:
    store = embedded.services.store
    t0 = 5_000_000.0
    assert await strangers.may_reply(store, "Troll", "d1", org="acme", now=t0)
    assert await strangers.may_reply(store, "troll", "d1", org="acme",
                                     now=t0 + 5)  # its own retry
    assert not await strangers.may_reply(store, "troll", "d2", org="acme", now=t0 + 10)
    assert not await strangers.may_reply(store, "troll", "d3", org="acme",
                                         now=t0 + strangers.QUIET_FOR - 1)
    assert await strangers.may_reply(store, "troll", "d4", org="acme",
                                     now=t0 + strangers.QUIET_FOR + 1)
    assert not await strangers.may_reply(store, "troll", "d5", org="acme",
                                         now=t0 + strangers.QUIET_FOR + 2)


INBOX = "vaultmail://inbox"


async def test_mcp_inbox_subscriptions_count_against_the_tokens_long_polls(
        embedded: Embedded, tools: Any) -> None:
    """Each `subscriptions/listen` holds a request open and a wait on the notifier for as long
    as the client likes, exactly like `list_inbox` with `wait`; one token opening hundreds of
    them would hold them all. With PER_TOKEN of them open, one more long poll is refused."""
    token = embedded.api_tokens["agent:builder"]
    async with AsyncExitStack() as stack:
        for _ in range(PER_TOKEN):
            client = await stack.enter_async_context(mcp_http(embedded, token))
            sub = await stack.enter_async_context(
                client.listen(resource_subscriptions=[INBOX]))
            assert sub.honored.resource_subscriptions == [INBOX]
        status, body = await tools("agent:builder").raw("list_inbox", {"wait": 1})
    assert status == 429, body
