"""Comments and questions on items, end to end: people in the forge, agents through the tools.

Items are issues labelled goal / outcome / plan / evidence in the vaults of the example office
(marco: editor; scout and critic are marco's agents, builder is sara's; every person has write
access to the vaults, each agent to its own vault only)."""

from __future__ import annotations

import re
from typing import Any

import handlers.items as hi
from bot.app.embedded import Embedded
from bot.items.service import Comments
from bot.store import comments as db
from tests.items_support import (
    BUILDER,
    CRITIC,
    LEE,
    MARCO,
    SARA,
    SCOUT,
    TOKEN_TTL,
    events,
    forge_comments,
    make_item,
    where,
)
from tests.support import ToolClient

BUILDER_VAULT = "acme/builder-vault"


async def test_token_ttl_through_the_tools(embedded: Embedded, person: Any,
                                           tools: Any) -> None:
    outcome = await make_item(embedded, person("marco"), "outcome", "Auth migration",
                              assignees=["scout-bot"])
    scout: ToolClient = tools(SCOUT)
    asked = await scout("add_comment", target=outcome, **TOKEN_TTL)
    qid = asked["comment"]["id"]
    assert asked["thread"]["waitingOn"] == [MARCO]
    assert asked["thread"]["options"][0]["then"].startswith("Add dual-read"), "the asker sees then"
    assert asked["notify"] == [{"principal": MARCO, "way": "personal"}]

    [card] = await forge_comments(person("admin"), outcome)
    assert card["user"]["login"] == "vaultmail[bot]" and "@marco" in card["body"]
    assert "### Token TTL" in card["body"] and "<summary>Context</summary>" in card["body"]
    assert "- [ ] 1. **Keep 30 days** (recommended)" in card["body"]
    assert "dual-read in refreshSession" not in card["body"], "then never reaches the forge"
    assert f"vaultmail:comment id={qid}" in card["body"]

    marco_tools: ToolClient = tools(MARCO)
    turn = (await marco_tools("list_inbox"))["you"]["yourTurn"]
    assert [t["header"] for t in turn] == ["Token TTL"]
    assert (turn[0]["targetType"], turn[0]["target"]) == ("outcome", outcome)
    assert "then" not in turn[0]["options"][0], "then is only for the asker"

    # humanOnly: marco's other agent may relay his answer only once he confirmed it
    critic: ToolClient = tools(CRITIC)
    status, refused = await critic.raw("add_comment", {
        "targetType": "outcome", "target": outcome, "parent": qid, "option": 1})
    assert status == 403 and "confirmedWithPerson" in refused["error"]["message"]
    answered = await critic("add_comment", targetType="outcome", target=outcome, parent=qid,
                            option="Keep 30 days", body="Marco says keep them",
                            confirmedWithPerson=True)
    assert answered["thread"]["answer"]["personsAnswer"] == MARCO
    assert answered["thread"]["waitingOn"] == [SCOUT]

    # the asker gets the answer back, with its `then` and that it was the person's answer
    inbox = (await scout("list_changes"))["inbox"]
    [back] = inbox["yourTurn"]
    assert back["forAgent"] == SCOUT and back["answer"]["option"] == "Keep 30 days"
    assert back["answer"]["confirmedWithPerson"] is True
    assert back["answer"]["then"].startswith("Add dual-read")
    got = await scout("get_outcome", outcome=outcome)
    [decision] = got["decisions"]
    assert decision["header"] == "Token TTL" and decision["decidedBy"] == MARCO
    assert decision["relayedBy"] == CRITIC and decision["answer"]["option"] == "Keep 30 days"
    card_now = (await forge_comments(person("admin"), outcome))[0]["body"]
    assert "- [x] 1. **Keep 30 days**" in card_now and "**Answered**" in card_now

    added = [e.data for e in await events(embedded, "comment.added")]
    assert [d["kind"] for d in added] == ["question", "answer"]
    assert added[0]["needsReply"] is True and added[0]["waitingOn"] == [MARCO]
    assert [o["label"] for o in added[0]["options"]] == ["Keep 30 days", "Force re-login"]
    assert all("then" not in o for d in added for o in d["options"])
    assert added[1]["answers"][0]["option"] == "Keep 30 days" and added[1]["thread"] == qid
    assert added[1]["notify"] == [{"principal": SCOUT, "way": "agents"}]
    changes = await scout("list_changes")
    assert {e["event"] for e in changes["events"]} >= {"comment.added", "comment.answered"}


async def test_token_ttl_through_the_forge_by_ticking_the_card(embedded: Embedded, person: Any,
                                                               tools: Any) -> None:
    marco, lee = person("marco"), person("lee")
    outcome = await make_item(embedded, marco, "outcome", "Auth migration",
                              assignees=["scout-bot"])
    asked = await tools(SCOUT)("add_comment", target=outcome, **TOKEN_TTL)
    [card] = await forge_comments(marco, outcome)
    repo, _ = where(outcome)
    path = f"/repos/{repo}/issues/comments/{card['id']}"

    # lee was not asked: the tick is undone with a note
    await lee.call("PATCH", path, {"body": card["body"].replace("- [ ] 2.", "- [x] 2.")},
                   expect=200)
    await embedded.settle()
    after = await forge_comments(marco, outcome)
    assert after[0]["body"] == card["body"]
    assert "@lee" in after[-1]["body"] and "undone" in after[-1]["body"]

    await marco.call("PATCH", path, {"body": card["body"].replace("- [ ] 2.", "- [x] 2.")},
                     expect=200)
    await embedded.settle()
    card_now = (await forge_comments(marco, outcome))[0]["body"]
    assert "- [x] 2. **Force re-login**" in card_now and "**Answered** by marco" in card_now
    thread = await db.get_thread(embedded.services.store, asked["comment"]["id"])
    assert thread is not None and thread.state.answer is not None
    assert thread.state.answer.by == MARCO and thread.state.answer.option == "Force re-login"
    back = (await tools(SCOUT)("list_inbox"))["agents"]["yourTurn"][0]["answer"]
    assert back["then"].startswith("Invalidate legacy tokens")


