"""On Gitea one bot token reaches every org the bot is in (issue 21): a write for one org goes
out only for that org's office. `evil`, beside acme, declares acme's principal names; its
tokens can neither read nor reply to nor close acme's mail through that one token."""

from __future__ import annotations

import aiohttp
import yaml

from bot.app.embedded import Embedded
from bot.forge.gitea import SYNTHETIC_INSTALLATION_ID
from bot.office.config import parse_office
from bot.office.seed import seed_office
from bot.store import api_tokens, mails
from tests.support import ToolClient

EVIL = {"org": "evil",
        "humans": [{"email": "marco@acme.com", "login": "eve", "permissions": ["mail.send"]}],
        "agents": [{"slug": "scout", "login": "evil-scout", "person": "marco@acme.com",
                    "capabilities": {"mail.send": ["*"]}}]}


async def test_another_org_cannot_reply_to_or_close_mail_through_the_shared_bot_token(
        office: Embedded, session: aiohttp.ClientSession) -> None:
    seed_office(office.forge, parse_office(yaml.safe_dump(EVIL), "evil.yml"))
    office.forge.add_org_member("evil", office.services.app_slug, role="admin")
    # the bot is in evil too: one token, two orgs (as the app finds its orgs at start)
    office.services.installations["evil"] = SYNTHETIC_INSTALLATION_ID
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
