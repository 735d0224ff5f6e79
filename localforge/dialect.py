"""What a forge dialect (GitHub, Gitea) supplies to the dialect-neutral core."""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Protocol

from aiohttp import web

from .state import Account, App, Delivery, Installation, Repo

if TYPE_CHECKING:
    from .forge import LocalForge


class Dialect(Protocol):
    name: str

    def build_app(self, forge: LocalForge) -> web.Application: ...

    def delivery_headers(self, forge: LocalForge, app: App, delivery: Delivery,
                         body: bytes) -> dict[str, str]: ...

    def installation_created(self, forge: LocalForge, inst: Installation,
                             sender: str) -> None: ...

    def installation_deleted(self, forge: LocalForge, inst: Installation,
                             sender: str) -> None: ...

    def installation_suspended(self, forge: LocalForge, inst: Installation, sender: str,
                               action: str) -> None: ...

    def repo_created(self, forge: LocalForge, repo: Repo, sender: str) -> None: ...

    def pushed(self, forge: LocalForge, repo: Repo, pusher: str, path: str,
               existed: bool) -> None: ...

    def account_renamed(self, forge: LocalForge, account: Account, was: str,
                        sender: str) -> None: ...

    def repo_renamed(self, forge: LocalForge, repo: Repo, was: str, sender: str) -> None: ...

    def repo_transferred(self, forge: LocalForge, repo: Repo, was: str,
                         sender: str) -> None: ...


class EventsDialect:
    """A dialect made of its server module (`build_app`) and events module (webhooks)."""

    name: str
    events: ModuleType
    server: ModuleType

    def build_app(self, forge: LocalForge) -> web.Application:
        app: web.Application = self.server.build_app(forge)
        return app

    def delivery_headers(self, forge: LocalForge, app: App, delivery: Delivery,
                         body: bytes) -> dict[str, str]:
        headers: dict[str, str] = self.events.delivery_headers(forge, app, delivery, body)
        return headers

    def installation_created(self, forge: LocalForge, inst: Installation, sender: str) -> None:
        self.events.installation_created(forge, inst, sender)

    def installation_deleted(self, forge: LocalForge, inst: Installation, sender: str) -> None:
        self.events.installation_deleted(forge, inst, sender)

    def installation_suspended(self, forge: LocalForge, inst: Installation, sender: str,
                               action: str) -> None:
        self.events.installation_suspended(forge, inst, sender, action)

    def repo_created(self, forge: LocalForge, repo: Repo, sender: str) -> None:
        self.events.repo_created(forge, repo, sender)

    def pushed(self, forge: LocalForge, repo: Repo, pusher: str, path: str,
               existed: bool) -> None:
        self.events.pushed(forge, repo, pusher, path, existed)

    def account_renamed(self, forge: LocalForge, account: Account, was: str,
                        sender: str) -> None:
        self.events.account_renamed(forge, account, was, sender)

    def repo_renamed(self, forge: LocalForge, repo: Repo, was: str, sender: str) -> None:
        self.events.repo_renamed(forge, repo, was, sender)

    def repo_transferred(self, forge: LocalForge, repo: Repo, was: str, sender: str) -> None:
        self.events.repo_transferred(forge, repo, was, sender)


def get_dialect(name: str) -> Dialect:
    if name == "github":
        from .github import GITHUB

        return GITHUB
    if name == "gitea":
        from .gitea import GITEA

        return GITEA
    raise ValueError(f"unknown forge dialect {name!r} (available: github, gitea)")
