"""Outbound triggers: every ledger event, as a signed POST to each URL the office config names
under `webhooks:` (DESIGN §3.7), in ledger order, at least once.

Each URL has a durable cursor (the last sequence number it acknowledged), so a receiver that is
down gets everything once it is back, and a restart of the app loses nothing. A URL the
operator's outbound policy refuses (`bot.app.egress`) is sent nothing: its cursor waits, and
the refusal is ledgered once as `office.config_refused` for each office naming it.
"""

from __future__ import annotations

import hashlib
import logging
import time
from functools import partial
from typing import TYPE_CHECKING

from bot.app.background import Rounds, Work, backoff
from bot.app.egress import OutboundRefused
from bot.app.signed_post import post_signed
from bot.office.source import CONFIG_REPO
from bot.store import ledger
from bot.store import outbound as cursors

if TYPE_CHECKING:
    from bot.app.services import Services

log = logging.getLogger("vaultmail.outbound")
POLL = 0.5  # seconds between looks at the ledger when nothing woke us
BATCH = 100
MAX_BACKOFF = 300.0

def _short(url: str) -> str:
    """A URL's name for its task (its query may carry a receiver's secret)."""
    return hashlib.sha256(url.encode()).hexdigest()[:12]


class LedgerForwarder(Rounds):
    """Each URL is sent to by a task of its own (`Rounds`): a receiver that answers slowly
    (or not until its timeout) holds its own cursor, never another URL's or another office's.
    One replica at a time sends, from the shared cursors; when it dies the next oldest takes
    over where they stand."""

    task_name = "vaultmail-outbound"
    poll = POLL

    def __init__(self, services: Services) -> None:
        self.services = services
        super().__init__()

    async def _leading(self) -> bool:
        return await self.services.store.is_leader()

    async def _round(self) -> list[tuple[str, Work]]:
        """For every installed office's webhooks: each receives its own office's ledger
        only, whoever else names the same URL."""
        return [(f"{org}:{_short(url)}", partial(self._send, org, url))
                for org, office in await self.services.installed_offices()
                for url in dict.fromkeys(office.webhooks)]

    async def _send(self, org: str, url: str) -> None:
        try:
            await self.forward(org, url)
        except Exception as exc:  # (its cursor stays: the next round tries again)
            log.warning("outbound POST round failed: %r", exc, extra={"org": org, "url": url})

    async def forward(self, org: str, url: str) -> int:
        """Send what `url` has not acknowledged yet of `org`'s ledger; returns how many were
        sent."""
        # one sender of a cursor at a time, whichever replica believes it leads (a stalled
        # leader may wake to find a successor): read, send, advance under its lock
        async with self.services.store.named_lock(f"outbound:{org}:{url}"):
            return await self._forward(org.lower(), url)

    async def _forward(self, org: str, url: str) -> int:
        store = self.services.store
        row = await cursors.get_cursor(store, org, url)
        if row is not None and row["next_at"] > time.time():
            return 0
        cursor = int(row["seq"]) if row else await cursors.legacy_seq(store, url)
        sent = 0
        behalf = await self.services.behalf(org)  # (its account, as the policy asks it)
        for entry in await ledger.entries(store, since=cursor, limit=BATCH, org=org):
            try:
                await post_signed(self.services.keyring.signer_for(entry.org), url,
                                  entry.as_json(), event=entry.event,
                                  delivery=str(entry.number),
                                  outbound=self.services.settings.outbound, office=behalf)
            except Exception as exc:
                failures = (int(row["failures"]) if row else 0) + 1
                delay = backoff(failures, MAX_BACKOFF)
                await self._save(org, url, cursor, failures, time.time() + delay, repr(exc))
                if isinstance(exc, OutboundRefused) and (row is None
                                                         or row["last_error"] != repr(exc)):
                    await self._refused(org, url, exc)  # once, not at every retry
                log.warning("outbound POST failed; retry in %.1fs", delay,
                            extra={"url": url, "seq": entry.seq, "error": repr(exc)})
                return sent
            cursor, sent = entry.seq, sent + 1
        if sent or row is None:
            await self._save(org, url, cursor, 0, 0.0, None)
        return sent

    async def _refused(self, org: str, url: str, exc: OutboundRefused) -> None:
        """Ledger a refused webhook URL as a config error of the office that names it."""
        services = self.services
        office = await services.offices.get(services.forge_for_org(org), org)
        if office is not None and url in office.webhooks:
            where = f"{services.offices.where(org)}: webhooks[{office.webhooks.index(url)}]"
            await ledger.record(services.store, "office.config_refused", "office",
                                f"{org}/{CONFIG_REPO}", {"errors": [f"{where}: {exc}"]}, org=org)

    async def _save(self, org: str, url: str, seq: int, failures: int, next_at: float,
                    error: str | None) -> None:
        await cursors.save_cursor(self.services.store, org, url, seq, failures, next_at,
                                  error)