async def test_ask_answer_and_resolve_by_hand_in_the_forge(embedded: Embedded,
                                                           person: Any, tools: Any) -> None:
    marco, sara = person("marco"), person("sara")
    goal = await make_item(embedded, marco, "goal", "EU launch")
    repo, n = where(goal)
    await marco.comment(repo, n, "/ask Which currency do we show first? @sara\n"
                                 "header: Currency\n"
                                 "- [ ] EUR (recommended) — most EU buyers\n"
                                 "- [ ] Local currency — more work per country")
    await embedded.settle()
    card = (await forge_comments(marco, goal))[-1]
    assert card["user"]["login"] == "vaultmail[bot]" and "@sara" in card["body"]
    assert "### Currency" in card["body"] and "- [ ] 2. **Local currency**" in card["body"]
    await sara.comment(repo, n, "/answer 2")
    await embedded.settle()
    card = (await forge_comments(marco, goal))[1]
    assert "**Answered** by sara: Local currency" in card["body"]
    await sara.comment(repo, n, "/resolve")
    await embedded.settle()
    assert "no open thread of yours" in (await forge_comments(marco, goal))[-1]["body"]
    await marco.comment(repo, n, "/resolve")
    await embedded.settle()
    assert "*Resolved.*" in (await forge_comments(marco, goal))[1]["body"]
    tree = await tools(SARA)("get_tree", goal=goal)
    [decision] = tree["decisions"]
    assert decision["answer"]["option"] == "Local currency" and decision["decidedBy"] == SARA
    assert decision["resolved"] is True, "decisions stay after the thread is resolved"


async def last_app_comment(person: Any, ref: str) -> str:
    found = [c for c in await forge_comments(person("admin"), ref)
             if c["user"]["login"] == "vaultmail[bot]"]
    return str(found[-1]["body"])


async def unread_ids(tools: Any, principal: str, box: str) -> list[str]:
    got = (await tools(principal)("list_inbox"))[box]["unread"]
    return [c["id"] for c in got]


async def test_every_row_of_the_reach_table_personal_and_through_agents(
        embedded: Embedded, person: Any, tools: Any) -> None:
    marco, sara = person("marco"), person("sara")
    outcome = await make_item(embedded, marco, "outcome", "Checkout", assignees=["scout-bot"])
    _, n = where(outcome)
    plan = await make_item(embedded, sara, "plan", "Plan A", body=f"Part of #{n}")
    bot_plan = await make_item(embedded, person("scout-bot"), "plan", "Plan B",
                               body=f"Part of #{n}")
    evidence = await make_item(embedded, sara, "evidence", "Logs", body=f"Part of #{n}")
    lee: ToolClient = tools("human:lee@acme.com")

    # on a plan a person wrote: its author, personally (mentioned in the forge), and the agent
    # holding the outcome's claim, through marco's agents inbox (marco is never mentioned)
    c = await lee("add_comment", targetType="plan", target=plan, body="Looks thin")
    assert c["notify"] == [{"principal": SARA, "way": "personal"},
                           {"principal": SCOUT, "way": "agents"}]
    text = await last_app_comment(person, plan)
    assert "@sara" in text and "@marco" not in text and "Looks thin" in text
    assert await unread_ids(tools, SARA, "you") == [c["comment"]["id"]]
    assert await unread_ids(tools, MARCO, "agents") == [c["comment"]["id"]]
    assert await unread_ids(tools, MARCO, "you") == []

    # on a plan an agent wrote, on an outcome, on evidence: the claim holder's agent only
    for kind, ref in (("plan", bot_plan), ("outcome", outcome), ("evidence", evidence)):
        c = await lee("add_comment", targetType=kind, target=ref, body=f"On the {kind}")
        assert c["notify"] == [{"principal": SCOUT, "way": "agents"}], kind
        head = (await last_app_comment(person, ref)).split("\n")[1]
        # the agent hears of it by its own account (issue 26); its person is never pinged
        assert "@scout-bot" in head and "@marco" not in head, kind

    # a reply: everyone in the thread (marco wrote in it himself: personally); `to` as well
    root = await lee("add_comment", targetType="outcome", target=outcome, body="Status?")
    await tools(MARCO)("add_comment", targetType="outcome", target=outcome,
                       parent=root["comment"]["id"], body="Soon")
    again = await lee("add_comment", targetType="outcome", target=outcome,
                      parent=root["comment"]["id"], body="Thanks", to=["sara@acme.com"])
    assert {(r["principal"], r["way"]) for r in again["notify"]} == {
        (MARCO, "personal"), (SARA, "personal"), (SCOUT, "agents")}
    text = await last_app_comment(person, outcome)
    assert "@marco" in text and "@sara" in text and f"thread `{root['comment']['id']}`" in text

    # on a goal, only `to`: a team and "me" personally, "agent" through the agent
    goal = await make_item(embedded, marco, "goal", "Launch")
    c = await tools(SCOUT)("add_comment", targetType="goal", target=goal, body="FYI",
                           to=["team:pricing"], cc=["me"])
    assert {(r["principal"], r["way"]) for r in c["notify"]} == {
        (MARCO, "personal"), (SARA, "personal")}
    c = await lee("add_comment", targetType="outcome", target=outcome, body="Yours",
                  to=["agent"])
    assert c["notify"] == [{"principal": SCOUT, "way": "agents"}]


