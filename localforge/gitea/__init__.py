"""The Gitea dialect of the local forge (Gitea 1.22 / Forgejo API under /api/v1)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..dialect import EventsDialect
from . import events, server

if TYPE_CHECKING:
    from ..forge import LocalForge
    from ..state import Installation


class GiteaDialect(EventsDialect):
    name = "gitea"
    events = events
    server = server

    def installation_created(self, forge: LocalForge, inst: Installation, sender: str) -> None:
        """Gitea has no Apps: nothing is sent."""

    def installation_deleted(self, forge: LocalForge, inst: Installation, sender: str) -> None:
        """Gitea has no Apps: nothing is sent."""

    def installation_suspended(self, forge: LocalForge, inst: Installation, sender: str,
                               action: str) -> None:
        """Gitea has no Apps: nothing is sent."""


GITEA = GiteaDialect()
