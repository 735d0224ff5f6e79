"""What each org's webhook secret is made from (bot.store.hook_secrets: the forge's id of the
org holding the name, and its generation) as intake takes it: held in memory, so a delivery
costs no database round trip, and read again from the index every KEPT seconds, at once when
a delivery is signed with one of its org's next secrets (bot.app.intake: a rotation not read
here yet), and at the next delivery after this replica took the forge's listing of orgs (a
name another org's now: the old org's secret is refused from then on). An org's new secret is
taken from its first delivery, on whichever replica gets it. A bad signature, which anyone may
send to any org's webhook, reads nothing: it cannot be made with a secret its sender does not
hold.

Why a short TTL and not a NOTIFY (bot.app.replica): a rotation is made by a command
(`vaultmail gitea-hook ORG --rotate`), not by a replica, often beside a single app on SQLite,
where there is nothing to notify with; and a wake-up missed while the listening session was
cut would leave a replica on the old generation until it restarts. Being a few seconds late
costs nothing: the secret before a rotation is accepted for a grace (an hour by default) anyway.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time

from bot.store import Store
from bot.store.hook_secrets import NEVER_ROTATED, Generation, generations

log = logging.getLogger("vaultmail.intake")

KEPT = 5.0  # seconds the generations read are taken as current
AHEAD = 2  # the generations past the one held that a signature is tried with (rotated twice
# within KEPT: the admins set the latest)


class HookGenerations:
    def __init__(self, store: Store) -> None:
        self._store = store
        self._known: dict[str, Generation] | None = None  # None: not read yet
        self._read_at = -math.inf  # (time.monotonic())
        self._known_at = -math.inf  # when the read of _known began (time.monotonic())
        self._reading: asyncio.Task[None] | None = None

    async def of(self, org: str) -> Generation:
        """`org`'s generation, as last read (read again once KEPT seconds old)."""
        if self._known is None or time.monotonic() - self._read_at >= KEPT:
            await self._read()
        assert self._known is not None
        return self._known.get(org.lower(), NEVER_ROTATED)

    async def recheck(self, org: str) -> Generation:
        """`org`'s generation read again now: a delivery was signed with one of its next
        secrets (a rotation not read yet here), which only those who hold it can do."""
        await self._read()
        return await self.of(org)

    def stale(self) -> None:
        """Read again at the next delivery: this replica just took the forge's listing of
        orgs (bot.app.gitea_orgs), which may have given a name to another org (another id,
        another secret: the old org's is refused from the next delivery on, here)."""
        self._read_at = -math.inf

    def since_rotation(self, generation: Generation) -> float:
        """Seconds since `generation` (as `of` gave it) became its org's, by the database's
        clock: its age when read, and the time since on this replica's monotonic clock (a
        duration, whatever its wall clock says)."""
        return generation.age + time.monotonic() - self._known_at

    async def _read(self) -> None:
        """One read at a time: deliveries arriving while it is under way wait for it, and
        no more (a read started before a rotation may miss it: the next one sees it)."""
        if self._reading is None:
            self._reading = asyncio.create_task(self._read_now())
        try:
            await asyncio.shield(self._reading)
        except Exception as exc:  # the index is away: what was read last still stands
            if self._known is None:
                raise
            log.warning("org webhook secrets not read again: %r", exc)

    async def _read_now(self) -> None:
        started = time.monotonic()
        try:
            known = await generations(self._store)
        finally:  # (failed: tried again KEPT seconds on, not by every delivery meanwhile)
            self._read_at, self._reading = started, None
        for org, generation in known.items():
            was = None if self._known is None else self._known.get(org)
            if was is not None and was.number != generation.number:
                log.info("org webhook secret rotated: its new generation now signs",
                         extra={"org": org, "generation": generation.number})
            if was is not None and was.org_id != generation.org_id:
                log.warning("org webhook secret: the name is another org's now, whose secret "
                            "is its own", extra={"org": org, "org_id": generation.org_id})
        self._known, self._known_at = known, started


def grace_text(seconds: float) -> str:
    """A grace as the operator set it, in words: "1 hour", "10 minutes", "0 seconds"."""
    for unit, size in (("hour", 3600), ("minute", 60)):
        if seconds >= size and seconds % size == 0:
            n = int(seconds // size)
            return f"{n} {unit}{'s' if n != 1 else ''}"
    return f"{seconds:g} seconds"
