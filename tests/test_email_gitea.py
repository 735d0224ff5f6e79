"""Email attachments on Gitea (issue 24), over real SMTP on loopback into the local forge's
Gitea dialect over HTTP: each file committed to the agent's vault under
`attachments/<mail id>/` through Gitea's contents API (POST to create), binary files
included, listed in the signed mail and the index, once however often the message comes;
and the contents routes answering as Gitea does."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from bot.email.message import read_meta
from bot.mail.header import VerdictStatus, parse_mail_body, verify_mail
from bot.store import attachments, mails
from tests.test_email_attachments import CSV, PDF, blob_sha
from tests.test_email_support import (
    DOMAIN,
    Mailroom,
    delivered,
    message,
    open_mailroom,
    send,
    wire,
    with_files,
)

SCOUT_VAULT = "acme/scout-vault"


@pytest.fixture
async def gitea_room(tmp_path: Path, database_url: str) -> AsyncIterator[Mailroom]:
    """The mailroom (tests/test_email_support.py) with the local forge speaking Gitea."""
    async with open_mailroom(tmp_path, database_url, dialect="gitea") as room:
        yield room


async def _gitea(room: Mailroom, method: str, path: str, json: Any = None) -> tuple[int, Any]:
    """marco on the forge's Gitea API with his token."""
    headers = {"Authorization": f"token {room.embedded.forge_tokens['marco']}"}
    async with room.session.request(method, room.embedded.forge.url + "/api/v1" + path,
                                    json=json, headers=headers) as resp:
        return resp.status, await resp.json(content_type=None)


async def test_attachments_are_committed_to_a_gitea_vault(gitea_room: Mailroom) -> None:
    room = gitea_room
    raw = wire(with_files(
        message("Bob <bob@example.org>", f"scout@{DOMAIN}", "Prices", "See the files.",
                Message_ID="<gitea-files@example.org>"),
        ("prices.pdf", "application/pdf", PDF), ("prices.csv", "text/csv", CSV)))
    answer = await send(room.port, raw, rcpts=[f"scout@{DOMAIN}"])
    assert f"{SCOUT_VAULT}#1" in await delivered(gitea_room, answer), answer
    # the same message again (a client's retry): nothing committed twice
    assert (await send(room.port, raw, rcpts=[f"scout@{DOMAIN}"])).code == 250
    await room.embedded.settle()
    store = room.embedded.services.store
    [mail] = await mails.all_mails(store)
    folder = f"attachments/{mail.mail_id}"
    for name, data in (("prices.pdf", PDF), ("prices.csv", CSV)):
        status, got = await _gitea(room, "GET",
                                   f"/repos/{SCOUT_VAULT}/contents/{quote(f'{folder}/{name}')}")
        assert status == 200, got
        assert base64.b64decode(got["content"]) == data and got["sha"] == blob_sha(data)
    vault = room.embedded.forge.state.repo("acme", "scout-vault")
    assert vault is not None
    assert sorted(p for p in vault.paths() if p.startswith("attachments/")) == [
        f"{folder}/prices.csv", f"{folder}/prices.pdf"]
    status, issue = await _gitea(room, "GET", f"/repos/{SCOUT_VAULT}/issues/1")
    assert status == 200
    assert verify_mail(issue["title"], issue["body"], SCOUT_VAULT,
                       room.embedded.services.keyring).status == VerdictStatus.VALID
    meta = read_meta(parse_mail_body(issue["body"])[1])
    assert meta is not None
    assert [(a.path, a.size, a.sha) for a in meta.attachments] == [
        (f"{folder}/prices.pdf", len(PDF), blob_sha(PDF)),
        (f"{folder}/prices.csv", len(CSV), blob_sha(CSV))]
    rows = await attachments.of_mail(store, mail.mail_id)
    assert sorted((r.name, r.sha) for r in rows) == sorted(
        [("prices.pdf", blob_sha(PDF)), ("prices.csv", blob_sha(CSV))])


