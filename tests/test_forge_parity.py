"""Issue 26: full parity in the forge for items. Everything `add_comment` does with `parent`,
`to`, `cc`, `header`, `context`, `options` (`then`), `humanOnly` and `confirmedWithPerson`, a
person or an agent can do by writing a comment on the item, and an agent reached through its
person's box hears of it by a mention of its own forge account.

Each test is named after the sentence of seeds/comments-and-inbox.md it acts out, and drives the
app over real HTTP: comments on the local forge as people and agents write them, the tools to
look. The example office: marco is an editor, scout and critic are his agents; sara's is
builder."""

from __future__ import annotations

from typing import Any

from bot.app.embedded import Embedded
from bot.store import comments as db
from tests.items_support import MARCO, SARA, SCOUT, events, forge_comments, make_item, where

YES_NO = [{"label": "Yes"}, {"label": "No"}]


async def _turn_of(tools: Any, principal: str, box: str) -> list[str]:
    return [t["thread"] for t in (await tools(principal)("list_inbox"))[box]["yourTurn"]]


async def _thread(embedded: Embedded, thread: str) -> db.ThreadRow:
    t = await db.get_thread(embedded.services.store, thread)
    assert t is not None
    return t


async def _threads(embedded: Embedded, ref: str) -> list[db.ThreadRow]:
    return await db.open_threads(embedded.services.store, item=ref)


# -- "Pass a question on with a reply addressed to someone else (`to`): "Sara owns pricing".
#     They join the thread and it waits on them too." -------------------------------------------
async def test_pass_a_question_on_with_a_reply_addressed_to_someone_else_in_the_forge(
        embedded: Embedded, person: Any, tools: Any) -> None:
    marco = person("marco")
    outcome = await make_item(embedded, marco, "outcome", "EU prices", assignees=["scout-bot"])
    repo, n = where(outcome)
    q = await tools(SCOUT)("add_comment", targetType="outcome", target=outcome,
                           header="Publish day", body="Which day do we publish?",
                           options=[{"label": "Monday"}, {"label": "Friday"}],
                           to=["marco@acme.com"])
    qid = q["comment"]["id"]
    await marco.comment(repo, n, "to: sara@acme.com\n/reply Publish day Sara owns pricing")
    await embedded.settle()
    assert [t.id for t in await _threads(embedded, outcome)] == [qid], "no new thread"
    t = await _thread(embedded, qid)
    assert SARA in t.state.asked and SARA in t.state.waiting_on, "she joins; it waits on her"
    assert t.state.answer is None
    assert qid in await _turn_of(tools, SARA, "you")
    [passed] = [e for e in await events(embedded, "comment.added") if e.data["thread"] == qid
                and e.data["parent"] == qid]
    assert passed.data["kind"] == "pass_on" and passed.data["to"] == [SARA]
    said = (await forge_comments(person("admin"), outcome))[-1]["body"]
    assert "@sara" in said, "named by email, she is mentioned once by the app"

    # she answers it from the forge like anyone asked
    await person("sara").comment(repo, n, "/answer Publish day 1")
    await embedded.settle()
    t = await _thread(embedded, qid)
    assert t.state.answer is not None and t.state.answer.by == SARA
    assert t.state.answer.option == "Monday"


# -- "An agent hands a question its person must decide to them with `to: ["me"]`." ------------
async def test_an_agent_hands_a_question_its_person_must_decide_to_them_with_to_me_in_the_forge(
        embedded: Embedded, person: Any, tools: Any) -> None:
    outcome = await make_item(embedded, person("marco"), "outcome", "Beta",
                              assignees=["scout-bot"])
    repo, n = where(outcome)
    q = await tools(SARA)("add_comment", targetType="outcome", target=outcome,
                          header="Budget", body="Can we spend 2k on the beta?",
                          needsReply=True, to=["agent"])
    qid = q["comment"]["id"]
    scout_bot = person("scout-bot")
    # as issue 26 found it: `to: me` with `/answer` was recorded as scout's answer
    await scout_bot.comment(repo, n, "to: me\n/answer marco must decide this")
    await embedded.settle()
    t = await _thread(embedded, qid)
    assert t.state.answer is None, "handing it on is no answer"
    assert t.state.waiting_on == (MARCO,), "scout steps out of the turn; it is marco's now"
    assert qid in await _turn_of(tools, MARCO, "you"), "in his own inbox"
    said = (await forge_comments(person("admin"), outcome))[-1]["body"]
    assert "@marco" in said, "and it pings him"

    # `/reply` says the same, on a second question
    q2 = await tools(SARA)("add_comment", targetType="outcome", target=outcome,
                           header="Vendor", body="Which vendor do we sign with?",
                           needsReply=True, to=["agent"])
    await scout_bot.comment(repo, n, "to: me\n/reply Vendor: money, so marco's call")
    await embedded.settle()
    t2 = await _thread(embedded, q2["comment"]["id"])
    assert t2.state.answer is None and t2.state.waiting_on == (MARCO,)


