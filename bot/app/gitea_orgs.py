"""Gitea and Forgejo send no installation events: the app reads the orgs its bot is in at
start (bot.app.build) and again every ORGS_EVERY seconds here, on every replica. An org the bot
was added to since gets its office (and its vaults' labels), one it left is refused, and one
made again under a known name by another user (another org id) gets a new office, the old one
moved aside (bot.store.offices.retire_in), as an installation by another account does on
GitHub. A known org id under a new name is the org renamed: its office follows it
(bot.store.installations.rename), as GitHub's `installation_target.renamed` makes it. Gitea
sends no rename of a repository either: each look follows the offices' vaults renamed since
(bot.app.listing.catch_up_offices), as GitHub's `repository.renamed` makes it."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from functools import partial

from bot.app.background import Rounds, Work
from bot.app.listing import CATCH_UP_AT_ONCE, catch_up_office, catch_up_offices, take_listing
from bot.app.services import Services
from bot.forge.gitea import GiteaClient
from bot.store import installations

log = logging.getLogger("vaultmail.gitea_orgs")
ORGS_EVERY = 300.0
# a delivery about an org with no office here looks at the bot's orgs at most this often, who-
# ever sends it: an org that just added the bot is an office at its first delivery, and an
# outsider's deliveries (the system webhook sends every org's) cost one read in this time
LOOK_AGAIN_AFTER = 30.0


async def refresh(services: Services) -> list[str]:
    """A look at the bot's orgs (`look`), and the vaults renamed followed, every office's
    (see the module); the orgs newly installed."""
    new = await look(services)
    await catch_up_offices(services)  # (Gitea tells no hook of a vault renamed either)
    return new


async def look(services: Services) -> list[str]:
    """Read the bot's orgs and take them (see the module); the orgs newly installed."""
    from bot.forge import gitea_events as gitea
    from bot.forge.gitea import SYNTHETIC_INSTALLATION_ID, GiteaClient

    client = services.forge_client
    assert isinstance(client, GiteaClient)
    store = services.store
    before = await installations.known(store)
    orgs = await client.installation().user_org_ids()
    taken = await take_listing(
        store, services.keyring, dict.fromkeys(orgs, SYNTHETIC_INSTALLATION_ID), before,
        {org: i for org, i in orgs.items() if i is not None})
    new = sorted(set(taken.installed) - set(services.installations)
                 - set(taken.renamed.values()))
    taken.take_into(services)
    services.hook_generations.stale()  # (a name another org's now: its secret at once)
    if new:  # their vaults' labels, as at start
        guid, event, payload = gitea.startup_delivery()
        if await store.enqueue_delivery(guid, event, payload, gitea.encode(payload)):
            services.wake_worker()
        log.info("organisations the bot was added to: installed", extra={"orgs": new})
    return new


async def _answer(value: bool) -> bool:
    return value


class GiteaOrgs(Rounds):
    """Every `every` seconds, on every replica, a look at the bot's orgs, then each office's
    vaults renamed followed in a task of its own (`Rounds`: one at a time per office, at most
    CATCH_UP_AT_ONCE offices reading at once): an office whose forge reads fail or hang holds
    up neither the next look nor another office's catch-up."""

    task_name = "vaultmail-gitea-orgs"

    def __init__(self, services: Services, every: float = ORGS_EVERY, *,
                 again_after: float = LOOK_AGAIN_AFTER,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.services = services
        self.poll = every
        services.installs_looked_for_every = every  # (NotInstalled's Retry-After)
        services.look_for_orgs = self.look_now
        client = services.forge_client
        if isinstance(client, GiteaClient):  # (a repository found another account's)
            client.owner_changed = self.look_again
        self._turns = asyncio.Semaphore(CATCH_UP_AT_ONCE)
        self._again_after, self._clock = again_after, clock
        self._looked = clock()  # (the start has just looked: bot.app.web)
        self._looking: asyncio.Future[list[str]] | None = None

    def look_now(self) -> Awaitable[bool]:
        """A look at the bot's orgs for a delivery about an org with no office here, unless
        one was made in the last `again_after` seconds (then, or when it fails: False).
        Decided when called: a look under way then (a round's, another delivery's) is the one
        it shares."""
        if self._looking is None and self._clock() - self._looked < self._again_after:
            return _answer(False)
        return self._told(self._look())

    def look_again(self) -> Awaitable[bool]:
        """A look at the bot's orgs now, whenever the last was (the one under way shared):
        a repository was found another account's than the one the index holds for its
        login (bot.forge.gitea), so the index is behind the forge, and the office follows
        its org before its write is tried again."""
        return self._told(self._look())

    async def _told(self, looking: asyncio.Future[list[str]]) -> bool:
        try:
            await asyncio.shield(looking)
        except Exception:  # (the forge's answer: logged, the delivery answered as it stands)
            log.warning("look at the bot's organisations failed", exc_info=True)
            return False
        return True

    def _look(self) -> asyncio.Future[list[str]]:
        """The look under way, or a new one: one at a time, whoever asks (a round,
        deliveries); two at once would each take the same orgs as new."""
        if self._looking is None:
            self._looked = self._clock()
            self._looking = asyncio.ensure_future(look(self.services))
            self._looking.add_done_callback(self._looked_now)
        return self._looking

    def _looked_now(self, done: asyncio.Future[list[str]]) -> None:
        self._looking = None
        if not done.cancelled():
            done.exception()  # (told to whoever awaited it; none may have, if cancelled)

    async def _run(self) -> None:
        await asyncio.sleep(self.poll)  # (the start has just looked, and catches up: bot.app.web)
        await super()._run()

    async def _leading(self) -> bool:
        return True  # (each replica keeps its own list of the orgs)

    async def _round(self) -> list[tuple[str, Work]]:
        await asyncio.shield(self._look())  # (failing: Rounds logs it, the next round tries)
        return [(org, partial(catch_up_office, self.services, org, self._turns))
                for org in sorted(self.services.installations)]
