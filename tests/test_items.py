"""The sans-I/O core of items: kinds, parents, claims, reach, questions, threads, rendering."""

from __future__ import annotations

import re
from typing import Any

import pytest

from bot.errors import Conflict, Denied, InvalidArguments
from bot.items.address import (
    Reached,
    Table,
    audience,
    check_addressed,
    resolve,
    table_reach,
)
from bot.items.model import item_from_issue, parent_of
from bot.items.questions import validate_question
from bot.items.render import (
    mentions,
    parse_addressing,
    parse_ask,
    render_card,
    render_comment,
    ticked_option,
)
from bot.items.threads import ThreadState, may_answer, may_resolve, reply, start
from bot.mail.markdown import defuse_mentions
from bot.office.config import load_office, parse_office

OFFICE = load_office()
MARCO, SARA, LEE = "human:marco@acme.com", "human:sara@acme.com", "human:lee@acme.com"
SCOUT, BUILDER, CRITIC = "agent:scout", "agent:builder", "agent:critic"


def issue(number: int, labels: list[str], body: str = "", user: str = "marco",
          assignees: list[str] | None = None) -> dict[str, Any]:
    return {"number": number, "title": f"#{number}", "body": body, "state": "open",
            "user": {"login": user}, "labels": [{"name": n} for n in labels],
            "assignees": [{"login": a} for a in assignees or []]}


# -- items ---------------------------------------------------------------------------------
def test_item_kind_parent_author_and_claim_come_from_the_issue() -> None:
    outcome = item_from_issue(OFFICE, "Acme/Scout-Vault",
                              issue(3, ["outcome", "bug"], "Part of #1", "sara",
                                    ["lee", "builder-bot"]))
    assert outcome is not None and outcome.ref == "acme/scout-vault#3"
    assert outcome.kind == "outcome" and outcome.parent == "acme/scout-vault#1"
    assert outcome.author == SARA and outcome.claim == BUILDER, "the assigned agent holds it"
    assert item_from_issue(OFFICE, "acme/x", issue(4, ["bug"])) is None
    plan = item_from_issue(OFFICE, "acme/x", issue(5, ["plan"], user="builder-bot"))
    assert plan is not None and plan.author == BUILDER and plan.claim is None


def test_parent_by_part_of_across_repos_or_by_sub_issue_link() -> None:
    assert parent_of("acme/a", {"body": "Some text.\nPart of acme/goals#12"}) == "acme/goals#12"
    assert parent_of("acme/a", {"body": "This is part of #7."}) == "acme/a#7"
    linked = {"body": "", "parent_issue_url": "http://f/api/v3/repos/acme/b/issues/9"}
    assert parent_of("acme/a", linked) == "acme/b#9"
    assert parent_of("acme/a", {"body": "no parent"}) is None


# -- reach: every row of the table ------------------------------------------------------------
def ways(reached: list[Reached]) -> dict[str, str]:
    return {r.principal: r.way for r in reached}


def test_on_a_plan_the_plans_author_personally_if_they_wrote_it_themselves() -> None:
    rows = table_reach(Table("plan", plan_author=SARA, claim=None))
    assert ways(audience(OFFICE, author=MARCO, candidates=rows)) == {SARA: "personal"}


def test_on_a_plan_an_agent_wrote_its_person_is_reached_through_the_agent() -> None:
    rows = table_reach(Table("plan", plan_author=BUILDER, claim=None))
    assert ways(audience(OFFICE, author=MARCO, candidates=rows)) == {BUILDER: "agents"}


@pytest.mark.parametrize("kind", ["outcome", "plan", "evidence"])
def test_on_an_outcome_its_plan_or_evidence_the_claim_holders_agent(kind: str) -> None:
    rows = table_reach(Table(kind, plan_author=None, claim=SCOUT))
    assert ways(audience(OFFICE, author=SARA, candidates=rows)) == {SCOUT: "agents"}


def test_a_goal_reaches_only_whom_the_comment_addresses() -> None:
    assert table_reach(Table("goal", plan_author=None, claim=SCOUT)) == []


