"""What a handler receives besides the event: the services, this installation's forge, a logger."""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bot.app.services import Services
    from bot.forge.base import Forge
    from bot.store import QueueItem


def change_key(event: str, payload: dict[str, Any]) -> str | None:
    """The forge change a delivery reports, when the app must act on it once however often it
    arrives: a new comment, by its id and update time (commands and replies come from there).
    What a command does is keyed on this, never on the delivery id. Edits and issue events
    carry no such identity (two edits within a second can look alike), so their handlers
    are idempotent by state instead."""
    comment, repo = payload.get("comment"), payload.get("repository")
    if (event != "issue_comment" or payload.get("action") != "created"
            or not isinstance(comment, dict) or not isinstance(repo, dict)
            or comment.get("id") is None):
        return None
    return (f"issue_comment.created:{repo.get('full_name')}:{comment.get('id')}:"
            f"{comment.get('updated_at')}")


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

    def next_marker(self) -> str:
        """The marker for the next thing the app says in this handling: the same, in the
        same order, on every attempt."""
        self.said += 1
        digest = hashlib.sha256((self.source or self.delivery_id).encode()).hexdigest()[:20]
        return f"<!-- vaultmail:said {digest}:{self.said} -->"


def context_for(services: Services, item: QueueItem,
                log: logging.LoggerAdapter[logging.Logger]) -> HandlerContext:
    """The worker's context factory; LookupError when no installation can act for the event."""
    return HandlerContext(services=services, forge=services.forge_for(item.installation_id),
                          installation_id=item.installation_id, delivery_id=item.guid, log=log,
                          source=change_key(item.event, item.payload) or item.guid,
                          retry=item.attempts > 0)
