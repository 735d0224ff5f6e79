"""Someone who leaves the office (removed from vaultmail.yml by a push) is asked nothing more:
acted out, lee stayed in `waitingOn` for good, a follow-up's `notify` named lee and its forge
comment rendered the broken mention `@human:lee@acme.com`, and a question asked of lee alone
waited forever, counting against its asker's open-question limits. The same for an agent."""

from __future__ import annotations

import asyncio
import copy
import re
import threading
import time
from importlib import resources
from typing import Any

import pytest

from bot.app.embedded import Embedded
from bot.app.services import Services
from bot.forge.github import ForgeClient
from bot.items.threads import ThreadState
from bot.office import source
from bot.office.source import OfficeSource
from bot.store import comments, members, open_store
from bot.store.db import Store
from tests.items_support import LEE, MARCO, SARA, SCOUT, forge_comments, make_item
from tests.test_stalled_send import GUARD

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


# The sweep at the config change, on two replicas (its own index connection and config reads
# each, as `tests/test_mail_races.py`'s): exactly once and complete.
PATCH_COMMENT = "PATCH /repos/{owner}/{repo}/issues/comments/{comment_id}"
POST_COMMENT = "POST /repos/{owner}/{repo}/issues/{issue_number}/comments"


def _replica(embedded: Embedded, store: Store, offices: OfficeSource | None = None) -> Services:
    """Another replica, just started: its own index connection and forge client (its own
    write turns), no config read yet (`offices`: its config source, when not a plain one)."""
    replica = copy.copy(embedded.services)
    replica.store = store
    client = replica.forge_client
    assert isinstance(client, ForgeClient)
    replica.forge_client = ForgeClient(client.auth, client.session, client.api_url,
                                       client.requester, config=client.config)
    replica.offices = offices or OfficeSource()
    replica.offices.on_read = replica._config_taken
    return replica


async def _thread(embedded: Embedded, qid: str) -> ThreadState:
    t = await comments.get_thread(embedded.services.store, qid)
    assert t is not None
    return t.state


async def test_a_sweep_cut_off_part_way_is_finished_by_the_next_read(
        embedded: Embedded, person: Any, tools: Any, database_url: str) -> None:
    """Replica a records that lee left and starts sending lee's questions back; it is cut off
    at the first card (held at the forge: a crash, a forge that does not answer). Replica b,
    started then, reads the config: the rest of the sweep is b's. a, let go late, writes
    nothing twice."""
    goal = await make_item(embedded, person("sara"), "goal", "EU launch")
    base = {"targetType": "goal", "target": goal}
    sara = tools(SARA)
    qids = [(await sara("add_comment", **base, header=f"Q{i}", needsReply=True,
                        body=f"Lee, {i}?", to=["lee@acme.com"]))["comment"]["id"]
            for i in range(2)]
    # (no pusher: no webhook; each replica reads the config itself)
    embedded.forge.put_file("acme/.github", "vaultmail.yml", _without(LEE_BLOCK))
    index = database_url or str(embedded.data_dir / "index.sqlite3")
    a_store, b_store = await open_store(index), await open_store(index)
    a, b = _replica(embedded, a_store), _replica(embedded, b_store)
    held = embedded.forge.faults.hold(PATCH_COMMENT, count=1)
    cut = asyncio.create_task(a.offices.get(a.forge_for_org("acme"), "acme", fresh=True))
    try:
        await asyncio.wait_for(held.arrived.wait(), GUARD)  # a: part-way
        await asyncio.wait_for(b.offices.get(b.forge_for_org("acme"), "acme", fresh=True),
                               GUARD)
        for qid in qids:
            state = await _thread(embedded, qid)
            assert (state.waiting_on, state.left) == ((SARA,), {LEE: "lee"}), (qid, state)
        held.release()
        await asyncio.wait_for(cut, GUARD)
    finally:
        held.release()
        cut.cancel()
        await a_store.close()
        await b_store.close()
    bodies = [c["body"] for c in await forge_comments(person("admin"), goal)]
    for i in range(2):
        [card] = [b for b in bodies if f"Lee, {i}?" in b]
        assert "lee has left the office" in card, card
    for qid in qids:
        assert (await _thread(embedded, qid)).waiting_on == (SARA,)


