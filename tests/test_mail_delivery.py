"""Mail is delivered exactly once through forge failures, retries and redeliveries."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from aiohttp import web

from bot.app.egress import OutboundPolicy
from bot.app.embedded import start_embedded
from bot.app.signed_post import check_signed_post
from bot.mail.signing import PublicKeys
from tests.support import Actor, label_names

SCOUT_VAULT = "acme/scout-vault"


async def test_a_create_that_landed_before_a_502_is_not_made_twice(
        embedded: Any, tools: Any, person: Any) -> None:
    embedded.forge.faults.add("POST /repos/{owner}/{repo}/issues", status=502, count=1,
                              mode="after")
    sent = await tools("agent:builder")("mail_send", to="scout", subject="Once", body="only once")
    issues = await person("admin").issues(SCOUT_VAULT)
    assert [i["number"] for i in issues] == [sent["mail"]["number"]]


async def test_a_send_retried_with_the_same_key_returns_the_first_mail(
        embedded: Any, tools: Any, person: Any) -> None:
    builder = tools("agent:builder")
    first = await builder("mail_send", to="scout", subject="Once", body="x", idempotencyKey="k1")
    again = await builder("mail_send", to="scout", subject="Once", body="x", idempotencyKey="k1")
    assert first["mail"]["mail_id"] == again["mail"]["mail_id"]
    assert len(await person("admin").issues(SCOUT_VAULT)) == 1


async def test_a_duplicated_webhook_delivery_adopts_the_issue_once(
        embedded: Any, person: Any) -> None:
    embedded.forge.faults.duplicate_webhooks(count=3)
    marco: Actor = person("marco")
    issue = await marco.open_issue(SCOUT_VAULT, "Twice?", "Only once please")
    await embedded.settle()
    found = await marco.issue(SCOUT_VAULT, issue["number"])
    assert label_names(found) == ["mail:new"]
    assert found["body"].count("vaultmail:header") == 1
    sent = [e for e in await embedded.ledger_events("mail.sent")]
    assert len(sent) == 1


async def test_a_follow_up_on_a_replied_mail_wakes_the_recipient(
        embedded: Any, person: Any) -> None:
    marco, scout_bot = person("marco"), person("scout-bot")
    issue = await marco.open_issue(SCOUT_VAULT, "Numbers", "Q3 numbers?")
    await embedded.settle()
    await scout_bot.comment(SCOUT_VAULT, issue["number"], "Q3 is up 4%.")
    await embedded.settle()
    assert label_names(await marco.issue(SCOUT_VAULT, issue["number"])) == ["mail:replied"]
    await marco.comment(SCOUT_VAULT, issue["number"], "And Q2?")
    await embedded.settle()
    assert label_names(await marco.issue(SCOUT_VAULT, issue["number"])) == ["mail:new"]
    queued = await embedded.ledger_events("run.queued")
    assert len(queued) == 2, "the follow-up queued a second run for scout"


async def test_runs_are_dispatched_as_signed_posts(tmp_path: Path) -> None:
    received: list[tuple[bytes, dict[str, str]]] = []

    async def runner(request: web.Request) -> web.Response:
        received.append((await request.read(), dict(request.headers)))
        return web.Response(status=204)

    app = web.Application()
    app.router.add_post("/runs", runner)
    site_runner = web.AppRunner(app)
    await site_runner.setup()
    site = web.TCPSite(site_runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    office = (Path(__file__).parents[1] / "bot" / "example_office.yml").read_text()
    # scout's (the first agent's) dispatch
    office = office.replace("dispatch: none\n", f"dispatch: http://127.0.0.1:{port}/runs\n", 1)
    (tmp_path / "office.yml").write_text(office)
    emb = await start_embedded(office_path=tmp_path / "office.yml", data_dir=tmp_path / "d",
                               port=0, forge_port=0, outbound=OutboundPolicy.parse("127.0.0.1"))
    try:
        marco = emb.api_tokens["human:marco@acme.com"]
        async with __import__("aiohttp").ClientSession() as s:
            async with s.post(emb.app_url + "/api/v1/tools/mail_send",
                              headers={"Authorization": f"Bearer {marco}"},
                              json={"to": "scout", "subject": "Go", "body": "run"}) as resp:
                assert resp.status == 200
            for _ in range(100):
                if received:
                    break
                await asyncio.sleep(0.05)
            async with s.get(emb.app_url + "/.well-known/vaultmail-keys.json") as resp:
                keys = PublicKeys.from_jwks(await resp.json())
        [(body, headers)] = received
        delivery = check_signed_post(keys, "acme", f"http://127.0.0.1:{port}/runs", headers,
                                     body, now=time.time())
        payload = json.loads(body)
        assert payload["agent"] == "scout" and payload["kind"] == "mail"
        assert delivery == f"run-{payload['run']}"
    finally:
        await emb.stop()
        await site_runner.cleanup()


async def test_the_demo_story_passes() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot.cli.main", "demo", stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), 120)
    text = out.decode()
    assert proc.returncode == 0, text
    assert "loop guard" in text and "demo passed" in text and "✗" not in text


async def test_a_mail_created_just_before_a_crash_is_recovered_from_its_webhook(
        embedded: Any, person: Any) -> None:
    """The app created the issue, then died before indexing it: its own webhook indexes it."""
    from bot.mail.header import render_mail_body, sign_header

    header = sign_header(keyring=embedded.services.keyring.for_office("acme"),
                         from_principal="agent:builder",
                         to_principal="agent:scout", vault=SCOUT_VAULT, subject="Orphan",
                         body="created, then the process died")
    forge = embedded.services.forge_for(None)
    await forge.create_issue(SCOUT_VAULT, "Orphan", render_mail_body(header, "created, then "
                             "the process died"), labels=["mail:new"])
    await embedded.settle()
    found = await embedded.services.store.fetchone(
        "SELECT state FROM mails WHERE mail_id=?", (header.mail_id,))
    assert found is not None and found["state"] == "mail:new"
    [sent] = await embedded.ledger_events("mail.sent")
    assert sent.actor == "agent:builder"
    assert len(await embedded.ledger_events("run.queued")) == 1


async def test_a_late_duplicate_left_open_by_its_try_is_closed_when_its_own_webhook_comes(
        embedded: Any, tools: Any, person: Any) -> None:
    """A stalled try's create landed after another try sent the mail, and the stalled try
    stopped before closing it (its index unreachable, a crash: the fault harness on three
    replicas, a PostgreSQL restart). The late issue's own `issues.opened` closes it as a
    duplicate (not planned, no state label, a comment naming the mail): it is in no inbox,
    never indexed, never ledgered."""
    sent = (await tools("agent:builder")("mail_send", to="scout", subject="Twice",
                                         body="sent once"))["mail"]
    admin = person("admin")
    original = await admin.issue(SCOUT_VAULT, sent["number"])
    forge = embedded.services.forge_for(None)  # the app's own create, as the stalled try's
    late = await forge.create_issue(SCOUT_VAULT, original["title"], original["body"],
                                    labels=["mail:new"])
    await embedded.settle()
    dup = await admin.issue(SCOUT_VAULT, int(late["number"]))
    assert (dup["state"], dup["state_reason"], label_names(dup)) == (
        "closed", "not_planned", []), "the late duplicate is closed, in no inbox"
    said = [c["body"] for c in await admin.comments(SCOUT_VAULT, int(late["number"]))]
    assert len(said) == 1 and f"duplicate of #{sent['number']}" in said[0], said
    mail = await admin.issue(SCOUT_VAULT, sent["number"])
    assert (mail["state"], label_names(mail)) == ("open", ["mail:new"])
    rows = await embedded.services.store.fetchall(
        "SELECT number FROM mails WHERE mail_id=?", (sent["mail_id"],))
    assert [r["number"] for r in rows] == [sent["number"]]
    assert len(await embedded.ledger_events("mail.sent")) == 1