# -- "Your follow-up hands it back to them." -------------------------------------------------
async def test_your_follow_up_hands_it_back_to_them_in_the_forge(
        embedded: Embedded, person: Any, tools: Any) -> None:
    marco, scout_bot = person("marco"), person("scout-bot")
    outcome = await make_item(embedded, marco, "outcome", "Auth", assignees=["scout-bot"])
    repo, n = where(outcome)
    await marco.comment(repo, n, "to: agent:scout\n/ask Which branch is it on?\nheader: Branch")
    await embedded.settle()
    [t] = await _threads(embedded, outcome)
    assert t.state.waiting_on == (SCOUT,)
    await scout_bot.comment(repo, n, "/answer auth-v2")
    await embedded.settle()
    assert (await _thread(embedded, t.id)).state.waiting_on == (MARCO,)
    await marco.comment(repo, n, "/reply Is it rebased on main?")  # his only thread
    await embedded.settle()
    t = await _thread(embedded, t.id)
    assert t.state.waiting_on == (SCOUT,), "the follow-up hands it back"
    assert [e.data["kind"] for e in await events(embedded, "comment.added")] == [
        "question", "answer", "follow_up"]
    await scout_bot.comment(repo, n, "/reply Branch yes, this morning")
    await embedded.settle()
    assert (await _thread(embedded, t.id)).state.waiting_on == (MARCO,), "then his again"
    assert len(await _threads(embedded, outcome)) == 1, "every reply stayed in its thread"


async def test_a_reply_naming_no_thread_among_several_is_refused_saying_which(
        embedded: Embedded, person: Any, tools: Any) -> None:
    marco = person("marco")
    outcome = await make_item(embedded, marco, "outcome", "Two", assignees=["scout-bot"])
    repo, n = where(outcome)
    scout = tools(SCOUT)
    for header in ("Colour", "Size"):
        await scout("add_comment", targetType="outcome", target=outcome, header=header,
                    body=f"Which {header.lower()}?", needsReply=True, to=["marco@acme.com"])
    await marco.comment(repo, n, "/reply ask sara")
    await embedded.settle()
    said = (await forge_comments(person("admin"), outcome))[-1]["body"]
    assert "@marco" in said and '"Colour"' in said and '"Size"' in said and "/reply" in said
    assert all(len(t.state.members) == 2 for t in await _threads(embedded, outcome))


# -- "A `humanOnly` question is theirs: tell them, then reply with what they said and
#     `confirmedWithPerson: true`; the asker sees it was their answer." ------------------------
async def test_a_human_only_question_is_relayed_with_what_they_said_confirmed_in_the_forge(
        embedded: Embedded, person: Any, tools: Any) -> None:
    outcome = await make_item(embedded, person("marco"), "outcome", "Pricing",
                              assignees=["scout-bot"])
    repo, n = where(outcome)
    q = await tools(SARA)("add_comment", targetType="outcome", target=outcome,
                          header="Discount", body="May we give 20% to the pilot?",
                          options=YES_NO, humanOnly=True, to=["marco@acme.com"])
    qid = q["comment"]["id"]
    scout_bot = person("scout-bot")
    await scout_bot.comment(repo, n, "/answer 1")  # no relay: refused, and said so
    await embedded.settle()
    assert (await _thread(embedded, qid)).state.answer is None
    await scout_bot.comment(repo, n, "/answer 1\n/confirmed marco said yes on our call")
    await embedded.settle()
    t = await _thread(embedded, qid)
    assert t.state.answer is not None and t.state.answer.option == "Yes"
    assert t.state.answer.confirmed_with_person and t.state.answer.person == MARCO
    [decision] = (await tools(SARA)("get_outcome", outcome=outcome))["decisions"]
    assert decision["decidedBy"] == MARCO, "the asker sees it was their answer"
    card = next(c["body"] for c in await forge_comments(person("admin"), outcome)
                if f"id={qid} kind=question" in c["body"])
    assert "their person marco's answer" in card

    # `/confirmed <answer>` alone says the same
    q2 = await tools(SARA)("add_comment", targetType="outcome", target=outcome,
                           header="Launch", body="Launch on Monday?", options=YES_NO,
                           humanOnly=True, to=["marco@acme.com"])
    await scout_bot.comment(repo, n, "/confirmed Launch 2")
    await embedded.settle()
    a = (await _thread(embedded, q2["comment"]["id"])).state.answer
    assert a is not None and a.option == "No" and a.confirmed_with_person


