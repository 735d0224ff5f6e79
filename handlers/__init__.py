"""Webhook handlers, one module per concern, each with its own router (gidgethub's, running an
event's handlers in the order the module adds them: bot.app.routing)."""

from bot.app.routing import OrderedRouter
from handlers import comments, config_checks, installation, items, mail, office_config


def build_router() -> OrderedRouter:
    return OrderedRouter(installation.router, mail.router, comments.router, items.router,
                         office_config.router, config_checks.router)


def build_own_router() -> OrderedRouter:
    """Handlers for events the app caused itself: only crash recovery reads those."""
    return OrderedRouter(mail.own_router)
