"""Issue 26: the seed's questions as people and agents live them, acted out over real HTTP.

Each test is named after the seed sentence it acts out (seeds/comments-and-inbox.md). The
example office: marco is an editor, scout and critic are his agents; sara's is builder."""

from __future__ import annotations

from typing import Any

from bot.app.embedded import Embedded
from bot.store import comments as db
from tests.items_support import (
    CRITIC,
    MARCO,
    SARA,
    SCOUT,
    TOKEN_TTL,
    forge_comments,
    make_item,
    where,
)

YES_NO = [{"label": "Yes"}, {"label": "No"}]


async def _turn_of(tools: Any, principal: str, box: str) -> list[str]:
    return [t["thread"] for t in (await tools(principal)("list_inbox"))[box]["yourTurn"]]


# -- 1. "The first reply from someone asked is the answer." --------------------------------
async def test_the_first_reply_from_someone_asked_is_the_answer(
        embedded: Embedded, person: Any, tools: Any) -> None:
    outcome = await make_item(embedded, person("marco"), "outcome", "Beta",
                              assignees=["scout-bot"])
    base = {"targetType": "outcome", "target": outcome}
    scout, critic, marco, sara = tools(SCOUT), tools(CRITIC), tools(MARCO), tools(SARA)

    # critic is marco's other agent, not asked: its word is a reply in the thread
    q = await scout("add_comment", **base, header="Ship the beta", body="Ship Friday?",
                    options=YES_NO, to=["marco@acme.com"])
    qid = q["comment"]["id"]
    fyi = await critic("add_comment", **base, parent=qid, body="FYI marco is out today")
    assert fyi["thread"]["answer"] is None, "a reply from someone not asked is no answer"
    assert fyi["thread"]["waitingOn"] == [MARCO], "and changes no one's turn"
    assert {r["principal"] for r in fyi["notify"]} == {MARCO, SCOUT}, (
        "it reaches everyone in the thread")
    assert (await scout("get_outcome", outcome=outcome))["decisions"] == []
    assert qid in await _turn_of(tools, MARCO, "you"), "the question stays on marco's stack"
    status, err = await critic.raw("add_comment", {**base, "parent": qid, "option": 1})
    assert status == 403 and "confirmedWithPerson" in err["error"]["message"], (
        "an agent of someone asked answers only by relaying their answer")

    answered = await marco("add_comment", **base, parent=qid, option="Yes")
    assert answered["thread"]["answer"]["by"] == MARCO
    assert answered["thread"]["waitingOn"] == [SCOUT]
    [decision] = (await scout("get_outcome", outcome=outcome))["decisions"]
    assert decision["decidedBy"] == MARCO and decision["answer"]["option"] == "Yes"

    # marco is scout's person, but sara asked scout: marco's remark is not scout's answer
    q2 = await sara("add_comment", **base, header="Branch", body="Which branch is it on?",
                    needsReply=True, to=["agent"])
    q2id = q2["comment"]["id"]
    remark = await marco("add_comment", **base, parent=q2id, body="Scout will know")
    assert remark["thread"]["answer"] is None and remark["thread"]["waitingOn"] == [SCOUT]
    assert q2id in await _turn_of(tools, SCOUT, "agents")
    assert q2id not in await _turn_of(tools, SARA, "you"), "nothing came back to sara yet"
    got = await scout("add_comment", **base, parent=q2id, body="auth-v2")
    assert got["thread"]["answer"]["by"] == SCOUT and got["thread"]["waitingOn"] == [SARA]
    decided = {d["header"]: d["decidedBy"]
               for d in (await sara("get_outcome", outcome=outcome))["decisions"]}
    assert decided == {"Ship the beta": MARCO, "Branch": SCOUT}


