"""Helpers for the item tests: make items on the local forge, read what the app wrote there."""

from __future__ import annotations

from typing import Any

from bot.app.embedded import Embedded
from bot.store import ledger
from tests.support import Actor

VAULT = "acme/scout-vault"
MARCO, SARA, LEE = "human:marco@acme.com", "human:sara@acme.com", "human:lee@acme.com"
SCOUT, BUILDER, CRITIC = "agent:scout", "agent:builder", "agent:critic"

# The seed's own example, word for word.
TOKEN_TTL: dict[str, Any] = {
    "targetType": "outcome", "to": ["marco@acme.com"], "header": "Token TTL", "humanOnly": True,
    "body": "After the auth schema migration, should existing sessions keep working?",
    "context": "We're changing how sign-in sessions are stored. Today about 40,000 people are "
               "signed in. If old sessions keep working, nobody notices the change, but we keep "
               "some extra code around for a month. If they stop working, everyone has to sign "
               "in again once, the day we ship.",
    "options": [
        {"label": "Keep 30 days", "recommended": True,
         "description": "Nobody is signed out; we carry dual-read code for a month.",
         "then": "Add dual-read in refreshSession(), a removal task 30 days out, and a test "
                 "that legacy tokens still refresh."},
        {"label": "Force re-login",
         "description": "Everyone signs in again once; the migration ships clean.",
         "then": "Invalidate legacy tokens at cutover, skip dual-read, and draft the sign-out "
                 "notice for Marco."}]}


async def make_item(embedded: Embedded, who: Actor, kind: str, title: str, *, body: str = "",
                    assignees: list[str] | None = None, repo: str = VAULT) -> str:
    issue = await who.open_issue(repo, title, body or title, labels=[kind],
                                 assignees=assignees or [])
    await embedded.settle()
    return f"{repo}#{issue['number']}"


def where(ref: str) -> tuple[str, int]:
    repo, _, n = ref.partition("#")
    return repo, int(n)


async def forge_comments(admin: Actor, ref: str) -> list[dict[str, Any]]:
    return await admin.comments(*where(ref))


async def events(embedded: Embedded, name: str) -> list[ledger.Entry]:
    return await ledger.entries(embedded.services.store, event=name)
