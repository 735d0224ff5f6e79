"""On Gitea one bot token reaches every org the bot is in (issue 21): a write for one org goes
out only for that org's office. `evil`, beside acme, declares acme's principal names; its
tokens can neither read nor reply to nor close acme's mail through that one token."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import hmac
import json
from typing import Any

import aiohttp
import pytest
import yaml

from bot.app.embedded import GITEA_EVENTS, Embedded
from bot.app.gitea_orgs import ORGS_EVERY, GiteaOrgs, refresh
from bot.app.intake import org_webhook_secret
from bot.forge.gitea import SYNTHETIC_INSTALLATION_ID
from bot.office.config import parse_office
from bot.office.seed import seed_office
from bot.store import api_tokens, mails
from localforge.gitea.events import add_org_hook
from localforge.state import Delivery, Repo
from tests.support import ToolClient, gitea_api, until

EVIL = {"org": "evil",
        "humans": [{"email": "marco@acme.com", "login": "eve", "permissions": ["mail.send"]}],
        "agents": [{"slug": "scout", "login": "evil-scout", "person": "marco@acme.com",
                    "capabilities": {"mail.send": ["*"]}}]}


def _secret(office: Embedded, org: str, generation: int = 0) -> str:
    """The secret of `org`'s own webhook, as `vaultmail gitea-hook` makes it (for the org's
    id on the forge)."""
    return org_webhook_secret(office.services.settings.webhook_secret, org,
                              office.forge.state.accounts[org].id, generation)


async def _evil_seen(office: Embedded) -> None:
    """evil made on the forge (EVIL's office), the bot added to it, and the app's look at its
    orgs taken: the app knows evil's id, which evil's webhook secret is made for."""
    seed_office(office.forge, parse_office(yaml.safe_dump(EVIL), "evil.yml", repository=False))
    office.forge.add_org_member("evil", office.services.app_slug, role="admin")
    assert await refresh(office.services) == ["evil"]


async def _post(office: Embedded, session: aiohttp.ClientSession, path: str, secret: str,
                body: Any, event: str, guid: str) -> tuple[int, str]:
    """A delivery POSTed to `path` as Gitea posts an org webhook's, signed with `secret`:
    its status and text."""
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    mac = hmac.new(secret.encode(), raw, hashlib.sha256).hexdigest()
    async with session.post(office.app_url + path, data=raw, headers={
            "Content-Type": "application/json", "X-Gitea-Delivery": guid,
            "X-Gitea-Event": event, "X-Gitea-Signature": mac}) as resp:
        return resp.status, await resp.text()


async def test_another_org_cannot_reply_to_or_close_mail_through_the_shared_bot_token(
        office: Embedded, session: aiohttp.ClientSession) -> None:
    seed_office(office.forge, parse_office(yaml.safe_dump(EVIL), "evil.yml", repository=False))
    office.forge.add_org_member("evil", office.services.app_slug, role="admin")
    # the bot is in evil too: one token, two orgs (as the app finds its orgs)
    assert await refresh(office.services) == ["evil"]
    sent = (await ToolClient(session, office, "human:marco@acme.com")(
        "mail_send", to="scout", subject="ACME only", body="x"))["mail"]
    await office.settle()
    store = office.services.store
    evil_scout = await api_tokens.create_token(store, "agent:scout", "evil")
    tools = ToolClient(session, office, "human:marco@acme.com")
    for name, args in (("mail_get", {"mail": sent["ref"]}),
                       ("mail_reply", {"mail": sent["ref"], "body": "Sold."}),
                       ("mail_close", {"mail": sent["mail_id"]})):
        status, body = await tools.raw(name, args, token=evil_scout)
        assert status == 404 and body["error"]["code"] == "not_found", (name, body)
    await office.settle()
    row = await mails.get_mail(store, sent["mail_id"])
    assert row is not None and row.state == "mail:new"
    vault = office.forge.state.repo_by_full_name("acme/scout-vault")
    assert not [c for c in vault.comments.values() if "Sold." in c.body]
    assert vault.issues[sent["number"]].state == "open"


async def test_an_orgs_webhook_secret_signs_that_orgs_deliveries_only(
        office: Embedded, session: aiohttp.ClientSession) -> None:
    """Each org's webhook posts to /webhook/<org> with a secret made for it from the
    operator's: evil's admins, who set evil's, cannot sign a delivery about acme's vaults
    (a mail from acme's people), at its own webhook or at acme's or at /webhook."""
    from localforge.gitea.events import org_hooks

    master = office.services.settings.webhook_secret
    [(hook, _)] = org_hooks(office.forge, "acme")  # as `vaultmail up --forge gitea` sets it
    assert str(hook.webhook_url).endswith("/webhook/acme")
    assert hook.webhook_secret == _secret(office, "acme") != master
    await _evil_seen(office)
    evils = _secret(office, "evil")
    about_acme = json.dumps({
        "action": "opened", "number": 99,
        "issue": {"id": 1, "number": 99, "title": "From marco", "body": "x", "labels": [],
                  "user": {"login": "marco"}, "state": "open"},
        "repository": {"full_name": "acme/scout-vault", "name": "scout-vault",
                       "owner": {"login": "acme"}},
        "sender": {"login": "marco"}}).encode()

    async def post(path: str, secret: str, guid: str) -> tuple[int, str]:
        return await _post(office, session, path, secret, about_acme, "issues", guid)

    status, text = await post("/webhook/evil", evils, "d-1")
    assert status == 403 and "wrong_org" in text, text
    assert (await post("/webhook/acme", evils, "d-2"))[0] == 401  # not acme's secret
    assert (await post("/webhook", evils, "d-3"))[0] == 401
    assert await office.services.store.fetchone(
        "SELECT 1 FROM queue WHERE guid IN ('d-1','d-2','d-3')") is None


async def test_an_orgs_webhook_cannot_name_its_org_in_one_field_and_another_in_the_next(
        office: Embedded, session: aiohttp.ClientSession) -> None:
    """The org a delivery is about is named by its repository's owner, the owner in its
    `full_name` and its organization: all must be the webhook's org (found by review: the
    check read `repository.owner`, the handlers `full_name`; evil's admins signed a `/close`
    by acme's marco with owner "evil" and full_name "acme/scout-vault", and acme's mail was
    closed through the shared bot token)."""
    sent = (await ToolClient(session, office, "human:marco@acme.com")(
        "mail_send", to="scout", subject="ACME only", body="x"))["mail"]
    await office.settle()
    await _evil_seen(office)
    evils = _secret(office, "evil")
    issue = {"id": 777, "number": sent["number"], "title": "ACME only", "body": "x",
             "labels": [], "user": {"login": "vaultmail"}, "state": "open"}
    comment = {"id": 4242, "body": "/close", "user": {"login": "marco"},
               "created_at": "2099-01-01T00:00:00Z", "updated_at": "2099-01-01T00:00:00Z"}
    answers = []
    for n, (full_name, owner, organization) in enumerate([
            ("acme/scout-vault", "evil", None), ("evil/scout-vault", "acme", None),
            ("evil/scout-vault", "evil", "acme"), ("acme/scout-vault", "evil", "evil")]):
        about: dict[str, object] = {
            "action": "created", "issue": issue, "comment": comment,
            "repository": {"full_name": full_name, "name": "scout-vault",
                           "owner": {"login": owner}}, "sender": {"login": "marco"}}
        if organization:
            about["organization"] = {"login": organization}
        status, text = await _post(office, session, "/webhook/evil", evils, about,
                                   "issue_comment", f"evil-{n}")
        answers.append((status, "wrong_org" in text))
    await office.settle()
    assert answers == [(403, True)] * 4
    row = await mails.get_mail(office.services.store, sent["mail_id"])
    vault = office.forge.state.repo_by_full_name("acme/scout-vault")
    assert row is not None
    assert (row.state, vault.issues[sent["number"]].state) == ("mail:new", "open")


async def test_an_orgs_webhook_cannot_queue_a_delivery_under_another_orgs_issue(
        office: Embedded, session: aiohttp.ClientSession) -> None:
    """A delivery runs in the order of the issue it is about, and counts against that
    issue's office's share of the worker: evil's admins, who sign evil's deliveries, named
    evil's repository and, as a sub-issue's, acme's issue (found by review: it was queued
    under acme's issue, in acme's order and counted as acme's)."""
    body = {
        "action": "opened", "number": 5,
        "issue": {"id": 5, "number": 5, "title": "x", "body": "x", "labels": [],
                  "user": {"login": "eve"}, "state": "open"},
        "repository": {"full_name": "evil/website", "name": "website",
                       "owner": {"login": "evil"}},
        "sub_issue": {"id": 6, "number": 1}, "sub_issue_repo": {
            "full_name": "acme/scout-vault", "owner": {"login": "acme"}},
        "sender": {"login": "eve"}}
    await _evil_seen(office)
    status, text = await _post(office, session, "/webhook/evil", _secret(office, "evil"), body,
                               "issues", "evil-sub")
    assert status == 403 and "wrong_org" in text, text
    assert await office.services.store.fetchone(
        "SELECT 1 FROM queue WHERE guid LIKE '%evil-sub'") is None


async def test_each_org_writes_within_a_budget_of_its_own(
        office: Embedded, session: aiohttp.ClientSession) -> None:
    """One bot serves every org, and each org's writes are paced and budgeted apart, as each
    GitHub installation's are: evil spending its hour of creations leaves acme's mail going
    out at once (it spent the one budget every org drew on)."""
    import time

    seed_office(office.forge, parse_office(yaml.safe_dump(EVIL), "evil.yml", repository=False))
    office.forge.add_org_member("evil", office.services.app_slug, role="admin")
    office.services.installations["evil"] = SYNTHETIC_INSTALLATION_ID
    acme, evil = (office.services.forge_for_org(org) for org in ("acme", "evil"))
    assert acme is not evil and acme.pacer is not evil.pacer
    evil.pacer._content.extend([time.monotonic()] * 500)  # noqa: SLF001 (evil's hour, spent)
    assert evil.pacer.delay(True) > 3000 and acme.pacer.delay(True) == 0
    sent = (await ToolClient(session, office, "human:marco@acme.com")(
        "mail_send", to="scout", subject="Prices", body="x"))["mail"]
    await office.settle()
    assert office.forge.state.repo_by_full_name("acme/scout-vault").issues[sent["number"]]
    rows = await office.services.store.fetchall(  # (the labels made at start: the bot's)
        "SELECT DISTINCT who FROM forge_writes WHERE endpoint LIKE 'POST %/issues'")
    assert {r["who"] for r in rows} == {"gitea:acme"}


async def test_a_delivery_id_is_one_orgs_own(
        office: Embedded, session: aiohttp.ClientSession) -> None:
    """A Gitea org's webhook names its deliveries itself, and evil's admins, who sign evil's,
    choose the id: one evil sent first never makes acme's delivery of that id a redelivery
    (each org's ids are deduped apart; before, the one global id dropped acme's)."""

    async def post(org: str, guid: str) -> dict[str, object]:
        about = {
            "action": "opened", "number": 99,
            "issue": {"id": 1, "number": 99, "title": "From marco", "body": "x",
                      "labels": [], "user": {"login": "marco"}, "state": "open"},
            "repository": {"full_name": f"{org}/scout-vault", "name": "scout-vault",
                           "owner": {"login": org}},
            "sender": {"login": "marco"}}
        status, text = await _post(office, session, f"/webhook/{org}", _secret(office, org),
                                   about, "issues", guid)
        assert status == 202, text
        answer: dict[str, object] = json.loads(text)
        return answer

    await _evil_seen(office)
    assert (await post("evil", "5f0c-chosen"))["queued"] is True
    assert (await post("acme", "5f0c-chosen"))["queued"] is True, "acme's delivery was dropped"
    assert (await post("acme", "5f0c-chosen"))["queued"] is False  # acme's own redelivery


async def test_an_office_not_installed_yet_is_told_to_come_back_at_the_next_look(
        office: Embedded, session: aiohttp.ClientSession) -> None:
    """Gitea sends no installation events: the app finds an org the bot was added to at its
    next look at the bot's orgs (every ORGS_EVERY s). Acted out: a token of globex's office,
    before the bot is in globex, was answered 503 not_installed with Retry-After 5, and
    asking again 5 s later finds it no more installed; it says the looks' cadence now. The
    look taken, the office is served."""
    seed_office(office.forge, parse_office(yaml.safe_dump(GLOBEX), "globex.yml", repository=False))
    amy = await api_tokens.create_token(office.services.store, "human:amy@globex.test",
                                        "globex")
    async with session.post(office.app_url + "/api/v1/tools/mail_list", json={},
                            headers={"Authorization": f"Bearer {amy}"}) as resp:
        assert resp.status == 503, await resp.text()
        assert (await resp.json())["error"]["code"] == "not_installed"
        assert resp.headers.get("Retry-After") == str(int(ORGS_EVERY)), dict(resp.headers)
    office.forge.add_org_member("globex", office.services.app_slug, role="admin")
    assert await refresh(office.services) == ["globex"]
    status, _ = await ToolClient(session, office, "human:amy@globex.test", token=amy).raw(
        "mail_list", {})
    assert status == 200


async def test_the_console_says_when_to_come_back_to_a_forge_sign_in_not_set_up(
        office: Embedded, session: aiohttp.ClientSession) -> None:
    """Signing in with the forge is GitHub's OAuth client only: here it is 503, and like
    every 503 the app answers (acted out: this one did not) it carries Retry-After."""
    async with session.get(office.app_url + "/console/sign-in/forge",
                           allow_redirects=False) as resp:
        assert resp.status == 503 and "not set up" in await resp.text()
        assert resp.headers.get("Retry-After") == "5", dict(resp.headers)


async def test_on_gitea_the_console_says_how_people_sign_in_not_to_set_githubs_client(
        office: Embedded, session: aiohttp.ClientSession) -> None:
    """Sign-in with the forge is GitHub's OAuth client: on Gitea the console told operators
    to set GITHUB_CLIENT_ID and GITHUB_CLIENT_SECRET, which change nothing here. It says how
    people sign in instead: with an API token, in the form on the embedded default, else
    as a Bearer token (the sign-in page too, where it has no form)."""
    async with session.get(office.app_url + "/console/sign-in/forge",
                           allow_redirects=False) as resp:
        text = await resp.text()
    assert "GITHUB_CLIENT_ID" not in text and "GitHub&#39;s" in text, text
    assert "Sign in with an API token in the form below" in text, text
    office.services.settings = dataclasses.replace(office.services.settings,
                                                   token_sign_in=False)
    for path in ("/console/sign-in/forge", "/console/sign-in"):
        async with session.get(office.app_url + path, allow_redirects=False) as resp:
            text = await resp.text()
        assert "GITHUB_CLIENT_ID" not in text and "GitHub&#39;s" in text, (path, text)
        assert "Authorization: Bearer" in text and "vaultmail token create" in text, text


async def test_an_orgs_webhook_carries_no_app_installation_events(
        office: Embedded, session: aiohttp.ClientSession) -> None:
    """Gitea has no App installations: `installation` events come from the app itself at start,
    never over an org's webhook. evil's admins, who sign evil's, sent one naming an evil
    repository (so it passed as evil's) and it ran: with no repositories listed, the app
    listed every org's repositories through the one bot token and set labels in each vault,
    acme's too, as often as evil liked."""
    await _evil_seen(office)
    for n, event in enumerate(("installation", "installation_repositories")):
        body = {
            "action": "created" if event == "installation" else "added",
            "repositories": [], "repositories_added": [{"full_name": "acme/scout-vault"}],
            "repository": {"full_name": "evil/x", "name": "x", "owner": {"login": "evil"}},
            "sender": {"login": "eve"}}
        status, text = await _post(office, session, "/webhook/evil", _secret(office, "evil"),
                                   body, event, f"inst-{n}")
        assert status == 403 and "not_from_gitea" in text, (event, status, text)


async def test_an_orgs_webhook_cannot_claim_the_ids_of_another_orgs_comments_to_come(
        office: Embedded, session: aiohttp.ClientSession) -> None:
    """Gitea numbers every org's comments from one counter, so the next ids are easy to
    guess. evil's admins signed a comment on evil's own outcome under the id acme's next
    comment would get; an index that knew each forge comment once, whatever its issue, then
    took acme's real comment for evil's, already recorded: acme's comment was never indexed
    (found by review)."""
    call = gitea_api(session, office, "marco")

    vault = "/repos/acme/scout-vault"
    label = (await call("POST", f"{vault}/labels", {"name": "outcome", "color": "#00aabb"},
                        201))["id"]
    outcome = await call("POST", f"{vault}/issues", {"title": "Pricing", "body": "x",
                                                     "labels": [label]}, 201)
    await office.settle()
    await _evil_seen(office)
    await office.settle()
    guessed = office.forge.state.ids.get("comment", 400000) + 1  # acme's next comment's id
    claim = {"action": "created",
             "issue": {"id": 9001, "number": 1, "title": "Ours", "body": "x", "state": "open",
                       "labels": [{"id": 1, "name": "outcome"}], "user": {"login": "eve"}},
             "comment": {"id": guessed, "body": "claimed", "user": {"login": "eve"},
                         "created_at": "2026-12-06T00:00:00Z",
                         "updated_at": "2026-12-06T00:00:00Z"},
             "repository": {"full_name": "evil/scout-vault", "name": "scout-vault",
                            "owner": {"login": "evil"}}, "sender": {"login": "eve"}}
    status, text = await _post(office, session, "/webhook/evil", _secret(office, "evil"),
                               claim, "issue_comment", "evil-claim")
    assert status in (200, 202), text
    await office.settle()
    posted = await call("POST", f"{vault}/issues/{outcome['number']}/comments",
                        {"body": "Margins first, then prices."}, 201)
    assert posted["id"] == guessed
    await office.settle()
    ours = await office.services.store.fetchall(
        "SELECT body FROM comments WHERE item=?", (f"acme/scout-vault#{outcome['number']}",))
    assert [r["body"] for r in ours] == ["Margins first, then prices."], ours


async def test_an_org_made_again_by_another_user_while_the_app_was_down_starts_a_new_office(
        tmp_path: Any) -> None:
    """Gitea sends no installation events: the app finds its orgs at start. acme was deleted
    and another user made an org of that name and added the bot to it (as Gitea lets anyone
    add a user): by its id, another org, whose office starts empty, acme's kept aside (found
    by review: on Gitea the office went to whoever took the name)."""
    from bot.app.embedded import start_embedded

    secret = "ACME-CONFIDENTIAL on Gitea"
    first = await start_embedded(data_dir=tmp_path, persist_forge=True, port=0, forge_port=0,
                                 dialect="gitea")
    app_port = int(first.app_url.rsplit(":", 1)[1])
    try:
        async with aiohttp.ClientSession() as s:
            sent = await ToolClient(s, first, "human:marco@acme.com")(
                "mail_send", to="scout", subject=secret, body="x")
            assert sent["mail"]["vault"] == "acme/scout-vault"
        await first.settle()
        old_kid = first.services.keyring.for_office("acme").active_kid
        # the name is another org's now (its people, by chance, named as acme's were)
        first.forge.state.accounts["acme"].id = first.forge.state.next_id("account")
    finally:
        await first.stop()

    again = await start_embedded(data_dir=tmp_path, persist_forge=True, port=app_port,
                                 forge_port=0, dialect="gitea")
    try:
        token = await api_tokens.create_token(again.services.store, "human:marco@acme.com",
                                              "acme")
        async with aiohttp.ClientSession() as s:
            listed = await ToolClient(s, again, "human:marco@acme.com", token=token)(
                "mail_list")
        assert secret not in json.dumps(listed), listed
        assert again.services.keyring.for_office("acme").active_kid != old_kid
        kept = await again.services.store.fetchall(
            "SELECT subject FROM mails WHERE org LIKE 'acme~%'")
        assert [r["subject"] for r in kept] == [secret]
    finally:
        await again.stop()


async def test_while_the_app_runs_an_org_made_again_or_joined_is_taken_at_the_next_look(
        office: Embedded, session: aiohttp.ClientSession) -> None:
    """The app reads the bot's orgs again every few minutes (bot.app.gitea_orgs), not only at
    start: acme made again by another user under its name gets a new office, its old one
    moved aside, and an org the bot was added to since is installed (found by review: until
    a restart, whoever made acme again was served the old office)."""
    from bot.app.gitea_orgs import refresh

    secret = "ACME-CONFIDENTIAL while running"
    sent = await ToolClient(session, office, "human:marco@acme.com")(
        "mail_send", to="scout", subject=secret, body="x")
    assert sent["mail"]["vault"] == "acme/scout-vault"
    await office.settle()
    old_kid = office.services.keyring.for_office("acme").active_kid
    office.forge.state.accounts["acme"].id = office.forge.state.next_id("account")
    seed_office(office.forge, parse_office(yaml.safe_dump(EVIL), "evil.yml", repository=False))
    office.forge.add_org_member("evil", office.services.app_slug, role="admin")
    assert await refresh(office.services) == ["evil"]
    await office.settle()
    assert office.services.installation_of("evil") == SYNTHETIC_INSTALLATION_ID
    token = await api_tokens.create_token(office.services.store, "human:marco@acme.com",
                                          "acme")
    listed = await ToolClient(session, office, "human:marco@acme.com", token=token)(
        "mail_list")
    assert secret not in json.dumps(listed), listed
    assert office.services.keyring.for_office("acme").active_kid != old_kid
    assert await refresh(office.services) == [], "nothing new at the next look"


GLOBEX = {"org": "globex",
          "humans": [{"email": "amy@globex.test", "login": "amy", "permissions": ["mail.send"]}],
          "agents": [{"slug": "scout", "login": "globex-scout", "person": "amy@globex.test",
                      "capabilities": {"mail.send": ["*"]}}]}


async def _globex_with_amy(office: Embedded, session: aiohttp.ClientSession) -> ToolClient:
    """globex's office beside acme's (the bot added to globex, the app's look taken, globex's
    own webhook set): amy's tool client."""
    seed_office(office.forge, parse_office(yaml.safe_dump(GLOBEX), "globex.yml", repository=False))
    office.forge.add_org_member("globex", office.services.app_slug, role="admin")
    assert await refresh(office.services) == ["globex"]
    add_org_hook(office.forge, "globex", f"{office.app_url}/webhook/globex",
                 _secret(office, "globex"), GITEA_EVENTS)
    await office.settle()
    amy = await api_tokens.create_token(office.services.store, "human:amy@globex.test",
                                        "globex")
    return ToolClient(session, office, "human:amy@globex.test", token=amy)


async def _reply_lost(office: Embedded, session: aiohttp.ClientSession, vault: str,
                      number: int) -> Delivery:
    """globex's scout replies by a comment on `vault#number`; its delivery (through globex's
    own webhook) is lost: the delivery."""
    deliveries = office.forge.state.deliveries
    before = set(deliveries)
    office.forge.faults.drop_webhooks(count=1)
    async with session.post(
            f"{office.forge.url}/api/v1/repos/{vault}/issues/{number}/comments",
            json={"body": "EU prices, up 4%."},
            headers={"Authorization": f"token {office.forge.user_token('globex-scout')}"}
            ) as resp:
        assert resp.status == 201, await resp.text()
    await office.settle()
    assert office.forge.faults.drop.count == 0, "the comment's delivery was dropped"
    (lost,) = [deliveries[i] for i in set(deliveries) - before]
    return lost


async def _system_hook(office: Embedded, session: aiohttp.ClientSession, event: str,
                       payload: dict[str, Any], guid: str) -> None:
    """`payload` delivered again as the instance's system webhook sends it (signed with the
    operator's secret: the forge's word), under a new id (Gitea's Redeliver), and handled."""
    status, text = await _post(office, session, "/webhook",
                               office.services.settings.webhook_secret, payload, event, guid)
    assert status == 202, text
    await office.settle()


async def test_a_reply_sent_under_an_orgs_old_login_is_taken_by_its_renamed_office(
        office: Embedded, session: aiohttp.ClientSession) -> None:
    """scout replies on amy's mail in globex/scout-vault, its delivery lost; globex renames
    itself initech (followed at the app's next look); the comment is delivered again as it
    was sent, naming globex. Before, with acme's office beside it every org's installation
    is the bot's one (id 1), so the index could say no org the delivery's installation is
    (installations.org_of_installation): globex, no office's now, was "no office config for
    this org: event ignored", and the mail never replied. Now the forge is asked, with the
    app's own token, what the repository (by its id) is called now: a name within the
    office whose names before include globex is taken."""
    client = await _globex_with_amy(office, session)
    sent = (await client("mail_send", to="scout", subject="Prices?", body="Which?"))["mail"]
    await office.settle()
    lost = await _reply_lost(office, session, "globex/scout-vault", sent["number"])
    office.forge.rename_org("globex", "initech")
    assert await refresh(office.services) == []
    await _system_hook(office, session, "issue_comment", lost.payload, "redelivered-reply")
    mail = await mails.mail_at(office.services.store, "initech/scout-vault", sent["number"])
    assert mail is not None and mail.state == "mail:replied", mail


async def test_an_org_renamed_on_gitea_keeps_its_office_at_the_next_look(
        office: Embedded, session: aiohttp.ClientSession) -> None:
    """Gitea tells no hook of an org renamed: the app's look at the bot's orgs finds the org's
    id under a new name, and the office follows it (its people's tokens, its mail under the
    vault's new name), as GitHub's installation_target.renamed makes it. Before, the renamed
    org was a new, empty office."""
    client = await _globex_with_amy(office, session)
    sent = await client("mail_send", to="scout", subject="before the rename", body="x")
    assert sent["mail"]["vault"] == "globex/scout-vault"
    await office.settle()
    office.forge.rename_org("globex", "initech")
    assert await refresh(office.services) == [], "the same org: nothing newly installed"
    assert office.services.installation_of("initech") == SYNTHETIC_INSTALLATION_ID
    listed = await client("mail_list")
    assert [m["vault"] for m in listed["mails"]] == ["initech/scout-vault"], listed
    again = await client("mail_send", to="scout", subject="after the rename", body="y")
    assert again["mail"]["vault"] == "initech/scout-vault"


@pytest.mark.parametrize(("renames", "now"), [
    # evil takes the name acme left
    ([("acme", "acme2"), ("evil", "acme")], {"acme": "acme2", "evil": "acme"}),
    # the two swap their names
    ([("acme", "spare"), ("evil", "acme"), ("spare", "evil")], {"acme": "evil", "evil": "acme"}),
], ids=["freed", "swapped"])
async def test_orgs_that_take_each_others_names_in_one_look_keep_their_offices(
        office: Embedded, session: aiohttp.ClientSession,
        renames: list[tuple[str, str]], now: dict[str, str]) -> None:
    """Between two looks at the bot's orgs, acme renames itself and evil takes the name acme
    left (or the two swap). Before, the renames were followed in the order of their names:
    evil's into acme first, which moved acme's office aside as one whose org had left
    (its tokens revoked, its keys given to evil). Now the rename out of a name is followed
    before the rename into it (a swap through a name no forge gives)."""
    services = office.services
    seed_office(office.forge, parse_office(yaml.safe_dump(EVIL), "evil.yml", repository=False))
    office.forge.add_org_member("evil", services.app_slug, role="admin")
    assert await refresh(services) == ["evil"]
    tokens, keys = {}, {}
    for org in ("acme", "evil"):
        tokens[org] = await api_tokens.create_token(services.store, "human:marco@acme.com",
                                                    org)
        await ToolClient(session, office, "human:marco@acme.com", token=tokens[org])(
            "mail_send", to="scout", subject=f"{org}'s own", body="x")
        await office.settle()
        keys[org] = set(services.keyring.for_office(org).key_ids)
    for old, new in renames:
        office.forge.rename_org(old, new)
    assert await refresh(services) == []
    for org in ("acme", "evil"):
        listed = await ToolClient(session, office, "human:marco@acme.com",
                                  token=tokens[org])("mail_list")
        assert [(m["vault"], m["subject"]) for m in listed["mails"]] == [
            (f"{now[org]}/scout-vault", f"{org}'s own")], (org, listed)
        assert set(services.keyring.for_office(now[org]).key_ids) >= keys[org]
    assert not set(services.keyring.for_office("acme").key_ids) & keys["acme"]
    assert not await services.store.fetchall(
        "SELECT org FROM api_tokens WHERE revoked_at IS NOT NULL")
    assert sorted(services.installations) == sorted(now.values())


async def test_a_repository_of_the_org_that_took_an_old_login_is_not_the_renamed_offices(
        office: Embedded, session: aiohttp.ClientSession) -> None:
    """The same, and eve makes an org called globex (the login initech left) with a
    scout-vault of its own: a delivery about her repository (its id hers, as the instance's
    webhook sends it) is hers, never initech's mail of the same number."""
    client = await _globex_with_amy(office, session)
    sent = (await client("mail_send", to="scout", subject="Prices?", body="Which?"))["mail"]
    await office.settle()
    lost = await _reply_lost(office, session, "globex/scout-vault", sent["number"])
    office.forge.rename_org("globex", "initech")
    assert await refresh(office.services) == []
    office.forge.add_user("eve", "eve@evil.test")
    office.forge.add_org("globex", owner="eve")
    office.forge.add_repo("globex", "scout-vault")
    hers = office.forge.state.repo_by_full_name("globex/scout-vault")
    await _system_hook(office, session, "issue_comment",
                       {**lost.payload, "repository": {**lost.payload["repository"],
                                                       "id": hers.id}},
                       "eves-comment")
    mail = await mails.mail_at(office.services.store, "initech/scout-vault", sent["number"])
    assert mail is not None and mail.state == "mail:new", mail


async def test_a_vault_renamed_on_gitea_is_followed_and_a_reply_under_its_old_name_taken(
        office: Embedded, session: aiohttp.ClientSession) -> None:
    """scout replies on amy's mail in globex/scout-vault, its delivery lost; the vault is
    renamed scout-mail in its settings (Gitea tells no hook); the comment is delivered
    again as it was sent, naming scout-vault. Before, the app never noticed a vault renamed
    on Gitea: its mail stayed under the old name, whose new repository would have been the
    mail's, and nothing asked the forge what the repository is called now. Now the app's
    look at the bot's orgs follows the vaults renamed (as a start does on GitHub), and the
    late reply is followed by its repository's id to the mail under the vault's new name."""
    client = await _globex_with_amy(office, session)
    sent = (await client("mail_send", to="scout", subject="Prices?", body="Which?"))["mail"]
    await office.settle()
    lost = await _reply_lost(office, session, "globex/scout-vault", sent["number"])
    office.forge.rename_repo("globex/scout-vault", "scout-mail")
    assert await refresh(office.services) == []
    listed = await client("mail_list")
    assert [m["vault"] for m in listed["mails"]] == ["globex/scout-mail"], listed
    await _system_hook(office, session, "issue_comment", lost.payload, "redelivered-reply")
    mail = await mails.mail_at(office.services.store, "globex/scout-mail", sent["number"])
    assert mail is not None and mail.state == "mail:replied", mail


async def test_a_reply_redelivered_through_the_orgs_webhook_after_a_vault_rename_is_taken(
        office: Embedded, session: aiohttp.ClientSession) -> None:
    """The same, the comment delivered again through globex's own webhook (its admins' word:
    its repository's id is dropped, bot.app.org_signed). Before, the comment was read back
    under the vault's old name, which Gitea leads to scout-mail, and refused as "not on
    globex/scout-vault#1" (the forge says it is on scout-mail#1): the mail never replied.
    The repository is now the one the forge answers the delivery's name with, its id read
    back with the issue (the app's own token), and followed by it."""
    client = await _globex_with_amy(office, session)
    sent = (await client("mail_send", to="scout", subject="Prices?", body="Which?"))["mail"]
    await office.settle()
    lost = await _reply_lost(office, session, "globex/scout-vault", sent["number"])
    office.forge.rename_repo("globex/scout-vault", "scout-mail")
    assert await refresh(office.services) == []
    office.forge.webhooks.redeliver(lost)
    await office.settle()
    mail = await mails.mail_at(office.services.store, "globex/scout-mail", sent["number"])
    assert mail is not None and mail.state == "mail:replied", mail


def _comment_in(repo: Repo, n: int) -> dict[str, Any]:
    """eve's comment `n` on #1 of `repo`, as the instance's system webhook sends it."""
    owner, _, name = repo.full_name.partition("/")
    return {"action": "created",
            "issue": {"id": 777, "number": 1, "title": "hello", "body": "x", "labels": [],
                      "user": {"login": "eve"}, "state": "open"},
            "comment": {"id": 888 + n, "body": "hi there", "user": {"login": "eve"},
                        "created_at": "2026-01-01T00:00:00Z",
                        "updated_at": "2026-01-01T00:00:00Z"},
            "repository": {"id": repo.id, "full_name": repo.full_name, "name": name,
                           "owner": {"login": owner}},
            "sender": {"login": "eve"}}


async def test_a_delivery_about_an_org_the_app_never_knew_is_ignored_without_asking_the_forge(
        office: Embedded, session: aiohttp.ClientSession) -> None:
    """The instance's system webhook sends every comment on the instance, and `outsider`, an
    org that never made an office, has a public repository eve comments on. Before, with
    acme and globex beside each other, each such delivery asked the forge what the
    repository (by its id) is called now (handlers.common._left_login): five comments, five
    reads (ten with the rename's); and with that read failing (502) the outsider's delivery
    was retried and dead-lettered. Now a login none of the offices ever had is ignored at
    once: no forge call, and (since the intake answers it) nothing kept."""
    await _globex_with_amy(office, session)
    forge = office.forge
    forge.add_user("eve", "eve@evil.test")
    forge.add_org("outsider", owner="eve")
    forge.add_repo("outsider", "notes", private=False)
    notes = forge.state.repo_by_full_name("outsider/notes")
    forge.requests.clear()
    for n in range(5):
        await _system_hook(office, session, "issue_comment", _comment_in(notes, n), f"out-{n}")
    by_id = "GET /api/v1/repositories/{repository_id}"
    assert forge.requests.count(by_id) == 0, [(r.route, r.status) for r in forge.requests]
    forge.faults.add(route=by_id, status=502)
    await _system_hook(office, session, "issue_comment", _comment_in(notes, 5), "out-502")
    assert forge.requests.count(by_id) == 0
    assert await office.services.store.processed_count("out-502") == 0


async def test_a_delivery_about_an_org_that_added_the_bot_since_the_last_look_is_its_offices(
        office: Embedded, session: aiohttp.ClientSession) -> None:
    """evil adds the bot after the app's last look at its orgs (every 300 s), and eve's
    comment there comes through the instance's system webhook. Before, it was answered
    `no_office` and ignored: lost, as was every delivery about evil until the next look. Now
    a delivery about an org with no office here makes the app look at the bot's orgs, at
    most once every 30 s whoever asks: evil is an office and the delivery queued. An
    outsider's deliveries within those 30 s read nothing more."""
    now = [0.0]
    GiteaOrgs(office.services, again_after=30, clock=lambda: now[0])  # (its looks, no rounds)
    forge = office.forge
    seed_office(forge, parse_office(yaml.safe_dump(EVIL), "evil.yml", repository=False))
    forge.add_org_member("evil", office.services.app_slug, role="admin")
    forge.add_repo("evil", "notes", private=False)
    forge.add_user("eve", "eve@evil.test")
    forge.add_org("outsider", owner="eve")
    forge.add_repo("outsider", "notes", private=False)
    now[0] = 31.0
    forge.requests.clear()
    master = office.services.settings.webhook_secret
    status, text = await _post(office, session, "/webhook", master,
                               _comment_in(forge.state.repo_by_full_name("evil/notes"), 0),
                               "issue_comment", "evil-0")
    assert status == 202 and json.loads(text)["queued"] is True, text
    assert office.services.installation_of("evil") is not None
    looks = "GET /api/v1/user/orgs"
    assert forge.requests.count(looks) == 1
    await office.settle()  # (evil's vaults labelled, as at start)
    forge.requests.clear()
    outsider = _comment_in(forge.state.repo_by_full_name("outsider/notes"), 1)
    for n in range(3):
        status, text = await _post(office, session, "/webhook", master, outsider,
                                   "issue_comment", f"outsider-{n}")
        assert status == 202 and "no_office" in text, text
    assert [r.route for r in forge.requests] == []  # (looked 0 s ago)
    now[0] = 62.0
    status, text = await _post(office, session, "/webhook", master, outsider,
                               "issue_comment", "outsider-3")
    assert status == 202 and "no_office" in text, text
    assert [r.route for r in forge.requests] == [looks]


async def test_a_deliverys_look_while_a_rounds_look_is_under_way_is_the_same_read(
        office: Embedded, session: aiohttp.ClientSession) -> None:
    """The app's round looks at the bot's orgs and the forge is slow to answer; 31 s later a
    delivery about an org with no office here asks for a look. Before, it made a second
    read beside the first (the round's look was not the one deliveries share), and both
    took what they read, each taking the same new orgs. One look at a time, whoever asks."""
    now = [100.0]
    looks = GiteaOrgs(office.services, again_after=30, clock=lambda: now[0])
    forge = office.forge
    forge.requests.clear()
    route = "GET /api/v1/user/orgs"
    held = forge.faults.hold(route, count=1)
    round_ = asyncio.create_task(looks._round())  # noqa: SLF001
    await asyncio.wait_for(held.arrived.wait(), 10)
    now[0] = 131.0
    delivery = looks.look_now()  # (while the round's read is held)
    held.release()
    assert await asyncio.wait_for(delivery, 10) is True
    await asyncio.wait_for(round_, 10)
    assert forge.requests.count(route) == 1


async def test_an_office_whose_vault_reads_hang_holds_up_no_other_offices_catch_up(
        office: Embedded, session: aiohttp.ClientSession) -> None:
    """The app's look at the bot's orgs follows every office's vaults renamed (Gitea tells no
    hook). globex's vault read is not answered; acme's scout-vault is renamed scout-mail
    after the look that hung began. Before, each look waited for every office's catch-up,
    so the held read stopped the looks (acme's rename never followed, no org taken); now
    each office's catch-up runs in a task of its own, one at a time per office, and the next
    look goes on without it."""
    await _globex_with_amy(office, session)
    forge = office.forge
    held = forge.faults.hold("GET /api/v1/repos/{owner}/{repo}", count=None,
                             repo="globex/scout-vault")
    forge.requests.clear()
    looks = GiteaOrgs(office.services, every=0.01)
    looks.start()
    try:
        await held.arrived.wait()
        await until(lambda: any(r.path == "/api/v1/repos/acme/scout-vault"  # (this look's)
                                for r in forge.requests))
        forge.rename_repo("acme/scout-vault", "scout-mail")
        await until(lambda: office.services.keyring.renamed("acme").get("acme/scout-vault")
                    == "acme/scout-mail")
    finally:
        held.release()
        await looks.stop()


async def test_a_delivery_redelivered_to_an_orgs_old_webhook_url_is_its_renamed_offices(
        office: Embedded, session: aiohttp.ClientSession) -> None:
    """scout's reply through globex's own webhook is lost; globex renames itself initech
    (followed at the app's next look); Gitea's Redeliver posts it again to the URL the hook
    had, /webhook/globex, signed with the secret it had. Before, the app knew no org called
    globex any more, so no secret for it: a bare 401 "bad_signature", as if the secret were
    wrong, and the reply never taken. The secret is the office's (made for globex's id, which
    is initech's): taken as initech's, once per delivery id."""
    client = await _globex_with_amy(office, session)
    sent = (await client("mail_send", to="scout", subject="Prices?", body="Which?"))["mail"]
    await office.settle()
    [opened] = [d for d in office.forge.state.deliveries.values()
                if d.url.endswith("/webhook/globex") and d.action == "opened"]
    lost = await _reply_lost(office, session, "globex/scout-vault", sent["number"])
    assert lost.url.endswith("/webhook/globex")
    office.forge.rename_org("globex", "initech")
    assert await refresh(office.services) == []
    handled = office.forge.webhooks.redeliver(opened)  # taken before the rename: not again
    await office.settle()
    assert handled is not None and handled.status_code == 202, handled.response_payload
    assert json.loads(handled.response_payload or "{}")["queued"] is False
    again = office.forge.webhooks.redeliver(lost)
    await office.settle()
    assert again is not None and again.status_code == 202, again.response_payload
    mail = await mails.mail_at(office.services.store, "initech/scout-vault", sent["number"])
    assert mail is not None and mail.state == "mail:replied", mail
    twice = office.forge.webhooks.redeliver(lost)  # the same delivery id: recorded already
    await office.settle()
    assert twice is not None and twice.status_code == 202, twice.response_payload
    assert json.loads(twice.response_payload or "{}")["queued"] is False


async def test_an_outsiders_delivery_is_answered_at_intake_with_no_forge_read_and_nothing_kept(
        office: Embedded, session: aiohttp.ClientSession) -> None:
    """An outsider's delivery: a comment on `outsider`, an org the bot was never in, through
    the instance's system webhook (every org's comments), and one on `evil`, an org that
    removed the bot, through evil's own webhook, which still posts. Before, each was queued
    and its handling read the org's office config from the forge (a 502 there retried it,
    on the forge's budget, into dead letters); a push to outsider/notes, which no handler
    takes, had its id recorded. Now each is answered at intake, saying there is no office
    for its org: no forge read, nothing queued or recorded."""
    forge = office.forge
    forge.add_user("eve", "eve@evil.test")
    forge.add_org("outsider", owner="eve")
    forge.add_repo("outsider", "notes", private=False)
    notes = forge.state.repo_by_full_name("outsider/notes")
    await _evil_seen(office)
    forge.add_repo("evil", "notes", private=False)
    forge.remove_org_member("evil", office.services.app_slug)
    await refresh(office.services)
    assert office.services.installation_of("evil") is None
    evils = forge.state.repo_by_full_name("evil/notes")
    forge.faults.add(route="GET /api/v1/repos/{owner}/{repo}/contents/{filepath}", status=502)
    forge.requests.clear()
    master = office.services.settings.webhook_secret
    answers = []
    for n, (path, secret, repo) in enumerate([
            ("/webhook", master, notes), ("/webhook", master, notes),
            ("/webhook/evil", _secret(office, "evil"), evils)]):
        answers.append(await _post(office, session, path, secret, _comment_in(repo, n),
                                   "issue_comment", f"outsider-{n}"))
    # a push to a repository other than .github, which no handler acts on: before, its id
    # was recorded, a write for each of the instance's pushes anywhere
    push = {"ref": "refs/heads/main", "commits": [], "sender": {"login": "eve"},
            "repository": {"id": notes.id, "full_name": "outsider/notes", "name": "notes",
                           "owner": {"login": "outsider"}}}
    answers.append(await _post(office, session, "/webhook", master, push, "push",
                               "outsider-push"))
    await office.settle()
    about = [(r.route, r.status) for r in forge.requests
             if "/outsider/" in r.path.lower() or "/evil/" in r.path.lower()]
    assert about == [], about
    assert [status for status, _ in answers] == [202, 202, 503, 202], answers
    assert all("no office for" in text and "no_office" in text for _, text in answers), answers
    store = office.services.store
    for table in ("queue", "deliveries"):
        assert await store.fetchone(
            f"SELECT 1 FROM {table} WHERE guid LIKE '%outsider-%'") is None, table
