"""Email attachments (issue 24), over real SMTP on loopback into the local forge over HTTP:
each file committed to the agent's vault under `attachments/<mail id>/` through the contents
API, listed in the mail's signed body, kept in the index; once across retries; a file or a
message over its limit refused at SMTP time with a 552 naming the limit."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
from typing import Any
from urllib.parse import quote

from bot.email.attachments import MAX_ATTACHMENTS, numbered, safe_name
from bot.email.keys import comment_key
from bot.email.message import read_meta
from bot.mail.header import VerdictStatus, parse_mail_body, verify_mail
from bot.mail.reindex import reindex
from bot.store import attachments, mails
from tests.test_email_support import (
    ATTACHMENT_MAX_BYTES,
    DOMAIN,
    Mailroom,
    delivered,
    mailroom,
    message,
    send,
    wire,
    with_files,
)

__all__ = ["mailroom"]  # the fixture, used by name
SCOUT_VAULT = "acme/scout-vault"
PDF = b"%PDF-1.7\n" + bytes(range(256)) * 40  # not UTF-8: a binary file
CSV = b"region,price\nEU,12\n"
CREATE_ISSUE = "POST /repos/{owner}/{repo}/issues"
PUT_CONTENTS = "PUT /repos/{owner}/{repo}/contents/{path}"


def blob_sha(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


async def vault_file(room: Mailroom, path: str) -> dict[str, Any]:
    """The file as the forge's contents API gives it to a person of the office."""
    return dict(await room.person("marco").call(
        "GET", f"/repos/{SCOUT_VAULT}/contents/{quote(path)}", expect=200))


async def test_attachments_are_committed_to_the_vault_and_listed_in_the_signed_mail(
        mailroom: Mailroom) -> None:
    msg = with_files(
        message("Bob <bob@example.org>", f"scout@{DOMAIN}", "Prices", "See the files.",
                Message_ID="<files@example.org>"),
        ("prices.pdf", "application/pdf", PDF), ("prices.csv", "text/csv", CSV),
        ("Prices.PDF", "application/pdf", b"another one"))
    answer = await send(mailroom.port, wire(msg), rcpts=[f"scout@{DOMAIN}"])
    assert f"{SCOUT_VAULT}#1" in await delivered(mailroom, answer)
    await mailroom.embedded.settle()
    [mail] = await mails.all_mails(mailroom.embedded.services.store)
    folder = f"attachments/{mail.mail_id}"
    want = {f"{folder}/prices.pdf": PDF, f"{folder}/prices.csv": CSV,
            f"{folder}/Prices-2.PDF": b"another one"}  # one name, two files: numbered
    for path, data in want.items():
        got = await vault_file(mailroom, path)
        assert base64.b64decode(got["content"]) == data and got["sha"] == blob_sha(data)
    issue = await mailroom.person("marco").issue(SCOUT_VAULT, 1)
    verdict = verify_mail(issue["title"], issue["body"], SCOUT_VAULT,
                          mailroom.embedded.services.keyring)
    assert verdict.status == VerdictStatus.VALID
    _, body = parse_mail_body(issue["body"])
    meta = read_meta(body)
    assert meta is not None
    assert [(a.path, a.size, a.content_type, a.sha) for a in meta.attachments] == [
        (f"{folder}/prices.pdf", len(PDF), "application/pdf", blob_sha(PDF)),
        (f"{folder}/prices.csv", len(CSV), "text/csv", blob_sha(CSV)),
        (f"{folder}/Prices-2.PDF", 11, "application/pdf", blob_sha(b"another one"))]
    pdf = await vault_file(mailroom, f"{folder}/prices.pdf")
    assert f"[`prices.pdf`]({pdf['html_url']}) | 10.0 KiB | `application/pdf` |" in body
    assert "See the files." in body, "the text is the message's, the files beside it"
    # the list is signed: a size changed on the forge is a tampered mail
    forged = issue["body"].replace("| 10.0 KiB |", "| 1.0 KiB |")
    assert verify_mail(issue["title"], forged, SCOUT_VAULT,
                       mailroom.embedded.services.keyring).status == VerdictStatus.TAMPERED
    rows = await attachments.of_mail(mailroom.embedded.services.store, mail.mail_id)
    assert sorted((r.name, r.size, r.content_type, r.sha, r.message_id, r.vault) for r in rows) \
        == sorted([("prices.pdf", len(PDF), "application/pdf", blob_sha(PDF),
                    "<files@example.org>", SCOUT_VAULT),
                   ("prices.csv", len(CSV), "text/csv", blob_sha(CSV), "<files@example.org>",
                    SCOUT_VAULT),
                   ("Prices-2.PDF", 11, "application/pdf", blob_sha(b"another one"),
                    "<files@example.org>", SCOUT_VAULT)])
    assert {r.url for r in rows} == {(await vault_file(mailroom, p))["html_url"] for p in want}


