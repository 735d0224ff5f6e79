"""An org's own webhook secret (Gitea) can be rotated for that org alone: an admin who left, or
a leaked hook config, keeps no power to sign the org's deliveries once the grace after
`vaultmail gitea-hook ORG --rotate` is over, and no other org's webhook changes."""

from __future__ import annotations

import json
import logging
import re
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from bot.app.embedded import Embedded, start_embedded
from bot.app.gitea_orgs import refresh
from bot.app.hook_generations import HookGenerations
from bot.app.intake import org_secrets, org_webhook_secret
from bot.store import hook_secrets, installations, ledger, open_store, sqlite
from bot.store.hook_secrets import NEVER_ROTATED
from tests.gitea.test_two_orgs_on_gitea import _evil_seen, _post, _secret
from tests.test_cli_tools import vaultmail


def _push(org: str) -> dict[str, object]:
    """A push to one of `org`'s repositories other than `.github`: signed, taken, acted on by
    no handler."""
    return {"ref": "refs/heads/main", "before": "0" * 40, "after": "1" * 40, "commits": [],
            "repository": {"full_name": f"{org}/website", "name": "website",
                           "owner": {"login": org}}, "sender": {"login": "marco"}}


async def _hook(office: Embedded, org: str, *more: str) -> tuple[int, str, str]:
    """`vaultmail gitea-hook ORG ...` beside the office, with the operator's secret."""
    return await vaultmail("gitea-hook", org, "--data", str(office.data_dir),
                           "--url", office.app_url, *more)


@pytest.fixture
def operator(office: Embedded, monkeypatch: pytest.MonkeyPatch) -> str:
    master = office.services.settings.webhook_secret
    monkeypatch.setenv("GITEA_WEBHOOK_SECRET", master)
    return master


async def test_a_rotated_orgs_webhook_takes_its_new_secret_and_for_the_grace_its_old_one(
        office: Embedded, session: aiohttp.ClientSession, operator: str,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    await _evil_seen(office)
    old, evils = _secret(office, "acme"), _secret(office, "evil")

    async def post(org: str, secret: str, guid: str) -> int:
        return (await _post(office, session, f"/webhook/{org}", secret, _push(org), "push",
                            guid))[0]

    assert await post("acme", old, "r-0") == 202  # never rotated: the secret it always had
    code, out, err = await _hook(office, "acme", "--rotate")
    assert code == 0, err
    new = _secret(office, "acme", 1)
    assert new != old
    assert f"URL     {office.app_url}/webhook/acme" in out and f"secret  {new}" in out, out
    assert old not in out and "1 hour" in out and "rotated" in out, out
    # what the org's webhook is signed with now, as asked again; evil's is what it was
    assert f"secret  {new}" in (await _hook(office, "acme"))[1]
    assert f"secret  {evils}" in (await _hook(office, "evil"))[1]
    assert await post("acme", new, "r-1") == 202  # at once, though acme's was read just now
    assert await post("acme", old, "r-2") == 202  # within the grace: the admin updates it
    assert await post("evil", evils, "r-3") == 202  # another org's: as it was
    assert await post("acme", _secret(office, "acme", 2), "r-4") == 401
    [entry] = await ledger.entries(office.services.store, org="acme",
                                   event="office.webhook_secret_rotated")
    assert (entry.actor, entry.subject, entry.data) == ("operator", "acme", {"generation": 1})
    logged = caplog.text + err
    assert new not in logged and old not in logged and operator not in logged


@pytest.fixture
async def no_grace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Embedded]:
    """An office whose operator gives a rotated secret no grace at all."""
    monkeypatch.setenv("VAULTMAIL_WEBHOOK_GRACE_SECONDS", "0")
    emb = await start_embedded(data_dir=tmp_path, port=0, forge_port=0, dialect="gitea")
    monkeypatch.setenv("GITEA_WEBHOOK_SECRET", emb.services.settings.webhook_secret)
    try:
        yield emb
    finally:
        await emb.stop()


async def test_a_rotated_out_secret_is_refused_past_the_grace_saying_what_to_do(
        no_grace: Embedded, session: aiohttp.ClientSession) -> None:
    office = no_grace
    old = _secret(office, "acme")
    code, out, err = await _hook(office, "acme", "--rotate")
    assert code == 0, err
    new = _secret(office, "acme", 1)
    assert f"secret  {new}" in out

    async def post(org: str, secret: str, guid: str) -> tuple[int, str]:
        return await _post(office, session, f"/webhook/{org}", secret, _push(org), "push", guid)

    assert (await post("acme", new, "g-1"))[0] == 202
    status, text = await post("acme", old, "g-2")
    assert status == 401, text
    error = json.loads(text)["error"]
    assert error["code"] == "webhook_secret_rotated", error
    assert "rotated" in error["message"] and "vaultmail gitea-hook acme" in error["message"]
    await _evil_seen(office)
    assert (await post("evil", _secret(office, "evil"), "g-3"))[0] == 202
    # rotated again: the one before (generation 1) is refused too, the first has no word
    code, out, err = await _hook(office, "acme", "--rotate")
    assert code == 0 and f"secret  {_secret(office, 'acme', 2)}" in out, err
    assert (await post("acme", _secret(office, "acme", 2), "g-4"))[0] == 202
    assert (await post("acme", new, "g-5"))[0] == 401
    status, text = await post("acme", old, "g-6")
    assert status == 401 and json.loads(text)["error"]["code"] == "bad_signature", text
    assert await office.services.store.fetchone(
        "SELECT 1 FROM queue WHERE guid IN ('acme/g-2','acme/g-5','acme/g-6')") is None


