"""Issue 21, what an attacker of a multi-tenant deployment tried: webhook bodies that hold the
app's memory and connections before their signature is checked, JSON nested past the stack,
/readyz naming every tenant, a captured `issues.closed` or `reopened` replayed under a new
delivery id, and files others on the host could read.

Everything runs against the embedded app and its local forge over real HTTP (raw sockets where
a test sends half a request)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import hmac
import json
import os
import stat
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from yarl import URL

from bot.app import intake
from bot.app.bodies import JSON_DEPTH_LIMIT, MiB
from bot.app.embedded import Embedded, start_embedded
from bot.app.web import OPERATOR_ONLY
from bot.store import ledger, mails
from tests.support import Actor, ToolClient, label_names, until
from tests.test_exactly_once import forge_delivery, replay_under_new_id

SCOUT_VAULT = "acme/scout-vault"
BOUNDED = 30.0  # seconds to wait for what should come at once: a hang fails, never blocks
WRONG_MAC = "sha256=" + "0" * 64  # well formed, and not the body's


def _settings(embedded: Embedded, **changes: Any) -> None:
    services = embedded.services
    services.settings = dataclasses.replace(services.settings, **changes)


# -- 1. webhook bodies before their signature is checked --------------------------------------


@contextlib.asynccontextmanager
async def _socket(embedded: Embedded) -> AsyncIterator[
        tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    url = URL(embedded.app_url)
    reader, writer = await asyncio.open_connection(url.host, url.port)
    try:
        yield reader, writer
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


def _head(length: int, signature: str | None = WRONG_MAC) -> bytes:
    lines = ["POST /webhook HTTP/1.1", "Host: vaultmail", "Content-Type: application/json",
             f"Content-Length: {length}", "X-GitHub-Event: ping",
             f"X-GitHub-Delivery: {uuid.uuid4()}"]
    if signature is not None:
        lines.append(f"X-Hub-Signature-256: {signature}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def _answer(reader: asyncio.StreamReader) -> tuple[int, Any]:
    """The status and JSON body of the next answer on a raw connection."""
    head = (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), BOUNDED)).decode("latin-1")
    lines = head.split("\r\n")
    length = next(int(line.split(":", 1)[1]) for line in lines
                  if line.lower().startswith("content-length:"))
    body = await asyncio.wait_for(reader.readexactly(length), BOUNDED)
    return int(lines[0].split()[1]), json.loads(body)


async def test_a_half_sent_webhook_body_is_answered_408_and_its_connection_closed(
        embedded: Embedded) -> None:
    """A sender that stops halfway held the connection and what it sent for ever (seen after
    240 s). Now the body must come whole within `webhook_read_seconds`."""
    _settings(embedded, webhook_read_seconds=0.5)
    async with _socket(embedded) as (reader, writer):
        writer.write(_head(1000) + b'{"zen": "half a body')
        await writer.drain()
        status, body = await _answer(reader)
        closed = await asyncio.wait_for(reader.read(), BOUNDED)  # the app closed it
    assert status == 408 and body["error"]["code"] == "body_timeout", body
    assert "0.5 s" in body["error"]["message"], body
    assert closed == b""
    assert intake.UNVERIFIED.held == 0


async def test_a_webhook_without_a_signature_is_refused_before_its_body_is_read(
        embedded: Embedded) -> None:
    for signature in (None, "sha256=not-hex", "sha1=" + "0" * 40):
        async with _socket(embedded) as (reader, writer):
            writer.write(_head(25 * MiB, signature))  # and not a byte of the body
            await writer.drain()
            status, body = await _answer(reader)
        assert status == 401 and body["error"]["code"] == "bad_signature", (signature, body)
        assert "X-Hub-Signature-256" in body["error"]["message"]


async def test_a_webhook_declared_over_the_limit_is_refused_before_its_body_is_read(
        embedded: Embedded) -> None:
    async with _socket(embedded) as (reader, writer):
        writer.write(_head(25 * MiB + 1))
        await writer.drain()
        status, body = await _answer(reader)
    assert status == 413 and body["error"]["code"] == "too_large"
    assert "25 MiB" in body["error"]["message"]


async def test_the_unverified_bytes_held_are_bounded_across_connections(
        embedded: Embedded, monkeypatch: pytest.MonkeyPatch) -> None:
    """Four connections held ~90 MiB of bodies nobody had signed. What the process holds
    before signatures are checked is counted over every connection: past the limit, 503."""
    monkeypatch.setattr(intake.UNVERIFIED, "limit", 64 * 1024)
    async with _socket(embedded) as (first, first_w), _socket(embedded) as (second, second_w):
        first_w.write(_head(60_000) + b" " * 50_000)
        await first_w.drain()
        await until(lambda: intake.UNVERIFIED.held >= 50_000)
        second_w.write(_head(20_000) + b" " * 20_000)
        await second_w.drain()
        status, body = await _answer(second)
        assert status == 503 and body["error"]["code"] == "busy", body
        assert "65,536 bytes" in body["error"]["message"], body
        first_w.write(b" " * 10_000)  # the first, once whole, is checked as any other
        await first_w.drain()
        status, body = await _answer(first)
        assert status == 401 and body["error"]["code"] == "bad_signature", body
    assert intake.UNVERIFIED.held == 0


# -- 2. JSON nested past the limit ------------------------------------------------------------


def _nested(levels: int) -> str:
    return "[" * levels + "]" * levels


async def test_json_nested_past_the_limit_is_400_bad_json_naming_it(
        embedded: Embedded, session: aiohttp.ClientSession) -> None:
    """`[` * 100000 was a RecursionError: a 500."""
    url = embedded.app_url + "/api/v1/tools/mail_send"
    headers = {"Authorization": f"Bearer {embedded.api_tokens['agent:builder']}",
               "Content-Type": "application/json"}
    args = {"to": "scout", "subject": "s", "body": "b"}
    deep = json.dumps(args)[:-1] + f', "x": {_nested(JSON_DEPTH_LIMIT)}}}'  # one level over
    for body in ("[" * 100_000, deep, '{"a": "' + "[" * 100 + '", "b": ' + deep + "}"):
        async with session.post(url, data=body, headers=headers) as resp:
            assert resp.status == 400, (body[:80], await resp.text())
            error = (await resp.json())["error"]
        assert error["code"] == "bad_json", error
        assert str(JSON_DEPTH_LIMIT) in error["message"], error
    # at the limit (and brackets in strings do not count) the arguments are read: refused for
    # what they say, not for how deep they are
    at_limit = json.dumps({**args, "x": "[" * 100})[:-1] + f', "y": {_nested(63)}}}'
    async with session.post(url, data=at_limit, headers=headers) as resp:
        assert resp.status == 422, await resp.text()

    secret = embedded.services.settings.webhook_secret.encode()
    signed = b'{"zen": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    async with session.post(embedded.app_url + "/webhook", data=signed, headers={
            "X-GitHub-Event": "ping", "X-GitHub-Delivery": str(uuid.uuid4()),
            "X-Hub-Signature-256": "sha256=" + hmac.new(secret, signed,
                                                        hashlib.sha256).hexdigest(),
            "Content-Type": "application/json"}) as resp:
        assert resp.status == 400, await resp.text()
        error = (await resp.json())["error"]
    assert error["code"] == "bad_json" and str(JSON_DEPTH_LIMIT) in error["message"], error


# -- 3. /readyz -------------------------------------------------------------------------------


async def test_readyz_says_ready_to_anyone_and_names_tenants_to_the_operator_only(
        embedded: Embedded, session: aiohttp.ClientSession) -> None:
    url = embedded.app_url + "/readyz"
    _settings(embedded, operator_token="the-operators-token")
    for headers in ({}, {"Authorization": "Bearer a-guess"},
                    {"Authorization": f"Bearer {embedded.api_tokens['human:marco@acme.com']}"}):
        async with session.get(url, headers=headers) as resp:
            text = await resp.text()
            assert resp.status == 200, text
        assert "acme" not in text.lower(), text
        body = json.loads(text)
        assert body["status"] == "ready" and body["failed"] == [] and "checks" not in body
        assert "VAULTMAIL_OPERATOR_TOKEN" in body["detail"]
    async with session.get(url, headers={
            "Authorization": "Bearer the-operators-token"}) as resp:
        body = await resp.json()
    assert resp.status == 200 and "acme" in body["checks"]["installations"]["detail"], body


async def test_healthz_tells_anyone_alive_and_the_operator_how_much_is_queued(
        embedded: Embedded, session: aiohttp.ClientSession) -> None:
    """The queue's depth and dead letters are every office's together: with an operator's
    token set they are the operator's, as /readyz's detail and /metrics are; anyone else
    (a probe) is told the process is alive, and the index is not read for them."""
    url = embedded.app_url + "/healthz"
    _settings(embedded, operator_token="the-operators-token")
    async with session.get(url) as resp:
        body = await resp.json()
    assert resp.status == 200 and body == {"status": "ok", "app": "vaultmail",
                                           "detail": OPERATOR_ONLY}, body
    async with session.get(url, headers={
            "Authorization": "Bearer the-operators-token"}) as resp:
        body = await resp.json()
    assert body["queue_pending"] == 0 and body["dead_letters"] == 0, body


# -- 4. state-changing events replayed --------------------------------------------------------


async def _hand_moved_mail(embedded: Embedded, marco: Actor) -> int:
    """A mail marco sent by opening an issue, then closed and reopened by hand."""
    issue = await marco.open_issue(SCOUT_VAULT, "Prices", "EU prices please")
    await embedded.settle()
    number = int(issue["number"])
    for state in ("closed", "open"):
        await marco.call("PATCH", f"/repos/{SCOUT_VAULT}/issues/{number}", {"state": state},
                         expect=200)
        await embedded.settle()
    return number


def _about(number: int) -> Any:
    return lambda p: (p["issue"]["number"] == number
                      and p["repository"]["full_name"].lower() == SCOUT_VAULT)


async def _ledgered(embedded: Embedded, ref: str) -> list[str]:
    return [e.event for e in await ledger.entries(embedded.services.store) if e.subject == ref]


async def test_a_replayed_close_does_not_close_a_mail_reopened_since(
        embedded: Embedded, person: Any, session: aiohttp.ClientSession) -> None:
    marco: Actor = person("marco")
    number = await _hand_moved_mail(embedded, marco)
    ref = f"{SCOUT_VAULT}#{number}"
    assert label_names(await marco.issue(SCOUT_VAULT, number)) == ["mail:new"], "reopened"
    before = await _ledgered(embedded, ref)
    assert before.count("mail.closed") == 1
    captured = forge_delivery(embedded, "issues", "closed", _about(number))
    await replay_under_new_id(embedded, session, "issues", captured)
    issue = await marco.issue(SCOUT_VAULT, number)
    assert issue["state"] == "open" and label_names(issue) == ["mail:new"], issue["labels"]
    mail = await mails.mail_at(embedded.services.store, SCOUT_VAULT, number)
    assert mail is not None and mail.state == "mail:new"
    assert await _ledgered(embedded, ref) == before, "nothing ledgered for the replay"


async def test_a_replayed_reopen_does_not_reopen_a_mail_closed_since_nor_run_the_agent(
        embedded: Embedded, person: Any, session: aiohttp.ClientSession) -> None:
    marco: Actor = person("marco")
    number = await _hand_moved_mail(embedded, marco)
    ref = f"{SCOUT_VAULT}#{number}"
    await marco.call("PATCH", f"/repos/{SCOUT_VAULT}/issues/{number}", {"state": "closed"},
                     expect=200)
    await embedded.settle()
    before = await _ledgered(embedded, ref)
    captured = forge_delivery(embedded, "issues", "reopened", _about(number))
    await replay_under_new_id(embedded, session, "issues", captured)
    issue = await marco.issue(SCOUT_VAULT, number)
    assert issue["state"] == "closed" and label_names(issue) == ["mail:closed"]
    assert await _ledgered(embedded, ref) == before, "no mail.sent, no run.queued again"


# -- 5. files the app writes are its own ------------------------------------------------------


@contextlib.contextmanager
def _umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


async def test_the_data_directory_and_every_file_in_it_are_the_apps_alone(
        tmp_path: Path, session: aiohttp.ClientSession) -> None:
    """`vaultmail up --data DIR` under the usual umask (022): the index and its -wal and -shm,
    the forge's state (tokens, passwords, the OAuth client secret) were readable by anyone on
    the host."""
    data = tmp_path / "data"
    with _umask(0o022):
        embedded = await start_embedded(data_dir=data, port=0, forge_port=0,
                                        persist_forge=True)
        try:  # something of everything: a mail signed, indexed and ledgered
            await ToolClient(session, embedded, "agent:builder")(
                "mail_send", to="scout", subject="Spec", body="Attached")
            await embedded.settle()
            seen = {p.relative_to(data).as_posix(): stat.S_IMODE(p.stat().st_mode)
                    for p in [data, *data.rglob("*")]}
        finally:
            await embedded.stop()
    assert {"index.sqlite3", "index.sqlite3-wal", "index.sqlite3-shm", "app.json",
            "tokens.json", "forge/localforge.sqlite3"} <= set(seen), sorted(seen)
    loose = {name: oct(mode) for name, mode in seen.items()
             if mode != (0o700 if (data / name).is_dir() else 0o600)}
    assert loose == {}, f"others could read these: {loose}"