def test_a_reply_reaches_everyone_in_the_thread_and_to_as_well() -> None:
    state = start(SCOUT, question=None, to=[], cc=[],
                  reached=[Reached(BUILDER, "agents")])
    state, kind = reply(state, OFFICE, SARA, comment="c2", at=1.0, body="me too",
                        option=None, amend=False, confirmed=False, to=[], cc=[])
    assert kind == "comment"
    to = resolve(OFFICE, ["lee@acme.com"], author=MARCO, claim=None, field="to")
    state, _ = reply(state, OFFICE, MARCO, comment="c3", at=2.0, body="lee?", option=None,
                     amend=False, confirmed=False, to=to, cc=[])
    members = [Reached(p, w) for p, w in state.members.items()]
    # sara wrote herself (personal), lee is addressed (personal); builder and scout are
    # reached through their agents' inboxes
    assert ways(audience(OFFICE, author=MARCO, candidates=members)) == {
        SARA: "personal", LEE: "personal", SCOUT: "agents", BUILDER: "agents"}


def test_the_author_never_reaches_themselves_nor_an_agent_its_person_unasked() -> None:
    candidates = [Reached(SCOUT, "agents"), Reached(CRITIC, "agents"),
                  Reached(MARCO, "personal"), Reached(BUILDER, "agents")]
    assert ways(audience(OFFICE, author=SCOUT, candidates=candidates)) == {
        CRITIC: "agents", BUILDER: "agents"}
    assert ways(audience(OFFICE, author=SCOUT, candidates=candidates,
                         explicit=[MARCO])) == {
        MARCO: "personal", CRITIC: "agents", BUILDER: "agents"}, 'cc: ["me"]'


def test_to_and_cc_take_emails_teams_agent_and_me() -> None:
    got = resolve(OFFICE, ["Marco@Acme.com", "team:pricing", "agent", "agent:critic"],
                  author=SCOUT, claim=BUILDER, field="to")
    assert ways(got) == {MARCO: "personal", SARA: "personal", BUILDER: "agents",
                         CRITIC: "agents"}
    assert ways(resolve(OFFICE, ["me"], author=SCOUT, claim=None, field="cc")) == {
        MARCO: "personal"}
    for bad, why in ((["me"], "person of the agent"), (["agent"], "claim"),
                     (["team:nope"], "teams: pricing"), (["nobody@x.com"], "not anyone")):
        with pytest.raises(InvalidArguments, match=why):
            resolve(OFFICE, bad, author=MARCO, claim=None, field="to")


def test_at_most_twenty_people_are_addressed() -> None:
    humans = [{"email": f"p{i}@acme.com", "login": f"p{i}"} for i in range(21)]
    big = parse_office(__import__("yaml").safe_dump({"org": "acme", "humans": humans,
                                                      "teams": {"all": [h["email"]
                                                                        for h in humans]}}),
                       repository=False)
    everyone = resolve(big, ["team:all"], author="human:p0@acme.com", claim=None, field="to")
    with pytest.raises(InvalidArguments, match="at most 20"):
        check_addressed(everyone)
    check_addressed(everyone[:20])


# -- questions ---------------------------------------------------------------------------
def opts(*labels: str, **extra: Any) -> list[dict[str, Any]]:
    return [{"label": label, **extra} for label in labels]


@pytest.mark.parametrize(("kwargs", "why"), [
    ({"options": opts("a", "b", "c", "d", "e")}, "at most 4"),
    ({"options": opts("one two three four five six")}, "1 to 5 words"),
    ({"options": opts("x" * 61)}, "at most 60"),
    ({"options": opts("   ")}, "1 to 5 words"),
    ({"options": opts("Other")}, "reply in words"),
    ({"options": opts("Other (say which)")}, "reply in words"),
    ({"options": [{"label": "a", "recommended": True}, {"label": "b", "recommended": True}]},
     "at most one"),
    ({"needs_reply": True, "header": "h" * 41}, "at most 40"),
    ({"needs_reply": True, "context": "c" * 4001}, "at most 4000"),
    ({"header": "Token TTL"}, "only a question"),
    ({"options": opts("a", "A")}, "same label"),
])
def test_every_question_rule_is_refused_with_the_reason(kwargs: dict[str, Any], why: str) -> None:
    args: dict[str, Any] = {"needs_reply": False, "options": None, "header": None,
                            "human_only": False, "context": None, **kwargs}
    with pytest.raises(InvalidArguments, match=why):
        validate_question("Which?", **args)