async def test_a_rotation_is_kept_in_the_index_where_another_replica_reads_it(
        database_url: str, tmp_path: Path) -> None:
    """Two replicas of one index: the one that did not rotate takes the new generation at
    the first signature its own did not match, the other org's generation unmoved."""
    where = database_url or str(tmp_path / "index.sqlite3")
    one, other = await open_store(where), await open_store(where)
    try:
        seen = HookGenerations(other)
        assert await seen.of("acme") == NEVER_ROTATED  # read: held from now on
        first = await hook_secrets.rotate(one, "ACME", "operator")
        second = await hook_secrets.rotate(one, "acme", "operator")
        assert (first.number, second.number) == (1, 2)
        assert second.rotated_at is not None and first.rotated_at is not None
        assert second.rotated_at >= first.rotated_at
        assert await seen.recheck("acme") == second == await hook_secrets.generation(other,
                                                                                    "Acme")
        assert await seen.of("evil") == NEVER_ROTATED
        assert [e.data for e in await ledger.entries(other, org="acme")] == [
            {"generation": 1}, {"generation": 2}]
        assert await ledger.verify_chain(other, "acme") is None
    finally:
        await one.close()
        await other.close()


async def test_an_org_webhook_names_a_forge_org_and_no_two_orgs_secrets_meet(
        office: Embedded, session: aiohttp.ClientSession, operator: str) -> None:
    """`/webhook/acme%0A1` was taken as an org `acme\\n1`, whose secret was acme's after one
    rotation (the generation was joined to the name by a newline). The URL's org must now be
    a forge org's name, and no org's secret is another's at any generation."""
    assert org_webhook_secret(operator, "acme\n1", None) != org_webhook_secret(
        operator, "acme", None, 1)  # (made from the name alone, as before org ids)
    code, _, err = await _hook(office, "acme\n1", "--rotate")
    assert code == 2 and "not a forge org's name" in err, err
    code, _, err = await _hook(office, "globex", "--rotate")  # an org the app has not seen
    assert code == 2 and "has not seen an org globex" in err, err
    assert (await hook_secrets.generation(office.services.store, "globex")) == NEVER_ROTATED
    await _hook(office, "acme", "--rotate")
    acmes = _secret(office, "acme", 1)
    for n, org in enumerate(("acme%0A1", "-acme", "ac%20me", "a" * 41)):
        status, text = await _post(office, session, f"/webhook/{org}", acmes, _push("acme"),
                                   "push", f"n-{n}")
        assert status == 404, (org, text)
        error = json.loads(text)["error"]
        assert error["code"] == "not_an_org" and "/webhook/<org>" in error["message"], error


async def test_bad_signatures_to_any_webhook_do_not_hold_back_a_rotated_orgs_new_secret(
        office: Embedded, session: aiohttp.ClientSession, operator: str) -> None:
    """The read again at a signature matching nothing known was one a second for the whole
    replica: an outsider's bad request to any /webhook/<org> spent it, and acme's first
    deliveries signed with its new secret got 401 until the generations were read again
    (Gitea does not retry). Only a signature made with one of the org's next secrets, which
    an outsider cannot make, reads the index again now."""
    async def post(org: str, secret: str, guid: str) -> int:
        return (await _post(office, session, f"/webhook/{org}", secret, _push(org), "push",
                            guid))[0]

    assert await post("acme", _secret(office, "acme"), "o-0") == 202  # generations read
    assert await post("evil", "not evil's secret", "o-1") == 401  # anyone, anywhere
    code, _, err = await _hook(office, "acme", "--rotate")
    assert code == 0, err
    assert await post("acme", _secret(office, "acme", 1), "o-2") == 202


