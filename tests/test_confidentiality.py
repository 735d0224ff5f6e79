"""Reading never shares (issue 9, items 1 and 2): every read path shows a principal only what
that principal's forge account can see, and refuses the rest as the forge does ("not found",
worded as for something that does not exist).

The office is the example one plus a private repository `acme/secret`: marco (admin) and
scout's account (write) can see it; critic's and builder's accounts cannot (agents are not org
members, and are no collaborators there)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import mcp_types as types
import pytest

from bot.app.embedded import Embedded
from tests.items_support import BUILDER, CRITIC, LEE, MARCO, SARA, SCOUT, make_item
from tests.support import Actor, ToolClient
from tests.test_cli_tools import vaultmail
from tests.test_mcp import mcp_http

SECRET = "acme/secret"
WORDS = "Launch codename Bluebird"  # a title nobody outside acme/secret may read
QUESTION = "Bluebird price: 12 or 15 euros?"


@dataclass
class Secret:
    goal: str
    outcome: str
    question: str  # the comment id of an answered question on the outcome


async def _secret(embedded: Embedded, person: Any, tools: Any) -> Secret:
    embedded.forge.add_repo("acme", "secret")
    embedded.forge.set_permission(SECRET, "marco", "admin")
    embedded.forge.set_permission(SECRET, "scout-bot", "write")
    marco: Actor = person("marco")
    goal = await make_item(embedded, marco, "goal", WORDS, repo=SECRET)
    outcome = await make_item(embedded, marco, "outcome", f"{WORDS}: pricing",
                              body=f"Part of {goal}", assignees=["scout-bot"], repo=SECRET)
    scout: ToolClient = tools(SCOUT)
    asked = await scout("add_comment", targetType="outcome", target=outcome, body=QUESTION,
                        options=[{"label": "12 euros"}, {"label": "15 euros"}],
                        to=["marco@acme.com"])
    qid = asked["comment"]["id"]
    await tools(MARCO)("add_comment", targetType="outcome", target=outcome, parent=qid,
                       option=1)
    await embedded.settle()
    return Secret(goal, outcome, qid)


@pytest.fixture
async def secret(embedded: Embedded, person: Any, tools: Any) -> Secret:
    return await _secret(embedded, person, tools)


def _shape(message: str) -> str:
    """A refusal with the refs taken out, to compare one with another."""
    return re.sub(r"[\w.-]+/[\w.-]+#\d+|'[^']*'", "REF", message)


async def _refused(client: ToolClient, tool: str, **args: Any) -> tuple[int, dict[str, Any]]:
    status, body = await client.raw(tool, args)
    assert status != 200, (tool, body)
    return status, body["error"]


def _leaks(body: Any, *, repo: bool = False) -> bool:
    """Whether `body` tells anything of acme/secret's items (with `repo`, even its name)."""
    text = json.dumps(body)
    return WORDS in text or QUESTION in text or (repo and SECRET in text)


async def test_get_outcome_refuses_an_item_the_callers_forge_account_cannot_see(
        secret: Secret, tools: Any) -> None:
    critic: ToolClient = tools(CRITIC)
    status, err = await _refused(critic, "get_outcome", outcome=secret.outcome)
    missing_status, missing = await _refused(critic, "get_outcome", outcome=f"{SECRET}#999")
    assert (status, err["code"]) == (missing_status, missing["code"]) == (404, "not_found")
    assert _shape(err["message"]) == _shape(missing["message"]), "existence is not leaked"
    assert WORDS not in err["message"]
    # the same for a repository that does not exist at all
    _, nowhere = await _refused(critic, "get_outcome", outcome="acme/nowhere#1")
    assert _shape(nowhere["message"]) == _shape(err["message"])

    seen = await tools(SCOUT)("get_outcome", outcome=secret.outcome)
    assert seen["outcome"]["title"].startswith(WORDS)
    assert [d["question"] for d in seen["decisions"]] == [QUESTION]
    assert [g["ref"] for g in seen["goals"]] == [secret.goal]


async def test_get_tree_refuses_a_goal_the_callers_forge_account_cannot_see(
        secret: Secret, tools: Any) -> None:
    status, err = await _refused(tools(CRITIC), "get_tree", goal=secret.goal)
    assert (status, err["code"]) == (404, "not_found") and not _leaks(err)
    tree = await tools(SCOUT)("get_tree", goal=secret.goal)
    assert [c["ref"] for c in tree["children"]] == [secret.outcome]