async def test_a_question_asked_of_someone_as_they_leave_goes_back_and_then_is_refused(
        embedded: Embedded, person: Any, tools: Any, database_url: str) -> None:
    """sara asks lee through a replica that still has the config naming lee; the question is
    at the forge (its card held) while replica b records that lee left and sweeps: it is
    indexed after the sweep, and goes back to sara all the same. Asked again through that
    replica, lee is refused: lee has left the office."""
    goal = await make_item(embedded, person("sara"), "goal", "EU launch")
    base = {"targetType": "goal", "target": goal}
    sara = tools(SARA)
    embedded.forge.put_file("acme/.github", "vaultmail.yml", _without(LEE_BLOCK))
    index = database_url or str(embedded.data_dir / "index.sqlite3")
    b_store = await open_store(index)
    b = _replica(embedded, b_store)
    held = embedded.forge.faults.hold(POST_COMMENT, count=1)
    asking = asyncio.create_task(sara("add_comment", **base, header="EU", needsReply=True,
                                      body="Lee, EU?", to=["lee@acme.com"]))
    try:
        await asyncio.wait_for(held.arrived.wait(), GUARD)  # checked, at the forge
        await b.offices.get(b.forge_for_org("acme"), "acme", fresh=True)
        held.release()
        asked = await asyncio.wait_for(asking, GUARD)
    finally:
        held.release()
        await b_store.close()
    state = await _thread(embedded, asked["comment"]["id"])
    assert (state.waiting_on, state.left) == ((SARA,), {LEE: "lee"}), state
    status, err = await sara.raw("add_comment", {**base, "header": "Again", "needsReply": True,
                                                 "body": "Lee?", "to": ["lee@acme.com"]})
    assert status == 422 and err["error"]["code"] == "invalid_arguments", err
    assert "lee has left the office" in err["error"]["message"], err


async def test_an_answer_given_while_the_sweep_is_at_the_forge_is_kept(
        embedded: Embedded, person: Any, tools: Any, database_url: str) -> None:
    """The sweep takes lee off a question asked of lee and marco; while its card is at the
    forge (held), marco answers. The sweep's write comes after the answer and keeps it."""
    goal = await make_item(embedded, person("sara"), "goal", "EU launch")
    base = {"targetType": "goal", "target": goal}
    asked = await tools(SARA)("add_comment", **base, header="Day", options=YES_NO,
                              body="Monday?", to=["lee@acme.com", "marco@acme.com"])
    qid = asked["comment"]["id"]
    embedded.forge.put_file("acme/.github", "vaultmail.yml", _without(LEE_BLOCK))
    index = database_url or str(embedded.data_dir / "index.sqlite3")
    a_store = await open_store(index)
    a = _replica(embedded, a_store)
    held = embedded.forge.faults.hold(PATCH_COMMENT, count=1)
    sweep = asyncio.create_task(a.offices.get(a.forge_for_org("acme"), "acme", fresh=True))
    try:
        await asyncio.wait_for(held.arrived.wait(), GUARD)
        await tools(MARCO)("add_comment", **base, parent=qid, option="Yes")
        held.release()
        await asyncio.wait_for(sweep, GUARD)
    finally:
        held.release()
        await a_store.close()
    state = await _thread(embedded, qid)
    assert state.answer is not None and state.answer.option == "Yes", state
    assert state.waiting_on == (SARA,) and LEE not in state.members, state
    [card] = [c["body"] for c in await forge_comments(person("admin"), goal)
              if "Monday?" in c["body"]]
    assert "Yes" in card, card


async def test_someone_added_back_with_the_text_a_replica_still_holds_is_back_everywhere(
        embedded: Embedded, person: Any, tools: Any, database_url: str) -> None:
    """Replica y reads the config without lee (lee recorded as departed); lee is pushed back
    with the very text replica x still holds, and x reads it: nothing new to x, but the
    shared record must follow it (acted out: lee stayed departed, asked nothing, on every
    replica, until one read a text other than its own)."""
    x = embedded.services
    goal = await make_item(embedded, person("sara"), "goal", "EU launch")
    base = {"targetType": "goal", "target": goal}
    sara = tools(SARA)
    await sara("add_comment", **base, body="Lee, before?", needsReply=True,
               to=["lee@acme.com"])
    with_lee = _without()
    assert x.offices._text["acme"] == with_lee  # (what x has read)
    embedded.forge.put_file("acme/.github", "vaultmail.yml", _without(LEE_BLOCK))
    index = database_url or str(embedded.data_dir / "index.sqlite3")
    y_store = await open_store(index)
    try:
        y = _replica(embedded, y_store)
        await y.offices.get(y.forge_for_org("acme"), "acme", fresh=True)
    finally:
        await y_store.close()
    assert await members.departed(x.store, "acme") == {LEE: "lee"}
    embedded.forge.put_file("acme/.github", "vaultmail.yml", with_lee, pusher="admin")
    await embedded.settle()  # (x handles the push)
    assert await members.departed(x.store, "acme") == {}
    asked = await sara("add_comment", **base, body="Lee, after?", needsReply=True,
                       to=["lee@acme.com"])
    assert asked["thread"]["waitingOn"] == [LEE], asked["thread"]


