"""What a handler receives besides the event: the services, this installation's forge, a logger."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bot.app.services import Services
    from bot.forge.base import Forge


@dataclass
class HandlerContext:
    services: Services
    forge: Forge
    installation_id: int | None
    delivery_id: str
    log: logging.LoggerAdapter[logging.Logger]