async def test_the_first_reply_from_someone_asked_is_the_answer_in_the_forge(
        embedded: Embedded, person: Any, tools: Any) -> None:
    outcome = await make_item(embedded, person("marco"), "outcome", "Beta",
                              assignees=["scout-bot"])
    repo, n = where(outcome)
    store = embedded.services.store

    # sara asks scout; marco, scout's person, remarks with `/answer`: a reply, not the answer
    q2 = await tools(SARA)("add_comment", targetType="outcome", target=outcome,
                           header="Branch", body="Which branch is it on?", needsReply=True,
                           to=["agent"])
    await person("marco").comment(repo, n, "/answer Ask scout, it knows")
    await embedded.settle()
    t2 = await db.get_thread(store, q2["comment"]["id"])
    assert t2 is not None and t2.state.answer is None and t2.state.waiting_on == (SCOUT,)
    said = (await forge_comments(person("admin"), outcome))[-1]["body"]
    assert "@marco" in said and "not the answer" in said, "marco is told how it was taken"

    # scout asks marco; critic, marco's other agent, remarks: a reply, not the answer
    q = await tools(SCOUT)("add_comment", targetType="outcome", target=outcome,
                           header="Ship the beta", body="Ship Friday?", options=YES_NO,
                           to=["marco@acme.com"])
    qid = q["comment"]["id"]
    await person("critic-bot").comment(repo, n, "/answer Ship the beta: FYI marco is out today")
    await embedded.settle()
    t = await db.get_thread(store, qid)
    assert t is not None and t.state.answer is None and t.state.waiting_on == (MARCO,)
    assert CRITIC in t.state.members, "a reply in the thread"
    said = (await forge_comments(person("admin"), outcome))[-1]["body"]
    assert "@critic-bot" in said and "not the answer" in said
    assert qid in await _turn_of(tools, MARCO, "you")

    await person("marco").comment(repo, n, "/answer 1")
    await embedded.settle()
    t = await db.get_thread(store, qid)
    assert t is not None and t.state.answer is not None and t.state.answer.by == MARCO
    assert t.state.answer.option == "Yes"


# -- 2. "A reply to something your agent asked (`askedBy` names it): act on it, checking that
#        `then` still fits, then resolve the thread so it stops showing." ----------------------
async def test_a_reply_to_something_your_agent_asked_act_on_it_then_resolve_it(
        embedded: Embedded, person: Any, tools: Any) -> None:
    outcome = await make_item(embedded, person("marco"), "outcome", "Auth",
                              assignees=["scout-bot"])
    base = {"targetType": "outcome", "target": outcome}
    scout, critic, sara = tools(SCOUT), tools(CRITIC), tools(SARA)
    q = await scout("add_comment", **{**TOKEN_TTL, **base, "to": ["sara@acme.com"]})
    qid = q["comment"]["id"]
    await sara("add_comment", **base, parent=qid, option=2)

    async def card(client: Any) -> dict[str, Any] | None:
        turn = (await client("list_changes"))["inbox"]["yourTurn"]
        return next((c for c in turn if c["thread"] == qid), None)

    mine = await card(scout)  # the asker's: act on it, with its `then`, and resolve it
    assert mine is not None and mine["turn"] == "replied" and "asHistory" not in mine
    assert mine["answer"]["then"].startswith("Invalidate")
    theirs = await card(critic)  # a sibling's: history it may act on, not a card to clear
    assert theirs is not None and theirs["forAgent"] == SCOUT and theirs["askedBy"] == SCOUT
    assert "then" not in theirs["answer"] and theirs["asHistory"] is True
    assert SCOUT in theirs["note"] and "resolve" in theirs["note"]
    status, err = await critic.raw("resolve_comment", {"comment": qid})
    assert status == 403, "resolving stays the asker's"

    # critic acts on it and says so in the thread: it has passed it on, and is done with it
    await critic("add_comment", **base, parent=qid, body="Noted: I'll hold the cutover",
                 cc=["me"])
    assert await card(critic) is None, "it left the sibling's yourTurn"
    assert await card(scout) is not None, "and stays the asker's until it resolves it"

    # a changed answer is news again to both; the asker's resolve takes it from everyone
    await sara("add_comment", **base, parent=qid, option=1, amend=True)
    again = await card(critic)
    assert again is not None and again["asHistory"] is True
    await scout("resolve_comment", comment=qid)
    assert await card(critic) is None and await card(scout) is None


