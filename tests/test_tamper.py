"""Signed headers in the forge: edits after sending are caught, `vaultmail verify` agrees."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from bot.app.embedded import Embedded
from bot.store import ledger, mails
from tests.support import Actor

SCOUT_VAULT = "acme/scout-vault"


async def vaultmail(embedded: Embedded, *args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot.cli.main", *args, "--data", str(embedded.data_dir),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await proc.communicate()
    return proc.returncode or 0, out.decode()


async def _sent(embedded: Embedded, tools: Any) -> dict[str, Any]:
    mail = await tools("human:marco@acme.com")("mail_send", to="scout", subject="Budget",
                                               body="Budget is 10k")
    await embedded.settle()
    return dict(mail["mail"])


async def test_an_untouched_mail_verifies(embedded: Embedded, tools: Any) -> None:
    mail = await _sent(embedded, tools)
    code, out = await vaultmail(embedded, "verify", mail["ref"])
    assert code == 0, out
    assert out.startswith("valid:") and "human:marco@acme.com" in out


async def test_an_edited_body_is_flagged_and_the_signed_values_are_kept(
        embedded: Embedded, tools: Any, person: Any) -> None:
    mail = await _sent(embedded, tools)
    admin: Actor = person("admin")
    issue = await admin.issue(SCOUT_VAULT, mail["number"])
    forged = issue["body"].replace("Budget is 10k", "Budget is 90k")
    await admin.call("PATCH", f"/repos/{SCOUT_VAULT}/issues/{mail['number']}",
                     {"body": forged}, expect=200)
    await embedded.settle()
    [entry] = await ledger.entries(embedded.services.store, event="mail.tampered")
    assert entry.subject == mail["ref"] and "body changed" in entry.data["reason"]
    kept = await mails.get_mail(embedded.services.store, mail["mail_id"])
    assert kept is not None and kept.tampered and kept.body == "Budget is 10k"
    notes = [c["body"] for c in await admin.comments(SCOUT_VAULT, mail["number"])]
    assert any("changed after it was sent" in n for n in notes)
    code, out = await vaultmail(embedded, "verify", mail["ref"])
    assert code == 1 and out.startswith("tampered:") and "body changed" in out


async def test_a_forged_sender_in_the_header_is_caught(embedded: Embedded, tools: Any,
                                                       person: Any) -> None:
    mail = await _sent(embedded, tools)
    admin: Actor = person("admin")
    issue = await admin.issue(SCOUT_VAULT, mail["number"])
    forged = issue["body"].replace("human:marco@acme.com", "human:sara@acme.com")
    await admin.call("PATCH", f"/repos/{SCOUT_VAULT}/issues/{mail['number']}",
                     {"body": forged}, expect=200)
    await embedded.settle()
    [entry] = await ledger.entries(embedded.services.store, event="mail.tampered")
    assert entry.actor == "human:admin@forge" or entry.actor.endswith("admin")
    kept = await mails.get_mail(embedded.services.store, mail["mail_id"])
    assert kept is not None and kept.from_principal == "human:marco@acme.com"
    code, _ = await vaultmail(embedded, "verify", mail["ref"])
    assert code == 1
    got = await tools("human:marco@acme.com")("mail_get", mail=mail["ref"])
    assert got["verified"] is False and got["mail"]["from_principal"] == "human:marco@acme.com"


async def test_a_copied_header_in_a_hand_made_issue_is_unsigned_mail(
        embedded: Embedded, tools: Any, person: Any) -> None:
    mail = await _sent(embedded, tools)
    admin: Actor = person("admin")
    original = await admin.issue(SCOUT_VAULT, mail["number"])
    copy = await admin.open_issue("acme/builder-vault", "Budget", original["body"])
    code, out = await vaultmail(embedded, "verify", f"acme/builder-vault#{copy['number']}")
    assert code == 1 and "acme/scout-vault" in out