async def test_a_file_name_cannot_leave_its_folder_or_hide_characters(
        mailroom: Mailroom) -> None:
    msg = with_files(message("bob@example.org", f"scout@{DOMAIN}", "Names", "odd names",
                             Message_ID="<names@example.org>"),
                     ("../../.github/vaultmail.yml", "text/plain", b"evil: true\n"),
                     ("inv\u202eoice\x07.txt", "text/plain", b"bidi\n"),
                     ("Résumé 2026+v1.pdf", "application/pdf", PDF))
    assert (await send(mailroom.port, wire(msg), rcpts=[f"scout@{DOMAIN}"])).code == 250
    await mailroom.embedded.settle()
    [mail] = await mails.all_mails(mailroom.embedded.services.store)
    folder = f"attachments/{mail.mail_id}"
    repo = mailroom.embedded.forge.state.repo("acme", "scout-vault")
    assert repo is not None
    assert sorted(p for p in repo.paths() if p.startswith("attachments/")) == [
        f"{folder}/Résumé 2026+v1.pdf", f"{folder}/invoice.txt", f"{folder}/vaultmail.yml"]
    assert not any(p.startswith(".github") for p in repo.paths())
    got = await vault_file(mailroom, f"{folder}/Résumé 2026+v1.pdf")
    assert base64.b64decode(got["content"]) == PDF
    issue = await mailroom.person("marco").issue(SCOUT_VAULT, 1)
    assert f"[`Résumé 2026+v1.pdf`]({got['html_url']})" in issue["body"]


def test_safe_names() -> None:
    assert safe_name("../../etc/passwd") == "passwd"
    assert safe_name("C:\\Users\\bob\\report.pdf") == "report.pdf"
    assert safe_name("..") == "attachment" and safe_name("") == "attachment"
    assert safe_name(".hidden") == "hidden"
    assert safe_name("a\x00b\r\nc\u200b\u202ed.txt") == "abcd.txt"
    assert safe_name("price [EU] (v2)*.csv") == "price _EU_ _v2_.csv"
    assert safe_name("Ünïcödé résumé.pdf") == "Ünïcödé résumé.pdf"
    long = safe_name("x" * 300 + ".tar.gz")
    assert len(long) == 100 and long.endswith(".gz")
    assert [numbered("a.txt", n) for n in (1, 2, 3)] == ["a.txt", "a-2.txt", "a-3.txt"]
    assert numbered("README", 2) == "README-2"


