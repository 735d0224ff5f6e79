"""Two organisations on one deployment, each an attacker of the other (issue 21).

`evil` installs the App next to `acme` and declares acme's principal names in its own office
config: a person `human:marco@acme.com` (its admin eve, an editor there) and an agent
`agent:scout`. With evil's tokens it tries every way into acme's mail, chats, ledger and inbox,
over real HTTP: each attempt is "not found" (or nothing of acme's in what comes back), and
acme's rows are as they were. Then what evil's own office gets: its own hash chain, its own
idempotency keys, and tokens that die with their holder's place in the office and with the
installation, whichever replica hears of it.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
import yaml

from bot.app.embedded import Embedded
from bot.mail.header import verify_mail
from bot.office.config import parse_office
from bot.office.seed import seed_office
from bot.office.source import CONFIG_PATH, CONFIG_REPO
from bot.store import api_tokens, installations, ledger, mails
from tests.support import ToolClient, forge_sign_in

SECRET = "ACME-CONFIDENTIAL acquisition plan"
MARCO, SCOUT = "human:marco@acme.com", "agent:scout"

EVIL = {
    "org": "evil",
    "humans": [{"email": "marco@acme.com", "login": "eve",
                "permissions": ["mail.send", "editor"]}],
    "agents": [{"slug": "scout", "login": "evil-scout", "person": "marco@acme.com",
                "run": {"triggers": ["mail", "chat"], "dispatch": "none"},
                "capabilities": {"mail.send": ["*"]}}],
}


@dataclass
class Tenants:
    embedded: Embedded
    session: aiohttp.ClientSession
    acme_mail: mails.MailRecord
    acme_chat: int
    evil_marco: str  # API tokens of evil's office
    evil_scout: str
    installation: int

    async def call(self, token: str, name: str, **args: Any) -> tuple[int, Any]:
        url = f"{self.embedded.app_url}/api/v1/tools/{name}"
        async with self.session.post(url, json=args,
                                     headers={"Authorization": f"Bearer {token}"}) as resp:
            return resp.status, await resp.json()

    async def console(self, token: str, path: str) -> tuple[int, str]:
        async with self.session.get(self.embedded.app_url + path, allow_redirects=False,
                                    headers={"Authorization": f"Bearer {token}"}) as resp:
            return resp.status, await resp.text()


@pytest.fixture
async def tenants(embedded: Embedded,
                  session: aiohttp.ClientSession) -> AsyncIterator[Tenants]:
    seed_office(embedded.forge, parse_office(yaml.safe_dump(EVIL), "evil.yml", repository=False))
    (app_id,) = embedded.forge.state.apps
    inst = embedded.forge.install_app(int(app_id), "evil")
    acme_marco = ToolClient(session, embedded, MARCO)
    sent = await acme_marco("mail_send", to="scout", subject=SECRET, body="Buy globex. " * 5,
                            idempotencyKey="k-1")
    chat = await acme_marco("agent_chat", agent="scout", message=f"{SECRET}: thoughts?")
    await embedded.settle()
    store = embedded.services.store
    mail = await mails.get_mail(store, sent["mail"]["mail_id"])
    assert mail is not None
    yield Tenants(embedded, session, mail, int(chat["chat"]["chat"]),
                  await api_tokens.create_token(store, MARCO, "evil"),
                  await api_tokens.create_token(store, SCOUT, "evil"), inst)


def _not_found(status: int, body: Any) -> bool:
    return status == 404 and body["error"]["code"] == "not_found"


async def test_a_token_naming_no_office_is_never_pinned_while_an_office_is_unread(
        tenants: Tenants) -> None:
    """A token that names no office is pinned, for good, to the one office whose config
    lists its principal, at its first use. evil's lists acme's `agent:scout` too: while
    acme's config cannot be read, scout was found in evil's alone and the token pinned there
    (review of this stop's round of every office). It is refused for now, and pinned nowhere."""
    t = tenants
    emb = t.embedded
    legacy = await api_tokens.create_token(emb.services.store, SCOUT)  # names no office
    emb.forge.faults.add(route="GET /repos/{owner}/{repo}/contents/{path}", status=403,
                         kind="primary_limit", repo="acme/.github")  # acme's requests spent
    emb.services.offices.max_age = 0.0  # read again at this use
    status, body = await t.call(legacy, "list_inbox")
    assert status == 502 and "cannot be read now" in body["error"]["message"], body
    # over MCP too, and not as a bad token (a client would throw it away): try again later
    async with t.session.post(emb.app_url + "/mcp", json={
            "jsonrpc": "2.0", "id": 1, "method": "ping"}, headers={
            "Authorization": f"Bearer {legacy}", "Accept": "application/json, "
            "text/event-stream"}) as resp:
        assert resp.status == 502 and "WWW-Authenticate" not in resp.headers, resp.headers
        assert resp.headers["Retry-After"] == "5"
    row = await emb.services.store.fetchone("SELECT org FROM api_tokens WHERE principal=?"
                                            " AND org IS NULL", (SCOUT,))
    assert row is not None, "pinned to an office while acme's config could not be read"


async def test_another_office_cannot_read_a_mail_by_id_ref_list_or_thread(
        tenants: Tenants) -> None:
    t, m = tenants, tenants.acme_mail
    for ref in (m.mail_id, m.ref):
        status, body = await t.call(t.evil_marco, "mail_get", mail=ref)
        assert _not_found(status, body), body
        assert SECRET not in str(body)
    status, listed = await t.call(t.evil_marco, "mail_list")
    assert status == 200 and SECRET not in str(listed)
    status, page = await t.console(t.evil_marco, "/console/mail")
    assert status == 200 and SECRET not in page
    status, page = await t.console(t.evil_marco, f"/console/mail/{m.thread_id}")
    assert status == 404 and SECRET not in page


async def test_another_office_cannot_reply_close_or_thread_onto_a_mail(
        tenants: Tenants) -> None:
    t, m = tenants, tenants.acme_mail
    for name, args in (("mail_reply", {"mail": m.mail_id, "body": "Sold."}),
                       ("mail_close", {"mail": m.mail_id}),
                       ("mail_open", {"mail": m.mail_id})):
        status, body = await t.call(t.evil_scout, name, **args)
        assert _not_found(status, body), (name, body)
    status, body = await t.call(t.evil_marco, "mail_send", to="scout", subject="Re",
                                body="x", inReplyTo=m.ref)
    assert _not_found(status, body), body
    await t.embedded.settle()
    after = await mails.get_mail(t.embedded.services.store, m.mail_id)
    assert after is not None and after.state == m.state == "mail:new"
    vault = t.embedded.forge.state.repo_by_full_name("acme/scout-vault")
    assert [c for c in vault.comments.values() if "Sold." in c.body] == []


async def test_another_offices_agent_of_the_same_name_sees_none_of_its_mail_or_chats(
        tenants: Tenants) -> None:
    t = tenants
    status, body = await t.call(t.evil_scout, "list_inbox")
    assert status == 200, body
    assert body["inbox"]["mail"] == [] and body["inbox"]["chats"] == []
    assert SECRET not in str(body)
    status, body = await t.call(t.evil_scout, "chat_reply", chat=t.acme_chat, message="No.")
    assert _not_found(status, body), body
    status, body = await t.call(t.evil_marco, "chat_get", chat=t.acme_chat)
    assert _not_found(status, body), body
    status, page = await t.console(t.evil_marco, "/console/agents/scout")
    assert SECRET not in page


async def test_each_office_reads_and_chains_only_its_own_ledger(tenants: Tenants) -> None:
    t = tenants
    status, sent = await t.call(t.evil_marco, "mail_send", to="scout", subject="Evil plan",
                                body="Ours")
    assert status == 200, sent
    await t.embedded.settle()
    status, changes = await t.call(t.evil_marco, "list_changes")
    assert status == 200
    assert changes["events"] and {e["office"] for e in changes["events"]} == {"evil"}
    assert SECRET not in str(changes)
    status, page = await t.console(t.evil_marco, "/console/ledger")
    assert status == 200 and SECRET not in page and "Evil plan" in page
    store = t.embedded.services.store
    evil = await ledger.entries(store, org="evil")
    acme = await ledger.entries(store, org="acme")
    assert evil and acme and {e.org for e in evil} == {"evil"}
    first = await store.fetchone("SELECT prev_hash FROM ledger WHERE chain='evil' ORDER BY seq"
                                 " LIMIT 1")
    assert first is not None and first["prev_hash"] == ledger.GENESIS  # a chain of its own
    assert await ledger.verify_chain(store, "evil") is None
    assert await ledger.verify_chain(store, "acme") is None
    # moving an entry to the other office's chain breaks that chain
    async with store.transaction() as db:
        await db.execute("UPDATE ledger SET org='acme', chain='acme' WHERE seq=?",
                         (evil[-1].seq,))
    assert await ledger.verify_chain(store, "acme") == evil[-1].seq


async def test_an_idempotency_key_is_the_senders_in_its_own_office(tenants: Tenants) -> None:
    t = tenants
    status, sent = await t.call(t.evil_marco, "mail_send", to="scout", subject="Same key",
                                body="Mine", idempotencyKey="k-1")
    assert status == 200, sent
    assert sent["mail"]["mail_id"] != t.acme_mail.mail_id
    assert sent["mail"]["vault"] == "evil/scout-vault" and SECRET not in str(sent)


@pytest.mark.parametrize("quiet", [False, True], ids=["busy", "quiet"])
async def test_removing_someone_from_the_config_ends_their_tokens_for_good(
        tenants: Tenants, quiet: bool) -> None:
    """`quiet`: the office's config is read from the forge at each use, as after a minute
    with no call (or on a replica that read it since): the push's own read finds the new
    config already, and comparing with it revoked nothing before."""
    t = tenants
    if quiet:
        t.embedded.services.offices.max_age = 0
    without = {**EVIL, "agents": []}
    t.embedded.forge.put_file(f"evil/{CONFIG_REPO}", CONFIG_PATH, yaml.safe_dump(without),
                              pusher="eve")
    await t.embedded.settle()
    # (its token is not used while it is out: nothing but the push can revoke it)
    t.embedded.forge.put_file(f"evil/{CONFIG_REPO}", CONFIG_PATH, yaml.safe_dump(EVIL),
                              pusher="eve")  # added back
    await t.embedded.settle()
    status, body = await t.call(t.evil_scout, "mail_list")
    assert status == 401 and "revoked" in body["error"]["message"], body
    status, body = await t.call(t.evil_marco, "mail_list")
    assert status == 200, "whoever stayed keeps theirs"


async def test_an_uninstall_another_replica_handled_is_refused_here_at_once(
        tenants: Tenants) -> None:
    t = tenants
    status, _ = await t.call(t.evil_marco, "mail_list")
    assert status == 200
    # the replica that handled installation.deleted wrote it; this one never saw the webhook
    await installations.removed(t.embedded.services.store, "evil", t.installation)
    status, body = await t.call(t.evil_marco, "mail_list")
    assert status == 503 and body["error"]["code"] == "not_installed", body
    assert t.embedded.services.installation_of("evil") is None
    status, _ = await t.call(t.embedded.api_tokens[MARCO], "mail_list")
    assert status == 200  # acme goes on


async def test_a_login_in_two_offices_chooses_the_office_at_sign_in(
        embedded: Embedded) -> None:
    """acme's marco is also listed (as himself, by login) in evil's config: signing in with
    the forge never lands him silently in either; he chooses, and gets the one he chose."""
    evil = {"org": "evil", "humans": [{"email": "m@evil.test", "login": "marco"}]}
    seed_office(embedded.forge, parse_office(yaml.safe_dump(evil), "evil.yml", repository=False))
    (app_id,) = embedded.forge.state.apps
    embedded.forge.install_app(int(app_id), "evil")
    await embedded.settle()
    embedded.forge.state.web.authorizations.setdefault("marco", []).append(int(app_id))
    token = embedded.forge_tokens["marco"]
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as browser:
        answer = await forge_sign_in(browser, embedded, "/console/sign-in/forge", token)
        assert answer.status == 200, "no session yet: a choice"
        async with browser.get(embedded.app_url + "/console/inbox",
                               allow_redirects=False) as resp:
            assert resp.status == 303, "not signed in to any office"
        answer = await forge_sign_in(browser, embedded, "/console/sign-in/forge?org=evil",
                                    token)
        assert answer.status == 303, "signed in"
        async with browser.get(embedded.app_url + "/console/inbox") as resp:
            page = await resp.text()
        assert resp.status == 200 and '<span class="org">evil</span>' in page


async def test_the_operators_office_file_is_its_own_orgs_office_only(tmp_path: Any) -> None:
    """`VAULTMAIL_OFFICE` names one office: an org installed beside it has no office (not
    this one, whose principals its tokens would then act as)."""
    from bot.office.source import OfficeSource

    path = tmp_path / "office.yml"
    path.write_text(yaml.safe_dump({"org": "acme", "humans": [
        {"email": "marco@acme.com", "login": "marco"}]}))
    source = OfficeSource(path)
    forge: Any = None  # a local file is read without the forge
    acme = await source.get(forge, "Acme")
    assert acme is not None and acme.org == "acme"
    assert await source.get(forge, "evil") is None


async def test_each_offices_webhook_receives_its_own_offices_ledger_only(
        tmp_path: Any, database_url: str) -> None:
    """acme and evil each name a receiver under `webhooks:`; each gets its own office's
    entries, chained on its own, and nothing of the other's (one receiver URL named by both
    would be two cursors, each over its own office's entries)."""
    from aiohttp import web

    from bot.app.egress import OutboundPolicy
    from bot.app.embedded import start_embedded
    from bot.office.seed import office_yaml
    from tests.support import until

    got: dict[str, list[dict[str, Any]]] = {"acme": [], "evil": []}

    async def hook(request: web.Request) -> web.Response:
        got[request.match_info["org"]].append(await request.json())
        return web.Response(status=204)

    app = web.Application()
    app.router.add_post("/{org}", hook)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    emb = await start_embedded(data_dir=tmp_path / "d", port=0, forge_port=0,
                               database_url=database_url,
                               outbound=OutboundPolicy.parse("127.0.0.1"))
    try:
        acme = yaml.safe_load(office_yaml(emb.office))
        acme["webhooks"] = [f"http://127.0.0.1:{port}/acme"]
        emb.forge.put_file(f"acme/{CONFIG_REPO}", CONFIG_PATH, yaml.safe_dump(acme),
                           pusher="admin")
        seed_office(emb.forge, parse_office(yaml.safe_dump(
            {**EVIL, "webhooks": [f"http://127.0.0.1:{port}/evil"]}), "evil.yml", repository=False))
        (app_id,) = emb.forge.state.apps
        emb.forge.install_app(int(app_id), "evil")
        await emb.settle()
        async with aiohttp.ClientSession() as session:
            await ToolClient(session, emb, MARCO)("mail_send", to="scout", subject=SECRET,
                                                   body="x")
            evil = await api_tokens.create_token(emb.services.store, MARCO, "evil")
            async with session.post(emb.app_url + "/api/v1/tools/mail_send",
                                    headers={"Authorization": f"Bearer {evil}"},
                                    json={"to": "scout", "subject": "Evil plan",
                                          "body": "x"}) as resp:
                assert resp.status == 200
        await emb.settle()
        await until(lambda: any(e["event"] == "mail.sent" for e in got["evil"])
                    and any(e["data"].get("subject") == SECRET for e in got["acme"]))
    finally:
        await emb.stop()
        await runner.cleanup()
    assert {e["office"] for e in got["evil"]} == {"evil"}
    assert {e["office"] for e in got["acme"]} == {"acme"}
    assert SECRET not in json.dumps(got["evil"])
    assert got["evil"][0]["seq"] > 0 and "Evil plan" in json.dumps(got["evil"])
    for mine in got.values():  # each office's entries chain on their own, from the start
        assert mine[0]["prev_hash"] == ledger.GENESIS
        pairs = zip(mine, mine[1:], strict=False)  # each entry with the one after it
        assert all(e["prev_hash"] == before["hash"] for before, e in pairs)


async def test_a_backlog_asking_for_the_office_at_once_all_get_it(embedded: Embedded) -> None:
    """At start-up a backlog is handled side by side, each delivery asking for its org's
    office while the first fetch is still in flight: each gets the office, none "no config"
    (which finished their deliveries as ignored: mail lost for good; issue 27)."""
    from bot.office.source import OfficeSource

    source = OfficeSource()  # a replica just started: nothing fetched yet
    forge = embedded.services.forge_for_org("acme")
    offices = await asyncio.gather(*(source.get(forge, "acme") for _ in range(8)))
    assert [o.org if o else None for o in offices] == ["acme"] * 8


async def test_asking_while_the_fetched_config_is_being_parsed_waits_for_it(
        embedded: Embedded) -> None:
    """The forge has answered and the text is being parsed (in a thread: slow on a loaded
    host): who asks meanwhile gets the office, not "no config" (found in whole-suite runs: a
    `serve` just started refused an SMTP recipient as unknown, 550, and a restarted one
    handled a delivery as an office's without a config: its answer was marked fresh before
    it was in place)."""
    import threading

    from bot.office.source import OfficeSource

    source = OfficeSource()
    parsing, may_finish = threading.Event(), threading.Event()
    validate = source.validate

    def slow_validate(org: str, text: str) -> Any:
        parsing.set()
        may_finish.wait(30)
        return validate(org, text)

    source.validate = slow_validate  # type: ignore[method-assign]
    forge = embedded.services.forge_for_org("acme")
    first = asyncio.create_task(source.get(forge, "acme"))
    try:
        await asyncio.to_thread(parsing.wait, 30)
        second = asyncio.create_task(source.get(forge, "acme"))
        await asyncio.sleep(0)  # (it has asked, while the first is being parsed)
        may_finish.set()
        offices = [await first, await second]
    finally:
        may_finish.set()
    assert [o.org if o else None for o in offices] == ["acme", "acme"]


GLOBEX = {
    "org": "globex",
    "humans": [{"email": "amy@globex.test", "login": "amy",
                "permissions": ["mail.send", "editor"]}],
    "agents": [{"slug": "scout", "login": "globex-scout", "person": "amy@globex.test",
                "run": {"triggers": [], "dispatch": "none"},
                "capabilities": {"mail.send": ["*"]}}],
}
SQUATTER = {
    "org": "globex",
    "humans": [{"email": "eve@evil.test", "login": "eve",
                "permissions": ["mail.send", "editor"]}],
    "agents": [{"slug": "scout", "login": "evil-scout", "person": "eve@evil.test",
                "run": {"triggers": [], "dispatch": "none"},
                "capabilities": {"mail.send": ["*"]}}],
}


async def test_an_org_name_taken_by_another_account_starts_a_new_office(
        embedded: Embedded, session: aiohttp.ClientSession) -> None:
    """globex renames itself (or is deleted), the forge frees the name, and another account
    makes an org called globex and installs the App: its installation names another account
    id. Before, it was globex's office: its mail, its ledger, its tokens, its signing key."""
    forge, store = embedded.forge, embedded.services.store
    seed_office(forge, parse_office(yaml.safe_dump(GLOBEX), "globex.yml", repository=False))
    (app_id,) = forge.state.apps
    first = forge.install_app(int(app_id), "globex")
    await embedded.settle()
    amy = await api_tokens.create_token(store, "human:amy@globex.test", "globex")
    old_scout = await api_tokens.create_token(store, "agent:scout", "globex")
    url = f"{embedded.app_url}/api/v1/tools/"

    async def call(token: str, name: str, **args: Any) -> tuple[int, Any]:
        async with session.post(url + name, json=args,
                                headers={"Authorization": f"Bearer {token}"}) as resp:
            return resp.status, await resp.json()

    status, body = await call(amy, "mail_send", to="scout", subject=SECRET,
                              body="Do not forward.")
    assert status == 200, body
    await embedded.settle()
    old_kid = embedded.services.keyring.for_office("globex").active_kid
    old_account = forge.state.accounts["globex"].id
    forge.uninstall_app(first)
    await embedded.settle()
    # the name is another account's now: its own config, people and repositories
    forge.state.accounts["globex"].id = forge.state.next_id("account")
    forge.add_user("eve", "eve@evil.test")
    forge.set_permission("globex/scout-vault", "eve", "admin")
    forge.set_permission("globex/scout-vault", "evil-scout", "write")
    forge.put_file(f"globex/{CONFIG_REPO}", CONFIG_PATH, yaml.safe_dump(SQUATTER))
    embedded.services.offices.max_age = 0  # (however long ago it was read: read again)
    forge.install_app(int(app_id), "globex", sender="eve")
    await embedded.settle()
    from bot.store.offices import _COLUMNS
    left = {}
    for row in await store.fetchall(_COLUMNS):  # every column naming an office, every table
        table, column = row["t"], row["c"]
        # (the new owner's; and the login's binding of the operator's entries and office
        # file naming it, to the account first recorded under it: the old one's, bound to
        # the login by design)
        if column in ("org", "office", "chain") and table not in (
                "installations", "office_members", "office_members_read",
                "outbound_allow_accounts", "office_file_accounts"):
            found = await store.fetchone(f"SELECT COUNT(*) AS n FROM {table}"
                                         f" WHERE {column}='globex'")
            if found is not None and found["n"]:
                left[f"{table}.{column}"] = found["n"]
    assert not left, f"the old office's rows left under its name: {left}"
    assert await installations.login_entries_holder(store, "globex", 0) == old_account
    assert await installations.file_office_holder(store, "globex", "globex") == (
        old_account, forge.state.accounts["globex"].id)

    eve = await api_tokens.create_token(store, "human:eve@evil.test", "globex")
    new_scout = await api_tokens.create_token(store, "agent:scout", "globex")
    status, body = await call(eve, "mail_list")
    assert status == 200 and SECRET not in str(body), body
    status, body = await call(eve, "list_changes", since=0)
    assert status == 200 and SECRET not in str(body), body
    status, body = await call(new_scout, "mail_list")
    assert status == 200 and SECRET not in str(body), body
    status, body = await call(old_scout, "mail_list")
    assert status == 401, ("the old office's token acts in the new one", body)
    assert embedded.services.keyring.for_office("globex").active_kid != old_kid
    # what the old office signed, copied into the new owner's vault of the same name, is
    # not theirs: its keys are kept aside, neither published for the name nor trusted there
    vault = forge.state.repo("globex", "scout-vault")
    assert vault is not None
    (issue,) = [i for i in vault.issues.values()
                if i.title == SECRET]
    copied = verify_mail(SECRET, issue.body, "globex/scout-vault", embedded.services.keyring)
    assert not copied.valid, copied
    assert old_kid not in embedded.services.keyring.for_office("globex").key_ids
    async with session.get(f"{embedded.app_url}/.well-known/vaultmail-keys/globex.json") as r:
        assert old_kid not in await r.text()
    # what the old office kept is kept, aside, its ledger whole
    kept = await store.fetchall("SELECT subject FROM mails WHERE org LIKE 'globex~%'")
    assert [r["subject"] for r in kept] == [SECRET]
    assert await ledger.verify_chain(store) is None
    status, body = await call(eve, "mail_send", to="scout", subject="hello",
                              body="a new office")
    assert status == 200, body
    assert await ledger.verify_chain(store) is None


async def test_a_login_taken_over_by_another_account_acts_as_no_one(
        embedded: Embedded, session: aiohttp.ClientSession) -> None:
    """marco renames his forge account and someone else registers "marco": the office config
    still says marco is human:marco@acme.com, but the account is not the one the office has
    seen as marco. Before, its `/mail` went out as signed mail from marco, and it signed in
    to the console as him."""
    from tests.support import Actor

    forge = embedded.forge
    forge.add_repo("acme", "product")
    forge.set_permission("acme/product", "marco", "write")
    marco = Actor(session, embedded, "marco")
    issue = await marco.open_issue("acme/product", "Pricing", "Where we talk about pricing")
    await marco.comment("acme/product", issue["number"], "/mail scout Prices\nEU prices")
    await embedded.settle()
    (app_id,) = forge.state.apps
    forge.state.web.authorizations.setdefault("marco", []).append(int(app_id))
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as browser:
        answer = await forge_sign_in(browser, embedded, "/console/sign-in/forge",
                                     embedded.forge_tokens["marco"])
        assert answer.status == 303, "the real marco signs in"

    forge.state.accounts["marco"].id = forge.state.next_id("account")  # the login's new owner
    await marco.comment("acme/product", issue["number"], "/mail scout Wire the money\nnow")
    await embedded.settle()
    subjects = [r["subject"] for r in await embedded.services.store.fetchall(
        "SELECT subject FROM mails WHERE org='acme'")]
    assert "Prices" in subjects and "Wire the money" not in subjects, subjects
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as browser:
        answer = await forge_sign_in(browser, embedded, "/console/sign-in/forge",
                                     embedded.forge_tokens["marco"])
        assert answer.status == 403, "not the account the office knows as marco"
        assert "changed hands" in await answer.text()


async def test_the_numbers_an_office_is_shown_count_its_own_entries_only(
        embedded: Embedded, session: aiohttp.ClientSession) -> None:
    """`seq` numbered every office's ledger entries, so the gap between two of evil's told
    evil how many acme had made in between, live (list_changes, the console's ledger page
    and its paging, a webhook's delivery number). Each office is now shown its own count;
    a cursor held from before still reads the same."""
    store = embedded.services.store
    evil = {"org": "evil", "humans": [{"email": "mallory@evil.test", "login": "mallory",
                                       "permissions": ["mail.send"]}],
            "agents": [{"slug": "spy", "login": "evil-spy", "person": "mallory@evil.test",
                        "run": {"triggers": ["mail"], "dispatch": "none"}}]}
    seed_office(embedded.forge, parse_office(yaml.safe_dump(evil), "evil.yml", repository=False))
    (app_id,) = embedded.forge.state.apps
    embedded.forge.install_app(int(app_id), "evil")
    await embedded.settle()
    token = await api_tokens.create_token(store, "human:mallory@evil.test", "evil")
    mallory = ToolClient(session, embedded, "human:mallory@evil.test", token=token)
    marco = ToolClient(session, embedded, MARCO)

    async def evil_numbers(since: int = 0) -> list[int]:
        await mallory("mail_send", to="spy", subject="tick", body="x")
        await embedded.settle()
        changes = await mallory("list_changes", since=since, limit=1000)
        return [e["seq"] for e in changes["events"]]

    first = await evil_numbers()
    for n in range(5):  # acme's business, none of evil's
        await marco("mail_send", to="scout", subject=f"acme {n}", body="x")
    await embedded.settle()
    both = await evil_numbers()
    assert both == list(range(1, len(both) + 1)) and both[:len(first)] == first, both
    more = await evil_numbers(since=both[-1])  # a cursor pages on from where it was
    assert more and more == list(range(both[-1] + 1, both[-1] + 1 + len(more))), more
    headers = {"Authorization": f"Bearer {token}"}
    async with session.get(embedded.app_url + "/console/ledger", headers=headers) as resp:
        page = await resp.text()
    shown = [int(n) for n in re.findall(r'data-label="#">(\d+)<', page)]
    assert shown and max(shown) <= len(both) + 2, shown
    assert await ledger.verify_chain(store) is None


async def test_an_org_name_taken_by_another_account_is_not_served_the_old_config(
        embedded: Embedded, session: aiohttp.ClientSession) -> None:
    """The new owner of globex's name has no config of its own (yet): a missing config keeps
    the last valid one in force, and that was the old office's, its people acting as members
    and its webhooks hearing the new office's ledger (review). Read through a new
    installation, what was kept of an org's config is not that org's any more."""
    forge, services = embedded.forge, embedded.services
    seed_office(forge, parse_office(yaml.safe_dump(GLOBEX), "globex.yml", repository=False))
    (app_id,) = forge.state.apps
    first = forge.install_app(int(app_id), "globex")
    await embedded.settle()
    assert await services.offices.get(services.forge_for_org("globex"), "globex") is not None
    forge.uninstall_app(first)
    await embedded.settle()
    forge.state.accounts["globex"].id = forge.state.next_id("account")
    del forge._repo(f"globex/{CONFIG_REPO}").files[CONFIG_PATH]  # (none of its own)
    forge.install_app(int(app_id), "globex")
    await embedded.settle()
    office = await services.offices.get(services.forge_for_org("globex"), "globex")
    assert office is None, [h.login for h in office.humans]


async def test_the_chat_and_run_numbers_an_office_is_shown_count_its_own_only(
        tenants: Tenants) -> None:
    """A chat's number was its id across every office: evil's two chats told evil how many
    acme's people had started in between (the ledger's `chat:N` too). Each office numbers
    its own; its chats are read, answered and seen in the ledger by them."""
    t = tenants
    acme_marco = ToolClient(t.session, t.embedded, MARCO)

    async def evil_chat() -> int:
        status, body = await t.call(t.evil_marco, "agent_chat", agent="scout", message="hi")
        assert status == 200, body
        return int(body["chat"]["chat"])

    first = await evil_chat()
    for n in range(3):
        await acme_marco("agent_chat", agent="scout", message=f"acme {n}")
    second = await evil_chat()
    assert (first, second) == (1, 2), (first, second)
    status, body = await t.call(t.evil_scout, "chat_reply", chat=second, message="hello")
    assert status == 200 and body["chat"]["answer"] == "hello", body
    status, body = await t.call(t.evil_marco, "chat_get", chat=second)
    assert status == 200 and body["chat"]["answer"] == "hello", body
    status, body = await t.call(t.evil_marco, "list_changes", since=0)
    assert status == 200 and "chat:2" in [e["subject"] for e in body["events"]], body
    runs = [e["data"]["run"] for e in body["events"] if e["event"] == "run.queued"]
    assert runs == [1, 2], runs  # a run's number too is its office's
    mine = await acme_marco("chat_get", chat=t.acme_chat)  # acme's first, as it was
    assert SECRET in mine["chat"]["message"]


async def test_an_office_checks_its_chain_from_what_it_is_shown(
        embedded: Embedded, session: aiohttp.ClientSession) -> None:
    """The hash covered the time to the microsecond, and an entry went out with its time to
    the second: no one outside the index could check an entry's hash or the chain (review).
    Each entry now carries the time as hashed; this check is written from docs/using.md's
    recipe, as a receiver would, not from the app's code."""
    import hashlib

    marco = ToolClient(session, embedded, MARCO)
    await marco("mail_send", to="scout", subject="Prix", body="Les prix, s'il vous plaît")
    await embedded.settle()
    events = (await marco("list_changes", since=0, limit=1000))["events"]
    assert events
    prev = "0" * 64
    for e in events:  # (marco, the sender, sees the whole of acme's chain so far)
        blob = json.dumps(e["data"], sort_keys=True, separators=(",", ":"))
        fields = [e["prev_hash"], e["timestamp"], e["event"], e["actor"], e["subject"], blob,
                  *([e["chain"]] if e["chain"] is not None else [])]
        assert e["prev_hash"] == prev, e
        assert hashlib.sha256(json.dumps(fields, separators=(",", ":")).encode()
                              ).hexdigest() == e["hash"], e
        prev = e["hash"]