def test_a_plain_comment_is_no_question_and_options_make_one() -> None:
    assert validate_question("hi", needs_reply=False, options=None, header=None,
                             human_only=False, context=None) is None
    q = validate_question("Which?", needs_reply=False, options=opts("Keep 30 days", "Force"),
                          header="Token TTL", human_only=True, context="c" * 4000)
    assert q is not None and q.option_index("keep 30 DAYS") == 0 and q.option_index(2) == 1
    with pytest.raises(InvalidArguments, match="not one of"):
        q.option_index("maybe")


# -- threads -------------------------------------------------------------------------------
def question(to: list[str], *, asker: str = SCOUT, human_only: bool = False) -> ThreadState:
    q = validate_question("Which?", needs_reply=False, options=opts("Keep", "Drop"),
                          header=None, human_only=human_only, context=None)
    return start(asker, question=q, to=resolve(OFFICE, to, author=asker, claim=BUILDER,
                                               field="to"), cc=[], reached=[])


def say(state: ThreadState, who: str, *, body: str = "", option: int | None = None,
        amend: bool = False, confirmed: bool = False,
        to: list[str] | None = None) -> tuple[ThreadState, str]:
    added = resolve(OFFICE, to or [], author=who, claim=BUILDER, field="to")
    return reply(state, OFFICE, who, comment=f"c-{who}", at=5.0, body=body, option=option,
                 amend=amend, confirmed=confirmed, to=added, cc=[])


def test_waiting_on_follows_whose_turn_it_is() -> None:
    s = question(["marco@acme.com"])
    assert s.waiting_on == (MARCO,)
    s, kind = say(s, MARCO, body="Keep them", option=0)
    assert kind == "answer" and s.waiting_on == (SCOUT,) and s.answer is not None
    assert s.answer.option == "Keep"
    s, kind = say(s, SCOUT, body="For all tenants?")
    assert kind == "follow_up" and s.waiting_on == (MARCO,), "the follow-up hands it back"
    with pytest.raises(Conflict, match="amend"):
        say(s, MARCO, option=1)


def test_a_reply_to_someone_else_passes_the_question_on() -> None:
    s = question(["marco@acme.com"])
    s, kind = say(s, MARCO, body="Sara owns pricing", to=["sara@acme.com"])
    assert kind == "pass_on" and s.answer is None
    assert s.waiting_on == (MARCO, SARA) and SARA in s.asked and s.members[SARA] == "personal"
    s, kind = say(s, SARA, option=1)
    assert kind == "answer" and s.answer is not None and s.answer.by == SARA


def test_an_agent_hands_a_question_to_its_person_with_me() -> None:
    s = question(["agent"])  # the claim holder: builder
    assert s.waiting_on == (BUILDER,)
    s, kind = say(s, BUILDER, body="Sara decides this", to=["me"])
    assert kind == "pass_on" and s.waiting_on == (SARA,)


def test_amend_changes_the_decision_keeps_history_and_reopens() -> None:
    s = question(["marco@acme.com"])
    s, _ = say(s, MARCO, option=0)
    s = ThreadState.from_json({**s.to_json(), "resolved": True})
    with pytest.raises(Denied):
        say(s, SARA, option=1, amend=True)
    s, kind = say(s, MARCO, option=1, body="Changed my mind", amend=True)
    assert kind == "amend" and not s.resolved and s.waiting_on == (SCOUT,)
    assert s.answer is not None and s.answer.option == "Drop"
    assert [a.option for a in s.history] == ["Keep"]


