"""Rules a review found missing, kept as regressions: permissions on by-hand changes, the
loop guard on follow-ups, exactly-once sends across a crash, and a worker that survives."""
from __future__ import annotations

from typing import Any

import pytest

from bot.email.keys import comment_key
from bot.mail.mailer import Mailer
from bot.mail.reindex import reindex
from bot.store import mails
from tests.support import label_names

SCOUT = "acme/scout-vault"
BUILDER = "acme/builder-vault"


async def test_a_send_retried_after_a_crash_makes_no_second_issue(
        embedded: Any, person: Any, monkeypatch: Any) -> None:
    """Kill (simulated) after create_issue, before _record_new. On a real kill the app is
    down when the forge sends issues.opened for the new issue, and GitHub never retries a
    webhook: modelled by dropping that one delivery. The retried /mail delivery must not
    open a second issue."""
    real = Mailer._record_new
    real_send = Mailer.send
    crashed = {"n": 0}

    async def send_app_down(self: Mailer, *a: Any, **k: Any) -> Any:
        if crashed["n"] == 0:
            embedded.forge.faults.drop_webhooks(count=1)  # the app's own issues.opened
        return await real_send(self, *a, **k)

    async def crash_once(self: Mailer, record: Any, *a: Any, **k: Any) -> None:
        if crashed["n"] == 0 and record.vault == SCOUT:
            crashed["n"] += 1
            raise RuntimeError("process killed here")
        await real(self, record, *a, **k)

    monkeypatch.setattr(Mailer, "_record_new", crash_once)
    monkeypatch.setattr(Mailer, "send", send_app_down)
    embedded.worker.base_backoff = 0.05
    sara = person("sara")
    issue = await sara.open_issue(BUILDER, "Pricing", "talk")
    await embedded.settle()
    await sara.comment(BUILDER, issue["number"], "/mail scout Prices\nList them please.")
    await embedded.settle()
    issues = await person("admin").issues(SCOUT)
    assert len(issues) == 1, [(i["number"], i["title"]) for i in issues]


async def test_two_identical_replies_both_reach_the_agent_sender(
        embedded: Any, tools: Any, person: Any) -> None:
    sent = await tools("agent:builder")("mail_send", to="scout", subject="Q", body="ok?")
    ref = sent["mail"]["ref"]
    scout = tools("agent:scout")
    await scout("mail_reply", mail=ref, body="OK")
    await embedded.settle()
    await tools("agent:builder")("mail_send", to="scout", subject="Q2", body="and this?",
                                 inReplyTo=ref)  # irrelevant chatter
    await scout("mail_reply", mail=ref, body="OK")   # a second, separate reply
    await embedded.settle()
    copies = [i for i in await person("admin").issues(BUILDER) if i["title"] == "Re: Q"]
    assert len(copies) == 2, len(copies)


async def test_closing_by_label_respects_may_manage(embedded: Any, person: Any) -> None:
    """sara (mail.send, not editor, not sender/recipient/person) may not close marco's mail
    by closing the issue; she must not be able to do it with the mail:closed label either."""
    marco, sara = person("marco"), person("sara")
    issue = await marco.open_issue(SCOUT, "Logs", "Rotate the logs")
    await embedded.settle()
    n = issue["number"]
    await sara.call("PATCH", f"/repos/{SCOUT}/issues/{n}", {"state": "closed"}, expect=200)
    await embedded.settle()
    assert (await marco.issue(SCOUT, n))["state"] == "open"  # refused: correct
    await sara.call("PUT", f"/repos/{SCOUT}/issues/{n}/labels",
                    {"labels": ["mail:closed"]}, expect=200)
    await embedded.settle()
    found = await marco.issue(SCOUT, n)
    assert found["state"] == "open" and label_names(found) == ["mail:new"], (
        found["state"], label_names(found))


async def test_tool_transition_keeps_other_labels(embedded: Any, tools: Any,
                                                 person: Any) -> None:
    marco = person("marco")
    issue = await marco.open_issue(SCOUT, "Logs", "Rotate the logs")
    await embedded.settle()
    n = issue["number"]
    await marco.call("POST", f"/repos/{SCOUT}/labels", {"name": "urgent", "color": "ff0000"})
    await marco.call("POST", f"/repos/{SCOUT}/issues/{n}/labels", {"labels": ["urgent"]},
                     expect=200)
    await embedded.settle()
    assert label_names(await marco.issue(SCOUT, n)) == ["mail:new", "urgent"]
    await tools("agent:scout")("mail_open", mail=f"{SCOUT}#{n}")
    await embedded.settle()
    assert label_names(await marco.issue(SCOUT, n)) == ["mail:working", "urgent"]


async def test_agent_without_capability_cannot_wake_recipient_by_comment(
        embedded: Any, tools: Any, person: Any) -> None:
    """critic has mail.send: [] -- yet a comment on a scout mail re-wakes scout (run.queued)."""
    sent = await tools("agent:builder")("mail_send", to="scout", subject="Q", body="x")
    ref = sent["mail"]["ref"]
    await tools("agent:scout")("mail_reply", mail=ref, body="done")
    await embedded.settle()
    before = len(await embedded.ledger_events("run.queued"))
    n = sent["mail"]["number"]
    await person("critic-bot").comment(SCOUT, n, "poke")
    await embedded.settle()
    after = await embedded.ledger_events("run.queued")
    assert len(after) == before, [(e.actor, e.subject) for e in after[before:]]


