"""What a forge dialect (GitHub, Gitea) supplies to the dialect-neutral core."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from aiohttp import web

from .state import App, Delivery, Installation, Repo

if TYPE_CHECKING:
    from .forge import LocalForge


class Dialect(Protocol):
    name: str

    def build_app(self, forge: LocalForge) -> web.Application: ...

    def delivery_headers(self, forge: LocalForge, app: App, delivery: Delivery,
                         body: bytes) -> dict[str, str]: ...

    def installation_created(self, forge: LocalForge, inst: Installation,
                             sender: str) -> None: ...

    def repo_created(self, forge: LocalForge, repo: Repo, sender: str) -> None: ...

    def pushed(self, forge: LocalForge, repo: Repo, pusher: str, path: str,
               existed: bool) -> None: ...


def get_dialect(name: str) -> Dialect:
    if name == "github":
        from .github import GITHUB

        return GITHUB
    if name == "gitea":
        from .gitea import GITEA

        return GITEA
    raise ValueError(f"unknown forge dialect {name!r} (available: github, gitea)")