def test_human_only_needs_the_persons_confirmation_from_an_agent() -> None:
    s = question(["marco@acme.com"], asker=BUILDER, human_only=True)
    assert may_answer(s, OFFICE, SCOUT, confirmed=True), "marco's agent may relay his answer"
    assert not may_answer(s, OFFICE, SCOUT), "but its own word is no answer"
    with pytest.raises(Denied, match="confirmedWithPerson"):
        say(s, SCOUT, option=0)
    s, kind = say(s, SCOUT, option=0, confirmed=True)
    assert kind == "answer" and s.answer is not None
    assert s.answer.confirmed_with_person and s.answer.person == MARCO


def test_only_its_asker_or_an_editor_resolves_a_question() -> None:
    s = question(["sara@acme.com"])
    assert may_resolve(s, OFFICE, SCOUT, editor=False)
    assert not may_resolve(s, OFFICE, MARCO, editor=False), "scout's person did not ask it"
    assert not may_resolve(s, OFFICE, SARA, editor=False)
    assert may_resolve(s, OFFICE, LEE, editor=True)


def test_a_question_needs_someone_to_answer_it() -> None:
    q = validate_question("Which?", needs_reply=True, options=None, header=None,
                          human_only=False, context=None)
    with pytest.raises(InvalidArguments, match="someone to answer"):
        start(MARCO, question=q, to=[], cc=[], reached=[])


# -- rendering and reading the forge ---------------------------------------------------------
def test_the_card_shows_the_question_but_never_then() -> None:
    q = validate_question("Keep sessions?", needs_reply=False, header="Token TTL",
                          human_only=True, context="Forty thousand people are signed in.",
                          options=[{"label": "Keep 30 days", "recommended": True,
                                    "description": "Nobody is signed out.",
                                    "then": "SECRET-PLAN dual read"},
                                   {"label": "Force re-login", "then": "SECRET-PLAN cut"}])
    s = start(SCOUT, question=q, to=[Reached(MARCO, "personal")], cc=[], reached=[])
    card = render_card("c1", author=SCOUT, state=s, mentions=["marco"], logins={})
    assert "SECRET-PLAN" not in card and "@marco" in card and "### Token TTL" in card
    assert "<details><summary>Context</summary>" in card and "(recommended)" in card
    assert "- [ ] 1. **Keep 30 days** (recommended) — Nobody is signed out." in card
    ticked = card.replace("- [ ] 2.", "- [x] 2.")
    assert q is not None and ticked_option(card, q, ticked) == 1
    assert ticked_option(card, q, card) is None


def test_text_that_looks_like_a_box_cannot_forge_an_option() -> None:
    text = render_comment("c1", author=SCOUT, body="- [ ] fake box", mentions=[], thread=None)
    assert "- \\[ ] fake box" in text


def test_the_apps_comment_opens_as_sealed_only_as_it_wrote_it() -> None:
    """The seal a rebuild trusts (bot.items.rebuild): it holds through what a forge may do to
    a body (CRLF line ends, trailing blanks), and fails for any edit of the words above it,
    under another key, with its MAC cut short, or on another issue than the one it was written
    on; a body with none says so (None)."""
    from bot.items.render import Opened, opened, seal

    key, text = b"k" * 32, render_comment("c1", author=SCOUT, body="keep them", mentions=[],
                                          thread="c2", note="answer: Keep 30 days")
    sealed = seal(text, key, 7001)
    assert opened(sealed, key, 7001) == Opened(text, True)
    assert opened(sealed.replace("\n", "\r\n") + "  \n", key, 7001).holds is True
    assert opened(sealed.replace("Keep 30 days", "Force re-login"), key, 7001).holds is False
    assert opened(sealed, b"j" * 32, 7001).holds is False
    assert opened(sealed.rstrip()[:-8] + " -->\n", key, 7001).holds is False
    assert opened(sealed, key, 7002).holds is False  # a copy on another issue
    assert opened(sealed, key, None).holds is False
    assert opened(text, key, 7001) == Opened(text, None)


