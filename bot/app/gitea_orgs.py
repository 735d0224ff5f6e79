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

from bot.app.background import Background
from bot.app.listing import catch_up_offices, take_listing
from bot.app.services import Services
from bot.store import installations

log = logging.getLogger("vaultmail.gitea_orgs")
ORGS_EVERY = 300.0


async def refresh(services: Services) -> list[str]:
    """Read the bot's orgs and take them, and follow the vaults renamed (see the module); the
    orgs newly installed."""
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
    await catch_up_offices(services)  # (Gitea tells no hook of a vault renamed either)
    if new:  # their vaults' labels, as at start
        guid, event, payload = gitea.startup_delivery()
        if await store.enqueue_delivery(guid, event, payload, gitea.encode(payload)):
            services.wake_worker()
        log.info("organisations the bot was added to: installed", extra={"orgs": new})
    return new


class GiteaOrgs(Background):
    task_name = "vaultmail-gitea-orgs"

    def __init__(self, services: Services, every: float = ORGS_EVERY) -> None:
        self.services = services
        self.every = every
        super().__init__()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.every)
            try:
                await refresh(self.services)
            except Exception as exc:  # the forge or the index: the next round tries again
                log.warning("reading the bot's organisations failed: %r", exc)