async def test_the_grace_is_counted_by_the_databases_clock_not_the_replicas(
        postgres_url: str, tmp_path: Path, session: aiohttp.ClientSession,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A rotation's time is the database's clock, and intake compared it with its replica's
    own: a replica two hours ahead refused acme's secret from before a rotation made a moment
    ago, well within the hour's grace. The time since a rotation is now the database's (its
    age when read, and the time since on this replica's monotonic clock). (PostgreSQL only:
    on SQLite the database's clock is the replica's own.)"""
    office = await start_embedded(data_dir=tmp_path, port=0, forge_port=0, dialect="gitea",
                                  database_url=postgres_url)
    try:
        old = _secret(office, "acme")
        await hook_secrets.rotate(office.services.store, "acme", "operator")

        async def post(secret: str, guid: str) -> int:
            return (await _post(office, session, "/webhook/acme", secret, _push("acme"),
                                "push", guid))[0]

        assert await post(_secret(office, "acme", 1), "c-1") == 202  # read
        real = time.time
        monkeypatch.setattr(time, "time", lambda: real() + 7200)  # the replica's clock
        assert await post(old, "c-2") == 202, "refused within the grace"
        monkeypatch.undo()
    finally:
        await office.stop()


def _printed(out: str) -> str:
    """The secret `vaultmail gitea-hook` printed."""
    found = re.search(r"secret  ([0-9a-f]{64})", out)
    assert found is not None, out
    return found[1]


async def test_an_org_made_again_under_a_name_is_not_signed_for_by_the_old_orgs_secret(
        office: Embedded, session: aiohttp.ClientSession, operator: str) -> None:
    """acme was deleted on the forge and another user made an org of that name, and added
    the bot to it. Its webhook secret was made from the name alone: the old acme's admin,
    who was given it, signed deliveries the app took as the new acme's. The secret is made
    for the org's id on the forge now: the new acme's is another, and the old one is
    refused saying what to do."""
    async def post(secret: str, guid: str) -> tuple[int, str]:
        return await _post(office, session, "/webhook/acme", secret, _push("acme"), "push",
                           guid)

    code, out, err = await _hook(office, "acme")
    assert code == 0, err
    old = _printed(out)
    assert (await post(old, "t-0"))[0] == 202
    # deleted, and made again by another user (another id), who adds the bot to it
    office.forge.state.accounts["acme"].id = office.forge.state.next_id("account")
    await refresh(office.services)
    status, text = await post(old, "t-1")
    assert status == 401, "the old acme's admin signed for the new acme"
    error = json.loads(text)["error"]
    assert error["code"] == "bad_signature" and \
        "vaultmail gitea-hook acme" in error["message"], error
    code, out, err = await _hook(office, "acme")
    assert code == 0, err
    new = _printed(out)
    assert new != old
    assert (await post(new, "t-2"))[0] == 202
    assert await office.services.store.fetchone(
        "SELECT 1 FROM queue WHERE guid='acme/t-1'") is None


async def test_a_secret_made_from_the_name_stays_the_org_it_was_given_to(
        tmp_path: Path) -> None:
    """Before org ids each org's secret was made from its name alone, and its admins set it:
    an index from then (version 28) records each name it knew with its org's id (one not read
    yet: the id the app reads first), and the name-made secret goes on signing for that org,
    rotated too, and never for an org made again under its name."""
    path = tmp_path / "index.sqlite3"
    sqlite._migrate_file(str(path), upto=28)
    conn = sqlite3.connect(path, isolation_level=None)
    try:  # acme's id read already; globex's, installed before ids were, not yet
        conn.execute("INSERT INTO installations(org, installation_id, account_id)"
                     " VALUES ('acme', 1, 5), ('globex', 1, NULL)")
    finally:
        conn.close()
    store = await open_store(str(path))
    try:
        acme = await hook_secrets.generation(store, "acme")
        assert (acme.org_id, acme.by_name) == (5, True)
        assert org_secrets("op", "acme", acme, 0) == [org_webhook_secret("op", "acme", None)]
        assert (await hook_secrets.generation(store, "globex")).org_id is None  # no secret yet
        before = await installations.known(store)
        await installations.listed(store, {"acme": 1, "globex": 1}, before,
                                   {"acme": 5, "globex": 7})
        globex = await hook_secrets.generation(store, "globex")
        assert (globex.org_id, globex.by_name) == (7, True)
        rotated = await hook_secrets.rotate(store, "acme", "operator")
        assert org_secrets("op", "acme", rotated, 1) == [
            org_webhook_secret("op", "acme", None, 1)]
        # acme deleted, and made again by another user: its secret is its own
        before = await installations.known(store)
        await installations.listed(store, {"acme": 1, "globex": 1}, before,
                                   {"acme": 9, "globex": 7})
        taken = await hook_secrets.generation(store, "acme")
        assert (taken.org_id, taken.by_name) == (9, False)
        made = org_secrets("op", "acme", taken, 0, 1)
        assert made == [org_webhook_secret("op", "acme", 9, n) for n in (0, 1)]
        assert not set(made) & {org_webhook_secret("op", "acme", None, n) for n in (0, 1)}
        assert (await hook_secrets.generation(store, "globex")).by_name
    finally:
        await store.close()
