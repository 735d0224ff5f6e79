"""The app's parts from its settings, once the forge has answered (`build_services`): the
forge client, the index, the office source and the keyrings. Kept apart from the web app
(bot.app.web) so that a command that only reads (`vaultmail verify`, `reindex`, `doctor`)
loads none of the web routes, the console or the MCP server."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import aiohttp

from bot.app.services import Services
from bot.app.settings import Settings
from bot.forge.github import ForgeClient, ForgeConfig
from bot.forge.tokens import AppAuth, AppJwtAPI
from bot.mail.signing import Keyrings
from bot.office.source import OfficeSource
from bot.private_files import private_dir
from bot.store import Store, installations, open_store
from handlers import build_own_router, build_router


async def fetch_app_slug(auth: AppAuth, session: aiohttp.ClientSession, api_url: str) -> str:
    gh = AppJwtAPI(session, "vaultmail", base_url=api_url)
    data = await gh.getitem("/app", jwt=auth.app_jwt(), accept="application/vnd.github+json")
    return str(data["slug"])


async def build_services(settings: Settings, session: aiohttp.ClientSession) -> Services:
    # the data directory is the app's own (0700) from its start, whichever engine holds the
    # index: keys, tokens and the CLI's commands beside it find it there
    private_dir(settings.data_dir)
    if settings.dialect == "gitea":
        return await build_gitea_services(settings, session)
    auth = AppAuth(settings.app_id, settings.private_key_pem, settings.api_url, session)
    slug = await fetch_app_slug(auth, session, settings.api_url)
    config = ForgeConfig(write_interval=settings.write_interval, bot_login=f"{slug}[bot]")
    client = ForgeClient(auth, session, settings.api_url, config=config)
    # after the forge answered: no retry reopens it
    store = await open_store(settings.database, synchronous=settings.sqlite_synchronous)
    try:  # the index's installations, then the forge's: a webhook heard between is newer
        before = await installations.known(store)
        listing = await client.app().list_installations()
    except BaseException:
        await store.close()
        raise
    services = Services(settings=settings, store=store, forge_client=client,
                        router=build_router(), own_router=build_own_router(), app_slug=slug,
                        offices=OfficeSource(settings.office_path,
                                             url_refused=settings.outbound.url_refusal),
                        keyring=Keyrings.in_data_dir(settings.data_dir))
    services.keyring.installed = services.installations.keys  # what legacy keys served
    services.offices.renamed = services.keyring.renamed
    taken = await take_listing(store, services.keyring, _live(listing), before,
                               _accounts(listing))
    services.installations.update(taken.installed)
    return services


@dataclass(frozen=True)
class Listing:
    """What taking the forge's listing found: what is installed now, the orgs whose name
    another account took (a new office each), and the orgs renamed ({old: new})."""

    installed: dict[str, int]
    taken: list[str]
    renamed: dict[str, str]

    def forget_configs(self, offices: OfficeSource) -> None:
        """What was kept of these orgs' configs is not their office's now."""
        for org in (*self.taken, *self.renamed, *self.renamed.values()):
            offices.forget(org)


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
    return Listing(await installations.listed(store, live, before, accounts), taken, renamed)


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
    taken = await take_listing(services.store, services.keyring, _live(listing), before,
                               _accounts(listing))
    taken.forget_configs(services.offices)
    services.installations.clear()  # (in place: others hold this dict)
    services.installations.update(taken.installed)
    return taken


async def build_gitea_services(settings: Settings, session: aiohttp.ClientSession) -> Services:
    """Gitea/Forgejo: the bot user's token; one (synthetic) installation covering its orgs."""
    from bot.forge.gitea import SYNTHETIC_INSTALLATION_ID, GiteaClient

    probe = GiteaClient(settings.token, session, settings.api_url)
    login = await probe.whoami()
    # Gitea has no per-endpoint points budget (GitHub's secondary limit)
    config = ForgeConfig(write_interval=settings.write_interval, bot_login=login,
                         endpoint_points_per_minute=0)
    client = GiteaClient(settings.token, session, settings.api_url, bot_login=login,
                         config=config)
    orgs = await client.installation().user_org_ids()
    store = await open_store(settings.database, synchronous=settings.sqlite_synchronous)
    keyring = Keyrings.in_data_dir(settings.data_dir)
    try:  # whose each org is, as with a GitHub App's installations (see build_services)
        taken = await take_listing(
            store, keyring, dict.fromkeys(orgs, SYNTHETIC_INSTALLATION_ID),
            await installations.known(store),
            {org: i for org, i in orgs.items() if i is not None})
    except BaseException:
        await store.close()
        raise
    services = Services(settings=settings, store=store, forge_client=client,
                        router=build_router(), own_router=build_own_router(), app_slug=login,
                        offices=OfficeSource(settings.office_path,
                                             url_refused=settings.outbound.url_refusal),
                        keyring=keyring, bot_user=login, installations=taken.installed)
    services.keyring.installed = services.installations.keys  # what legacy keys served
    services.offices.renamed = keyring.renamed
    return services


def _accounts(listing: list[dict[str, Any]]) -> dict[str, int]:
    """{org: its account's id}: whose each installation's org is (a login may change hands)."""
    return {str(i["account"]["login"]).lower(): int(i["account"]["id"]) for i in listing
            if isinstance((i.get("account") or {}).get("id"), int)}


def _live(listing: list[dict[str, Any]]) -> dict[str, int]:
    """{org: installation id} of the App's installations that are not suspended (GitHub
    lists those too, and makes them no token)."""
    return {str(i["account"]["login"]).lower(): int(i["id"]) for i in listing
            if not i.get("suspended_at")}