async def test_the_gitea_contents_routes_answer_as_gitea_does(gitea_room: Mailroom) -> None:
    room = gitea_room
    route = f"/repos/{SCOUT_VAULT}/contents/notes/a.txt"
    one, two = base64.b64encode(b"one\n").decode(), base64.b64encode(b"two\n").decode()
    status, made = await _gitea(room, "POST", route, {"content": one, "message": "a note"})
    assert status == 201 and made["content"]["sha"] == blob_sha(b"one\n"), made
    assert made["commit"]["message"] == "a note\n" and "verification" in made
    status, again = await _gitea(room, "POST", route, {"content": two})
    assert status == 422 and "already exists" in again["message"]
    status, said = await _gitea(room, "PUT", route, {"content": two})
    assert status == 422 and "SHA" in said["message"]
    status, said = await _gitea(room, "PUT", route, {"content": two, "sha": "0" * 40})
    assert status == 422 and "sha does not match" in said["message"]
    status, said = await _gitea(room, "PUT", route, {"content": two,
                                                     "sha": blob_sha(b"one\n")})
    assert status == 200 and said["content"]["sha"] == blob_sha(b"two\n")
    status, _ = await _gitea(room, "PUT", f"/repos/{SCOUT_VAULT}/contents/notes/none.txt",
                             {"content": two, "sha": blob_sha(b"two\n")})
    assert status == 404
    status, said = await _gitea(room, "POST", route.replace("a.txt", "b.txt"),
                                {"content": "not base64!"})
    assert status == 422


async def test_the_held_note_names_the_release_label_as_gitea_spells_it(
        gitea_room: Mailroom) -> None:
    """Mail from a stranger to builder is held for sara; the note tells her to release it
    with the label as the vault has it on Gitea (`mail/new`, the exclusive scoped set), and
    giving it that label releases it."""
    room, vault = gitea_room, "acme/builder-vault"
    raw = wire(message("eve@other.example", f"builder@{DOMAIN}", "Offer", "Buy now.",
                       Message_ID="<held-gitea@other.example>"))
    assert (await send(room.port, raw, rcpts=[f"builder@{DOMAIN}"])).code == 250
    await room.embedded.settle()
    status, comments = await _gitea(room, "GET", f"/repos/{vault}/issues/1/comments")
    assert status == 200
    [note] = [c["body"] for c in comments if "held for you" in c["body"]]
    assert "giving it the label `mail/new`" in note and "mail:new" not in note, note
    status, labels = await _gitea(room, "GET", f"/repos/{vault}/labels")
    by_name = {lb["name"]: lb["id"] for lb in labels}
    status, got = await _gitea(room, "POST", f"/repos/{vault}/issues/1/labels",
                               {"labels": [by_name["mail/new"]]})
    assert status == 200 and [lb["name"] for lb in got] == ["mail/new"], got
    await room.embedded.settle()
    store = room.embedded.services.store
    mail = await mails.mail_at(store, vault, 1)
    assert mail is not None and mail.state == "mail:new"
    assert len(await room.embedded.ledger_events("email.released")) == 1


async def test_an_archived_gitea_vault_is_refused_at_rcpt(gitea_room: Mailroom) -> None:
    """The RCPT-time check of a vault (Forge.repo_closed) reads the repository's `archived`,
    which Gitea's API gives as it is (convert.ToRepo: `archived`, `archived_at`); the local
    forge's Gitea dialect answered `archived: false` for every repository, so an archived
    vault was taken at RCPT and a message to it and another agent got 451 on every try."""
    repo = gitea_room.embedded.forge.state.repo("acme", "echo-vault")
    assert repo is not None
    repo.archived = True  # (archived in Gitea's settings; its API's writes then answer 423)
    status, data = await _gitea(gitea_room, "GET", "/repos/acme/echo-vault")
    assert status == 200 and data["archived"] is True, data
    assert data["archived_at"] != "1970-01-01T00:00:00Z", data
    status, data = await _gitea(gitea_room, "GET", "/repos/acme/scout-vault")
    assert status == 200 and data["archived"] is False, data
    assert data["archived_at"] == "1970-01-01T00:00:00Z", data
    raw = wire(message("bob@example.org", f"scout@{DOMAIN}", "Hi", "both of you",
                       Cc=f"echo@{DOMAIN}"))
    answer = await send(gitea_room.port, raw, rcpts=[f"scout@{DOMAIN}", f"echo@{DOMAIN}"])
    assert answer.code == 250, answer
    code, said = answer.refused[f"echo@{DOMAIN}"]
    assert code == 550 and b"takes no mail now" in said, said