# -- 3. "Questions on a plan count for the outcome or goal it implements." ------------------
async def test_questions_on_a_plan_count_for_the_outcome_or_goal_it_implements(
        embedded: Embedded, person: Any, tools: Any) -> None:
    marco, sara = person("marco"), person("sara")
    old = await make_item(embedded, marco, "outcome", "AC-12: Auth schema migration")
    new = await make_item(embedded, marco, "outcome", "AC-14: Session store")
    plan = await make_item(embedded, sara, "plan", "Dual-read plan",
                           body=f"Part of #{where(old)[1]}\n\nRead both tables for a month.")
    base = {"targetType": "plan", "target": plan}
    q = await tools(SARA)("add_comment", **base, header="Cutover day", body="Cut over Monday?",
                          options=YES_NO, to=["marco@acme.com"])
    await tools(MARCO)("add_comment", **base, parent=q["comment"]["id"], option="Yes")

    async def decided(outcome: str) -> list[str]:
        got = await tools(SARA)("get_outcome", outcome=outcome)
        return [d["header"] for d in got["decisions"]]

    assert await decided("AC-12") == ["Cutover day"] and await decided("AC-14") == []

    # the plan now implements AC-14: its decisions go with it
    repo, n = where(plan)
    await sara.call("PATCH", f"/repos/{repo}/issues/{n}",
                    {"body": f"Part of #{where(new)[1]}\n\nRead both tables for a month."},
                    expect=200)
    await embedded.settle()
    assert await decided("AC-14") == ["Cutover day"], "the decision follows the plan"
    assert await decided("AC-12") == [], "and leaves the outcome it no longer implements"

    # and a reply in the thread afterwards keeps it there
    await tools(SARA)("add_comment", **base, parent=q["comment"]["id"], body="Thanks")
    assert await decided("AC-14") == ["Cutover day"] and await decided("AC-12") == []


# -- 4. "Change your mind with another reply from someone asked, marked `amend: true`": in the
#        forge, `/answer` names the question it changes --------------------------------------
async def test_change_your_mind_with_another_reply_from_someone_asked_in_the_forge(
        embedded: Embedded, person: Any, tools: Any) -> None:
    marco = person("marco")
    outcome = await make_item(embedded, marco, "outcome", "Launch page",
                              assignees=["scout-bot"])
    repo, n = where(outcome)
    store = embedded.services.store
    scout = tools(SCOUT)
    colour = (await scout("add_comment", targetType="outcome", target=outcome,
                          header="Colour", body="Which colour for the button?",
                          options=[{"label": "Blue"}, {"label": "Green"}],
                          to=["marco@acme.com"]))["comment"]["id"]
    await marco.comment(repo, n, "/answer 1")  # the only question: no need to name it
    await embedded.settle()
    ship = (await scout("add_comment", targetType="outcome", target=outcome,
                        body="When do we ship?", needsReply=True,
                        to=["marco@acme.com"]))["comment"]["id"]

    async def answers(thread: str) -> list[str | None]:
        t = await db.get_thread(store, thread)
        assert t is not None
        said = [t.state.answer, *reversed(t.state.history)]
        return [a.option or a.body for a in said if a is not None]

    # two open questions ask marco: a bare `/answer 2` is refused, saying how to name one
    await marco.comment(repo, n, "/answer 2")
    await embedded.settle()
    assert await answers(ship) == [], "not recorded as the answer to another question"
    assert await answers(colour) == ["Blue"]
    said = (await forge_comments(person("admin"), outcome))[-1]["body"]
    assert "@marco" in said and '"Colour"' in said and "When do we ship?" in said
    assert colour in said and ship in said and "/answer Colour 2" in said

    await marco.comment(repo, n, "/answer Colour 2")  # by its header
    await embedded.settle()
    assert await answers(colour) == ["Green", "Blue"], "the decision changed, history kept"
    assert await answers(ship) == []
    [decision] = [d for d in (await scout("get_outcome", outcome=outcome))["decisions"]]
    assert decision["answer"]["option"] == "Green" and decision["history"][0]["option"] == "Blue"

    await marco.comment(repo, n, f"/answer {ship} Next Tuesday")  # by its comment id
    await marco.comment(repo, n, '/answer "colour": 1')  # a header quoted, any case
    await embedded.settle()
    assert await answers(ship) == ["Next Tuesday"]
    assert await answers(colour) == ["Blue", "Green", "Blue"]
