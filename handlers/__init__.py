"""Webhook handlers, one module per concern, each with its own gidgethub Router."""

from gidgethub.routing import Router

from handlers import comments, config_checks, installation, items, mail, office_config


def build_router() -> Router:
    return Router(installation.router, mail.router, comments.router, items.router,
                  office_config.router, config_checks.router)


def build_own_router() -> Router:
    """Handlers for events the app caused itself: only crash recovery reads those."""
    return Router(mail.own_router)