async def test_a_person_writing_a_comment_by_hand_addresses_with_to_lines_and_mentions(
        embedded: Embedded, person: Any, tools: Any) -> None:
    marco = person("marco")
    outcome = await make_item(embedded, marco, "outcome", "Checkout", assignees=["builder-bot"])
    repo, n = where(outcome)
    await marco.comment(repo, n, "to: sara@acme.com\ncc: @lee\n\nCan you check this?")
    await embedded.settle()
    [added] = [e.data for e in await events(embedded, "comment.added")]
    assert {(r["principal"], r["way"]) for r in added["notify"]} == {
        (SARA, "personal"), ("human:lee@acme.com", "personal"), (BUILDER, "agents")}
    [c] = (await tools(SARA)("list_inbox"))["you"]["unread"]
    assert c["body"] == "Can you check this?" and c["author"] == MARCO
    # sara, named by email only, is mentioned by the app so that the forge notifies her
    ping = await last_app_comment(person, outcome)
    assert "@sara" in ping and "@lee" not in ping and "@builder" not in ping
    # a team mention addresses its members (the forge notifies them itself)
    await person("lee").comment(repo, n, "Thoughts, @acme/pricing?")
    await embedded.settle()
    added = (await events(embedded, "comment.added"))[-1].data
    assert {r["principal"] for r in added["notify"]} >= {SARA, MARCO}
    assert await last_app_comment(person, outcome) == ping, "no extra ping for a team mention"


async def test_limits_are_refused_with_a_clear_error(embedded: Embedded, person: Any,
                                                     tools: Any) -> None:
    marco = person("marco")
    outcome = await make_item(embedded, marco, "outcome", "Checkout", assignees=["scout-bot"])
    scout: ToolClient = tools(SCOUT)
    base = {"targetType": "outcome", "target": outcome}

    status, err = await scout.raw("add_comment", {**base, "body": "x" * 10_001})
    assert status == 422 and "at most 10,000" in err["error"]["message"]
    assert (await scout("add_comment", **base, body="x" * 10_000))["comment"]["id"]

    for i in range(5):
        await scout("add_comment", **base, body=f"Question {i}?", needsReply=True,
                    to=["marco@acme.com"])
    status, err = await scout.raw("add_comment", {**base, "body": "Sixth?", "needsReply": True,
                                                  "to": ["marco@acme.com"]})
    assert status == 409 and "5 open questions" in err["error"]["message"]
    assert "resolve" in err["error"]["message"]

    # writing takes contributor access: builder's account may only read scout's vault...
    builder: ToolClient = tools(BUILDER)
    status, err = await builder.raw("add_comment", {**base, "body": "Hello"})
    assert status == 403 and "contributor" in err["error"]["message"]
    assert (await events(embedded, "run.denied"))[-1].actor == BUILDER
    # ...except to reply to a question addressed to it (or to its person)
    q = await tools(MARCO)("add_comment", **base, body="Builder, is the API ready?",
                           needsReply=True, to=["agent:builder"])
    ok = await builder("add_comment", **base, parent=q["comment"]["id"], body="Yes, v2")
    assert ok["thread"]["answer"]["body"] == "Yes, v2"

    # everyone addressed must already see the item: critic's account cannot see this repo
    embedded.forge.add_repo("acme", "secret")
    embedded.forge.set_permission("acme/secret", "marco", "admin")
    hidden = await make_item(embedded, marco, "goal", "Secret", repo="acme/secret")
    status, err = await tools(MARCO).raw("add_comment", {
        "targetType": "goal", "target": hidden, "body": "hi", "to": ["agent:critic"]})
    assert status == 403 and "cannot see" in err["error"]["message"], err

    # 100 open questions in all, and 2,000 comments per item (filled in the index directly)
    store = embedded.services.store
    row = await db.get_thread(store, q["comment"]["id"])
    assert row is not None
    async with store.transaction() as tx:
        for i in range(95):
            await db.put_thread(tx, db.ThreadRow(f"fill{i}", f"acme/other#{i}", "x",
                                                 row.state.__class__.from_json(
                                                     {**row.state.to_json(), "asker": SCOUT}),
                                                 None, None, None, 0.0))
    goal = await make_item(embedded, marco, "goal", "Another")
    status, err = await scout.raw("add_comment", {
        "targetType": "goal", "target": goal, "body": "One more?", "needsReply": True,
        "to": ["marco@acme.com"]})
    assert status == 409 and "100 open questions in all" in err["error"]["message"]
    async with store.transaction() as tx:
        for i in range(2_000):
            await db.put_comment(tx, db.CommentRow(f"bulk{i}", goal, f"bulk{i}", None, MARCO,
                                                   "x", {}, None, 0.0))
    status, err = await tools(MARCO).raw("add_comment", {
        "targetType": "goal", "target": goal, "body": "hi"})
    assert status == 409 and "2,000 comments" in err["error"]["message"]


async def test_a_full_item_still_takes_the_answers_to_its_questions(embedded: Embedded,
                                                                     person: Any,
                                                                     tools: Any) -> None:
    """Anyone a question asks may reply without write access, so someone asked once could
    fill an item to its 2,000 comments and no question on it could be answered. Past the cap
    a question still takes its answer and amends, ANSWERS_PAST_FULL (5) in all, each question
    its own; anything else is refused as before."""
    marco = person("marco")
    goal = await make_item(embedded, marco, "goal", "Full")
    base = {"targetType": "goal", "target": goal}
    marco_t, builder = tools(MARCO), tools(BUILDER)  # builder may only read this vault
    q1 = (await marco_t("add_comment", **base, body="Builder, is the API ready?",
                        needsReply=True, to=["agent:builder"]))["comment"]["id"]
    q2 = (await marco_t("add_comment", **base, body="And its docs?", needsReply=True,
                        to=["agent:builder"]))["comment"]["id"]
    store = embedded.services.store
    async with store.transaction() as tx:  # filled in the index directly
        for i in range(2_000):
            await db.put_comment(tx, db.CommentRow(f"bulk{i}", goal, f"bulk{i}", None, BUILDER,
                                                   "x", {}, None, 0.0))

    async def refused(who: ToolClient, **args: Any) -> None:
        status, err = await who.raw("add_comment", {**base, **args})
        assert status == 409 and err["error"]["code"] == "item_full", err
        assert "2,000 comments" in err["error"]["message"]

    await refused(marco_t, body="One more thing")
    await refused(marco_t, parent=q1, body="Builder?")  # a follow-up is no answer

    answered = await builder("add_comment", **base, parent=q1, body="Yes, v2")
    assert answered["thread"]["answer"]["body"] == "Yes, v2"
    for n in range(4):
        amended = await builder("add_comment", **base, parent=q1, body=f"v{3 + n}", amend=True)
        assert amended["thread"]["answer"]["body"] == f"v{3 + n}"
    await refused(builder, parent=q1, body="v7", amend=True)
    await refused(builder, parent=q1, body="Also, thanks")  # a reply, not an answer
    # the other question is answered all the same, and the forge shows both answers
    assert (await builder("add_comment", **base, parent=q2,
                          body="Half written"))["thread"]["answer"]["body"] == "Half written"
    bodies = [c["body"] for c in await forge_comments(person("admin"), goal)]
    assert any("Yes, v2" in b for b in bodies) and any("Half written" in b for b in bodies)
    assert not any("v7" in b for b in bodies)


