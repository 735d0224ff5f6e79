"""`vaultmail reindex` rebuilds the mail index from the forge alone."""

from __future__ import annotations

from typing import Any

from bot.app.embedded import Embedded
from bot.mail.reindex import reindex
from bot.store import mails
from tests.test_tamper import vaultmail


async def _busy_office(embedded: Embedded, tools: Any, person: Any) -> None:
    marco, scout, builder = (tools("human:marco@acme.com"), tools("agent:scout"),
                             tools("agent:builder"))
    await person("sara").open_issue("acme/scout-vault", "Hand-made", "From the forge")
    first = (await marco("mail_send", to="scout", subject="One", body="first"))["mail"]
    await scout("mail_open", mail=first["ref"])
    ping = (await builder("mail_send", to="scout", subject="Ping", body="ping"))["mail"]
    await scout("mail_reply", mail=ping["ref"], body="pong")
    await marco("mail_close", mail=first["ref"])
    await embedded.settle()


async def test_reindex_rebuilds_an_index_equal_to_the_live_one(
        embedded: Embedded, tools: Any, person: Any) -> None:
    await _busy_office(embedded, tools, person)
    store = embedded.services.store
    live = await mails.all_mails(store)
    assert len(live) == 4
    await mails.replace_all(store, [])
    forge = embedded.services.forge_for(None)
    report = await reindex(store, forge, embedded.office, embedded.services.keyring)
    assert report.mails == 4 and report.tampered == []
    assert await mails.all_mails(store) == live


async def test_a_second_reindex_with_nothing_changed_costs_no_rate_limit(
        embedded: Embedded, tools: Any, person: Any) -> None:
    await _busy_office(embedded, tools, person)
    code, out = await vaultmail(embedded, "reindex")
    assert code == 0 and "reindexed 4 mail(s)" in out, out
    before = len(embedded.forge.requests.records)
    code, out = await vaultmail(embedded, "reindex")
    assert code == 0 and "reindexed 4 mail(s)" in out, out
    lists = [r for r in embedded.forge.requests.records[before:]
             if r.route == "GET /repos/{owner}/{repo}/issues"]
    assert len(lists) == len(embedded.office.vaults())
    assert all(r.status == 304 for r in lists)
