"""More of evil's attacks on acme (issue 21), found by an adversarial review of the office
wall: an item hung under another office's outcome, tokens that named no office, updates
crowded out by a principal of the same name, a page load that cleared another office's
deferred cards; and an index from before offices upgraded in place on both engines."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import yaml

from bot.app.embedded import Embedded
from bot.office.config import parse_office
from bot.office.seed import seed_office
from bot.office.source import CONFIG_PATH, CONFIG_REPO
from bot.store import api_tokens, open_store
from bot.store import sessions as console_db
from tests.items_support import make_item
from tests.support import Actor, ToolClient, older_index

MARCO, SCOUT = "human:marco@acme.com", "agent:scout"
EVIL = {
    "org": "evil",
    "humans": [{"email": "marco@acme.com", "login": "eve",
                "permissions": ["mail.send", "editor"]},
               {"email": "mallory@evil.test", "login": "mallory", "permissions": ["mail.send"]}],
    "agents": [{"slug": "scout", "login": "evil-scout", "person": "marco@acme.com",
                "run": {"triggers": ["mail", "chat"], "dispatch": "none"},
                "capabilities": {"mail.send": ["*"]}}],
}


async def _install_evil(embedded: Embedded) -> None:
    seed_office(embedded.forge, parse_office(yaml.safe_dump(EVIL), "evil.yml", repository=False))
    (app_id,) = embedded.forge.state.apps
    embedded.forge.install_app(int(app_id), "evil")
    await embedded.settle()


def _actor(session: aiohttp.ClientSession, embedded: Embedded, login: str) -> Actor:
    embedded.forge_tokens.setdefault(login, embedded.forge.user_token(login))
    return Actor(session, embedded, login)


async def test_an_item_cannot_be_part_of_another_offices_outcome(
        embedded: Embedded, session: aiohttp.ClientSession) -> None:
    marco = _actor(session, embedded, "marco")
    outcome = await make_item(embedded, marco, "outcome", "Acme pricing",
                              assignees=["scout-bot"])
    await _install_evil(embedded)
    mallory = _actor(session, embedded, "mallory")
    issue = await mallory.open_issue("evil/scout-vault", "INJECTED by evil",
                                     f"Part of {outcome}", labels=["plan"])
    await embedded.settle()
    store = embedded.services.store
    assert await store.fetchall("SELECT 1 FROM item_updates WHERE summary LIKE '%INJECTED%'"
                                " AND org='acme'") == []
    row = await store.fetchone("SELECT parent, claim FROM items WHERE ref=?",
                               (f"evil/scout-vault#{issue['number']}",))
    assert row is None or (row["parent"], row["claim"]) == (None, None), dict(row)
    inbox = await ToolClient(session, embedded, MARCO)("list_inbox")
    assert "INJECTED" not in str(inbox)


async def test_another_office_can_neither_take_nor_revoke_a_token_that_named_no_office(
        embedded: Embedded, session: aiohttp.ClientSession) -> None:
    store = embedded.services.store
    legacy = await api_tokens.create_token(store, SCOUT)  # `vaultmail token create agent:scout`
    url = f"{embedded.app_url}/api/v1/tools/mail_list"
    headers = {"Authorization": f"Bearer {legacy}"}
    async with session.post(url, json={}, headers=headers) as resp:
        assert resp.status == 200  # its first use pins it to acme's office
    await _install_evil(embedded)  # evil declares an agent:scout of its own
    async with session.post(url, json={}, headers=headers) as resp:
        assert resp.status == 200, await resp.text()
    without = {**EVIL, "agents": []}
    embedded.forge.put_file(f"evil/{CONFIG_REPO}", CONFIG_PATH, yaml.safe_dump(without),
                            pusher="eve")
    await embedded.settle()
    async with session.post(url, json={}, headers=headers) as resp:
        assert resp.status == 200, "evil's removal of its scout is none of acme's scout's"


async def test_another_office_cannot_clear_a_persons_deferred_cards(
        embedded: Embedded, session: aiohttp.ClientSession) -> None:
    store = embedded.services.store
    marco = _actor(session, embedded, "marco")
    outcome = await make_item(embedded, marco, "outcome", "Acme pricing",
                              assignees=["scout-bot"])
    asked = await ToolClient(session, embedded, SCOUT)(
        "add_comment", targetType="outcome", target=outcome, body="Discount?",
        needsReply=True, to=["marco@acme.com"])
    thread = asked["comment"]["thread"]
    await console_db.defer(store, MARCO, thread, org="acme")
    await _install_evil(embedded)
    evil_marco = await api_tokens.create_token(store, MARCO, "evil")
    async with session.get(embedded.app_url + "/console/inbox",
                           headers={"Authorization": f"Bearer {evil_marco}"}) as resp:
        assert resp.status == 200
    assert [r["thread"] for r in await console_db.deferred(store, MARCO, org="acme")] == [thread]


async def test_another_offices_updates_do_not_crowd_out_a_persons_own(
        embedded: Embedded, session: aiohttp.ClientSession) -> None:
    marco, sara = _actor(session, embedded, "marco"), _actor(session, embedded, "sara")
    outcome = await make_item(embedded, marco, "outcome", "Acme pricing",
                              assignees=["scout-bot"])
    repo, n = outcome.split("#")
    await sara.call("PATCH", f"/repos/{repo}/issues/{n}", {"state": "closed"}, expect=200)
    await embedded.settle()
    before = (await ToolClient(session, embedded, MARCO)("list_inbox"))["updates"]
    assert before
    await _install_evil(embedded)
    eve, mallory = _actor(session, embedded, "eve"), _actor(session, embedded, "mallory")
    bait = await make_item(embedded, eve, "outcome", "bait", repo="evil/scout-vault")
    erepo, en = bait.split("#")
    for _ in range(16):
        for state in ("closed", "open"):
            await mallory.call("PATCH", f"/repos/{erepo}/issues/{en}", {"state": state},
                               expect=200)
    await embedded.settle()
    after = (await ToolClient(session, embedded, MARCO)("list_inbox"))["updates"]
    assert [u["summary"] for u in after] == [u["summary"] for u in before]


_BEFORE_OFFICES = [
    "INSERT INTO comments(id, item, thread, parent, author, body, data, created_at) VALUES"
    " ('c1','acme/v#1','t1',NULL,'agent:scout','x','{}',0)",
    "INSERT INTO comments(id, item, thread, parent, author, body, data, created_at) VALUES"
    " ('c2','Globex/v#1','t2',NULL,'agent:scout','x','{}',0)",
    "INSERT INTO inbox_deliveries(owner, box, principal, comment, created_at) VALUES"
    " ('human:m','agents','agent:scout','c1',0)",
    "INSERT INTO inbox_deliveries(owner, box, principal, comment, created_at) VALUES"
    " ('human:m','agents','agent:scout','c2',0)",
    "INSERT INTO inbox_agent_marks(owner, agent, seq) VALUES ('human:m','agent:scout',2)",
    "INSERT INTO ledger(time, event, actor, subject, data, prev_hash, hash) VALUES"
    " (0,'mail.sent','a','ACME/v#1','{}','g','h1')",
    "INSERT INTO ledger(time, event, actor, subject, data, prev_hash, hash) VALUES"
    " (0,'run.denied','a','chat:5','{}','h1','h2')",
]


async def test_an_index_from_before_offices_gives_each_row_its_office(
        tmp_path: Path, empty_database_url: str) -> None:
    target = await older_index(tmp_path, empty_database_url, 3,
                               [(statement, ()) for statement in _BEFORE_OFFICES])
    store = await open_store(target)
    try:
        owners = {(r["owner"], r["org"]) for r in await store.fetchall(
            "SELECT owner, org FROM inbox_deliveries")}
        assert owners == {("acme/human:m", "acme"), ("globex/human:m", "globex")}
        marks = {(r["owner"], r["seq"]) for r in await store.fetchall(
            "SELECT owner, seq FROM inbox_agent_marks")}
        assert marks == {("acme/human:m", 2), ("globex/human:m", 2)}, "a mark per office"
        ledger = {r["subject"]: (r["org"], r["chain"]) for r in await store.fetchall(
            "SELECT subject, org, chain FROM ledger")}
        assert ledger == {"ACME/v#1": ("acme", None), "chat:5": (None, None)}
    finally:
        await store.close()


async def test_an_idempotency_key_made_to_collide_gets_a_refusal_not_the_comment(
        embedded: Embedded, session: aiohttp.ClientSession) -> None:
    """A comment's id from an idempotencyKey is short (40 bits): evil searches offline for a
    key whose id, on its own goal, is that of a comment of acme's it saw the marker of. The
    retry path then finds a comment of another item and author: refused, nothing of acme's
    shown. (The collision is made by giving acme's comment that id.)"""
    from bot.items.service import Comments
    from bot.store import comments as db

    secret = "ACME-CONFIDENTIAL: the Q4 price"
    outcome = await make_item(embedded, _actor(session, embedded, "marco"), "outcome", "Pricing")
    asked = await ToolClient(session, embedded, MARCO)(
        "add_comment", targetType="outcome", target=outcome, body=secret)
    await _install_evil(embedded)
    goal = await make_item(embedded, _actor(session, embedded, "mallory"), "goal", "evil goal",
                           repo="evil/scout-vault")
    store = embedded.services.store
    item = await db.get_item(store, goal)
    assert item is not None
    mallory = "human:mallory@evil.test"
    collided = Comments._new_id(item, None, mallory, "found-offline")
    async with store.transaction() as tx:
        await tx.execute("UPDATE comments SET id=? WHERE id=?",
                         (collided, asked["comment"]["id"]))
    token = await api_tokens.create_token(store, mallory, "evil")
    async with session.post(f"{embedded.app_url}/api/v1/tools/add_comment", json={
            "targetType": "goal", "target": goal, "body": "hello",
            "idempotencyKey": "found-offline"},
            headers={"Authorization": f"Bearer {token}"}) as resp:
        text = await resp.text()
        assert resp.status == 409 and "key_in_use" in text, text
    assert secret not in text


def test_a_comments_id_is_too_long_to_be_taken_first_by_a_made_key() -> None:
    """Comment ids are one space for every office, and a hand comment's is predictable (its
    repository, the forge's next comment id): 128 bits, so that no office can search out a
    key whose id takes another office's next comment's first (its delivery would fail)."""
    import re

    from bot.items.model import Item
    from bot.items.service import Comments

    item = Item(repo="acme/scout-vault", number=1, kind="outcome", title="t", state="open",
                author_login="x")
    ids = [Comments._new_id(item, 4242, "x", None), Comments._new_id(item, None, "x", "k"),
           Comments._new_id(item, None, "x", None)]
    assert all(re.fullmatch(r"c[0-9a-f]{32}", i) for i in ids), ids


async def test_an_org_whose_config_was_never_valid_is_told_why_not_to_add_one(
        embedded: Embedded, session: aiohttp.ClientSession) -> None:
    """A second org installs the App with a config the app refuses (and none valid before):
    its calls are refused naming the refusal and its first error, not told to add a file it
    has (found acting it out: "no office config found ... add vaultmail.yml")."""
    store = embedded.services.store
    bad = dict(EVIL, agents=[{"slug": "scout", "login": "mallory"}])  # a human's login too
    embedded.forge.add_org("evil", owner="admin")
    embedded.forge.add_repo("evil", CONFIG_REPO)
    embedded.forge.put_file(f"evil/{CONFIG_REPO}", CONFIG_PATH, yaml.safe_dump(bad))
    (app_id,) = embedded.forge.state.apps
    embedded.forge.install_app(int(app_id), "evil")
    await embedded.settle()
    token = await api_tokens.create_token(store, "human:mallory@evil.test", "evil")
    async with session.post(f"{embedded.app_url}/api/v1/tools/mail_list", json={},
                            headers={"Authorization": f"Bearer {token}"}) as resp:
        status, error = resp.status, (await resp.json())["error"]
    assert status == 400 and error["code"] == "no_office", error
    assert "refused" in error["message"] and "logins must be unique" in error["message"], error
    assert "add vaultmail.yml" not in error["message"], error