async def test_a_visible_tree_hides_the_parts_in_repositories_one_cannot_see(
        embedded: Embedded, secret: Secret, person: Any, tools: Any) -> None:
    """A goal everyone can read, with one outcome under it in acme/secret and one in scout's
    vault; a decision taken on a plan in acme/secret counts for the visible outcome."""
    marco: Actor = person("marco")
    goal = await make_item(embedded, marco, "goal", "Spring pricing")
    open_part = await make_item(embedded, marco, "outcome", "Public price list",
                                body=f"Part of {goal}", assignees=["scout-bot"])
    await make_item(embedded, marco, "outcome", f"{WORDS}: part of spring",
                    body=f"Part of {goal}", repo=SECRET)
    plan = await make_item(embedded, marco, "plan", f"{WORDS}: plan",
                           body=f"Part of {open_part}", repo=SECRET)
    asked = await tools(SCOUT)("add_comment", targetType="plan", target=plan, body=QUESTION,
                               needsReply=True, to=["marco@acme.com"])
    await tools(MARCO)("add_comment", targetType="plan", target=plan,
                       parent=asked["comment"]["id"], body="15")

    critic: ToolClient = tools(CRITIC)
    tree = await critic("get_tree", goal=goal)
    assert [c["ref"] for c in tree["children"]] == [open_part] and not _leaks(tree)
    outcome = await critic("get_outcome", outcome=open_part)
    assert outcome["decisions"] == [] and not _leaks(outcome)
    # scout's account sees all of it
    full = await tools(SCOUT)("get_tree", goal=goal)
    assert len(full["children"]) == 2
    assert [d["question"] for d in (await tools(SCOUT)("get_outcome", outcome=open_part))[
        "decisions"]] == [QUESTION]


async def test_commenting_on_or_resolving_in_an_item_one_cannot_see_is_not_found(
        secret: Secret, tools: Any) -> None:
    critic: ToolClient = tools(CRITIC)
    status, err = await _refused(critic, "add_comment", targetType="outcome",
                                 target=secret.outcome, body="hello")
    assert (status, err["code"]) == (404, "not_found") and not _leaks(err)
    status, err = await _refused(critic, "resolve_comment", comment=secret.question)
    _, missing = await _refused(critic, "resolve_comment", comment="c0000000000")
    assert (status, err["code"]) == (404, "not_found")
    assert _shape(err["message"]) == _shape(missing["message"]) and not _leaks(err)


async def test_list_changes_serves_only_events_about_what_the_caller_may_see(
        embedded: Embedded, secret: Secret, tools: Any) -> None:
    sent = (await tools(BUILDER)("mail_send", to="scout", subject="Bluebird mail",
                                 body="The Bluebird numbers"))["mail"]
    await embedded.settle()

    async def changes(principal: str) -> list[dict[str, Any]]:
        events, since = [], 0
        while True:
            page = await tools(principal)("list_changes", since=since, limit=3)
            events += page["events"]
            if page["next"] == since:
                return events
            since = page["next"]

    for who in (CRITIC, BUILDER):  # their accounts cannot see acme/secret
        assert not _leaks(await changes(who), repo=True), who
    for who in (CRITIC, LEE, SARA):  # no party to builder's mail to scout
        seen = await changes(who)
        assert not [e for e in seen if e["subject"] == sent["ref"]
                    or "Bluebird mail" in json.dumps(e)], f"{who} sees the mail"
    # the comments on acme/secret are for those who can see it
    scout_sees = await changes(SCOUT)
    assert {e["event"] for e in scout_sees if e["subject"] == secret.outcome} >= {
        "comment.added", "comment.answered"}
    # mail: the sender, the recipient, the recipient's person (marco, also an editor)
    for who in (BUILDER, SCOUT, MARCO):
        assert [e["event"] for e in await changes(who) if e["subject"] == sent["ref"]][:1] == [
            "mail.sent"], who


async def test_list_changes_pages_past_what_the_caller_may_not_see(
        embedded: Embedded, secret: Secret, tools: Any) -> None:
    """`next` moves on over entries the caller may not see, so paging always ends."""
    newest = max(e.seq for e in await embedded.ledger_events("comment.answered"))
    page = await tools(CRITIC)("list_changes", since=0, limit=1000)
    assert page["next"] >= newest and not _leaks(page["events"], repo=True)


async def test_the_shared_agents_box_shows_a_sibling_nothing_from_an_item_it_cannot_see(
        embedded: Embedded, secret: Secret, tools: Any) -> None:
    """scout and critic share marco's agents' box; a comment for scout on acme/secret neither
    shows in critic's inbox nor is used up by critic's look."""
    note = await tools(MARCO)("add_comment", targetType="outcome", target=secret.outcome,
                              body=f"{WORDS}: please double-check", to=["agent:scout"])
    asked = await tools(MARCO)("add_comment", targetType="outcome", target=secret.outcome,
                               body=f"{WORDS}: ready by Friday?", needsReply=True,
                               to=["agent:scout"])
    critic: ToolClient = tools(CRITIC)
    listed = await critic("list_inbox")
    assert not _leaks(listed["agents"]) and not _leaks(listed["inbox"]), listed
    other = await critic("mail_list")
    assert not _leaks(other["inbox"])
    scout = await tools(SCOUT)("list_inbox")
    assert note["comment"]["id"] in [c["id"] for c in scout["agents"]["unread"]]
    assert asked["comment"]["id"] in [t["thread"] for t in scout["agents"]["yourTurn"]]


