"""Where the office config comes from: the org's `.github/vaultmail.yml`, or a local file.

Read through the forge client's ETag cache, so asking on every event costs a 304 at most. An
invalid new config is refused and the last valid one stays in force.

A config from an org's repository is data, never code: it cannot name a command (only the
operator's local file and VAULTMAIL_AGENT_COMMANDS do), and a URL in it that names an address
the operator's outbound policy refuses is refused here already, with its key.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

from bot.forge.errors import FileTooLarge, UnreadableFile
from bot.forge.pacing import without_wait_limit
from bot.mail.signing import name_now
from bot.office.config import (
    MAX_CONFIG_BYTES,
    Office,
    OfficeConfigError,
    UrlCheck,
    load_office,
    locate_errors,
    parse_office,
    shortened,
    too_big,
)

if TYPE_CHECKING:
    from bot.forge.base import Forge

log = logging.getLogger("vaultmail.office")
CONFIG_REPO = ".github"
CONFIG_PATH = "vaultmail.yml"
# seconds a round of every office (outbound webhooks, sign-in, email's recipients, the doctor)
# gives one office's config read that has not answered yet (a forge waiting out its limits)
ROUND_WAIT = 3.0
# seconds past `max_age` such a round goes on with an office's config read before, while its
# forge does not answer (a push's read in flight: none, it said the config changed)
STALE_AT_MOST = 300.0
READS_AT_ONCE = 32  # configs read from the forge at once
# seconds such a round gives the read of an office's config never read before (at start)
FIRST_READ_WAIT = 20.0


class OfficeUnanswered(Exception):
    """An office's config was never read, and its forge has not answered within the time a
    round of every office gives each (`OfficeSource.get(within=)`)."""

    def __init__(self, org: str, within: float) -> None:
        super().__init__(f"{org}'s office config: its forge has not answered in {within:g} s")
        self.org = org


class OfficeSource:
    """`max_age`: how long a fetched config is used without asking the forge again; a push
    to the config asks at once (`fresh=True`), so this only bounds edits made without one.
    `url_refused`: the operator's outbound policy, applied to a repository config's URLs on
    behalf of its org."""

    def __init__(self, path: Path | None = None, max_age: float = 60.0, *,
                 url_refused: UrlCheck | None = None,
                 renamed: Callable[[str], dict[str, str]] | None = None) -> None:
        self._path = path
        self._url_refused = url_refused
        # an office's names before ({was: now}: Keyring.renamed): its config may still say them
        self.renamed = renamed or (lambda org: {})
        # (the file's org, an org served now): None when the office under that name now is
        # the org the file is for (the first account the index knew under the file's org),
        # else (that account, the one there now)
        # (bot.store.installations.file_office_holder; set by the services)
        self.file_holder: Callable[[str, str], Awaitable[tuple[int, int] | None]] | None = None
        # the outbound check for an org's URLs as the org stands now (its forge account: an
        # operator's entry for the org is for the account it names or was bound to), asked
        # before each parse; `url_refused` where unset (set by the services)
        self.url_refused_for: Callable[[str], Awaitable[UrlCheck]] | None = None
        self._local: Office | None = None
        # per org: when the file's holder was last asked, and its answer (kept `max_age`)
        self._file_checked: dict[str, tuple[float, tuple[int, int] | None]] = {}
        self._last_valid: dict[str, Office] = {}
        self._fetched: dict[str, float] = {}
        self._text: dict[str, str] = {}  # the text the last valid config was parsed from
        # the fetch in flight per org: whoever asks meanwhile waits for its answer (a backlog
        # handled side by side at start-up must not read "no config" off a fetch not done)
        self._asking: dict[str, asyncio.Future[Office | None]] = {}
        self._asked_at: dict[str, float] = {}  # when the read in flight began
        # the installation each org's config was read through: read through another (the
        # App installed again, maybe by another account that took the org's name), what was
        # kept of it is not that org's config any more
        self._read_under: dict[str, int | None] = {}
        self._fresh: set[str] = set()  # orgs a push asked to read again, until answered
        # how many times each org's config was forgotten: a read begun before the last time
        # answers whoever waited for it, but nothing of it is kept (`forget`)
        self._forgotten: dict[str, int] = {}
        self._reading = asyncio.Semaphore(READS_AT_ONCE)
        self.max_age = max_age
        self.last_error: dict[str, OfficeConfigError] = {}
        # called with each valid config read (org, office, when its read began by the wall
        # clock, whether its text is new to this replica), before anyone is served it: an
        # unchanged text too, as the shared record of who the config names (bot.store.members)
        # may hold another replica's read since; a failure fails the read
        self.on_read: Callable[[str, Office, float, bool], Awaitable[None]] | None = None

    async def get(self, forge: Forge, org: str, *, fresh: bool = False,
                  within: float | None = None, first: float | None = None) -> Office | None:
        """`org`'s office (None: it has no valid config). `within`: for a caller going round
        every office, how long this one's read may keep it, counted from the read's start:
        past it, the answer before stands (read within `max_age` + STALE_AT_MOST, and no push
        asked for it again since), else OfficeUnanswered; the read goes on for whoever asks
        next. (Another office's forge that waits out its rate limit must not hold every
        office's round.) `first`: how long instead, when `org` was never read (nothing to
        go on with meanwhile: at start, on a loaded host, a read takes more than `within`)."""
        if self._path is not None:
            if self._local is None:
                began = time.time()
                local = load_office(self._path)
                if self.on_read is not None:
                    await self.on_read(local.org, local, began, True)
                self._local = local
            # the operator's file is one office's: another org installed beside it has none
            # (never this one's, or its tokens would act in this office), and neither has
            # another org under its name (made again by another user: its repositories would
            # be written the file's people's mail), told apart by id as installations are
            local = as_renamed(self._local, org, self.renamed(org))
            if local.org.lower() != org.lower() or await self._file_not_for(org) is not None:
                return None
            return local
        under = getattr(forge, "installation_id", None)
        if org in self._read_under and self._read_under[org] != under:
            self.forget(org)
        if (not fresh and org not in self._fresh
                and time.monotonic() - self._fetched.get(org, -1e18) < self.max_age):
            return self._last_valid.get(org)  # (a push's read in flight: it is waited for)
        asking = self._asking.get(org)
        if asking is None:
            # shared by whoever asks: none's limit on forge waits (a delivery's) is the others'
            asking = asyncio.get_running_loop().create_task(self._fetch(forge, org),
                                                            context=without_wait_limit())
            self._read_under[org] = under
            self._asking[org] = asking
            self._asked_at[org] = time.monotonic()
            asking.add_done_callback(lambda done: self._asked(org, done))
        # shielded: a caller that leaves (a long poll) does not cancel the others' answer;
        # a forge that failed fails each of them (a retry), never reads as "no config"
        if fresh:
            self._fresh.add(org)  # (until answered: the answer before is not served meanwhile)
        if within is None:
            return await asyncio.shield(asking)
        if first is not None and org not in self._fetched:
            within = max(within, first)
        left = within - (time.monotonic() - self._asked_at.get(org, time.monotonic()))
        try:
            return await asyncio.wait_for(asyncio.shield(asking), max(0.0, left))
        except TimeoutError:
            # the answer before stands a while, unless a push said it changed
            if (org not in self._fresh and time.monotonic() - self._fetched.get(org, -1e18)
                    < self.max_age + STALE_AT_MOST):
                return self._last_valid.get(org)
            raise OfficeUnanswered(org, within) from None

    async def _file_not_for(self, org: str) -> tuple[int, int] | None:
        """Whether the operator's file is not the office under `org` now (`file_holder`),
        asked again after `max_age` (another replica's look may have found the name taken)."""
        assert self._local is not None
        kept = self._file_checked.get(org)
        if kept is None or time.monotonic() - kept[0] >= self.max_age:
            holder = self.file_holder
            kept = (time.monotonic(),
                    None if holder is None else await holder(self._local.org, org))
            self._file_checked[org] = kept
        return kept[1]

    def forget(self, org: str) -> None:
        """Drop what was kept of `org`'s config (its name now another account's, a vault's
        old name another repository's): the next read is its first. A read under way is not
        waited for and keeps nothing: begun before, it may be parsed with what was forgotten
        (the names the office had), and kept, it was served for `max_age` after."""
        for kept in (self._last_valid, self._fetched, self._text, self.last_error,
                     self._read_under, self._file_checked, self._asking, self._asked_at):
            kept.pop(org, None)
        self._fresh.discard(org)
        self._forgotten[org] = self._forgotten.get(org, 0) + 1

    def answered(self, org: str) -> bool:
        """Whether `org`'s config was ever read (valid or not)."""
        return org in self._fetched

    def last_valid(self, org: str) -> Office | None:
        """`org`'s office as its last valid config said, however long ago."""
        return self._last_valid.get(org)

    def _asked(self, org: str, done: asyncio.Future[Office | None]) -> None:
        if self._asking.get(org) is done:
            del self._asking[org]
            self._asked_at.pop(org, None)
        if not done.cancelled():
            done.exception()  # retrieved: whoever awaited it has it already

    async def _fetch(self, forge: Forge, org: str) -> Office | None:
        forgotten = self._forgotten.get(org, 0)
        office = await self._read(forge, org)
        if self._forgotten.get(org, 0) == forgotten:
            self._fetched[org] = time.monotonic()  # it stands for `max_age` from now
            self._fresh.discard(org)
        return office

    async def _read(self, forge: Forge, org: str) -> Office | None:
        """`org`'s config read from the forge, what is kept of it updated (unless `forget`
        was called meanwhile)."""
        forgotten = self._forgotten.get(org, 0)

        def kept() -> bool:  # (forgotten since the read began: nothing of it is kept)
            return self._forgotten.get(org, 0) == forgotten

        try:
            async with self._reading:  # (a round of a thousand offices: not all at once)
                began = time.time()
                text = await config_text(forge.get_file(
                    f"{org}/{CONFIG_REPO}", CONFIG_PATH, at_most=MAX_CONFIG_BYTES), self.where(org))
        except OfficeConfigError as exc:  # the org's file, not the forge: refused as invalid
            return self._refused(org, exc, kept())
        if text is None:
            return self._last_valid.get(org)
        last = self._last_valid.get(org)
        if self._text.get(org) == text and last is not None:
            # unchanged (a 304): not parsed, but applied (another replica may have recorded
            # another text since, and the forge has this one back)
            if self.on_read is not None:
                await self.on_read(org, last, began, False)
            if kept():
                self.last_error.pop(org, None)  # back to (or still) the last valid text
            return last
        try:  # (another office's text: parsed beside the loop, which serves every office)
            checks = {} if self.url_refused_for is None else {
                "url_refused": await self.url_refused_for(org)}
            office = await asyncio.to_thread(self.validate, org, text, **checks)
        except OfficeConfigError as exc:
            return self._refused(org, exc, kept())
        if self.on_read is not None:
            await self.on_read(org, office, began, True)
        # (in place before the read is marked answered, `_fetch`: a caller meanwhile read the
        # answer before it, at start-up none: an SMTP recipient refused as unknown, a
        # delivery handled as one of an office without a config)
        if kept():
            self.last_error.pop(org, None)
            self._last_valid[org] = office
            self._text[org] = text
        return office

    def _refused(self, org: str, exc: OfficeConfigError, kept: bool = True) -> Office | None:
        """`org`'s config refused: said once while it stays the same, the last valid kept
        (`kept`: the read began since the org's config was last forgotten)."""
        if not kept:
            return None
        if org not in self.last_error or str(self.last_error[org]) != str(exc):
            log.error("office config refused; last valid config stays in force",
                      extra={"org": org, "errors": [shortened(e) for e in exc.errors[:50]],
                             "count": len(exc.errors)})  # (a hostile file has thousands)
        self.last_error[org] = exc
        return self._last_valid.get(org)

    def validate(self, org: str, text: str, url_refused: UrlCheck | None = None) -> Office:
        """`org`'s config from `text`, validated as a push of it is (a pull request's is
        checked by the same): OfficeConfigError with every error, its line and column.
        `url_refused`: the outbound check for `org` now (else the source's)."""
        source = self.where(org)
        try:
            # its URLs checked on behalf of the org served, whatever the file says it is
            office = parse_office(text, source, repository=True,
                                  url_refused=url_refused or self._url_refused, office=org)
            return bound_to_org(as_renamed(office, org, self.renamed(org)), org, source, text)
        except OfficeConfigError:
            raise
        except (ValueError, RecursionError, MemoryError) as exc:  # one org's file, whatever
            # it holds, refuses that org's config alone: never fails a round of every office
            raise OfficeConfigError(source, [f"{source}: cannot be read: {exc!r}"[:500]]) from exc

    def why_none(self, org: str) -> str:
        """Why `org` has no office now, for whoever asked: its config refused (and none valid
        before), naming the first error, or none found."""
        other = self._file_checked.get(org, (0.0, None))[1]
        if self._path is not None and other is not None:
            named = self._local.org if self._local is not None else org
            return (f"{org} is not the org the operator's office file ({self._path}) serves: "
                    f"the file is for forge account {other[0]}, the first this app knew as "
                    f"{named}, and {org} is account {other[1]} now (an org deleted or renamed, "
                    "and its name taken by another account), so it has no office here")
        refused = self.last_error.get(org)
        if refused is not None:
            more = len(refused.errors) - 1
            return (f"{org}'s office config is refused, and none was valid before: "
                    f"{refused.errors[0]}" + (f" (and {more} more)" if more else "")
                    + f"; fix it in {org}/{CONFIG_REPO} (`vaultmail office check` says the same)")
        return f"no office config found for {org}: add {CONFIG_PATH} to {org}/{CONFIG_REPO}"

    def where(self, org: str) -> str:
        """Where `org`'s config is read from, as its errors name it."""
        return str(self._path) if self._path is not None else f"{org}/{CONFIG_REPO}/{CONFIG_PATH}"


async def config_text(read: Awaitable[str | None], source: str) -> str | None:
    """What `read` (of a config at `source`, at most MAX_CONFIG_BYTES) gets from the forge:
    its text, None when there is none; OfficeConfigError when it cannot be a config (too big,
    refused before it was read whole; not UTF-8 text)."""
    try:
        return await read
    except FileTooLarge:
        raise OfficeConfigError(source, [too_big(source)]) from None
    except UnreadableFile as exc:
        raise OfficeConfigError(source, [f"{source}: {exc}"]) from exc


def as_renamed(office: Office, org: str, renamed: dict[str, str]) -> Office:
    """`org`'s config read with the names its office had (`renamed`, {was: now}): written
    before the org, or a vault, was renamed, it says `org: <old>` and names vaults by their
    old names; it is taken as it would say now (until an admin writes the new names), and
    only by the office that had those names (whoever holds `<old>` now has none of them)."""
    if not renamed:
        return office
    agents = []
    for agent in office.agents:
        vault = office.vault_of(agent)
        now = name_now(renamed, vault)
        agents.append(agent if now == vault.lower() or now == vault
                      else agent.model_copy(update={"vault": now}))
    named = office.org.lower()
    return office.model_copy(update={
        "org": org if renamed.get(named) == org.lower() else office.org, "agents": agents})


def bound_to_org(office: Office, org: str, source: str, text: str = "") -> Office:
    """An org's config speaks for that org only: its `org` and every vault must be in it, or
    one installation could have the office sign mail for another's people. `text`: the file
    it was parsed from, where each error is located."""
    problems = []
    if office.org.lower() != org.lower():
        problems.append(("org", f"is {office.org!r}, but this config lives in {org!r}"))
    for i, agent in enumerate(office.agents):
        owner = office.vault_of(agent).split("/")[0]
        if owner.lower() != org.lower():
            problems.append((f"agents[{i}].vault", f"{office.vault_of(agent)} is outside {org}"))
    if problems:
        raise OfficeConfigError(source, locate_errors(text, source, problems))
    return office
