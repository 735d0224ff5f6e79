"""API tokens: `vaultmail token create|list|revoke`, shown once, stored hashed, last use kept,
revocation effective at the next call."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from bot.app.embedded import Embedded, start_embedded
from bot.office.source import CONFIG_PATH, CONFIG_REPO
from bot.store import api_tokens
from tests.support import ToolClient
from tests.test_cli_tools import vaultmail


async def test_create_use_list_and_revoke_a_token(embedded: Embedded, tools: Any) -> None:
    data = str(embedded.data_dir)
    code, out, err = await vaultmail("token", "create", "agent:scout", "--data", data)
    assert code == 0, err
    assert "shown once" in out
    token = out.strip().splitlines()[-1]
    assert token.startswith("vm_")

    status, body = await tools("agent:scout").raw("mail_list", {}, token=token)
    assert status == 200 and "inbox" in body

    code, out, err = await vaultmail("token", "list", "--data", data, "--json")
    assert code == 0, err
    listed = json.loads(out)["result"]["tokens"]
    mine = listed[-1]
    assert mine["principal"] == "agent:scout" and not mine["revoked"]
    assert mine["last_used"] is not None, "the last use is kept"
    assert all(token not in json.dumps(t) for t in listed)

    code, out, err = await vaultmail("token", "list", "--data", data)
    assert code == 0 and f"{mine['id']:>4}  agent:scout" in out

    code, out, err = await vaultmail("token", "revoke", str(mine["id"]), "--data", data)
    assert code == 0 and "revoked" in out
    status, body = await tools("agent:scout").raw("mail_list", {}, token=token)
    assert status == 401 and "revoked" in body["error"]["message"]
    code, out, err = await vaultmail("token", "revoke", str(mine["id"]), "--data", data)
    assert code == 1 and "no live token" in out

    other = embedded.api_tokens["agent:scout"]
    status, _ = await tools("agent:scout").raw("mail_list", {}, token=other)
    assert status == 200, "revoking one token leaves the principal's others alive"


async def test_the_list_names_each_tokens_office_and_expiry(embedded: Embedded) -> None:
    """acme and evil may both declare agent:scout: the operator told which to revoke by its
    office; a run's token (one a run, acting until its timeout) says so, and once expired."""
    store, data = embedded.services.store, str(embedded.data_dir)
    evil = await api_tokens.create_token(store, "agent:scout", "Evil")
    await api_tokens.create_token(store, "agent:scout", "acme", lasts=0.0)  # a run's, spent
    await api_tokens.create_token(store, "agent:scout", "acme", lasts=3600.0)  # a run's
    code, out, err = await vaultmail("token", "list", "--data", data, "--json")
    assert code == 0, err
    scouts = [t for t in json.loads(out)["result"]["tokens"] if t["principal"] == "agent:scout"]
    assert [(t["org"], t["run"], t["expired"]) for t in scouts] == [
        ("acme", False, False), ("evil", False, False), ("acme", True, True),
        ("acme", True, False)], scouts
    assert scouts[0]["expires"] is None and scouts[3]["expires"] is not None

    code, out, err = await vaultmail("token", "list", "--data", data)
    assert code == 0, err
    lines = [line for line in out.splitlines() if "agent:scout" in line]
    assert " evil " in lines[1] and "run" not in lines[1]
    assert "run token, EXPIRED" in lines[2] and "run token, expires" in lines[3], lines

    code, out, err = await vaultmail("token", "list", "--org", "EVIL", "--data", data,
                                     "--json")
    assert code == 0, err
    [only] = json.loads(out)["result"]["tokens"]
    assert (only["principal"], only["org"]) == ("agent:scout", "evil")
    assert await api_tokens.principal_for(store, evil) == "agent:scout"
    code, out, err = await vaultmail("token", "list", "--org", "nobody", "--data", data)
    assert code == 0 and "no API tokens of nobody's office" in out, out


async def test_tokens_are_stored_hashed(embedded: Embedded) -> None:
    store = embedded.services.store
    token = await api_tokens.create_token(store, "human:sara@acme.com")
    rows = await store.fetchall("SELECT token_hash FROM api_tokens")
    assert all(token not in r["token_hash"] for r in rows)
    raw = b"".join(p.read_bytes() for p in embedded.data_dir.glob("index.sqlite3*"))
    assert token.encode() not in raw
    assert await api_tokens.principal_for(store, token) == "human:sara@acme.com"
    assert await api_tokens.principal_for(store, token + "x") is None


