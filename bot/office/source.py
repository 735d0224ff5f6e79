"""Where the office config comes from: the org's `.github/vaultmail.yml`, or a local file.

Read through the forge client's ETag cache, so asking on every event costs a 304 at most. An
invalid new config is refused and the last valid one stays in force.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

from bot.office.config import Office, OfficeConfigError, load_office, parse_office

if TYPE_CHECKING:
    from bot.forge.base import Forge

log = logging.getLogger("vaultmail.office")
CONFIG_REPO = ".github"
CONFIG_PATH = "vaultmail.yml"


class OfficeSource:
    """`max_age`: how long a fetched config is used without asking the forge again; a push
    to the config asks at once (`fresh=True`), so this only bounds edits made without one."""

    def __init__(self, path: Path | None = None, max_age: float = 60.0) -> None:
        self._path = path
        self._local: Office | None = None
        self._last_valid: dict[str, Office] = {}
        self._fetched: dict[str, float] = {}
        self._text: dict[str, str] = {}  # the text the last valid config was parsed from
        self.max_age = max_age
        self.last_error: dict[str, OfficeConfigError] = {}

    async def get(self, forge: Forge, org: str, *, fresh: bool = False) -> Office | None:
        if self._path is not None:
            if self._local is None:
                self._local = load_office(self._path)
            return self._local
        if not fresh and time.monotonic() - self._fetched.get(org, -1e18) < self.max_age:
            return self._last_valid.get(org)
        self._fetched[org] = time.monotonic()
        text = await forge.get_file(f"{org}/{CONFIG_REPO}", CONFIG_PATH)
        if text is None:
            return self._last_valid.get(org)
        if self._text.get(org) == text and org in self._last_valid:
            self.last_error.pop(org, None)  # back to (or still) the last valid text
            return self._last_valid[org]  # unchanged (a 304): no need to parse it again
        source = f"{org}/{CONFIG_REPO}/{CONFIG_PATH}"
        try:
            office = bound_to_org(parse_office(text, source), org, source)
        except OfficeConfigError as exc:
            if org not in self.last_error or str(self.last_error[org]) != str(exc):
                log.error("office config refused; last valid config stays in force",
                          extra={"org": org, "errors": exc.errors})
            self.last_error[org] = exc
            return self._last_valid.get(org)
        self.last_error.pop(org, None)
        self._last_valid[org] = office
        self._text[org] = text
        return office


def bound_to_org(office: Office, org: str, source: str) -> Office:
    """An org's config speaks for that org only: its `org` and every vault must be in it, or
    one installation could have the office sign mail for another's people."""
    errors = []
    if office.org.lower() != org.lower():
        errors.append(f"{source}: org: is {office.org!r}, but this config lives in {org!r}")
    for i, agent in enumerate(office.agents):
        owner = office.vault_of(agent).split("/")[0]
        if owner.lower() != org.lower():
            errors.append(f"{source}: agents[{i}].vault: {office.vault_of(agent)} is outside "
                          f"{org}")
    if errors:
        raise OfficeConfigError(source, errors)
    return office
