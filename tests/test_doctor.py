"""`vaultmail doctor` (issue 28): writes the forge acknowledged and then lost are found and
repaired from the index, once, however often it runs; a change the index has not taken yet is
flagged, never undone.

The forge loses writes through its `lost` fault (it answers the write, then the repository is
as it was before it) or an admin deleting a comment; the doctor runs as the operator runs it,
`vaultmail doctor --data DIR` in a process of its own, on both engines."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest

from bot.app.embedded import Embedded
from bot.forge import markers
from bot.mail.mailer import Mailer
from bot.mail.reindex import mail_from_issue
from bot.store import mails
from labels.states import MailState
from tests.support import label_names
from tests.test_tamper import vaultmail

SCOUT_VAULT, BUILDER_VAULT = "acme/scout-vault", "acme/builder-vault"
PATCH_ISSUE = "PATCH /repos/{owner}/{repo}/issues/{issue_number}"
CREATE_ISSUE = "POST /repos/{owner}/{repo}/issues"


def _number(ref: str) -> int:
    return int(ref.rsplit("#", 1)[1])


def _count(out: str, outcome: str) -> int:
    found = re.search(rf"{outcome}: (\d+)", out)
    assert found, out
    return int(found[1])


async def test_the_doctor_repairs_lost_writes_once(embedded: Embedded, person: Any,
                                                   tools: Any) -> None:
    marco, builder, scout = (tools("human:marco@acme.com"), tools("agent:builder"),
                             tools("agent:scout"))
    admin = person("admin")
    store, faults = embedded.services.store, embedded.forge.faults
    closed = (await marco("mail_send", to="scout", subject="Close me", body="done?"))["mail"]
    told = (await marco("mail_send", to="scout", subject="Prices", body="EU?"))["mail"]
    asked = (await builder("mail_send", to="scout", subject="Spec", body="Spec v1?"))["mail"]
    await embedded.settle()

    # 1. the close's PATCH is answered, then lost: the forge shows the mail as it was
    lose = faults.add(route=PATCH_ISSUE, mode="lost", count=1)
    assert (await marco("mail_close", mail=closed["ref"]))["mail"]["state"] == "mail:closed"
    assert lose.fired == 1
    # 2. scout's reply: the copy opened in builder's vault is answered, then lost; and an
    #    admin deletes the reply's comment from the mail's issue
    lose = faults.add(route=CREATE_ISSUE, mode="lost", count=1)
    await scout("mail_reply", mail=asked["ref"], body="Spec v1 looks right.",
                idempotencyKey="reply-1")
    assert lose.fired == 1
    # 3. scout's reply to marco: its comment is answered, then lost
    lose = faults.add(route="POST /repos/{owner}/{repo}/issues/{issue_number}/comments",
                      mode="lost", count=1)
    await scout("mail_reply", mail=told["ref"], body="EU prices are up 3 %.",
                idempotencyKey="reply-2")
    assert lose.fired == 1
    await embedded.settle()
    marker, marker2 = markers.reply("reply-1"), markers.reply("reply-2")
    comment = next(c for c in await admin.comments(SCOUT_VAULT, _number(asked["ref"]))
                   if marker in c["body"])
    await admin.call("DELETE", f"/repos/{SCOUT_VAULT}/issues/comments/{comment['id']}",
                     expect=204)
    await embedded.settle()

    copy = next(m for m in await mails.list_mails(store, org="acme", vault=BUILDER_VAULT)
                if m.in_reply_to == asked["ref"])
    issue = await admin.issue(SCOUT_VAULT, _number(closed["ref"]))
    assert (issue["state"], label_names(issue)) == ("open", ["mail:new"]), "the close was lost"
    await admin.call("GET", f"/repos/{BUILDER_VAULT}/issues/{copy.number}", expect=404)
    assert not [i for i in await admin.issues(BUILDER_VAULT) if copy.mail_id in i["body"]]
    assert not [c for c in await admin.comments(SCOUT_VAULT, _number(told["ref"]))
                if marker2 in c["body"]]
    # someone else's comment carrying the lost reply's marker does not make it there (found
    # by review: any comment with the marker did)
    await admin.comment(SCOUT_VAULT, _number(told["ref"]), f"Where did it go? {marker2}")

    # a dry run says what it would repair, and writes nothing
    code, out = await vaultmail(embedded, "doctor", "--dry-run")
    assert code == 1, out
    assert _count(out, "would repair") == 4 and _count(out, "repaired") == 0, out
    issue = await admin.issue(SCOUT_VAULT, _number(closed["ref"]))
    assert issue["state"] == "open", "a dry run writes nothing"

    code, out = await vaultmail(embedded, "doctor")
    assert code == 0, out
    assert _count(out, "repaired") == 4 and _count(out, "flagged") == 0, out
    await embedded.settle()

    async def end_state() -> tuple[Any, ...]:
        closed_issue = await admin.issue(SCOUT_VAULT, _number(closed["ref"]))
        replies = [c for c in await admin.comments(SCOUT_VAULT, _number(asked["ref"]))
                   if marker in c["body"]]
        copies = [i for i in await admin.issues(BUILDER_VAULT) if copy.mail_id in i["body"]]
        to_marco = [c["body"] for c in await admin.comments(SCOUT_VAULT, _number(told["ref"]))
                    if marker2 in c["body"]
                    and c["user"]["login"] == embedded.services.bot_login]
        return (closed_issue["state"], label_names(closed_issue), len(replies),
                [(i["number"], label_names(i), i["state"]) for i in copies],
                [r["body"] for r in replies], to_marco)

    repaired = await end_state()
    assert repaired[:3] == ("closed", ["mail:closed"], 1), repaired
    assert "Spec v1 looks right." in repaired[4][0]
    [to_marco] = repaired[5]  # the reply to a person, which has no copy, is back too
    assert "EU prices are up 3 %." in to_marco and "**agent:scout** replied" in to_marco
    [(number, labels, state)] = repaired[3]
    assert labels == ["mail:new"] and state == "open", repaired
    row = await mails.get_mail(store, copy.mail_id)
    assert row is not None and row.number == number, "the index points at the copy again"
    code, out = await vaultmail(embedded, "verify", f"{BUILDER_VAULT}#{number}")
    assert code == 0, out  # the copy opened again verifies as the app's signed mail

    # again: nothing left to repair, nothing doubled
    code, out = await vaultmail(embedded, "doctor")
    assert code == 0 and _count(out, "repaired") == 0, out
    assert "the forge and the index agree" in out, out
    await embedded.settle()
    assert await end_state() == repaired


async def test_a_change_not_yet_delivered_is_flagged_not_undone(
        embedded: Embedded, person: Any, tools: Any) -> None:
    marco = person("marco")
    sent = (await tools("human:marco@acme.com")("mail_send", to="scout", subject="Hand",
                                                 body="x"))["mail"]
    await embedded.settle()
    embedded.forge.faults.drop_webhooks(count=1)  # marco's close by hand is not delivered
    await marco.call("PATCH", f"/repos/{SCOUT_VAULT}/issues/{_number(sent['ref'])}",
                     {"state": "closed"}, expect=200)
    await embedded.settle()
    row = await mails.get_mail(embedded.services.store, sent["mail_id"])
    assert row is not None and row.state == "mail:new"

    code, out = await vaultmail(embedded, "doctor")
    assert code == 1, out
    assert _count(out, "flagged") == 1 and _count(out, "repaired") == 0, out
    assert "marco changed it on the forge" in out, out
    issue = await marco.issue(SCOUT_VAULT, _number(sent["ref"]))
    assert issue["state"] == "closed", "marco's close is not undone"

    assert await embedded.reconciler.run_once() == 1  # the close arrives after all
    await embedded.settle()
    code, out = await vaultmail(embedded, "doctor")
    assert code == 0 and "the forge and the index agree" in out, out
    row = await mails.get_mail(embedded.services.store, sent["mail_id"])
    assert row is not None and row.state == "mail:closed"


async def test_a_lost_write_after_one_that_landed_late_is_repaired_not_taken(
        embedded: Embedded, person: Any, tools: Any) -> None:
    """Acted out (review r5): the app's follow-up write for marco's comment is held at the
    forge; marco closes by hand (its delivery late); the held write lands (mail:new, after
    the close); the close's delivery arrives and the app's label write for it is lost. The
    doctor read the held write, dated after the close, as the index behind the forge
    ("caught up": mail:new, the closed issue back in scout's inbox). The index recorded the
    close after that write landed: it is the forge that is behind, and the close is
    written again."""
    marco, admin, faults = person("marco"), person("admin"), embedded.forge.faults
    sent = (await tools("human:marco@acme.com")("mail_send", to="scout", subject="S",
                                                 body="x"))["mail"]
    await embedded.settle()
    await tools("agent:scout")("mail_open", mail=sent["ref"])
    await embedded.settle()
    n = _number(sent["ref"])
    held = faults.hold(PATCH_ISSUE, count=1, repo=SCOUT_VAULT)
    await marco.comment(SCOUT_VAULT, n, "One more thing: EU too?")
    await asyncio.wait_for(held.arrived.wait(), 20)  # the app's follow-up write, at the forge
    faults.drop_webhooks(count=1)  # marco's close is delivered later (a backlog)
    await marco.call("PATCH", f"/repos/{SCOUT_VAULT}/issues/{n}", {"state": "closed"},
                     expect=200)
    embedded.forge.clock.advance(1)  # the held write lands in a later (whole) forge second
    held.release()
    await embedded.settle()
    lost = faults.add(route=PATCH_ISSUE, mode="lost", count=1)
    assert await embedded.reconciler.run_once() == 1  # the close arrives
    await embedded.settle()
    assert lost.fired == 1
    issue = await admin.issue(SCOUT_VAULT, n)
    assert (issue["state"], label_names(issue)) == ("closed", ["mail:new"]), "the label lost"

    code, out = await vaultmail(embedded, "doctor")
    assert _count(out, "repaired") == 1 and "caught up" not in out, out
    await embedded.settle()
    issue = await admin.issue(SCOUT_VAULT, n)
    row = await mails.get_mail(embedded.services.store, sent["mail_id"])
    assert row is not None and row.state == "mail:closed", out
    assert (issue["state"], label_names(issue)) == ("closed", ["mail:closed"]), out


async def test_the_leaders_scheduled_pass_repairs_a_lost_move(
        embedded: Embedded, person: Any, tools: Any) -> None:
    """The pass the leader runs every VAULTMAIL_DOCTOR_SECONDS, in the app's own process: a
    lost `mail:working` label is written again, under the same locks as the worker's."""
    from bot.app.web import DOCTOR_KEY

    sent = (await tools("human:marco@acme.com")("mail_send", to="scout", subject="Open me",
                                                 body="x"))["mail"]
    await embedded.settle()
    embedded.forge.faults.add(route=PATCH_ISSUE, mode="lost", count=1)
    await tools("agent:scout")("mail_open", mail=sent["ref"])
    issue = await person("admin").issue(SCOUT_VAULT, _number(sent["ref"]))
    assert label_names(issue) == ["mail:new"], "the open was lost"

    schedule = embedded.runner.app[DOCTOR_KEY]
    assert await embedded.services.store.is_leader()
    report = await schedule.run_once()
    assert report.counts() == {"repaired": 1}, report.table()
    issue = await person("admin").issue(SCOUT_VAULT, _number(sent["ref"]))
    assert label_names(issue) == ["mail:working"] and issue["state"] == "open"
    assert (await schedule.run_once()).findings == []


async def test_one_pass_at_a_time_beside_the_app_on_sqlite(embedded: Embedded) -> None:
    """On SQLite `vaultmail doctor` is a process beside the app, whose locks it does not
    share: while another pass holds the data directory's lock, it looks at nothing."""
    import fcntl
    import os

    if embedded.services.store.engine != "sqlite":
        return  # PostgreSQL: the database's named lock, shared by every process
    fd = os.open(embedded.data_dir / "doctor.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # as the app's own pass holds it
        code, out = await vaultmail(embedded, "doctor")
        assert code == 1 and "another doctor pass is running" in out, out
    finally:
        os.close(fd)
    code, out = await vaultmail(embedded, "doctor")
    assert code == 0 and "the forge and the index agree" in out, out


async def test_two_passes_at_once_repair_each_thing_once(embedded: Embedded, person: Any,
                                                        tools: Any) -> None:
    """The app's pass and one by hand, or two by hand, at the same time: every lost write is
    written again once (PostgreSQL: the database's lock; SQLite: the data directory's)."""
    import asyncio

    marco, scout, admin = tools("human:marco@acme.com"), tools("agent:scout"), person("admin")
    one = (await marco("mail_send", to="scout", subject="One", body="1"))["mail"]
    two = (await marco("mail_send", to="scout", subject="Two", body="2"))["mail"]
    await embedded.settle()
    embedded.forge.faults.add(route=PATCH_ISSUE, mode="lost", count=1)
    await marco("mail_close", mail=one["ref"])
    embedded.forge.faults.add(route="POST /repos/{owner}/{repo}/issues/{issue_number}/comments",
                              mode="lost", count=1)
    await scout("mail_reply", mail=two["ref"], body="Two it is.", idempotencyKey="two")
    await embedded.settle()

    from bot.app.web import DOCTOR_KEY

    runs = await asyncio.gather(vaultmail(embedded, "doctor"), vaultmail(embedded, "doctor"),
                                embedded.runner.app[DOCTOR_KEY].run_once())
    repaired = sum(_count(out, "repaired") for _, out in runs[:2]) + runs[2].counts().get(
        "repaired", 0)
    assert repaired == 2, runs
    issue = await admin.issue(SCOUT_VAULT, _number(one["ref"]))
    assert (issue["state"], label_names(issue)) == ("closed", ["mail:closed"])
    comments = [c for c in await admin.comments(SCOUT_VAULT, _number(two["ref"]))
                if markers.reply("two") in c["body"]]
    assert len(comments) == 1, comments


def test_the_help_shows_the_doctors_own_defaults() -> None:
    """`vaultmail doctor --help` names its limits without loading the doctor (every command
    starts faster): the numbers it shows are the doctor's."""
    from bot.app.doctor import MAX_REPAIRS, REPLY_WINDOW
    from bot.cli.doctor import SHOWN_MAX_REPAIRS, SHOWN_REPLY_DAYS

    assert SHOWN_MAX_REPAIRS == MAX_REPAIRS
    assert SHOWN_REPLY_DAYS * 86400.0 == REPLY_WINDOW


async def test_one_offices_repairs_or_spent_budget_stop_no_other_offices_pass(
        embedded: Embedded, person: Any, tools: Any, session: Any) -> None:
    """A pass's repairs were counted across offices, in the order of their names, and the
    pass ended at the cap: an office that sorts first (`aardvark`, installed beside acme)
    with lost writes enough, however they came about, took every pass's repairs, and acme's
    lost writes were never written again. Each office now has its own `--max-repairs` a
    pass, and its own installation's budget stops its own pass only."""
    import yaml

    from bot.office.config import parse_office
    from bot.office.seed import seed_office
    from bot.store import api_tokens
    from tests.support import ToolClient
    from tests.test_tenancy import EVIL

    other = {**EVIL, "org": "aardvark"}
    seed_office(embedded.forge, parse_office(yaml.safe_dump(other), "aardvark.yml",
                                             repository=False))
    (app_id,) = embedded.forge.state.apps
    embedded.forge.install_app(int(app_id), "aardvark")
    await embedded.settle()
    store = embedded.services.store
    theirs = {p: await api_tokens.create_token(store, p, org="aardvark")
              for p in ("human:marco@acme.com", "agent:scout")}
    sent = []
    for n in range(2):  # aardvark's two mails, then acme's one: three lost opens
        their_marco = ToolClient(session, embedded, "human:marco@acme.com",
                                 token=theirs["human:marco@acme.com"])
        sent.append(("aardvark", (await their_marco(
            "mail_send", to="scout", subject=f"Theirs {n}", body="x"))["mail"]["ref"]))
    sent.append(("acme", (await tools("human:marco@acme.com")(
        "mail_send", to="scout", subject="Ours", body="x"))["mail"]["ref"]))
    await embedded.settle()
    lose = embedded.forge.faults.add(route=PATCH_ISSUE, mode="lost", count=3)
    for org, ref in sent:
        scout = ToolClient(session, embedded, "agent:scout", token=theirs["agent:scout"]) \
            if org == "aardvark" else tools("agent:scout")
        await scout("mail_open", mail=ref)
    assert lose.fired == 3
    code, out = await vaultmail(embedded, "doctor", "--max-repairs", "1")
    assert _count(out, "repaired") == 2, out  # one of aardvark's, and acme's
    issue = await person("admin").issue(SCOUT_VAULT, _number(sent[-1][1]))
    assert label_names(issue) == ["mail:working"], "acme's lost open written again"


async def test_an_office_whose_config_read_hangs_is_skipped_not_waited_for(
        embedded: Embedded) -> None:
    """The pass read each office's config in turn and waited for it however long its forge
    took (one waiting out its installation's rate limit: up to 15 minutes) before any office
    after it was looked at."""
    import yaml

    from bot.office.config import parse_office
    from bot.office.seed import seed_office
    from tests.test_tenancy import EVIL

    seed_office(embedded.forge, parse_office(yaml.safe_dump({**EVIL, "org": "aardvark"}),
                                             "aardvark.yml", repository=False))
    (app_id,) = embedded.forge.state.apps
    embedded.forge.install_app(int(app_id), "aardvark")
    await embedded.settle()
    held = embedded.forge.faults.hold("GET /repos/{owner}/{repo}/contents/{path}", count=None,
                                      repo="aardvark/.github")
    try:
        code, out = await vaultmail(embedded, "doctor")
    finally:
        held.release()
    assert held.caught, "aardvark's config read was never held: the test tested nothing"
    assert "aardvark: aardvark's office config: its forge has not answered in 3 s: skipped" \
        in out, out
    assert "acme/scout-vault:" in out and code == 0, out


async def _send_stopped_after_its_create(embedded: Embedded, subject: str,
                                         key: str) -> dict[str, Any]:
    """marco's keyed send to scout stopped after its create landed (its answer a 502, its look
    for it held and the send stopped there, the app's own webhook about it lost): the issue
    it left on the forge, its send still begun in the index; the app's webhooks still lost."""
    services, faults = embedded.services, embedded.forge.faults
    forge = services.forge_for_org("acme")
    faults.add(route=CREATE_ISSUE, status=502, mode="after", count=1)
    faults.drop_webhooks(rate=1.0, senders=(services.bot_login,))
    held = faults.hold("GET /repos/{owner}/{repo}/issues", count=1, repo=SCOUT_VAULT)
    first = asyncio.create_task(Mailer(services, forge, embedded.office).send(
        "human:marco@acme.com", "scout", subject, "once", idempotency_key=key))
    await asyncio.wait_for(held.arrived.wait(), 60)  # did the create land? asked
    first.cancel()  # stopped there
    held.release()
    with pytest.raises(asyncio.CancelledError):
        await first
    [issue] = [i async for i in forge.iter_issues(SCOUT_VAULT, state="all")
               if i["title"] == subject]
    return issue


async def test_the_doctor_records_a_send_an_older_catch_up_indexed_as_a_row_alone(
        embedded: Embedded) -> None:
    """A keyed send stopped after its create landed (its answer a 502, its look for it held
    and the send stopped there, its own webhook lost), then indexed as a row alone, as a
    release before 44's catch-up did: no `mail.sent`, its recipient never woken. The doctor
    reports it, and records it as its sender would have, once however often it runs.
    Acted out: the doctor said nothing of it (`would repair: 0`)."""
    services = embedded.services
    issue = await _send_stopped_after_its_create(embedded, "Row alone", "row-alone")
    record = mail_from_issue(SCOUT_VAULT, issue, services.keyring, app_login=services.bot_login)
    assert record is not None
    store = services.store
    async with store.transaction() as db:  # what the older catch-up wrote: the row alone
        await mails.put_mail(db, record)
    embedded.forge.faults.drop_webhooks()

    code, out = await vaultmail(embedded, "doctor", "--dry-run")
    assert code == 1 and _count(out, "would repair") == 1 and record.ref in out, out
    code, out = await vaultmail(embedded, "doctor")
    assert code == 0 and _count(out, "repaired") == 1, out
    code, out = await vaultmail(embedded, "doctor")
    assert code == 0 and _count(out, "repaired") == 0 and _count(out, "flagged") == 0, out
    sent = [e.subject for e in await embedded.ledger_events("mail.sent")
            if e.data.get("mail") == record.mail_id]
    assert sent == [record.ref], "the send is ledgered once"
    queued = [e.subject for e in await embedded.ledger_events("run.queued")]
    assert queued.count(record.ref) == 1, "its recipient's run admitted once"
    assert not await mails.send_begun(store, record.mail_id)


async def test_a_begun_send_caught_up_after_its_recipient_answered_it_wakes_no_one(
        embedded: Embedded) -> None:
    """A keyed send stopped after its create landed, its pending row kept (a backup taken
    while it was at work, restored after its recipient had woken and answered it: the
    issue says mail:replied). The catch-up records it as its sender did, `mail.sent` once,
    but wakes no one: the forge says it was opened already. Acted out: the catch-up admitted
    a run for it (its recipient woken twice for one mail)."""
    forge = embedded.services.forge_for_org("acme")
    issue = await _send_stopped_after_its_create(embedded, "Answered", "answered")
    await forge.set_labels(SCOUT_VAULT, int(issue["number"]), [MailState.REPLIED.value])
    embedded.forge.faults.drop_webhooks()
    ref = f"{SCOUT_VAULT}#{issue['number']}"

    code, out = await vaultmail(embedded, "doctor")
    assert ref in out, out
    sent = [e.subject for e in await embedded.ledger_events("mail.sent") if e.subject == ref]
    assert sent == [ref], "the send is ledgered once"
    queued = [e.subject for e in await embedded.ledger_events("run.queued")]
    assert ref not in queued, "no run for a mail its recipient answered"