async def test_a_bad_principal_is_refused(embedded: Embedded) -> None:
    code, _, err = await vaultmail("token", "create", "scout", "--data", str(embedded.data_dir))
    assert code == 2 and "agent:<slug>" in err


async def test_a_token_for_someone_not_in_the_office_acts_for_no_one(
        embedded: Embedded, session: aiohttp.ClientSession) -> None:
    from bot.store import api_tokens

    token = await api_tokens.create_token(embedded.services.store, "agent:ghost")
    async with session.post(embedded.app_url + "/api/v1/tools/mail_list", json={},
                            headers={"Authorization": f"Bearer {token}"}) as resp:
        body = await resp.json()
    assert resp.status == 403 and "not in the office config" in body["error"]["message"]
    denied = await embedded.ledger_events("run.denied")
    assert [(e.actor, e.data["reason"][:40]) for e in denied] == [
        ("agent:ghost", "agent:ghost is not in the office config ")], "refusals are ledgered"


async def test_a_token_belongs_to_one_office_from_its_making(
        embedded: Embedded, session: aiohttp.ClientSession) -> None:
    """`token create` names the token's office when it is made: the one organisation the App
    is installed on, else `--org` (found by review: a token made without it was pinned to an
    office at its first use, and another office declaring the same principal meanwhile made
    it refused, or took a new hire's token for its own)."""
    from tests.test_tenancy_attacks import _install_evil

    data = str(embedded.data_dir)
    code, out, err = await vaultmail("token", "create", "agent:scout", "--data", data)
    assert code == 0 and "in acme's office" in out, err
    made_alone = out.strip().splitlines()[-1]
    await _install_evil(embedded)  # evil declares an agent:scout of its own
    code, out, err = await vaultmail("token", "create", "agent:scout", "--data", data)
    assert code == 2 and "several organisations here (acme, evil)" in err, err
    assert "--org ORG" in err
    code, out, err = await vaultmail("token", "create", "agent:scout", "--org", "acme",
                                     "--data", data)
    assert code == 0, err
    for token in (made_alone, out.strip().splitlines()[-1]):
        async with session.post(f"{embedded.app_url}/api/v1/tools/mail_list", json={},
                                headers={"Authorization": f"Bearer {token}"}) as resp:
            assert resp.status == 200, await resp.text()


async def test_a_token_for_no_known_office_says_to_name_one(tmp_path: Any) -> None:
    """An index that knows no installation (fresh, or a Gitea bot's) makes no token without
    `--org`, and says so; with it, one."""
    from bot.store import open_store

    await (await open_store(str(tmp_path / "index.sqlite3"))).close()
    code, _, err = await vaultmail("token", "create", "agent:scout", "--data", str(tmp_path))
    assert code == 2 and "knows no organisation" in err and "--org ORG" in err, err
    code, out, err = await vaultmail("token", "create", "agent:scout", "--org", "acme",
                                     "--data", str(tmp_path))
    assert code == 0 and "in acme's office" in out, err


async def test_an_office_written_with_capitals_revokes_the_tokens_it_made(
        tmp_path: Path, database_url: str) -> None:
    """`org: Acme` in the config: the tokens made for its people are the office's (acme) as
    every other row is, so removing someone from the config ends them (they were kept as
    "Acme", which the revocation, comparing "acme", never matched)."""
    example = Path(__file__).resolve().parents[1] / "bot" / "example_office.yml"
    config = yaml.safe_load(example.read_text())
    config["org"] = "Acme"
    office = tmp_path / "office.yml"
    office.write_text(yaml.safe_dump(config, sort_keys=False))
    emb = await start_embedded(office_path=office, data_dir=tmp_path / "d", port=0,
                               forge_port=0, database_url=database_url)
    try:
        rows = await emb.services.store.fetchall("SELECT DISTINCT org FROM api_tokens")
        assert [r["org"] for r in rows] == ["acme"]
        async with aiohttp.ClientSession() as session:
            lee = ToolClient(session, emb, "human:lee@acme.com")
            status, _ = await lee.raw("mail_list", {})
            assert status == 200
            without = {**config, "humans": [h for h in config["humans"]
                                            if h["email"] != "lee@acme.com"]}
            emb.forge.put_file(f"acme/{CONFIG_REPO}", CONFIG_PATH, yaml.safe_dump(without),
                               pusher="admin")
            await emb.settle()
            emb.forge.put_file(f"acme/{CONFIG_REPO}", CONFIG_PATH, yaml.safe_dump(config),
                               pusher="admin")  # added back
            await emb.settle()
            status, body = await lee.raw("mail_list", {})
            assert status == 401 and "revoked" in body["error"]["message"], body
    finally:
        await emb.stop()


