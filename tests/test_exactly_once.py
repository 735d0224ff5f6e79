"""Exactly once (issue 9, items 3 to 8): retried tool calls, overlapping calls, replayed and
retried deliveries, a warning whose comment failed, and malformed deliveries.

Everything runs against the embedded app and its local forge over real HTTP; faults come from
the local forge's fault injection."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import hmac
import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from gidgethub import sansio
from gidgethub.routing import Router

from bot.app.context import HandlerContext, change_key, named_change_key
from bot.app.embedded import Embedded
from bot.app.worker import Worker
from bot.errors import InvalidArguments
from bot.forge import writes
from bot.store import QueueItem, idempotency, open_store
from tests.items_support import make_item, where
from tests.support import Actor, label_names, until

SCOUT_VAULT = "acme/scout-vault"
BUILDER_VAULT = "acme/builder-vault"
ISSUE = "/repos/{owner}/{repo}/issues/{issue_number}"
COMMENTS = "/repos/{owner}/{repo}/issues/{issue_number}/comments"


def short_forge_retries(embedded: Embedded, attempts: int = 2) -> None:
    """The app's forge client gives up after `attempts` tries, quickly."""
    forge = embedded.services.forge_for(None)
    forge.config = dataclasses.replace(  # type: ignore[attr-defined]
        forge.config, backoff_base=0.001, max_attempts=attempts)  # type: ignore[attr-defined]


