"""The request log: one record per API request the forge answered."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class RequestRecord:
    method: str
    path: str
    route: str  # "GET /repos/{owner}/{repo}/issues"
    status: int
    auth: str  # app | installation | user | none
    login: str | None
    at: float
    duration: float
    installation_id: int | None = None


@dataclass
class BodySent:
    """A large answer sent in chunks, as Gitea's JSON encoder sends one (no Content-Length):
    how many of its `size` bytes went out before it ended, and whether all of them did (a
    client that stops reading and closes the connection ends it early)."""

    path: str
    size: int
    sent: int = 0
    whole: bool = False
    ended: asyncio.Event = field(default_factory=asyncio.Event)


class RequestLog:
    def __init__(self, cap: int = 200_000) -> None:
        self.records: list[RequestRecord] = []
        self.cap = cap

    def add(self, record: RequestRecord) -> None:
        self.records.append(record)
        if len(self.records) > self.cap:
            del self.records[: len(self.records) - self.cap]

    def clear(self) -> None:
        self.records.clear()

    def count(self, route: str | None = None, auth: str | None = None) -> int:
        return sum(
            1 for r in self.records
            if (route is None or r.route == route) and (auth is None or r.auth == auth)
        )

    def as_list(self) -> list[dict[str, Any]]:
        return [asdict(r) for r in self.records]

    def __iter__(self) -> Iterator[RequestRecord]:
        return iter(self.records)

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int) -> RequestRecord:
        return self.records[i]