async def test_mail_get_refuses_a_mail_one_is_no_party_to_as_not_found(
        embedded: Embedded, tools: Any) -> None:
    sent = (await tools(BUILDER)("mail_send", to="scout", subject="Bluebird mail",
                                 body="The Bluebird numbers"))["mail"]
    lee: ToolClient = tools(LEE)
    for ref in (sent["ref"], sent["mail_id"]):
        status, err = await _refused(lee, "mail_get", mail=ref)
        assert (status, err["code"]) == (404, "not_found") and "Bluebird" not in err["message"]
    _, missing = await _refused(lee, "mail_get", mail="acme/scout-vault#999")
    status, err = await _refused(lee, "mail_get", mail=sent["ref"])
    assert _shape(err["message"]) == _shape(missing["message"])
    status, err = await _refused(tools(CRITIC), "mail_send", to="scout", subject="Re",
                                 body="x", inReplyTo=sent["ref"])
    assert status == 404, "replying to a mail one cannot read is not found either"
    assert (await tools(MARCO)("mail_get", mail=sent["ref"]))["mail"]["subject"] == \
        "Bluebird mail", "the recipient's person reads it"


async def test_access_removed_on_the_forge_takes_effect_once_the_cache_expires(
        embedded: Embedded, secret: Secret, tools: Any) -> None:
    scout: ToolClient = tools(SCOUT)
    assert (await scout("get_outcome", outcome=secret.outcome))["outcome"]
    visibility = embedded.services.visibility
    now = [1000.0]
    visibility.clock = lambda: now[0]
    visibility.forget()
    assert (await scout("get_outcome", outcome=secret.outcome))["outcome"]
    embedded.forge.remove_permission(SECRET, "scout-bot")
    now[0] += visibility.ttl / 2
    assert (await scout("get_outcome", outcome=secret.outcome))["outcome"], "cached briefly"
    now[0] += visibility.ttl
    status, err = await _refused(scout, "get_outcome", outcome=secret.outcome)
    assert (status, err["code"]) == (404, "not_found")


async def test_the_inbox_prompt_and_the_shell_show_nothing_one_cannot_see(
        embedded: Embedded, secret: Secret, tools: Any) -> None:
    """lee is asked on acme/secret while lee can see it (as an org member), then leaves the
    org: the MCP `inbox` prompt and `vaultmail inbox` no longer show the card."""
    embedded.forge.set_permission(SECRET, "lee", "read")
    await tools(SCOUT)("add_comment", targetType="outcome", target=secret.outcome,
                       body=f"{WORDS}: can you check the numbers?", needsReply=True,
                       to=["lee@acme.com"])
    assert [t["body"] for t in (await tools(LEE)("list_inbox"))["you"]["yourTurn"]] == [
        f"{WORDS}: can you check the numbers?"]
    embedded.forge.remove_permission(SECRET, "lee")
    embedded.forge.remove_org_member("acme", "lee")
    embedded.services.visibility.forget()
    async with mcp_http(embedded, embedded.api_tokens[LEE]) as client:
        got = await client.get_prompt("inbox")
    [message] = got.messages
    assert isinstance(message.content, types.TextContent)
    assert "Nothing is waiting" in message.content.text and WORDS not in message.content.text
    code, out, err = await vaultmail("inbox", "--as", LEE, "--data", str(embedded.data_dir),
                                     "--json")
    assert code == 0, err
    assert WORDS not in out
    code, out, err = await vaultmail("call", "get_outcome", "--args",
                                     json.dumps({"outcome": secret.outcome}),
                                     "--as", LEE, "--data", str(embedded.data_dir))
    assert code != 0 and "not_found" in out + err and WORDS not in out + err


async def test_an_item_key_one_cannot_see_is_as_unknown_as_a_key_nobody_gave(
        embedded: Embedded, secret: Secret, person: Any, tools: Any) -> None:
    keyed = await make_item(embedded, person("marco"), "outcome", f"BB-7: {WORDS}",
                            assignees=["scout-bot"], repo=SECRET)
    status, err = await _refused(tools(CRITIC), "get_outcome", outcome="BB-7")
    _, nobody = await _refused(tools(CRITIC), "get_outcome", outcome="ZZ-9")
    assert status == 404 and err["code"] == nobody["code"]
    assert err["message"].replace("BB-7", "ZZ-9") == nobody["message"] and not _leaks(err)
    assert (await tools(SCOUT)("get_outcome", outcome="BB-7"))["outcome"]["ref"] == keyed


async def test_a_refused_send_is_in_the_ledger_of_its_parties_only(
        embedded: Embedded, tools: Any) -> None:
    """A refusal is about mail to an agent: its would-be sender, that agent, the agent's person
    and editors read it in list_changes; nobody else does."""
    status, _ = await tools(BUILDER).raw("mail_send", {"to": "critic", "subject": "Bluebird",
                                                       "body": "x"})
    assert status == 403

    async def denials(who: str) -> list[str]:
        page = await tools(who)("list_changes", limit=1000)
        return [e["actor"] for e in page["events"] if e["event"] == "run.denied"]

    for who in (BUILDER, CRITIC, MARCO):
        assert await denials(who) == [BUILDER], who
    for who in (SARA, LEE, SCOUT):
        assert await denials(who) == [], who
