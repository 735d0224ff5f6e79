"""Which orgs the App is installed on, as the forge lists them, taken into the index: at
start, on Gitea every few minutes (bot.app.gitea_orgs), and on GitHub when a rename heard is
into a name whose office's own rename was not heard yet (handlers.installation). Apart from
bot.app.build, which imports the handlers, so that a handler may take a listing too."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from bot.app.services import Services
from bot.forge.github import ForgeClient
from bot.mail.signing import Keyrings, vault_office
from bot.store import Store, installations, mails, offices

log = logging.getLogger("vaultmail.listing")


@dataclass(frozen=True)
class Listing:
    """What taking the forge's listing found: what is installed now, the orgs whose name
    another account took (a new office each), and the orgs renamed ({old: new})."""

    installed: dict[str, int]
    taken: list[str]
    renamed: dict[str, str]
    accounts: dict[str, int]  # {org: its office's account id} of those installed, where known

    def take_into(self, services: Services) -> None:
        """This replica serves what the index has installed now (`services.installations`,
        changed in place: others hold that dict), and forgets what it kept of the configs of
        the orgs moved (taken by another account, or renamed): not their office's now."""
        for org in (*self.taken, *self.renamed, *self.renamed.values()):
            services.offices.forget(org)
        services.installations.clear()
        services.installations.update(self.installed)
        services.accounts.clear()  # (at once with it: the forge an office's work is given)
        services.accounts.update(self.accounts)


async def take_listing(store: Store, keyring: Keyrings, live: dict[str, int],
                       before: installations.Known, accounts: dict[str, int]) -> Listing:
    """The forge's listing of the App's orgs taken into the index (`installations.listed`),
    at start, on Gitea every few minutes, and on GitHub when a rename heard is into a name
    whose office's own rename was not heard yet. An org that renamed itself (its account
    under a new login) has its office's keys moved to the new name first (`follow_keys`),
    in the order the index follows them (`installations.in_order`), and an org whose name
    another account took has its office's keys set aside first (`Keyrings.retire`), each
    before the index moves the office (a crash between finds the keys moved, or the office
    moved, and moves nothing twice)."""
    known = await installations.accounts(store)
    renamed = installations.renamed_in(known, accounts)
    whose = dict(known)
    for old, new in installations.in_order(renamed):
        follow_keys(keyring, whose, old, new)
    taken = installations.taken_over(known, accounts)
    for org in taken:
        keyring.retire(org, installations.archived_name(org, known[org]))
    installed = await installations.listed(store, live, before, accounts)
    held = await installations.accounts(store)
    return Listing(installed, taken, renamed,
                   {org: held[org] for org in installed if org in held})


def follow_keys(keyring: Keyrings, whose: dict[str, int], old: str, new: str) -> None:
    """Office `old`'s keys follow its org's rename to `new` (`Keyrings.rename`); keys under
    `new` of another account's office (`whose`: {org: account id}, as the index has it, kept
    up to date here: an org left that name, uninstalled, deleted or renamed) are set aside
    first, as the index sets that office aside (`installations.rename`)."""
    account = whose.pop(old, None)
    if new in whose and whose[new] != account:
        keyring.retire(new, installations.archived_name(new, whose.pop(new)))
    keyring.rename(old, new)
    if account is not None:
        whose[new] = account


async def relist(services: Services) -> Listing:
    """GitHub: the App's installations listed again and taken (`take_listing`), as at
    start, and this replica's installations made what the index has now."""
    client = services.forge_client
    assert isinstance(client, ForgeClient)  # (Gitea's orgs are read by gitea_orgs.refresh)
    before = await installations.known(services.store)
    listing = await client.app().list_installations()
    taken = await take_listing(services.store, services.keyring, live_of(listing), before,
                               accounts_of(listing))
    taken.take_into(services)
    return taken


def accounts_of(listing: list[dict[str, Any]]) -> dict[str, int]:
    """{org: its account's id}: whose each installation's org is (a login may change hands)."""
    return {str(i["account"]["login"]).lower(): int(i["account"]["id"]) for i in listing
            if isinstance((i.get("account") or {}).get("id"), int)}