async def test_revoke_names_whose_token_it_was_and_keeps_to_the_office_named(
        embedded: Embedded) -> None:
    """`token revoke ID` took any office's token id and said only "token N revoked": an
    operator who misread the list revoked evil's scout for acme's and was not told. It now
    names the token's principal and office, and with `--org` refuses another office's id."""
    store, data = embedded.services.store, str(embedded.data_dir)
    evil = await api_tokens.create_token(store, "agent:scout", "evil")
    acme = await api_tokens.create_token(store, "agent:scout", "acme")
    ids = {t.org: t.id for t in await api_tokens.list_tokens(store)
           if t.principal == "agent:scout" and not t.revoked}
    code, out, err = await vaultmail("token", "revoke", str(ids["evil"]), "--org", "Acme",
                                     "--data", data)
    assert code == 1 and "evil's office, not acme's" in out, (out, err)
    assert await api_tokens.principal_for(store, evil) == "agent:scout", "left alive"
    code, out, err = await vaultmail("token", "revoke", str(ids["acme"]), "--org", "acme",
                                     "--data", data)
    assert code == 0 and "agent:scout" in out and "acme's office" in out, (out, err)
    assert await api_tokens.principal_for(store, acme) is None


async def test_a_first_use_that_lost_the_race_to_pin_a_token_acts_where_the_winner_pinned_it(
        embedded: Embedded) -> None:
    """Two first uses of a token that named no office (from before offices) each work out its
    office; the first to write pins it. The other, which read the token unpinned and worked
    out another office meanwhile (a config changed between them), acts where the token is
    pinned, not where it worked out (found by review: a console session of the other office)."""
    from bot.tools.http import pinned

    store = embedded.services.store
    token = await api_tokens.create_token(store, "human:marco@acme.com")
    stale = await api_tokens.owner_of(store, token)  # read before the other use pinned it
    assert stale is not None and stale.org is None
    await api_tokens.pin_office(store, token, "evil")  # the other first use, meanwhile
    assert await pinned(embedded.services, stale, token) == "evil"
    again = await api_tokens.owner_of(store, token)
    assert again is not None and again.org == "evil"


async def test_failed_bearer_tokens_are_limited_per_address_and_a_success_is_not_charged(
        embedded: Embedded, session: aiohttp.ClientSession) -> None:
    """Found by review: `Authorization: Bearer` took unknown tokens without end (the tools,
    /mcp, console pages), each a lookup in the index and a log line. The sign-in form's limit
    per address holds there too: PER_ADDRESS failures a minute, then 429 `too_many_failures`
    with Retry-After before any lookup, a live token too; over MCP not as a bad token (a
    client would throw its token away). Successes are not counted."""
    from bot.app.tries import PER_ADDRESS

    live = {"Authorization": f"Bearer {embedded.api_tokens['agent:scout']}"}
    tools = embedded.app_url + "/api/v1/tools/mail_list"

    async def call(headers: dict[str, str]) -> tuple[int, Any, str | None]:
        async with session.post(tools, json={}, headers=headers) as resp:
            return resp.status, await resp.json(), resp.headers.get("Retry-After")

    for _ in range(PER_ADDRESS + 3):
        assert (await call(live))[0] == 200
    statuses = [(await call({"Authorization": f"Bearer vm_guess{n}"}))[0]
                for n in range(PER_ADDRESS)]
    assert statuses == [401] * PER_ADDRESS, statuses
    status, body, wait = await call(live)
    assert (status, body["error"]["code"], wait) == (429, "too_many_failures", "60"), body
    async with session.post(embedded.app_url + "/mcp", json={
            "jsonrpc": "2.0", "id": 1, "method": "ping"}, headers={
            **live, "Accept": "application/json, text/event-stream"}) as resp:
        assert resp.status == 429 and resp.headers["Retry-After"] == "60"
        assert "WWW-Authenticate" not in resp.headers, "not a bad token: try again later"
    async with session.get(embedded.app_url + "/console/inbox", allow_redirects=False,
                           headers={"Authorization": "Bearer vm_x"}) as resp:
        assert resp.status == 429 and resp.headers["Retry-After"] == "60"
