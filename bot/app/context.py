"""What a handler receives besides the event: the services, this installation's forge, a logger."""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bot.forge import markers
from bot.forge.once import comment_once
from bot.store import idempotency
from bot.store.queue import payload_org

if TYPE_CHECKING:
    from bot.app.services import Services
    from bot.forge.base import JSON, Forge
    from bot.store import QueueItem


def change_key(event: str, payload: dict[str, Any], office: str | None = None) -> str | None:
    """The forge change a delivery reports, when the app must act on it once however often it
    arrives (a redelivery under a new id, a replayed capture): a new comment, by its id and
    update time (commands and replies come from there), and an issue's opening, by the
    issue's id (an issue is opened once; adoption and its refusal come from there). What
    these do is keyed on this, never on the delivery id. By the forge's ids, not the
    repository's name: one change whose payloads spell it `Acme/Scout-Vault` and
    `acme/scout-vault`, or name it before and after a rename, is one key. Within its org
    (lower case), which intake checked an org-signed delivery is about: ids are the signer's
    word there, and one org's admins must not claim another org's change by naming its id.
    `office`: that org under its name now, where the payload may name it as it was called
    before a rename (bot.app.worker's `queued_change_key`; a rename moves the keys with the office:
    bot.store.offices.rename_in). Edits and other issue events carry no such identity (two
    edits within a second can look alike), so their handlers are idempotent by state
    instead."""
    return _change_key(event, payload, named=False, office=office)


def named_change_key(event: str, payload: dict[str, Any]) -> str | None:
    """The key releases before this one recorded the change under: its repository's name as
    the payload spelt it, for its org. A redelivery of a change handled then carries that
    spelling again, so its row is found (`Worker._dispatch_once`)."""
    return _change_key(event, payload, named=True)


def _change_key(event: str, payload: dict[str, Any], *, named: bool,
                office: str | None = None) -> str | None:
    action, repo = payload.get("action"), payload.get("repository")
    if not isinstance(repo, dict):
        return None
    full_name = repo.get("full_name")
    scope = full_name if named else office or str(full_name).partition("/")[0].lower()
    if event == "issue_comment" and action == "created":
        comment = payload.get("comment")
        if isinstance(comment, dict) and comment.get("id") is not None:
            return (f"issue_comment.created:{scope}:{comment.get('id')}:"
                    f"{comment.get('updated_at')}")
    if event == "issues" and action == "opened":
        issue = payload.get("issue")
        if isinstance(issue, dict) and issue.get("id") is not None:
            return f"issues.opened:{scope}:{issue.get('id')}"
    return None


@dataclass
class HandlerContext:
    services: Services
    forge: Forge
    installation_id: int | None
    delivery_id: str
    log: logging.LoggerAdapter[logging.Logger]
    # what the app says on the forge while handling this delivery carries a marker made of
    # `source` (the forge change, else the delivery) and a count, so a retry finds it
    source: str = ""
    retry: bool = False  # an earlier attempt at this delivery failed, maybe after writing
    said: int = field(default=0, init=False)
    # why the delivery waits for its issue's mail (`park`), or None
    parked: str | None = field(default=None, init=False)
    # the orgs the index had its installation on when this handling first asked (each
    # handler the delivery is routed to asks: `handlers.common.repo_now`)
    orgs: list[str] | None = field(default=None, init=False)
    # the scene each handler of this try at the delivery reads (`handlers.common.scene`):
    # found once, by the first (its event, the try it was found in, and it)
    scenes: dict[int, tuple[Any, str | None, Any]] = field(default_factory=dict, init=False)

    def park(self, why: str) -> None:
        """This delivery is about a vault's issue that is not mail yet, though it may become
        mail (its `issues.opened` delivery is missing, to be redelivered): instead of being
        finished, it is held in the queue (`parked`) until the issue is adopted, then handled
        again in its order (issue 28). The handler returns without acting on the mail."""
        self.parked = why

    def next_marker(self) -> str:
        """The marker for the next thing the app says in this handling: the same, in the
        same order, on every attempt."""
        self.said += 1
        digest = hashlib.sha256((self.source or self.delivery_id).encode()).hexdigest()[:20]
        return markers.marker("said", f"{digest}:{self.said}")

    async def post_once(self, repo: str, number: int, text: str, marker: str) -> None:
        """`text` on `repo`#`number` once across this delivery's tries: looked for when an
        earlier try may have written it, and a late copy (a try taken over whose create
        landed after the retry's) deleted (`comment_once`)."""
        async def earlier() -> JSON | None:
            if self.retry or idempotency.resumed():
                return await self.forge.find_comment(repo, number, marker)
            return None
        await comment_once(self.forge, repo, number, text, marker, find=earlier)


def context_for(services: Services, item: QueueItem,
                log: logging.LoggerAdapter[logging.Logger]) -> HandlerContext:
    """The worker's context factory; LookupError when no installation can act for the event."""
    forge = services.forge_for(item.installation_id, org=payload_org(item.payload))
    return HandlerContext(services=services, forge=forge,
                          installation_id=item.installation_id, delivery_id=item.guid, log=log,
                          source=change_key(item.event, item.payload) or item.guid,
                          retry=was_tried(item))


def was_tried(item: QueueItem) -> bool:
    """Whether an earlier run of this delivery may have written already: it failed before
    (`attempts`), or it was claimed before (a process that died after its forge write but
    before finishing the row: a takeover, or a restart under its replica id), so a handler
    looks before it writes (issue 27: a re-run after a crash said its comment twice)."""
    return item.attempts > 0 or item.takeovers > 0 or item.lease > 1