async def test_a_message_sent_again_after_a_failure_commits_each_file_once(
        mailroom: Mailroom) -> None:
    forge = mailroom.embedded.forge
    client = mailroom.embedded.services.forge_for(None)  # its retries short: they all fail
    client.config = dataclasses.replace(  # type: ignore[attr-defined]
        client.config, backoff_base=0.01, backoff_max=0.05)  # type: ignore[attr-defined]
    raw = wire(with_files(message("bob@example.org", f"scout@{DOMAIN}", "Again", "retry me",
                                  Message_ID="<again@example.org>"),
                          ("a.bin", "application/octet-stream", PDF),
                          ("b.csv", "text/csv", CSV)))
    # the files land, then the issue cannot be opened: the client is told to try later
    failing = forge.faults.add(route=CREATE_ISSUE, status=500, count=1_000)
    first = await send(mailroom.port, raw, rcpts=[f"scout@{DOMAIN}"])
    assert first.code == 451
    forge.faults.remove(failing)
    puts = forge.requests.count(PUT_CONTENTS)
    assert puts == 2
    again = await send(mailroom.port, raw, rcpts=[f"scout@{DOMAIN}"])
    assert f"{SCOUT_VAULT}#1" in await delivered(mailroom, again)
    once_more = await send(mailroom.port, raw, rcpts=[f"scout@{DOMAIN}"])
    assert once_more.code == 250 and once_more.text == again.text
    await mailroom.embedded.settle()
    assert forge.requests.count(PUT_CONTENTS) == puts, "the files were there: none written again"
    [mail] = await mails.all_mails(mailroom.embedded.services.store)
    rows = await attachments.of_mail(mailroom.embedded.services.store, mail.mail_id)
    assert sorted(r.name for r in rows) == ["a.bin", "b.csv"]
    meta = read_meta(mail.body)
    assert meta is not None and [a.name for a in meta.attachments] == ["a.bin", "b.csv"]


async def test_a_reply_in_the_thread_brings_its_files_to_the_threads_folder(
        mailroom: Mailroom) -> None:
    first = with_files(message("bob@example.org", f"scout@{DOMAIN}", "Quote", "v1 attached",
                               Message_ID="<v1@example.org>"), ("quote.txt", "text/plain",
                                                                 b"v1\n"))
    assert (await send(mailroom.port, wire(first), rcpts=[f"scout@{DOMAIN}"])).code == 250
    second = with_files(message("bob@example.org", f"scout@{DOMAIN}", "Re: Quote",
                                "v2 attached", Message_ID="<v2@example.org>",
                                In_Reply_To="<v1@example.org>", References="<v1@example.org>"),
                        ("quote.txt", "text/plain", b"v2\n"))
    answer = await send(mailroom.port, wire(second), rcpts=[f"scout@{DOMAIN}"])
    assert f"{SCOUT_VAULT}#1" in await delivered(mailroom, answer)
    await mailroom.embedded.settle()
    [mail] = await mails.all_mails(mailroom.embedded.services.store)
    folder = f"attachments/{mail.mail_id}"
    assert base64.b64decode((await vault_file(mailroom, f"{folder}/quote.txt"))["content"]) \
        == b"v1\n"
    v2 = await vault_file(mailroom, f"{folder}/quote-2.txt")
    assert base64.b64decode(v2["content"]) == b"v2\n"
    [reply] = [c for c in await mailroom.person("marco").comments(SCOUT_VAULT, 1)
               if "wrote by email" in c["body"]]
    assert f"[`quote-2.txt`]({v2['html_url']})" in reply["body"]
    rows = await attachments.of_mail(mailroom.embedded.services.store, mail.mail_id)
    assert [(r.name, r.message_id) for r in rows] == [("quote-2.txt", "<v2@example.org>"),
                                                      ("quote.txt", "<v1@example.org>")]

    # the index is the forge's to rebuild: `vaultmail reindex` finds the same rows (the
    # mail's in its signed body, the reply's in the comment the app posted for it)
    emb = mailroom.embedded
    store = emb.services.store
    async with store.transaction() as db:
        await db.execute("DELETE FROM mail_attachments")
    report = await reindex(store, emb.services.forge_for_org("acme"), emb.office,
                           emb.services.keyring, app_login=emb.services.bot_login,
                           comment_key=comment_key(emb.services.settings.data_dir, "acme"))
    assert report.attachments == 2
    assert await attachments.of_mail(store, mail.mail_id) == rows


