"""Someone who leaves the office (removed from vaultmail.yml by a push) is asked nothing more:
acted out, lee stayed in `waitingOn` for good, a follow-up's `notify` named lee and its forge
comment rendered the broken mention `@human:lee@acme.com`, and a question asked of lee alone
waited forever, counting against its asker's open-question limits. The same for an agent."""

from __future__ import annotations

import re
from importlib import resources
from typing import Any

from bot.app.embedded import Embedded
from tests.items_support import LEE, MARCO, SARA, SCOUT, forge_comments, make_item

YES_NO = [{"label": "Yes"}, {"label": "No"}]


def _without(*blocks: str) -> str:
    text = resources.files("bot").joinpath("example_office.yml").read_text()
    for block in blocks:
        assert block in text, block
        text = text.replace(block, "")
    return text


LEE_BLOCK = "  - email: lee@acme.com\n    login: lee\n    permissions: []\n"
CRITIC_BLOCK = ("  - slug: critic\n    login: critic-bot\n    person: marco@acme.com\n"
                "    run:\n      triggers: []\n      dispatch: none\n    capabilities:\n"
                "      mail.send: []\n")


def _broken_mentions(body: str) -> list[str]:
    return re.findall(r"@(?:human|agent):\S+", body)


async def test_a_question_asked_of_someone_who_left_goes_back_to_its_asker(
        embedded: Embedded, person: Any, tools: Any) -> None:
    goal = await make_item(embedded, person("sara"), "goal", "EU launch")
    base = {"targetType": "goal", "target": goal}
    sara = tools(SARA)
    asked = await sara("add_comment", **base, header="EU numbers", options=YES_NO,
                       body="Can you check the EU numbers?", to=["lee@acme.com"])
    qid = asked["comment"]["id"]
    both = await sara("add_comment", **base, header="Launch day", needsReply=True,
                      body="Monday or Tuesday?", to=["lee@acme.com", "marco@acme.com"])
    for i in range(3):  # sara's five open questions on the goal: the most one asker may
        await sara("add_comment", **base, body=f"And {i}?", needsReply=True,
                   to=["lee@acme.com"])
    status, err = await sara.raw("add_comment", {**base, "body": "One more?",
                                                 "needsReply": True, "to": ["marco@acme.com"]})
    assert status == 409 and err["error"]["code"] == "too_many_questions", err

    embedded.forge.put_file("acme/.github", "vaultmail.yml", _without(LEE_BLOCK),
                            pusher="admin")
    await embedded.settle()

    # at the config change: nobody waits on lee; a question asked of lee alone is sara's again
    mine = {t["thread"]: t for t in (await sara("list_inbox"))["you"]["yourTurn"]}
    assert qid in mine, "the question lee was asked alone came back to its asker"
    card = mine[qid]
    assert card["waitingOn"] == [SARA] and card["turn"] == "returned", card
    assert "lee has left the office" in card["why"], card
    marco_turn = [t for t in (await tools(MARCO)("list_inbox"))["you"]["yourTurn"]
                  if t["thread"] == both["comment"]["id"]]
    assert [t["waitingOn"] for t in marco_turn] == [[MARCO]], "marco, still asked, stays"
    bodies = [c["body"] for c in await forge_comments(person("admin"), goal)]
    [shown] = [b for b in bodies if "EU numbers" in b]
    assert "lee has left the office" in shown, shown
    assert _broken_mentions("\n".join(bodies)) == [], bodies
    assert "lee@acme.com" not in "\n".join(bodies), "no email on the forge"

    # the limits count only what someone can still answer
    more = await sara("add_comment", **base, body="One more?", needsReply=True,
                      to=["marco@acme.com"])
    assert more["thread"]["waitingOn"] == [MARCO]

    # a reply in a thread lee was in reaches and mentions only those still here
    follow = await sara("add_comment", **base, parent=both["comment"]["id"],
                        body="Lee left; Marco?")
    assert LEE not in {r["principal"] for r in follow["notify"]}, follow["notify"]
    assert LEE not in follow["thread"]["waitingOn"]
    passed = await sara("add_comment", **base, parent=qid, body="Lee left; Marco, can you?",
                        to=["marco@acme.com"])
    assert passed["thread"]["waitingOn"] == [MARCO], passed["thread"]
    assert {r["principal"] for r in passed["notify"]} == {MARCO}, passed["notify"]
    bodies = [c["body"] for c in await forge_comments(person("admin"), goal)]
    assert _broken_mentions("\n".join(bodies)) == [], bodies
    answered = await tools(MARCO)("add_comment", **base, parent=qid, option="Yes")
    assert answered["thread"]["waitingOn"] == [SARA]


async def test_a_question_asked_of_an_agent_that_left_goes_back_to_its_asker(
        embedded: Embedded, person: Any, tools: Any) -> None:
    outcome = await make_item(embedded, person("marco"), "outcome", "Auth",
                              assignees=["scout-bot"])
    base = {"targetType": "outcome", "target": outcome}
    scout = tools(SCOUT)
    asked = await scout("add_comment", **base, header="Logs", needsReply=True,
                        body="Which branch has the logs?", to=["agent:critic"])
    qid = asked["comment"]["id"]
    embedded.forge.put_file("acme/.github", "vaultmail.yml", _without(
        CRITIC_BLOCK, "    critic: {accept: office, otherwise: refuse}\n"), pusher="admin")
    await embedded.settle()
    assert not await embedded.ledger_events("office.config_refused")
    mine = {t["thread"]: t for t in (await scout("list_inbox"))["agents"]["yourTurn"]}
    assert qid in mine and mine[qid]["waitingOn"] == [SCOUT], mine
    assert "critic has left the office" in mine[qid]["why"]
    follow = await scout("add_comment", **base, parent=qid, body="Anyone?")
    assert "agent:critic" not in {r["principal"] for r in follow["notify"]}
    bodies = [c["body"] for c in await forge_comments(person("admin"), outcome)]
    assert _broken_mentions("\n".join(bodies)) == [], bodies