# -- The seed's own question, asked in the forge: header, context, options with `then`
#    ("shown only to you, and comes back with the answer") and humanOnly ---------------------
TOKEN_TTL_ASK = (
    "to: marco@acme.com\n"
    "/ask After the auth schema migration, should existing sessions keep working?\n"
    "header: Token TTL\n"
    "human only\n"
    "context: We're changing how sign-in sessions are stored. Today about 40,000 people are\n"
    "signed in. If old sessions keep working, nobody notices the change.\n"
    "\n"
    "- [ ] Keep 30 days (recommended) — Nobody is signed out; we carry dual-read code for a "
    "month. <!-- then: Add dual-read in refreshSession() and a removal task 30 days out. -->\n"
    "- [ ] Force re-login — Everyone signs in again once; the migration ships clean. "
    "<!-- then: Invalidate legacy tokens at cutover and draft the sign-out notice. -->\n")


async def test_then_is_shown_only_to_you_and_comes_back_with_the_answer_when_asked_in_the_forge(
        embedded: Embedded, person: Any, tools: Any) -> None:
    outcome = await make_item(embedded, person("marco"), "outcome", "Auth migration",
                              assignees=["scout-bot"])
    repo, n = where(outcome)
    scout_bot = person("scout-bot")
    asked = await scout_bot.comment(repo, n, TOKEN_TTL_ASK)
    await embedded.settle()
    [t] = await _threads(embedded, outcome)
    q = t.state.question
    assert q is not None and q.header == "Token TTL" and q.human_only
    assert q.context is not None and " ".join(q.context.split()).startswith(
        "We're changing how sign-in sessions are stored. Today about 40,000 people are signed "
        "in. If old sessions")
    assert [(o.label, o.recommended) for o in q.options] == [
        ("Keep 30 days", True), ("Force re-login", False)]
    assert q.options[0].then.startswith("Add dual-read") and \
        q.options[1].then.startswith("Invalidate legacy")
    assert q.options[0].description == "Nobody is signed out; we carry dual-read code for a month."
    admin = person("admin")
    on_forge = "\n".join(c["body"] for c in await forge_comments(admin, outcome))
    assert "dual-read in refreshSession" not in on_forge, "then was moved out of the forge"
    assert "Invalidate legacy" not in on_forge
    mine = next(c for c in await forge_comments(admin, outcome) if c["id"] == asked["id"])
    assert "/ask After the auth schema migration" in mine["body"] and "Keep 30 days" in mine["body"]
    card = next(c["body"] for c in await forge_comments(admin, outcome)
                if "kind=question" in c["body"])
    assert "<summary>Context</summary>" in card and "human only" in card and "@marco" in card
    [added] = await events(embedded, "comment.added")
    assert added.data["humanOnly"] is True and all("then" not in o for o in added.data["options"])

    # marco answers from the forge; scout's answer carries its `then`, marco's view never does
    await person("marco").comment(repo, n, "/answer Token TTL 1")
    await embedded.settle()
    [card_for_scout] = (await tools(SCOUT)("list_inbox"))["agents"]["yourTurn"]
    assert card_for_scout["answer"]["option"] == "Keep 30 days"
    assert card_for_scout["answer"]["then"].startswith("Add dual-read")
    seen_by_marco = (await tools(MARCO)("get_outcome", outcome=outcome))["decisions"]
    assert "then" not in seen_by_marco[0]["answer"]


