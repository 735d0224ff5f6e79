"""Chat (seed mail.md, "Mail versus chat"): people only, kept in the index (never on the
forge), a `chat` run admitted by the agent's run.triggers, answered by the agent."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from bot.app.embedded import Embedded
from bot.store import ledger, mails
from bot.tools import chat_tools
from bot.tools.chat_tools import get_chat
from tests.support import ToolClient
from tests.tool_scenario import forge_issues

MARCO, SARA, LEE = "human:marco@acme.com", "human:sara@acme.com", "human:lee@acme.com"


async def events(embedded: Embedded, name: str) -> list[ledger.Entry]:
    return await ledger.entries(embedded.services.store, event=name)


async def test_a_person_chats_with_an_agent_and_waits_for_the_answer(
        embedded: Embedded, tools: Any) -> None:
    marco: ToolClient = tools(MARCO)
    scout: ToolClient = tools("agent:scout")
    asking = asyncio.create_task(marco("agent_chat", agent="scout",
                                       message="Quick: EU or US prices first?", wait=10))
    chats: list[dict[str, Any]] = []
    for _ in range(100):  # the agent sees the chat in the inbox of any tool result
        chats = (await scout("mail_list"))["inbox"]["chats"]
        if chats:
            break
        await asyncio.sleep(0.05)
    [chat] = chats
    assert chat["from"] == MARCO and chat["message"] == "Quick: EU or US prices first?"
    answered = await scout("chat_reply", chat=chat["chat"], message="EU first")
    assert answered["chat"]["answer"] == "EU first"
    result = (await asyncio.wait_for(asking, 5))["chat"]
    assert result["answer"] == "EU first" and result["agent"] == "agent:scout"
    assert "inbox" not in (await marco("chat_get", chat=chat["chat"])), "people get no inbox"
    assert (await scout("mail_list"))["inbox"]["chats"] == []

    [queued] = await events(embedded, "run.queued")
    assert queued.data == {"agent": "agent:scout", "kind": "chat", "run": queued.data["run"]}
    assert queued.subject == f"chat:{chat['chat']}" and queued.actor == MARCO
    [run] = await mails.runs_for(embedded.services.store, "scout", org="acme")
    assert run["kind"] == "chat" and run["state"] == "queued"
    row = await get_chat(embedded.services.store, chat["chat"], org="acme")
    assert row is not None and row["message"] == "Quick: EU or US prices first?"
    assert await forge_issues(embedded, "acme/scout-vault") == [], "chat stays off the forge"


async def test_a_chat_the_agents_triggers_do_not_admit_is_refused_and_not_kept(
        embedded: Embedded, tools: Any) -> None:
    status, body = await tools(SARA).raw("agent_chat", {"agent": "builder", "message": "hi"})
    assert status == 409 and body["error"]["code"] == "run_refused"
    assert "run.triggers" in body["error"]["message"] and "mail_send" in body["error"]["message"]
    [refused] = await events(embedded, "run.refused")
    assert refused.data["kind"] == "chat" and refused.data["agent"] == "agent:builder"
    assert await events(embedded, "run.queued") == []
    assert await embedded.services.store.fetchall("SELECT * FROM chats") == []


async def test_agents_are_denied_and_people_need_no_mail_send(embedded: Embedded,
                                                              tools: Any) -> None:
    status, body = await tools("agent:builder").raw("agent_chat",
                                                    {"agent": "scout", "message": "hi"})
    assert status == 403 and body["error"]["code"] == "denied"
    assert "for people" in body["error"]["message"]
    denied = await events(embedded, "run.denied")
    assert [d.actor for d in denied] == ["agent:builder"]
    assert await embedded.services.store.fetchall("SELECT * FROM chats") == []
    assert await events(embedded, "run.queued") == []
    # lee has no permissions at all: chat needs none (seed mail.md, "Mail versus chat")
    chat = (await tools(LEE)("agent_chat", agent="scout", message="hi"))["chat"]
    assert chat["from"] == LEE


async def test_only_the_addressed_agent_answers_and_only_once(embedded: Embedded,
                                                              tools: Any) -> None:
    chat = (await tools(MARCO)("agent_chat", agent="agent:scout", message="ping"))["chat"]
    assert chat["answer"] is None
    status, body = await tools("agent:critic").raw("chat_reply",
                                                   {"chat": chat["chat"], "message": "pong"})
    assert status == 404
    await tools("agent:scout")("chat_reply", chat=chat["chat"], message="pong")
    status, body = await tools("agent:scout").raw("chat_reply",
                                                  {"chat": chat["chat"], "message": "again"})
    assert status == 409 and body["error"]["code"] == "already_answered"
    status, body = await tools(MARCO).raw("agent_chat", {"agent": "nobody", "message": "x"})
    assert status == 404 and "scout" in body["error"]["message"]
    status, body = await tools(MARCO).raw("agent_chat", {"agent": "scout", "wait": 99})
    assert status == 422
    assert "message: Field required" in body["error"]["message"]
    assert "wait: Input should be less than or equal to 50" in body["error"]["message"]


async def test_two_replies_racing_past_the_check_answer_once(
        embedded: Embedded, tools: Any, monkeypatch: Any) -> None:
    """Both replies read the chat unanswered; only the first may land, the second is a 409."""
    chat = (await tools(MARCO)("agent_chat", agent="scout", message="ping"))["chat"]
    store = embedded.services.store
    stale = await get_chat(store, chat["chat"], org="acme")
    assert stale is not None and stale["answered_at"] is None
    await tools("agent:scout")("chat_reply", chat=chat["chat"], message="pong")

    async def read_before_the_first_reply(call: Any, chat_id: int) -> Any:
        return stale

    monkeypatch.setattr(chat_tools, "_visible_chat", read_before_the_first_reply)
    status, body = await tools("agent:scout").raw("chat_reply",
                                                  {"chat": chat["chat"], "message": "again"})
    assert status == 409 and body["error"]["code"] == "already_answered", body
    assert "already answered" in body["error"]["message"]
    row = await get_chat(store, chat["chat"], org="acme")
    assert row is not None and row["answer"] == "pong"


async def test_the_chats_waiting_for_an_agent_are_bounded(embedded: Embedded, tools: Any,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Each chat queues a run of the agent (and its dispatch): one person's script, with no
    forge write to slow it, queued as many as it liked (found by review). Unanswered chats
    are bounded per person and per agent; an answer makes room."""
    monkeypatch.setattr(chat_tools, "WAITING_PER_PERSON", 2)
    monkeypatch.setattr(chat_tools, "WAITING_PER_AGENT", 3)
    marco, sara = tools("human:marco@acme.com"), tools("human:sara@acme.com")
    first = [await marco("agent_chat", agent="scout", message=f"q{n}") for n in range(2)]
    status, body = await marco.raw("agent_chat", {"agent": "scout", "message": "q2"})
    assert status == 429 and body["error"]["code"] == "too_many_chats", body
    await sara("agent_chat", agent="scout", message="mine")
    status, body = await sara.raw("agent_chat", {"agent": "scout", "message": "more"})
    assert status == 429 and "3 chats waiting" in body["error"]["message"], body
    await tools("agent:scout")("chat_reply", chat=first[0]["chat"]["chat"], message="a0")
    await marco("agent_chat", agent="scout", message="q2")  # room again
    # an hour on, the chats still unanswered count no more (runs that failed shut no one out)
    monkeypatch.setattr(chat_tools, "WAITING_FOR", -1.0)
    await marco("agent_chat", agent="scout", message="q3")
    queued = [e for e in await embedded.ledger_events("run.queued")
              if e.data.get("kind") == "chat" or e.subject.startswith("chat:")]
    assert len(queued) == 5, queued


