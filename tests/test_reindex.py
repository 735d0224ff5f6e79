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
    report = await reindex(store, forge, embedded.office, embedded.services.keyring,
                           app_login=embedded.services.bot_login)
    assert report.mails == 4 and report.tampered == []
    assert await mails.all_mails(store) == live


LIST = "GET /repos/{owner}/{repo}/issues"


async def test_a_second_reindex_under_the_same_token_costs_no_rate_limit(
        embedded: Embedded, tools: Any, person: Any) -> None:
    """Rereads are free only while the installation token is the same: GitHub's ETags hash the
    Authorization header with the body (as the local forge's do), so the ETag cache pays off
    within one token's hour."""
    await _busy_office(embedded, tools, person)
    store, forge = embedded.services.store, embedded.services.forge_for(None)
    args = (store, forge, embedded.office, embedded.services.keyring)
    app_login = embedded.services.bot_login
    await reindex(*args, app_login=app_login)
    before = len(embedded.forge.requests.records)
    report = await reindex(*args, app_login=app_login)
    assert report.mails == 4
    lists = [r for r in embedded.forge.requests.records[before:] if r.route == LIST]
    assert len(lists) == len(embedded.office.vaults())
    assert all(r.status == 304 for r in lists)


async def test_after_the_tokens_hour_a_reindex_reads_everything_again(
        embedded: Embedded, tools: Any, person: Any) -> None:
    """An installation token lives an hour (on the forge clock); the next one gets new ETags
    for the same content, so the first reread after it costs a request per page again."""
    await _busy_office(embedded, tools, person)
    store, forge = embedded.services.store, embedded.services.forge_for(None)
    args = (store, forge, embedded.office, embedded.services.keyring)
    app_login = embedded.services.bot_login
    await reindex(*args, app_login=app_login)
    embedded.forge.clock.advance(3601)
    before = len(embedded.forge.requests.records)
    report = await reindex(*args, app_login=app_login)
    assert report.mails == 4
    lists = [r for r in embedded.forge.requests.records[before:]
             if r.route == LIST and r.status != 401]
    assert len(lists) == len(embedded.office.vaults())
    assert all(r.status == 200 for r in lists)


async def test_a_second_reindex_command_mints_its_own_token_and_reads_in_full(
        embedded: Embedded, tools: Any, person: Any) -> None:
    """Each `vaultmail reindex` is a new process with a new installation token, so the ETags
    saved in etag-cache.json by the last run do not match (a 200 per page, not a 304). What
    the README says of a second run, held to the forge that models GitHub's ETags."""
    await _busy_office(embedded, tools, person)
    code, out = await vaultmail(embedded, "reindex")
    assert code == 0 and "reindexed 4 mail(s)" in out, out
    before = len(embedded.forge.requests.records)
    code, out = await vaultmail(embedded, "reindex")
    assert code == 0 and "reindexed 4 mail(s)" in out, out
    lists = [r for r in embedded.forge.requests.records[before:] if r.route == LIST]
    assert len(lists) == len(embedded.office.vaults())
    assert all(r.status == 200 for r in lists)