@pytest.mark.parametrize("where", [BUILDER, SCOUT], ids=["another_vault", "the_same_vault"])
async def test_reindex_is_not_poisoned_by_a_copied_header(
        embedded: Any, person: Any, where: str) -> None:
    marco, lee = person("marco"), person("lee")
    issue = await marco.open_issue(SCOUT, "Secret plan", "the real mail")
    await embedded.settle()
    genuine = await marco.issue(SCOUT, issue["number"])
    store = embedded.services.store
    rec = await mails.mail_at(store, SCOUT, issue["number"])
    assert rec is not None
    # lee (no mail.send) pastes the signed mail into another vault, or into the same one (a
    # newer issue, listed first): adoption refuses and closes it, but the copied header stays
    # at the top of that issue.
    copy = await lee.open_issue(where, genuine["title"], genuine["body"])
    await embedded.settle()
    svc = embedded.services
    forge = svc.forge_for(None)
    office = await svc.offices.get(forge, "acme")
    await mails.replace_all(store, [])  # rebuilt from the forge alone
    await reindex(store, forge, office, svc.keyring, app_login=svc.bot_login,
                  comment_key=comment_key(svc.settings.data_dir, office.org))
    after = await mails.get_mail(store, rec.mail_id)
    assert after is not None and after.ref == rec.ref, (after.ref if after else None,
                                                        f"copy at {where}#{copy['number']}")


async def test_an_event_without_installation_does_not_kill_the_worker(
        embedded: Any, person: Any, session: Any) -> None:
    """A delivery may come without `installation` (GitHub's `ping` and `meta` do; intake
    answers those unstored now, no handler taking them); with several installations there is
    no default, forge_for() raised outside the worker's try, the worker task died and every
    later delivery stayed pending while intake kept answering 202."""
    import hashlib
    import hmac
    import json
    svc = embedded.services
    svc.installations["another-org"] = 999  # two installations: no default one
    body = json.dumps({"ref": "refs/heads/main", "after": "0" * 40, "commits": [],
                       "repository": {"full_name": "acme/.github", "name": ".github",
                                      "owner": {"login": "acme"}},
                       "sender": {"login": "admin"}}).encode()  # (no installation)
    sig = "sha256=" + hmac.new(svc.settings.webhook_secret.encode(), body,
                               hashlib.sha256).hexdigest()
    async with session.post(embedded.app_url + "/webhook", data=body, headers={
            "X-GitHub-Delivery": "ping-1", "X-GitHub-Event": "push",
            "X-Hub-Signature-256": sig, "Content-Type": "application/json"}) as resp:
        assert resp.status == 202
    import asyncio
    import time
    task = embedded.worker._task
    assert task is not None
    deadline = time.monotonic() + 10  # until the worker ends the ping, or dies trying
    while not task.done():
        row = await svc.store.fetchone("SELECT state FROM queue WHERE guid='ping-1'")
        if row is not None and row["state"] != "pending":
            break
        assert time.monotonic() < deadline, "the ping is still pending"
        await asyncio.sleep(0.01)
    assert not task.done(), task.exception() if task.done() else None


async def test_a_forge_failure_in_a_tool_is_a_json_error(embedded: Any, session: Any) -> None:
    embedded.forge.faults.add("POST /repos/{owner}/{repo}/issues", status=422, count=1)
    url = embedded.app_url + "/api/v1/tools/mail_send"
    headers = {"Authorization": f"Bearer {embedded.api_tokens['agent:builder']}"}
    async with session.post(url, json={"to": "scout", "subject": "s", "body": "b"},
                            headers=headers) as resp:
        text = await resp.text()
        assert resp.headers.get("Content-Type", "").startswith("application/json"), (
            resp.status, text[:200])


async def test_agents_trading_comments_on_one_mail_are_stopped_by_the_loop_guard(
        embedded: Any, person: Any, tools: Any) -> None:
    sent = (await tools("agent:builder")("mail_send", to="scout", subject="Chat",
                                         body="hi"))["mail"]
    scout_bot, builder_bot = person("scout-bot"), person("builder-bot")
    for turn in range(1, 5):
        await scout_bot.comment(SCOUT, sent["number"], f"reply {turn}")
        await embedded.settle()
        await builder_bot.comment(SCOUT, sent["number"], f"follow-up {turn}")
        await embedded.settle()
    # The automatic copies of scout's replies count hops on the thread, so the fourth copy
    # reaches builder quietly and wakes it no more; builder's follow-ups count on the mail
    # (scout's replies start nothing again), so its fourth wakes scout no more either.
    copies = [m for m in await mails.all_mails(embedded.services.store) if m.vault == BUILDER]
    assert sorted(m.hops for m in copies) == [1, 2, 3, 4]
    quiet = [m for m in copies if m.state == "quiet"]
    assert [m.hops for m in quiet] == [4]
    guards = await embedded.ledger_events("mail.loop_guard")
    assert [g.subject for g in guards] == [quiet[0].ref, sent["ref"]]