async def test_pass_on_amend_and_resolve_rights(embedded: Embedded, person: Any,
                                                tools: Any) -> None:
    marco = person("marco")
    outcome = await make_item(embedded, marco, "outcome", "Pricing", assignees=["scout-bot"])
    scout, marco_t, sara_t = tools(SCOUT), tools(MARCO), tools(SARA)
    base = {"targetType": "outcome", "target": outcome}
    q = await scout("add_comment", **base, body="Discount for schools?",
                    options=[{"label": "Yes, 20%", "then": "add the coupon"},
                             {"label": "No discount"}], to=["marco@acme.com"])
    qid = q["comment"]["id"]

    passed = await marco_t("add_comment", **base, parent=qid, body="Sara owns pricing",
                           to=["sara@acme.com"])
    assert passed["thread"]["waitingOn"] == [MARCO, SARA] and passed["thread"]["answer"] is None
    assert "@sara" in await last_app_comment(person, outcome)
    assert [t["thread"] for t in (await sara_t("list_inbox"))["you"]["yourTurn"]] == [qid]

    answered = await sara_t("add_comment", **base, parent=qid, option=1)
    assert answered["thread"]["answer"]["option"] == "Yes, 20%"
    status, err = await sara_t.raw("resolve_comment", {"comment": qid})
    assert status == 403 and "only the asker" in err["error"]["message"]
    await scout("resolve_comment", comment=qid)
    seen = await scout("list_inbox")  # consume what came back so far
    assert seen["agents"]["yourTurn"] == []

    amended = await sara_t("add_comment", **base, parent=qid, option="No discount",
                           body="Budget got cut", amend=True)
    t = amended["thread"]
    assert t["resolved"] is False and t["answer"]["option"] == "No discount"
    assert [h["option"] for h in t["history"]] == ["Yes, 20%"]
    assert "changed from sara: Yes, 20%" in (await forge_comments(marco, outcome))[0]["body"]
    told = (await scout("list_inbox"))["agents"]
    assert [c["id"] for c in told["unread"]] == [amended["comment"]["id"]]
    assert told["yourTurn"][0]["answer"]["option"] == "No discount", "its turn again"
    decision = (await scout("get_outcome", outcome=outcome))["decisions"][0]
    assert decision["answer"]["option"] == "No discount"
    assert decision["history"][0]["option"] == "Yes, 20%"
    # an editor may resolve someone else's question
    done = await marco_t("resolve_comment", comment=qid)
    assert done["thread"]["resolved"] is True
    assert [e.data["thread"] for e in await events(embedded, "comment.resolved")] == [qid, qid]


async def test_only_those_a_question_asks_pass_it_on(embedded: Embedded, person: Any,
                                                     tools: Any) -> None:
    """Being asked is what lets someone answer, and amend the decision: someone the question
    never asked, who may write on the item, passed it to their own agent, which then changed
    the decision. Only the asker and those asked (or their agents) pass a question on."""
    outcome = await make_item(embedded, person("sara"), "outcome", "Pricing",
                              repo="acme/builder-vault")
    base = {"targetType": "outcome", "target": outcome}
    q = await tools(MARCO)("add_comment", **base, body="Discount?", to=["lee@acme.com"],
                           options=[{"label": "Yes"}, {"label": "No"}])
    qid = q["comment"]["id"]
    await tools(LEE)("add_comment", **base, parent=qid, option="Yes")
    status, err = await tools(SARA).raw("add_comment", {
        **base, "parent": qid, "body": "fyi", "to": ["agent:builder"]})
    assert status == 403 and "only those the question asks" in err["error"]["message"], err
    status, err = await tools(BUILDER).raw("add_comment", {
        **base, "parent": qid, "option": "No", "amend": True})
    assert status == 403, "not asked: no amend"
    decision = (await tools(MARCO)("get_outcome", outcome=outcome))["decisions"][0]
    assert decision["answer"]["option"] == "Yes", decision
    # the asker may still ask someone more, and sara may reply in words
    widened = await tools(MARCO)("add_comment", **base, parent=qid, body="and sara?",
                                 to=["sara@acme.com"])
    assert SARA in widened["thread"]["waitingOn"]


async def test_an_agent_passes_a_question_to_its_person_with_me(embedded: Embedded,
                                                                person: Any,
                                                                tools: Any) -> None:
    outcome = await make_item(embedded, person("sara"), "outcome", "API",
                              assignees=["builder-bot"], repo="acme/builder-vault")
    base = {"targetType": "outcome", "target": outcome}
    q = await tools(MARCO)("add_comment", **base, body="Can we drop v1?", needsReply=True,
                           to=["agent"])
    assert q["thread"]["waitingOn"] == [BUILDER]
    head = (await last_app_comment(person, outcome)).split("\n")[1]
    assert "@builder-bot" in head and "@sara" not in head  # the agent, not its person
    builder = tools(BUILDER)
    passed = await builder("add_comment", **base, parent=q["comment"]["id"],
                           body="Sara decides this", to=["me"])
    assert passed["thread"]["waitingOn"] == [SARA]
    assert "@sara" in await last_app_comment(person, outcome)
    assert [t["thread"] for t in (await tools(SARA)("list_inbox"))["you"]["yourTurn"]] == [
        q["comment"]["id"]]


