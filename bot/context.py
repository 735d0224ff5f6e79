"""What a handler receives besides the event: the services, this installation's forge, a logger."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bot.forge.base import Forge
    from bot.services import Services


@dataclass
class HandlerContext:
    services: Services
    forge: Forge
    installation_id: int | None
    delivery_id: str
    log: logging.LoggerAdapter[logging.Logger]