def _sign(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


async def post_webhook(embedded: Embedded, session: aiohttp.ClientSession, event: str,
                       payload: Any, guid: str | None = None) -> tuple[int, Any]:
    body = json.dumps(payload).encode()
    headers = {"X-GitHub-Event": event, "X-GitHub-Delivery": guid or str(uuid.uuid4()),
               "X-Hub-Signature-256": _sign(embedded.services.settings.webhook_secret, body),
               "Content-Type": "application/json"}
    async with session.post(embedded.app_url + "/webhook", data=body, headers=headers) as resp:
        return resp.status, await resp.json(content_type=None)


def forge_delivery(embedded: Embedded, event: str, action: str,
                   pick: Callable[[dict[str, Any]], bool] = lambda p: True) -> dict[str, Any]:
    """The payload of the newest delivery the forge sent for `event.action` matching `pick`."""
    found = [d for d in embedded.forge.state.deliveries.values()
             if d.event == event and d.action == action and pick(d.payload)]
    assert found, f"the forge sent no {event}.{action}"
    return found[-1].payload


async def replay_under_new_id(embedded: Embedded, session: aiohttp.ClientSession,
                              event: str, payload: dict[str, Any]) -> None:
    """What Gitea's "Redeliver" (or a replayed capture) does: the same signed payload, a new
    delivery id."""
    status, body = await post_webhook(embedded, session, event, payload)
    assert status == 202 and body["queued"] is True
    await embedded.settle()


async def _mail_to_scout(tools: Any) -> dict[str, Any]:
    sent = await tools("agent:builder")("mail_send", to="scout", subject="Prices",
                                        body="EU prices, please")
    return dict(sent["mail"])


# -- 3. a retried mail_reply ------------------------------------------------------------------

async def test_a_retried_mail_reply_with_the_same_key_returns_the_first_result(
        embedded: Embedded, tools: Any, person: Any) -> None:
    mail = await _mail_to_scout(tools)
    scout = tools("agent:scout")
    first = await scout("mail_reply", mail=mail["ref"], body="Up 4%.", idempotencyKey="r-1")
    again = await scout("mail_reply", mail=mail["ref"], body="Up 4%.", idempotencyKey="r-1")
    assert again["mail"] == first["mail"]
    comments = await person("admin").comments(SCOUT_VAULT, mail["number"])
    assert [c["body"].count("Up 4%.") for c in comments] == [1], "one reply comment"
    assert len(await embedded.ledger_events("mail.replied")) == 1
    copies = [i for i in await person("admin").issues(BUILDER_VAULT)
              if i["title"].startswith("Re:")]
    assert len(copies) == 1, "builder got the reply once"


async def test_a_key_used_again_with_other_arguments_is_refused(
        embedded: Embedded, tools: Any, person: Any) -> None:
    builder = tools("agent:builder")
    await builder("mail_send", to="scout", subject="One", body="x", idempotencyKey="k")
    status, body = await builder.raw("mail_send", {"to": "scout", "subject": "Two",
                                                   "body": "y", "idempotencyKey": "k"})
    assert status == 409 and body["error"]["code"] == "idempotency_key_reused"
    assert "idempotencyKey" in body["error"]["message"]
    assert len(await person("admin").issues(SCOUT_VAULT)) == 1


# -- 4. overlapping calls with one key --------------------------------------------------------

async def test_overlapping_sends_with_one_key_open_one_issue(
        embedded: Embedded, tools: Any, person: Any) -> None:
    """A client times out and retries while its first call still waits on the forge."""
    embedded.forge.faults.delay("POST /repos/{owner}/{repo}/issues", 0.5)
    builder = tools("agent:builder")
    args = {"to": "scout", "subject": "Once", "body": "only once", "idempotencyKey": "k-4"}
    first, second = await asyncio.gather(builder("mail_send", **args),
                                         builder("mail_send", **args))
    assert first["mail"]["mail_id"] == second["mail"]["mail_id"]
    assert first["mail"]["number"] == second["mail"]["number"]
    assert len(await person("admin").issues(SCOUT_VAULT)) == 1
    assert len(await embedded.ledger_events("mail.sent")) == 1


async def test_overlapping_replies_with_one_key_post_one_comment(
        embedded: Embedded, tools: Any, person: Any) -> None:
    mail = await _mail_to_scout(tools)
    embedded.forge.faults.delay("POST " + COMMENTS, 0.5)
    scout = tools("agent:scout")
    args = {"mail": mail["ref"], "body": "On it.", "idempotencyKey": "r-4"}
    first, second = await asyncio.gather(scout("mail_reply", **args),
                                         scout("mail_reply", **args))
    assert first["mail"] == second["mail"]
    comments = await person("admin").comments(SCOUT_VAULT, mail["number"])
    assert sum("On it." in c["body"] for c in comments) == 1
    assert len(await embedded.ledger_events("mail.replied")) == 1


async def test_a_comment_retried_with_its_key_is_posted_once(
        embedded: Embedded, tools: Any, person: Any) -> None:
    """The same class elsewhere: add_comment takes an idempotencyKey too."""
    marco: Actor = person("marco")
    target = await make_item(embedded, marco, "outcome", "Faster checkout")
    args = {"targetType": "outcome", "target": target, "body": "Started on it.",
            "idempotencyKey": "c-1"}
    scout = tools("agent:scout")
    first, second = await asyncio.gather(scout("add_comment", **args),
                                         scout("add_comment", **args))
    third = await scout("add_comment", **args)
    assert first["comment"]["id"] == second["comment"]["id"] == third["comment"]["id"]
    comments = await marco.comments(*where(target))
    assert sum("Started on it." in c["body"] for c in comments) == 1
    assert len(await embedded.ledger_events("comment.added")) == 1


async def test_a_chat_retried_with_its_key_starts_one_chat_and_reads_the_answer_fresh(
        embedded: Embedded, tools: Any) -> None:
    """The same class elsewhere: agent_chat takes an idempotencyKey; the retry returns the
    first chat, with the answer it has by then."""
    marco, scout = tools("human:marco@acme.com"), tools("agent:scout")
    args = {"agent": "scout", "message": "EU or US first?", "idempotencyKey": "chat-1"}
    first = await marco("agent_chat", **args)
    await scout("chat_reply", chat=first["chat"]["chat"], message="EU first")
    again = await marco("agent_chat", **args, wait=5)
    assert again["chat"]["chat"] == first["chat"]["chat"]
    assert again["chat"]["answer"] == "EU first"
    rows = await embedded.services.store.fetchall("SELECT id FROM chats")
    assert len(rows) == 1
    assert len(await embedded.ledger_events("run.queued")) == 1


# -- 5. a delivery replayed under a new delivery id -------------------------------------------

async def test_a_replayed_mail_command_does_not_send_again(
        embedded: Embedded, person: Any, session: aiohttp.ClientSession) -> None:
    marco: Actor = person("marco")
    issue = await marco.open_issue("acme/.github", "Planning", "notes")
    await marco.comment("acme/.github", issue["number"], "/mail scout Prices\nCheck them")
    await embedded.settle()
    payload = forge_delivery(embedded, "issue_comment", "created",
                             lambda p: p["comment"]["user"]["login"] == "marco")
    await replay_under_new_id(embedded, session, "issue_comment", payload)
    assert [i["title"] for i in await marco.issues(SCOUT_VAULT)] == ["Prices"]
    answers = [c for c in await marco.comments("acme/.github", issue["number"])
               if c["body"].startswith("@marco")]
    assert len(answers) == 1, "the app answered the command once"
    assert len(await embedded.ledger_events("mail.sent")) == 1


async def test_a_replayed_reply_does_not_take_the_turn_back(
        embedded: Embedded, person: Any, session: aiohttp.ClientSession) -> None:
    marco, scout_bot = person("marco"), person("scout-bot")
    issue = await marco.open_issue(SCOUT_VAULT, "Numbers", "Q3 numbers?")
    await embedded.settle()
    await scout_bot.comment(SCOUT_VAULT, issue["number"], "Q3 is up 4%.")
    await embedded.settle()
    reply = forge_delivery(embedded, "issue_comment", "created",
                           lambda p: p["comment"]["user"]["login"] == "scout-bot")
    await marco.comment(SCOUT_VAULT, issue["number"], "And Q2?")
    await embedded.settle()
    await replay_under_new_id(embedded, session, "issue_comment", reply)
    assert label_names(await marco.issue(SCOUT_VAULT, issue["number"])) == ["mail:new"]
    assert len(await embedded.ledger_events("mail.replied")) == 1


# -- 6. per-issue order across retries --------------------------------------------------------

async def test_a_retried_delivery_still_runs_before_later_ones_about_its_issue(
        embedded: Embedded, person: Any) -> None:
    """The adoption fails once; the close that follows waits for it. The adoption's retry finds
    the issue closed and takes it as found (issue 28): a closed mail, sent and closed once
    each, and no run queued for it (there is nothing left to do)."""
    short_forge_retries(embedded, attempts=1)
    embedded.worker.base_backoff = 0.5  # the retry comes well after the close has arrived
    store = embedded.services.store
    embedded.forge.faults.add("PATCH " + ISSUE, status=502, count=1)
    marco: Actor = person("marco")
    issue = await marco.open_issue(SCOUT_VAULT, "Order", "first things first")

    async def adoption_failed() -> bool:
        row = await store.fetchone("SELECT attempts FROM queue WHERE event='issues' "
                                   "ORDER BY id DESC LIMIT 1")
        return row is not None and row["attempts"] == 1

    await until(adoption_failed)
    await marco.call("PATCH", f"/repos/{SCOUT_VAULT}/issues/{issue['number']}",
                     {"state": "closed"}, expect=200)
    await embedded.settle()
    found = await marco.issue(SCOUT_VAULT, issue["number"])
    assert found["state"] == "closed"
    assert label_names(found) == ["mail:closed"]
    events = [e.event for e in await embedded.ledger_events("mail.sent")
              + await embedded.ledger_events("run.queued")
              + await embedded.ledger_events("mail.closed")]
    assert sorted(events) == ["mail.closed", "mail.sent"], "no run queued for a closed mail"


# -- 7. the tamper warning --------------------------------------------------------------------

async def test_the_tamper_warning_is_posted_even_when_its_first_post_fails(
        embedded: Embedded, tools: Any, person: Any) -> None:
    short_forge_retries(embedded, attempts=2)
    embedded.worker.base_backoff = 0.01
    mail = await _mail_to_scout(tools)
    marco: Actor = person("marco")
    path = f"/repos/{SCOUT_VAULT}/issues/{mail['number']}"
    issue = await marco.issue(SCOUT_VAULT, mail["number"])
    embedded.forge.faults.add("POST " + COMMENTS, status=502, count=2)  # every try of one call
    await marco.call("PATCH", path, {"body": issue["body"].replace("EU prices", "US prices")},
                     expect=200)
    await embedded.settle()
    warnings = [c for c in await marco.comments(SCOUT_VAULT, mail["number"])
                if "changed after it was sent" in c["body"]]
    assert len(warnings) == 1
    assert len(await embedded.ledger_events("mail.tampered")) == 1
    got = await tools("agent:scout")("mail_get", mail=mail["ref"])
    assert got["mail"]["tampered"] is True
    again = [c for c in await marco.comments(SCOUT_VAULT, mail["number"])
             if "changed after it was sent" in c["body"]]
    assert len(again) == 1, "read again, the warning is not repeated"


# -- 8. malformed deliveries ------------------------------------------------------------------

async def test_a_malformed_delivery_fails_alone_and_ends_in_dead_letters(
        embedded: Embedded, person: Any, session: aiohttp.ClientSession) -> None:
    embedded.worker.base_backoff, embedded.worker.max_attempts = 0.01, 3
    good = forge_delivery(embedded, "installation", "created")
    bad_sender = {"action": "opened", "sender": "notadict", "issue": {"number": 1},
                  "repository": {"full_name": SCOUT_VAULT}}
    bad_installation = {"action": "created", "installation": "notadict", "sender": "x"}
    answers = await asyncio.gather(
        post_webhook(embedded, session, "issues", bad_sender),
        post_webhook(embedded, session, "installation", bad_installation),
        *(post_webhook(embedded, session, "ping", {"zen": f"z{i}", "hook_id": i})
          for i in range(5)),
        post_webhook(embedded, session, "installation", good))
    assert [status for status, _ in answers] == [202] * 8
    await embedded.settle()
    dead = await embedded.services.store.dead_letters()
    assert sorted(d.event for d in dead) == ["installation", "issues"]
    assert all(d.attempts == 3 and d.last_error for d in dead)
    async with session.get(embedded.app_url + "/healthz") as resp:
        health = await resp.json()
    assert health["queue_pending"] == 0 and health["dead_letters"] == 2
    marco: Actor = person("marco")
    issue = await marco.open_issue(SCOUT_VAULT, "Still working", "after the bad ones")
    await embedded.settle()
    assert label_names(await marco.issue(SCOUT_VAULT, issue["number"])) == ["mail:new"]


async def test_a_delivery_failing_in_a_batch_holds_the_rest_of_its_issue(
        tmp_path: Path) -> None:
    """Both deliveries are taken in one batch; the first fails once: the second still runs
    after it (the worker stops that issue's group, the store holds it until the retry)."""
    store = await open_store(tmp_path / "index.sqlite3")
    router = Router()
    handled: list[str] = []
    failed: list[str] = []

    @router.register("issues")
    async def record(event: sansio.Event, ctx: HandlerContext) -> None:
        action = event.data["action"]
        if action == "opened" and not failed:
            failed.append(action)
            raise RuntimeError("the forge said 502")
        handled.append(action)

    def context(item: QueueItem, log: Any) -> HandlerContext:
        return HandlerContext(services=None, forge=None, installation_id=None,  # type: ignore[arg-type]
                              delivery_id=item.guid, log=log)

    worker = Worker(store, router, Router(), lambda payload: False, context,
                    base_backoff=0.05)
    try:
        for guid, action in (("a1", "opened"), ("a2", "closed")):
            payload = {"action": action, "issue": {"number": 1},
                       "repository": {"full_name": SCOUT_VAULT}}
            raw = json.dumps(payload).encode()
            assert await store.enqueue_delivery(guid, "issues", payload, raw)
        worker.start()
        await worker.idle(timeout=10)
        assert failed == ["opened"] and handled == ["opened", "closed"]
    finally:
        await worker.stop()
        await store.close()


async def test_a_stop_that_cuts_a_batch_short_still_records_what_finished(
        tmp_path: Path) -> None:
    """A shutdown whose drain times out cancels the batch: a delivery that was handled by
    then is recorded all the same, its change's result with it, so that the replica that
    takes the rest over does not handle that change again."""
    store = await open_store(tmp_path / "index.sqlite3")
    router = Router()
    handled: list[int] = []
    stuck = asyncio.Event()

    @router.register("issues", action="opened")
    async def adopt(event: sansio.Event, ctx: HandlerContext) -> None:
        number = event.data["issue"]["number"]
        handled.append(number)
        if number == 2:
            await stuck.wait()  # a forge that never answers

    def context(item: QueueItem, log: Any) -> HandlerContext:
        return HandlerContext(services=None, forge=None, installation_id=None,  # type: ignore[arg-type]
                              delivery_id=item.guid, log=log)

    worker = Worker(store, router, Router(), lambda payload: False, context)
    try:
        for number in (1, 2):
            payload = {"action": "opened", "issue": {"number": number, "id": 10 + number},
                       "repository": {"full_name": SCOUT_VAULT}}
            assert await store.enqueue_delivery(f"d{number}", "issues", payload,
                                                json.dumps(payload).encode())
        worker.start()
        await until(lambda: handled == [1, 2] or handled == [2, 1])
        await worker.stop(drain_timeout=1.0)  # (delivery 1 is done well before)
        rows = await store.fetchall("SELECT key, result FROM idempotency ORDER BY key")
        assert [(r["key"], r["result"]) for r in rows] == [
            ("issues.opened:acme:11", '{"delivery": "d1"}'), ("issues.opened:acme:12", None)]
        states = await store.fetchall("SELECT guid, state FROM queue ORDER BY guid")
        assert [(r["guid"], r["state"]) for r in states] == [("d1", "done"), ("d2", "pending")]
    finally:
        stuck.set()
        await store.close()


async def test_an_opening_naming_another_orgs_issue_id_hides_not_that_orgs_opening(
        tmp_path: Path) -> None:
    """A change is keyed by the forge's ids within its org: globex's admins, who sign
    globex's Gitea deliveries and may put any id in them, name the id of acme's issue in an
    opening of their own, delivered first; acme's opening is handled all the same."""
    store = await open_store(tmp_path / "index.sqlite3")
    router = Router()
    handled: list[str] = []

    @router.register("issues", action="opened")
    async def adopt(event: sansio.Event, ctx: HandlerContext) -> None:
        handled.append(event.data["repository"]["full_name"])

    def context(item: QueueItem, log: Any) -> HandlerContext:
        return HandlerContext(services=None, forge=None, installation_id=None,  # type: ignore[arg-type]
                              delivery_id=item.guid, log=log)

    worker = Worker(store, router, Router(), lambda payload: False, context)
    try:
        for guid, org in (("d1", "globex"), ("d2", "acme")):
            payload = {"action": "opened", "issue": {"number": 1, "id": 300001},
                       "repository": {"full_name": f"{org}/scout-vault"}}
            assert await store.enqueue_delivery(guid, "issues", payload,
                                                json.dumps(payload).encode())
        worker.start()
        await until(lambda: len(handled) == 2)
        assert sorted(handled) == ["acme/scout-vault", "globex/scout-vault"]
    finally:
        await worker.stop()
        await store.close()


PRODUCT = "acme/product"


async def test_a_mail_command_is_confirmed_once_when_the_confirmation_post_fails_after_landing(
        embedded: Embedded, person: Any) -> None:
    """`/mail scout ...` in a comment: the app sends the mail, then says "mail sent to ...".
    That reply carries no marker, so when its POST lands but the answer is lost (a 502 after
    the write), the delivery is retried and the person reads the confirmation twice."""
    embedded.forge.add_repo("acme", "product")
    embedded.forge.set_permission(PRODUCT, "marco", "write")
    marco = person("marco")
    issue = await marco.open_issue(PRODUCT, "Pricing", "Where we talk about pricing")
    await embedded.settle()
    held = embedded.forge.faults.hold("POST /repos/{owner}/{repo}/issues")
    await marco.comment(PRODUCT, issue["number"], "/mail scout Prices\nEU prices, please")
    await held.caught_at_least(1)  # the app is sending the mail now
    embedded.forge.faults.add("POST /repos/{owner}/{repo}/issues/{issue_number}/comments",
                              status=502, count=1, mode="after")
    held.release()
    await embedded.settle()
    said = [c["body"] for c in await person("admin").comments(PRODUCT, issue["number"])
            if "mail sent to" in c["body"]]
    assert len(said) == 1, said


async def test_closing_a_closed_mail_again_writes_nothing_and_ledgers_nothing(
        embedded: Embedded, tools: Any) -> None:
    """`mail_close` twice (a client that lost the first answer and calls again without a
    key): the second finds the mail closed and says so, with no PATCH and no second
    `mail.closed`."""
    sent = await tools("agent:builder")("mail_send", to="scout", subject="Done?", body="EU")
    ref = sent["mail"]["ref"]
    await embedded.settle()
    first = await tools("agent:builder")("mail_close", mail=ref)
    patch = "PATCH /repos/{owner}/{repo}/issues/{issue_number}"
    before = embedded.forge.requests.count(patch)
    again = await tools("agent:builder")("mail_close", mail=ref)
    assert first["mail"]["state"] == again["mail"]["state"] == "mail:closed"
    assert embedded.forge.requests.count(patch) == before
    assert len(await embedded.ledger_events("mail.closed")) == 1


async def test_a_refused_retry_keeps_the_key_of_a_try_that_wrote(tmp_path: Path) -> None:
    """A first try writes, then crashes; its retry is refused before writing again (the
    installation suspended, say). The key stays claimed: the try after that still looks on
    the forge for what the first wrote, instead of writing it again."""
    store = await open_store(tmp_path / "i.sqlite3")
    seen: list[bool] = []
    try:
        async def first() -> dict[str, Any]:
            writes.note()                       # posted the reply comment
            raise RuntimeError("crash after the write")

        with pytest.raises(RuntimeError):
            await store.once("s", "k", "f", first)

        async def second() -> dict[str, Any]:
            seen.append(idempotency.resumed())
            raise InvalidArguments("refused this time, before writing again")

        with pytest.raises(InvalidArguments):
            await store.once("s", "k", "f", second)

        async def third() -> dict[str, Any]:
            seen.append(idempotency.resumed())
            return {}

        await store.once("s", "k", "f", third)
        assert seen == [True, True], "third try must still look on the forge (resumed)"
    finally:
        await store.close()


async def test_an_issue_opening_replayed_under_a_new_id_is_refused_once(
        embedded: Embedded, person: Any, session: aiohttp.ClientSession) -> None:
    """Gitea's "Redeliver" of an `issues.opened` gives a new delivery id: the opening is one
    change, so its refusal is said and ledgered once."""
    lee = person("lee")  # no mail.send
    issue = await lee.open_issue(SCOUT_VAULT, "Hi", "please do X")
    await embedded.settle()
    payload = forge_delivery(embedded, "issues", "opened",
                             lambda p: p["issue"]["number"] == issue["number"]
                             and p["repository"]["full_name"].lower() == SCOUT_VAULT)
    await replay_under_new_id(embedded, session, "issues", payload)
    said = [c["body"] for c in await person("admin").comments(SCOUT_VAULT, issue["number"])
            if "cannot become mail" in c["body"]]
    denied = await embedded.ledger_events("run.denied")
    assert len(said) == 1, said
    assert len(denied) == 1, denied


async def test_a_retried_reply_does_not_reopen_a_mail_its_sender_closed_since(
        embedded: Embedded, tools: Any, person: Any) -> None:
    """The reply lands, its copy fails; the sender reads it and closes the mail; the
    recipient's client retries the reply with its key. The reply was applied once: the mail
    stays closed and `mail.replied` is ledgered once."""
    sent = await tools("agent:builder")("mail_send", to="scout", subject="Q", body="EU?")
    await embedded.settle()
    ref = sent["mail"]["ref"]
    short_forge_retries(embedded, attempts=1)
    embedded.forge.faults.add("POST /repos/{owner}/{repo}/issues", status=502, count=1)
    scout = tools("agent:scout")
    status, body = await scout.raw("mail_reply", {"mail": ref, "body": "Up 4%",
                                                  "idempotencyKey": "r1"})
    assert status != 200, body            # the copy failed: client will retry
    await tools("agent:builder")("mail_close", mail=ref)  # sender read the reply, closes
    await scout("mail_reply", mail=ref, body="Up 4%", idempotencyKey="r1")
    await embedded.settle()
    issue = await person("admin").issue(SCOUT_VAULT, sent["mail"]["number"])
    replied = await embedded.ledger_events("mail.replied")
    assert len(replied) == 1 and issue["state"] == "closed", (len(replied), issue["state"])


# -- one forge change, however its repository is named ----------------------------------------

def _named(payload: dict[str, Any], full_name: str) -> dict[str, Any]:
    """`payload` as a capture naming its repository `full_name` (another case, or its name
    after a rename) would carry it: the same change, the same ids."""
    owner, name = full_name.split("/")
    repo = {**payload["repository"], "full_name": full_name, "name": name,
            "owner": {**payload["repository"]["owner"], "login": owner}}
    return {**payload, "repository": repo}


async def test_an_opening_replayed_naming_its_repository_in_capitals_is_refused_once(
        embedded: Embedded, person: Any, session: aiohttp.ClientSession) -> None:
    """GitHub's payloads spell a repository as its owner does (`Acme/Scout-Vault`), a rename
    or another capture in lower case: the opening is one change (the issue's id), so a copy
    naming the repository in another case is refused, said and ledgered once."""
    lee = person("lee")  # no mail.send
    issue = await lee.open_issue(SCOUT_VAULT, "Hi", "please do X")
    await embedded.settle()
    payload = forge_delivery(embedded, "issues", "opened",
                             lambda p: p["issue"]["number"] == issue["number"]
                             and p["repository"]["full_name"].lower() == SCOUT_VAULT)
    await replay_under_new_id(embedded, session, "issues", _named(payload, "Acme/Scout-Vault"))
    said = [c["body"] for c in await person("admin").comments(SCOUT_VAULT, issue["number"])
            if "cannot become mail" in c["body"]]
    assert len(said) == 1, said
    assert len(await embedded.ledger_events("run.denied")) == 1


async def test_a_reply_replayed_under_its_vaults_new_name_does_not_take_the_turn_back(
        embedded: Embedded, person: Any, session: aiohttp.ClientSession) -> None:
    """scout's reply is delivered naming acme/scout-vault; marco answers it; the vault is
    renamed scout-mail, and the reply arrives again naming the new name (a capture replayed):
    one comment, one reply, the turn stays marco's answer's."""
    marco, scout_bot = person("marco"), person("scout-bot")
    issue = await marco.open_issue(SCOUT_VAULT, "Numbers", "Q3 numbers?")
    await embedded.settle()
    await scout_bot.comment(SCOUT_VAULT, issue["number"], "Q3 is up 4%.")
    await embedded.settle()
    reply = forge_delivery(embedded, "issue_comment", "created",
                           lambda p: p["comment"]["user"]["login"] == "scout-bot")
    await marco.comment(SCOUT_VAULT, issue["number"], "And Q2?")
    await embedded.settle()
    embedded.forge.rename_repo(SCOUT_VAULT, "scout-mail")
    await embedded.settle()
    await replay_under_new_id(embedded, session, "issue_comment",
                              _named(reply, "acme/scout-mail"))
    assert label_names(await marco.issue("acme/scout-mail", issue["number"])) == ["mail:new"]
    assert len(await embedded.ledger_events("mail.replied")) == 1


async def _as_a_release_before_left_it(embedded: Embedded, payload: dict[str, Any], *,
                                       finished: bool) -> str:
    """The change `payload` reports, its row moved to the key releases before recorded it
    under (the repository's name in it, as spelt), as one of them would have left it:
    finished, or claimed and left unfinished. Returns that key."""
    new, named = change_key("issues", payload), named_change_key("issues", payload)
    assert new is not None and named is not None and new != named
    async with embedded.services.store.transaction() as db:
        await db.execute("UPDATE idempotency SET key=? WHERE scope='forge' AND key=?",
                         (named, new))
        if not finished:
            await db.execute("UPDATE idempotency SET result=NULL, done_at=NULL, owner=NULL"
                             " WHERE scope='forge' AND key=?", (named,))
    return named


async def test_an_opening_a_release_before_handled_is_recognised_when_redelivered(
        embedded: Embedded, person: Any, session: aiohttp.ClientSession) -> None:
    """lee's opening was refused by a release that keyed it by its repository's name; the
    app is upgraded and the opening redelivered as it was sent: still one change, refused,
    said and ledgered once."""
    lee = person("lee")
    issue = await lee.open_issue(SCOUT_VAULT, "Hi", "please do X")
    await embedded.settle()
    payload = forge_delivery(embedded, "issues", "opened",
                             lambda p: p["issue"]["number"] == issue["number"])
    await _as_a_release_before_left_it(embedded, payload, finished=True)
    await replay_under_new_id(embedded, session, "issues", payload)
    said = [c["body"] for c in await person("admin").comments(SCOUT_VAULT, issue["number"])
            if "cannot become mail" in c["body"]]
    assert len(said) == 1, said
    assert len(await embedded.ledger_events("run.denied")) == 1


async def test_an_opening_a_release_before_left_unfinished_goes_on_from_its_try(
        embedded: Embedded, person: Any, session: aiohttp.ClientSession) -> None:
    """A release before began refusing lee's opening (its comment, marked from the key it
    used, is on the forge) and stopped before recording it; upgraded, the opening is
    redelivered: the refusal is looked for by that try's marker, and not said again."""
    lee = person("lee")
    issue = await lee.open_issue(SCOUT_VAULT, "Hi", "please do X")
    await embedded.settle()
    payload = forge_delivery(embedded, "issues", "opened",
                             lambda p: p["issue"]["number"] == issue["number"])
    named = await _as_a_release_before_left_it(embedded, payload, finished=False)
    # the refusal as that release marked it (its marker made from its key)
    new = change_key("issues", payload)
    ours, theirs = (hashlib.sha256(str(k).encode()).hexdigest()[:20] for k in (new, named))
    repo = embedded.forge.state.repo("acme", "scout-vault")
    assert repo is not None
    said = [c for c in repo.comments.values() if ours in c.body]
    assert len(said) == 1
    said[0].body = said[0].body.replace(ours, theirs)
    await replay_under_new_id(embedded, session, "issues", payload)
    said_now = [c["body"] for c in await person("admin").comments(SCOUT_VAULT, issue["number"])
                if "cannot become mail" in c["body"]]
    assert len(said_now) == 1, said_now