LEE = "human:lee@acme.com"


async def _refused(client: ToolClient, agent: str) -> tuple[str, str | None]:
    """A chat to `agent` refused 429: its message, and the Retry-After the answer carries."""
    async with client.session.post(client.url + "agent_chat", json={
            "agent": agent, "message": "one more"},
            headers={"Authorization": f"Bearer {client.token}"}) as resp:
        body = await resp.json()
        assert resp.status == 429 and body["error"]["code"] == "too_many_chats", body
        return body["error"]["message"], resp.headers.get("Retry-After")


async def test_a_persons_chats_are_bounded_across_the_agents_of_the_office(
        embedded: Embedded, tools: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The per-person cap was per agent asked (acted out, review r4: with caps of 2 per person
    and 3 per agent, one person's chats to 31 agents queued 62 runs). A person's waiting chats
    count across every agent of the office, and the office's all together; each refusal says
    which cap, how many wait, what to do, and when the oldest counted ages out."""
    from dataclasses import replace

    monkeypatch.setattr(chat_tools, "WAITING_PER_PERSON", 2)
    monkeypatch.setattr(chat_tools, "WAITING_PER_AGENT", 3)
    marco, sara, lee = tools(MARCO), tools(SARA), tools(LEE)
    await marco("agent_chat", agent="scout", message="q0")
    await marco("agent_chat", agent="echo", message="q1")
    for agent in ("scout", "echo"):  # another agent is no way around it
        said, retry = await _refused(marco, agent)
        assert "2 chats of yours wait" in said and "at most 2 of one person's" in said, said
        assert "chat_get" in said and retry is not None and 0 < int(retry) <= 3601, retry
        assert f"try again in {retry} s" in said, (said, retry)  # the header says the same
    services = embedded.services  # the operator's cap on an office: 3 here
    monkeypatch.setattr(services, "settings", replace(services.settings, chats_waiting=3))
    await sara("agent_chat", agent="echo", message="mine")
    said, retry = await _refused(lee, "scout")  # the office's cap: 3 in all
    assert "3 chats wait in the acme office" in said and "VAULTMAIL_CHATS_WAITING" in said, said
    assert retry is not None, said
    assert len(await events(embedded, "run.queued")) == 3, "a refused chat queues no run"


async def test_a_refused_chats_number_is_never_given_again(embedded: Embedded,
                                                          tools: Any) -> None:
    """A chat its agent's triggers refuse is not kept, and its number went back: the next
    chat of the office got it, and its people saw the refused one's ledger entry as theirs
    (review). A number once given is never given again."""
    status, body = await tools("human:sara@acme.com").raw(
        "agent_chat", {"agent": "builder", "message": "secret"})
    assert status == 409, body
    chat = (await tools(LEE)("agent_chat", agent="scout", message="hi"))["chat"]
    events = (await tools(LEE)("list_changes", since=0, limit=1000))["events"]
    assert chat["chat"] == 2 and not [e for e in events if e["event"] == "run.refused"], (
        chat, events)


async def test_chats_beside_a_replica_of_the_release_before(embedded: Embedded,
                                                            tools: Any) -> None:
    """A rolling deploy: a replica of the release before numbers chats by their ids and
    writes no number. Its chat is listed, read and answered by its id; while it lives, ours
    go by their ids too (one of its next ids could be a number we gave); once it is gone, the
    office counts on from above every id given (review)."""
    import time

    store = embedded.services.store
    async with store.transaction() as db:
        await db.execute("INSERT INTO replicas(id, url, started_at, seen_at, steady_since)"
                         " VALUES ('old', NULL, vm_now(), vm_now(), vm_now())")
        old = await db.insert(
            "INSERT INTO chats(agent, sender, message, created_at, org) VALUES (?,?,?,?,?)"
            " RETURNING id", ("agent:scout", LEE, "from the old replica", time.time(), "acme"))
    scout = tools("agent:scout")
    waiting = (await scout("mail_list"))["inbox"]["chats"]
    assert [c["chat"] for c in waiting] == [old], waiting
    answered = await scout("chat_reply", chat=old, message="seen")
    assert answered["chat"]["answer"] == "seen"
    beside = (await tools(LEE)("agent_chat", agent="scout", message="and ours"))["chat"]
    row = await store.fetchone("SELECT id FROM chats WHERE message='and ours'")
    assert row is not None and beside["chat"] == row["id"], "its id, while the old one lives"
    async with store.transaction() as db:
        await db.execute("DELETE FROM replicas WHERE id='old'")  # (the deploy is done)
    after = (await tools(LEE)("agent_chat", agent="scout", message="after"))["chat"]
    assert after["chat"] == beside["chat"] + 1, (beside, after)


async def test_rows_a_stopped_replica_of_the_release_before_wrote_are_numbered_as_it_showed(
        embedded: Embedded, tools: Any) -> None:
    """A replica of the release before wrote a chat, its run and their ledger entry (no
    number: each goes by its id, its seq), then stopped: none of that release lives, so the
    office counts on. Its rows are numbered as it showed them, and the office's next numbers
    come after them, not in between (a number it showed is never given again): each
    transaction that numbers an office's rows first numbers those left unnumbered, whether
    or not such a replica lives now."""
    import time

    from bot.store.ledger import GENESIS, _digest

    store = embedded.services.store
    lee = tools(LEE)
    await lee("agent_chat", agent="scout", message="ours, first")
    async with store.transaction(ledger.key("acme")) as db:
        await db.execute("INSERT INTO replicas(id, url, started_at, seen_at, steady_since)"
                         " VALUES ('old', NULL, vm_now()-60, vm_now()-60, vm_now()-60)")
        chat = await db.insert(
            "INSERT INTO chats(agent, sender, message, created_at, org) VALUES (?,?,?,?,?)"
            " RETURNING id", ("agent:scout", LEE, "from the old replica", time.time(), "acme"))
        run = await db.insert("INSERT INTO runs(agent, kind, subject, state, created_at, org)"
                              " VALUES (?,?,?,?,?,?) RETURNING id",
                              ("agent:scout", "chat", f"chat:{chat}", "queued", time.time(),
                               "acme"))
        head = await db.fetchone("SELECT hash FROM ledger WHERE chain='acme'"
                                 " ORDER BY seq DESC LIMIT 1")
        prev, at, data = head[0] if head else GENESIS, time.time(), f'{{"run":{run}}}'
        seq = await db.insert(
            "INSERT INTO ledger(time, event, actor, subject, data, prev_hash, hash, org, chain)"
            " VALUES (?,?,?,?,?,?,?,?,?) RETURNING seq",
            (at, "run.queued", LEE, f"chat:{chat}", data, prev,
             _digest(prev, at, "run.queued", LEE, f"chat:{chat}", data, "acme"), "acme",
             "acme"))
    after = (await lee("agent_chat", agent="scout", message="ours, after"))["chat"]
    assert after["chat"] == chat + 1, ("after the old replica's chat", chat, after)
    assert (await lee("chat_get", chat=chat))["chat"]["message"] == "from the old replica"
    numbered = {(r["kind"], r["n"], r["was"]) for r in await store.fetchall(
        "SELECT 'chat' AS kind, number AS n, id AS was FROM chats WHERE id=?"
        " UNION ALL SELECT 'run', number, id FROM runs WHERE id=?"
        " UNION ALL SELECT 'entry', pos, seq FROM ledger WHERE seq=?", (chat, run, seq))}
    assert numbered == {("chat", chat, chat), ("run", run, run), ("entry", seq, seq)}, numbered
    changes = (await lee("list_changes", since=0, limit=1000))["events"]
    queued = [e for e in changes if e["event"] == "run.queued"]
    assert [e["subject"] for e in queued][-2:] == [f"chat:{chat}", f"chat:{chat + 1}"], queued
    assert queued[-1]["data"]["run"] == run + 1 and queued[-1]["seq"] == seq + 1, queued
    assert await ledger.verify_chain(store, "acme") is None


async def test_chats_from_before_offices_are_adopted_beside_numbered_ones(
        embedded: Embedded, tools: Any) -> None:
    """Chats written before offices (no office, their number their id) are given to the
    deployment's one office at a start: its own numbers must not be theirs, or the start
    failed on the unique number (review)."""
    import time

    from bot.store import offices

    store = embedded.services.store
    async with store.transaction() as db:
        await db.execute("INSERT INTO chats(agent, sender, message, created_at, org, number)"
                         " VALUES ('agent:scout', ?, 'old', ?, NULL, 1)", (LEE, time.time()))
    await tools(LEE)("agent_chat", agent="scout", message="new")
    assert await offices.adopt_unowned(store, "acme")
    numbers = [r["number"] for r in await store.fetchall(
        "SELECT number FROM chats WHERE org='acme' ORDER BY number")]
    assert numbers == [1, 2], numbers