async def test_get_outcome_lists_decisions_up_the_goals_and_plans_count_for_the_outcome(
        embedded: Embedded, person: Any, tools: Any) -> None:
    marco = person("marco")
    top = await make_item(embedded, marco, "goal", "Grow")
    _, top_n = where(top)
    goal = await make_item(embedded, marco, "goal", "EU", body=f"Part of #{top_n}")
    _, goal_n = where(goal)
    outcome = await make_item(embedded, marco, "outcome", "Prices", body=f"Part of #{goal_n}",
                              assignees=["scout-bot"])
    _, out_n = where(outcome)
    plan = await make_item(embedded, person("scout-bot"), "plan", "Plan",
                           body=f"Part of #{out_n}")
    scout, marco_t = tools(SCOUT), tools(MARCO)

    async def decide(kind: str, ref: str, text: str) -> None:
        q = await scout("add_comment", targetType=kind, target=ref, body=text, needsReply=True,
                        to=["marco@acme.com"])
        await marco_t("add_comment", targetType=kind, target=ref, parent=q["comment"]["id"],
                      body=f"yes to {text}")
        await scout("resolve_comment", comment=q["comment"]["id"])  # used: 5 open at most

    await decide("goal", top, "Grow in 2027?")
    await decide("goal", goal, "EU first?")
    await decide("plan", plan, "Use Stripe?")
    for i in range(11):
        await decide("outcome", outcome, f"Detail {i}?")
    got = await marco_t("get_outcome", outcome=outcome)
    assert len(got["decisions"]) == 10, "the newest 10"
    assert got["decisions"][0]["question"] == "Detail 10?"
    assert "Use Stripe?" not in [d["question"] for d in got["decisions"]], "older than 10"
    assert [(g["ref"], [d["question"] for d in g["decisions"]]) for g in got["goals"]] == [
        (goal, ["EU first?"]), (top, ["Grow in 2027?"])]
    assert got["decisions"][0]["answer"]["body"] == "yes to Detail 10?"
    assert "then" not in got["decisions"][0]
    tree = await marco_t("get_tree", goal=goal)
    assert [d["question"] for d in tree["decisions"]] == ["EU first?"]
    [child] = tree["children"]
    assert child["ref"] == outcome and [c["ref"] for c in child["children"]] == [plan]
    store = embedded.services.store
    plan_scope = [t for t in await db.decisions(store, outcome, limit=20)
                  if t.item == plan]
    assert len(plan_scope) == 1, "a question on a plan counts for its outcome"


async def test_refusals_in_the_forge_get_a_one_line_reply_and_quotes_run_nothing(
        embedded: Embedded, person: Any) -> None:
    outcome = await make_item(embedded, person("marco"), "outcome", "Logs",
                              assignees=["scout-bot"])
    repo, n = where(outcome)
    await person("builder-bot").comment(repo, n, "Can I help?")
    await embedded.settle()
    await person("marco").comment(repo, n, "> /ask Should we?\n> - [ ] Yes\n\nquoted above")
    await embedded.settle()
    comments = await forge_comments(person("admin"), outcome)
    assert len(comments) == 3, "a reply for the refusal, and no card for the quoted /ask"
    assert comments[1]["body"].startswith("@builder-bot")
    assert "contributor" in comments[1]["body"] and "\n" not in comments[1]["body"].strip()


# -- what the app posts for others mentions nobody the reach rules did not choose -------------
LIVE = re.compile(r"(?<![A-Za-z0-9_])@(?P<name>[A-Za-z0-9][A-Za-z0-9-]*(?:/[\w.-]+)?)")


def live_mentions(body: str) -> list[str]:
    """What the forge takes for @mentions (a login or org/team after a non-word character)."""
    return [m["name"] for m in LIVE.finditer(body)]


async def test_mentions_in_text_from_tools_and_commands_are_not_posted_live(
        embedded: Embedded, person: Any, tools: Any) -> None:
    marco = person("marco")
    outcome = await make_item(embedded, marco, "outcome", "Ship v2")
    scout: ToolClient = tools(SCOUT)
    out = await scout("add_comment", targetType="outcome", target=outcome,
                      body="FYI @lee @acme/pricing")
    assert out["notify"] == []
    body = await last_app_comment(person, outcome)
    assert "FYI" in body and live_mentions(body) == [], body
    assert "@\u2060lee @\u2060acme/pricing" in body, "the text still reads the same"

    # a card: only the people the question reaches are mentioned, never those in its text
    await scout("add_comment", targetType="outcome", target=outcome, to=["marco@acme.com"],
                header="Ping @lee?", body="Should I loop in @acme/pricing?",
                context="@sara said so", options=[
                    {"label": "Yes, @lee", "description": "and @acme/pricing"},
                    {"label": "No"}])
    card = await last_app_comment(person, outcome)
    assert "❓" in card and live_mentions(card) == ["marco"], card

    # say(): a refusal quoting what someone wrote mentions only them
    issue = await person("sara").open_issue(BUILDER_VAULT, "Pricing", "talk")
    await embedded.settle()
    await person("sara").comment(BUILDER_VAULT, issue["number"], "/mail @acme/pricing x\nhi")
    await embedded.settle()
    [reply] = [c["body"] for c in await person("admin").comments(BUILDER_VAULT, issue["number"])
               if c["user"]["login"] == "vaultmail[bot]"]
    assert "acme/pricing" in reply and live_mentions(reply) == ["sara"], reply


