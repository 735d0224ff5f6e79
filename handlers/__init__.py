"""Webhook handlers, one module per concern, each with its own gidgethub Router."""

from gidgethub.routing import Router

from handlers import comments, installation, items, mail, office_config


def build_router() -> Router:
    return Router(installation.router, mail.router, comments.router, items.router,
                  office_config.router)
