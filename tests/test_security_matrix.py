"""The security matrix (issue 9): every tool and every slash command, tried by a principal
without the right to it, is refused, leaves nothing behind, and is ledgered as `run.denied`
where the seeds say so (permissions, capabilities and the question rules: DESIGN §3.5, seed
mail "Who an agent can write to"); a read of something one cannot see is "not found", as the
forge answers, and is not ledgered (that would tell the ledger's readers it exists).

The world of each cell is the example office plus a private repository `acme/secret` that
marco (admin) and scout's account (write) can see and the other agents cannot:

* `M`: builder → scout mail; `C`: marco's chat with scout;
* `O`: an outcome in scout's vault held by scout; `Q` on it: scout asks marco; `H` on another
  outcome there: scout asks marco, `humanOnly` (critic, marco's other agent, may not answer
  it for him); `S`: an outcome in acme/secret; `B`: builder asks marco on an outcome in
  builder's vault.

Tools go over real HTTP with API tokens; slash commands are forge comments by the principal's
own forge account, answered by the app with a one-line refusal that mentions them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from bot.app.embedded import Embedded
from bot.mail.commands import KNOWN
from bot.store import ledger, mails
from bot.tools import TOOLS
from tests.items_support import BUILDER, CRITIC, LEE, MARCO, SARA, SCOUT, make_item, where
from tests.support import Actor, ToolClient

SECRET = "acme/secret"
HIDDEN = "Bluebird"  # in every title and question of acme/secret


@dataclass
class World:
    embedded: Embedded
    session: aiohttp.ClientSession
    mail: dict[str, Any]  # M
    chat: int  # C
    outcome: str  # O
    question: str  # Q
    decide: str  # another outcome in scout's vault, held by scout
    human_only: str  # H, on `decide`
    secret: str  # S
    secret_question: str
    builder_outcome: str
    builder_question: str  # B

    def tools(self, principal: str) -> ToolClient:
        return ToolClient(self.session, self.embedded, principal)

    def forge(self, login: str) -> Actor:
        return Actor(self.session, self.embedded, login)


async def _world(embedded: Embedded, session: aiohttp.ClientSession) -> World:
    embedded.forge.add_repo("acme", "secret")
    embedded.forge.set_permission(SECRET, "marco", "admin")
    embedded.forge.set_permission(SECRET, "scout-bot", "write")
    w = World(embedded, session, {}, 0, "", "", "", "", "", "", "", "")
    marco, sara = w.forge("marco"), w.forge("sara")
    w.mail = (await w.tools(BUILDER)("mail_send", to="scout", subject="Spec",
                                     body="Spec v1"))["mail"]
    w.chat = (await w.tools(MARCO)("agent_chat", agent="scout", message="Ready?"))["chat"][
        "chat"]
    w.outcome = await make_item(embedded, marco, "outcome", "Pricing",
                                assignees=["scout-bot"])
    scout = w.tools(SCOUT)
    base = {"targetType": "outcome", "target": w.outcome}
    w.question = (await scout("add_comment", **base, body="Discount for schools?",
                              options=[{"label": "Yes"}, {"label": "No"}],
                              to=["marco@acme.com"]))["comment"]["id"]
    w.decide = await make_item(embedded, marco, "outcome", "Prices",
                               assignees=["scout-bot"])
    w.human_only = (await scout("add_comment", targetType="outcome", target=w.decide,
                                body="Raise prices?", options=[{"label": "Yes"},
                                                               {"label": "No"}],
                                humanOnly=True, to=["marco@acme.com"]))["comment"]["id"]
    w.secret = await make_item(embedded, marco, "outcome", f"{HIDDEN} pricing",
                               assignees=["scout-bot"], repo=SECRET)
    w.secret_question = (await scout("add_comment", targetType="outcome", target=w.secret,
                                     body=f"{HIDDEN}: 12 or 15?", needsReply=True,
                                     to=["marco@acme.com"]))["comment"]["id"]
    w.builder_outcome = await make_item(embedded, sara, "outcome", "Build it",
                                        assignees=["builder-bot"], repo="acme/builder-vault")
    w.builder_question = (await w.tools(BUILDER)(
        "add_comment", targetType="outcome", target=w.builder_outcome, body="Ship Friday?",
        needsReply=True, to=["marco@acme.com"]))["comment"]["id"]
    await embedded.settle()
    return w


async def _snapshot(w: World) -> Any:
    """What a refusal must leave as it was: the mails, the threads, the comments, the chats."""
    store = w.embedded.services.store
    rows = [(m.mail_id, m.state) for m in await mails.all_mails(store)]
    threads = [tuple(r) for r in await store.fetchall(
        "SELECT id, open, answered_at, state FROM threads ORDER BY id")]
    comments = (await store.fetchone("SELECT COUNT(*) AS n FROM comments"))["n"]
    chats = [tuple(r) for r in await store.fetchall("SELECT id, answer FROM chats ORDER BY id")]
    return rows, threads, comments, chats


async def _denied(w: World, actor: str) -> int:
    return len([e for e in await w.embedded.ledger_events("run.denied") if e.actor == actor])


# -- the cells ----------------------------------------------------------------------------

Args = Callable[[World], dict[str, Any]]


@dataclass(frozen=True)
class ToolCell:
    tool: str
    who: str
    args: Args
    status: int
    ledgered: bool
    why: str  # the right that is missing, as the seed names it

    @property
    def id(self) -> str:
        return f"{self.tool}-{self.why}"


@dataclass(frozen=True)
class SlashCell:
    command: str
    login: str  # the forge account that comments
    principal: str
    where: Callable[[World], str]  # owner/repo#N
    body: Callable[[World], str]
    ledgered: bool | None  # None: the seed says nothing either way
    why: str

    @property
    def id(self) -> str:
        return f"/{self.command}-{self.why}"


def _m(w: World) -> str:
    return str(w.mail["ref"])


def _on(ref: Callable[[World], str], **extra: Any) -> Args:
    return lambda w: {"targetType": "outcome", "target": ref(w), **extra}


TOOL_CELLS = [
    # mail.send: people need the permission, agents the capability, naming the recipient
    ToolCell("mail_send", LEE, lambda w: {"to": "scout", "subject": "Hi", "body": "x"},
             403, True, "mail.send-permission"),
    ToolCell("mail_send", BUILDER, lambda w: {"to": "critic", "subject": "Hi", "body": "x"},
             403, True, "capability-allow-list"),
    ToolCell("mail_send", CRITIC, lambda w: {"to": "scout", "subject": "Hi", "body": "x"},
             403, True, "capability-empty"),
    ToolCell("mail_send", CRITIC, lambda w: {"to": "scout", "subject": "Re", "body": "x",
                                             "inReplyTo": _m(w)}, 404, False,
             "in-reply-to-a-mail-one-cannot-see"),
    # the mail's own rights: only its recipient agent opens and replies (seed: "mail:working
    # (the agent opened it)"; "It replies with mail_reply")
    ToolCell("mail_open", BUILDER, lambda w: {"mail": _m(w)}, 403, True, "sender-is-not-the-agent"),
    ToolCell("mail_open", MARCO, lambda w: {"mail": _m(w)}, 403, True,
             "recipients-person-is-not-the-agent"),
    ToolCell("mail_open", LEE, lambda w: {"mail": _m(w)}, 404, False, "no-party"),
    ToolCell("mail_reply", BUILDER, lambda w: {"mail": _m(w), "body": "x"}, 403, True,
             "sender-is-not-the-recipient"),
    ToolCell("mail_reply", CRITIC, lambda w: {"mail": _m(w), "body": "x"}, 404, False,
             "no-party"),
    ToolCell("mail_close", LEE, lambda w: {"mail": _m(w)}, 404, False, "no-party"),
    ToolCell("mail_get", CRITIC, lambda w: {"mail": w.mail["mail_id"]}, 404, False, "no-party"),
    # comments: contributor access, addressing, seeing the item, the question rules
    ToolCell("add_comment", BUILDER, _on(lambda w: w.outcome, body="Hello"), 403, True,
             "contributor-access"),
    ToolCell("add_comment", MARCO, lambda w: {"targetType": "outcome", "target": w.secret,
                                              "body": "hi", "to": ["agent:critic"]},
             403, True, "addressing-someone-who-cannot-see-the-item"),
    ToolCell("add_comment", CRITIC, _on(lambda w: w.secret, body="hi"), 404, False,
             "an-item-one-cannot-see"),
    ToolCell("add_comment", CRITIC, lambda w: {"targetType": "outcome", "target": w.decide,
                                               "parent": w.human_only, "option": 1},
             403, True, "humanOnly"),
    ToolCell("add_comment", SARA, lambda w: {"targetType": "outcome", "target": w.outcome,
                                             "parent": w.question, "option": 1},
             403, True, "answer-a-question-one-was-not-asked"),
    ToolCell("resolve_comment", SARA, lambda w: {"comment": w.question}, 403, True,
             "resolve-rights"),
    ToolCell("resolve_comment", SARA, lambda w: {"comment": w.builder_question}, 403, True,
             "resolve-rights-askers-person"),
    ToolCell("resolve_comment", CRITIC, lambda w: {"comment": w.secret_question}, 404, False,
             "an-item-one-cannot-see"),
    ToolCell("get_outcome", CRITIC, lambda w: {"outcome": w.secret}, 404, False,
             "an-item-one-cannot-see"),
    ToolCell("get_tree", BUILDER, lambda w: {"goal": w.secret}, 404, False,
             "an-item-one-cannot-see"),
    # chat: people start chats, the agent asked answers
    ToolCell("agent_chat", BUILDER, lambda w: {"agent": "scout", "message": "hi"}, 403, True,
             "agents-cannot-start-chats"),
    ToolCell("chat_reply", MARCO, lambda w: {"chat": w.chat, "message": "x"}, 403, True,
             "only-the-agent-asked-answers"),
    ToolCell("chat_reply", BUILDER, lambda w: {"chat": w.chat, "message": "x"}, 404, False,
             "no-party"),
    ToolCell("chat_get", CRITIC, lambda w: {"chat": w.chat}, 404, False, "no-party"),
]


def _comment(text: str) -> Callable[[World], str]:
    return lambda w: text


SLASH_CELLS = [
    SlashCell("mail", "lee", LEE, lambda w: w.outcome, _comment("/mail scout Hello\nhi"),
              True, "mail.send-permission"),
    SlashCell("mail", "builder-bot", BUILDER, lambda w: w.builder_outcome,
              _comment("/mail critic Hello\nhi"), True, "capability-allow-list"),
    SlashCell("working", "lee", LEE, _m, _comment("/working"), True, "no-party"),
    SlashCell("working", "builder-bot", BUILDER, _m, _comment("/working"), True,
              "sender-is-not-the-agent"),
    SlashCell("close", "lee", LEE, _m, _comment("/close"), True, "no-party"),
    SlashCell("ask", "builder-bot", BUILDER, lambda w: w.outcome,
              _comment("to: marco@acme.com\n/ask Ship it?"), True, "contributor-access"),
    SlashCell("ask", "marco", MARCO, lambda w: w.secret,
              _comment("to: agent:critic\n/ask Ready?"), True,
              "addressing-someone-who-cannot-see-the-item"),
    SlashCell("answer", "sara", SARA, lambda w: w.outcome, _comment("/answer 1"), None,
              "a-question-one-was-not-asked"),
    SlashCell("answer", "critic-bot", CRITIC, lambda w: w.decide, _comment("/answer 2"), True,
              "humanOnly"),
    SlashCell("resolve", "sara", SARA, lambda w: w.outcome,
              lambda w: f"/resolve {w.question}", True, "resolve-rights"),
    SlashCell("resolve", "sara", SARA, lambda w: w.builder_outcome,
              lambda w: f"/resolve {w.builder_question}", True, "resolve-rights-askers-person"),
    SlashCell("comment", "builder-bot", BUILDER, lambda w: w.outcome,
              _comment("Looks fine to me"), True, "contributor-access"),
    SlashCell("reply", "builder-bot", BUILDER, lambda w: w.outcome,
              lambda w: f"/reply {w.question} Fine by me", True, "contributor-access"),
    SlashCell("confirmed", "sara", SARA, lambda w: w.decide, _comment("/confirmed 1"), None,
              "a-question-one-was-not-asked"),
]


def test_every_tool_and_every_slash_command_has_a_cell() -> None:
    assert {c.tool for c in TOOL_CELLS} | READS_ONLY == set(TOOLS), \
        "a new tool needs its cells in the security matrix"
    assert {c.command for c in SLASH_CELLS} >= set(KNOWN)


# Tools with no right to lack: everyone may call them, and they show only what the caller may
# see (cells below, in test_reads_show_only_what_the_caller_may_see).
READS_ONLY = {"mail_list", "list_inbox", "list_changes"}


@pytest.fixture
async def world(embedded: Embedded, session: aiohttp.ClientSession) -> World:
    return await _world(embedded, session)


@pytest.mark.parametrize("cell", TOOL_CELLS, ids=lambda c: c.id)
async def test_a_tool_without_the_right_is_refused(world: World, cell: ToolCell) -> None:
    before, denied = await _snapshot(world), await _denied(world, cell.who)
    status, body = await world.tools(cell.who).raw(cell.tool, cell.args(world))
    assert status == cell.status, (cell.id, status, body)
    error = body["error"]
    assert error["message"] and HIDDEN not in error["message"], error
    if status == 404:
        assert error["code"] in ("not_found",), error
    await world.embedded.settle()
    assert await _snapshot(world) == before, "a refusal leaves nothing behind"
    assert await _denied(world, cell.who) - denied == (1 if cell.ledgered else 0), \
        f"{cell.id}: run.denied {'expected' if cell.ledgered else 'not expected'}"


@pytest.mark.parametrize("cell", SLASH_CELLS, ids=lambda c: c.id)
async def test_a_slash_command_without_the_right_is_refused(world: World,
                                                            cell: SlashCell) -> None:
    before, denied = await _snapshot(world), await _denied(world, cell.principal)
    repo, number = where(cell.where(world))
    posted = await world.forge(cell.login).comment(repo, number, cell.body(world))
    await world.embedded.settle()
    admin = world.forge("admin")
    replies = [c for c in await admin.comments(repo, number)
               if c["id"] > posted["id"] and c["user"]["login"] != cell.login]
    refusals = [c for c in replies if c["body"].startswith(f"@{cell.login} ")]
    assert len(refusals) == 1, (cell.id, [c["body"] for c in replies])
    assert HIDDEN not in refusals[0]["body"] or cell.where(world) == world.secret
    assert await _snapshot(world) == before, f"{cell.id}: a refusal leaves nothing behind"
    if cell.ledgered is not None:
        assert await _denied(world, cell.principal) - denied == (1 if cell.ledgered else 0), \
            f"{cell.id}: run.denied {'expected' if cell.ledgered else 'not expected'}"


async def test_closing_a_mail_by_hand_without_the_right_is_undone(world: World) -> None:
    repo, number = where(_m(world))
    before, denied = await _snapshot(world), await _denied(world, LEE)
    await world.forge("lee").call("PATCH", f"/repos/{repo}/issues/{number}",
                                  {"state": "closed"}, expect=200)
    await world.embedded.settle()
    assert (await world.forge("admin").issue(repo, number))["state"] == "open"
    assert await _snapshot(world) == before
    assert await _denied(world, LEE) - denied == 1


async def test_reads_show_only_what_the_caller_may_see(world: World) -> None:
    """The read-only tools: mail_list, list_inbox (and the `inbox` field), list_changes."""
    critic, lee = world.tools(CRITIC), world.tools(LEE)
    assert (await lee("mail_list"))["mails"] == [], "lee is no party to any mail"
    assert [m["ref"] for m in (await world.tools(BUILDER)("mail_list"))["mails"]] == [_m(world)]
    listed = await critic("list_inbox")
    changes = await critic("list_changes", limit=1000)
    for shown in (listed, changes):
        assert HIDDEN not in json.dumps(shown) and SECRET not in json.dumps(shown), shown
    assert not [e for e in changes["events"] if e["subject"] == _m(world)], "no party to M"
    newest = (await ledger.entries(world.embedded.services.store, limit=100_000))[-1].seq
    assert changes["next"] == newest, "next steps over what critic may not see"
    scout_sees = await world.tools(SCOUT)("list_changes", limit=1000)
    assert {e["subject"] for e in scout_sees["events"]} >= {world.secret, _m(world)}


async def test_resolve_in_the_forge_reaches_only_the_threads_of_that_item(world: World) -> None:
    """`/resolve <id>` on one item never reaches a thread on another: not one in a repository
    the commenter cannot see (its asker and kind stay unsaid), not even one an editor could
    resolve where it is."""
    repo, number = where(world.outcome)

    async def refusal(login: str, text: str) -> str:
        posted = await world.forge(login).comment(repo, number, text)
        await world.embedded.settle()
        [reply] = [c["body"] for c in await world.forge("admin").comments(repo, number)
                   if c["id"] > posted["id"] and c["body"].startswith(f"@{login} ")]
        said = re.sub(r" <!-- vaultmail:said [0-9a-f]+:\d+ -->$", "", str(reply))
        return said.replace(text.split()[-1], "ID")

    before = await _snapshot(world)
    hidden = await refusal("critic-bot", f"/resolve {world.secret_question}")
    missing = await refusal("critic-bot", "/resolve c0000000000")
    assert hidden == missing and "agent:scout" not in hidden, hidden
    elsewhere = await refusal("marco", f"/resolve {world.builder_question}")
    assert elsewhere.replace("@marco", "@critic-bot") == missing, elsewhere
    assert await _snapshot(world) == before, "no thread was resolved"


# -- another office: every tool, tried by an org that names its principals like acme's -----
#
# `evil` installs the App beside acme and declares acme's principal names in its own config
# (its admin eve as `human:marco@acme.com`, an editor there; agents scout, builder, critic).
# With evil's tokens, every tool is tried against acme's mail, chat, items and questions: each
# is "not found" as for nothing, or shows nothing of acme's, and leaves acme's rows as they
# were (issue 21).

EVIL_OFFICE = {
    "org": "evil",
    "humans": [{"email": "marco@acme.com", "login": "eve",
                "permissions": ["mail.send", "editor"]}],
    "agents": [{"slug": slug, "login": f"evil-{slug}", "person": "marco@acme.com",
                "run": {"triggers": ["mail", "chat"], "dispatch": "none"},
                "capabilities": {"mail.send": ["*"]}} for slug in ("scout", "builder", "critic")],
}


@dataclass(frozen=True)
class OtherOfficeCell:
    tool: str
    who: str  # the principal's name, in evil's office
    args: Args

    @property
    def id(self) -> str:
        return f"{self.tool}-as-{self.who.split(':')[0]}"


OTHER_OFFICE_CELLS = [
    OtherOfficeCell("mail_get", MARCO, lambda w: {"mail": w.mail["mail_id"]}),
    OtherOfficeCell("mail_get", SCOUT, lambda w: {"mail": _m(w)}),
    OtherOfficeCell("mail_open", SCOUT, lambda w: {"mail": _m(w)}),
    OtherOfficeCell("mail_reply", SCOUT, lambda w: {"mail": _m(w), "body": "Sold."}),
    OtherOfficeCell("mail_close", MARCO, lambda w: {"mail": _m(w)}),
    OtherOfficeCell("mail_send", BUILDER, lambda w: {"to": "scout", "subject": "Re",
                                                     "body": "x", "inReplyTo": _m(w)}),
    OtherOfficeCell("add_comment", MARCO, _on(lambda w: w.outcome, body="Hello")),
    OtherOfficeCell("add_comment", MARCO, lambda w: {
        "targetType": "outcome", "target": w.outcome, "parent": w.question, "option": 1}),
    OtherOfficeCell("resolve_comment", MARCO, lambda w: {"comment": w.question}),
    OtherOfficeCell("get_outcome", SCOUT, lambda w: {"outcome": w.outcome}),
    OtherOfficeCell("get_tree", MARCO, lambda w: {"goal": w.outcome}),
    OtherOfficeCell("chat_reply", SCOUT, lambda w: {"chat": w.chat, "message": "No."}),
    OtherOfficeCell("chat_get", MARCO, lambda w: {"chat": w.chat}),
]
# Tools that act in the caller's own office whatever they are given: tried below for what
# they show and where they write.
OTHER_OFFICE_OWN = {"mail_list", "list_inbox", "list_changes", "agent_chat"}


@dataclass
class TwoOffices:
    world: World
    tokens: dict[str, str]  # evil's, by principal name

    async def raw(self, who: str, tool: str, args: dict[str, Any]) -> tuple[int, Any]:
        return await self.world.tools(MARCO).raw(tool, args, token=self.tokens[who])


@pytest.fixture
async def two_offices(world: World) -> TwoOffices:
    from bot.office.config import parse_office
    from bot.office.seed import seed_office
    from bot.store import api_tokens

    forge = world.embedded.forge
    seed_office(forge, parse_office(json.dumps(EVIL_OFFICE), "evil.yml", repository=False))
    (app_id,) = forge.state.apps
    forge.install_app(int(app_id), "evil")
    await world.embedded.settle()
    store = world.embedded.services.store
    tokens = {p: await api_tokens.create_token(store, p, "evil")
              for p in (MARCO, SCOUT, BUILDER, CRITIC)}
    return TwoOffices(world, tokens)


def test_every_tool_has_a_cell_for_another_office() -> None:
    assert {c.tool for c in OTHER_OFFICE_CELLS} | OTHER_OFFICE_OWN == set(TOOLS), \
        "a new tool needs its cell against another office in the security matrix"


@pytest.mark.parametrize("cell", OTHER_OFFICE_CELLS, ids=lambda c: c.id)
async def test_another_office_finds_nothing_of_this_one(two_offices: TwoOffices,
                                                       cell: OtherOfficeCell) -> None:
    w = two_offices.world
    before = await _snapshot(w)
    status, body = await two_offices.raw(cell.who, cell.tool, cell.args(w))
    assert status == 404 and body["error"]["code"] == "not_found", (cell.id, status, body)
    for said in (w.mail["subject"], "Pricing", "Discount for schools", "Ready?"):
        assert said not in json.dumps(body), (cell.id, body)
    await w.embedded.settle()
    assert await _snapshot(w) == before, f"{cell.id}: acme's rows are as they were"


async def test_another_offices_reads_and_chats_stay_in_that_office(
        two_offices: TwoOffices) -> None:
    w = two_offices.world
    for who in (MARCO, SCOUT):
        for tool in ("mail_list", "list_inbox", "list_changes"):
            status, body = await two_offices.raw(who, tool, {})
            assert status == 200, body
            shown = json.dumps(body)
            for said in (w.mail["subject"], "Pricing", "Discount for schools", "Ready?",
                         _m(w), w.outcome):
                assert said not in shown, (who, tool, said)
    status, body = await two_offices.raw(MARCO, "agent_chat",
                                         {"agent": "scout", "message": "From evil"})
    assert status == 200, body
    acme_scout = (await w.tools(SCOUT)("mail_list"))["inbox"]["chats"]
    assert "From evil" not in json.dumps(acme_scout), "acme's scout is not evil's scout"
    status, body = await two_offices.raw(SCOUT, "list_inbox", {})
    assert [c["message"] for c in body["inbox"]["chats"]] == ["From evil"]


async def test_another_offices_console_shows_nothing_of_this_one(
        two_offices: TwoOffices) -> None:
    w = two_offices.world
    bearer = {"Authorization": f"Bearer {two_offices.tokens[MARCO]}"}
    for path in ("/console/inbox", "/console/mail", "/console/ledger", "/console/agents/scout",
                 f"/console/mail/{w.mail['thread_id']}"):
        async with w.session.get(w.embedded.app_url + path, headers=bearer,
                                 allow_redirects=False) as resp:
            text = await resp.text()
        assert resp.status in (200, 404), (path, resp.status)
        for said in (w.mail["subject"], "Pricing", "Discount for schools", "Ready?"):
            assert said not in text, (path, said)
