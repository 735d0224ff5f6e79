"""What a handler receives besides the event: the services, this installation's forge, a logger."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bot.app.services import Services
    from bot.forge.base import Forge
    from bot.store import QueueItem


@dataclass
class HandlerContext:
    services: Services
    forge: Forge
    installation_id: int | None
    delivery_id: str
    log: logging.LoggerAdapter[logging.Logger]


def context_for(services: Services, item: QueueItem,
                log: logging.LoggerAdapter[logging.Logger]) -> HandlerContext:
    """The worker's context factory; LookupError when no installation can act for the event."""
    return HandlerContext(services=services, forge=services.forge_for(item.installation_id),
                          installation_id=item.installation_id, delivery_id=item.guid, log=log)