# -- An agent reached through its person's box hears of it by its own forge account ----------
async def test_an_agent_hears_by_its_own_account_what_reaches_it_through_its_person(
        embedded: Embedded, person: Any, tools: Any) -> None:
    """Seed: agents reached "see it in every tool result"; an agent that reads only its forge
    notifications sees it too: the app mentions its account once (issue 26: the card said
    "for agent:scout" and mentioned no one)."""
    outcome = await make_item(embedded, person("marco"), "outcome", "Search",
                              assignees=["scout-bot"])
    repo, n = where(outcome)
    admin = person("admin")
    await tools(SARA)("add_comment", targetType="outcome", target=outcome, header="Index",
                      body="Which index do we use?", needsReply=True, to=["agent"])
    card = (await forge_comments(admin, outcome))[-1]["body"]
    assert "for @scout-bot" in card and "@marco" not in card, "the agent, never its person"

    # by hand: sara addresses the agent in a `to:` line without mentioning it
    await person("sara").comment(repo, n, "to: agent\nThe staging index is ready")
    await embedded.settle()
    said = await forge_comments(admin, outcome)
    assert "@scout-bot" in said[-1]["body"] and "@marco" not in said[-1]["body"]
    await person("sara").comment(repo, n, "to: agent\n@scout-bot the prod one too")
    await embedded.settle()
    assert len(await forge_comments(admin, outcome)) == len(said) + 1, (
        "mentioned by the writer already: once, so no note from the app")


# -- A whole day of the seed's Token TTL story, the agent acting only by comments ------------
def _card_id(comments: list[dict[str, Any]], header: str) -> str:
    """The thread id as an agent reading the forge finds it: in the card's hidden marker."""
    card = next(c["body"] for c in comments
                if "kind=question" in c["body"] and f"### {header}" in c["body"])
    return card.split("id=", 1)[1].split(" ", 1)[0]


def _pinged(comments: list[dict[str, Any]], since: int) -> list[str]:
    """The accounts the app's notes mentioned in the comments after the first `since`."""
    return [c["body"].split("\n")[1].split(":")[0] for c in comments[since:]
            if "kind=ping" in c["body"]]


async def test_a_day_of_the_token_ttl_story_with_the_agent_acting_only_by_comments(
        embedded: Embedded, person: Any, tools: Any) -> None:
    """scout-bot asks the seed's Token TTL question in the forge; marco passes it on to sara,
    sara answers, scout follows up and hears back, marco changes the decision, scout resolves;
    and sara's humanOnly question to scout goes to marco and comes back relayed. Every act of
    the agent is a comment on the outcome, and every turn that becomes its own reaches its
    forge account by a mention."""
    marco, sara, scout_bot, admin = (person("marco"), person("sara"), person("scout-bot"),
                                     person("admin"))
    outcome = await make_item(embedded, marco, "outcome", "AC-12: Auth schema migration",
                              assignees=["scout-bot"])
    repo, n = where(outcome)

    async def said() -> list[dict[str, Any]]:
        await embedded.settle()
        return await forge_comments(admin, outcome)

    # morning: scout asks, by comment, keeping its `then` out of the forge
    await scout_bot.comment(repo, n, TOKEN_TTL_ASK.replace(
        "to: marco@acme.com\n", "to: marco@acme.com\ncc: sara@acme.com\n"))
    seen = await said()
    ttl = _card_id(seen, "Token TTL")
    card = next(c["body"] for c in seen if f"id={ttl} kind=question" in c["body"])
    assert "for @marco" in card and "cc @sara" in card
    assert "dual-read in refreshSession" not in "\n".join(c["body"] for c in seen)
    assert ttl in await _turn_of(tools, MARCO, "you")

    # marco, on his phone: "Sara owns sign-in"
    before = len(seen)
    await marco.comment(repo, n, "to: sara@acme.com\n/reply Token TTL Sara owns sign-in")
    seen = await said()
    assert _pinged(seen, before) == ["@sara"]
    assert set((await _thread(embedded, ttl)).state.waiting_on) == {MARCO, SARA}

    # sara answers; the turn is scout's, and scout-bot hears of it by its own account
    before = len(seen)
    await sara.comment(repo, n, "/answer Token TTL 2")
    seen = await said()
    assert _pinged(seen, before) == ["@scout-bot"]
    t = await _thread(embedded, ttl)
    assert t.state.answer is not None and (t.state.answer.by, t.state.answer.option) == (
        SARA, "Force re-login")
    assert t.state.waiting_on == (SCOUT,)

    # scout follows up by comment; sara's reply hands it back
    before = len(seen)
    await scout_bot.comment(repo, n, "/reply Token TTL I'll draft the sign-out notice today?")
    seen = await said()
    assert _pinged(seen, before) == ["@sara"], "the follow-up hands it back to her"
    assert (await _thread(embedded, ttl)).state.waiting_on == (SARA,)
    before = len(seen)
    await sara.comment(repo, n, "/reply Token TTL yes please")
    seen = await said()
    assert _pinged(seen, before) == ["@scout-bot"]
    assert (await _thread(embedded, ttl)).state.waiting_on == (SCOUT,)

    # afternoon: sara's humanOnly question to scout is marco's to decide; scout relays it
    await sara.comment(repo, n, "to: agent:scout\n/ask Can the beta take 500 users?\n"
                                "header: Beta size\nhuman only\n- [ ] Yes\n- [ ] No")
    seen = await said()
    beta = _card_id(seen, "Beta size")
    card = next(c["body"] for c in seen if f"id={beta} kind=question" in c["body"])
    assert "for @scout-bot" in card and "@marco" not in card, "the agent, by its account"
    before = len(seen)
    await scout_bot.comment(repo, n, "to: me\n/reply Beta size money: marco decides")
    seen = await said()
    assert _pinged(seen, before) == ["@marco"]
    assert (await _thread(embedded, beta)).state.waiting_on == (MARCO,)
    before = len(seen)
    await scout_bot.comment(repo, n, "/confirmed Beta size 1")  # after asking marco
    seen = await said()
    assert _pinged(seen, before) == ["@sara"]
    a = (await _thread(embedded, beta)).state.answer
    assert a is not None and a.option == "Yes" and a.confirmed_with_person and a.person == MARCO

    # evening: marco changes his mind on Token TTL; scout hears it, acts, resolves
    before = len(seen)
    await marco.comment(repo, n, "/answer Token TTL 1")
    seen = await said()
    assert _pinged(seen, before) == ["@scout-bot"], "the asker is told"
    t = await _thread(embedded, ttl)
    assert t.state.answer is not None and (t.state.answer.by, t.state.answer.option) == (
        MARCO, "Keep 30 days")
    [mine] = [c for c in (await tools(SCOUT)("list_inbox"))["agents"]["yourTurn"]
              if c["thread"] == ttl]
    assert mine["answer"]["then"].startswith("Add dual-read"), "then comes back to scout"
    await scout_bot.comment(repo, n, f"/resolve {ttl}")
    await embedded.settle()
    assert (await _thread(embedded, ttl)).state.resolved
    decided = {d["header"]: (d["decidedBy"], d["answer"]["option"], len(d["history"]))
               for d in (await tools(SARA)("get_outcome", outcome=outcome))["decisions"]}
    assert decided == {"Token TTL": (MARCO, "Keep 30 days", 1),
                       "Beta size": (MARCO, "Yes", 0)}
    kinds = [e.data["kind"] for e in await events(embedded, "comment.added")]
    assert kinds == ["question", "pass_on", "answer", "follow_up", "comment", "question",
                     "pass_on", "answer", "amend"]


