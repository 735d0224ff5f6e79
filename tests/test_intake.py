"""Webhook intake over real HTTP: signatures, dedupe, persistence, retries and dead letters."""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import uuid

import aiohttp

from bot.app.embedded import Embedded
from bot.app.intake import signature_valid
from bot.store import ledger
from tests.support import Actor, label_names


def _sign(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def test_signature_matches_githubs_published_test_vector() -> None:
    header = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
    assert signature_valid(b"Hello, World!", header, "It's a Secret to Everybody")
    assert not signature_valid(b"Hello, World?", header, "It's a Secret to Everybody")
    assert not signature_valid(b"Hello, World!", None, "It's a Secret to Everybody")


async def _queue_rows(embedded: Embedded) -> int:
    row = await embedded.services.store.fetchone("SELECT COUNT(*) AS n FROM queue")
    return int(row["n"]) if row else 0


async def test_unsigned_and_forged_deliveries_are_refused_and_nothing_is_stored(
        embedded: Embedded, session: aiohttp.ClientSession) -> None:
    before = await _queue_rows(embedded)
    body = json.dumps({"action": "opened", "sender": {"login": "x"}}).encode()
    base = {"X-GitHub-Event": "issues", "X-GitHub-Delivery": str(uuid.uuid4()),
            "Content-Type": "application/json"}
    for extra in ({}, {"X-Hub-Signature-256": _sign("wrong secret", body)},
                  {"X-Hub-Signature": "sha1=" + hmac.new(
                      embedded.services.settings.webhook_secret.encode(), body,
                      hashlib.sha1).hexdigest()}):
        async with session.post(embedded.app_url + "/webhook", data=body,
                                headers={**base, **extra}) as resp:
            assert resp.status == 401
            assert (await resp.json())["error"]["code"] == "bad_signature"
    assert await _queue_rows(embedded) == before


README_PUSHED = {
    "ref": "refs/heads/main", "after": "0" * 40, "pusher": {"name": "marco"},
    "commits": [{"added": [], "modified": ["README.md"], "removed": []}],
    "repository": {"full_name": "acme/.github", "name": ".github", "owner": {"login": "acme"},
                   "default_branch": "main"},
    "sender": {"login": "marco"}, "installation": {"id": 1}}


async def test_a_signed_delivery_is_queued_once_even_when_sent_twice(
        embedded: Embedded, session: aiohttp.ClientSession) -> None:
    body = json.dumps(README_PUSHED).encode()  # (a push to .github: a handler reads it)
    headers = {"X-GitHub-Event": "push", "X-GitHub-Delivery": str(uuid.uuid4()),
               "X-Hub-Signature-256": _sign(embedded.services.settings.webhook_secret, body),
               "Content-Type": "application/json"}
    answers = []
    for _ in range(2):
        async with session.post(embedded.app_url + "/webhook", data=body,
                                headers=headers) as resp:
            assert resp.status == 202
            answers.append((await resp.json())["queued"])
    assert answers == [True, False]
    await embedded.settle()
    row = await embedded.services.store.fetchone(
        "SELECT COUNT(*) AS n FROM queue WHERE guid=?", (headers["X-GitHub-Delivery"],))
    assert row is not None and row["n"] == 1


async def test_the_apps_own_echo_is_answered_unstored_and_other_payloads_keep_their_numbers(
        embedded: Embedded, session: aiohttp.ClientSession) -> None:
    """Intake tells the app's own write coming back (an `issues.edited` by vaultmail[bot]) at a
    glance, before the checks of what it keeps, and answers it unstored; a payload it keeps is
    read as json.loads reads it all the same, a number past 64 bits included (orjson's glance
    makes it a float)."""
    secret = embedded.services.settings.webhook_secret
    long = 123456789012345678901234567890

    async def post(payload: dict[str, object]) -> tuple[str, dict[str, object]]:
        body = json.dumps(payload).encode()
        guid = str(uuid.uuid4())
        async with session.post(embedded.app_url + "/webhook", data=body, headers={
                "X-GitHub-Event": "issues", "X-GitHub-Delivery": guid,
                "X-Hub-Signature-256": _sign(secret, body),
                "Content-Type": "application/json"}) as resp:
            assert resp.status == 202 and resp.content_type == "application/json"
            return guid, await resp.json()

    before = await _queue_rows(embedded)
    echo = {"action": "edited", "issue": {"number": 1, "n": long},
            "repository": {"full_name": "acme/scout-vault"},
            "sender": {"login": "vaultmail[bot]"}, "installation": {"id": 1}}
    guid, answer = await post(echo)
    assert answer == {"delivery": guid, "queued": False, "ignored": True}
    assert await _queue_rows(embedded) == before
    kept = {**echo, "sender": {"login": "marco"}}
    guid, answer = await post(kept)
    assert answer == {"delivery": guid, "queued": True}
    row = await embedded.services.store.fetchone("SELECT payload FROM queue WHERE guid=?",
                                                 (guid,))
    assert row is not None and json.loads(row["payload"])["issue"]["n"] == long


async def test_what_no_handler_acts_on_is_answered_and_never_queued(
        embedded: Embedded, session: aiohttp.ClientSession) -> None:
    """A ping, an issue pinned, and a push or pull request to any repository but the org's
    `.github` (the App hears every push of every repository it is installed on): answered,
    never queued, so a busy org's pushes cost no commit and hold no other office's deliveries
    up in the worker; a push to `.github` is queued."""
    secret = embedded.services.settings.webhook_secret

    async def post(event: str, payload: dict[str, object]) -> dict[str, object]:
        body = json.dumps({**payload, "sender": {"login": "marco"},
                           "installation": {"id": 1}}).encode()
        async with session.post(embedded.app_url + "/webhook", data=body, headers={
                "X-GitHub-Event": event, "X-GitHub-Delivery": str(uuid.uuid4()),
                "X-Hub-Signature-256": _sign(secret, body),
                "Content-Type": "application/json"}) as resp:
            assert resp.status == 202
            answer: dict[str, object] = await resp.json()
            return answer

    def repo(name: str) -> dict[str, object]:
        return {"full_name": f"acme/{name}", "name": name, "owner": {"login": "acme"},
                "default_branch": "main"}

    push = {"ref": "refs/heads/main", "after": "0" * 40, "pusher": {"name": "marco"},
            "commits": [{"added": [], "modified": ["README.md"], "removed": []}]}
    before = await _queue_rows(embedded)
    for event, payload in (
            ("ping", {"zen": "Design for failure.", "hook_id": 1}),
            ("issues", {"action": "pinned", "issue": {"number": 1},
                        "repository": repo("scout-vault")}),
            ("push", {**push, "repository": repo("website")}),
            ("pull_request", {"action": "opened", "number": 3, "pull_request": {"number": 3},
                              "repository": repo("website")})):
        assert (await post(event, payload))["ignored"] is True, event
    assert await _queue_rows(embedded) == before
    answer = await post("push", {**push, "repository": repo(".github")})
    assert answer["queued"] is True
    assert await _queue_rows(embedded) == before + 1


async def test_forge_redelivery_keeps_the_delivery_id_and_is_handled_once(
        embedded: Embedded, person) -> None:  # type: ignore[no-untyped-def]
    marco: Actor = person("marco")
    issue = await marco.open_issue("acme/scout-vault", "Prices", "Check EU prices please")
    await embedded.settle()
    app = embedded.services.forge_client.app()  # the App's JWT, as an operator's script would
    deliveries = [d async for d in app.iter_deliveries()
                  if d["event"] == "issues" and d["action"] == "opened"]
    assert len(deliveries) == 1, "the forge recorded the issues.opened delivery"
    original = deliveries[0]
    await app.redeliver(original["id"])
    await embedded.settle()
    again = [d async for d in app.iter_deliveries() if d["guid"] == original["guid"]]
    assert len(again) == 2 and any(d["redelivery"] for d in again)
    rows = await embedded.services.store.fetchall(
        "SELECT state FROM queue WHERE guid=?", (original["guid"],))
    assert [r["state"] for r in rows] == ["done"]
    comments = await marco.comments("acme/scout-vault", issue["number"])
    assert comments == [], "a redelivery must not make the app act twice"
    # what adopting does happened once: one mail indexed, ledgered and run, one label set
    ref = f"acme/scout-vault#{issue['number']}"
    ledgered = [e.event for e in await ledger.entries(embedded.services.store)
                if e.subject == ref]
    assert ledgered == ["mail.sent", "run.queued"], ledgered
    indexed = await embedded.services.store.fetchall(
        "SELECT mail_id FROM mails WHERE vault=? AND number=?",
        ("acme/scout-vault", issue["number"]))
    assert len(indexed) == 1
    timeline = await marco.call(
        "GET", f"/repos/acme/scout-vault/issues/{issue['number']}/timeline", expect=200)
    labelled = [e for e in timeline if e.get("event") == "labeled"
                and e["label"]["name"] == "mail:new"]
    assert len(labelled) == 1, "the app labelled the issue once"


async def test_labels_are_provisioned_in_every_vault_at_install(
        embedded: Embedded, person) -> None:  # type: ignore[no-untyped-def]
    admin: Actor = person("admin")
    for vault in embedded.office.vaults():
        labels = await admin.call("GET", f"/repos/{vault}/labels", expect=200)
        mail = {lab["name"]: lab for lab in labels if lab["name"].startswith("mail:")}
        assert sorted(mail) == ["mail:closed", "mail:held", "mail:new", "mail:replied",
                                "mail:working"]
        assert mail["mail:new"]["color"] == "0e8a16" and mail["mail:new"]["description"]
    other = await admin.call("GET", "/repos/acme/.github/labels", expect=200)
    assert not [lab for lab in other if lab["name"].startswith("mail:")]


async def test_a_failing_handler_is_retried_then_dead_lettered_and_replayed(
        embedded: Embedded, person) -> None:  # type: ignore[no-untyped-def]
    worker = embedded.worker
    worker.base_backoff, worker.max_attempts = 0.01, 2
    forge = embedded.services.forge_for(None)  # keep the client's own retries short
    forge.config = dataclasses.replace(forge.config, backoff_base=0.001, max_attempts=2)  # type: ignore[attr-defined]
    fault = embedded.forge.faults.add("PATCH /repos/{owner}/{repo}/issues/{issue_number}",
                                      status=503)
    marco: Actor = person("marco")
    issue = await marco.open_issue("acme/scout-vault", "Budget", "Numbers for Q3?")
    await embedded.settle()
    dead = await embedded.services.store.dead_letters()
    assert [d.event for d in dead] == ["issues"] and "503" in (dead[0].last_error or "")
    embedded.forge.faults.routes.remove(fault)
    assert await embedded.services.store.replay() == 1
    embedded.worker.wake()
    await embedded.settle()
    assert label_names(await marco.issue("acme/scout-vault", issue["number"])) == ["mail:new"]
    assert await embedded.services.store.dead_letters() == []


async def test_healthz_reports_the_queue(embedded: Embedded,
                                         session: aiohttp.ClientSession) -> None:
    async with session.get(embedded.app_url + "/healthz") as resp:
        body = await resp.json()
    assert resp.status == 200 and body["status"] == "ok" and body["app"] == "vaultmail"
    assert body["dead_letters"] == 0