def live_of(listing: list[dict[str, Any]]) -> dict[str, int]:
    """{org: installation id} of the App's installations that are not suspended (GitHub
    lists those too, and makes them no token)."""
    return {str(i["account"]["login"]).lower(): int(i["id"]) for i in listing
            if not i.get("suspended_at")}


async def follow_vault(services: Services, old: str, new: str) -> int:
    """The vault `old` (`owner/repo`) renamed `new` (GitHub's `repository.renamed`, or found
    so by `catch_up_vaults`): what its office signed under the old name verifies under the
    new (keys first, as for an org renamed), the index's rows name it by the new, and its
    office's config is read again (one naming the old is read as naming the new:
    bot.office.source.as_renamed). Returns the rows changed. Within its office only: a
    vault that went to another owner is no rename (ValueError, nothing changed)."""
    org = new.split("/", 1)[0].lower()
    services.keyring.rename_vault(old, new)
    async with services.store.transaction(f"installation:{org}") as db:
        changed = await offices.rename_vault_in(db, old, new)
    services.offices.forget(org)
    return changed


async def catch_up_vaults(services: Services, org: str) -> dict[str, str]:
    """At start: the renames of `org`'s vaults made while no app heard them, followed
    (`follow_vault`), as the start's listing follows orgs renamed. Each vault its config
    names, or the index's mail rows name, is asked for (the forge leads an old name to the
    repository's new one); and a vault's old name that a repository of its own answers to
    now is that repository's (`Keyrings.vault_name_taken`). A name the forge leads to another
    owner's repository (GitHub redirects a repository transferred too) is a vault gone from
    the office: said in the log, its rows and keys left as they are (an org renamed is the
    listing's to follow, before this). Returns {old: new} followed."""
    forge = services.forge_for_org(org)
    office = await services.offices.get(forge, org)
    names = {v.lower() for v in office.vaults()} if office is not None else set()
    names |= await mails.vaults_of(services.store, org)
    moved: dict[str, str] = {}
    gone: dict[str, str] = {}
    for name in sorted(names):
        now = await forge.repo_name_now(name)
        if now is None or now == name:
            continue
        if vault_office(now) != vault_office(name):
            gone[name] = now
            continue
        await follow_vault(services, name, now)
        moved[name] = now
    for was in services.keyring.renamed(org):
        if "/" in was and await forge.repo_name_now(was) == was:
            services.keyring.vault_name_taken(was)
            services.offices.forget(org)
    if moved:
        log.warning("vaults renamed while no app heard it: their rows follow them",
                    extra={"org": org, "renamed": moved})
    if gone:
        log.warning("vaults transferred to another owner: gone from the office, their mail "
                    "left in its index", extra={"org": org, "gone": gone})
    return moved


CATCH_UP_AT_ONCE = 4  # offices whose vaults a catch-up reads at a time


async def catch_up_offices(services: Services) -> None:
    """Every office's vaults renamed unheard, followed (`catch_up_vaults`): at a start (GitHub's
    renamed while the app was down), run beside it, never in its way; on Gitea, which sends
    no rename, at every look at the bot's orgs too (bot.app.gitea_orgs). Each office reads
    its vaults from the forge one by one, CATCH_UP_AT_ONCE offices at a time; one office's
    forge failing, or slow, leaves that office as it was (the next round tries again), never
    the others."""
    turns = asyncio.Semaphore(CATCH_UP_AT_ONCE)
    await asyncio.gather(*(catch_up_office(services, org, turns)
                           for org in sorted(services.installations)))


async def catch_up_office(services: Services, org: str, turns: asyncio.Semaphore) -> None:
    """`org`'s vaults renamed unheard, followed in one of `turns`; a failure is logged, and
    leaves the office as it was."""
    async with turns:
        try:
            await catch_up_vaults(services, org)
        except Exception as exc:  # (its forge, or its config: the next round tries again)
            log.warning("vaults renamed unheard: not read", extra={
                "org": org, "error": repr(exc)})