class _AnHourAhead:
    """A replica's wall clock an hour fast (the rest of `time` as it is)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)

    @staticmethod
    def time() -> float:
        return time.time() + 3600


async def test_a_replica_whose_clock_ran_ahead_freezes_no_one_in_or_out(
        embedded: Embedded, person: Any, tools: Any, database_url: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Review r8: replica y, its clock an hour fast, read the config without lee once and
    recorded that read an hour ahead; lee was pushed back and every replica read it, yet each
    read counted as older than y's, and lee stayed departed (422 "lee has left the office")
    for the hour. A read is recorded no later than the database's own clock says it is."""
    x = embedded.services
    embedded.forge.put_file("acme/.github", "vaultmail.yml", _without(LEE_BLOCK))
    index = database_url or str(embedded.data_dir / "index.sqlite3")
    y_store = await open_store(index)
    try:
        y = _replica(embedded, y_store)
        with monkeypatch.context() as fast:
            fast.setattr(source, "time", _AnHourAhead())
            await y.offices.get(y.forge_for_org("acme"), "acme", fresh=True)
        assert await members.departed(x.store, "acme") == {LEE: "lee"}
        embedded.forge.put_file("acme/.github", "vaultmail.yml", _without(), pusher="admin")
        await embedded.settle()  # (x handles the push)
        await y.offices.get(y.forge_for_org("acme"), "acme", fresh=True)  # (its clock right)
    finally:
        await y_store.close()
    assert await members.departed(x.store, "acme") == {}
    goal = await make_item(embedded, person("sara"), "goal", "EU launch")
    asked = await tools(SARA)("add_comment", targetType="goal", target=goal, body="Lee?",
                              needsReply=True, to=["lee@acme.com"])
    assert asked["thread"]["waitingOn"] == [LEE], asked["thread"]


async def test_a_read_older_than_the_one_recorded_does_not_bring_anyone_back(
        embedded: Embedded, person: Any, tools: Any, database_url: str) -> None:
    """Replica x reads the config naming lee, and is slow to take it (its parse held); lee is
    removed meanwhile, and replica y records it. x's read, begun before y's, must not record
    lee back when it lands (acted out: it did, whichever text the forge has)."""
    parsing, go_on = threading.Event(), threading.Event()

    def slow(org: str) -> dict[str, str]:  # (x's parse, beside the loop: held here)
        parsing.set()
        go_on.wait(GUARD)
        return {}

    index = database_url or str(embedded.data_dir / "index.sqlite3")
    x_store, y_store = await open_store(index), await open_store(index)
    x = _replica(embedded, x_store, OfficeSource(renamed=slow))
    y = _replica(embedded, y_store)
    reading = asyncio.create_task(x.offices.get(x.forge_for_org("acme"), "acme", fresh=True))
    try:
        assert await asyncio.to_thread(parsing.wait, GUARD)  # x has the text naming lee
        embedded.forge.put_file("acme/.github", "vaultmail.yml", _without(LEE_BLOCK))
        await y.offices.get(y.forge_for_org("acme"), "acme", fresh=True)
        assert await members.departed(y_store, "acme") == {LEE: "lee"}
        go_on.set()
        office = await asyncio.wait_for(reading, GUARD)
        assert office is not None and any(h.login == "lee" for h in office.humans)
    finally:
        go_on.set()
        reading.cancel()
        await x_store.close()
        await y_store.close()
    assert await members.departed(embedded.services.store, "acme") == {LEE: "lee"}
    goal = await make_item(embedded, person("sara"), "goal", "EU launch")
    status, err = await tools(SARA).raw("add_comment", {
        "targetType": "goal", "target": goal, "body": "Lee?", "needsReply": True,
        "to": ["lee@acme.com"]})
    assert status == 422 and "lee has left the office" in err["error"]["message"], err


CONFIG_GET = "GET /repos/{owner}/{repo}/contents/{path}"


async def test_a_read_under_way_when_the_config_is_forgotten_keeps_nothing(
        embedded: Embedded, person: Any, tools: Any) -> None:
    """A config read is part-way (lee left: its sweep's card held at the forge) when what was
    kept of the office's config is forgotten (a new repository under a renamed vault's old
    name: the office's names read again). That read, parsed with the names forgotten, was
    kept and served for a minute after: scout's mail went to the renamed vault and not to the
    new one (test_renames, under load). The next read after `forget` is its own."""
    goal = await make_item(embedded, person("sara"), "goal", "EU launch")
    await tools(SARA)("add_comment", targetType="goal", target=goal, header="Q",
                      needsReply=True, body="Lee?", to=["lee@acme.com"])
    embedded.forge.put_file("acme/.github", "vaultmail.yml", _without(LEE_BLOCK))
    services = embedded.services
    forge = services.forge_for_org("acme")
    held = embedded.forge.faults.hold(PATCH_COMMENT, count=1)
    read = asyncio.create_task(services.offices.get(forge, "acme", fresh=True))
    try:
        await asyncio.wait_for(held.arrived.wait(), GUARD)  # the read: part-way
        services.offices.forget("acme")
        held.release()
        await asyncio.wait_for(read, GUARD)
    finally:
        held.release()
    reads = len([r for r in embedded.forge.requests if r.route == CONFIG_GET])
    assert await services.offices.get(forge, "acme") is not None
    assert len([r for r in embedded.forge.requests if r.route == CONFIG_GET]) == reads + 1, \
        "the office was served what the read begun before `forget` found"
