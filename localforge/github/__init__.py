"""The GitHub dialect of the local forge."""

from __future__ import annotations

from ..dialect import EventsDialect
from . import events, server


class GitHubDialect(EventsDialect):
    name = "github"
    events = events
    server = server


GITHUB = GitHubDialect()