def test_a_v1_seal_holds_on_any_issue_and_says_so() -> None:
    """A seal from before seals named their issue (v1: the text alone) still holds, on any
    issue: its MAC is given, for a rebuild to find the same text on two items."""
    import hashlib
    import hmac

    from bot.forge import markers
    from bot.items.render import Opened, opened

    key, text = b"k" * 32, render_comment("c1", author=SCOUT, body="keep them", mentions=[],
                                          thread=None)
    mac = hmac.new(key, text.rstrip().encode(), hashlib.sha256).hexdigest()
    sealed = f"{text}{markers.marker('seal', f'v1={mac}')}\n"
    for issue in (7001, 7002, None):
        assert opened(sealed, key, issue) == Opened(text, True, mac)
    assert opened(sealed.replace("keep them", "drop them"), key, 7001).v1 is None


# What the forge takes for a mention: `@` after no letter/digit/underscore, then a letter/digit.
LIVE = re.compile(r"(?<![A-Za-z0-9_])@(?P<name>[A-Za-z0-9][A-Za-z0-9-]*(?:/[\w.-]+)?)")


def live(text: str) -> list[str]:
    return [m["name"] for m in LIVE.finditer(text)]


def test_defuse_mentions_leaves_no_mention_and_keeps_the_text() -> None:
    text = ("FYI @lee @acme/pricing (@sara) x.@marco\n> @quoted `@code` &#64;ent &commat;ent2 "
            "@&#108;ee mail me@acme.com or @ alone")
    out = defuse_mentions(text)
    assert live(out) == [] and "&#64;" not in out and "&commat;" not in out
    assert out.replace("\u2060", "").replace("@ent", "&#64;ent", 1) \
        .replace("@ent2", "&commat;ent2", 1) == text, "only invisible joiners are added"
    assert "me@acme.com" in out and "@ alone" in out
    assert defuse_mentions(out) == out


def test_text_from_others_is_posted_without_live_mentions() -> None:
    q = validate_question("Ask @lee? cc @acme/pricing", needs_reply=False,
                          header="For @lee", human_only=False, context="see @sara",
                          options=[{"label": "Ping @lee", "description": "and @acme/pricing"},
                                   {"label": "No"}])
    s = start(SCOUT, question=q, to=[Reached(MARCO, "personal")], cc=[], reached=[])
    card = render_card("c1", author=SCOUT, state=s, mentions=["marco"], logins={})
    assert live(card) == ["marco"], "only the app's own mention list is live"
    assert q is not None and ticked_option(card, q, card.replace("- [ ] 1.", "- [x] 1.")) == 0
    answered, _ = reply(s, OFFICE, MARCO, comment="c2", at=1.0, body="ask @lee", option=0,
                        amend=False, confirmed=False, to=[], cc=[])
    card = render_card("c1", author=SCOUT, state=answered, mentions=["marco"], logins={})
    assert live(card) == ["marco"]
    text = render_comment("c3", author=SCOUT, body="FYI @lee @acme/pricing", mentions=["sara"],
                          thread="c1", note="answer: @lee")
    assert live(text) == ["sara"]


def test_to_and_cc_lines_at_the_top_and_mentions_address_a_comment() -> None:
    got = parse_addressing("to: sara@acme.com, team:pricing\ncc: @lee\n\nHi @marco and "
                           "@acme/pricing, not `@quoted` nor me@mail.com\n> @quoted too")
    assert got.to == ["sara@acme.com", "team:pricing", "@marco", "@acme/pricing"]
    assert got.cc == ["@lee"] and got.body.startswith("Hi @marco")
    assert mentions("```\n@fenced\n```\n@real") == ["real"]
    # Gitea's logins hold '.' and '_'; a sentence's full stop is not part of a name
    assert mentions("Ask @john.doe and @ann_lee. Then @sara.") == ["john.doe", "ann_lee", "sara"]


def test_ask_reads_options_and_the_recommended_one() -> None:
    ask = parse_ask("Keep existing sessions?", "header: Token TTL\n"
                    "- [ ] Keep 30 days (recommended) — Nobody is signed out\n"
                    "- [ ] Force re-login - Everyone signs in again")
    assert ask.body == "Keep existing sessions?" and ask.header == "Token TTL"
    assert ask.options == [
        {"label": "Keep 30 days", "description": "Nobody is signed out", "recommended": True},
        {"label": "Force re-login", "description": "Everyone signs in again",
         "recommended": False}]
