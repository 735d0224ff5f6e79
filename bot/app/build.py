"""The app's parts from its settings, once the forge has answered (`build_services`): the
forge client, the index, the office source and the keyrings. Kept apart from the web app
(bot.app.web) so that a command that only reads (`vaultmail verify`, `reindex`, `doctor`)
loads none of the web routes, the console or the MCP server."""

from __future__ import annotations

from functools import partial

import aiohttp

from bot.app.listing import accounts_of, live_of, take_listing
from bot.app.services import Services
from bot.app.settings import Settings
from bot.forge.github import ForgeClient, ForgeConfig
from bot.forge.tokens import AppAuth, AppJwtAPI
from bot.items.service import left_office
from bot.mail.signing import Keyrings
from bot.office.source import OfficeSource
from bot.private_files import private_dir
from bot.store import installations, open_store
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
                        offices=OfficeSource(settings.office_path),
                        keyring=Keyrings.in_data_dir(settings.data_dir))
    services.keyring.installed = services.installations.keys  # what legacy keys served
    services.left_office = left_office  # (questions stop waiting on whoever left)
    services.offices.renamed = services.keyring.renamed
    taken = await take_listing(store, services.keyring, live_of(listing), before,
                               accounts_of(listing))
    taken.take_into(services)
    return services


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
                        offices=OfficeSource(settings.office_path),
                        keyring=keyring, bot_user=login, installations=taken.installed,
                        accounts=taken.accounts)
    services.keyring.installed = services.installations.keys  # what legacy keys served
    services.left_office = left_office  # (questions stop waiting on whoever left)
    services.offices.renamed = keyring.renamed
    # a repository is the office's while its owner is the account the index holds for its
    # login (bot.forge.gitea: Gitea tells no hook of an org renamed)
    client.account_of = partial(installations.account_of, store)
    return services