async def test_a_relay_refused_on_the_forge_says_what_to_write_there(
        embedded: Embedded, person: Any, tools: Any) -> None:
    """scout's `/answer 1` relaying marco's answer without `/confirmed` was refused in the
    tool's words, "reply with what they said and confirmedWithPerson: true", which the forge
    has no way to write; so too a humanOnly question's refusal, sara's `/answer` to a question
    that does not ask her ("reply with body") and a `/reply` without words ("answer with
    option"). Each refusal a forge command reaches now says what to write on the forge."""
    outcome = await make_item(embedded, person("marco"), "outcome", "Pricing",
                              assignees=["scout-bot"])
    repo, n = where(outcome)
    said = []
    for header, human_only in (("Discount", False), ("Launch", True)):
        await tools(SARA)("add_comment", targetType="outcome", target=outcome, header=header,
                          body=f"{header}?", options=YES_NO, humanOnly=human_only,
                          to=["marco@acme.com"])
    for who, text in (("scout-bot", "/answer Discount 1"), ("scout-bot", "/answer Launch 1"),
                      ("sara", "/answer Discount 2"), ("marco", "/reply Discount")):
        await person(who).comment(repo, n, text)
        await embedded.settle()
        said.append([c["body"] for c in await forge_comments(person("admin"), outcome)
                     if c["user"]["login"] == "vaultmail[bot]"][-1])
    assert all(t.state.answer is None for t in await _threads(embedded, outcome))
    for line in said:
        assert not any(w in line for w in ("confirmedWithPerson", "with body", "with option",
                                           '["me"]')), line
    assert "/confirmed" in said[0] and "/confirmed" in said[1] and "to: me" in said[1], said
    assert "in words" in said[2] and "/reply" in said[3], said