async def test_a_file_or_message_over_its_limit_is_refused_552_naming_it(
        mailroom: Mailroom) -> None:
    big_file = with_files(message("bob@example.org", f"scout@{DOMAIN}", "Big file", "x"),
                          ("huge.bin", "application/octet-stream",
                           b"\x00" * (ATTACHMENT_MAX_BYTES + 1)))
    answer = await send(mailroom.port, wire(big_file), rcpts=[f"scout@{DOMAIN}"])
    assert answer.code == 552 and "huge.bin" in answer.text
    assert f"at most {ATTACHMENT_MAX_BYTES:,} bytes" in answer.text
    big_message = with_files(message("bob@example.org", f"scout@{DOMAIN}", "Big message", "x"),
                             *[(f"part{n}.bin", "application/octet-stream", b"\x01" * 190_000)
                               for n in range(6)])
    answer = await send(mailroom.port, wire(big_message), rcpts=[f"scout@{DOMAIN}"])
    assert answer.code == 552 and "1,048,576 bytes" in answer.text
    many = with_files(message("bob@example.org", f"scout@{DOMAIN}", "Many", "x"),
                      *[(f"f{n}.txt", "text/plain", b"x") for n in range(MAX_ATTACHMENTS + 1)])
    answer = await send(mailroom.port, wire(many), rcpts=[f"scout@{DOMAIN}"])
    assert answer.code == 552 and f"at most {MAX_ATTACHMENTS}" in answer.text
    assert await mails.all_mails(mailroom.embedded.services.store) == []
    assert mailroom.embedded.forge.requests.count(PUT_CONTENTS) == 0


GET_CONTENTS = "GET /repos/{owner}/{repo}/contents/{path}"


async def test_a_thread_full_of_one_file_name_costs_each_message_a_few_reads_a_file(
        mailroom: Mailroom) -> None:
    """A sender fills a thread's folder with files of one name (20 a message, each of other
    bytes), then sends more. Each name already there was looked for, one forge read a number
    (`x.txt`, `x-2.txt`, ...), for each part, so a message's reads grew with everything the
    thread held: the third message 20 files, 820 reads, and a dozen messages spend the
    office's hourly forge quota (found by review). A part now looks at two numbered names,
    then its bytes' (`x-<sha>.txt`): at most four reads a file, however full the folder."""
    forge = mailroom.embedded.forge

    def files(round_: int) -> list[tuple[str, str, bytes]]:
        return [("x.txt", "text/plain", f"{round_}.{i}\n".encode()) for i in range(20)]

    first = with_files(message("bob@example.org", f"scout@{DOMAIN}", "Files", "a",
                               Message_ID="<f1@example.org>"), *files(1))
    assert (await send(mailroom.port, wire(first), rcpts=[f"scout@{DOMAIN}"])).code == 250
    for n in (2, 3):
        reply = with_files(message("bob@example.org", f"scout@{DOMAIN}", "Re: Files", "b",
                                   Message_ID=f"<f{n}@example.org>",
                                   In_Reply_To="<f1@example.org>"), *files(n))
        reads = forge.requests.count(GET_CONTENTS)
        answer = await send(mailroom.port, wire(reply), rcpts=[f"scout@{DOMAIN}"])
        assert f"{SCOUT_VAULT}#1" in await delivered(mailroom, answer)
        spent = forge.requests.count(GET_CONTENTS) - reads
        assert spent <= 4 * 20, f"message {n}: {spent} reads for 20 files"
    [mail] = await mails.all_mails(mailroom.embedded.services.store)
    rows = await attachments.of_mail(mailroom.embedded.services.store, mail.mail_id)
    assert len(rows) == len({r.path for r in rows}) == 60, "each file kept, apart"
    assert sorted({r.sha for r in rows}) == sorted(
        {blob_sha(f"{r}.{i}\n".encode()) for r in (1, 2, 3) for i in range(20)})