# -- a retried delivery records a hand-written comment once -----------------------------------


async def test_a_retried_delivery_records_a_hand_written_comment_once(
        embedded: Embedded, person: Any, tools: Any, monkeypatch: Any) -> None:
    """Something failing after Comments.add committed (the ping note's POST) runs the whole
    delivery again: the comment is indexed, delivered and ledgered once; the note posted once."""
    real = hi.ping_addressed
    calls = {"n": 0}

    async def fail_once(*a: Any, **k: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("502 on the ping note")
        await real(*a, **k)

    monkeypatch.setattr(hi, "ping_addressed", fail_once)
    embedded.worker.base_backoff = 0.05
    marco = person("marco")
    outcome = await make_item(embedded, marco, "outcome", "Ship v2")
    repo, n = where(outcome)
    await marco.comment(repo, n, "to: sara@acme.com\nplease review")
    await embedded.settle()
    assert calls["n"] == 2, "the delivery was run again"
    added = await events(embedded, "comment.added")
    assert len(added) == 1, [e.data["comment"] for e in added]
    assert await unread_ids(tools, SARA, "you") == [added[0].data["comment"]]
    pings = [c for c in await forge_comments(person("admin"), outcome)
             if c["user"]["login"] == "vaultmail[bot]"]
    assert len(pings) == 1 and "@sara" in pings[0]["body"]


async def test_a_delivery_retried_after_its_ping_landed_pings_once(
        embedded: Embedded, person: Any, monkeypatch: Any) -> None:
    """The ping note landed, then the delivery failed (its replica stopped before finishing
    it): the retry, which gets the comment as recorded, finds the note and posts no second."""
    real = hi.ping_addressed
    calls = {"n": 0}

    async def fail_after_once(*a: Any, **k: Any) -> None:
        calls["n"] += 1
        await real(*a, **k)
        if calls["n"] == 1:
            raise RuntimeError("stopped after the ping note landed")

    monkeypatch.setattr(hi, "ping_addressed", fail_after_once)
    embedded.worker.base_backoff = 0.05
    marco = person("marco")
    outcome = await make_item(embedded, marco, "outcome", "Ship v3")
    repo, n = where(outcome)
    await marco.comment(repo, n, "to: sara@acme.com\nplease review")
    await embedded.settle()
    assert calls["n"] == 2, "the delivery was run again"
    pings = [c for c in await forge_comments(person("admin"), outcome)
             if c["user"]["login"] == "vaultmail[bot]"]
    assert len(pings) == 1 and "@sara" in pings[0]["body"], [c["id"] for c in pings]


async def test_a_retried_ask_posts_one_card_and_records_once(
        embedded: Embedded, person: Any, monkeypatch: Any) -> None:
    """A crash after the card was posted, before the index: the retry finds the card by its
    marker (the comment id comes from the forge comment's id), and records the question once."""
    real = Comments._commit
    calls = {"n": 0}

    async def crash_once(self: Comments, *a: Any, **k: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("killed before the index write")
        await real(self, *a, **k)

    monkeypatch.setattr(Comments, "_commit", crash_once)
    embedded.worker.base_backoff = 0.05
    marco = person("marco")
    goal = await make_item(embedded, marco, "goal", "EU launch")
    repo, n = where(goal)
    await marco.comment(repo, n, "/ask Which currency first? @sara\n- [ ] EUR\n- [ ] Local")
    await embedded.settle()
    assert calls["n"] == 2
    cards = [c for c in await forge_comments(marco, goal)
             if c["user"]["login"] == "vaultmail[bot]"]
    assert len(cards) == 1, [c["body"] for c in cards]
    [added] = await events(embedded, "comment.added")
    thread = await db.get_thread(embedded.services.store, added.data["thread"])
    assert thread is not None and thread.card_id == cards[0]["id"]


# -- the forge changes a comment after it was indexed -------------------------------------------
async def _inbox_bodies(tools: Any, principal: str) -> list[str]:
    got = await tools(principal)("list_inbox", markRead=False)
    return [c["body"] for c in got["you"]["unread"]]


async def test_a_comment_deleted_on_the_forge_leaves_every_inbox_and_its_ping_says_so(
        embedded: Embedded, person: Any, tools: Any) -> None:
    """Acted out: sara deleted the password she pasted, and marco's inbox still showed it,
    under the app's ping "@marco: @sara's comment above is for you"."""
    sara = person("sara")
    goal = await make_item(embedded, person("marco"), "goal", "EU launch")
    repo, n = where(goal)
    kept = await sara.comment(repo, n, "to: marco@acme.com\nPrices are 10 EUR")
    pasted = await sara.comment(repo, n, "to: marco@acme.com\nthe admin password is hunter2")
    await embedded.settle()
    assert len(await _inbox_bodies(tools, MARCO)) == 2
    await sara.call("DELETE", f"/repos/{repo}/issues/comments/{pasted['id']}", expect=204)
    await embedded.settle()
    assert await _inbox_bodies(tools, MARCO) == ["Prices are 10 EUR"]
    store = embedded.services.store
    gone = await db.comment_by_forge_id(store, int(pasted["id"]), goal)
    assert gone is not None and gone.body == "" and gone.deleted_at is not None
    assert "hunter2" not in str(gone.data), "a tombstone keeps who and when, not the words"
    assert await db.count_comments(store, goal) == 1
    bodies = [c["body"] for c in await forge_comments(sara, goal)]
    assert not any("hunter2" in b for b in bodies)
    [ping] = [b for b in bodies if f"id={gone.id} kind=ping" in b]
    assert "deleted on the forge" in ping and "@marco" not in ping, ping
    other = await db.comment_by_forge_id(store, int(kept["id"]), goal)
    assert other is not None and any(f"id={other.id} kind=ping" in b and "@marco" in b
                                     for b in bodies), "the other comment's ping stays"
    assert [e.data["comment"] for e in await events(embedded, "comment.deleted")] == [gone.id]


async def test_a_deleted_answer_is_withdrawn_and_the_question_waits_again(
        embedded: Embedded, person: Any, tools: Any) -> None:
    """Acted out: sara deleted her `/answer`, and get_tree still gave her decision, the card
    still said "Answered by sara: March"."""
    marco, sara = person("marco"), person("sara")
    goal = await make_item(embedded, marco, "goal", "EU launch")
    repo, n = where(goal)
    await marco.comment(repo, n, "to: sara@acme.com\n/ask Ship in March?\nheader: Ship month\n"
                                 "- [ ] March\n- [ ] April\n")
    await embedded.settle()
    answer = await sara.comment(repo, n, "/answer Ship month 1")
    await embedded.settle()
    [decision] = (await tools(MARCO)("get_tree", goal=goal))["decisions"]
    assert decision["answer"]["option"] == "March"
    await sara.call("DELETE", f"/repos/{repo}/issues/comments/{answer['id']}", expect=204)
    await embedded.settle()
    assert (await tools(MARCO)("get_tree", goal=goal))["decisions"] == []
    card = next(c["body"] for c in await forge_comments(marco, goal)
                if "### Ship month" in c["body"])
    assert "**Answered**" not in card and "Answer withdrawn" in card and "sara again" in card
    assert "withdrawn: sara's answer (March), deleted on the forge" in card
    [waiting] = (await tools(MARCO)("list_inbox", markRead=False))["you"]["waitingOnOthers"]
    assert waiting["waitingOn"] == [SARA] and waiting["answer"] is None
    assert waiting["history"][0]["withdrawn"] is True and waiting["history"][0]["body"] == ""
    turn = (await tools(SARA)("list_inbox", markRead=False))["you"]["yourTurn"]
    assert [t["header"] for t in turn] == ["Ship month"], "it is sara's turn again"
    await sara.comment(repo, n, "/answer Ship month 2")
    await embedded.settle()
    [decision] = (await tools(MARCO)("get_tree", goal=goal))["decisions"]
    assert decision["answer"]["option"] == "April"
    assert decision["history"][0]["withdrawn"] is True


async def test_a_deletion_delivered_before_its_creation_leaves_nothing_indexed(
        embedded: Embedded, person: Any, tools: Any) -> None:
    sara = person("sara")
    goal = await make_item(embedded, person("marco"), "goal", "EU launch")
    repo, n = where(goal)
    forge = embedded.forge
    forge.faults.drop_webhooks(count=1)
    pasted = await sara.comment(repo, n, "to: marco@acme.com\nthe admin password is hunter2")
    await embedded.settle()
    await sara.call("DELETE", f"/repos/{repo}/issues/comments/{pasted['id']}", expect=204)
    await embedded.settle()
    created = next(d for d in forge.state.deliveries.values() if d.event == "issue_comment"
                   and d.action == "created" and d.payload["comment"]["id"] == pasted["id"])
    assert forge.webhooks.redeliver(created) is not None
    await embedded.settle()
    assert await _inbox_bodies(tools, MARCO) == []
    assert not any("@marco" in c["body"] for c in await forge_comments(sara, goal))


async def test_an_edited_comment_reads_as_the_forge_shows_it_and_runs_nothing(
        embedded: Embedded, person: Any, tools: Any) -> None:
    """Acted out: sara changed "10 EUR" to "12 EUR" on the forge, and marco's inbox still
    read 10."""
    sara = person("sara")
    goal = await make_item(embedded, person("marco"), "goal", "EU launch")
    repo, n = where(goal)
    c = await sara.comment(repo, n, "to: marco@acme.com\nPrices are 10 EUR")
    await embedded.settle()
    await sara.call("PATCH", f"/repos/{repo}/issues/comments/{c['id']}",
                    {"body": "to: marco@acme.com\nto: lee@acme.com\nPrices are 12 EUR\n"
                             "/ask Fine?"}, expect=200)
    await embedded.settle()
    [seen] = (await tools(MARCO)("list_inbox", markRead=False))["you"]["unread"]
    assert seen["body"] == "Prices are 12 EUR\n/ask Fine?" and "edited" in seen, seen
    assert (await tools(LEE)("list_inbox"))["you"]["unread"] == [], "an edit addresses no one"
    assert not any("Question" in x["body"] for x in await forge_comments(sara, goal)), \
        "an edit runs no command"


async def test_an_edit_delivered_before_its_creation_is_what_the_index_ends_with(
        embedded: Embedded, person: Any, tools: Any) -> None:
    """Acted out: sara's comment's `created` was lost (redelivered later), her edit "10 EUR"
    -> "12 EUR" came first and found nothing indexed, then the late `created` indexed the
    words of its payload: marco's inbox read 10 EUR though the forge showed 12. The edit's
    words are kept until the comment is indexed: it ends as the forge shows it, marked edited,
    and what the edit added runs nothing and addresses no one (as an edit after it would)."""
    sara = person("sara")
    goal = await make_item(embedded, person("marco"), "goal", "EU launch")
    repo, n = where(goal)
    forge = embedded.forge
    forge.faults.drop_webhooks(count=1)
    c = await sara.comment(repo, n, "to: marco@acme.com\nPrices are 10 EUR")
    await embedded.settle()
    await sara.call("PATCH", f"/repos/{repo}/issues/comments/{c['id']}",
                    {"body": "to: marco@acme.com\nto: lee@acme.com\nPrices are 12 EUR\n"
                             "/ask Fine?"}, expect=200)
    await embedded.settle()
    created = next(d for d in forge.state.deliveries.values() if d.event == "issue_comment"
                   and d.action == "created" and d.payload["comment"]["id"] == c["id"])
    assert forge.webhooks.redeliver(created) is not None
    await embedded.settle()
    [seen] = (await tools(MARCO)("list_inbox", markRead=False))["you"]["unread"]
    assert seen["body"] == "Prices are 12 EUR\n/ask Fine?" and "edited" in seen, seen
    assert (await tools(LEE)("list_inbox"))["you"]["unread"] == [], "an edit addresses no one"
    assert not any("Question" in x["body"] for x in await forge_comments(sara, goal)), \
        "an edit runs no command"


async def test_a_deleted_ask_closes_its_question(
        embedded: Embedded, person: Any, tools: Any) -> None:
    """marco deleted his `/ask` on the forge: the question is withdrawn, its card says so,
    and it waits on no one (Comments.forge_deleted, threads.withdraw). The card kept only
    "Question from marco for @sara", not the header using.md says it keeps: it keeps it."""
    marco = person("marco")
    goal = await make_item(embedded, marco, "goal", "EU launch")
    repo, n = where(goal)
    ask = await marco.comment(repo, n, "to: sara@acme.com\n/ask Ship in March?\n"
                                       "header: Ship month\n- [ ] March\n- [ ] April\n")
    await embedded.settle()
    turn = (await tools(SARA)("list_inbox", markRead=False))["you"]["yourTurn"]
    assert [t["header"] for t in turn] == ["Ship month"]
    await marco.call("DELETE", f"/repos/{repo}/issues/comments/{ask['id']}", expect=204)
    await embedded.settle()
    question = await db.comment_by_forge_id(embedded.services.store, int(ask["id"]), goal)
    assert question is not None and question.deleted_at is not None
    thread = await db.get_thread(embedded.services.store, question.thread)
    assert thread is not None and thread.state.resolved and thread.state.waiting_on == ()
    assert thread.state.question is not None and thread.state.question.body == ""
    assert (await tools(SARA)("list_inbox", markRead=False))["you"]["yourTurn"] == []
    assert (await tools(MARCO)("list_inbox", markRead=False))["you"]["waitingOnOthers"] == []
    [card] = [c["body"] for c in await forge_comments(marco, goal)]
    assert "This question was deleted on the forge." in card and "March" not in card, card
    assert "### Ship month" in card, "its card keeps its header (docs/using.md)"


async def test_amending_to_the_same_answer_changes_nothing_and_says_so(
        embedded: Embedded, person: Any, tools: Any) -> None:
    """marco amended his answer to the option it already was: the history gained "changed
    from marco: Force re-login" to Force re-login, and the asker was told of a change that was
    none. Now it is refused (409 answer_unchanged), nothing written; other words still amend."""
    outcome = await make_item(embedded, person("marco"), "outcome", "Auth",
                              assignees=["scout-bot"])
    base = {"targetType": "outcome", "target": outcome}
    q = await tools(SCOUT)("add_comment", target=outcome, **{
        k: v for k, v in TOKEN_TTL.items() if k != "humanOnly"})
    qid = q["comment"]["id"]
    marco = tools(MARCO)
    await marco("add_comment", **base, parent=qid, option="Force re-login")
    before = await forge_comments(person("admin"), outcome)
    for same in ({"option": 2}, {"option": "force re-login"}):
        status, err = await marco.raw("add_comment", {**base, "parent": qid, "amend": True,
                                                      **same})
        assert status == 409 and err["error"]["code"] == "answer_unchanged", err
        assert "already" in err["error"]["message"] and "Force re-login" in \
            err["error"]["message"], err
    assert await forge_comments(person("admin"), outcome) == before, "nothing written"
    [thread] = [t for t in (await tools(SCOUT)("list_inbox"))["agents"]["yourTurn"]
                if t["thread"] == qid]
    assert thread["history"] == []
    changed = await marco("add_comment", **base, parent=qid, option=2, body="and today",
                          amend=True)
    assert [h["option"] for h in changed["thread"]["history"]] == ["Force re-login"]


async def test_answering_again_on_the_forge_with_the_same_option_says_so_there(
        embedded: Embedded, person: Any) -> None:
    """The tool refuses an amend to the answer one gave already (409 answer_unchanged); on the
    forge, sara's second `/answer 2` must be told so there, as other `/answer` refusals are,
    the answer and its card unchanged (no history of a change that is none)."""
    marco, sara = person("marco"), person("sara")
    goal = await make_item(embedded, marco, "goal", "EU launch")
    repo, n = where(goal)
    await marco.comment(repo, n, "/ask Which currency do we show first? @sara\n"
                                 "header: Currency\n"
                                 "- [ ] EUR (recommended) — most EU buyers\n"
                                 "- [ ] Local currency — more work per country")
    await embedded.settle()
    await sara.comment(repo, n, "/answer 2")
    await embedded.settle()
    card = (await forge_comments(marco, goal))[1]
    await sara.comment(repo, n, "/answer 2")
    await embedded.settle()
    said = await last_app_comment(person, goal)
    assert "already" in said and "Local currency" in said and "nothing changed" in said, said
    assert "amend" not in said.lower(), "the forge has no amend: say what to write there"
    assert (await forge_comments(marco, goal))[1]["body"] == card["body"]
    states = [r["state"] for r in await embedded.services.store.fetchall(
        "SELECT state FROM queue WHERE event='issue_comment'")]
    assert "dead" not in states and "pending" not in states, states


async def test_a_target_of_another_kind_is_named_with_its_article(
        embedded: Embedded, person: Any, tools: Any) -> None:
    """"targetType: acme/scout-vault#1 is a outcome, not a goal": a wrong article."""
    outcome = await make_item(embedded, person("marco"), "outcome", "Auth")
    evidence = await make_item(embedded, person("marco"), "evidence", "Logs")
    for target, kind, said in ((outcome, "goal", "is an outcome, not a goal"),
                               (evidence, "outcome", "is evidence, not an outcome")):
        status, err = await tools(MARCO).raw("add_comment", {
            "targetType": kind, "target": target, "body": "hi"})
        assert status == 422 and said in err["error"]["message"], err
