"""The Gitea dialect of the local forge (Gitea 1.22 / Forgejo API under /api/v1)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from ..state import App, Delivery, Installation, Repo
from . import events

if TYPE_CHECKING:
    from ..forge import LocalForge


class GiteaDialect:
    name = "gitea"

    def build_app(self, forge: LocalForge) -> web.Application:
        from .server import build_app

        return build_app(forge)

    def delivery_headers(self, forge: LocalForge, app: App, delivery: Delivery,
                         body: bytes) -> dict[str, str]:
        return events.delivery_headers(forge, app, delivery, body)

    def installation_created(self, forge: LocalForge, inst: Installation, sender: str) -> None:
        """Gitea has no Apps: nothing is sent."""

    def repo_created(self, forge: LocalForge, repo: Repo, sender: str) -> None:
        events.repo_created(forge, repo, sender)

    def pushed(self, forge: LocalForge, repo: Repo, pusher: str, path: str,
               existed: bool) -> None:
        events.pushed(forge, repo, pusher, path, existed)


GITEA = GiteaDialect()
